// The provider's own dashboard (GET /api/providers/me) over real HTTP: its active_job.
import { expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { pickUp } from "../jobs/helpers.js";

const srv = useTestServer({ SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);

it("active_job is the provider's running job however many jobs it finished since on its other GPU", async () => {
  const renter = await makeRenter(srv, 1_000_000);
  const p = await makeProvider(srv);
  await srv.sql`UPDATE providers SET gpu_count = 2 WHERE id = ${p.id}`;
  const submit = (jobType: string, params?: object) => api.post("/api/jobs/submit", { job_type: jobType, duration_minutes: 30, params }, renter.headers);

  const long = (await submit("training")).body.job;
  expect(long).toMatchObject({ status: "pending", provider_id: p.id });
  expect((await pickUp(api, p.key))?.job_id).toBe(long.job_id);
  for (let i = 0; i < 12; i++) {
    const short = (await submit("llm-inference", { prompt: "hi" })).body.job;
    expect(short).toMatchObject({ status: "pending", provider_id: p.id });
    expect((await pickUp(api, p.key))?.job_id).toBe(short.job_id);
    const done = await api.post("/api/providers/job-result", { api_key: p.key, job_id: short.job_id, success: true, result: { response: "ok" } });
    expect(done.body.status).toBe("completed");
  }

  const me = await api.get(`/api/providers/me?key=${p.key}`);
  expect(me.status).toBe(200);
  expect(me.body.recent_jobs).toHaveLength(10);
  expect(me.body.provider.active_job).toMatchObject({ job_id: long.job_id, status: "running" });
});
