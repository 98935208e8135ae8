// Operator pages (admin token): dashboard, providers and approval, renters
// (suspension, balance adjustments, quotas), jobs, payments, the audit log,
// registry requests and the receipt keys (receipt-keys.tsx).
import { useRef, useState } from "preact/hooks";
import type { Provider, Renter, RenterQuota } from "../../../gen/svc/v1/models_pb.js";
import { api } from "../api.js";
import { ago, dayToSeconds, idFilter, parseSar, refunded, sar, when } from "../format.js";
import { href } from "../router.js";
import { Card, Chart, DataTable, Empty, ErrorBox, Field, FilterInput, Pager, Show, Stat, StatusBadge, useAction, useId, useLoad, usePaging } from "../ui.js";
import { JobPage } from "./job.js";
import { ReceiptKeysPage } from "./receipt-keys.js";
import { JobTable } from "./renter.js";

export const OPERATOR_NAV: [string, string][] = [
  ["", "Dashboard"], ["providers", "Providers"], ["renters", "Renters"], ["jobs", "Jobs"], ["payments", "Payments"], ["audit", "Audit"], ["registry", "Registry"],
  ["receipt-keys", "Receipt keys"],
];

export function OperatorPages({ route }: { route: string[] }) {
  const [page, id] = route;
  if (page === "providers") return <ProvidersPage />;
  if (page === "renters" && id) return <RenterPage id={id} />;
  if (page === "renters") return <RentersPage />;
  if (page === "jobs" && id) return <JobPage jobId={id} back={["admin", "jobs"]} />;
  if (page === "jobs") return <JobsPage />;
  if (page === "payments") return <PaymentsPage />;
  if (page === "audit") return <AuditPage />;
  if (page === "registry") return <RegistryPage />;
  if (page === "receipt-keys") return <ReceiptKeysPage />;
  return <DashboardPage />;
}

/** A reading with its unit, or "—" alone when the daemon did not report it. */
const figure = (v: number | undefined, unit: string) => (v === undefined ? "—" : `${v}${unit}`);

function DashboardPage() {
  const dash = useLoad(() => api.admin.getDashboard({}), [], 10_000);
  const daily = useLoad(() => api.reports.getPlatformDaily({ days: 14 }), [], 30_000);
  return (
    <>
      <h1>Dashboard</h1>
      <Show l={dash} what="dashboard">
        {(d) => {
          const s = d.stats!;
          return (
            <>
              <Card title="Now" actions={<span class="muted">as of {when(s.timestamp)}</span>}>
                <div class="stats">
                  <Stat label="Providers" value={String(s.totalProviders)} testid="total-providers" />
                  <Stat label="Online now" value={String(s.onlineNow)} testid="online-now" />
                  <Stat label="Renters" value={String(s.totalRenters)} testid="total-renters" />
                  <Stat label="Jobs" value={String(s.totalJobs)} testid="total-jobs" />
                  <Stat label="Active jobs" value={String(s.activeJobs)} />
                  <Stat label="Completed" value={String(s.completedJobs)} testid="completed-jobs" />
                  <Stat label="Failed" value={String(s.failedJobs)} />
                  <Stat label="Revenue" value={sar(s.totalRevenueHalala)} testid="revenue" />
                  <Stat label="Platform fees" value={sar(s.totalSvcFeesHalala)} />
                  <Stat label="Revenue today" value={sar(s.todayRevenueHalala)} />
                  <Stat label="Renter balances" value={sar(s.totalRenterBalanceHalala)} />
                </div>
              </Card>
              <Card title="Providers online by GPU model">
                {d.gpuBreakdown.length === 0 ? (
                  <Empty>No providers yet. Providers register from the console's Provider tab or the API, then appear here for approval.</Empty>
                ) : (
                  <Chart title="Providers by GPU model" x={d.gpuBreakdown.map((_, i) => i)} labels={d.gpuBreakdown.map((g) => g.gpuModel.replace(/^NVIDIA (GeForce )?/, ""))}
                    series={[
                      { label: "Online", values: d.gpuBreakdown.map((g) => Number(g.online)), color: "#16a34a", bars: true },
                      { label: "All", values: d.gpuBreakdown.map((g) => Number(g.providers)), color: "#94a3b8", bars: true },
                    ]} />
                )}
              </Card>
              <Card title="Recent heartbeats">
                <DataTable rows={d.recentHeartbeats} empty="No heartbeats yet: no daemon has connected." columns={[
                  { head: "Provider", cell: (h) => `${h.name} #${h.providerId}` },
                  { head: "GPU", cell: (h) => h.gpuModel },
                  { head: "Status", cell: (h) => <StatusBadge status={h.status} /> },
                  { head: "Heard", cell: (h) => ago(h.lastHeartbeat) },
                  { head: "Util.", cell: (h) => figure(h.gpuUtilPct, "%") },
                  { head: "Temp.", cell: (h) => figure(h.tempC, " °C") },
                ]} />
              </Card>
            </>
          );
        }}
      </Show>
      <Card title="Last 14 days">
        <Show l={daily} what="daily figures">
          {(r) => (
            <div class="charts">
              <Chart title="Revenue per day (SAR)" x={r.days.map((x) => dayToSeconds(x.day))}
                series={[
                  { label: "Revenue", values: r.days.map((x) => Number(x.revenueHalala) / 100), color: "#2563eb", bars: true },
                  { label: "Platform fees", values: r.days.map((x) => Number(x.svcFeesHalala) / 100), color: "#f59e0b", bars: true },
                ]} />
              <Chart title="Jobs per day" x={r.days.map((x) => dayToSeconds(x.day))}
                series={[
                  { label: "Submitted", values: r.days.map((x) => Number(x.jobs)), color: "#7c3aed" },
                  { label: "Completed", values: r.days.map((x) => Number(x.completedJobs)), color: "#16a34a" },
                ]} />
            </div>
          )}
        </Show>
      </Card>
    </>
  );
}

