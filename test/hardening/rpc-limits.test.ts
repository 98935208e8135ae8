// The gRPC/Connect wire reads no more than the REST wire: each RPC's message
// limit is its route's body limit (src/http/body.ts bodyLimitBytesOf), also
// for compressed bodies, and it applies before authentication.
import zlib from "node:zlib";
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { uniqueEmail } from "../helpers/http.js";

const srv = useTestServer();

const connectCall = (path: string, body: Buffer, headers: Record<string, string> = {}) =>
  fetch(`${srv.url}/${path}`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: new Uint8Array(body) });

describe("message size limits on the Connect/gRPC wire", () => {
  it("a public RPC refuses a message over its 64 KiB limit, and serves one under it", async () => {
    const ok = await connectCall("svc.v1.RenterService/Register", Buffer.from(JSON.stringify({ name: "Small", email: uniqueEmail("rpc") })));
    expect(ok.status).toBe(200);
    const big = await connectCall("svc.v1.RenterService/Register", Buffer.from(JSON.stringify({ name: "x".repeat(200 * 1024), email: uniqueEmail("rpc") })));
    expect(big.status).toBe(429); // Connect's resource_exhausted
    expect((await big.json()).code).toBe("resource_exhausted");
  });

  it("counts the decompressed size: a small gzip body that inflates past the limit is refused", async () => {
    const bomb = zlib.gzipSync(Buffer.from(JSON.stringify({ name: "y".repeat(50 * 1024 * 1024), email: "a@b.c" })));
    expect(bomb.length).toBeLessThan(200 * 1024);
    const r = await connectCall("svc.v1.RenterService/Register", bomb, { "content-encoding": "gzip" });
    expect(r.status).toBe(429);
    expect((await r.json()).code).toBe("resource_exhausted");
  });

  it("a route with a larger limit takes a larger message (job-result, 16 MiB)", async () => {
    const body = Buffer.from(JSON.stringify({ apiKey: "svc-provider-nobody", jobId: "job-x", success: true, error: "e".repeat(2 * 1024 * 1024) }));
    const r = await connectCall("svc.v1.JobService/ReportResult", body);
    // Read whole, then refused for its key: the size was allowed.
    expect((await r.json()).code).not.toBe("resource_exhausted");
  });
});
