// Each kind of message a daemon sends on its stream has a byte bound of its own (DAEMON_MESSAGE_MAX_BYTES),
// below the stream's 16 MiB: a heartbeat no larger than the REST heartbeat's body, a hello 1 MiB (room for
// the 4,096 jobs it may name besides the machine's description), while a result keeps the stream's bound.
// A message over its kind's bound ends the stream (resource_exhausted, naming the kind and its bound), held
// on its envelope's declared length before it is read where the first bytes tell the kind: on gRPC (the
// service's own stream path), and on Connect's streaming protocol in JSON and in the binary codec compressed.
import http2 from "node:http2";
import * as grpc from "@grpc/grpc-js";
import { create, fromJson, toBinary, toJsonString, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import { Code } from "@connectrpc/connect";
import { codeFromString } from "@connectrpc/connect/protocol-connect";
import { describe, expect, it } from "vitest";
import { DaemonMessageSchema, DaemonService } from "../../gen/svc/v1/daemon_pb.js";
import { bodyLimitBytesOf, HEARTBEAT_BODY_LIMIT_BYTES } from "../../src/http/body.js";
import { newJobId } from "../../src/domain/jobs/submit.js";
import { HELLO_MAX_JOB_IDS } from "../../src/services/daemon.js";
import { DAEMON_MESSAGE_MAX_BYTES, HELLO_MAX_BYTES } from "../../src/services/daemon-wire.js";
import { client } from "../helpers/http.js";
import { makeProvider, makeRenter } from "../helpers/fixtures.js";
import { openStream, useStreamServer } from "./grpc-stream.js";
import { waitFor } from "./helpers.js";

const { srv, streams } = useStreamServer();
const api = client(srv);

const LIMIT = HEARTBEAT_BODY_LIMIT_BYTES;
const refusal = (kind: string, size: number, max: number) => `a ${kind} message of ${size} bytes is over the ${max} a ${kind} may take`;
/** A result larger than a heartbeat may be, and than the REST logs and daemon-event bodies: a stream's result takes it. */
const BIG_RESULT_CHARS = 2 * 1024 * 1024;

type Sent = MessageInitShape<typeof DaemonMessageSchema>;
const hello: Sent = { kind: { case: "hello", value: { daemonVersion: "5.0.0", gpus: [{ name: "NVIDIA GeForce RTX 4090", vram_mib: 24564 }] } } };

const binaryOf = (m: Sent) => Buffer.from(toBinary(DaemonMessageSchema, create(DaemonMessageSchema, m)));
const jsonOf = (m: Sent) => Buffer.from(toJsonString(DaemonMessageSchema, create(DaemonMessageSchema, m)));

/** The padding that makes `size(pad)` exactly `target` bytes (sizes grow by one a character between varint steps). */
function padTo(target: number, size: (pad: number) => number): number {
  let pad = target - size(0);
  for (let i = 0; i < 4 && size(pad) !== target; i++) pad += target - size(pad);
  expect(size(pad)).toBe(target);
  return pad;
}

const beatOf = (pad: number): Sent => ({
  kind: { case: "heartbeat", value: { daemonVersion: "5.0.0", gpuStatus: fromJson(ValueSchema, { gpu_name: "NVIDIA GeForce RTX 4090", note: "a".repeat(pad) }) } },
});
const paddedHelloOf = (pad: number): Sent => ({ kind: { case: "hello", value: { daemonVersion: "5.0.0", resourceSpec: { note: "a".repeat(pad) } } } });

/** A field of a message in the binary codec: its tag, its length, its bytes (or only the length `declared`). */
const part = (no: number, body: Uint8Array, declared?: number) => {
  const w = new BinaryWriter().tag(no, WireType.LengthDelimited);
  return Buffer.from((declared === undefined ? w.bytes(body) : w.uint32(declared).raw(body)).finish());
};
/** An envelope (a flag byte, the length `declared`, by default the payload's) and the payload. */
function envelope(payload: Buffer, declared = payload.length): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32BE(declared, 1);
  return Buffer.concat([head, payload]);
}

