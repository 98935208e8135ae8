// How many items the lists (and maps) of a request message may hold, checked before the message is read.
// protobuf-es makes an object for each item it reads (a log line's google.protobuf.Value: some 200 bytes of
// heap and a few hundred nanoseconds), and an item can be two bytes on the wire: a daemon stream's 16 MiB
// message of empty log lines held the process for seconds and took gigabytes before the domain counted them.
// So the bytes of a request whose type holds a list are walked first, allocating nothing, and one with a list
// past its bound is refused. Free-form JSON (google.protobuf.Struct, ListValue) is bounded by its size alone.
import { getOption, ScalarType, type DescField, type DescMessage, type JsonValue } from "@bufbuild/protobuf";
import { max_items } from "../../gen/svc/v1/options_pb.js";

/** The most items any list or map of a request message holds; a field's (svc.v1.max_items) option may set fewer. */
export const MAX_LIST_ITEMS = 4096;

/** A request with a list past its bound (its message: tooManyItemsMessage's). */
export class ListTooLong extends Error {}

/** `path`: the field's proto name, after the names of the fields holding it (`logs.logs` on a daemon's stream). */
export const tooManyItemsMessage = (path: string, max: number) => `${path} must hold at most ${max} items`;

/** A message's bytes that protobuf-es would read past the part holding them (it does not check), or past the end. */
export class MalformedMessage extends Error {}

/** The bound of a field: of a list or map of our messages (free-form JSON has none); 0 for any other field. */
export function listBoundOf(f: DescField): number {
  if ((f.fieldKind !== "list" && f.fieldKind !== "map") || f.parent.typeName.startsWith("google.protobuf.")) return 0;
  return getOption(f, max_items) || MAX_LIST_ITEMS;
}

interface FieldPlan {
  field: DescField;
  /** The message it holds (a message field, a list's or a map's values). */
  child: Plan | undefined;
  max: number;
}

interface Plan {
  desc: DescMessage;
  fields: Map<number, FieldPlan>;
  /** The same, by field number, for the numbers below 64 (a lookup per field read). */
  low: (FieldPlan | undefined)[];
  /** A list with a bound is in it or in a message it holds. */
  reaches: boolean;
}

const plans = new WeakMap<DescMessage, Plan>();

const childOf = (f: DescField): DescMessage | undefined =>
  f.fieldKind === "message" ? f.message : f.fieldKind === "list" && f.listKind === "message" ? f.message : f.fieldKind === "map" && f.mapKind === "message" ? f.message : undefined;

function planOf(root: DescMessage): Plan {
  const known = plans.get(root);
  if (known) return known;
  // Every message type the root reaches that has no plan yet: planned together, cycles included.
  const made = new Map<DescMessage, Plan>();
  const todo = [root];
  while (todo.length > 0) {
    const desc = todo.pop()!;
    if (made.has(desc) || plans.has(desc)) continue;
    for (const f of desc.fields) {
      // Group encoding is not read below (proto3 has none).
      if ((f.fieldKind === "message" || (f.fieldKind === "list" && f.listKind === "message")) && f.delimitedEncoding) throw new Error(`${desc.typeName}.${f.name}: group-encoded fields are not walked`);
    }
    made.set(desc, { desc, fields: new Map(), low: new Array<FieldPlan | undefined>(64).fill(undefined), reaches: desc.fields.some((f) => listBoundOf(f) > 0) });
    for (const f of desc.fields) {
      const c = childOf(f);
      if (c) todo.push(c);
    }
  }
  const plan = (d: DescMessage) => made.get(d) ?? plans.get(d)!;
  for (const p of made.values()) {
    for (const f of p.desc.fields) {
      const c = childOf(f);
      const fp = { field: f, child: c && plan(c), max: listBoundOf(f) };
      p.fields.set(f.number, fp);
      if (f.number < 64) p.low[f.number] = fp;
    }
  }
  for (let changed = true; changed; ) {
    changed = false;
    for (const p of made.values()) {
      if (!p.reaches && [...p.fields.values()].some((f) => f.child?.reaches)) changed = p.reaches = true;
    }
  }
  for (const [d, p] of made) plans.set(d, p);
  return plan(root);
}

