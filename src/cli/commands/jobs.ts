// svc jobs: list, show, logs, watch, cancel and output, for every role (the
// server answers with what the credential may see).
import type { JsonObject } from "@bufbuild/protobuf";
import type { Command } from "commander";
import type { Job } from "../../../gen/svc/v1/models_pb.js";
import { follow, saveOutput } from "../follow.js";
import { EXIT, Exit, colour, out, printFields, printJson, statusColour, terminalSafe } from "../output.js";
import type { Role } from "../profiles.js";
import { int, listCommand, type Context } from "./context.js";

/** The output format of a job's result object (as JobOutcome.output_format says it): an image's format, text or json. */
function outputFormatOf(obj: JsonObject): string {
  if (typeof obj.data === "string") return typeof obj.format === "string" && /^[a-z0-9]{1,10}$/.test(obj.format) ? obj.format : "png";
  if (typeof obj.response === "string") return "text";
  return "json";
}

/**
 * The jobs the credential may see (`svc jobs ls`, `svc provider jobs`): `cmd`
 * with --status added gets --limit (20), --offset and --before (a cursor) and prints job, type, status, the
 * columns `between`, then when it was submitted.
 */
export function jobList(ctx: Context, cmd: Command, role: Role | undefined, between: [string, (j: Job) => unknown][]): Command {
  cmd.option("--before <job_id>", "the jobs after this one in the list (the last of the page before): reaches past --offset's 10,000");
  return listCommand(ctx, cmd, {
    role,
    limit: 20,
    fetch: (c, o: { status?: string; limit: number; offset: number; before?: string }) =>
      c.jobs.list({ status: o.status, limit: o.limit, offset: o.offset, before: o.before }),
    rows: (r) => r.jobs,
    cursor: { option: "--before", after: (jobs) => jobs.at(-1)?.jobId },
    columns: [["job", (j) => j.jobId], ["type", (j) => j.jobType], ["status", (j) => statusColour(j.status)], ...between, ["submitted", (j) => j.submittedAt]],
  });
}

export function addJobCommands(program: Command, ctx: Context): void {
  const { globals: g, session, show } = ctx;
  const jobs = program.command("jobs").description("your jobs (renter), your runs (provider), any job (admin)");
  jobList(ctx, jobs.command("ls").description("list jobs").option("--status <status>", "queued, pending, running, completed, failed, cancelled"), undefined, [
    ["progress", (j) => (j.progressPct === undefined ? undefined : `${Math.round(j.progressPct)}%`)],
    ["cost (halala)", (j) => j.actualCostHalala ?? j.costHalala],
  ]);
  jobs
    .command("show")
    .argument("<job_id>")
    .description("one job")
    .action(async (jobId: string) => {
      const { c } = session();
      const j = await c.jobs.get({ jobId });
      show(j, () =>
        printFields([
          ["job", j.jobId],
          ["type", j.jobType],
          ["status", statusColour(j.status)],
          ["queue reason", j.queueReason],
          ["provider", j.providerId],
          ["attempt", j.attempt],
          ["progress", j.progressPct === undefined ? undefined : `${Math.round(j.progressPct)}% ${j.progressPhase ?? ""}`.trim()],
          ["held / cost", `${j.costHalala} / ${j.actualCostHalala ?? "-"} halala`],
          ["submitted", j.submittedAt],
          ["completed", j.completedAt],
          ["error", j.error],
        ]),
      );
    });
  jobs
    .command("logs")
    .argument("<job_id>")
    .option("-f, --follow", "keep printing new lines until the job ends")
    .option("--attempt <n>", "that attempt's lines only (with -f: followed until the job ends)", int("--attempt"))
    .description("a job's log lines")
    .action(async (jobId: string, o: { follow?: boolean; attempt?: number }) => {
      const { c } = session();
      if (o.follow) throw new Exit(await follow(c, jobId, { json: !!g().json, logsOnly: true, attempt: o.attempt }));
      const r = await c.jobs.getLogs({ jobId, attempt: o.attempt });
      show(r, () => {
        for (const l of r.logs) out(`${colour(terminalSafe(l.level.padEnd(7)), "dim")} ${terminalSafe(l.message)}`);
      });
    });
  jobs
    .command("watch")
    .argument("<job_id>")
    .option("-o, --out <file>", "where to write the output")
    .description("follow a job live until it ends (exit code: how it ended)")
    .action(async (jobId: string, o: { out?: string }) => {
      const { c } = session();
      throw new Exit(await follow(c, jobId, { json: !!g().json, outFile: o.out }));
    });
  jobs
    .command("cancel")
    .argument("<job_id>")
    .option("--reason <text>")
    .description("cancel a queued, pending or running job (the hold comes back, less the time a running job used)")
    .action(async (jobId: string, o: { reason?: string }) => {
      const { c, p } = session(["renter", "admin"]);
      if (p.role === "admin") {
        const j = await c.admin.cancelJob({ jobId, reason: o.reason });
        return show(j, () => out(`${j.jobId}: ${statusColour(j.status)}`));
      }
      const r = await c.jobs.cancel({ jobId, reason: o.reason });
      show(r, () => out(`${r.job?.jobId}: ${statusColour(r.job?.status ?? "")}; refunded ${r.refundedHalala} halala, charged ${r.chargedHalala}`));
    });
  jobs
    .command("output")
    .argument("<job_id>")
    .option("-o, --out <file>", "write it to this file (images default to <job_id>.<format>, <job_id>.bin when not a raster image)")
    .description("a finished job's output")
    .action(async (jobId: string, o: { out?: string }) => {
      const { c } = session();
      const r = await c.jobs.getOutput({ jobId });
      if (r.body.case !== "result") {
        const v = r.body.value!;
        show(v, () => out(`${terminalSafe(v.jobId)}: ${statusColour(v.status)} — ${terminalSafe("message" in v ? v.message : v.error)}`));
        throw new Exit(r.body.case === "gone" ? EXIT.jobFailed : EXIT.refused);
      }
      const obj = r.body.value as JsonObject;
      const format = outputFormatOf(obj);
      if (format === "json" && !o.out) {
        // The result object as the output route answers it.
        if (g().json) printJson(obj);
        else out(JSON.stringify(obj, null, 2));
        return;
      }
      if (format === "text" && !o.out && g().json) return printJson(obj);
      // As `submit --follow` saves it: text as text, an image as its bytes, JSON as the output route's JSON.
      const saved = await saveOutput(c, jobId, format, o.out);
      if (saved.where !== "stdout") show({ job_id: jobId, file: saved.where, bytes: saved.bytes }, () => out(`written to ${saved.where} (${saved.bytes} bytes)`));
    });
}
