// JSON text as it arrives (a request body, a stream's message), walked once in pieces for what is refused
// before it is parsed: objects and arrays nested past a depth (json-depth.ts), naming the top-level member
// being read then, and the lists and maps of a request's JSON form past their bounds (src/shared/list-bounds.ts);
// and the name of its first top-level member, which tells a stream message's kind (kind-bounds.ts).
// Strings are jumped over (native indexOf to each closing quote); a member's name is read, escapes too, where
// a refusal names it or a list is followed through it. Text that is not JSON is left to the parser to refuse.
import type { JsonListNode } from "../shared/list-bounds.js";
import { tooManyItemsMessage } from "../shared/list-bounds.js";

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_LIST = 0x5b;
const CLOSE_LIST = 0x5d;
const COMMA = 0x2c;
/** The longest top-level member name a depth refusal repeats (bytes of its text). */
const NAMED_BYTES = 64;
/** Longer member names are not followed to a list: no field's name is this long. */
const MEMBER_NAME_BYTES = 128;

const isSpace = (c: number) => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
/** Where the text stands for its first top-level member: before its first byte, after its object's brace, in the member's name, past it. */
const First = { Text: 0, Object: 1, Name: 2, Known: 3 } as const;
const isOpen = (c: number) => c === OPEN_OBJECT || c === OPEN_LIST;
const isClose = (c: number) => c === CLOSE_OBJECT || c === CLOSE_LIST;

/** A member's name as written (its escapes read); undefined where it is not JSON (the parser refuses it). */
function decoded(raw: string): string | undefined {
  try {
    return JSON.parse(`"${raw}"`) as string;
  } catch {
    return undefined;
  }
}

/** A list or object followed along the list tree. */
interface Frame {
  node: JsonListNode;
  /** The field's proto name (a refusal's path); "" for the request's own object. */
  name: string;
  items: number;
  /** An object expects a member's name next; a list, an item. */
  expect: boolean;
}

/**
 * Measures JSON text fed in pieces: how deep it nests (as jsonDepthExceeds counts the parsed value), stopping at
 * the first level past `maxDepth`, and, given a request type's list tree (jsonListTree), how many items its lists
 * and maps hold (members matched by proto or JSON name), up to the first one past its bound. A list past its
 * bound does not stop the measure of depth: a body is refused as too deep first. It also reads the name of the
 * text's first top-level member (firstMember()); one made by firstMemberReader() reads no further than that.
 */
export class JsonScanner {
  private inString = false;
  /** Inside a string, the last byte was a backslash that escapes the next one. */
  private escaped = false;
  /** The string being read is a member's name: its first bytes (escapes as written) and its length. */
  private name: Buffer[] | undefined;
  private nameKept = 0;
  private nameBytes = 0;
  /** What the name is read for: a depth refusal (a top-level member), a list followed (a followed message's member), the first member. */
  private nameIsTop = false;
  private nameIsMember = false;
  private nameIsFirst = false;

  private depth = 0;
  private tooDeep = false;
  /** The text is an object, and the next string at its top level is a member's name. */
  private topIsObject = false;
  private topNameNext = false;
  private topName: string | undefined;
  /** How far the first top-level member is read (First), and its name once it is. */
  private first: number = First.Text;
  private firstName: string | undefined;

  private readonly stack: Frame[] = [];
  private started = false;
  /** Levels into a value not followed. */
  private skip = 0;
  /** The member whose value comes next, when followed. */
  private next: { name: string; node: JsonListNode } | undefined;
  private tooMany: string | undefined;

  constructor(
    private readonly maxDepth: number,
    private readonly lists?: JsonListNode,
    /** The text is read no further than its first top-level member's name. */
    private readonly untilFirstMember = false,
  ) {}

  /** A scanner for the first top-level member's name alone: exceeds() reads no further than it takes to know it. */
  static firstMemberReader(): JsonScanner {
    return new JsonScanner(Number.POSITIVE_INFINITY, undefined, true);
  }

  /** The top-level member whose value was being read when the text went too deep (undefined: none). */
  member(): string | undefined {
    return this.tooDeep ? this.topName : undefined;
  }

  /** The refusal of the first list past its bound (tooManyItemsMessage's), once one is. */
  listRefusal(): string | undefined {
    return this.tooMany;
  }

  /** The first top-level member is known from the text so far: its name was read, or the text holds none. */
  get firstKnown(): boolean {
    return this.first === First.Known;
  }

  /**
   * The name of the text's first top-level member (escapes read), once known; undefined while it is not, for
   * text that is no object or an object without members, and for a name no field has (longer than
   * MEMBER_NAME_BYTES, or not JSON).
   */
  firstMember(): string | undefined {
    return this.firstName;
  }

  private startName(): void {
    if (this.name) return;
    this.name = [];
    this.nameKept = this.nameBytes = 0;
    this.nameIsTop = this.nameIsMember = this.nameIsFirst = false;
  }

