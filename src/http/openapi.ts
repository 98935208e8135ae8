// The OpenAPI 3.1 document of the /api routes, generated from the proto: the
// route options give each operation (method, path, success status, roles,
// rate-limit row, body limit) and the messages give the schemas, written the
// way the transcoder writes JSON (json.ts): proto field names, 64-bit
// integers as numbers, enums by name, documented nulls, inlined members, the
// status-code field left out, server streams as text/event-stream. Nothing
// here is declared a second time: change the proto and the document follows.
import { getOption, ScalarType, type DescField, type DescMessage, type DescMethod, type DescService } from "@bufbuild/protobuf";
import { RawBodySchema, Role, route } from "../../gen/svc/v1/options_pb.js";
import { bodyLimitBytesOf } from "./body.js";
import { fieldOptionsOf } from "./json.js";

type Schema = Record<string, unknown>;
export type OpenApiDocument = Record<string, unknown> & {
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, Schema>; securitySchemes: Record<string, Schema>; responses: Record<string, Schema> };
};
export interface Operation {
  operationId: string;
  tags: string[];
  summary: string;
  security: Record<string, string[]>[];
  parameters?: Schema[];
  requestBody?: Schema;
  responses: Record<string, Schema>;
  "x-roles": string[];
  "x-rate-limit-row": string;
  "x-body-limit-bytes": number;
}

/** The documented ways of sending each role's credential (src/http/credentials.ts). */
export const SECURITY_OF_ROLE: Record<number, Record<string, string[]>[]> = {
  [Role.RENTER]: [{ renterKey: [] }, { bearer: [] }],
  [Role.PROVIDER]: [{ providerKey: [] }, { bearer: [] }],
  [Role.ADMIN]: [{ adminToken: [] }, { bearer: [] }],
};

/** The security requirements of a route's roles: none for public routes, else any one credential of any allowed role. */
export function securityOf(method: DescMethod): Record<string, string[]>[] {
  const roles = getOption(method, route).roles;
  if (roles.length === 0 || roles.includes(Role.PUBLIC)) return [];
  const out: Record<string, string[]>[] = [];
  const seen = new Set<string>();
  for (const r of roles) {
    for (const req of SECURITY_OF_ROLE[r] ?? []) {
      const k = Object.keys(req)[0];
      if (!seen.has(k)) out.push(req);
      seen.add(k);
    }
  }
  return out;
}

const INT32 = new Set([ScalarType.INT32, ScalarType.UINT32, ScalarType.SINT32, ScalarType.FIXED32, ScalarType.SFIXED32]);
const INT64 = new Set([ScalarType.INT64, ScalarType.UINT64, ScalarType.SINT64, ScalarType.FIXED64, ScalarType.SFIXED64]);

function scalarSchema(t: ScalarType): Schema {
  if (t === ScalarType.STRING) return { type: "string" };
  if (t === ScalarType.BOOL) return { type: "boolean" };
  if (INT32.has(t)) return { type: "integer", format: "int32" };
  // Written as JSON numbers (json.ts), not protobuf's strings.
  if (INT64.has(t)) return { type: "integer", format: "int64" };
  if (t === ScalarType.BYTES) return { type: "string", contentEncoding: "base64" };
  return { type: "number", format: t === ScalarType.FLOAT ? "float" : "double" };
}

/** Well-known types written as protobuf's JSON (json.ts WKT_JSON). */
function wellKnown(desc: DescMessage): Schema | undefined {
  switch (desc.typeName) {
    case "google.protobuf.Struct":
      return { type: "object", additionalProperties: true };
    case "google.protobuf.Value":
      return {};
    case "google.protobuf.ListValue":
      return { type: "array" };
    case "google.protobuf.Timestamp":
      return { type: "string", format: "date-time" };
    case "google.protobuf.Duration":
      return { type: "string", pattern: "^-?\\d+(\\.\\d+)?s$" };
  }
  return undefined;
}

const nullableOf = (s: Schema): Schema => ({ anyOf: [s, { type: "null" }] });

class Builder {
  readonly schemas: Record<string, Schema> = {};

  /** A reference to a message's component, made on first use. */
  ref(desc: DescMessage): Schema {
    const wk = wellKnown(desc);
    if (wk) return wk;
    if (!(desc.typeName in this.schemas)) {
      this.schemas[desc.typeName] = {}; // placeholder: recursive messages refer to it while it is built
      this.schemas[desc.typeName] = this.messageSchema(desc);
    }
    return { $ref: `#/components/schemas/${desc.typeName}` };
  }

