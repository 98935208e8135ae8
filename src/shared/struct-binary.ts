// google.protobuf.Struct in its binary form straight from plain JSON. protobuf-es
// encodes a Struct field (held as a JsonObject) by building a Value message per
// member and walking them by reflection: for a pushed job, whose task spec is a
// Struct, that was most of the message's encoding time. Here one pass sizes
// every length-delimited part and a second writes them into one buffer. The
// bytes are those a Struct message encodes to; any protobuf decoder reads them.
import type { DescField, JsonObject, JsonValue, Message } from "@bufbuild/protobuf";
import { WireType } from "@bufbuild/protobuf/wire";

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

/** Bytes these readers leave to protobuf-es, which says what is wrong with them (or accepts them). */
export class NotPlainJson extends Error {}

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

function readValue(r: WireCursor, end: number): JsonValue {
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
        value = readStruct(r, e);
        break;
      }
      case VALUE_LIST: {
        const e = r.delimited();
        const list: JsonValue[] = [];
        while (r.pos < e) {
          if (r.buf[r.pos++] !== LIST_VALUES) throw new NotPlainJson("unknown field in a ListValue");
          const itemEnd = r.delimited();
          list.push(readValue(r, itemEnd));
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

function readStruct(r: WireCursor, end: number): JsonObject {
  const obj: JsonObject = {};
  while (r.pos < end) {
    if (r.buf[r.pos++] !== STRUCT_FIELDS) throw new NotPlainJson("unknown field in a Struct");
    const entryEnd = r.delimited();
    let key = "";
    let value: JsonValue | undefined;
    while (r.pos < entryEnd) {
      const tag = r.buf[r.pos++];
      if (tag === ENTRY_KEY) key = r.string();
      else if (tag === ENTRY_VALUE) value = readValue(r, r.delimited());
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
export function readValueJson(bytes: Uint8Array): JsonValue {
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return readValue(new WireCursor(buf, 0, buf.length), buf.length);
}

/** The Value whose bytes run from the cursor to `end`, as JSON. */
export function readValueJsonAt(r: WireCursor, end: number): JsonValue {
  return readValue(r, end);
}

/** The Struct whose bytes run from the cursor to `end`, as JSON. */
export function readStructJsonAt(r: WireCursor, end: number): JsonObject {
  return readStruct(r, end);
}

/** A google.protobuf.Struct's message bytes as JSON; throws NotPlainJson for bytes to leave to protobuf-es. */
export function readStructJson(bytes: Uint8Array): JsonObject {
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return readStruct(new WireCursor(buf, 0, buf.length), buf.length);
}
