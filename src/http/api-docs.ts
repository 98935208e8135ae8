// GET /api/openapi.json (the document generated from the proto, openapi.ts)
// and GET /api/docs, a reference page on Swagger UI served from the
// installed swagger-ui-dist package: no CDN, nothing fetched from elsewhere
// (its Content-Security-Policy allows this origin only).
import crypto from "node:crypto";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import type { DescService } from "@bufbuild/protobuf";
import { selfOnlyCsp } from "./csp.js";
import { buildOpenApi } from "./openapi.js";
import type { RateLimits } from "./rate-limits.js";
import type { NodeRequest, NodeResponse } from "./rest.js";
import { clientIpOf, passesLimit, sendJson } from "./rest.js";

export const DOCS_CSP = selfOnlyCsp({
  // Swagger UI (React) sets style attributes on its elements.
  "style-src": ["'unsafe-inline'"],
  "img-src": ["data:"],
});

/** The package's version: the document's info.x-package-version (info.version is the interface's). */
export function packageVersion(): string {
  return JSON.parse(fs.readFileSync(new URL("../../package.json", import.meta.url), "utf8")).version as string;
}

const PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>svc API reference</title>
<link rel="icon" type="image/png" href="/api/docs/favicon-32x32.png">
<link rel="stylesheet" href="/api/docs/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/api/docs/swagger-ui-bundle.js"></script>
<script src="/api/docs/init.js"></script>
</body>
</html>
`;

// validatorUrl null: Swagger UI would otherwise send the document to validator.swagger.io.
const INIT = `window.ui = SwaggerUIBundle({
  url: "/api/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
  tryItOutEnabled: false,
  presets: [SwaggerUIBundle.presets.apis],
});
`;

interface Asset {
  body: Buffer;
  type: string;
  etag: string;
}

const asset = (body: Buffer | string, type: string): Asset => {
  const b = Buffer.isBuffer(body) ? body : Buffer.from(body);
  return { body: b, type, etag: `"${crypto.createHash("sha256").update(b).digest("base64url").slice(0, 22)}"` };
};

/** The viewer's files, read from node_modules on first use. */
function viewerFile(name: "swagger-ui.css" | "swagger-ui-bundle.js" | "favicon-32x32.png"): Buffer {
  const dir = path.dirname(createRequire(import.meta.url).resolve("swagger-ui-dist/package.json"));
  return fs.readFileSync(path.join(dir, name));
}

/**
 * The document and its viewer. Answered ahead of the transcoder, so they count on the
 * default row themselves (the spec's "all other /api/*"), when rate limits are on.
 */
export function createApiDocsHandler(services: readonly DescService[], limits?: { rows: Pick<RateLimits, "check">; trustProxy: number }) {
  let doc: Asset | undefined;
  const assets = new Map<string, Asset | (() => Asset)>([
    ["/api/docs", () => asset(PAGE, "text/html; charset=utf-8")],
    ["/api/docs/init.js", () => asset(INIT, "text/javascript; charset=utf-8")],
    ["/api/docs/swagger-ui.css", () => asset(viewerFile("swagger-ui.css"), "text/css; charset=utf-8")],
    ["/api/docs/swagger-ui-bundle.js", () => asset(viewerFile("swagger-ui-bundle.js"), "text/javascript; charset=utf-8")],
    ["/api/docs/favicon-32x32.png", () => asset(viewerFile("favicon-32x32.png"), "image/png")],
  ]);

  function send(req: NodeRequest, res: NodeResponse, a: Asset, headers: Record<string, string>) {
    if (req.headers["if-none-match"] === a.etag) {
      res.writeHead(304, { etag: a.etag, ...headers });
      res.end();
      return;
    }
    res.writeHead(200, { "content-type": a.type, "content-length": a.body.length, etag: a.etag, "cache-control": "no-cache", ...headers });
    if (req.method === "HEAD") res.end();
    else res.end(a.body);
  }

  return async (req: NodeRequest, res: NodeResponse, url: URL): Promise<boolean> => {
    const p = url.pathname.length > 1 && url.pathname.endsWith("/") ? url.pathname.slice(0, -1) : url.pathname;
    if (p !== "/api/openapi.json" && !assets.has(p)) return false;
    if (limits && !(await passesLimit(res, () => limits.rows.check("default", clientIpOf(req, limits.trustProxy))))) return true;
    if (req.method !== "GET" && req.method !== "HEAD") {
      sendJson(res, 405, { error: `method ${req.method} not allowed on ${p}` }, { allow: "GET" });
      return true;
    }
    if (p === "/api/openapi.json") {
      doc ??= asset(JSON.stringify(buildOpenApi([...services], { packageVersion: packageVersion() })), "application/json; charset=utf-8");
      send(req, res, doc, {});
      return true;
    }
    let a = assets.get(p)!;
    if (typeof a === "function") {
      a = a();
      assets.set(p, a);
    }
    send(req, res, a, { "content-security-policy": DOCS_CSP, "x-content-type-options": "nosniff" });
    return true;
  };
}
