// google.protobuf.Struct in its binary form straight from plain JSON. protobuf-es
// encodes a Struct field (held as a JsonObject) by building a Value message per
// member and walking them by reflection: for a pushed job, whose task spec is a
// Struct, that was most of the message's encoding time. Here one pass sizes
// every length-delimited part and a second writes them into one buffer. The
// bytes are those a Struct message encodes to; any protobuf decoder reads them.
import type { DescField, JsonObject, JsonValue, Message } from "@bufbuild/protobuf";
import { WireType } from "@bufbuild/protobuf/wire";
import { MAX_JSON_DEPTH } from "./json-nesting.js";

// Tags (field number << 3 | wire type) of google/protobuf/struct.proto.
const STRUCT_FIELDS = 0x0a; // Struct.fields (map entry), length-delimited
const ENTRY_KEY = 0x0a;
const ENTRY_VALUE = 0x12;
const VALUE_NULL = 0x08; // varint
const VALUE_NUMBER = 0x11; // fixed64
const VALUE_STRING = 0x1a;
const VALUE_BOOL = 0x20; // varint
const VALUE_STRUCT = 0x2a;
const VALUE_LIST = 0x32;
const LIST_VALUES = 0x0a;

/** Bytes of a varint of n (n < 2^35). */
export const varintSize = (n: number) => (n < 0x80 ? 1 : n < 0x4000 ? 2 : n < 0x200000 ? 3 : n < 0x10000000 ? 4 : 5);
/** Size of a length-delimited part (tag, length, body) whose body is n bytes. */
export const partSize = (n: number) => 1 + varintSize(n) + n;

/** Writes n (n < 2^32) as a varint at pos; returns the position after it. */
export function writeVarint(buf: Buffer, pos: number, n: number): number {
  while (n >= 0x80) {
    buf[pos++] = (n & 0x7f) | 0x80;
    n >>>= 7;
  }
  buf[pos++] = n;
  return pos;
}

// Pass 1: the body size of every length-delimited part, in the order pass 2 writes them.

function sizeStruct(obj: JsonObject, sizes: number[]): number {
  let total = 0;
  for (const key in obj) {
    const v = obj[key];
    if (v === undefined) continue; // as JSON.stringify: an undefined member is absent
    const entryAt = sizes.push(0) - 1;
    const keyBytes = Buffer.byteLength(key);
    sizes.push(keyBytes);
    const valueAt = sizes.push(0) - 1;
    const valueBytes = sizeValue(v, sizes);
    sizes[valueAt] = valueBytes;
    sizes[entryAt] = partSize(keyBytes) + partSize(valueBytes);
    total += partSize(sizes[entryAt]);
  }
  return total;
}

function sizeValue(v: JsonValue, sizes: number[]): number {
  if (v === null || typeof v === "boolean") return 2;
  if (typeof v === "number") return 9;
  if (typeof v === "string") {
    const n = Buffer.byteLength(v);
    sizes.push(n);
    return partSize(n);
  }
  const at = sizes.push(0) - 1;
  let body = 0;
  if (Array.isArray(v)) {
    for (const item of v) {
      const itemAt = sizes.push(0) - 1;
      sizes[itemAt] = sizeValue(item, sizes);
      body += partSize(sizes[itemAt]);
    }
  } else {
    body = sizeStruct(v, sizes);
  }
  sizes[at] = body;
  return partSize(body);
}

// Pass 2.

class Out {
  pos = 0;
  next = 0;
  constructor(
    readonly buf: Buffer,
    readonly sizes: number[],
  ) {}

  varint(n: number) {
    this.pos = writeVarint(this.buf, this.pos, n);
  }

  /** A tag and the next length from pass 1; returns the length. */
  part(tag: number): number {
    const n = this.sizes[this.next++];
    this.buf[this.pos++] = tag;
    this.varint(n);
    return n;
  }

  string(tag: number, s: string) {
    const n = this.part(tag);
    this.pos += this.buf.write(s, this.pos, n, "utf8");
  }
}

function writeStruct(o: Out, obj: JsonObject): void {
  for (const key in obj) {
    const v = obj[key];
    if (v === undefined) continue;
    o.part(STRUCT_FIELDS);
    o.string(ENTRY_KEY, key);
    o.part(ENTRY_VALUE);
    writeValue(o, v);
  }
}

