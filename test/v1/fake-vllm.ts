// A small OpenAI-compatible HTTP server that plays vLLM in tests: answers
// POST /v1/chat/completions (JSON or SSE) with a fixed reply and exact usage,
// and can be told to fail, hang or stream slowly. It records what it saw.
// The "stream-*" modes answer a streaming request 200 (headers flushed) and
// then fail before the first event: the connection drops, the response ends
// empty, the first event is an error, or nothing more comes.
// The endless modes never stop sending until the gateway hangs up: one event
// that never ends (from the start, or after the first words), or a flood of
// well-formed chunks. "overstate" answers like "ok" but reports usage of
// OVERSTATED_TOKENS prompt and completion tokens, far beyond what it sent.
// Given an API key (`apiKey`, as vLLM's --api-key / VLLM_API_KEY), it refuses
// every /v1 request without `Authorization: Bearer <key>` with 401, as vLLM
// does; it records each request's Authorization header either way.
import http from "node:http";
import type { AddressInfo } from "node:net";

export type Mode =
  | "ok"
  | "overstate"
  | "error500"
  | "refuse400"
  | "hang"
  | "slow-stream"
  | "break-stream"
  | "slow-json"
  | "stream-drop-before-first"
  | "stream-end-before-first"
  | "stream-error-first"
  | "stream-stall-before-first"
  | "stream-endless-event-first"
  | "stream-endless-event"
  | "stream-flood";

export interface FakeVllm {
  url: string;
  name: string;
  mode: Mode;
  /** Request bodies received (those its key let through). */
  requests: Record<string, unknown>[];
  /** The key /v1 requests must carry (`Authorization: Bearer <key>`); none: every request is served. */
  apiKey?: string;
  /** The Authorization header of every request received, in order (undefined: none sent). */
  authorizations: (string | undefined)[];
  /** Requests refused for a missing or wrong key (401). */
  refused: number;
  /** Bytes the endless modes poured out until the gateway hung up. */
  sent: number;
  /** Requests whose client (the gateway) went away before the answer ended. */
  aborted: number;
  /** Resolves when the next request is aborted by its client. */
  nextAbort(): Promise<void>;
  close(): Promise<void>;
}

/** Words of the reply; one stream chunk each, and `completion_tokens` = their count. */
export const REPLY_WORDS = ["Hello", " from", " a", " provider", " GPU", "."];
export const PROMPT_TOKENS = 11;
/** The prompt and completion tokens "overstate" claims. */
export const OVERSTATED_TOKENS = 900_000_000;

