// Live job events: WatchJob (gRPC and Connect) and GET /api/jobs/{id}/events
// (server-sent events) against a real server: order of events, resume from a
// cursor after a cut connection, who may watch, one read per change however
// many watch, and events written by a second server process.
import { spawn, type ChildProcess } from "node:child_process";
import net from "node:net";
import { Code, ConnectError } from "@connectrpc/connect";
import { toJson } from "@bufbuild/protobuf";
import { afterAll, beforeEach, describe, expect, it } from "vitest";
import { JobEventSchema } from "../../gen/svc/v1/jobs_pb.js";
import { ADMIN_TOKEN, HMAC_SECRET, useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { jobWatchHub, MAX_QUEUED_LOG_CHARS, MAX_WATCHES_PER_ACCOUNT, Watcher } from "../../src/workers/job-watch.js";
import { isFullPage, readJobChanges, WATCH_LOG_PAGE_CHARS } from "../../src/domain/jobs/job-watch.js";
import { clearMarketplace } from "./helpers.js";
import { jobClient, openSse, watchAll, type SseEvent } from "./watch-helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

/** A renter with a benchmark job assigned to a fresh provider (pending). */
async function assignedJob() {
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv);
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 3 }, renter.headers);
  expect(r.status).toBe(201);
  expect(r.body.job.status).toBe("pending");
  return { renter, provider, jobId: r.body.job.job_id as string };
}

const logs = (base: string, provider: { key: string }, jobId: string, lines: string[]) =>
  client(base).post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: lines });
const progress = (base: string, provider: { key: string }, jobId: string, pct: number, phase: string) =>
  client(base).post(`/api/jobs/${jobId}/progress`, { api_key: provider.key, progress_pct: pct, phase });
const result = (base: string, provider: { key: string }, jobId: string, body: Record<string, unknown>) =>
  client(base).post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, ...body });

const kinds = (es: SseEvent[]) => es.map((e) => e.event);
const logMessages = (es: SseEvent[]) => es.filter((e) => e.event === "log").map((e) => e.data.log.message);

/** WatchJob over a generated client, collected as it arrives. */
function grpcWatch(headers: Record<string, string>, jobId: string, cursor?: string) {
  const events: any[] = [];
  const ac = new AbortController();
  const done = (async () => {
    for await (const e of jobClient(srv.url).watchJob({ jobId, cursor }, { headers, signal: ac.signal })) {
      events.push(toJson(JobEventSchema, e, { useProtoFieldName: true }));
    }
  })();
  done.catch(() => {});
  const until = async (pred: (es: any[]) => boolean) => {
    while (!pred(events)) {
      const settled = await Promise.race([done.then(() => true, () => true), new Promise((r) => setTimeout(() => r(false), 20))]);
      if (settled && !pred(events)) throw new Error(`stream ended before the condition held: ${JSON.stringify(events)}`);
    }
  };
  return { events, done, until, cut: () => ac.abort() };
}
const eventKind = (e: any) => Object.keys(e).find((k) => k !== "cursor");

