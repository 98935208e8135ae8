// svc: the command-line client of the marketplace, on the generated Connect
// clients (gRPC). Commands for renters, providers and operators; profiles
// from `svc login`; --json everywhere; exit codes in output.ts (EXIT).
import fs from "node:fs";
import readline from "node:readline";
import { Writable } from "node:stream";
import { Command, CommanderError, Option } from "commander";
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import type { JobParam } from "../../gen/svc/v1/job_types_pb.js";
import { JobReceiptSchema, ReceiptKeysSchema } from "../../gen/svc/v1/receipts_pb.js";
import { messageToJson } from "../shared/message-json.js";
import { verifyReceipt, type PublishedKeys } from "../shared/receipt.js";
import { clientsFor, type Clients } from "./clients.js";
import { follow, saveOutput } from "./follow.js";
import { EXIT, Exit, apiJson, colour, out, printFields, printJson, printJsonLine, printTable, reportError, sar, statusColour } from "./output.js";
import { ROLES, checkBaseUrl, maskSecret, resolveProfile, roleOfKey, saveProfile, UsageError, withArticle, type Profile, type Role } from "./profiles.js";

const EXIT_HELP = `
Exit codes:
  0  done (a followed job completed)
  1  the job failed or was cancelled
  2  usage error
  3  authentication: no profile, a bad key or token, or not allowed
  4  server unreachable
  5  the server refused the request (its error text and status are printed)
  6  receipt verify: the receipt or the output does not verify

Environment: SVC_PROFILE, SVC_URL, SVC_KEY (renter or provider key: the role is its
prefix's), SVC_ADMIN_TOKEN (the admin role when SVC_KEY is not set), SVC_ROLE,
SVC_CONFIG_DIR (default $XDG_CONFIG_HOME/svc or ~/.config/svc), SVC_RECONNECT_SECONDS
(how long a followed job's lost connection is tried again without an event; default 300).`;

interface Globals {
  profile?: string;
  json?: boolean;
}

/** Reads a secret: piped stdin, else a prompt that does not echo it. Never from argv. */
async function readSecret(prompt: string): Promise<string> {
  if (!process.stdin.isTTY) {
    let data = "";
    for await (const chunk of process.stdin) data += chunk;
    return data.trim();
  }
  let muted = false;
  const output = new Writable({
    write(chunk, _enc, cb) {
      if (!muted) process.stderr.write(chunk);
      cb();
    },
  });
  const rl = readline.createInterface({ input: process.stdin, output, terminal: true });
  return new Promise((resolve) => {
    rl.question(prompt, (answer) => {
      rl.close();
      process.stderr.write("\n");
      resolve(answer.trim());
    });
    muted = true;
  });
}

/** --param or --param-json: [option, key, text of the value]. */
type ParamArg = ["param" | "param-json", string, string];
/** Parses key=value into `into` (both options share it, so the last one given wins). */
const paramArg = (option: ParamArg[0], into: ParamArg[]) => (text: string): ParamArg[] => {
  const i = text.indexOf("=");
  if (i <= 0) throw new UsageError(`--${option} wants key=value, got "${text}"`);
  into.push([option, text.slice(0, i), text.slice(i + 1)]);
  return into;
};

const PARAM_HELP = `
Parameters: each --param key=value takes the type the job type declares for that
parameter (svc reads them from the server, GET /api/job-types): text for a string
(prompt=2024 stays "2024"), a number for an integer or a number, true or false for a
boolean, JSON for an array or an object. A parameter the job type does not declare is
JSON when it parses as JSON, else text. --param-json key=JSON gives a value as JSON,
whatever the declared type (e.g. --param-json 'stop=["\\n"]').`;

/** The params of a submit: each --param typed by the job type's declared parameters, each --param-json parsed. */
async function buildParams(c: Clients, jobType: string, args: ParamArg[]): Promise<JsonObject | undefined> {
  if (args.length === 0) return undefined;
  let declared = new Map<string, JobParam>();
  if (args.some(([option]) => option === "param")) {
    try {
      const rule = (await c.jobTypes.listJobTypes({})).jobTypes.find((t) => t.jobType === jobType);
      declared = new Map((rule?.params ?? []).map((p) => [p.name, p]));
    } catch {
      // A server that does not say: every value is taken as JSON when it parses, as for an undeclared parameter.
    }
  }
  const params: JsonObject = {};
  for (const [option, key, text] of args) {
    if (option === "param-json") {
      try {
        params[key] = JSON.parse(text) as JsonValue;
      } catch {
        throw new UsageError(`--param-json ${key}: not JSON: ${text}`);
      }
    } else params[key] = typedParam(text, declared.get(key)?.type);
  }
  return params;
}

