// The bounds of a request's lists (src/shared/list-bounds.ts), counted in its JSON text as it arrives: on the
// wires Connect reads (a unary call's JSON body, a stream's JSON messages), a body is parsed and read into
// its message in one step, an object per item, so a list past its bound is refused from the text first.
import type { JsonListNode } from "../shared/list-bounds.js";
import { tooManyItemsMessage } from "../shared/list-bounds.js";

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
/** Longer member names are not followed: no field's name is this long. */
const MEMBER_NAME_BYTES = 128;

const isSpace = (c: number) => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

interface Frame {
  node: JsonListNode;
  /** The field's proto name (a refusal's path); "" for the request's own object. */
  name: string;
  items: number;
  /** An object expects a member's name next; a list, an item. */
  expect: boolean;
}

/**
 * Counts, in JSON text fed in pieces, the items of the lists and maps a request's JSON form holds along
 * `tree` (members matched by proto or JSON name, escapes read), and stops at the first one past its bound.
 * What it does not follow (free-form JSON, scalars) it reads as nesting only; text that is not JSON is the
 * parser's to refuse.
 */
export class JsonListMeter {
  private readonly stack: Frame[] = [];
  private started = false;
  /** Levels into a value not followed. */
  private skip = 0;
  private inString = false;
  private escaped = false;
  /** The member name being read (its bytes as written), when its object is followed. */
  private name: Buffer[] | undefined;
  private nameBytes = 0;
  /** The member whose value comes next, when followed. */
  private next: { name: string; node: JsonListNode } | undefined;
  private over: string | undefined;

  constructor(private readonly tree: JsonListNode) {}

  /** The refusal, once a list went past its bound. */
  refusal(): string | undefined {
    return this.over;
  }

  private keep(b: Buffer, from: number, to: number): void {
    if (!this.name || to <= from) return;
    if (this.nameBytes + (to - from) > MEMBER_NAME_BYTES) {
      this.name = [];
      this.nameBytes = MEMBER_NAME_BYTES + 1;
      return;
    }
    this.name.push(Buffer.from(b.subarray(from, to)));
    this.nameBytes += to - from;
  }

  private nameEnded(top: Frame): void {
    const raw = this.nameBytes > MEMBER_NAME_BYTES ? undefined : Buffer.concat(this.name!).toString("utf8");
    this.name = undefined;
    let name: string | undefined;
    try {
      name = raw === undefined ? undefined : (JSON.parse(`"${raw}"`) as string);
    } catch {
      name = undefined; // not JSON: the parser refuses it
    }
    this.next = name === undefined || top.node.kind !== "message" ? undefined : top.node.members.get(name);
  }

  private count(top: Frame): boolean {
    const node = top.node as JsonListNode & { max: number };
    if (node.max > 0 && ++top.items > node.max) {
      this.over = tooManyItemsMessage(this.stack.map((f) => f.name).filter(Boolean).join("."), node.max);
      return true;
    }
    return false;
  }

  /** A container opened where `node` (if any) is followed. */
  private open(c: number, name: string, node: JsonListNode | undefined): void {
    const fits = node && (node.kind === "list" ? c === 0x5b : c === 0x7b);
    if (fits) this.stack.push({ node, name, items: 0, expect: true });
    else this.skip = 1;
  }

  /** Takes the next bytes of the text; true once a list is past its bound (refusal() says which). */
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
          this.inString = false;
          this.keep(b, i, q);
          if (this.name) this.nameEnded(this.stack[this.stack.length - 1]!);
        } else {
          this.keep(b, i, q + 1);
        }
        i = q + 1;
        continue;
      }
      const c = b[i++]!;
      if (isSpace(c)) continue;
      if (this.skip > 0) {
        if (c === QUOTE) this.inString = true;
        else if (c === 0x7b || c === 0x5b) this.skip++;
        else if (c === 0x7d || c === 0x5d) this.skip--;
        continue;
      }
      if (!this.started) {
        this.started = true;
        this.open(c, "", this.tree);
        if (c === QUOTE) this.inString = true;
        continue;
      }
      const top = this.stack[this.stack.length - 1];
      if (!top) {
        // After the request's own value: the parser refuses anything more.
        if (c === QUOTE) this.inString = true;
        continue;
      }
      if (top.node.kind === "list") {
        if (c === 0x5d) this.stack.pop();
        else if (c === 0x2c) top.expect = true;
        else if (top.expect) {
          top.expect = false;
          if (this.count(top)) return true;
          if (c === QUOTE) this.inString = true;
          else if (c === 0x7b || c === 0x5b) this.open(c, "", top.node.element);
        }
        continue;
      }
      // An object: a message's members, or a map's entries.
      if (c === 0x7d) {
        this.stack.pop();
      } else if (c === 0x2c) {
        top.expect = true;
        this.next = undefined;
      } else if (c === QUOTE) {
        this.inString = true;
        if (top.expect) {
          top.expect = false;
          if (top.node.kind === "map") {
            if (this.count(top)) return true;
            this.next = top.node.element && { name: "", node: top.node.element };
          } else {
            this.name = [];
            this.nameBytes = 0;
          }
        }
      } else if (c === 0x7b || c === 0x5b) {
        this.open(c, this.next?.name ?? "", this.next?.node);
        this.next = undefined;
      }
    }
    return false;
  }
}
