// Waiting out a response's backpressure: resolves once it drains, or once it
// closes (the client left), whichever comes first.
import type { EventEmitter } from "node:events";

export function drained(out: Pick<EventEmitter, "on" | "off">): Promise<void> {
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
