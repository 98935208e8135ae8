// One LISTEN connection per process for job assignments and cancels and for
// providers' settings changes, fanned out in memory to the daemon streams
// connected to this process. Any process may commit an assignment (job-events.ts
// NOTIFYs inside that transaction) or a settings change (a trigger does);
// every process hears it and hands it to the stream of that provider, if it
// holds one. After the LISTEN connection (re)connects, every subscriber is
// asked to resync from the database, since notices sent while it was down
// are lost; `generation` tells a stream whether that may have happened since
// it last looked. A connection can also go silent without an error (its host
// gone without a reset) until TCP's keepalive notices, minutes later: the hub
// sends itself a notice every PROBE_INTERVAL_MS, and while one is not heard
// back within PROBE_GRACE_MS it does not count as hearing everything.
import crypto from "node:crypto";
import type { Sql } from "../db/index.js";
import type { Logger } from "../log.js";
import { ASSIGNED_CHANNEL, CANCEL_CHANNEL, type AssignedJob, type JobSignal } from "../domain/notify/job-notices.js";
import { SETTINGS_CHANNEL } from "../domain/notify/provider-notices.js";

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

/** Each hub's notices to itself, that its LISTEN connection still hears. Payload: the hub's id, a colon, a count. */
const PROBE_CHANNEL = "svc_hub_probe";
export const PROBE_INTERVAL_MS = 10_000;
export const PROBE_GRACE_MS = 2_000;

const CHANNELS = [
  [ASSIGNED_CHANNEL, "assigned"],
  [CANCEL_CHANNEL, "cancel"],
  [SETTINGS_CHANNEL, "settings"],
  [PROBE_CHANNEL, "probe"],
] as const;

/** The provider and the job at the start of a notice: json_build_object's spacing (assignedNoticeSql) or JSON.stringify's (notifyCancel). */
const NOTICE_HEAD = /^\{"provider_id" ?: ?(\d+), ?"job_id" ?: ?"([^"\\]*)"/;

export class JobSignalHub {
  private readonly byProvider = new Map<number, Set<JobSignalListener>>();
  private started: Promise<void> | undefined;
  private unlisten: (() => Promise<void>)[] = [];
  private listens = 0;
  private listening = false;
  private missedCount = 0;
  private readonly probeId = crypto.randomUUID();
  private probes = 0;
  /** When the oldest probe not yet heard back was sent; 0: none outstanding. */
  private probeSentAt = 0;
  private probeTimer: NodeJS.Timeout | undefined;

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

  /** A mark of what this process has heard so far; see heardAllSince. */
  get generation(): number {
    return this.missedCount;
  }

  /**
   * Whether every notice committed since `generation` was read has reached this process: the hub
   * listened throughout, and its connection was not lost and listening again meanwhile.
   */
  heardAllSince(generation: number): boolean {
    return this.listening && generation === this.missedCount && !this.deaf();
  }

  /** A probe went unanswered past its grace: the connection may be silent. */
  private deaf(): boolean {
    return this.probeSentAt !== 0 && Date.now() - this.probeSentAt > PROBE_GRACE_MS;
  }

  /** Sends this hub a notice through the pool (also every PROBE_INTERVAL_MS while it listens). */
  async probe(): Promise<void> {
    if (!this.listening) return;
    if (this.probeSentAt === 0) this.probeSentAt = Date.now();
    // A probe that cannot be sent (the database is away) stays unanswered: the hub counts as deaf meanwhile.
    await this.sql`SELECT pg_notify(${PROBE_CHANNEL}, ${`${this.probeId}:${++this.probes}`})`.catch(() => {});
  }

  /** A probe came back: if the hub had counted as deaf, what it missed meanwhile is read again. */
  private probeHeard(payload: string): void {
    if (!payload.startsWith(`${this.probeId}:`)) return; // another process's
    const wasDeaf = this.deaf();
    this.probeSentAt = 0;
    if (wasDeaf) this.missed();
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
      const onListen = () => {
        // Every channel reports each (re)connection: after the first round, a channel listening again
        // may have missed notices (each one resyncs, as each may come back apart from the others).
        this.listens++;
        if (this.listens > CHANNELS.length) this.missed();
      };
      const handlers = {
        assigned: (payload: string) => this.dispatch("assigned", payload),
        cancel: (payload: string) => this.dispatch("cancel", payload),
        settings: (payload: string) => this.settingsChanged(payload),
        probe: (payload: string) => this.probeHeard(payload),
      };
      for (const [channel, kind] of CHANNELS) {
        const sub = await this.sql.listen(channel, handlers[kind], onListen);
        this.unlisten.push(sub.unlisten);
      }
      // Whatever was read while the hub did not listen may have missed notices since.
      this.missedCount++;
      this.listening = true;
      this.probeTimer = setInterval(() => void this.probe(), PROBE_INTERVAL_MS);
      this.probeTimer.unref();
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
    clearInterval(this.probeTimer);
    this.probeTimer = undefined;
    this.probeSentAt = 0;
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
