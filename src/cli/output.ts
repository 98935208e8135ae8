// How svc prints: tables (or key/value lists) by default, one JSON document
// with --json, plain text with no colour when stdout is not a terminal, and
// errors as the server's text with its HTTP status and gRPC code (never a
// stack trace). Exit codes are fixed here. Text from the server (names anyone
// can register, a provider's log lines, error messages) never reaches the
// terminal with its control characters: see terminalSafe.
import fs from "node:fs";
import util from "node:util";
import { Code, ConnectError } from "@connectrpc/connect";
import { createRegistry, type Message } from "@bufbuild/protobuf";
import { file_svc_v1_admin } from "../../gen/svc/v1/admin_pb.js";
import { file_svc_v1_daemon } from "../../gen/svc/v1/daemon_pb.js";
import { file_svc_v1_job_types } from "../../gen/svc/v1/job_types_pb.js";
import { file_svc_v1_jobs } from "../../gen/svc/v1/jobs_pb.js";
import { file_svc_v1_models } from "../../gen/svc/v1/models_pb.js";
import { file_svc_v1_options } from "../../gen/svc/v1/options_pb.js";
import { file_svc_v1_payments } from "../../gen/svc/v1/payments_pb.js";
import { file_svc_v1_providers } from "../../gen/svc/v1/providers_pb.js";
import { file_svc_v1_receipts } from "../../gen/svc/v1/receipts_pb.js";
import { file_svc_v1_renters } from "../../gen/svc/v1/renters_pb.js";
import { file_svc_v1_reports } from "../../gen/svc/v1/reports_pb.js";
import { file_svc_v1_templates } from "../../gen/svc/v1/templates_pb.js";
import { messageToJson } from "../shared/message-json.js";
import { callTimeoutMs, isNoHttp2 } from "./clients.js";
import { AuthMissing, UsageError } from "./profiles.js";

/** Documented exit codes (README, `svc --help`). */
export const EXIT = {
  ok: 0,
  /** The job ended failed or cancelled. */
  jobFailed: 1,
  /** svc's arguments, a profile or the environment, a file it cannot write; also the server's 400 (the values it was given). */
  usage: 2,
  auth: 3,
  unreachable: 4,
  /** The server refused the request for another reason (402, 404, 409, 429, 5xx...), its own internal errors included. */
  refused: 5,
  /** `receipt verify`: the receipt (or the output given) does not verify. */
  invalid: 6,
} as const;

export class Exit extends Error {
  constructor(readonly code: number) {
    super(`exit ${code}`);
  }
}

/** C0 controls, DEL and C1 controls: what a terminal acts on instead of printing. */
const CONTROLS = /[\u0000-\u001f\u007f-\u009f]/g;
const CONTROLS_BUT_TAB_NEWLINE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g;

/** A control character made visible: C0 in caret notation (`cat -v`), DEL and C1 as JSON writes them escaped. */
function visible(c: string): string {
  const code = c.charCodeAt(0);
  if (code < 0x20) return `^${String.fromCharCode(code + 0x40)}`;
  return `\\u${code.toString(16).padStart(4, "0")}`;
}

/**
 * Text that came from the server (a provider's name, a log line a daemon sent, an error message)
 * made safe to print on a terminal: every C0 control character (U+0000-U+001F) is shown in caret
 * notation, as `cat -v` and `less` show it (ESC as `^[`, BEL `^G`, CR `^M`), and DEL and the C1
 * controls (U+007F-U+009F) as the escape JSON and JavaScript write for them (CSI U+009B as
 * `\u009b`), so no escape sequence in it can move the cursor, erase or hide lines, retitle the
 * terminal or write the clipboard (OSC 52). Not U+FFFD: these are plain ASCII (any terminal, font
 * or locale prints them), they keep which character was sent, a provider's coloured log line stays
 * readable (`^[[31mERROR^[[0m`), and JSON text stays the same JSON (JSON.stringify already escapes
 * C0, and `\u009b` is its escape of U+009B). Tab and newline are kept unless `singleLine` (a table
 * cell or a field: one line, so that rows stay aligned).
 */
export function terminalSafe(text: string, opts: { singleLine?: boolean } = {}): string {
  return text.replace(opts.singleLine ? CONTROLS : CONTROLS_BUT_TAB_NEWLINE, visible);
}

