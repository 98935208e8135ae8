// The pre-encoded Struct of a pushed job (src/shared/struct-binary.ts) decodes to
// the same message protobuf-es's own encoding gives, for every kind of JSON value;
// and Values and Structs read straight to JSON read as protobuf-es reads them.
import { describe, expect, it } from "vitest";
import { create, fromBinary, fromJson, toBinary, toJson, type JsonObject, type JsonValue } from "@bufbuild/protobuf";
import { StructSchema, ValueSchema } from "@bufbuild/protobuf/wkt";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import { AssignedJobSchema } from "../../gen/svc/v1/jobs_pb.js";
import { NotPlainJson, partSize, readStructJson, readStructTextAt, readValueJson, setStructBytes, structBytes, WireCursor, writeVarint } from "../../src/shared/struct-binary.js";

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

  it("reads JSON as deep as its room, and leaves deeper JSON to protobuf-es however deep (no stack overflow)", () => {
    /** A Value of `depth` lists around a string, encoded from the outside in (no recursion here either). */
    const deepList = (depth: number) => {
      const inner = toBinary(ValueSchema, fromJson(ValueSchema, "x"));
      const valueSizes = [inner.length];
      const listSizes: number[] = [];
      for (let i = 1; i <= depth; i++) {
        listSizes[i] = partSize(valueSizes[i - 1]);
        valueSizes[i] = partSize(listSizes[i]);
      }
      const out = Buffer.alloc(valueSizes[depth]);
      let pos = 0;
      for (let i = depth; i >= 1; i--) {
        out[pos++] = 0x32; // Value.list_value
        pos = writeVarint(out, pos, listSizes[i]);
        out[pos++] = 0x0a; // ListValue.values
        pos = writeVarint(out, pos, valueSizes[i - 1]);
      }
      out.set(inner, pos);
      return out;
    };
    let expected: JsonValue = "x";
    for (let i = 0; i < 5; i++) expected = [expected];
    expect(readValueJson(deepList(5), 5)).toEqual(expected);
    expect(() => readValueJson(deepList(6), 5)).toThrow(NotPlainJson);
    // Each frame of the reader's recursion was a level: this many overflowed the stack (RangeError).
    const deep = deepList(500_000);
    expect(() => readValueJson(deep)).toThrow(NotPlainJson);
    // {"a": deep}, read to an object and to text.
    const entry = partSize(1) + partSize(deep.length);
    const struct = Buffer.alloc(partSize(entry));
    let pos = writeVarint(struct, 1, entry);
    struct[0] = 0x0a; // Struct.fields
    struct.set([0x0a, 0x01, 0x61, 0x12], pos); // key "a", then the value
    pos = writeVarint(struct, pos + 4, deep.length);
    struct.set(deep, pos);
    expect(() => readStructJson(struct)).toThrow(NotPlainJson);
    expect(() => readStructTextAt(new WireCursor(struct, 0, struct.length), struct.length, new Set())).toThrow(NotPlainJson);
  });
});

