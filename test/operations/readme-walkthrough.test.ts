// README.md's walkthrough run as written: its shell block, taken from the document, run by bash
// with curl against a real server (only BASE and the admin token T point at the test server), so
// that a body the document sends cannot drift from what the server accepts.
import { execFile } from "node:child_process";
import fs from "node:fs";
import { describe, expect, it } from "vitest";
import { client } from "../helpers/http.js";
import { ADMIN_TOKEN, useTestServer } from "../helpers/server.js";

const srv = useTestServer();
const api = client(srv);
const admin = { "x-admin-token": ADMIN_TOKEN };

/** The first ```sh block of README.md's "## Walkthrough" section. */
function walkthroughScript(): string {
  const readme = fs.readFileSync("README.md", "utf8");
  const section = readme.slice(readme.indexOf("\n## Walkthrough\n"));
  const m = /```sh\n([\s\S]*?)\n```/.exec(section);
  if (!m) throw new Error("README.md: no shell block in the Walkthrough section");
  return m[1];
}

/** Runs the walkthrough against the test server; resolves to the variables it set, and what it printed. */
function runWalkthrough(): Promise<{ vars: Record<string, string>; stdout: string; stderr: string }> {
  let script = walkthroughScript();
  const setBase = /^BASE=.*$/m;
  const setToken = /^T=\$\(node -pe .*\).*$/m;
  expect(script).toMatch(setBase);
  expect(script).toMatch(setToken);
  script = script.replace(setBase, `BASE=${srv.url}`).replace(setToken, `T=${ADMIN_TOKEN}`);
  const names = ["RK", "RID", "PK", "PROV", "JOB_ID"];
  script = `set -eo pipefail\n${script}\necho\n${names.map((n) => `echo "::${n}=$${n}"`).join("\n")}\n`;
  return new Promise((resolve, reject) => {
    execFile("bash", ["-c", script], { timeout: 60_000 }, (err, stdout, stderr) => {
      if (err) return reject(new Error(`the walkthrough failed (${err.message}):\n${stdout}\n${stderr}`));
      const vars = Object.fromEntries([...stdout.matchAll(/^::(\w+)=(.*)$/gm)].map((v) => [v[1], v[2]]));
      resolve({ vars, stdout, stderr });
    });
  });
}

describe("README walkthrough", () => {
  it("runs as written: the renter pays, the provider comes online with its GPU's memory, the job completes and settles", async () => {
    const { vars } = await runWalkthrough();
    for (const n of ["RK", "RID", "PK", "PROV", "JOB_ID"]) expect(vars[n], n).toMatch(/\S/);
    const renter = { "x-renter-key": vars.RK };

    // Step 3's heartbeat declares the GPU (spec: gpu_status.gpu_name, gpu_count, gpu_vram_mib).
    const list = await api.get("/api/admin/providers?limit=200", admin);
    const provider = list.body.providers.find((p: { id: number }) => p.id === Number(vars.PROV));
    expect(provider).toMatchObject({ gpu_count_reported: 1, gpu_vram_mib: 24564, gpu_vram_mib_approved: 24564 });

    // Steps 4 and 5: the job completed with the result the provider reported.
    const output = await api.get(`/api/jobs/${vars.JOB_ID}/output`, renter);
    expect(output.status, output.text).toBe(200);
    expect(output.body.response).toBe("Hi!");

    // Step 6: the operator's credit went through the ledger, audited.
    const audit = await api.get("/api/admin/audit?limit=20", admin);
    expect(JSON.stringify(audit.body)).toContain("goodwill credit");

    // The provider the walkthrough brought online takes a job that needs 16 GB of its 24564 MiB.
    const sub = await api.post(
      "/api/jobs/submit",
      { job_type: "llm-inference", duration_minutes: 5, params: { prompt: "Hello" }, gpu_requirements: { min_vram_gb: 16 } },
      renter,
    );
    expect(sub.status, sub.text).toBe(201);
    expect(sub.body.job.provider_id).toBe(Number(vars.PROV));
  }, 90_000);
});
