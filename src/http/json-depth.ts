// JSON.parse reads any nesting, but JSON.stringify and every recursive walk of
// the value (protobuf's reading of a Struct, the answer's assembly, the bounds
// of a prompt) take one stack frame per level: a few hundred kilobytes of
// `{"a":` throw RangeError out of them. And JSON.parse itself, given a body of
// millions of levels, holds the event loop for seconds and the heap for
// hundreds of megabytes, before anything has looked at the caller's
// credentials. So request bodies are measured as text first (JsonDepthMeter,
// linear and stopping at the first level too many; json-scan.ts), and what
// nests deeper than its route allows is refused before it is parsed, naming
// the top-level member that does.

import { JsonScanner } from "./json-scan.js";

export { jsonDepthExceeds, MAX_JSON_DEPTH, PROTO_RECURSION_LIMIT, tooDeepMessage } from "../shared/json-nesting.js";

/**
 * Measures the nesting of JSON text fed in pieces (a body as it arrives), counted as jsonDepthExceeds
 * counts the parsed value: exceeds() is true once it nests deeper than `max`, and member() then names
 * the top-level member being read (JsonScanner, with no lists to count).
 */
export class JsonDepthMeter extends JsonScanner {
  constructor(max: number) {
    super(max);
  }
}

/** Whether JSON text nests objects and arrays more than `max` deep (JsonDepthMeter, in one piece). */
export function jsonTextDepthExceeds(text: Uint8Array, max: number): boolean {
  return new JsonDepthMeter(max).exceeds(text);
}
