// Message <-> documented JSON, guided by the descriptors and our field options:
// proto field names, 64-bit integers as JSON numbers, documented nulls,
// inlined members, and the status-code field left out. Message -> JSON is
// src/shared/message-json.ts, which the CLI's --json writes with too.
import { create, fromJson, type DescField, type DescMessage, type JsonObject, type JsonValue, type Message, ScalarType } from "@bufbuild/protobuf";
import { badRequest } from "../errors.js";
import { fieldOptionsOf } from "../shared/message-json.js";
import { unstorableIn, withoutNul } from "../shared/nul-text.js";
import { checkJsonLists, ListTooLong } from "../shared/list-bounds.js";
import { PROTO_RECURSION_LIMIT } from "./json-depth.js";
import { unstorableError } from "./nul.js";

export { fieldOptionsOf, messageToJson, type FieldOptions } from "../shared/message-json.js";

/** The HTTP status a response message asks for, if it carries one. */
export function responseStatus(desc: DescMessage, msg: Message): number | undefined {
  const f = desc.fields.find((x) => fieldOptionsOf(x).httpStatus);
  const v = f ? Number((msg as unknown as Record<string, unknown>)[f.localName]) : 0;
  return v > 0 ? v : undefined;
}

const INTEGER_SCALARS = new Set([
  ScalarType.INT32, ScalarType.INT64, ScalarType.UINT32, ScalarType.UINT64, ScalarType.SINT32,
  ScalarType.SINT64, ScalarType.FIXED32, ScalarType.FIXED64, ScalarType.SFIXED32, ScalarType.SFIXED64,
]);

/** Path and query values arrive as text; give them the JSON type their field wants. */
function coerceText(field: DescField, text: string): JsonValue {
  if (field.fieldKind === "scalar" || (field.fieldKind === "list" && field.listKind === "scalar")) {
    const t = field.scalar!;
    if (t === ScalarType.BOOL) {
      if (text === "true" || text === "1") return true;
      if (text === "false" || text === "0") return false;
      throw badRequest(`${field.name} must be true or false`);
    }
    if (INTEGER_SCALARS.has(t) || t === ScalarType.DOUBLE || t === ScalarType.FLOAT) {
      const n = Number(text);
      if (text.trim() === "" || !Number.isFinite(n)) throw badRequest(`${field.name} must be a number`);
      if (INTEGER_SCALARS.has(t) && !Number.isInteger(n)) throw badRequest(`${field.name} must be an integer`);
      return n;
    }
  }
  return text;
}

export interface RestInput {
  pathParams: Record<string, string>;
  query: URLSearchParams;
  headers: Record<string, string | string[] | undefined>;
  /** Parsed JSON body, or undefined when there was none. */
  body: JsonValue | undefined;
  rawBody: Buffer;
}

const INVALID_FIELD = /field ([\w.]+)/;
// The body was measured before it was parsed (json-depth.ts): free-form JSON may nest as deep as it allows.
const JSON_READ = { ignoreUnknownFields: true, recursionLimit: PROTO_RECURSION_LIMIT };

/**
 * Builds the request message: body members, then query and path parameters
 * (path wins), then header- and raw-body-bound fields. Unknown members are ignored.
 */
