// `svc jobs logs -f --attempt N` for an attempt the job has not had: it says so while it waits, and
// when the job ends without it, exits 5 naming it, as `jobs logs --attempt N` without -f does (404).
// Before, it printed nothing and exited 0 when the job ended.
import { expect, it } from "vitest";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { tempDir, waitFor } from "../daemon/helpers.js";
import { finishJob, runningJob } from "./completed-job.js";
import { runSvc } from "./run-svc.js";

const srv = useTestServer();
const api = client(srv);

it("waits for an attempt not yet started, saying so, and exits 5 naming it when the job ends without it", { timeout: 120_000 }, async () => {
  const { env, jobId, provider } = await runningJob(srv);
  await api.post(`/api/jobs/${jobId}/logs`, { api_key: provider.key, logs: ["first attempt's line"] });
  let told = false;
  const followed = runSvc(["jobs", "logs", "-f", "--attempt", "2", jobId], {
    home: tempDir("svc-logs-wait"),
    env,
    limitMs: 60_000,
    onStderr: (e) => (told ||= e.includes("attempt 2 has not started yet (the job has had 1)")),
  });
  await waitFor(() => told, 30_000, "the notice that attempt 2 has not started");
  const done = await finishJob(srv, provider.key, jobId);
  expect(done.status, done.text).toBe(200);
  const r = await followed;
  expect(r.code, r.stderr).toBe(5);
  expect(r.stderr).toContain("attempt 2 does not exist (the job has 1)");
  expect(r.stdout).toBe(""); // the first attempt's line is not the one asked for
});

it("for an ended job: exits 5 at once with the same words as without -f", async () => {
  const { env, jobId, provider } = await runningJob(srv);
  expect((await finishJob(srv, provider.key, jobId)).status).toBe(200);
  const home = tempDir("svc-logs-ended");
  const followed = await runSvc(["jobs", "logs", "-f", "--attempt", "3", jobId], { home, env, limitMs: 60_000 });
  const read = await runSvc(["jobs", "logs", "--attempt", "3", jobId], { home, env });
  expect([followed.code, read.code]).toEqual([5, 5]);
  for (const r of [followed, read]) expect(r.stderr).toContain("attempt 3 does not exist (the job has 1)");
  expect(followed.stderr).not.toContain("has not started");
});
