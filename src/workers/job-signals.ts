// One LISTEN connection per process for job assignments and cancels and for
// providers' settings changes, fanned out in memory to the daemon streams
// connected to this process. Any process may commit an assignment (job-events.ts
// NOTIFYs inside that transaction) or a settings change (a trigger does);
// every process hears it and hands it to the stream of that provider, if it
// holds one. After the LISTEN connection (re)connects, every subscriber is
// asked to resync from the database, since notices sent while it was down
// are lost; `generation` tells a stream whether that may have happened since
// it last looked. A connection can also go silent without an error: while the
// hub's probe (listen-probe.ts) goes unanswered it does not count as hearing
// everything, and once it is heard again every subscriber resyncs.
import type { Sql } from "../db/index.js";
import type { Logger } from "../log.js";
import { ASSIGNED_CHANNEL, CANCEL_CHANNEL, type AssignedJob, type JobSignal } from "../domain/notify/job-notices.js";
import { SETTINGS_CHANNEL } from "../domain/notify/provider-notices.js";
import { ListenProbe } from "./listen-probe.js";

export { PROBE_GRACE_MS, PROBE_INTERVAL_MS } from "./listen-probe.js";

export interface JobSignalListener {
  /**
   * `job` gives what the daemon is sent, when the notice carried it: read from the notice only when
   * called, so a listener that has the job already does not parse it. `canonical`: its task spec's
   * canonical JSON, when this process made the job and signed that (assignedHere): no need to
   * verify its HMAC again.
   */
  assigned(jobId: string, job?: () => AssignedJob | undefined, canonical?: string): void;
  cancel(jobId: string): void;
  /** The provider's settings changed. */
  settings(): void;
  /** Notices may have been missed: look at the database again. */
  resync(): void;
}

const CHANNELS = [
  [ASSIGNED_CHANNEL, "assigned"],
  [CANCEL_CHANNEL, "cancel"],
  [SETTINGS_CHANNEL, "settings"],
] as const;
/** Each channel, and the probe's, reports each (re)connection. */
const LISTENS_PER_CONNECTION = CHANNELS.length + 1;

/** The provider and the job at the start of a notice: json_build_object's spacing (assignedNoticeSql) or JSON.stringify's (notifyCancel). */
const NOTICE_HEAD = /^\{"provider_id" ?: ?(\d+), ?"job_id" ?: ?"([^"\\]*)"/;

export class JobSignalHub {
  private readonly byProvider = new Map<number, Set<JobSignalListener>>();
  private started: Promise<void> | undefined;
  private unlisten: (() => Promise<void>)[] = [];
  private listens = 0;
  private listening = false;
  private missedCount = 0;
  private readonly listenProbe: ListenProbe;

  constructor(
    private readonly sql: Sql,
    private readonly log: Logger,
  ) {
    // Heard again after counting as deaf: what was missed meanwhile is read again.
    this.listenProbe = new ListenProbe(sql, { heardAgain: () => this.missed() });
  }

  /** Subscribes a stream; resolves once the LISTEN is in place (so no later assignment is missed). */
  async subscribe(providerId: number, listener: JobSignalListener): Promise<() => void> {
    let set = this.byProvider.get(providerId);
    if (!set) this.byProvider.set(providerId, (set = new Set()));
    set.add(listener);
    const unsubscribe = () => {
      const s = this.byProvider.get(providerId);
      s?.delete(listener);
      if (s && s.size === 0) this.byProvider.delete(providerId);
    };
    try {
      await this.start();
    } catch (err) {
      // Its caller gets no unsubscribe: kept, the listener (and the stream it holds) would be handed every later notice.
      unsubscribe();
      throw err;
    }
    return unsubscribe;
  }

  /** A mark of what this process has heard so far; see heardAllSince. */
  get generation(): number {
    return this.missedCount;
  }

  /**
   * Whether every notice committed since `generation` was read has reached this process: the hub
   * listened throughout, and its connection was not lost and listening again meanwhile.
   */
  heardAllSince(generation: number): boolean {
    return this.listening && generation === this.missedCount && !this.listenProbe.deaf;
  }

