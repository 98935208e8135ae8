// Dispatch over real HTTP and PostgreSQL: one job per provider GPU under
// concurrent submits, two providers polling at once never share a job,
// priority then age order, explicit provider_id waits for that provider,
// queue reasons, and the LISTEN/NOTIFY signals of assignment and cancel.
import { beforeEach, describe, expect, it, vi } from "vitest";
import { HMAC_SECRET, useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { EXPLAIN_CAP } from "../../src/domain/dispatch/dispatch.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { verifyTask } from "../../src/shared/task-signature.js";
import { sweepJobs } from "../../src/workers/job-timeouts.js";
import { ASSIGNED_CHANNEL, CANCEL_CHANNEL } from "../../src/domain/notify/job-notices.js";
import { clearMarketplace } from "./helpers.js";
import { JobSignalHub } from "../../src/workers/job-signals.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const submit = (headers: Record<string, string>, body: Record<string, unknown> = {}) =>
  api.post("/api/jobs/submit", { job_type: "benchmark", ...body }, headers);

async function setGpus(providerId: number, n: number) {
  await srv.sql`UPDATE providers SET gpu_count = ${n}, approved_gpu_count = ${n} WHERE id = ${providerId}`;
}

async function statusOf(jobId: string) {
  const [j] = await srv.sql<{ status: string; provider_id: number | null }[]>`SELECT status, provider_id FROM jobs WHERE job_id = ${jobId}`;
  return j;
}

/** Poll, then report success: the provider's next job in the order it gets them. */
async function runNext(key: string): Promise<string | null> {
  const p = await api.get(`/api/providers/${key}/jobs`);
  if (!p.body.job) return null;
  const r = await api.post("/api/providers/job-result", { api_key: key, job_id: p.body.job.job_id, success: true, result: { scores: {} } });
  expect(r.status).toBe(200);
  return p.body.job.job_id;
}

describe("slots", () => {
  it("keeps one job per GPU when submits race, and queues the rest with a reason", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await setGpus(provider.id, 2);
    const rs = await Promise.all(Array.from({ length: 16 }, () => submit(renter.headers)));
    expect(rs.map((r) => r.status)).toEqual(Array(16).fill(201));
    const pending = rs.filter((r) => r.body.job.status === "pending");
    const queued = rs.filter((r) => r.body.job.status === "queued");
    expect(pending).toHaveLength(2);
    expect(queued).toHaveLength(14);
    for (const q of queued) {
      expect(q.body.queued).toBe(true);
      expect(q.body.job.queue_position).toBeGreaterThanOrEqual(1);
      expect(q.body.job.queue_reason_code).toBe("providers_busy");
      expect(q.body.message).toMatch(/busy/);
    }
    const [load] = await srv.sql<{ active: number }[]>`SELECT active FROM provider_load WHERE provider_id = ${provider.id}`;
    expect(load.active).toBe(2);
    const [{ n }] = await srv.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM jobs WHERE provider_id = ${provider.id} AND status IN ('pending','running')`;
    expect(n).toBe(2);
  });

  it("answers each queued submit its exact place, read for its batch after the commit", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await setGpus(provider.id, 1);
    const first = await submit(renter.headers);
    expect(first.status, JSON.stringify(first.body)).toBe(201);
    expect(first.body.job.status).toBe("pending");
    // Concurrent submits to a full fleet: written in groups, every one queued.
    const rs = await Promise.all(Array.from({ length: 12 }, (_, i) => submit(renter.headers, { priority: i % 3 === 0 ? 1 : 3 })));
    expect(rs.map((r) => r.status), JSON.stringify(rs.find((r) => r.status !== 201)?.body)).toEqual(Array(12).fill(201));
    expect(rs.map((r) => r.body.job.status)).toEqual(Array(12).fill("queued"));
    const order = await srv.sql<{ job_id: string }[]>`SELECT job_id FROM jobs WHERE status = 'queued' ORDER BY priority, submitted_at, id`;
    const placeOf = new Map(order.map((r, i) => [r.job_id, i + 1]));
    for (const r of rs) {
      const place = placeOf.get(r.body.job.job_id)!;
      expect(r.body.job.queue_position).toBe(place);
      // The reason counts the same jobs ahead.
      if (place > 1) expect(r.body.job.queue_reason).toContain(`${place - 1} job${place === 2 ? "" : "s"} ahead in the queue`);
      else expect(r.body.job.queue_reason).not.toContain("ahead in the queue");
      expect(r.body.job.queue_reason_code).toBe("providers_busy");
      // A read of the job, nothing having moved since, gives the same reason.
      const read = await api.get(`/api/jobs/${r.body.job.job_id}`, renter.headers);
      expect(read.status).toBe(200);
      expect(JSON.stringify(read.body)).toContain(JSON.stringify(r.body.job.queue_reason));
    }
  });

  it("never hands one job to two providers polling at the same time", async () => {
    const renter = await makeRenter(srv, 1_000_000);
    const a = await makeProvider(srv);
    const b = await makeProvider(srv);
    // Both paused while the queue fills; together they have exactly one GPU per job.
    await srv.sql`UPDATE providers SET is_paused = true, gpu_count = 15 WHERE id IN (${a.id}, ${b.id})`;
    const ids: string[] = [];
    for (let i = 0; i < 30; i++) {
      const r = await submit(renter.headers);
      expect(r.body.job.queue_reason_code).toBe("providers_paused");
      ids.push(r.body.job.job_id);
    }
    await srv.sql`UPDATE providers SET is_paused = false WHERE id IN (${a.id}, ${b.id})`;
    const polls = await Promise.all(
      Array.from({ length: 40 }, (_, i) => api.get(`/api/providers/${i % 2 ? a.key : b.key}/jobs`).then((r) => ({ who: i % 2 ? a.id : b.id, job: r.body.job?.job_id as string | undefined }))),
    );
    // Drain what each one was given.
    for (const who of [a, b]) {
      for (;;) {
        const r = await api.get(`/api/providers/${who.key}/jobs`);
        if (!r.body.job) break;
        polls.push({ who: who.id, job: r.body.job.job_id });
      }
    }
    const got = polls.filter((p) => p.job);
    const jobIds = got.map((p) => p.job!);
    expect(new Set(jobIds).size).toBe(jobIds.length); // no job twice
    expect(jobIds.length).toBe(30);
    expect(new Set(got.map((p) => p.who)).size).toBe(2); // both took part
    expect(new Set(jobIds)).toEqual(new Set(ids));
    for (const p of got) expect((await statusOf(p.job!)).provider_id).toBe(p.who);
    const attempts = await srv.sql<{ n: number }[]>`SELECT count(*)::int AS n FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id IN ${srv.sql(ids)}`;
    expect(attempts[0].n).toBe(30);
  });
});

describe("order", () => {
  it("dispatches by priority, then submit time", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${provider.id}`;
    const plan = [3, 2, 1, 2, 1, 3];
    const ids: string[] = [];
    for (const priority of plan) ids.push((await submit(renter.headers, { priority })).body.job.job_id);
    await srv.sql`UPDATE providers SET is_paused = false WHERE id = ${provider.id}`;
    const order: string[] = [];
    for (let i = 0; i < plan.length; i++) order.push((await runNext(provider.key))!);
    expect(order).toEqual([ids[2], ids[4], ids[1], ids[3], ids[0], ids[5]]);
    expect(await runNext(provider.key)).toBeNull();
  });

  it("gives a freed GPU the next queued job at once", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    const first = (await submit(renter.headers)).body.job.job_id;
    const second = (await submit(renter.headers)).body.job.job_id;
    expect((await statusOf(second)).status).toBe("queued");
    await api.get(`/api/providers/${provider.key}/jobs`);
    await api.post("/api/providers/job-result", { api_key: provider.key, job_id: first, success: true, result: {} });
    expect(await statusOf(second)).toEqual({ status: "pending", provider_id: provider.id });
  });
});

