// A google.protobuf.Value (or Struct) as JSON, for what a provider's machine reported (machine
// output: a job's result, log lines, telemetry, an attestation's statement). protobuf-es's toJson
// throws on a number JSON cannot write (NaN, ±Infinity: JSON text's 1e400 reads as Infinity, and
// binary protobuf's double can be either), which would refuse the whole report; here such a number
// is written null, as JSON.stringify writes it, so the report is kept. A caller's own free-form
// JSON is refused instead, naming the field (src/http/nul.ts).
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import type { Struct, Value } from "@bufbuild/protobuf/wkt";

export function valueJson(v: Value): JsonValue {
  switch (v.kind.case) {
    case "numberValue":
      return Number.isFinite(v.kind.value) ? v.kind.value : null;
    case "stringValue":
    case "boolValue":
      return v.kind.value;
    case "structValue":
      return structJson(v.kind.value);
    case "listValue":
      return v.kind.value.values.map(valueJson);
    default:
      return null;
  }
}

export function structJson(s: Struct): JsonObject {
  const out: JsonObject = {};
  for (const [k, x] of Object.entries(s.fields)) out[k] = valueJson(x);
  return out;
}