async function submitTo(providerId: number) {
  const renter = await makeRenter(srv, 1_000);
  const r = await api.post("/api/jobs/submit", { job_type: "benchmark", duration_minutes: 1, params: { suite: "quick", iterations: 1 }, provider_id: providerId }, renter.headers);
  expect(r.status, r.text).toBe(201);
}

/** How a stream ended: its status code and message. */
interface Ended {
  code: number | undefined;
  message: string | undefined;
}

/**
 * A daemon stream over raw HTTP/2 in `type` (gRPC or Connect's streaming protocol, either codec): the messages
 * it received (their payloads), and how it ended (gRPC's trailers, Connect's end-of-stream message).
 */
function rawStream(key: string, type: string) {
  const session = http2.connect(srv.url);
  session.on("error", () => {});
  const stream = session.request({ ":method": "POST", ":path": "/svc.v1.DaemonService/Connect", "content-type": type, te: "trailers", "x-provider-key": key });
  stream.on("error", () => {});
  let buf = Buffer.alloc(0);
  const messages: Buffer[] = [];
  let end: { error?: { code: string; message: string } } | undefined;
  stream.on("data", (c: Buffer) => {
    buf = Buffer.concat([buf, c]);
    while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
      const payload = buf.subarray(5, 5 + buf.readUInt32BE(1));
      if (buf[0]! & 0x02) end = JSON.parse(payload.toString("utf8"));
      else messages.push(payload);
      buf = buf.subarray(5 + buf.readUInt32BE(1));
    }
  });
  const trailers = new Promise<http2.IncomingHttpHeaders>((resolve) => {
    let t: http2.IncomingHttpHeaders = {};
    stream.once("trailers", (h) => (t = h));
    stream.once("close", () => resolve(t));
  });
  const ended = async (): Promise<Ended> => {
    if (type.startsWith("application/grpc")) {
      const t = await trailers;
      return { code: Number(t["grpc-status"]), message: decodeURIComponent(String(t["grpc-message"] ?? "")) };
    }
    const { error } = await waitFor(() => end, 20_000, "the stream's end");
    return { code: error && codeFromString(error.code), message: error?.message };
  };
  return { stream, messages, ended, endOfStream: () => end, close: () => session.destroy() };
}

/** A daemon stream as its messages and answers: sent and read in one codec, on one path. */
interface Conversation {
  send(m: Sent): void;
  /** The next answer of that kind (its JSON form's names). */
  next(kind: string): Promise<Record<string, unknown>>;
  ended(): Promise<Ended>;
  close(): void;
}

interface Wire {
  name: string;
  /** A message's size in the wire's codec. */
  size(m: Sent): number;
  open(key: string): Conversation;
}

const WIRES: Wire[] = [
  {
    name: "over gRPC (binary)",
    size: (m) => binaryOf(m).length,
    open: (key) => {
      const s = openStream(srv.port, key);
      streams.push(s);
      return {
        send: (m) => s.send(m.kind),
        next: async (kind) => (await s.next(kind as never)) as Record<string, unknown>,
        ended: async () => {
          const { code, details } = await s.ended;
          return { code, message: details };
        },
        close: () => s.cancel(),
      };
    },
  },
  {
    name: "in Connect's streaming protocol, JSON",
    size: (m) => jsonOf(m).length,
    open: (key) => {
      const s = rawStream(key, "application/connect+json");
      let seen = 0;
      return {
        send: (m) => s.stream.write(envelope(jsonOf(m))),
        next: async (kind) => {
          const { answer } = await waitFor(() => {
            while (seen < s.messages.length) {
              const m = JSON.parse(s.messages[seen++]!.toString("utf8")) as Record<string, Record<string, unknown>>;
              if (kind in m) return { answer: m[kind] };
            }
            return s.endOfStream() && { answer: undefined };
          }, 20_000, kind);
          if (!answer) throw new Error(`the stream ended before a ${kind}: ${JSON.stringify(s.endOfStream())}`);
          return answer;
        },
        ended: s.ended,
        close: s.close,
      };
    },
  },
];

