// A daemon stream opened with the standard @grpc/grpc-js client (messages
// serialised with protobuf-es), with helpers to await the next message of a
// given kind.
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { afterEach, beforeEach } from "vitest";
import { DaemonMessageSchema, DaemonService, ServerMessageSchema, type ServerMessage } from "../../gen/svc/v1/daemon_pb.js";
import { useTestServer, type TestServer } from "../helpers/server.js";
import { clearMarketplace } from "../helpers/isolation.js";

const method = DaemonService.method.connect;
const definition = {
  connect: {
    path: `/${DaemonService.typeName}/${method.name}`,
    requestStream: true,
    responseStream: true,
    // Bytes go as they are (a message no client library would write).
    requestSerialize: (m: unknown) => Buffer.from(m instanceof Uint8Array ? m : toBinary(DaemonMessageSchema, m as never)),
    requestDeserialize: (b: Buffer) => fromBinary(DaemonMessageSchema, b),
    responseSerialize: (m: unknown) => Buffer.from(toBinary(ServerMessageSchema, m as never)),
    responseDeserialize: (b: Buffer) => fromBinary(ServerMessageSchema, b),
  },
};
const Client = grpc.makeGenericClientConstructor(definition, "DaemonService");

type Kind = NonNullable<ServerMessage["kind"]["case"]>;
export type Sent = MessageInitShape<typeof DaemonMessageSchema>["kind"];

export interface TestStream {
  send(kind: Sent): void;
  /** One message, its bytes as given. */
  sendBytes(bytes: Uint8Array): void;
  /** The next message of that kind (earlier messages of other kinds are kept). */
  next<K extends Kind>(kind: K, timeoutMs?: number): Promise<Extract<ServerMessage["kind"], { case: K }>["value"]>;
  /** Every message received so far. */
  received: ServerMessage[];
  ended: Promise<{ code?: number; details?: string }>;
  end(): void;
  cancel(): void;
}

export function openStream(port: number, key: string | undefined, options?: grpc.ChannelOptions): TestStream {
  const client = new Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure(), options) as any;
  const md = new grpc.Metadata();
  if (key) md.set("x-provider-key", key);
  const call = client.connect(md);
  const received: ServerMessage[] = [];
  const consumed = new Set<ServerMessage>();
  let wake: (() => void) | undefined;
  let finished: { code?: number; details?: string } | undefined;
  const ended = new Promise<{ code?: number; details?: string }>((resolve) => {
    call.on("error", (err: grpc.ServiceError) => {
      finished = { code: err.code, details: err.details };
      resolve(finished);
      wake?.();
    });
    call.on("end", () => {
      finished ??= {};
      resolve(finished);
      client.close();
      wake?.();
    });
  });
  call.on("data", (m: ServerMessage) => {
    received.push(m);
    wake?.();
  });
  return {
    received,
    ended,
    send(kind) {
      call.write(create(DaemonMessageSchema, { kind } as never));
    },
    sendBytes(bytes) {
      call.write(bytes);
    },
    async next(kind, timeoutMs = 10_000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const m = received.find((r) => r.kind.case === kind && !consumed.has(r));
        if (m) {
          consumed.add(m);
          return m.kind.value as never;
        }
        if (finished) throw new Error(`stream ended (${JSON.stringify(finished)}) before a ${kind} message`);
        const left = deadline - Date.now();
        if (left <= 0) throw new Error(`no ${kind} message within ${timeoutMs} ms; got ${received.map((r) => r.kind.case).join(", ")}`);
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, left);
          wake = () => {
            clearTimeout(t);
            resolve();
          };
        });
      }
    },
    end() {
      call.end();
    },
    cancel() {
      call.cancel();
      client.close();
    },
  };
}

/**
 * A test file's server for daemon streams (job sweep slowed down, the marketplace cleared
 * before each test) and the streams its tests open, cancelled as each test ends (the next
 * test's clearing waits for the server to let go of open streams).
 */
export function useStreamServer(env: Record<string, string> = {}): { srv: TestServer; streams: TestStream[] } {
  const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", ...env });
  const streams: TestStream[] = [];
  afterEach(() => {
    for (const s of streams.splice(0)) s.cancel();
  });
  beforeEach(() => clearMarketplace(srv));
  return { srv, streams };
}
