// The TypeScript daemon makes a job's image present before it accepts the
// job (docker image inspect, else docker pull): the pull is neither in the
// renter's billed time nor under the job's kill timer. A pull that fails, or
// has not finished within the daemon's wait (SVC_PREPARE_WAIT_SECONDS here,
// 25 minutes by default, under the server's 30-minute limit on preparing),
// hands the job back as the provider's (provider_refused: re-queued, nothing
// charged), and no container is run for it. While it waits, its JobPreparing
// notices keep the job assigned to it and tell the renter what it waits for.
// The tests whose pulls wait for the test share one daemon (keptDockerDaemon),
// whose fake docker forgets its images before each of them.
import fs from "node:fs";
import path from "node:path";
import { beforeEach, describe, expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { endedFirstAttempt, endedJob, waitFor } from "./helpers.js";
import { placeJobs, requeueLocked } from "../../src/domain/dispatch/dispatch.js";
import { cancelJob } from "../../src/domain/jobs/job-control.js";
import { startTestServer } from "../helpers/server.js";
import { dockerDaemon, keptDockerDaemon, useTsDaemonServer } from "./ts-harness.js";

const h = useTsDaemonServer();

const dockerProvider = (pull: "fail" | "gate", env: Record<string, string> = {}) => dockerDaemon(h, { docker: { images: "absent", pull }, env });
const firstAttempt = (jobId: string, what: string) => endedFirstAttempt(h.srv.sql, jobId, what);

type DockerProvider = Awaited<ReturnType<typeof dockerDaemon>>;

/**
 * A job on a docker provider whose image pull waits for the test (`pull-release`), once the daemon
 * has said it prepares it (a notice a second).
 */
async function preparingJob({ p, d, docker }: DockerProvider, command: string) {
  const renter = await makeRenter(h.srv, 10_000);
  const job = await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: [command] } });
  expect(job.provider_id).toBe(p.id);
  await waitFor(async () => (await h.job(job.job_id)).preparing_at, 15_000, `a preparing notice (${d.output()})`);
  return { p, d, docker, job };
}

