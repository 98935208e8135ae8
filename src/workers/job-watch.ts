// Live job events for WatchJob and GET /api/jobs/{id}/events. One LISTEN per
// process on the job-watch channel (migration 019's triggers send the job's
// id from whichever process changed it); a notice for a job that watchers of
// this process follow starts one read of that job (readJobChanges), whose
// events are handed to all of them: a thousand watchers of one job cost one
// read per change in each process, not a thousand. Notices that arrive while
// a read is running fold into one more read after it. Notices lost while the
// LISTEN connection was down or silent (listen-probe.ts) are made up for by
// reading every followed job again.
import { Code, ConnectError } from "@connectrpc/connect";
import type { Sql } from "../db/index.js";
import type { Logger } from "../log.js";
import {
  JOB_WATCH_CHANNEL,
  WATCH_LOG_PAGE,
  WATCH_LOG_PAGE_CHARS,
  changeEvents,
  isFullPage,
  logEvent,
  outcomeEvent,
  readJobChanges,
  snapshotEvent,
  watchState,
  type JobChanges,
  type JobEventInit,
  type WatchState,
} from "../domain/jobs/job-watch.js";
import type { JobReader } from "../domain/jobs/jobs.js";
import { failureLevel } from "../errors.js";
import { ListenProbe } from "./listen-probe.js";

/** Events a watcher may have waiting before it is cut off (it resumes from its last cursor). */
export const MAX_QUEUED_EVENTS = 4 * WATCH_LOG_PAGE;
/**
 * Characters of log messages a watcher may have waiting, likewise: a reader that stops reading
 * pins what is queued for it (lines of up to 16,384 characters each).
 */
export const MAX_QUEUED_LOG_CHARS = 4 * WATCH_LOG_PAGE_CHARS;
/**
 * Watches one account (a renter, a provider) may hold open in one process at once: each holds a
 * connection, a watcher and what is queued for it until the job ends.
 */
export const MAX_WATCHES_PER_ACCOUNT = 32;
/** Retry-After (seconds) of a watcher cut for falling behind: it resumes from its cursor after a moment. */
export const FELL_BEHIND_RETRY_AFTER_SECONDS = 1;
/** Retry-After (seconds) of a watch refused past MAX_WATCHES_PER_ACCOUNT: long enough for one of them to end. */
export const TOO_MANY_WATCHES_RETRY_AFTER_SECONDS = 10;
/** How often a queued job's reason is read again (it changes with providers, which send no notice). */
const QUEUE_REFRESH_MS = 10_000;
/** Longest wait for slow watchers to take a page of log lines before the next page is read. */
const DRAIN_WAIT_MS = 5_000;

/**
 * A 429 as the wires carry a ServiceError of that status (src/http/errors.ts): resource_exhausted with
 * the documented status and Retry-After in its metadata, so that clients try again later (REST: 429,
 * its Retry-After) rather than take it for a final refusal. A ConnectError, not a ServiceError, as the
 * hub's other endings are.
 */
function tryAgainLater(message: string, retryAfterSeconds: number): ConnectError {
  return new ConnectError(message, Code.ResourceExhausted, { "x-svc-http-status": "429", "retry-after": String(retryAfterSeconds) });
}

const MOVED_ON = "this job moved to another provider; a provider watches a job only while it runs it";

/** The attempt numbers a provider held. */
function ownAttempts(c: JobChanges, providerId: number): Set<number> {
  return new Set(c.attempts.filter((a) => a.provider_id === providerId).map((a) => a.attempt));
}

/** A state with only these attempts (a provider's view). */
function scoped(s: WatchState, own: Set<number>): WatchState {
  const attempts = s.attempts.filter((a) => own.has(a.attempt!));
  return { ...s, attempts, attemptsKey: JSON.stringify(attempts.map((a) => [a.attempt, a.status, a.endedAt, a.endReason, String(a.costHalala)])) };
}

