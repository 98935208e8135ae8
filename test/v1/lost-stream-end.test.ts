// An endpoint whose answer is whole (every choice the request asked for has its finish_reason) but whose
// stream then breaks, before its usage chunk or `data: [DONE]`, has answered: the client gets the whole
// answer as a success and is billed for it. Before, a client that had not asked for the usage chunk lost
// the finishing chunk's text (held back for the usage chunk), and every client got an error instead of
// the answer it was sent (a streaming error event, a non-streaming 502), which the OpenAI SDK runs again.
// An answer that is not whole when the stream breaks stays an error.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { startEvil, usageChunk, type Ending } from "./evil-upstream.js";
import { serveModel } from "./serving.js";

const RATE = { input: 1_000_000, output: 2_000_000 }; // 1 halala per prompt token, 2 per completion token
const srv = useTestServer({ SVC_V1_TOKEN_RATES: JSON.stringify({ "*": RATE }), SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });

const cleanup: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  for (const f of cleanup) await f();
});

/** A chunk as vLLM sends it with continuous_usage_stats: its choices' deltas and the usage so far. */
const piece = (choices: { index: number; content: string; finish?: string }[], completionTokens: number) => ({
  id: "chatcmpl-lost-end",
  object: "chat.completion.chunk",
  created: 1,
  model: "m",
  choices: choices.map((c) => ({ index: c.index, delta: { content: c.content }, finish_reason: c.finish ?? null })),
  usage: { prompt_tokens: 5, completion_tokens: completionTokens, total_tokens: 5 + completionTokens },
});

const WHOLE = [piece([{ index: 0, content: "Hel" }], 1), piece([{ index: 0, content: "lo", finish: "stop" }], 2)];
const WHOLE_WITH_USAGE = [...WHOLE, usageChunk("m", 5, 2)];
// Two choices asked for (n = 2), one finished.
const HALF = [piece([{ index: 0, content: "Hel" }, { index: 1, content: "Bye" }], 2), piece([{ index: 0, content: "lo", finish: "stop" }], 3)];
const UNFINISHED = [piece([{ index: 0, content: "Hel" }], 1)];
/** The reported usage: 5 prompt tokens, 2 completion tokens. */
const COST = 5 + 2 * 2;

/** How the endpoints end their streams, for the tests that run now. */
let ending: Ending = "drop";
async function endpoint(events: object[], model: string): Promise<string> {
  const evil = await startEvil(() => events as Record<string, unknown>[], () => ending);
  cleanup.push(evil.close);
  await serveModel(srv, model, evil.url);
  return model;
}
const models: Record<string, string> = {};
beforeAll(async () => {
  models.whole = await endpoint(WHOLE, "TinyLlama/TinyLlama-1.1B-Chat-v1.0");
  models.withUsage = await endpoint(WHOLE_WITH_USAGE, "microsoft/Phi-3-mini-4k-instruct");
  models.half = await endpoint(HALF, "google/gemma-2-9b-it");
  models.unfinished = await endpoint(UNFINISHED, "Qwen/Qwen2.5-7B-Instruct");
});

async function ask(model: string, body: Record<string, unknown>) {
  const renter = await makeRenter(srv, 100_000);
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${renter.key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 20, ...body }),
  });
  const text = await res.text();
  const [row] = await srv.sql<{ state: string; cost_halala: number }[]>`
    SELECT state, cost_halala FROM v1_usage WHERE request_id = ${res.headers.get("x-request-id")!}`;
  return { status: res.status, text, row };
}

/** The events of an SSE answer, parsed (`[DONE]` as the string). */
function events(text: string): unknown[] {
  return text
    .split("\n\n")
    .filter((e) => e.startsWith("data: "))
    .map((e) => e.slice("data: ".length))
    .map((d) => (d === "[DONE]" ? d : JSON.parse(d)));
}

const content = (evs: unknown[]) =>
  evs.flatMap((e) => ((e as { choices?: { delta?: { content?: string } }[] }).choices ?? []).map((c) => c.delta?.content ?? "")).join("");

for (const how of ["drop", "end"] as const) {
  describe(`the endpoint's stream ${how === "drop" ? "drops" : "ends"} after the answer, before [DONE]`, () => {
    beforeAll(() => {
      ending = how;
    });

    it("streaming, without the usage chunk: the finishing chunk, with its usage, and [DONE]; billed", async () => {
      const a = await ask(models.whole, { stream: true });
      expect(a.status).toBe(200);
      const evs = events(a.text);
      expect(content(evs)).toBe("Hello");
      expect(evs.at(-1)).toBe("[DONE]");
      expect(a.text).not.toContain('"error"');
      const last = evs.at(-2) as { choices: { finish_reason: string }[]; usage: { completion_tokens: number } };
      expect(last.choices[0].finish_reason).toBe("stop");
      expect(last.usage.completion_tokens).toBe(2);
      expect(a.row).toEqual({ state: "settled", cost_halala: COST });
    });

    it("streaming, with the usage chunk asked for: it comes, then [DONE]; billed", async () => {
      for (const m of [models.whole, models.withUsage]) {
        const a = await ask(m, { stream: true, stream_options: { include_usage: true } });
        expect(a.status).toBe(200);
        const evs = events(a.text);
        expect(content(evs)).toBe("Hello");
        expect(evs.at(-1)).toBe("[DONE]");
        expect(a.text).not.toContain('"error"');
        expect(evs.at(-2)).toMatchObject({ choices: [], usage: { prompt_tokens: 5, completion_tokens: 2 } });
        expect(a.row).toEqual({ state: "settled", cost_halala: COST });
      }
    });

    it("not streaming: 200 with the whole answer; billed", async () => {
      for (const m of [models.whole, models.withUsage]) {
        const a = await ask(m, {});
        expect(a.status, a.text).toBe(200);
        const json = JSON.parse(a.text);
        expect(json.choices).toEqual([expect.objectContaining({ index: 0, message: expect.objectContaining({ content: "Hello" }), finish_reason: "stop" })]);
        expect(json.usage).toMatchObject({ prompt_tokens: 5, completion_tokens: 2 });
        expect(a.row).toEqual({ state: "settled", cost_halala: COST });
      }
    });

    it("an answer not whole (its choice unfinished, one of two unfinished) stays an error: streamed, what was sent is billed; not streamed, 502", async () => {
      for (const [m, n, sent] of [[models.unfinished, 1, "Hel"], [models.half, 2, "HelByelo"]] as const) {
        const streamed = await ask(m, { stream: true, n });
        expect(streamed.status).toBe(200);
        const evs = events(streamed.text);
        // Every piece of text the endpoint sent reaches the client, the finished choice's last one too.
        expect(content(evs)).toBe(sent);
        expect(evs).not.toContain("[DONE]");
        expect(evs.at(-1)).toMatchObject({ error: { code: "provider_unavailable" } });
        expect(streamed.row.state).toBe("settled");
        // Charged nothing, as any non-streaming answer that broke off (the SDK runs it again).
        const whole = await ask(m, { n });
        expect(whole.status, whole.text).toBe(502);
        expect(whole.row).toEqual({ state: "released", cost_halala: 0 });
      }
    });
  });
}