/** The escape sequences svc writes itself (colour(): the SGR codes it uses, and the reset). */
const OWN_SGR = /(\x1b\[(?:0|2|31|32|33|36)m)/;

export const isTty = () => process.stdout.isTTY === true;
const useColour = () => isTty() && !process.env.NO_COLOR && process.env.TERM !== "dumb";

export function colour(text: string, c: "green" | "red" | "yellow" | "dim" | "cyan"): string {
  if (!useColour()) return text;
  const codes = { green: 32, red: 31, yellow: 33, dim: 2, cyan: 36 };
  return `\x1b[${codes[c]}m${text}\x1b[0m`;
}

/** A job's status (the server's text), coloured by what it means. */
export function statusColour(status: string): string {
  if (status === "completed") return colour(status, "green");
  if (status === "failed" || status === "cancelled") return colour(status, "red");
  if (status === "queued") return colour(status, "yellow");
  return colour(terminalSafe(status, { singleLine: true }), "cyan");
}

/**
 * Prints one line on stdout. Callers make the server's text in it safe (terminalSafe); a control
 * character still in it other than tab, newline and svc's own colours is made visible here too
 * (terminalSafe), so that a line built from a server's text without it does not reach the terminal
 * raw either. JSON text passes unchanged in value.
 */
export const out = (line = "") =>
  process.stdout.write(
    line
      .split(OWN_SGR)
      .map((part, i) => (i % 2 === 1 ? part : terminalSafe(part)))
      .join("") + "\n",
  );

/** Every message of the API, by type name, for apiJson. */
const registry = createRegistry(
  file_svc_v1_admin,
  file_svc_v1_daemon,
  file_svc_v1_job_types,
  file_svc_v1_jobs,
  file_svc_v1_models,
  file_svc_v1_options,
  file_svc_v1_payments,
  file_svc_v1_providers,
  file_svc_v1_receipts,
  file_svc_v1_renters,
  file_svc_v1_reports,
  file_svc_v1_templates,
);

/**
 * A value as the API's JSON: every protobuf message in it written as the REST
 * routes write it (src/shared/message-json.ts: proto field names, 64-bit
 * integers as numbers, documented nulls present, no "$typeName"); other
 * objects and arrays member by member, a bigint as a number.
 */
export function apiJson(value: unknown): unknown {
  if (typeof value === "bigint") return Number(value);
  if (Array.isArray(value)) return value.map(apiJson);
  if (value && typeof value === "object") {
    const typeName = (value as { $typeName?: unknown }).$typeName;
    const desc = typeof typeName === "string" ? registry.getMessage(typeName) : undefined;
    if (desc) return messageToJson(desc, value as Message);
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, apiJson(v)]));
  }
  return value;
}

/**
 * JSON text with no control character a terminal acts on: JSON.stringify escapes U+0000-U+001F in
 * strings but writes DEL and the C1 controls (U+007F-U+009F) as they are; those are escaped here
 * too (`\u009b`). They can only stand inside strings, so the document stays the same JSON value.
 */
export function jsonText(value: unknown, indent?: number): string {
  return terminalSafe(JSON.stringify(value, null, indent));
}

/** One JSON document (the API's JSON, see apiJson), indented. */
export function printJson(value: unknown): void {
  out(jsonText(apiJson(value), 2));
}

/** One JSON document on one line (--follow --json: one per event). */
export function printJsonLine(value: unknown): void {
  out(jsonText(apiJson(value)));
}

/** A value as one table cell or field: on one line, and safe for a terminal (terminalSafe). */
const cell = (v: unknown): string => {
  if (v === undefined || v === null || v === "") return "-";
  if (typeof v === "bigint") return v.toString();
  if (typeof v === "object") return terminalSafe(JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? Number(x) : x)), { singleLine: true });
  return terminalSafe(String(v), { singleLine: true });
};

