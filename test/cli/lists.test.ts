// svc's lists as a real subprocess against a real server: every list (`jobs
// ls`, `provider jobs`, `admin providers|renters|jobs|audit`) pages with
// --limit and --offset (the job lists also with their --before cursor), says which rows of how many it printed, and carries
// total, limit and offset in its --json answer.
import { describe, expect, it } from "vitest";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";
import { ADMIN, seedJob } from "../admin/helpers.js";
import { runSvc, type Run } from "./run-svc.js";

const srv = useTestServer();

const svc = (args: string[], env: Record<string, string>): Promise<Run> => runSvc(args, { env });

async function json(args: string[], env: Record<string, string>) {
  const r = await svc(["--json", ...args], env);
  expect(r.code, `${args.join(" ")}: ${r.stderr}`).toBe(0);
  return JSON.parse(r.stdout);
}

// Each svc run starts a Node process: seconds each on a loaded machine.
describe("svc lists", { timeout: 180_000 }, () => {
  it("jobs ls and provider jobs page with --offset and say which of how many", async () => {
    const renter = await makeRenter(srv, 100_000);
    // Offline: the job sweep would otherwise place the seeded queued jobs on it while the lists are read.
    const provider = await makeProvider(srv, { online: false });
    for (let i = 0; i < 25; i++) await seedJob(srv, { renterId: renter.id, status: "queued", cost: 10 });
    for (let i = 0; i < 3; i++) await seedJob(srv, { renterId: renter.id, providerId: provider.id, status: "running", cost: 10 });
    const env = { SVC_URL: srv.url, SVC_KEY: renter.key };

    const first = await svc(["jobs", "ls", "--status", "queued"], env);
    expect(first.code, first.stderr).toBe(0);
    expect(first.stdout).toMatch(/^JOB\s+TYPE\s+STATUS\s+PROGRESS\s+COST \(halala\)\s+SUBMITTED$/m);
    const all = await json(["jobs", "ls", "--status", "queued", "--limit", "25"], env);
    const ids = all.jobs.map((j: { job_id: string }) => j.job_id);
    // The next page is offered by its cursor, which reaches past the server's largest offset.
    expect(first.stdout.trimEnd().split("\n").at(-1)).toBe(`1-20 of 25 (--before ${ids[19]} for more)`);
    const after = await svc(["jobs", "ls", "--status", "queued", "--before", ids[19]], env);
    expect(after.code, after.stderr).toBe(0);
    expect(after.stdout.trimEnd().split("\n").at(-1)).toBe(`5 of 25, after ${ids[19]}`);
    expect(await json(["jobs", "ls", "--status", "queued", "--before", ids[19]], env)).toMatchObject({ jobs: all.jobs.slice(20) });
    const full = await svc(["jobs", "ls", "--status", "queued", "--limit", "2", "--before", ids[19]], env);
    expect(full.stdout.trimEnd().split("\n").at(-1)).toBe(`2 of 25, after ${ids[19]} (--before ${ids[21]} for more)`);
    const rest = await svc(["jobs", "ls", "--status", "queued", "--offset", "20"], env);
    expect(rest.code, rest.stderr).toBe(0);
    expect(rest.stdout.trimEnd().split("\n").at(-1)).toBe("21-25 of 25");
    const past = await svc(["jobs", "ls", "--status", "queued", "--offset", "30"], env);
    expect(past.stdout).toMatch(/\(none\)\nnone of 25 \(past --offset 30\)\n$/);

    const page = await json(["jobs", "ls", "--status", "queued", "--offset", "20"], env);
    expect(page).toMatchObject({ total: 25, limit: 20, offset: 20 });
    expect(page.jobs).toHaveLength(5);
    expect(page.jobs.map((j: { job_id: string }) => j.job_id)).toEqual(all.jobs.slice(20).map((j: { job_id: string }) => j.job_id));

    const penv = { SVC_URL: srv.url, SVC_KEY: provider.key };
    const runs = await svc(["provider", "jobs", "--limit", "2", "--offset", "1"], penv);
    expect(runs.code, runs.stderr).toBe(0);
    expect(runs.stdout).toMatch(/^JOB\s+TYPE\s+STATUS\s+EARNED \(halala\)\s+SUBMITTED$/m);
    expect(runs.stdout.trimEnd().split("\n").at(-1)).toBe("2-3 of 3");
    expect(await json(["provider", "jobs", "--offset", "2"], penv)).toMatchObject({ total: 3, offset: 2, jobs: [expect.anything()] });
  });

  it("admin providers, renters, jobs and audit page with --offset and say which of how many", async () => {
    const env = { SVC_URL: srv.url, SVC_ADMIN_TOKEN: ADMIN_TOKEN };
    const api = client(srv.url);
    for (let i = 0; i < 3; i++) {
      const p = await makeProvider(srv, { approved: false });
      expect((await api.post(`/api/admin/providers/${p.id}/approve`, {}, ADMIN)).status).toBe(200);
      const r = await makeRenter(srv, 1_000);
      await seedJob(srv, { renterId: r.id, status: "queued", cost: 10 });
    }
    const lists: [string, string][] = [
      ["providers", "providers"],
      ["renters", "renters"],
      ["jobs", "jobs"],
      ["audit", "entries"],
    ];
    for (const [cmd, rows] of lists) {
      const all = await json(["admin", cmd, "--limit", "200"], env);
      expect(all.total, cmd).toBeGreaterThanOrEqual(3);
      expect(all[rows], cmd).toHaveLength(all.total);
      const second = await json(["admin", cmd, "--limit", "1", "--offset", "1"], env);
      expect(second, cmd).toMatchObject({ total: all.total, limit: 1, offset: 1 });
      expect(second[rows], cmd).toEqual([all[rows][1]]);
      const table = await svc(["admin", cmd, "--limit", "1", "--offset", "1"], env);
      expect(table.code, table.stderr).toBe(0);
      expect(table.stdout.trimEnd().split("\n").at(-1), cmd).toBe(`2-2 of ${all.total} (--offset 2 for more)`);
    }
  });
});
