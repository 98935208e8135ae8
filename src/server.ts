// Builds the whole service: database, migrations, services, both wires on
// one port, background workers. `main.ts` only calls `startApp`.
import { createContextValues } from "@connectrpc/connect";
import type { Config } from "./config.js";
import { connect, type Sql } from "./db/index.js";
import { startEmbedded, type EmbeddedServer } from "./db/embedded.js";
import { migrate, migrationsCurrent } from "./db/migrate.js";
import { createLogger, maskSecrets, type Logger } from "./log.js";
import { createEdge } from "./http/edge.js";
import { bodyLimitBytesOf } from "./http/body.js";
import { callLogInterceptor, requestIdOf } from "./http/call-log.js";
import { credentialsFromHeaders, credentialsKey } from "./http/credentials.js";
import { buildRouteTable, clientIpOf, createRestHandler, passesLimit, sendJson, type NodeRequest, type NodeResponse } from "./http/rest.js";
import { buildServices, STREAM_CODECS, STREAM_KIND_BOUNDS } from "./services/index.js";
import { createApiDocsHandler } from "./http/api-docs.js";
import { createCors } from "./http/cors.js";
import { checkRouteRows, createRateLimits, ipRowCountKey } from "./http/rate-limits.js";
import { createGrpcStreamHandler } from "./http/grpc-streams.js";
import { createConnectHandler } from "./http/connect-adapter.js";
import { createV1Handler } from "./http/v1/router.js";
import { createConsoleHandler } from "./http/console.js";
import type { Deps } from "./services/deps.js";
import type { Worker } from "./workers/worker.js";
import { webhookOutboxWorker } from "./workers/webhook-outbox.js";
import { providerWorkers } from "./workers/liveness-sweep.js";
import { jobTimeoutsWorker } from "./workers/job-timeouts.js";
import { endpointHealthWorker } from "./workers/endpoint-health.js";
import { offerWorkToEach } from "./domain/dispatch/job-hooks.js";
import { createMetrics } from "./metrics/metrics.js";
import { createMetricsHandler, metricsInterceptor, startMetricsListener, type MetricsListener } from "./http/metrics.js";
import { ledgerAuditWorker } from "./workers/ledger-audit.js";
import { receiptResignWorker } from "./workers/receipt-resign.js";
import { daemonPolicy } from "./domain/providers/versions.js";

export interface App {
  port: number;
  /** The separate metrics listener's port (SVC_METRICS_LISTEN), when there is one. */
  metricsPort: number | undefined;
  url: string;
  sql: Sql;
  deps: Deps;
  close(): Promise<void>;
}

export interface StartOptions {
  log?: Logger;
  /** Use this pool instead of opening one (tests). */
  sql?: Sql;
}

/** How long /readyz waits for the database before it answers 503. */
const READY_CHECK_MS = 3000;
/** How long shutdown waits for the background workers to finish what they are doing. */
const WORKER_STOP_GRACE_MS = 10_000;

/** True once `p` fulfils, false if `ms` pass first; a rejection within `ms` is thrown. */
async function settlesWithin(p: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  try {
    return await Promise.race([p.then(() => true as const), late]);
  } finally {
    clearTimeout(timer);
  }
}

type PlainHandler = (req: NodeRequest, res: NodeResponse, url: URL) => Promise<boolean> | boolean;

