// The web console: one HTML page and its bundle (src/console, TypeScript +
// Preact), built with esbuild in this process on first request and kept in
// memory, so `npm start` serves it with no build step and it can never be
// stale. Pages route by URL hash; keys never appear in a URL. Every answer
// carries a Content-Security-Policy that allows only this origin.
import crypto from "node:crypto";
import zlib from "node:zlib";
import { fileURLToPath } from "node:url";
import type { Config } from "../config.js";
import type { Logger } from "../log.js";
import { selfOnlyCsp } from "./csp.js";
import type { NodeRequest, NodeResponse } from "./rest.js";

export const CONSOLE_CSP = selfOnlyCsp({
  // PNG output is previewed from an object URL made in the page.
  "img-src": ["blob:"],
});

const FAVICON = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="6" fill="#0f172a"/><path d="M8 22V10h4v12zm6 0V6h4v16zm6 0v-8h4v8z" fill="#60a5fa"/></svg>`;

const ENTRY = fileURLToPath(new URL("../console/main.tsx", import.meta.url));

interface Asset {
  body: Buffer;
  /** Compressed once at build time (the bundle is mostly generated descriptors and libraries). */
  gzip: Buffer;
  type: string;
  etag: string;
  /** The gzip representation's own tag: another representation of the same content needs another ETag. */
  gzipEtag: string;
  /** The `?v=` the page gives this asset's URL: a hash of its content. */
  version: string;
}

function asset(body: Buffer, type: string): Asset {
  const hash = crypto.createHash("sha256").update(body);
  const tag = hash.copy().digest("base64url").slice(0, 22);
  return { body, gzip: zlib.gzipSync(body, { level: 9 }), type, etag: `"${tag}"`, gzipEtag: `"${tag}-gzip"`, version: hash.digest("hex").slice(0, 12) };
}

/**
 * Whether an Accept-Encoding takes gzip (RFC 9110 12.5.3): its own q-value, else that of `*`;
 * q=0 refuses it. No header (or an empty one) asks for no coding.
 */
function acceptsGzip(header: string | undefined): boolean {
  let gzip: number | undefined;
  let any: number | undefined;
  for (const part of (header ?? "").split(",")) {
    const [coding, ...params] = part.split(";").map((x) => x.trim().toLowerCase());
    const qParam = params.find((p) => /^q\s*=/.test(p));
    const q = qParam === undefined ? 1 : Number(qParam.slice(qParam.indexOf("=") + 1).trim());
    const weight = Number.isFinite(q) ? q : 0;
    if (coding === "gzip" || coding === "x-gzip") gzip = Math.max(gzip ?? 0, weight);
    else if (coding === "*") any = weight;
  }
  return (gzip ?? any ?? 0) > 0;
}

/** Whether an If-None-Match names `etag` (weak comparison, as RFC 9110 13.1.2 has it), or is `*`. */
function noneMatch(header: string | undefined, etag: string): boolean {
  if (header === undefined) return false;
  if (header.trim() === "*") return true;
  return (header.match(/(?:W\/)?"[^"]*"/g) ?? []).some((t) => t.replace(/^W\//, "") === etag);
}

async function buildBundle(log: Logger): Promise<Map<string, Asset>> {
  const started = Date.now();
  // Imported here so that processes which never serve the console never load esbuild.
  const esbuild = await import("esbuild");
  const result = await esbuild.build({
    entryPoints: { app: ENTRY },
    bundle: true,
    write: false,
    outdir: "/console",
    format: "esm",
    target: "es2020",
    minify: true,
    jsx: "automatic",
    jsxImportSource: "preact",
    legalComments: "none",
    logLevel: "silent",
  });
  const assets = new Map<string, Asset>();
  for (const f of result.outputFiles) {
    const name = f.path.slice(f.path.lastIndexOf("/") + 1);
    const type = name.endsWith(".css") ? "text/css; charset=utf-8" : "text/javascript; charset=utf-8";
    assets.set(`/console/${name}`, asset(Buffer.from(f.contents), type));
  }
  assets.set("/console/icon.svg", asset(Buffer.from(FAVICON), "image/svg+xml"));
  log.info({ ms: Date.now() - started, files: [...assets.keys()] }, "console bundle built");
  return assets;
}

function page(config: Config, assets: Map<string, Asset>): Asset {
  // Asset URLs carry a hash of their content, so they may be cached for good.
  const v = (p: string) => `${p}?v=${assets.get(p)!.version}`;
  // What the page needs to know of this deployment; no secret ever goes here.
  const settings = JSON.stringify({
    production: config.production,
    sandboxTopup: config.allowTopup,
    cardCheckout: config.paymentGatewaySecretKey !== undefined,
    emailCodes: config.emailApiKey !== undefined,
  }).replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;");
  const html = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="svc-settings" content="${settings}">
<title>svc console</title>
<link rel="icon" href="${v("/console/icon.svg")}" type="image/svg+xml">
<link rel="stylesheet" href="${v("/console/app.css")}">
<script type="module" src="${v("/console/app.js")}"></script>
</head>
<body><div id="app"><noscript>The console needs JavaScript.</noscript></div></body>
</html>
`;
  return asset(Buffer.from(html), "text/html; charset=utf-8");
}

