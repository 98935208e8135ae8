// A provider running a legacy daemon of the field's 3.3-4.9 line (a stand-in,
// fixtures/field_daemon.py: string HMAC check, self-update on a newer
// check_only version) is given no job while it runs it, is told why, and the
// documented update route brings it onto our daemon, which completes a job.
// No job fails on the way.
import fs from "node:fs";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { HMAC_SECRET, useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { DAEMON_MIN_RELEASE, DAEMON_RELEASE } from "../../src/shared/daemon-release.js";
import { FIXTURES, start, tempDir, waitFor, writeExecutable, type Spawned } from "./helpers.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "500" });
let daemon: Spawned | undefined;
const api = () => client(srv.url);

// Registered after the server's: runs before it closes.
afterAll(async () => {
  daemon?.kill("SIGKILL");
  await daemon?.exited;
});

describe("a daemon of the field's legacy line", { timeout: 120_000 }, () => {
  it("gets no job until it has updated itself to our daemon through the update route, then runs one", async () => {
    const p = await makeProvider(srv, { online: false });
    const renter = await makeRenter(srv, 10_000);
    const dir = tempDir("field");
    const file = path.join(dir, "provider_daemon.py");
    fs.copyFileSync(path.join(FIXTURES, "field_daemon.py"), file);
    const smi = writeExecutable(
      dir,
      "nvidia-smi",
      `#!/bin/sh\ncase "$1" in\n  --query-gpu=*) cat '${path.join(FIXTURES, "nvidia-smi-query-2gpu.csv")}' ;;\n  *) cat '${path.join(FIXTURES, "nvidia-smi.txt")}' ;;\nesac\n`,
    );
    daemon = start("python3", [file, "--key", p.key, "--url", srv.url], {
      env: {
        FIELD_HMAC_SECRET: HMAC_SECRET,
        FIELD_UPDATE_SECONDS: "4",
        // For our daemon once it has replaced the stand-in (it keeps the environment).
        SVC_NVIDIA_SMI: smi, SVC_DOCKER: "none", SVC_WORK_DIR: path.join(dir, "work"), HOME: dir,
        SVC_HEARTBEAT_SECONDS: "1", SVC_POLL_SECONDS: "0.3", PYTHONDONTWRITEBYTECODE: "1",
      },
    });

    // While it runs the field's daemon: online and told to update, but not given jobs.
    const beat = await waitFor(async () => {
      const [r] = await srv.sql`SELECT daemon_version, status FROM providers WHERE id = ${p.id}`;
      return r.daemon_version === "4.9.0" ? r : undefined;
    }, 30_000, `field heartbeat (${daemon.output()})`);
    expect(beat.status).toBe("online");
    const me = await api().get("/api/providers/me", { "x-provider-key": p.key });
    expect(me.body.provider).toMatchObject({ daemon_version: "4.9.0", daemon_needs_update: true });
    const signals = await api().post("/api/providers/heartbeat", { api_key: p.key, daemon_version: "4.9.0" });
    expect(signals.body).toMatchObject({ needs_update: true, update_available: true, min_version: DAEMON_MIN_RELEASE });
    const admin = await api().get("/api/admin/providers", { "x-admin-token": srv.config.adminToken });
    expect(admin.body.providers.find((x: { id: number }) => x.id === p.id)).toMatchObject({ daemon_needs_update: true });
    const refused = await api().post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 } }, renter.headers);
    expect(refused.status, refused.text).toBe(503);

    // It updates itself to our daemon (the release this server ships, the provider's key and this server's URL baked in).
    await waitFor(async () => {
      const [r] = await srv.sql`SELECT daemon_version, legacy_task_secret FROM providers WHERE id = ${p.id}`;
      return r.daemon_version === DAEMON_RELEASE && r.legacy_task_secret === "provider" ? r : undefined;
    }, 60_000, `update to our daemon (${daemon.output()})`);
    const onDisk = fs.readFileSync(file, "utf8");
    expect(onDisk).toContain(`DAEMON_VERSION = "${DAEMON_RELEASE}"`);
    expect(onDisk).toContain(`API_KEY = "${p.key}"`);
    expect(onDisk).toContain(`BACKEND_URL = "${srv.url}"`);

    // Now it is given jobs, and runs one to the end.
    const submitted = await api().post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 } }, renter.headers);
    expect(submitted.status, submitted.text).toBe(201);
    const jobId = submitted.body.job.job_id as string;
    const done = await waitFor(async () => {
      const [r] = await srv.sql`SELECT status, error FROM jobs WHERE job_id = ${jobId}`;
      return ["completed", "failed", "cancelled"].includes(r.status) ? r : undefined;
    }, 60_000, `job end (${daemon.output()})`);
    expect(done.status, done.error ?? "").toBe("completed");
    const [failed] = await srv.sql`SELECT count(*)::int AS n FROM jobs WHERE renter_id = ${renter.id} AND status = 'failed'`;
    expect(failed.n).toBe(0);
    expect(daemon.output()).not.toMatch(/refused/);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});
