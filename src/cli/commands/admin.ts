// svc admin: providers and their approval, platform figures, renters and
// their suspension, every job, the audit log (an admin profile).
import type { Command } from "commander";
import { apiJson, out, printFields, sar, statusColour } from "../output.js";
import { int, listCommand, type Context } from "./context.js";

/** "N halala (x.xx SAR)". */
const halala = (v: bigint | number | undefined) => (v === undefined ? undefined : `${v} halala (${sar(v)})`);

export function addAdminCommands(program: Command, ctx: Context): void {
  const { session, show } = ctx;
  const admin = program.command("admin").description("operator commands (an admin profile)");
  listCommand(ctx, admin.command("providers").description("providers").option("--pending", "only those waiting for approval").option("--status <status>"), {
    role: "admin",
    limit: 50,
    fetch: (c, o: { pending?: boolean; status?: string; limit: number; offset: number }) =>
      c.admin.listProviders({ approvalStatus: o.pending ? "pending" : undefined, status: o.status, limit: o.limit, offset: o.offset }),
    rows: (r) => r.providers,
    columns: [
      ["id", (p) => p.id],
      ["name", (p) => p.name],
      ["gpu", (p) => p.gpuModel],
      ["status", (p) => p.status],
      ["approval", (p) => p.approvalStatus],
      ["last heartbeat", (p) => p.lastHeartbeat],
    ],
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
        const req = { id: BigInt(int("provider_id", "int64")(id)), reason: o.reason };
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
    .command("suspend-renter")
    .argument("<renter_id>")
    .description("suspend a renter: its key is refused and its queued jobs wait; --stop-jobs cancels its active jobs too")
    .option("--reason <text>", "why (kept in the audit log)")
    .option("--stop-jobs", "also cancel its queued, pending and running jobs (a running job pays the time it used)")
    .action(async (id: string, o: { reason?: string; stopJobs?: boolean }) => {
      const { c } = session("admin");
      const r = await c.admin.suspendRenter({ id: BigInt(int("renter_id", "int64")(id)), reason: o.reason, stopJobs: o.stopJobs });
      const stopped = r.jobsStopped ?? 0n;
      show(r, () => out(`renter ${id}: suspended${o.stopJobs ? `; ${stopped} ${stopped === 1n ? "job" : "jobs"} stopped` : ""}`));
    });
  admin
    .command("unsuspend-renter")
    .argument("<renter_id>")
    .description("unsuspend a renter: its key works again and its queued jobs are offered to providers")
    .option("--reason <text>", "why (kept in the audit log)")
    .action(async (id: string, o: { reason?: string }) => {
      const { c } = session("admin");
      const r = await c.admin.unsuspendRenter({ id: BigInt(int("renter_id", "int64")(id)), reason: o.reason });
      show(r, () => out(`renter ${id}: unsuspended`));
    });
  admin
    .command("dashboard")
    .description("platform figures")
    .action(async () => {
      const { c } = session("admin");
      const d = await c.admin.getDashboard({});
      const stats = (apiJson(d.stats ?? {}) ?? {}) as Record<string, unknown>;
      show(d, () => printFields(Object.entries(stats).map(([k, v]) => (k.endsWith("_halala") ? [k.slice(0, -7).replace(/_/g, " "), halala(v as number)] : [k.replace(/_/g, " "), v]))));
    });
  listCommand(ctx, admin.command("renters").description("renters").option("--q <text>", "search name or email"), {
    role: "admin",
    limit: 50,
    fetch: (c, o: { q?: string; limit: number; offset: number }) => c.admin.listRenters({ q: o.q, limit: o.limit, offset: o.offset }),
    rows: (r) => r.renters,
    columns: [["id", (x) => x.id], ["name", (x) => x.name], ["email", (x) => x.email], ["status", (x) => x.status], ["balance (halala)", (x) => x.balanceHalala]],
  });
  listCommand(
    ctx,
    admin
      .command("jobs")
      .description("every job, newest first, with the total that matches the filters")
      .option("--status <status>")
      .option("--type <job_type>", "one job type")
      .option("--renter <id>", "one renter's", int("--renter", "int64"))
      .option("--provider <id>", "one provider's", int("--provider", "int64")),
    {
      role: "admin",
      limit: 50,
      fetch: (c, o: { status?: string; type?: string; renter?: number; provider?: number; limit: number; offset: number }) =>
        c.admin.listJobs({
          status: o.status,
          jobType: o.type,
          renterId: o.renter === undefined ? undefined : BigInt(o.renter),
          providerId: o.provider === undefined ? undefined : BigInt(o.provider),
          limit: o.limit,
          offset: o.offset,
        }),
      rows: (r) => r.jobs,
      columns: [["job", (j) => j.jobId], ["type", (j) => j.jobType], ["status", (j) => statusColour(j.status)], ["renter", (j) => j.renterId], ["provider", (j) => j.providerId], ["submitted", (j) => j.submittedAt]],
    },
  );
  listCommand(ctx, admin.command("audit").description("the audit log").option("--action <action>"), {
    role: "admin",
    limit: 50,
    fetch: (c, o: { action?: string; limit: number; offset: number }) => c.admin.listAudit({ action: o.action, limit: o.limit, offset: o.offset }),
    rows: (r) => r.entries,
    columns: [["when", (e) => e.createdAt], ["actor", (e) => e.actor], ["action", (e) => e.action], ["target", (e) => `${e.targetType} ${e.targetId}`]],
  });
}
