// One job: live status and progress, logs, attempts, output, cost, cancel, its signed receipt once it has ended;
// for the operator, re-queueing a pending or running job.
import type { JsonObject } from "@bufbuild/protobuf";
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { api } from "../api.js";
import { isTerminal, sar, when } from "../format.js";
import { watchJob, type LiveJob } from "../live-job.js";
import { href } from "../router.js";
import { session } from "../session.js";
import { Card, DataTable, Empty, ErrorBox, Loading, ProgressBar, StatusBadge, useAction, useLoad, useObjectUrl } from "../ui.js";
import { ReceiptCard } from "./job-receipt.js";
import { RASTER_IMAGE_FORMATS, outputFileExtension, outputFileType } from "../../shared/image-formats.js";

function useLiveJob(jobId: string): LiveJob {
  const [s, set] = useState<LiveJob>({ attempts: [], logs: [], lost: false, done: false });
  useEffect(() => watchJob(jobId, set), [jobId]);
  return s;
}

/**
 * The format of a result object's image, by the service's rule (JobOutcome.output_format,
 * the raw output route): a `data` string is an image, of its `format` when that is a
 * short lowercase name and a PNG otherwise. Undefined: not an image.
 */
function imageFormatOf(obj: JsonObject): string | undefined {
  if (typeof obj.data !== "string") return undefined;
  return typeof obj.format === "string" && /^[a-z0-9]{1,10}$/.test(obj.format) ? obj.format : "png";
}


