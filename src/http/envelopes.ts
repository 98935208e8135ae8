// The messages of an enveloped body (gRPC, gRPC-Web, Connect's streams: a flag byte and a 4-byte length
// before each), split out of its pieces as they arrive, for what looks at a call's messages before Connect
// reads them (connect-adapter.ts: their depth and lists, their kind's bound).
import { ConnectError } from "@connectrpc/connect";

/** A refusal, now or once a message is inflated. */
export type Refusal = ConnectError | undefined | Promise<ConnectError | undefined>;

const COMPRESSED = 0x01;
/** gRPC-Web's trailers: a frame that is no message, skipped. */
const TRAILER = 0x80;

/** What looks at each message of an enveloped body, its state `T` kept from its envelope to its end. */
export interface EnvelopeReading<T> {
  /** A message's envelope was read (flags and length): what its bytes are given to, or the message's refusal then. */
  start(compressed: boolean, size: number): T | ConnectError;
  /** The next bytes of the message, as they arrive. */
  piece?(state: T, bytes: Buffer): ConnectError | undefined;
  /** Whether `end` is given the message's bytes whole (never past the limit: Connect refuses such a message at its envelope). */
  whole?(state: T): boolean;
  /** The message ended: `bytes`, its bytes whole, where kept. */
  end?(state: T, bytes: Buffer | undefined): Refusal;
}

/** Splits an enveloped body's pieces into its messages for `reading`; `limit`, the call's message limit. */
export class Envelopes<T> {
  private readonly head = Buffer.alloc(5);
  private headHave = 0;
  private left = 0;
  private message: { state: T; parts: Buffer[] | undefined; size: number } | undefined;

  constructor(
    private readonly limit: number,
    private readonly reading: EnvelopeReading<T>,
  ) {}

  /** Takes the body's next piece: the first refusal of a message in it. */
  async refusal(piece: Uint8Array): Promise<ConnectError | undefined> {
    const b = Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
    let i = 0;
    while (i < b.length || (this.message && this.left === 0)) {
      if (this.message && this.left === 0) {
        const { state, parts, size } = this.message;
        this.message = undefined;
        const refusal = await this.reading.end?.(state, parts && Buffer.concat(parts, size));
        if (refusal) return refusal;
        continue;
      }
      if (!this.message && this.left === 0) {
        const take = Math.min(5 - this.headHave, b.length - i);
        b.copy(this.head, this.headHave, i, i + take);
        this.headHave += take;
        i += take;
        if (this.headHave < 5) return undefined;
        this.headHave = 0;
        const flags = this.head[0]!;
        const size = (this.left = this.head.readUInt32BE(1));
        if (flags & TRAILER) continue;
        const state = this.reading.start((flags & COMPRESSED) !== 0, size);
        if (state instanceof ConnectError) return state;
        this.message = { state, parts: size <= this.limit && this.reading.whole?.(state) ? [] : undefined, size };
        continue;
      }
      const take = Math.min(this.left, b.length - i);
      const part = b.subarray(i, i + take);
      this.left -= take;
      i += take;
      if (!this.message) continue; // a trailer frame
      this.message.parts?.push(part);
      const refusal = this.reading.piece?.(this.message.state, part);
      if (refusal) return refusal;
    }
    return undefined;
  }
}
