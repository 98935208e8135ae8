// The daemon stream's messages, read off and written to the wire. A heartbeat,
// most of what a fleet sends, is read by hand, and its ack written by hand. The
// heartbeat's telemetry (a google.protobuf.Value; daemons send a Struct) goes
// straight to the JSON text the heartbeat stores (shared/struct-binary.ts), not
// through a Value message per member read back by reflection nor an object
// written out again; the message keeps its gpu_status, built from that text only
// if something reads it. Every other message, and a heartbeat
// with anything unusual in it, is read and written by protobuf-es, which also
// reports what is wrong with bytes that do not parse.
// Each kind of message the daemon sends has a byte bound of its own (DAEMON_MESSAGE_MAX_BYTES), held on
// every wire before the message is read (http/kind-bounds.ts).
import { create, fromJson, isMessage, toBinary, type JsonObject, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { DaemonMessageSchema, DaemonService, ServerMessageSchema, type DaemonMessage, type ServerMessage } from "../../gen/svc/v1/daemon_pb.js";
import { JobService } from "../../gen/svc/v1/jobs_pb.js";
import { HeartbeatRequestSchema, ProviderService, type HeartbeatRequest, type HeartbeatResponseSchema } from "../../gen/svc/v1/providers_pb.js";
import { bodyLimitBytesOf, DEFAULT_BODY_LIMIT_KB, HEARTBEAT_BODY_LIMIT_BYTES } from "../http/body.js";
import { KindBounds } from "../http/kind-bounds.js";
import { NotPlainJson, partSize, readStructJsonAt, readStructTextAt, readValueJsonAt, WireCursor, writeVarint, type StructText } from "../shared/struct-binary.js";
import { GPU_STATUS_READ, gpuStatusJsonOf, setGpuStatusRead } from "../domain/providers/heartbeat.js";
import { MAX_JSON_DEPTH, readBinaryRequest } from "../shared/json-nesting.js";
import { listBoundOf, ListTooLong, tooManyItemsMessage } from "../shared/list-bounds.js";

// Tags (field number << 3 | wire type) of daemon.proto and providers.proto.
const DAEMON_HEARTBEAT = 0x12; // DaemonMessage.heartbeat, length-delimited
const GPU_STATUS = 0x0a;
const VALUE_STRUCT = 0x2a; // google.protobuf.Value.struct_value
const UPTIME = 0x11; // double
const PROVIDER_IP = 0x1a;
const PROVIDER_HOSTNAME = 0x22;
const CACHED_MODELS = 0x2a;
const RESOURCE_SPEC = 0x32;
const DAEMON_VERSION = 0x3a;
const SUPPORTED_JOB_TYPES = 0x42;
/**
 * How deep the heartbeat's telemetry and resource spec may nest as read by hand: the message and its
 * heartbeat are the first two levels of MAX_JSON_DEPTH. Deeper is left to readBinaryRequest, which refuses it.
 */
const HEARTBEAT_JSON_ROOM = MAX_JSON_DEPTH - 2;
/** The bounds of the heartbeat's lists, as readBinaryRequest holds a message read by protobuf-es to them. */
const MAX_CACHED_MODELS = listBoundOf(HeartbeatRequestSchema.field.cachedModels);
const MAX_SUPPORTED_JOB_TYPES = listBoundOf(HeartbeatRequestSchema.field.supportedJobTypes);
const tooMany = (field: string, max: number) => new ListTooLong(tooManyItemsMessage(`heartbeat.${field}`, max));

/**
 * A hello's bound: it describes the machine as a heartbeat does (256 KiB), and names besides up to
 * HELLO_MAX_JOB_IDS held jobs with their attempts (4,096 of today's job ids take about 240 KB).
 */
export const HELLO_MAX_BYTES = 1024 * 1024;

/**
 * The most bytes each kind of daemon message may take (its envelope's length), below the stream's own
 * limit (DaemonService.Connect's body_limit_kb, 16 MiB), which only results and log batches need. A report
 * with a JSON route of its own is held to that route's body limit; a hello to HELLO_MAX_BYTES; a log batch
 * to the stream's (1,000 lines of 16,384 characters, more than the JSON route's 1 MiB); an accept or a
 * hand-back, which has no route, to the default body limit.
 */
export const DAEMON_MESSAGE_MAX_BYTES: Readonly<Record<NonNullable<DaemonMessage["kind"]["case"]>, number>> = {
  hello: HELLO_MAX_BYTES,
  heartbeat: HEARTBEAT_BODY_LIMIT_BYTES,
  jobAccepted: DEFAULT_BODY_LIMIT_KB * 1024,
  jobRejected: DEFAULT_BODY_LIMIT_KB * 1024,
  jobPreparing: bodyLimitBytesOf(JobService.method.reportPreparing),
  logs: bodyLimitBytesOf(DaemonService.method.connect),
  progress: bodyLimitBytesOf(JobService.method.reportProgress),
  endpointReady: bodyLimitBytesOf(JobService.method.endpointReady),
  result: bodyLimitBytesOf(JobService.method.reportResult),
  event: bodyLimitBytesOf(ProviderService.method.daemonEvent),
  readiness: bodyLimitBytesOf(ProviderService.method.readiness),
};

/** The bounds as the wires hold them; a message of no kind this server knows (answered as empty) to the default body limit. */
export const DAEMON_MESSAGE_BOUNDS = new KindBounds(
  DaemonMessageSchema.oneofs.find((o) => o.name === "kind")!,
  (member) => DAEMON_MESSAGE_MAX_BYTES[member.localName as keyof typeof DAEMON_MESSAGE_MAX_BYTES],
  DEFAULT_BODY_LIMIT_KB * 1024,
);

export function decodeDaemonMessage(bytes: Uint8Array): DaemonMessage {
  try {
    const heartbeat = readHeartbeat(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
    if (heartbeat) return create(DaemonMessageSchema, { kind: { case: "heartbeat", value: heartbeat } });
  } catch (err) {
    if (!(err instanceof NotPlainJson)) throw err;
  }
  return readBinaryRequest(DaemonMessageSchema, bytes) as DaemonMessage;
}

/** A DaemonMessage that holds a heartbeat and nothing else, read by hand; undefined for any other. */
function readHeartbeat(buf: Buffer): HeartbeatRequest | undefined {
  if (buf.length < 2 || buf[0] !== DAEMON_HEARTBEAT) return undefined;
  const r = new WireCursor(buf, 1, buf.length);
  const end = r.delimited();
  if (end !== buf.length) return undefined; // a second field: protobuf-es merges them
  let gpuStatus: { json: JsonValue } | { text: StructText } | undefined;
  let uptime: number | undefined;
  let providerIp: string | undefined;
  let providerHostname: string | undefined;
  const cachedModels: string[] = [];
  let resourceSpec: JsonObject | undefined;
  let daemonVersion: string | undefined;
  const supportedJobTypes: string[] = [];
  while (r.pos < end) {
    const tag = buf[r.pos++];
    switch (tag) {
      case GPU_STATUS: {
        if (gpuStatus !== undefined) return undefined; // twice: protobuf-es merges the two
        const valueEnd = r.delimited();
        // A Struct, as daemons send it: read straight to the text the heartbeat stores.
        if (r.pos < valueEnd && buf[r.pos] === VALUE_STRUCT) {
          const at = r.pos;
          r.pos++;
          if (r.delimited() === valueEnd) {
            gpuStatus = { text: readStructTextAt(r, valueEnd, GPU_STATUS_READ, HEARTBEAT_JSON_ROOM) };
            break;
          }
          r.pos = at;
        }
        gpuStatus = { json: readValueJsonAt(r, valueEnd, HEARTBEAT_JSON_ROOM) };
        break;
      }
      case UPTIME:
        if (r.pos + 8 > end) throw new NotPlainJson("truncated double");
        uptime = buf.readDoubleLE(r.pos);
        r.pos += 8;
        break;
      case PROVIDER_IP:
        providerIp = r.string();
        break;
      case PROVIDER_HOSTNAME:
        providerHostname = r.string();
        break;
      case CACHED_MODELS:
        if (cachedModels.push(r.string()) > MAX_CACHED_MODELS) throw tooMany("cached_models", MAX_CACHED_MODELS);
        break;
      case RESOURCE_SPEC:
        if (resourceSpec !== undefined) return undefined;
        resourceSpec = readStructJsonAt(r, r.delimited(), HEARTBEAT_JSON_ROOM);
        break;
      case DAEMON_VERSION:
        daemonVersion = r.string();
        break;
      case SUPPORTED_JOB_TYPES:
        if (supportedJobTypes.push(r.string()) > MAX_SUPPORTED_JOB_TYPES) throw tooMany("supported_job_types", MAX_SUPPORTED_JOB_TYPES);
        break;
      default:
        return undefined; // raw, or a field this reader does not know
    }
  }
  if (r.pos !== end) throw new NotPlainJson("a part overruns the heartbeat");
  const req = create(HeartbeatRequestSchema, { uptime, providerIp, providerHostname, cachedModels, resourceSpec, daemonVersion, supportedJobTypes });
  if (gpuStatus !== undefined) {
    setGpuStatusRead(req, gpuStatus);
    Object.defineProperty(req, "gpuStatus", LAZY_GPU_STATUS);
  }
  return req;
}

const dataProperty = (value: Value | undefined): PropertyDescriptor => ({ value, writable: true, enumerable: true, configurable: true });

/**
 * gpu_status of a hand-read heartbeat: a Value built from the JSON beside the
 * message on its first read; a write replaces it (and drops that JSON). One
 * descriptor for every message, so a heartbeat costs no closures.
 */
const LAZY_GPU_STATUS: PropertyDescriptor = {
  enumerable: true,
  configurable: true,
  get(this: HeartbeatRequest): Value {
    const value = fromJson(ValueSchema, gpuStatusJsonOf(this) ?? null);
    Object.defineProperty(this, "gpuStatus", dataProperty(value));
    return value;
  },
  set(this: HeartbeatRequest, v: Value | undefined) {
    setGpuStatusRead(this, undefined);
    Object.defineProperty(this, "gpuStatus", dataProperty(v));
  },
};

// Writing: a heartbeat's ack (most of what a fleet is sent) by hand, the very bytes
// protobuf-es writes for it; any other message by protobuf-es.

const SERVER_HEARTBEAT_ACK = 0x12; // ServerMessage.heartbeat_ack, length-delimited
// HeartbeatResponse, in field order.
const ACK_SUCCESS = 0x08;
const ACK_MESSAGE = 0x12;
const ACK_TIMESTAMP = 0x1a;
const ACK_UPDATE_AVAILABLE = 0x20;
const ACK_NEEDS_UPDATE = 0x28;
const ACK_LATEST_VERSION = 0x32;
const ACK_MIN_VERSION = 0x3a;
const ACK_APPROVAL_STATUS = 0x42;
const ACK_APPROVED = 0x48;
const ACK_PRELOAD_MODEL = 0x52;
const ACK_PAUSED = 0x58;
const PRELOAD_MODEL_NAME = 0x0a;
const PRELOAD_STATUS = 0x12;

/** Size of a string field as proto3 writes it: nothing when empty. */
const stringSize = (s: string | undefined) => (!s ? 0 : partSize(Buffer.byteLength(s)));

class AckWriter {
  pos = 0;
  constructor(readonly buf: Buffer) {}

  varint(n: number) {
    this.pos = writeVarint(this.buf, this.pos, n);
  }

  bool(tag: number, v: boolean | undefined) {
    if (!v) return;
    this.buf[this.pos++] = tag;
    this.buf[this.pos++] = 1;
  }

  string(tag: number, s: string | undefined) {
    if (!s) return;
    const n = Buffer.byteLength(s);
    this.buf[this.pos++] = tag;
    this.varint(n);
    this.pos += this.buf.write(s, this.pos, n, "utf8");
  }
}

function ackBytes(a: AckShape): Uint8Array {
  const preload = a.preloadModel;
  const preloadBody = preload ? stringSize(preload.modelName) + stringSize(preload.status) : 0;
  const body =
    (a.success ? 2 : 0) +
    stringSize(a.message) +
    stringSize(a.timestamp) +
    (a.updateAvailable ? 2 : 0) +
    (a.needsUpdate ? 2 : 0) +
    stringSize(a.latestVersion) +
    stringSize(a.minVersion) +
    stringSize(a.approvalStatus) +
    (a.approved ? 2 : 0) +
    (preload ? partSize(preloadBody) : 0) +
    (a.paused ? 2 : 0);
  const w = new AckWriter(Buffer.allocUnsafe(partSize(body)));
  w.buf[w.pos++] = SERVER_HEARTBEAT_ACK;
  w.varint(body);
  w.bool(ACK_SUCCESS, a.success);
  w.string(ACK_MESSAGE, a.message);
  w.string(ACK_TIMESTAMP, a.timestamp);
  w.bool(ACK_UPDATE_AVAILABLE, a.updateAvailable);
  w.bool(ACK_NEEDS_UPDATE, a.needsUpdate);
  w.string(ACK_LATEST_VERSION, a.latestVersion);
  w.string(ACK_MIN_VERSION, a.minVersion);
  w.string(ACK_APPROVAL_STATUS, a.approvalStatus);
  w.bool(ACK_APPROVED, a.approved);
  if (preload) {
    w.buf[w.pos++] = ACK_PRELOAD_MODEL;
    w.varint(preloadBody);
    w.string(PRELOAD_MODEL_NAME, preload.modelName);
    w.string(PRELOAD_STATUS, preload.status);
  }
  w.bool(ACK_PAUSED, a.paused);
  return w.buf;
}

type AckShape = MessageInitShape<typeof HeartbeatResponseSchema>;
type ServerMessageShape = MessageInitShape<typeof ServerMessageSchema>;

const hasUnknown = (m: object | undefined) => ((m as { $unknown?: unknown[] } | undefined)?.$unknown?.length ?? 0) > 0;

/**
 * A server message, or its init shape as the stream's implementation sends it (a heartbeat's ack is
 * written from that shape, without making the message first).
 */
export function encodeServerMessage(msg: ServerMessageShape): Uint8Array {
  const k = msg.kind;
  if (k?.case === "heartbeatAck" && !msg.taskSignature && !hasUnknown(msg) && !hasUnknown(k.value) && !hasUnknown(k.value.preloadModel)) {
    return ackBytes(k.value);
  }
  return toBinary(ServerMessageSchema, isMessage(msg, ServerMessageSchema) ? msg : create(ServerMessageSchema, msg));
}
