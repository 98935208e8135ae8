// How deep the free-form JSON of a request may nest (a result, its metrics, a job's params, a heartbeat's
// telemetry), on every wire: a JSON body is measured as text before it is parsed (src/http/json-depth.ts);
// a message in the binary codec is read with protobuf-es's recursion limit raised to what that depth needs
// (bounded: each level is a few stack frames) and then held to the depth its JSON form would nest.
import { fromBinary, type DescMessage, type Message } from "@bufbuild/protobuf";
import { binaryRecursionPassed } from "./list-bounds.js";

/**
 * Deepest nesting accepted in a request body (/api and /v1) and in a /v1 endpoint's chunk, its own object
 * counted, and in the JSON form of a binary message. No request's shape comes near it: a chunk nests 9 deep
 * at most (choices, logprobs, content, top_logprobs, bytes), and a chat request's deepest part is a tool's
 * JSON schema. The free-form JSON of a request (a job's params, a result's output and metrics, telemetry)
 * may use all of it.
 */
export const MAX_JSON_DEPTH = 100;

/**
 * The recursion limit protobuf-es reads a request with, in JSON and in binary. Its own default, 100, counts
 * each message and each google.protobuf.Value once more (a level of free-form JSON is a Value and a Struct or
 * ListValue), so it refused free-form JSON about half as deep as MAX_JSON_DEPTH in binary, a few levels short
 * of it in JSON. Twice that bounds the count; the stack it allows is a few hundred frames.
 */
export const PROTO_RECURSION_LIMIT = 2 * MAX_JSON_DEPTH + 2;

/** Whether `value` nests objects and arrays more than `max` deep (a scalar is 0 deep, `{}` 1). Iterative: any depth is safe to ask about. */
export function jsonDepthExceeds(value: unknown, max = MAX_JSON_DEPTH): boolean {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (!v || typeof v !== "object") continue;
    if (depth > max) return true;
    for (const x of Array.isArray(v) ? v : Object.values(v)) if (x && typeof x === "object") stack.push([x, depth + 1]);
  }
  return false;
}

/** The refusal of a body (`subject`) nested past MAX_JSON_DEPTH, naming the top-level member that does (when known). */
export function tooDeepMessage(subject: string, member: string | undefined): string {
  const named = member === undefined ? "" : `; field '${member}' nests deeper`;
  return `${subject} must not nest objects and arrays more than ${MAX_JSON_DEPTH} levels deep${named}`;
}

/** A binary request message whose JSON form would nest past MAX_JSON_DEPTH (its message: tooDeepMessage's). */
export class NestedTooDeep extends Error {}

const VALUE = "google.protobuf.Value";
const STRUCT = "google.protobuf.Struct";
const LIST_VALUE = "google.protobuf.ListValue";
/** Well-known types whose JSON form is a string or a scalar (the wrappers, times, field masks). */
const SCALAR_JSON = /^google\.protobuf\.(?:Timestamp|Duration|FieldMask|(?:Double|Float|Int64|UInt64|Int32|UInt32|Bool|String|Bytes)Value)$/;

/** A field's message: a Struct in a field (not in a Value) is held by protobuf-es as its JSON. */
const child = (desc: DescMessage, msg: unknown, level: number, member: string | undefined): Node =>
  desc.typeName === STRUCT ? { json: msg, level, member } : { desc, msg, level, member };

type Node = { desc: DescMessage; msg: unknown; level: number; member: string | undefined } | { json: unknown; level: number; member: string | undefined };

/**
 * The top-level field of a decoded message whose proto3 JSON form nests objects and arrays more than `max`
 * deep, the message's own object counted (as a JSON body is measured); undefined when none does. Iterative.
 */