/** Serves `/`, `/index.html` and `/console/*`; answers false for anything else. */
export function createConsoleHandler(config: Config, log: Logger) {
  let built: Promise<{ assets: Map<string, Asset>; index: Asset }> | undefined;
  const load = () => {
    built ??= buildBundle(log).then((assets) => ({ assets, index: page(config, assets) }));
    // A failed build is retried on the next request rather than cached.
    built.catch(() => (built = undefined));
    return built;
  };
  return async function consoleHandler(req: NodeRequest, res: NodeResponse, url: URL): Promise<boolean> {
    const isPage = url.pathname === "/" || url.pathname === "/index.html";
    if (!isPage && !url.pathname.startsWith("/console/")) return false;
    if (req.method !== "GET" && req.method !== "HEAD") return false;
    let found: Asset | undefined;
    try {
      const b = await load();
      found = isPage ? b.index : b.assets.get(url.pathname);
    } catch (err) {
      log.error({ err }, "console bundle failed to build");
      res.writeHead(500, { "content-type": "text/plain; charset=utf-8", "content-security-policy": CONSOLE_CSP });
      res.end("console unavailable: its bundle failed to build (see the server log)");
      return true;
    }
    if (!found) return false;
    // Added to what is there already (CORS varies every answer on Origin), not put in its place.
    const vary = res.getHeader("vary");
    const headers: Record<string, string> = {
      "content-type": found.type,
      vary: [...(vary === undefined ? [] : [String(vary)]), "Accept-Encoding"].join(", "),
      "content-security-policy": CONSOLE_CSP,
      "x-content-type-options": "nosniff",
      "referrer-policy": "no-referrer",
      "x-frame-options": "DENY",
      // An asset under the version the page names may be cached for good. The page itself is revalidated, and
      // so is an asset asked for under another version (a page of another build): its URL does not name this content.
      "cache-control": !isPage && url.searchParams.get("v") === found.version ? "public, max-age=31536000, immutable" : "no-cache",
    };
    const ae = req.headers["accept-encoding"];
    const gzip = acceptsGzip(Array.isArray(ae) ? ae.join(",") : ae);
    headers.etag = gzip ? found.gzipEtag : found.etag;
    if (noneMatch(req.headers["if-none-match"], headers.etag)) {
      res.writeHead(304, headers);
      res.end();
      return true;
    }
    const body = gzip ? found.gzip : found.body;
    if (gzip) headers["content-encoding"] = "gzip";
    headers["content-length"] = String(body.length);
    res.writeHead(200, headers);
    if (req.method === "HEAD") res.end();
    else res.end(body);
    return true;
  };
}