function typedParam(text: string, type: string | undefined): JsonValue {
  const json = (): JsonValue | undefined => {
    try {
      return JSON.parse(text) as JsonValue;
    } catch {
      return undefined;
    }
  };
  switch (type) {
    case "string":
      return text;
    case "integer":
    case "number":
      // Not a number: sent as given, and the server says what it wants.
      return text.trim() !== "" && Number.isFinite(Number(text)) ? Number(text) : text;
    case "boolean":
      return text === "true" ? true : text === "false" ? false : text;
    default:
      return json() ?? text;
  }
}

/** "N halala (x.xx SAR)". */
const halala = (v: bigint | number | undefined) => (v === undefined ? undefined : `${v} halala (${sar(v)})`);

const int = (name: string) => (v: string) => {
  const n = Number(v);
  if (!Number.isInteger(n)) throw new UsageError(`${name} must be an integer`);
  return n;
};
const num = (name: string) => (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n)) throw new UsageError(`${name} must be a number`);
  return n;
};

export function buildProgram(): Command {
  const program = new Command("svc")
    .description("Command-line client of the GPU compute marketplace")
    .option("--profile <name>", "profile to use (default: SVC_PROFILE, else the first one saved)")
    .option("--json", "print JSON instead of tables (one object per event when following)")
    .addHelpText("after", EXIT_HELP)
    .showHelpAfterError()
    .exitOverride();
  program.configureOutput({ writeErr: (s) => process.stderr.write(s) });

  const g = (): Globals => program.opts<Globals>();
  const session = (role?: Role | Role[]): { c: Clients; p: Profile } => {
    const p = resolveProfile(g().profile);
    const wanted = role === undefined ? undefined : Array.isArray(role) ? role : [role];
    if (wanted && !wanted.includes(p.role)) {
      const from = process.env.SVC_ROLE ? "SVC_ROLE" : process.env.SVC_KEY ? "SVC_KEY" : process.env.SVC_ADMIN_TOKEN ? "SVC_ADMIN_TOKEN" : `profile "${p.name}"`;
      throw new UsageError(`this command is for ${withArticle(wanted.join(" or "))} profile; the credential in effect (${from}) is ${withArticle(p.role)}'s`);
    }
    return { c: clientsFor(p), p };
  };
  const show = (value: unknown, human: () => void) => (g().json ? printJson(value) : human());

  // ---- profiles ----
  program
    .command("login")
    .description("save a profile: the key (or admin token) is read from stdin or a prompt, never from arguments; SVC_KEY (or SVC_ADMIN_TOKEN) only when neither gives one")
    .requiredOption("--url <url>", "server base URL, e.g. http://localhost:8080")
    .addOption(new Option("--role <role>", "renter, provider or admin (default: from the key's prefix)").choices([...ROLES]))
    .option("--name <profile>", "profile name (default: --profile, else \"default\")")
    .action(async (o: { url: string; role?: Role; name?: string }) => {
      const url = checkBaseUrl(o.url, "--url");
      // What stdin or the prompt gives wins; the environment stands in only when they give nothing.
      const envName = o.role === "admin" ? "SVC_ADMIN_TOKEN" : process.env.SVC_KEY ? "SVC_KEY" : o.role ? undefined : "SVC_ADMIN_TOKEN";
      const envSecret = envName ? process.env[envName] || undefined : undefined;
      const given = await readSecret(`${o.role === "admin" ? "Admin token" : "API key"}${envSecret ? ` (Enter: use ${envName})` : ""}: `);
      const secret = given || envSecret;
      if (!secret) throw new UsageError("no key given (pipe it on stdin, type it at the prompt, or set SVC_KEY)");
      const role = o.role ?? roleOfKey(secret) ?? "admin";
      const p: Profile = { url, role, secret };
      const c = clientsFor(p);
      // Checked before it is saved: a bad key is refused here, with the server's answer.
      let who: string;
      // The `me` reads answer 404 for a key of no account (the spec's table); a list answers 401 "invalid API key".
      if (role !== "admin") await c.jobs.list({ limit: 1 });
      if (role === "renter") {
        const me = await c.renters.getMe({});
        who = `renter ${me.renter?.id} (${me.renter?.email})`;
      } else if (role === "provider") {
        const me = await c.providers.getMe({});
        who = `provider ${me.provider?.provider?.id} (${me.provider?.provider?.name})`;
      } else {
        await c.admin.getDashboard({});
        who = "admin";
      }
      const name = o.name ?? g().profile ?? "default";
      const file = saveProfile(name, p);
      show({ profile: name, url: p.url, role, key: maskSecret(secret), file }, () => out(`logged in as ${who} on ${p.url}: profile "${name}" saved in ${file} (key ${maskSecret(secret)})`));
    });

  program
    .command("whoami")
    .description("the profile in effect (the key masked)")
    .action(() => {
      const p = resolveProfile(g().profile);
      show({ profile: p.name, url: p.url, role: p.role, key: maskSecret(p.secret) }, () =>
        printFields([["profile", p.name], ["url", p.url], ["role", p.role], ["key", maskSecret(p.secret)]]),
      );
    });

  // ---- renter ----
  program
    .command("balance")
    .description("renter balance")
    .action(async () => {
      const { c } = session("renter");
      const b = await c.renters.getBalance({});
      show(b, () =>
        printFields([
          ["balance", `${b.balanceHalala} halala (${sar(b.balanceHalala)})`],
          ["held", `${b.heldHalala} halala`],
          ["available", `${b.availableHalala} halala (${sar(b.availableHalala)})`],
          ["spent", `${b.totalSpentHalala} halala`],
          ["jobs", b.totalJobs],
        ]),
      );
    });

  program
    .command("topup")
    .description("add funds: sandbox payments are confirmed at once (outside production); card sources print a checkout URL")
    .requiredOption("--sar <amount>", "amount in SAR", num("--sar"))
    .addOption(new Option("--source <type>", "payment source").choices(["sandbox", "creditcard", "mada", "applepay"]).default("sandbox"))
    .option("--idempotency-key <key>", "makes a retried top-up safe")
    .action(async (o: { sar: number; source: string; idempotencyKey?: string }) => {
      const { c, p } = session("renter");
      const t = await c.payments.topup({ amountSar: o.sar, sourceType: o.source, idempotencyKey: o.idempotencyKey });
      const pay = t.payment!;
      if (o.source !== "sandbox") {
        return show(t, () => out(`payment ${pay.paymentId} (${sar(pay.amountHalala)}): pay at ${new URL(t.checkoutUrl, p.url)}`));
      }
      const confirmed = await c.payments.confirmSandbox({ paymentId: pay.paymentId });
      const b = await c.renters.getBalance({});
      show({ payment: confirmed, balance: b }, () =>
        out(`payment ${confirmed.paymentId}: ${confirmed.status}, ${sar(confirmed.amountHalala)} added; balance ${b.balanceHalala} halala (${sar(b.balanceHalala)})`),
      );
    });

  const paramArgs: ParamArg[] = [];
  program
    .command("submit")
    .description("submit a job; --follow watches it to the end (exit code: how it ended)")
    .argument("<type>", "job type, e.g. llm-inference, image_generation, benchmark")
    .option("-p, --param <key=value>", "a job parameter (repeatable), typed as the job type declares it (see below)", paramArg("param", paramArgs))
    .option("--param-json <key=json>", "a job parameter given as JSON (repeatable)", paramArg("param-json", paramArgs))
    .option("-d, --duration <minutes>", "duration estimate in minutes (the hold)", num("--duration"))
    .option("--priority <1-3>", "1 high, 2 normal, 3 low", int("--priority"))
    .option("--provider <id>", "run on this provider", int("--provider"))
    .option("--max-duration <seconds>", "hard limit of the run", int("--max-duration"))
    .option("--idempotency-key <key>", "a retried submit with the same key answers the first job")
    .option("-f, --follow", "watch the job until it ends")
    .option("-o, --out <file>", "with --follow: where to write the output")
    .addHelpText("after", PARAM_HELP)
    .action(async (type: string, o: { duration?: number; priority?: number; provider?: number; maxDuration?: number; idempotencyKey?: string; follow?: boolean; out?: string }) => {
      const { c } = session("renter");
      const r = await c.jobs.submit({
        jobType: type,
        params: await buildParams(c, type, paramArgs),
        durationMinutes: o.duration,
        priority: o.priority,
        providerId: o.provider === undefined ? undefined : BigInt(o.provider),
        maxDurationSeconds: o.maxDuration === undefined ? undefined : BigInt(o.maxDuration),
        idempotencyKey: o.idempotencyKey,
      });
      const job = r.job!.job!;
      // Following with --json: one JSON object per line, the submission first.
      if (g().json && o.follow) printJsonLine({ submitted: r });
      else if (g().json) printJson(r);
      else out(`submitted ${job.jobId}: ${statusColour(job.status)} — ${r.message} (estimate ${job.costHalala} halala held)`);
      if (o.follow) throw new Exit(await follow(c, job.jobId, { json: !!g().json, outFile: o.out }));
    });

  const jobs = program.command("jobs").description("your jobs (renter), your runs (provider), any job (admin)");
  jobs
    .command("ls")
    .description("list jobs")
    .option("--status <status>", "queued, pending, running, completed, failed, cancelled")
    .option("--limit <n>", "how many", int("--limit"), 20)
    .action(async (o: { status?: string; limit: number }) => {
      const { c } = session();
      const r = await c.jobs.list({ status: o.status, limit: o.limit });
      show(r, () =>
        printTable(r.jobs, [
          ["job", (j) => j.jobId],
          ["type", (j) => j.jobType],
          ["status", (j) => statusColour(j.status)],
          ["progress", (j) => (j.progressPct === undefined ? undefined : `${Math.round(j.progressPct)}%`)],
          ["cost (halala)", (j) => j.actualCostHalala ?? j.costHalala],
          ["submitted", (j) => j.submittedAt],
        ]),
      );
    });
  jobs
    .command("show")
    .argument("<job_id>")
    .description("one job")
    .action(async (jobId: string) => {
      const { c } = session();
      const j = await c.jobs.get({ jobId });
      show(j, () =>
        printFields([
          ["job", j.jobId],
          ["type", j.jobType],
          ["status", statusColour(j.status)],
          ["queue reason", j.queueReason],
          ["provider", j.providerId],
          ["attempt", j.attempt],
          ["progress", j.progressPct === undefined ? undefined : `${Math.round(j.progressPct)}% ${j.progressPhase ?? ""}`.trim()],
          ["held / cost", `${j.costHalala} / ${j.actualCostHalala ?? "-"} halala`],
          ["submitted", j.submittedAt],
          ["completed", j.completedAt],
          ["error", j.error],
        ]),
      );
    });
  jobs
    .command("logs")
    .argument("<job_id>")
    .option("-f, --follow", "keep printing new lines until the job ends")
    .option("--attempt <n>", "an earlier attempt's lines", int("--attempt"))
    .description("a job's log lines")
    .action(async (jobId: string, o: { follow?: boolean; attempt?: number }) => {
      const { c } = session();
      if (o.follow) throw new Exit(await follow(c, jobId, { json: !!g().json, logsOnly: true }));
      const r = await c.jobs.getLogs({ jobId, attempt: o.attempt });
      show(r, () => {
        for (const l of r.logs) out(`${colour(l.level.padEnd(7), "dim")} ${l.message}`);
      });
    });
  jobs
    .command("watch")
    .argument("<job_id>")
    .option("-o, --out <file>", "where to write the output")
    .description("follow a job live until it ends (exit code: how it ended)")
    .action(async (jobId: string, o: { out?: string }) => {
      const { c } = session();
      throw new Exit(await follow(c, jobId, { json: !!g().json, outFile: o.out }));
    });
  jobs
    .command("cancel")
    .argument("<job_id>")
    .option("--reason <text>")
    .description("cancel a queued, pending or running job (the hold is released)")
    .action(async (jobId: string, o: { reason?: string }) => {
      const { c, p } = session(["renter", "admin"]);
      if (p.role === "admin") {
        const j = await c.admin.cancelJob({ jobId, reason: o.reason });
        return show(j, () => out(`${j.jobId}: ${statusColour(j.status)}`));
      }
      const r = await c.jobs.cancel({ jobId, reason: o.reason });
      show(r, () => out(`${r.job?.jobId}: ${statusColour(r.job?.status ?? "")}; refunded ${r.refundedHalala} halala, charged ${r.chargedHalala}`));
    });
  jobs
    .command("output")
    .argument("<job_id>")
    .option("-o, --out <file>", "write it to this file (images default to <job_id>.png)")
    .description("a finished job's output")
    .action(async (jobId: string, o: { out?: string }) => {
      const { c } = session();
      const r = await c.jobs.getOutput({ jobId });
      if (r.body.case !== "result") {
        const v = r.body.value!;
        show(v, () => out(`${v.jobId}: ${statusColour(v.status)} — ${"message" in v ? v.message : v.error}`));
        throw new Exit(r.body.case === "gone" ? EXIT.jobFailed : EXIT.refused);
      }
      const obj = r.body.value as JsonObject;
      const format = outputFormatOf(obj);
      if (format === "json" && !o.out) {
        // The result object as the output route answers it.
        if (g().json) printJson(obj);
        else out(JSON.stringify(obj, null, 2));
        return;
      }
      if (format === "text" && !o.out && g().json) return printJson(obj);
      // As `submit --follow` saves it: text as text, an image as its bytes, JSON as the output route's JSON.
      const saved = await saveOutput(c, jobId, format, o.out);
      if (saved.where !== "stdout") show({ job_id: jobId, file: saved.where, bytes: saved.bytes }, () => out(`written to ${saved.where} (${saved.bytes} bytes)`));
    });

  program
    .command("usage")
    .description("your /v1 (OpenAI-compatible) token usage, by day and by model")
    .option("--days <n>", "days back, today included (at most 90)", int("--days"), 14)
    .action(async (o: { days: number }) => {
      const { c } = session("renter");
      const r = await c.reports.getRenterUsage({ days: o.days });
      show(r, () => {
        const days = r.days.filter((d) => d.requests > 0n).reverse();
        printTable(days, [["day", (d) => d.day], ["requests", (d) => d.requests], ["prompt", (d) => d.promptTokens], ["completion", (d) => d.completionTokens], ["cost", (d) => sar(d.costHalala)]]);
        if (r.models.length) {
          console.log("");
          printTable(r.models, [["model", (m) => m.model], ["requests", (m) => m.requests], ["prompt", (m) => m.promptTokens], ["completion", (m) => m.completionTokens], ["cost", (m) => sar(m.costHalala)]]);
        }
      });
    });

  // ---- provider ----
  const provider = program.command("provider").description("provider commands (a provider profile)");
  provider
    .command("status")
    .description("online, last heartbeat, GPUs, earnings")
    .action(async () => {
      const { c } = session("provider");
      const me = await c.providers.getMe({});
      const d = me.provider!;
      const pr = d.provider!;
      show(me, () =>
        printFields([
          ["provider", `${pr.id} ${pr.name}`],
          ["status", statusColour(pr.status)],
          ["approval", pr.approvalStatus],
          ["paused", pr.isPaused],
          ["last heartbeat", pr.lastHeartbeat],
          ["GPU", `${pr.gpuCountReported} x ${pr.gpuModel}${pr.gpuVramMib ? ` (${pr.gpuVramMib} MiB)` : ""}`],
          ["daemon", pr.daemonVersion],
          ["active job", d.activeJob?.jobId],
          ["today", sar(d.todayEarningsHalala)],
          ["this week", sar(d.weekEarningsHalala)],
          ["total", sar(pr.totalEarningsHalala)],
        ]),
      );
    });
  provider
    .command("earnings")
    .description("earnings by day (UTC), from the provider's ledger credits")
    .option("--days <n>", "days back, today included (at most 90)", int("--days"), 14)
    .action(async (o: { days: number }) => {
      const { c } = session("provider");
      const r = await c.reports.getProviderEarnings({ days: o.days });
      const rows = r.days.filter((d) => d.jobs > 0n || d.earnedHalala > 0n).reverse();
      show(r, () => {
        printTable(rows, [["day", (d) => d.day], ["jobs", (d) => d.jobs], ["earned", (d) => `${d.earnedHalala} halala (${sar(d.earnedHalala)})`]]);
        console.log(`total: ${r.totalEarnedHalala} halala (${sar(r.totalEarnedHalala)})`);
      });
    });
  provider
    .command("jobs")
    .description("jobs run on this provider")
    .option("--status <status>")
    .option("--limit <n>", "how many", int("--limit"), 20)
    .action(async (o: { status?: string; limit: number }) => {
      const { c } = session("provider");
      const r = await c.jobs.list({ status: o.status, limit: o.limit });
      show(r, () =>
        printTable(r.jobs, [
          ["job", (j) => j.jobId],
          ["type", (j) => j.jobType],
          ["status", (j) => statusColour(j.status)],
          ["earned (halala)", (j) => j.providerEarnedHalala],
          ["submitted", (j) => j.submittedAt],
        ]),
      );
    });
  for (const verb of ["pause", "resume"] as const) {
    provider
      .command(verb)
      .description(verb === "pause" ? "take no new jobs" : "take jobs again")
      .action(async () => {
        const { c } = session("provider");
        const r = verb === "pause" ? await c.providers.pause({}) : await c.providers.resume({});
        show(r, () => out(`provider ${verb === "pause" ? "paused" : "resumed"}`));
      });
  }
  provider
    .command("preferences")
    .description("show or set run preferences")
    .addOption(new Option("--run-mode <mode>").choices(["always-on", "manual", "scheduled"]))
    .option("--scheduled-start <HH:MM>")
    .option("--scheduled-end <HH:MM>")
    .option("--gpu-usage-cap <pct>", "", int("--gpu-usage-cap"))
    .option("--vram-reserve <GB>", "", num("--vram-reserve"))
    .option("--temp-limit <C>", "", int("--temp-limit"))
    .action(async (o: { runMode?: string; scheduledStart?: string; scheduledEnd?: string; gpuUsageCap?: number; vramReserve?: number; tempLimit?: number }) => {
      const { c } = session("provider");
      const set = Object.values(o).some((v) => v !== undefined);
      if (set) {
        await c.providers.setPreferences({
          runMode: o.runMode,
          scheduledStart: o.scheduledStart,
          scheduledEnd: o.scheduledEnd,
          gpuUsageCapPct: o.gpuUsageCap,
          vramReserveGb: o.vramReserve,
          tempLimitC: o.tempLimit,
        });
      }
      const pr = (await c.providers.getMe({})).provider!.provider!;
      const prefs = {
        run_mode: pr.runMode,
        scheduled_start: pr.scheduledStart ?? null,
        scheduled_end: pr.scheduledEnd ?? null,
        gpu_usage_cap_pct: pr.gpuUsageCapPct,
        vram_reserve_gb: pr.vramReserveGb,
        temp_limit_c: pr.tempLimitC,
      };
      show(prefs, () => printFields(Object.entries(prefs)));
    });

  // ---- operator ----
  const admin = program.command("admin").description("operator commands (an admin profile)");
  admin
    .command("providers")
    .description("providers")
    .option("--pending", "only those waiting for approval")
    .option("--status <status>")
    .option("--limit <n>", "how many", int("--limit"), 50)
    .action(async (o: { pending?: boolean; status?: string; limit: number }) => {
      const { c } = session("admin");
      const r = await c.admin.listProviders({ approvalStatus: o.pending ? "pending" : undefined, status: o.status, limit: o.limit });
      show(r, () =>
        printTable(r.providers, [
          ["id", (p) => p.id],
          ["name", (p) => p.name],
          ["gpu", (p) => p.gpuModel],
          ["status", (p) => p.status],
          ["approval", (p) => p.approvalStatus],
          ["last heartbeat", (p) => p.lastHeartbeat],
        ]),
      );
    });
  for (const verb of ["approve", "reject", "suspend", "unsuspend"] as const) {
    const cmd = admin.command(verb).argument("<provider_id>");
    // The server refuses a rejection without a reason (the provider is told it).
    if (verb === "reject") cmd.requiredOption("--reason <text>", "why (required: the provider sees it)");
    else cmd.option("--reason <text>", "why (kept in the audit log)");
    cmd
      .description(`${verb} a provider`)
      .action(async (id: string, o: { reason?: string }) => {
        const { c } = session("admin");
        const req = { id: BigInt(int("provider_id")(id)), reason: o.reason };
        const r =
          verb === "approve"
            ? await c.admin.approveProvider(req)
            : verb === "reject"
              ? await c.admin.rejectProvider(req)
              : verb === "suspend"
                ? await c.admin.suspendProvider(req)
                : await c.admin.unsuspendProvider(req);
        show(r, () => out(`provider ${id}: ${verb} done`));
      });
  }
  admin
    .command("dashboard")
    .description("platform figures")
    .action(async () => {
      const { c } = session("admin");
      const d = await c.admin.getDashboard({});
      const stats = (apiJson(d.stats ?? {}) ?? {}) as Record<string, unknown>;
      show(d, () => printFields(Object.entries(stats).map(([k, v]) => (k.endsWith("_halala") ? [k.slice(0, -7).replace(/_/g, " "), halala(v as number)] : [k.replace(/_/g, " "), v]))));
    });
  admin
    .command("renters")
    .description("renters")
    .option("--q <text>", "search name or email")
    .option("--limit <n>", "how many", int("--limit"), 50)
    .action(async (o: { q?: string; limit: number }) => {
      const { c } = session("admin");
      const r = await c.admin.listRenters({ q: o.q, limit: o.limit });
      show(r, () => printTable(r.renters, [["id", (x) => x.id], ["name", (x) => x.name], ["email", (x) => x.email], ["status", (x) => x.status], ["balance (halala)", (x) => x.balanceHalala]]));
    });
  admin
    .command("jobs")
    .description("every job, newest first, with the total that matches the filters")
    .option("--status <status>")
    .option("--type <job_type>", "one job type")
    .option("--renter <id>", "one renter's", int("--renter"))
    .option("--provider <id>", "one provider's", int("--provider"))
    .option("--limit <n>", "how many", int("--limit"), 50)
    .option("--offset <n>", "skip this many", int("--offset"), 0)
    .action(async (o: { status?: string; type?: string; renter?: number; provider?: number; limit: number; offset: number }) => {
      const { c } = session("admin");
      const r = await c.admin.listJobs({
        status: o.status,
        jobType: o.type,
        renterId: o.renter === undefined ? undefined : BigInt(o.renter),
        providerId: o.provider === undefined ? undefined : BigInt(o.provider),
        limit: o.limit,
        offset: o.offset,
      });
      show(r, () => {
        printTable(r.jobs, [["job", (j) => j.jobId], ["type", (j) => j.jobType], ["status", (j) => statusColour(j.status)], ["renter", (j) => j.renterId], ["provider", (j) => j.providerId], ["submitted", (j) => j.submittedAt]]);
        console.log(`${o.offset + r.jobs.length > 0 ? `${o.offset + 1}-${o.offset + r.jobs.length}` : "none"} of ${r.total}`);
      });
    });
  admin
    .command("audit")
    .description("the audit log")
    .option("--action <action>")
    .option("--limit <n>", "how many", int("--limit"), 50)
    .action(async (o: { action?: string; limit: number }) => {
      const { c } = session("admin");
      const r = await c.admin.listAudit({ action: o.action, limit: o.limit });
      show(r, () => printTable(r.entries, [["when", (e) => e.createdAt], ["actor", (e) => e.actor], ["action", (e) => e.action], ["target", (e) => `${e.targetType} ${e.targetId}`]]));
    });
  receiptCommands(program, g, session, show);
  return program;
}

