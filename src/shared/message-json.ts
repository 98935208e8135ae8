// A message as the documented JSON, guided by the descriptors and our field
// options: proto field names, 64-bit integers as JSON numbers, documented
// nulls, inlined members, and the status-code field left out. The REST
// transcoder (src/http/json.ts) writes its answers with it, and the CLI its
// --json output, so that both print the one documented shape.
import { getOption, isFieldSet, toJson, type DescField, type DescMessage, type JsonObject, type JsonValue, type Message, ScalarType } from "@bufbuild/protobuf";
import { http_status, inline, nullable, whole_body, from_header, raw_body, machine_output } from "../../gen/svc/v1/options_pb.js";

/** Our field options, read once per field: getOption builds a new container on every call. */
export interface FieldOptions {
  httpStatus: boolean;
  nullable: boolean;
  inline: boolean;
  wholeBody: boolean;
  rawBody: boolean;
  fromHeader: string;
  /** Text a provider's machine produced: a NUL in it is dropped by the domain, not refused (src/http/nul.ts). */
  machineOutput: boolean;
}
const fieldOptionsCache = new WeakMap<DescField, FieldOptions>();

/** Our options of a field (cached): what the transcoder, and the OpenAPI document, do with it. */
export function fieldOptionsOf(field: DescField): FieldOptions {
  let o = fieldOptionsCache.get(field);
  if (!o) {
    o = {
      httpStatus: getOption(field, http_status),
      nullable: getOption(field, nullable),
      inline: getOption(field, inline),
      wholeBody: getOption(field, whole_body),
      rawBody: getOption(field, raw_body),
      fromHeader: getOption(field, from_header),
      machineOutput: getOption(field, machine_output),
    };
    fieldOptionsCache.set(field, o);
  }
  return o;
}

const WKT_JSON = new Set([
  "google.protobuf.Struct",
  "google.protobuf.Value",
  "google.protobuf.ListValue",
  "google.protobuf.Timestamp",
  "google.protobuf.Duration",
]);

function scalarToJson(type: ScalarType, value: unknown): JsonValue {
  switch (type) {
    case ScalarType.INT64:
    case ScalarType.UINT64:
    case ScalarType.SINT64:
    case ScalarType.FIXED64:
    case ScalarType.SFIXED64:
      return Number(value);
    case ScalarType.BYTES:
      return Buffer.from(value as Uint8Array).toString("base64");
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return Number.isFinite(value as number) ? (value as number) : null;
    default:
      return value as JsonValue;
  }
}

function messageValueToJson(desc: DescMessage, value: unknown): JsonValue {
  if (desc.typeName === "google.protobuf.Struct") return value as JsonObject; // already unboxed
  if (WKT_JSON.has(desc.typeName)) return toJson(desc, value as Message);
  return messageToJson(desc, value as Message);
}

function fieldToJson(field: DescField, value: unknown): JsonValue {
  switch (field.fieldKind) {
    case "scalar":
      return scalarToJson(field.scalar, value);
    case "enum":
      return field.enum.values.find((v) => v.number === value)?.name ?? (value as number);
    case "message":
      return messageValueToJson(field.message, value);
    case "list":
      return (value as unknown[]).map((v) =>
        field.listKind === "message"
          ? messageValueToJson(field.message, v)
          : field.listKind === "scalar"
            ? scalarToJson(field.scalar, v)
            : (v as number),
      );
    case "map": {
      const out: JsonObject = {};
      for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
        out[k] = field.mapKind === "message" ? messageValueToJson(field.message, v) : field.mapKind === "scalar" ? scalarToJson(field.scalar, v) : (v as number);
      }
      return out;
    }
  }
}

/** Writes a message as the documented JSON object. */
export function messageToJson(desc: DescMessage, msg: Message): JsonObject {
  const out: JsonObject = {};
  for (const field of desc.fields) {
    if (fieldOptionsOf(field).httpStatus) continue;
    let value: unknown;
    if (field.oneof) {
      const o = (msg as unknown as Record<string, { case?: string; value?: unknown }>)[field.oneof.localName];
      if (o?.case !== field.localName) continue;
      value = o.value;
    } else {
      const explicitPresence = field.fieldKind === "message" || (field.fieldKind === "scalar" && field.proto.proto3Optional);
      if (explicitPresence && !isFieldSet(msg, field)) {
        if (fieldOptionsOf(field).nullable) out[field.name] = null;
        continue;
      }
      value = (msg as unknown as Record<string, unknown>)[field.localName];
    }
    const json = fieldToJson(field, value);
    if (fieldOptionsOf(field).inline && json && typeof json === "object" && !Array.isArray(json)) {
      Object.assign(out, json);
    } else {
      out[field.name] = json;
    }
  }
  return out;
}
