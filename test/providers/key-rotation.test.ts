// A provider rotates its key (POST /api/providers/rotate-key, an addition to the
// interface): every earlier key stops working on every route and wire at once,
// the daemon's stream is ended, the legacy task-signing secret moves to a new
// epoch, and the new key (with its installer) works.
import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { openStream } from "../daemon/grpc-stream.js";
import { gpuStatus } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
const api = client(srv);

describe("provider key rotation", () => {
  it("revokes every earlier key, ends its streams and answers a working key with its installer", async () => {
    const p = await makeProvider(srv);
    // A second live key, as login-email issues one.
    const [{ email }] = await srv.sql<{ email: string }[]>`SELECT email FROM providers WHERE id = ${p.id}`;
    const login = await api.post("/api/providers/login-email", { email });
    expect(login.status, login.text).toBe(200);
    const second: string = login.body.api_key;
    const epoch = async () => (await srv.sql<{ e: number }[]>`SELECT task_secret_epoch AS e FROM providers WHERE id = ${p.id}`)[0].e;
    const before = await epoch();

    const stream = openStream(srv.port, p.key);
    try {
      stream.send({ case: "hello", value: { daemonVersion: "5.2.1", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
      await stream.next("welcome");

      const r = await api.post("/api/providers/rotate-key", undefined, { "x-provider-key": second });
      expect(r.status, r.text).toBe(200);
      const fresh: string = r.body.api_key;
      expect(fresh).toMatch(/^svc-provider-/);
      expect([p.key, second]).not.toContain(fresh);
      expect(r.body).toMatchObject({ success: true, provider_id: p.id, installer_url: `/api/providers/installer?key=${encodeURIComponent(fresh)}&os=linux` });
      expect(r.body.message).toMatch(/shown only once/);

      // The daemon on the old key is disconnected.
      const ended = await stream.ended;
      expect(ended.code).toBeDefined();
      for (const old of [p.key, second]) {
        expect((await api.get("/api/providers/me", { "x-provider-key": old })).status).not.toBe(200);
        expect((await api.post("/api/providers/heartbeat", { api_key: old, gpu_status: gpuStatus() })).status).toBe(401);
        expect((await api.get(`/api/providers/${old}/jobs`)).status).not.toBe(200);
      }
      expect(await epoch()).toBe(before + 1);

      const me = await api.get("/api/providers/me", { "x-provider-key": fresh });
      expect(me.status, me.text).toBe(200);
      expect(me.body.provider.id).toBe(p.id);
      expect((await api.post("/api/providers/heartbeat", { api_key: fresh, gpu_status: gpuStatus() })).status).toBe(200);
      const installer = await api.get(r.body.installer_url);
      expect(installer.status).toBe(200);
      expect(installer.text).toContain(fresh);
    } finally {
      stream.cancel();
    }
  });

  it("needs a provider key", async () => {
    const none = await api.post("/api/providers/rotate-key", undefined);
    expect(none.status, none.text).toBe(400);
    expect(none.body.error).toBe("API key required");
    expect((await api.post("/api/providers/rotate-key", undefined, { "x-provider-key": "svc-provider-not-a-key" })).status).toBe(401);
  });

  it("rotations with one key at the same moment: the first wins, the second is refused, and the key handed out is the live one", async () => {
    const liveKeys = (column: "renter_id" | "provider_id", id: number) =>
      srv.sql<{ h: Buffer }[]>`SELECT key_hash AS h FROM api_keys WHERE ${srv.sql(column)} = ${id} AND revoked_at IS NULL`;
    const sha = (k: string) => createHash("sha256").update(k).digest("hex");
    // Each round is a fresh account rotated twice at once with its one key. Without the account's
    // key lock one round in a few left both new keys live; without the re-check under it the
    // second rotation revoked the key the first had just answered.
    const check = async (answers: { status: number; body: { api_key?: string } }[], column: "renter_id" | "provider_id", id: number) => {
      expect(answers.map((x) => x.status).sort()).toEqual([200, 401]);
      const won = answers.find((x) => x.status === 200)!;
      const live = await liveKeys(column, id);
      expect(live.map((k) => k.h.toString("hex"))).toEqual([sha(won.body.api_key!)]);
    };
    for (let round = 0; round < 6; round++) {
      const r = await makeRenter(srv);
      await check(await Promise.all([api.post("/api/renters/rotate-key", {}, r.headers), api.post("/api/renters/rotate-key", {}, r.headers)]), "renter_id", r.id);
      const p = await makeProvider(srv);
      await check(await Promise.all([api.post("/api/providers/rotate-key", { key: p.key }), api.post("/api/providers/rotate-key", { key: p.key })]), "provider_id", p.id);
    }
  });
});
