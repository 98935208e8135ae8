// Byte bounds per kind of message, on a stream whose request type is a oneof of kinds (a daemon's
// DaemonMessage): each kind may take at most its own number of bytes, below the method's limit, so that
// a small report (a heartbeat) cannot be as large as the largest (a result). In the binary codec the kind
// is read off the message's first bytes where they tell it (its first field, when that field is the whole
// message, as every encoder writes a oneof), else off its top-level fields once it has arrived, their
// contents jumped over; either way before the message is decoded. In JSON it is the object's first member
// (protobuf-es refuses a second member of the oneof, and unknown members).
import type { DescField, DescOneof } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import type { EnvelopeReading } from "./envelopes.js";
import { JsonScanner } from "./json-scan.js";

export interface KindBound {
  /** The member's proto name ("heartbeat"); undefined for a message holding none. */
  kind: string | undefined;
  maxBytes: number;
}

export class KindBounds {
  private readonly byNumber = new Map<number, KindBound>();
  private readonly byMember = new Map<string, KindBound>();
  readonly none: KindBound;

  /**
   * `maxBytes` of each member of `oneof`; `noneMaxBytes` for a message that holds none of them (empty, or
   * a kind this server does not know: it is answered as empty).
   */
  constructor(
    readonly oneof: DescOneof,
    maxBytes: (member: DescField) => number,
    noneMaxBytes: number,
  ) {
    for (const f of oneof.fields) {
      const bound = { kind: f.name, maxBytes: maxBytes(f) };
      if (!Number.isSafeInteger(bound.maxBytes)) throw new Error(`${oneof.parent.typeName}.${f.name} has no byte bound`);
      this.byNumber.set(f.number, bound);
      this.byMember.set(f.name, bound);
      this.byMember.set(f.jsonName, bound);
    }
    this.none = { kind: undefined, maxBytes: noneMaxBytes };
  }

  /** The bound of a top-level field (undefined: not a member). */
  ofField(number: number): KindBound | undefined {
    return this.byNumber.get(number);
  }

  /** The bound of a message whose JSON object's first member is `name` (proto or JSON name). */
  ofMember(name: string | undefined): KindBound {
    return (name !== undefined && this.byMember.get(name)) || this.none;
  }

  /** The refusal of a message of `size` bytes of that kind, when it is over the kind's bound. */
  refusal(bound: KindBound, size: number): ConnectError | undefined {
    if (size <= bound.maxBytes) return undefined;
    const what = bound.kind === undefined ? `a message holding no ${this.oneof.name}` : `a ${bound.kind} message`;
    const may = bound.kind === undefined ? "one" : `a ${bound.kind}`;
    // No comma: grpc-js leaves one percent-encoded in the status message it reports.
    return new ConnectError(`${what} of ${size} bytes is over the ${bound.maxBytes} ${may} may take`, Code.ResourceExhausted);
  }

  /** The kind of a binary message of `size` bytes, read as its bytes come (KindScan). */
  scan(size: number): KindScan {
    return new KindScan(this, size);
  }
}

/** What KindScan reads next: a field's tag, its length, a varint field's value, or bytes it jumps over. */
const Phase = { Tag: 0, Length: 1, Varint: 2, Skip: 3 } as const;

/**
 * Walks the top-level fields of one binary message as its bytes are pushed, jumping over their contents
 * (a few bytes looked at per field): the kind it holds is the last member of the oneof (as protobuf reads
 * a oneof set twice). A message that does not parse is held to the bound of the last member seen so far;
 * reading it refuses it anyway.
 */
export class KindScan {
  private phase: number = Phase.Tag;
  private pos = 0;
  private acc = 0;
  private accBytes = 0;
  private skip = 0;
  private field = 0;
  private groups = 0;
  private fieldStart = 0;
  private last: KindBound | undefined;
  private broken = false;
  /** The first field is the whole message: its kind is known. */
  private settled = false;

  constructor(
    private readonly bounds: KindBounds,
    private readonly size: number,
  ) {}

  /** The message's kind is known from the bytes pushed so far (before its end). */
  get known(): boolean {
    return this.settled;
  }