function writeValue(o: Out, v: JsonValue): void {
  if (v === null) {
    o.buf[o.pos++] = VALUE_NULL;
    o.buf[o.pos++] = 0;
  } else if (typeof v === "boolean") {
    o.buf[o.pos++] = VALUE_BOOL;
    o.buf[o.pos++] = v ? 1 : 0;
  } else if (typeof v === "number") {
    o.buf[o.pos++] = VALUE_NUMBER;
    o.pos = o.buf.writeDoubleLE(v, o.pos);
  } else if (typeof v === "string") {
    o.string(VALUE_STRING, v);
  } else if (Array.isArray(v)) {
    o.part(VALUE_LIST);
    for (const item of v) {
      o.part(LIST_VALUES);
      writeValue(o, item);
    }
  } else {
    o.part(VALUE_STRUCT);
    writeStruct(o, v);
  }
}

/** A Struct's encoding, length-prefixed (as a length-delimited field's value). */
export function structBytes(value: JsonObject): Uint8Array {
  const sizes: number[] = [];
  const body = sizeStruct(value, sizes);
  const o = new Out(Buffer.allocUnsafe(varintSize(body) + body), sizes);
  o.varint(body);
  writeStruct(o, value);
  return o.buf;
}

/**
 * Sets a Struct field of `msg` as pre-encoded bytes: the field is left unset
 * and its encoding rides as an unknown field, which toBinary writes as is.
 * For the binary codec only: a JSON encoding would leave the field out.
 */
export function setStructBytes(msg: Message, field: DescField, value: JsonObject): void {
  const m = msg as { $unknown?: { no: number; wireType: WireType; data: Uint8Array }[] };
  m.$unknown = [...(m.$unknown ?? []), { no: field.number, wireType: WireType.LengthDelimited, data: structBytes(value) }];
}

// Reading: the inverse, plain JSON straight from the bytes of a Value or a
// Struct. protobuf-es builds a Value message per member by reflection, and the
// JSON is then made from those; for a heartbeat's telemetry that was most of
// the decoding of a stream heartbeat.

/**
 * Bytes these readers leave to protobuf-es, which says what is wrong with them (or accepts them). So is
 * JSON nested deeper than the reader was given room for (`room`: the objects and arrays it may nest,
 * its own counted), which protobuf-es reads within its bounded recursion, or refuses.
 */
export class NotPlainJson extends Error {}

const deeper = (room: number) => {
  if (room < 1) throw new NotPlainJson("nested deeper than the room given");
  return room - 1;
};

/** A position in protobuf bytes, for the hand-written readers here and in services/daemon-wire.ts. */
export class WireCursor {
  pos: number;
  constructor(
    readonly buf: Buffer,
    start: number,
    readonly end: number,
  ) {
    this.pos = start;
  }

  varint(): number {
    let n = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      if (this.pos >= this.end) throw new NotPlainJson("truncated varint");
      const b = this.buf[this.pos++]!;
      n += (b & 0x7f) * 2 ** shift;
      if (b < 0x80) return n;
    }
    throw new NotPlainJson("varint over 32 bits");
  }

  /** The end of the length-delimited part that starts here. */
  delimited(): number {
    const n = this.varint();
    const end = this.pos + n;
    if (end > this.end) throw new NotPlainJson("truncated part");
    return end;
  }

  string(): string {
    const end = this.delimited();
    const s = this.buf.toString("utf8", this.pos, end);
    this.pos = end;
    return s;
  }
}

