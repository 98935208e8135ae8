// Signed job receipts: proof, checkable offline with public keys only, of what
// ran, where, for how long and for how much (the document and its checks:
// src/shared/receipt.ts; the procedure: docs/receipts.md).
//
// issueReceipt runs inside the transaction that settles a job (settlement.ts,
// every terminal path), after the job row and its attempts are written, and
// reads everything it states from the database in that transaction: the job,
// its attempts (with the GPU facts migration 021's trigger took when each
// ended), the job's ledger transfers and the daemon's verified attestation. A
// job gets one receipt (job_receipts' primary key: a second issue fails the
// settling transaction rather than writing another) and the database refuses
// to change or delete it.
//
// Keys: receipt_keys holds Ed25519 seeds the server generates (like the
// task-signing key, server_keys); one is current. rotateReceiptKey retires it
// and adds another; every key stays published by GET /api/receipts/keys.
// revokeReceiptKey marks a key no longer trusted (its seed may have leaked);
// every receipt stored under it is then signed again with the current key
// (receipt_signatures; the document is not changed), in batches
// (resignRevokedReceipts, run by the revocation and by a periodic sweep), and
// a receipt read before its batch ran is signed on the read.
import crypto from "node:crypto";
import { allInTransaction, type Db, type Sql, type Tx } from "../../db/index.js";
import { badRequest, notFound } from "../../errors.js";
import { canonicalJson } from "../../shared/task-signature.js";
import { isTerminal } from "../../shared/job-status.js";
import {
  RECEIPT_TYPE,
  RECEIPT_VERSION,
  SIGNATURE_ALGORITHM,
  ed25519Signer,
  keyIdOf,
  outputSha256,
  sha256Hex,
  type Ed25519Signer,
  type GpuFacts,
  type ReceiptFile,
} from "../../shared/receipt.js";
import { iso } from "../shared/validate.js";
import type { JobAttemptRow, JobRow } from "../shared/job-row.js";
import { CHARGE_KIND } from "./ledger.js";
import { billableSeconds } from "./pricing.js";


// ---- keys ----

interface KeyRow {
  key_id: string;
  seed: Buffer;
}

/** Signers by key id: a seed is turned into a key once per process. */
const signers = new Map<string, Ed25519Signer>();
const signerOf = (row: KeyRow) => {
  let s = signers.get(row.key_id);
  if (!s) signers.set(row.key_id, (s = ed25519Signer(row.seed)));
  return s;
};

function newKey(): { keyId: string; seed: Buffer; publicKey: string } {
  const seed = crypto.randomBytes(32);
  const publicKey = ed25519Signer(seed).publicKey;
  return { keyId: keyIdOf("srv", publicKey), seed, publicKey };
}

/**
 * The current signing key, created on first use (concurrent first uses agree: one current key, by index).
 * `forSigning` (in a transaction that signs with it) holds the table in ROW EXCLUSIVE mode until the
 * transaction ends: a rotation or revocation (SHARE ROW EXCLUSIVE) waits for it, so once a revocation has
 * committed no transaction can still add a signature by the key it revoked.
 */
async function currentKey(db: Db, forSigning = false): Promise<{ keyId: string; signer: Ed25519Signer }> {
  if (forSigning) await db`LOCK TABLE receipt_keys IN ROW EXCLUSIVE MODE`;
  let [row] = await db<KeyRow[]>`SELECT key_id, seed FROM receipt_keys WHERE retired_at IS NULL`;
  if (!row) {
    const k = newKey();
    await db`
      INSERT INTO receipt_keys (key_id, seed, public_key) VALUES (${k.keyId}, ${k.seed}, ${k.publicKey})
      ON CONFLICT ((true)) WHERE retired_at IS NULL DO NOTHING`;
    [row] = await db<KeyRow[]>`SELECT key_id, seed FROM receipt_keys WHERE retired_at IS NULL`;
  }
  return { keyId: row.key_id, signer: signerOf(row) };
}

export interface ServerKeyView {
  keyId: string;
  publicKey: string;
  createdAt: Date;
  retiredAt: Date | null;
  revokedAt: Date | null;
  revocationReason: string | null;
}

interface KeyViewRow {
  key_id: string;
  public_key: string;
  created_at: Date;
  retired_at: Date | null;
  revoked_at: Date | null;
  revocation_reason: string | null;
}

