// Readers of a job's live events for tests: the SSE route over fetch, and
// WatchJob over a generated Connect client.
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { toJson } from "@bufbuild/protobuf";
import { JobEventSchema, JobService } from "../../gen/svc/v1/jobs_pb.js";

export interface SseEvent {
  id?: string;
  event?: string;
  data: any;
}

/** Parses complete events out of `buf`; returns them and the unfinished rest. */
function parseFrames(buf: string): { events: SseEvent[]; rest: string } {
  const events: SseEvent[] = [];
  let i: number;
  while ((i = buf.indexOf("\n\n")) >= 0) {
    const frame = buf.slice(0, i);
    buf = buf.slice(i + 2);
    const e: SseEvent = { data: undefined };
    const data: string[] = [];
    for (const line of frame.split("\n")) {
      if (line.startsWith(":")) continue;
      const c = line.indexOf(":");
      const field = c < 0 ? line : line.slice(0, c);
      const value = c < 0 ? "" : line.slice(c + 1).replace(/^ /, "");
      if (field === "id") e.id = value;
      else if (field === "event") e.event = value;
      else if (field === "data") data.push(value);
    }
    if (data.length === 0) continue;
    e.data = JSON.parse(data.join("\n"));
    events.push(e);
  }
  return { events, rest: buf };
}

export interface SseStream {
  status: number;
  contentType: string | null;
  /** Events so far (grows while the stream runs). */
  events: SseEvent[];
  /** Resolves when the server ends the stream (or it is cut). */
  ended: Promise<void>;
  /** Resolves once `pred` holds for the events received. */
  until(pred: (events: SseEvent[]) => boolean): Promise<void>;
  /** Cuts the connection from the client side. */
  cut(): void;
  /** The body of a non-200 answer. */
  errorBody?: any;
}

export async function openSse(url: string, headers: Record<string, string>): Promise<SseStream> {
  const ac = new AbortController();
  const res = await fetch(url, { headers: { accept: "text/event-stream", ...headers }, signal: ac.signal });
  const events: SseEvent[] = [];
  const waiters: { pred: (e: SseEvent[]) => boolean; resolve: () => void; reject: (e: Error) => void }[] = [];
  const check = () => {
    for (const w of [...waiters]) {
      if (w.pred(events)) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve();
      }
    }
  };
  const stream: SseStream = {
    status: res.status,
    contentType: res.headers.get("content-type"),
    events,
    ended: Promise.resolve(),
    until: (pred) =>
      new Promise((resolve, reject) => {
        waiters.push({ pred, resolve, reject });
        check();
      }),
    cut: () => ac.abort(),
  };
  if (res.status !== 200) {
    stream.errorBody = await res.json();
    return stream;
  }
  stream.ended = (async () => {
    const decoder = new TextDecoder();
    let buf = "";
    try {
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        buf += decoder.decode(chunk, { stream: true });
        const parsed = parseFrames(buf);
        buf = parsed.rest;
        events.push(...parsed.events);
        check();
      }
    } catch {
      // cut by the client
    } finally {
      for (const w of waiters.splice(0)) w.reject(new Error(`stream ended; events: ${JSON.stringify(events.map((e) => e.event))}`));
    }
  })();
  return stream;
}

export function jobClient(baseUrl: string, wire: "grpc" | "connect" = "grpc") {
  const transport = wire === "grpc" ? createGrpcTransport({ baseUrl }) : createConnectTransport({ baseUrl, httpVersion: "1.1" });
  return createClient(JobService, transport);
}

/** Every event of a WatchJob call as JSON (the shape the SSE data carries), until the stream ends. */
export async function watchAll(baseUrl: string, headers: Record<string, string>, jobId: string, cursor?: string, wire: "grpc" | "connect" = "grpc") {
  const out: any[] = [];
  for await (const e of jobClient(baseUrl, wire).watchJob({ jobId, cursor }, { headers })) {
    out.push(toJson(JobEventSchema, e, { useProtoFieldName: true }));
  }
  return out;
}