/** The characters of a log event's message (what a queued event holds that can be large). */
const logChars = (e: JobEventInit): number => (e.event?.case === "log" ? (e.event.value.message?.length ?? 0) : 0);

/** Whose watches count together against MAX_WATCHES_PER_ACCOUNT; none for an admin. */
function accountOf(reader: JobReader): string | undefined {
  if (reader.role === "renter") return `renter:${reader.renterId}`;
  if (reader.role === "provider") return `provider:${reader.providerId}`;
  return undefined;
}

/** One watch's queue of events (exported for tests). */
export class Watcher {
  private readonly queue: JobEventInit[] = [];
  private head = 0;
  private queuedChars = 0;
  private wake: (() => void) | undefined;
  private drained: (() => void) | undefined;
  /** Snapshot not yet sent. */
  fresh = true;
  done = false;
  error: ConnectError | undefined;

  constructor(
    /** Seq of the last log line this watcher was given. */
    public cursor: number,
    readonly reader: JobReader,
  ) {}

  get queued(): number {
    return this.queue.length - this.head;
  }

  push(e: JobEventInit): void {
    if (this.done) return;
    const chars = logChars(e);
    if (this.queued >= MAX_QUEUED_EVENTS || (this.queued > 0 && this.queuedChars + chars > MAX_QUEUED_LOG_CHARS)) {
      this.finish(tryAgainLater(`this watcher fell behind the job's events; watch again from cursor ${this.lastCursor()}`, FELL_BEHIND_RETRY_AFTER_SECONDS));
      return;
    }
    this.queue.push(e);
    this.queuedChars += chars;
    this.notify();
  }

  private lastCursor(): string {
    return this.head > 0 ? String(this.queue[this.head - 1].cursor) : "(the last event received)";
  }

  finish(error?: ConnectError): void {
    if (this.done) return;
    this.done = true;
    this.error = error;
    if (error) this.queue.length = this.head = this.queuedChars = 0;
    this.notify();
    this.drained?.();
  }

  private notify(): void {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  take(): JobEventInit | undefined {
    if (this.head >= this.queue.length) return undefined;
    const e = this.queue[this.head++];
    this.queuedChars -= logChars(e);
    if (this.head > 1024 && this.head * 2 > this.queue.length) {
      this.queue.splice(0, this.head);
      this.head = 0;
    }
    if (this.belowAPage()) this.drained?.();
    return e;
  }

  wait(signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const onAbort = () => resolve();
      signal.addEventListener("abort", onAbort, { once: true });
      const wake = () => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      };
      this.wake = wake;
    });
  }

  /** Less than a page waits: fewer events than a page holds, and fewer characters. */
  private belowAPage(): boolean {
    return this.queued < WATCH_LOG_PAGE && this.queuedChars < WATCH_LOG_PAGE_CHARS;
  }

  /** Resolves once less than a page of events waits (or the watcher ended). */
  untilDrained(): Promise<void> {
    if (this.done || this.belowAPage()) return Promise.resolve();
    return new Promise((resolve) => {
      const drained = () => {
        this.drained = undefined;
        resolve();
      };
      this.drained = drained;
    });
  }
}

class Feed {
  readonly watchers = new Set<Watcher>();
  prev: WatchState | undefined;
  running = false;
  dirty = false;
  constructor(readonly id: number) {}
}

export class JobWatchHub {
  private readonly feeds = new Map<number, Feed>();
  /** Open watches by account (accountOf). */
  private readonly perAccount = new Map<string, number>();
  private started: Promise<void> | undefined;
  private unlisten: (() => Promise<void>) | undefined;
  private listens = 0;
  private refresh: NodeJS.Timeout | undefined;
  private readonly listenProbe: ListenProbe;
  /** Reads of job changes made (for tests and the bench: one per change per process, however many watch). */
  reads = 0;

  constructor(
    private readonly sql: Sql,
    private readonly log: Logger,
  ) {
    // While the connection is silent no notice arrives: each followed job is read at every probe
    // left unanswered, and once more when the connection is heard again.
    // Those reads are a precaution: one that fails (the database away, or too busy to answer the
    // probe) ends no watch; the next probe reads again.
    const readAll = () => this.readAll(true);
    this.listenProbe = new ListenProbe(sql, { silent: readAll, heardAgain: readAll });
  }

