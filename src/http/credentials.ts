// Reads the credentials a caller sent, the documented ways, into one
// `Credentials` value on the request context. Services never parse headers.
import type { IncomingHttpHeaders } from "node:http";
import { createContextKey } from "@connectrpc/connect";
import type { JsonValue } from "@bufbuild/protobuf";

export interface Credentials {
  /** API keys the caller presented (query/body `key`, `api_key`, path key, role headers, bearer). */
  keys: string[];
  /** Admin token candidates (x-admin-token, Authorization: Bearer). */
  adminTokens: string[];
  clientIp: string;
  /** Request id for logs. */
  requestId: string;
}

export const credentialsKey = createContextKey<Credentials>({ keys: [], adminTokens: [], clientIp: "", requestId: "" });

function header(headers: IncomingHttpHeaders | Headers, name: string): string | undefined {
  if (headers instanceof Headers) return headers.get(name) ?? undefined;
  const v = headers[name];
  return Array.isArray(v) ? v[0] : v;
}

function fromHeaders(headers: IncomingHttpHeaders | Headers, keys: string[], adminTokens: string[]) {
  for (const h of ["x-renter-key", "x-provider-key"]) {
    const v = header(headers, h)?.trim();
    if (v) keys.push(v);
  }
  const admin = header(headers, "x-admin-token")?.trim();
  if (admin) adminTokens.push(admin);
  const auth = header(headers, "authorization");
  const bearer = auth && /^Bearer\s+(.+)$/i.exec(auth.trim())?.[1];
  if (bearer) {
    adminTokens.push(bearer);
    keys.push(bearer);
  }
}

/** gRPC / Connect calls: credentials come in metadata only. */
export function credentialsFromHeaders(headers: IncomingHttpHeaders | Headers, clientIp: string, requestId: string): Credentials {
  const keys: string[] = [];
  const adminTokens: string[] = [];
  fromHeaders(headers, keys, adminTokens);
  return { keys, adminTokens, clientIp, requestId };
}

const KEY_FIELDS = ["api_key", "key"];

/** REST calls: headers first (preferred), then path, body and query `key`/`api_key`. */
export function credentialsFromRest(
  headers: IncomingHttpHeaders,
  pathParams: Record<string, string>,
  query: URLSearchParams,
  body: JsonValue | undefined,
  clientIp: string,
  requestId: string,
): Credentials {
  const creds = credentialsFromHeaders(headers, clientIp, requestId);
  for (const f of KEY_FIELDS) {
    if (pathParams[f]) creds.keys.push(pathParams[f]);
  }
  if (body && typeof body === "object" && !Array.isArray(body)) {
    for (const f of KEY_FIELDS) {
      const v = (body as Record<string, JsonValue>)[f];
      if (typeof v === "string" && v) creds.keys.push(v);
    }
  }
  for (const f of KEY_FIELDS) {
    const v = query.get(f);
    if (v) creds.keys.push(v);
  }
  return creds;
}
