// A LISTEN connection can go silent without an error (its host gone without a
// reset) until TCP's keepalive notices, minutes later, and the notices sent
// meanwhile never arrive. A hub that listens sends itself a notice every
// PROBE_INTERVAL_MS through the pool; while one is not heard back within
// PROBE_GRACE_MS the hub counts as deaf (`silent` is called then, and again at
// each interval it stays so), and once one is heard again `heardAgain` is
// called: what was read from notices meanwhile must be read again.
import crypto from "node:crypto";
import type { Sql } from "../db/index.js";

/** Every probe's notices. Payload: the probe's id, a colon, a count; each probe ignores the others'. */
export const PROBE_CHANNEL = "svc_hub_probe";
export const PROBE_INTERVAL_MS = 10_000;
export const PROBE_GRACE_MS = 2_000;

export interface ProbeHooks {
  /** A probe went unanswered past its grace (and again at each interval while none is answered). */
  silent?(): void;
  /** A probe came back after the hub had counted as deaf. */
  heardAgain(): void;
}

export class ListenProbe {
  private readonly id = crypto.randomUUID();
  private sent = 0;
  /** When the oldest probe not yet heard back was sent; 0: none outstanding. */
  private sentAt = 0;
  private timer: NodeJS.Timeout | undefined;
  private unlisten: (() => Promise<void>) | undefined;

  constructor(
    private readonly sql: Sql,
    private readonly hooks: ProbeHooks,
  ) {}

  /**
   * Listens for this probe's notices, on the pool's LISTEN connection like the hub's own channels
   * (postgres.js holds one per pool). `onListen` is called on each (re)connection, as by sql.listen.
   */
  async listen(onListen?: () => void): Promise<void> {
    const sub = await this.sql.listen(PROBE_CHANNEL, (payload) => this.heard(payload), onListen);
    this.unlisten = sub.unlisten;
  }

  /** Probes every PROBE_INTERVAL_MS from now on: called once the hub listens on all its channels. */
  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.send(), PROBE_INTERVAL_MS);
    this.timer.unref();
  }

  /** A probe went unanswered past its grace: the connection may be silent. */
  get deaf(): boolean {
    return this.sentAt !== 0 && Date.now() - this.sentAt >= PROBE_GRACE_MS;
  }

  /** Sends a probe now (also every PROBE_INTERVAL_MS once started); no-op before start(). */
  async send(): Promise<void> {
    if (!this.timer) return;
    if (this.sentAt === 0) this.sentAt = Date.now();
    setTimeout(() => {
      if (this.timer && this.deaf) this.hooks.silent?.();
    }, PROBE_GRACE_MS + 50).unref(); // a margin: the timer's clock may lag Date.now()
    // A probe that cannot be sent (the database is away) stays unanswered: the hub counts as deaf meanwhile.
    await this.sql`SELECT pg_notify(${PROBE_CHANNEL}, ${`${this.id}:${++this.sent}`})`.catch(() => {});
  }

  private heard(payload: string): void {
    if (!payload.startsWith(`${this.id}:`)) return; // another hub's or process's
    const wasDeaf = this.deaf;
    this.sentAt = 0;
    if (wasDeaf) this.hooks.heardAgain();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    this.sentAt = 0;
    const un = this.unlisten;
    this.unlisten = undefined;
    await un?.().catch(() => {});
  }
}
