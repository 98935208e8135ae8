// A submit or a top-up whose answer never came may or may not have been done.
// As docs/operations.md asks of every client, svc sends each with an
// Idempotency-Key (--idempotency-key, else a new one) and, when no answer came
// (a connection refused, reset or cut, a server restarting), sends it again
// with the same key a few times: the server answers what the first one did,
// and never does it twice. Past those tries, it names the key that gets the
// answer later. The server's own answers (a refusal, "try again later") are
// not sent again, but for "still in progress" (409 with Retry-After: a card
// top-up whose first try is still at the gateway), which is waited for.
import crypto from "node:crypto";
import { Code, ConnectError } from "@connectrpc/connect";
import { metadataValue, noAnswer, terminalSafe } from "./output.js";

/** Tries after the first: enough for a blip (a reset, a restart of a second or two), not an outage. */
export const RESENDS = 3;
/** Waits before each of them, in ms. */
const BACKOFF_MS = [500, 1_000, 2_000] as const;

/** The Idempotency-Key of a request: the one given, else a new random one. */
export const idempotencyKeyOf = (given: string | undefined): string => given || crypto.randomUUID();

const say = (text: string) => void process.stderr.write(`svc: ${terminalSafe(text, { singleLine: true })}\n`);

/** The server's "still in progress; retry" (its 409 with Retry-After), in ms; undefined for any other error. */
function inProgressMs(err: ConnectError): number | undefined {
  if (Number(metadataValue(err.metadata, "x-svc-http-status")) !== 409) return undefined;
  const s = Number(metadataValue(err.metadata, "retry-after"));
  return Number.isFinite(s) && s > 0 ? s * 1000 : undefined;
}

/** How long svc waits for a first try still in progress (a card top-up at the gateway answers within 15 s). */
const IN_PROGRESS_WAIT_MS = 30_000;

/**
 * Runs `call` (which sends `key` as its Idempotency-Key) and sends it again while no answer came, up to
 * RESENDS times. `what` names the request in what svc says ("submit", "top-up").
 */
export async function resendWithKey<T>(what: string, key: string, call: () => Promise<T>): Promise<T> {
  const started = Date.now();
  for (let resent = 0; ; ) {
    try {
      return await call();
    } catch (err) {
      if (!(err instanceof ConnectError)) throw err;
      const lost = noAnswer(err);
      // A deadline that passed has waited SVC_TIMEOUT_SECONDS already: svc does not wait that again.
      if (lost && resent < RESENDS && err.code !== Code.DeadlineExceeded) {
        say(`no answer to the ${what} (${err.rawMessage}); sending it again with the same idempotency key…`);
        await new Promise((r) => setTimeout(r, BACKOFF_MS[resent++]));
        continue;
      }
      // Sent again, it met the first try still at work: its answer comes once that one ends.
      const inProgress = resent > 0 ? inProgressMs(err) : undefined;
      if (inProgress !== undefined && Date.now() + inProgress - started < IN_PROGRESS_WAIT_MS) {
        await new Promise((r) => setTimeout(r, inProgress));
        continue;
      }
      if (lost) say(`the ${what} may have been done: send it again with --idempotency-key ${key} to get its answer (never a second one)`);
      throw err;
    }
  }
}
