// The daemon stream's reader and writer (src/services/daemon-wire.ts): a
// heartbeat read by hand gives the message, the stored telemetry and the bytes
// that protobuf-es gives, and an ack written by hand is protobuf-es's bytes;
// anything else is left to protobuf-es.
import { describe, expect, it } from "vitest";
import { create, fromBinary, fromJson, toBinary, toJson, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { DaemonMessageSchema, ServerMessageSchema } from "../../gen/svc/v1/daemon_pb.js";
import { HeartbeatRequestSchema, HeartbeatResponseSchema } from "../../gen/svc/v1/providers_pb.js";
import { decodeDaemonMessage, encodeServerMessage } from "../../src/services/daemon-wire.js";
import { heartbeatInputOf } from "../../src/domain/providers/heartbeat.js";
import { gpuStatus } from "../../bench/fleet.js";

type Beat = MessageInitShape<typeof HeartbeatRequestSchema>;
const value = (json: JsonValue) => fromJson(ValueSchema, json);

const BEATS: [string, Beat][] = [
  ["empty", {}],
  ["a fleet daemon's", { gpuStatus: value(gpuStatus(3)), uptime: 3603, providerHostname: "rig-3", daemonVersion: "5.0.0" }],
  [
    "every typed field",
    {
      gpuStatus: value({ gpu_name: "NVIDIA L4", all_gpus: [{ index: 0 }, { index: 1 }], free_vram_mib: 1000, note: null, ok: true }),
      uptime: 0.5,
      providerIp: "10.0.0.2",
      providerHostname: "host ☃",
      cachedModels: ["llama3:8b", "mistral"],
      resourceSpec: { cpu: 16, ram_gb: 64, disks: [{ gb: 500 }] },
      daemonVersion: "5.1.0",
      supportedJobTypes: ["benchmark", "llm-inference"],
    },
  ],
  ["a bare list of GPUs", { gpuStatus: value([{ gpu_name: "A100" }]) }],
  [
    "text to make storable (NUL, escapes)",
    { gpuStatus: value({ gpu_name: "L4\u0000 \"x\"\n☃", gpu_count: "2", driver_version: 550.5, all_gpus: "not a list", extra: { "\u0000k": ["\u0000"] } }), uptime: 9 },
  ],
  ["telemetry over 16 KB", { gpuStatus: value({ gpu_name: "H100", gpu_vram_mib: 81559, cuda_version: "12.4", log: "x".repeat(20_000), all_gpus: [{}, {}] }), uptime: 1 }],
  ["an index key in telemetry (read as an object)", { gpuStatus: value({ gpu_name: "A10", 0: "first" }) }],
  ["empty telemetry", { gpuStatus: value({}), uptime: 2 }],
  ["a string for telemetry", { gpuStatus: value("nvidia-smi failed") }],
];

const bytesOf = (beat: Beat) => toBinary(DaemonMessageSchema, create(DaemonMessageSchema, { kind: { case: "heartbeat", value: beat } }));

describe("daemon-wire", () => {
  it.each(BEATS)("reads %s heartbeat as protobuf-es does", (_, beat) => {
    const bytes = bytesOf(beat);
    const reference = fromBinary(DaemonMessageSchema, bytes);
    const read = decodeDaemonMessage(bytes);
    expect(read.kind.case).toBe("heartbeat");
    if (read.kind.case !== "heartbeat" || reference.kind.case !== "heartbeat") throw new Error("not a heartbeat");
    // What the heartbeat stores and answers with.
    expect(heartbeatInputOf(read.kind.value)).toEqual(heartbeatInputOf(reference.kind.value));
    if (beat.gpuStatus?.kind?.case === "structValue" && "gpu_name" in (beat.gpuStatus.kind.value.fields ?? {})) {
      expect(heartbeatInputOf(read.kind.value).telemetryJson).toContain('"gpu_name":');
    }
    // The message itself: its gpu_status is there for any reader, and it encodes to the same bytes.
    if (reference.kind.value.gpuStatus) expect(toJson(ValueSchema, read.kind.value.gpuStatus!)).toEqual(toJson(ValueSchema, reference.kind.value.gpuStatus));
    else expect(read.kind.value.gpuStatus).toBeUndefined();
    expect(Buffer.from(toBinary(DaemonMessageSchema, read))).toEqual(Buffer.from(bytes));
  });

  it("forgets the telemetry it read when gpu_status is replaced", () => {
    const bytes = bytesOf(BEATS[1]![1]);
    const [read, reference] = [decodeDaemonMessage(bytes), fromBinary(DaemonMessageSchema, bytes)];
    if (read.kind.case !== "heartbeat" || reference.kind.case !== "heartbeat") throw new Error("not a heartbeat");
    const replaced = () => fromJson(ValueSchema, { gpu_name: "replaced" });
    read.kind.value.gpuStatus = replaced();
    reference.kind.value.gpuStatus = replaced();
    expect(heartbeatInputOf(read.kind.value)).toEqual(heartbeatInputOf(reference.kind.value));
    expect(heartbeatInputOf(read.kind.value).telemetryJson).toContain('"gpu_name":"replaced"');
  });

  it("leaves other messages, and heartbeats it does not read plainly, to protobuf-es", () => {
    const hello = toBinary(DaemonMessageSchema, create(DaemonMessageSchema, { kind: { case: "hello", value: { daemonVersion: "5.0.0", runningJobIds: ["job-1"] } } }));
    expect(decodeDaemonMessage(hello)).toEqual(fromBinary(DaemonMessageSchema, hello));
    const odd: Uint8Array[] = [
      bytesOf({ raw: { api_key: "x", gpu_status: { gpu_name: "A" } } }), // REST's whole-body field
      toBinary(ValueSchema, create(ValueSchema, {})), // not a DaemonMessage heartbeat at all
      Buffer.concat([bytesOf({ uptime: 1 }), bytesOf({ daemonVersion: "5" })]), // two heartbeats, merged
      bytesOf({ gpuStatus: create(ValueSchema, { kind: { case: "numberValue", value: NaN } }) }),
    ];
    for (const bytes of odd) {
      const reference = (() => {
        try {
          return { ok: fromBinary(DaemonMessageSchema, bytes) };
        } catch (err) {
          return { err: (err as Error).message };
        }
      })();
      if ("ok" in reference) expect(decodeDaemonMessage(bytes)).toEqual(reference.ok);
      else expect(() => decodeDaemonMessage(bytes)).toThrow(reference.err);
    }
  });
});

describe("daemon-wire: the heartbeat's ack", () => {
  type Ack = MessageInitShape<typeof HeartbeatResponseSchema>;
  const ACKS: [string, Ack][] = [
    ["empty", {}],
    ["a usual", { success: true, message: "Heartbeat received", timestamp: new Date(0).toISOString(), latestVersion: "5.1.0", minVersion: "4.0.0", approvalStatus: "approved", approved: true }],
    [
      "a full",
      {
        success: true,
        message: "ü ☃ 𝄞 ".repeat(40), // a length over one varint byte
        timestamp: "2026-11-27T10:00:00.000Z",
        updateAvailable: true,
        needsUpdate: true,
        latestVersion: "5.1.0",
        minVersion: "5.0.0",
        approvalStatus: "approved",
        approved: true,
        preloadModel: { modelName: "llama3:8b", status: "downloading" },
        paused: true,
      },
    ],
    ["an empty preload", { success: true, preloadModel: {} }],
  ];

  it.each(ACKS)("writes %s ack as protobuf-es does, to the byte", (_, ack) => {
    const msg = create(ServerMessageSchema, { kind: { case: "heartbeatAck", value: ack } });
    expect(Buffer.from(encodeServerMessage(msg))).toEqual(Buffer.from(toBinary(ServerMessageSchema, msg)));
  });

  it.each(ACKS)("writes %s ack from its init shape (what the stream sends) as from the message", (_, ack) => {
    const shape = { kind: { case: "heartbeatAck" as const, value: ack } };
    expect(Buffer.from(encodeServerMessage(shape))).toEqual(Buffer.from(toBinary(ServerMessageSchema, create(ServerMessageSchema, shape))));
  });

  it("writes any other init shape through protobuf-es", () => {
    const shape = { kind: { case: "drain" as const, value: { reason: "bye", reconnectAfterMs: 1000 } } };
    expect(Buffer.from(encodeServerMessage(shape))).toEqual(Buffer.from(toBinary(ServerMessageSchema, create(ServerMessageSchema, shape))));
    const signed = { kind: { case: "heartbeatAck" as const, value: { success: true } }, taskSignature: "sig" };
    expect(Buffer.from(encodeServerMessage(signed))).toEqual(Buffer.from(toBinary(ServerMessageSchema, create(ServerMessageSchema, signed))));
  });

  it("leaves every other message to protobuf-es", () => {
    const others = [
      create(ServerMessageSchema, { kind: { case: "heartbeatAck", value: { success: true } }, taskSignature: "sig" }),
      create(ServerMessageSchema, { kind: { case: "drain", value: { reason: "bye", reconnectAfterMs: 1000 } } }),
      create(ServerMessageSchema, {}),
    ];
    for (const msg of others) expect(Buffer.from(encodeServerMessage(msg))).toEqual(Buffer.from(toBinary(ServerMessageSchema, msg)));
  });
});
