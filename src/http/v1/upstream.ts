// The HTTP client for serving endpoints. Endpoint URLs come from providers'
// daemons, so unless private upstreams are allowed (SVC_V1_PRIVATE_UPSTREAMS,
// off in production) the gateway connects only to public addresses: literal
// hosts are checked before connecting and names at the moment of connecting
// (the address actually dialled, so DNS rebinding cannot slip through). An
// endpoint whose daemon reported a secret (endpoint-ready's endpoint_api_key,
// vLLM's VLLM_API_KEY) gets it as `Authorization: Bearer`; nothing else does,
// and it is never logged.
import http from "node:http";
import https from "node:https";
import { isIpLiteral, isPrivateAddress, publicOnlyLookup } from "../../domain/shared/address.js";

/**
 * How long a connection to an endpoint is kept idle for the next request: below the 5 s after which vLLM's
 * server (uvicorn) closes an idle one, so that a request is not sent down a connection the endpoint is closing
 * (a reset, read as the endpoint's failure). Only idle connections: a slow stream is never cut by it.
 */
const IDLE_CONNECTION_MS = 4_000;
const agents = {
  http: new http.Agent({ keepAlive: true, timeout: IDLE_CONNECTION_MS }),
  https: new https.Agent({ keepAlive: true, timeout: IDLE_CONNECTION_MS }),
};

const lookup = publicOnlyLookup("endpoint");

export interface PostOptions {
  signal: AbortSignal;
  accept: string;
  allowPrivate: boolean;
  /** The endpoint's own secret (Upstream.apiKey): sent as `Authorization: Bearer`. */
  apiKey?: string;
}

/** POSTs a JSON body; resolves with the response (headers read, body not yet). */
export function postJson(url: string, body: string, opts: PostOptions): Promise<http.IncomingMessage> {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const host = u.hostname.replace(/^\[|\]$/g, "");
    if (!opts.allowPrivate && isIpLiteral(host) && isPrivateAddress(host)) {
      return reject(new Error(`endpoint host ${host} is a private address`));
    }
    const secure = u.protocol === "https:";
    const req = (secure ? https : http).request(u, {
      method: "POST",
      agent: secure ? agents.https : agents.http,
      headers: {
        "content-type": "application/json",
        "content-length": Buffer.byteLength(body),
        accept: opts.accept,
        ...(opts.apiKey ? { authorization: `Bearer ${opts.apiKey}` } : {}),
      },
      signal: opts.signal,
      lookup: opts.allowPrivate ? undefined : lookup,
    });
    req.once("response", resolve);
    req.once("error", reject);
    req.end(body);
  });
}

/** Reads a whole response body, refusing more than `limit` bytes. */
export async function readAll(res: http.IncomingMessage, limit: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of res as AsyncIterable<Buffer>) {
    size += c.length;
    if (size > limit) {
      res.destroy();
      throw new Error(`response larger than ${limit} bytes`);
    }
    chunks.push(c);
  }
  return Buffer.concat(chunks).toString("utf8");
}
