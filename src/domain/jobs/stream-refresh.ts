// A daemon stream reads its provider's settings and pending jobs when a notice
// may not have reached it: on a settings notice, after the LISTEN connection
// came back, and on a heartbeat after a push of the stream failed or while the
// process did not listen or hear (src/services/daemon.ts). Reads asked for while one
// is in flight wait for the next, which reads all of their providers with two
// set-based statements (group commit's shape, for reads): one read at a time
// per process, as large as the load makes it (after a reconnect, every stream
// of the process asks at once).
import type { Sql } from "../../db/index.js";
import { pendingJobIdsOf } from "./job-reports.js";
import { daemonSettingsOf, type DaemonSettingsRow } from "../providers/providers.js";

/** Providers per statement; a larger wave is read in several. */
const MAX_IDS = 5000;

export interface StreamState {
  /** Undefined when the provider no longer exists. */
  settings: DaemonSettingsRow | undefined;
  /** Its pending jobs, in assignment order. */
  pending: string[];
}

interface Waiter {
  resolve(s: StreamState): void;
  reject(err: unknown): void;
}

export class StreamRefresher {
  private waiting = new Map<number, Waiter[]>();
  private reading = false;
  /** Reads made (each covering every provider that asked meanwhile); for tests and metrics. */
  reads = 0;

  constructor(private readonly sql: Sql) {}

  /** The provider's settings and pending jobs, read after this call. */
  state(providerId: number): Promise<StreamState> {
    return new Promise((resolve, reject) => {
      const list = this.waiting.get(providerId);
      if (list) list.push({ resolve, reject });
      else this.waiting.set(providerId, [{ resolve, reject }]);
      if (!this.reading) {
        this.reading = true;
        setImmediate(() => void this.drain());
      }
    });
  }

  private async drain(): Promise<void> {
    while (this.waiting.size > 0) {
      const wave = this.waiting;
      this.waiting = new Map();
      const ids = [...wave.keys()];
      for (let from = 0; from < ids.length; from += MAX_IDS) {
        const chunk = ids.slice(from, from + MAX_IDS);
        try {
          const [settings, pending] = await Promise.all([daemonSettingsOf(this.sql, chunk), pendingJobIdsOf(this.sql, chunk)]);
          this.reads++;
          for (const id of chunk) {
            const state = { settings: settings.get(id), pending: pending.get(id) ?? [] };
            for (const w of wave.get(id)!) w.resolve(state);
          }
        } catch (err) {
          for (const id of chunk) for (const w of wave.get(id)!) w.reject(err);
        }
      }
    }
    this.reading = false;
  }
}

const refreshers = new WeakMap<Sql, StreamRefresher>();

/** The refresher of a pool: one per process, shared by its streams. */
export function streamRefresher(sql: Sql): StreamRefresher {
  let r = refreshers.get(sql);
  if (!r) refreshers.set(sql, (r = new StreamRefresher(sql)));
  return r;
}