/** The answer of a proto message as the REST route writes it (src/shared/message-json.ts), for saving. */
const restJson = messageToJson;

/** The output format of a job's result object (as JobOutcome.output_format says it): an image's format, text or json. */
function outputFormatOf(obj: JsonObject): string {
  if (typeof obj.data === "string") return typeof obj.format === "string" && /^[a-z0-9]{1,10}$/.test(obj.format) ? obj.format : "png";
  if (typeof obj.response === "string") return "text";
  return "json";
}

function readJsonFile(file: string, what: string): unknown {
  let text: string;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (err) {
    throw new UsageError(`cannot read ${what} ${file}: ${(err as Error).message}`);
  }
  try {
    return JSON.parse(text);
  } catch {
    throw new UsageError(`${what} ${file} is not JSON`);
  }
}

function writeOrPrint(value: unknown, file: string | undefined, what: string, json: boolean) {
  const text = JSON.stringify(value, null, 2) + "\n";
  if (!file) return void process.stdout.write(text);
  fs.writeFileSync(file, text);
  if (json) printJson({ file, bytes: Buffer.byteLength(text) });
  else out(`${what} written to ${file}`);
}

/**
 * svc receipt get|keys|verify. `verify` needs no account and, with --keys, no network: the
 * receipt, the public keys and the output (optional) are files (src/shared/receipt.ts checks them).
 */
