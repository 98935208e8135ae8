// svc sends a submit or a top-up again when its answer never came, with the
// same Idempotency-Key (its own when none is given): the server answers what
// the first one did, so a connection lost after the server did the work
// makes neither a second job (and hold) nor a second credit, and svc ends as
// the first try would have. The proxy in front of the real server passes
// every request on and cuts the connection where the server's answer begins
// (its first HEADERS frame), for the first connection only.
import { afterEach, describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { tempDir } from "../daemon/helpers.js";
import { frameProxy, type FrameProxy } from "./proxy.js";
import { runSvc } from "./run-svc.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });

/** Passes HTTP/2 through; on its first `cutConnections` connections, closes both sides once the server starts an answer. */
const cutFirstAnswers = (cutConnections = 1): Promise<FrameProxy> =>
  frameProxy(srv.port, (connection) =>
    connection > cutConnections
      ? undefined
      : // HEADERS (type 1) on a request's stream: the answer begins; it never reaches svc.
        (frame) => (frame[3] === 1 && frame.readUInt32BE(5) !== 0 ? "cut" : "pass"),
  );

let proxy: FrameProxy | undefined;
afterEach(async () => {
  await proxy?.close();
  proxy = undefined;
});

describe("svc and an answer lost on the way back", { timeout: 120_000 }, () => {
  it("submit: sent again with the same key, it answers the one job submitted, held once; exit 0", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    proxy = await cutFirstAnswers();
    const r = await runSvc(["--json", "submit", "benchmark", "--duration", "2", "--provider", String(provider.id)], {
      home: tempDir("svc-resend"),
      env: { SVC_URL: proxy.url, SVC_KEY: renter.key },
    });
    expect(proxy.cuts()).toBe(1);
    expect(r.stderr).toMatch(/^svc: no answer to the submit \(.+\); sending it again with the same idempotency key…$/m);
    expect(r.code, r.stderr).toBe(0);
    const answered = JSON.parse(r.stdout);
    const jobs = await srv.sql`SELECT job_id FROM jobs WHERE renter_id = ${renter.id}`;
    expect(jobs.map((j) => j.job_id)).toEqual([answered.job.job_id]);
    const [held] = await srv.sql`SELECT coalesce(sum(amount), 0)::int AS n FROM ledger_holds WHERE renter_id = ${renter.id}`;
    expect(held.n).toBe(answered.job.cost_halala);
  });

  it("topup: the payment made once and credited once; exit 0", async () => {
    const renter = await makeRenter(srv);
    proxy = await cutFirstAnswers();
    const r = await runSvc(["topup", "--sar", "12.5"], { home: tempDir("svc-resend"), env: { SVC_URL: proxy.url, SVC_KEY: renter.key } });
    expect(proxy.cuts()).toBe(1);
    expect(r.stderr).toMatch(/^svc: no answer to the top-up \(.+\); sending it again with the same idempotency key…$/m);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/paid, 12\.50 SAR added; balance 1250 halala/);
    const payments = await srv.sql`SELECT status, amount_halala FROM payments WHERE renter_id = ${renter.id}`;
    expect(payments).toEqual([{ status: "paid", amount_halala: 1250 }]);
  });

  it("no answer at all: a few tries, then exit 4 naming the key that gets the answer later", async () => {
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    proxy = await cutFirstAnswers(100);
    const args = ["submit", "benchmark", "--duration", "2", "--provider", String(provider.id)];
    const r = await runSvc(args, { home: tempDir("svc-resend"), env: { SVC_URL: proxy.url, SVC_KEY: renter.key } });
    expect(proxy.cuts()).toBe(4);
    expect(r.code, r.stderr).toBe(4);
    const key = /^svc: the submit may have been done: send it again with --idempotency-key (\S+) to get its answer/m.exec(r.stderr)?.[1];
    expect(key, r.stderr).toBeDefined();
    expect(r.stderr).toMatch(/^svc: server unreachable: /m);
    // The server did it once (the first try); with the key, its answer comes, and no second job.
    const again = await runSvc(["--json", ...args, "--idempotency-key", key!], { home: tempDir("svc-resend"), env: { SVC_URL: srv.url, SVC_KEY: renter.key } });
    expect(again.code, again.stderr).toBe(0);
    const jobs = await srv.sql`SELECT job_id FROM jobs WHERE renter_id = ${renter.id}`;
    expect(jobs.map((j) => j.job_id)).toEqual([JSON.parse(again.stdout).job.job_id]);
  });
});
