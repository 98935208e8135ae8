// Provider pages: status, GPU telemetry, jobs served, earnings, preferences, install.
import { useEffect, useRef, useState } from "preact/hooks";
import type { GetProviderMeResponse } from "../../../gen/svc/v1/providers_pb.js";
import { api } from "../api.js";
import { ago, dayToSeconds, sar, when } from "../format.js";
import { href } from "../router.js";
import { session } from "../session.js";
import { Card, Chart, DataTable, Empty, ErrorBox, Field, Pager, Show, Stat, StatusBadge, useAction, useId, useLoad, usePaging } from "../ui.js";
import { JobPage } from "./job.js";
import { JobTable } from "./renter.js";
import { RotateKey } from "./rotate-key.js";

export const PROVIDER_NAV: [string, string][] = [["", "Status"], ["earnings", "Earnings"], ["settings", "Settings"], ["install", "Install"]];

export function ProviderPages({ route }: { route: string[] }) {
  const [page, id] = route;
  if (page === "job" && id) return <JobPage jobId={id} back={["provider"]} />;
  if (page === "earnings") return <EarningsPage />;
  if (page === "settings") return <SettingsPage />;
  if (page === "install") return <InstallPage />;
  return <StatusPage />;
}

interface Sample {
  t: number;
  temp: number;
  util: number;
  vramGb: number;
}

const MAX_SAMPLES = 360;

/**
 * GPU telemetry over time: the service keeps each provider's latest
 * heartbeat figures, so the page samples them while it is open (read every
 * 5 s; the last 360 heartbeats at most). A sample is a heartbeat, at its
 * time: reads between two heartbeats, or after the daemon stopped sending,
 * add none.
 */
function useTelemetry(me: GetProviderMeResponse | undefined): Sample[] {
  const samples = useRef<Sample[]>([]);
  const [, bump] = useState(0);
  useEffect(() => {
    const p = me?.provider;
    const g = p?.gpuMetrics;
    const beat = p?.provider?.lastHeartbeat;
    if (!g || !beat) return;
    const t = new Date(beat).getTime() / 1000;
    const last = samples.current[samples.current.length - 1];
    if (!Number.isFinite(t) || (last && t <= last.t)) return;
    samples.current = [...samples.current, { t, temp: g.temperatureC, util: g.utilizationPct, vramGb: Number(g.vramUsedMib) / 1024 }].slice(-MAX_SAMPLES);
    bump((n) => n + 1);
  }, [me]);
  return samples.current;
}