const KEY_VIEW_COLUMNS = "key_id, public_key, created_at, retired_at, revoked_at, revocation_reason";

const keyView = (k: KeyViewRow): ServerKeyView => ({
  keyId: k.key_id,
  publicKey: k.public_key,
  createdAt: k.created_at,
  retiredAt: k.retired_at,
  revokedAt: k.revoked_at,
  revocationReason: k.revocation_reason,
});

/** The receipt_keys lock every change of the current key takes (see currentKey). */
const lockKeys = (tx: Tx) => tx`LOCK TABLE receipt_keys IN SHARE ROW EXCLUSIVE MODE`;

/** Retires the current key, if any, and adds a new current one; the caller holds lockKeys. */
async function replaceCurrentKey(tx: Tx): Promise<{ current: ServerKeyView; retired: string | null }> {
  const [old] = await tx<{ key_id: string }[]>`SELECT key_id FROM receipt_keys WHERE retired_at IS NULL`;
  if (old) await tx`UPDATE receipt_keys SET retired_at = now() WHERE key_id = ${old.key_id}`;
  const k = newKey();
  const [row] = await tx<KeyViewRow[]>`
    INSERT INTO receipt_keys (key_id, seed, public_key) VALUES (${k.keyId}, ${k.seed}, ${k.publicKey})
    RETURNING ${tx.unsafe(KEY_VIEW_COLUMNS)}`;
  return { current: keyView(row), retired: old?.key_id ?? null };
}

/**
 * Retires the current receipt key and makes a new one current. Receipts
 * signed before keep verifying: the retired key stays published.
 */
export async function rotateReceiptKey(tx: Tx): Promise<{ current: ServerKeyView; retired: string | null }> {
  // Two rotations at once run one after the other. Locking the current row would not do it: the
  // second, once the first commits, finds that row retired, no current one, and adds a second key.
  await lockKeys(tx);
  return replaceCurrentKey(tx);
}

/**
 * Revokes a receipt key: it is retired (a current key is replaced, as a
 * rotation does) and marked revoked, which verifiers read as "not trusted".
 * The receipts stored under it are re-signed afterwards, in batches
 * (resignRevokedReceipts). A key already revoked is answered as it stands,
 * with `alreadyRevoked` (its first reason kept). 404 for an unknown key.
 */
export async function revokeReceiptKey(
  tx: Tx,
  keyId: string,
  reason: string | null,
): Promise<{ key: ServerKeyView; current: ServerKeyView; alreadyRevoked: boolean }> {
  await lockKeys(tx);
  const [k] = await tx<KeyViewRow[]>`SELECT ${tx.unsafe(KEY_VIEW_COLUMNS)} FROM receipt_keys WHERE key_id = ${keyId}`;
  if (!k) throw notFound(`receipt key ${keyId} not found`);
  const alreadyRevoked = k.revoked_at !== null;
  if (!alreadyRevoked && k.retired_at === null) await replaceCurrentKey(tx);
  const [key] = alreadyRevoked
    ? [k]
    : await tx<KeyViewRow[]>`
        UPDATE receipt_keys SET revoked_at = now(), revocation_reason = ${reason}, retired_at = coalesce(retired_at, now())
        WHERE key_id = ${keyId} RETURNING ${tx.unsafe(KEY_VIEW_COLUMNS)}`;
  const [row] = await tx<KeyViewRow[]>`SELECT ${tx.unsafe(KEY_VIEW_COLUMNS)} FROM receipt_keys WHERE retired_at IS NULL`;
  const current = row ? keyView(row) : (await replaceCurrentKey(tx)).current;
  return { key: keyView(key), current, alreadyRevoked };
}

/** Receipts one re-signing transaction covers at most. */
export const RESIGN_BATCH = 500;

/**
 * One batch of re-signing for a revoked key: the next `limit` receipts (by
 * job id, after the key's resign_cursor) whose signature in force is by this
 * key (issued under it, or signed again by it before it was revoked) and that
 * hold no signature by a key not revoked get one by the current key. The
 * cursor moves in the same transaction, so a run that stops resumes after the
 * last batch it committed; `done` once a batch finds fewer than `limit`
 * (resigned_at is then set). Batches of one key from several processes run one
 * after the other (the key's row is locked).
 */
