// JSON.parse reads any nesting, but JSON.stringify and every recursive walk of
// the value (the answer's assembly, the bounds of a prompt) take one stack
// frame per level: a few hundred kilobytes of `{"a":` throw RangeError out of
// them. The gateway takes JSON from renters and from providers' endpoints, so
// it refuses what nests deeper than any chat request or answer does before
// anything walks it.

/**
 * Deepest nesting accepted, in a renter's request body and in an endpoint's chunk. A chunk nests 9 deep at
 * most (choices, logprobs, content, top_logprobs, bytes); a request's deepest part is a tool's JSON schema.
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
