// The stream daemon pins each server's task-signing key in a file of its own,
// so one state folder serves several servers; a server that presents another
// key at the same address (its database recreated) is refused at connect: the
// daemon exits non-zero naming --trust-new-server-key, the server keeps the
// provider out of dispatch with the reason (me, status, admin lists) and
// assigns it no job, and a daemon started with the flag clears it.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { ADMIN_TOKEN, startTestServer, type TestServer } from "../helpers/server.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { freePort, tempDir, waitFor } from "./helpers.js";
import { useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();
const ADMIN = { "x-admin-token": ADMIN_TOKEN };

async function daemonUp(srv: TestServer, providerId: number) {
  await waitFor(async () => (await srv.sql`SELECT readiness_status FROM providers WHERE id = ${providerId}`)[0].readiness_status, 45_000, "daemon up");
}

describe("svc-daemon (TypeScript) server key pinning", { timeout: 120_000 }, () => {
  it("pins per server, refuses a changed key at connect (provider kept out of dispatch), and --trust-new-server-key clears it", async () => {
    const state = path.join(tempDir("keys"), "state");
    // Server A (the shared one): pinned on first contact.
    const pa = await makeProvider(h.srv);
    const a = h.startDaemon(pa.key, [], {}, { stateDir: state });
    await daemonUp(h.srv, pa.id);
    expect(await h.stopDaemon(a)).toBe(0);

    // Server B at another address, same state folder: its own pin, it works.
    const portB = await freePort();
    const urlB = `http://127.0.0.1:${portB}`;
    let b: TestServer | undefined = await startTestServer({ PORT: String(portB), SVC_JOB_SWEEP_MS: "60000" });
    try {
      const pb = await makeProvider(b);
      const d = h.startDaemon(pb.key, [], {}, { url: urlB, stateDir: state });
      await daemonUp(b, pb.id);
      expect(await h.stopDaemon(d)).toBe(0);
      expect(fs.readdirSync(path.join(state, "server-keys")).sort()).toEqual([`http_127.0.0.1_${h.port}`, `http_127.0.0.1_${portB}`].sort());
      await b.close();
      b = undefined;

      // B again at the same address with its database recreated: a new key.
      b = await startTestServer({ PORT: String(portB), SVC_JOB_SWEEP_MS: "60000" });
      const srvB = b;
      const p = await makeProvider(srvB);
      const renter = await makeRenter(srvB, 1_000);
      const bench = { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 } };
      // Assigned while the provider looked fine: the refused connect sends it back to the queue.
      const early = await client(srvB.url).post("/api/jobs/submit", bench, renter.headers);
      expect(early.status, early.text).toBe(201);
      expect(early.body.job.provider_id).toBe(p.id);
      const refused = h.startDaemon(p.key, [], {}, { url: urlB, stateDir: state });
      expect(await refused.exited, refused.output()).toBe(78);
      expect(refused.output()).toMatch(/signs tasks with another key/);
      expect(refused.output()).toMatch(/--trust-new-server-key/);
      expect(refused.output()).not.toMatch(/connected as provider/);

      const me = await client(srvB.url).get("/api/providers/me", p.headers);
      expect(me.status).toBe(200);
      expect(me.body.provider.task_key_mismatch).toMatch(/pinned another task-signing key.*--trust-new-server-key/);
      const status = await client(srvB.url).get(`/api/providers/status/${p.key}`, p.headers);
      expect(status.body.task_key_mismatch).toBe(me.body.provider.task_key_mismatch);
      const listed = await client(srvB.url).get("/api/admin/providers", ADMIN);
      expect(listed.body.providers.find((x: { id: number }) => x.id === p.id).task_key_mismatch).toBe(me.body.provider.task_key_mismatch);
      const [event] = await srvB.sql`SELECT severity FROM daemon_events WHERE provider_id = ${p.id} AND event_type = 'task_signing_key_mismatch'`;
      expect(event?.severity).toBe("critical");

      // Approved and heartbeating (makeProvider), yet no job goes to it: the only provider, so 503.
      const [back] = await srvB.sql`SELECT status, provider_id FROM jobs WHERE job_id = ${early.body.job.job_id}`;
      expect(back).toEqual({ status: "queued", provider_id: null });
      const submit = await client(srvB.url).post("/api/jobs/submit", bench, renter.headers);
      expect(submit.status, submit.text).toBe(503);
      expect((await srvB.sql`SELECT count(*)::int AS n FROM jobs WHERE provider_id = ${p.id}`)[0].n).toBe(0);

      // The operator checked the key: the flag pins it and the provider takes work again.
      const trusted = h.startDaemon(p.key, ["--trust-new-server-key"], {}, { url: urlB, stateDir: state });
      await daemonUp(srvB, p.id);
      expect(trusted.output()).toMatch(/pinned the new task-signing key/);
      await waitFor(async () => (await client(srvB.url).get("/api/providers/me", p.headers)).body.provider.task_key_mismatch === null, 10_000, "mismatch cleared");
      const job = await client(srvB.url).post("/api/jobs/submit", bench, renter.headers);
      expect(job.status, job.text).toBe(201);
      for (const jobId of [early.body.job.job_id, job.body.job.job_id]) {
        const done = await waitFor(async () => {
          const [r] = await srvB.sql`SELECT * FROM jobs WHERE job_id = ${jobId}`;
          return r.status === "completed" || r.status === "failed" ? r : undefined;
        }, 45_000, `job end (${trusted.output()})`);
        expect(done.status, done.error).toBe("completed");
        expect(done.provider_id).toBe(p.id);
      }
      expect(await h.stopDaemon(trusted)).toBe(0);
      expect(await ledgerProblems(srvB.sql)).toEqual([]);

      // The new pin holds: a plain restart connects.
      const again = h.startDaemon(p.key, [], {}, { url: urlB, stateDir: state });
      await waitFor(() => /connected as provider/.test(again.output()), 30_000, "reconnected with the new pin");
      expect(await h.stopDaemon(again)).toBe(0);
    } finally {
      await h.killDaemons();
      await b?.close();
    }
  });

  it("takes a key pinned by an older version (one file for every server) as this server's pin", async () => {
    const state = path.join(tempDir("keys"), "state");
    fs.mkdirSync(state, { recursive: true });
    // Another server's key, from the time one file served every server.
    fs.writeFileSync(path.join(state, "server-task-key"), Buffer.alloc(32, 7).toString("base64") + "\n");
    const p = await makeProvider(h.srv);
    const d = h.startDaemon(p.key, [], {}, { stateDir: state });
    expect(await d.exited, d.output()).toBe(78);
    expect(d.output()).toMatch(/server-task-key/);
    const [row] = await h.srv.sql`SELECT task_key_mismatch FROM providers WHERE id = ${p.id}`;
    expect(row.task_key_mismatch).toMatch(/--trust-new-server-key/);
  });
});
