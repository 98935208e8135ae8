// Text PostgreSQL cannot store: U+0000 (text and jsonb refuse it) and a UTF-16
// surrogate without its pair (JSON text may escape one, `"\ud800"`, and jsonb
// refuses it; Python's json.dumps writes one for each byte of badly decoded
// output, "\udcXX"). The rule for both, in one place:
// - requests the service decodes itself refuse them, naming the field
//   (unstorableIn, used by src/http/nul.ts);
// - what a provider's machine produced (the (svc.v1.machine_output) fields) and
//   JSON from outside stored as it came (a payment gateway's event) are made
//   storable instead (withoutNul, storableJson): U+0000 dropped, a lone
//   surrogate replaced with U+FFFD. The stream daemon does the same before it
//   signs a result, so that its attestation covers what is stored.

const NUL = /\0/g;
/** A UTF-16 surrogate without its pair. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;
/** Either of them (not global: `test` keeps no state). */
const UNSTORABLE = /\0|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
/** Their JSON escapes, and a paired surrogate's. */
const UNSTORABLE_ESCAPE = /\\u(?:0000|d[89a-f])/i;

/**
 * Whether JSON text may escape what PostgreSQL cannot store: `\u0000` or a surrogate (`\ud800` to
 * `\udfff`, paired or not). A quick test of the text before its values are checked (unstorableIn,
 * withoutNul); a match may also be an escaped backslash followed by such letters.
 */
export function mayEscapeUnstorable(json: string): boolean {
  return UNSTORABLE_ESCAPE.test(json);
}

/** What PostgreSQL cannot store in `s`: a NUL ("nul", first), a lone surrogate ("lone_surrogate"), or undefined. */
export function unstorableIn(s: string): "nul" | "lone_surrogate" | undefined {
  if (s.includes("\0")) return "nul";
  return UNSTORABLE.test(s) ? "lone_surrogate" : undefined;
}

/** `s` made storable: U+0000 dropped, each lone surrogate replaced with U+FFFD. */
export function storableText(s: string): string {
  return UNSTORABLE.test(s) ? s.replace(NUL, "").replace(LONE_SURROGATE, "\uFFFD") : s;
}

/** Whether a string, or any string or key inside arrays and plain objects, needs storableText (no recursion). */
function holdsUnstorable(x: unknown): boolean {
  const stack: unknown[] = [x];
  while (stack.length > 0) {
    const v = stack.pop();
    if (typeof v === "string") {
      if (UNSTORABLE.test(v)) return true;
    } else if (Array.isArray(v)) {
      for (const e of v) stack.push(e);
    } else if (v && typeof v === "object") {
      for (const [k, e] of Object.entries(v)) {
        if (UNSTORABLE.test(k)) return true;
        stack.push(e);
      }
    }
  }
  return false;
}

function toStorable(x: unknown): unknown {
  if (typeof x === "string") return storableText(x);
  if (Array.isArray(x)) return x.map(toStorable);
  if (x && typeof x === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(x)) out[storableText(k)] = toStorable(v);
    return out;
  }
  return x;
}

/**
 * What a provider's machine reported (a job's output, error, metrics, log
 * lines, progress, telemetry, daemon events: the (svc.v1.machine_output)
 * fields, src/http/nul.ts), made storable in every string and key in it:
 * U+0000 dropped, as heartbeats always were (a NUL in text output is padding or
 * a terminator, not a character anyone reads), and a lone surrogate replaced
 * with U+FFFD (a byte the machine's output could not decode, as a decoder
 * shows it). The value itself when it holds neither (nothing is copied).
 */
export function withoutNul<T>(x: T): T {
  return holdsUnstorable(x) ? (toStorable(x) as T) : x;
}

/**
 * JSON from outside the service that is stored as it came (a payment gateway's event), made
 * storable in jsonb and text by the same rule as machine output (withoutNul). The requests the
 * service decodes itself refuse both instead (src/http/nul.ts).
 */
export function storableJson(x: unknown): unknown {
  return withoutNul(x);
}
