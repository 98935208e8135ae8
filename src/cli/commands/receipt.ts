// svc receipt: get, output, keys and verify; revoke-key (an admin profile).
import fs from "node:fs";
import type { Command } from "commander";
import { JobReceiptSchema, ReceiptKeysSchema } from "../../../gen/svc/v1/receipts_pb.js";
import { messageToJson } from "../../shared/message-json.js";
import { receiptKeyIds, repeatedMemberName, verifyReceipt, type PublishedKeys } from "../../shared/receipt.js";
import { clientsFor } from "../clients.js";
import { EXIT, Exit, colour, jsonText, out, printFields, printJson, writeLocalFile } from "../output.js";
import { checkBaseUrl, UsageError } from "../profiles.js";
import type { Context } from "./context.js";

/** The answer of a proto message as the REST route writes it (src/shared/message-json.ts), for saving. */
const restJson = messageToJson;

function readJsonText(file: string, what: string): { value: unknown; text: string } {
  let text: string;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (err) {
    throw new UsageError(`cannot read ${what} ${file}: ${(err as Error).message}`);
  }
  try {
    return { value: JSON.parse(text), text };
  } catch {
    throw new UsageError(`${what} ${file} is not JSON`);
  }
}

const readJsonFile = (file: string, what: string): unknown => readJsonText(file, what).value;

function writeOrPrint(value: unknown, file: string | undefined, what: string, json: boolean) {
  // On stdout as every JSON svc prints (jsonText: a C1 control a provider put in the receipt, e.g. in
  // its GPU model, as its JSON escape); into a file, the exact bytes.
  if (!file) return void out(jsonText(value, 2));
  const text = JSON.stringify(value, null, 2) + "\n";
  writeLocalFile(file, text);
  if (json) printJson({ file, bytes: Buffer.byteLength(text) });
  else out(`${what} written to ${file}`);
}

/**
 * svc receipt get|output|keys|verify|revoke-key. `verify` needs no account and, with --keys, no
 * network: the receipt, the public keys and the output (optional) are files (src/shared/receipt.ts
 * checks them).
 */
