// The managed-endpoint accounts are named by email (SVC_V1_MANAGED_RENTERS),
// and registration takes any address: the right to run public vllm_serve jobs
// (serving every renter's /v1 requests) goes to the account that proved it owns
// the address by signing in with the code sent there, not to whoever
// registered it first.
import { describe, expect, it } from "vitest";
import { credit } from "../../src/domain/money/ledger.js";
import { makeProvider } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";

const OPS = "ops-endpoints@platform.test";
/** Named managed by the second server only: as if the operator added it after the account proved it. */
const LATE = "late-endpoints@platform.test";
const srv = useTestServer({ SVC_V1_MANAGED_RENTERS: OPS });
const late = useTestServer({ SVC_V1_MANAGED_RENTERS: `${OPS},${LATE}` });
const api = client(srv);
const lateApi = client(late);

describe("a managed-endpoint account", () => {
  it("serves every renter only once it proved its address: registering the address is not enough", async () => {
    // Registered with the configured address, in another case, by someone who never received mail there.
    const reg = await api.post("/api/renters/register", { name: "Not the platform", email: OPS.toUpperCase() });
    expect(reg.status, reg.text).toBe(201);
    const id: number = reg.body.renter_id;
    await srv.sql.begin((tx) => credit(tx, id, 100_000, `test-fund:${id}`));
    const own = await makeProvider(srv, { vramMib: 81920, gpuModel: "NVIDIA H100 80GB HBM3" });
    const submit = () =>
      api.post(
        "/api/jobs/submit",
        { job_type: "vllm_serve", params: { model: "meta-llama/Llama-3.1-8B-Instruct", public: true }, provider_id: own.id, duration_minutes: 10 },
        { "x-renter-key": reg.body.api_key },
      );
    const refused = await submit();
    expect(refused.status, refused.text).toBe(403);
    expect(refused.body.error).toMatch(/has not proven it owns the address; sign in once with POST \/api\/renters\/login-email/);
    expect(await srv.sql`SELECT 1 FROM jobs WHERE renter_id = ${id}`).toHaveLength(0);
    expect((await api.get("/api/renters/balance", { "x-renter-key": reg.body.api_key })).body.held_halala).toBe(0);

    // Whoever registered it may have set a webhook (every job event of the account would go there).
    const hook = await api.patch("/api/renters/me", { webhook_url: "https://hooks.example.com/squat" }, { "x-renter-key": reg.body.api_key });
    expect(hook.status, hook.text).toBe(200);

    // A sign-in that reached the address (one step here: no email delivery is configured) proves it.
    const login = await api.post("/api/renters/login-email", { email: OPS });
    expect(login.status, login.text).toBe(200);
    expect((await srv.sql<{ proven: boolean }[]>`SELECT email_proven_at IS NOT NULL AS proven FROM renters WHERE id = ${id}`)[0].proven).toBe(true);
    // The keys issued before the proof, and their webhook, do not carry the right over: revoked, dropped.
    expect((await submit()).status).toBe(401);
    expect((await srv.sql`SELECT webhook_url, webhook_secret FROM renters WHERE id = ${id}`)[0]).toEqual({ webhook_url: null, webhook_secret: null });
    const proven = { "x-renter-key": login.body.api_key as string };
    const accepted = await api.post(
      "/api/jobs/submit",
      { job_type: "vllm_serve", params: { model: "meta-llama/Llama-3.1-8B-Instruct", public: true }, provider_id: own.id, duration_minutes: 10 },
      proven,
    );
    expect(accepted.status, accepted.text).toBe(201);
    // Later sign-ins are ordinary: one more key, the proven one still works.
    const again = await api.post("/api/renters/login-email", { email: OPS });
    expect(again.status, again.text).toBe(200);
    expect((await api.get("/api/renters/balance", proven)).status).toBe(200);
  });

  it("an ordinary account's first sign-in keeps its earlier keys", async () => {
    const reg = await api.post("/api/renters/register", { name: "Renter", email: "someone@renter.test" });
    const login = await api.post("/api/renters/login-email", { email: "someone@renter.test" });
    expect(login.status, login.text).toBe(200);
    expect((await api.get("/api/renters/balance", { "x-renter-key": reg.body.api_key })).status).toBe(200);
  });

  it("an address proven before the operator named it serves only once the keys from before the proof are rotated away", async () => {
    // Registered (perhaps by someone else) and proven while the address was not yet managed: no revocation then.
    const reg = await lateApi.post("/api/renters/register", { name: "Early", email: LATE });
    const id: number = reg.body.renter_id;
    await late.sql`UPDATE renters SET email_proven_at = now() WHERE id = ${id}`;
    await late.sql.begin((tx) => credit(tx, id, 100_000, `test-fund:${id}`));
    const own = await makeProvider(late, { vramMib: 81920, gpuModel: "NVIDIA H100 80GB HBM3" });
    const submit = (key: string) =>
      lateApi.post(
        "/api/jobs/submit",
        { job_type: "vllm_serve", params: { model: "meta-llama/Llama-3.1-8B-Instruct", public: true }, provider_id: own.id, duration_minutes: 10 },
        { "x-renter-key": key },
      );
    const refused = await submit(reg.body.api_key);
    expect(refused.status, refused.text).toBe(403);
    expect(refused.body.error).toMatch(/keys issued before this account proved its address are still live.*rotate-key/);
    const rotated = await lateApi.post("/api/renters/rotate-key", {}, { "x-renter-key": reg.body.api_key });
    expect(rotated.status, rotated.text).toBe(200);
    const accepted = await submit(rotated.body.api_key);
    expect(accepted.status, accepted.text).toBe(201);
  });
});