function StatusPage() {
  const me = useLoad(() => api.providers.getMe({}), [], 5000);
  const samples = useTelemetry(me.data);
  const pause = useAction();
  return (
    <>
      <h1>Provider status</h1>
      <Show l={me} what="provider">
        {(m) => {
          const d = m.provider!;
          const p = d.provider!;
          return (
            <>
              <Card
                title={p.name}
                actions={
                  <button disabled={pause.busy} onClick={() => void pause.run(async () => { await (p.isPaused ? api.providers.resume({}) : api.providers.pause({})); me.reload(); })}>
                    {p.isPaused ? "Resume (take jobs again)" : "Pause (take no new jobs)"}
                  </button>
                }
              >
                <ErrorBox error={pause.error} />
                <div class="stats">
                  <Stat label="Status" value={<StatusBadge status={p.status} />} testid="provider-status" />
                  <Stat label="Approval" value={<StatusBadge status={p.approvalStatus} />} testid="approval" />
                  <Stat label="Last heartbeat" value={ago(p.lastHeartbeat)} />
                  <Stat label="GPU" value={`${p.gpuModel}${p.gpuVramMib ? ` · ${Math.round(Number(p.gpuVramMib) / 1024)} GB` : ""}`} />
                  <Stat label="Earned today" value={sar(d.todayEarningsHalala)} />
                  <Stat label="Earned this week" value={sar(d.weekEarningsHalala)} />
                  <Stat label="Earned in all" value={sar(p.totalEarningsHalala)} testid="total-earnings" />
                  <Stat label="Jobs served" value={String(p.totalJobs)} />
                </div>
                <p data-testid="job-types">
                  Job types its daemon runs: {p.supportedJobTypes.length ? p.supportedJobTypes.join(", ") : "any (its daemon declares none)"}
                </p>
                {p.approvalStatus === "pending" ? <p class="note">Your provider waits for an operator's approval; start the daemon meanwhile so it shows online.</p> : null}
                {p.approvalStatus === "rejected" ? <p class="error">Rejected{p.rejectionReason ? `: ${p.rejectionReason}` : ""}.</p> : null}
                {!p.lastHeartbeat ? <Empty>No heartbeat yet. Install and start the daemon (see Install) and this page fills in.</Empty> : null}
                {d.activeJob ? <p>Running now: <span class="mono">{d.activeJob.jobId}</span> ({d.activeJob.jobType}, {Math.round(d.activeJob.progressPct ?? 0)}%)</p> : null}
              </Card>
              <Card title="GPU telemetry (while this page is open)">
                {samples.length < 2 ? (
                  <Empty>Collecting samples from heartbeats…</Empty>
                ) : (
                  <div class="charts">
                    <Chart title="Temperature (°C)" x={samples.map((s) => s.t)} series={[{ label: "°C", values: samples.map((s) => s.temp), color: "#dc2626" }]} height={160} />
                    <Chart title="Utilisation (%)" x={samples.map((s) => s.t)} series={[{ label: "%", values: samples.map((s) => s.util), color: "#2563eb" }]} height={160} />
                    <Chart title="VRAM used (GB)" x={samples.map((s) => s.t)} series={[{ label: "GB", values: samples.map((s) => s.vramGb), color: "#16a34a" }]} height={160} />
                  </div>
                )}
              </Card>
              <Card title="Jobs served">
                <JobTable jobs={m.recentJobs} base={["provider", "job"]} empty="No jobs yet. Jobs arrive once you are approved and online." />
              </Card>
            </>
          );
        }}
      </Show>
    </>
  );
}

function EarningsPage() {
  const earnings = useLoad(() => api.reports.getProviderEarnings({ days: 14 }), [], 10_000);
  const paging = usePaging(50, []);
  const jobs = useLoad(() => api.jobs.list({ limit: paging.limit, offset: paging.offset }), [paging.offset], 10_000);
  return (
    <>
      <h1>Earnings</h1>
      <Card title="Earnings by day (last 14 days)">
        <Show l={earnings} what="earnings">
          {(e) => (
            <>
              <p>
                Total in this window: <strong data-testid="window-earnings">{sar(e.totalEarnedHalala)}</strong>
              </p>
              <Chart title="Earned per day (SAR)" x={e.days.map((d) => dayToSeconds(d.day))}
                series={[{ label: "SAR", values: e.days.map((d) => Number(d.earnedHalala) / 100), color: "#16a34a", bars: true }]} />
            </>
          )}
        </Show>
      </Card>
      <Card title="Jobs and what each earned">
        <Show l={jobs} what="jobs">
          {(r) => (
            <>
              <DataTable rows={r.jobs} testid="earnings-jobs" rowAttrs={(j) => ({ "data-job": j.jobId })} empty="No jobs served yet." columns={[
                { head: "Job", class: "mono", cell: (j) => j.jobId },
                { head: "Type", cell: (j) => j.jobType },
                { head: "Status", cell: (j) => <StatusBadge status={j.status} /> },
                { head: "Ended", cell: (j) => when(j.completedAt) },
                { head: "Renter paid", cell: (j) => sar(j.actualCostHalala) },
                { head: "You earned", cell: (j) => sar(j.providerEarnedHalala) },
              ]} />
              <Pager paging={paging} page={r} shown={r.jobs.length} />
            </>
          )}
        </Show>
      </Card>
    </>
  );
}

function SettingsPage() {
  const me = useLoad(() => api.providers.getMe({}), []);
  return (
    <>
      <h1>Settings</h1>
      <Card title="Preferences">
        <Show l={me} what="preferences">{(m) => <Preferences me={m} />}</Show>
      </Card>
      <RotateKey
        explain="Rotating issues a new key and revokes every earlier key of this provider at once: its daemon is disconnected and takes no jobs until it runs with the new key. Rotate when a key may have leaked (an install command shared, a log that kept it)."
        rotate={async () => (await api.providers.rotateKey({})).apiKey}
        after={<p>Run the install command again with this key (<a href={href("provider", "install")}>Install</a>), or restart the daemon with it in <code>SVC_API_KEY</code>.</p>}
      />
    </>
  );
}

function Preferences({ me }: { me: GetProviderMeResponse }) {
  const p = me.provider!.provider!;
  const [f, setF] = useState({
    runMode: p.runMode,
    scheduledStart: p.scheduledStart ?? "",
    scheduledEnd: p.scheduledEnd ?? "",
    gpuUsageCapPct: String(p.gpuUsageCapPct),
    vramReserveGb: String(p.vramReserveGb),
    tempLimitC: String(p.tempLimitC),
  });
  const [saved, setSaved] = useState(false);
  const a = useAction();
  const ids = { mode: useId("mode"), start: useId("start"), end: useId("end"), cap: useId("cap"), vram: useId("reserve"), temp: useId("temp") };
  const set = (k: keyof typeof f) => (e: Event) => { setSaved(false); setF({ ...f, [k]: (e.target as HTMLInputElement).value }); };
  return (
    <form
      onSubmit={(e) => {
        e.preventDefault();
        void a.run(async () => {
          // A limit left blank is not sent: the service keeps its value (0 would be a limit too).
          const num = (v: string) => (v.trim() === "" ? undefined : Number(v));
          const r = await api.providers.setPreferences({
            runMode: f.runMode,
            ...(f.runMode === "scheduled" ? { scheduledStart: f.scheduledStart, scheduledEnd: f.scheduledEnd } : {}),
            gpuUsageCapPct: num(f.gpuUsageCapPct),
            vramReserveGb: num(f.vramReserveGb),
            tempLimitC: num(f.tempLimitC),
          });
          const kept = r.preferences!;
          setF({ ...f, gpuUsageCapPct: String(kept.gpuUsageCapPct), vramReserveGb: String(kept.vramReserveGb), tempLimitC: String(kept.tempLimitC) });
          setSaved(true);
        });
      }}
    >
      <Field id={ids.mode} label="Run mode">
        <select id={ids.mode} value={f.runMode} onChange={set("runMode")}>
          <option value="always-on">always on</option>
          <option value="scheduled">on a schedule</option>
          <option value="manual">manual</option>
        </select>
      </Field>
      {f.runMode === "scheduled" ? (
        <div class="grid2">
          <Field id={ids.start} label="Schedule start (HH:MM, UTC)">
            <input id={ids.start} type="time" required value={f.scheduledStart} onInput={set("scheduledStart")} />
          </Field>
          <Field id={ids.end} label="Schedule end (HH:MM, UTC)">
            <input id={ids.end} type="time" required value={f.scheduledEnd} onInput={set("scheduledEnd")} />
          </Field>
        </div>
      ) : null}
      <Field id={ids.cap} label="GPU usage cap (%)" hint="0 to 100">
        <input id={ids.cap} type="number" min={0} max={100} step={1} value={f.gpuUsageCapPct} aria-describedby={`${ids.cap}-hint`} onInput={set("gpuUsageCapPct")} />
      </Field>
      <Field id={ids.vram} label="VRAM kept free (GB)" hint="0 to 16">
        <input id={ids.vram} type="number" min={0} max={16} step="any" value={f.vramReserveGb} aria-describedby={`${ids.vram}-hint`} onInput={set("vramReserveGb")} />
      </Field>
      <Field id={ids.temp} label="Temperature limit (°C)" hint="50 to 100">
        <input id={ids.temp} type="number" min={50} max={100} step={1} value={f.tempLimitC} aria-describedby={`${ids.temp}-hint`} onInput={set("tempLimitC")} />
      </Field>
      <ErrorBox error={a.error} />
      {saved ? <p class="ok" role="status">Saved.</p> : null}
      <button type="submit" disabled={a.busy}>Save preferences</button>
    </form>
  );
}

/** Sets PK from a prompt: a key typed (pasted) there is not in the shell's history, as one on a command line is. */
const SH_READ_KEY = `printf 'Provider key: '; IFS= read -r PK; export PK`;
const PS_READ_KEY = `$env:PK = Read-Host 'Provider key'`;

function InstallPage() {
  const [show, setShow] = useState(false);
  const key = session()?.secret ?? "";
  const base = location.origin;
  const shown = show ? key : key.replace(/^(svc-provider-.{4}).*/, "$1…");
  // The key never goes on a command line (where `ps` shows it to every user): curl reads it
  // as a header from standard input; the Python file has it (and the provider's signing
  // secret) baked in and is written readable by its owner only; the TypeScript daemon
  // reads SVC_API_KEY. A redirect is an error (`-L --max-redirs 0`), never followed: curl would send the
  // key header on to whatever host it names, and without -L it would hand the redirect's page on as the answer.
  // The installer runs only once curl has succeeded: `curl | sh` runs sh on nothing and exits 0.
  const keyHeader = `printf 'x-provider-key: %s\\n' "$PK" | curl -fsSL --max-redirs 0 -H @-`;
  const lines = [
    ["Linux or macOS, as a service", `SETUP=$(${keyHeader} "${base}/api/providers/setup") && printf '%s\\n' "$SETUP" | sh`],
    [
      "In the foreground (Python daemon; the file holds your key, so only you may read it)",
      `(umask 077 && ${keyHeader} -o svc_daemon.py "${base}/api/providers/download/daemon") && chmod 600 svc_daemon.py && python3 svc_daemon.py --url "${base}"`,
    ],
    ["Windows (PowerShell)", `irm "${base}/api/providers/setup-windows" -MaximumRedirection 0 -Headers @{ 'x-provider-key' = $env:PK } | iex`],
    ["TypeScript stream daemon, from a checkout", `SVC_API_KEY="$PK" npx svc-daemon -- --url "${base}"`],
  ];
  return (
    <>
      <h1>Install the daemon</h1>
      <Card title="Your key">
        <p>
          Every command below reads your key from <code>PK</code>. Run this first in the same shell, and paste your key when it
          asks: typed at the prompt, the key stays out of your shell's history. Linux or macOS (sh, bash, zsh):
        </p>
        <pre class="cmd" tabIndex={0}>{SH_READ_KEY}</pre>
        <p>Windows (PowerShell):</p>
        <pre class="cmd" tabIndex={0}>{PS_READ_KEY}</pre>
        <p>Your key:</p>
        <pre class="cmd" tabIndex={0} data-testid="provider-key">{shown}</pre>
        <button class="secondary" aria-pressed={show} onClick={() => setShow(!show)}>{show ? "Hide key" : "Show key"}</button>
      </Card>
      <Card title="One-liners">
        {lines.map(([title, cmd]) => (
          <div class="cmd-block">
            <h3>{title}</h3>
            <pre class="cmd" tabIndex={0}>{cmd}</pre>
          </div>
        ))}
      </Card>
    </>
  );
}
