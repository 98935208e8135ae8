// What the OpenAPI document says of requests holds on a real server: the members
// and query parameters it marks required are the ones refused when missing (a
// rule of one member among several is in the operation's description), the
// whole-body daemon routes list their members, every documented way of sending
// a key works (header, query `key`, the path of the path-key routes, `api_key`
// in a provider route's body), the values the server limits a parameter to are
// its enum, parameters nothing reads are not offered, and the interface version
// is the spec's.
import fs from "node:fs";
import { beforeAll, describe, expect, it } from "vitest";
import { Role } from "../../gen/svc/v1/options_pb.js";
import { fieldOptionsOf } from "../../src/http/json.js";
import { buildRouteTable, type RestRoute } from "../../src/http/rest.js";
import { buildServices } from "../../src/services/index.js";
import { rolesOf } from "../../src/services/secure.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";
import { fixtures, MATRIX, routeKey, routeOwnerCred, send, WEBHOOK_SECRET, type Fx } from "../hardening/routes.js";

const srv = useTestServer({ PAYMENT_GATEWAY_WEBHOOK_SECRET: WEBHOOK_SECRET });
const api = client(srv);
const admin = { "x-admin-token": ADMIN_TOKEN };
let doc: any;
let routes: RestRoute[];
beforeAll(async () => {
  doc = (await api.get("/api/openapi.json")).body;
  routes = buildRouteTable(buildServices(srv.app.deps));
});

const op = (method: string, path: string) => doc.paths[path][method.toLowerCase()];
const bodySchema = (o: any) => o.requestBody?.content["application/json"]?.schema;
const isBodyRoute = (r: RestRoute) => r.httpMethod !== "GET" && r.httpMethod !== "DELETE";

/** The request members and query parameters the operation marks required (path parameters aside). */
function requiredOf(o: any): string[] {
  const params = (o.parameters ?? []).filter((p: any) => p.in !== "path" && p.required).map((p: any) => p.name);
  const body = o.requestBody?.required ? (bodySchema(o)?.required ?? []) : [];
  return [...params, ...body];
}

/** Sends a route a request carrying nothing but the caller's credential. */
async function sendBare(r: RestRoute, fx: Fx) {
  const entry = MATRIX[routeKey(r)];
  const cred = routeOwnerCred(r, fx, ADMIN_TOKEN);
  return send(srv, r, entry, fx, cred, { body: {} });
}