  /** A field's value as JSON, whatever its presence. */
  valueSchema(field: DescField): Schema {
    switch (field.fieldKind) {
      case "scalar":
        return scalarSchema(field.scalar);
      case "enum":
        return { type: "string", enum: field.enum.values.map((v) => v.name) };
      case "message":
        return this.ref(field.message);
      case "list": {
        const item =
          field.listKind === "message" ? this.ref(field.message) : field.listKind === "scalar" ? scalarSchema(field.scalar) : { type: "string", enum: field.enum.values.map((v) => v.name) };
        return { type: "array", items: item };
      }
      case "map": {
        const v =
          field.mapKind === "message" ? this.ref(field.message) : field.mapKind === "scalar" ? scalarSchema(field.scalar) : { type: "string", enum: field.enum.values.map((x) => x.name) };
        return { type: "object", additionalProperties: v };
      }
    }
  }

  /** A message as the transcoder writes it (messageToJson): which members, which always present. */
  private members(desc: DescMessage): { properties: Record<string, Schema>; required: string[]; open: boolean } {
    const properties: Record<string, Schema> = {};
    const required: string[] = [];
    let open = false;
    for (const field of desc.fields) {
      const o = fieldOptionsOf(field);
      if (o.httpStatus) continue;
      const explicitPresence = field.fieldKind === "message" || (field.fieldKind === "scalar" && field.proto.proto3Optional);
      if (o.inline && field.fieldKind === "message") {
        if (wellKnown(field.message)) {
          open = true; // a free-form object's members are written beside the others
          continue;
        }
        const inner = this.members(field.message);
        Object.assign(properties, inner.properties);
        if (!field.oneof) required.push(...inner.required);
        open ||= inner.open;
        continue;
      }
      const schema = this.valueSchema(field);
      properties[field.name] = o.nullable ? nullableOf(schema) : schema;
      // Always written: plain fields, lists and maps; an unset optional one is null when documented so, else left out.
      if (!field.oneof && (!explicitPresence || o.nullable)) required.push(field.name);
    }
    return { properties, required, open };
  }

  messageSchema(desc: DescMessage): Schema {
    const { properties, required, open } = this.members(desc);
    return { type: "object", properties, ...(required.length ? { required: [...new Set(required)] } : {}), additionalProperties: open };
  }

  /** The schema of one request field as a client sends it (fromJson: null means "not given"). */
  inputSchema(field: DescField): Schema {
    const s = this.valueSchema(field);
    return { anyOf: [s, { type: "null" }] };
  }
}

function pathParams(template: string): string[] {
  return [...template.matchAll(/\{(\w+)\}/g)].map((m) => m[1]);
}

const ROLE_NAMES: Record<number, string> = { [Role.PUBLIC]: "public", [Role.PROVIDER]: "provider", [Role.RENTER]: "renter", [Role.ADMIN]: "admin" };