  /** Sends this hub a notice through the pool (also every PROBE_INTERVAL_MS while it listens). */
  probe(): Promise<void> {
    return this.listenProbe.send();
  }

  /** Notices may have been missed: every subscriber reads the database again. */
  private missed(): void {
    this.missedCount++;
    for (const set of this.byProvider.values()) for (const l of set) l.resync();
  }

  /** Streams of this process (for tests and metrics). */
  get subscribers(): number {
    let n = 0;
    for (const s of this.byProvider.values()) n += s.size;
    return n;
  }

  private start(): Promise<void> {
    this.started ??= (async () => {
      // postgres.js keeps a listener whose LISTEN failed, and listens for it again on its own: the
      // handlers of a start that failed go quiet, or each notice would be handled once more per
      // failed start once the next start adds its own.
      let live = true;
      const onListen = () => {
        if (!live) return;
        // Every channel reports each (re)connection: after the first round, a channel listening again
        // may have missed notices (each one resyncs, as each may come back apart from the others).
        this.listens++;
        if (this.listens > LISTENS_PER_CONNECTION) this.missed();
      };
      const handlers = {
        assigned: (payload: string) => live && this.dispatch("assigned", payload),
        cancel: (payload: string) => live && this.dispatch("cancel", payload),
        settings: (payload: string) => live && this.settingsChanged(payload),
      };
      try {
        for (const [channel, kind] of CHANNELS) {
          const sub = await this.sql.listen(channel, handlers[kind], onListen);
          this.unlisten.push(sub.unlisten);
        }
        await this.listenProbe.listen(onListen);
      } catch (err) {
        live = false;
        throw err;
      }
      // Whatever was read while the hub did not listen may have missed notices since.
      this.missedCount++;
      this.listening = true;
      this.listenProbe.start();
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
    this.deliver("assigned", providerId, job.job_id, () => job, canonical);
  }

  /**
   * Every process hears every notice, and most concern providers whose streams are elsewhere, or a
   * job this process pushed already: the provider and the job are read from the notice's head, and
   * the rest (the job, a kilobyte or more of JSON) is parsed only when a stream asks for it.
   */
  private dispatch(kind: "assigned" | "cancel", payload: string): void {
    const head = NOTICE_HEAD.exec(payload);
    if (head) {
      let parsed: JobSignal | undefined;
      this.deliver(kind, Number(head[1]), head[2], () => (parsed ??= JSON.parse(payload) as JobSignal).job);
      return;
    }
    let signal: JobSignal;
    try {
      signal = JSON.parse(payload);
    } catch {
      this.log.warn({ payload: payload.slice(0, 200) }, "ignored a malformed job signal");
      return;
    }
    this.deliver(kind, Number(signal.provider_id), signal.job_id, () => signal.job);
  }

  private deliver(kind: "assigned" | "cancel", providerId: number, jobId: string, job: () => AssignedJob | undefined, canonical?: string): void {
    const set = this.byProvider.get(providerId);
    if (!set) return;
    for (const l of set) {
      try {
        if (kind === "assigned") l.assigned(jobId, job, canonical);
        else l.cancel(jobId);
      } catch (err) {
        this.log.error({ err }, "job signal listener failed");
      }
    }
  }

  private settingsChanged(payload: string): void {
    const set = this.byProvider.get(Number(payload));
    if (!set) return;
    for (const l of set) {
      try {
        l.settings();
      } catch (err) {
        this.log.error({ err }, "provider signal listener failed");
      }
    }
  }

  async stop(): Promise<void> {
    const fns = this.unlisten;
    this.unlisten = [];
    this.started = undefined;
    this.listening = false;
    this.listens = 0;
    await Promise.all([...fns.map((f) => f().catch(() => {})), this.listenProbe.stop()]);
  }
}

const hubs = new WeakMap<Sql, JobSignalHub>();

/** The hub of a pool: one LISTEN connection per process. */
export function jobSignalHub(sql: Sql, log: Logger): JobSignalHub {
  let hub = hubs.get(sql);
  if (!hub) hubs.set(sql, (hub = new JobSignalHub(sql, log)));
  return hub;
}
