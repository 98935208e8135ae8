// Group commit for job submits. Concurrent submits that arrive while a batch
// is being written wait for the next one, and each batch is one transaction
// of set-based statements (submitMany): a few round trips and one commit for
// the whole batch instead of ~6 round trips and a commit per submit. Under
// light load a submit finds no batch running and goes at once, alone.
//
// A batch whose transaction fails as a whole (not a refusal of one submit,
// which submitMany answers per submit) is run again one submit at a time, so
// that one bad submit cannot fail the others.
import type { Sql } from "../db/index.js";
import { submitMany, type SubmitIntent, type Submitted } from "./submit.js";

/** Most submits in one transaction: bounds a batch's time and its statements' parameters. */
export const MAX_BATCH = 64;
/** Batches written at once by one process. One keeps every batch as full as the load allows. */
export const BATCHES_IN_FLIGHT = 1;

interface Waiting {
  intent: SubmitIntent;
  resolve: (s: Submitted) => void;
  reject: (e: unknown) => void;
}

export class SubmitBatcher {
  private readonly waiting: Waiting[] = [];
  private inFlight = 0;

  constructor(
    private readonly sql: Sql,
    private readonly opts = { maxBatch: MAX_BATCH, inFlight: BATCHES_IN_FLIGHT },
  ) {}

  /** Resolves with the written job once its batch committed; rejects with its refusal (402, 429, 404, 503) or failure. */
  submit(intent: SubmitIntent): Promise<Submitted> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ intent, resolve, reject });
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

  private async write(batch: Waiting[]): Promise<void> {
    let outcomes;
    try {
      outcomes = await this.sql.begin((tx) => submitMany(tx, batch.map((w) => w.intent)));
    } catch (err) {
      if (batch.length === 1) return batch[0].reject(err);
      for (const w of batch) await this.write([w]);
      return;
    }
    outcomes.forEach((o, i) => (o.ok ? batch[i].resolve(o.submitted) : batch[i].reject(o.error)));
  }
}