describe("placement rules", () => {
  it("honours gpu_requirements (VRAM and model) and skips paused, unapproved and silent providers", async () => {
    const renter = await makeRenter(srv, 100_000);
    const small = await makeProvider(srv, { vramMib: 8192, gpuModel: "NVIDIA GeForce RTX 3070" });
    const paused = await makeProvider(srv, { vramMib: 81559, gpuModel: "NVIDIA H100 80GB HBM3" });
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${paused.id}`;
    await makeProvider(srv, { vramMib: 81559, gpuModel: "NVIDIA H100 80GB HBM3", approved: false });
    const big = await makeProvider(srv, { vramMib: 49140, gpuModel: "NVIDIA RTX A6000" });
    const r = await submit(renter.headers, { gpu_requirements: { min_vram_gb: 40 } });
    expect(r.body.job.provider_id).toBe(big.id);
    const byModel = await submit(renter.headers, { gpu_requirements: { gpu_model: "rtx 3070" } });
    expect(byModel.body.job.provider_id).toBe(small.id);
    // The only H100 that could run it is paused: queued, not 503.
    const h100 = await submit(renter.headers, { gpu_requirements: { gpu_model: "H100" } });
    expect(h100.status).toBe(201);
    expect(h100.body.job).toMatchObject({ status: "queued", queue_reason_code: "providers_paused" });
    // vram_reserve_gb is not usable: 48 GB card with 10 GB reserved no longer fits 40 GB.
    await srv.sql`UPDATE providers SET vram_reserve_gb = 10 WHERE id = ${big.id}`;
    const reserved = await submit(renter.headers, { gpu_requirements: { min_vram_gb: 40, gpu_model: "A6000" } });
    expect(reserved.status).toBe(503);
  });

  it("lists queued jobs with the same reasons and places as each job's own read", async () => {
    const renter = await makeRenter(srv, 100_000);
    const one = await makeProvider(srv);
    const h100 = await makeProvider(srv, { vramMib: 81559, gpuModel: "NVIDIA H100 80GB HBM3" });
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${h100.id}`;
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) ids.push((await submit(renter.headers)).body.job.job_id); // the first runs, three wait behind it
    for (let i = 0; i < 2; i++) ids.push((await submit(renter.headers, { gpu_requirements: { gpu_model: "H100" } })).body.job.job_id);
    ids.push((await submit(renter.headers, { provider_id: one.id })).body.job.job_id);
    // A later attempt's standing is its own (the providers that declined it do not count).
    await srv.sql`UPDATE jobs SET attempt = 2 WHERE job_id = ${ids[3]}`;

    const list = await api.get("/api/jobs?limit=50", renter.headers);
    expect(list.status).toBe(200);
    const listed = new Map<string, Record<string, unknown>>(list.body.jobs.map((j: Record<string, unknown>) => [j.job_id as string, j]));
    const codes = new Set<unknown>();
    for (const id of ids) {
      const own = (await api.get(`/api/jobs/${id}`, renter.headers)).body;
      const inList = listed.get(id)!;
      expect(inList.status).toBe(own.status);
      expect([inList.queue_reason, inList.queue_reason_code]).toEqual([own.queue_reason, own.queue_reason_code]);
      codes.add(own.queue_reason_code);
    }
    expect(codes).toEqual(new Set([null, "providers_busy", "providers_paused", "provider_busy"]));
    expect(listed.get(ids[2])!.queue_reason).toMatch(/1 job ahead in the queue/);
  });

  it("places a page's queued jobs by the queued jobs ahead of each, across priorities and after one left", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv, { gpuModel: "NVIDIA L4 queue-order" });
    const fits = { gpu_requirements: { gpu_model: "queue-order" } };
    expect((await submit(renter.headers, fits)).body.job.status).toBe("pending"); // takes the one GPU
    const ids: string[] = [];
    for (const priority of [2, 1, 3, 2, 1, 3, 2]) {
      const r = await submit(renter.headers, { ...fits, priority });
      expect(r.body.job.status).toBe("queued");
      ids.push(r.body.job.job_id);
    }
    expect((await api.post(`/api/jobs/${ids[4]}/cancel`, {}, renter.headers)).status).toBe(200);

    const list = await api.get("/api/jobs?limit=50", renter.headers);
    const listed = new Map<string, { status: string; queue_reason: string }>(list.body.jobs.map((j: { job_id: string }) => [j.job_id, j]));
    for (const id of ids.filter((_, i) => i !== 4)) {
      // Counted on its own, as each job's place is defined.
      const [{ ahead }] = await srv.sql<{ ahead: number }[]>`
        SELECT count(q.id)::int AS ahead FROM jobs me JOIN jobs q ON q.status = 'queued'
          AND (q.priority, q.submitted_at, q.id) < (me.priority, me.submitted_at, me.id)
        WHERE me.job_id = ${id}`;
      const job = listed.get(id)!;
      expect(job.status).toBe("queued");
      if (ahead === 0) expect(job.queue_reason).not.toMatch(/ahead in the queue/);
      else expect(job.queue_reason).toMatch(new RegExp(`; ${ahead} jobs? ahead in the queue`));
    }
  });

  it("waits for an explicitly requested provider, saying why", async () => {
    const renter = await makeRenter(srv, 100_000);
    const wanted = await makeProvider(srv);
    await makeProvider(srv); // free, but not the one asked for
    const busy = (await submit(renter.headers, { provider_id: wanted.id })).body.job;
    expect(busy.provider_id).toBe(wanted.id);
    const waiting = (await submit(renter.headers, { provider_id: wanted.id })).body.job;
    expect(waiting).toMatchObject({ status: "queued", provider_id: null, queue_reason_code: "provider_busy" });
    expect(waiting.queue_reason).toMatch(new RegExp(`provider ${wanted.id} is busy`));

    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${wanted.id}`;
    expect((await api.get(`/api/jobs/${waiting.job_id}`, renter.headers)).body.queue_reason_code).toBe("provider_paused");
    await srv.sql`UPDATE providers SET is_paused = false, run_mode = 'scheduled',
      scheduled_start = to_char((now() AT TIME ZONE 'UTC') + interval '2 hours', 'HH24:MI'),
      scheduled_end = to_char((now() AT TIME ZONE 'UTC') + interval '3 hours', 'HH24:MI') WHERE id = ${wanted.id}`;
    const out = await api.get(`/api/jobs/${waiting.job_id}/output`, renter.headers);
    expect(out.status).toBe(202);
    expect(out.body.message).toMatch(/outside its scheduled window/);
    expect((await api.get(`/api/jobs/${waiting.job_id}`, renter.headers)).body.queue_reason_code).toBe("provider_outside_schedule");
    await srv.sql`UPDATE providers SET run_mode = 'always-on' WHERE id = ${wanted.id}`;
    await api.get(`/api/providers/${wanted.key}/jobs`);
    await api.post("/api/providers/job-result", { api_key: wanted.key, job_id: busy.job_id, success: true, result: {} });
    expect(await statusOf(waiting.job_id)).toEqual({ status: "pending", provider_id: wanted.id });
  });

  it("says when no matching provider is online any more", async () => {
    const renter = await makeRenter(srv, 100_000);
    const p = await makeProvider(srv);
    await submit(renter.headers);
    const q = (await submit(renter.headers)).body.job.job_id;
    await srv.sql`UPDATE providers SET last_heartbeat = now() - interval '10 minutes' WHERE id = ${p.id}`;
    const job = (await api.get(`/api/jobs/${q}`, renter.headers)).body;
    expect(job).toMatchObject({ status: "queued", queue_reason_code: "no_matching_provider" });
    expect(job.queue_reason).toMatch(/online/);
  });
});

describe("provider choice", () => {
  it("gives a job to the least busy provider that fits, then the most reliable", async () => {
    const renter = await makeRenter(srv, 100_000);
    const [a, b, c] = [await makeProvider(srv), await makeProvider(srv), await makeProvider(srv)];
    await setGpus(a.id, 2);
    for (const [p, score] of [[a, 0.99], [b, 0.5], [c, 0.9]] as const) {
      await srv.sql`UPDATE providers SET reliability_score = ${score} WHERE id = ${p.id}`;
    }
    expect((await submit(renter.headers, { provider_id: a.id })).body.job.provider_id).toBe(a.id); // a: 1 of 2 busy
    const placed: number[] = [];
    for (let i = 0; i < 3; i++) placed.push((await submit(renter.headers)).body.job.provider_id);
    expect(placed).toEqual([c.id, b.id, a.id]); // idle first (most reliable first), then a's free GPU
    const last = (await submit(renter.headers)).body.job;
    expect(last).toMatchObject({ status: "queued", provider_id: null });
  });

  it("looks past the most reliable providers when none of them fit (a fleet wider than the candidate window)", async () => {
    const renter = await makeRenter(srv, 100_000);
    const fleet = [];
    for (let i = 0; i < 40; i++) fleet.push(await makeProvider(srv));
    const h100 = await makeProvider(srv, { gpuModel: "NVIDIA H100 80GB HBM3", vramMib: 81559 });
    await srv.sql`UPDATE providers SET reliability_score = 0.9 + id / 1e9 WHERE id = ANY(${fleet.map((p) => p.id)})`;
    await srv.sql`UPDATE providers SET reliability_score = 0.1 WHERE id = ${h100.id}`;
    const big = (await submit(renter.headers, { gpu_requirements: { gpu_model: "H100" } })).body.job;
    expect(big.provider_id).toBe(h100.id);
    const plain = (await submit(renter.headers)).body.job;
    expect(plain.provider_id).toBe(fleet[fleet.length - 1].id); // the most reliable 4090
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("the sweep's safety net", () => {
  it("places queued jobs once capacity appears behind its back: a bound job on its provider, a free job anywhere", async () => {
    const renter = await makeRenter(srv, 100_000);
    const bound = await makeProvider(srv);
    const other = await makeProvider(srv);
    await setGpus(other.id, 2);
    // Everything busy: bound runs b1 (b2 waits for it), other runs two fillers (free waits).
    const b1 = (await submit(renter.headers, { provider_id: bound.id })).body.job;
    const b2 = (await submit(renter.headers, { provider_id: bound.id })).body.job;
    expect([b1.provider_id, b2.status]).toEqual([bound.id, "queued"]);
    const fillers = [(await submit(renter.headers)).body.job, (await submit(renter.headers)).body.job];
    expect(fillers.map((j) => j.provider_id)).toEqual([other.id, other.id]);
    const free = (await submit(renter.headers)).body.job;
    expect(free.status).toBe("queued");

    // Slots open with no event (as if another process's notice was lost): only the sweep can notice.
    await srv.sql`UPDATE providers SET gpu_count = 2, approved_gpu_count = 2 WHERE id = ${bound.id}`;
    await srv.sql`UPDATE providers SET gpu_count = 3, approved_gpu_count = 3 WHERE id = ${other.id}`;
    const swept = await sweepJobs(srv.sql);
    expect(swept.assigned).toBeGreaterThanOrEqual(2);
    expect(await statusOf(b2.job_id)).toMatchObject({ status: "pending", provider_id: bound.id });
    expect(await statusOf(free.job_id)).toMatchObject({ status: "pending", provider_id: other.id });
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("signals", () => {
  it("notifies listeners of assignments and cancels, only once committed", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    const assigned: { provider_id: number; job_id: string }[] = [];
    const cancelled: { provider_id: number; job_id: string }[] = [];
    const l1 = await srv.sql.listen(ASSIGNED_CHANNEL, (p) => assigned.push(JSON.parse(p)));
    const l2 = await srv.sql.listen(CANCEL_CHANNEL, (p) => cancelled.push(JSON.parse(p)));
    try {
      const job = (await submit(renter.headers)).body.job.job_id;
      // A 503 rolls back whole: no notice escapes.
      expect((await submit(renter.headers, { gpu_requirements: { min_vram_gb: 500 } })).status).toBe(503);
      await expect.poll(() => assigned.length).toBe(1);
      // The assignment carries what the daemon is sent, signed as stored.
      const notice = assigned[0] as { provider_id: number; job_id: string; job: Record<string, unknown> };
      expect(notice).toMatchObject({ provider_id: provider.id, job_id: job, job: { job_id: job, job_type: "benchmark", max_duration_seconds: 1800 } });
      expect(verifyTask(HMAC_SECRET, notice.job.task_spec, notice.job.task_spec_hmac as string)).toBe(true);
      const c = await api.post(`/api/jobs/${job}/cancel`, {}, renter.headers);
      expect(c.status).toBe(200);
      await expect.poll(() => cancelled.length).toBe(1);
      expect(cancelled[0]).toEqual({ provider_id: provider.id, job_id: job });
    } finally {
      await l1.unlisten();
      await l2.unlisten();
    }
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("leaves the job out of an assignment notice too large for NOTIFY (listeners read it)", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    const assigned: Record<string, unknown>[] = [];
    const l = await srv.sql.listen(ASSIGNED_CHANNEL, (p) => assigned.push(JSON.parse(p)));
    try {
      const r = await api.post("/api/jobs/submit", { job_type: "llm-inference", params: { prompt: "x".repeat(9000) } }, renter.headers);
      expect(r.status, r.text).toBe(201);
      await expect.poll(() => assigned.length).toBe(1);
      expect(assigned[0]).toEqual({ provider_id: provider.id, job_id: r.body.job.job_id });
    } finally {
      await l.unlisten();
    }
  });
});

describe("the signal hub", () => {
  it("reads provider and job from a notice's head, and parses the job only for a stream that asks for it", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    await srv.sql`UPDATE providers SET gpu_count = 2, approved_gpu_count = 2 WHERE id = ${provider.id}`;
    const other = await makeProvider(srv, { online: false });
    const hub = new JobSignalHub(srv.sql, srv.app.deps.log);
    const heard: { jobId: string; job?: Record<string, unknown> }[] = [];
    const cancels: string[] = [];
    let asking = false;
    const offProvider = await hub.subscribe(provider.id, {
      assigned: (jobId, job) => heard.push({ jobId, job: asking ? (job?.() as unknown as Record<string, unknown>) : undefined }),
      cancel: (jobId) => cancels.push(jobId),
      settings: () => {},
      resync: () => {},
    });
    const offOther = await hub.subscribe(other.id, { assigned: () => expect.unreachable("another provider's notice"), cancel: () => {}, settings: () => {}, resync: () => {} });
    const parse = vi.spyOn(JSON, "parse");
    const parsedNotices = () => parse.mock.calls.filter(([text]) => typeof text === "string" && text.startsWith('{"provider_id"')).length;
    try {
      // A stream that has the job already asks for nothing: the notice is not parsed.
      const first = (await submit(renter.headers)).body.job.job_id;
      await expect.poll(() => heard.length).toBe(1);
      expect(heard[0]).toEqual({ jobId: first, job: undefined });
      expect(parsedNotices()).toBe(0);
      // One that asks gets the job the notice carried, signed as stored.
      asking = true;
      const second = (await submit(renter.headers)).body.job.job_id;
      await expect.poll(() => heard.length).toBe(2);
      expect(heard[1].jobId).toBe(second);
      expect(heard[1].job).toMatchObject({ job_id: second, job_type: "benchmark" });
      expect(verifyTask(HMAC_SECRET, heard[1].job!.task_spec, heard[1].job!.task_spec_hmac as string)).toBe(true);
      expect(parsedNotices()).toBe(1);
      // A cancel notice (JSON.stringify's spacing) reaches the provider's stream by its head too.
      expect((await api.post(`/api/jobs/${second}/cancel`, {}, renter.headers)).status).toBe(200);
      await expect.poll(() => cancels).toEqual([second]);
      // A malformed notice is logged and dropped.
      await srv.sql`SELECT pg_notify(${ASSIGNED_CHANNEL}, ${"{not json"})`;
      await srv.sql`SELECT pg_notify(${ASSIGNED_CHANNEL}, ${JSON.stringify({ provider_id: provider.id, job_id: "job-late" })})`;
      await expect.poll(() => heard.length).toBe(3);
      expect(heard[2]).toEqual({ jobId: "job-late", job: undefined });
    } finally {
      parse.mockRestore();
      offProvider();
      offOther();
      await hub.stop();
    }
  });
});

describe("queue reasons at fleet scale", () => {
  it("looks at no more than EXPLAIN_CAP live providers that fit, and says so in the reason", async () => {
    const renter = await makeRenter(srv, 10_000);
    const tag = Math.random().toString(36).slice(2, 8);
    await srv.sql`
      INSERT INTO providers (name, email, gpu_model, os, status, approval_status, last_heartbeat, gpu_count, gpu_vram_mib, is_paused)
      SELECT 'bulk', 'bulk-' || g || '-' || ${tag} || '@example.com', 'RTX 4090', 'linux', 'online', 'approved', now(), 1, 24576, true
      FROM generate_series(1, ${EXPLAIN_CAP + 5}) g`;
    const r = await submit(renter.headers);
    expect(r.status).toBe(201);
    expect(r.body.job).toMatchObject({ status: "queued", queue_reason_code: "providers_paused" });
    expect(r.body.job.queue_reason).toMatch(/all of the 1,000\+ matching providers looked at are paused/);
    const read = await api.get(`/api/jobs/${r.body.job.job_id}`, renter.headers);
    expect(read.body.queue_reason).toBe(r.body.job.queue_reason);
  });
});