export async function startFakeVllm(name: string, mode: Mode = "ok", opts: { apiKey?: string } = {}): Promise<FakeVllm> {
  const sockets = new Set<import("node:net").Socket>();
  let abortWaiters: (() => void)[] = [];
  const fake: FakeVllm = {
    url: "",
    name,
    mode,
    requests: [],
    apiKey: opts.apiKey,
    authorizations: [],
    refused: 0,
    sent: 0,
    aborted: 0,
    nextAbort: () => new Promise((resolve) => abortWaiters.push(resolve)),
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
  const server = http.createServer(async (req, res) => {
    let finished = false;
    res.on("close", () => {
      if (!finished) {
        fake.aborted++;
        const w = abortWaiters;
        abortWaiters = [];
        w.forEach((f) => f());
      }
    });
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    fake.authorizations.push(req.headers.authorization);
    // vLLM's check: every path under /v1, the exact header (its /health is open).
    if (fake.apiKey !== undefined && req.url?.startsWith("/v1") && req.headers.authorization !== `Bearer ${fake.apiKey}`) {
      fake.refused++;
      res.writeHead(401, { "content-type": "application/json" }).end(JSON.stringify({ error: "Unauthorized" }));
      finished = true;
      return;
    }
    // vLLM's health route: 200 while the engine serves (the server's endpoint probe asks it).
    if (req.method === "GET" && req.url === "/health") {
      res.writeHead(fake.mode === "error500" ? 500 : 200).end();
      finished = true;
      return;
    }
    if (req.method !== "POST" || req.url !== "/v1/chat/completions") {
      res.writeHead(404).end(JSON.stringify({ error: { message: "not found" } }));
      finished = true;
      return;
    }
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    fake.requests.push(body);
    if (fake.mode === "error500") {
      res.writeHead(500, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: "CUDA out of memory" } }));
      finished = true;
      return;
    }
    if (fake.mode === "refuse400") {
      // A broken engine (or another model behind the name) refusing every request as the client's fault.
      res.writeHead(400, { "content-type": "application/json" }).end(JSON.stringify({ object: "error", message: "This model's maximum context length is 16 tokens", code: 400 }));
      finished = true;
      return;
    }
    if (fake.mode === "hang") return; // never answers
    if (fake.mode === "slow-json") {
      // Answers, but late: nothing at all (no headers, no first event) for 2 s. The gateway asks for a
      // stream also for a non-streaming client, so this is how a slow unstreamed answer looks to it.
      await new Promise((r) => setTimeout(r, 2000));
      if (res.destroyed) return;
    }
    const id = `chatcmpl-${name}-${fake.requests.length}`;
    const created = Math.floor(Date.now() / 1000);
    const usage =
      fake.mode === "overstate"
        ? { prompt_tokens: OVERSTATED_TOKENS, completion_tokens: OVERSTATED_TOKENS, total_tokens: 2 * OVERSTATED_TOKENS }
        : { prompt_tokens: PROMPT_TOKENS, completion_tokens: REPLY_WORDS.length, total_tokens: PROMPT_TOKENS + REPLY_WORDS.length };
    if (!body.stream) {
      const json = {
        id,
        object: "chat.completion",
        created,
        model: body.model,
        choices: [{ index: 0, message: { role: "assistant", content: REPLY_WORDS.join("") }, finish_reason: "stop", logprobs: null }],
        usage,
      };
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(json));
      finished = true;
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    if (fake.mode.endsWith("-before-first") || fake.mode === "stream-error-first") {
      res.flushHeaders();
      await new Promise((r) => setTimeout(r, 50)); // the 200 reaches the gateway before the failure
      if (fake.mode === "stream-drop-before-first") res.destroy();
      if (fake.mode === "stream-end-before-first") {
        finished = true;
        res.end();
      }
      if (fake.mode === "stream-error-first") {
        res.write(`data: ${JSON.stringify({ error: { message: "engine died", type: "InternalServerError", code: 500 } })}\n\n`);
        finished = true;
        res.end();
      }
      return; // stream-stall-before-first: nothing more
    }
    /** Writes `piece` again and again, minding backpressure, until the gateway hangs up. */
    const pour = async (piece: string) => {
      while (!res.destroyed) {
        fake.sent += piece.length;
        if (res.write(piece)) continue;
        await new Promise<void>((resolve) => {
          const done = () => {
            res.off("drain", done);
            res.off("close", done);
            resolve();
          };
          res.on("drain", done);
          res.on("close", done);
        });
      }
    };
    if (fake.mode === "stream-endless-event-first") {
      res.write(`data: {"id":"${id}","choices":[{"index":0,"delta":{"content":"`);
      return pour("x".repeat(1024));
    }
    const send = (obj: unknown) => res.write(`data: ${typeof obj === "string" ? obj : JSON.stringify(obj)}\n\n`);
    const chunk = (delta: Record<string, unknown>, finish: string | null) => ({
      id,
      object: "chat.completion.chunk",
      created,
      model: body.model,
      choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }],
    });
    send(chunk({ role: "assistant", content: "" }, null));
    for (const [i, w] of REPLY_WORDS.entries()) {
      if (fake.mode === "slow-stream") await new Promise((r) => setTimeout(r, 100));
      if (res.destroyed) return;
      send(chunk({ content: w }, null));
      if (fake.mode === "stream-endless-event" && i === 2) {
        await new Promise((r) => setTimeout(r, 50)); // the first words reach the client
        res.write(`data: {"id":"${id}","choices":[{"index":0,"delta":{"content":"`);
        return pour("x".repeat(1024));
      }
      if (fake.mode === "stream-flood" && i === 2) {
        await new Promise((r) => setTimeout(r, 50));
        return pour(`data: ${JSON.stringify(chunk({ content: "y".repeat(32 * 1024) }, null))}\n\n`);
      }
      if (fake.mode === "break-stream" && i === 2) {
        await new Promise((r) => setTimeout(r, 50)); // let the chunks so far reach the gateway
        res.destroy();
        return;
      }
    }
    send(chunk({}, "stop"));
    if (body.stream_options?.include_usage) send({ id, object: "chat.completion.chunk", created, model: body.model, choices: [], usage });
    send("[DONE]");
    finished = true;
    res.end();
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  fake.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return fake;
}

/**
 * Answers a chat completion as vLLM does for a request body `body`: server-sent events when it asked to
 * stream (the content in one chunk, the finish, the usage when asked), the chat.completion object otherwise.
 * For test engines of their own that only decide the content and the usage.
 */
export function answerLikeVllm(
  res: http.ServerResponse,
  body: { model: string; stream?: boolean; stream_options?: { include_usage?: boolean } },
  answer: { id: string; content: string; finishReason: string; usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number } },
): void {
  const head = { id: answer.id, created: 1, model: body.model };
  if (!body.stream) {
    res.writeHead(200, { "content-type": "application/json" }).end(
      JSON.stringify({
        ...head,
        object: "chat.completion",
        choices: [{ index: 0, message: { role: "assistant", content: answer.content }, finish_reason: answer.finishReason }],
        usage: answer.usage,
      }),
    );
    return;
  }
  const chunk = (delta: Record<string, unknown>, finish: string | null) => ({ ...head, object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: finish }] });
  const events = [chunk({ role: "assistant", content: answer.content }, null), chunk({}, answer.finishReason)];
  if (body.stream_options?.include_usage) events.push({ ...head, object: "chat.completion.chunk", choices: [], usage: answer.usage } as never);
  res.writeHead(200, { "content-type": "text/event-stream" }).end(events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join("") + "data: [DONE]\n\n");
}