/** A table with a header row; columns are [title, value-of-row]. */
export function printTable<T>(rows: T[], columns: [string, (r: T) => unknown][]): void {
  const cells = rows.map((r) => columns.map(([, f]) => cell(f(r))));
  const widths = columns.map(([t], i) => Math.max(t.length, ...cells.map((c) => c[i].length)));
  const line = (cs: string[]) => cs.map((c, i) => (i === cs.length - 1 ? c : c.padEnd(widths[i]))).join("  ").trimEnd();
  // Titles in capitals, a unit in brackets as written: "COST (halala)".
  out(colour(line(columns.map(([t]) => t.replace(/^[^(]*/, (name) => name.toUpperCase()))), "dim"));
  for (const c of cells) out(line(c));
  if (rows.length === 0) out(colour("(none)", "dim"));
}

/** Aligned `key  value` lines. */
export function printFields(fields: [string, unknown][]): void {
  const keys = fields.map(([k]) => terminalSafe(k, { singleLine: true }));
  const w = Math.max(...keys.map((k) => k.length));
  fields.forEach(([, v], i) => out(`${keys[i].padEnd(w)}  ${cell(v)}`));
}

/**
 * Writes a file of svc's (--out, or a job's image in the working folder): a failure is on this
 * machine, for the user to fix (exit 2: "cannot write FILE: no such file or directory (ENOENT)"),
 * not the server's refusal.
 */
export function writeLocalFile(file: string, data: string | Uint8Array): void {
  try {
    fs.writeFileSync(file, data);
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const described = typeof e.errno === "number" ? util.getSystemErrorMap().get(e.errno)?.[1] : undefined;
    throw new UsageError(`cannot write ${file}: ${described ? `${described} (${e.code})` : e.message}`);
  }
}

export const sar = (halala: bigint | number | undefined) => (halala === undefined ? "-" : `${(Number(halala) / 100).toFixed(2)} SAR`);

/**
 * What a call that failed without the server's answer ends with (see reportError): a connection
 * closed under it is canceled ("http/2 stream closed with error code CANCEL"), one reset aborted.
 */
const TRANSPORT_CODES = new Set([Code.Canceled, Code.Aborted, Code.Unavailable, Code.Unknown, Code.Internal, Code.DeadlineExceeded]);

const CODE_NAMES: Partial<Record<Code, string>> = Object.fromEntries(
  Object.entries(Code)
    .filter(([, v]) => typeof v === "number")
    .map(([k, v]) => [v, k.replace(/[A-Z]/g, (c, i) => (i ? "_" : "") + c.toLowerCase())]),
);

/**
 * One value of a metadata entry: a value the server sent in both its headers and its trailers (the
 * request id of a stream that failed midway) reaches the client as both, joined by ", "; the first is kept.
 */
export function metadataValue(metadata: Headers, name: string): string | undefined {
  const v = metadata.get(name);
  if (v === null) return undefined;
  return v.split(",")[0].trim() || undefined;
}

/**
 * Whether a failed call got no answer from the server: it failed in transport (refused, reset, DNS, TLS, a
 * gateway's bare HTTP error, no answer within the deadline), so that what it asked may or may not have been
 * done. A call the server answered carries its status (grpc-status, and x-svc-http-status on its documented
 * errors). As follow.ts `resumable` tells them apart.
 */
export function noAnswer(err: ConnectError): boolean {
  // Refused at the door for its protocol: nothing was taken (see isNoHttp2).
  if (isNoHttp2(err)) return false;
  const answered = Number(metadataValue(err.metadata, "x-svc-http-status")) > 0 || err.metadata.has("grpc-status");
  return !answered && TRANSPORT_CODES.has(err.code);
}

/** Prints an error the way svc reports every failure (its text made terminalSafe), and returns its exit code. */
export function reportError(err: unknown): number {
  if (err instanceof Exit) return err.code;
  const say = (text: string) => void process.stderr.write(`svc: ${terminalSafe(text)}\n`);
  if (err instanceof UsageError) {
    say(err.message);
    return EXIT.usage;
  }
  if (err instanceof AuthMissing) {
    say(err.message);
    return EXIT.auth;
  }
  if (err instanceof ConnectError && isNoHttp2(err)) {
    // A connection problem: the URL, or a proxy on the way, is not one svc can speak gRPC to.
    say(err.rawMessage);
    return EXIT.unreachable;
  }
  if (err instanceof ConnectError) {
    const http = Number(metadataValue(err.metadata, "x-svc-http-status")) || undefined;
    const code = CODE_NAMES[err.code] ?? String(err.code);
    const answered = http !== undefined || err.metadata.has("grpc-status");
    if (noAnswer(err) && err.code === Code.DeadlineExceeded) {
      // Taken, and never answered: what it asked may still be done (a submit or a top-up is safe to send
      // again with the same --idempotency-key).
      say(`server unreachable: no answer within ${callTimeoutMs() / 1000} s (SVC_TIMEOUT_SECONDS); the request may still take effect (gRPC ${code})`);
      return EXIT.unreachable;
    }
    if (noAnswer(err)) {
      say(`server unreachable: ${err.rawMessage} (gRPC ${code})`);
      return EXIT.unreachable;
    }
    if (!answered && err.code === Code.Unimplemented) {
      // An HTTP 404 that is no gRPC answer: something answers at this URL, but not the service's API
      // (the URL names its /api prefix, the console, or a proxy that routes only REST paths).
      say(`the service's API is not served at this URL (${err.rawMessage}, gRPC ${code}): give the service's base URL (--url, SVC_URL or the profile's), e.g. http://localhost:8080, without /api`);
      return EXIT.usage;
    }
    // The server's own failures are found in its log by the request id.
    const requestId = (!http || http >= 500) && answered ? metadataValue(err.metadata, "x-request-id") : undefined;
    say(`${err.rawMessage} (${http ? `HTTP ${http}, ` : ""}gRPC ${code}${requestId ? `, request id ${requestId}` : ""})`);
    if (err.code === Code.Unauthenticated || err.code === Code.PermissionDenied) return EXIT.auth;
    // A 400 refuses the values svc was given (a filter, a parameter): a usage error, as svc's own checks.
    if (http === 400 || (!http && (err.code === Code.InvalidArgument || err.code === Code.OutOfRange))) return EXIT.usage;
    return EXIT.refused;
  }
  const e = err as NodeJS.ErrnoException;
  say(e?.message ?? String(err));
  return EXIT.refused;
}
