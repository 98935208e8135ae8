// Secrets stay out of what the server writes and answers: the real built server
// (dist/src/main.js) at LOG_LEVEL=trace, driven over HTTP (REST, Connect, /v1)
// through a whole workflow with known secrets, keys in URL paths as sent and
// percent-encoded among them; every captured byte (its log, its answers, /metrics,
// its tables, what it sends out) is searched for them and their encodings.
import crypto from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { freshDatabase } from "../helpers/server.js";
import { connect, type Sql } from "../../src/db/index.js";
import { providerTaskSecret } from "../../src/domain/accounts/provider-secret.js";
import { findSecrets, receiver, rnd, spawnServer, type Receiver, type SpawnedServer } from "./secret-search.js";
import { startFakeVllm, type FakeVllm } from "../v1/fake-vllm.js";

const ADMIN_TOKEN = `ADMTOK${rnd()}`;
const OPERATOR_TOKEN = `OPTOK${rnd()}`;
const HMAC = `HMACSEC${rnd()}`;
const GATEWAY_KEY = `sk_test_PGKEY${rnd()}`;
const GATEWAY_WEBHOOK = `PGWHSEC${rnd()}`;
const EMAIL_KEY = `re_EMAILKEY${rnd()}`;
const METRICS_TOKEN = `METRICSTOK${rnd()}`;
const ENV_SECRET = `ENVSECRET${rnd()}`;
const ENV_SECRET2 = `hf_ENVTOKEN${rnd()}`;
const ENDPOINT_KEY = `EPKEY${rnd()}`;
const MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";

let db: { url: string; drop(): Promise<void> };
let srv: SpawnedServer;
let sql: Sql;
let email: Receiver;
let gateway: Receiver;
let hook: Receiver;
let vllm: FakeVllm;

/** Secrets learnt while driving the server (keys it issued, codes it mailed, …). */
const learnt: Record<string, string> = {};
/** What the server answered (bodies of error paths, etc.), for the "error messages" sink. */
const answers: string[] = [];
/** Answers that are allowed to carry a secret (a key issued to its owner, an installer): not searched. */
let metricsText = "";
let installerUrls = "";

async function call(method: string, path: string, body?: unknown, headers: Record<string, string> = {}, record = true) {
  const init: RequestInit = { method, headers: { ...headers } };
  if (body !== undefined) {
    init.body = typeof body === "string" ? body : JSON.stringify(body);
    (init.headers as Record<string, string>)["content-type"] ??= "application/json";
  }
  const res = await fetch(srv.url + path, { ...init, redirect: "manual" });
  const text = await res.text();
  // The request line is not recorded (it holds what the test sent): only what the server answered.
  const whole = `${method} -> ${res.status} ${[...res.headers].map(([k, v]) => `${k}: ${v}`).join("; ")}\n${text}`;
  if (record) answers.push(whole);
  let parsed: any = text;
  try {
    parsed = JSON.parse(text);
  } catch {}
  return { status: res.status, body: parsed, text, headers: res.headers };
}

beforeAll(async () => {
  db = await freshDatabase();
  email = await receiver();
  gateway = await receiver((r) =>
    r.url.startsWith("/v1/invoices") ? { status: 200, body: { id: `inv_${rnd(6)}`, url: `https://checkout.example/inv`, status: "initiated", amount: JSON.parse(r.body).amount, currency: "SAR" } } : { status: 404, body: {} },
  );
  hook = await receiver();
  vllm = await startFakeVllm("sweep", "ok", { apiKey: ENDPOINT_KEY });
  srv = await spawnServer({
    DATABASE_URL: db.url,
    SVC_ADMIN_TOKEN: ADMIN_TOKEN,
    SVC_OPERATOR_TOKENS: `alice:${OPERATOR_TOKEN}`,
    SVC_HMAC_SECRET: HMAC,
    PAYMENT_GATEWAY_SECRET_KEY: GATEWAY_KEY,
    PAYMENT_GATEWAY_WEBHOOK_SECRET: GATEWAY_WEBHOOK,
    PAYMENT_GATEWAY_URL: gateway.url,
    EMAIL_API_KEY: EMAIL_KEY,
    EMAIL_API_URL: email.url,
    SVC_METRICS_TOKEN: METRICS_TOKEN,
    SVC_JOB_SWEEP_MS: "500",
  });
  sql = connect(db.url, 2);
}, 120_000);