function receiptCommands(
  program: Command,
  g: () => Globals,
  session: (role?: Role | Role[]) => { c: Clients; p: Profile },
  show: (value: unknown, human: () => void) => void,
) {
  const receipt = program.command("receipt").description("signed job receipts: download them, and verify them offline with public keys");
  receipt
    .command("get")
    .argument("<job_id>")
    .option("-o, --out <file>", "write the receipt file here (default: print it)")
    .description("a settled job's signed receipt (its renter, its providers, admins)")
    .action(async (jobId: string, o: { out?: string }) => {
      const { c } = session();
      const r = await c.receipts.getJobReceipt({ jobId });
      writeOrPrint(restJson(JobReceiptSchema, r), o.out, "receipt", !!g().json);
    });
  receipt
    .command("keys")
    .option("-o, --out <file>", "write the public keys here (default: print them)")
    .option("--url <url>", "server to ask (default: the profile's)")
    .description("the public keys that verify receipts (server keys, retired ones included, and provider keys)")
    .action(async (o: { out?: string; url?: string }) => {
      const keys = await fetchKeys(o.url, session);
      writeOrPrint(keys, o.out, "keys", !!g().json);
    });
  receipt
    .command("verify")
    .argument("<file>", "a receipt file (svc receipt get, or GET /api/jobs/{job_id}/receipt)")
    .option("--keys <file>", "public keys (svc receipt keys, or GET /api/receipts/keys): no network at all")
    .option("--url <url>", "without --keys: read the public keys from this server (default: the profile's)")
    .option("--output <file>", "also check the job's output (its JSON result, or the output route's answer)")
    .description("check a receipt's signatures (server and provider attestation) and, with --output, the output")
    .addHelpText("after", "\nExit code 0 when everything checked holds, 6 when anything does not.")
    .action(async (file: string, o: { keys?: string; url?: string; output?: string }) => {
      const doc = readJsonFile(file, "receipt");
      const named = receiptKeyIds(doc);
      const keys = o.keys ? (readJsonFile(o.keys, "keys file") as PublishedKeys) : await fetchKeys(o.url, session, named);
      const output = o.output ? { value: readJsonFile(o.output, "output") } : undefined;
      const v = verifyReceipt(doc, keys, output);
      const body = (doc as { receipt?: Record<string, unknown> })?.receipt ?? {};
      show({ valid: v.ok, job_id: body.job_id ?? null, receipt_id: body.receipt_id ?? null, checks: v.checks, problems: v.problems }, () => {
        for (const line of v.checks) out(`${colour("ok", "green")}   ${line}`);
        for (const line of v.problems) out(`${colour("FAIL", "red")} ${line}`);
        out(v.ok ? `receipt ${String(body.receipt_id)} of job ${String(body.job_id)}: valid` : `receipt ${String(body.receipt_id ?? file)}: NOT valid`);
      });
      if (!v.ok) throw new Exit(EXIT.invalid);
    });
}

