// The process's Prometheus metrics (prom-client): one registry per app, the
// series the wires, services and workers count into, the domain's committed
// changes (src/domain/shared/observe.ts), the database pool, and figures
// read from the database (fleet, queue, outbox, last ledger audit) through a
// cache: at most one read every `dbFiguresSeconds` per process, however often
// it is scraped. Labels are bounded: wires, route templates, statuses, kinds
// and reasons from fixed sets; never a job, renter or provider id.
import client from "prom-client";
import { poolStats, type Sql } from "../db/index.js";
import { operationsFigures, PROVIDER_STATES, type OperationsFigures } from "../domain/admin/operations.js";
import { latestLedgerAudit, type LedgerAuditSummary } from "../domain/money/ledger-audit.js";
import { observeDomain } from "../domain/shared/observe.js";
import type { Logger } from "../log.js";

export type Wire = "rest" | "grpc" | "grpc_web" | "connect" | "v1";

export interface DatabaseFigures extends OperationsFigures {
  audit: LedgerAuditSummary | undefined;
}

export interface Metrics {
  registry: client.Registry;
  /** One answered request or call: its wire, route (template or RPC), status, and seconds taken. */
  request(wire: Wire, route: string, status: string | number, seconds: number): void;
  /** A submit's outcome: assigned, queued, or the refusal's HTTP status. */
  submit(outcome: string): void;
  heartbeat(protocol: "legacy" | "stream"): void;
  daemonStreams: client.Gauge;
  webhookFailure(final: boolean): void;
  v1Tokens(promptTokens: number, completionTokens: number): void;
  v1UpstreamError(code: string): void;
  /** Database figures, cached (also what the scrape shows). */
  databaseFigures(): Promise<DatabaseFigures>;
  close(): void;
}

export interface MetricsOptions {
  sql: Sql;
  log: Logger;
  /** Least seconds between two reads of the database figures in this process. */
  dbFiguresSeconds: number;
}

/** Request latency buckets (seconds): from a cached read to a long submit under load. */
const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/**
 * The event loop's sampling interval (ms). The nodejs_eventloop_lag_* figures
 * are the times between samples, so each includes this interval.
 */
export const EVENT_LOOP_SAMPLE_MS = 20;

/** How long a scrape waits for the database figures before it shows the last ones read. */
export const FIGURES_WAIT_MS = 3000;