afterAll(async () => {
  await srv?.stop();
  await sql?.end();
  await email?.close();
  await gateway?.close();
  await hook?.close();
  await vllm?.close();
  await db?.drop();
});

const codeOf = (mail: { body: string }) => /code is (\d{6})/.exec(JSON.parse(mail.body).text)![1];

async function waitFor<T>(fn: () => Promise<T | undefined | false | null> | T | undefined | false | null, ms = 20_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("secrets through the whole server workflow", { timeout: 180_000 }, () => {
  it("drives the workflow", async () => {
    const ADMIN = { "x-admin-token": ADMIN_TOKEN };
    const OPER = { authorization: `Bearer ${OPERATOR_TOKEN}` };

    // --- accounts
    const renterEmail = `sweep.renter.${rnd(4)}@example.com`;
    const rr = await call("POST", "/api/renters/register", { name: "Sweep Renter", email: renterEmail }, {}, false);
    expect(rr.status, rr.text).toBe(201);
    learnt.renterKey0 = rr.body.api_key;
    if (rr.body.webhook_secret) learnt.webhookSecret0 = rr.body.webhook_secret;
    const renterId = rr.body.renter_id;
    const providerEmail = `sweep.provider.${rnd(4)}@example.com`;
    const pr = await call("POST", "/api/providers/register", { name: "Sweep Rig", email: providerEmail, gpu_model: "NVIDIA H100 80GB HBM3", os: "linux" }, {}, false);
    expect(pr.status, pr.text).toBe(200);
    learnt.providerKey0 = pr.body.api_key;
    const providerId = pr.body.provider_id;

    // --- login-email: code mailed, wrong code, right code (renter and provider)
    for (const [role, addr] of [["renters", renterEmail], ["providers", providerEmail]] as const) {
      const before = email.requests.length;
      const first = await call("POST", `/api/${role}/login-email`, { email: addr });
      expect(first.status, first.text).toBeLessThan(300);
      await waitFor(() => email.requests.length > before);
      const code = codeOf(email.requests[email.requests.length - 1]);
      learnt[`${role}LoginCode`] = code;
      const wrong = String((Number(code) + 1) % 1_000_000).padStart(6, "0");
      await call("POST", `/api/${role}/login-email`, { email: addr, code: wrong });
      const ok = await call("POST", `/api/${role}/login-email`, { email: addr, code }, {}, false);
      expect(ok.status, ok.text).toBeLessThan(300);
      learnt[`${role}LoginKey`] = ok.body.api_key;
    }
    // Connect form of login-email (a code in a Connect body).
    {
      const before = email.requests.length;
      await call("POST", "/svc.v1.RenterService/LoginEmail", { email: renterEmail }, { "connect-protocol-version": "1" });
      await waitFor(() => email.requests.length > before);
      learnt.renterLoginCode2 = codeOf(email.requests[email.requests.length - 1]);
      const ok = await call("POST", "/svc.v1.RenterService/LoginEmail", { email: renterEmail, code: learnt.renterLoginCode2 }, { "connect-protocol-version": "1" }, false);
      if (ok.body.apiKey) learnt.renterLoginKey2 = ok.body.apiKey;
    }

    const rk = learnt.renterKey0;
    const pk = learnt.providerKey0;
    const R = { "x-renter-key": rk };
    const P = { "x-provider-key": pk };

    // --- admin calls: header and Bearer, admin and operator
    expect((await call("POST", `/api/admin/providers/${providerId}/approve`, {}, ADMIN)).status).toBe(200);
    await call("GET", "/api/admin/providers", undefined, OPER);
    await call("GET", "/api/admin/renters", undefined, { authorization: `Bearer ${ADMIN_TOKEN}` });
    await call("POST", `/api/admin/renters/${renterId}/adjust-balance`, { amount_halala: 500000, reason: "secret sweep" }, OPER);
    await call("GET", "/api/admin/audit", undefined, ADMIN);
    await call("POST", "/api/admin/receipts/keys/rotate", {}, OPER);
    // wrong admin token that looks like a real one (ours, with a suffix)
    await call("GET", "/api/admin/renters", undefined, { "x-admin-token": ADMIN_TOKEN + "x" });
    await call("GET", `/api/admin/renters?token=${ADMIN_TOKEN}`);

    // --- heartbeats: body, query, header, path forms
    const gpu = { gpu_status: { gpu_name: "NVIDIA H100 80GB HBM3", gpu_vram_mib: 81920, gpu_count: 1 } };
    expect((await call("POST", "/api/providers/heartbeat", { api_key: pk, ...gpu })).status).toBe(200);
    await call("POST", "/api/providers/heartbeat", { key: pk, ...gpu });
    await call("POST", `/api/providers/heartbeat?key=${pk}`, gpu);
    await call("POST", `/api/providers/heartbeat?api_key=${encodeURIComponent(pk)}`, gpu);
    await call("POST", "/api/providers/heartbeat", gpu, P);
    await call("GET", `/api/providers/status/${pk}`);
    await call("GET", `/api/providers/${pk}/jobs`);
    await call("POST", "/svc.v1.ProviderService/Heartbeat", { gpuStatus: {} }, { ...P, "connect-protocol-version": "1" });
    await call("POST", "/api/providers/readiness", { api_key: pk, ready: true });
    await sql`UPDATE providers SET gpu_vram_mib = 81920, gpu_count = 1, status = 'online', last_heartbeat = now() WHERE id = ${providerId}`;

    // --- webhook set, payments
    const wh = await call("PATCH", "/api/renters/me", { webhook_url: `${hook.url}/hook?token=${rnd(4)}` }, R, false);
    expect(wh.status, wh.text).toBe(200);
    if (wh.body.webhook_secret) learnt.webhookSecret = wh.body.webhook_secret;
    const [wrow] = await sql`SELECT webhook_secret FROM renters WHERE id = ${renterId}`;
    if (wrow.webhook_secret) learnt.webhookSecretDb = wrow.webhook_secret;
    const top = await call("POST", "/api/payments/topup", { source_type: "sandbox", amount_sar: 100 }, R);
    if (top.body.payment?.payment_id) await call("POST", `/api/payments/${top.body.payment.payment_id}/sandbox-confirm`, {}, R);
    const card = await call("POST", "/api/payments/topup", { source_type: "creditcard", amount_sar: 10 }, { ...R, "idempotency-key": `idem-${rnd(4)}` });
    const payId = card.body.payment?.payment_id;
    const event = JSON.stringify({ id: `evt_${rnd(4)}`, type: "invoice.paid", data: { id: card.body.payment?.gateway_id ?? "x", status: "paid", amount: 1000, metadata: { payment_id: payId } } });
    const sig = crypto.createHmac("sha256", GATEWAY_WEBHOOK).update(event).digest("hex");
    await call("POST", "/api/payments/webhook", event, { "content-type": "application/json", "x-gateway-signature": sig });
    await call("POST", "/api/payments/webhook", event, { "content-type": "application/json", "x-gateway-signature": "bad" + sig });
    await call("GET", "/api/payments/history", undefined, R);

    // --- job with env secrets
    const sub = await call(
      "POST",
      "/api/jobs/submit",
      { job_type: "custom_container", container_spec: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" }, params: { command: ["run"], env: { API_TOKEN: ENV_SECRET, HF_TOKEN: ENV_SECRET2 } }, provider_id: providerId, duration_minutes: 5 },
      R,
    );
    expect(sub.status, sub.text).toBe(201);
    const jobId = sub.body.job.job_id;
    const poll = await call("GET", `/api/providers/${pk}/jobs`, undefined, {}, false);
    expect(poll.body.job?.job_id, poll.text).toBe(jobId);
    await call("POST", `/api/jobs/${jobId}/preparing`, { api_key: pk });
    await call("POST", `/api/jobs/${jobId}/progress`, { api_key: pk, progress: 10 });
    await call("POST", `/api/jobs/${jobId}/logs`, { api_key: pk, logs: ["booting", { level: "info", message: "step 1" }] });
    await call("POST", "/api/providers/daemon-event", { api_key: pk, event: "job_started", job_id: jobId });
    await call("GET", `/api/jobs/${jobId}`, undefined, R);
    await call("GET", `/api/jobs/${jobId}/logs`, undefined, R);
    await call("GET", `/api/jobs/${jobId}/history`, undefined, R);
    await call("GET", `/api/admin/jobs`, undefined, ADMIN);
    const res = await call("POST", "/api/providers/job-result", { api_key: pk, job_id: jobId, success: true, result: { output: "done" } });
    expect(res.status, res.text).toBe(200);
    await call("GET", `/api/jobs/${jobId}/output`, undefined, R);
    await call("GET", `/api/jobs/${jobId}/receipt`, undefined, R);
    await waitFor(() => hook.requests.length > 0, 20_000).catch(() => undefined);

    // --- a served endpoint with its endpoint_api_key, and /v1
    const serve = await call("POST", "/api/jobs/submit", { job_type: "vllm_serve", params: { model: MODEL }, provider_id: providerId, duration_minutes: 60, max_duration_seconds: 3600 }, R);
    expect(serve.status, serve.text).toBe(201);
    const serveId = serve.body.job.job_id;
    await call("GET", `/api/providers/${pk}/jobs`, undefined, {}, false);
    const ready = await call("POST", `/api/jobs/${serveId}/endpoint-ready`, { api_key: pk, endpoint_url: `${vllm.url}/v1`, model: MODEL, endpoint_api_key: ENDPOINT_KEY });
    expect(ready.status, ready.text).toBe(200);
    const chat = await call("POST", "/v1/chat/completions", { model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 8 }, { authorization: `Bearer ${rk}` });
    expect(chat.status, chat.text).toBe(200);
    await call("POST", "/v1/chat/completions", { model: MODEL, messages: [{ role: "user", content: "hi" }], stream: true }, { authorization: `Bearer ${rk}` });
    await call("GET", "/v1/models", undefined, { authorization: `Bearer ${rk}` });
    await call("GET", `/v1/models/${encodeURIComponent(MODEL)}`, undefined, { authorization: `Bearer ${rk}` });
    await call("POST", "/v1/chat/completions", { model: MODEL, messages: [] }, { authorization: `Bearer ${pk}` });
    await call("POST", "/v1/chat/completions", "{not json", { authorization: `Bearer ${rk}` });
    await call("POST", "/v1/chat/completions", { model: "nope/x", messages: [{ role: "user", content: "x" }] }, { authorization: `Bearer ${rk}` });
    await call("GET", `/v1/models?key=${rk}`);
    await call("POST", "/api/providers/job-result", { api_key: pk, job_id: serveId, success: false, error: "stopped" });

    // --- downloads / installers
    for (const path of ["/api/providers/setup", "/api/providers/setup-windows", "/api/providers/download?platform=linux", "/api/providers/download/setup?os=windows", "/api/providers/installer?os=linux", "/api/providers/download/daemon"]) {
      const r = await call("GET", path, undefined, P, false);
      installerUrls += (r.text.match(/\bhttps?:\/\/[^\s'"`<>)]+/g) ?? []).join("\n") + "\n";
      if (r.headers.get("location")) installerUrls += r.headers.get("location") + "\n";
    }
    const check = await call("GET", "/api/providers/download/daemon?check_only=true", undefined, P);
    installerUrls += check.text + "\n";
    await call("GET", `/api/providers/setup?key=${pk}`, undefined, {}, false).then((r) => (installerUrls += (r.text.match(/\bhttps?:\/\/[^\s'"`<>)]+/g) ?? []).join("\n")));
    await call("GET", "/api/providers/download-windows-exe", undefined, P);

    // --- error paths with keys and tokens in them
    await call("GET", `/api/providers/${pk}x/jobs`);
    await call("GET", `/api/providers/status/${pk}x`);
    await call("GET", `/api/nonexistent/${pk}`);
    await call("DELETE", `/api/providers/${pk}/jobs`);
    // Keys in a path percent-encoded, as some clients send them: the router decodes them (they work), the
    // request log, the 404 and 405 answers and their log lines must not carry them in any form.
    const everyDash = (k: string) => k.replace(/-/g, "%2D");
    const oneEscaped = (k: string) => `svc-provider-%${k.charCodeAt(13).toString(16).toUpperCase()}${k.slice(14)}`;
    const twice = (k: string) => k.replace(/-/g, "%252D");
    for (const form of [everyDash, oneEscaped, twice]) {
      await call("GET", `/api/providers/${form(pk)}/jobs`);
      await call("GET", `/api/providers/status/${form(pk)}`);
      await call("HEAD", `/api/providers/status/${form(pk)}`);
      await call("DELETE", `/api/providers/${form(pk)}/jobs`);
      await call("GET", `/api/nonexistent/${form(pk)}`);
      await call("GET", `/api/nonexistent/x${form(pk)}y?key=${form(pk)}`);
      await call("POST", `/svc.v1.ProviderService/${form(pk)}`, "{}", { "connect-protocol-version": "1" });
      await call("POST", `/svc.v1.${form(pk)}/Heartbeat`, "{}", { "connect-protocol-version": "1" });
      // /v1 names an unknown path in its error answer as it was sent (to its sender): only its log is searched here.
      await call("GET", `/v1/${everyDash(rk)}`, undefined, { authorization: `Bearer ${rk}` }, false);
      await call("GET", `/v1/models/${form(rk)}`, undefined, { authorization: `Bearer ${rk}` }, false);
    }
    await call("POST", "/api/providers/heartbeat", `{"api_key":"${pk}", broken`);
    await call("POST", "/api/providers/heartbeat", { api_key: pk, gpu_status: "not-an-object" });
    await call("POST", "/api/providers/heartbeat", { api_key: pk, gpu_status: { gpu_count: pk } });
    await call("POST", "/api/jobs/submit", { job_type: pk, params: {} }, R);
    await call("POST", "/api/jobs/submit", { job_type: "custom_container", container_spec: { image: ENV_SECRET }, params: { env: { X: ENV_SECRET } } }, R);
    await call("POST", "/api/jobs/submit", { job_type: "custom_container", container_spec: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" }, params: { env: { HF_TOKEN: ENV_SECRET2 + "\u0000" } } }, R);
    await call("POST", "/api/jobs/submit", { job_type: "custom_container", container_spec: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" }, params: { env: { HF_TOKEN: ENV_SECRET2 + "\ud800" } } }, R);
    await call("POST", "/api/jobs/submit", { job_type: "custom_container", container_spec: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" }, params: { env: { HF_TOKEN: ENV_SECRET2 + "x".repeat(40000) } } }, R);
    await call("POST", "/api/jobs/submit", { job_type: "custom_container", container_spec: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" }, params: { env: { "bad name": ENV_SECRET2 } } }, R);
    await call("POST", "/api/jobs/submit", { job_type: "custom_container", container_spec: { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04" }, params: { command: "notarray", env: { HF_TOKEN: ENV_SECRET2 } } }, R);
    await call("PATCH", "/api/renters/me", { webhook_url: `not a url ${rk}` }, R);
    await call("GET", "/api/renters/me", undefined, { "x-renter-key": rk + "x" });
    await call("GET", "/api/renters/me", undefined, { authorization: `Bearer ${rk}` });
    await call("POST", "/svc.v1.RenterService/GetMe", `{"x":"${rk}"`, { ...R, "content-type": "application/json", "connect-protocol-version": "1" });
    await call("POST", "/svc.v1.RenterService/GetMe", "{}", { "x-renter-key": rk + "zz", "content-type": "application/json", "connect-protocol-version": "1" });
    await call("GET", `/svc.v1.RenterService/GetMe?connect=v1&encoding=json&message=${encodeURIComponent(JSON.stringify({ key: rk }))}`, undefined, R);
    await call("POST", `/api/jobs/${jobId}/logs`, { api_key: pk, logs: [{ level: pk, message: 1 }] });
    await call("POST", "/api/jobs/submit", "x".repeat(10) + rk, { ...R, "content-type": "text/plain" });

    // --- /metrics
    for (const h of [{ authorization: `Bearer ${METRICS_TOKEN}` }, ADMIN, { authorization: `Bearer ${METRICS_TOKEN}x` }]) {
      const m = await call("GET", "/metrics", undefined, h, false);
      metricsText += m.text;
    }

    // --- rotate keys (the old and the new are secrets too)
    const rot = await call("POST", "/api/renters/rotate-key", {}, R, false);
    if (rot.body.api_key) learnt.renterKeyRotated = rot.body.api_key;
    const prot = await call("POST", "/api/providers/rotate-key", { api_key: pk }, {}, false);
    if (prot.body.api_key) learnt.providerKeyRotated = prot.body.api_key;
    await call("GET", "/api/renters/me", undefined, R); // the rotated-away key
    if (learnt.providerKeyRotated) await call("GET", `/api/providers/${learnt.providerKeyRotated}/jobs`);

    // task secret of the provider; receipt seeds from the database
    const [sig2] = await sql`SELECT * FROM providers WHERE id = ${providerId}`;
    learnt.taskSecret = providerTaskSecret(HMAC, providerId, sig2.task_secret_epoch ?? 0);
    const seeds = await sql`SELECT * FROM receipt_keys`.catch(() => []);
    seeds.forEach((s: any, i: number) => {
      for (const [k, v] of Object.entries(s)) if (/seed|secret|private/i.test(k) && v) learnt[`receiptSeed${i}.${k}`] = Buffer.isBuffer(v) ? v.toString("hex") : String(v);
    });
    await new Promise((r) => setTimeout(r, 1500)); // let workers log
  });

  const secrets = () => ({
    ADMIN_TOKEN,
    OPERATOR_TOKEN,
    HMAC,
    GATEWAY_KEY,
    GATEWAY_WEBHOOK,
    EMAIL_KEY,
    METRICS_TOKEN,
    ENV_SECRET,
    ENV_SECRET2,
    ENDPOINT_KEY,
    ...learnt,
  });

  it("leaves no secret in the server's log output (LOG_LEVEL=trace)", async () => {
    if (process.env.SECRET_SWEEP_DUMP) (await import("node:fs")).writeFileSync(process.env.SECRET_SWEEP_DUMP, srv.output() + "\n=====ANSWERS\n" + answers.join("\n---\n"));
    const hits = findSecrets(secrets(), { "server log": srv.output() });
    expect(hits).toEqual([]);
  });

  it("leaves no secret in /metrics", () => {
    expect(findSecrets(secrets(), { metrics: metricsText })).toEqual([]);
  });

  it("leaves no secret in the audit log, job logs/events, webhook outbox or stored errors", async () => {
    const tables: Record<string, string> = {};
    const names = (await sql`SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'`).map((r: any) => r.table_name as string);
    for (const t of names.filter((n) => /audit|log|event|outbox|history|notice/.test(n))) {
      tables[t] = JSON.stringify(await sql.unsafe(`SELECT * FROM "${t}"`));
    }
    tables["jobs.error"] = JSON.stringify(await sql`SELECT error, status_message FROM jobs`.catch(() => sql`SELECT error FROM jobs`));
    const s = secrets();
    // A renter's env is meant to be in the job row itself; not in these tables.
    expect(findSecrets(s, tables)).toEqual([]);
  });

  it("sends no secret in webhook URLs or bodies (beyond the signature)", () => {
    const s = { ...secrets() };
    const text = hook.requests.map((r) => `${r.url}\n${JSON.stringify({ ...r.headers, "x-svc-signature": undefined })}\n${r.body}`).join("\n");
    expect(hook.requests.length).toBeGreaterThan(0);
    expect(findSecrets(s, { "webhook deliveries": text })).toEqual([]);
  });

  it("puts no key in the URLs its installers, daemon check and messages generate", () => {
    expect(installerUrls.length).toBeGreaterThan(0);
    expect(findSecrets(secrets(), { "installer/daemon URLs": installerUrls })).toEqual([]);
  });

  it("echoes no secret in error answers or other answers not meant to carry one", () => {
    expect(findSecrets(secrets(), { answers: answers.join("\n---\n") })).toEqual([]);
  });

  it("sends the email API and the gateway nothing but their own key", () => {
    const s: Record<string, string> = { ...secrets() };
    delete s.EMAIL_KEY;
    delete s.GATEWAY_KEY;
    for (const k of Object.keys(s)) if (/LoginCode/.test(k)) delete s[k]; // the code is the mail's content
    const text = [...email.requests, ...gateway.requests].map((r) => `${r.url}\n${JSON.stringify(r.headers)}\n${r.body}`).join("\n");
    expect(findSecrets(s, { "email/gateway requests": text })).toEqual([]);
  });
});
