// Group commit for heartbeats that change state (first beat, offline -> online;
// the provider's load row is no longer away once its group commits: heartbeat-write.ts).
// Beats that arrive while a group is being written wait for the next, and each
// group is one statement (writeStateRows) that locks the provider rows FOR NO
// KEY UPDATE in id order, moves them online and writes their telemetry; a beat
// is answered only after its group committed. A lone beat is a group of one:
// the rule has one path. Two beats of one provider in a group are merged.
//
// Two groups may be in the database at once (MAX_IN_FLIGHT): the next goes out
// while one is written, so this process's work and the database's overlap.
//
// A row another transaction holds (an admin action, the telemetry flush) is
// skipped by the group, and that beat is written alone outside the pipeline,
// waiting for the lock as long as it takes: one held row cannot stall the
// fleet, and the row lock still orders the beat against admin actions and the
// sweep. A group whose statement fails is written again one beat at a time,
// side by side, so one bad beat fails alone.
import type { Sql } from "../../db/index.js";
import { mergeInput, writeStateRows, type BeatSpan, type HeartbeatInput, type StateRow } from "./heartbeat-write.js";

/** Most providers in one group: bounds a statement's size and time. */
export const MAX_GROUP = 1000;
/**
 * Groups written at once. A second group goes out while the first is in the
 * database, so this process's work (answers, offers of work) and the
 * database's overlap; their rows never clash (a row the other holds is
 * skipped and written alone).
 */
export const MAX_IN_FLIGHT = 2;

interface Waiting {
  resolve: (row: StateRow | undefined) => void;
  reject: (err: unknown) => void;
}

/** One provider's beats in a group. */
interface Entry {
  span: BeatSpan;
  waiters: Waiting[];
}

/**
 * Called once per written group (or beat written alone) after it committed and
 * before its beats are answered, with the rows written: the caller updates its
 * cache and offers work. Must not throw.
 */
export type AfterCommit = (rows: StateRow[]) => Promise<void>;

export class StateBeatBatcher {
  private waiting = new Map<number, Entry>();
  private inFlight = 0;
  /** Groups written (statements in the pipeline), for tests and metrics. */
  groups = 0;

  constructor(
    private readonly sql: Sql,
    private readonly afterCommit: AfterCommit,
    private readonly maxGroup = MAX_GROUP,
    private readonly maxInFlight = MAX_IN_FLIGHT,
  ) {}

  /**
   * Resolves with the provider's row after the beat committed, or undefined when the provider does
   * not exist. `at` is the beat's performance.now(): the write stores the database's now() less the
   * beat's age (heartbeat-write.ts beatsSql), never a time of this host's clock. `since` is the
   * first of earlier beats, not yet written, whose input `input` already carries (merged before it).
   */
  write(providerId: number, at: number, input: HeartbeatInput, since = at): Promise<StateRow | undefined> {
    return new Promise((resolve, reject) => {
      const w: Waiting = { resolve, reject };
      const e = this.waiting.get(providerId);
      if (e) {
        e.span = { firstTs: Math.min(e.span.firstTs, since), lastTs: Math.max(e.span.lastTs, at), input: mergeInput(e.span.input, input) };
        e.waiters.push(w);
      } else {
        this.waiting.set(providerId, { span: { firstTs: since, lastTs: at, input }, waiters: [w] });
      }
      this.next();
    });
  }

  /** Beats waiting for a group (tests). */
  get queued(): number {
    let n = 0;
    for (const e of this.waiting.values()) n += e.waiters.length;
    return n;
  }

  private next(): void {
    if (this.inFlight >= this.maxInFlight || this.waiting.size === 0) return;
    const group = new Map<number, Entry>();
    for (const [id, e] of this.waiting) {
      if (group.size >= this.maxGroup) break;
      group.set(id, e);
      this.waiting.delete(id);
    }
    this.inFlight++;
    this.groups++;
    const entries = [...group].sort((a, b) => a[0] - b[0]);
    const written = writeStateRows(this.sql, entries.map(([id, e]) => [id, e.span]), true);
    // The pipeline is free once the statement ends; answering happens beside it.
    void written.then(
      () => this.free(),
      () => this.free(),
    );
    void this.settle(entries, written);
  }

  private free(): void {
    this.inFlight--;
    this.next();
  }

  private async settle(entries: [number, Entry][], written: Promise<StateRow[]>): Promise<void> {
    let rows: StateRow[];
    try {
      rows = await written;
    } catch (err) {
      if (entries.length === 1) return fail(entries[0][1], err);
      await Promise.all(entries.map(([id, e]) => this.alone(id, e)));
      return;
    }
    const byId = new Map(rows.map((r) => [r.id, r]));
    const held = entries.filter(([id]) => !byId.has(id));
    await Promise.all([this.finish(entries.filter(([id]) => byId.has(id)), byId), ...held.map(([id, e]) => this.alone(id, e))]);
  }

  /** Outside the pipeline: one provider's beats, waiting for its row lock. */
  private async alone(id: number, e: Entry): Promise<void> {
    try {
      const rows = await writeStateRows(this.sql, [[id, e.span]], false);
      await this.finish([[id, e]], new Map(rows.map((r) => [r.id, r])));
    } catch (err) {
      fail(e, err);
    }
  }

  private async finish(entries: [number, Entry][], rows: Map<number, StateRow>): Promise<void> {
    const written = entries.map(([id]) => rows.get(id)).filter((r): r is StateRow => r !== undefined);
    // Committed whatever the callback does (it logs its own failures): the beats are answered.
    if (written.length > 0) await this.afterCommit(written).catch(() => undefined);
    for (const [id, e] of entries) for (const w of e.waiters) w.resolve(rows.get(id));
  }
}

function fail(e: Entry, err: unknown): void {
  for (const w of e.waiters) w.reject(err);
}
