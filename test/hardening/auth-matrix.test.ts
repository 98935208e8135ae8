// The auth matrix, generated from the route table the server really serves:
// every REST route x {no credential, malformed, wrong role, another owner,
// right owner} -> the documented status. A route without an entry in MATRIX
// (routes.ts), or an entry without a route, fails the test.
//
// Documented statuses (src/services/secure.ts, spec "Errors"):
//   no credential  public: served | key roles: 400 "API key required" | admin only: 401
//   malformed      public: served | key roles: 401 "invalid API key" (404 "not found" on the me reads) | admin only: 401
//   wrong role     a provider key on a renter route (or the reverse): 403; a key on an admin-only route: 401
//   another owner  a job or payment of someone else: 403 (spec: "job belongs to another caller")
//   former provider  a provider's key on a job that moved on to another provider: its own attempts'
//                  logs and history, and the job's receipt, are served; everything else (the job, its
//                  output, reports) is 403
//   right owner    served: neither 401 nor 403 (validation may still answer 4xx)
// "served" never means a 5xx; routes still being built may answer 501 and are listed.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Role } from "../../gen/svc/v1/options_pb.js";
import { buildRouteTable, type RestRoute } from "../../src/http/rest.js";
import { buildServices } from "../../src/services/index.js";
import { rolesOf } from "../../src/services/secure.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";
import { fixtures, MATRIX, routeKey, send, WEBHOOK_SECRET, type Cred, type Entry, type Fx } from "./routes.js";

let routes: RestRoute[];

const srv = useTestServer({ PAYMENT_GATEWAY_WEBHOOK_SECRET: WEBHOOK_SECRET });
beforeAll(async () => {
  routes = buildRouteTable(buildServices(srv.app.deps));
});

type Column = "no credential" | "malformed" | "wrong role" | "another owner" | "former provider" | "right owner" | "admin";
const SERVED = "served";
type Expected = number | typeof SERVED;

interface Case {
  column: Column;
  cred: Cred;
  expected: Expected;
  /** The fixtures this case acts on, when not the route's own (the former provider's moved job). */
  fx?: Fx;
}

/** What a provider still reads of a job that moved on: its own attempts. */
const FORMER_PROVIDER_READS = new Set(["GET /api/jobs/{job_id}/logs", "GET /api/jobs/{job_id}/history", "GET /api/jobs/{job_id}/receipt"]);

/** Reads whose documented answer for a key of no account is 404 "not found" (spec Errors table: me). */
const UNKNOWN_KEY_NOT_FOUND = new Set(["GET /api/providers/me", "GET /api/renters/me", "GET /api/providers/status/{api_key}"]);

