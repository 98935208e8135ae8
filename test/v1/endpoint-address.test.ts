// What a renter is told when a provider's endpoint cannot be reached: the
// connection error's code, never the provider's address.
import net from "node:net";
import OpenAI from "openai";
import { afterAll, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { serveModel } from "./serving.js";

const srv = useTestServer();
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
});

const openai = (apiKey: string) => new OpenAI({ apiKey, baseURL: `${srv.url}/v1`, maxRetries: 0 });
const usageRows = (renterId: number) =>
  srv.sql<{ state: string; cost_halala: number }[]>`SELECT state, cost_halala FROM v1_usage WHERE renter_id = ${renterId} ORDER BY created_at`;

it("does not tell the renter where a provider's endpoint is when it cannot be reached: the connection error's code, not its address", async () => {
  const model = "Qwen/Qwen2.5-7B-Instruct";
  // A port that was just listening and is closed now: the connection is refused.
  const gone = net.createServer();
  await new Promise<void>((res) => gone.listen(0, "127.0.0.1", res));
  const port = (gone.address() as net.AddressInfo).port;
  await new Promise((res) => gone.close(res));
  await serveModel(srv, model, `http://127.0.0.1:${port}`);
  const renter = await makeRenter(srv, 10_000);
  const err = await openai(renter.key)
    .chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] })
    .catch((e) => e);
  expect(err).toBeInstanceOf(OpenAI.APIError);
  expect(err.error).toMatchObject({ code: "provider_unavailable", retryable: true });
  expect(err.error.message).toContain("ECONNREFUSED");
  expect(err.error.message).not.toContain(String(port));
  expect(err.error.message).not.toContain("127.0.0.1");
  expect(await usageRows(renter.id)).toMatchObject([{ state: "released", cost_halala: 0 }]);
});
