// The SSE reader: events split anywhere across chunks, every kind of line end,
// and bounded work on bytes from a hostile endpoint (each byte scanned once,
// one event at most MAX_SSE_EVENT_LENGTH).
import { expect, it } from "vitest";
import { MAX_SSE_EVENT_LENGTH, SseReader } from "../../src/http/v1/sse.js";

const bytes = (s: string) => new TextEncoder().encode(s);

/** Feeds `text` cut into pieces of `size` bytes; returns every event's data, the end included. */
function read(text: string, size: number, reader = new SseReader()): string[] {
  const b = bytes(text);
  const out: string[] = [];
  for (let i = 0; i < b.length; i += size) out.push(...reader.push(b.subarray(i, i + size)));
  out.push(...reader.end());
  return out;
}

it("reads events split at every byte, with LF, CRLF and CR line ends, multi-line data, and other fields skipped", () => {
  const text =
    'data: {"a":1}\n\n' +
    ": keep-alive comment\r\n\r\n" +
    "event: x\r\nid: 7\r\ndata: first\r\ndata:second\r\n\r\n" +
    "data: cr\r\rdata: mixed\n\r\n" +
    "data: é漢字🙂\n\n" +
    "data: [DONE]";
  const want = ['{"a":1}', "first\nsecond", "cr", "mixed", "é漢字🙂", "[DONE]"];
  for (const size of [1, 2, 3, 7, 1024]) expect(read(text, size), `pieces of ${size}`).toEqual(want);
});

it("a CR at the end of one chunk and the LF opening the next are one line end", () => {
  const r = new SseReader();
  expect(r.push(bytes("data: a\r"))).toEqual([]);
  expect(r.push(bytes("\n"))).toEqual([]); // not a blank line
  expect(r.push(bytes("\r\ndata: b\r"))).toEqual(["a"]);
  expect(r.push(bytes("\r"))).toEqual(["b"]); // CR CR: a blank line
  expect(r.end()).toEqual([]);
});

it("scans each byte once: 5 MB without an event boundary, in 1 KB chunks, is searched once", () => {
  const chunk = bytes("x".repeat(1024));
  const n = 5 * 1024;
  const r = new SseReader(10 * 1024 * 1024); // a limit above the input, so every chunk is scanned
  r.push(bytes("data: "));
  for (let i = 0; i < n; i++) expect(r.push(chunk)).toHaveLength(0);
  expect(r.overflowed).toBe(false);
  expect(r.push(bytes("\n\n"))).toEqual(["x".repeat(n * 1024)]);
  // The former reader re-split the whole buffer on every chunk: about 13 GB searched here. Counted, not timed.
  expect(r.scannedChars).toBe("data: ".length + n * 1024 + 2);
});

it("gives up on an event longer than the limit and reads nothing after it", () => {
  const chunk = bytes("x".repeat(1024));
  const r = new SseReader();
  expect(r.push(bytes("data: ok\n\ndata: "))).toEqual(["ok"]);
  let pushed = 0;
  while (!r.overflowed && pushed < 5 * 1024) {
    expect(r.push(chunk)).toEqual([]);
    pushed++;
  }
  expect(r.overflowed).toBe(true);
  expect(pushed * 1024).toBeGreaterThanOrEqual(MAX_SSE_EVENT_LENGTH - 1024);
  expect(pushed * 1024).toBeLessThanOrEqual(MAX_SSE_EVENT_LENGTH + 1024);
  expect(r.push(bytes("\n\ndata: later\n\n"))).toEqual([]);
  expect(r.end()).toEqual([]);
  // Nothing after the overflow is searched.
  expect(r.scannedChars).toBeLessThanOrEqual(MAX_SSE_EVENT_LENGTH + 2 * 1024 + "data: ok\n\ndata: ".length);
});

it("counts skipped lines toward the limit too, and events below it never trip it", () => {
  const comments = new SseReader(1000);
  for (let i = 0; i < 200 && !comments.overflowed; i++) comments.push(bytes(": ping\n"));
  expect(comments.overflowed).toBe(true);

  const many = new SseReader(1000);
  const events = read(`data: ${"z".repeat(900)}\n\n`.repeat(10_000), 4096, many);
  expect(events).toHaveLength(10_000);
  expect(many.overflowed).toBe(false);
});