export async function resignBatch(sql: Sql, keyId: string, limit = RESIGN_BATCH): Promise<{ resigned: number; done: boolean }> {
  return sql.begin(async (tx) => {
    const signing = await currentKey(tx, true);
    const [k] = await tx<{ resign_cursor: number }[]>`
      SELECT resign_cursor FROM receipt_keys
      WHERE key_id = ${keyId} AND revoked_at IS NOT NULL AND resigned_at IS NULL FOR UPDATE`;
    if (!k) return { resigned: 0, done: true };
    const cursor = Number(k.resign_cursor);
    const batch = await tx<{ job_id: number }[]>`
      (SELECT job_id FROM job_receipts WHERE key_id = ${keyId} AND job_id > ${cursor} ORDER BY job_id LIMIT ${limit})
      UNION
      (SELECT job_id FROM receipt_signatures WHERE key_id = ${keyId} AND job_id > ${cursor} ORDER BY job_id LIMIT ${limit})
      ORDER BY job_id LIMIT ${limit}`;
    const ids = batch.map((b) => Number(b.job_id));
    const todo = ids.length
      ? await tx<{ job_id: number; document: string }[]>`
          SELECT r.job_id, r.document FROM job_receipts r
          JOIN receipt_keys issued ON issued.key_id = r.key_id AND issued.revoked_at IS NOT NULL
          WHERE r.job_id = ANY(${ids}::bigint[]) AND NOT EXISTS (${inForceSignature(tx)})`
      : [];
    if (todo.length) {
      const values = todo.map((r) => signing.signer.signCanonical(JSON.parse(r.document)));
      await tx`
        INSERT INTO receipt_signatures (job_id, key_id, value)
        SELECT j, ${signing.keyId}, v FROM unnest(${todo.map((r) => Number(r.job_id))}::bigint[], ${values}::text[]) AS t(j, v)
        ON CONFLICT DO NOTHING`;
    }
    const done = ids.length < limit;
    await tx`
      UPDATE receipt_keys SET resign_cursor = ${ids.length ? ids[ids.length - 1] : cursor}, resigned_at = CASE WHEN ${done} THEN now() END
      WHERE key_id = ${keyId}`;
    return { resigned: todo.length, done };
  });
}

/** A re-signature of receipt r (job_receipts r) by a key not revoked. */
const inForceSignature = (db: Db) => db`
  SELECT 1 FROM receipt_signatures s JOIN receipt_keys sk ON sk.key_id = s.key_id
  WHERE s.job_id = r.job_id AND sk.revoked_at IS NULL`;

/**
 * Re-signs, batch after batch, the receipts of revoked keys (`keyId`: of that
 * key only) that have no signature in force yet, until none is left (`done`)
 * or, given `until` (a Date.now() time), until then: what is left is the
 * periodic sweep's, which runs this again.
 */
export async function resignRevokedReceipts(
  sql: Sql,
  opts: { keyId?: string; batch?: number; until?: number } = {},
): Promise<{ resigned: number; done: boolean }> {
  const keys =
    opts.keyId !== undefined
      ? [opts.keyId]
      : (await sql<{ key_id: string }[]>`
          SELECT key_id FROM receipt_keys WHERE revoked_at IS NOT NULL AND resigned_at IS NULL ORDER BY revoked_at, key_id`).map((k) => k.key_id);
  let resigned = 0;
  for (const keyId of keys) {
    for (;;) {
      if (opts.until !== undefined && Date.now() >= opts.until) return { resigned, done: false };
      const b = await resignBatch(sql, keyId, opts.batch);
      resigned += b.resigned;
      if (b.done) break;
    }
  }
  return { resigned, done: true };
}

export interface ProviderKeyView {
  keyId: string;
  providerId: number;
  publicKey: string;
  registeredAt: Date;
}

/**
 * Provider keys the listing counts at most, or up to one past the end of the
 * page asked for when that is more: the route is public, and a count of the
 * whole table on each call would grow with every provider's keys. A total at
 * that bound says only that more keys follow the page.
 */
export const PROVIDER_KEYS_COUNTED = 10_000;

/**
 * The largest offset of a page of provider keys. A page reads every key
 * before its offset (SQL OFFSET), and its count goes one past the page: an
 * offset bounded by the count's bound keeps both, on a public route, at most
 * PROVIDER_KEYS_COUNTED plus a page (1,000), however large the table. Keys
 * past it are listed by `provider_id` (a provider has at most 20), `key_id`
 * or `after_provider_id` (keyset pages, from the provider index).
 */
