// Group commit for job submits. Concurrent submits that arrive while a batch
// is being written wait for the next one, and each batch is one transaction
// of set-based statements (submitMany): a few round trips and one commit for
// the whole batch instead of ~6 round trips and a commit per submit. Under
// light load a submit finds no batch running and goes at once, alone.
//
// A batch whose transaction fails as a whole (not a refusal of one submit,
// which submitMany answers per submit) is run again one submit at a time, so
// that one bad submit cannot fail the others (per renter in order, renters side
// by side, outside the pipeline). That includes a batch, even of one, that waits
// too long for a lock (a renter's accounts held by a slow transaction): it gives
// up after BATCH_LOCK_TIMEOUT_MS, the pipeline moves on, and only that renter's
// submits wait on. A batch whose COMMIT went through but whose answer was lost
// (the connection dropped) fails too: each of its submits whose write then
// fails (or, run again, is refused: its holds are taken) looks for its job, and
// is answered with it when its batch wrote it.
import { allInTransaction, type Sql } from "../../db/index.js";
import { queueStandings } from "../dispatch/dispatch.js";
import { reportSubmitGroup } from "../shared/observe.js";
import type { JobRow } from "../shared/job-row.js";
import { submitMany, type SubmitIntent, type Submitted } from "./submit.js";

/** Most submits in one transaction: bounds a batch's time and its statements' parameters. */
export const MAX_BATCH = 64;
/** Batches written at once by one process. One keeps every batch as full as the load allows. */
export const BATCHES_IN_FLIGHT = 1;
/** How long a batch waits for a lock before its submits are written one by one outside the pipeline (waiting as long as it takes). */
export const BATCH_LOCK_TIMEOUT_MS = 2000;

interface Waiting {
  intent: SubmitIntent;
  /** performance.now() when it arrived. */
  at: number;
  resolve: (s: Submitted) => void;
  reject: (e: unknown) => void;
}

/** lock_not_available: the batch's lock timeout ran out. */
const LOCK_NOT_AVAILABLE = "55P03";

export interface BatcherOptions {
  maxBatch: number;
  inFlight: number;
  lockTimeoutMs: number;
}

export class SubmitBatcher {
  private readonly waiting: Waiting[] = [];
  private inFlight = 0;
  private readonly opts: BatcherOptions;

  constructor(
    private readonly sql: Sql,
    options: Partial<BatcherOptions> = {},
  ) {
    this.opts = { maxBatch: MAX_BATCH, inFlight: BATCHES_IN_FLIGHT, lockTimeoutMs: BATCH_LOCK_TIMEOUT_MS, ...options };
  }

  /** Resolves with the written job once its batch committed; rejects with its refusal (402, 429, 404, 503) or failure. */
  submit(intent: SubmitIntent): Promise<Submitted> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ intent, at: performance.now(), resolve, reject });
      this.next();
    });
  }

  private next(): void {
    while (this.inFlight < this.opts.inFlight && this.waiting.length > 0) {
      const batch = this.waiting.splice(0, this.opts.maxBatch);
      this.inFlight++;
      void this.write(batch).finally(() => {
        this.inFlight--;
        this.next();
      });
    }
  }

  /** Writes a batch in the pipeline; one that fails as a whole is handed to split() and frees the pipeline at once. */
  private async write(batch: Waiting[]): Promise<void> {
    const intents = batch.map((w) => w.intent);
    const started = performance.now();
    try {
      const outcomes = await this.sql.begin(async (tx) => {
        // The lock timeout goes out ahead of the batch's first statements (execute() sends it now),
        // without a round trip of its own.
        const timeout = tx`SELECT set_config('lock_timeout', ${`${this.opts.lockTimeoutMs}ms`}, true)`.execute();
        const [, written] = await allInTransaction([timeout, submitMany(tx, intents)]);
        return written;
      });
      const writeSeconds = (performance.now() - started) / 1000;
      // A queued submit answers its place and why it waits: read for the batch's queued jobs together,
      // after the commit and outside the pipeline (the next batch does not wait for it).
      const queued = outcomes.flatMap((o) => (o.ok && o.submitted.job.status === "queued" ? [o.submitted.job] : []));
      const standings = queued.length === 0 ? undefined : queueStandings(this.sql, queued);
      standings?.catch(() => {}); // each queued submit awaits it and meets a failure there
      outcomes.forEach((o, i) => (o.ok ? batch[i].resolve(standings ? { ...o.submitted, standings } : o.submitted) : batch[i].reject(o.error)));
      reportSubmitGroup(batch.map((w) => (started - w.at) / 1000), writeSeconds);
    } catch (err) {
      if (batch.length === 1 && (err as { code?: string } | null)?.code !== LOCK_NOT_AVAILABLE) void this.answerFailed(batch[0], err);
      else void this.split(batch);
    }
  }

  /**
   * Outside the pipeline, one submit per transaction and without the lock
   * timeout: per renter in order, renters side by side, so a renter whose
   * accounts are held waits without holding up anyone else.
   */
  private async split(batch: Waiting[]): Promise<void> {
    const byRenter = new Map<number, Waiting[]>();
    for (const w of batch) byRenter.set(w.intent.renterId, [...(byRenter.get(w.intent.renterId) ?? []), w]);
    await Promise.all(
      [...byRenter.values()].map(async (ws) => {
        for (const w of ws) {
          try {
            const [o] = await this.sql.begin((tx) => submitMany(tx, [w.intent]));
            if (o.ok) w.resolve(o.submitted);
            else await this.answerFailed(w, o.error);
          } catch (err) {
            await this.answerFailed(w, err);
          }
        }
      }),
    );
  }

  /**
   * Answers a submit whose write failed (or, run again, was refused: its batch's holds were taken
   * already): with its job, when its batch wrote it after all (the COMMIT went through, its answer was
   * lost), else with the failure. Its job is its own: same id, renter and signed task spec.
   */
  private async answerFailed(w: Waiting, failure: unknown): Promise<void> {
    const written = await this.writtenBefore(w.intent).catch(() => undefined);
    if (written) w.resolve(written);
    else w.reject(failure);
  }

  private async writtenBefore(intent: SubmitIntent): Promise<Submitted | undefined> {
    const [job] = await this.sql<JobRow[]>`SELECT * FROM jobs WHERE job_id = ${intent.jobId}`;
    if (!job || job.renter_id !== intent.renterId || job.task_spec_hmac !== intent.taskSpecHmac) return undefined;
    const placed = job.status === "pending" && job.provider_id !== null;
    return { job, placement: placed ? { providerId: job.provider_id, contended: [], job } : { providerId: null, contended: [] } };
  }
}