describe("WatchJob and GET /api/jobs/{id}/events", () => {
  it("sends the snapshot first, then status, progress and log lines in order, and ends with the outcome", async () => {
    const { renter, provider, jobId } = await assignedJob();
    const sse = await openSse(`${srv.url}/api/jobs/${jobId}/events`, renter.headers);
    expect(sse.status).toBe(200);
    expect(sse.contentType).toMatch(/^text\/event-stream/);
    const grpc = grpcWatch(renter.headers, jobId);
    await sse.until((es) => es.length >= 1);
    await grpc.until((es) => es.length >= 1);
    expect(sse.events[0].event).toBe("snapshot");
    expect(sse.events[0].data.snapshot.job).toMatchObject({ job_id: jobId, status: "pending", provider_id: provider.id });
    expect(sse.events[0].data.snapshot.attempts).toHaveLength(1);
    expect(sse.events[0].data.snapshot.job).not.toHaveProperty("endpoint_url", expect.any(String));
    expect(eventKind(grpc.events[0])).toBe("snapshot");

    // Each step waits until both watchers saw the last, so every change is its own event.
    const both = async (pred: (n: number) => boolean) => {
      await sse.until((es) => pred(es.length));
      await grpc.until((es) => pred(es.length));
    };
    const poll = await api.get(`/api/providers/${provider.key}/jobs`);
    expect(poll.body.job.job_id).toBe(jobId);
    await sse.until((es) => es.some((e) => e.event === "status" && e.data.status.status === "running"));
    await progress(srv.url, provider, jobId, 10, "loading");
    await sse.until((es) => es.some((e) => e.event === "progress"));
    await logs(srv.url, provider, jobId, ["line a", "line b"]);
    await sse.until((es) => logMessages(es).length === 2);
    await progress(srv.url, provider, jobId, 60, "generating");
    await sse.until((es) => es.filter((e) => e.event === "progress").length === 2);
    await logs(srv.url, provider, jobId, ["line c"]);
    await sse.until((es) => logMessages(es).length === 3);
    await both((n) => n === sse.events.length);
    expect((await result(srv.url, provider, jobId, { success: true, result: { response: "done" } })).status).toBe(200);
    await sse.ended;
    await grpc.done;

    const k = kinds(sse.events);
    expect(k.slice(0, 3)).toEqual(["snapshot", "status", "attempts"]);
    expect(k.slice(3, 8)).toEqual(["progress", "log", "log", "progress", "log"]);
    expect(k.at(-1)).toBe("outcome");
    expect(k.slice(8)).toContain("status");
    expect(sse.events[1].data.status).toMatchObject({ status: "running", provider_id: provider.id, attempt: 1 });
    expect(sse.events[3].data.progress).toEqual({ progress_pct: 10, phase: "loading" });
    expect(sse.events[6].data.progress).toEqual({ progress_pct: 60, phase: "generating" });
    expect(logMessages(sse.events)).toEqual(["line a", "line b", "line c"]);
    const seqs = sse.events.filter((e) => e.event === "log").map((e) => e.data.log.seq);
    expect([...seqs].sort((a, b) => a - b)).toEqual(seqs);
    // Every event's id is its cursor: the seq of the last line sent before or with it.
    for (const e of sse.events) expect(e.id).toBe(e.data.cursor);
    for (const e of sse.events.filter((x) => x.event === "log")) expect(e.id).toBe(String(e.data.log.seq));
    const finalStatus = sse.events.filter((e) => e.event === "status").at(-1)!;
    expect(finalStatus.data.status.status).toBe("completed");
    const outcome = sse.events.at(-1)!.data.outcome;
    expect(outcome).toMatchObject({ status: "completed", end_reason: "completed", fault: "none", error: null, output_path: `/api/jobs/${jobId}/output`, output_format: "text" });
    expect(outcome.cost_halala).toBeGreaterThan(0);
    expect(outcome.actual_minutes).toBe(1);

    // The gRPC watcher got the same events (64-bit integers as strings in proto JSON).
    expect(grpc.events.map(eventKind)).toEqual(k);
    expect(grpc.events.filter((e) => e.log).map((e) => e.log.message)).toEqual(["line a", "line b", "line c"]);
    expect(grpc.events.at(-1).outcome.cost_halala).toBe(String(outcome.cost_halala));
  });

  it("a terminal job streams its snapshot, every line and the outcome, then ends; a failed job says why", async () => {
    const { renter, provider, jobId } = await assignedJob();
    await api.get(`/api/providers/${provider.key}/jobs`);
    await logs(srv.url, provider, jobId, ["x1", "x2"]);
    await result(srv.url, provider, jobId, { success: false, error: "CUDA out of memory" });
    const events = await watchAll(srv.url, renter.headers, jobId, undefined, "connect");
    expect(events.map(eventKind)).toEqual(["snapshot", "log", "log", "outcome"]);
    expect(events[3].outcome).toMatchObject({ status: "failed", error: "CUDA out of memory", end_reason: "runtime_error", fault: "unattributed" });
    expect(events[3].outcome.output_path).toBeUndefined();
    // From a cursor: only the lines after it.
    const after = await watchAll(srv.url, renter.headers, jobId, events[1].cursor);
    expect(after.map(eventKind)).toEqual(["snapshot", "log", "outcome"]);
    expect(after[1].log.message).toBe("x2");
  });

  it("resumes after a cut connection from Last-Event-ID (or a cursor) with no line lost or repeated", async () => {
    const { renter, provider, jobId } = await assignedJob();
    await api.get(`/api/providers/${provider.key}/jobs`);
    const first = await openSse(`${srv.url}/api/jobs/${jobId}/events`, renter.headers);
    await logs(srv.url, provider, jobId, ["1", "2", "3", "4", "5"]);
    await first.until((es) => logMessages(es).length === 5);
    first.cut();
    await first.ended;
    // The client processed only three of them before the cut: it resumes from the third's id.
    const third = first.events.filter((e) => e.event === "log")[2];
    await logs(srv.url, provider, jobId, ["6", "7"]); // written while nobody watched
    const second = await openSse(`${srv.url}/api/jobs/${jobId}/events`, { ...renter.headers, "last-event-id": third.id! });
    expect(second.status).toBe(200);
    await second.until((es) => logMessages(es).length === 4);
    expect(second.events[0].event).toBe("snapshot");
    expect(second.events[0].id).toBe(third.id);
    const grpc = grpcWatch(renter.headers, jobId, third.id);
    await grpc.until((es) => es.filter((e) => e.log).length === 4);
    await logs(srv.url, provider, jobId, ["8"]);
    await result(srv.url, provider, jobId, { success: true, result: { response: "ok" } });
    await second.ended;
    await grpc.done;
    const seen = [...logMessages(first.events).slice(0, 3), ...logMessages(second.events)];
    expect(seen).toEqual(["1", "2", "3", "4", "5", "6", "7", "8"]);
    expect(grpc.events.filter((e) => e.log).map((e) => e.log.message)).toEqual(["4", "5", "6", "7", "8"]);
    expect(kinds(second.events).at(-1)).toBe("outcome");
    // ?cursor= does the same for clients that cannot set headers; a bad cursor is 400.
    const viaQuery = await openSse(`${srv.url}/api/jobs/${jobId}/events?cursor=${third.id}`, renter.headers);
    await viaQuery.ended;
    expect(logMessages(viaQuery.events)).toEqual(["4", "5", "6", "7", "8"]);
    const bad = await api.get(`/api/jobs/${jobId}/events`, { ...renter.headers, "last-event-id": "abc" });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/cursor/);
  });

  it("readers: the owning renter, the job's provider and admins; others are refused with the read's errors", async () => {
    const { renter, provider, jobId } = await assignedJob();
    const other = await makeRenter(srv);
    const otherProvider = await makeProvider(srv);
    const path = `${srv.url}/api/jobs/${jobId}/events`;
    for (const headers of [renter.headers, provider.headers, { "x-admin-token": ADMIN_TOKEN }]) {
      const s = await openSse(path, headers);
      expect(s.status).toBe(200);
      await s.until((es) => es.length >= 1);
      expect(s.events[0].event).toBe("snapshot");
      s.cut();
    }
    const refused = [
      [other.headers, 403, /another caller/],
      [otherProvider.headers, 403, /another caller/],
      [{ "x-renter-key": "svc-renter-not-a-real-key" }, 401, /invalid API key/],
      [{ "x-admin-token": "wrong" }, 401, /invalid admin token/],
    ] as const;
    for (const [headers, status, error] of refused) {
      const s = await openSse(path, headers);
      expect(s.status).toBe(status);
      expect(s.errorBody.error).toMatch(error);
    }
    const missing = await openSse(`${srv.url}/api/jobs/job-does-not-exist/events`, renter.headers);
    expect(missing.status).toBe(404);
    // gRPC: the same decisions as codes.
    await expect(watchAll(srv.url, other.headers, jobId)).rejects.toSatisfy((e) => ConnectError.from(e).code === Code.PermissionDenied);
    await expect(watchAll(srv.url, { "x-provider-key": "svc-provider-nope" }, jobId)).rejects.toSatisfy(
      (e) => ConnectError.from(e).code === Code.Unauthenticated,
    );
  });

  it("a provider's watch ends with 403 once the job moves to another provider", async () => {
    const { renter, provider, jobId } = await assignedJob();
    const asProvider = await openSse(`${srv.url}/api/jobs/${jobId}/events`, provider.headers);
    const asRenter = await openSse(`${srv.url}/api/jobs/${jobId}/events`, renter.headers);
    await asProvider.until((es) => es.length >= 1);
    await asRenter.until((es) => es.length >= 1);
    // Paused, the provider cannot be given the job back: it stays queued (a re-queue may otherwise land
    // on the same provider, whose watch then rightly goes on).
    expect((await api.post("/api/providers/pause", { key: provider.key })).status).toBe(200);
    const rq = await api.post(`/api/admin/jobs/${jobId}/requeue`, {}, { "x-admin-token": ADMIN_TOKEN });
    expect(rq.status, rq.text).toBe(200);
    await asProvider.ended;
    expect(asProvider.events.at(-1)!.data).toMatchObject({ status: 403, error: expect.stringMatching(/moved to another provider/) });
    // The renter keeps watching: the job is queued again, with the reason.
    await asRenter.until((es) => es.some((e) => e.event === "status" && e.data.status.status === "queued"));
    expect(asRenter.events.find((e) => e.event === "status" && e.data.status.status === "queued")!.data.status.queue_reason).toBeTruthy();
    asRenter.cut();
  });

  it("a renter's watches end with 401 once its key is rotated; the new key watches again", async () => {
    const { renter, jobId } = await assignedJob();
    const sse = await openSse(`${srv.url}/api/jobs/${jobId}/events`, renter.headers);
    const grpc = grpcWatch(renter.headers, jobId);
    await sse.until((es) => es.length >= 1);
    await grpc.until((es) => es.length >= 1);
    const rotated = await api.post("/api/renters/rotate-key", {}, renter.headers);
    expect(rotated.status, rotated.text).toBe(200);
    await sse.ended;
    expect(sse.events.at(-1)!.data).toMatchObject({ status: 401, error: expect.stringMatching(/key this stream was opened with was revoked/) });
    const err = await grpc.done.then(() => undefined, (e) => e);
    expect(ConnectError.from(err).code).toBe(Code.Unauthenticated);
    // The old key opens nothing; the new one watches as before.
    expect((await openSse(`${srv.url}/api/jobs/${jobId}/events`, renter.headers)).status).toBe(401);
    const again = await openSse(`${srv.url}/api/jobs/${jobId}/events`, { "x-renter-key": rotated.body.api_key });
    await again.until((es) => es.length >= 1);
    expect(again.events[0].event).toBe("snapshot");
    again.cut();
  });

  it("event streams ended by revocation let go of their watch slots at once, on a job with nothing new to send", async () => {
    const { renter, provider, jobId } = await assignedJob();
    expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(jobId); // running, then quiet
    const url = `${srv.url}/api/jobs/${jobId}/events`;
    const open = await Promise.all(Array.from({ length: MAX_WATCHES_PER_ACCOUNT }, () => openSse(url, renter.headers)));
    await Promise.all(open.map((s) => s.until((es) => es.length >= 1)));
    const rotated = await api.post("/api/renters/rotate-key", {}, renter.headers);
    expect(rotated.status, rotated.text).toBe(200);
    await Promise.all(open.map((s) => s.ended));
    for (const s of open) expect(s.events.at(-1)!.data).toMatchObject({ status: 401 });
    // The new key holds as many watches as the old one did, and no more.
    const headers = { "x-renter-key": rotated.body.api_key as string };
    const again: Awaited<ReturnType<typeof openSse>>[] = [];
    try {
      await expect.poll(async () => {
        const s = await openSse(url, headers);
        if (s.status === 200) again.push(s);
        return s.status;
      }, { timeout: 2_000 }).toBe(200);
      again.push(...(await Promise.all(Array.from({ length: MAX_WATCHES_PER_ACCOUNT - 1 }, () => openSse(url, headers)))));
      expect(again.map((s) => s.status)).toEqual(Array(MAX_WATCHES_PER_ACCOUNT).fill(200));
      expect((await openSse(url, headers)).status).toBe(429);
    } finally {
      for (const s of again) s.cut();
    }
  });

  it("an account holds at most MAX_WATCHES_PER_ACCOUNT watches open at once: the next is 429 before it starts; closing one makes room", async () => {
    const { renter, provider, jobId } = await assignedJob();
    const url = `${srv.url}/api/jobs/${jobId}/events`;
    const open = await Promise.all(Array.from({ length: MAX_WATCHES_PER_ACCOUNT }, () => openSse(url, renter.headers)));
    await Promise.all(open.map((s) => s.until((es) => es.length >= 1)));
    const refused = await openSse(url, renter.headers);
    expect(refused.status).toBe(429);
    expect(refused.errorBody.error).toMatch(/at most 32 job watches may be open at once/);
    const grpc = grpcWatch(renter.headers, jobId);
    await expect(grpc.done).rejects.toMatchObject({ code: Code.ResourceExhausted });
    // The job's provider and another renter are not held back by this renter's watches.
    expect((await openSse(url, provider.headers)).status).toBe(200);
    open[0].cut();
    await expect.poll(async () => {
      const again = await openSse(url, renter.headers);
      again.cut();
      return again.status;
    }, { timeout: 5_000 }).toBe(200);
    for (const s of open) s.cut();
  });

  it("a job's lines are read and sent in pages bounded in characters too: a watcher of a long log gets every line", async () => {
    const { renter, provider, jobId } = await assignedJob();
    await api.get(`/api/providers/${provider.key}/jobs`);
    // 250 lines of 16,000 characters: 4 M characters (under what an attempt keeps), four pages.
    const line = (i: number) => `${String(i).padStart(4, "0")} ${"y".repeat(15_995)}`;
    for (let from = 0; from < 250; from += 50) expect((await logs(srv.url, provider, jobId, Array.from({ length: 50 }, (_, i) => line(from + i)))).status).toBe(200);
    const [{ id }] = await srv.sql`SELECT id FROM jobs WHERE job_id = ${jobId}`;
    const page = (await readJobChanges(srv.sql, Number(id), 0))!.logs;
    expect(page.length).toBe(Math.ceil(WATCH_LOG_PAGE_CHARS / 16_000));
    expect(isFullPage(page)).toBe(true);
    const sse = await openSse(`${srv.url}/api/jobs/${jobId}/events`, renter.headers);
    await sse.until((es) => es.filter((e) => e.event === "log").length === 250);
    expect(logMessages(sse.events).map((m: string) => m.slice(0, 4))).toEqual(Array.from({ length: 250 }, (_, i) => String(i).padStart(4, "0")));
    sse.cut();
  });

  it("a watcher whose reader stops taking is cut off once MAX_QUEUED_LOG_CHARS of lines wait, naming the cursor to resume from", () => {
    const w = new Watcher(0, { role: "renter", renterId: 1 });
    const line = (i: number) => ({ cursor: String(i), event: { case: "log" as const, value: { seq: BigInt(i), attempt: 1, level: "info", message: "z".repeat(16_000) } } });
    let n = 1;
    // A reader that keeps up: each line taken as it comes, however many.
    for (; n <= 1_000; n++) {
      w.push(line(n));
      expect(w.take()).toBeDefined();
    }
    // One that stops: lines wait until their characters pass the bound.
    while (!w.done) w.push(line(n++));
    expect(n - 1_001).toBe(Math.floor(MAX_QUEUED_LOG_CHARS / 16_000) + 1);
    expect(w.error?.code).toBe(Code.ResourceExhausted);
    expect(w.error?.message).toMatch(/watch again from cursor 1000/);
  });

  it("many watchers of one job in a process cost one read per change, not one per watcher", async () => {
    const { renter, provider, jobId } = await assignedJob();
    await api.get(`/api/providers/${provider.key}/jobs`);
    const hub = jobWatchHub(srv.app.sql, srv.app.deps.log);
    // The renter's own (at most MAX_WATCHES_PER_ACCOUNT) and admins' (not counted per account).
    const WATCHERS = 40;
    const headers = (i: number) => (i < MAX_WATCHES_PER_ACCOUNT ? renter.headers : { "x-admin-token": ADMIN_TOKEN });
    const streams = await Promise.all(Array.from({ length: WATCHERS }, (_, i) => openSse(`${srv.url}/api/jobs/${jobId}/events`, headers(i))));
    await Promise.all(streams.map((s) => s.until((es) => es.length >= 1)));
    expect(hub.watchers).toBeGreaterThanOrEqual(WATCHERS);
    const before = hub.reads;
    await progress(srv.url, provider, jobId, 42, "one change");
    await Promise.all(streams.map((s) => s.until((es) => es.some((e) => e.event === "progress" && e.data.progress.progress_pct === 42))));
    const reads = hub.reads - before;
    expect(reads).toBeGreaterThanOrEqual(1);
    expect(reads).toBeLessThanOrEqual(2);
    await result(srv.url, provider, jobId, { success: true, result: { response: "ok" } });
    await Promise.all(streams.map((s) => s.ended));
    for (const s of streams) expect(kinds(s.events).at(-1)).toBe("outcome");
  });
});

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(p));
    });
  });
}

