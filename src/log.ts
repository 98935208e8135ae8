// Structured logs (pino). Secrets never reach a log line: credential headers
// and body fields are redacted, and keys inside URLs are masked.
import { pino, type Logger } from "pino";

export type { Logger };

const KEY_IN_TEXT = /svc-(provider|renter)-[A-Za-z0-9_-]+/g;
const HAS_KEY = /svc-(?:provider|renter)-[A-Za-z0-9_-]/;
/** The characters of a path segment or a query item, escapes included: what one key can be spread over. */
const URL_TOKEN = /[A-Za-z0-9_.~!$'()*+,;:@%-]+/g;
/** A query item whose value is a credential, whatever the escapes in its name. */
const QUERY_ITEM = /([?&])([^=&#?]*)=([^&#]*)/g;
const QUERY_CREDENTIALS = new Set(["key", "api_key", "token"]);

/**
 * Undoes the percent-escapes of ASCII characters (%2D, %2d, also %252D escaped twice), leniently:
 * a malformed escape stays as written. Keys are ASCII, so this finds any key a router would decode.
 */
function decodeAsciiEscapes(text: string): string {
  for (let i = 0; i < 4 && text.includes("%"); i++) {
    const next = text.replace(/%([0-7][0-9A-Fa-f])/g, (_, hex: string) => String.fromCharCode(parseInt(hex, 16)));
    if (next === text) break;
    text = next;
  }
  return text;
}

/**
 * Masks API keys wherever they appear in a string (paths, query strings), as sent or percent-encoded
 * (`svc%2Dprovider%2D…`, one character escaped: the router decodes both, so either is a working key):
 * a stretch of URL characters that decodes to a key is written decoded, its key masked. Query values
 * of `key`, `api_key` and `token` are masked whatever they hold.
 */
export function maskSecrets(text: string): string {
  if (text.includes("%")) {
    text = text.replace(URL_TOKEN, (token) => {
      if (!token.includes("%")) return token;
      const decoded = decodeAsciiEscapes(token);
      return HAS_KEY.test(decoded) ? decoded : token;
    });
  }
  text = text.replace(KEY_IN_TEXT, "svc-$1-***");
  if (!text.includes("=")) return text;
  return text.replace(QUERY_ITEM, (item, sep: string, name: string) =>
    QUERY_CREDENTIALS.has(decodeAsciiEscapes(name).toLowerCase()) ? `${sep}${name}=***` : item,
  );
}

export function createLogger(level: string): Logger {
  const pretty = process.stdout.isTTY && level !== "silent";
  return pino({
    level,
    // A `path` field is a request's path: masked here too, whichever handler logged it.
    serializers: { path: (p: unknown) => (typeof p === "string" ? maskSecrets(p) : p) },
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
