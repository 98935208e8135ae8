// Shared by the auth-matrix and fuzz tests: one entry per REST route (who
// owns what it acts on), ready-made accounts, and a sender that places a
// credential the documented way for the route.
import crypto from "node:crypto";
import type { RestRoute } from "../../src/http/rest.js";
import { Role } from "../../gen/svc/v1/options_pb.js";
import { rolesOf } from "../../src/services/secure.js";
import { client, type Reply } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import type { TestServer } from "../helpers/server.js";
import { seedJob } from "../admin/helpers.js";

export const WEBHOOK_SECRET = "whsec-matrix-0123456789abcdef";

export type Account = { id: number; key: string };
export interface Fx {
  renterA: Account;
  renterB: Account;
  provider1: Account;
  provider2: Account;
  jobId: string;
  paymentId: string;
  /** A job provider2 ran first (attempt 1) that moved on to provider1 (attempt 2, running). */
  movedJobId: string;
  imageRequestId: number;
  /** Targets of the admin routes, never used as credentials. */
  renterT: Account;
  providerT: Account;
}

/** Who owns the resource a route acts on. */
export type Owner = "public" | "self" | "job" | "payment" | "admin" | "signature";

export interface Entry {
  owner: Owner;
  body?: (fx: Fx) => Record<string, unknown>;
  /** Its right-owner call changes what later routes rely on: it gets accounts and a job of its own. */
  fresh?: boolean;
  /** A server-sent event stream: only its status and headers are read, then the connection is cut. */
  stream?: boolean;
}

const job = (body?: Entry["body"]): Entry => ({ owner: "job", body });
const jobChange = (body?: Entry["body"]): Entry => ({ owner: "job", body, fresh: true });
const SELF: Entry = { owner: "self" };
const PUBLIC: Entry = { owner: "public" };
const ADMIN: Entry = { owner: "admin" };

