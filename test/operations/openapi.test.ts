// The OpenAPI document generated from the proto: it covers every route of the
// route table the server serves (method, path, success status, security,
// body schema), the committed docs/openapi.json is current, the reference
// page is served from this origin, and what a real server answers on every
// route validates against the document's response schemas (ajv), so the
// document cannot drift from what the service sends.
import fs from "node:fs";
import { beforeAll, describe, expect, it } from "vitest";
import { Ajv2020 } from "ajv/dist/2020.js";
import { Role } from "../../gen/svc/v1/options_pb.js";
import { buildRouteTable, type RestRoute } from "../../src/http/rest.js";
import { buildServices, SERVED_SERVICES } from "../../src/services/index.js";
import { rolesOf } from "../../src/services/secure.js";
import { buildOpenApi, securityOf, type OpenApiDocument } from "../../src/http/openapi.js";
import { packageVersion } from "../../src/http/api-docs.js";
import { OPENAPI_FILE, openApiText } from "../../src/http/write-openapi.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";
import { fixtures, MATRIX, ownerCred, routeKey, send, WEBHOOK_SECRET, type Fx } from "../hardening/routes.js";

let routes: RestRoute[];
let doc: OpenApiDocument;

const srv = useTestServer({ PAYMENT_GATEWAY_WEBHOOK_SECRET: WEBHOOK_SECRET });
beforeAll(async () => {
  routes = buildRouteTable(buildServices(srv.app.deps));
  const r = await client(srv.url).get("/api/openapi.json");
  expect(r.status).toBe(200);
  expect(r.headers.get("content-type")).toMatch(/^application\/json/);
  doc = r.body;
});

describe("the OpenAPI document", () => {
  it("is the one generated from the proto, and docs/openapi.json is current (npm run openapi)", () => {
    expect(doc.openapi).toBe("3.1.0");
    expect(doc).toEqual(JSON.parse(JSON.stringify(buildOpenApi([...SERVED_SERVICES], { packageVersion: packageVersion() }))));
    expect(fs.readFileSync(OPENAPI_FILE, "utf8"), "docs/openapi.json is stale: run npm run openapi").toBe(openApiText());
  });

  it("has every route of the route table with its method, path, success status, security and body schema", () => {
    const documented = new Set<string>();
    for (const [path, ops] of Object.entries(doc.paths)) for (const m of Object.keys(ops)) documented.add(`${m.toUpperCase()} ${path}`);
    expect([...documented].sort()).toEqual(routes.map(routeKey).sort());
    const schemes = Object.keys(doc.components.securitySchemes);
    for (const r of routes) {
      const op = doc.paths[r.template][r.httpMethod.toLowerCase()];
      const at = routeKey(r);
      expect(op.responses[String(r.status)], `${at}: success status ${r.status}`).toBeDefined();
      expect(op.responses.default, `${at}: error answer`).toBeDefined();
      const roles = rolesOf(r.method);
      expect(op.security, at).toEqual(securityOf(r.method, r.httpMethod, r.template));
      // Public routes ask for nothing, and so do the two whose path carries the key (openapi-requests.test.ts).
      if (roles.includes(Role.PUBLIC) || r.params.includes("api_key")) {
        expect(op.security, at).toEqual([]);
      } else {
        expect(op.security.length, at).toBeGreaterThan(0);
        const names = op.security.flatMap((s) => Object.keys(s));
        for (const n of names) expect(schemes).toContain(n);
        if (roles.includes(Role.RENTER)) expect(names, at).toEqual(expect.arrayContaining(["renterKey", "renterKeyQuery"]));
        if (roles.includes(Role.PROVIDER)) expect(names, at).toEqual(expect.arrayContaining(["providerKey", "providerKeyQuery"]));
        if (roles.includes(Role.ADMIN)) expect(names, at).toContain("adminToken");
      }
      expect(op["x-rate-limit-row"], at).toBe(r.rateLimit || "default");
      expect(op["x-body-limit-bytes"], at).toBe(r.bodyLimitBytes);
      if (r.httpMethod !== "GET" && r.httpMethod !== "DELETE") {
        const schema = op.requestBody?.content as Record<string, { schema: { type: string } }> | undefined;
        expect(schema?.["application/json"]?.schema?.type, `${at}: request body schema`).toBe("object");
      }
      for (const p of r.params) expect(op.parameters?.some((x) => x.in === "path" && x.name === p), `${at}: path parameter ${p}`).toBe(true);
      const ok = op.responses[String(r.status)].content as Record<string, { schema?: unknown; "x-event-schema"?: unknown }>;
      const media = Object.values(ok)[0];
      expect(media.schema ?? media["x-event-schema"], `${at}: response schema`).toBeDefined();
    }
  });

  it("serves a reference page from this origin only", async () => {
    const api = client(srv.url);
    const page = await api.get("/api/docs");
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toMatch(/^text\/html/);
    const csp = page.headers.get("content-security-policy")!;
    expect(csp).toContain("default-src 'self'");
    expect(csp).toContain("script-src 'self'");
    const refs = [...page.text.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]);
    expect(refs.length).toBeGreaterThanOrEqual(3);
    for (const ref of refs) {
      expect(ref.startsWith("/api/docs/"), ref).toBe(true);
      const a = await api.get(ref);
      expect(a.status, ref).toBe(200);
      expect(a.headers.get("content-type"), ref).toMatch(/^(text\/(css|javascript)|image\/png)/);
    }
    expect((await api.get("/api/docs/init.js")).text).toContain('url: "/api/openapi.json"');
    expect((await api.get("/api/docs/swagger-ui-bundle.js")).text.length).toBeGreaterThan(100_000);
  });
});

