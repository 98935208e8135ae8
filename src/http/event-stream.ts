// Server-streaming RPCs on REST: each streamed message is one server-sent
// event (text/event-stream). `data:` is the message as documented JSON,
// `event:` the name of its set oneof member (e.g. "log"), `id:` the field
// marked (svc.v1.sse_id), which browsers send back as Last-Event-ID when they
// reconnect. An error before the first message is an ordinary JSON answer
// with its status (the caller's, in rest.ts); one after it is a last
// `event: error` with {"error", "status"}.
import { create, getOption, type DescField, type DescMessage, type Message } from "@bufbuild/protobuf";
import { sse_id } from "../../gen/svc/v1/options_pb.js";
import { messageToJson } from "./json.js";
import { toHttpError } from "./errors.js";
import type { ServerResponse } from "node:http";
import type { Http2ServerResponse } from "node:http2";
import { closed, drained } from "./drained.js";

type NodeResponse = ServerResponse | Http2ServerResponse;

/** A comment line this often keeps proxies and load balancers from closing a quiet stream. */
const KEEPALIVE_MS = 15_000;

interface EventShape {
  idField: DescField | undefined;
  oneofLocalName: string | undefined;
}
const shapes = new WeakMap<DescMessage, EventShape>();

function shapeOf(desc: DescMessage): EventShape {
  let s = shapes.get(desc);
  if (!s) {
    s = { idField: desc.fields.find((f) => getOption(f, sse_id)), oneofLocalName: desc.oneofs[0]?.localName };
    shapes.set(desc, s);
  }
  return s;
}

/** One message as a server-sent event. */
export function sseFrame(desc: DescMessage, msg: Message): string {
  const { idField, oneofLocalName } = shapeOf(desc);
  let out = "";
  if (oneofLocalName) {
    const set = (msg as unknown as Record<string, { case?: string }>)[oneofLocalName]?.case;
    const field = set ? desc.fields.find((f) => f.localName === set) : undefined;
    if (field) out += `event: ${field.name}\n`;
  }
  if (idField) {
    const id = String((msg as unknown as Record<string, unknown>)[idField.localName] ?? "");
    if (id && !/[\r\n]/.test(id)) out += `id: ${id}\n`;
  }
  // JSON.stringify writes no raw line breaks: one data line.
  return `${out}data: ${JSON.stringify(messageToJson(desc, msg))}\n\n`;
}

/**
 * Frames by the streamed value: a stream that hands the same object to many
 * watchers (the job-watch hub does, per change) is serialized once, not once
 * per watcher.
 */
const frames = new WeakMap<object, string>();

function frameOf(desc: DescMessage, value: object): string {
  let f = frames.get(value);
  if (f === undefined) frames.set(value, (f = sseFrame(desc, create(desc, value as never))));
  return f;
}

const gone = (res: NodeResponse) => closed(res) || res.writableEnded;
/** HTTP/1.1 and HTTP/2 responses write alike; their union's overloads do not type-check as one. */
const write = (res: NodeResponse, text: string): boolean => (res as ServerResponse).write(text);


/**
 * Writes a server stream as text/event-stream. Throws (headers unsent) when
 * the stream fails before its first message; later errors end the stream
 * with an `error` event. Waits for the socket to drain between writes, so a
 * slow reader holds back its stream instead of filling memory.
 */
export async function writeEventStream(res: NodeResponse, desc: DescMessage, stream: AsyncIterable<unknown>, headers: Record<string, string>): Promise<void> {
  const it = stream[Symbol.asyncIterator]();
  let next = await it.next();
  res.writeHead(200, {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache, no-store",
    "x-accel-buffering": "no",
    ...headers,
  });
  const keepalive = setInterval(() => {
    if (!gone(res)) write(res, ": keep-alive\n\n");
  }, KEEPALIVE_MS);
  try {
    while (!next.done && !gone(res)) {
      if (!write(res, frameOf(desc, next.value as object))) await drained(res);
      next = await it.next();
    }
  } catch (err) {
    const e = toHttpError(err);
    if (!gone(res)) write(res, `event: error\ndata: ${JSON.stringify({ error: e.message, status: e.status })}\n\n`);
    if (e.status >= 500) throw err;
  } finally {
    clearInterval(keepalive);
    if (!next.done) await it.return?.(undefined);
    if (!gone(res)) res.end();
  }
}
