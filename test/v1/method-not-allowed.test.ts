// A /v1 route asked with a method it does not take is answered 405 in the /v1 envelope with the
// Allow header naming the one it takes (RFC 9110 15.5.6), as every other route of the server is.
import { expect, it } from "vitest";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });

it.each([
  ["GET", "/v1/chat/completions", "POST"],
  ["PUT", "/v1/chat/completions", "POST"],
  ["POST", "/v1/models", "GET"],
  ["DELETE", "/v1/models/Qwen%2FQwen2.5-7B-Instruct", "GET"],
  ["POST", "/v1/usage", "GET"],
])("%s %s: 405 method_not_allowed with Allow: %s", async (method, path, allow) => {
  const renter = await makeRenter(srv, 1_000);
  const res = await fetch(`${srv.url}${path}`, { method, headers: { authorization: `Bearer ${renter.key}` } });
  expect(res.status).toBe(405);
  expect(res.headers.get("allow")).toBe(allow);
  expect((await res.json()).error).toMatchObject({ code: "method_not_allowed", type: "invalid_request_error", status: 405, retryable: false });
});
