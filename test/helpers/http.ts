// A small JSON-over-HTTP client for tests (real HTTP/1.1 via fetch).
export interface Reply<T = any> {
  status: number;
  body: T;
  headers: Headers;
  text: string;
}

/** `base` may be a server, its URL then read at each call: a client built before the server starts. */
export function client(base: string | { readonly url: string }) {
  async function call<T = any>(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<Reply<T>> {
    const init: RequestInit = { method, headers: { ...headers } };
    if (body !== undefined) {
      init.body = typeof body === "string" ? body : JSON.stringify(body);
      (init.headers as Record<string, string>)["content-type"] ??= "application/json";
    }
    const res = await fetch((typeof base === "string" ? base : base.url) + path, init);
    const text = await res.text();
    let parsed: unknown = text;
    try {
      parsed = JSON.parse(text);
    } catch {}
    return { status: res.status, body: parsed as T, headers: res.headers, text };
  }
  return {
    get: <T = any>(path: string, headers?: Record<string, string>) => call<T>("GET", path, undefined, headers),
    post: <T = any>(path: string, body?: unknown, headers?: Record<string, string>) => call<T>("POST", path, body ?? {}, headers),
    patch: <T = any>(path: string, body?: unknown, headers?: Record<string, string>) => call<T>("PATCH", path, body ?? {}, headers),
    put: <T = any>(path: string, body?: unknown, headers?: Record<string, string>) => call<T>("PUT", path, body ?? {}, headers),
    call,
  };
}

let counter = 0;
/** A unique email for this test run. */
export function uniqueEmail(prefix = "user"): string {
  counter++;
  return `${prefix}.${process.pid}.${Date.now()}.${counter}@example.com`;
}