describe("svc-daemon (TypeScript): the job's image", { timeout: 150_000 }, () => {
  it("hands the job back as the provider's, at no charge, when the pull fails or does not finish in time", async () => {
    // Time enough for the failing pull to fail on a loaded machine (each fake docker call is a Python start).
    const { p, d, docker } = await dockerProvider("fail", { SVC_PREPARE_WAIT_SECONDS: "5", SVC_PREPARE_NOTICE_SECONDS: "1" });
    const renter = await makeRenter(h.srv, 10_000);

    const failed = await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: ["true"] } });
    expect(failed.provider_id).toBe(p.id);
    const a = await firstAttempt(failed.job_id, `first attempt end (${d.output()})`);
    expect(a).toMatchObject({ status: "requeued", end_reason: "provider_refused", fault: "provider", cost_halala: 0 });
    expect(a.error).toMatch(/could not pull the job's image nvidia\/cuda:.*no such host/);

    // A registry that hangs: the job waits 5 s for it, then goes back (the pull goes on for the next job).
    fs.writeFileSync(path.join(docker.dir, "pull-mode"), "hang");
    const hung = await h.submit(renter, { job_type: "custom_container", duration_minutes: 1, max_duration_seconds: 60, params: { command: ["true"] } });
    expect(hung.provider_id).toBe(p.id);
    // Meanwhile the daemon says what it waits for (JobPreparing, every second here): the renter sees
    // it, and each notice keeps the job assigned to it on the server.
    const preparing = () => h.srv.sql`SELECT status, progress_phase, preparing_at FROM jobs WHERE job_id = ${hung.job_id}`.then((r) => r[0]);
    const first = await waitFor(async () => ((await preparing()).preparing_at ? preparing() : undefined), 15_000, `a preparing notice (${d.output()})`);
    expect(first).toMatchObject({ status: "pending", progress_phase: expect.stringMatching(/^preparing: pulling image nvidia\/cuda:/) });
    await waitFor(async () => (await preparing()).preparing_at > first.preparing_at || undefined, 5_000, `a second notice (${d.output()})`);
    const b = await firstAttempt(hung.job_id, `first attempt end (${d.output()})`);
    expect(b).toMatchObject({ status: "requeued", end_reason: "provider_refused", fault: "provider", cost_halala: 0 });
    expect(b.error).toMatch(/its pull had not finished/);
    expect(b.started_at).toBeNull();

    // No container ran for either.
    expect(docker.runs()).toEqual([]);
  });

  it("a pull that ends while the server is away: the job accepted then is started by the hello and runs on, whatever its held-over notices meet", async () => {
    // A daemon of its own: the reconnects that fail while the server is away lengthen its next ones.
    const { d, docker, job } = await preparingJob(await dockerProvider("gate", { SVC_PREPARE_NOTICE_SECONDS: "1" }), "wait");

    // The server goes away; notices pile up for the next connection, then the pull ends and the job is accepted (held over too).
    // The daemon finds the server gone no sooner than the drain's wait (at least a second: a notice's period) after it was told.
    await h.srv.app.close();
    await waitFor(() => /server is draining[^]*stream closed/.test(d.output()) || undefined, 15_000, `the server found gone (${d.output()})`);
    fs.writeFileSync(path.join(docker.dir, "pull-release"), "");
    await waitFor(() => docker.runs().length > 0 || undefined, 15_000, `the container started (${d.output()})`);
    h.srv = await startTestServer({ PORT: String(h.port), SVC_JOB_SWEEP_MS: "60000" }, h.srv.databaseUrl);
    // The hello names it: the job runs; the notices held over reach a running job and are refused; it runs on.
    await waitFor(async () => ((await h.job(job.job_id)).status === "running" ? true : undefined), 20_000, `running (${d.output()})`);
    await waitFor(() => d.output().includes(`server refused a report about ${job.job_id}: job ${job.job_id} is already running`) || undefined, 15_000, `a held-over notice refused (${d.output()})`);
    expect(d.output()).not.toContain(`job ${job.job_id} cancelled by the server`);
    docker.release(job.job_id);
    const done = await endedJob(h.srv.sql, job.job_id, `job end (${d.output()})`);
    expect(done.status, done.error).toBe("completed");
    await h.killDaemons();
  });

  describe("on one daemon whose pulls wait for the test (a notice a second)", () => {
    const k = keptDockerDaemon(h, { docker: { images: "absent", pull: "gate" }, env: { SVC_PREPARE_NOTICE_SECONDS: "1" } });
    // Each test finds no image on the host and the pull gate closed, and sees the docker calls made from its start.
    let from = 0;
    beforeEach(() => {
      k.docker.forgetPulls();
      from = k.docker.calls().length;
    });
    const provider = (): DockerProvider => {
      const calls = () => k.docker.calls().slice(from);
      return { ...k, docker: { ...k.docker, calls, runs: () => calls().filter((a) => a[0] === "run") } };
    };

    it("is pulled before the job is accepted: the pull's time is not the job's", async () => {
      const { p, d, docker } = provider();
      const renter = await makeRenter(h.srv, 10_000);
      const job = await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: ["true"] } });
      expect(job.provider_id).toBe(p.id);
      // The pull is under way (the daemon said so): the job is not running, and nothing of it is billed.
      await waitFor(async () => (await h.job(job.job_id)).preparing_at, 15_000, `a preparing notice (${d.output()})`);
      expect(await h.job(job.job_id)).toMatchObject({ status: "pending", started_at: null });
      expect(docker.runs()).toEqual([]);
      const [{ now: released }] = await h.srv.sql`SELECT now()`;
      fs.writeFileSync(path.join(docker.dir, "pull-release"), "");
      const done = await endedJob(h.srv.sql, job.job_id, `job end (${d.output()})`);
      expect(done.status, done.error).toBe("completed");
      // inspect (absent), pull, inspect/run: the pull before the container, and once.
      const verbs = docker.calls().map((a) => (a[0] === "image" ? `image ${a[1]}` : a[0]));
      expect(verbs.filter((v) => v === "pull")).toHaveLength(1);
      expect(verbs.indexOf("image inspect")).toBeLessThan(verbs.indexOf("pull"));
      expect(verbs.indexOf("pull")).toBeLessThan(verbs.indexOf("run"));
      // The job started running (billed time, max_duration_seconds) after the pull was let through.
      const attempts = await h.srv.sql`SELECT attempt, started_at >= ${released} AS after_pull FROM job_attempts WHERE job_id = ${done.id}`;
      expect(attempts).toEqual([{ attempt: 1, after_pull: true }]);

      // The image is here now: the next job of it pulls nothing.
      const again = await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: ["true"] } });
      expect((await endedJob(h.srv.sql, again.job_id, `second job end (${d.output()})`)).status).toBe("completed");
      expect(docker.calls().filter((c) => c[0] === "pull")).toHaveLength(1);
    });

    it("a refusal of an old attempt's notice, answered late, does not drop the new attempt of the job it prepares", async () => {
      const { p, d, docker } = provider();
      const renter = await makeRenter(h.srv, 10_000);
      const [x, y] = [
        await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: ["ok"] } }),
        await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: ["ok"] } }),
      ];
      expect([x.provider_id, y.provider_id]).toEqual([p.id, p.id]);
      for (const j of [x, y]) await waitFor(async () => (await h.job(j.job_id)).preparing_at, 15_000, `a preparing notice (${d.output()})`);
      // The stream's reports wait behind a notice about X (its row held here): Y's notices of attempt 1 queue up.
      let release!: () => void;
      const holding = new Promise<void>((resolve) => {
        void h.srv.sql.begin(async (tx) => {
          await tx`SELECT 1 FROM jobs WHERE job_id = ${x.job_id} FOR UPDATE`;
          resolve();
          await new Promise<void>((r) => (release = r));
        });
      });
      await holding;
      // A notice about X waits for the row; the ones after it, Y's among them (a notice a second), wait behind it.
      await waitFor(async () => {
        const [r] = await h.srv.sql`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`;
        return r.n > 0;
      }, 15_000, `a notice waiting for X's row (${d.output()})`);
      await new Promise((r) => setTimeout(r, 1_200));
      // Meanwhile Y is taken off the provider and placed back on it as attempt 2 (a cancel, then its push).
      await h.srv.sql.begin(async (tx) => {
        const [row] = await tx`SELECT * FROM jobs WHERE job_id = ${y.job_id} FOR UPDATE`;
        await requeueLocked(tx, row as never, "provider_silent", "taken off");
      });
      await placeJobs(h.srv.sql, [Number((await h.job(y.job_id)).id)]);
      expect(await h.job(y.job_id)).toMatchObject({ status: "pending", provider_id: p.id, attempt: 2 });
      await waitFor(() => d.output().includes(`job ${y.job_id} cancelled by the server`) || undefined, 10_000, `attempt 1 stopped (${d.output()})`);
      // The daemon prepares attempt 2 (it checks the image for it: the third check, after X's and attempt 1's).
      const inspects = () => docker.calls().filter((a) => a[0] === "image" && a[1] === "inspect").length;
      await waitFor(() => inspects() >= 3 || undefined, 15_000, `attempt 2 prepared (${d.output()})`);
      // The held-up notices of attempt 1 are refused now, while the pull for attempt 2 still waits: the
      // daemon hears a refusal (each would drop a job still being prepared) before the pull ends.
      release();
      await waitFor(() => d.output().includes(`server refused a report about ${y.job_id}: this preparing notice is for attempt 1`) || undefined, 15_000, `a late refusal (${d.output()})`);
      fs.writeFileSync(path.join(docker.dir, "pull-release"), "");
      const done = await endedJob(h.srv.sql, y.job_id, `Y's attempt 2 ends (${d.output()})`);
      expect(done).toMatchObject({ status: "completed", attempt: 2 });
    });

    it("a job assigned back to it as a new attempt while it was away mid-pull: the old run is dropped and the new attempt runs", async () => {
      const { p, d, docker, job } = await preparingJob(provider(), "ok");
      const connections = () => d.output().split("connected as provider").length - 1;
      const before = connections();

      // The server goes away mid-pull; meanwhile (another process, as the silence sweep would) the job is
      // taken off the provider and placed again: back on it, as attempt 2. No cancel reaches the daemon.
      await h.srv.app.close();
      await h.srv.sql.begin(async (tx) => {
        const [row] = await tx`SELECT * FROM jobs WHERE job_id = ${job.job_id} FOR UPDATE`;
        await requeueLocked(tx, row as never, "provider_silent", "taken off while its daemon was away");
      });
      await placeJobs(h.srv.sql, [Number((await h.job(job.job_id)).id)]);
      expect(await h.job(job.job_id)).toMatchObject({ status: "pending", provider_id: p.id, attempt: 2 });
      h.srv = await startTestServer({ PORT: String(h.port), SVC_JOB_SWEEP_MS: "60000" }, h.srv.databaseUrl);
      await waitFor(() => connections() > before || undefined, 30_000, `reconnected (${d.output()})`);
      fs.writeFileSync(path.join(docker.dir, "pull-release"), "");
      const done = await endedJob(h.srv.sql, job.job_id, `attempt 2 ends (${d.output()})`);
      expect(done).toMatchObject({ status: "completed", attempt: 2 });
      expect(docker.runs()).toHaveLength(1);
    });

    // Last: the original server process is gone afterwards.
    it("a reconnect while the image is pulled does not start the job (billed only from the accept after the pull), and drops one cancelled meanwhile", async () => {
      const { p, d, docker } = provider();
      const renter = await makeRenter(h.srv, 10_000);
      // Two jobs of the one image, one per GPU, both waiting for its pull.
      const job = await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: ["true"] } });
      const dropped = await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: ["echo", "dropped"] } });
      expect([job.provider_id, dropped.provider_id]).toEqual([p.id, p.id]);
      for (const j of [job, dropped]) await waitFor(async () => (await h.job(j.job_id)).preparing_at, 15_000, `a preparing notice (${d.output()})`);

      // The server goes away mid-pull; meanwhile the renter cancels the second job (through another
      // process, say: no cancel reaches this daemon). A new process takes the port: the daemon says hello again.
      await h.srv.app.close();
      await cancelJob(h.srv.sql, dropped.job_id, { role: "renter", renterId: renter.id });
      const again = await startTestServer({ PORT: String(h.port), SVC_JOB_SWEEP_MS: "60000" }, h.srv.databaseUrl);
      try {
        const row = async () => (await again.sql`SELECT status, started_at, preparing_at FROM jobs WHERE job_id = ${job.job_id}`)[0];
        const noticed = (await row()).preparing_at;
        // Reconnected: a notice reaches the new process, and the job is still pending, unbilled.
        await waitFor(async () => ((await row()).preparing_at > noticed ? true : undefined), 20_000, `a notice to the new process (${d.output()})`);
        expect(await row()).toMatchObject({ status: "pending", started_at: null });
        const [{ now: released }] = await again.sql`SELECT now()`;
        fs.writeFileSync(path.join(docker.dir, "pull-release"), "");
        const done = await endedJob(again.sql, job.job_id, `job end (${d.output()})`);
        expect(done.status, done.error).toBe("completed");
        // One attempt, started (billed) after the pull was let through.
        const attempts = await again.sql`SELECT a.attempt, a.started_at >= ${released} AS after_pull FROM job_attempts a JOIN jobs j ON j.id = a.job_id WHERE j.job_id = ${job.job_id}`;
        expect(attempts).toEqual([{ attempt: 1, after_pull: true }]);
        // The cancelled one: its notice to the new process was refused, and the daemon dropped it unrun.
        await waitFor(() => d.output().includes(`job ${dropped.job_id} cancelled by the server`) || undefined, 10_000, `the drop (${d.output()})`);
        expect(docker.runs().filter((argv) => argv.includes("dropped"))).toEqual([]);
        expect(docker.runs()).toHaveLength(1);
      } finally {
        await again.close();
      }
    });
  });
});
