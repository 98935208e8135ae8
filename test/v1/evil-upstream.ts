// A provider's endpoint that sends whatever a test scripts: every chat completion is answered
// with the SSE events `events(body)` returns (strings are sent as `data:` lines verbatim, so a
// test can send JSON no serializer would write), then `data: [DONE]` (or, as `ending` says, the
// response ends without it, or the connection is dropped). It records the requests.
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface Evil {
  url: string;
  requests: Record<string, unknown>[];
  close(): Promise<void>;
}

/** How the scripted stream ends: `data: [DONE]`, the response ended without it, or the connection dropped mid-response. */
export type Ending = "done" | "end" | "drop";

export async function startEvil(events: (body: Record<string, unknown>) => (string | Record<string, unknown>)[], ending: Ending | (() => Ending) = "done"): Promise<Evil> {
  const sockets = new Set<import("node:net").Socket>();
  const evil: Evil = { url: "", requests: [], close: async () => {} };
  const server = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    if (req.method === "GET") return void res.writeHead(200).end();
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    evil.requests.push(body);
    res.writeHead(200, { "content-type": "text/event-stream" });
    for (const e of events(body)) res.write(`data: ${typeof e === "string" ? e : JSON.stringify(e)}\n\n`);
    const how = typeof ending === "function" ? ending() : ending;
    if (how === "done") res.end("data: [DONE]\n\n");
    else if (how === "end") res.end();
    // Once what was written has left: the client reads the events, then a response cut off before its end.
    else res.write("", () => res.socket?.destroy());
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  evil.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  evil.close = async () => {
    for (const s of sockets) s.destroy();
    await new Promise((r) => server.close(r));
  };
  return evil;
}

/** A `chat.completion.chunk` of one choice (index 0). */
export const chunk = (model: unknown, delta: Record<string, unknown>, finish: string | null = null, extra: Record<string, unknown> = {}) => ({
  id: "chatcmpl-evil",
  object: "chat.completion.chunk",
  created: 1,
  model,
  choices: [{ index: 0, delta, finish_reason: finish, ...extra }],
});

/** The usage-only chunk that ends a stream (include_usage). */
export const usageChunk = (model: unknown, promptTokens: number, completionTokens: number) => ({
  id: "chatcmpl-evil",
  object: "chat.completion.chunk",
  created: 1,
  model,
  choices: [],
  usage: { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens },
});