describe("a second server process", () => {
  let child: ChildProcess | undefined;
  afterAll(async () => {
    if (child && child.exitCode === null) {
      const exited = new Promise((r) => child!.once("exit", r));
      child.kill("SIGTERM");
      await exited;
    }
  });

  it("changes written through another process reach a watcher of this one", async () => {
    const port = await freePort();
    const env = {
      ...process.env,
      DATABASE_URL: srv.databaseUrl,
      PORT: String(port),
      HOST: "127.0.0.1",
      SVC_ADMIN_TOKEN: ADMIN_TOKEN,
      SVC_HMAC_SECRET: HMAC_SECRET,
      SVC_RATE_LIMITS: "off",
      SVC_JOB_SWEEP_MS: "60000",
      LOG_LEVEL: "silent",
    } as NodeJS.ProcessEnv;
    delete env.VITEST;
    child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], { env, stdio: "ignore" });
    const other = `http://127.0.0.1:${port}`;
    let ready = false;
    while (!ready && child.exitCode === null) {
      await new Promise((r) => setTimeout(r, 200));
      ready = await fetch(`${other}/readyz`).then((r) => r.status === 200, () => false);
    }
    expect(ready).toBe(true);

    const { renter, provider, jobId } = await assignedJob();
    const sse = await openSse(`${srv.url}/api/jobs/${jobId}/events`, renter.headers);
    await sse.until((es) => es.length >= 1);
    expect((await client(other).get(`/api/providers/${provider.key}/jobs`)).body.job.job_id).toBe(jobId);
    await sse.until((es) => es.some((e) => e.event === "status" && e.data.status.status === "running"));
    expect((await logs(other, provider, jobId, ["from the other process"])).status).toBe(200);
    await sse.until((es) => logMessages(es).length === 1);
    expect((await result(other, provider, jobId, { success: true, result: { data: Buffer.from("img").toString("base64"), format: "png" } })).status).toBe(200);
    await sse.ended;
    expect(logMessages(sse.events)).toEqual(["from the other process"]);
    expect(sse.events.at(-1)!.data.outcome).toMatchObject({ status: "completed", output_format: "png" });
  });
});
