// RFC 8785 canonical JSON (JSON Canonicalization Scheme): object members
// sorted by UTF-16 code units, no whitespace, strings as JSON.stringify writes
// them, numbers in their shortest round-trip form. Task signatures
// (task-signature.ts) and receipts (receipt-check.ts) sign these bytes. Plain
// JavaScript only: the web console bundles it to verify receipts.

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
