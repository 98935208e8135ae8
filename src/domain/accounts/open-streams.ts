// The streams open in this process, by the account whose key opened them. A
// stream's key is checked once, when it opens (services/secure.ts); when the
// account's keys are revoked (rotated, or the renter suspended), the
// invalidation that tells every process (invalidation.ts) ends its streams
// too, so a revoked key does not go on receiving a job's logs, or a daemon's
// jobs, for as long as the stream stays open. A client that still holds a
// valid key reconnects.
import { unauthorized } from "../../errors.js";
import type { KeyRole } from "./keys.js";

const open = new Map<string, Set<(reason: string) => void>>();
const keyOf = (role: KeyRole, accountId: number) => `${role}:${accountId}`;

export interface TrackedStream {
  /** Rejects (401) when the account's keys are revoked. */
  revoked: Promise<never>;
  /** The stream ended: forget it. */
  release(): void;
}

export function trackStream(role: KeyRole, accountId: number): TrackedStream {
  const key = keyOf(role, accountId);
  let end!: (reason: string) => void;
  const revoked = new Promise<never>((_, reject) => (end = (reason) => reject(unauthorized(reason))));
  revoked.catch(() => {}); // observed by the stream's own race; never an unhandled rejection
  let set = open.get(key);
  if (!set) open.set(key, (set = new Set()));
  set.add(end);
  return {
    revoked,
    release() {
      set.delete(end);
      if (set.size === 0 && open.get(key) === set) open.delete(key);
    },
  };
}

/** Ends the account's open streams in this process (their keys were revoked). */
export function endStreamsOf(role: KeyRole, accountId: number): number {
  const set = open.get(keyOf(role, accountId));
  if (!set) return 0;
  open.delete(keyOf(role, accountId));
  for (const end of set) end("the key this stream was opened with was revoked (rotated, or the account suspended); reconnect with a valid key");
  return set.size;
}