describe("real answers validate against the document", () => {
  const ajv = new Ajv2020({ strict: false, validateFormats: false, allErrors: true });
  let compiled = false;
  const validator = (ref: string) => {
    if (!compiled) {
      ajv.addSchema({ $id: "https://svc.invalid/openapi.json", components: doc.components });
      compiled = true;
    }
    return ajv.getSchema(`https://svc.invalid/openapi.json${ref.slice(1)}`) ?? ajv.compile({ $ref: `https://svc.invalid/openapi.json${ref}` });
  };

  /** The JSON schema $ref the document gives an answer of this status, or undefined when not JSON. */
  function responseRef(r: RestRoute, status: number): string | undefined {
    const op = doc.paths[r.template][r.httpMethod.toLowerCase()];
    const res = (op.responses[String(status)] ?? (status < 300 ? op.responses["2XX"] : undefined) ?? op.responses.default) as Record<string, unknown>;
    if (res.$ref === "#/components/responses/Error") return "#/components/schemas/Error";
    const media = (res.content as Record<string, { schema?: { $ref?: string } }>)["application/json"];
    return media?.schema?.$ref;
  }

  /** Bodies and queries that make a route succeed where the auth matrix's entry only needs it reached. */
  const SUCCESS: Record<string, (fx: Fx, emails: { renter: string; provider: string }) => { body?: Record<string, unknown>; query?: Record<string, string> }> = {
    "POST /api/providers/register": () => ({ body: { name: "Rig", email: uniqueEmail("oa-provider"), gpu_model: "RTX 4090", os: "linux" } }),
    "POST /api/renters/register": () => ({ body: { name: "Lab", email: uniqueEmail("oa-renter") } }),
    "POST /api/providers/login-email": (_, e) => ({ body: { email: e.provider } }),
    "POST /api/renters/login-email": (_, e) => ({ body: { email: e.renter } }),
    "POST /api/renters/topup": () => ({ body: { amount_halala: 100 } }),
    "GET /api/providers/installer": () => ({ query: { os: "linux" } }),
    "POST /api/jobs/submit": () => ({ body: { job_type: "benchmark", duration_minutes: 1 } }),
    "POST /api/admin/providers/{id}/reject": () => ({ body: { reason: "openapi test" } }),
  };
  /** Renter and provider routes whose documented answer in this setup is not a success, and why. */
  const NOT_A_SUCCESS: Record<string, string> = {
    "GET /api/providers/download-windows-exe": "404 until SVC_WINDOWS_EXE_PATH is set",
    "GET /api/jobs/{job_id}/output/{format}": "404 while the fixture's job has no output yet (a file, not JSON, once it has)",
    "GET /api/jobs/{job_id}/receipt": "404 until the fixture's job has ended (receipts are issued at settlement)",
  };

  it("on every renter, provider, public and admin route", async () => {
    const shared: Fx = await fixtures(srv);
    const emailOf = async (table: "renters" | "providers", id: number) => (await srv.sql<{ email: string }[]>`SELECT email FROM ${srv.sql(table)} WHERE id = ${id}`)[0].email;
    const validated: string[] = [];
    const notOk: string[] = [];
    for (const r of routes) {
      const key = routeKey(r);
      const entry = MATRIX[key];
      expect(entry, `${key} has no entry in test/hardening/routes.ts`).toBeDefined();
      if (entry.stream) continue; // the event stream: checked below
      const roles = rolesOf(r.method);
      // A route that changes what others rely on (cancel, rotate-key…) acts on fixtures of its own.
      const fx = entry.fresh ? await fixtures(srv) : shared;
      const cred = ownerCred(
        { renter: roles.includes(Role.RENTER), provider: roles.includes(Role.PROVIDER), admin: roles.includes(Role.ADMIN), public: roles.includes(Role.PUBLIC) },
        entry,
        fx,
        ADMIN_TOKEN,
      );
      const emails = { renter: await emailOf("renters", fx.renterA.id), provider: await emailOf("providers", fx.provider1.id) };
      const reply = await send(srv, r, entry, fx, cred, SUCCESS[key]?.(fx, emails) ?? {});
      expect(reply.status, `${key}: ${reply.text.slice(0, 300)}`).toBeLessThan(500);
      if (reply.status >= 300) notOk.push(`${key} ${reply.status}`);
      if (!(reply.headers.get("content-type") ?? "").startsWith("application/json")) continue;
      const ref = responseRef(r, reply.status);
      expect(ref, `${key} ${reply.status}: the document gives no JSON schema`).toBeDefined();
      const validate = validator(ref!);
      const ok = validate(reply.body);
      expect(ok, `${key} ${reply.status} against ${ref}: ${JSON.stringify(validate.errors?.slice(0, 5))}\n${reply.text.slice(0, 500)}`).toBe(true);
      validated.push(key);
    }
    // Every renter, provider and public route was answered with its success (so its success schema was checked).
    const expected = routes
      .filter((r) => rolesOf(r.method).some((x) => x === Role.RENTER || x === Role.PROVIDER || x === Role.PUBLIC) && MATRIX[routeKey(r)]?.owner !== "signature")
      .map(routeKey);
    expect(notOk.filter((n) => expected.includes(n.replace(/ \d+$/, "")) && !(n.replace(/ \d+$/, "") in NOT_A_SUCCESS))).toEqual([]);
    expect(validated.length).toBeGreaterThan(routes.length * 0.75);
  }, 180_000);

  it("on the answers that need an ended job: its output and its receipt", async () => {
    const fx = await fixtures(srv);
    const api = client(srv.url);
    await api.get(`/api/providers/${fx.provider1.key}/jobs`);
    const done = await api.post("/api/providers/job-result", { api_key: fx.provider1.key, job_id: fx.jobId, success: true, result: { response: "ok" } });
    expect(done.status, done.text).toBe(200);
    for (const r of routes.filter((x) => ["GET /api/jobs/{job_id}/receipt", "GET /api/jobs/{job_id}/output"].includes(routeKey(x)))) {
      const reply = await send(srv, r, MATRIX[routeKey(r)], fx, { kind: "renter", key: fx.renterA.key });
      expect(reply.status, `${routeKey(r)}: ${reply.text.slice(0, 300)}`).toBe(200);
      const validate = validator(responseRef(r, 200)!);
      expect(validate(reply.body), `${routeKey(r)}: ${JSON.stringify(validate.errors?.slice(0, 5))}`).toBe(true);
    }
  });

  it("on the job event stream (each event's data is a JobEvent)", async () => {
    const fx = await fixtures(srv);
    const ac = new AbortController();
    const res = await fetch(`${srv.url}/api/jobs/${fx.jobId}/events`, { headers: { "x-renter-key": fx.renterA.key }, signal: ac.signal });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
    const reader = res.body!.getReader();
    let text = "";
    while (!/\ndata: .*\n/.test(text)) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString("utf8");
    }
    ac.abort();
    const data = /\ndata: (.*)\n/.exec(text)![1];
    const op = doc.paths["/api/jobs/{job_id}/events"].get;
    const media = (op.responses["200"].content as Record<string, { "x-event-schema": { $ref: string } }>)["text/event-stream"];
    const validate = validator(media["x-event-schema"].$ref);
    expect(validate(JSON.parse(data)), JSON.stringify(validate.errors?.slice(0, 5))).toBe(true);
  });
});