/** Items counted in one message (of the fields that appear in it again merged, as protobuf-es merges them). */
class Counts {
  private items: Map<FieldPlan, number> | undefined;
  private children: Map<FieldPlan, Counts> | undefined;

  add(f: FieldPlan, path: string): void {
    const items = (this.items ??= new Map());
    const n = (items.get(f) ?? 0) + 1;
    if (f.max > 0 && n > f.max) throw new ListTooLong(tooManyItemsMessage(join(path, f.field.name), f.max));
    items.set(f, n);
  }

  child(f: FieldPlan): Counts {
    const children = (this.children ??= new Map());
    let c = children.get(f);
    if (!c) children.set(f, (c = new Counts()));
    return c;
  }
}

const join = (path: string, name: string) => (path ? `${path}.${name}` : name);

/** Thrown where protobuf-es itself stops reading with an error (an illegal tag or varint): it is left to say so. */
const PROTOBUF_REFUSES = Symbol("protobuf-es refuses the message here");

/** Thrown where protobuf-es stops reading at its recursion limit: `field`, the top-level field being read then (undefined: an unknown one). */
class TooDeep {
  constructor(readonly field: DescField | undefined) {}
}

/**
 * Reads a message's bytes as protobuf-es's fromBinary reads them (a known field by its type whatever its
 * wire type says, an unknown one by its wire type), keeping nothing but counts. It differs in one thing:
 * protobuf-es does not check that a field ends within the message holding it, and goes on reading from
 * wherever it ended; here that is refused, as no encoder writes it and walking it alike would take a
 * reading of every part to know where protobuf-es would be.
 */
class Walker {
  pos = 0;
  no = 0;
  wt = 0;
  /** The top-level field being read. */
  top: DescField | undefined;

  constructor(
    readonly buf: Uint8Array,
    readonly recursionLimit: number,
  ) {}

  /** A part that would end at `to`, past `end`, the end of the part holding it. */
  private past(to: number, end: number): MalformedMessage {
    return new MalformedMessage(to > this.buf.length || end === this.buf.length ? "premature EOF" : "a field runs past the end of the message holding it");
  }

  private byte(end: number): number {
    if (this.pos >= end) throw this.past(this.pos + 1, end);
    return this.buf[this.pos++]!;
  }

  /** A varint as protobuf-es's uint32() reads it: its low 32 bits; ten bytes at most. */
  private uint32(end: number): number {
    let n = 0;
    for (let i = 0; i < 10; i++) {
      const b = this.byte(end);
      if (i < 4) n |= (b & 0x7f) << (7 * i);
      else if (i === 4) n |= (b & 0x0f) << 28;
      if (b < 0x80) return n >>> 0;
    }
    throw PROTOBUF_REFUSES; // invalid varint
  }

  private skip(n: number, end: number): void {
    if (this.pos + n > end) throw this.past(this.pos + n, end);
    this.pos += n;
  }

  /** The end of a length-delimited part that starts here, within `end`. */
  private part(end: number): number {
    const len = this.uint32(end);
    if (this.pos + len > end) throw this.past(this.pos + len, end);
    return this.pos + len;
  }

  private tag(end: number): void {
    const start = this.pos;
    const t = this.uint32(end);
    const read = this.pos - start;
    if (read > 5 || (read === 5 && this.buf[this.pos - 1]! > 0x0f)) throw PROTOBUF_REFUSES;
    this.no = t >>> 3;
    this.wt = t & 7;
    if (this.no <= 0 || this.wt > 5) throw PROTOBUF_REFUSES;
  }

  private scalar(type: ScalarType, end: number): void {
    switch (type) {
      case ScalarType.STRING:
      case ScalarType.BYTES:
        this.skip(this.uint32(end), end);
        return;
      case ScalarType.DOUBLE:
      case ScalarType.FIXED64:
      case ScalarType.SFIXED64:
        this.skip(8, end);
        return;
      case ScalarType.FLOAT:
      case ScalarType.FIXED32:
      case ScalarType.SFIXED32:
        this.skip(4, end);
        return;
      default:
        this.uint32(end); // a varint, 64-bit ones too: ten bytes at most
    }
  }