  /** Takes the next bytes of the message; the refusal once its kind is known and the message over that kind's bound. */
  push(bytes: Uint8Array): ConnectError | undefined {
    if (this.settled || this.broken) return undefined;
    let i = 0;
    while (i < bytes.length && !this.broken && !this.settled) {
      if (this.phase === Phase.Skip) {
        const n = Math.min(this.skip, bytes.length - i);
        this.skip -= n;
        this.pos += n;
        i += n;
        if (this.skip === 0) this.phase = Phase.Tag;
        continue;
      }
      if (this.phase === Phase.Tag && this.accBytes === 0) this.fieldStart = this.pos;
      const b = bytes[i++]!;
      this.pos++;
      this.acc += (b & 0x7f) * 2 ** (7 * this.accBytes++);
      if (b & 0x80) {
        if (this.accBytes >= 10) this.broken = true;
        continue;
      }
      const value = this.acc;
      this.acc = 0;
      this.accBytes = 0;
      if (this.phase === Phase.Tag) this.tag(value);
      else if (this.phase === Phase.Length) this.length(value);
      else this.phase = Phase.Tag; // a varint field's value
    }
    return this.settled ? this.bounds.refusal(this.last ?? this.bounds.none, this.size) : undefined;
  }

  /** The message ended (all its bytes pushed): the refusal when it is over its kind's bound. */
  end(): ConnectError | undefined {
    return this.bounds.refusal(this.last ?? this.bounds.none, this.size);
  }

  private tag(tag: number): void {
    this.field = Math.floor(tag / 8);
    if (this.field === 0) return void (this.broken = true);
    switch (tag & 7) {
      case 0:
        this.phase = Phase.Varint;
        return;
      case 1:
        return this.skipping(8);
      case 2:
        this.phase = Phase.Length;
        return;
      case 3:
        this.groups++;
        return;
      case 4:
        if (--this.groups < 0) this.broken = true;
        return;
      case 5:
        return this.skipping(4);
      default:
        this.broken = true;
    }
  }

  private length(n: number): void {
    if (this.pos + n > this.size) return void (this.broken = true);
    if (this.groups === 0) {
      const member = this.bounds.ofField(this.field);
      if (member) this.last = member;
      if (this.fieldStart === 0 && this.pos + n === this.size) this.settled = true;
    }
    this.skipping(n);
  }

  private skipping(n: number): void {
    if (this.pos + n > this.size) return void (this.broken = true);
    this.skip = n;
    this.phase = n === 0 ? Phase.Tag : Phase.Skip;
  }
}

/** The kind of one JSON message, read as its bytes come: its object's first member (JsonScanner.firstMember). */
class JsonKindScan {
  private readonly text = JsonScanner.firstMemberReader();

  constructor(
    private readonly bounds: KindBounds,
    private readonly size: number,
  ) {}

  /** Takes the next bytes of the message; the refusal once its kind is known and the message over that kind's bound. */
  push(bytes: Uint8Array): ConnectError | undefined {
    if (this.text.firstKnown) return undefined;
    this.text.exceeds(bytes);
    return this.text.firstKnown ? this.end() : undefined;
  }

  /** The message ended (all its bytes pushed): the refusal when it is over its kind's bound (none read: a message holding no kind). */
  end(): ConnectError | undefined {
    return this.bounds.refusal(this.bounds.ofMember(this.text.firstMember()), this.size);
  }
}

/** What reads a message's kind as its bytes come; undefined for a compressed one, read once it ended. */
type MessageKind = KindScan | JsonKindScan | undefined;

/**
 * The messages of an enveloped body (Envelopes), each held to its kind's bound as its bytes arrive:
 * uncompressed, from its first bytes (or as it ends); compressed (binary only: a compressed JSON message is
 * refused as such elsewhere), once it ended, inflated by `inflate` (undefined: what the reader refuses itself).
 */
export class EnvelopedKinds implements EnvelopeReading<MessageKind> {
  constructor(
    private readonly bounds: KindBounds,
    private readonly json: boolean,
    private readonly inflate: (bytes: Buffer) => Promise<Buffer | undefined>,
  ) {}

  start(compressed: boolean, size: number): MessageKind {
    if (compressed) return undefined;
    return this.json ? new JsonKindScan(this.bounds, size) : this.bounds.scan(size);
  }

  piece(scan: MessageKind, bytes: Buffer): ConnectError | undefined {
    return scan?.push(bytes);
  }

  whole(scan: MessageKind): boolean {
    return !scan && !this.json;
  }

  async end(scan: MessageKind, bytes: Buffer | undefined): Promise<ConnectError | undefined> {
    if (scan) return scan.end();
    const message = bytes && (await this.inflate(bytes));
    if (!message) return undefined;
    const inflated = this.bounds.scan(message.length);
    return inflated.push(message) ?? inflated.end();
  }
}
