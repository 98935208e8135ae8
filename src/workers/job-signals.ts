// One LISTEN connection per process for job assignments and cancels, fanned
// out in memory to the daemon streams connected to this process. Any process
// may commit an assignment (job-events.ts NOTIFYs inside that transaction);
// every process hears it and hands it to the stream of that provider, if it
// holds one. After the LISTEN connection (re)connects, every subscriber is
// asked to resync from the database, since notices sent while it was down
// are lost.
import type { Sql } from "../db/index.js";
import type { Logger } from "../log.js";
import { ASSIGNED_CHANNEL, CANCEL_CHANNEL, type AssignedJob, type JobSignal } from "../domain/notify/job-notices.js";

export interface JobSignalListener {
  /**
   * `job` is what the daemon is sent, when the notice carried it. `canonical`: its task spec's
   * canonical JSON, when this process made the job and signed that (assignedHere): no need to
   * verify its HMAC again.
   */
  assigned(jobId: string, job?: AssignedJob, canonical?: string): void;
  cancel(jobId: string): void;
  /** Notices may have been missed: look at the database again. */
  resync(): void;
}

export class JobSignalHub {
  private readonly byProvider = new Map<number, Set<JobSignalListener>>();
  private started: Promise<void> | undefined;
  private unlisten: (() => Promise<void>)[] = [];
  private listens = 0;

  constructor(
    private readonly sql: Sql,
    private readonly log: Logger,
  ) {}

  /** Subscribes a stream; resolves once the LISTEN is in place (so no later assignment is missed). */
  async subscribe(providerId: number, listener: JobSignalListener): Promise<() => void> {
    let set = this.byProvider.get(providerId);
    if (!set) this.byProvider.set(providerId, (set = new Set()));
    set.add(listener);
    await this.start();
    return () => {
      const s = this.byProvider.get(providerId);
      s?.delete(listener);
      if (s && s.size === 0) this.byProvider.delete(providerId);
    };
  }

  /** Streams of this process (for tests and metrics). */
  get subscribers(): number {
    let n = 0;
    for (const s of this.byProvider.values()) n += s.size;
    return n;
  }

  private start(): Promise<void> {
    this.started ??= (async () => {
      const onListen = () => {
        // Both channels report (re)connection; resync once per pair after the first.
        this.listens++;
        if (this.listens > 2) for (const set of this.byProvider.values()) for (const l of set) l.resync();
      };
      for (const [channel, kind] of [
        [ASSIGNED_CHANNEL, "assigned"],
        [CANCEL_CHANNEL, "cancel"],
      ] as const) {
        const sub = await this.sql.listen(channel, (payload) => this.dispatch(kind, payload), onListen);
        this.unlisten.push(sub.unlisten);
      }
    })().catch((err) => {
      this.started = undefined;
      throw err;
    });
    return this.started;
  }

  /**
   * An assignment this process has just committed (the submit's own job): handed
   * to this process's streams of that provider at once, instead of after its
   * notice has gone through PostgreSQL and back. The notice still reaches the
   * other processes; here it finds the job delivered (a stream pushes a job once).
   */
  assignedHere(providerId: number, job: AssignedJob, canonical?: string): void {
    this.deliver("assigned", { provider_id: providerId, job_id: job.job_id, job }, canonical);
  }

  private dispatch(kind: "assigned" | "cancel", payload: string): void {
    let signal: JobSignal;
    try {
      signal = JSON.parse(payload);
    } catch {
      this.log.warn({ payload: payload.slice(0, 200) }, "ignored a malformed job signal");
      return;
    }
    this.deliver(kind, signal);
  }

  private deliver(kind: "assigned" | "cancel", signal: JobSignal, canonical?: string): void {
    const set = this.byProvider.get(Number(signal.provider_id));
    if (!set) return;
    for (const l of set) {
      try {
        if (kind === "assigned") l.assigned(signal.job_id, signal.job, canonical);
        else l.cancel(signal.job_id);
      } catch (err) {
        this.log.error({ err }, "job signal listener failed");
      }
    }
  }

  async stop(): Promise<void> {
    const fns = this.unlisten;
    this.unlisten = [];
    this.started = undefined;
    await Promise.all(fns.map((f) => f().catch(() => {})));
  }
}

const hubs = new WeakMap<Sql, JobSignalHub>();

/** The hub of a pool: one LISTEN connection per process. */
export function jobSignalHub(sql: Sql, log: Logger): JobSignalHub {
  let hub = hubs.get(sql);
  if (!hub) hubs.set(sql, (hub = new JobSignalHub(sql, log)));
  return hub;
}