export function messageDepthExceeds(desc: DescMessage, message: Message, max = MAX_JSON_DEPTH): { member: string | undefined } | undefined {
  const stack: Node[] = [{ desc, msg: message, level: 1, member: undefined }];
  while (stack.length > 0) {
    const node = stack.pop()!;
    const { level, member } = node;
    if (!("desc" in node)) {
      const v = node.json;
      if (!v || typeof v !== "object") continue;
      if (level > max) return { member };
      for (const x of Array.isArray(v) ? v : Object.values(v)) if (x && typeof x === "object") stack.push({ json: x, level: level + 1, member });
      continue;
    }
    const { desc: d, msg } = node;
    if (!msg || typeof msg !== "object" || SCALAR_JSON.test(d.typeName)) continue;
    if (d.typeName === VALUE) {
      // No level of its own: its struct or list is the level.
      const kind = (msg as { kind?: { case?: string; value?: unknown } }).kind;
      if (kind?.case === "structValue" || kind?.case === "listValue") {
        stack.push({ desc: d.fields.find((f) => f.localName === kind.case)!.message!, msg: kind.value, level, member });
      }
      continue;
    }
    if (level > max) return { member };
    if (d.typeName === STRUCT || d.typeName === LIST_VALUE) {
      const valueDesc = d.fields[0]!.message!;
      const values = d.typeName === STRUCT ? Object.values((msg as { fields?: Record<string, unknown> }).fields ?? {}) : ((msg as { values?: unknown[] }).values ?? []);
      for (const v of values) stack.push({ desc: valueDesc, msg: v, level: level + 1, member });
      continue;
    }
    const m = msg as Record<string, unknown>;
    for (const f of d.fields) {
      const name = level === 1 ? f.jsonName : member;
      if (f.fieldKind === "scalar" || f.fieldKind === "enum") continue;
      if (f.fieldKind === "message") {
        const v = f.oneof ? (m[f.oneof.localName] as { case?: string; value?: unknown } | undefined) : undefined;
        const value = f.oneof ? (v?.case === f.localName ? v.value : undefined) : m[f.localName];
        if (value !== undefined) stack.push(child(f.message, value, level + 1, name));
        continue;
      }
      // A list (an array) or a map (an object) with anything in it.
      const items = f.fieldKind === "list" ? ((m[f.localName] as unknown[] | undefined) ?? []) : Object.values((m[f.localName] as object | undefined) ?? {});
      if (items.length === 0) continue;
      if (level + 1 > max) return { member: name };
      const itemDesc = f.fieldKind === "list" ? (f.listKind === "message" ? f.message : undefined) : f.mapKind === "message" ? f.message : undefined;
      if (itemDesc) for (const item of items) stack.push(child(itemDesc, item, level + 2, name));
    }
  }
  return undefined;
}

const RECURSION_REFUSED = /maximum recursion depth/;

/**
 * A request message in the binary codec, read as deep as MAX_JSON_DEPTH allows its JSON form and no deeper:
 * NestedTooDeep, naming the top-level field, for one nested past it (however deep: one past what protobuf-es
 * reads is refused before it is read, by checkBinaryRequest, as a unary call's is); protobuf-es's own error
 * for bytes that are not the message. One with a list past its bound is refused before it is read
 * (ListTooLong, shared/list-bounds.ts), in the same walk of its bytes.
 */
export function readBinaryRequest(desc: DescMessage, bytes: Uint8Array): Message {
  let message: Message;
  try {
    checkBinaryRequest(desc, bytes);
    message = fromBinary(desc, bytes, { recursionLimit: PROTO_RECURSION_LIMIT });
  } catch (err) {
    // Past the limit in bytes the walk left to protobuf-es (a field of a type with no list running past
    // the message holding it): no field to name.
    if (err instanceof Error && RECURSION_REFUSED.test(err.message)) throw new NestedTooDeep(tooDeepMessage("request body", undefined));
    throw err;
  }
  checkMessageDepth(desc, message);
  return message;
}

/**
 * A request message's bytes in the binary codec, before protobuf-es reads them: ListTooLong and MalformedMessage as
 * checkBinaryLists throws them, and NestedTooDeep, naming the top-level field, for one nested past what protobuf-es
 * reads (PROTO_RECURSION_LIMIT). What protobuf-es then reads is held to MAX_JSON_DEPTH by checkMessageDepth.
 */
export function checkBinaryRequest(desc: DescMessage, bytes: Uint8Array): void {
  const over = binaryRecursionPassed(desc, bytes, PROTO_RECURSION_LIMIT);
  if (over) throw new NestedTooDeep(tooDeepMessage("request body", over.member));
}

/** Throws NestedTooDeep for a decoded message whose JSON form nests past MAX_JSON_DEPTH (messageDepthExceeds). */
export function checkMessageDepth(desc: DescMessage, message: Message): void {
  const over = messageDepthExceeds(desc, message);
  if (over) throw new NestedTooDeep(tooDeepMessage("request body", over.member));
}
