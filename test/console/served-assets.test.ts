// The console's page and assets as HTTP answers: what caches may keep and for
// which requests (Vary, Cache-Control), with and without an Origin.
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