/** One entry per route. Adding an RPC binding without adding it here fails the test. */
export const MATRIX: Record<string, Entry> = {
  "POST /api/providers/register": PUBLIC,
  "POST /api/providers/login-email": PUBLIC,
  "GET /api/providers/me": SELF,
  "POST /api/providers/heartbeat": SELF,
  "POST /api/providers/daemon-event": { owner: "self", body: () => ({ event_type: "matrix" }) },
  "POST /api/providers/readiness": SELF,
  "POST /api/providers/pause": SELF,
  "POST /api/providers/resume": SELF,
  "POST /api/providers/preferences": SELF,
  "POST /api/providers/rotate-key": { owner: "self", fresh: true },
  "GET /api/providers/status/{api_key}": SELF,
  "GET /api/renters/available-providers": PUBLIC,
  "GET /api/providers/marketplace": PUBLIC,
  "GET /api/providers/setup": SELF,
  "GET /api/providers/setup-windows": SELF,
  "GET /api/providers/download": SELF,
  "GET /api/providers/download/setup": SELF,
  "GET /api/providers/download/daemon": SELF,
  "GET /api/providers/download-windows-exe": PUBLIC,
  "GET /api/providers/installer": SELF,
  "GET /api/providers/{api_key}/jobs": SELF,
  "POST /api/providers/job-result": jobChange((fx) => ({ job_id: fx.jobId, success: true, result: { response: "ok" } })),
  "POST /api/renters/register": PUBLIC,
  "POST /api/renters/login-email": PUBLIC,
  "GET /api/renters/me": SELF,
  "PATCH /api/renters/me": SELF,
  "GET /api/renters/balance": SELF,
  "POST /api/renters/topup": SELF,
  "POST /api/renters/rotate-key": { owner: "self", fresh: true },
  "POST /api/jobs/submit": SELF,
  "GET /api/jobs": SELF,
  "GET /api/jobs/{job_id}": job(),
  "GET /api/jobs/{job_id}/output": job(),
  "GET /api/jobs/{job_id}/output/{format}": job(),
  "GET /api/jobs/{job_id}/logs": job(),
  "GET /api/jobs/{job_id}/history": job(),
  "GET /api/jobs/{job_id}/events": { owner: "job", stream: true },
  "GET /api/jobs/{job_id}/receipt": job(),
  "GET /api/receipts/keys": PUBLIC,
  "POST /api/admin/receipts/keys/rotate": ADMIN,
  "POST /api/admin/receipts/keys/{key_id}/revoke": ADMIN,
  "POST /api/jobs/{job_id}/cancel": jobChange(),
  "POST /api/jobs/{job_id}/logs": jobChange(() => ({ logs: ["matrix"] })),
  "POST /api/jobs/{job_id}/preparing": jobChange(() => ({ detail: "pulling image" })),
  "POST /api/jobs/{job_id}/progress": jobChange(() => ({ progress_pct: 50, phase: "matrix" })),
  "POST /api/jobs/{job_id}/endpoint-ready": jobChange(() => ({ endpoint_url: "http://10.0.0.1:8000/v1" })),
  "POST /api/jobs/{job_id}/complete": jobChange(() => ({ response: "ok" })),
  "POST /api/payments/topup": { owner: "self", body: () => ({ amount_halala: 100, source_type: "sandbox" }) },
  "POST /api/payments/webhook": { owner: "signature" },
  "GET /api/payments/history": SELF,
  "GET /api/payments/{payment_id}": { owner: "payment" },
  "POST /api/payments/{payment_id}/sandbox-confirm": { owner: "payment" },
  "GET /api/templates": PUBLIC,
  "GET /api/job-types": PUBLIC,
  "GET /api/job-types/{job_type}/estimate": PUBLIC,
  "GET /api/providers/earnings": SELF,
  "GET /api/renters/usage": SELF,
  "GET /api/admin/daily": ADMIN,
  "GET /api/templates/{id}": PUBLIC,
  "GET /api/registry/images": PUBLIC,
  "POST /api/registry/requests": { owner: "self", body: () => ({ image: `ghcr.io/matrix/app:${crypto.randomInt(1e9)}@sha256:${crypto.randomBytes(32).toString("hex")}` }) },
  "GET /api/registry/requests": SELF,
  "GET /api/admin/dashboard": ADMIN,
  "GET /api/admin/providers": ADMIN,
  "GET /api/admin/providers/{id}": ADMIN,
  "POST /api/admin/providers/{id}/approve": ADMIN,
  "PATCH /api/admin/providers/{id}/approve": ADMIN,
  "POST /api/admin/providers/{id}/reject": ADMIN,
  "POST /api/admin/providers/{id}/suspend": ADMIN,
  "POST /api/admin/providers/{id}/unsuspend": ADMIN,
  "POST /api/admin/providers/{id}/preload-model": ADMIN,
  "GET /api/admin/providers/{id}/events": ADMIN,
  "GET /api/admin/renters": ADMIN,
  "GET /api/admin/renters/{id}": ADMIN,
  "POST /api/admin/renters/{id}/suspend": ADMIN,
  "POST /api/admin/renters/{id}/unsuspend": ADMIN,
  "POST /api/admin/renters/{id}/adjust-balance": { owner: "admin", body: () => ({ amount_halala: 10, reason: "matrix" }) },
  "PUT /api/admin/renters/{id}/quota": { owner: "admin", body: () => ({ daily_jobs_limit: 5 }) },
  "POST /api/admin/renters/{id}/quota": { owner: "admin", body: () => ({ daily_jobs_limit: 5 }) },
  "GET /api/admin/jobs": ADMIN,
  "POST /api/admin/jobs/{job_id}/requeue": { owner: "admin", fresh: true },
  "POST /api/admin/jobs/{job_id}/cancel": { owner: "admin", fresh: true },
  "GET /api/admin/payments": ADMIN,
  "GET /api/admin/audit": ADMIN,
  "GET /api/admin/ledger/audit": ADMIN,
  "POST /api/admin/registry/requests/{id}/approve": ADMIN,
  "POST /api/admin/registry/requests/{id}/reject": ADMIN,
};

export const routeKey = (r: RestRoute) => `${r.httpMethod} ${r.template}`;

export async function fixtures(srv: TestServer): Promise<Fx> {
  const api = client(srv.url);
  const [a, b] = [await makeRenter(srv, 100_000), await makeRenter(srv, 100_000)];
  const [p1, p2] = [await makeProvider(srv, { vramMib: 81_920 }), await makeProvider(srv)];
  const submit = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, provider_id: p1.id }, a.headers);
  const jobId =
    submit.status === 201 ? (submit.body.job.job_id as string) : (await seedJob(srv, { renterId: a.id, providerId: p1.id, status: "pending" })).jobId;
  // Polled by its provider: running there, so the provider's reports on it are taken.
  await api.get(`/api/providers/${p1.key}/jobs`);
  const pay = await api.post("/api/payments/topup", { amount_halala: 500, source_type: "sandbox" }, a.headers);
  const paymentId = pay.status === 201 ? (pay.body.payment.payment_id as string) : "pay-missing";
  const req = await api.post("/api/registry/requests", { image: `ghcr.io/matrix/fixture:${crypto.randomInt(1e9)}@sha256:${crypto.randomBytes(32).toString("hex")}` }, a.headers);
  const moved = await seedJob(srv, { renterId: a.id, providerId: p1.id, status: "running" });
  await srv.sql`UPDATE jobs SET attempt = 2, started_at = now() WHERE id = ${moved.id}`;
  await srv.sql`
    INSERT INTO job_attempts (job_id, attempt, provider_id, status, assigned_at, started_at, ended_at, end_reason)
    VALUES (${moved.id}, 1, ${p2.id}, 'requeued', now(), now(), now(), 'admin'), (${moved.id}, 2, ${p1.id}, 'running', now(), now(), NULL, NULL)`;
  const [renterT, providerT] = [await makeRenter(srv, 1_000), await makeProvider(srv)];
  return { renterA: a, renterB: b, provider1: p1, provider2: p2, jobId, paymentId, movedJobId: moved.jobId, imageRequestId: req.body.id, renterT, providerT };
}

