// A job's signed receipt in the browser: the file `svc receipt verify` takes,
// written from the GetJobReceipt answer as the REST route writes it, and its
// check against the keys ListReceiptKeys publishes, by the rules the CLI runs
// (src/shared/receipt-check.ts) with WebCrypto's Ed25519 and SHA-256. A
// browser without Ed25519 in WebCrypto (or a page without WebCrypto: served
// over plain HTTP from another host than localhost) checks nothing, and says so.
// The job's output is checked too: SHA-256 of the very bytes
// GET /api/jobs/{id}/output/result serves (GetOutputFormat "result": the
// canonical JSON of the stored result) against the receipt's output_sha256.
import { toJson } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { JobReceiptSchema, type JobReceipt } from "../../gen/svc/v1/receipts_pb.js";
import { receiptKeyIds, verifyReceiptAsync, type PublishedKeys, type ReceiptCrypto, type Verification } from "../shared/receipt-check.js";
import { api } from "./api.js";

/**
 * The receipt file: {"receipt": …, "signature": {"algorithm", "key_id", "value"}}, the JSON text
 * GET /api/jobs/{job_id}/receipt answers (proto field names, every signature member written).
 */
export function receiptFileText(r: JobReceipt): string {
  return JSON.stringify(toJson(JobReceiptSchema, r, { useProtoFieldName: true, alwaysEmitImplicit: true }));
}

const subtle = (): SubtleCrypto | undefined => globalThis.crypto?.subtle;

/** Bytes WebCrypto takes (a view over an ArrayBuffer of its own). */
const own = (b: Uint8Array) => new Uint8Array(b);

/** The checks' cryptography from WebCrypto: every answer a promise. */
export const webReceiptCrypto: ReceiptCrypto = {
  fromBase64(text) {
    let bin: string;
    try {
      bin = atob(text);
    } catch {
      return null;
    }
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  },
  async sha256Hex(data) {
    const digest = new Uint8Array(await subtle()!.digest("SHA-256", own(data)));
    return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
  },
  async ed25519Verify(publicKey, message, signature) {
    const key = await subtle()!.importKey("raw", own(publicKey), { name: "Ed25519" }, false, ["verify"]);
    return subtle()!.verify({ name: "Ed25519" }, key, own(signature), own(message));
  },
};

const hex = (h: string) => Uint8Array.from(h.match(/../g)!, (b) => parseInt(b, 16));
// RFC 8032 section 7.1, test 1: the empty message, its key and signature.
const PROBE_KEY = hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
const PROBE_SIG = hex("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b");

let available: Promise<boolean> | undefined;

/** Whether this browser verifies Ed25519 with WebCrypto: a known good signature must check, and SHA-256 be there. */
export function ed25519Available(): Promise<boolean> {
  available ??= (async () => {
    if (!subtle()) return false;
    try {
      const ok = await webReceiptCrypto.ed25519Verify(PROBE_KEY, new Uint8Array(0), PROBE_SIG);
      await webReceiptCrypto.sha256Hex(new Uint8Array(0));
      return ok;
    } catch {
      return false;
    }
  })();
  return available;
}

/**
 * The published keys a receipt file names (its signature's, its signer's, its provider
 * attestation's), each asked for by id as `svc receipt verify` does without --keys.
 */
async function publishedKeysFor(file: unknown): Promise<PublishedKeys> {
  const pages = await Promise.all(receiptKeyIds(file).map((keyId) => api.receipts.listReceiptKeys({ keyId })));
  const server = new Map<string, PublishedKeys["server_keys"][number]>();
  const providers = new Map<string, NonNullable<PublishedKeys["provider_keys"]>[number]>();
  for (const p of pages) {
    for (const k of p.serverKeys) {
      server.set(k.keyId, { key_id: k.keyId, algorithm: k.algorithm, public_key: k.publicKey, revoked_at: k.revokedAt ?? null, revocation_reason: k.revocationReason ?? null });
    }
    for (const k of p.providerKeys) {
      providers.set(k.keyId, { key_id: k.keyId, provider_id: Number(k.providerId), algorithm: k.algorithm, public_key: k.publicKey });
    }
  }
  return { server_keys: [...server.values()], provider_keys: [...providers.values()] };
}

/** A receipt file's check: `unavailable` when this browser cannot verify Ed25519 (nothing was checked). */
export type ReceiptCheck = { state: "unavailable" } | { state: "checked"; verification: Verification };

/** Checks the receipt file `text` (receiptFileText) against the published keys it names. */
export async function checkReceiptFile(text: string): Promise<ReceiptCheck> {
  if (!(await ed25519Available())) return { state: "unavailable" };
  const file: unknown = JSON.parse(text);
  return { state: "checked", verification: await verifyReceiptAsync(webReceiptCrypto, file, await publishedKeysFor(file)) };
}

/**
 * Whether the output the service serves now is the one the receipt names: `match` or `mismatch` (the
 * SHA-256 of the served bytes, `actual`, against `expected`, the receipt's output_sha256, null when it
 * records none), `none` when the service serves no output (`reason`: its answer), `unavailable` when
 * this browser has no SHA-256 in WebCrypto (nothing was checked).
 */
export type OutputCheck =
  | { state: "unavailable" }
  | { state: "match" | "mismatch"; expected: string | null; actual: string }
  | { state: "none"; expected: string | null; reason: string };

/**
 * Hashes the job's output as GET /api/jobs/{id}/output/result answers it (docs/receipts.md, "Verifying
 * offline", step 4: those exact bytes) and compares it with the receipt's output_sha256. A job without
 * output is answered 404 (completed) or 410 (failed or cancelled; FailedPrecondition over Connect).
 */
export async function checkJobOutput(jobId: string, expected: string | null): Promise<OutputCheck> {
  if (typeof subtle()?.digest !== "function") return { state: "unavailable" };
  let data: Uint8Array;
  try {
    data = (await api.jobs.getOutputFormat({ jobId, format: "result" })).data;
  } catch (err) {
    if (err instanceof ConnectError && (err.code === Code.NotFound || err.code === Code.FailedPrecondition)) {
      return { state: "none", expected, reason: err.rawMessage };
    }
    throw err;
  }
  const actual = await webReceiptCrypto.sha256Hex(data);
  return { state: actual === expected ? "match" : "mismatch", expected, actual };
}
