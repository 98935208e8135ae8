// A stream the server refuses with a wait (a rate limit's 429, a 503 while its
// database is away: Retry-After in the answer) is not opened again before
// that wait is over. The server here is a bare HTTP/2 endpoint answering each
// stream as the real one answers a refused call: gRPC trailers only, with
// grpc-status and retry-after. And a server that welcomes each stream and
// drops it at once is not reconnected to at the first step's pace forever.
import crypto from "node:crypto";
import http2 from "node:http2";
import path from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { afterEach, describe, expect, it } from "vitest";
import { DaemonService, ServerMessageSchema } from "../../gen/svc/v1/daemon_pb.js";
import { FIXTURES, start, tempDir, waitFor, writeExecutable, type Spawned } from "./helpers.js";

const PATH = `/${DaemonService.typeName}/${DaemonService.method.connect.name}`;

const daemons: Spawned[] = [];
const servers: http2.Http2Server[] = [];
afterEach(async () => {
  for (const d of daemons.splice(0)) {
    d.kill("SIGKILL");
    await d.exited;
  }
  for (const s of servers.splice(0)) await new Promise((r) => s.close(r));
});

/** A server refusing every daemon stream with `status` (a gRPC code) and `retryAfter` seconds; the times streams were opened. */
async function refusingServer(status: number, retryAfter: string): Promise<{ url: string; opened: number[] }> {
  const opened: number[] = [];
  const server = http2.createServer();
  server.on("stream", (stream, headers) => {
    if (headers[":path"] === PATH) opened.push(Date.now());
    stream.on("error", () => {});
    stream.respond({ ":status": 200, "content-type": "application/grpc", "grpc-status": String(status), "grpc-message": "refused", "retry-after": retryAfter }, { endStream: true });
  });
  server.on("session", (s) => s.on("error", () => {}));
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}`, opened };
}

/** A server welcoming every daemon stream, then ending it at once (gRPC unavailable); the times streams were opened. */
async function welcomeAndDropServer(): Promise<{ url: string; opened: number[] }> {
  const opened: number[] = [];
  const key = crypto.generateKeyPairSync("ed25519").publicKey.export({ format: "der", type: "spki" }).subarray(12).toString("base64");
  const welcome = toBinary(
    ServerMessageSchema,
    create(ServerMessageSchema, { kind: { case: "welcome", value: { providerId: 7n, heartbeatIntervalSeconds: 30, approvalStatus: "approved", taskSigningKey: key } } }),
  );
  const frame = Buffer.alloc(5 + welcome.length);
  frame.writeUInt32BE(welcome.length, 1);
  frame.set(welcome, 5);
  const server = http2.createServer();
  server.on("stream", (stream, headers) => {
    if (headers[":path"] === PATH) opened.push(Date.now());
    stream.on("error", () => {});
    stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
    stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "14", "grpc-message": "dropped" }));
    stream.end(frame);
  });
  server.on("session", (s) => s.on("error", () => {}));
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}`, opened };
}

function startDaemon(url: string): Spawned {
  const dir = tempDir("tsd-retry");
  const smi = writeExecutable(dir, "nvidia-smi", `#!/bin/sh\ncase "$1" in\n  --query-gpu=*) cat '${path.join(FIXTURES, "nvidia-smi-query-2gpu.csv")}' ;;\n  *) exit 1 ;;\nesac\n`);
  const d = start(process.execPath, ["bin/svc-daemon.js", "--url", url, "--docker", "none", "--nvidia-smi", smi, "--state-dir", path.join(dir, "state")], {
    env: { CUDA_VISIBLE_DEVICES: undefined, SVC_API_KEY: "svc-provider-retryafter", SVC_PROVIDER_KEY: undefined, SVC_KEY_FILE: undefined },
  });
  daemons.push(d);
  return d;
}

describe("the stream daemon refused with a wait", { timeout: 60_000 }, () => {
  for (const [what, code] of [["a rate limit (resource_exhausted)", 8], ["a server whose database is away (unavailable)", 14]] as const) {
    it(`opens its stream again only after the Retry-After of ${what}`, async () => {
      const srv = await refusingServer(code, "3");
      const d = startDaemon(srv.url);
      await waitFor(() => srv.opened.length >= 3, 30_000, `three streams opened (${d.output()})`);
      const gaps = srv.opened.slice(1).map((t, i) => t - srv.opened[i]);
      for (const gap of gaps) expect(gap, `gaps ${gaps.join(", ")} ms`).toBeGreaterThanOrEqual(2900);
      expect(d.output()).toMatch(/retrying in 3 s, as the server asked/);
    });
  }
});

describe("the stream daemon welcomed and dropped each time", { timeout: 60_000 }, () => {
  it("backs off as from any failure: a welcome restarts the backoff only for a stream that stayed open", async () => {
    const srv = await welcomeAndDropServer();
    const d = startDaemon(srv.url);
    await waitFor(() => srv.opened.length >= 5, 40_000, `five streams opened (${d.output()})`);
    const gaps = srv.opened.slice(1).map((t, i) => t - srv.opened[i]);
    // From 0.5 s, doubling, each in [0.5, 1.5) of its step: the fourth wait is at least 2 s x 0.5.
    expect(gaps[3], `gaps ${gaps.join(", ")} ms`).toBeGreaterThanOrEqual(1000);
    expect(d.output()).toMatch(/welcome|provider 7|approved/i);
  });
});
