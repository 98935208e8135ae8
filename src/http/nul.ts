// PostgreSQL text and jsonb cannot hold U+0000, and jsonb cannot hold a UTF-16
// surrogate without its pair (JSON text may escape one: "\ud800";
// src/shared/nul-text.ts). Either anywhere in a request is refused before the
// implementation runs, naming the field (400 on REST, invalid_argument on gRPC
// and Connect), rather than failing in the database as an internal error,
// possibly after part of the work was written. One check for every wire, on
// the decoded request message: the secured implementations
// (src/services/secure.ts) run it on each call, REST's included, and a daemon
// stream on each message it reads (src/services/daemon.ts). (Binary protobuf
// carries UTF-8, which holds no lone surrogate: gRPC and the Connect protocol's
// binary codec never bring one; REST and Connect's JSON codec can.)
//
// Fields marked (svc.v1.machine_output) are not checked: what a provider's
// machine produced (a job's output and error, its log lines, progress phase,
// telemetry, daemon events) is made storable by the domain (withoutNul,
// src/shared/nul-text.ts: NUL characters dropped, lone surrogates replaced
// with U+FFFD), so that the report is kept and the job ends instead of being
// refused.
import { ScalarType, type DescField, type DescMessage, type DescOneof } from "@bufbuild/protobuf";
import { badRequest, type ServiceError } from "../errors.js";
import { mayEscapeUnstorable, unstorableIn } from "../shared/nul-text.js";
import { fieldOptionsOf } from "../shared/message-json.js";

/** A field's name in the answer is cut here (keys of free-form objects are the caller's). */
const MAX_NAME = 200;

/** A field that holds text PostgreSQL cannot store, and what it holds. */
export interface Unstorable {
  field: string;
  holds: "nul" | "lone_surrogate";
}

interface Plan {
  /** Fields outside any oneof that may hold text and are checked. */
  fields: DescField[];
  /** Oneofs with at least one such member, and those members by local name. */
  oneofs: DescOneof[];
  members: Map<string, DescField>;
}

const plans = new WeakMap<DescMessage, Plan>();

function holdsText(f: DescField): boolean {
  const o = fieldOptionsOf(f);
  if (o.machineOutput) return false;
  switch (f.fieldKind) {
    case "scalar":
      // A raw body (the payment gateway's signed event) is not: refusing it would leave a payment
      // uncredited whatever the gateway retries; its implementation makes it storable (storableJson).
      return f.scalar === ScalarType.STRING;
    case "enum":
      return false;
    case "list":
      return f.listKind === "message" || (f.listKind === "scalar" && f.scalar === ScalarType.STRING);
    case "map":
      return f.mapKey === ScalarType.STRING || f.mapKind === "message" || (f.mapKind === "scalar" && f.scalar === ScalarType.STRING);
    case "message":
      return true;
  }
}

function planOf(desc: DescMessage): Plan {
  let plan = plans.get(desc);
  if (!plan) {
    const checked = desc.fields.filter(holdsText);
    plan = {
      fields: checked.filter((f) => !f.oneof),
      oneofs: desc.oneofs.filter((o) => o.fields.some((f) => checked.includes(f))),
      members: new Map(checked.filter((f) => f.oneof).map((f) => [f.localName, f])),
    };
    plans.set(desc, plan);
  }
  return plan;
}

const join = (path: string, key: string) => (path ? `${path}.${key}` : key);
/** A field's path as an answer names it. */
const shown = (path: string) => (path.length > MAX_NAME ? `${path.slice(0, MAX_NAME)}…` : path || "request");
const named = (path: string, holds: Unstorable["holds"]): Unstorable => ({ field: shown(path), holds });

type Pending = [value: unknown, desc: DescMessage | undefined, path: string];

/**
 * A field of `message` (of type `desc`) that holds a NUL or a lone surrogate,
 * named as a path of proto field names and object keys ("params.prompt",
 * "logs[2]"), or undefined when there is none. Walks messages, lists, maps, and
 * the free-form JSON of google.protobuf.Struct/Value/ListValue, without
 * recursion (a deeply nested request must not exhaust the stack).
 */
