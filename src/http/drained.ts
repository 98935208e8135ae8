// Waiting out a response's backpressure: resolves once it drains, or once it
// closes (the client left), whichever comes first.
import type { EventEmitter } from "node:events";

type Out = Pick<EventEmitter, "on" | "off"> & { destroyed?: boolean; stream?: { destroyed: boolean; closed: boolean } };

/**
 * Whether the response can take no more writes: an HTTP/1.1 response destroyed, or an HTTP/2 one
 * whose stream closed (Http2ServerResponse has no `destroyed`, and a write to it after its stream
 * closed returns false with no "drain" or "close" to follow).
 */
export function closed(out: Out): boolean {
  return Boolean(out.destroyed || out.stream?.destroyed || out.stream?.closed);
}

export function drained(out: Out): Promise<void> {
  if (closed(out)) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      out.off("drain", done);
      out.off("close", done);
      resolve();
    };
    out.on("drain", done);
    out.on("close", done);
  });
}