export const PROVIDER_KEYS_OFFSET_MAX = PROVIDER_KEYS_COUNTED;

/** The 400 of an offset past PROVIDER_KEYS_OFFSET_MAX, naming the bound and how to reach the keys past it. */
export function checkProviderKeysOffset(offset: number): number {
  if (!Number.isInteger(offset) || offset < 0 || offset > PROVIDER_KEYS_OFFSET_MAX) {
    throw badRequest(
      `offset must be an integer between 0 and ${PROVIDER_KEYS_OFFSET_MAX}: provider keys are paged within the first ` +
        `${PROVIDER_KEYS_COUNTED}; list the keys past them with provider_id, key_id or after_provider_id`,
    );
  }
  return offset;
}

/**
 * Every server receipt key (oldest first, the current one last; one is
 * created when there is none yet) and provider keys, all or those asked for
 * (`afterProviderId`: of providers with a greater id, the keyset pages that
 * reach the keys past the offset bound).
 */
export async function publishedKeys(
  db: Db,
  f: { providerId?: number; keyId?: string; afterProviderId?: number; limit: number; offset: number },
): Promise<{ server: ServerKeyView[]; providers: ProviderKeyView[]; providerTotal: number }> {
  checkProviderKeysOffset(f.offset);
  await currentKey(db);
  const where = db`WHERE true ${f.providerId === undefined ? db`` : db`AND provider_id = ${f.providerId}`} ${f.keyId === undefined ? db`` : db`AND key_id = ${f.keyId}`}
    ${f.afterProviderId === undefined ? db`` : db`AND provider_id > ${f.afterProviderId}`}`;
  const counted = Math.max(PROVIDER_KEYS_COUNTED, f.offset + f.limit + 1);
  const server = await db<KeyViewRow[]>`SELECT ${db.unsafe(KEY_VIEW_COLUMNS)} FROM receipt_keys ORDER BY created_at, key_id`;
  const providers = await db<{ key_id: string; provider_id: number; public_key: string; registered_at: Date }[]>`
    SELECT key_id, provider_id, public_key, registered_at FROM provider_keys ${where}
    ORDER BY provider_id, registered_at, key_id LIMIT ${f.limit} OFFSET ${f.offset}`;
  const [{ total }] = await db<{ total: number }[]>`
    SELECT count(*)::int AS total FROM (SELECT 1 FROM provider_keys ${where} LIMIT ${counted}) k`;
  return {
    server: server.map(keyView),
    providers: providers.map((k) => ({ keyId: k.key_id, providerId: k.provider_id, publicKey: k.public_key, registeredAt: k.registered_at })),
    providerTotal: total,
  };
}

// ---- issue ----

type AttemptRow = Pick<
  JobAttemptRow,
  "attempt" | "provider_id" | "status" | "assigned_at" | "started_at" | "ended_at" | "end_reason" | "cost_halala" | "gpu"
> & {
  /** The attempt's fault, where the schema has that column (null: none recorded; undefined: no column). */
  fault?: string | null;
  has_fault: boolean;
};

interface MoneyRow {
  held: number;
  provider_share: number;
  platform_share: number;
  refunded: number;
}

interface AttestationRow {
  provider_id: number;
  key_id: string;
  statement: Record<string, unknown>;
  signature: string;
}

/** The GPU facts as stored (a snapshot), with the members a receipt always has. */
function gpuFacts(g: GpuFacts | null): GpuFacts | null {
  if (!g) return null;
  return {
    model: g.model ?? null,
    count: g.count ?? null,
    vram_mib: g.vram_mib === null || g.vram_mib === undefined ? null : Number(g.vram_mib),
    driver_version: g.driver_version ?? null,
    uuids: Array.isArray(g.uuids) ? g.uuids.filter((u) => typeof u === "string") : [],
  };
}

/**
 * Issues the receipt of a job that has just settled, in the settling
 * transaction (`jobId`: jobs.id). Throws when the job is not terminal, and
 * (unique key) when it already has a receipt.
 */
