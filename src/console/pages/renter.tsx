// Renter pages: balance and top-up, jobs, the submit form, a job, /v1 usage and the key.
import type { ComponentChildren } from "preact";
import { useState } from "preact/hooks";
import type { Job } from "../../../gen/svc/v1/models_pb.js";
import { api } from "../api.js";
import { ago, dayToSeconds, refunded, sar, when } from "../format.js";
import { href } from "../router.js";
import { settings } from "../settings.js";
import { Card, Chart, DataTable, Empty, ErrorBox, Field, Pager, Show, Stat, StatusBadge, useAction, useId, useLoad, usePaging } from "../ui.js";
import { JobPage } from "./job.js";
import { RotateKey } from "./rotate-key.js";
import { SubmitPage } from "./submit.js";

export const RENTER_NAV: [string, string][] = [["", "Balance"], ["jobs", "Jobs"], ["submit", "New job"], ["account", "Usage & key"]];

export function RenterPages({ route }: { route: string[] }) {
  const [page, id] = route;
  if (page === "jobs" && id) return <JobPage jobId={id} back={["renter", "jobs"]} />;
  if (page === "jobs") return <JobsPage />;
  if (page === "submit") return <SubmitPage />;
  if (page === "account") return <AccountPage />;
  return <BalancePage />;
}

function BalancePage() {
  // Refreshed as the other live pages are: holds and settlements of jobs, and card payments, change it from elsewhere.
  const balance = useLoad(() => api.renters.getBalance({}), [], 10_000);
  const pay = usePaging(20, []);
  const payments = useLoad(() => api.payments.history({ limit: pay.limit, offset: pay.offset }), [pay.offset], 10_000);
  const refresh = () => {
    balance.reload();
    payments.reload();
  };
  return (
    <>
      <h1>Balance</h1>
      <Card title="Your funds">
        <Show l={balance} what="balance">
          {(b) => (
            <div class="stats">
              <Stat label="Balance" value={sar(b.balanceHalala)} testid="balance" />
              <Stat label="Held for running jobs" value={sar(b.heldHalala)} testid="held" />
              <Stat label="Available" value={sar(b.availableHalala)} testid="available" />
              <Stat label="Spent so far" value={sar(b.totalSpentHalala)} />
              <Stat label="Jobs" value={String(b.totalJobs)} />
              {b.refundOwedHalala !== undefined && <Stat label="Owed for refunded payments (not spendable)" value={sar(b.refundOwedHalala)} testid="refund-owed" />}
            </div>
          )}
        </Show>
      </Card>
      <TopUp onDone={refresh} />
      <Card title="Payment history">
        <Show l={payments} what="payments">
          {(p) => (
            <>
              <DataTable rows={p.payments} empty="No payments yet. Add funds above to run your first job." columns={[
                { head: "When", cell: (x) => when(x.createdAt) },
                { head: "Amount", cell: (x) => sar(x.amountHalala) },
                { head: "Source", cell: (x) => x.sourceType },
                { head: "Status", cell: (x) => <StatusBadge status={x.status} /> },
                { head: "Refunded", cell: (x) => refunded(x) },
                { head: "Payment", class: "mono", cell: (x) => x.paymentId },
              ]} />
              <Pager paging={pay} page={p} shown={p.payments.length} />
            </>
          )}
        </Show>
      </Card>
    </>
  );
}

function TopUp({ onDone }: { onDone(): void }) {
  const [amount, setAmount] = useState("10");
  const [done, setDone] = useState<string>();
  const a = useAction();
  const id = useId("amount");
  if (!settings.sandboxTopup && !settings.cardCheckout) {
    return (
      <Card title="Add funds">
        <Empty>Top-ups are not enabled on this server; ask the operator to credit your account.</Empty>
      </Card>
    );
  }
  const amountSar = Number(amount);
  return (
    <Card title="Add funds">
      <form
        onSubmit={(e) => {
          e.preventDefault();
          setDone(undefined);
          const source = (e.submitter as HTMLButtonElement | null)?.value ?? "sandbox";
          void a.run(async () => {
            const r = await api.payments.topup({ amountSar, sourceType: source, idempotencyKey: crypto.randomUUID() });
            if (source === "sandbox") {
              await api.payments.confirmSandbox({ paymentId: r.payment!.paymentId });
              setDone(`Added ${sar(r.payment!.amountHalala)} (sandbox).`);
              onDone();
            } else {
              // The gateway's hosted checkout; it returns to FRONTEND_URL when paid.
              location.assign(r.checkoutUrl);
            }
          });
        }}
      >
        <Field id={id} label="Amount (SAR)">
          <input id={id} type="number" min="0.01" step="0.01" required value={amount} onInput={(e) => setAmount((e.target as HTMLInputElement).value)} />
        </Field>
        <ErrorBox error={a.error} />
        {done ? <p class="ok" role="status">{done}</p> : null}
        <div class="buttons">
          {settings.sandboxTopup && !settings.production ? (
            <button type="submit" value="sandbox" disabled={a.busy}>Top up (sandbox)</button>
          ) : null}
          {settings.cardCheckout ? (
            <button type="submit" value="creditcard" disabled={a.busy}>Pay by card</button>
          ) : null}
        </div>
      </form>
    </Card>
  );
}