export function unstorableFieldOf(desc: DescMessage, message: unknown): Unstorable | undefined {
  const stack: Pending[] = [[message, desc, ""]];
  while (stack.length > 0) {
    const [v, d, path] = stack.pop()!;
    if (typeof v === "string") {
      const found = textIn(v, path);
      if (found) return found;
      continue;
    }
    if (v === null || typeof v !== "object") continue;
    const m = v as Record<string, unknown>;
    if (d === undefined || !("$typeName" in m)) {
      // Free-form JSON: a Struct field (held as a plain object), or a raw body.
      if (Array.isArray(v)) {
        for (let i = v.length - 1; i >= 0; i--) stack.push([v[i], undefined, `${path}[${i}]`]);
        continue;
      }
      for (const [k, x] of Object.entries(m)) {
        const key = textIn(k, path || "body");
        if (key) return key;
        stack.push([x, undefined, join(path, k)]);
      }
      continue;
    }
    switch (d.typeName) {
      case "google.protobuf.Value": {
        const kind = (m.kind ?? {}) as { case?: string; value?: unknown };
        const f = kind.case === "structValue" || kind.case === "listValue" ? d.field[kind.case] : undefined;
        if (kind.case === "stringValue") stack.push([kind.value, undefined, path]);
        else if (f?.fieldKind === "message") stack.push([kind.value, f.message, path]);
        continue;
      }
      case "google.protobuf.Struct": {
        const f = d.field.fields;
        for (const [k, x] of Object.entries(m.fields as Record<string, unknown>)) {
          const key = textIn(k, path);
          if (key) return key;
          if (f.fieldKind === "map" && f.mapKind === "message") stack.push([x, f.message, join(path, k)]);
        }
        continue;
      }
      case "google.protobuf.ListValue": {
        const f = d.field.values;
        const items = m.values as unknown[];
        if (f.fieldKind === "list" && f.listKind === "message") for (let i = items.length - 1; i >= 0; i--) stack.push([items[i], f.message, `${path}[${i}]`]);
        continue;
      }
    }
    const plan = planOf(d);
    for (const o of plan.oneofs) {
      const set = m[o.localName] as { case?: string; value?: unknown } | undefined;
      const f = set?.case === undefined ? undefined : plan.members.get(set.case);
      if (f) {
        const found = pushField(stack, f, set!.value, path);
        if (found !== undefined) return found;
      }
    }
    for (let i = plan.fields.length - 1; i >= 0; i--) {
      const f = plan.fields[i];
      const found = pushField(stack, f, m[f.localName], path);
      if (found !== undefined) return found;
    }
  }
  return undefined;
}

/** The field `name` when text `s` holds what PostgreSQL cannot store. */
function textIn(s: string, name: string): Unstorable | undefined {
  const holds = unstorableIn(s);
  return holds ? named(name, holds) : undefined;
}

/** Checks a field's text at once, or queues what it holds; returns the field when it holds what cannot be stored. */
function pushField(stack: Pending[], f: DescField, value: unknown, path: string): Unstorable | undefined {
  if (value === undefined || value === null) return undefined;
  const name = join(path, f.name);
  switch (f.fieldKind) {
    case "scalar":
      if (typeof value === "string") return textIn(value, name);
      if (value instanceof Uint8Array && mayEscapeUnstorable(Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString("latin1"))) {
        try {
          stack.push([JSON.parse(Buffer.from(value).toString("utf8")), undefined, name]);
        } catch {
          // Not JSON: the implementation answers for it.
        }
      }
      return undefined;
    case "message":
      stack.push([value, f.message, name]);
      return undefined;
    case "list": {
      const items = value as unknown[];
      for (let i = items.length - 1; i >= 0; i--) {
        if (f.listKind === "message") stack.push([items[i], f.message, `${name}[${i}]`]);
        else if (typeof items[i] === "string") {
          const found = textIn(items[i] as string, `${name}[${i}]`);
          if (found) return found;
        }
      }
      return undefined;
    }
    case "map":
      for (const [k, x] of Object.entries(value as Record<string, unknown>)) {
        const key = textIn(k, name);
        if (key) return key;
        if (f.mapKind === "message") stack.push([x, f.message, join(name, k)]);
        else if (typeof x === "string") {
          const found = textIn(x, join(name, k));
          if (found) return found;
        }
      }
      return undefined;
    default:
      return undefined;
  }
}

/** 400 (invalid_argument) naming the field and what it holds that cannot be stored. */
export function unstorableError({ field, holds }: Unstorable): ServiceError {
  return badRequest(
    holds === "nul"
      ? `${field} must not contain NUL characters (\\u0000)`
      : `${field} must not contain unpaired UTF-16 surrogates (\\ud800-\\udfff)`,
  );
}

/**
 * Throws unstorableError when a field of the request message, other than machine output, holds
 * a NUL or a lone surrogate (named for the first; it refuses both), and the same for a number JSON
 * cannot write (NaN, ±Infinity: JSON text's 1e400 reads as Infinity) in a caller's free-form JSON
 * (finiteJson). Machine output is the domain's to make storable: such a number there is written
 * null (src/shared/value-json.ts), so the report is kept.
 */