export function createMetrics(opts: MetricsOptions): Metrics {
  const registry = new client.Registry();
  client.collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: EVENT_LOOP_SAMPLE_MS });
  const reg = { registers: [registry] };

  const requests = new client.Counter({ name: "svc_requests_total", help: "Requests and calls answered, by wire, route or RPC, and status", labelNames: ["wire", "route", "status"] as const, ...reg });
  const latency = new client.Histogram({
    name: "svc_request_duration_seconds",
    help: "Time to answer a request or call (a stream: until it ended), by wire, route or RPC, and status",
    labelNames: ["wire", "route", "status"] as const,
    buckets: LATENCY_BUCKETS,
    ...reg,
  });
  const groupSize = new client.Histogram({ name: "svc_submit_group_size", help: "Submits written together in one transaction (group commit)", buckets: [1, 2, 4, 8, 16, 32, 64], ...reg });
  const groupWait = new client.Histogram({
    name: "svc_submit_group_wait_seconds",
    help: "Time a submit waited for its group to start: the group before it was being written",
    buckets: LATENCY_BUCKETS,
    ...reg,
  });
  const groupWrite = new client.Histogram({ name: "svc_submit_group_write_seconds", help: "Time a group of submits took to be written, from taking its database connection to its commit", buckets: LATENCY_BUCKETS, ...reg });
  const submits = new client.Counter({ name: "svc_job_submits_total", help: "Job submits by outcome: assigned, queued, or the refusal's status (402, 429, 503, 400...)", labelNames: ["outcome"] as const, ...reg });
  const heartbeats = new client.Counter({ name: "svc_heartbeats_total", help: "Provider heartbeats received, by protocol (legacy JSON/RPC or the daemon stream)", labelNames: ["protocol"] as const, ...reg });
  const daemonStreams = new client.Gauge({ name: "svc_daemon_streams_connected", help: "Stream daemons connected to this process", ...reg });
  const settlements = new client.Counter({ name: "svc_job_settlements_total", help: "Jobs ended (money settled or released), by final status and end reason", labelNames: ["status", "reason"] as const, ...reg });
  const moved = new client.Counter({ name: "svc_ledger_moved_halala_total", help: "Halala moved by committed ledger transfers, by transfer kind", labelNames: ["kind"] as const, ...reg });
  const webhookFailures = new client.Counter({ name: "svc_webhook_delivery_failures_total", help: "Failed renter webhook deliveries; final=true when the delivery was given up", labelNames: ["final"] as const, ...reg });
  const v1Tokens = new client.Counter({ name: "svc_v1_tokens_total", help: "/v1 tokens billed, by type (prompt, completion)", labelNames: ["type"] as const, ...reg });
  const v1UpstreamErrors = new client.Counter({ name: "svc_v1_upstream_errors_total", help: "/v1 upstream attempts that failed, by error code", labelNames: ["code"] as const, ...reg });

  new client.Gauge({ name: "svc_db_pool_max", help: "Connections the database pool may open", ...reg, collect() { this.set(poolStats(opts.sql)?.max ?? 0); } });
  new client.Gauge({ name: "svc_db_pool_in_use", help: "Pool connections serving statements or held by a transaction", ...reg, collect() { this.set(poolStats(opts.sql)?.inUse ?? 0); } });
  new client.Gauge({ name: "svc_db_pool_idle", help: "Pool connections open and idle", ...reg, collect() { this.set(poolStats(opts.sql)?.idle ?? 0); } });
  new client.Gauge({ name: "svc_db_pool_waiting", help: "Statements and transactions waiting for a pool connection", ...reg, collect() { this.set(poolStats(opts.sql)?.waiting ?? 0); } });

  // Database figures: one read at a time, reused for dbFiguresSeconds.
  const figureReads = new client.Counter({ name: "svc_db_figure_reads_total", help: "Reads of the database figures by this process (at most one per SVC_METRICS_DB_SECONDS)", ...reg });
  let cached: { at: number; figures: DatabaseFigures } | undefined;
  let reading: Promise<DatabaseFigures> | undefined;
  async function databaseFigures(): Promise<DatabaseFigures> {
    if (cached && performance.now() - cached.at < opts.dbFiguresSeconds * 1000) return cached.figures;
    reading ??= (async () => {
      try {
        figureReads.inc();
        const [ops, audit] = await Promise.all([operationsFigures(opts.sql), latestLedgerAudit(opts.sql)]);
        const figures = { ...ops, audit };
        cached = { at: performance.now(), figures };
        return figures;
      } finally {
        reading = undefined;
      }
    })();
    return reading;
  }
  /**
   * The figures for a scrape: the last good ones when the database cannot be read now, or does not
   * answer within FIGURES_WAIT_MS (the read goes on, and a later scrape takes what it brings), so a
   * database that stopped answering does not hold the whole scrape, process series included.
   */
  async function scrapeFigures(): Promise<DatabaseFigures | undefined> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), FIGURES_WAIT_MS)));
    try {
      const figures = await Promise.race([databaseFigures(), late]);
      if (figures) return figures;
      opts.log.warn({ waitedMs: FIGURES_WAIT_MS }, "metrics: the database did not answer in time; the last figures read are shown");
      return cached?.figures;
    } catch (err) {
      opts.log.warn({ err }, "metrics: database figures unavailable");
      return cached?.figures;
    } finally {
      clearTimeout(timer);
    }
  }

  new client.Gauge({
    name: "svc_providers",
    help: "Providers by state (online, offline, paused, pending_approval, suspended, rejected) and GPU model (the 20 most common, the rest 'other')",
    labelNames: ["state", "gpu_model"] as const,
    ...reg,
    async collect() {
      const f = await scrapeFigures();
      if (!f) return;
      this.reset();
      for (const s of PROVIDER_STATES) if (!f.providers.some((p) => p.state === s)) this.set({ state: s, gpu_model: "any" }, 0);
      for (const p of f.providers) this.set({ state: p.state, gpu_model: p.gpuModel }, p.count);
    },
  });
  new client.Gauge({
    name: "svc_queue_jobs",
    help: "Queued jobs by queue reason code",
    labelNames: ["queue_reason"] as const,
    ...reg,
    async collect() {
      const f = await scrapeFigures();
      if (!f) return;
      this.reset();
      for (const q of f.queue) this.set({ queue_reason: q.reason }, q.count);
    },
  });
  new client.Gauge({
    name: "svc_queue_oldest_age_seconds",
    help: "Age of the oldest queued job (0 when the queue is empty)",
    ...reg,
    async collect() {
      const f = await scrapeFigures();
      if (f) this.set(f.queueOldestAgeSeconds);
    },
  });
  new client.Gauge({
    name: "svc_webhook_outbox_pending",
    help: "Renter webhook deliveries waiting in the outbox",
    ...reg,
    async collect() {
      const f = await scrapeFigures();
      if (f) this.set(f.webhookOutboxPending);
    },
  });
  // The last ledger audit (any process's, src/workers/ledger-audit.ts): absent until one ran.
  const auditGauge = (name: string, help: string, value: (a: LedgerAuditSummary) => number) =>
    new client.Gauge({
      name,
      help,
      ...reg,
      async collect() {
        const f = await scrapeFigures();
        this.reset();
        if (f?.audit) this.set(value(f.audit));
      },
    });
  auditGauge("svc_ledger_drift_halala", "Halala by which the last ledger audit found balances off their entries (0 expected)", (a) => a.driftHalala);
  auditGauge("svc_ledger_discrepancies", "Discrepancies the last ledger audit found (0 expected)", (a) => a.discrepancies);
  auditGauge("svc_ledger_audit_age_seconds", "Seconds since the last ledger audit finished", (a) => Math.max(0, (Date.now() - a.finishedAt.getTime()) / 1000));
  auditGauge("svc_ledger_audit_duration_seconds", "How long the last ledger audit took", (a) => a.ms / 1000);

  const unobserve = observeDomain({
    ledgerMoved: (kind, halala) => moved.inc({ kind }, halala),
    jobSettled: (status, reason) => settlements.inc({ status, reason }),
    submitGroup(waits, write) {
      groupSize.observe(waits.length);
      for (const w of waits) groupWait.observe(w);
      groupWrite.observe(write);
    },
  });

  return {
    registry,
    request(wire, route, status, seconds) {
      const labels = { wire, route, status: String(status) };
      requests.inc(labels);
      latency.observe(labels, seconds);
    },
    submit: (outcome) => submits.inc({ outcome }),
    heartbeat: (protocol) => heartbeats.inc({ protocol }),
    daemonStreams,
    webhookFailure: (final) => webhookFailures.inc({ final: String(final) }),
    v1Tokens(prompt, completion) {
      if (prompt > 0) v1Tokens.inc({ type: "prompt" }, prompt);
      if (completion > 0) v1Tokens.inc({ type: "completion" }, completion);
    },
    v1UpstreamError: (code) => v1UpstreamErrors.inc({ code }),
    databaseFigures,
    close() {
      unobserve();
      registry.clear();
    },
  };
}
