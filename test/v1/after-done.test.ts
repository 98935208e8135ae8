// What an endpoint sends after `data: [DONE]`. vLLM's server ends its response in a write of its own after
// the event: the gateway reads it to that end, so the connection goes back to its agent and the next request
// reuses it. An endpoint that keeps its response open after [DONE] (silent, or pouring bytes) is hung up on
// within AFTER_DONE_MS: it cannot hold one open connection of the gateway's for every request it served.
import http from "node:http";
import type { AddressInfo } from "node:net";
import type { Socket } from "node:net";
import { afterAll, beforeAll, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { AFTER_DONE_MS } from "../../src/http/v1/proxy.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { chunk, usageChunk } from "./evil-upstream.js";
import { serveModel } from "./serving.js";

const srv = useTestServer({
  SVC_V1_TOKEN_RATES: JSON.stringify({ "*": { input: 1_000_000, output: 2_000_000 } }),
  SVC_JOB_SWEEP_MS: "60000",
  SVC_LIVENESS_SWEEP_SECONDS: "0",
});

type After = "end-later" | "keep-open" | "pour";

/** An endpoint answering every chat completion with one chunk, its usage and [DONE], then doing `after`. */
async function startEndpoint(after: After) {
  // `completionSockets`: the connections chat completions came on (the health probe's GETs come on their own).
  const ep = { url: "", completionSockets: new Set<Socket>(), open: new Set<Socket>(), responsesOpen: 0, close: async () => {} };
  const server = http.createServer(async (req, res) => {
    for await (const _ of req);
    if (req.method === "GET") return void res.writeHead(200).end();
    ep.completionSockets.add(req.socket);
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write(`data: ${JSON.stringify(chunk("m", { role: "assistant", content: "hi" }, "stop"))}\n\n`);
    res.write(`data: ${JSON.stringify(usageChunk("m", 3, 1))}\n\n`);
    res.write("data: [DONE]\n\n");
    ep.responsesOpen++;
    let pour: NodeJS.Timeout | undefined;
    res.on("close", () => {
      clearInterval(pour);
      ep.responsesOpen--;
    });
    if (after === "end-later") setTimeout(() => res.end(), 20);
    if (after === "pour") pour = setInterval(() => res.write(": " + "x".repeat(16 * 1024) + "\n"), 5);
  });
  server.on("connection", (s) => {
    ep.open.add(s);
    s.on("close", () => ep.open.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  ep.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  ep.close = async () => {
    for (const s of ep.open) s.destroy();
    await new Promise((r) => server.close(r));
  };
  return ep;
}

const endpoints: Awaited<ReturnType<typeof startEndpoint>>[] = [];
afterAll(async () => {
  for (const e of endpoints) await e.close();
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

async function ask(key: string, model: string, stream: boolean) {
  const r = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "x" }], max_tokens: 5, stream }),
  });
  const text = await r.text();
  expect(r.status, text).toBe(200);
  return text;
}

const waitFor = async (cond: () => boolean, ms: number) => {
  const until = Date.now() + ms;
  while (!cond() && Date.now() < until) await new Promise((r) => setTimeout(r, 25));
  return cond();
};

let renterKey: string;
beforeAll(async () => {
  renterKey = (await makeRenter(srv, 1_000_000)).key;
});

it("an endpoint that ends its response in a write after [DONE] keeps its connection: the next requests reuse it", async () => {
  const model = "Qwen/Qwen2.5-7B-Instruct";
  const ep = await startEndpoint("end-later");
  endpoints.push(ep);
  await serveModel(srv, model, ep.url);
  for (let i = 0; i < 3; i++) {
    for (const stream of [false, true]) {
      await ask(renterKey, model, stream);
      // The endpoint ends its response 20 ms after [DONE], after the client has its answer: a request sent
      // sooner would find the connection still busy and rightly open another.
      expect(await waitFor(() => ep.responsesOpen === 0, 5_000)).toBe(true);
    }
  }
  expect(ep.completionSockets.size).toBe(1);
});

for (const [after, model] of [["keep-open", "google/gemma-2-9b-it"], ["pour", "microsoft/Phi-3-mini-4k-instruct"]] as const) {
  it(`an endpoint that ${after === "pour" ? "keeps sending" : "keeps its response open"} after [DONE] is hung up on within ${AFTER_DONE_MS} ms`, async () => {
    const ep = await startEndpoint(after);
    endpoints.push(ep);
    await serveModel(srv, model, ep.url);
    const text = await ask(renterKey, model, true);
    expect(text).toMatch(/data: \[DONE\]\n\n$/);
    await ask(renterKey, model, false);
    // Both answered; neither of the endpoint's responses outlives the grace by much.
    expect(await waitFor(() => ep.responsesOpen === 0 && ep.open.size === 0, AFTER_DONE_MS + 3_000)).toBe(true);
  });
}
