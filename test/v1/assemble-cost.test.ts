// A non-streamed answer is built from the endpoint's chunks on the event loop: vLLM streams one
// chunk per token, with logprobs one entry each, and an endpoint may send tiny chunks at will, so
// the assembly must cost in proportion to the chunks (copying what was gathered on every chunk
// made 30,000 of them take tens of seconds, stalling every request of the process). And every
// part of a choice that grows the answer counts against its size cap.
import { describe, expect, it } from "vitest";
import { CompletionBuilder } from "../../src/http/v1/assemble.js";

type Json = Record<string, unknown>;

const tokenChunk = (i: number): Json => ({
  id: "c",
  object: "chat.completion.chunk",
  created: 1,
  model: "m",
  choices: [
    {
      index: 0,
      delta: { content: "x" },
      logprobs: { content: [{ token: "x", logprob: -0.1, bytes: [120], top_logprobs: [] }] },
      token_ids: [i],
      finish_reason: null,
    },
  ],
});

/**
 * Array elements the assembly of `chunks` visits: those copied by concat, and those walked by the
 * array iterator (spread, for...of, Array.from). Counted, not timed: the figure is the same on any machine.
 */
function elementsVisited(chunks: Json[]): { visited: number; json: Json } {
  const proto = Array.prototype as unknown as { concat: typeof Array.prototype.concat; [Symbol.iterator]: () => Iterator<unknown> };
  const { concat } = proto;
  const iterate = proto[Symbol.iterator];
  let visited = 0;
  proto.concat = function (this: unknown[], ...items: unknown[]) {
    visited += this.length + items.reduce((n: number, x) => n + (Array.isArray(x) ? x.length : 1), 0);
    return concat.apply(this, items);
  } as typeof Array.prototype.concat;
  proto[Symbol.iterator] = function (this: unknown[]) {
    const it = iterate.call(this);
    return {
      next: () => {
        visited++;
        return it.next();
      },
      [Symbol.iterator]() {
        return this;
      },
    };
  };
  try {
    const b = new CompletionBuilder(1 << 30);
    for (let i = 0; i < chunks.length; i++) if (!b.add(chunks[i])) throw new Error(`chunk ${i} refused`);
    return { visited, json: b.build() };
  } finally {
    proto.concat = concat;
    proto[Symbol.iterator] = iterate;
  }
}

describe("CompletionBuilder", () => {
  it("visits each chunk's elements a bounded number of times: linear in the chunks", () => {
    const small = elementsVisited(Array.from({ length: 1000 }, (_, i) => tokenChunk(i)));
    const large = elementsVisited(Array.from({ length: 4000 }, (_, i) => tokenChunk(i)));
    // Copying what came before on every chunk visits about N²/2 elements: 8 million for 4000 chunks.
    expect(large.visited).toBeLessThan(100 * 4000);
    expect(large.visited).toBeLessThanOrEqual(4 * small.visited + 100);
    const [choice] = large.json.choices as Json[];
    expect((choice.message as Json).content).toBe("x".repeat(4000));
    expect(((choice.logprobs as Json).content as unknown[]).length).toBe(4000);
    expect(choice.token_ids).toEqual(Array.from({ length: 4000 }, (_, i) => i));
    expect(choice.finish_reason).toBeNull();
  });

  it("assembles 30,000 token chunks with logprobs in well under 5 seconds", () => {
    const chunks = Array.from({ length: 30_000 }, (_, i) => tokenChunk(i));
    const t = performance.now();
    const b = new CompletionBuilder(1 << 30);
    for (const c of chunks) b.add(c);
    const [choice] = b.build().choices as Json[];
    // Tens of seconds when quadratic; a generous bound for a slow, busy machine.
    expect(performance.now() - t).toBeLessThan(5000);
    expect(((choice.logprobs as Json).content as unknown[]).length).toBe(30_000);
  });

  it("counts a choice's other fields (token_ids) against the size cap, as its delta and logprobs", () => {
    const ids = Array.from({ length: 100 }, () => 151_643); // 701 bytes of JSON a chunk
    const b = new CompletionBuilder(10_000);
    let taken = 0;
    while (taken < 100 && b.add({ id: "c", choices: [{ index: 0, delta: {}, token_ids: ids }] })) taken++;
    expect(taken).toBe(14);
    expect(b.bytes).toBeLessThanOrEqual(10_000);
    const [choice] = b.build({ finishAs: "length" }).choices as Json[];
    expect((choice.token_ids as unknown[]).length).toBe(14 * 100);
  });
});
