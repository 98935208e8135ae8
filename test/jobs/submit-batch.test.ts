// The submit group commit against real PostgreSQL: submitMany judges a batch
// in order as if its submits came one after another (money, then quotas, then
// capacity; a refused submit writes nothing), placement water-fills the
// least busy providers and keeps priority order across batches, the
// SubmitBatcher isolates a submit that fails at the database, and concurrent
// submits over real HTTP are each held exactly once.
import { beforeEach, describe, expect, it } from "vitest";
import { HMAC_SECRET, useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import type { Sql } from "../../src/db/index.js";
import { placeMany } from "../../src/domain/dispatch/dispatch.js";
import { ledgerProblems, renterFunds } from "../../src/domain/money/ledger.js";
import { prepareSubmit, submitMany, type SubmitInput, type SubmitIntent, type SubmitOutcome } from "../../src/domain/jobs/submit.js";
import { SubmitBatcher } from "../../src/domain/jobs/submit-batcher.js";
import { observeDomain } from "../../src/domain/shared/observe.js";
import { toHttpError } from "../../src/http/errors.js";
import { clearMarketplace } from "./helpers.js";

// The job sweep is slowed down so that only the code under test places jobs.
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

// benchmark: 10 halala/min, 10 minutes by default, so each default submit holds 100.
const ESTIMATE = 100;

const prepare = (renterId: number, input: SubmitInput = {}) => prepareSubmit(srv.sql, HMAC_SECRET, renterId, { jobType: "benchmark", ...input });
/** One batch, one transaction: what the batcher does with a group of submits. */
const submitBatch = (intents: SubmitIntent[]) => srv.sql.begin((tx) => submitMany(tx, intents));
/** The HTTP status a submit would answer. */
const statusOf = (o: SubmitOutcome) => (o.ok ? 201 : toHttpError(o.error).status);
const messageOf = (o: SubmitOutcome) => (o.ok ? "" : toHttpError(o.error).message);

async function rowsFor(jobId: string): Promise<number> {
  const [{ n }] = await srv.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM jobs WHERE job_id = ${jobId}`;
  return n;
}

async function setGpus(providerId: number, n: number) {
  await srv.sql`UPDATE providers SET gpu_count = ${n}, approved_gpu_count = ${n} WHERE id = ${providerId}`;
}

/** Pending + running jobs per provider, for the given providers (0 when none). */
async function activeByProvider(ids: number[]): Promise<Map<number, number>> {
  const rows = await srv.sql<{ provider_id: number; n: number }[]>`
    SELECT provider_id, count(*)::int AS n FROM jobs
    WHERE provider_id = ANY(${ids}::bigint[]) AND status IN ('pending', 'running') GROUP BY provider_id`;
  return new Map(ids.map((id) => [id, rows.find((r) => r.provider_id === id)?.n ?? 0]));
}

async function jobState(jobId: string) {
  const [j] = await srv.sql<{ id: number; status: string; provider_id: number | null }[]>`
    SELECT id, status, provider_id FROM jobs WHERE job_id = ${jobId}`;
  return j;
}

describe("submitMany judges a batch in order", () => {
  it("holds funds for exactly two of three submits and refuses the third with 402, writing nothing for it", async () => {
    const renter = await makeRenter(srv, 2 * ESTIMATE);
    await makeProvider(srv);
    const intents = [await prepare(renter.id), await prepare(renter.id), await prepare(renter.id)];
    expect(intents.map((i) => i.estimate)).toEqual([ESTIMATE, ESTIMATE, ESTIMATE]);

    const out = await submitBatch(intents);
    expect(out.map(statusOf)).toEqual([201, 201, 402]);
    expect(messageOf(out[2])).toMatch(/insufficient balance/);

    expect(await renterFunds(srv.sql, renter.id)).toEqual({ available: 0, held: 2 * ESTIMATE, balance: 2 * ESTIMATE });
    expect(await rowsFor(intents[0].jobId)).toBe(1);
    expect(await rowsFor(intents[1].jobId)).toBe(1);
    expect(await rowsFor(intents[2].jobId)).toBe(0);
    const [r] = await srv.sql<{ total_jobs: number }[]>`SELECT total_jobs FROM renters WHERE id = ${renter.id}`;
    expect(r.total_jobs).toBe(2);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("lets the last job of the daily quota through and answers 429 to the next one in the same batch", async () => {
    const limited = await makeRenter(srv, 10_000);
    const other = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    await setGpus(provider.id, 4);
    // One job already today and a limit of 2: exactly one more fits.
    expect((await submitBatch([await prepare(limited.id)])).map(statusOf)).toEqual([201]);
    await srv.sql`UPDATE renter_quota SET daily_jobs_limit = 2 WHERE renter_id = ${limited.id}`;

    const intents = [await prepare(limited.id), await prepare(other.id), await prepare(limited.id), await prepare(other.id)];
    const out = await submitBatch(intents);
    expect(out.map(statusOf)).toEqual([201, 201, 429, 201]);
    expect(messageOf(out[2])).toMatch(/daily_jobs_limit is 2 jobs per UTC day and 2 were submitted today/);
    expect(await rowsFor(intents[2].jobId)).toBe(0);

    expect((await renterFunds(srv.sql, limited.id)).held).toBe(2 * ESTIMATE);
    expect((await renterFunds(srv.sql, other.id)).held).toBe(2 * ESTIMATE);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("answers 503 to a job no online provider fits and 404 to an unknown provider_id; the rest of the batch goes through", async () => {
    // Funds for exactly three jobs: a refused submit must not use up what the later ones need.
    const renter = await makeRenter(srv, 3 * ESTIMATE);
    const provider = await makeProvider(srv, { gpuModel: "NVIDIA GeForce RTX 4090" });
    await setGpus(provider.id, 4);
    const unapproved = await makeProvider(srv, { approved: false });
    const [{ max }] = await srv.sql<{ max: number }[]>`SELECT max(id)::int AS max FROM providers`;

    const intents = [
      await prepare(renter.id),
      await prepare(renter.id, { gpuRequirements: { gpu_model: "H100" } }),
      await prepare(renter.id, { providerId: max + 1000 }),
      await prepare(renter.id, { providerId: unapproved.id }),
      await prepare(renter.id),
      await prepare(renter.id, { providerId: provider.id }),
    ];
    const out = await submitBatch(intents);
    expect(out.map(statusOf)).toEqual([201, 503, 404, 503, 201, 201]);
    expect(messageOf(out[1])).toMatch(/no providers available/);
    expect(out[1].ok ? undefined : toHttpError(out[1].error).headers["retry-after"]).toBe("30");
    expect(messageOf(out[2])).toMatch(new RegExp(`provider_id ${max + 1000}: provider not found`));
    expect(messageOf(out[3])).toMatch(new RegExp(`provider ${unapproved.id} is not available`));

    for (const i of [1, 2, 3]) expect(await rowsFor(intents[i].jobId)).toBe(0);
    for (const i of [0, 4, 5]) {
      expect(await rowsFor(intents[i].jobId)).toBe(1);
      expect(out[i].ok && out[i].submitted.placement.providerId).toBe(provider.id);
    }
    expect(await renterFunds(srv.sql, renter.id)).toEqual({ available: 0, held: 3 * ESTIMATE, balance: 3 * ESTIMATE });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("placement of a batch", () => {
  it("water-fills the least busy providers, never past a provider's GPUs, and queues the rest with a reason", async () => {
    const renter = await makeRenter(srv, 100_000);
    const [a, b, c] = [await makeProvider(srv), await makeProvider(srv), await makeProvider(srv)];
    const ids = [a.id, b.id, c.id];
    for (const id of ids) await setGpus(id, 4);
    // Start unevenly loaded: a 2 of 4 busy, b idle, c 1 of 4.
    const bound = await submitBatch([await prepare(renter.id, { providerId: a.id }), await prepare(renter.id, { providerId: a.id }), await prepare(renter.id, { providerId: c.id })]);
    expect(bound.map((o) => o.ok && o.submitted.placement.providerId)).toEqual([a.id, a.id, c.id]);

    // Three more: whatever the tie-breaks, filling the emptiest first evens them out at 2 each.
    const first = await submitBatch([await prepare(renter.id), await prepare(renter.id), await prepare(renter.id)]);
    expect(first.map(statusOf)).toEqual([201, 201, 201]);
    for (const o of first) expect(o.ok && o.submitted.job.status).toBe("pending");
    expect(await activeByProvider(ids)).toEqual(new Map([[a.id, 2], [b.id, 2], [c.id, 2]]));

    // Nine more, six free GPUs: the first six in dispatch order run, the last three wait.
    const intents = await Promise.all(Array.from({ length: 9 }, () => prepare(renter.id)));
    const second = await submitBatch(intents);
    expect(second.map(statusOf)).toEqual(Array(9).fill(201));
    const placedOn = second.map((o) => (o.ok ? o.submitted.placement.providerId : "refused"));
    expect(placedOn.slice(6)).toEqual([null, null, null]);
    for (const p of placedOn.slice(0, 6)) expect(ids).toContain(p);

    // One job per GPU: every provider exactly full, and the database agrees with what submitMany answered.
    expect(await activeByProvider(ids)).toEqual(new Map([[a.id, 4], [b.id, 4], [c.id, 4]]));
    const load = await srv.sql<{ provider_id: number; active: number }[]>`SELECT provider_id, active FROM provider_load WHERE provider_id = ANY(${ids}::bigint[])`;
    for (const l of load) expect(l.active).toBe(4);
    for (const [k, intent] of intents.entries()) {
      const j = await jobState(intent.jobId);
      expect(j.provider_id).toBe(placedOn[k]);
      expect(j.status).toBe(placedOn[k] === null ? "queued" : "pending");
    }
    for (const intent of intents.slice(6)) {
      const view = (await api.get(`/api/jobs/${intent.jobId}`, renter.headers)).body;
      expect(view).toMatchObject({ status: "queued", queue_reason_code: "providers_busy" });
      expect(view.queue_reason).toMatch(/all 3 matching providers are busy/);
    }
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("priority across batches", () => {
  it("places older high-priority queued jobs before a new batch, and the batch's own jobs by priority", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await setGpus(provider.id, 2);
    // Queue two jobs while the provider is paused (each its own transaction, so they are older).
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${provider.id}`;
    const lowOld = await prepare(renter.id, { priority: 3 });
    const highOld = await prepare(renter.id, { priority: 1 });
    expect((await submitBatch([lowOld])).map((o) => o.ok && o.submitted.job.status)).toEqual(["queued"]);
    expect((await submitBatch([highOld])).map((o) => o.ok && o.submitted.job.status)).toEqual(["queued"]);
    // Unpaused without a dispatch: the next batch's placement is what fills it.
    await srv.sql`UPDATE providers SET is_paused = false WHERE id = ${provider.id}`;

    const n1 = await prepare(renter.id, { priority: 2 });
    const n2 = await prepare(renter.id, { priority: 2 });
    const out = await submitBatch([n1, n2]);
    expect(out.map(statusOf)).toEqual([201, 201]);
    // Two GPUs, dispatch order highOld (1), n1 (2), n2 (2, later id), lowOld (3).
    expect(await jobState(highOld.jobId)).toMatchObject({ status: "pending", provider_id: provider.id });
    expect(await jobState(n1.jobId)).toMatchObject({ status: "pending", provider_id: provider.id });
    expect(await jobState(n2.jobId)).toMatchObject({ status: "queued", provider_id: null });
    expect(await jobState(lowOld.jobId)).toMatchObject({ status: "queued", provider_id: null });
    expect(out.map((o) => o.ok && o.submitted.placement.providerId)).toEqual([provider.id, null]);
  });

  it("gives the only free GPU to the batch's highest priority, not to the first one given", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    const intents = [await prepare(renter.id, { priority: 3 }), await prepare(renter.id, { priority: 2 }), await prepare(renter.id, { priority: 1 })];
    const out = await submitBatch(intents);
    expect(out.map((o) => o.ok && o.submitted.placement.providerId)).toEqual([null, null, provider.id]);
    expect((await jobState(intents[2].jobId)).status).toBe("pending");
  });

  it("placeMany never lets a newer low-priority job overtake an older high-priority one on the same provider", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${provider.id}`;
    const high = await prepare(renter.id, { priority: 1 });
    const low = await prepare(renter.id, { priority: 3 });
    await submitBatch([high]);
    await submitBatch([low]);
    await srv.sql`UPDATE providers SET is_paused = false WHERE id = ${provider.id}`;
    const [highId, lowId] = [(await jobState(high.jobId)).id, (await jobState(low.jobId)).id];

    // Asked for alone, the low one must not take the GPU the older high-priority job can use:
    // the plan gives it to the older job, and placeMany carries that out.
    const alone = await srv.sql.begin((tx) => placeMany(tx, [lowId]));
    expect([...alone.placed.keys()]).toEqual([highId]);
    expect(alone.placed.get(highId)!.providerId).toBe(provider.id);
    expect(await jobState(high.jobId)).toMatchObject({ status: "pending", provider_id: provider.id });
    expect((await jobState(low.jobId)).status).toBe("queued");
  });

  it("over HTTP: a freed GPU goes to the older high-priority job, then the newer low-priority one", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    const submit = (body: Record<string, unknown>) => api.post("/api/jobs/submit", { job_type: "benchmark", ...body }, renter.headers);
    const running = (await submit({})).body.job;
    expect(running.provider_id).toBe(provider.id);
    const high = (await submit({ priority: 1 })).body.job;
    const low = (await submit({ priority: 3 })).body.job;
    expect([high.status, low.status]).toEqual(["queued", "queued"]);

    expect((await api.post(`/api/jobs/${running.job_id}/cancel`, {}, renter.headers)).status).toBe(200);
    expect(await jobState(high.job_id)).toMatchObject({ status: "pending", provider_id: provider.id });
    expect((await jobState(low.job_id)).status).toBe("queued");
    expect((await api.post(`/api/jobs/${high.job_id}/cancel`, {}, renter.headers)).status).toBe(200);
    expect(await jobState(low.job_id)).toMatchObject({ status: "pending", provider_id: provider.id });
  });

  // Regression: a plan that gives the free GPUs only to older queued jobs was once dropped
  // whole, leaving the GPU idle until the job sweep while the submit said "waiting_for_dispatch".
  it("a submit that cannot have the free GPU still hands it to the older job that can", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${provider.id}`;
    const high = (await api.post("/api/jobs/submit", { job_type: "benchmark", priority: 1 }, renter.headers)).body.job;
    await srv.sql`UPDATE providers SET is_paused = false WHERE id = ${provider.id}`;
    const low = (await api.post("/api/jobs/submit", { job_type: "benchmark", priority: 3 }, renter.headers)).body.job;
    expect(low.status).toBe("queued");
    expect(await jobState(high.job_id)).toMatchObject({ status: "pending", provider_id: provider.id });
  });
});