describe("struct-binary reading to text", () => {
  const PICK = new Set(["gpu_name", "gpu_count", "all_gpus", "flag", "nested"]);
  const textOf = (bytes: Uint8Array) => {
    const buf = Buffer.from(bytes);
    return readStructTextAt(new WireCursor(buf, 0, buf.length), buf.length, PICK);
  };

  /** What the text reader must give for these bytes: JSON.stringify of the object the object reader makes. */
  function expectSameAsObject(bytes: Uint8Array, what: string): "text" | "left" {
    const object = readStructJson(bytes);
    let read: ReturnType<typeof textOf>;
    try {
      read = textOf(bytes);
    } catch (err) {
      expect(err, what).toBeInstanceOf(NotPlainJson);
      return "left";
    }
    expect(read.json, what).toBe(JSON.stringify(object));
    for (const k of PICK) {
      const v = object[k];
      expect(read.scalars.get(k), `${what}: ${k}`).toBe(typeof v === "string" || typeof v === "number" || typeof v === "boolean" ? v : undefined);
      expect(read.lengths.get(k), `${what}: ${k} length`).toBe(Array.isArray(v) ? v.length : undefined);
    }
    return "text";
  }

  it.each(SPECS.map((s, i) => [i, s] as const))("struct %i reads to the text JSON.stringify writes for its object", (_, spec) => {
    expect(expectSameAsObject(toBinary(StructSchema, fromJson(StructSchema, spec)), "spec")).toBe("text");
  });

  it("writes strings as JSON does: quotes, backslashes, control characters, NUL and non-ASCII", () => {
    const spec = { gpu_name: 'A "quoted"\\ name\n\t\u0001\u0000 ☃ 𝄞 \u2028', flag: true, gpu_count: 2, nested: { "key \"q\"": "v" }, all_gpus: [{ a: 1 }, 2, "3"] };
    const read = textOf(toBinary(StructSchema, fromJson(StructSchema, spec)));
    expect(read.json).toBe(JSON.stringify(spec));
    expect(JSON.parse(read.json)).toEqual(spec);
    expect(read.lengths.get("all_gpus")).toBe(3);
    expect(read.scalars.get("gpu_count")).toBe(2);
    expect(read.scalars.has("nested")).toBe(false);
  });

  it("leaves to the object reader a Struct whose object orders or holds its keys otherwise: a key twice, an index key, __proto__", () => {
    const once = (k: string, v: JsonValue) => toBinary(StructSchema, fromJson(StructSchema, { [k]: v }));
    const cases: [string, Uint8Array][] = [
      ["a key twice", Buffer.concat([once("k", 1), once("other", "x"), once("k", "last")])],
      ["an index key", Buffer.concat([once("b", 1), once("7", 2)])],
      ["__proto__", structBytes(JSON.parse('{"__proto__": 1}') as JsonObject).subarray(1)],
    ];
    for (const [what, bytes] of cases) expect(() => textOf(bytes), what).toThrow(NotPlainJson);
    // Keys that only look like indices are written in order, as an object keeps them.
    expect(expectSameAsObject(Buffer.concat([once("b", 1), once("07", 2), once("-1", 3), once("1.5", 5)]), "near-index keys")).toBe("text");
  });

  it("gives the object's text for random Structs", () => {
    let seed = 20261130;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const pick = <T>(xs: T[]) => xs[Math.floor(rand() * xs.length)]!;
    const KEYS = ["gpu_name", "gpu_count", "all_gpus", "flag", "nested", "a", "b", "é", "0", "10", "x y", '"', "\\", "", "__proto__x"];
    const STRINGS = ["", "plain", "ü ☃ 𝄞", 'q"uote', "back\\slash", "line\nfeed", "nul\u0000", "\u001f", "\u2028"];
    function value(depth: number): JsonValue {
      const kind = Math.floor(rand() * (depth > 3 ? 4 : 6));
      switch (kind) {
        case 0: return null;
        case 1: return pick([true, false]);
        case 2: return pick([0, -0, 1, -1.5, 1e21, 1e-7, 123456789.125, Number.MAX_SAFE_INTEGER]);
        case 3: return pick(STRINGS);
        case 4: return Array.from({ length: Math.floor(rand() * 4) }, () => value(depth + 1));
        default: return struct(depth + 1);
      }
    }
    function struct(depth: number): JsonObject {
      const o: JsonObject = {};
      for (let i = Math.floor(rand() * 6); i > 0; i--) o[pick(KEYS)] = value(depth);
      return o;
    }
    const seen = { text: 0, left: 0 };
    for (let i = 0; i < 400; i++) {
      const spec = struct(0);
      seen[expectSameAsObject(toBinary(StructSchema, fromJson(StructSchema, spec)), JSON.stringify(spec))]++;
    }
    // Both ways were taken: most Structs as text, those with index keys left to the object reader.
    expect(seen.text).toBeGreaterThan(200);
    expect(seen.left).toBeGreaterThan(0);
  });
});