  /** A length-delimited message field's message (protobuf-es: readMessageField, not delimited). */
  private sub(plan: Plan, end: number, depth: number, counts: Counts | undefined, path: string): void {
    this.message(plan, this.part(end), depth + 1, counts, path);
  }

  /** protobuf-es: readMessage, the message's fields up to `end`; `depth` the message's own. */
  message(plan: Plan, end: number, depth: number, counts: Counts | undefined, path: string): void {
    if (depth > this.recursionLimit) throw new TooDeep(this.top);
    while (this.pos < end) {
      this.tag(end);
      const f = this.no < 64 ? plan.low[this.no] : plan.fields.get(this.no);
      if (depth === 1) this.top = f?.field;
      if (!f) {
        this.unknown(this.wt, this.no, this.recursionLimit - depth, end);
        continue;
      }
      const field = f.field;
      // Counted in a message that reaches a bound only (else nothing in it has one).
      const within = counts && f.child?.reaches ? join(path, field.name) : "";
      switch (field.fieldKind) {
        case "scalar":
          this.scalar(field.scalar, end);
          break;
        case "enum":
          this.uint32(end);
          break;
        case "message":
          this.sub(f.child!, end, depth, counts && f.child!.reaches ? counts.child(f) : undefined, within);
          break;
        case "list":
          if (field.listKind === "message") {
            counts?.add(f, path);
            this.sub(f.child!, end, depth, counts && f.child!.reaches ? new Counts() : undefined, within);
          } else {
            const type = field.scalar ?? ScalarType.INT32;
            if (this.wt === 2 && type !== ScalarType.STRING && type !== ScalarType.BYTES) {
              // Packed: every item in one part.
              const packedEnd = this.part(end);
              while (this.pos < packedEnd) {
                counts?.add(f, path);
                this.scalar(type, packedEnd);
              }
            } else {
              counts?.add(f, path);
              this.scalar(type, end);
            }
          }
          break;
        case "map":
          counts?.add(f, path);
          this.entry(f, end, depth, within);
          break;
      }
    }
  }

  /** protobuf-es: readMapEntry (a field number other than the key's and the value's reads nothing more). */
  private entry(f: FieldPlan, end: number, depth: number, path: string): void {
    const field = f.field as DescField & { fieldKind: "map" };
    const entryEnd = this.part(end);
    while (this.pos < entryEnd) {
      this.tag(entryEnd);
      if (this.no === 1) {
        this.scalar(field.mapKey, entryEnd);
      } else if (this.no === 2) {
        if (field.mapKind === "message") this.sub(f.child!, entryEnd, depth, f.child!.reaches ? new Counts() : undefined, path);
        else if (field.mapKind === "enum") this.uint32(entryEnd);
        else this.scalar(field.scalar, entryEnd);
      }
    }
  }

  /** protobuf-es: BinaryReader.skip, with `room` the levels of groups it allows. */
  private unknown(wt: number, no: number, room: number, end: number): void {
    switch (wt) {
      case 0:
        while (this.byte(end) & 0x80);
        return;
      case 1:
        this.skip(8, end);
        return;
      case 2:
        this.skip(this.uint32(end), end);
        return;
      case 3:
        if (room <= 0) throw new TooDeep(this.top);
        for (;;) {
          this.tag(end);
          if (this.wt === 4) {
            if (this.no !== no) throw PROTOBUF_REFUSES;
            return;
          }
          this.unknown(this.wt, this.no, room - 1, end);
        }
      default:
        throw PROTOBUF_REFUSES; // an end-group outside a group
    }
  }
}

/**
 * Refuses a request message in the binary codec that holds a list or map past its bound (ListTooLong) or
 * a field that runs past the message holding it (MalformedMessage), walking its bytes without reading them
 * into a message: for a request type with no list, nothing is done. Bytes that protobuf-es itself refuses
 * (read with `recursionLimit`) are left to it, as is everything after them.
 */
export function checkBinaryLists(desc: DescMessage, bytes: Uint8Array, recursionLimit: number): void {
  const plan = planOf(desc);
  if (plan.reaches) walk(plan, bytes, recursionLimit);
}