function operation(b: Builder, service: DescService, method: DescMethod, httpMethod: string, template: string, idSuffix: string): Operation {
  const opts = getOption(method, route);
  const status = opts.status || 200;
  const params = pathParams(template);
  const input = method.input;
  const parameters: Schema[] = [];
  const bodyProps: Record<string, Schema> = {};
  let wholeBody = false;
  let rawBody = false;
  for (const f of input.fields) {
    const o = fieldOptionsOf(f);
    if (params.includes(f.name)) {
      parameters.push({ name: f.name, in: "path", required: true, schema: b.valueSchema(f) });
    } else if (o.fromHeader) {
      parameters.push({ name: o.fromHeader, in: "header", required: false, schema: { type: "string" } });
    } else if (o.rawBody) {
      rawBody = true;
    } else if (o.wholeBody) {
      wholeBody = true;
    } else if (httpMethod === "GET" || httpMethod === "DELETE") {
      const queryable = f.fieldKind === "scalar" || f.fieldKind === "enum" || (f.fieldKind === "list" && f.listKind !== "message");
      if (queryable) {
        parameters.push({ name: f.name, in: "query", required: false, schema: b.valueSchema(f), ...(f.fieldKind === "list" ? { explode: true } : {}) });
      }
    } else {
      bodyProps[f.name] = b.inputSchema(f);
    }
  }
  const bodyLimit = bodyLimitBytesOf(method);
  let requestBody: Schema | undefined;
  if (httpMethod !== "GET" && httpMethod !== "DELETE") {
    const schema: Schema = rawBody || wholeBody ? { type: "object", additionalProperties: true } : { type: "object", properties: bodyProps, additionalProperties: true };
    requestBody = {
      required: false,
      description: `JSON object of at most ${bodyLimit} bytes; unknown members are ignored${rawBody ? "; read as raw bytes (signed)" : ""}.`,
      content: { "application/json": { schema } },
    };
  }

  const responses: Record<string, Schema> = {};
  const output = method.output;
  if (method.methodKind === "server_streaming") {
    responses[String(status)] = {
      description: `Server-sent events: each \`data:\` line is one ${output.name} as JSON, \`event:\` its member's name, \`id:\` its cursor.`,
      content: { "text/event-stream": { schema: { type: "string" }, "x-event-schema": b.ref(output) } },
    };
  } else if (output.typeName === RawBodySchema.typeName) {
    responses[String(status)] = { description: "The file or document itself.", content: { "*/*": { schema: { type: "string", format: "binary" } } } };
  } else {
    const content = { "application/json": { schema: b.ref(output) } };
    responses[String(status)] = { description: "Success.", content };
    // A message with an http_status field answers the status it carries (e.g. 202 while a job runs, 410 once it failed).
    if (output.fields.some((f) => fieldOptionsOf(f).httpStatus)) {
      responses["2XX"] = { description: "The status the answer carries (202 while not finished).", content };
    }
  }
  responses.default = { $ref: "#/components/responses/Error" };
  const roles = (opts.roles.length ? opts.roles : [Role.PUBLIC]).map((r) => ROLE_NAMES[r] ?? String(r));
  return {
    operationId: `${service.name}_${method.name}${idSuffix}`,
    tags: [service.name],
    summary: method.name.replace(/([a-z])([A-Z])/g, "$1 $2"),
    security: securityOf(method),
    ...(parameters.length ? { parameters } : {}),
    ...(requestBody ? { requestBody } : {}),
    responses,
    "x-roles": roles,
    "x-rate-limit-row": opts.rateLimit || "default",
    "x-body-limit-bytes": bodyLimit,
  };
}

export interface OpenApiOptions {
  version: string;
  serverUrl?: string;
}

/** The document of every route the given services declare. */
export function buildOpenApi(services: DescService[], opts: OpenApiOptions): OpenApiDocument {
  const b = new Builder();
  const paths: Record<string, Record<string, Operation>> = {};
  for (const service of services) {
    for (const method of service.methods) {
      const bindings = getOption(method, route).http;
      bindings.forEach((binding, i) => {
        const httpMethod = binding.method.toUpperCase();
        const suffix = i === 0 ? "" : `_${httpMethod.toLowerCase()}${bindings.slice(0, i).some((x) => x.method.toUpperCase() === httpMethod) ? i : ""}`;
        (paths[binding.path] ??= {})[httpMethod.toLowerCase()] = operation(b, service, method, httpMethod, binding.path, suffix);
      });
    }
  }
  const sortedPaths = Object.fromEntries(Object.entries(paths).sort(([a], [z]) => a.localeCompare(z)));
  const schemas = Object.fromEntries(Object.entries(b.schemas).sort(([a], [z]) => a.localeCompare(z)));
  schemas.Error = { type: "object", properties: { error: { type: "string" } }, required: ["error"] };
  return {
    openapi: "3.1.0",
    info: {
      title: "svc GPU compute marketplace",
      version: opts.version,
      description:
        "The JSON-over-HTTP `/api` routes, generated from the proto (`proto/svc/v1`). The same RPCs are served as gRPC and Connect " +
        "on the same port. Amounts are integer halala (1 SAR = 100). 64-bit integers are JSON numbers. A failure answers " +
        "`{\"error\": \"...\"}` with its status; 429 and 503 may carry `Retry-After`.",
    },
    servers: [{ url: opts.serverUrl ?? "/" }],
    paths: sortedPaths,
    components: {
      schemas,
      securitySchemes: {
        renterKey: { type: "apiKey", in: "header", name: "x-renter-key", description: "A renter API key (svc-renter-...)." },
        providerKey: {
          type: "apiKey",
          in: "header",
          name: "x-provider-key",
          description: "A provider API key (svc-provider-...). The legacy daemon protocol also sends it as `api_key` or `key` in the body, query or path.",
        },
        adminToken: { type: "apiKey", in: "header", name: "x-admin-token", description: "The admin token (SVC_ADMIN_TOKEN)." },
        bearer: { type: "http", scheme: "bearer", description: "`Authorization: Bearer` with any of the above." },
      },
      responses: {
        Error: {
          description: "A documented failure (400 naming the field, 401, 402, 403, 404, 409, 410, 413, 429, 503, 500).",
          content: { "application/json": { schema: { $ref: "#/components/schemas/Error" } } },
        },
      },
    },
  };
}