const STATUSES = ["", "queued", "pending", "running", "completed", "failed", "cancelled"];

/** Jobs, each linking to its page under `base`; `empty` is shown when there are none. */
export function JobTable({ jobs, base, empty }: { jobs: Job[]; base: string[]; empty: ComponentChildren }) {
  return (
    <DataTable rows={jobs} rowAttrs={(j) => ({ "data-job": j.jobId })} empty={empty} columns={[
      { head: "Job", cell: (j) => <a class="mono" href={href(...base, j.jobId)}>{j.jobId}</a> },
      { head: "Type", cell: (j) => j.jobType },
      { head: "Status", cell: (j) => <><StatusBadge status={j.status} />{j.progressPct !== undefined && j.status === "running" ? ` ${Math.round(j.progressPct)}%` : ""}</> },
      { head: "Submitted", cell: (j) => ago(j.submittedAt) },
      { head: "Cost", cell: (j) => sar(j.actualCostHalala ?? j.costHalala) },
      { head: "Why waiting", cell: (j) => j.queueReason ?? "" },
    ]} />
  );
}

function JobsPage() {
  const [status, setStatus] = useState("");
  const id = useId("status");
  const paging = usePaging(50, [status]);
  // Polled: the list shows live status and why queued jobs wait.
  const jobs = useLoad(() => api.jobs.list({ limit: paging.limit, offset: paging.offset, ...(status ? { status } : {}) }), [status, paging.offset], 3000);
  return (
    <>
      <h1>Jobs</h1>
      <Card title="Your jobs" actions={<a class="button" href={href("renter", "submit")}>New job</a>}>
        <Field id={id} label="Status">
          <select id={id} value={status} onChange={(e) => setStatus((e.target as HTMLSelectElement).value)}>
            {STATUSES.map((s) => <option value={s}>{s || "any"}</option>)}
          </select>
        </Field>
        <Show l={jobs} what="jobs">
          {(r) => (
            <>
              <JobTable jobs={r.jobs} base={["renter", "jobs"]} empty={
                <>No jobs{status ? ` with status ${status}` : ""} yet. <a href={href("renter", "submit")}>Submit a job</a> to get started.</>
              } />
              <Pager paging={paging} page={r} shown={r.jobs.length} />
            </>
          )}
        </Show>
      </Card>
    </>
  );
}

function AccountPage() {
  const usage = useLoad(() => api.reports.getRenterUsage({ days: 14 }), []);
  const me = useLoad(() => api.renters.getMe({}), []);
  return (
    <>
      <h1>Usage & key</h1>
      <Card title="/v1 usage, last 14 days">
        <Show l={usage} what="usage">
          {(u) =>
            u.models.length === 0 ? (
              <Empty>No /v1 requests yet. Point an OpenAI SDK at this server's /v1 with your API key as the bearer token.</Empty>
            ) : (
              <>
                <Chart
                  title="Tokens per day"
                  x={u.days.map((d) => dayToSeconds(d.day))}
                  series={[
                    { label: "Prompt tokens", values: u.days.map((d) => Number(d.promptTokens)), color: "#2563eb", bars: true },
                    { label: "Completion tokens", values: u.days.map((d) => Number(d.completionTokens)), color: "#db2777", bars: true },
                  ]}
                />
                <DataTable rows={u.models} columns={[
                  { head: "Model", cell: (m) => m.model },
                  { head: "Requests", cell: (m) => String(m.requests) },
                  { head: "Prompt tokens", cell: (m) => String(m.promptTokens) },
                  { head: "Completion tokens", cell: (m) => String(m.completionTokens) },
                  { head: "Cost", cell: (m) => sar(m.costHalala) },
                ]} />
              </>
            )
          }
        </Show>
      </Card>
      <Card title="Account">
        <Show l={me} what="account">
          {(m) => (
            <dl class="facts">
              <dt>Name</dt><dd>{m.renter?.name}</dd>
              <dt>Email</dt><dd>{m.renter?.email}</dd>
              <dt>Daily job limit</dt><dd>{String(m.quota?.dailyJobsLimit ?? "—")}</dd>
              <dt>Monthly spend limit</dt><dd>{sar(m.quota?.monthlySpendLimitHalala)}</dd>
            </dl>
          )}
        </Show>
      </Card>
      <RotateKey
        explain="Rotating issues a new key and revokes every earlier key of this account at once (scripts using them stop working)."
        rotate={async () => (await api.renters.rotateKey({})).apiKey}
      />
    </>
  );
}