/**
 * checkBinaryLists, and where protobuf-es, reading the bytes with `recursionLimit`, would refuse them as nested
 * too deep: the top-level field it was reading then, by its JSON name (undefined: an unknown field). The bytes
 * of a request type with no list are walked for that alone: what else is wrong with them is left to protobuf-es.
 */
export function binaryRecursionPassed(desc: DescMessage, bytes: Uint8Array, recursionLimit: number): { member: string | undefined } | undefined {
  const plan = planOf(desc);
  try {
    const over = walk(plan, bytes, recursionLimit);
    return over && { member: over.field?.jsonName };
  } catch (err) {
    if (err instanceof MalformedMessage && !plan.reaches) return undefined;
    throw err;
  }
}

/** Walks a message's bytes (its lists counted where it has any): where protobuf-es passes its recursion limit, if it does before it stops otherwise. */
function walk(plan: Plan, bytes: Uint8Array, recursionLimit: number): TooDeep | undefined {
  try {
    new Walker(bytes, recursionLimit).message(plan, bytes.length, 1, plan.reaches ? new Counts() : undefined, "");
  } catch (err) {
    if (err instanceof TooDeep) return err;
    if (err !== PROTOBUF_REFUSES) throw err;
  }
  return undefined;
}

/**
 * The same bound on a request's JSON form, parsed (its members by proto or JSON name, as protobuf-es reads
 * them): throws ListTooLong for a list or map past it.
 */
export function checkJsonLists(desc: DescMessage, json: JsonValue | undefined): void {
  const plan = planOf(desc);
  if (plan.reaches) jsonMessage(plan, json, "");
}

function jsonMessage(plan: Plan, json: JsonValue | undefined, path: string): void {
  if (!json || typeof json !== "object" || Array.isArray(json)) return;
  for (const f of plan.fields.values()) {
    if (f.max === 0 && !f.child?.reaches) continue;
    const field = f.field;
    const v = json[field.jsonName] ?? json[field.name];
    if (v === undefined || v === null) continue;
    const at = join(path, field.name);
    const items = Array.isArray(v) ? v : typeof v === "object" && field.fieldKind === "map" ? Object.values(v) : undefined;
    if (field.fieldKind === "list" || field.fieldKind === "map") {
      if (items && f.max > 0 && items.length > f.max) throw new ListTooLong(tooManyItemsMessage(at, f.max));
      if (items && f.child?.reaches) for (const item of items) jsonMessage(f.child, item, at);
    } else if (f.child?.reaches) {
      jsonMessage(f.child, v, at);
    }
  }
}

/**
 * What a JSON text meter follows of a request type's JSON form: the members (by proto and JSON name) that hold
 * a bounded list or map or lead to one, and the bounds.
 */
export type JsonListNode =
  | { kind: "message"; members: Map<string, { name: string; node: JsonListNode }> }
  | { kind: "list" | "map"; max: number; element: JsonListNode | undefined };

const jsonNodes = new WeakMap<Plan, JsonListNode & { kind: "message" }>();

function jsonMessageNode(plan: Plan): JsonListNode & { kind: "message" } {
  let node = jsonNodes.get(plan);
  if (node) return node;
  node = { kind: "message", members: new Map() };
  jsonNodes.set(plan, node);
  for (const f of plan.fields.values()) {
    const field = f.field;
    if (f.max === 0 && !f.child?.reaches) continue;
    const element = f.child?.reaches ? jsonMessageNode(f.child) : undefined;
    const member = {
      name: field.name,
      node: field.fieldKind === "list" || field.fieldKind === "map" ? { kind: field.fieldKind, max: f.max, element } : element!,
    };
    node.members.set(field.jsonName, member);
    node.members.set(field.name, member);
  }
  return node;
}

/** A request type's JSON form as a text meter follows it; undefined when it holds no bounded list. */
export function jsonListTree(desc: DescMessage): JsonListNode | undefined {
  const plan = planOf(desc);
  return plan.reaches ? jsonMessageNode(plan) : undefined;
}