/** What a daemon on an 8-GPU machine describes of it in its hello: each GPU (its MIG instances and NVLinks), the host, its cached models. */
function machine() {
  const hex = (n: number, seed: number) => Array.from({ length: n }, (_, k) => ((seed * 7 + k * 13) % 16).toString(16)).join("");
  const uuid = (seed: number) => `${hex(8, seed)}-${hex(4, seed + 1)}-${hex(4, seed + 2)}-${hex(4, seed + 3)}-${hex(12, seed + 4)}`;
  const clocks = { graphics: 1980, sm: 1980, memory: 2619, video: 1545 };
  const gpus = Array.from({ length: 8 }, (_, i) => ({
    index: i,
    name: "NVIDIA H100 80GB HBM3",
    uuid: `GPU-${uuid(i)}`,
    serial: `16549220${String(i).padStart(5, "0")}`,
    pci_bus_id: `00000000:${(0x18 + i * 0x20).toString(16).toUpperCase()}:00.0`,
    vram_mib: 81559,
    vram_used_mib: 0,
    driver_version: "550.54.15",
    cuda_version: "12.4",
    vbios_version: "96.00.89.00.01",
    compute_capability: "9.0",
    power_limit_w: 700,
    power_draw_w: 71.3,
    temperature_c: 31,
    clocks_mhz: clocks,
    max_clocks_mhz: { ...clocks, video: 1980 },
    ecc: { mode: "enabled", volatile: { corrected: 0, uncorrected: 0 }, aggregate: { corrected: 0, uncorrected: 0 }, remapped_rows: { correctable: 0, uncorrectable: 0, pending: false } },
    mig: {
      mode: "enabled",
      instances: Array.from({ length: 7 }, (_, k) => ({ gpu_instance: k + 7, compute_instance: 0, profile: "1g.10gb", uuid: `MIG-${uuid(i * 8 + k)}`, memory_mib: 9856, sm_count: 16 })),
    },
    nvlink: Array.from({ length: 18 }, (_, l) => ({ link: l, state: "active", version: 4, speed_gbps: 26.562, remote: "NVSwitch", remote_pci_bus_id: `00000008:0${(l % 4) + 5}:00.0` })),
    topology: Object.fromEntries(Array.from({ length: 8 }, (_, j) => [`GPU${j}`, j === i ? "X" : "NV18"])),
    cpu_affinity: i < 4 ? "0-55,112-167" : "56-111,168-223",
    numa_node: i < 4 ? 0 : 1,
  }));
  const resourceSpec = {
    hostname: "gpu-node-07",
    os: "Ubuntu 22.04.4 LTS",
    kernel: "5.15.0-105-generic",
    cpu: { model: "Intel(R) Xeon(R) Platinum 8480+", sockets: 2, cores: 112, threads: 224 },
    ram_mib: 2063731,
    disks: Array.from({ length: 8 }, (_, d) => ({ device: `/dev/nvme${d}n1`, model: "SAMSUNG MZQL23T8HCLS-00A07", size_gb: 3840, mount: d === 0 ? "/" : `/data${d}` })),
    network: Array.from({ length: 9 }, (_, n) => ({ name: n === 0 ? "eno1" : `ibp${n}s0`, kind: n === 0 ? "ethernet" : "infiniband", speed_gbps: n === 0 ? 25 : 400 })),
    docker: { version: "26.1.3", runtime: "nvidia", nvidia_container_toolkit: "1.15.0" },
  };
  const cachedModels = ["meta-llama/Meta-Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-72B-Instruct", "black-forest-labs/FLUX.1-dev"];
  return { gpus, resourceSpec, cachedModels };
}