function readValue(r: WireCursor, end: number, room: number): JsonValue {
  let value: JsonValue | undefined;
  while (r.pos < end) {
    // One member per Value: anything else (a second kind, an unknown field) goes to protobuf-es.
    if (value !== undefined) throw new NotPlainJson("more than one field in a Value");
    const tag = r.buf[r.pos++];
    switch (tag) {
      case VALUE_NULL:
        r.varint();
        value = null;
        break;
      case VALUE_NUMBER: {
        if (r.pos + 8 > end) throw new NotPlainJson("truncated double");
        const n = r.buf.readDoubleLE(r.pos);
        r.pos += 8;
        if (!Number.isFinite(n)) throw new NotPlainJson("a number JSON cannot hold");
        value = n;
        break;
      }
      case VALUE_STRING:
        value = r.string();
        break;
      case VALUE_BOOL:
        value = r.varint() !== 0;
        break;
      case VALUE_STRUCT: {
        const e = r.delimited();
        value = readStruct(r, e, room);
        break;
      }
      case VALUE_LIST: {
        const e = r.delimited();
        const inner = deeper(room);
        const list: JsonValue[] = [];
        while (r.pos < e) {
          if (r.buf[r.pos++] !== LIST_VALUES) throw new NotPlainJson("unknown field in a ListValue");
          const itemEnd = r.delimited();
          list.push(readValue(r, itemEnd, inner));
        }
        value = list;
        break;
      }
      default:
        throw new NotPlainJson("unknown field in a Value");
    }
  }
  if (r.pos !== end) throw new NotPlainJson("a part overruns its Value");
  if (value === undefined) throw new NotPlainJson("a Value with no kind");
  return value;
}

function readStruct(r: WireCursor, end: number, room: number): JsonObject {
  const inner = deeper(room);
  const obj: JsonObject = {};
  while (r.pos < end) {
    if (r.buf[r.pos++] !== STRUCT_FIELDS) throw new NotPlainJson("unknown field in a Struct");
    const entryEnd = r.delimited();
    let key = "";
    let value: JsonValue | undefined;
    while (r.pos < entryEnd) {
      const tag = r.buf[r.pos++];
      if (tag === ENTRY_KEY) key = r.string();
      else if (tag === ENTRY_VALUE) value = readValue(r, r.delimited(), inner);
      else throw new NotPlainJson("unknown field in a Struct entry");
    }
    if (r.pos !== entryEnd) throw new NotPlainJson("a part overruns its Struct entry");
    if (value === undefined) throw new NotPlainJson("a Struct entry with no value");
    if (key === "__proto__") throw new NotPlainJson("a key a plain object cannot hold");
    obj[key] = value;
  }
  if (r.pos !== end) throw new NotPlainJson("a part overruns its Struct");
  return obj;
}

/** A google.protobuf.Value's message bytes as JSON; throws NotPlainJson for bytes to leave to protobuf-es. */
export function readValueJson(bytes: Uint8Array, room = MAX_JSON_DEPTH): JsonValue {
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return readValue(new WireCursor(buf, 0, buf.length), buf.length, room);
}

/** The Value whose bytes run from the cursor to `end`, as JSON. */
export function readValueJsonAt(r: WireCursor, end: number, room: number): JsonValue {
  return readValue(r, end, room);
}

/** The Struct whose bytes run from the cursor to `end`, as JSON. */
export function readStructJsonAt(r: WireCursor, end: number, room: number): JsonObject {
  return readStruct(r, end, room);
}

/** A google.protobuf.Struct's message bytes as JSON; throws NotPlainJson for bytes to leave to protobuf-es. */
export function readStructJson(bytes: Uint8Array, room = MAX_JSON_DEPTH): JsonObject {
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return readStruct(new WireCursor(buf, 0, buf.length), buf.length, room);
}

// A Struct read straight to JSON text, for a heartbeat's telemetry, which is stored as text: the
// object readStructJson makes (a keyed store under a new key per member, every string decoded) was
// most of a stream heartbeat's decoding, and was then written out again with JSON.stringify. Here
// the bytes are copied across: a string of printable ASCII without a quote or a backslash (nearly
// every string a daemon reports) is the same bytes in JSON between quotes; any other is decoded
// and written as JSON.stringify writes it. One UTF-8 decode of the whole text at the end.

/** A Struct as JSON text, with the top-level members asked for as values. */
export interface StructText {
  /** What JSON.stringify writes for the object readStructJson returns from the same bytes. */
  json: string;
  /** No string in it needed an escape: it cannot hold an escaped NUL or surrogate. */
  plain: boolean;
  /** Members asked for that hold a string, a number or a boolean. */
  scalars: Map<string, string | number | boolean>;
  /** Members asked for that hold a list: its length. */
  lengths: Map<string, number>;
}

/** Members of one Struct read to text; a larger one goes to the object reader (keys are compared pairwise). */
const MAX_KEYS_COMPARED = 256;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/** The JSON text being written, in a buffer kept between reads (its text is decoded out of it at the end). */
class JsonOut {
  buf = Buffer.allocUnsafe(4096);
  len = 0;
  plain = true;

