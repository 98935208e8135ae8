// Settlement grows a hold short of the run's minutes first (settlement.ts coverRun), so a running
// job's running_cost_halala is what an end would charge now: its minutes at its rate, not capped
// at a hold the end would grow.
import { beforeEach, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { clearMarketplace, pickUp } from "../jobs/helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

it("running_cost_halala of a run past its sub-minute hold is what the cancel then charges", async () => {
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv);
  const r = await api.post("/api/jobs/submit", { job_type: "llm-inference", duration_minutes: 0.01 }, renter.headers);
  expect(r.status, r.text).toBe(201);
  const jobId = r.body.job.job_id as string;
  expect((await pickUp(api, provider.key))?.job_id).toBe(jobId);
  await srv.sql`UPDATE jobs SET started_at = now() - interval '40 seconds', acked_at = coalesce(acked_at, now()) WHERE job_id = ${jobId}`;
  const shown = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body.running_cost_halala;
  const cancel = await api.post(`/api/jobs/${jobId}/cancel`, {}, renter.headers);
  expect(cancel.status, cancel.text).toBe(200);
  const charged = Number(cancel.body.charged_halala);
  expect(charged).toBeGreaterThan(1); // a full minute at the job's rate, beyond the 1-halala hold
  expect(shown, `running_cost_halala ${shown}, cancel charged ${charged}`).toBe(charged);
});
