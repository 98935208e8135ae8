// A hello that does not name a job running here hands that job back (the
// daemon restarted and lost it): the attempt the server saw running, never a
// newer one the job moved to meanwhile (re-queued by an admin and assigned back
// to this provider while the hello's other jobs were being taken), which this
// daemon has not even been handed.
import { expect, it } from "vitest";
import { connect as connectDb } from "../../src/db/index.js";
import { ADMIN_TOKEN } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { openStream, useStreamServer } from "./grpc-stream.js";
import { waitFor } from "./helpers.js";

const { srv, streams } = useStreamServer();
const api = client(srv);

function connect(key: string, runningJobIds: string[] = [], runningJobAttempts: Record<string, number> = {}) {
  const s = openStream(srv.port, key);
  streams.push(s);
  s.send({ case: "hello", value: { daemonVersion: "5.0.0", runningJobIds, runningJobAttempts, gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } });
  return s;
}

it("hands back the attempt it saw running when a hello leaves the job out, not the newer attempt assigned back meanwhile", async () => {
  const p = await makeProvider(srv);
  await srv.sql`UPDATE providers SET gpu_count = 2, approved_gpu_count = 2 WHERE id = ${p.id}`;
  const renter = await makeRenter(srv, 1_000);
  const submit = async () => {
    // Pinned: re-queued, it comes back to this provider.
    const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 }, provider_id: p.id }, renter.headers);
    expect(r.status, r.text).toBe(201);
    return r.body.job.job_id as string;
  };
  const job = async (jobId: string) => (await srv.sql<{ status: string; attempt: number; provider_id: number | null }[]>`SELECT status, attempt, provider_id FROM jobs WHERE job_id = ${jobId}`)[0];

  // The daemon runs `lost`; it is handed `held` and accepts it, but the stream drops before the accept arrives.
  const lost = await submit();
  const s1 = connect(p.key);
  expect((await s1.next("job")).jobId).toBe(lost);
  s1.send({ case: "jobAccepted", value: { jobId: lost, attempt: 1 } });
  await waitFor(async () => (await job(lost)).status === "running", 5_000, "running");
  const held = await submit();
  expect((await s1.next("job")).jobId).toBe(held);
  s1.cancel();

  // It comes back naming `held` only (it lost `lost`). While the server takes `held` (held up here on
  // its row), an admin re-queues `lost`, which comes back to this provider as attempt 2.
  const locker = connectDb(srv.databaseUrl, 1);
  let release!: () => void;
  let locked!: () => void;
  const rowLocked = new Promise<void>((r) => (locked = r));
  const lock = locker.begin(async (tx) => {
    await tx`SELECT 1 FROM jobs WHERE job_id = ${held} FOR UPDATE`;
    locked();
    await new Promise<void>((r) => (release = r));
  });
  try {
    await rowLocked;
    const s2 = connect(p.key, [held], { [held]: 1 });
    await waitFor(async () => {
      const [{ n }] = await srv.sql<{ n: number }[]>`
        SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`;
      return n > 0;
    }, 5_000, "the hello's accept waiting on the row");
    const rq = await api.post(`/api/admin/jobs/${lost}/requeue`, { reason: "stuck" }, { "x-admin-token": ADMIN_TOKEN });
    expect(rq.status, rq.text).toBe(200);
    expect(await job(lost)).toMatchObject({ status: "pending", attempt: 2, provider_id: p.id });
    release();
    await lock;

    await s2.next("welcome");
    // Attempt 1 was no longer running: nothing is handed back, and attempt 2 is pushed to the daemon.
    await waitFor(async () => (await job(held)).status === "running", 5_000, "the held job accepted");
    const pushed = await s2.next("job");
    expect({ jobId: pushed.jobId, attempt: pushed.attempt }).toEqual({ jobId: lost, attempt: 2 });
    expect(await job(lost)).toMatchObject({ status: "pending", attempt: 2, provider_id: p.id });
    const attempts = await srv.sql`
      SELECT a.attempt, a.status, a.end_reason FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${lost} ORDER BY a.attempt`;
    expect(attempts).toEqual([
      { attempt: 1, status: "requeued", end_reason: "admin_requeued" },
      { attempt: 2, status: expect.not.stringMatching(/requeued|failed/), end_reason: null },
    ]);
    s2.cancel();
  } finally {
    release?.();
    await lock.catch(() => {});
    await locker.end();
  }
});