  room(n: number): void {
    if (this.len + n <= this.buf.length) return;
    const bigger = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.len + n));
    this.buf.copy(bigger, 0, 0, this.len);
    this.buf = bigger;
  }

  byte(b: number): void {
    this.room(1);
    this.buf[this.len++] = b;
  }

  /** Text that may hold any character. */
  text(s: string): void {
    this.room(s.length * 3);
    this.len += this.buf.write(s, this.len, "utf8");
  }

  /** Text known to be ASCII (numbers, literals), byte by byte: Buffer's calls cost more than a short loop. */
  ascii(s: string): void {
    this.room(s.length);
    for (let i = 0; i < s.length; i++) this.buf[this.len++] = s.charCodeAt(i);
  }

  /** Bytes [start, end) of `src` as a JSON string. */
  string(src: Buffer, start: number, end: number): void {
    this.room(end - start + 2);
    const buf = this.buf;
    const from = this.len;
    let at = from;
    buf[at++] = QUOTE;
    for (let i = start; i < end; i++) {
      const b = src[i]!;
      if (b < 0x20 || b >= 0x80 || b === QUOTE || b === BACKSLASH) {
        this.len = from;
        this.plain = false;
        this.text(JSON.stringify(src.toString("utf8", start, end)));
        return;
      }
      buf[at++] = b;
    }
    buf[at++] = QUOTE;
    this.len = at;
  }
}

/** Whether bytes [s1, e1) and [s2, e2) of `buf` are the same. */
function sameBytes(buf: Buffer, s1: number, e1: number, s2: number, e2: number): boolean {
  if (e1 - s1 !== e2 - s2) return false;
  for (let i = 0; i < e1 - s1; i++) if (buf[s1 + i] !== buf[s2 + i]) return false;
  return true;
}

const PROTO_KEY = Buffer.from("__proto__");

/** A key a plain object orders before the others (an array index: JSON.stringify would not keep wire order), or `__proto__`. */
function unusualKey(buf: Buffer, start: number, end: number): boolean {
  const n = end - start;
  if (n === PROTO_KEY.length) {
    let i = 0;
    while (i < n && buf[start + i] === PROTO_KEY[i]) i++;
    if (i === n) return true;
  }
  if (n === 0 || n > 10) return false;
  if (buf[start] === 0x30) return n === 1; // "0", never "07"
  for (let i = start; i < end; i++) if (buf[i]! < 0x30 || buf[i]! > 0x39) return false;
  return true; // up to 10 digits: an index, or near enough (left to the object reader either way)
}

let shared: JsonOut | undefined;

/** What a Value held, when the caller asked: a scalar, or a list's length. */
interface Noted {
  scalar: string | number | boolean | undefined;
  length: number | undefined;
}

function valueText(r: WireCursor, end: number, out: JsonOut, room: number, noted?: Noted): void {
  let seen = false;
  while (r.pos < end) {
    if (seen) throw new NotPlainJson("more than one field in a Value");
    seen = true;
    const tag = r.buf[r.pos++];
    switch (tag) {
      case VALUE_NULL:
        r.varint();
        out.ascii("null");
        break;
      case VALUE_NUMBER: {
        if (r.pos + 8 > end) throw new NotPlainJson("truncated double");
        const n = r.buf.readDoubleLE(r.pos);
        r.pos += 8;
        if (!Number.isFinite(n)) throw new NotPlainJson("a number JSON cannot hold");
        if (noted) noted.scalar = n;
        out.ascii(String(n));
        break;
      }
      case VALUE_STRING: {
        const e = r.delimited();
        if (noted) noted.scalar = r.buf.toString("utf8", r.pos, e);
        out.string(r.buf, r.pos, e);
        r.pos = e;
        break;
      }
      case VALUE_BOOL: {
        const b = r.varint() !== 0;
        if (noted) noted.scalar = b;
        out.ascii(b ? "true" : "false");
        break;
      }
      case VALUE_STRUCT:
        structText(r, r.delimited(), out, room);
        break;
      case VALUE_LIST: {
        const e = r.delimited();
        const inner = deeper(room);
        out.byte(0x5b); // [
        let length = 0;
        while (r.pos < e) {
          if (r.buf[r.pos++] !== LIST_VALUES) throw new NotPlainJson("unknown field in a ListValue");
          const itemEnd = r.delimited();
          if (length++ > 0) out.byte(0x2c); // ,
          valueText(r, itemEnd, out, inner);
        }
        if (noted) noted.length = length;
        out.byte(0x5d); // ]
        break;
      }
      default:
        throw new NotPlainJson("unknown field in a Value");
    }
  }
  if (r.pos !== end) throw new NotPlainJson("a part overruns its Value");
  if (!seen) throw new NotPlainJson("a Value with no kind");
}