describe("required request members", () => {
  it("what the server refuses as missing is required in the document, or named in the operation's description", async () => {
    let shared: Fx | undefined;
    const wrong: string[] = [];
    const refusedAsMissing: string[] = [];
    for (const r of routes) {
      const entry = MATRIX[routeKey(r)];
      if (entry.stream || entry.owner === "signature") continue;
      const fx = entry.fresh ? await fixtures(srv) : (shared ??= await fixtures(srv));
      const reply = await sendBare(r, fx);
      const error = String(reply.body?.error ?? "");
      const missing = /missing required fields: (.+)$/i.exec(error)?.[1] ?? /exactly one of (.+)$/.exec(error)?.[1];
      if (reply.status !== 400 || !missing) continue;
      refusedAsMissing.push(routeKey(r));
      const o = op(r.httpMethod, r.template);
      const names = missing.match(/\w+/g)!.filter((w) => w !== "or");
      const choice = / or /.test(missing) || /\(or /.test(missing);
      for (const name of names) {
        if (r.params.includes(name)) continue;
        const declared = choice ? String(o.description ?? "").includes(name) : requiredOf(o).includes(name) || String(o.description ?? "").includes(name);
        if (!declared) wrong.push(`${routeKey(r)}: the server answers 400 "${error}"; the document does not require ${name}`);
      }
    }
    expect(wrong).toEqual([]);
    // The ones the interface names, among others.
    expect(refusedAsMissing).toEqual(
      expect.arrayContaining([
        "POST /api/providers/register", "POST /api/renters/register", "POST /api/providers/login-email", "POST /api/renters/login-email",
        "POST /api/jobs/submit", "POST /api/providers/daemon-event", "POST /api/providers/job-result", "GET /api/providers/installer",
        "POST /api/payments/topup", "POST /api/registry/requests", "POST /api/admin/providers/{id}/reject",
        "POST /api/jobs/{job_id}/progress", "POST /api/jobs/{job_id}/endpoint-ready", "POST /api/renters/topup",
      ]),
    );
  }, 120_000);

  it("a request without a member the document requires is refused (400)", async () => {
    let shared: Fx | undefined;
    const wrong: string[] = [];
    let checked = 0;
    for (const r of routes) {
      const o = op(r.httpMethod, r.template);
      const required = requiredOf(o);
      if (required.length === 0) continue;
      const entry = MATRIX[routeKey(r)];
      const fx = entry.fresh ? await fixtures(srv) : (shared ??= await fixtures(srv));
      const reply = await sendBare(r, fx);
      checked++;
      if (reply.status !== 400) wrong.push(`${routeKey(r)} requires ${required.join(", ")}; without them: ${reply.status} ${reply.text.slice(0, 200)}`);
      // A required member has no null "not given" form.
      const s = bodySchema(o);
      for (const name of required) {
        const member = s?.properties?.[name];
        if (member?.anyOf?.some((x: any) => x.type === "null")) wrong.push(`${routeKey(r)}: required ${name} may be null`);
      }
    }
    expect(wrong).toEqual([]);
    expect(checked).toBeGreaterThanOrEqual(10);
  }, 120_000);

  it("names the members the interface requires, with a required request body", () => {
    const cases: [string, string, string[]][] = [
      ["POST", "/api/providers/register", ["name", "email", "gpu_model", "os"]],
      ["POST", "/api/renters/register", ["name", "email"]],
      ["POST", "/api/providers/login-email", ["email"]],
      ["POST", "/api/renters/login-email", ["email"]],
      ["POST", "/api/providers/daemon-event", ["event_type"]],
      ["POST", "/api/providers/job-result", ["job_id"]],
      ["POST", "/api/payments/topup", ["source_type"]],
      ["POST", "/api/registry/requests", ["image"]],
      ["POST", "/api/admin/providers/{id}/reject", ["reason"]],
      ["POST", "/api/admin/renters/{id}/adjust-balance", ["amount_halala", "reason"]],
    ];
    for (const [method, path, names] of cases) {
      const o = op(method, path);
      expect(o.requestBody.required, `${method} ${path}`).toBe(true);
      expect(bodySchema(o).required, `${method} ${path}`).toEqual(names);
    }
    const os = op("GET", "/api/providers/installer").parameters.find((p: any) => p.name === "os");
    expect(os).toMatchObject({ in: "query", required: true });
    // Approving, suspending or unsuspending takes no required reason; rejecting does.
    expect(op("POST", "/api/admin/providers/{id}/approve").requestBody.required).toBe(false);
  });

  it("describes the rules of one member among several", () => {
    const cases: [string, string, string[]][] = [
      ["POST", "/api/jobs/submit", ["job_type", "template_id"]],
      ["POST", "/api/jobs/{job_id}/progress", ["progress_pct", "phase"]],
      ["POST", "/api/jobs/{job_id}/endpoint-ready", ["endpoint_url", "port"]],
      ["POST", "/api/renters/topup", ["amount_halala", "amount_sar"]],
      ["POST", "/api/payments/topup", ["amount_halala", "amount_sar"]],
    ];
    for (const [method, path, names] of cases) {
      const d = String(op(method, path).description ?? "");
      for (const n of names) expect(d, `${method} ${path}`).toContain(`\`${n}\``);
    }
  });
});

describe("whole-body daemon routes", () => {
  it("list the members of their request message, and take any other", () => {
    const wholeBody = routes.filter((r) => r.method.input.fields.some((f) => fieldOptionsOf(f).wholeBody));
    expect(wholeBody.map(routeKey).sort()).toEqual(["POST /api/jobs/{job_id}/complete", "POST /api/providers/daemon-event", "POST /api/providers/heartbeat"]);
    for (const r of wholeBody) {
      const s = bodySchema(op(r.httpMethod, r.template));
      const typed = r.method.input.fields.filter((f) => !fieldOptionsOf(f).wholeBody && !r.params.includes(f.name)).map((f) => f.name);
      expect(Object.keys(s.properties ?? {}), routeKey(r)).toEqual(expect.arrayContaining(typed));
      expect(s.additionalProperties, routeKey(r)).toBe(true);
    }
    const hb = bodySchema(op("POST", "/api/providers/heartbeat"));
    expect(Object.keys(hb.properties)).toEqual(expect.arrayContaining(["gpu_status", "uptime", "provider_ip", "provider_hostname", "cached_models", "resource_spec"]));
    expect(bodySchema(op("POST", "/api/providers/daemon-event")).required).toEqual(["event_type"]);
  });
});

describe("credentials", () => {
  const querySchemes = (o: any) =>
    o.security
      .flatMap((s: any) => Object.keys(s))
      .map((n: string) => doc.components.securitySchemes[n])
      .filter((s: any) => s.type === "apiKey" && s.in === "query" && s.name === "key");

  it("a renter or provider key may be sent as the query `key` on every route that takes one in a header", async () => {
    for (const r of routes) {
      const roles = rolesOf(r.method);
      if (roles.includes(Role.PUBLIC) || r.params.includes("api_key")) continue;
      const schemes = querySchemes(op(r.httpMethod, r.template)).map((s: any) => s.description);
      if (roles.includes(Role.RENTER)) expect(schemes.some((d: string) => /renter/i.test(d)), routeKey(r)).toBe(true);
      if (roles.includes(Role.PROVIDER)) expect(schemes.some((d: string) => /provider/i.test(d)), routeKey(r)).toBe(true);
      if (!roles.includes(Role.RENTER) && !roles.includes(Role.PROVIDER)) expect(schemes, routeKey(r)).toEqual([]);
    }
    const renter = await makeRenter(srv, 0);
    const provider = await makeProvider(srv);
    expect((await api.get(`/api/renters/me?key=${encodeURIComponent(renter.key)}`)).status).toBe(200);
    expect((await api.get(`/api/providers/me?key=${encodeURIComponent(provider.key)}`)).status).toBe(200);
  });

  it("a route whose path carries the key asks for no other credential, and says the path parameter is it", async () => {
    const pathKey = routes.filter((r) => r.params.includes("api_key"));
    expect(pathKey.map(routeKey).sort()).toEqual(["GET /api/providers/status/{api_key}", "GET /api/providers/{api_key}/jobs"]);
    const provider = await makeProvider(srv);
    for (const r of pathKey) {
      const o = op(r.httpMethod, r.template);
      expect(o.security, routeKey(r)).toEqual([]);
      const param = o.parameters.find((p: any) => p.in === "path" && p.name === "api_key");
      expect(param.description, routeKey(r)).toMatch(/provider API key/i);
      const reply = await api.get(r.template.replace("{api_key}", provider.key));
      expect(reply.status, `${routeKey(r)}: ${reply.text}`).toBeLessThan(300);
    }
  });

  it("a provider route with a JSON body takes the key as body `api_key` (or `key`) with no other credential", async () => {
    const bodyKey = routes.filter((r) => isBodyRoute(r) && rolesOf(r.method).includes(Role.PROVIDER) && !rolesOf(r.method).includes(Role.PUBLIC));
    expect(bodyKey.length).toBeGreaterThanOrEqual(10);
    for (const r of bodyKey) {
      const o = op(r.httpMethod, r.template);
      expect(o.security, routeKey(r)).toContainEqual({});
      expect(Object.keys(bodySchema(o).properties), routeKey(r)).toEqual(expect.arrayContaining(["api_key", "key"]));
      expect(bodySchema(o).properties.api_key.description, routeKey(r)).toMatch(/provider API key/i);
    }
    const provider = await makeProvider(srv);
    expect((await api.post("/api/providers/heartbeat", { api_key: provider.key, gpu_status: { gpu_name: "RTX 4090" } })).status).toBe(200);
    expect((await api.post("/api/providers/pause", { key: provider.key })).status).toBe(200);
    // A renter route documents no body key: its credential is a header or the query.
    expect(op("POST", "/api/jobs/submit").security).not.toContainEqual({});
  });
});

describe("values the server limits to a list", () => {
  /** The list a 400 names for a value outside it. */
  const listIn = (error: string, name: string): string[] | undefined => {
    if (new RegExp(`^${name} must be true or false`).test(error)) return ["true", "false"];
    const m = new RegExp(`^${name} must be one of ([\\w\\-, ]+?)(?: \\(got .*)?$`).exec(error);
    return m?.[1].split(", ");
  };

  it("are enums in the document, listing exactly what the server takes", async () => {
    const fx = await fixtures(srv);
    const cases: [string, string, string][] = [
      ["GET", "/api/admin/providers", "status"],
      ["GET", "/api/admin/providers", "approval_status"],
      ["GET", "/api/admin/renters", "status"],
      ["GET", "/api/admin/payments", "status"],
      ["GET", "/api/admin/jobs", "status"],
      ["GET", "/api/admin/jobs", "job_type"],
      ["GET", "/api/jobs", "status"],
      ["GET", "/api/registry/requests", "status"],
      ["GET", "/api/admin/providers/{id}/events", "severity"],
      ["GET", "/api/providers/download/daemon", "check_only"],
      ["GET", "/api/jobs/{job_id}/output/{format}", "format"],
    ];
    const documented: string[] = [];
    for (const r of routes) {
      for (const p of op(r.httpMethod, r.template).parameters ?? []) if (p.schema?.enum) documented.push(`${routeKey(r)} ${p.name}`);
    }
    expect(documented).toEqual(expect.arrayContaining(cases.map(([m, path, n]) => `${m} ${path} ${n}`)));
    const wrong: string[] = [];
    for (const r of routes) {
      for (const p of op(r.httpMethod, r.template).parameters ?? []) {
        if (!p.schema?.enum) continue;
        const entry = MATRIX[routeKey(r)];
        const cred = routeOwnerCred(r, fx, ADMIN_TOKEN);
        const reply = await send(srv, r, entry, fx, cred, p.in === "path" ? { path: { [p.name]: "not-a-value" } } : { query: { [p.name]: "not-a-value" } });
        const list = listIn(String(reply.body?.error ?? ""), p.name);
        if (reply.status !== 400 || !list) wrong.push(`${routeKey(r)} ${p.name}=not-a-value: ${reply.status} ${reply.text.slice(0, 200)}`);
        else if ([...list].sort().join() !== [...p.schema.enum].sort().join()) wrong.push(`${routeKey(r)} ${p.name}: server takes ${list}, document ${p.schema.enum}`);
      }
    }
    expect(wrong).toEqual([]);
  }, 60_000);
});

describe("parameters", () => {
  it("the admin reads of one provider or renter offer no parameter but its id", async () => {
    for (const path of ["/api/admin/providers/{id}", "/api/admin/renters/{id}"]) {
      expect(op("GET", path).parameters.map((p: any) => p.name), path).toEqual(["id"]);
    }
    const p = await makeProvider(srv);
    const r = await makeRenter(srv);
    expect((await api.get(`/api/admin/providers/${p.id}`, admin)).body.id).toBe(p.id);
    expect((await api.get(`/api/admin/renters/${r.id}`, admin)).body.renter.id).toBe(r.id);
  });
});

describe("the document's version", () => {
  it("is the interface's (5.0.0); the package's is beside it", () => {
    expect(doc.info.version).toBe("5.0.0");
    expect(doc.info["x-package-version"]).toBe(JSON.parse(fs.readFileSync("package.json", "utf8")).version);
  });
});

describe("the document against the interface", () => {
  it("has every endpoint of the interface with its success status", () => {
    const spec: [string, string, number][] = [
      ["post", "/api/providers/register", 200], ["post", "/api/providers/login-email", 200], ["get", "/api/providers/me", 200],
      ["post", "/api/providers/heartbeat", 200], ["post", "/api/providers/daemon-event", 200], ["post", "/api/providers/readiness", 200],
      ["post", "/api/providers/pause", 200], ["post", "/api/providers/resume", 200], ["post", "/api/providers/preferences", 200],
      ["get", "/api/providers/setup", 200], ["get", "/api/providers/setup-windows", 200], ["get", "/api/providers/download", 200],
      ["get", "/api/providers/download/daemon", 200], ["get", "/api/providers/download-windows-exe", 200], ["get", "/api/providers/installer", 200],
      ["get", "/api/providers/status/{api_key}", 200], ["get", "/api/providers/{api_key}/jobs", 200], ["post", "/api/providers/job-result", 200],
      ["get", "/api/providers/download/setup", 200], ["get", "/api/providers/marketplace", 200],
      ["post", "/api/renters/register", 201], ["get", "/api/renters/me", 200], ["get", "/api/renters/available-providers", 200],
      ["get", "/api/renters/balance", 200], ["post", "/api/renters/topup", 200], ["post", "/api/renters/login-email", 200], ["post", "/api/renters/rotate-key", 200],
      ["post", "/api/jobs/submit", 201], ["get", "/api/jobs/{job_id}", 200], ["get", "/api/jobs/{job_id}/output", 200], ["get", "/api/jobs/{job_id}/output/{format}", 200],
      ["get", "/api/jobs/{job_id}/logs", 200], ["post", "/api/jobs/{job_id}/logs", 200], ["post", "/api/jobs/{job_id}/progress", 200],
      ["post", "/api/jobs/{job_id}/endpoint-ready", 200], ["post", "/api/jobs/{job_id}/complete", 200], ["get", "/api/admin/dashboard", 200],
    ];
    const missing = spec.filter(([m, p, s]) => !doc.paths[p]?.[m]?.responses[String(s)]).map((x) => x.join(" "));
    expect(missing).toEqual([]);
    expect(op("get", "/api/jobs/{job_id}/output").responses["2XX"]).toBeDefined(); // 202 while running
  });

  it("declares the interface's resource fields with their types", () => {
    const S = doc.components.schemas;
    const t = (schema: string, field: string) => {
      const s = S[schema]?.properties?.[field];
      if (!s) return "absent";
      const base = s.anyOf ? s.anyOf[0] : s;
      return base.type ?? (base.$ref ? "object" : "any");
    };
    const want: Record<string, Record<string, string>> = {
      "svc.v1.Provider": { id: "integer", gpu_vram_mib: "integer", uptime_percent: "number", total_earnings_halala: "integer", gpu_usage_cap_pct: "integer", vram_reserve_gb: "number", temp_limit_c: "integer", is_paused: "boolean", gpu_count_reported: "integer" },
      "svc.v1.Renter": { id: "integer", balance_halala: "integer", total_spent_halala: "integer", total_jobs: "integer", created_at: "string", webhook_url: "string" },
      "svc.v1.Job": { id: "integer", job_id: "string", cost_halala: "integer", actual_cost_halala: "integer", provider_earned_halala: "integer", platform_fee_halala: "integer", started_at: "string" },
      "svc.v1.JobSubmission": { provider_id: "integer", renter_id: "integer", duration_minutes: "number", max_duration_seconds: "integer", timeout_at: "string", container_spec: "object", workspace_volume_name: "string", checkpoint_enabled: "boolean", task_spec_signed: "boolean", priority: "integer", pricing_class: "string", prewarm_requested: "boolean", queue_position: "integer", model: "string" },
      "svc.v1.AvailableProvider": { vram_gb: "integer", vram_mib: "integer", gpu_count: "integer", is_live: "boolean", reliability_score: "number", cached_models: "array", addrs: "array", stale: "boolean" },
      "svc.v1.GetBalanceResponse": { balance_halala: "integer", balance_sar: "number", held_halala: "integer", held_sar: "number", available_halala: "integer", total_spent_sar: "number" },
      "svc.v1.JobResultResponse": { actual_minutes: "integer", cost_halala: "integer", provider_earned_halala: "integer", platform_fee_halala: "integer" },
      "svc.v1.GetProviderStatusResponse": { provider_id: "integer", total_earnings: "number", total_jobs: "integer", uptime_percent: "number" },
      "svc.v1.Payment": { amount_sar: "number", amount_halala: "integer", confirmed_at: "string" },
      "svc.v1.GpuMetrics": { utilization_pct: "number", vram_used_mib: "integer", temperature_c: "number" },
    };
    const wrong: string[] = [];
    for (const [schema, fields] of Object.entries(want)) for (const [f, ty] of Object.entries(fields)) if (t(schema, f) !== ty) wrong.push(`${schema}.${f}: ${t(schema, f)} (interface: ${ty})`);
    expect(wrong).toEqual([]);
  });

  it("x-body-limit-bytes is the size refused, with a JSON {error}", async () => {
    const r = await makeRenter(srv, 10_000);
    const limit = op("POST", "/api/jobs/submit")["x-body-limit-bytes"] as number;
    const pad = (n: number) => JSON.stringify({ job_type: "benchmark", duration_minutes: 1, pad: "x".repeat(n) });
    const base = pad(0).length;
    expect((await api.post("/api/jobs/submit", pad(limit - base), r.headers)).status).not.toBe(413);
    const over = await api.post("/api/jobs/submit", pad(limit - base + 1), r.headers);
    expect(over.status).toBe(413);
    expect(typeof over.body.error).toBe("string");
  });

  it("unknown members are ignored and null means not given, as documented", async () => {
    const reply = await api.post("/api/renters/register", { name: "Lab", email: uniqueEmail("oa"), organization: null, unknown_member: { a: 1 } });
    expect(reply.status).toBe(201);
  });
});
