// A stand-in vLLM engine closer to the real one than fake-vllm.ts for what the
// OpenAI SDK exercises: `n` choices, tool calls (when the request offers tools and does not
// forbid them), logprobs/top_logprobs, `stop` strings, json_object answers, and
// `stream_options.continuous_usage_stats` (usage on every chunk, counting that chunk's choice),
// the usage chunk (`choices: []`) with include_usage, `data: [DONE]`. Each piece of text is one token.
// It can break the stream of chosen requests after their first content chunk, or go slow.
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface Engine {
  url: string;
  requests: Record<string, unknown>[];
  /** Request numbers (1-based) whose stream drops after the first content chunk. */
  breakOn: Set<number>;
  /** Delay between chunks, ms. */
  delayMs: number;
  /** Chunks written per request (content deltas). */
  written: number[];
  aborted: number;
  close(): Promise<void>;
}

export const WORDS = ["The", " answer", " is", " forty", "-two", "."];
export const PROMPT = 11;

export async function startEngine(): Promise<Engine> {
  const sockets = new Set<import("node:net").Socket>();
  const e: Engine = {
    url: "",
    requests: [],
    breakOn: new Set(),
    delayMs: 0,
    written: [],
    aborted: 0,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
  const server = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    if (req.method === "GET" && req.url === "/health") return void res.writeHead(200).end();
    if (req.method !== "POST" || req.url !== "/v1/chat/completions") return void res.writeHead(404).end("{}");
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    e.requests.push(body);
    const no = e.requests.length;
    e.written[no - 1] = 0;
    let done = false;
    res.on("close", () => {
      if (!done) e.aborted++;
    });
    const id = `chatcmpl-eng-${no}`;
    const created = 1_700_000_000 + no;
    const n: number = body.n ?? 1;
    const maxTokens: number = body.max_completion_tokens ?? body.max_tokens ?? 1000;
    const tools = Array.isArray(body.tools) && body.tools.length > 0 && body.tool_choice !== "none";
    const json = body.response_format?.type === "json_object" || body.response_format?.type === "json_schema";
    const stops: string[] = body.stop == null ? [] : Array.isArray(body.stop) ? body.stop : [body.stop];
    const wantLogprobs = body.logprobs === true;
    const topN: number = body.top_logprobs ?? 0;
    const cont = body.stream_options?.continuous_usage_stats === true;
    const includeUsage = body.stream_options?.include_usage === true;
    if (!body.stream) {
      res.writeHead(500).end(JSON.stringify({ error: { message: "this engine only streams (the gateway always asks for a stream)" } }));
      done = true;
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    const send = (obj: unknown) => res.write(`data: ${typeof obj === "string" ? obj : JSON.stringify(obj)}\n\n`);
    const counts = new Array(n).fill(0);
    const usageOf = (i: number) => ({ prompt_tokens: PROMPT, completion_tokens: counts[i], total_tokens: PROMPT + counts[i] });
    const chunk = (i: number, delta: Record<string, unknown>, finish: string | null, logprobs: unknown = null) => ({
      id,
      object: "chat.completion.chunk",
      created,
      model: body.model,
      choices: [{ index: i, delta, logprobs, finish_reason: finish, ...(finish ? { stop_reason: null } : {}) }],
      ...(cont ? { usage: usageOf(i) } : {}),
    });
    const lp = (token: string) =>
      wantLogprobs
        ? {
            content: [
              {
                token,
                logprob: -0.25,
                bytes: [...Buffer.from(token)],
                top_logprobs: Array.from({ length: topN }, (_, k) => ({ token: `${token}${k}`, logprob: -0.25 - k, bytes: [...Buffer.from(`${token}${k}`)] })),
              },
            ],
          }
        : null;
    const pause = () => (e.delayMs ? new Promise((r) => setTimeout(r, e.delayMs)) : undefined);
    for (let i = 0; i < n; i++) send(chunk(i, { role: "assistant", content: "" }, null));
    let finish: string[] = new Array(n).fill("stop");
    if (tools) {
      for (let i = 0; i < n; i++) {
        const name = body.tool_choice?.function?.name ?? body.tools[0].function.name;
        counts[i]++;
        send(chunk(i, { tool_calls: [{ index: 0, id: `chatcmpl-tool-${no}-${i}`, type: "function", function: { name, arguments: "" } }] }, null));
        for (const piece of ['{"city": ', '"Riyadh"}']) {
          await pause();
          counts[i]++;
          send(chunk(i, { tool_calls: [{ index: 0, function: { arguments: piece } }] }, null));
        }
        finish[i] = "tool_calls";
      }
    } else {
      const words = json ? ['{"answer"', ": ", "42", "}"] : WORDS;
      for (let i = 0; i < n; i++) {
        let text = "";
        for (const w of words) {
          if (counts[i] >= maxTokens) {
            finish[i] = "length";
            break;
          }
          const next = text + w;
          const stop = stops.find((s) => next.includes(s));
          if (stop) {
            finish[i] = "stop";
            break;
          }
          await pause();
          if (res.destroyed) return;
          counts[i]++;
          text = next;
          send(chunk(i, { content: n > 1 ? `${w}` : w }, null, lp(w)));
          e.written[no - 1]++;
          if (e.breakOn.has(no)) {
            await new Promise((r) => setTimeout(r, 50));
            res.destroy();
            return;
          }
        }
      }
    }
    for (let i = 0; i < n; i++) send(chunk(i, {}, finish[i]));
    const total = counts.reduce((a, b) => a + b, 0);
    if (includeUsage) send({ id, object: "chat.completion.chunk", created, model: body.model, choices: [], usage: { prompt_tokens: PROMPT, completion_tokens: total, total_tokens: PROMPT + total } });
    send("[DONE]");
    done = true;
    res.end();
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  e.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return e;
}