export async function startApp(config: Config, opts: StartOptions = {}): Promise<App> {
  const log = opts.log ?? createLogger(config.logLevel);
  let embedded: EmbeddedServer | undefined;
  let databaseUrl = config.databaseUrl;
  if (!opts.sql && !databaseUrl) {
    embedded = await startEmbedded(config.dataDir, log);
    databaseUrl = embedded.socketUrl ?? embedded.url;
    log.info({ dataDir: config.dataDir, via: embedded.socketUrl ? "unix socket" : "tcp" }, "using embedded PostgreSQL (set DATABASE_URL to use another)");
  }
  const sql = opts.sql ?? connect(databaseUrl!, 20);
  const applied = await migrate(sql);
  if (applied.length) log.info({ applied }, "migrations applied");

  // One limiter set shared by REST and gRPC; counters live in PostgreSQL or Redis.
  // Made before the services: rows per renter key are counted after
  // authentication, inside the secured services (deps.keyRowCounter).
  const limits = config.rateLimits ? await createRateLimits(config, sql, log) : undefined;
  daemonPolicy.minVersion = config.daemonMinVersion;
  const metrics = createMetrics({ sql, log, dbFiguresSeconds: config.metrics.dbFiguresSeconds });
  const deps: Deps = {
    config,
    sql,
    log,
    keyRowCounter: limits?.keyRowCounter,
    streamBeatLimit: limits?.streamBeatLimit,
    streamWriteLimit: limits?.streamWriteLimit,
    offerWork: (ids) => offerWorkToEach(sql, log, ids),
    metrics,
  };
  const shutdown = new AbortController();
  let services: ReturnType<typeof buildServices>;
  try {
    services = buildServices(deps);
    checkRouteRows(services.flatMap((s) => s.service.methods));
  } catch (err) {
    metrics.close();
    await limits?.close();
    throw err;
  }
  const rest = createRestHandler({
    routes: buildRouteTable(services),
    log,
    trustProxy: config.trustProxy,
    guard: limits?.guard,
    unroutedGuard: limits?.unroutedGuard,
    shutdownSignal: shutdown.signal,
    onAnswered: (r, status, seconds) => metrics.request("rest", `${r.httpMethod} ${r.template}`, status, seconds),
  });

  const plain: PlainHandler[] = [
    (req, res, url) => {
      if (url.pathname !== "/healthz") return false;
      sendJson(res, 200, { status: "ok" });
      return true;
    },
    async (req, res, url) => {
      if (url.pathname !== "/readyz") return false;
      // A database that does not answer is unreachable too: a probe gets its answer in READY_CHECK_MS.
      let timer: NodeJS.Timeout | undefined;
      const timedOut = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error("no answer")), READY_CHECK_MS)));
      try {
        const ok = await Promise.race([migrationsCurrent(sql), timedOut]);
        sendJson(res, ok ? 200 : 503, ok ? { status: "ready" } : { error: "migrations pending" });
      } catch {
        sendJson(res, 503, { error: "database unreachable" });
      } finally {
        clearTimeout(timer);
      }
      return true;
    },
    // These answer outside the guard and the interceptor: they count on their IP rows themselves.
    createMetricsHandler(config, metrics, log, limits),
    createApiDocsHandler(
      services.map((s) => s.service),
      limits && { rows: limits, trustProxy: config.trustProxy },
    ),
    createV1Handler({ config, sql, log, metrics, rateLimits: limits }),
    createConsoleHandler(config, log),
  ];

  // Method by method, each with its route's size limit: a message is never read past it
  // (the library's default is 4 GiB, and bodies are read before authentication); a stream's message
  // with a bound per kind is held to its kind's too, on either path.
  const methods = services.flatMap((s) =>
    s.service.methods.map((m) => ({
      method: m,
      impl: (s.impl as unknown as Record<string, never>)[m.localName],
      readMaxBytes: bodyLimitBytesOf(m),
      bounds: STREAM_KIND_BOUNDS.get(m),
    })),
  );
  const interceptors = [metricsInterceptor(metrics), callLogInterceptor(log), ...(limits ? [limits.interceptor] : [])];
  const methodAt = new Map(methods.map((r) => [`/${r.method.parent.typeName}/${r.method.name}`, r.method]));
  // A call's per-IP row is counted here, as its request starts: before its body is read (limits.countAtStart).
  const contextValues = (req: NodeRequest) => {
    const credentials = credentialsFromHeaders(req.headers as Record<string, string>, clientIpOf(req, config.trustProxy), requestIdOf(req.headers));
    const values = createContextValues().set(credentialsKey, credentials);
    const method = methodAt.get((req.url ?? "").split("?", 1)[0]!);
    const counted = method && limits?.countAtStart(method, credentials.clientIp);
    if (counted) values.set(ipRowCountKey, counted);
    return values;
  };
  // Streaming calls over plain gRPC take the lighter path (http/grpc-streams.ts); Connect serves the rest.
  const grpcStreams = createGrpcStreamHandler({
    routes: methods.filter((r) => r.method.methodKind !== "unary").map((r) => ({ ...r, ...STREAM_CODECS.get(r.method) })),
    interceptors,
    contextValues: (req) => contextValues(req as unknown as NodeRequest),
    shutdownSignal: shutdown.signal,
    log,
  });
  // The Connect handler drops the promise a fallback returns: a handler that throws is caught here, or it
  // would be an unhandled rejection, which ends the process.
  const fallback = (req: NodeRequest, res: NodeResponse) =>
    (async () => {
      const url = new URL(req.url ?? "/", "http://localhost");
      for (const h of plain) if (await h(req, res, url)) return;
      if (await rest(req, res)) return;
      // Nothing answered (an unknown gRPC/Connect procedure, any other path): counted as an unrouted /api
      // request is, so that no path is a way around the per-IP limit.
      const unrouted = limits?.unroutedGuard;
      const httpMethod = (req.method ?? "GET").toUpperCase();
      if (unrouted && !(await passesLimit(res, () => unrouted(httpMethod, url.pathname, clientIpOf(req, config.trustProxy))))) return;
      sendJson(res, 404, { error: `not found: ${req.method} ${maskSecrets(url.pathname)}` });
    })().catch((err: unknown) => {
      log.error({ err, method: req.method, path: maskSecrets((req.url ?? "").split("?")[0]) }, "request handler failed");
      if (!res.headersSent) sendJson(res, 500, { error: "internal error" });
      else res.destroy();
    });
  // Connect serves the procedures (its unary bodies read once their IP row let them in); the rest falls through.
  const handler = createConnectHandler({
    routes: methods,
    interceptors,
    shutdownSignal: shutdown.signal,
    contextValues,
    fallback,
    metrics,
    log,
  });

  const sendsWhileOpen = new Set([...methodAt].filter(([, m]) => m.methodKind === "bidi_streaming" || m.methodKind === "client_streaming").map(([path]) => path));
  const cors = createCors(config);
  const edge = createEdge(
    (req, res) => {
      // No answer is to be taken for another type than it says (a job's text output as a script of this
      // origin, which the console's script-src 'self' would run).
      res.setHeader("x-content-type-options", "nosniff");
      if (!cors(req, res) && !grpcStreams(req, res)) handler(req as NodeRequest, res as NodeResponse);
    },
    // Bidirectional and client-streaming calls send for as long as they are open (a daemon's stream has its hello deadline).
    { receivesWithoutDeadline: (path) => sendsWhileOpen.has(path) },
  );
  const port = await edge.listen(config.port, config.host);
  const hostForUrl = config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host;
  // Local default: installers and daemons point at this very server.
  if (!config.backendUrl) config.backendUrl = `http://${hostForUrl}:${port}`;
  log.info({ port }, "listening (HTTP/1.1 and gRPC h2c)");
  let metricsListener: MetricsListener | undefined;
  if (config.metrics.listen) {
    try {
      metricsListener = await startMetricsListener(config.metrics.listen, metrics, log);
    } catch (err) {
      await edge.close();
      await limits?.close();
      throw err;
    }
  }

  // Background work, started once the port is open and stopped before the pool closes.
  const workers: Worker[] = [
    webhookOutboxWorker({ sql, log, production: config.production, onFailure: (final) => metrics.webhookFailure(final) }),
    ...providerWorkers(deps),
    jobTimeoutsWorker({ sql, log, intervalMs: config.jobSweepMs }),
    endpointHealthWorker({ sql, log, periodSeconds: config.endpointProbeSeconds, allowPrivate: config.v1.allowPrivateUpstreams }),
    ledgerAuditWorker({ sql, log, periodSeconds: config.ledgerAuditSeconds, fullSeconds: config.ledgerAuditFullSeconds }),
    receiptResignWorker({ sql, log, periodSeconds: config.receiptResignSeconds }),
  ];
  for (const w of workers) await w.start();

  let closing: Promise<void> | undefined;
  return {
    port,
    metricsPort: metricsListener?.port,
    url: `http://${hostForUrl}:${port}`,
    sql,
    deps,
    close() {
      closing ??= (async () => {
        shutdown.abort();
        // The listener stops accepting at once, while the workers stop: the two waits overlap.
        const workersStopped = settlesWithin(Promise.all(workers.map((w) => w.stop())), WORKER_STOP_GRACE_MS);
        await edge.close();
        if (!(await workersStopped)) {
          // A worker waits on a database that stopped answering; closing the pool below ends its query.
          log.warn({ graceMs: WORKER_STOP_GRACE_MS }, "background workers did not stop in time; closing without them");
        }
        await metricsListener?.close();
        metrics.close();
        await limits?.close();
        if (!opts.sql) await sql.end({ timeout: 5 });
        if (embedded) await embedded.stop();
      })();
      return closing;
    },
  };
}