  /** Watchers held by this process. */
  get watchers(): number {
    let n = 0;
    for (const f of this.feeds.values()) n += f.watchers.size;
    return n;
  }

  /**
   * The events of job `id` (internal id; the caller checked that `reader` may
   * read it), from log cursor `cursor`, until the job is terminal and all was
   * sent, or `signal` aborts.
   */
  async *watch(id: number, reader: JobReader, cursor: number, signal: AbortSignal): AsyncGenerator<JobEventInit> {
    const account = accountOf(reader);
    const open = account === undefined ? 0 : (this.perAccount.get(account) ?? 0);
    if (open >= MAX_WATCHES_PER_ACCOUNT) {
      throw tryAgainLater(`at most ${MAX_WATCHES_PER_ACCOUNT} job watches may be open at once; close one, or watch again later`, TOO_MANY_WATCHES_RETRY_AFTER_SECONDS);
    }
    if (account !== undefined) this.perAccount.set(account, open + 1);
    try {
      yield* this.follow(id, reader, cursor, signal);
    } finally {
      if (account !== undefined) {
        const left = (this.perAccount.get(account) ?? 1) - 1;
        if (left > 0) this.perAccount.set(account, left);
        else this.perAccount.delete(account);
      }
    }
  }

  private async *follow(id: number, reader: JobReader, cursor: number, signal: AbortSignal): AsyncGenerator<JobEventInit> {
    await this.start();
    const w = new Watcher(cursor, reader);
    let feed = this.feeds.get(id);
    if (!feed) this.feeds.set(id, (feed = new Feed(id)));
    feed.watchers.add(w);
    void this.run(feed);
    try {
      for (;;) {
        const e = w.take();
        if (e) {
          yield e;
          continue;
        }
        if (w.done) {
          if (w.error) throw w.error;
          return;
        }
        if (signal.aborted) return;
        await w.wait(signal);
      }
    } finally {
      w.finish();
      feed.watchers.delete(w);
      if (feed.watchers.size === 0 && !feed.running && this.feeds.get(id) === feed) this.feeds.delete(id);
    }
  }

  /** Reads every followed job again. */
  private readAll(precaution = false): void {
    for (const f of this.feeds.values()) void this.run(f, precaution);
  }

  private start(): Promise<void> {
    this.started ??= (async () => {
      // postgres.js keeps a listener whose LISTEN failed, and listens for it again on its own: the
      // handlers of a start that failed go quiet, or each notice would be read once more (and each
      // reconnection counted twice) once the next start adds its own.
      let live = true;
      // The job-watch channel and the probe's each report every (re)connection.
      const onListen = () => {
        // After a reconnect, notices sent while the connection was down are lost.
        if (live && ++this.listens > 2) this.readAll();
      };
      try {
        const sub = await this.sql.listen(
          JOB_WATCH_CHANNEL,
          (payload) => {
            const feed = live ? this.feeds.get(Number(payload)) : undefined;
            if (feed) void this.run(feed);
          },
          onListen,
        );
        this.unlisten = sub.unlisten;
        await this.listenProbe.listen(onListen);
      } catch (err) {
        live = false;
        throw err;
      }
      this.listenProbe.start();
      this.refresh = setInterval(() => {
        for (const f of this.feeds.values()) if (f.prev?.status.status === "queued") void this.run(f);
      }, QUEUE_REFRESH_MS);
      this.refresh.unref();
    })().catch((err) => {
      this.started = undefined;
      throw err;
    });
    return this.started;
  }

