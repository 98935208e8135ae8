// Brings up a vLLM endpoint: a renter submits a vllm_serve job for the model
// (public, as the platform's managed endpoints are, from the managed-endpoint
// account the test server names; or private, from a renter of its own),
// it is assigned to a fresh approved and live provider, and that provider's
// daemon reports the endpoint through POST /api/jobs/{job_id}/endpoint-ready
// (which also marks the job running).
import { afterAll, beforeAll } from "vitest";
import { credit } from "../../src/domain/money/ledger.js";
import { startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { MANAGED_RENTER_EMAIL, type TestServer } from "../helpers/server.js";

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
  const isPublic = opts.public ?? true;
  const owner = opts.owner ?? (isPublic ? await managedOwner(srv) : await makeRenter(srv, 100_000));
  const submit = await api.post(
    "/api/jobs/submit",
    { job_type: "vllm_serve", params: { model, public: isPublic }, provider_id: provider.id, duration_minutes: 60, max_duration_seconds: 3600 },
    owner.headers,
  );
  if (submit.status !== 201) throw new Error(`vllm_serve submit failed: ${submit.status} ${submit.text}`);
  const jobId: string = submit.body.job.job_id;
  // The daemon polls the job (it runs from then on), then reports where its engine listens.
  const polled = await api.get(`/api/providers/${provider.key}/jobs`);
  if (polled.body?.job?.job_id !== jobId) throw new Error(`the provider's poll did not hand out ${jobId}: ${polled.text}`);
  const ready = await api.post(`/api/jobs/${jobId}/endpoint-ready`, { api_key: provider.key, endpoint_url: endpointUrl, model });
  if (ready.status !== 200) throw new Error(`endpoint-ready failed: ${ready.status} ${ready.text}`);
  return { provider, owner, jobId };
}

const managedOwners = new WeakMap<TestServer, Promise<Serving["owner"]>>();

/** The server's managed-endpoint account (MANAGED_RENTER_EMAIL), registered, its address proven and funded once per server. */
function managedOwner(srv: TestServer): Promise<Serving["owner"]> {
  let owner = managedOwners.get(srv);
  if (!owner) {
    owner = (async () => {
      const r = await client(srv.url).post("/api/renters/register", { name: "Managed endpoints", email: MANAGED_RENTER_EMAIL });
      if (r.status !== 201) throw new Error(`managed renter register failed: ${r.status} ${r.text}`);
      const id: number = r.body.renter_id;
      // The account proves it owns the address (one step here: no email delivery is configured); the
      // first proof of a managed address revokes the registration's key, so the sign-in's is used.
      const proof = await client(srv.url).post("/api/renters/login-email", { email: MANAGED_RENTER_EMAIL });
      if (proof.status !== 200) throw new Error(`managed renter login failed: ${proof.status} ${proof.text}`);
      await srv.sql.begin((tx) => credit(tx, id, 100_000_000, `test-fund:${id}:managed`));
      const key = proof.body.api_key as string;
      return { id, key, headers: { "x-renter-key": key } };
    })();
    managedOwners.set(srv, owner);
  }
  return owner;
}

/**
 * For a test file: a fake vLLM engine (fake-vllm.ts, its default behaviour) serving `model` publicly,
 * started before the file's tests and closed after them. `fake` is the engine once started.
 */
export function useServedEngine(srv: TestServer, model: string): { readonly fake: FakeVllm } {
  let fake: FakeVllm | undefined;
  beforeAll(async () => {
    fake = await startFakeVllm("engine");
    await serveModel(srv, model, fake.url);
  });
  afterAll(async () => {
    await fake?.close();
  });
  return {
    get fake() {
      if (!fake) throw new Error("the served engine is started before the tests");
      return fake;
    },
  };
}

