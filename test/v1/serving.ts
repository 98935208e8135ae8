// Brings up a vLLM endpoint: a renter submits a vllm_serve job for the model
// (public, as the platform's managed endpoints are, unless asked otherwise),
// it is assigned to a fresh approved and live provider, and that provider's
// daemon reports the endpoint through POST /api/jobs/{job_id}/endpoint-ready
// (which also marks the job running).
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import type { TestServer } from "../helpers/server.js";

export interface Serving {
  provider: { id: number; key: string };
  /** The renter who runs the serving job. */
  owner: { id: number; key: string; headers: Record<string, string> };
  /** The job's public id (job_id). */
  jobId: string;
}

export async function serveModel(
  srv: TestServer,
  model: string,
  endpointUrl: string,
  opts: { public?: boolean; owner?: Serving["owner"] } = {},
): Promise<Serving> {
  const api = client(srv.url);
  const provider = await makeProvider(srv, { vramMib: 81920, gpuModel: "NVIDIA H100 80GB HBM3" });
  const owner = opts.owner ?? (await makeRenter(srv, 100_000));
  const submit = await api.post(
    "/api/jobs/submit",
    { job_type: "vllm_serve", params: { model, public: opts.public ?? true }, provider_id: provider.id, duration_minutes: 60, max_duration_seconds: 3600 },
    owner.headers,
  );
  if (submit.status !== 201) throw new Error(`vllm_serve submit failed: ${submit.status} ${submit.text}`);
  const jobId: string = submit.body.job.job_id;
  const ready = await api.post(`/api/jobs/${jobId}/endpoint-ready`, { api_key: provider.key, endpoint_url: endpointUrl, model });
  if (ready.status !== 200) throw new Error(`endpoint-ready failed: ${ready.status} ${ready.text}`);
  return { provider, owner, jobId };
}