  /** Reads the job and hands out what changed; a call while a read runs asks for one more after it. */
  private async run(feed: Feed, precaution = false): Promise<void> {
    if (feed.running) {
      feed.dirty = true;
      return;
    }
    feed.running = true;
    try {
      do {
        feed.dirty = false;
        // Watchers that join during the read are served by the next one (their cursor may be older).
        const ws = [...feed.watchers].filter((w) => !w.done);
        if (ws.length === 0) break;
        const from = Math.min(...ws.map((w) => w.cursor));
        this.reads++;
        let c;
        try {
          c = await readJobChanges(this.sql, feed.id, from);
        } catch (err) {
          this.log[failureLevel(err)]({ err, job: feed.id }, "job watch read failed");
          if (precaution && !feed.dirty) break;
          for (const w of ws) w.finish(new ConnectError("could not read the job's events; watch again from the last cursor", Code.Unavailable));
          break;
        }
        if (!c) {
          for (const w of ws) w.finish(new ConnectError("job not found", Code.NotFound));
          break;
        }
        const next = watchState(c);
        const pageFull = isFullPage(c.logs);
        // Events are made once per read and handed to every watcher as the same objects (serialized
        // once, event-stream.ts); only those that carry a watcher's own cursor are made per cursor.
        const lines = c.logs.map(logEvent);
        const prev = feed.prev;
        const changes = new Map<number, ReturnType<typeof changeEvents>>();
        const outcomes = new Map<number, ReturnType<typeof outcomeEvent>>();
        const perCursor = <T>(m: Map<number, T>, cursor: number, make: () => T) => {
          let v = m.get(cursor);
          if (v === undefined) m.set(cursor, (v = make()));
          return v;
        };
        for (const w of ws) {
          if (w.done) continue;
          // A provider watches a job while it is the job's provider, and sees only its own attempts and their lines.
          const own = w.reader.role === "provider" ? ownAttempts(c, w.reader.providerId) : undefined;
          if (own && c.job.provider_id !== (w.reader as { providerId: number }).providerId) {
            w.finish(new ConnectError(MOVED_ON, Code.PermissionDenied));
            continue;
          }
          if (w.fresh) {
            w.push(snapshotEvent(c, own ? scoped(next, own) : next, w.reader, w.cursor));
            w.fresh = false;
          } else if (prev) {
            if (own) for (const e of changeEvents(scoped(prev, own), scoped(next, own), w.cursor)) w.push(e);
            else for (const e of perCursor(changes, w.cursor, () => changeEvents(prev, next, w.cursor))) w.push(e);
          }
          for (let i = 0; i < lines.length; i++) {
            if (c.logs[i].id <= w.cursor) continue;
            if (!own || own.has(c.logs[i].attempt)) w.push(lines[i]);
            w.cursor = c.logs[i].id;
          }
          if (next.terminal && !pageFull) {
            w.push(perCursor(outcomes, w.cursor, () => outcomeEvent(c, w.cursor)));
            w.finish();
          }
        }
        feed.prev = next;
        if (pageFull) {
          feed.dirty = true;
          await Promise.race([Promise.all(ws.map((w) => w.untilDrained())), new Promise((r) => setTimeout(r, DRAIN_WAIT_MS).unref())]);
        }
      } while (feed.dirty);
    } finally {
      feed.running = false;
      for (const w of feed.watchers) if (w.done) feed.watchers.delete(w);
      if (feed.watchers.size === 0 && this.feeds.get(feed.id) === feed) this.feeds.delete(feed.id);
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.refresh);
    const un = this.unlisten;
    this.unlisten = undefined;
    this.started = undefined;
    this.listens = 0;
    for (const f of this.feeds.values()) for (const w of f.watchers) w.finish(new ConnectError("the server is shutting down", Code.Unavailable));
    await Promise.all([un?.().catch(() => {}), this.listenProbe.stop()]);
  }
}

const hubs = new WeakMap<Sql, JobWatchHub>();

/** The hub of a pool: one LISTEN and one read per job change per process. */
export function jobWatchHub(sql: Sql, log: Logger): JobWatchHub {
  let hub = hubs.get(sql);
  if (!hub) hubs.set(sql, (hub = new JobWatchHub(sql, log)));
  return hub;
}
