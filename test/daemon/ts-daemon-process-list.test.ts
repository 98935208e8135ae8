// The TypeScript daemon keeps secrets out of the process list (`ps`, /proc/<pid>/cmdline), which every
// user of the host can read: it is documented to take the provider key from SVC_API_KEY or a key file
// (--key-file, refused unless only its owner may read it, as svc keeps its profiles), and --key and
// --hmac-secret, still accepted, say on stderr that they are not private. While a custom_container job
// with env secrets runs on the fake docker, the argv of the daemon and of every process it spawns is
// sampled, along with its output, and searched for the key, the HMAC secret and the renter's values.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { configFromArgs, USAGE } from "../../src/daemon/ts/cli.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { HMAC_SECRET } from "../helpers/server.js";
import { findSecrets, rnd } from "../hardening/secret-search.js";
import { FIXTURES, fakeDocker, endedJob, start, tempDir, waitFor, writeExecutable } from "./helpers.js";
import { useTsDaemonServer } from "./ts-harness.js";
import { cmdline, descendants } from "./procs.js";

const h = useTsDaemonServer();

/** configFromArgs without docker or GPUs (quick), its log lines collected. */
async function config(args: string[], env: NodeJS.ProcessEnv = {}) {
  const lines: string[] = [];
  const cfg = await configFromArgs(["--url", "http://127.0.0.1:9", "--docker", "none", "--nvidia-smi", "/nonexistent/nvidia-smi", ...args], env, (l) => lines.push(l));
  return { cfg, lines };
}

function secretFile(text: string, mode: number): string {
  const file = path.join(tempDir("tsd-secret-file"), "secret");
  fs.writeFileSync(file, text, { mode });
  fs.chmodSync(file, mode);
  return file;
}