export type Cred =
  | { kind: "none" }
  | { kind: "renter" | "provider"; key: string }
  | { kind: "admin"; token: string }
  | { kind: "signature"; valid: boolean };

export interface Overrides {
  /** Replaces the entry's body (fuzzing); may be any JSON value or raw text. */
  body?: unknown;
  /** Replaces path parameter values. */
  path?: Record<string, string>;
  /** Extra query parameters. */
  query?: Record<string, string>;
}

/** Sends a request to a route with one credential, placed the documented way for that route. */
export async function send(srv: TestServer, r: RestRoute, entry: Entry, fx: Fx, cred: Cred, o: Overrides = {}): Promise<Reply> {
  const api = client(srv.url);
  const headers: Record<string, string> = {};
  const query = new URLSearchParams(o.query);
  let body: unknown = "body" in o ? o.body : (entry.body?.(fx) ?? {});
  let pathKey = "no-key-given";
  const isGet = r.httpMethod === "GET";
  if (cred.kind === "renter") headers["x-renter-key"] = cred.key;
  if (cred.kind === "admin") headers["x-admin-token"] = cred.token;
  if (cred.kind === "provider") {
    // Daemon routes: api_key in the body (key for pause/resume/preferences, same handling); GETs: ?key=.
    // A route no provider may call (a wrong role) takes none in its body: the header.
    if (r.params.includes("api_key")) pathKey = cred.key;
    else if (isGet) query.set("key", cred.key);
    else if (body && typeof body === "object" && !Array.isArray(body) && rolesOf(r.method).includes(Role.PROVIDER)) body = { ...body, api_key: cred.key };
    else headers["x-provider-key"] = cred.key;
  }
  if (cred.kind === "signature") {
    const raw = typeof body === "string" ? body : JSON.stringify(body);
    headers["x-gateway-signature"] = cred.valid ? crypto.createHmac("sha256", WEBHOOK_SECRET).update(raw).digest("hex") : "00".repeat(32);
  }
  const values: Record<string, string> = {
    job_id: fx.jobId,
    job_type: "benchmark",
    payment_id: fx.paymentId,
    api_key: pathKey,
    format: "json",
    id: r.template.startsWith("/api/admin/renters")
      ? String(fx.renterT.id)
      : r.template.startsWith("/api/admin/providers")
        ? String(fx.providerT.id)
        : r.template.startsWith("/api/admin/registry")
          ? String(fx.imageRequestId)
          : "llm-inference",
  };
  Object.assign(values, o.path);
  const path = r.template.replace(/\{(\w+)\}/g, (_, p) => encodeURIComponent(values[p]));
  const url = query.size ? `${path}?${query}` : path;
  if (entry.stream) return streamHead(srv.url + url, headers);
  return api.call(r.httpMethod, url, isGet ? undefined : body, headers);
}

/** A stream's answer up to its headers (and its JSON body when it is an error), then the connection cut. */
async function streamHead(url: string, headers: Record<string, string>): Promise<Reply> {
  const ac = new AbortController();
  const res = await fetch(url, { headers, signal: ac.signal });
  if (res.status === 200) {
    ac.abort();
    return { status: 200, body: undefined, headers: res.headers, text: "" };
  }
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {}
  return { status: res.status, body, headers: res.headers, text };
}


/** The credential of the caller a route is for (the "right owner"). */
/** The credential of a route's rightful caller, from the roles the route declares and its matrix entry. */
export function routeOwnerCred(r: RestRoute, fx: Fx, adminToken: string): Cred {
  const roles = rolesOf(r.method);
  const has = (role: Role) => roles.includes(role);
  return ownerCred({ renter: has(Role.RENTER), provider: has(Role.PROVIDER), admin: has(Role.ADMIN), public: has(Role.PUBLIC) }, MATRIX[routeKey(r)], fx, adminToken);
}

export function ownerCred(roles: { renter: boolean; provider: boolean; admin: boolean; public: boolean }, entry: Entry, fx: Fx, adminToken: string): Cred {
  if (entry.owner === "signature") return { kind: "signature", valid: true };
  if (roles.public) return { kind: "none" };
  if (roles.renter) return { kind: "renter", key: fx.renterA.key };
  if (roles.provider) return { kind: "provider", key: fx.provider1.key };
  return { kind: "admin", token: adminToken };
}
