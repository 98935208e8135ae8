// A minimal Server-Sent Events reader: bytes in, the `data` of each event out.
// Upstreams (vLLM) send only `data:` lines; comments and other fields are skipped.
// The bytes come from providers' endpoints, so the reader holds only the event
// in progress, scans each byte once (only what just arrived is searched for the
// end of a line), and gives up on an event that grows past `maxEventLength`.

/** Longest single event accepted (characters, line ends and skipped lines included). */
export const MAX_SSE_EVENT_LENGTH = 1024 * 1024;

const LINE_END = /\r\n|\r|\n/g;

export class SseReader {
  private readonly decoder = new TextDecoder();
  /** The start of a line whose end has not arrived yet. */
  private line = "";
  /** The data lines of the event in progress. */
  private data: string[] = [];
  /** Characters of the event in progress so far. */
  private length = 0;
  /** The last chunk ended in CR: a LF opening the next one belongs to that line end. */
  private afterCr = false;
  private over = false;
  /** Characters searched for line ends so far (each arrives once: the reader's cost is linear in its input). */
  private searched = 0;

  constructor(private readonly maxEventLength = MAX_SSE_EVENT_LENGTH) {}

  /** Characters searched for line ends so far: at most what was pushed. */
  get scannedChars(): number {
    return this.searched;
  }

  /** An event grew past the limit: the reader has dropped it and reads nothing more. */
  get overflowed(): boolean {
    return this.over;
  }

  /** Feeds bytes; returns the data of every event completed by them. */
  push(chunk: Uint8Array): string[] {
    if (this.over) return [];
    return this.feed(this.decoder.decode(chunk, { stream: true }));
  }

  /** The data of a last event not followed by a blank line, if any. */
  end(): string[] {
    if (this.over) return [];
    const out = this.feed(this.decoder.decode());
    if (this.over) return out;
    if (this.line !== "") this.takeLine(this.line);
    this.line = "";
    this.dispatch(out);
    return out;
  }

  private feed(text: string): string[] {
    const out: string[] = [];
    let i = 0;
    if (text.length > 0) {
      if (this.afterCr && text.charCodeAt(0) === 10) i = 1;
      this.afterCr = false;
    }
    while (i < text.length) {
      LINE_END.lastIndex = i;
      const m = LINE_END.exec(text);
      const end = m ? m.index : text.length;
      this.searched += (m ? end + m[0].length : text.length) - i;
      this.length += end - i + (m ? 1 : 0);
      if (this.length > this.maxEventLength) {
        this.over = true;
        this.line = "";
        this.data = [];
        return out;
      }
      if (!m) {
        this.line += text.slice(i);
        break;
      }
      const line = this.line + text.slice(i, end);
      this.line = "";
      if (line === "") this.dispatch(out);
      else this.takeLine(line);
      i = end + m[0].length;
      if (m[0] === "\r" && i === text.length) this.afterCr = true;
    }
    return out;
  }

  private takeLine(line: string): void {
    if (line.startsWith("data:")) this.data.push(line.slice(line.charCodeAt(5) === 32 ? 6 : 5));
  }

  private dispatch(out: string[]): void {
    if (this.data.length > 0) out.push(this.data.join("\n"));
    this.data = [];
    this.length = 0;
  }
}

export const sseEvent = (data: string) => `data: ${data}\n\n`;
