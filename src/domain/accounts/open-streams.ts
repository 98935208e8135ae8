// The streams open in this process, by the account whose key opened them. A
// stream's key is checked once, when it opens (services/secure.ts, and each
// /v1 chat completion in http/v1/router.ts); when the account's keys are
// revoked (rotated, or the renter suspended), the invalidation that tells
// every process (invalidation.ts) ends its streams too, so a revoked key does
// not go on receiving a job's logs, or a daemon's jobs, or generated tokens,
// for as long as the stream stays open. A client that still holds a valid key
// reconnects.
//
// That notice can be lost (the listener's connection dropped while it was
// sent), so the keys of the open streams are also checked against the
// database, all in one query: when the listener reconnects (invalidation.ts)
// and every KEY_CACHE_TTL_MS while any stream is open, the bound the key cache
// keeps for a revoked key. A stream keeps the SHA-256 of its key for that,
// never the key.
//
// Streams are kept per database pool (the process's one; a test process runs
// several servers, each on its own database), so a check only judges the
// streams opened against the database it reads.
import type { Sql } from "../../db/index.js";
import { unauthorized } from "../../errors.js";
import { KEY_CACHE_TTL_MS } from "./key-cache.js";
import type { KeyRole } from "./keys.js";

const REVOKED_REASON = "the key this stream was opened with was revoked (rotated, or the account suspended); reconnect with a valid key";

/** Who opened a stream, and with which key. */
export interface StreamOwner {
  role: KeyRole;
  accountId: number;
  /** SHA-256 of the key, base64 (keyHashOf in key-cache.ts): what api_keys.key_hash holds. */
  keyHash: string;
}

interface Stream {
  accounts: Map<number, Set<Stream>>;
  accountId: number;
  keyHash: string;
  open: boolean;
  onRevoked: (reason: string) => void;
}

interface Scope {
  /** Open streams by role, then account id. */
  byAccount: Record<KeyRole, Map<number, Set<Stream>>>;
  timer: NodeJS.Timeout;
  /** The check running now, and whether another was asked for meanwhile. */
  checking?: Promise<number>;
  again: boolean;
}

const scopes = new Map<Sql, Scope>();

function scopeOf(db: Sql): Scope {
  let scope = scopes.get(db);
  if (scope) return scope;
  const created: Scope = {
    byAccount: { provider: new Map(), renter: new Map() },
    timer: setInterval(() => {
      // An account's set outlives its streams until here: creating and dropping it with each /v1
      // request cost several times what the rest of tracking one does.
      let open = 0;
      for (const accounts of Object.values(created.byAccount)) {
        for (const [id, set] of accounts) {
          if (set.size === 0) accounts.delete(id);
          else open += set.size;
        }
      }
      if (open === 0) {
        // Nothing open: stop until a stream opens again.
        clearInterval(created.timer);
        if (scopes.get(db) === created) scopes.delete(db);
        return;
      }
      // A failure (the database away) is made up for by the next period or the listener's reconnect.
      recheckOpenStreams(db).catch(() => {});
    }, KEY_CACHE_TTL_MS),
    again: false,
  };
  created.timer.unref();
  scopes.set(db, created);
  return created;
}

function forget(s: Stream): void {
  s.open = false;
  s.accounts.get(s.accountId)?.delete(s); // an empty set is dropped by the period's tick
}

/**
 * Calls `onRevoked` (once) when the key the stream was opened with is revoked;
 * returns the function that forgets the stream when it ends. Cheap enough for
 * every /v1 request (about 0.1 µs with its release): map lookups and a set
 * insertion, no timer or promise of its own.
 */
export function watchRevocation(db: Sql, owner: StreamOwner, onRevoked: (reason: string) => void): () => void {
  const accounts = scopeOf(db).byAccount[owner.role];
  const s: Stream = { accounts, accountId: owner.accountId, keyHash: owner.keyHash, open: true, onRevoked };
  let set = accounts.get(owner.accountId);
  if (!set) accounts.set(owner.accountId, (set = new Set()));
  set.add(s);
  return () => {
    if (s.open) forget(s);
  };
}

export interface TrackedStream {
  /** Rejects (401) when the stream's key is revoked. */
  revoked: Promise<never>;
  /** The stream ended: forget it. */
  release(): void;
}

export function trackStream(db: Sql, owner: StreamOwner): TrackedStream {
  let end!: (reason: string) => void;
  const revoked = new Promise<never>((_, reject) => (end = (reason) => reject(unauthorized(reason))));
  revoked.catch(() => {}); // observed by the stream's own race; never an unhandled rejection
  return { revoked, release: watchRevocation(db, owner, end) };
}

function endAll(streams: Iterable<Stream>): number {
  let n = 0;
  for (const s of [...streams]) {
    if (!s.open) continue;
    forget(s);
    s.onRevoked(REVOKED_REASON);
    n++;
  }
  return n;
}

/** Ends the account's open streams (its keys were revoked). */
export function endStreamsOf(db: Sql, role: KeyRole, accountId: number): number {
  const set = scopes.get(db)?.byAccount[role].get(accountId);
  return set ? endAll(set) : 0;
}

/**
 * Checks the key of every stream open against `db` and ends those whose key
 * is revoked or whose renter is suspended: one query for them all. Resolves
 * to how many it ended. Asked again while a check runs, it runs once more
 * after it (a revocation may have committed after that check read).
 */
export function recheckOpenStreams(db: Sql): Promise<number> {
  const scope = scopes.get(db);
  if (!scope) return Promise.resolve(0);
  if (scope.checking) {
    scope.again = true;
    return scope.checking;
  }
  const run = async () => {
    let ended = 0;
    do {
      scope.again = false;
      ended += await checkOnce(db, scope);
    } while (scope.again);
    return ended;
  };
  const checking = run().finally(() => {
    if (scope.checking === checking) scope.checking = undefined;
  });
  scope.checking = checking;
  return checking;
}

async function checkOnce(db: Sql, scope: Scope): Promise<number> {
  const streams: Stream[] = [];
  const hashes = new Set<string>();
  for (const accounts of Object.values(scope.byAccount)) {
    for (const set of accounts.values()) {
      for (const s of set) {
        streams.push(s);
        hashes.add(s.keyHash);
      }
    }
  }
  if (streams.length === 0) return 0;
  // The same judgement as a key lookup (keys.ts lookupKey): a key not revoked, of no suspended renter.
  const rows = await db<{ h: string }[]>`
    SELECT encode(k.key_hash, 'base64') AS h
    FROM api_keys k LEFT JOIN renters r ON r.id = k.renter_id
    WHERE k.key_hash IN (SELECT decode(t.h, 'base64') FROM unnest(${[...hashes]}::text[]) AS t(h))
      AND k.revoked_at IS NULL AND r.status IS DISTINCT FROM 'suspended'`;
  const valid = new Set(rows.map((r) => r.h));
  // Only the streams read above: one opened meanwhile had its key checked as it opened.
  return endAll(streams.filter((s) => !valid.has(s.keyHash)));
}

/** Streams open against `db` in this process (tests, metrics). */
export function openStreamCount(db: Sql): number {
  const scope = scopes.get(db);
  let n = 0;
  for (const accounts of scope ? Object.values(scope.byAccount) : []) for (const set of accounts.values()) n += set.size;
  return n;
}
