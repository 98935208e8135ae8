// A job of a fresh renter run by hand over the legacy protocol, for the commands that read one
// (`svc jobs logs`, `jobs output`, `jobs watch`).
import { expect } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import type { TestServer } from "../helpers/server.js";

/**
 * An llm-inference job of a fresh renter, picked up (attempt 1) by its provider's legacy daemon;
 * `env` is what svc needs to read it as that renter.
 */
export async function runningJob(srv: TestServer) {
  const api = client(srv);
  const renter = await makeRenter(srv, 100_000);
  const provider = await makeProvider(srv);
  const sub = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 2, provider_id: provider.id, params: { prompt: "Hello" } }, renter.headers);
  expect(sub.status, sub.text).toBe(201);
  const jobId: string = sub.body.job.job_id;
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job?.job_id).toBe(jobId);
  return { env: { SVC_URL: srv.url, SVC_KEY: renter.key }, jobId, provider };
}

/** Its provider reports the job of `runningJob` done: its result is "Hi!". */
export const finishJob = (srv: TestServer, providerKey: string, jobId: string) =>
  client(srv).post("/api/providers/job-result", { api_key: providerKey, job_id: jobId, success: true, result: { response: "Hi!" } });

/** A completed job (runningJob, then finishJob). */
export async function completedJob(srv: TestServer) {
  const { env, jobId, provider } = await runningJob(srv);
  const res = await finishJob(srv, provider.key, jobId);
  expect(res.status, res.text).toBe(200);
  return { env, jobId };
}
