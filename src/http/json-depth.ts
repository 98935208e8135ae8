// JSON.parse reads any nesting, but JSON.stringify and every recursive walk of
// the value (protobuf's reading of a Struct, the answer's assembly, the bounds
// of a prompt) take one stack frame per level: a few hundred kilobytes of
// `{"a":` throw RangeError out of them. And JSON.parse itself, given a body of
// millions of levels, holds the event loop for seconds and the heap for
// hundreds of megabytes, before anything has looked at the caller's
// credentials. So request bodies are measured as text first
// (jsonTextDepthExceeds, linear and stopping at the first level too many), and
// what nests deeper than its route allows is refused before it is parsed.

/**
 * Deepest nesting accepted in a request body (/api and /v1) and in a /v1 endpoint's chunk. No request's
 * shape comes near it: a chunk nests 9 deep at most (choices, logprobs, content, top_logprobs, bytes), a chat
 * request's deepest part is a tool's JSON schema, and the free-form JSON of an /api request (a job's params, a
 * result's output and metrics, telemetry) is read by protobuf-es, which stops at 100 messages deep (each
 * JSON level is one or two: a Value, and a Struct or ListValue).
 */
export const MAX_JSON_DEPTH = 100;

/** Whether `value` nests objects and arrays more than `max` deep (a scalar is 0 deep, `{}` 1). Iterative: any depth is safe to ask about. */
export function jsonDepthExceeds(value: unknown, max = MAX_JSON_DEPTH): boolean {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (!v || typeof v !== "object") continue;
    if (depth > max) return true;
    for (const x of Array.isArray(v) ? v : Object.values(v)) if (x && typeof x === "object") stack.push([x, depth + 1]);
  }
  return false;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * Measures the nesting of JSON text fed in pieces (a body as it arrives), counted as jsonDepthExceeds
 * counts the parsed value. It jumps over strings (native indexOf to each closing quote) and looks at
 * no byte after the first level too many; text that is not JSON is left to the parser to refuse.
 */
export class JsonDepthMeter {
  private depth = 0;
  private inString = false;
  /** Inside a string, the last byte was a backslash that escapes the next one. */
  private escaped = false;
  private over = false;

  constructor(private readonly max: number) {}

  /** Takes the next bytes of the text; true once it has nested deeper than `max`. */
  exceeds(piece: Uint8Array): boolean {
    if (this.over) return true;
    const b = Buffer.isBuffer(piece) ? piece : Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
    let i = 0;
    while (i < b.length) {
      if (this.inString) {
        if (this.escaped) {
          this.escaped = false;
          i++;
          continue;
        }
        const q = b.indexOf(QUOTE, i);
        // The run of backslashes just before `end` (none of it before i: i is not escaped).
        const run = (end: number) => {
          let k = end - 1;
          while (k >= i && b[k] === BACKSLASH) k--;
          return end - 1 - k;
        };
        if (q < 0) {
          this.escaped = run(b.length) % 2 === 1;
          return false;
        }
        if (run(q) % 2 === 0) this.inString = false; // an escaped quote is part of the string
        i = q + 1;
        continue;
      }
      const c = b[i++];
      if (c === QUOTE) {
        this.inString = true;
      } else if (c === 0x7b || c === 0x5b) {
        if (++this.depth > this.max) return (this.over = true);
      } else if (c === 0x7d || c === 0x5d) {
        this.depth--;
      }
    }
    return false;
  }
}

/** Whether JSON text nests objects and arrays more than `max` deep (JsonDepthMeter, in one piece). */
export function jsonTextDepthExceeds(text: Uint8Array, max: number): boolean {
  return new JsonDepthMeter(max).exceeds(text);
}
