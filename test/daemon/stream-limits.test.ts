// The rate table's heartbeat row on daemon streams: with rate limits on, a
// stream's heartbeat messages are counted in windows of the row's length, and
// a beat over the row is refused with a StreamError (resource_exhausted)
// before any work is done for it, while the stream stays open.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../helpers/server.js";
import { makeProvider } from "../helpers/fixtures.js";
import { openStream, type TestStream } from "./grpc-stream.js";
import { waitFor } from "./helpers.js";
import { flushHeartbeats } from "../providers/helpers.js";

let srv: TestServer;
const streams: TestStream[] = [];

beforeAll(async () => {
  // 3 heartbeats per 2 s, so that a window ends within the test.
  srv = await startTestServer({ SVC_RATE_LIMITS: "on", SVC_RATE_LIMIT_OVERRIDES: "heartbeat=3/2" });
});
afterAll(async () => {
  for (const s of streams) s.cancel();
  await srv?.close();
});

async function connect(key: string) {
  const s = openStream(srv.port, key);
  streams.push(s);
  s.send({ case: "hello", value: { daemonVersion: "5.0.0" } });
  await s.next("welcome");
  return s;
}

/** The answers to the stream's heartbeats so far, in order: "ack" or the refusal's code. */
const answers = (s: TestStream) =>
  s.received.flatMap((m) =>
    m.kind.case === "heartbeatAck" ? ["ack"] : m.kind.case === "error" && m.kind.value.report === "heartbeat" ? [m.kind.value.code] : [],
  );

const lastBeatOf = async (id: number) => {
  const [r] = await srv.sql<{ last_heartbeat: Date | null }[]>`SELECT last_heartbeat FROM providers WHERE id = ${id}`;
  return r.last_heartbeat;
};

describe("daemon stream: the heartbeat row of the rate table", () => {
  it("refuses the beats over the row, keeps the stream open, and counts again in the next window", async () => {
    const p = await makeProvider(srv);
    const s = await connect(p.key);
    for (let i = 0; i < 5; i++) s.send({ case: "heartbeat", value: { daemonVersion: "5.0.0" } });
    await waitFor(() => answers(s).length === 5, 10_000);
    expect(answers(s)).toEqual(["ack", "ack", "ack", "resource_exhausted", "resource_exhausted"]);
    const refusal = s.received.find((m) => m.kind.case === "error")!.kind.value as { message: string; report: string };
    expect(refusal.message).toMatch(/too many heartbeats on this stream: at most 3 per 2 s; beat again in [12] s/);

    // Another provider's stream has its own count.
    const other = await makeProvider(srv);
    const o = await connect(other.key);
    o.send({ case: "heartbeat", value: {} });
    await waitFor(() => answers(o).length === 1, 10_000);
    expect(answers(o)).toEqual(["ack"]);

    // The refused stream is still open; after the window its beats are answered again.
    await new Promise((r) => setTimeout(r, 2100));
    s.send({ case: "heartbeat", value: { daemonVersion: "5.0.0" } });
    await waitFor(() => answers(s).length === 6, 10_000);
    expect(answers(s)[5]).toBe("ack");
    expect(await Promise.race([s.ended.then(() => "ended"), new Promise((r) => setTimeout(() => r("open"), 100))])).toBe("open");
    await flushHeartbeats(srv);
    expect(await lastBeatOf(p.id)).not.toBeNull();
  });
});

describe("daemon stream: rate limits off", () => {
  it("answers every heartbeat", async () => {
    const off = await startTestServer({});
    try {
      const p = await makeProvider(off);
      const s = openStream(off.port, p.key);
      streams.push(s);
      s.send({ case: "hello", value: { daemonVersion: "5.0.0" } });
      await s.next("welcome");
      for (let i = 0; i < 8; i++) s.send({ case: "heartbeat", value: {} });
      await waitFor(() => answers(s).length === 8, 10_000);
      expect(answers(s)).toEqual(Array(8).fill("ack"));
    } finally {
      await off.close();
    }
  });
});