export function addReceiptCommands(program: Command, ctx: Context): void {
  const { globals: g, session, show } = ctx;
  const receipt = program.command("receipt").description("signed job receipts: download them, and verify them offline with public keys");
  receipt
    .command("get")
    .argument("<job_id>")
    .option("-o, --out <file>", "write the receipt file here (default: print it)")
    .description("a settled job's signed receipt (its renter, its providers, admins)")
    .action(async (jobId: string, o: { out?: string }) => {
      const { c } = session();
      const r = await c.receipts.getJobReceipt({ jobId });
      writeOrPrint(restJson(JobReceiptSchema, r), o.out, "receipt", !!g().json);
    });
  receipt
    .command("output")
    .argument("<job_id>")
    .option("-o, --out <file>", "write the output here (default: print it)")
    .description("a settled job's output exactly as its receipt's output_sha256 hashes it (also a failed job's), for verify --output")
    .action(async (jobId: string, o: { out?: string }) => {
      const { c } = session();
      const r = await c.jobs.getOutputFormat({ jobId, format: "result" });
      // Parsed and written as every JSON svc prints or files (the canonical bytes' hash is what verify checks).
      writeOrPrint(JSON.parse(Buffer.from(r.data).toString("utf8")), o.out, "output", !!g().json);
    });
  receipt
    .command("keys")
    .option("-o, --out <file>", "write the public keys here (default: print them)")
    .option("--url <url>", "server to ask (default: the profile's)")
    .description("the public keys that verify receipts (server keys, retired and revoked ones included, and provider keys)")
    .action(async (o: { out?: string; url?: string }) => {
      const keys = await fetchKeys(o.url, session);
      writeOrPrint(keys, o.out, "keys", !!g().json);
    });
  receipt
    .command("verify")
    .argument("<file>", "a receipt file (svc receipt get, or GET /api/jobs/{job_id}/receipt)")
    .option("--keys <file>", "public keys (svc receipt keys, or GET /api/receipts/keys): no network at all")
    .option("--url <url>", "without --keys: read the public keys from this server (default: the profile's)")
    .option("--output <file>", "also check the job's output (svc receipt output, GET /api/jobs/{job_id}/output/result, or the output route's answer)")
    .description("check a receipt's signatures (server and provider attestation) and, with --output, the output")
    .addHelpText("after", "\nExit code 0 when everything checked holds, 6 when anything does not.")
    .action(async (file: string, o: { keys?: string; url?: string; output?: string }) => {
      const { value: doc, text } = readJsonText(file, "receipt");
      const named = receiptKeyIds(doc);
      const keys = o.keys ? (readJsonFile(o.keys, "keys file") as PublishedKeys) : await fetchKeys(o.url, session, named);
      const outputFile = o.output ? readJsonText(o.output, "output") : undefined;
      const v = verifyReceipt(doc, keys, outputFile && { value: outputFile.value });
      const repeated = repeatedMemberName(text);
      if (repeated !== undefined) {
        v.problems.unshift(`the file names "${repeated}" twice in one object: what it shows need not be what was signed`);
        v.ok = false;
      }
      const repeatedInOutput = outputFile && repeatedMemberName(outputFile.text);
      if (repeatedInOutput !== undefined) {
        v.problems.push(`the output file names "${repeatedInOutput}" twice in one object: what it shows need not be what was hashed`);
        v.ok = false;
      }
      const body = (doc as { receipt?: Record<string, unknown> })?.receipt ?? {};
      show({ valid: v.ok, job_id: body.job_id ?? null, receipt_id: body.receipt_id ?? null, checks: v.checks, problems: v.problems }, () => {
        for (const line of v.checks) out(`${colour("ok", "green")}   ${line}`);
        for (const line of v.problems) out(`${colour("FAIL", "red")} ${line}`);
        out(v.ok ? `receipt ${String(body.receipt_id)} of job ${String(body.job_id)}: valid` : `receipt ${String(body.receipt_id ?? file)}: NOT valid`);
      });
      if (!v.ok) throw new Exit(EXIT.invalid);
    });
  receipt
    .command("revoke-key")
    .argument("<key_id>", "a server receipt key (srv-…)")
    .option("--reason <text>", "why (published with the key, and kept in the audit log)")
    .description("revoke a server receipt key (admin): trusted no more; its receipts are signed again with the current key")
    .action(async (keyId: string, o: { reason?: string }) => {
      const { c } = session("admin");
      const r = await c.receipts.revokeReceiptKey({ keyId, reason: o.reason });
      show(r, () => {
        printFields([
          ["revoked", r.key?.keyId],
          ["revoked at", r.key?.revokedAt],
          ["reason", r.key?.revocationReason],
          ["current key", r.current?.keyId],
          ["receipts re-signed", r.receiptsResigned],
        ]);
        if (r.alreadyRevoked) out("the key was already revoked: nothing changed");
        if (!r.resigningDone) out("re-signing continues on the server (its periodic sweep); receipts are served re-signed meanwhile");
      });
    });
}

/** Provider keys per page of the listing (its largest). */
const KEYS_PAGE = 1000;

/**
 * Published keys from --url (no credential: the route is public) or the profile's server: all of
 * them, page by page, or only those with the ids given (what one receipt names).
 */
async function fetchKeys(url: string | undefined, session: Context["session"], ids?: string[]): Promise<PublishedKeys> {
  const c = url ? clientsFor({ url: checkBaseUrl(url, "--url"), role: "renter", secret: "" }) : session().c;
  const pages = [];
  if (ids) for (const keyId of ids) pages.push(await c.receipts.listReceiptKeys({ keyId }));
  else {
    // Pages after the last provider read whole (an offset stops at 10,000 keys): keys come in provider
    // order, and a page that ends inside a provider's keys is completed with that provider's own listing.
    let after: bigint | undefined;
    for (;;) {
      const page = await c.receipts.listReceiptKeys({ limit: KEYS_PAGE, afterProviderId: after });
      pages.push(page);
      const keys = page.providerKeys;
      if (keys.length < KEYS_PAGE) break;
      const last = keys[keys.length - 1].providerId;
      // A server that ignored after_provider_id answers the same page again: stop rather than loop.
      if (after !== undefined && last <= after) break;
      for (let offset = 0; ; ) {
        const own = await c.receipts.listReceiptKeys({ providerId: last, limit: KEYS_PAGE, offset });
        pages.push(own);
        offset += own.providerKeys.length;
        if (own.providerKeys.length < KEYS_PAGE) break;
      }
      after = last;
    }
  }
  const json = pages.map((p) => restJson(ReceiptKeysSchema, p) as unknown as PublishedKeys);
  const byId = <T extends { key_id: string }>(list: T[]) => [...new Map(list.map((k) => [k.key_id, k])).values()];
  return { server_keys: byId(json.flatMap((j) => j.server_keys ?? [])), provider_keys: byId(json.flatMap((j) => j.provider_keys ?? [])) };
}
