// `svc receipt` as a real subprocess: verify a receipt offline from files
// alone (no profile, no server), fail on a changed receipt or output (exit
// 6), and fetch receipts and keys with a profile or from a URL.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { tempDir } from "../daemon/helpers.js";
import { runSvc, type Run } from "./run-svc.js";


const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });

const svc = (args: string[], home: string, input = ""): Promise<Run> => runSvc(args, { home, input });

/** A completed job (over the legacy JSON protocol) and its renter. */
async function completedJob() {
  const api = client(srv.url);
  const renter = await makeRenter(srv, 10_000);
  const provider = await makeProvider(srv);
  const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2, provider_id: provider.id }, renter.headers);
  expect(sub.status, sub.text).toBe(201);
  const jobId: string = sub.body.job.job_id;
  await api.get(`/api/providers/${provider.key}/jobs`);
  const done = await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { scores: { gflops: 3.5 } } });
  expect(done.status, done.text).toBe(200);
  return { api, renter, jobId };
}

// Each svc run starts a Node process with the TypeScript loader: seconds each on a loaded machine.
describe("svc receipt", { timeout: 300_000 }, () => {
  it("verifies a receipt offline from files, and refuses a changed receipt or output", async () => {
    const api = client(srv.url);
    const renter = await makeRenter(srv, 10_000);
    const provider = await makeProvider(srv);
    const sub = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 2 }, renter.headers);
    const jobId = sub.body.job.job_id;
    await api.get(`/api/providers/${provider.key}/jobs`);
    await api.post("/api/providers/job-result", { api_key: provider.key, job_id: jobId, success: true, result: { scores: { gflops: 3.5 } } });

    const home = tempDir("svc-receipt");
    const file = path.join(home, "receipt.json");
    const keys = path.join(home, "keys.json");
    const output = path.join(home, "output.json");
    fs.writeFileSync(file, (await api.get(`/api/jobs/${jobId}/receipt`, renter.headers)).text);
    fs.writeFileSync(keys, (await api.get("/api/receipts/keys")).text);
    fs.writeFileSync(output, (await api.get(`/api/jobs/${jobId}/output`, renter.headers)).text);

    // No profile and no server needed: files only.
    const ok = await svc(["receipt", "verify", file, "--keys", keys, "--output", output], home);
    expect(ok.code, ok.stderr).toBe(0);
    expect(ok.stdout).toMatch(/ok\s+server signature: valid \(key srv-[0-9a-f]{16}\)/);
    expect(ok.stdout).toMatch(/provider attestation: none/);
    expect(ok.stdout).toMatch(/output: matches output_sha256/);
    expect(ok.stdout).toMatch(new RegExp(`of job ${jobId}: valid`));

    const changed = JSON.parse(fs.readFileSync(file, "utf8"));
    changed.receipt.billing.charged_halala += 1;
    const bad = path.join(home, "changed.json");
    fs.writeFileSync(bad, JSON.stringify(changed));
    const refused = await svc(["receipt", "verify", bad, "--keys", keys], home);
    expect(refused.code).toBe(6);
    expect(refused.stdout).toMatch(/FAIL the server's signature does not match the receipt/);
    expect(refused.stdout).toMatch(/NOT valid/);

    // The signed figure repeated after another one: JSON.parse keeps the signed one, a first-wins reader shows 9999.
    const text = fs.readFileSync(file, "utf8");
    const charged = JSON.parse(text).receipt.billing.charged_halala;
    const repeated = path.join(home, "repeated.json");
    fs.writeFileSync(repeated, text.replace(`"charged_halala":${charged}`, `"charged_halala":9999,"charged_halala":${charged}`));
    expect(fs.readFileSync(repeated, "utf8")).not.toBe(text);
    const twice = await svc(["receipt", "verify", repeated, "--keys", keys], home);
    expect(twice.code).toBe(6);
    expect(twice.stdout).toMatch(/FAIL the file names "charged_halala" twice in one object/);

    // A keys file whose key has no public_key: a problem, not a crash.
    const broken = JSON.parse(fs.readFileSync(keys, "utf8"));
    for (const k of broken.server_keys) delete k.public_key;
    const brokenKeys = path.join(home, "broken-keys.json");
    fs.writeFileSync(brokenKeys, JSON.stringify(broken));
    const noKey = await svc(["receipt", "verify", file, "--keys", brokenKeys], home);
    expect(noKey.code, noKey.stderr).toBe(6);
    expect(noKey.stdout).toMatch(/FAIL published server key srv-[0-9a-f]{16} does not match its id/);

    const otherOutput = path.join(home, "other-output.json");
    fs.writeFileSync(otherOutput, JSON.stringify({ scores: { gflops: 4 } }));
    const wrongOut = await svc(["--json", "receipt", "verify", file, "--keys", keys, "--output", otherOutput], home);
    expect(wrongOut.code).toBe(6);
    expect(JSON.parse(wrongOut.stdout)).toMatchObject({ valid: false, job_id: jobId, problems: ["the output does not match the receipt's output_sha256"] });

    expect((await svc(["receipt", "verify", path.join(home, "missing.json"), "--keys", keys], home)).code).toBe(2);

    // With a profile: get the receipt and the keys, verify against the server's published keys.
    expect((await svc(["login", "--url", srv.url], home, renter.key)).code).toBe(0);
    const got = await svc(["receipt", "get", jobId, "--out", "mine.json"], home);
    expect(got.code, got.stderr).toBe(0);
    expect(JSON.parse(fs.readFileSync(path.join(home, "mine.json"), "utf8"))).toEqual(JSON.parse(fs.readFileSync(file, "utf8")));
    const viaProfile = await svc(["--json", "receipt", "verify", "mine.json"], home);
    expect(viaProfile.code, viaProfile.stderr).toBe(0);
    expect(JSON.parse(viaProfile.stdout)).toMatchObject({ valid: true, job_id: jobId, problems: [] });
    // The output as its receipt hashes it, and verified with it.
    const saved = await svc(["receipt", "output", jobId, "--out", "out.json"], home);
    expect(saved.code, saved.stderr).toBe(0);
    expect(JSON.parse(fs.readFileSync(path.join(home, "out.json"), "utf8"))).toEqual({ scores: { gflops: 3.5 } });
    const withOutput = await svc(["--json", "receipt", "verify", "mine.json", "--output", "out.json"], home);
    expect(JSON.parse(withOutput.stdout)).toMatchObject({ valid: true, problems: [] });
    const k = await svc(["receipt", "keys", "--out", "k.json"], home);
    expect(k.code, k.stderr).toBe(0);
    const ids = (f: string) => JSON.parse(fs.readFileSync(f, "utf8")).server_keys.map((x: { key_id: string; public_key: string }) => [x.key_id, x.public_key]);
    expect(ids(path.join(home, "k.json"))).toEqual(ids(keys));

    // From a URL without any profile (a new home): the public keys route needs no key.
    const bare = tempDir("svc-receipt-bare");
    fs.copyFileSync(file, path.join(bare, "r.json"));
    const viaUrl = await svc(["receipt", "verify", "r.json", "--url", srv.url], bare);
    expect(viaUrl.code, viaUrl.stderr).toBe(0);
    // Another renter cannot fetch it.
    const stranger = await makeRenter(srv, 0);
    const other = tempDir("svc-receipt-other");
    await svc(["login", "--url", srv.url], other, stranger.key);
    expect((await svc(["receipt", "get", jobId], other)).code).toBe(3);
  });

  it("refuses an output file that names a member twice: a first-wins reader would show what was not hashed", async () => {
    const { api, renter, jobId } = await completedJob();
    const home = tempDir("svc-receipt-output-twice");
    fs.writeFileSync(path.join(home, "r.json"), (await api.get(`/api/jobs/${jobId}/receipt`, renter.headers)).text);
    fs.writeFileSync(path.join(home, "k.json"), (await api.get("/api/receipts/keys")).text);
    const text = (await api.get(`/api/jobs/${jobId}/output/result`, renter.headers)).text;
    fs.writeFileSync(path.join(home, "out.json"), text);
    const ok = await svc(["receipt", "verify", "r.json", "--keys", "k.json", "--output", "out.json"], home);
    expect(ok.code, ok.stdout + ok.stderr).toBe(0);
    // The hashed value last: JSON.parse keeps it, a reader keeping the first value shows 99.
    expect(text).toContain('"gflops":3.5');
    fs.writeFileSync(path.join(home, "twice.json"), text.replace('"gflops":3.5', '"gflops":99,"gflops":3.5'));
    const twice = await svc(["--json", "receipt", "verify", "r.json", "--keys", "k.json", "--output", "twice.json"], home);
    expect(twice.code, twice.stdout + twice.stderr).toBe(6);
    expect(JSON.parse(twice.stdout)).toMatchObject({ valid: false, problems: [expect.stringMatching(/the output file names "gflops" twice in one object/)] });
  });

  it("a receipt naming a key id the server would refuse is not valid (6), with the keys from a file or from the server", async () => {
    const { api, renter, jobId } = await completedJob();
    const home = tempDir("svc-receipt-odd-key-id");
    const file = JSON.parse((await api.get(`/api/jobs/${jobId}/receipt`, renter.headers)).text);
    fs.writeFileSync(path.join(home, "k.json"), (await api.get("/api/receipts/keys")).text);
    // Longer than the server takes as a key id (64 characters): not a value to refuse (2), a key not published.
    file.signature.key_id = `srv-${"a".repeat(80)}`;
    fs.writeFileSync(path.join(home, "r.json"), JSON.stringify(file));
    const offline = await svc(["receipt", "verify", "r.json", "--keys", "k.json"], home);
    expect(offline.code, offline.stdout + offline.stderr).toBe(6);
    const online = await svc(["--json", "receipt", "verify", "r.json", "--url", srv.url], home);
    expect(online.code, online.stdout + online.stderr).toBe(6);
    expect(JSON.parse(online.stdout)).toMatchObject({ valid: false, problems: expect.arrayContaining([expect.stringMatching(/is not among the published keys/)]) });
  });
});