export function requestFromRest<D extends DescMessage>(desc: D, input: RestInput): Message {
  const json: JsonObject = {};
  const { byName, wholeBodyField, machineText } = shapeOf(desc);
  // A Struct is held as plain JSON by protobuf-es: the parsed body is assigned
  // as is after fromJson instead of being converted value by value.
  const wholeBodyStruct = wholeBodyField?.fieldKind === "message" && wholeBodyField.message.typeName === "google.protobuf.Struct";
  if (wholeBodyField) {
    if (input.body !== undefined && (typeof input.body !== "object" || input.body === null || Array.isArray(input.body))) {
      throw badRequest("request body must be a JSON object");
    }
    if (!wholeBodyStruct) json[wholeBodyField.jsonName] = (input.body as JsonObject) ?? {};
  } else if (input.body !== undefined && input.body !== null) {
    if (typeof input.body !== "object" || Array.isArray(input.body)) throw badRequest("request body must be a JSON object");
    for (const [k, v] of Object.entries(input.body)) {
      // JSON null means "not given" for every field.
      if (v !== null && byName.has(k)) json[byName.get(k)!.jsonName] = v;
    }
  }
  for (const [k, v] of input.query) {
    const f = byName.get(k);
    if (!f || fieldOptionsOf(f).rawBody || fieldOptionsOf(f).wholeBody) continue;
    if (f.fieldKind === "list") {
      const given = json[f.jsonName];
      // A body that sent a non-array here keeps it, and the message conversion answers 400 for it.
      if (given === undefined) json[f.jsonName] = [coerceText(f, v)];
      else if (Array.isArray(given)) given.push(coerceText(f, v));
    } else if (!(f.jsonName in json)) {
      json[f.jsonName] = coerceText(f, v);
    }
  }
  for (const [k, v] of Object.entries(input.pathParams)) {
    const f = byName.get(k);
    if (f) json[f.jsonName] = coerceText(f, v);
  }
  for (const f of desc.fields) {
    const header = fieldOptionsOf(f).fromHeader;
    if (header) {
      const v = input.headers[header.toLowerCase()];
      if (typeof v === "string") json[f.jsonName] = v;
    }
  }
  // A machine's text is made storable, not refused (src/shared/nul-text.ts): a lone surrogate in a
  // string field would fail the conversion ("invalid UTF8"), and the daemon's report with it.
  for (const f of machineText) if (f.jsonName in json) json[f.jsonName] = withoutNul(json[f.jsonName]);
  // Counted before protobuf-es reads the lists (an object per item, shared/list-bounds.ts).
  try {
    checkJsonLists(desc, json);
  } catch (err) {
    throw err instanceof ListTooLong ? badRequest(err.message) : err;
  }
  let msg: Message;
  try {
    msg = fromJson(desc, json, JSON_READ);
  } catch (err) {
    const text = err instanceof Error ? err.message : String(err);
    const m = INVALID_FIELD.exec(text);
    const name = m ? m[1].split(".").pop() : undefined;
    // Nested decoders (Struct, Value) name no field: find the top-level member that fails alone.
    const field =
      (name ? desc.fields.find((f) => f.localName === name || f.jsonName === name || f.name === name) : undefined) ??
      desc.fields.find((f) => f.jsonName in json && !decodes(desc, { [f.jsonName]: json[f.jsonName] }));
    // A string field refuses a lone surrogate: said as a NUL's refusal is (src/http/nul.ts).
    const given = field ? json[field.jsonName] : undefined;
    const texts = Array.isArray(given) ? given : [given];
    for (const t of texts) {
      const holds = typeof t === "string" ? unstorableIn(t) : undefined;
      if (holds) throw unstorableError({ field: field!.name, holds });
    }
    // A member of a typed message field (readiness `checks.cuda`) is named as such, with the type it takes.
    const member = field && m ? memberOf(field, m[1]) : undefined;
    if (member) throw badRequest(`invalid value for field '${member.path}': ${describeExpected(member.field)}`);
    throw badRequest(field ? `invalid value for field '${field.name}': ${describeExpected(field)}` : `invalid request: ${text}`);
  }
  for (const f of desc.fields) {
    if (fieldOptionsOf(f).rawBody) (msg as unknown as Record<string, unknown>)[f.localName] = new Uint8Array(input.rawBody);
  }
  if (wholeBodyStruct) (msg as unknown as Record<string, unknown>)[wholeBodyField!.localName] = (input.body as JsonObject) ?? {};
  return msg;
}

interface MessageShape {
  byName: Map<string, DescField>;
  wholeBodyField: DescField | undefined;
  /** (svc.v1.machine_output) string fields and lists of strings. */
  machineText: DescField[];
}
const shapes = new WeakMap<DescMessage, MessageShape>();

/** Field lookups of a request message, built once per descriptor. */
function shapeOf(desc: DescMessage): MessageShape {
  let shape = shapes.get(desc);
  if (!shape) {
    shape = {
      byName: new Map(desc.fields.map((f) => [f.name, f] as const)),
      wholeBodyField: desc.fields.find((f) => fieldOptionsOf(f).wholeBody),
      machineText: desc.fields.filter(
        (f) => fieldOptionsOf(f).machineOutput && (f.fieldKind === "scalar" || (f.fieldKind === "list" && f.listKind === "scalar")) && f.scalar === ScalarType.STRING,
      ),
    };
    shapes.set(desc, shape);
  }
  return shape;
}

function decodes(desc: DescMessage, json: JsonObject): boolean {
  try {
    fromJson(desc, json, JSON_READ);
    return true;
  } catch {
    return false;
  }
}

/**
 * The member a decoding error names (`svc.v1.ReadinessChecks.cuda`) inside the message of a top-level
 * field, as a dotted path from that field (`checks.cuda`), or undefined when the field's message is not
 * the one named (a Struct or Value member, a field of the request itself).
 */
function memberOf(top: DescField, qualified: string): { path: string; field: DescField } | undefined {
  const dot = qualified.lastIndexOf(".");
  const typeName = qualified.slice(0, dot);
  const name = qualified.slice(dot + 1);
  const find = (f: DescField, path: string, depth: number): { path: string; field: DescField } | undefined => {
    const msg = f.message;
    if (!msg || msg.typeName.startsWith("google.protobuf.") || depth > 8) return undefined;
    if (msg.typeName === typeName) {
      const member = msg.fields.find((x) => x.name === name);
      return member ? { path: `${path}.${member.name}`, field: member } : undefined;
    }
    for (const sub of msg.fields) {
      const found = find(sub, `${path}.${sub.name}`, depth + 1);
      if (found) return found;
    }
    return undefined;
  };
  return dot > 0 ? find(top, top.name, 0) : undefined;
}

function describeExpected(field: DescField): string {
  switch (field.fieldKind) {
    case "scalar":
      if (field.scalar === ScalarType.STRING) return "expected a string";
      if (field.scalar === ScalarType.BOOL) return "expected a boolean";
      if (INTEGER_SCALARS.has(field.scalar)) return "expected an integer";
      return "expected a number";
    case "list":
      return "expected an array";
    case "message":
      return field.message.typeName === "google.protobuf.Value" ? "unexpected value" : "expected a JSON object";
    default:
      return "unexpected value";
  }
}

export function emptyMessage<D extends DescMessage>(desc: D): Message {
  return create(desc);
}