  private keep(b: Buffer, from: number, to: number): void {
    if (!this.name || to <= from) return;
    this.nameBytes += to - from;
    const take = Math.min(to - from, MEMBER_NAME_BYTES - this.nameKept);
    if (take <= 0) return;
    this.name.push(Buffer.from(b.subarray(from, from + take)));
    this.nameKept += take;
  }

  private nameEnded(): void {
    const raw = Buffer.concat(this.name!);
    this.name = undefined;
    if (this.nameIsTop) {
      const cut = raw.subarray(0, NAMED_BYTES).toString("utf8");
      this.topName = decoded(cut) ?? cut; // cut inside an escape
    }
    const name = this.nameIsMember || this.nameIsFirst ? (this.nameBytes > MEMBER_NAME_BYTES ? undefined : decoded(raw.toString("utf8"))) : undefined;
    if (this.nameIsFirst) {
      this.firstName = name;
      this.first = First.Known;
    }
    if (this.nameIsMember) {
      const top = this.stack[this.stack.length - 1]!;
      this.next = name === undefined || top.node.kind !== "message" ? undefined : top.node.members.get(name);
    }
  }

  /** A byte outside strings, not white space, before the first member is known: whether the text is an object, and its first member's name next. */
  private firstAt(c: number): void {
    if (this.first === First.Text && c === OPEN_OBJECT) this.first = First.Object;
    else if (this.first === First.Object && c === QUOTE) this.first = First.Name;
    else this.first = First.Known; // no object, or one without members
  }

  /** Takes the next bytes of the text; true once it has nested deeper than `maxDepth` (listRefusal() aside). */
  exceeds(piece: Uint8Array): boolean {
    if (this.tooDeep) return true;
    if (this.untilFirstMember && this.first === First.Known) return false;
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
          if (this.untilFirstMember && this.first === First.Known) return false;
        } else {
          this.keep(b, i, q + 1);
        }
        i = q + 1;
        continue;
      }
      const c = b[i++]!;
      if (this.first < First.Name && !isSpace(c)) {
        this.firstAt(c);
        if (this.untilFirstMember && this.first === First.Known) return false;
      }
      if (c === QUOTE) {
        this.inString = true;
        if (this.topNameNext && this.depth === 1) {
          this.topNameNext = false;
          this.startName();
          this.nameIsTop = true;
          this.nameIsFirst = this.first === First.Name;
        }
      } else if (isOpen(c)) {
        if (this.depth === 0) this.topIsObject = this.topNameNext = c === OPEN_OBJECT;
        if (++this.depth > this.maxDepth) return (this.tooDeep = true);
      } else if (isClose(c)) {
        this.depth--;
      } else if (c === COMMA && this.depth === 1 && this.topIsObject) {
        this.topNameNext = true;
      }
      if (this.lists && !this.tooMany && !isSpace(c)) this.follow(c);
    }
    return false;
  }

  /** A byte outside strings, for the lists: an item counted, a member's value followed or not. */
  private follow(c: number): void {
    if (this.skip > 0) {
      if (isOpen(c)) this.skip++;
      else if (isClose(c)) this.skip--;
      return;
    }
    if (!this.started) {
      this.started = true;
      this.open(c, "", this.lists);
      return;
    }
    const top = this.stack[this.stack.length - 1];
    // After the request's own value: the parser refuses anything more.
    if (!top) return;
    if (top.node.kind === "list") {
      if (c === CLOSE_LIST) this.stack.pop();
      else if (c === COMMA) top.expect = true;
      else if (top.expect) {
        top.expect = false;
        if (!this.count(top) && isOpen(c)) this.open(c, "", top.node.element);
      }
      return;
    }
    // An object: a message's members, or a map's entries.
    if (c === CLOSE_OBJECT) {
      this.stack.pop();
    } else if (c === COMMA) {
      top.expect = true;
      this.next = undefined;
    } else if (c === QUOTE) {
      if (!top.expect) return;
      top.expect = false;
      if (top.node.kind === "map") {
        if (!this.count(top)) this.next = top.node.element && { name: "", node: top.node.element };
      } else {
        this.startName();
        this.nameIsMember = true;
      }
    } else if (isOpen(c)) {
      this.open(c, this.next?.name ?? "", this.next?.node);
      this.next = undefined;
    }
  }

  /** One more item in `top`; true once that is past its bound. */
  private count(top: Frame): boolean {
    const node = top.node as JsonListNode & { max: number };
    if (node.max > 0 && ++top.items > node.max) {
      this.tooMany = tooManyItemsMessage(this.stack.map((f) => f.name).filter(Boolean).join("."), node.max);
      return true;
    }
    return false;
  }

  /** A container opened where `node` (if any) is followed. */
  private open(c: number, name: string, node: JsonListNode | undefined): void {
    const fits = node && (node.kind === "list" ? c === OPEN_LIST : c === OPEN_OBJECT);
    if (fits) this.stack.push({ node, name, items: 0, expect: true });
    else this.skip = 1;
  }
}
