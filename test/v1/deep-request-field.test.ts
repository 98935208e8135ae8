// A /v1 request body nested past MAX_JSON_DEPTH is refused before it is parsed naming the top-level member
// that nests too deep, in the same words as an /api body's refusal.
import { describe, expect, it } from "vitest";
import { MAX_JSON_DEPTH } from "../../src/http/json-depth.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";

const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000" });
const nest = (depth: number) => "[".repeat(depth) + "1" + "]".repeat(depth);

describe("a /v1 request body nested too deep", () => {
  it("is refused naming the field that nests too deep", async () => {
    const renter = await makeRenter(srv, 10_000);
    for (const [field, body] of [
      ["messages", `{"model":"m","messages":[{"role":"user","content":"x","meta":${nest(MAX_JSON_DEPTH)}}]}`],
      ["tools", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":${nest(2_000_000)}}`],
      ["too\"ls", `{"model":"m","too\\"ls":${nest(MAX_JSON_DEPTH)},"messages":[]}`],
    ]) {
      const r = await client(srv.url).call("POST", "/v1/chat/completions", body, { authorization: `Bearer ${renter.key}`, "content-type": "application/json" });
      expect(r.status, field).toBe(400);
      expect(r.body.error, field).toMatchObject({
        code: "invalid_request",
        message: `request body must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep; field '${field}' nests deeper`,
      });
    }
  });
});
