// A minimal Server-Sent Events reader: bytes in, the `data` of each event out.
// Upstreams (vLLM) send only `data:` lines; comments and other fields are skipped.
export class SseReader {
  private readonly decoder = new TextDecoder();
  private buffer = "";

  /** Feeds bytes; returns the data of every event completed by them. */
  push(chunk: Uint8Array): string[] {
    this.buffer += this.decoder.decode(chunk, { stream: true });
    return this.drain(false);
  }

  /** The data of a last event not followed by a blank line, if any. */
  end(): string[] {
    this.buffer += this.decoder.decode();
    return this.drain(true);
  }

  private drain(final: boolean): string[] {
    const out: string[] = [];
    const blocks = this.buffer.split(/\r\n\r\n|\n\n|\r\r/);
    this.buffer = final ? "" : blocks.pop()!;
    for (const block of blocks) {
      const data = block
        .split(/\r\n|\n|\r/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""));
      if (data.length > 0) out.push(data.join("\n"));
    }
    return out;
  }
}

export const sseEvent = (data: string) => `data: ${data}\n\n`;
