// Renter accounts: registration, lookup, the Renter resource and quotas.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { RenterSchema } from "../../../gen/svc/v1/models_pb.js";
import type { Db, Sql, Tx } from "../../db/index.js";
import { conflict, isUniqueViolation, notFound } from "../../errors.js";
import { issueKey } from "./keys.js";
import { credit, openRenterAccounts, renterFundsOf } from "../money/ledger.js";
import { iso } from "../shared/validate.js";
import { DEFAULT_QUOTA } from "../money/quota.js";
import { newWebhookSecret } from "../notify/webhooks.js";
import { jobCountSql } from "../shared/job-counts.js";

/** Defaults for a new renter's quota; admins override per renter. */

export interface RenterRow {
  id: number;
  name: string;
  email: string;
  organization: string | null;
  use_case: string | null;
  phone: string | null;
  webhook_url: string | null;
  webhook_secret: string | null;
  status: string;
  total_spent_halala: number;
  total_jobs: number;
  /** Owed for refunded payments (migration 054, money/refund-debt.ts). */
  refund_owed_halala: number;
  created_at: Date;
}

export async function registerRenter(
  tx: Tx,
  input: { name: string; email: string; organization?: string; useCase?: string; phone?: string; webhookUrl?: string },
  signupCreditHalala: number,
): Promise<{ id: number; apiKey: string; webhookSecret?: string }> {
  let id: number;
  const webhookSecret = input.webhookUrl ? newWebhookSecret() : undefined;
  try {
    const [row] = await tx<{ id: number }[]>`
      INSERT INTO renters (name, email, organization, use_case, phone, webhook_url, webhook_secret)
      VALUES (${input.name}, ${input.email}, ${input.organization ?? null}, ${input.useCase ?? null},
              ${input.phone ?? null}, ${input.webhookUrl ?? null}, ${webhookSecret ?? null})
      RETURNING id`;
    id = row.id;
  } catch (err) {
    if (isUniqueViolation(err, "renters_email_key")) throw conflict("a renter with this email is already registered");
    throw err;
  }
  await openRenterAccounts(tx, id);
  await tx`
    INSERT INTO renter_quota (renter_id, daily_jobs_limit, monthly_spend_limit_halala)
    VALUES (${id}, ${DEFAULT_QUOTA.dailyJobsLimit}, ${DEFAULT_QUOTA.monthlySpendLimitHalala})`;
  if (signupCreditHalala > 0) await credit(tx, id, signupCreditHalala, `signup:renter:${id}`, "signup_credit");
  return { id, apiKey: await issueKey(tx, "renter", id), webhookSecret };
}

export interface RenterPatch {
  name?: string;
  /** null clears a nullable field; undefined leaves it. */
  organization?: string | null;
  useCase?: string | null;
  phone?: string | null;
  webhookUrl?: string | null;
  rotateWebhookSecret?: boolean;
}

/**
 * Applies a partial update. A webhook signing secret exists exactly while a
 * webhook_url is set: it is created with the first URL, kept when the URL
 * changes, dropped when it is cleared, and replaced on request.
 */
export async function updateRenter(tx: Tx, id: number, p: RenterPatch): Promise<RenterRow> {
  const [current] = await tx<RenterRow[]>`SELECT * FROM renters WHERE id = ${id} FOR NO KEY UPDATE`;
  if (!current) throw notFound("renter not found");
  const pick = <T>(v: T | undefined, old: T) => (v === undefined ? old : v);
  const webhookUrl = pick(p.webhookUrl, current.webhook_url);
  const webhookSecret = !webhookUrl ? null : p.rotateWebhookSecret || !current.webhook_secret ? newWebhookSecret() : current.webhook_secret;
  const [row] = await tx<RenterRow[]>`
    UPDATE renters SET
      name = ${pick(p.name, current.name)},
      organization = ${pick(p.organization, current.organization)},
      use_case = ${pick(p.useCase, current.use_case)},
      phone = ${pick(p.phone, current.phone)},
      webhook_url = ${webhookUrl},
      webhook_secret = ${webhookSecret}
    WHERE id = ${id} RETURNING *`;
  return row;
}

export async function renterById(db: Db, id: number): Promise<RenterRow> {
  const [row] = await db<RenterRow[]>`SELECT * FROM renters WHERE id = ${id}`;
  if (!row) throw notFound("renter not found");
  return row;
}

export async function renterByEmail(db: Db, email: string): Promise<RenterRow | undefined> {
  const [row] = await db<RenterRow[]>`SELECT * FROM renters WHERE lower(email) = ${email.toLowerCase()}`;
  return row;
}

export async function renterQuota(db: Db, renterId: number) {
  const [q] = await db<{ daily_jobs_limit: number; monthly_spend_limit_halala: number }[]>`
    SELECT daily_jobs_limit, monthly_spend_limit_halala FROM renter_quota WHERE renter_id = ${renterId}`;
  return {
    dailyJobsLimit: q?.daily_jobs_limit ?? DEFAULT_QUOTA.dailyJobsLimit,
    monthlySpendLimitHalala: q?.monthly_spend_limit_halala ?? DEFAULT_QUOTA.monthlySpendLimitHalala,
  };
}

/** Jobs the renter ever submitted (jobCountSql). */
export async function renterJobCount(db: Db, renterId: number): Promise<number> {
  return (await renterJobCounts(db, [renterId])).get(renterId)!;
}

/** renterJobCount of several renters in one statement (a page of them). */
async function renterJobCounts(db: Db, renterIds: number[]): Promise<Map<number, number>> {
  const rows = await db<{ id: number; n: number }[]>`
    SELECT r.id, ${jobCountSql(db, { renterId: db`r.id` })} AS n FROM unnest(${renterIds}::bigint[]) AS r(id)`;
  return new Map(rows.map((r) => [Number(r.id), Number(r.n)]));
}

/** The Renter resource; balance_halala includes held funds. */
export async function renterMessage(db: Db, r: RenterRow): Promise<MessageInitShape<typeof RenterSchema>> {
  return (await renterMessages(db, [r]))[0];
}

/** renterMessage of a page of renters: their funds and job counts in two reads, not two per renter. */
export async function renterMessages(db: Db, rows: RenterRow[]): Promise<MessageInitShape<typeof RenterSchema>[]> {
  if (rows.length === 0) return [];
  const ids = rows.map((r) => r.id);
  const [fundsOf, jobsOf] = await Promise.all([renterFundsOf(db, ids), renterJobCounts(db, ids)]);
  return rows.map((r) => renterMessageOf(r, fundsOf.get(r.id)!, jobsOf.get(r.id) ?? 0));
}

function renterMessageOf(r: RenterRow, funds: { balance: number; held: number }, totalJobs: number): MessageInitShape<typeof RenterSchema> {
  return {
    id: BigInt(r.id),
    name: r.name,
    email: r.email,
    organization: r.organization ?? undefined,
    useCase: r.use_case ?? undefined,
    phone: r.phone ?? undefined,
    webhookUrl: r.webhook_url ?? undefined,
    balanceHalala: BigInt(funds.balance),
    totalSpentHalala: BigInt(r.total_spent_halala),
    totalJobs: BigInt(totalJobs),
    createdAt: iso(r.created_at)!,
    heldHalala: BigInt(funds.held),
    status: r.status,
  };
}
