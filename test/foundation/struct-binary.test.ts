// The pre-encoded Struct of a pushed job (src/shared/struct-binary.ts) decodes to
// the same message protobuf-es's own encoding gives, for every kind of JSON value;
// and Values and Structs read straight to JSON read as protobuf-es reads them.
import { describe, expect, it } from "vitest";
import { create, fromBinary, fromJson, toBinary, toJson, type JsonObject, type JsonValue } from "@bufbuild/protobuf";
import { StructSchema, ValueSchema } from "@bufbuild/protobuf/wkt";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import { AssignedJobSchema } from "../../gen/svc/v1/jobs_pb.js";
import { NotPlainJson, readStructJson, readValueJson, setStructBytes, structBytes } from "../../src/shared/struct-binary.js";

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

describe("struct-binary reading", () => {
  const VALUES: JsonValue[] = [null, true, false, 0, -0, 1.5, -1e-300, "", "naïve ☃ 𝄞", [], [1, [2, [3, null]], { a: [] }], ...SPECS];

  it.each(VALUES.map((v, i) => [i, v] as const))("value %i reads as protobuf-es reads it", (_, v) => {
    const bytes = toBinary(ValueSchema, fromJson(ValueSchema, v));
    expect(readValueJson(bytes)).toEqual(toJson(ValueSchema, fromBinary(ValueSchema, bytes)));
    expect(Object.is(readValueJson(bytes), v) || typeof v === "object").toBe(true);
  });

  it.each(SPECS.map((s, i) => [i, s] as const))("struct %i reads as protobuf-es reads it, also from its own encoding", (_, spec) => {
    const bytes = toBinary(StructSchema, fromJson(StructSchema, spec));
    expect(readStructJson(bytes)).toEqual(spec);
    expect(readStructJson(new BinaryReader(structBytes(spec)).bytes())).toEqual(spec);
  });

  it("keeps the last of a repeated key, as a map does", () => {
    const once = (k: string, v: JsonValue) => toBinary(StructSchema, fromJson(StructSchema, { [k]: v }));
    const bytes = Buffer.concat([once("k", 1), once("other", "x"), once("k", "last")]);
    expect(readStructJson(bytes)).toEqual(toJson(StructSchema, fromBinary(StructSchema, bytes)));
    expect(readStructJson(bytes)).toEqual({ k: "last", other: "x" });
  });

  it("leaves to protobuf-es what plain JSON cannot say or what it would merge or reject", () => {
    const value = (v: JsonValue) => toBinary(ValueSchema, fromJson(ValueSchema, v));
    const cases: [string, Uint8Array][] = [
      ["an empty Value", new Uint8Array(0)],
      ["NaN", toBinary(ValueSchema, create(ValueSchema, { kind: { case: "numberValue", value: NaN } }))],
      ["Infinity", toBinary(ValueSchema, create(ValueSchema, { kind: { case: "numberValue", value: Infinity } }))],
      ["two kinds in one Value", Buffer.concat([value(1), value("x")])],
      ["an unknown field", Buffer.concat([value(1).subarray(0, 0), Buffer.from([0x38, 0x01])])],
      ["a truncated string", value("hello").subarray(0, 4)],
      ["a __proto__ key", Buffer.concat([Buffer.from([0x2a]), structBytes(JSON.parse('{"__proto__": 1}') as JsonObject)])],
    ];
    for (const [what, bytes] of cases) expect(() => readValueJson(bytes), what).toThrow(NotPlainJson);
  });
});
