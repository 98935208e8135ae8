// config -> database -> server; nothing else.
import { ConfigError, loadConfig } from "./config.js";
import { applyHeapGrowth } from "./heap-growth.js";
import { createLogger } from "./log.js";
import { startApp } from "./server.js";

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
  if (config.secretsFile) log.info({ file: config.secretsFile }, "local admin token and HMAC secret are kept in this file");
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

  const app = await startApp(config, { log });
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
