// The console's page and assets as HTTP answers: what caches may keep and for
// which requests (Vary, Cache-Control), with and without an Origin.
import http from "node:http";
import zlib from "node:zlib";
import { describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";

const srv = useTestServer();
/** An origin the test server allows (a local development front end). */
const ORIGIN = "http://localhost:5173";

const varyOf = (res: Response) => (res.headers.get("vary") ?? "").split(",").map((v) => v.trim().toLowerCase()).filter(Boolean).sort();

async function assetUrls(): Promise<string[]> {
  const html = await (await fetch(srv.url + "/")).text();
  return [...html.matchAll(/(?:src|href)="(\/console\/[^"]+)"/g)].map((m) => m[1]);
}

describe("the console's answers", () => {
  it("vary on Origin as every answer of the service does, and on Accept-Encoding, fresh or revalidated", async () => {
    const urls = ["/", ...(await assetUrls())];
    expect(urls.length).toBeGreaterThan(3);
    for (const u of urls) {
      for (const origin of [undefined, ORIGIN]) {
        const res = await fetch(srv.url + u, { headers: { "accept-encoding": "gzip", ...(origin ? { origin } : {}) } });
        expect(res.status, u).toBe(200);
        expect(varyOf(res), u).toEqual(["accept-encoding", "origin"]);
        if (origin) expect(res.headers.get("access-control-allow-origin"), u).toBe(origin);
        const again = await fetch(srv.url + u, { headers: { "if-none-match": res.headers.get("etag")!, ...(origin ? { origin } : {}) } });
        expect(again.status, u).toBe(304);
        expect(varyOf(again), u).toEqual(["accept-encoding", "origin"]);
      }
    }
  });

  it("are kept for good only under the version the page names; another version's URL, or none, is revalidated", async () => {
    const urls = await assetUrls();
    for (const u of urls) {
      const current = await fetch(srv.url + u);
      expect(current.headers.get("cache-control"), u).toBe("public, max-age=31536000, immutable");
      const path = u.split("?")[0];
      // A page of another build (a deploy under way, a tab open since) asks for its own version: the
      // answer is this build's file, which must not be kept for a year under that other version's URL.
      for (const other of [path, `${path}?v=000000000000`]) {
        const res = await fetch(srv.url + other);
        expect(res.status, other).toBe(200);
        expect(res.headers.get("cache-control"), other).toBe("no-cache");
        expect(await res.arrayBuffer()).toEqual(await (await fetch(srv.url + u)).arrayBuffer());
      }
    }
    expect((await fetch(srv.url + "/")).headers.get("cache-control")).toBe("no-cache");
  });
});

/** A GET as sent, its body as received (no decoding): fetch decodes gzip itself and adds its own Accept-Encoding. */
function rawGet(url: string, headers: Record<string, string>): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    http.get(url, { headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on("error", reject);
    }).on("error", reject);
  });
}

describe("the console's encodings", () => {
  it("are gzip only where the request's Accept-Encoding gives gzip a q-value above 0", async () => {
    const urls = ["/", ...(await assetUrls())];
    for (const u of urls) {
      const plain = await rawGet(srv.url + u, {});
      expect(plain.headers["content-encoding"], u).toBeUndefined();
      for (const ae of ["gzip;q=0", "identity", "gzip; q=0.000, identity", "*;q=0, identity", "gzip;q=0, *", "br", ""]) {
        const res = await rawGet(srv.url + u, { "accept-encoding": ae });
        expect(res.status, `${u} ${ae}`).toBe(200);
        expect(res.headers["content-encoding"], `${u} ${ae}`).toBeUndefined();
        expect(res.body.equals(plain.body), `${u} ${ae}`).toBe(true);
      }
      for (const ae of ["gzip", "deflate, gzip;q=0.5", "GZIP", "*", "br;q=1, *;q=0.1"]) {
        const res = await rawGet(srv.url + u, { "accept-encoding": ae });
        expect(res.headers["content-encoding"], `${u} ${ae}`).toBe("gzip");
        expect(zlib.gunzipSync(res.body).equals(plain.body), `${u} ${ae}`).toBe(true);
      }
    }
  });

  it("each have their own ETag, and If-None-Match answers 304 for the one the request selects", async () => {
    const urls = ["/", ...(await assetUrls())];
    for (const u of urls) {
      const plain = await rawGet(srv.url + u, { "accept-encoding": "identity" });
      const gzip = await rawGet(srv.url + u, { "accept-encoding": "gzip" });
      const [p, g] = [plain.headers.etag!, gzip.headers.etag!];
      expect(p, u).toMatch(/^"[^"]+"$/);
      expect(g, u).toMatch(/^"[^"]+"$/);
      expect(g, u).not.toBe(p);
      // Each is revalidated under its own tag, alone, weakly compared, or among others a cache holds.
      for (const [ae, tag] of [["identity", p], ["gzip", g]]) {
        for (const inm of [tag, `W/${tag}`, `"other", ${tag}`, "*"]) {
          const res = await rawGet(srv.url + u, { "accept-encoding": ae, "if-none-match": inm });
          expect(res.status, `${u} ${ae} ${inm}`).toBe(304);
          expect(res.headers.etag, `${u} ${ae} ${inm}`).toBe(tag);
          expect(res.body.length).toBe(0);
        }
      }
      // The other representation's tag does not validate this one.
      const cross = await rawGet(srv.url + u, { "accept-encoding": "gzip", "if-none-match": p });
      expect(cross.status, u).toBe(200);
      expect(cross.headers["content-encoding"], u).toBe("gzip");
      expect(cross.headers.etag, u).toBe(g);
      const back = await rawGet(srv.url + u, { "accept-encoding": "identity", "if-none-match": g });
      expect(back.status, u).toBe(200);
      expect(back.headers["content-encoding"], u).toBeUndefined();
      expect(back.headers.etag, u).toBe(p);
    }
  });
});
