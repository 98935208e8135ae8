// The outbound-address classifier (src/domain/shared/address.ts) form by form, then
// through the routes that use it: a production webhook_url and a /v1
// endpoint with private upstreams off.
import OpenAI from "openai";
import { describe, expect, it } from "vitest";
import { classifyAddress, isPrivateAddress, isPrivateHost, publicOnlyLookup } from "../../src/domain/shared/address.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client, uniqueEmail } from "../helpers/http.js";
import { startTestServer, useTestServer } from "../helpers/server.js";
import { startFakeVllm } from "../v1/fake-vllm.js";
import { serveModel } from "../v1/serving.js";

/** Not public, each with the range it falls in. */
const PRIVATE: [string, string][] = [
  // IPv4
  ["127.0.0.1", "loopback"],
  ["127.255.255.254", "loopback"],
  ["10.0.0.5", "private"],
  ["172.16.3.4", "private"],
  ["172.31.255.255", "private"],
  ["192.168.0.1", "private"],
  ["169.254.169.254", "linkLocal"],
  ["100.64.0.1", "carrierGradeNat"],
  ["100.127.255.255", "carrierGradeNat"],
  ["0.0.0.0", "unspecified"],
  ["224.0.0.1", "multicast"],
  ["255.255.255.255", "broadcast"],
  ["192.0.2.7", "reserved"],
  ["240.0.0.1", "reserved"],
  // IPv6 of its own
  ["::", "unspecified"],
  ["::1", "loopback"],
  ["fd00::1", "uniqueLocal"],
  ["fc12:3456::1", "uniqueLocal"],
  ["fe80::1", "linkLocal"],
  ["fe80::1%eth0", "linkLocal"],
  ["ff02::1", "multicast"],
  ["fec0::1", "deprecatedSiteLocal"],
  ["feff::1", "deprecatedSiteLocal"],
  ["2001:db8::1", "reserved"],
  ["100::1", "discard"],
  ["2001:0:4136:e378:8000:63bf:3fff:fdd2", "teredo"],
  ["4000::1", "notGlobal"],
  // IPv4-compatible ::a.b.c.d (deprecated; some stacks route it to a.b.c.d)
  ["::7f00:1", "ipv4Compatible"],
  ["::a9fe:a9fe", "ipv4Compatible"],
  ["::127.0.0.1", "ipv4Compatible"],
  ["::8.8.8.8", "ipv4Compatible"],
  ["::1:0:0:1", "reserved"],
  // ::ffff:0:0/96, mapped (::ffff:a.b.c.d) leading to a private IPv4
  ["::ffff:127.0.0.1", "ipv4Mapped:loopback"],
  ["::ffff:7f00:1", "ipv4Mapped:loopback"],
  ["::ffff:10.0.0.1", "ipv4Mapped:private"],
  ["::ffff:a9fe:a9fe", "ipv4Mapped:linkLocal"],
  ["::ffff:100.64.0.1", "ipv4Mapped:carrierGradeNat"],
  // ...and translated (::ffff:0:a.b.c.d, RFC 6145): never a destination of its own
  ["::ffff:0:7f00:1", "rfc6145"],
  ["::ffff:0:a9fe:a9fe", "rfc6145"],
  ["::ffff:0:808:808", "rfc6145"],
  // 6to4 2002:AABB:CCDD::/48 over a private IPv4
  ["2002:7f00:1::1", "6to4:loopback"],
  ["2002:a00:1::", "6to4:private"],
  ["2002:a9fe:a9fe::1", "6to4:linkLocal"],
  ["2002:c0a8:101::1", "6to4:private"],
  // NAT64: the well-known prefix over a private IPv4, and the local-use prefix whatever it carries
  ["64:ff9b::7f00:1", "rfc6052:loopback"],
  ["64:ff9b::a9fe:a9fe", "rfc6052:linkLocal"],
  ["64:ff9b::10.1.2.3", "rfc6052:private"],
  ["64:ff9b:1::808:808", "rfc6052:localUse"],
  ["64:ff9b:1:abcd::1", "rfc6052:localUse"],
  // not an address at all
  ["not-an-ip", "invalid"],
  ["", "invalid"],
];

const PUBLIC = [
  "8.8.8.8",
  "1.1.1.1",
  "172.32.0.1",
  "100.128.0.1",
  "2606:4700:4700::1111",
  "2a00:1450:4001:81a::200e",
  "::ffff:8.8.8.8",
  "64:ff9b::808:808",
  "2002:808:808::1",
];

