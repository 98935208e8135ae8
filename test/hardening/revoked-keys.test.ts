// A key that worked and was then revoked (a renter's or a provider's rotation) is an invalid API key
// on every route that takes one: 401 {"error"}, on REST (every route of the table the server really
// serves, the key placed the documented way) and on Connect and gRPC (every method, through the
// generated clients). The `me` reads too: their documented 404 "not found" is for a key that no
// account was ever given, not for one its account revoked.
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import type { DescMethod, DescService } from "@bufbuild/protobuf";
import { beforeAll, describe, expect, it } from "vitest";
import { Role } from "../../gen/svc/v1/options_pb.js";
import { ProviderService } from "../../gen/svc/v1/providers_pb.js";
import { RenterService } from "../../gen/svc/v1/renters_pb.js";
import { buildRouteTable, type RestRoute } from "../../src/http/rest.js";
import { buildServices } from "../../src/services/index.js";
import { rolesOf } from "../../src/services/secure.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { fixtures, MATRIX, routeKey, send, WEBHOOK_SECRET, type Fx } from "./routes.js";

const srv = useTestServer({ PAYMENT_GATEWAY_WEBHOOK_SECRET: WEBHOOK_SECRET });
const api = client(srv);

let routes: RestRoute[];
let services: DescService[];
let fx: Fx;
/** Keys their accounts revoked by rotating (the accounts live on, with the keys the rotations issued). */
const revoked = { renter: "", provider: "" };

beforeAll(async () => {
  const built = buildServices(srv.app.deps);
  routes = buildRouteTable(built);
  services = built.map((s) => s.service);
  fx = await fixtures(srv);
  const r = await makeRenter(srv, 10_000);
  const p = await makeProvider(srv);
  const rr = await api.post("/api/renters/rotate-key", undefined, r.headers);
  const pr = await api.post("/api/providers/rotate-key", undefined, p.headers);
  expect(rr.status, rr.text).toBe(200);
  expect(pr.status, pr.text).toBe(200);
  revoked.renter = r.key;
  revoked.provider = p.key;
  // The keys worked before: the rotations answered with them. The new ones work now.
  expect((await api.get("/api/renters/me", { "x-renter-key": rr.body.api_key })).status).toBe(200);
  expect((await api.get("/api/providers/me", { "x-provider-key": pr.body.api_key })).status).toBe(200);
});

/** The key roles a method takes (public and admin-only methods take none). */
function keyRolesOf(method: DescMethod): ("renter" | "provider")[] {
  const roles = rolesOf(method);
  if (roles.includes(Role.PUBLIC)) return [];
  return [...(roles.includes(Role.RENTER) ? (["renter"] as const) : []), ...(roles.includes(Role.PROVIDER) ? (["provider"] as const) : [])];
}

describe("a revoked key", () => {
  it("is answered 401 {error} on every REST route that takes a key, the me reads included", async () => {
    const failures: string[] = [];
    let checked = 0;
    for (const r of routes) {
      const entry = MATRIX[routeKey(r)];
      if (!entry || entry.owner === "signature") continue;
      for (const role of keyRolesOf(r.method)) {
        const res = await send(srv, r, entry, fx, { kind: role, key: revoked[role] });
        checked++;
        const label = `${routeKey(r)} [revoked ${role} key] -> ${res.status} ${res.text.slice(0, 160)}`;
        if (res.status !== 401) failures.push(`${label}: expected 401`);
        else if (typeof res.body?.error !== "string" || !/invalid API key/.test(res.body.error)) failures.push(`${label}: expected {"error": "invalid API key..."}`);
      }
    }
    expect(failures).toEqual([]);
    expect(checked).toBeGreaterThan(40);
  }, 120_000);

  it("is 401 on the me reads in each documented place (header, query, path), while a key never issued stays 404", async () => {
    const reads: [string, Record<string, string>][] = [
      ["/api/renters/me", { "x-renter-key": revoked.renter }],
      [`/api/renters/me?key=${encodeURIComponent(revoked.renter)}`, {}],
      ["/api/providers/me", { "x-provider-key": revoked.provider }],
      [`/api/providers/me?key=${encodeURIComponent(revoked.provider)}`, {}],
      [`/api/providers/status/${encodeURIComponent(revoked.provider)}`, {}],
    ];
    for (const [path, headers] of reads) {
      const res = await api.get(path, headers);
      expect(res.status, `${path}: ${res.text}`).toBe(401);
      expect(res.body).toEqual({ error: expect.stringMatching(/^invalid API key/) });
    }
    const never = "svc-renter-" + "n".repeat(32);
    const unknown = await api.get("/api/renters/me", { "x-renter-key": never });
    expect(unknown.status).toBe(404);
    expect(unknown.body).toEqual({ error: expect.stringContaining("not found") });
    expect((await api.get(`/api/providers/status/svc-provider-${"n".repeat(32)}`)).status).toBe(404);
  });

  for (const wire of ["connect", "grpc"] as const) {
    it(`is unauthenticated on every ${wire} method that takes a key (generated clients)`, async () => {
      const transport: Transport =
        wire === "connect" ? createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1" }) : createGrpcTransport({ baseUrl: srv.url });
      const failures: string[] = [];
      let checked = 0;
      for (const service of services) {
        const c = createClient(service, transport) as unknown as Record<string, (req: unknown, opts: unknown) => unknown>;
        for (const method of service.methods) {
          // Daemon streams: the stream tests (test/daemon/stream-revocation.test.ts).
          if (method.methodKind === "bidi_streaming" || method.methodKind === "client_streaming") continue;
          for (const role of keyRolesOf(method)) {
            checked++;
            const label = `${service.typeName}.${method.name} [revoked ${role} key]`;
            const headers = { [`x-${role}-key`]: revoked[role] };
            try {
              const out = c[method.localName]({}, { headers, timeoutMs: 10_000 });
              if (method.methodKind === "server_streaming") for await (const _ of out as AsyncIterable<unknown>) break;
              else await out;
              failures.push(`${label}: answered`);
            } catch (err) {
              const e = ConnectError.from(err);
              if (e.code !== Code.Unauthenticated) failures.push(`${label}: ${Code[e.code]} ${e.rawMessage}`);
            }
          }
        }
      }
      expect(failures).toEqual([]);
      expect(checked).toBeGreaterThan(40);
    }, 120_000);
  }

  it("is unauthenticated on the me reads through the generated clients, a key never issued not_found", async () => {
    for (const transport of [createConnectTransport({ baseUrl: srv.url, httpVersion: "1.1" }), createGrpcTransport({ baseUrl: srv.url })]) {
      const renters = createClient(RenterService, transport);
      const providers = createClient(ProviderService, transport);
      const code = (p: Promise<unknown>) => p.then(() => "answered", (err: unknown) => Code[ConnectError.from(err).code]);
      expect(await code(renters.getMe({}, { headers: { "x-renter-key": revoked.renter } }))).toBe("Unauthenticated");
      expect(await code(providers.getMe({}, { headers: { "x-provider-key": revoked.provider } }))).toBe("Unauthenticated");
      expect(await code(providers.getStatus({ apiKey: revoked.provider }, { headers: { "x-provider-key": revoked.provider } }))).toBe("Unauthenticated");
      expect(await code(renters.getMe({}, { headers: { "x-renter-key": `svc-renter-${"n".repeat(32)}` } }))).toBe("NotFound");
    }
  });
});