function ProviderActions({ p, onDone }: { p: Provider; onDone(): void }) {
  const a = useAction();
  const act = (fn: () => Promise<unknown>) => void a.run(async () => { await fn(); onDone(); });
  const id = { id: p.id };
  // As for a renter: the reason goes to the audit log; cancelling the question suspends nothing.
  const suspend = () => {
    const reason = prompt(`Suspend ${p.name}? It gets no jobs until it is unsuspended, and its jobs are re-queued.\nReason (optional, kept in the audit log):`);
    if (reason === null) return;
    act(() => api.admin.suspendProvider({ ...id, ...(reason.trim() ? { reason: reason.trim() } : {}) }));
  };
  return (
    <div class="actions">
      {p.approvalStatus !== "approved" ? <button onClick={() => act(() => api.admin.approveProvider(id))} disabled={a.busy} aria-label={`Approve ${p.name}`}>Approve</button> : null}
      {p.approvalStatus === "pending" ? (
        <button class="secondary" disabled={a.busy} aria-label={`Reject ${p.name}`}
          onClick={() => { const reason = prompt(`Why reject ${p.name}?`); if (reason) act(() => api.admin.rejectProvider({ ...id, reason })); }}>Reject</button>
      ) : null}
      {p.status === "suspended" ? (
        <button class="secondary" disabled={a.busy} onClick={() => act(() => api.admin.unsuspendProvider(id))} aria-label={`Unsuspend ${p.name}`}>Unsuspend</button>
      ) : (
        <button class="danger" disabled={a.busy} onClick={suspend} aria-label={`Suspend ${p.name}`}>Suspend</button>
      )}
      <ErrorBox error={a.error} />
    </div>
  );
}