describe("classifyAddress", () => {
  it.each(PRIVATE)("%s is not public (%s)", (address, range) => {
    expect(classifyAddress(address)).toMatchObject({ public: false, range });
    expect(isPrivateAddress(address)).toBe(true);
    expect(isPrivateAddress(`[${address}]`)).toBe(true);
  });

  it.each(PUBLIC)("%s is public", (address) => {
    expect(classifyAddress(address).public).toBe(true);
    expect(isPrivateAddress(address)).toBe(false);
  });

  it("names the IPv4 address an IPv6 form leads to", () => {
    expect(classifyAddress("2002:7f00:1::1").embedded).toBe("127.0.0.1");
    expect(classifyAddress("64:ff9b::a9fe:a9fe").embedded).toBe("169.254.169.254");
    expect(classifyAddress("::ffff:7f00:1").embedded).toBe("127.0.0.1");
    expect(classifyAddress("2002:808:808::1")).toMatchObject({ public: true, embedded: "8.8.8.8" });
  });

  it("judges URL hosts: literals by the classifier, local names by name, other names later by their addresses", () => {
    for (const h of ["[::7f00:1]", "[::ffff:7f00:1]", "[fec0::1]", "localhost", "api.localhost", "printer.local", "db.internal", "intranet", "localhost."]) {
      expect(isPrivateHost(h), h).toBe(true);
    }
    for (const h of ["hooks.example.com", "8.8.8.8", "[2606:4700:4700::1111]"]) expect(isPrivateHost(h), h).toBe(false);
  });

  it("the resolving lookup refuses a name whose addresses are private", async () => {
    for (const all of [true, false]) {
      const err = await new Promise<Error | null>((resolve) => publicOnlyLookup("webhook")("localhost", { all }, (e) => resolve(e)));
      expect(err?.message).toMatch(/webhook host localhost resolves to a private address/);
    }
  });
});

describe("through the routes", () => {
  const prod = useTestServer({ NODE_ENV: "production" });

  it("production: a webhook_url at any private IPv6 form is refused with 400 naming the field", async () => {
    const r = await makeRenter(prod);
    const api = client(prod.url);
    const hosts = ["[::7f00:1]", "[::a9fe:a9fe]", "[::ffff:127.0.0.1]", "[::ffff:0:7f00:1]", "[2002:7f00:1::1]", "[fec0::1]", "[64:ff9b:1::808:808]", "[64:ff9b::a9fe:a9fe]", "[fd00::1]", "100.64.0.1"];
    for (const host of hosts) {
      const res = await api.patch("/api/renters/me", { webhook_url: `https://${host}/hook` }, r.headers);
      expect(res.status, host).toBe(400);
      expect(res.body.error, host).toMatch(/^webhook_url must not point at a private or loopback address/);
    }
    const reg = await api.post("/api/renters/register", { name: "v6", email: uniqueEmail("v6"), webhook_url: "https://[::a9fe:a9fe]/latest" });
    expect(reg.status).toBe(400);
    expect(reg.body.error).toMatch(/webhook_url/);
    expect((await api.patch("/api/renters/me", { webhook_url: "https://[2606:4700:4700::1111]/hook" }, r.headers)).status).toBe(200);
  });

  it("/v1 with private upstreams off: endpoints at IPv6 forms of loopback are refused before connecting", async () => {
    const strict = await startTestServer({ SVC_V1_PRIVATE_UPSTREAMS: "off" });
    const up = await startFakeVllm("mapped");
    try {
      const port = new URL(up.url).port;
      const renter = await makeRenter(strict, 10_000);
      const ai = new OpenAI({ apiKey: renter.key, baseURL: `${strict.url}/v1`, maxRetries: 0 });
      // One model per endpoint, so each answer is about that address. [::ffff:7f00:1] reaches the
      // fake's 127.0.0.1 listener on a dual-stack host; the others would be dialled as given.
      const cases = [
        ["TinyLlama/TinyLlama-1.1B-Chat-v1.0", "::ffff:7f00:1"],
        ["Qwen/Qwen2.5-7B-Instruct", "::ffff:0:7f00:1"],
        ["google/gemma-2-9b-it", "::7f00:1"],
        ["microsoft/Phi-3-mini-4k-instruct", "2002:7f00:1::1"],
        ["mistralai/Mistral-7B-Instruct-v0.3", "64:ff9b::7f00:1"],
      ];
      for (const [model, host] of cases) {
        await serveModel(strict, model, `http://[${host}]:${port}`);
        const err = await ai.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] }).catch((e) => e);
        expect(err.status, host).toBe(502);
        expect(err.message, host).toMatch(/is a private address/);
      }
      expect(up.requests).toHaveLength(0);
    } finally {
      await up.close();
      await strict.close();
    }
  });
});
