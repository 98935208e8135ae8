// A submit whose params reach the maxima that GET /api/job-types (and each template's params_schema)
// advertises is taken over real HTTP, whichever way its client writes JSON: a 100,000-character
// Arabic prompt as Python's json.dumps sends it (every character a \uXXXX escape, 6 bytes) and a
// custom_container command and environment at their longest.
import { beforeEach, describe, expect, it } from "vitest";
import { PARAMS_SCHEMAS } from "../../src/domain/jobs/job-schemas.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { clearMarketplace } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const api = client(srv);
beforeEach(() => clearMarketplace(srv));

type Props = Record<string, { maxLength?: number; maxItems?: number; maxProperties?: number; items?: { maxLength?: number }; additionalProperties?: { maxLength?: number } }>;
const props = (t: keyof typeof PARAMS_SCHEMAS) => PARAMS_SCHEMAS[t].properties as Props;

/** JSON text with every non-ASCII character escaped, as Python's json.dumps (ensure_ascii) writes it. */
const asciiJson = (v: unknown) => JSON.stringify(v).replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);

describe("submit bodies at the advertised params maxima", () => {
  it("the schemas advertise what these bodies send", async () => {
    const types = await api.get("/api/job-types");
    expect(types.status).toBe(200);
    expect(JSON.stringify(types.body)).toContain(`"maxLength":${props("llm-inference").prompt.maxLength}`);
    expect(props("llm-inference").prompt.maxLength).toBe(100_000);
    expect(props("llm-inference").system.maxLength).toBe(20_000);
  });

  it("an llm-inference job with the longest prompt and system prompt, in Arabic, \\u-escaped", async () => {
    const renter = await makeRenter(srv, 100_000);
    await makeProvider(srv);
    const p = props("llm-inference");
    const params = { prompt: "م".repeat(p.prompt.maxLength!), system: "ع".repeat(p.system.maxLength!), max_tokens: 64 };
    const body = asciiJson({ job_type: "llm-inference", duration_minutes: 2, params });
    expect(body.length).toBeGreaterThan(700_000);
    const res = await api.post("/api/jobs/submit", body, renter.headers);
    expect(res.status, res.text.slice(0, 200)).toBe(201);
    const [row] = await srv.sql<{ params: { prompt: string; system: string } }[]>`SELECT params FROM jobs WHERE job_id = ${res.body.job.job_id}`;
    expect(row.params.prompt).toBe(params.prompt);
    expect(row.params.system).toBe(params.system);
  });

  it("a custom_container job with the longest command and environment", async () => {
    const renter = await makeRenter(srv, 100_000);
    const provider = await makeProvider(srv);
    const p = props("custom_container");
    const command = Array.from({ length: p.command.maxItems! }, (_, i) => String(i % 10).repeat(p.command.items!.maxLength!));
    const env = Object.fromEntries(Array.from({ length: p.env.maxProperties! }, (_, i) => [`VAR_${i}`, "v".repeat(p.env.additionalProperties!.maxLength!)]));
    const res = await api.post("/api/jobs/submit", { job_type: "custom_container", duration_minutes: 2, params: { command, env } }, renter.headers);
    expect(res.status, res.text.slice(0, 200)).toBe(201);
    // The daemon is handed the whole command and environment.
    const poll = await api.get(`/api/providers/${provider.key}/jobs`);
    expect(poll.body.job.job_id).toBe(res.body.job.job_id);
    expect(poll.body.job.task_spec.command).toEqual(command);
    expect(poll.body.job.task_spec.env).toEqual(env);
  });
});