describe("the bounds", () => {
  it("hold a heartbeat to the REST heartbeat's body limit, a hello to 1 MiB, and a result and a log batch to the stream's", () => {
    expect(LIMIT).toBe(256 * 1024);
    expect(DAEMON_MESSAGE_MAX_BYTES.heartbeat).toBe(LIMIT);
    expect(DAEMON_MESSAGE_MAX_BYTES.hello).toBe(HELLO_MAX_BYTES);
    expect(HELLO_MAX_BYTES).toBe(1024 * 1024);
    expect(DAEMON_MESSAGE_MAX_BYTES.result).toBe(bodyLimitBytesOf(DaemonService.method.connect));
    expect(DAEMON_MESSAGE_MAX_BYTES.logs).toBe(bodyLimitBytesOf(DaemonService.method.connect));
  });

  it("are the REST heartbeat's: a body one byte over it is refused there", async () => {
    const p = await makeProvider(srv);
    const bodyOf = (pad: number) => JSON.stringify({ gpu_status: { gpu_name: "NVIDIA GeForce RTX 4090", note: "a".repeat(pad) } });
    const body = bodyOf(padTo(LIMIT + 1, (pad) => Buffer.byteLength(bodyOf(pad))));
    const over = await fetch(`${srv.url}/api/providers/heartbeat`, { method: "POST", headers: { "content-type": "application/json", "x-provider-key": p.key }, body });
    expect(over.status).toBe(413);
    expect(await over.json()).toEqual({ error: "request body too large (limit 256 KiB)" });
  });
});

describe.each(WIRES)("a daemon stream $name", (wire) => {
  /** A message of exactly `size` bytes in the wire's codec, padded by `of`. */
  const sized = (size: number, of: (pad: number) => Sent) => of(padTo(size, (pad) => wire.size(of(pad))));
  /** A new provider's stream opened with `first` (welcomed, unless `first` ends it), given to `fn`, closed after it. */
  async function opened(first: Sent, fn: (s: Conversation, providerId: number) => Promise<void>): Promise<void> {
    const p = await makeProvider(srv);
    const s = wire.open(p.key);
    try {
      s.send(first);
      await fn(s, p.id);
    } finally {
      s.close();
    }
  }

  it("acks a heartbeat of the bound's size and ends at one a byte larger, naming the kind and its bound", () =>
    opened(hello, async (s) => {
      await s.next("welcome");
      s.send(sized(LIMIT, beatOf));
      expect((await s.next("heartbeatAck")).success).toBe(true);
      s.send(sized(LIMIT + 1, beatOf));
      expect(await s.ended()).toEqual({ code: Code.ResourceExhausted, message: refusal("heartbeat", LIMIT + 1, LIMIT) });
    }));

  it("takes a hello naming the most held jobs it may, with their attempts, and a multi-GPU machine's description", async () => {
    const ids = Array.from({ length: HELLO_MAX_JOB_IDS }, () => newJobId());
    const attempts = Object.fromEntries(ids.map((id, k) => [id, 1 + (k % 3)]));
    const full: Sent = { kind: { case: "hello", value: { daemonVersion: "5.0.0", ...machine(), runningJobIds: ids, runningJobAttempts: attempts } } };
    // More than a heartbeat may take, well within a hello's bound.
    expect(wire.size(full)).toBeGreaterThan(LIMIT);
    expect(wire.size(full)).toBeLessThan(HELLO_MAX_BYTES / 2);
    await opened(full, async (s) => {
      await s.next("welcome");
      // Each held job is read: none of them is this server's, and each is cancelled.
      const cancelled: unknown[] = [];
      for (const _ of ids) cancelled.push((await s.next("cancel")).jobId);
      expect(cancelled).toEqual(ids);
    });
  });

  it("refuses a hello a byte over its bound before the welcome", () =>
    opened(sized(HELLO_MAX_BYTES + 1, paddedHelloOf), async (s) => {
      expect(await s.ended()).toEqual({ code: Code.ResourceExhausted, message: refusal("hello", HELLO_MAX_BYTES + 1, HELLO_MAX_BYTES) });
    }));

  it("takes a result far larger than a heartbeat may be", () =>
    opened(hello, async (s, providerId) => {
      await s.next("welcome");
      await submitTo(providerId);
      const jobId = (await s.next("job")).jobId as string;
      s.send({ kind: { case: "jobAccepted", value: { jobId } } });
      const result = "r".repeat(BIG_RESULT_CHARS);
      s.send({ kind: { case: "result", value: { jobId, success: true, result: fromJson(ValueSchema, result) } } });
      expect((await s.next("resultAck")).status).toBe("completed");
      const [row] = await srv.sql<{ result: JsonValue }[]>`SELECT result FROM jobs WHERE job_id = ${jobId}`;
      expect(row!.result).toBe(result);
    }));
});

