// The daemon stream's messages read off the wire. A heartbeat, most of what a
// fleet sends, is read by hand: its telemetry (a google.protobuf.Value) goes
// straight to the JSON the heartbeat stores (shared/struct-binary.ts) instead
// of through a Value message per member, read back by reflection. The message
// keeps its gpu_status, built from that JSON only if something reads it.
// Every other message, and a heartbeat with anything unusual in it, is read by
// protobuf-es, which also reports what is wrong with bytes that do not parse.
import { create, fromBinary, fromJson, type JsonObject, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { DaemonMessageSchema, type DaemonMessage } from "../../gen/svc/v1/daemon_pb.js";
import { HeartbeatRequestSchema, type HeartbeatRequest } from "../../gen/svc/v1/providers_pb.js";
import { NotPlainJson, readStructJson, readValueJson } from "../shared/struct-binary.js";
import { setGpuStatusJson } from "../domain/providers/heartbeat.js";

// Tags (field number << 3 | wire type) of daemon.proto and providers.proto.
const DAEMON_HEARTBEAT = 0x12; // DaemonMessage.heartbeat, length-delimited
const GPU_STATUS = 0x0a;
const UPTIME = 0x11; // double
const PROVIDER_IP = 0x1a;
const PROVIDER_HOSTNAME = 0x22;
const CACHED_MODELS = 0x2a;
const RESOURCE_SPEC = 0x32;
const DAEMON_VERSION = 0x3a;

export function decodeDaemonMessage(bytes: Uint8Array): DaemonMessage {
  try {
    const heartbeat = readHeartbeat(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
    if (heartbeat) return create(DaemonMessageSchema, { kind: { case: "heartbeat", value: heartbeat } });
  } catch (err) {
    if (!(err instanceof NotPlainJson)) throw err;
  }
  return fromBinary(DaemonMessageSchema, bytes);
}

/** A DaemonMessage that holds a heartbeat and nothing else, read by hand; undefined for any other. */
function readHeartbeat(buf: Buffer): HeartbeatRequest | undefined {
  if (buf.length < 2 || buf[0] !== DAEMON_HEARTBEAT) return undefined;
  let pos = 1;
  const varint = () => {
    let n = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      if (pos >= buf.length) throw new NotPlainJson("truncated varint");
      const b = buf[pos++]!;
      n += (b & 0x7f) * 2 ** shift;
      if (b < 0x80) return n;
    }
    throw new NotPlainJson("varint over 32 bits");
  };
  const delimited = (limit: number) => {
    const n = varint();
    if (pos + n > limit) throw new NotPlainJson("truncated part");
    const start = pos;
    pos += n;
    return buf.subarray(start, pos);
  };
  const body = delimited(buf.length);
  if (pos !== buf.length) return undefined; // a second field: protobuf-es merges them
  pos = body.byteOffset - buf.byteOffset;
  const end = pos + body.length;
  let gpuStatus: JsonValue | undefined;
  let uptime: number | undefined;
  let providerIp: string | undefined;
  let providerHostname: string | undefined;
  const cachedModels: string[] = [];
  let resourceSpec: JsonObject | undefined;
  let daemonVersion: string | undefined;
  const str = () => delimited(end).toString("utf8");
  while (pos < end) {
    const tag = buf[pos++];
    switch (tag) {
      case GPU_STATUS:
        if (gpuStatus !== undefined) return undefined; // twice: protobuf-es merges the two
        gpuStatus = readValueJson(delimited(end));
        break;
      case UPTIME:
        if (pos + 8 > end) throw new NotPlainJson("truncated double");
        uptime = buf.readDoubleLE(pos);
        pos += 8;
        break;
      case PROVIDER_IP:
        providerIp = str();
        break;
      case PROVIDER_HOSTNAME:
        providerHostname = str();
        break;
      case CACHED_MODELS:
        cachedModels.push(str());
        break;
      case RESOURCE_SPEC:
        if (resourceSpec !== undefined) return undefined;
        resourceSpec = readStructJson(delimited(end));
        break;
      case DAEMON_VERSION:
        daemonVersion = str();
        break;
      default:
        return undefined; // raw, or a field this reader does not know
    }
  }
  const req = create(HeartbeatRequestSchema, { uptime, providerIp, providerHostname, cachedModels, resourceSpec, daemonVersion });
  if (gpuStatus !== undefined) {
    const json = gpuStatus;
    setGpuStatusJson(req, json);
    let value: Value | undefined;
    Object.defineProperty(req, "gpuStatus", {
      enumerable: true,
      configurable: true,
      get: () => (value ??= fromJson(ValueSchema, json)),
      set: (v: Value | undefined) => {
        setGpuStatusJson(req, undefined);
        Object.defineProperty(req, "gpuStatus", { value: v, writable: true, enumerable: true, configurable: true });
      },
    });
  }
  return req;
}
