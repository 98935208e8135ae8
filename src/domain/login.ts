// login-email for both account kinds. Without email delivery configured the
// documented one-step answer applies (refused in production: anyone knowing
// an address would get a key). With EMAIL_API_KEY, the first call mails a
// one-time code and the second call, with the code, issues an extra key.
import crypto from "node:crypto";
import type { Config } from "../config.js";
import type { Sql } from "../db/index.js";
import { apiError, badRequest, unauthorized } from "../http/errors.js";
import type { Logger } from "../log.js";
import { issueKey, type KeyRole } from "./keys.js";

const CODE_TTL_MINUTES = 10;
const MAX_ATTEMPTS = 5;

export type LoginOutcome = { kind: "key"; apiKey: string } | { kind: "code_sent"; message: string };

const hashCode = (code: string) => crypto.createHash("sha256").update(code).digest();

export async function sendEmail(config: Config, to: string, subject: string, text: string): Promise<void> {
  const res = await fetch(`${config.emailApiUrl}/emails`, {
    method: "POST",
    headers: { authorization: `Bearer ${config.emailApiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ from: "no-reply@svc.example.com", to: [to], subject, text }),
    signal: AbortSignal.timeout(10_000),
  });
  if (!res.ok) throw apiError(503, "email delivery failed; try again later");
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
    return { kind: "key", apiKey: await issueKey(sql, role, accountId) };
  }
  if (!code) {
    const fresh = String(crypto.randomInt(0, 1_000_000)).padStart(6, "0");
    await sql`
      INSERT INTO login_codes (role, account_id, code_hash, expires_at)
      VALUES (${role}, ${accountId}, ${hashCode(fresh)}, now() + make_interval(mins => ${CODE_TTL_MINUTES}))`;
    await sendEmail(config, email, "Your sign-in code", `Your sign-in code is ${fresh}. It expires in ${CODE_TTL_MINUTES} minutes.`);
    log.info({ role, accountId }, "login code sent");
    return { kind: "code_sent", message: "a sign-in code was sent to the email address; call again with email and code" };
  }
  if (!/^\d{6}$/.test(code)) throw badRequest("code must be the 6-digit code from the email");
  const latest = sql`
    SELECT id FROM login_codes
    WHERE role = ${role} AND account_id = ${accountId} AND used_at IS NULL AND expires_at > now() AND attempts < ${MAX_ATTEMPTS}
    ORDER BY created_at DESC LIMIT 1`;
  const used = await sql`
    UPDATE login_codes SET used_at = now()
    WHERE id = (${latest}) AND code_hash = ${hashCode(code)} AND used_at IS NULL RETURNING id`;
  if (used.length === 0) {
    const counted = await sql`UPDATE login_codes SET attempts = attempts + 1 WHERE id = (${latest}) RETURNING id`;
    throw unauthorized(counted.length ? "wrong sign-in code" : "no valid sign-in code; request a new one");
  }
  return { kind: "key", apiKey: await issueKey(sql, role, accountId) };
}
