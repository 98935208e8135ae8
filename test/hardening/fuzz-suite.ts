// Fuzzing every JSON route with fast-check: malformed, oversized, wrongly
// typed and boundary values in the body, query and path, sent with a valid
// credential so they reach the implementation. Properties: never a 5xx
// (501 for routes still being built, 503 for the documented "unavailable"
// answers aside), a 4xx always carries exactly {"error": string}, and a
// rejected request leaves every table as it was.
import fc from "fast-check";
import { ScalarType, type DescField } from "@bufbuild/protobuf";
import { beforeAll, describe, expect, it } from "vitest";
import { buildRouteTable, type RestRoute } from "../../src/http/rest.js";
import { buildServices } from "../../src/services/index.js";
import type { Reply } from "../helpers/http.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";
import { fixtures, MATRIX, routeKey, routeOwnerCred, send, WEBHOOK_SECRET, type Fx, type Overrides } from "./routes.js";

/** Defines the fuzz tests for the routes `pick` selects (the suite is split over files to run in parallel). */
export function defineFuzzSuite(name: string, pick: (r: RestRoute) => boolean): void {
let routes: RestRoute[];
let fx: Fx;

// Background sweeps slowed down: the fingerprint must only see what a request did.
const srv = useTestServer({ PAYMENT_GATEWAY_WEBHOOK_SECRET: WEBHOOK_SECRET, SVC_JOB_SWEEP_MS: "60000" });
beforeAll(async () => {
  routes = buildRouteTable(buildServices(srv.app.deps));
  fx = await fixtures(srv);
});

/** A hash of every table's rows (the rate-limit counters, migrations and the platform's 5-second pulse aside), "table:hash|..." */
let fingerprintQuery: string | undefined;
async function fingerprint(): Promise<string> {
  if (!fingerprintQuery) {
    const tables = await srv.sql<{ t: string }[]>`
      SELECT tablename AS t FROM pg_tables WHERE schemaname = 'public' AND tablename NOT IN ('rate_limits', 'schema_migrations', 'platform_pulse') ORDER BY 1`;
    const parts = tables.map(({ t }) => `(SELECT '${t}:' || coalesce(md5(string_agg(md5(x::text), '' ORDER BY md5(x::text))), '') FROM "${t}" x)`);
    fingerprintQuery = `SELECT concat_ws('|', ${parts.join(", ")}) AS h`;
  }
  const [row] = await srv.sql.unsafe<{ h: string }[]>(fingerprintQuery);
  return row.h;
}
let quietCalls = 0;

/**
 * Lets background work an accepted request left behind finish (the
 * heartbeat flusher writes every 250 ms), so that it is not blamed on the
 * next, rejected request: until the tables read the same twice 350 ms apart
 * (a loaded machine may take a few periods), for 10 s at most.
 */
async function quiet(): Promise<string> {
  quietCalls++;
  const until = Date.now() + 10_000;
  let last = await fingerprint();
  for (;;) {
    await new Promise((r) => setTimeout(r, 350));
    const now = await fingerprint();
    if (now === last || Date.now() > until) return now;
    last = now;
  }
}

/** The tables whose rows differ between two fingerprints. */
function changedTables(a: string, b: string): string[] {
  const after = new Set(b.split("|"));
  return a.split("|").filter((x) => !after.has(x)).map((x) => x.split(":")[0]);
}

const deep = (depth: number): unknown => (depth === 0 ? 1 : { a: deep(depth - 1) });
const HOSTILE_TEXT = ["", " ", "NaN", "Infinity", "-1", "1e999", "0x1F", "' OR 1=1 --", "\u0000", "😀😀", "../../etc/passwd", "<script>x</script>", "%00", "null"];
const NUMBERS = [-1, 0, 1, 0.5, -0.0001, 2 ** 31, 2 ** 53, 2 ** 63, 1e308, -1e308, Number.MAX_SAFE_INTEGER + 2];

const hostile: fc.Arbitrary<unknown> = fc.oneof(
  fc.constant(null),
  fc.boolean(),
  fc.constantFrom(...HOSTILE_TEXT),
  fc.string({ maxLength: 30 }),
  fc.constant("x".repeat(70_000)),
  fc.constantFrom(...NUMBERS),
  fc.integer(),
  fc.double(),
  fc.array(fc.oneof(fc.integer(), fc.string({ maxLength: 5 })), { maxLength: 4 }),
  fc.dictionary(fc.string({ maxLength: 6 }), fc.oneof(fc.integer(), fc.string({ maxLength: 6 })), { maxKeys: 3 }),
  fc.constant(deep(200)),
);

/** Values aimed at one field: its own type at the edges, or anything at all. */
function fieldValue(f: DescField): fc.Arbitrary<unknown> {
  const scalar = f.fieldKind === "scalar" ? f.scalar : undefined;
  const own =
    scalar === ScalarType.STRING
      ? fc.oneof(fc.string({ maxLength: 40 }), fc.constantFrom(...HOSTILE_TEXT))
      : scalar === ScalarType.BOOL
        ? fc.boolean()
        : scalar !== undefined
          ? fc.oneof(fc.integer({ min: -5, max: 5000 }), fc.constantFrom(...NUMBERS))
          : hostile;
  return fc.oneof(own, hostile);
}

function textOf(v: unknown): string {
  return typeof v === "string" ? v : JSON.stringify(v) ?? "";
}

/** A request for a route: body members, query parameters and path values drawn from its request message. */
function requestArb(r: RestRoute): fc.Arbitrary<Overrides> {
  const fields = r.method.input.fields;
  const body = fc.oneof(
    { weight: 6, arbitrary: fc.dictionary(fc.constantFrom(...fields.map((f) => f.name), "unexpected_field"), fc.constant(0), { maxKeys: 4 }).chain((keys) =>
      fc.record(Object.fromEntries(Object.keys(keys).map((k) => [k, fieldValue(fields.find((f) => f.name === k) ?? fields[0] ?? ({} as DescField))]))),
    ) },
    { weight: 1, arbitrary: hostile },
    { weight: 1, arbitrary: fc.constantFrom("{not json", "[1,2", '"just a string"', "", "\u0000") },
  );
  const query = fields.length
    ? fc.dictionary(fc.constantFrom(...fields.map((f) => f.name)), fc.oneof(fc.constantFrom(...HOSTILE_TEXT), fc.string({ maxLength: 10 }), fc.constantFrom(...NUMBERS.map(String))), { maxKeys: 3 })
    : fc.constant({});
  const path = r.params.length
    ? fc.record(Object.fromEntries(r.params.filter((p) => p !== "api_key").map((p) => [p, fc.oneof(fc.constantFrom("0", "-1", "abc", "9".repeat(30), "1.5", "%", "job-x"), fc.string({ minLength: 1, maxLength: 12 }))])), { requiredKeys: [] })
    : fc.constant({});
  return fc.record({ body, query, path }).map((o) => ({
    body: r.httpMethod === "GET" ? undefined : o.body,
    query: o.query as Record<string, string>,
    path: o.path as Record<string, string>,
  }));
}

function checkReply(label: string, res: Reply, failures: string[]) {
  if (res.status >= 500 && res.status !== 501 && res.status !== 503) failures.push(`${label}: ${res.status} ${res.text.slice(0, 200)}`);
  if (res.status >= 400) {
    const ok = res.body && typeof res.body === "object" && Object.keys(res.body).join() === "error" && typeof res.body.error === "string" && res.body.error.length > 0;
    if (!ok) failures.push(`${label}: ${res.status} body is not {"error": string}: ${res.text.slice(0, 200)}`);
  }
}

const jsonRoutes = () => routes.filter((r) => MATRIX[routeKey(r)] && r.method.output.typeName !== "svc.v1.RawBody" && pick(r));

describe(`fuzzing every JSON route: ${name}`, () => {
  it("never answers 5xx, always {error} on 4xx, and changes nothing when it rejects", async () => {
    const failures: string[] = [];
    let rejected = 0;
    let dirty = true;
    let current: string | undefined;
    for (const r of jsonRoutes()) {
      const entry = MATRIX[routeKey(r)];
      const cred = routeOwnerCred(r, fx, ADMIN_TOKEN);
      await fc.assert(
        fc.asyncProperty(requestArb(r), async (o) => {
          // The state before: the last one seen, unless an accepted request may have left work behind.
          const before = dirty || current === undefined ? await quiet() : current;
          const res = await send(srv, r, entry, fx, cred, o);
          const label = `${routeKey(r)} ${textOf(o).slice(0, 300)}`;
          checkReply(label, res, failures);
          current = await fingerprint();
          // A write may leave background work behind; a read only if it changed something itself (a daemon's poll).
          dirty = res.status < 400 && (r.httpMethod !== "GET" || current !== before);
          if (res.status >= 400) {
            rejected++;
            if (current !== before) failures.push(`${label}: rejected with ${res.status} but changed ${changedTables(before, current).join(", ")}`);
          }
        }),
        // CI runs a fixed, small sample; FUZZ_RUNS / FUZZ_SEED widen it for a local soak.
        { numRuns: Number(process.env.FUZZ_RUNS ?? 8), seed: process.env.FUZZ_SEED ? Number(process.env.FUZZ_SEED) : 7 },
      );
    }
    console.info(`fuzz: ${rejected} rejected requests checked, ${quietCalls} waits for quiet`);
    expect(failures).toEqual([]);
    expect(rejected).toBeGreaterThan(50);
  }, 120_000);

  it("answers 413 with {error} for a body over the route's limit, and 4xx for deeply nested or NUL-carrying JSON", async () => {
    const failures: string[] = [];
    const nested = (depth: number) => "[".repeat(depth) + "]".repeat(depth);
    for (const r of jsonRoutes().filter((x) => x.httpMethod !== "GET")) {
      const entry = MATRIX[routeKey(r)];
      const cred = { kind: "admin", token: ADMIN_TOKEN } as const;
      for (const body of [`{"params":${nested(20_000)}}`, `{"details":{"a":${nested(5_000)}},"job_id":"x"}`, '{"name":"a\\u0000b","event_type":"x\\u0000"}']) {
        const fp = await fingerprint();
        const res = await send(srv, r, entry, fx, cred, { body });
        checkReply(`${routeKey(r)} ${body.slice(0, 40)}`, res, failures);
        if (res.status >= 400 && (await fingerprint()) !== fp) failures.push(`${routeKey(r)} ${body.slice(0, 40)} changed the database`);
      }
      const big = { pad: "x".repeat(r.bodyLimitBytes + 10) };
      const before = await fingerprint();
      const res = await send(srv, r, entry, fx, { kind: "admin", token: ADMIN_TOKEN }, { body: big });
      checkReply(`${routeKey(r)} oversized`, res, failures);
      if (res.status !== 413) failures.push(`${routeKey(r)} oversized -> ${res.status}`);
      if ((await fingerprint()) !== before) failures.push(`${routeKey(r)} oversized changed the database`);
    }
    expect(failures).toEqual([]);
  }, 60_000);
});
}