export async function issueReceipt(tx: Tx, jobId: number): Promise<void> {
  const [jobs, attempts, money, key] = await allInTransaction([
    tx<(JobRow & { fault_col?: string | null; has_fault: boolean; db_now: Date })[]>`
      SELECT j.*, to_jsonb(j)->>'fault' AS fault_col, to_jsonb(j) ? 'fault' AS has_fault, now() AS db_now FROM jobs j WHERE j.id = ${jobId}`,
    tx<AttemptRow[]>`
      SELECT attempt, provider_id, status, assigned_at, started_at, ended_at, end_reason, cost_halala, gpu,
             to_jsonb(a)->>'fault' AS fault, to_jsonb(a) ? 'fault' AS has_fault
      FROM job_attempts a WHERE job_id = ${jobId} ORDER BY attempt`,
    tx<MoneyRow[]>`
      SELECT coalesce(sum(t.amount) FILTER (WHERE c.kind = 'renter_held'), 0)::bigint AS held,
             coalesce(sum(t.amount) FILTER (WHERE t.kind = ${CHARGE_KIND.jobProvider}), 0)::bigint AS provider_share,
             coalesce(sum(t.amount) FILTER (WHERE t.kind = ${CHARGE_KIND.jobPlatform}), 0)::bigint AS platform_share,
             coalesce(sum(t.amount) FILTER (WHERE d.kind = 'renter_held' AND c.kind = 'renter_available'), 0)::bigint AS refunded
      FROM ledger_transfers t
      JOIN ledger_accounts d ON d.id = t.debit_account_id
      JOIN ledger_accounts c ON c.id = t.credit_account_id
      WHERE t.job_id = ${jobId}`,
    currentKey(tx, true),
  ]);
  const job = jobs[0];
  if (!job) throw new Error(`receipt of job ${jobId}: no such job`);
  if (!isTerminal(job.status)) throw new Error(`receipt of job ${job.job_id}: the job is ${job.status}, not settled`);
  const m = money[0];
  const outputHash = outputSha256(job.result);
  const [att] =
    job.provider_id === null
      ? []
      : await tx<AttestationRow[]>`
          SELECT provider_id, key_id, statement, signature FROM job_attestations
          WHERE job_id = ${jobId} AND attempt = ${job.attempt} AND provider_id = ${job.provider_id}`;
  const charged = Number(m.provider_share) + Number(m.platform_share);
  // Billed time: what settlement billed (its run seconds end at this transaction's now(), which is completed_at,
  // and never pass max_duration_seconds: pricing.ts billableMinutes).
  const from = job.started_at ?? job.assigned_at ?? job.submitted_at;
  const billedMinutes = Number(job.actual_minutes ?? 0);
  const ranSeconds = Math.max(0, new Date(job.db_now).getTime() - new Date(from).getTime()) / 1000;
  const billedSeconds = billedMinutes > 0 ? Math.round(billableSeconds(ranSeconds, Number(job.max_duration_seconds)) * 1000) / 1000 : 0;

  const body: Record<string, unknown> = {
    type: RECEIPT_TYPE,
    version: RECEIPT_VERSION,
    receipt_id: `rcpt-${crypto.randomUUID()}`,
    job_id: job.job_id,
    renter_id: job.renter_id,
    provider_id: job.provider_id,
    job_type: job.job_type,
    status: job.status,
    end_reason: job.end_reason,
    ...(job.has_fault ? { fault: job.fault_col ?? null } : {}),
    submitted_at: iso(job.submitted_at),
    ended_at: iso(job.completed_at) ?? null,
    task_spec_sha256: sha256Hex(canonicalJson(job.task_spec ?? {})),
    output_sha256: outputHash,
    attempts: attempts.map((a) => ({
      attempt: a.attempt,
      provider_id: a.provider_id,
      status: a.status,
      assigned_at: iso(a.assigned_at) ?? null,
      started_at: iso(a.started_at) ?? null,
      ended_at: iso(a.ended_at) ?? null,
      end_reason: a.end_reason,
      ...(a.has_fault ? { fault: a.fault ?? null } : {}),
      charged_halala: Number(a.cost_halala ?? 0),
      gpu: gpuFacts(a.gpu),
    })),
    billing: {
      currency: "SAR",
      unit: "halala",
      rate_halala_per_minute: Number(job.rate_halala_per_minute),
      billed_seconds: billedSeconds,
      billed_minutes: billedMinutes,
      held_halala: Number(m.held),
      charged_halala: charged,
      provider_share_halala: Number(m.provider_share),
      platform_share_halala: Number(m.platform_share),
      refunded_halala: Number(m.refunded),
      // The billed minutes' cost that the renter's funds did not cover (a run past them: charged what they held,
      // its provider unpaid for the rest): rate x billed_minutes = charged + uncovered.
      uncovered_halala: Math.max(0, Number(job.rate_halala_per_minute) * billedMinutes - charged),
    },
    provider_attestation: attestationOf(job, attempts.length > 0, outputHash, att),
    signer: { key_id: key.keyId, algorithm: SIGNATURE_ALGORITHM },
    issued_at: iso(job.db_now),
  };
  const document = canonicalJson(body);
  const signature = key.signer.signCanonical(body);
  await tx`
    INSERT INTO job_receipts (job_id, receipt_id, key_id, document, signature, issued_at)
    VALUES (${jobId}, ${body.receipt_id as string}, ${key.keyId}, ${document}, ${signature}, ${job.db_now})`;
}

