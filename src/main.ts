// config -> database -> server; nothing else.
import util from "node:util";
import { ConfigError, loadConfig, type Config } from "./config.js";
import { isDatabaseUnavailable } from "./errors.js";
import { applyHeapGrowth } from "./heap-growth.js";
import { createLogger } from "./log.js";
import { startApp } from "./server.js";

type SystemError = NodeJS.ErrnoException & { address?: string; port?: number; hostname?: string };

/** A system error's description: "address already in use (EADDRINUSE)". */
function reasonOf(e: SystemError): string {
  const described = typeof e.errno === "number" ? util.getSystemErrorMap().get(e.errno)?.[1] : undefined;
  return described ? `${described} (${e.code})` : e.message;
}

const urlOf = (raw: string): URL | undefined => (URL.canParse(raw) ? new URL(raw) : undefined);

/** Where a URL points, for a message: host, port and path (or a socket's folder), never its user or password. */
function whereOf(raw: string): string {
  const u = urlOf(raw);
  return u ? `${u.searchParams.get("host") ?? u.host}${u.pathname}` : "its value not shown";
}

/**
 * The one line a start that failed for a setting says (the port is taken, the database cannot be
 * reached or refuses, the embedded one exits as it starts), naming the variable; undefined for any other failure, whose stack is printed.
 */
function startFailure(err: unknown, config: Config): string | undefined {
  if (err instanceof ConfigError) return `configuration error: ${err.message}`;
  const e = err as SystemError;
  if (e?.name === "EmbeddedStartError") return e.message;
  const metrics = config.metrics.listen;
  if (e?.syscall === "listen" || (e?.syscall === "getaddrinfo" && (e.hostname === config.host || e.hostname === metrics?.host))) {
    const onMetrics = metrics !== undefined && (e.port === metrics.port || (e.port === undefined && e.hostname === metrics.host));
    const [host, port] = onMetrics ? [metrics.host, metrics.port] : [config.host, config.port];
    return `cannot listen on ${host}:${port} (${onMetrics ? "SVC_METRICS_LISTEN" : "HOST and PORT"}): ${reasonOf(e)}`;
  }
  const postgres = e?.name === "PostgresError";
  if (!postgres && !isDatabaseUnavailable(err) && e?.syscall !== "connect" && e?.syscall !== "getaddrinfo") return undefined;
  const redis = !postgres && config.redisUrl ? urlOf(config.redisUrl) : undefined;
  if (redis && (e.port === Number(redis.port || 6379) || (e.port === undefined && e.hostname === redis.hostname))) {
    return `cannot reach the rate-limit store of REDIS_URL (${whereOf(config.redisUrl!)}): ${reasonOf(e)}`;
  }
  const database = config.databaseUrl ? `the database of DATABASE_URL (${whereOf(config.databaseUrl)})` : `the embedded PostgreSQL in ${config.dataDir}/pg`;
  return postgres ? `${database} refused: ${e.message}` : `cannot reach ${database}: ${reasonOf(e)}`;
}

async function main() {
  let config;
  try {
    config = loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) {
      console.error(`configuration error: ${err.message}`);
      process.exit(1);
    }
    throw err;
  }
  const log = createLogger(config.logLevel);
  applyHeapGrowth(config.heapGrowthPercent);
  if (config.localSecrets) {
    // Only what was generated: a secret set in the environment is neither written nor kept there.
    log.info({ file: config.localSecrets.file, secrets: config.localSecrets.names }, "the generated local secrets are kept in this file");
  }
  if (config.defaultedOrigins.length > 0) {
    // The installers and daemons handed out, and the links in mail and payment callbacks, carry these origins.
    log.warn(
      { unset: config.defaultedOrigins, frontendUrl: config.frontendUrl, backendUrl: config.backendUrl },
      "public origins not configured: installers, daemons and links carry the defaults; set FRONTEND_URL and BACKEND_URL",
    );
  }
  // Signals are handled from the first moment: a stop requested while starting
  // waits for the start to finish, then shuts down cleanly.
  let stopRequested: string | undefined;
  let stop: (signal: string) => void = (signal) => {
    stopRequested ??= signal;
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));

  let app;
  try {
    app = await startApp(config, { log });
  } catch (err) {
    const line = startFailure(err, config);
    if (line === undefined) throw err;
    console.error(line);
    process.exit(1);
  }
  log.info({ url: app.url }, "svc marketplace ready");
  let stopping = false;
  stop = (signal) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, "shutting down");
    app.close().then(
      () => process.exit(0),
      (err) => {
        log.error({ err }, "shutdown failed");
        process.exit(1);
      },
    );
  };
  if (stopRequested) stop(stopRequested);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
