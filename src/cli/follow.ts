// `svc submit --follow`, `svc jobs watch` and `svc jobs logs -f`: a job's live
// events (WatchJob). On a terminal: the queue reason while queued, then a
// progress bar with the phase, log lines printed above it; elsewhere plain
// lines; with --json one JSON object per event. A cut stream is resumed from
// the last cursor, so no log line is lost or printed twice. At the end the
// result, its cost and where the output was written.
import fs from "node:fs";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { toJson } from "@bufbuild/protobuf";
import cliProgress from "cli-progress";
import { JobEventSchema, type JobEvent, type JobOutcome } from "../../gen/svc/v1/jobs_pb.js";
import type { Clients } from "./clients.js";
import { EXIT, colour, isTty, out, printJsonLine, sar, statusColour } from "./output.js";

export interface FollowOptions {
  json: boolean;
  /** Only log lines (svc jobs logs -f). */
  logsOnly?: boolean;
  /** Where to write the output (default: <job_id>.<ext> for files, stdout for text). */
  outFile?: string;
}

const RECONNECTS = 5;

interface Display {
  status(text: string): void;
  progress(pct: number | undefined, phase: string | undefined): void;
  log(text: string): void;
  stop(complete: boolean): void;
}

function plainDisplay(): Display {
  let last = "";
  return {
    status: (t) => out(t),
    progress(pct, phase) {
      const line = `progress: ${pct === undefined ? "?" : Math.round(pct)}%${phase ? ` ${phase}` : ""}`;
      if (line !== last) out(line);
      last = line;
    },
    log: (t) => out(t),
    stop() {},
  };
}

/** The bar lives on stderr's line below the logs; MultiBar.log prints above it. */
function barDisplay(): Display {
  const multi = new cliProgress.MultiBar(
    {
      format: " {bar} {percentage}% | {phase}",
      barCompleteChar: "\u2588",
      barIncompleteChar: "\u2591",
      hideCursor: true,
      clearOnComplete: false,
      stopOnComplete: false,
      stream: process.stdout,
      forceRedraw: true,
    },
    cliProgress.Presets.shades_classic,
  );
  let bar: cliProgress.SingleBar | undefined;
  let phase = "";
  const ensure = () => (bar ??= multi.create(100, 0, { phase }));
  return {
    status(t) {
      if (bar) multi.log(t + "\n");
      else out(t);
    },
    progress(pct, ph) {
      phase = ph ?? phase;
      const b = ensure();
      b.update(pct === undefined ? b.getProgress() * 100 : Math.round(pct), { phase });
    },
    log(t) {
      if (bar) multi.log(t + "\n");
      else out(t);
    },
    stop(complete) {
      if (complete) ensure().update(100, { phase: phase || "done" });
      multi.stop();
    },
  };
}

function extensionOf(format: string): string {
  return format === "text" ? "txt" : format;
}

/** Writes or prints what a completed job produced; returns where it went. */
async function saveOutput(c: Clients, jobId: string, o: JobOutcome, outFile: string | undefined): Promise<string | undefined> {
  if (!o.outputFormat) return undefined;
  const image = o.outputFormat !== "text" && o.outputFormat !== "json";
  const res = await c.jobs.getOutputFormat({ jobId, format: image ? "raw" : o.outputFormat === "text" ? "raw" : "json" });
  if (!outFile && !image) {
    process.stdout.write(Buffer.from(res.data).toString("utf8").replace(/\n?$/, "\n"));
    return "stdout";
  }
  const file = path.resolve(outFile ?? `${jobId}.${extensionOf(o.outputFormat)}`);
  fs.writeFileSync(file, res.data);
  return file;
}

/** Follows a job to its end; returns the exit code (0 completed, 1 failed or cancelled). */
export async function follow(c: Clients, jobId: string, opts: FollowOptions): Promise<number> {
  const tty = isTty() && !opts.json;
  const display = opts.json ? undefined : tty && !opts.logsOnly ? barDisplay() : plainDisplay();
  let cursor: string | undefined;
  let outcome: JobOutcome | undefined;
  let complete = false;
  const onEvent = (e: JobEvent) => {
    cursor = e.cursor;
    if (opts.json) {
      printJsonLine(toJson(JobEventSchema, e, { useProtoFieldName: true, alwaysEmitImplicit: true }));
      if (e.event.case === "outcome") outcome = e.event.value;
      return;
    }
    const d = display!;
    switch (e.event.case) {
      case "snapshot": {
        const j = e.event.value.job!;
        if (opts.logsOnly) break;
        d.status(`job ${j.jobId} (${j.jobType}): ${statusColour(j.status)}${j.queueReason ? ` — ${j.queueReason}` : ""}`);
        if (j.status === "running" || j.progressPct !== undefined) d.progress(j.progressPct, j.progressPhase);
        break;
      }
      case "status": {
        if (opts.logsOnly) break;
        const s = e.event.value;
        d.status(`status: ${statusColour(s.status)}${s.queueReason ? ` — ${s.queueReason}` : ""}${s.providerId !== undefined && s.status !== "queued" ? ` (provider ${s.providerId})` : ""}`);
        if (s.status === "running") d.progress(undefined, undefined);
        break;
      }
      case "progress":
        if (!opts.logsOnly) d.progress(e.event.value.progressPct, e.event.value.phase);
        break;
      case "log": {
        const l = e.event.value;
        d.log(`${colour(l.level.padEnd(7), l.level === "error" || l.level === "critical" ? "red" : "dim")} ${l.message}`);
        break;
      }
      case "attempts":
        break;
      case "outcome":
        outcome = e.event.value;
        complete = outcome.status === "completed";
        break;
    }
  };
  for (let attempt = 0; !outcome; attempt++) {
    try {
      for await (const e of c.jobs.watchJob({ jobId, cursor })) onEvent(e);
      if (!outcome) throw new ConnectError("the event stream ended before the job did", Code.Unavailable);
    } catch (err) {
      const ce = ConnectError.from(err);
      const fromServer = ce.metadata.get("x-svc-http-status");
      // A cut connection (or a server restarting) resumes from the last cursor; a refusal does not.
      if (outcome || fromServer || (ce.code !== Code.Unavailable && ce.code !== Code.ResourceExhausted && ce.code !== Code.Internal) || attempt >= RECONNECTS) {
        display?.stop(false);
        throw err;
      }
      await new Promise((r) => setTimeout(r, 250 * 2 ** attempt));
    }
  }
  display?.stop(complete);
  const o = outcome;
  const ok = o.status === "completed";
  if (opts.logsOnly) return ok ? EXIT.ok : EXIT.jobFailed;
  let where: string | undefined;
  // With --json, stdout carries only the events: a text result goes to a file only when --out names one.
  if (ok && !(opts.json && !opts.outFile && (o.outputFormat === "text" || o.outputFormat === "json"))) where = await saveOutput(c, jobId, o, opts.outFile);
  if (opts.json) return ok ? EXIT.ok : EXIT.jobFailed;
  const why = [o.endReason, o.fault && o.fault !== "none" ? `${o.fault} fault` : undefined].filter(Boolean).join(", ");
  out(`result: ${statusColour(o.status)}${why ? ` (${why})` : ""}${o.error ? `: ${o.error}` : ""}`);
  out(`cost: ${o.costHalala} halala (${sar(o.costHalala)})${o.actualMinutes !== undefined ? `, ${o.actualMinutes} GPU minute(s)` : ""}`);
  if (where && where !== "stdout") out(`output: written to ${where}`);
  return ok ? EXIT.ok : EXIT.jobFailed;
}
