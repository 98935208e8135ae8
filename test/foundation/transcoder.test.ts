// Request decoding errors name the offending field, also for nested decoders.
import { describe, expect, it } from "vitest";
import { AppendJobLogsRequestSchema, SubmitJobRequestSchema } from "../../gen/svc/v1/jobs_pb.js";
import { RegisterProviderRequestSchema } from "../../gen/svc/v1/providers_pb.js";
import { requestFromRest } from "../../src/http/json.js";

const input = (body: unknown) => ({ pathParams: {}, query: new URLSearchParams(), headers: {}, body: body as never, rawBody: Buffer.alloc(0) });

describe("requestFromRest", () => {
  it("names the field whose value has the wrong type", () => {
    expect(() => requestFromRest(SubmitJobRequestSchema, input({ job_type: "training", params: "hi" }))).toThrow(
      "invalid value for field 'params': expected a JSON object",
    );
    expect(() => requestFromRest(SubmitJobRequestSchema, input({ job_type: "training", priority: 1.5 }))).toThrow(
      "invalid value for field 'priority': expected an integer",
    );
    expect(() => requestFromRest(RegisterProviderRequestSchema, input({ name: ["x"] }))).toThrow("invalid value for field 'name': expected a string");
  });

  it("coerces query text to the field's type and ignores unknown members", () => {
    const q = new URLSearchParams("duration_minutes=2.5&priority=1&bogus=1");
    const msg = requestFromRest(SubmitJobRequestSchema, { ...input({ job_type: "training", unknown: 1 }), query: q }) as any;
    expect(msg.durationMinutes).toBe(2.5);
    expect(msg.priority).toBe(1);
    expect(() => requestFromRest(SubmitJobRequestSchema, { ...input(undefined), query: new URLSearchParams("priority=high") })).toThrow(
      "priority must be a number",
    );
  });

  it("a repeated field sent as a non-array in the body and again in the query is a 400 naming it, not a crash", () => {
    const body = { logs: 4.35e225, job_id: "x" };
    expect(() => requestFromRest(AppendJobLogsRequestSchema, { ...input(body), query: new URLSearchParams("logs=-1") })).toThrow(
      "invalid value for field 'logs': expected an array",
    );
    const both = requestFromRest(AppendJobLogsRequestSchema, { ...input({ logs: ["a"] }), query: new URLSearchParams("logs=b") }) as any;
    expect(both.logs.map((v: any) => v.kind.value)).toEqual(["a", "b"]);
  });
});