/** The bytes of an image's `data`: base64, or a data: URL of it (as the service accepts). Throws when it is not. */
function base64ToBytes(data: string): Uint8Array<ArrayBuffer> {
  const b64 = data.replace(/^data:[\w/+.-]+;base64,/, "").replace(/-/g, "+").replace(/_/g, "/");
  let bin: string;
  try {
    bin = atob(b64);
  } catch {
    throw new Error("its data is not base64");
  }
  if (bin.length === 0) throw new Error("its data is empty");
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** The output as a file to show and download, or why it cannot be. */
interface OutputFile {
  kind: "image" | "text" | "json";
  blob?: Blob;
  /** The download's file extension. */
  ext: string;
  /** What the output is called on the page ("PNG", "binary"). */
  label: string;
  error?: string;
}

/**
 * An image output as its file: a raster format keeps its name and media type; any other the
 * provider names (html, svg, exe …) is opaque bytes, `.bin` and application/octet-stream, so that
 * the downloaded file never opens as a document or runs as a program (outputFileExtension).
 */
function outputFile(result: JsonObject): OutputFile {
  const format = imageFormatOf(result);
  if (format !== undefined) {
    const ext = outputFileExtension(format);
    const label = RASTER_IMAGE_FORMATS.has(ext) ? ext.toUpperCase() : "binary";
    try {
      return { kind: "image", blob: new Blob([base64ToBytes(result.data as string)], { type: outputFileType(format) }), ext, label };
    } catch (err) {
      return { kind: "image", ext, label, error: `The ${label} output cannot be read: ${(err as Error).message}.` };
    }
  }
  if (typeof result.response === "string") return { kind: "text", blob: new Blob([result.response], { type: "text/plain" }), ext: "txt", label: "TXT" };
  return { kind: "json", blob: new Blob([JSON.stringify(result, null, 2)], { type: "application/json" }), ext: "json", label: "JSON" };
}

function Output({ jobId, status }: { jobId: string; status: string }) {
  const out = useLoad(() => api.jobs.getOutput({ jobId }), [jobId, status]);
  const result = out.data?.body.case === "result" ? (out.data.body.value as JsonObject) : undefined;
  const file = useMemo(() => (result ? outputFile(result) : undefined), [result]);
  const url = useObjectUrl(file?.blob);
  const [unshown, setUnshown] = useState(false);
  useEffect(() => setUnshown(false), [url]);
  if (!out.data) return out.error ? <ErrorBox error={out.error} /> : <Loading what="output" />;
  const body = out.data.body;
  if (body.case === "pending") return <Empty>The output appears here when the job completes.</Empty>;
  if (body.case === "gone") return <p class="error" role="alert">No output: the job {body.value.status}{body.value.error ? ` (${body.value.error})` : ""}.</p>;
  const { kind, ext, label, error } = file!;
  const shown: JsonObject = { ...result };
  delete shown.data;
  return (
    <div class="output">
      <ErrorBox error={error ?? (unshown ? `The ${label} output could not be shown; download it to look at it.` : undefined)} />
      {kind === "image" && url && RASTER_IMAGE_FORMATS.has(ext) && !unshown ? (
        <img src={url} alt={`${label} output of job ${jobId}`} data-testid="output-image" onError={() => setUnshown(true)} />
      ) : null}
      {kind === "text" ? <pre class="output-text">{result!.response as string}</pre> : null}
      {kind === "json" ? <pre class="output-text">{JSON.stringify(shown, null, 2)}</pre> : null}
      {url ? <a class="button" href={url} download={`${jobId}.${ext}`}>Download {label}</a> : null}
    </div>
  );
}

function Logs({ live }: { live: LiveJob }) {
  const box = useRef<HTMLPreElement>(null);
  useEffect(() => {
    const el = box.current;
    if (el) el.scrollTop = el.scrollHeight;
  }, [live.logs.length]);
  if (live.logs.length === 0) return <Empty>No log lines yet{live.done ? "" : "; they appear here as the provider sends them"}.</Empty>;
  return (
    <pre class="logs" ref={box} tabIndex={0} aria-label="Job log" aria-live="polite">
      {live.logs.map((l) => `${l.createdAt.slice(11, 19)} ${l.level.padEnd(5)} ${l.message}`).join("\n")}
    </pre>
  );
}

export function JobPage({ jobId, back }: { jobId: string; back: string[] }) {
  const live = useLiveJob(jobId);
  const cancel = useAction();
  const [reason, setReason] = useState("");
  const requeue = useAction();
  const [requeueReason, setRequeueReason] = useState("");
  const j = live.job;
  if (!j) {
    return (
      <>
        <h1>Job {jobId}</h1>
        {live.error ? <ErrorBox error={live.error} /> : <Loading what="job" />}
      </>
    );
  }
  const pct = j.status === "completed" ? 100 : j.progressPct ?? 0;
  return (
    <>
      <p><a href={href(...back)}>← Back</a></p>
      <h1>Job <span class="mono">{j.jobId}</span></h1>
      <ErrorBox error={live.error} />
      {live.lost ? (
        <div class="banner" role="status">
          Lost connection to the service. Reconnecting to the job's events…
        </div>
      ) : null}
      <Card title="Status">
        <div class="job-head">
          <StatusBadge status={j.status} />
          <span>{j.jobType}</span>
          {j.progressPhase && !isTerminal(j.status) ? <span class="muted">{j.progressPhase}</span> : null}
        </div>
        <ProgressBar pct={pct} status={j.status} label="Job progress" />
        {j.queueReason ? <p class="note" data-testid="queue-reason">Waiting: {j.queueReason}</p> : null}
        {j.error ? <p class="error" role="alert">{j.error}</p> : null}
        <dl class="facts" data-testid="facts">
          <dt>Submitted</dt><dd>{when(j.submittedAt)}</dd>
          <dt>Started</dt><dd>{when(j.startedAt)}</dd>
          <dt>Ended</dt><dd>{when(j.completedAt)}</dd>
          <dt>Provider</dt><dd>{j.providerId !== undefined ? `#${j.providerId}` : "not assigned yet"}</dd>
          <dt>Priority</dt><dd>{j.priority}</dd>
          <dt>Attempt</dt><dd>{j.attempt}</dd>
        </dl>
        {!isTerminal(j.status) && session()?.role !== "provider" ? (
          <form class="inline" onSubmit={(e) => { e.preventDefault(); void cancel.run(() => api.jobs.cancel({ jobId, ...(reason ? { reason } : {}) })); }}>
            <label for="cancel-reason">Cancel reason (optional)</label>
            <input id="cancel-reason" value={reason} onInput={(e) => setReason((e.target as HTMLInputElement).value)} />
            <button class="danger" type="submit" disabled={cancel.busy}>Cancel job</button>
          </form>
        ) : null}
        <ErrorBox error={cancel.error} />
        {session()?.role === "admin" && (j.status === "pending" || j.status === "running") ? (
          // The attempt on its provider ends and the job waits for placement again; the stream shows what follows.
          <form class="inline" onSubmit={(e) => {
            e.preventDefault();
            const why = requeueReason.trim();
            void requeue.run(async () => {
              await api.admin.requeueJob({ jobId, ...(why ? { reason: why } : {}) });
              setRequeueReason("");
            });
          }}>
            <label for="requeue-reason">Requeue reason (optional)</label>
            <input id="requeue-reason" maxLength={1000} value={requeueReason} onInput={(e) => setRequeueReason((e.target as HTMLInputElement).value)} />
            <button class="secondary" type="submit" disabled={requeue.busy}>Requeue</button>
          </form>
        ) : null}
        <ErrorBox error={requeue.error} />
      </Card>
      <div class="grid2">
        <Card title="Cost">
          <dl class="facts" data-testid="cost">
            <dt>Held at submit</dt><dd>{sar(j.costHalala)}</dd>
            <dt>Charged</dt><dd>{j.actualCostHalala !== undefined ? sar(j.actualCostHalala) : "not settled yet"}</dd>
            <dt>Provider's share</dt><dd>{sar(j.providerEarnedHalala)}</dd>
            <dt>Platform fee</dt><dd>{sar(j.platformFeeHalala)}</dd>
            <dt>Duration booked</dt><dd>{j.durationMinutes} min</dd>
          </dl>
          {isTerminal(j.status) ? null : <p class="muted" data-testid="receipt-note">A signed receipt is issued when the job settles.</p>}
        </Card>
        <Card title="Attempts">
          <DataTable rows={live.attempts} empty="No attempt yet: the job has not been handed to a provider." columns={[
            { head: "#", cell: (a) => a.attempt },
            { head: "Provider", cell: (a) => (a.providerId !== undefined ? `#${a.providerId}` : "—") },
            { head: "Status", cell: (a) => `${a.status}${a.endReason ? ` (${a.endReason})` : ""}` },
            { head: "Started", cell: (a) => when(a.startedAt) },
            { head: "Ended", cell: (a) => when(a.endedAt) },
            { head: "Cost", cell: (a) => (a.costHalala !== undefined ? sar(a.costHalala) : "—") },
          ]} />
        </Card>
      </div>
      {isTerminal(j.status) ? <ReceiptCard jobId={jobId} /> : null}
      <Card title="Output">
        <Output jobId={jobId} status={j.status} />
      </Card>
      <Card title="Logs">
        <Logs live={live} />
      </Card>
    </>
  );
}