function ProvidersPage() {
  const [approval, setApproval] = useState("pending");
  const [q, setQ] = useState("");
  const ids = { approval: useId("approval"), q: useId("q") };
  const paging = usePaging(100, [approval, q]);
  const list = useLoad(
    () => api.admin.listProviders({ limit: paging.limit, offset: paging.offset, ...(approval ? { approvalStatus: approval } : {}), ...(q ? { q } : {}) }),
    [approval, q, paging.offset],
  );
  return (
    <>
      <h1>Providers</h1>
      <Card title={approval === "pending" ? "Waiting for approval" : "Providers"}>
        <div class="filters">
          <Field id={ids.approval} label="Approval">
            <select id={ids.approval} value={approval} onChange={(e) => setApproval((e.target as HTMLSelectElement).value)}>
              <option value="pending">pending</option><option value="approved">approved</option><option value="rejected">rejected</option><option value="">any</option>
            </select>
          </Field>
          <Field id={ids.q} label="Search name or email">
            <FilterInput id={ids.q} search value={q} onApply={setQ} />
          </Field>
        </div>
        <Show l={list} what="providers">
          {(r) => (
            <>
              <DataTable rows={r.providers} rowAttrs={(p) => ({ "data-provider": String(p.id) })}
                empty={approval === "pending" ? "No provider waits for approval." : "No provider matches these filters."}
                columns={[
                  { head: "Provider", cell: (p) => <>{p.name} #{String(p.id)}<br /><small>{p.email}</small></> },
                  { head: "GPU", cell: (p) => p.gpuModel },
                  { head: "Runs", cell: (p) => (p.supportedJobTypes.length ? p.supportedJobTypes.join(", ") : "any job type") },
                  { head: "Status", cell: (p) => <StatusBadge status={p.status} /> },
                  { head: "Approval", cell: (p) => <StatusBadge status={p.approvalStatus} /> },
                  { head: "Heard", cell: (p) => ago(p.lastHeartbeat) },
                  { head: "Actions", cell: (p) => <ProviderActions p={p} onDone={list.reload} /> },
                ]} />
              <Pager paging={paging} page={r} shown={r.providers.length} />
            </>
          )}
        </Show>
      </Card>
    </>
  );
}

function RentersPage() {
  const [q, setQ] = useState("");
  const [status, setStatus] = useState("");
  const ids = { q: useId("rq"), status: useId("rstatus") };
  const paging = usePaging(100, [q, status]);
  const list = useLoad(
    () => api.admin.listRenters({ limit: paging.limit, offset: paging.offset, ...(q ? { q } : {}), ...(status ? { status } : {}) }),
    [q, status, paging.offset],
  );
  return (
    <>
      <h1>Renters</h1>
      <Card title="Renters">
        <div class="filters">
          <Field id={ids.q} label="Search name or email">
            <FilterInput id={ids.q} search value={q} onApply={setQ} />
          </Field>
          <Field id={ids.status} label="Status">
            <select id={ids.status} value={status} onChange={(e) => setStatus((e.target as HTMLSelectElement).value)}>
              <option value="">any</option><option value="active">active</option><option value="suspended">suspended</option>
            </select>
          </Field>
        </div>
        <Show l={list} what="renters">
          {(r) => (
            <>
              <DataTable rows={r.renters} rowAttrs={(x) => ({ "data-renter": String(x.id) })}
                empty="No renter matches. Renters sign up from the console's Renter tab." columns={[
                { head: "Renter", cell: (x) => <><a href={href("admin", "renters", String(x.id))}>{x.name}</a> #{String(x.id)}<br /><small>{x.email}</small></> },
                { head: "Status", cell: (x) => <StatusBadge status={x.status} /> },
                { head: "Balance", cell: (x) => sar(x.balanceHalala) },
                { head: "Held", cell: (x) => sar(x.heldHalala) },
                { head: "Spent", cell: (x) => sar(x.totalSpentHalala) },
                { head: "Jobs", cell: (x) => String(x.totalJobs) },
                { head: "Since", cell: (x) => when(x.createdAt) },
                { head: "Actions", cell: (x) => <RenterActions r={x} onDone={list.reload} /> },
              ]} />
              <Pager paging={paging} page={r} shown={r.renters.length} />
            </>
          )}
        </Show>
      </Card>
    </>
  );
}

/**
 * Suspend (asking for a reason for the audit log; cancelling the question
 * suspends nothing) or unsuspend a renter. A suspended renter's key is refused
 * and its queued jobs wait until it is unsuspended; with "stop its jobs"
 * ticked, its active jobs are cancelled too (stop_jobs), and how many is said.
 */
function RenterActions({ r, onDone }: { r: Renter; onDone(): void }) {
  const a = useAction();
  const [stopJobs, setStopJobs] = useState(false);
  const [done, setDone] = useState<string>();
  const stopId = useId("stop-jobs");
  const act = (fn: () => Promise<unknown>) => void a.run(async () => { await fn(); onDone(); });
  const suspend = () => {
    const jobs = stopJobs
      ? "Its queued and running jobs are cancelled now (a running job pays the time it used)."
      : "Its running jobs run on; its queued jobs wait until it is unsuspended.";
    const reason = prompt(`Suspend ${r.name}? Its key is refused until it is unsuspended. ${jobs}\nReason (optional, kept in the audit log):`);
    if (reason === null) return;
    setDone(undefined);
    act(async () => {
      const res = await api.admin.suspendRenter({ id: r.id, ...(reason.trim() ? { reason: reason.trim() } : {}), ...(stopJobs ? { stopJobs: true } : {}) });
      if (stopJobs) setDone(`${String(res.jobsStopped ?? 0n)} ${res.jobsStopped === 1n ? "job" : "jobs"} stopped.`);
    });
  };
  return (
    <div class="actions">
      {r.status === "suspended" ? (
        <button class="secondary" disabled={a.busy} onClick={() => act(() => api.admin.unsuspendRenter({ id: r.id }))} aria-label={`Unsuspend ${r.name}`}>Unsuspend</button>
      ) : (
        <>
          <button class="danger" disabled={a.busy} onClick={suspend} aria-label={`Suspend ${r.name}`}>Suspend</button>
          <span class="check">
            <input id={stopId} type="checkbox" checked={stopJobs} aria-label={`Stop ${r.name}'s jobs when suspending`}
              onChange={(e) => setStopJobs((e.target as HTMLInputElement).checked)} />
            <label for={stopId}>stop its jobs</label>
          </span>
        </>
      )}
      {done ? <p class="ok" role="status">{done}</p> : null}
      <ErrorBox error={a.error} />
    </div>
  );
}

/** One renter: its account and quota, suspension, balance adjustments, its latest jobs. */
function RenterPage({ id }: { id: string }) {
  const renterId = idFilter("The renter id", id);
  const account = useLoad(async () => {
    if (renterId.id === undefined) throw new Error(renterId.error ?? "No renter id.");
    return api.admin.getRenter({ id: renterId.id });
  }, [id]);
  const jobs = useLoad(async () => (renterId.id === undefined ? undefined : api.admin.listJobs({ renterId: renterId.id, limit: 20 })), [id]);
  // A suspension with "stop its jobs" cancels them: the jobs listed below are read again with the account.
  const reload = () => {
    account.reload();
    jobs.reload();
  };
  return (
    <>
      <p><a href={href("admin", "renters")}>← Renters</a></p>
      <h1>Renter #{id}</h1>
      <Show l={account} what="renter">
        {(d) => {
          const r = d.renter!;
          return (
            <>
              <Card title="Account">
                <div class="stats">
                  <Stat label="Balance" value={sar(r.balanceHalala)} testid="renter-balance" />
                  <Stat label="Held for running jobs" value={sar(r.heldHalala)} />
                  <Stat label="Spent so far" value={sar(r.totalSpentHalala)} />
                  <Stat label="Jobs" value={String(r.totalJobs)} />
                </div>
                <dl class="facts" data-testid="renter-facts">
                  <dt>Name</dt><dd>{r.name}</dd>
                  <dt>Email</dt><dd>{r.email}</dd>
                  {r.organization ? <><dt>Organization</dt><dd>{r.organization}</dd></> : null}
                  <dt>Status</dt><dd><StatusBadge status={r.status} /></dd>
                  <dt>Since</dt><dd>{when(r.createdAt)}</dd>
                  <dt>Jobs per UTC day</dt><dd>at most {String(d.quota?.dailyJobsLimit ?? "—")}</dd>
                  <dt>Spend per UTC month</dt><dd>at most {sar(d.quota?.monthlySpendLimitHalala)}</dd>
                </dl>
                <RenterActions r={r} onDone={reload} />
              </Card>
              <div class="grid2">
                <AdjustBalance r={r} onDone={account.reload} />
                <QuotaForm r={r} quota={d.quota} onDone={account.reload} />
              </div>
            </>
          );
        }}
      </Show>
      {renterId.id !== undefined ? (
        <Card title="Latest jobs">
          <Show l={jobs} what="jobs">
            {(j) => <JobTable jobs={j?.jobs ?? []} base={["admin", "jobs"]} empty="This renter has no jobs yet." />}
          </Show>
        </Card>
      ) : null}
    </>
  );
}

/**
 * Credits or debits a renter, with a required reason (kept on the ledger and in
 * the audit log). The adjustment the form holds keeps one Idempotency-Key until
 * it succeeds or its amount or reason changes: a double submit or a retry after
 * a lost answer moves the money once.
 */
function AdjustBalance({ r, onDone }: { r: Renter; onDone(): void }) {
  const [amount, setAmount] = useState("");
  const [reason, setReason] = useState("");
  const [done, setDone] = useState<string>();
  const held = useRef<{ halala: bigint; reason: string; key: string } | undefined>(undefined);
  const a = useAction();
  const ids = { amount: useId("adjust-amount"), reason: useId("adjust-reason") };
  const submit = (e: Event) => {
    e.preventDefault();
    setDone(undefined);
    const halala = parseSar(amount);
    const why = reason.trim();
    if (halala === undefined || halala === 0n) return a.setError("The amount must be a number of SAR other than 0, with at most two decimals (e.g. 12.50, or -3 to debit).");
    if (!why) return a.setError("Give a reason: it is kept with the adjustment and in the audit log.");
    if (held.current?.halala !== halala || held.current.reason !== why) held.current = { halala, reason: why, key: crypto.randomUUID() };
    const req = { id: r.id, amountHalala: halala, reason: why, idempotencyKey: held.current.key };
    void a.run(async () => {
      await api.admin.adjustBalance(req);
      if (held.current?.key === req.idempotencyKey) held.current = undefined;
      setAmount("");
      setReason("");
      setDone(`${halala > 0n ? "Credited" : "Debited"} ${sar(halala > 0n ? halala : -halala)}.`);
      onDone();
    });
  };
  return (
    <Card title="Adjust balance">
      <form onSubmit={submit}>
        <Field id={ids.amount} label="Amount (SAR)" hint="Positive credits the renter, negative debits it (never below its available funds).">
          <input id={ids.amount} type="number" step="0.01" required value={amount} aria-describedby={`${ids.amount}-hint`}
            onInput={(e) => setAmount((e.target as HTMLInputElement).value)} />
        </Field>
        <Field id={ids.reason} label="Reason" hint="Required; kept on the ledger and in the audit log.">
          <input id={ids.reason} required maxLength={1000} value={reason} aria-describedby={`${ids.reason}-hint`}
            onInput={(e) => setReason((e.target as HTMLInputElement).value)} />
        </Field>
        <ErrorBox error={a.error} />
        {done ? <p class="ok" role="status">{done}</p> : null}
        <div class="buttons"><button type="submit" disabled={a.busy}>Adjust balance</button></div>
      </form>
    </Card>
  );
}

/** Sets either or both of a renter's limits; a field left blank keeps its limit. */
function QuotaForm({ r, quota, onDone }: { r: Renter; quota?: RenterQuota; onDone(): void }) {
  const [daily, setDaily] = useState("");
  const [monthly, setMonthly] = useState("");
  const [done, setDone] = useState<string>();
  const a = useAction();
  const ids = { daily: useId("quota-daily"), monthly: useId("quota-monthly") };
  const submit = (e: Event) => {
    e.preventDefault();
    setDone(undefined);
    const d = daily.trim();
    const m = monthly.trim();
    if (!d && !m) return a.setError("Give a daily job limit, a monthly spend limit or both.");
    if (d && !/^\d{1,13}$/.test(d)) return a.setError("The daily job limit must be a whole number, 0 or more.");
    const spend = m ? parseSar(m) : undefined;
    if (m && (spend === undefined || spend < 0n)) return a.setError("The monthly spend limit must be a number of SAR, 0 or more, with at most two decimals.");
    void a.run(async () => {
      await api.admin.setQuota({ id: r.id, ...(d ? { dailyJobsLimit: BigInt(d) } : {}), ...(spend !== undefined ? { monthlySpendLimitHalala: spend } : {}) });
      setDaily("");
      setMonthly("");
      setDone("Quota saved.");
      onDone();
    });
  };
  return (
    <Card title="Quota">
      <form onSubmit={submit}>
        <Field id={ids.daily} label="Jobs per UTC day" hint={`Now ${quota ? String(quota.dailyJobsLimit) : "—"}; blank keeps it.`}>
          <input id={ids.daily} type="number" min={0} step={1} value={daily} aria-describedby={`${ids.daily}-hint`}
            onInput={(e) => setDaily((e.target as HTMLInputElement).value)} />
        </Field>
        <Field id={ids.monthly} label="Spend per UTC month (SAR)" hint={`Now ${sar(quota?.monthlySpendLimitHalala)}; blank keeps it.`}>
          <input id={ids.monthly} type="number" min={0} step="0.01" value={monthly} aria-describedby={`${ids.monthly}-hint`}
            onInput={(e) => setMonthly((e.target as HTMLInputElement).value)} />
        </Field>
        <ErrorBox error={a.error} />
        {done ? <p class="ok" role="status">{done}</p> : null}
        <div class="buttons"><button type="submit" disabled={a.busy}>Save quota</button></div>
      </form>
    </Card>
  );
}

/** The first thing wrong with a page's filters, shown instead of a list they do not select. */
const filterError = (...fs: { error?: string }[]) => fs.find((f) => f.error)?.error;

function JobsPage() {
  const [f, setF] = useState({ status: "", jobType: "", renter: "", provider: "" });
  const ids = { status: useId("jstatus"), type: useId("jtype"), renter: useId("jrenter"), provider: useId("jprov") };
  const set = (k: keyof typeof f) => (v: string) => setF({ ...f, [k]: v });
  const renter = idFilter("Renter id", f.renter);
  const provider = idFilter("Provider id", f.provider);
  const bad = filterError(renter, provider);
  const paging = usePaging(100, [f.status, f.jobType, f.renter, f.provider]);
  const list = useLoad(
    async () => {
      if (bad) throw new Error(bad);
      return api.admin.listJobs({
        limit: paging.limit,
        offset: paging.offset,
        ...(f.status ? { status: f.status } : {}),
        ...(f.jobType ? { jobType: f.jobType } : {}),
        ...(renter.id !== undefined ? { renterId: renter.id } : {}),
        ...(provider.id !== undefined ? { providerId: provider.id } : {}),
      });
    },
    [f.status, f.jobType, f.renter, f.provider, paging.offset],
    5000,
  );
  return (
    <>
      <h1>Jobs</h1>
      <Card title="All jobs">
        <div class="filters">
          <Field id={ids.status} label="Status">
            <select id={ids.status} value={f.status} onChange={(e) => set("status")((e.target as HTMLSelectElement).value)}>
              {["", "queued", "pending", "running", "completed", "failed", "cancelled"].map((s) => <option value={s}>{s || "any"}</option>)}
            </select>
          </Field>
          <Field id={ids.type} label="Job type"><FilterInput id={ids.type} value={f.jobType} onApply={set("jobType")} /></Field>
          <Field id={ids.renter} label="Renter id"><FilterInput id={ids.renter} numeric invalid={!!renter.error} value={f.renter} onApply={set("renter")} /></Field>
          <Field id={ids.provider} label="Provider id"><FilterInput id={ids.provider} numeric invalid={!!provider.error} value={f.provider} onApply={set("provider")} /></Field>
        </div>
        {bad ? <ErrorBox error={bad} /> : (
          <Show l={list} what="jobs">
            {(r) => (
              <>
                <JobTable jobs={r.jobs} base={["admin", "jobs"]} empty="No job matches these filters." />
                <Pager paging={paging} page={r} shown={r.jobs.length} />
              </>
            )}
          </Show>
        )}
      </Card>
    </>
  );
}

function PaymentsPage() {
  const [status, setStatus] = useState("");
  const [renter, setRenter] = useState("");
  const ids = { status: useId("pstatus"), renter: useId("prenter") };
  const renterId = idFilter("Renter id", renter);
  const bad = filterError(renterId);
  const paging = usePaging(100, [status, renter]);
  const list = useLoad(
    async () => {
      if (bad) throw new Error(bad);
      return api.admin.listPayments({
        limit: paging.limit,
        offset: paging.offset,
        ...(status ? { status } : {}),
        ...(renterId.id !== undefined ? { renterId: renterId.id } : {}),
      });
    },
    [status, renter, paging.offset],
  );
  return (
    <>
      <h1>Payments</h1>
      <Card title="Payments">
        <div class="filters">
          <Field id={ids.status} label="Status">
            <select id={ids.status} value={status} onChange={(e) => setStatus((e.target as HTMLSelectElement).value)}>
              {["", "initiated", "paid", "failed", "refunded"].map((s) => <option value={s}>{s || "any"}</option>)}
            </select>
          </Field>
          <Field id={ids.renter} label="Renter id"><FilterInput id={ids.renter} numeric invalid={!!renterId.error} value={renter} onApply={setRenter} /></Field>
        </div>
        {bad ? <ErrorBox error={bad} /> : (
          <Show l={list} what="payments">
            {(r) => (
              <>
                <DataTable rows={r.payments} empty="No payment matches these filters." columns={[
                  { head: "Payment", class: "mono", cell: (p) => p.paymentId },
                  { head: "Renter", cell: (p) => `#${p.renterId}` },
                  { head: "Amount", cell: (p) => sar(p.amountHalala) },
                  { head: "Source", cell: (p) => p.sourceType },
                  { head: "Status", cell: (p) => <StatusBadge status={p.status} /> },
                  { head: "Refunded", cell: (p) => refunded(p) },
                  { head: "Created", cell: (p) => when(p.createdAt) },
                ]} />
                <Pager paging={paging} page={r} shown={r.payments.length} />
              </>
            )}
          </Show>
        )}
      </Card>
    </>
  );
}

function AuditPage() {
  const [action, setAction] = useState("");
  const [target, setTarget] = useState("");
  const ids = { action: useId("aaction"), target: useId("atarget") };
  const paging = usePaging(100, [action, target]);
  const list = useLoad(
    () => api.admin.listAudit({ limit: paging.limit, offset: paging.offset, ...(action ? { action } : {}), ...(target ? { targetType: target } : {}) }),
    [action, target, paging.offset],
  );
  return (
    <>
      <h1>Audit log</h1>
      <Card title="Operator actions">
        <div class="filters">
          <Field id={ids.action} label="Action"><FilterInput id={ids.action} value={action} placeholder="e.g. provider.approve" onApply={setAction} /></Field>
          <Field id={ids.target} label="Target type"><FilterInput id={ids.target} value={target} placeholder="provider, renter, job" onApply={setTarget} /></Field>
        </div>
        <Show l={list} what="audit log">
          {(r) => (
            <>
              <DataTable rows={r.entries} empty="Nothing recorded yet: approvals, suspensions and adjustments appear here." columns={[
                { head: "When", cell: (e) => when(e.createdAt) },
                { head: "Actor", cell: (e) => e.actor },
                { head: "Action", cell: (e) => e.action },
                { head: "Target", cell: (e) => `${e.targetType} ${e.targetId}` },
                { head: "Details", class: "mono small", cell: (e) => JSON.stringify(e.details ?? {}) },
              ]} />
              <Pager paging={paging} page={r} shown={r.entries.length} />
            </>
          )}
        </Show>
      </Card>
    </>
  );
}

function RegistryPage() {
  const paging = usePaging(50, []);
  const list = useLoad(() => api.registry.listRequests({ limit: paging.limit, offset: paging.offset }), [paging.offset]);
  const a = useAction();
  // The public description each pending image gets when approved (GET /api/registry/images shows it);
  // the renter's reason is private to it and the operator.
  const [descriptions, setDescriptions] = useState<Record<string, string>>({});
  return (
    <>
      <h1>Registry requests</h1>
      <Card title="Images renters asked for">
        <ErrorBox error={a.error} />
        <Show l={list} what="registry requests">
          {(r) => (
            <>
              <DataTable rows={r.requests} empty="No image requests. Renters ask for container images with POST /api/registry/requests." columns={[
                { head: "Image", class: "mono", cell: (x) => x.image },
                { head: "Status", cell: (x) => <StatusBadge status={x.status} /> },
                { head: "Requested", cell: (x) => when(x.createdAt) },
                { head: "Renter's reason (private)", cell: (x) => x.reason ?? "" },
                {
                  head: "Actions",
                  cell: (x) => x.status === "pending" ? (
                    <div class="actions">
                      <input
                        aria-label={`Public description of ${x.image}`}
                        placeholder="Public description (optional)"
                        maxLength={1000}
                        value={descriptions[String(x.id)] ?? ""}
                        onInput={(e) => setDescriptions({ ...descriptions, [String(x.id)]: (e.target as HTMLInputElement).value })}
                      />
                      <button disabled={a.busy} onClick={() => void a.run(async () => { await api.registry.approveRequest({ id: x.id, description: descriptions[String(x.id)]?.trim() || undefined }); list.reload(); })}>Approve</button>
                      <button class="secondary" disabled={a.busy} onClick={() => void a.run(async () => { await api.registry.rejectRequest({ id: x.id }); list.reload(); })}>Reject</button>
                    </div>
                  ) : null,
                },
              ]} />
              <Pager paging={paging} page={r} shown={r.requests.length} />
            </>
          )}
        </Show>
      </Card>
    </>
  );
}
