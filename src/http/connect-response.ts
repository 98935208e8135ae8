// A Connect call's answer written to its Node response: what
// @connectrpc/connect-node's universalResponseToNodeResponse does, but for how
// a write waits for room. Connect's writer waits for "drain" or "error", and a
// connection closed under a write held back says neither (an HTTP/2 stream or
// an HTTP/1.1 socket destroyed while answers were still queued for it only
// closes): the call never ended, and a daemon's stream whose client left with
// thousands of answers unread stayed open, subscribed to its provider's
// notices, counted as connected, holding every answer. Here a write waits for
// room or for the response to close (drained.ts); closed, the answers stop and
// the call is told as of a failed write (its answers' iterator thrown into, as
// Connect does), so that its implementation ends. A client that reads slowly is
// waited for, as before.
import type { OutgoingHttpHeaders, ServerResponse } from "node:http";
import { Code, ConnectError } from "@connectrpc/connect";
import type { UniversalServerResponse } from "@connectrpc/connect/protocol";
import { closed, drained } from "./drained.js";
import type { NodeResponse } from "./rest.js";

/** The client went away before the answers ended (failureLogLevel logs it at info). */
function gone(): Error {
  return Object.assign(new Error("the client went away before the answers ended"), { code: "ERR_STREAM_PREMATURE_CLOSE" });
}

function nodeHeaders(web: Headers | undefined): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  web?.forEach((value, key) => {
    const had = out[key];
    out[key] = had === undefined ? value : Array.isArray(had) ? [...had, value] : [String(had), value];
  });
  return out;
}

/** Writes `chunk`; resolves once the response has room for more, rejects once it closed. */
async function write(res: NodeResponse, chunk: Uint8Array): Promise<void> {
  if (closed(res)) throw gone();
  if (!(res as ServerResponse).write(chunk)) await drained(res);
  if (closed(res)) throw gone();
}

/**
 * Writes `answer` to `res`: its headers with its first piece (the implementation may set them until
 * then), each piece once the last one found room, its trailers, the end. Rejects with Aborted when the
 * response closed first (the client gone), having thrown that into the answers when it closed under a
 * write.
 */
export async function writeResponse(answer: UniversalServerResponse, res: NodeResponse): Promise<void> {
  const it = answer.body?.[Symbol.asyncIterator]();
  let writing = false;
  try {
    if (it) {
      let piece = await it.next();
      writing = true;
      if (closed(res)) throw gone();
      res.writeHead(answer.status, nodeHeaders(answer.header));
      writing = false;
      for (; piece.done !== true; piece = await it.next()) {
        writing = true;
        await write(res, piece.value);
        writing = false;
      }
    }
    if (closed(res)) return;
    if (!res.headersSent) res.writeHead(answer.status, nodeHeaders(answer.header));
    if (answer.trailer) res.addTrailers(nodeHeaders(answer.trailer));
    res.end();
  } catch (err) {
    // The answers learn that a write failed: their implementation's finally runs.
    if (writing) it?.throw?.(err).catch(() => {});
    throw closed(res) ? new ConnectError("the client went away", Code.Aborted, undefined, undefined, err) : ConnectError.from(err);
  } finally {
    it?.return?.().catch(() => {});
  }
}