/** The documented status of each column for a route, from its declared roles and its entry. */
function casesFor(r: RestRoute, entry: Entry, fx: Fx): Case[] {
  const roles = rolesOf(r.method);
  const renter = roles.includes(Role.RENTER);
  const provider = roles.includes(Role.PROVIDER);
  const admin = roles.includes(Role.ADMIN);
  const garbage = "garbage-credential";
  if (entry.owner === "signature") {
    return [
      { column: "no credential", cred: { kind: "none" }, expected: 401 },
      { column: "malformed", cred: { kind: "signature", valid: false }, expected: 401 },
      { column: "right owner", cred: { kind: "signature", valid: true }, expected: SERVED },
    ];
  }
  if (roles.includes(Role.PUBLIC)) {
    return [
      { column: "no credential", cred: { kind: "none" }, expected: SERVED },
      { column: "malformed", cred: { kind: "renter", key: garbage }, expected: SERVED },
    ];
  }
  const cases: Case[] = [];
  const adminOnly = !renter && !provider;
  const pathKey = r.params.includes("api_key");
  if (!pathKey) cases.push({ column: "no credential", cred: { kind: "none" }, expected: adminOnly ? 401 : 400 });
  cases.push({
    column: "malformed",
    cred: adminOnly ? { kind: "admin", token: garbage } : { kind: renter ? "renter" : "provider", key: garbage },
    // The `me` reads answer 404 "not found" for a key of no account (spec Errors table).
    expected: UNKNOWN_KEY_NOT_FOUND.has(routeKey(r)) ? 404 : 401,
  });
  if (adminOnly) cases.push({ column: "wrong role", cred: { kind: "renter", key: fx.renterA.key }, expected: 401 });
  else if (!provider) cases.push({ column: "wrong role", cred: { kind: "provider", key: fx.provider1.key }, expected: 403 });
  else if (!renter) cases.push({ column: "wrong role", cred: { kind: "renter", key: fx.renterA.key }, expected: 403 });
  if (entry.owner === "job" || entry.owner === "payment") {
    cases.push({
      column: "another owner",
      cred: renter ? { kind: "renter", key: fx.renterB.key } : { kind: "provider", key: fx.provider2.key },
      expected: 403,
    });
  }
  if (entry.owner === "job" && provider) {
    cases.push({
      column: "former provider",
      cred: { kind: "provider", key: fx.provider2.key },
      expected: FORMER_PROVIDER_READS.has(routeKey(r)) ? SERVED : 403,
      fx: { ...fx, jobId: fx.movedJobId },
    });
  }
  if (admin && !adminOnly) cases.push({ column: "admin", cred: { kind: "admin", token: ADMIN_TOKEN }, expected: SERVED });
  cases.push({
    column: "right owner",
    cred: renter ? { kind: "renter", key: fx.renterA.key } : provider ? { kind: "provider", key: fx.provider1.key } : { kind: "admin", token: ADMIN_TOKEN },
    expected: SERVED,
  });
  return cases;
}

const unbuilt = new Set<string>();

describe("auth matrix (generated from the route table)", () => {
  it("has exactly one entry per served route", () => {
    const served = routes.map(routeKey);
    const missing = served.filter((k) => !(k in MATRIX));
    const stale = Object.keys(MATRIX).filter((k) => !served.includes(k));
    expect(missing, "routes without an auth-matrix entry").toEqual([]);
    expect(stale, "auth-matrix entries without a route").toEqual([]);
    expect(served.length).toBeGreaterThan(60);
  });

  it("answers every route x credential with the documented status", async () => {
    const failures: string[] = [];
    const shared = await fixtures(srv);
    for (const r of routes) {
      const entry = MATRIX[routeKey(r)];
      if (!entry) continue;
      const fx = entry.fresh ? await fixtures(srv) : shared;
      let ownerUnbuilt = false;
      const cases = casesFor(r, entry, fx);
      // The right owner runs last: it may change state.
      for (const c of cases) {
        if (c.column === "another owner" && ownerUnbuilt) continue;
        const res = await send(srv, r, entry, c.fx ?? fx, c.cred);
        const label = `${routeKey(r)} [${c.column}] -> ${res.status} ${res.text.slice(0, 160)}`;
        if (res.status >= 400 && (typeof res.body !== "object" || typeof res.body?.error !== "string")) failures.push(`${label}: no {"error"} body`);
        if (c.expected === SERVED) {
          if (res.status === 501) unbuilt.add(routeKey(r));
          else if (res.status === 401 || res.status === 403 || res.status >= 500) failures.push(`${label}: expected to be served`);
        } else if (res.status !== c.expected) {
          // An owner check lives in the implementation: a route still answering 501 cannot make it yet.
          if (res.status === 501 && c.column === "another owner") {
            unbuilt.add(routeKey(r));
            ownerUnbuilt = true;
          } else failures.push(`${label}: expected ${c.expected}`);
        }
      }
    }
    expect(failures).toEqual([]);
  }, 120_000);

  afterAll(() => {
    if (unbuilt.size) console.info(`auth matrix: routes still answering 501: ${[...unbuilt].sort().join(", ")}`);
  });
});
