// A browser page using the official OpenAI JS SDK sends `x-stainless-*`
// headers (the SDK's language, version, platform, retry count, timeout...)
// with every /v1 request, so its preflight asks for them: a /v1 preflight
// allows those it asks for, beside the usual list. The SDKs also send
// `openai-organization` and `openai-project` when the client sets them, and
// `openai-beta` for beta features: /v1 allows those too. Other routes keep
// the usual list.
import { expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";

const ORIGIN = "https://chat.example.org";
const srv = useTestServer({ CORS_ORIGINS: ORIGIN });

const SDK_HEADERS = [
  "x-stainless-os",
  "x-stainless-lang",
  "x-stainless-package-version",
  "x-stainless-runtime",
  "x-stainless-runtime-version",
  "x-stainless-arch",
  "x-stainless-retry-count",
  "x-stainless-timeout",
  "x-stainless-helper-method",
  "x-stainless-poll-helper",
  "x-stainless-custom-poll-interval",
];
const preflight = (path: string, headers: string[], method = "POST") =>
  fetch(srv.url + path, {
    method: "OPTIONS",
    headers: { origin: ORIGIN, "access-control-request-method": method, "access-control-request-headers": headers.join(",") },
  });
const allowed = (r: Response) => new Set(r.headers.get("access-control-allow-headers")!.split(",").map((h) => h.trim().toLowerCase()));

it("allows the OpenAI SDK's x-stainless-* headers on a /v1 preflight", async () => {
  for (const [path, method] of [["/v1/chat/completions", "POST"], ["/v1/models", "GET"], ["/v1/models/some%2Fmodel", "GET"]]) {
    // As a browser sends them: lower case, sorted, with the SDK's own authorization and content-type.
    const r = await preflight(path, ["authorization", "content-type", ...SDK_HEADERS].sort(), method);
    expect(r.status, path).toBe(204);
    expect(r.headers.get("access-control-allow-origin")).toBe(ORIGIN);
    const names = allowed(r);
    for (const h of ["authorization", "content-type", ...SDK_HEADERS]) expect(names, `${path} ${h}`).toContain(h);
    // The answer depends on what was asked: a cache keys it on that too.
    expect(r.headers.get("vary")).toMatch(/access-control-request-headers/i);
  }
});

it("allows only x-stainless-* headers beyond the usual list, and them only on /v1", async () => {
  const v1 = allowed(await preflight("/v1/chat/completions", ["X-Stainless-Retry-Count", "x-custom-header"]));
  expect(v1).toContain("x-stainless-retry-count");
  expect(v1).not.toContain("x-custom-header");
  const api = allowed(await preflight("/api/jobs/submit", ["x-stainless-os", "content-type"]));
  expect(api).toContain("content-type");
  expect(api).not.toContain("x-stainless-os");
});

it("allows the OpenAI SDK's openai-organization, openai-project and openai-beta headers on /v1 only", async () => {
  const asked = ["authorization", "content-type", "openai-beta", "openai-organization", "openai-project", "x-stainless-lang"];
  for (const [path, method] of [["/v1/chat/completions", "POST"], ["/v1/models", "GET"]]) {
    const r = await preflight(path, asked, method);
    expect(r.status, path).toBe(204);
    const names = allowed(r);
    for (const h of asked) expect(names, `${path} ${h}`).toContain(h);
  }
  // As a client sets them, in any case.
  const mixed = allowed(await preflight("/v1/embeddings", ["OpenAI-Organization", "OpenAI-Project", "OpenAI-Beta"]));
  for (const h of ["openai-organization", "openai-project", "openai-beta"]) expect(mixed).toContain(h);
  const api = allowed(await preflight("/api/jobs/submit", ["openai-organization", "openai-project", "openai-beta", "content-type"]));
  expect(api).toContain("content-type");
  for (const h of ["openai-organization", "openai-project", "openai-beta"]) expect(api).not.toContain(h);
});