/** The receipt's provider_attestation: the daemon's verified signature, or plainly why there is none. */
function attestationOf(job: JobRow, hadAttempts: boolean, outputHash: string | null, att: AttestationRow | undefined): Record<string, unknown> {
  // A job taken back from its provider (re-queued) and ended in the queue reached one: it ended without a result.
  if (job.provider_id === null && !hadAttempts) return { status: "none", reason: "no_provider", detail: "the job never reached a provider" };
  // Stored only after it verified against the provider's registered key (providers/attestations.ts), with
  // the result its report ended the attempt with; it counts only when it is about the output this job
  // stored. A job that stored no output has nothing attested (a statement of "no output" proves no work).
  if (att && outputHash !== null && att.statement.job_id === job.job_id && att.statement.output_sha256 === outputHash) {
    return { status: "attested", provider_id: att.provider_id, key_id: att.key_id, algorithm: SIGNATURE_ALGORITHM, statement: att.statement, signature: att.signature };
  }
  if (outputHash === null) {
    return { status: "none", reason: "no_result", detail: "the job ended without a result from its provider: there is no provider attestation" };
  }
  return {
    status: "none",
    reason: "not_attested",
    detail:
      "the result came without a provider signature that covers the stored output (the legacy JSON protocol has no provider key; " +
      "a stream daemon may send none): there is no provider attestation",
  };
}

// ---- read ----

/**
 * A job's receipt (`jobId`: jobs.id) with a signature in force, or undefined
 * when it has none: as issued, unless the key it was issued under is revoked;
 * then its signature by a key not revoked, made on this read when no
 * re-signing batch has reached it yet.
 */
export async function storedReceipt(sql: Sql, jobId: number): Promise<ReceiptFile | undefined> {
  const [r] = await sql<{ key_id: string; document: string; signature: string; revoked: boolean; in_force_key: string | null; in_force_value: string | null }[]>`
    SELECT r.key_id, r.document, r.signature, k.revoked_at IS NOT NULL AS revoked, s.key_id AS in_force_key, s.value AS in_force_value
    FROM job_receipts r
    JOIN receipt_keys k ON k.key_id = r.key_id
    LEFT JOIN LATERAL (
      SELECT s.key_id, s.value FROM receipt_signatures s JOIN receipt_keys sk ON sk.key_id = s.key_id
      WHERE s.job_id = r.job_id AND sk.revoked_at IS NULL ORDER BY s.created_at DESC, s.key_id LIMIT 1
    ) s ON k.revoked_at IS NOT NULL
    WHERE r.job_id = ${jobId}`;
  if (!r) return undefined;
  const receipt = JSON.parse(r.document) as Record<string, unknown>;
  const file = (keyId: string, value: string): ReceiptFile => ({ receipt, signature: { algorithm: SIGNATURE_ALGORITHM, key_id: keyId, value } });
  if (!r.revoked) return file(r.key_id, r.signature);
  if (r.in_force_key !== null && r.in_force_value !== null) return file(r.in_force_key, r.in_force_value);
  const signed = await sql.begin(async (tx) => {
    const key = await currentKey(tx, true);
    const value = key.signer.signCanonical(receipt);
    await tx`INSERT INTO receipt_signatures (job_id, key_id, value) VALUES (${jobId}, ${key.keyId}, ${value}) ON CONFLICT DO NOTHING`;
    return { keyId: key.keyId, value };
  });
  return file(signed.keyId, signed.value);
}
