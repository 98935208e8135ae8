// Renter commands: balance, top-ups, submitting a job, /v1 usage.
import { Option, type Command } from "commander";
import { follow } from "../follow.js";
import { Exit, out, printFields, printJson, printJsonLine, printTable, sar, statusColour } from "../output.js";
import { buildParams, paramArg, PARAM_HELP, type ParamArg } from "../params.js";
import { idempotencyKeyOf, resendWithKey } from "../resend.js";
import { int, num, type Context } from "./context.js";

/** svc balance, topup and submit. */
export function addRenterCommands(program: Command, ctx: Context): void {
  const { globals: g, session, show } = ctx;
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
          ...(b.refundOwedHalala ? [["owed for refunded payments", `${b.refundOwedHalala} halala (not spendable; taken as funds come free)`] as [string, string]] : []),
        ]),
      );
    });

  program
    .command("topup")
    .description("add funds: sandbox payments are confirmed at once (outside production); card sources print a checkout URL")
    .requiredOption("--sar <amount>", "amount in SAR", num("--sar"))
    .addOption(new Option("--source <type>", "payment source").choices(["sandbox", "creditcard", "mada", "applepay"]).default("sandbox"))
    .option("--idempotency-key <key>", "the top-up's Idempotency-Key (default: a new one); a top-up sent again with it is not done twice")
    .action(async (o: { sar: number; source: string; idempotencyKey?: string }) => {
      const { c, p } = session("renter");
      const key = idempotencyKeyOf(o.idempotencyKey);
      const t = await resendWithKey("top-up", key, () => c.payments.topup({ amountSar: o.sar, sourceType: o.source, idempotencyKey: key }));
      const pay = t.payment!;
      if (o.source !== "sandbox") {
        return show(t, () => out(`payment ${pay.paymentId} (${sar(pay.amountHalala)}): pay at ${new URL(t.checkoutUrl, p.url)}`));
      }
      // Confirming a payment twice credits it once: sent again like the top-up.
      const confirmed = await resendWithKey("top-up", key, () => c.payments.confirmSandbox({ paymentId: pay.paymentId }));
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
    .option("--param-json <key=json>", "a job parameter given as JSON (repeatable); key=@FILE reads the JSON from FILE, key=@- from stdin (keeps secrets such as env values off the command line)", paramArg("param-json", paramArgs))
    .option("-d, --duration <minutes>", "duration estimate in minutes (the hold)", num("--duration"))
    .option("--priority <1-3>", "1 high, 2 normal, 3 low", int("--priority"))
    .option("--provider <id>", "run on this provider", int("--provider", "int64"))
    .option("--max-duration <seconds>", "hard limit of the run", int("--max-duration", "int64"))
    .option("--idempotency-key <key>", "the submit's Idempotency-Key (default: a new one); a submit sent again with it answers the first job")
    .option("-f, --follow", "watch the job until it ends")
    .option("-o, --out <file>", "with --follow: where to write the output")
    .addHelpText("after", PARAM_HELP)
    .action(async (type: string, o: { duration?: number; priority?: number; provider?: number; maxDuration?: number; idempotencyKey?: string; follow?: boolean; out?: string }) => {
      const { c } = session("renter");
      const key = idempotencyKeyOf(o.idempotencyKey);
      const request = {
        jobType: type,
        params: await buildParams(c, type, paramArgs),
        durationMinutes: o.duration,
        priority: o.priority,
        providerId: o.provider === undefined ? undefined : BigInt(o.provider),
        maxDurationSeconds: o.maxDuration === undefined ? undefined : BigInt(o.maxDuration),
        idempotencyKey: key,
      };
      const r = await resendWithKey("submit", key, () => c.jobs.submit(request));
      const job = r.job!.job!;
      // Following with --json: one JSON object per line, the submission first.
      if (g().json && o.follow) printJsonLine({ submitted: r });
      else if (g().json) printJson(r);
      else out(`submitted ${job.jobId}: ${statusColour(job.status)} — ${r.message} (estimate ${job.costHalala} halala held)`);
      if (o.follow) throw new Exit(await follow(c, job.jobId, { json: !!g().json, outFile: o.out }));
    });
}

/** svc usage. */
export function addUsageCommand(program: Command, ctx: Context): void {
  const { session, show } = ctx;
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
}
