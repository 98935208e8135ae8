// JSON.parse reads any nesting, but JSON.stringify and every recursive walk of
// the value (protobuf's reading of a Struct, the answer's assembly, the bounds
// of a prompt) take one stack frame per level: a few hundred kilobytes of
// `{"a":` throw RangeError out of them. And JSON.parse itself, given a body of
// millions of levels, holds the event loop for seconds and the heap for
// hundreds of megabytes, before anything has looked at the caller's
// credentials. So request bodies are measured as text first
// (jsonTextDepthExceeds, linear and stopping at the first level too many), and
// what nests deeper than its route allows is refused before it is parsed.

export { jsonDepthExceeds, MAX_JSON_DEPTH, PROTO_RECURSION_LIMIT, tooDeepMessage } from "../shared/json-nesting.js";

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/** The longest member name a refusal repeats (bytes of its text). */
const MEMBER_NAME_BYTES = 64;

/**
 * Measures the nesting of JSON text fed in pieces (a body as it arrives), counted as jsonDepthExceeds
 * counts the parsed value. It jumps over strings (native indexOf to each closing quote) and looks at
 * no byte after the first level too many; text that is not JSON is left to the parser to refuse.
 * It keeps the name of the top-level member being read, for a refusal to name (member()).
 */
export class JsonDepthMeter {
  private depth = 0;
  private inString = false;
  /** Inside a string, the last byte was a backslash that escapes the next one. */
  private escaped = false;
  private over = false;
  /** The text is an object, and the next string at its top level is a member's name. */
  private topIsObject = false;
  private nameNext = false;
  /** The string being read is a top-level member's name: its text so far (escapes as written). */
  private name: Buffer[] | undefined;
  private nameBytes = 0;
  private lastName: string | undefined;

  constructor(private readonly max: number) {}

  /** The top-level member whose value was being read when the text went too deep (undefined: none). */
  member(): string | undefined {
    return this.over ? this.lastName : undefined;
  }

  private keep(b: Buffer, from: number, to: number): void {
    if (!this.name || this.nameBytes >= MEMBER_NAME_BYTES || to <= from) return;
    const part = b.subarray(from, Math.min(to, from + MEMBER_NAME_BYTES - this.nameBytes));
    this.name.push(Buffer.from(part));
    this.nameBytes += part.length;
  }

  private nameEnded(): void {
    const raw = Buffer.concat(this.name!).toString("utf8");
    this.name = undefined;
    try {
      this.lastName = JSON.parse(`"${raw}"`);
    } catch {
      this.lastName = raw; // cut inside an escape
    }
  }

  /** Takes the next bytes of the text; true once it has nested deeper than `max`. */
  exceeds(piece: Uint8Array): boolean {
    if (this.over) return true;
    const b = Buffer.isBuffer(piece) ? piece : Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
    let i = 0;
    while (i < b.length) {
      if (this.inString) {
        if (this.escaped) {
          this.escaped = false;
          this.keep(b, i, i + 1);
          i++;
          continue;
        }
        const q = b.indexOf(QUOTE, i);
        // The run of backslashes just before `end` (none of it before i: i is not escaped).
        const run = (end: number) => {
          let k = end - 1;
          while (k >= i && b[k] === BACKSLASH) k--;
          return end - 1 - k;
        };
        if (q < 0) {
          this.keep(b, i, b.length);
          this.escaped = run(b.length) % 2 === 1;
          return false;
        }
        if (run(q) % 2 === 0) {
          // The string ends here (an escaped quote is part of it).
          this.inString = false;
          this.keep(b, i, q);
          if (this.name) this.nameEnded();
        } else {
          this.keep(b, i, q + 1);
        }
        i = q + 1;
        continue;
      }
      const c = b[i++];
      if (c === QUOTE) {
        this.inString = true;
        if (this.nameNext && this.depth === 1) {
          this.nameNext = false;
          this.name = [];
          this.nameBytes = 0;
        }
      } else if (c === 0x7b || c === 0x5b) {
        if (this.depth === 0) this.topIsObject = this.nameNext = c === 0x7b;
        if (++this.depth > this.max) return (this.over = true);
      } else if (c === 0x7d || c === 0x5d) {
        this.depth--;
      } else if (c === 0x2c && this.depth === 1 && this.topIsObject) {
        this.nameNext = true;
      }
    }
    return false;
  }
}

/** Whether JSON text nests objects and arrays more than `max` deep (JsonDepthMeter, in one piece). */
export function jsonTextDepthExceeds(text: Uint8Array, max: number): boolean {
  return new JsonDepthMeter(max).exceeds(text);
}