export function refuseNul(desc: DescMessage, message: unknown): void {
  const found = unstorableFieldOf(desc, message);
  if (found !== undefined) throw unstorableError(found);
  const infinite = finiteJson(desc, message);
  if (infinite !== undefined) throw badRequest(`${infinite} must be a finite number (JSON has no NaN or Infinity)`);
}

/** Messages that can hold a caller's free-form JSON (a Struct, Value or ListValue outside machine output, at any depth). */
const holdsJson = new WeakMap<DescMessage, boolean>();
const JSON_TYPES = new Set(["google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"]);

/** The message type a field holds (itself, or its list's or map's), when it holds messages and is not machine output. */
function callerMessageOf(f: DescField): DescMessage | undefined {
  if (fieldOptionsOf(f).machineOutput) return undefined;
  return f.fieldKind === "message" || (f.fieldKind === "list" && f.listKind === "message") || (f.fieldKind === "map" && f.mapKind === "message") ? f.message : undefined;
}

function canHoldJson(desc: DescMessage, seen = new Set<DescMessage>()): boolean {
  const known = holdsJson.get(desc);
  if (known !== undefined) return known;
  if (JSON_TYPES.has(desc.typeName)) return true;
  if (seen.has(desc)) return false;
  seen.add(desc);
  const found = desc.fields.some((f) => {
    const m = callerMessageOf(f);
    return m !== undefined && canHoldJson(m, seen);
  });
  holdsJson.set(desc, found);
  return found;
}

type Walk = [value: unknown, desc: DescMessage | undefined, path: string];

/**
 * The first number JSON cannot write in a caller's free-form JSON of `message`, named as a path of
 * field names and keys; undefined when there is none. Walks only the fields that can hold such JSON
 * (never machine output; a daemon's stream messages hold no other), without recursion.
 */
export function finiteJson(desc: DescMessage, message: unknown): string | undefined {
  if (!canHoldJson(desc)) return undefined;
  const stack: Walk[] = [[message, desc, ""]];
  while (stack.length > 0) {
    const [v, d, path] = stack.pop()!;
    if (typeof v === "number") {
      if (!Number.isFinite(v)) return shown(path);
      continue;
    }
    if (v === null || typeof v !== "object") continue;
    const m = v as Record<string, unknown>;
    if (d === undefined || !("$typeName" in m)) {
      // Free-form JSON: a Struct field (held as a plain object).
      if (Array.isArray(v)) for (let i = v.length - 1; i >= 0; i--) stack.push([v[i], undefined, `${path}[${i}]`]);
      else for (const [k, x] of Object.entries(m)) stack.push([x, undefined, join(path, k)]);
      continue;
    }
    if (d.typeName === "google.protobuf.Value") {
      const kind = (m.kind ?? {}) as { case?: string; value?: unknown };
      if (kind.case === "numberValue") stack.push([kind.value, undefined, path]);
      else if (kind.case === "structValue" || kind.case === "listValue") {
        const f = d.field[kind.case];
        if (f.fieldKind === "message") stack.push([kind.value, f.message, path]);
      }
      continue;
    }
    if (d.typeName === "google.protobuf.Struct") {
      for (const [k, x] of Object.entries(m.fields as Record<string, unknown>)) stack.push([x, valueOf(d), join(path, k)]);
      continue;
    }
    if (d.typeName === "google.protobuf.ListValue") {
      const items = m.values as unknown[];
      for (let i = items.length - 1; i >= 0; i--) stack.push([items[i], valueOf(d), `${path}[${i}]`]);
      continue;
    }
    for (const f of d.fields) {
      const held = callerMessageOf(f);
      if (held === undefined || !canHoldJson(held)) continue;
      const set = f.oneof ? (m[f.oneof.localName] as { case?: string; value?: unknown } | undefined) : undefined;
      const value = f.oneof ? (set?.case === f.localName ? set.value : undefined) : m[f.localName];
      if (value === undefined || value === null) continue;
      const name = join(path, f.name);
      if (f.fieldKind === "list") {
        const items = value as unknown[];
        for (let i = items.length - 1; i >= 0; i--) stack.push([items[i], held, `${name}[${i}]`]);
      } else if (f.fieldKind === "map") {
        for (const [k, x] of Object.entries(value as Record<string, unknown>)) stack.push([x, held, join(name, k)]);
      } else stack.push([value, held, name]);
    }
  }
  return undefined;
}

/** google.protobuf.Value's descriptor, reached from Struct or ListValue. */
function valueOf(d: DescMessage): DescMessage {
  const f = d.typeName === "google.protobuf.Struct" ? d.field.fields : d.field.values;
  return ((f.fieldKind === "map" && f.mapKind === "message") || (f.fieldKind === "list" && f.listKind === "message") ? f.message : undefined)!;
}