describe("svc-daemon (TypeScript): secrets and the process list", { timeout: 150_000 }, () => {
  it("documents starting it with the key in SVC_API_KEY or a file, never on its command line", () => {
    const starts = USAGE.split("\n").filter((l) => /^\s+(\S+=\S+ )*(npx )?svc-daemon\b/.test(l));
    expect(starts.length).toBeGreaterThan(1);
    for (const line of starts) expect(line).not.toMatch(/--key\b(?!-file)|--hmac-secret\b(?!-file)|svc-provider-/);
    expect(USAGE).toMatch(/SVC_API_KEY/);
    expect(USAGE).toMatch(/--key-file PATH/);
  });

  it("started with SVC_API_KEY, as documented, shows no key in its argv", async () => {
    const p = await makeProvider(h.srv);
    const d = h.startDaemon(p.key);
    await waitFor(() => cmdline(d.pid).length > 0, 5_000);
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, `daemon up (${d.output()})`);
    expect(cmdline(d.pid)).toContain("bin/svc-daemon.js");
    expect(cmdline(d.pid)).not.toContain(p.key);
    expect(d.output()).not.toMatch(/warning/);
  });

  it("reads the key from --key-file (which wins over SVC_API_KEY), connects, and shows no key in its argv", async () => {
    const p = await makeProvider(h.srv);
    const file = secretFile(`${p.key}\n`, 0o600);
    const d = h.startDaemon("svc-provider-not-this-one", ["--key-file", file]);
    await waitFor(async () => (await h.srv.sql`SELECT readiness_status FROM providers WHERE id = ${p.id}`)[0].readiness_status, 45_000, `daemon up (${d.output()})`);
    expect(cmdline(d.pid)).toContain(`--key-file ${file}`);
    expect(cmdline(d.pid)).not.toContain(p.key);
    expect(d.output()).not.toContain(p.key);
  });

  it("refuses a key file other users may read or write, or that is not one key alone", async () => {
    for (const mode of [0o644, 0o640, 0o604, 0o620]) {
      const file = secretFile("svc-provider-k\n", mode);
      await expect(config(["--key-file", file]), mode.toString(8)).rejects.toThrow(`chmod 600 ${file}`);
    }
    await expect(config(["--key-file", secretFile("\n", 0o600)])).rejects.toThrow(/is empty/);
    await expect(config(["--key-file", secretFile("svc-provider-a svc-provider-b\n", 0o600)])).rejects.toThrow(/alone, on one line/);
    await expect(config(["--key-file", tempDir("tsd-key-dir")])).rejects.toThrow(/not a regular file/);
    await expect(config(["--key-file", "/nonexistent/key"])).rejects.toThrow(/cannot read \/nonexistent\/key: ENOENT/);
    await expect(config(["--key", "svc-provider-k", "--key-file", secretFile("svc-provider-k", 0o600)])).rejects.toThrow(/both given/);
    // The file's content is never part of a refusal.
    await expect(config(["--key-file", secretFile("svc-provider-FILESECRET other", 0o600)])).rejects.not.toThrow(/FILESECRET/);
    // Its owner's alone: 0600 or 0400; SVC_KEY_FILE works as --key-file does.
    expect((await config(["--key-file", secretFile(" svc-provider-k1\n", 0o400)])).cfg.key).toBe("svc-provider-k1");
    expect((await config([], { SVC_KEY_FILE: secretFile("svc-provider-k2", 0o600) })).cfg.key).toBe("svc-provider-k2");
    expect((await config([], { SVC_API_KEY: "svc-provider-env", SVC_KEY_FILE: secretFile("svc-provider-k3", 0o600) })).cfg.key).toBe("svc-provider-env");
    const hmac = await config(["--hmac-secret-file", secretFile("hmac-from-file\n", 0o600)], { SVC_API_KEY: "svc-provider-k" });
    expect(hmac.cfg.hmacSecret).toBe("hmac-from-file");
    await expect(config(["--hmac-secret-file", secretFile("h", 0o644)], { SVC_API_KEY: "svc-provider-k" })).rejects.toThrow(/chmod 600/);
  });

  it("still takes --key and --hmac-secret, warning that every user of the host can read them", async () => {
    const { cfg, lines } = await config(["--key", "svc-provider-argv", "--hmac-secret", "hmac-argv"]);
    expect(cfg.key).toBe("svc-provider-argv");
    expect(cfg.hmacSecret).toBe("hmac-argv");
    expect(lines.filter((l) => /warning: --key .*every user of this host can read/.test(l))).toHaveLength(1);
    expect(lines.filter((l) => /warning: --hmac-secret .*every user of this host can read/.test(l))).toHaveLength(1);
    expect(lines.join("\n")).not.toMatch(/svc-provider-argv|hmac-argv/);
    const quiet = await config([], { SVC_API_KEY: "svc-provider-env", SVC_HMAC_SECRET: "hmac-env" });
    expect(quiet.lines.filter((l) => /warning/.test(l))).toEqual([]);
    // The daemon writes it to its stderr.
    const withArgv = start(process.execPath, ["bin/svc-daemon.js", "--url", "not a url", "--key", "svc-provider-argv"], {});
    await withArgv.exited;
    expect(withArgv.output()).toMatch(/warning: --key puts a secret in this process's arguments/);
  });

  it("keeps key, HMAC secret and a renter's env values out of every spawned process's argv and out of the daemon's output", async () => {
    const p = await makeProvider(h.srv);
    const docker = fakeDocker(tempDir("tsd-ps-docker"));
    const dir = tempDir("tsd-ps");
    const smi = writeExecutable(dir, "nvidia-smi", `#!/bin/sh\ncase "$1" in\n  --query-gpu=*) cat '${path.join(FIXTURES, "nvidia-smi-query-2gpu.csv")}' ;;\n  -L) echo 'GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-5c7e4b6a)' ;;\n  *) cat '${path.join(FIXTURES, "nvidia-smi.txt")}' ;;\nesac\n`);
    const d = start(process.execPath, ["bin/svc-daemon.js", "--docker", docker.path, "--nvidia-smi", smi, "--state-dir", path.join(dir, "state"), "--heartbeat-seconds", "1", "--stop-grace-seconds", "1"], {
      env: { CUDA_VISIBLE_DEVICES: undefined, SVC_URL: `http://127.0.0.1:${h.port}`, SVC_API_KEY: p.key, SVC_HMAC_SECRET: HMAC_SECRET },
    });
    await waitFor(async () => {
      const [r] = await h.srv.sql`SELECT gpu_count, readiness_status FROM providers WHERE id = ${p.id}`;
      return r.gpu_count === 2 && r.readiness_status;
    }, 45_000, `daemon up (${d.output()})`);
    const renter = await makeRenter(h.srv, 100_000);
    const secret = `ENVSECRET${rnd()}`;
    const job = await h.submit(renter, { job_type: "custom_container", duration_minutes: 2, params: { command: ["wait"], env: { API_TOKEN: secret, PASSWORD: `pw${secret}` } } });
    const seen = new Map<number, string>();
    const sample = () => {
      for (const [pid, argv] of descendants(d.pid)) seen.set(pid, argv);
    };
    const sampler = setInterval(sample, 20);
    try {
      await waitFor(() => docker.containers().find((c) => c.labels["svc.job_id"] === job.job_id && c.running), 45_000, `container running (${d.output()})`);
      sample();
      await h.api().post(`/api/jobs/${job.job_id}/cancel`, {}, renter.headers).catch(() => undefined);
      docker.release(job.job_id);
      await endedJob(h.srv.sql, job.job_id, `job end (${d.output()})`).catch(() => undefined);
      await new Promise((r) => setTimeout(r, 500));
    } finally {
      clearInterval(sampler);
      d.kill("SIGKILL");
      await d.exited;
    }
    const secrets = { providerKey: p.key, hmac: HMAC_SECRET, envValue: secret, renterKey: renter.key };
    const argvs = [...seen.entries()].map(([pid, a]) => `${pid}: ${a}`).join("\n");
    expect(seen.size).toBeGreaterThan(1);
    expect(findSecrets(secrets, { "descendant argv": argvs, "docker calls": JSON.stringify(docker.calls()), "daemon output": d.output() })).toEqual([]);
  });
});
