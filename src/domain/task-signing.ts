// Task signing (DESIGN §3): task_spec_hmac = lowercase hex
// HMAC-SHA256(SVC_HMAC_SECRET, canonical JSON of task_spec), canonical per
// RFC 8785: object keys sorted by UTF-16 code units, no whitespace, strings
// as JSON.stringify writes them, numbers in their shortest round-trip form.
import crypto from "node:crypto";

export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") {
    if (typeof value === "number" && !Number.isFinite(value)) throw new Error("non-finite number in task spec");
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  const entries = Object.entries(value as Record<string, unknown>)
    .filter(([, v]) => v !== undefined)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
}

export function signTask(secret: string, taskSpec: unknown): string {
  return hmacOfCanonical(secret, canonicalJson(taskSpec));
}

function hmacOfCanonical(secret: string, canonical: string): string {
  return crypto.createHmac("sha256", secret).update(canonical, "utf8").digest("hex");
}

/** `canonical`: canonicalJson(taskSpec) when the caller already has it (it also signs it). */
export function verifyTask(secret: string, taskSpec: unknown, hmac: string, canonical = canonicalJson(taskSpec)): boolean {
  if (!/^[0-9a-f]{64}$/.test(hmac)) return false;
  return crypto.timingSafeEqual(Buffer.from(hmacOfCanonical(secret, canonical), "hex"), Buffer.from(hmac, "hex"));
}
