// A serving job whose endpoint the probe found dead bills nothing however it ends (job-end.ts
// deadAtEnd): its running_cost_halala, what an end would charge now, is 0 too.
import { beforeEach, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { clearMarketplace } from "../jobs/helpers.js";

const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0", SVC_ENDPOINT_PROBE_SECONDS: "0" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

it("running_cost_halala of a serving job whose endpoint failed every probe past the grace is what an end charges: 0", async () => {
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv, { vramMib: 81920, gpuModel: "NVIDIA H100 80GB HBM3" });
  const submit = await api.post(
    "/api/jobs/submit",
    { job_type: "vllm_serve", params: { model: MODEL }, duration_minutes: 60, max_duration_seconds: 3600, provider_id: provider.id },
    renter.headers,
  );
  expect(submit.status, submit.text).toBe(201);
  const jobId: string = submit.body.job.job_id;
  expect((await api.get(`/api/providers/${provider.key}/jobs`)).body.job?.job_id).toBe(jobId);
  const r = await api.post(`/api/jobs/${jobId}/endpoint-ready`, { api_key: provider.key, endpoint_url: "http://127.0.0.1:9/v1", model: MODEL, endpoint_api_key: "k" });
  expect(r.status, r.text).toBe(200);
  // Five minutes running; the probe's record: failing for 290 s (grace 180 s), last failure 5 s ago.
  await srv.sql`
    UPDATE jobs SET started_at = now() - interval '300 seconds', acked_at = coalesce(acked_at, now() - interval '300 seconds'),
           endpoint_failing_since = now() - interval '290 seconds', endpoint_failed_at = now() - interval '5 seconds'
    WHERE job_id = ${jobId}`;
  const view = (await api.get(`/api/jobs/${jobId}`, renter.headers)).body;
  expect(view.status).toBe("running");
  const shown = view.running_cost_halala;
  // What the renter's cancel now actually charges.
  const cancel = await api.post(`/api/jobs/${jobId}/cancel`, {}, renter.headers);
  expect(cancel.status, cancel.text).toBe(200);
  const [ended] = await srv.sql`SELECT actual_cost_halala FROM jobs WHERE job_id = ${jobId}`;
  expect(Number(ended.actual_cost_halala)).toBe(0);
  expect(shown, "running_cost_halala promised a charge no end makes").toBe(0);
});