function structText(r: WireCursor, end: number, out: JsonOut, room: number, top?: { pick: ReadonlySet<string>; into: StructText }): void {
  const inner = deeper(room);
  // Each key's bytes (start, end): a key twice is left to protobuf-es (compared byte by byte; few keys per Struct).
  const keys: number[] = [];
  const noted: Noted | undefined = top && { scalar: undefined, length: undefined };
  out.byte(0x7b); // {
  while (r.pos < end) {
    if (r.buf[r.pos++] !== STRUCT_FIELDS) throw new NotPlainJson("unknown field in a Struct");
    const entryEnd = r.delimited();
    // Key first, then the value, each once: any other entry is left to protobuf-es.
    let keyStart = r.pos;
    let keyEnd = r.pos;
    if (r.pos < entryEnd && r.buf[r.pos] === ENTRY_KEY) {
      r.pos++;
      keyEnd = r.delimited();
      keyStart = r.pos;
      r.pos = keyEnd;
    }
    if (r.pos >= entryEnd || r.buf[r.pos++] !== ENTRY_VALUE) throw new NotPlainJson("an unusual Struct entry");
    if (unusualKey(r.buf, keyStart, keyEnd)) throw new NotPlainJson("a key a plain object orders or holds differently");
    if (keys.length >= 2 * MAX_KEYS_COMPARED) throw new NotPlainJson("a Struct with many members");
    for (let k = 0; k < keys.length; k += 2) {
      if (sameBytes(r.buf, keys[k]!, keys[k + 1]!, keyStart, keyEnd)) throw new NotPlainJson("a key twice in a Struct");
    }
    if (keys.length > 0) out.byte(0x2c); // ,
    keys.push(keyStart, keyEnd);
    out.string(r.buf, keyStart, keyEnd);
    out.byte(0x3a); // :
    // Names asked for are ASCII: a key's latin1 text is its text when it is one of them.
    const key = top ? r.buf.toString("latin1", keyStart, keyEnd) : "";
    const picked = !!top && top.pick.has(key);
    if (picked) noted!.scalar = noted!.length = undefined;
    valueText(r, r.delimited(), out, inner, picked ? noted : undefined);
    if (r.pos !== entryEnd) throw new NotPlainJson("an unusual Struct entry");
    if (picked) {
      if (noted!.scalar !== undefined) top!.into.scalars.set(key, noted!.scalar);
      if (noted!.length !== undefined) top!.into.lengths.set(key, noted!.length);
    }
  }
  if (r.pos !== end) throw new NotPlainJson("a part overruns its Struct");
  out.byte(0x7d); // }
}

/**
 * The Struct whose bytes run from the cursor to `end`, as JSON text, with the top-level members
 * named in `pick` (ASCII names), nesting at most `room` deep; throws NotPlainJson for bytes to leave to protobuf-es (also for a
 * Struct whose object would order or hold its keys otherwise than the bytes do: a key twice, an
 * index key).
 */
export function readStructTextAt(r: WireCursor, end: number, pick: ReadonlySet<string>, room = MAX_JSON_DEPTH): StructText {
  const out = shared ?? new JsonOut();
  shared = undefined; // a read inside a read (none today) gets its own
  out.len = 0;
  out.plain = true;
  try {
    const into: StructText = { json: "", plain: true, scalars: new Map(), lengths: new Map() };
    structText(r, end, out, room, { pick, into });
    into.json = out.buf.toString("utf8", 0, out.len);
    into.plain = out.plain;
    return into;
  } finally {
    if (out.buf.length <= 1 << 20) shared = out; // a buffer grown past 1 MiB is not kept
  }
}
