// The pre-encoded Struct of a pushed job (src/shared/struct-binary.ts) decodes to
// the same message protobuf-es's own encoding gives, for every kind of JSON value.
import { describe, expect, it } from "vitest";
import { create, fromBinary, fromJson, toBinary, type JsonObject } from "@bufbuild/protobuf";
import { StructSchema } from "@bufbuild/protobuf/wkt";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import { AssignedJobSchema } from "../../gen/svc/v1/jobs_pb.js";
import { setStructBytes, structBytes } from "../../src/shared/struct-binary.js";

const SPECS: JsonObject[] = [
  {},
  { a: 1, b: -2.5, c: 0, d: 1e300, e: -0, f: Number.MAX_SAFE_INTEGER },
  { s: "", t: "naïve ☃ 𝄞", u: "x".repeat(300), n: null, yes: true, no: false },
  { list: [1, "two", null, false, [], [[3]], { k: "v" }], empty: [], nested: { deeper: { deepest: { z: [{}, { y: null }] } } } },
  { job_id: "job-1", image: "pytorch/pytorch:2.3", env: { A: "1" }, command: ["python", "-c", "print(1)"], limits: { gpus: 1, seconds: 1800 } },
];

describe("struct-binary", () => {
  it.each(SPECS.map((s, i) => [i, s] as const))("spec %i decodes as the reflective encoding does", (_, spec) => {
    const base = { id: 7n, jobId: "job-x", jobType: "benchmark", taskSpecHmac: "h", durationMinutes: 1n, maxDurationSeconds: 60n };
    const reflective = toBinary(AssignedJobSchema, create(AssignedJobSchema, { ...base, taskSpec: spec, gpuRequirements: { min_vram_gb: 24 } }));
    const msg = create(AssignedJobSchema, base);
    setStructBytes(msg, AssignedJobSchema.field.taskSpec, spec);
    setStructBytes(msg, AssignedJobSchema.field.gpuRequirements, { min_vram_gb: 24 });
    const pre = toBinary(AssignedJobSchema, msg);
    const [a, b] = [fromBinary(AssignedJobSchema, reflective), fromBinary(AssignedJobSchema, pre)];
    expect(b.taskSpec).toEqual(spec);
    expect(b.gpuRequirements).toEqual({ min_vram_gb: 24 });
    expect(b).toEqual(a);
  });

  it.each(SPECS.map((s, i) => [i, s] as const))("spec %i has the very bytes of protobuf-es's Struct encoding", (_, spec) => {
    const own = new BinaryReader(structBytes(spec)).bytes(); // the length prefix read off
    expect(Buffer.from(own)).toEqual(Buffer.from(toBinary(StructSchema, fromJson(StructSchema, spec))));
  });

  it("leaves out undefined members, as JSON does", () => {
    const msg = create(AssignedJobSchema, {});
    setStructBytes(msg, AssignedJobSchema.field.taskSpec, { a: 1, b: undefined } as unknown as JsonObject);
    expect(fromBinary(AssignedJobSchema, toBinary(AssignedJobSchema, msg)).taskSpec).toEqual({ a: 1 });
  });
});
