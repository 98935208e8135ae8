// Structured logs (pino). Secrets never reach a log line: credential headers
// and body fields are redacted, and keys inside URLs are masked.
import { pino, type Logger } from "pino";

export type { Logger };

const KEY_IN_TEXT = /svc-(provider|renter)-[A-Za-z0-9_-]+/g;

/** Masks API keys wherever they appear in a string (paths, query strings). */
export function maskSecrets(text: string): string {
  return text.replace(KEY_IN_TEXT, "svc-$1-***").replace(/([?&](key|api_key|token)=)[^&]*/gi, "$1***");
}

export function createLogger(level: string): Logger {
  const pretty = process.stdout.isTTY && level !== "silent";
  return pino({
    level,
    redact: {
      paths: [
        "req.headers.authorization",
        "req.headers[\"x-admin-token\"]",
        "req.headers[\"x-renter-key\"]",
        "req.headers[\"x-provider-key\"]",
        "req.headers[\"x-gateway-signature\"]",
        "*.api_key",
        "*.endpoint_api_key",
        "*.endpointApiKey",
        "*.key",
        "*.token",
        "*.secret",
        "*.password",
        "api_key",
        "adminToken",
        "hmacSecret",
      ],
      censor: "***",
    },
    ...(pretty ? { transport: { target: "pino-pretty", options: { colorize: true } } } : {}),
  });
}
