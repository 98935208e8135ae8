// What a renter's webhook receives for each way a job ends, through a running server (and two
// servers sharing one database, each with its own outbox worker), with a real loopback receiver:
// each ending arrives once, with the job's own figures.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../helpers/server.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { credit } from "../../src/domain/money/ledger.js";
import { makeProvider } from "../helpers/fixtures.js";
import { pickUp } from "../jobs/helpers.js";

/** A webhook receiver on loopback that answers 200 and keeps each body. */
function receiver() {
  const hits: { body: string }[] = [];
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      hits.push({ body });
      res.writeHead(200).end();
    });
  });
  return {
    hits,
    async listen() {
      await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
      return `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`;
    },
    close: () => {
      server.closeAllConnections();
      return new Promise<void>((r) => server.close(() => r()));
    },
  };
}

let a: TestServer;
let b: TestServer;
const rx = receiver();
let hookUrl: string;

beforeAll(async () => {
  hookUrl = await rx.listen();
  a = await startTestServer();
  // A second process on the same database (its own pool, its own outbox worker).
  b = await startTestServer({}, a.databaseUrl);
});
afterAll(async () => {
  await b?.app.close();
  await b?.sql.end();
  await a?.close();
  await rx.close();
});

describe("job endings as webhooks", () => {
  it("each ending arrives once with the job's own figures, with two servers sharing the database", async () => {
    const api = client(a.url);
    const reg = await api.post("/api/renters/register", { name: "Hooked", email: uniqueEmail("hooked"), webhook_url: hookUrl });
    expect(reg.status, reg.text).toBe(201);
    const headers = { "x-renter-key": reg.body.api_key as string };
    await a.sql.begin((tx) => credit(tx, reg.body.renter_id, 100_000, `test-fund:${Date.now()}`));
    const prov = await makeProvider(a);

    // 1: completed
    const j1 = (await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, provider_id: prov.id }, headers)).body.job;
    // 2: queued behind it, cancelled while queued
    const j2 = (await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, provider_id: prov.id }, headers)).body.job;
    expect((await pickUp(api, prov.key))?.job_id).toBe(j1.job_id);
    const done = await api.post("/api/providers/job-result", { api_key: prov.key, job_id: j1.job_id, success: true, result: { scores: {} } });
    expect(done.status, done.text).toBe(200);
    const c = await api.post(`/api/jobs/${j2.job_id}/cancel`, {}, headers);
    expect(c.status, c.text).toBe(200);
    // 3: the renter's own failure
    const j3 = (await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, provider_id: prov.id }, headers)).body.job;
    expect((await pickUp(api, prov.key))?.job_id).toBe(j3.job_id);
    const failed = await api.post("/api/providers/job-result", { api_key: prov.key, job_id: j3.job_id, success: false, error: "boom", end_reason: "runtime_error", fault: "renter" });
    expect(failed.status, failed.text).toBe(200);

    const ids = [j1.job_id, j2.job_id, j3.job_id];
    await expect.poll(() => new Set(rx.hits.map((h) => JSON.parse(h.body).data.job_id)).size, { timeout: 10_000 }).toBe(3);
    await new Promise((r) => setTimeout(r, 1500));
    for (const id of ids) {
      const job = (await api.get(`/api/jobs/${id}`, headers)).body;
      const hits = rx.hits.filter((h) => JSON.parse(h.body).data.job_id === id);
      expect(hits.length, `${id} delivered ${hits.length} times`).toBe(1);
      const body = JSON.parse(hits[0].body);
      expect(body.event).toBe(`job.${job.status}`);
      expect(body.data).toMatchObject({
        job_id: id,
        status: job.status,
        actual_cost_halala: job.actual_cost_halala,
        end_reason: job.end_reason,
        fault: job.fault,
      });
    }
  });
});
