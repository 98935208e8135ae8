// A member of a typed object in a request body (readiness `checks`) with the wrong type is a 400
// naming that member and the type it takes, not its parent object said to be "not a JSON object".
import { beforeAll, describe, expect, it } from "vitest";
import { useTestServer } from "../helpers/server.js";
import { client } from "../helpers/http.js";
import { makeProvider } from "../helpers/fixtures.js";

const srv = useTestServer();
const api = client(srv);
let key = "";

beforeAll(async () => {
  key = (await makeProvider(srv)).key;
});

const readiness = (checks: unknown) => api.post("/api/providers/readiness", { api_key: key, checks });

describe("POST /api/providers/readiness with a checks member of the wrong type", () => {
  it("names checks.<member> and its type", async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ cuda: "yes" }, "invalid value for field 'checks.cuda': expected a boolean"],
      [{ cuda: true, pytorch: 1 }, "invalid value for field 'checks.pytorch': expected a boolean"],
      [{ vram_gb: "lots" }, "invalid value for field 'checks.vram_gb': expected a number"],
      [{ driver: 550 }, "invalid value for field 'checks.driver': expected a string"],
    ];
    for (const [checks, error] of cases) {
      const r = await readiness(checks);
      expect(r.status, JSON.stringify(checks)).toBe(400);
      expect(r.body).toEqual({ error });
    }
  });

  it("still names checks itself when it is not an object, and takes a well-typed report", async () => {
    const r = await readiness("all good");
    expect(r.status).toBe(400);
    expect(r.body).toEqual({ error: "invalid value for field 'checks': expected a JSON object" });
    const ok = await readiness({ cuda: true, pytorch: true, vram_gb: 23.5, driver: "550.54" });
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ success: true, readiness_status: "ready" });
  });
});
