// svc provider: status, earnings, jobs run, pause and resume, preferences.
import { Option, type Command } from "commander";
import { out, printFields, printTable, sar, statusColour } from "../output.js";
import { int, num, type Context } from "./context.js";
import { jobList } from "./jobs.js";

export function addProviderCommands(program: Command, ctx: Context): void {
  const { session, show } = ctx;
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
          ["job types", pr.supportedJobTypes.length ? pr.supportedJobTypes.join(", ") : "any (its daemon declares none)"],
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
  jobList(ctx, provider.command("jobs").description("jobs run on this provider").option("--status <status>"), "provider", [["earned (halala)", (j) => j.providerEarnedHalala]]);
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
}
