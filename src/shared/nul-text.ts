// U+0000 in what a provider's machine produced. PostgreSQL text and jsonb
// cannot hold it, so the server stores such text without it (the
// (svc.v1.machine_output) fields, src/http/nul.ts), and the stream daemon drops
// it before it signs a result, so that its attestation covers what is stored.

const NUL = /\0/g;

/** Whether a string, or any string or key inside arrays and plain objects, holds U+0000 (no recursion). */
function holdsNul(x: unknown): boolean {
  const stack: unknown[] = [x];
  while (stack.length > 0) {
    const v = stack.pop();
    if (typeof v === "string") {
      if (v.includes("\0")) return true;
    } else if (Array.isArray(v)) {
      for (const e of v) stack.push(e);
    } else if (v && typeof v === "object") {
      for (const [k, e] of Object.entries(v)) {
        if (k.includes("\0")) return true;
        stack.push(e);
      }
    }
  }
  return false;
}

function dropNul(x: unknown): unknown {
  if (typeof x === "string") return x.replace(NUL, "");
  if (Array.isArray(x)) return x.map(dropNul);
  if (x && typeof x === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(x)) out[k.replace(NUL, "")] = dropNul(v);
    return out;
  }
  return x;
}

/**
 * What a provider's machine reported (a job's output, error, metrics, log
 * lines, progress, telemetry, daemon events: the (svc.v1.machine_output)
 * fields, src/http/nul.ts), made storable: U+0000 is dropped from every string
 * and key in it. Dropped rather than replaced (U+FFFD), as heartbeats always
 * were: a NUL in text output is padding or a terminator, not a character
 * anyone reads. The value itself when it holds none (nothing is copied).
 */
export function withoutNul<T>(x: T): T {
  return holdsNul(x) ? (dropNul(x) as T) : x;
}


/** A UTF-16 surrogate without its pair: JSON text may escape one (`"\ud800"`), and jsonb refuses it. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

function storableText(s: string): string {
  return s.replace(NUL, "").replace(LONE_SURROGATE, "\uFFFD");
}

/**
 * JSON from outside the service that is stored as it came (a payment gateway's event), made
 * storable in jsonb and text: U+0000 dropped, and a lone surrogate replaced with U+FFFD, in every
 * string and key. The requests the service decodes itself refuse both instead (src/http/nul.ts).
 */
export function storableJson(x: unknown): unknown {
  if (typeof x === "string") return storableText(x);
  if (Array.isArray(x)) return x.map(storableJson);
  if (x && typeof x === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(x)) out[storableText(k)] = storableJson(v);
    return out;
  }
  return x;
}
