// login-email for both account kinds. Without email delivery configured the
// documented one-step answer applies (refused in production: anyone knowing
// an address would get a key). With EMAIL_API_KEY, the first call mails a
// one-time code and the second call, with the code, issues an extra key.
// Guessing is bounded per account, whatever the callers' addresses: one live
// code (5 wrong guesses), 5 codes an hour, 10 wrong guesses an hour (429).
// The retention sweep deletes the codes those limits no longer count.
import crypto from "node:crypto";
import type { Config } from "../../config.js";
import type { Db, Sql, Tx } from "../../db/index.js";
import { apiError, badRequest, unauthorized } from "../../errors.js";
import type { Logger } from "../../log.js";
import { deleteInBatches } from "../shared/batched-delete.js";
import { issueKey, type KeyRole } from "./keys.js";
import { lockAccountKeys, rotateKeys } from "./key-rotation.js";

const CODE_TTL_MINUTES = 10;
/** Wrong guesses one code allows. */
const MAX_ATTEMPTS = 5;
/** Codes issued per account per hour (a new code also ends the older unused ones). */
export const CODES_PER_HOUR = 5;
/** Wrong guesses per account per hour across all its codes; past it even the right code waits. */
export const WRONG_GUESSES_PER_HOUR = 10;
/** The hour both per-hour limits count over. */
const LIMITS_WINDOW = "1 hour";
/** How long one email may take to send. */
const SEND_TIMEOUT_MS = 10_000;
/**
 * A code whose email is being sent (sent_at NULL) counts against the hourly limit for this long:
 * well past SEND_TIMEOUT_MS, after which one still unsent was left by a process that stopped mid-send.
 */
const SENDING_COUNTS_FOR = "1 minute";
/** Advisory-lock namespace: issuing and checking codes of one account run one at a time. */
const LOGIN_LOCK_NS = 0x7632;

export type LoginOutcome = { kind: "key"; apiKey: string } | { kind: "code_sent"; message: string };

const hashCode = (code: string) => crypto.createHash("sha256").update(code).digest();

async function lockAccount(tx: Tx, role: KeyRole, accountId: number): Promise<void> {
  await tx`SELECT pg_advisory_xact_lock(${LOGIN_LOCK_NS}, hashtext(${role} || ':' || ${accountId}::text))`;
}

const tooMany = (message: string, retrySeconds: number) => apiError(429, message, { "retry-after": String(Math.max(1, retrySeconds)) });

export async function sendEmail(config: Config, log: Logger, to: string, subject: string, text: string): Promise<void> {
  const failed = () => apiError(503, "email delivery failed; try again later");
  let res: Response;
  try {
    res = await fetch(`${config.emailApiUrl}/emails`, {
      method: "POST",
      headers: { authorization: `Bearer ${config.emailApiKey}`, "content-type": "application/json" },
      body: JSON.stringify({ from: "no-reply@svc.example.com", to: [to], subject, text }),
      signal: AbortSignal.timeout(SEND_TIMEOUT_MS),
    });
  } catch (err) {
    // Unreachable, connection closed, timed out: the service's outage, not ours.
    log.warn({ err }, "email service unreachable");
    throw failed();
  }
  if (!res.ok) {
    log.warn({ status: res.status }, "email service refused the email");
    throw failed();
  }
}