describe("placement finds the free GPU past what another transaction holds", () => {
  const submitOne = async (renterId: number, input: SubmitInput = {}) => {
    const [o] = await submitBatch([await prepare(renterId, input)]);
    if (!o.ok) throw o.error;
    return o.submitted.job;
  };

  it("the older job planned for the free GPU is held elsewhere (a cancel under way): the new job gets the GPU", async () => {
    const [a, b] = [await makeRenter(srv, 10_000), await makeRenter(srv, 10_000)];
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${provider.id}`;
    const older = await submitOne(a.id);
    await srv.sql`UPDATE providers SET is_paused = false WHERE id = ${provider.id}`;
    // Another transaction holds the older job's row while the new one is submitted.
    const other = await srv.sql.reserve();
    try {
      await other`BEGIN`;
      await other`SELECT id FROM jobs WHERE id = ${older.id} FOR UPDATE`;
      const fresh = await submitOne(b.id);
      expect(fresh).toMatchObject({ status: "pending", provider_id: provider.id });
      expect((await jobState(older.job_id)).status).toBe("queued");
    } finally {
      await other`ROLLBACK`;
      other.release();
    }
  });

  it("a queue head full of jobs waiting for another provider does not hide an older job this provider can run", async () => {
    const renter = await makeRenter(srv, 1_000_000);
    const [busy, free] = [await makeProvider(srv), await makeProvider(srv)];
    await srv.sql`UPDATE providers SET is_paused = true WHERE id IN (${busy.id}, ${free.id})`;
    // More high-priority jobs bound to the paused provider than placement offers from the head.
    for (let i = 0; i < 40; i++) await submitOne(renter.id, { priority: 1, providerId: busy.id });
    const older = await submitOne(renter.id, { priority: 2 });
    await srv.sql`UPDATE providers SET is_paused = false WHERE id = ${free.id}`;
    const newer = await submitOne(renter.id, { priority: 3 });
    expect(await jobState(older.job_id)).toMatchObject({ status: "pending", provider_id: free.id });
    expect((await jobState(newer.job_id)).status).toBe("queued");
  });
});

describe("SubmitBatcher", () => {
  it("a batch that waits on one renter's locked accounts gives up and splits: the other renters' submits are written meanwhile", async () => {
    const [stuck, other] = [await makeRenter(srv, 10_000), await makeRenter(srv, 10_000)];
    const provider = await makeProvider(srv);
    await setGpus(provider.id, 8);
    const batcher = new SubmitBatcher(srv.sql, { lockTimeoutMs: 200 });
    // A slow transaction holds the stuck renter's accounts (as a settlement would, for longer).
    const holder = await srv.sql.reserve();
    try {
      await holder`BEGIN`;
      await holder`SELECT id FROM ledger_accounts WHERE owner_id = ${stuck.id} FOR NO KEY UPDATE`;
      // A lone submit goes first; the next three arrive meanwhile and form one batch with the stuck renter.
      const lone = batcher.submit(await prepare(other.id));
      const batch = [await prepare(stuck.id), await prepare(other.id), await prepare(other.id)];
      const [stuckResult, ...others] = batch.map((i) => batcher.submit(i));
      await lone;
      const written = await Promise.all(others);
      expect(written.map((w) => w.job.status)).toEqual(["pending", "pending"]);
      // The stuck renter's submit still waits, alone, while its accounts are held.
      expect(await rowsFor(batch[0].jobId)).toBe(0);
      await holder`COMMIT`;
      expect((await stuckResult).job).toMatchObject({ job_id: batch[0].jobId, status: "pending" });
    } finally {
      await holder`ROLLBACK`.catch(() => undefined);
      holder.release();
    }
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("reports each group it commits: every submit's wait for its group, and the group's write", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await setGpus(provider.id, 8);
    const groups: { waits: number[]; write: number }[] = [];
    const unobserve = observeDomain({ submitGroup: (waits, write) => groups.push({ waits, write }) });
    try {
      const batcher = new SubmitBatcher(srv.sql, { maxBatch: 64, inFlight: 1 });
      const intents = await Promise.all(Array.from({ length: 6 }, () => prepare(renter.id)));
      // The first starts a group at once; the other five arrive while it is written and form the next.
      await Promise.all(intents.map((i) => batcher.submit(i)));
      expect(groups.map((g) => g.waits.length)).toEqual([1, 5]);
      expect(groups[0].waits[0]).toBeLessThan(groups[0].write);
      // Those of the second group waited for the whole first group to be written.
      for (const w of groups[1].waits) expect(w).toBeGreaterThanOrEqual(groups[0].write * 0.9);
      for (const g of groups) expect(g.write).toBeGreaterThan(0);
    } finally {
      unobserve();
    }
  });

  it("fails only the submits that the database rejects; the rest of their batch is written", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await setGpus(provider.id, 8);
    // Count transactions, to see the batch fail as a whole and be retried one submit at a time.
    let transactions = 0;
    const counted = { begin: (fn: never) => (transactions++, srv.sql.begin(fn)) } as unknown as Sql;
    const batcher = new SubmitBatcher(counted, { maxBatch: 64, inFlight: 1 });

    const first = await prepare(renter.id);
    const good = await Promise.all(Array.from({ length: 4 }, () => prepare(renter.id)));
    // jsonb refuses \u0000 in a string (22P05), so this row cannot be inserted.
    const nul = await prepare(renter.id);
    nul.params = { ...nul.params, note: "bad\u0000byte" };
    // Same job_id as `first`, written by the batch before: a unique violation (23505), and not
    // this submit's job (another task), so not taken for a batch answer that was lost.
    const duplicate = { ...(await prepare(renter.id)), jobId: first.jobId };
    const unknownProvider = await prepare(renter.id, { providerId: 2_000_000_000 });

    // `first` starts a batch at once; the others arrive while it runs and go together in the next one.
    const all = [first, good[0], nul, good[1], duplicate, good[2], unknownProvider, good[3]];
    const results = await Promise.allSettled(all.map((i) => batcher.submit(i)));
    const [rFirst, rG0, rNul, rG1, rDup, rG2, rUnknown, rG3] = results;

    for (const [r, intent] of [[rFirst, first], [rG0, good[0]], [rG1, good[1]], [rG2, good[2]], [rG3, good[3]]] as const) {
      expect(r.status).toBe("fulfilled");
      if (r.status === "fulfilled") {
        expect(r.value.job.job_id).toBe(intent.jobId);
        expect(r.value.placement.providerId).toBe(provider.id);
      }
    }
    expect(rNul).toMatchObject({ status: "rejected", reason: { code: "22P05" } });
    expect(rDup).toMatchObject({ status: "rejected", reason: { code: "23505" } });
    expect(rUnknown.status).toBe("rejected");
    if (rUnknown.status === "rejected") expect(toHttpError(rUnknown.reason).status).toBe(404);
    // 1 (first) + 1 (the batch of 7, rolled back) + 7 (its submits one by one).
    expect(transactions).toBe(9);

    expect(await rowsFor(nul.jobId)).toBe(0);
    expect(await rowsFor(unknownProvider.jobId)).toBe(0);
    expect(await rowsFor(first.jobId)).toBe(1); // the duplicate added no second row
    const [{ n, cost }] = await srv.sql<{ n: number; cost: number }[]>`
      SELECT count(*)::int AS n, coalesce(sum(cost_halala), 0)::int AS cost FROM jobs WHERE renter_id = ${renter.id}`;
    expect(n).toBe(5);
    expect(await renterFunds(srv.sql, renter.id)).toMatchObject({ held: cost, balance: 100_000 });
    expect(cost).toBe(5 * ESTIMATE);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("a batch whose commit went through but whose answer was lost", () => {
  /** A pool whose `lostAt`-th transaction commits, then loses its answer (the connection drops); it counts them. */
  function losingAnswer(lostAt: number) {
    const counter = { transactions: 0 };
    const begin = async (fn: never) => {
      const n = ++counter.transactions;
      const result = await srv.sql.begin(fn);
      if (n === lostAt) throw Object.assign(new Error("write CONNECTION_CLOSED"), { code: "CONNECTION_CLOSED" });
      return result;
    };
    const sql = new Proxy(srv.sql, { get: (target, key) => (key === "begin" ? begin : Reflect.get(target, key)) }) as Sql;
    return { sql, counter };
  }

  it("answers each submit with the job its batch wrote, and writes no second one", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await setGpus(provider.id, 2);
    // The second transaction (the batch below) commits, then its connection drops before the answer.
    const { sql: flaky, counter } = losingAnswer(2);
    const batcher = new SubmitBatcher(flaky, { maxBatch: 64, inFlight: 1 });
    const first = await prepare(renter.id);
    const rest = await Promise.all(Array.from({ length: 3 }, () => prepare(renter.id)));
    const results = await Promise.allSettled([first, ...rest].map((i) => batcher.submit(i)));
    const [rFirst, ...others] = results;
    expect(rFirst.status).toBe("fulfilled");
    for (const [r, intent] of others.map((r, i) => [r, rest[i]] as const)) {
      expect(r.status).toBe("fulfilled");
      if (r.status === "fulfilled") expect(r.value.job).toMatchObject({ job_id: intent.jobId, renter_id: renter.id });
    }
    const statuses = others.map((r) => (r.status === "fulfilled" ? r.value.job.status : "rejected"));
    expect(statuses.sort()).toEqual(["pending", "queued", "queued"]);
    const pending = others.find((r) => r.status === "fulfilled" && r.value.job.status === "pending");
    expect(pending?.status === "fulfilled" && pending.value.placement.providerId).toBe(provider.id);
    // 1 (first) + 1 (the batch of 3, committed, answer lost) + 3 (its submits one by one).
    expect(counter.transactions).toBe(5);
    const [{ n, cost }] = await srv.sql<{ n: number; cost: number }[]>`
      SELECT count(*)::int AS n, coalesce(sum(cost_halala), 0)::int AS cost FROM jobs WHERE renter_id = ${renter.id}`;
    expect(n).toBe(4);
    expect(await renterFunds(srv.sql, renter.id)).toMatchObject({ held: cost, balance: 100_000 });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("answers with its job a submit that, run again, is refused because its batch's hold took the funds", async () => {
    // Funded for exactly its four jobs: run again, each of the batch's submits finds no funds left.
    const renter = await makeRenter(srv, 4 * ESTIMATE);
    await makeProvider(srv);
    const { sql: flaky } = losingAnswer(2);
    const batcher = new SubmitBatcher(flaky, { maxBatch: 64, inFlight: 1 });
    const intents = await Promise.all(Array.from({ length: 4 }, () => prepare(renter.id)));
    const results = await Promise.allSettled(intents.map((i) => batcher.submit(i)));
    expect(results.map((r) => (r.status === "fulfilled" ? r.value.job.job_id : String(r.reason)))).toEqual(intents.map((i) => i.jobId));
    expect(await renterFunds(srv.sql, renter.id)).toMatchObject({ held: 4 * ESTIMATE, balance: 4 * ESTIMATE });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("answers a lone submit with its job too", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv);
    const { sql: flaky } = losingAnswer(1);
    const batcher = new SubmitBatcher(flaky, { maxBatch: 64, inFlight: 1 });
    const intent = await prepare(renter.id);
    expect((await batcher.submit(intent)).job).toMatchObject({ job_id: intent.jobId, renter_id: renter.id });
    expect(await rowsFor(intent.jobId)).toBe(1);
    // A lone submit whose write truly failed is still answered with its failure.
    const nul = await prepare(renter.id);
    nul.params = { ...nul.params, note: "bad\u0000byte" };
    await expect(new SubmitBatcher(srv.sql).submit(nul)).rejects.toMatchObject({ code: "22P05" });
  });
});

describe("concurrent submits over HTTP", () => {
  it("answers 201 to 40 concurrent submits of 4 renters and holds each job exactly once", async () => {
    // The test server runs with SVC_RATE_LIMITS=off, so the per-key limit does not apply here.
    const renters = await Promise.all(Array.from({ length: 4 }, () => makeRenter(srv, 50_000)));
    const provider = await makeProvider(srv);
    await setGpus(provider.id, 5);

    const replies = await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        // Different durations, so that a hold counted twice or for the wrong job shows in the sums.
        api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1 + (i % 7) }, renters[i % 4].headers),
      ),
    );
    expect(replies.map((r) => r.status)).toEqual(Array(40).fill(201));
    expect(new Set(replies.map((r) => r.body.job.job_id)).size).toBe(40);
    expect(replies.filter((r) => r.body.job.status === "pending")).toHaveLength(5);

    expect(await ledgerProblems(srv.sql)).toEqual([]);
    for (const r of renters) {
      const [jobs] = await srv.sql<{ n: number; cost: number; holds: number; hold_sum: number; hold_transfers: number }[]>`
        SELECT count(*)::int AS n, sum(cost_halala)::int AS cost,
               (SELECT count(*)::int FROM ledger_holds h JOIN jobs j ON j.id = h.job_id WHERE j.renter_id = ${r.id}) AS holds,
               (SELECT coalesce(sum(h.amount), 0)::int FROM ledger_holds h JOIN jobs j ON j.id = h.job_id WHERE j.renter_id = ${r.id} AND h.status = 'open') AS hold_sum,
               (SELECT count(*)::int FROM ledger_transfers t JOIN jobs j ON j.id = t.job_id WHERE j.renter_id = ${r.id} AND t.kind = 'hold') AS hold_transfers
        FROM jobs WHERE renter_id = ${r.id}`;
      expect(jobs.n).toBe(10);
      expect(jobs.holds).toBe(10);
      expect(jobs.hold_transfers).toBe(10);
      expect(jobs.hold_sum).toBe(jobs.cost);
      expect(await renterFunds(srv.sql, r.id)).toEqual({ available: 50_000 - jobs.cost, held: jobs.cost, balance: 50_000 });
      const [row] = await srv.sql<{ total_jobs: number }[]>`SELECT total_jobs FROM renters WHERE id = ${r.id}`;
      expect(row.total_jobs).toBe(10);
    }
    // One job per GPU held under the race too.
    expect(await activeByProvider([provider.id])).toEqual(new Map([[provider.id, 5]]));
  });
});
