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
 * Whether JSON text nests objects and arrays more than `max` deep, counted as jsonDepthExceeds counts
 * the parsed value. One pass that jumps over strings (native indexOf to each closing quote) and stops at
 * the first level too many; text that is not JSON is left to the parser to refuse.
 */
export function jsonTextDepthExceeds(text: Uint8Array, max: number): boolean {
  const b = Buffer.isBuffer(text) ? text : Buffer.from(text.buffer, text.byteOffset, text.byteLength);
  let depth = 0;
  for (let i = 0; i < b.length; i++) {
    const c = b[i];
    if (c === QUOTE) {
      // The closing quote: the next one not escaped (an even run of backslashes before it).
      let j = i;
      for (;;) {
        j = b.indexOf(QUOTE, j + 1);
        if (j < 0) return false;
        let k = j - 1;
        while (b[k] === BACKSLASH) k--;
        if ((j - 1 - k) % 2 === 0) break;
      }
      i = j;
    } else if (c === 0x7b || c === 0x5b) {
      if (++depth > max) return true;
    } else if (c === 0x7d || c === 0x5d) {
      depth--;
    }
  }
  return false;
}
