// Named operator tokens (SVC_OPERATOR_TOKENS): each works as the admin token
// does, and the audit log records whose token did what; SVC_ADMIN_TOKEN's calls
// are recorded as "admin". A token is compared in full, and a malformed list
// is refused at start, naming the problem.
import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../../src/config.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { ADMIN } from "./helpers.js";

const ALICE = "alice-token-0123456789abcdef";
const BOB = "bob-token-fedcba9876543210xyz";
const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_OPERATOR_TOKENS: ` alice:${ALICE}, bob.ops:${BOB}` });
const api = client(srv);

const actions = (targetType: string, targetId: number) =>
  srv.sql<{ actor: string; action: string }[]>`SELECT actor, action FROM audit_log WHERE target_type = ${targetType} AND target_id = ${String(targetId)} ORDER BY id`;

describe("operator tokens", () => {
  it("each works as the admin token, and the audit log names whose it was", async () => {
    const renter = await makeRenter(srv, 1_000);
    const provider = await makeProvider(srv);
    const alice = { "x-admin-token": ALICE };
    const bob = { authorization: `Bearer ${BOB}` };
    expect((await api.post(`/api/admin/renters/${renter.id}/suspend`, { reason: "chargeback" }, alice)).status).toBe(200);
    expect((await api.post(`/api/admin/renters/${renter.id}/unsuspend`, { reason: "resolved" }, bob)).status).toBe(200);
    expect((await api.post(`/api/admin/providers/${provider.id}/suspend`, { reason: "overheating" }, bob)).status).toBe(200);
    expect((await api.post(`/api/admin/providers/${provider.id}/unsuspend`, { reason: "fixed" }, ADMIN)).status).toBe(200);
    expect(await actions("renter", renter.id)).toEqual(expect.arrayContaining([
      { actor: "alice", action: expect.stringMatching(/suspend/) },
      { actor: "bob.ops", action: expect.stringMatching(/unsuspend/) },
    ]));
    const byProvider = (await actions("provider", provider.id)).filter((a) => /suspend/.test(a.action));
    expect(byProvider.map((a) => a.actor)).toEqual(["bob.ops", "admin"]);
    // The audit route shows them too.
    const listed = await api.get(`/api/admin/audit?limit=200`, alice);
    expect(listed.status).toBe(200);
    expect(listed.body.entries.map((e: any) => e.actor)).toEqual(expect.arrayContaining(["alice", "bob.ops", "admin"]));
  });

  it("reads /metrics, as the admin token does", async () => {
    for (const headers of [{ authorization: `Bearer ${ALICE}` }, { "x-admin-token": BOB }] as Record<string, string>[]) {
      const r = await fetch(`${srv.url}/metrics`, { headers });
      expect(r.status).toBe(200);
      expect(await r.text()).toMatch(/^# HELP /m);
    }
    expect((await fetch(`${srv.url}/metrics`, { headers: { authorization: `Bearer ${ALICE}x` } })).status).toBe(401);
  });

  it("refuses a token that is one of them cut short or extended, and renter keys", async () => {
    for (const token of [ALICE.slice(0, -1), `${BOB}x`, "alice", `alice:${ALICE}`]) {
      const r = await api.get("/api/admin/dashboard", { "x-admin-token": token });
      expect([token, r.status]).toEqual([token, 401]);
    }
    const renter = await makeRenter(srv, 0);
    expect((await api.get("/api/admin/dashboard", renter.headers)).status).toBe(401);
  });
});

describe("SVC_OPERATOR_TOKENS", () => {
  const load = (v: string) => loadConfig({ SVC_ADMIN_TOKEN: "admin-token-0123456789", SVC_HMAC_SECRET: "hmac-secret-0123456789", SVC_OPERATOR_TOKENS: v, DATABASE_URL: "postgres://x" });
  it("reads name:token pairs and refuses a malformed list, naming why", () => {
    expect(load(`a:${ALICE},b-2:${BOB}`).operatorTokens).toEqual([{ name: "a", token: ALICE }, { name: "b-2", token: BOB }]);
    expect(load("").operatorTokens).toEqual([]);
    for (const [bad, why] of [
      [ALICE, /name:token pairs/],
      [`a b:${ALICE}`, /name:token pairs/],
      [`a:short`, /token of a must be at least 16/],
      [`a:${ALICE},a:${BOB}`, /names a twice/],
      [`a:${ALICE},b:${ALICE}`, /another operator's/],
      [`a:admin-token-0123456789`, /another operator's/],
      [`admin:${ALICE}`, /SVC_ADMIN_TOKEN's/],
    ] as const) {
      expect(() => load(bad), bad).toThrow(ConfigError);
      expect(() => load(bad), bad).toThrow(why);
    }
  });
});
