// A provider reads a job only while it is the job's current provider; after
// the job moved on (re-queued to another provider) it reads only its own
// attempts: never the next provider's endpoint, logs or the job's output.
import { beforeEach, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { admin, clearMarketplace } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

const asProvider = (key: string) => ({ "x-provider-key": key });

describe("a provider's reads of a job that moved on", () => {
  it("keeps the first provider to its own attempt: no endpoint, logs or output of the second", async () => {
    const renter = await makeRenter(srv, 100_000);
    const first = await makeProvider(srv);
    const submit = await api.post("/api/jobs/submit", { job_type: "vllm_serve", params: { model: "Qwen/Qwen2.5-7B-Instruct" }, duration_minutes: 5 }, renter.headers);
    expect(submit.status).toBe(201);
    const job = submit.body.job.job_id as string;
    // The first provider picks it up, reports an endpoint and a log line, then is taken out.
    expect((await api.get(`/api/providers/${first.key}/jobs`)).body.job.job_id).toBe(job);
    expect((await api.post(`/api/jobs/${job}/endpoint-ready`, { api_key: first.key, endpoint_url: "http://10.1.1.1:8000/v1" })).status).toBe(200);
    expect((await api.post(`/api/jobs/${job}/logs`, { api_key: first.key, logs: ["first provider line"] })).status).toBe(200);
    await srv.sql`UPDATE providers SET is_paused = true WHERE id = ${first.id}`;
    const second = await makeProvider(srv);
    const moved = await api.post(`/api/admin/jobs/${job}/requeue`, { reason: "moved" }, admin(srv));
    expect(moved.body).toMatchObject({ provider_id: second.id, attempt: 2 });
    expect((await api.get(`/api/providers/${second.key}/jobs`)).body.job.job_id).toBe(job);
    expect((await api.post(`/api/jobs/${job}/endpoint-ready`, { api_key: second.key, endpoint_url: "http://10.2.2.2:8000/v1" })).status).toBe(200);
    expect((await api.post(`/api/jobs/${job}/logs`, { api_key: second.key, logs: ["second provider line"] })).status).toBe(200);

    // The first provider: the job itself is no longer its to read.
    const read = await api.get(`/api/jobs/${job}`, asProvider(first.key));
    expect(read.status).toBe(403);
    expect(read.body.error).toMatch(/moved to another provider/);
    expect(read.text).not.toContain("10.2.2.2");
    expect((await api.get(`/api/jobs/${job}/output`, asProvider(first.key))).status).toBe(403);
    expect((await api.get(`/api/jobs/${job}/output/json`, asProvider(first.key))).status).toBe(403);
    // Its own attempt's logs, by default and by number; not the second provider's.
    const ownLogs = await api.get(`/api/jobs/${job}/logs`, asProvider(first.key));
    expect(ownLogs.status).toBe(200);
    expect(ownLogs.body.attempt).toBe(1);
    expect(ownLogs.body.logs.map((l: { message: string }) => l.message)).toEqual(["first provider line"]);
    const otherLogs = await api.get(`/api/jobs/${job}/logs?attempt=2`, asProvider(first.key));
    expect(otherLogs.status).toBe(403);
    expect(otherLogs.text).not.toContain("second provider line");
    // Its own attempt in the history, not the second's.
    const hist = await api.get(`/api/jobs/${job}/history`, asProvider(first.key));
    expect(hist.status).toBe(200);
    expect(hist.body.attempts.map((a: { attempt: number; provider_id: number }) => [a.attempt, a.provider_id])).toEqual([[1, first.id]]);
    // Its job list no longer shows the job.
    const list = await api.get(`/api/jobs`, asProvider(first.key));
    expect(list.status).toBe(200);
    expect(list.body.jobs.map((j: { job_id: string }) => j.job_id)).not.toContain(job);
    // A provider's reports on a job it no longer runs are refused.
    expect((await api.post(`/api/jobs/${job}/logs`, { api_key: first.key, logs: ["late"] })).status).toBe(403);

    // The second (current) provider reads the job and its own attempt, not the first's logs.
    const current = await api.get(`/api/jobs/${job}`, asProvider(second.key));
    expect(current.status).toBe(200);
    expect(current.body.endpoint_url).toBe("http://10.2.2.2:8000/v1");
    expect((await api.get(`/api/jobs/${job}/logs?attempt=1`, asProvider(second.key))).status).toBe(403);
    const secondHist = await api.get(`/api/jobs/${job}/history`, asProvider(second.key));
    expect(secondHist.body.attempts.map((a: { attempt: number }) => a.attempt)).toEqual([2]);

    // The renter and an admin read everything.
    expect((await api.get(`/api/jobs/${job}/history`, renter.headers)).body.attempts).toHaveLength(2);
    expect((await api.get(`/api/jobs/${job}/logs?attempt=1`, admin(srv))).body.logs[0].message).toBe("first provider line");
  });

  it("refuses a provider that never held the job", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv);
    const job = (await api.post("/api/jobs/submit", { job_type: "benchmark" }, renter.headers)).body.job.job_id as string;
    const stranger = await makeProvider(srv, { online: false });
    for (const path of [``, `/logs`, `/history`, `/output`]) {
      const r = await api.get(`/api/jobs/${job}${path}`, asProvider(stranger.key));
      expect(r.status, path).toBe(403);
      expect(r.body.error).toMatch(/belongs to another caller/);
    }
  });
});