describe("a daemon stream, as bytes", () => {
  /** A heartbeat's envelope declaring 8 MiB and more, and the first bytes that tell its kind: of the rest, none is sent. */
  const BODY = 8 * 1024 * 1024;
  const binaryHead = part(2, Buffer.alloc(0), BODY);
  // In JSON, its member's name escaped, as JSON may write it.
  const jsonHead = Buffer.from(' {"\\u0068eartbeat": {"gpuStatus": "');
  const cases: [string, Buffer, Buffer, number][] = [
    ["application/grpc", binaryOf(hello), binaryHead, binaryHead.length + BODY],
    ["application/connect+proto", binaryOf(hello), binaryHead, binaryHead.length + BODY],
    ["application/connect+json", jsonOf(hello), jsonHead, BODY],
  ];

  it.each(cases)("%s: refuses a heartbeat by its declared length and first bytes, the rest never sent", async (type, helloBytes, head, size) => {
    const p = await makeProvider(srv);
    const s = rawStream(p.key, type);
    try {
      s.stream.write(envelope(helloBytes));
      await waitFor(() => s.messages.length > 0, 10_000, "the welcome");
      s.stream.write(envelope(head, size));
      expect(await s.ended()).toEqual({ code: Code.ResourceExhausted, message: refusal("heartbeat", size, LIMIT) });
    } finally {
      s.close();
    }
  });

  it("holds a message of several fields to the kind it is read as: the last member of the oneof", async () => {
    const p = await makeProvider(srv);
    const beat = binaryOf({ kind: { case: "heartbeat", value: { daemonVersion: "5.0.0" } } });
    // A heartbeat, then an unknown field 99 of padding; and a padded result, then a heartbeat (read as a heartbeat).
    const padding = part(99, Buffer.alloc(LIMIT));
    const result = part(8, Buffer.concat([part(1, Buffer.from("job-x")), padding]));
    for (const message of [Buffer.concat([beat, padding]), Buffer.concat([result, beat])]) {
      const s = openStream(srv.port, p.key);
      streams.push(s);
      s.send(hello.kind);
      await s.next("welcome");
      s.sendBytes(message);
      expect(await s.ended).toEqual({ code: grpc.status.RESOURCE_EXHAUSTED, details: refusal("heartbeat", message.length, LIMIT) });
    }
  });

  it("refuses a compressed heartbeat (left to Connect) by its size once inflated", async () => {
    const p = await makeProvider(srv);
    const beat = (size: number) => beatOf(padTo(size, (pad) => binaryOf(beatOf(pad)).length)).kind;
    // grpc-js compressing every message with gzip: the padding compresses to almost nothing.
    const s = openStream(srv.port, p.key, { "grpc.default_compression_algorithm": 2 });
    streams.push(s);
    s.send(hello.kind);
    await s.next("welcome");
    s.send(beat(LIMIT));
    expect((await s.next("heartbeatAck")).success).toBe(true);
    s.send(beat(LIMIT + 1));
    expect(await s.ended).toEqual({ code: grpc.status.RESOURCE_EXHAUSTED, details: refusal("heartbeat", LIMIT + 1, LIMIT) });
  });
});