/** The key ids a receipt file names: its signer's and its provider attestation's. */
function receiptKeyIds(doc: unknown): string[] {
  const d = doc as { signature?: { key_id?: unknown }; receipt?: { provider_attestation?: { key_id?: unknown } } } | null;
  return [d?.signature?.key_id, d?.receipt?.provider_attestation?.key_id].filter((k): k is string => typeof k === "string" && k !== "");
}

/**
 * Published keys from --url (no credential: the route is public) or the profile's server: all of
 * them, page by page, or only those with the ids given (what one receipt names).
 */
async function fetchKeys(url: string | undefined, session: (role?: Role | Role[]) => { c: Clients; p: Profile }, ids?: string[]): Promise<PublishedKeys> {
  const c = url ? clientsFor({ url: checkBaseUrl(url, "--url"), role: "renter", secret: "" }) : session().c;
  const pages = [];
  if (ids) for (const keyId of ids) pages.push(await c.receipts.listReceiptKeys({ keyId }));
  else {
    for (let offset = 0; ; ) {
      const page = await c.receipts.listReceiptKeys({ limit: 1000, offset });
      pages.push(page);
      offset += page.providerKeys.length;
      if (page.providerKeys.length === 0 || offset >= Number(page.providerKeysTotal)) break;
    }
  }
  const json = pages.map((p) => restJson(ReceiptKeysSchema, p) as unknown as PublishedKeys);
  const byId = <T extends { key_id: string }>(list: T[]) => [...new Map(list.map((k) => [k.key_id, k])).values()];
  return { server_keys: byId(json.flatMap((j) => j.server_keys ?? [])), provider_keys: byId(json.flatMap((j) => j.provider_keys ?? [])) };
}

/** Runs svc with these arguments; resolves to the exit code. */
export async function main(argv: string[]): Promise<number> {
  // A reader that stops early (`svc jobs list | head`) is not an error: stop quietly, as other tools do.
  process.stdout.on("error", (err: NodeJS.ErrnoException) => {
    if (err.code === "EPIPE") process.exit(EXIT.ok);
    throw err;
  });
  const program = buildProgram();
  try {
    await program.parseAsync(argv, { from: "user" });
    return EXIT.ok;
  } catch (err) {
    if (err instanceof CommanderError) {
      // --help and --version are not errors; commander has printed its message.
      return err.exitCode === 0 ? EXIT.ok : EXIT.usage;
    }
    return reportError(err);
  }
}
