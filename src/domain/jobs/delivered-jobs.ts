// Which jobs a daemon stream has handed to its daemon, so that none is pushed
// twice: a job reaches a stream by more than one path (the submitting
// process's own push, its assignment's notice, a resync's read of the pending
// jobs). A job that ended on the stream is remembered a while longer, for a
// notice of its assignment that comes late; so what a stream remembers is the
// jobs its daemon runs and the last few that ended, not every job it ever ran.

/**
 * Jobs remembered after they ended on the stream: more than a notice can trail
 * the job's end by (milliseconds). A remembered id costs about 160 bytes, so
 * 10,000 streams keep about 26 MB of them at most.
 */
export const ENDED_KEPT = 16;
/**
 * Jobs remembered as delivered and not ended, at most: far above what a daemon
 * runs at once. Past it the oldest are forgotten (jobs that ended without a
 * word on this stream); none of them is pending any more, so none is pushed again.
 */
export const ACTIVE_KEPT = 1024;

export class DeliveredJobs {
  /** Insertion-ordered, so the first is the oldest. */
  private readonly active = new Set<string>();
  private readonly ended = new Set<string>();

  /** Pushed on this stream (or run by its daemon), and not taken away since. */
  has(jobId: string): boolean {
    return this.active.has(jobId) || this.ended.has(jobId);
  }

  /** Pushed to the daemon, or the daemon runs it. */
  add(jobId: string): void {
    if (this.ended.has(jobId)) return;
    this.active.add(jobId);
    if (this.active.size > ACTIVE_KEPT) this.active.delete(this.active.values().next().value as string);
  }

  /** The job ended on this stream: its result came, or the daemon gave it back. */
  end(jobId: string): void {
    this.active.delete(jobId);
    this.ended.delete(jobId);
    this.ended.add(jobId);
    if (this.ended.size > ENDED_KEPT) this.ended.delete(this.ended.values().next().value as string);
  }

  /** The job was cancelled or re-queued away: it may come back to this provider as a new attempt. */
  forget(jobId: string): void {
    this.active.delete(jobId);
    this.ended.delete(jobId);
  }

  /** Job ids remembered (for tests and memory figures). */
  get size(): number {
    return this.active.size + this.ended.size;
  }
}