export async function loginByEmail(
  sql: Sql,
  config: Config,
  log: Logger,
  role: KeyRole,
  accountId: number,
  email: string,
  code: string | undefined,
): Promise<LoginOutcome> {
  if (!config.emailApiKey) {
    if (config.production) {
      throw apiError(503, "login-email is disabled: email delivery (EMAIL_API_KEY) is not configured");
    }
    return { kind: "key", apiKey: await signedIn(sql, config, role, accountId) };
  }
  if (!code) {
    // Stored first, so that concurrent requests count it, but usable, and ending the older codes,
    // only once its email went out: a failed send leaves the account as it was.
    const fresh = String(crypto.randomInt(0, 1_000_000)).padStart(6, "0");
    const id = await sql.begin(async (tx) => {
      await lockAccount(tx, role, accountId);
      // The fifth newest code of the last hour, sent or being sent: while there is one, no new code until it is an hour old.
      const [fifth] = await tx<{ retry: number }[]>`
        SELECT ceil(extract(epoch FROM created_at + ${LIMITS_WINDOW}::interval - now()))::int AS retry FROM login_codes
        WHERE role = ${role} AND account_id = ${accountId} AND created_at > now() - ${LIMITS_WINDOW}::interval
          AND (sent_at IS NOT NULL OR created_at > now() - ${SENDING_COUNTS_FOR}::interval)
        ORDER BY created_at DESC OFFSET ${CODES_PER_HOUR - 1} LIMIT 1`;
      if (fifth) {
        throw tooMany(`at most ${CODES_PER_HOUR} sign-in codes per hour; use the last code sent or try again later`, fifth.retry);
      }
      const [row] = await tx<{ id: number }[]>`
        INSERT INTO login_codes (role, account_id, code_hash, expires_at)
        VALUES (${role}, ${accountId}, ${hashCode(fresh)}, now() + make_interval(mins => ${CODE_TTL_MINUTES}))
        RETURNING id`;
      return row.id;
    });
    try {
      await sendEmail(config, log, email, "Your sign-in code", `Your sign-in code is ${fresh}. It expires in ${CODE_TTL_MINUTES} minutes.`);
    } catch (err) {
      await sql`DELETE FROM login_codes WHERE id = ${id}`.catch((e) => log.warn({ err: e, role, accountId }, "unsent login code not deleted"));
      throw err;
    }
    await sql.begin(async (tx) => {
      await lockAccount(tx, role, accountId);
      // One live code per account: a new code ends the older unused ones (their wrong guesses still count).
      await tx`
        UPDATE login_codes SET expires_at = now()
        WHERE role = ${role} AND account_id = ${accountId} AND id <> ${id} AND sent_at IS NOT NULL
          AND used_at IS NULL AND expires_at > now()`;
      await tx`UPDATE login_codes SET sent_at = now(), expires_at = now() + make_interval(mins => ${CODE_TTL_MINUTES}) WHERE id = ${id}`;
    });
    log.info({ role, accountId }, "login code sent");
    return { kind: "code_sent", message: "a sign-in code was sent to the email address; call again with email and code" };
  }
  if (!/^\d{6}$/.test(code)) throw badRequest("code must be the 6-digit code from the email");
  const right = await sql.begin(async (tx) => {
    await lockAccount(tx, role, accountId);
    // Wrong guesses of the last hour, across all codes: a code is guessed at only before its
    // expires_at, so every guess of the last hour is on a code that expired less than an hour ago.
    // retry: when enough of the oldest of those codes are out of the window to leave fewer than the limit.
    const [g] = await tx<{ wrong: number; retry: number | null }[]>`
      WITH c AS (
        SELECT attempts, expires_at,
               sum(attempts) OVER (ORDER BY expires_at DESC, id DESC) - attempts AS newer
        FROM login_codes
        WHERE role = ${role} AND account_id = ${accountId} AND attempts > 0 AND expires_at > now() - ${LIMITS_WINDOW}::interval)
      SELECT coalesce(sum(attempts), 0)::int AS wrong,
             ceil(extract(epoch FROM min(expires_at) FILTER (WHERE newer < ${WRONG_GUESSES_PER_HOUR}) + ${LIMITS_WINDOW}::interval - now()))::int AS retry
      FROM c`;
    if (g.wrong >= WRONG_GUESSES_PER_HOUR) {
      throw tooMany(`too many wrong sign-in codes (${WRONG_GUESSES_PER_HOUR} per hour); try again later`, g.retry ?? 3600);
    }
    const [latest] = await tx<{ id: number; ok: boolean }[]>`
      SELECT id, code_hash = ${hashCode(code)} AS ok FROM login_codes
      WHERE role = ${role} AND account_id = ${accountId} AND sent_at IS NOT NULL AND used_at IS NULL
        AND expires_at > now() AND attempts < ${MAX_ATTEMPTS}
      ORDER BY created_at DESC, id DESC LIMIT 1`;
    if (!latest) throw unauthorized("no valid sign-in code; request a new one");
    // A wrong guess is counted and committed (not thrown here, which would roll the count back).
    await (latest.ok
      ? tx`UPDATE login_codes SET used_at = now() WHERE id = ${latest.id}`
      : tx`UPDATE login_codes SET attempts = attempts + 1 WHERE id = ${latest.id}`);
    return latest.ok;
  });
  if (!right) throw unauthorized("wrong sign-in code");
  return { kind: "key", apiKey: await signedIn(sql, config, role, accountId) };
}

/**
 * Deletes the codes nothing reads any more, a batch a statement (shared/batched-delete.ts): a code
 * counts toward the hour's codes until LIMITS_WINDOW after its created_at, its wrong guesses toward
 * the hour's until LIMITS_WINDOW after its expires_at, and it signs in only before its expires_at.
 * So one created and expired more than LIMITS_WINDOW ago, used or not, is spent: the limits count
 * the same without it. Run by the retention sweep (src/workers/retention.ts). The table is read
 * whole: after a sweep it holds the last hour's codes and those spent since.
 */
export async function deleteSpentLoginCodes(db: Db): Promise<number> {
  return deleteInBatches(async (limit) => {
    const r = await db`
      DELETE FROM login_codes WHERE id = ANY(ARRAY(
        SELECT id FROM login_codes
        WHERE created_at < now() - ${LIMITS_WINDOW}::interval AND expires_at < now() - ${LIMITS_WINDOW}::interval
        LIMIT ${limit} FOR UPDATE SKIP LOCKED))`;
    return r.count;
  });
}

/**
 * A sign-in that reached the account's address: a new key, and (renters) the address counted as
 * proven (migration 051). Registration takes any address, so a managed-endpoint account's
 * (SVC_V1_MANAGED_RENTERS) may have been registered by someone else first: the right to serve every
 * renter's /v1 requests goes with the proof, so its first proof revokes the keys issued before it
 * as a rotation would, and drops the webhook they may have set (a rotation only replaces its secret).
 */
async function signedIn(sql: Sql, config: Config, role: KeyRole, accountId: number): Promise<string> {
  return sql.begin(async (tx) => {
    await lockAccountKeys(tx, role, accountId);
    if (role === "renter") {
      const [r] = await tx<{ email: string; first: boolean }[]>`
        SELECT email, email_proven_at IS NULL AS first FROM renters WHERE id = ${accountId} FOR UPDATE`;
      await tx`UPDATE renters SET email_proven_at = coalesce(email_proven_at, now()) WHERE id = ${accountId}`;
      if (r?.first && config.v1.managedRenters.includes(r.email.toLowerCase())) {
        await tx`UPDATE renters SET webhook_url = NULL, webhook_secret = NULL WHERE id = ${accountId}`;
        return rotateKeys(tx, role, accountId);
      }
    }
    return issueKey(tx, role, accountId);
  });
}
