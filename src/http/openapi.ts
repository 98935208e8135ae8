// The OpenAPI 3.1 document of the /api routes, generated from the proto: the
// route options give each operation (method, path, success status, roles,
// rate-limit row, body limit, a description) and the messages give the
// schemas, written the way the transcoder writes JSON (json.ts): proto field
// names, 64-bit integers as numbers, enums by name, documented nulls, inlined
// members, the status-code field left out, server streams as
// text/event-stream; the field options give the required request members and
// the values a member is limited to. Nothing here is declared a second time:
// change the proto and the document follows.
import { getOption, ScalarType, type DescField, type DescMessage, type DescMethod, type DescService } from "@bufbuild/protobuf";
import { listBoundOf } from "../shared/list-bounds.js";
import { allowed, RawBodySchema, required as requiredMember, Role, route } from "../../gen/svc/v1/options_pb.js";
import { bodyLimitBytesOf } from "./body.js";
import { fieldOptionsOf } from "./json.js";

/** The version of the interface the document describes (the service interface spec's), not the package's. */
export const INTERFACE_VERSION = "5.0.0";

type Schema = Record<string, unknown>;
export type OpenApiDocument = Record<string, unknown> & {
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, Schema>; securitySchemes: Record<string, Schema>; responses: Record<string, Schema> };
};
export interface Operation {
  operationId: string;
  tags: string[];
  summary: string;
  description?: string;
  security: Record<string, string[]>[];
  parameters?: Schema[];
  requestBody?: Schema;
  responses: Record<string, Schema>;
  "x-roles": string[];
  "x-rate-limit-row": string;
  "x-body-limit-bytes": number;
}

/** The documented ways of sending each role's credential in a header or the query (src/http/credentials.ts). */
export const SECURITY_OF_ROLE: Record<number, Record<string, string[]>[]> = {
  [Role.RENTER]: [{ renterKey: [] }, { renterKeyQuery: [] }, { bearer: [] }],
  [Role.PROVIDER]: [{ providerKey: [] }, { providerKeyQuery: [] }, { bearer: [] }],
  [Role.ADMIN]: [{ adminToken: [] }, { bearer: [] }],
};

/** The path parameters and body members the transcoder also reads a key from (credentials.ts KEY_FIELDS). */
const KEY_MEMBERS = ["api_key", "key"];

const pathKeyOf = (template: string) => pathParams(template).find((p) => KEY_MEMBERS.includes(p));
const hasJsonBody = (method: DescMethod, httpMethod: string) =>
  httpMethod !== "GET" && httpMethod !== "DELETE" && !method.input.fields.some((f) => fieldOptionsOf(f).rawBody);

/** A provider route with a JSON body takes the key as body `api_key` or `key`, as the daemons send it. */
function takesBodyKey(method: DescMethod, httpMethod: string): boolean {
  const roles = getOption(method, route).roles;
  return roles.includes(Role.PROVIDER) && !roles.includes(Role.PUBLIC) && hasJsonBody(method, httpMethod);
}

/**
 * The security requirements of one binding of a route: none for public routes, nor for those whose
 * path carries the key (that parameter is the credential); else any one credential of any allowed
 * role, or, on a provider route with a JSON body, none beyond the key in the body (the empty requirement).
 */
export function securityOf(method: DescMethod, httpMethod: string, template: string): Record<string, string[]>[] {
  const roles = getOption(method, route).roles;
  if (roles.length === 0 || roles.includes(Role.PUBLIC) || pathKeyOf(template)) return [];
  const out: Record<string, string[]>[] = [];
  const seen = new Set<string>();
  for (const r of roles) {
    for (const req of SECURITY_OF_ROLE[r] ?? []) {
      const k = Object.keys(req)[0];
      if (!seen.has(k)) out.push(req);
      seen.add(k);
    }
  }
  if (takesBodyKey(method, httpMethod)) out.push({});
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
      case "scalar": {
        const values = getOption(field, allowed);
        return values.length ? { type: "string", enum: values } : scalarSchema(field.scalar);
      }
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

  /** The schema of one request field as a client sends it (fromJson: null means "not given", which a required one may not be). */
  inputSchema(field: DescField, required: boolean, bounded = true): Schema {
    // A list past its bound is refused before the body is read into the message (src/shared/list-bounds.ts).
    const max = bounded ? listBoundOf(field) : 0;
    const s = { ...this.valueSchema(field), ...(max > 0 ? (field.fieldKind === "map" ? { maxProperties: max } : { maxItems: max }) : {}) };
    return required ? s : { anyOf: [s, { type: "null" }] };
  }
}

function pathParams(template: string): string[] {
  return [...template.matchAll(/\{(\w+)\}/g)].map((m) => m[1]);
}

const ROLE_NAMES: Record<number, string> = { [Role.PUBLIC]: "public", [Role.PROVIDER]: "provider", [Role.RENTER]: "renter", [Role.ADMIN]: "admin" };

/** The roles whose API key a route takes, in words ("provider", "renter or provider"). */
const roleWords = (roles: Role[]) => roles.filter((r) => r === Role.RENTER || r === Role.PROVIDER).map((r) => ROLE_NAMES[r]).join(" or ");

const BODY_KEY: Record<string, Schema> = {
  api_key: {
    type: "string",
    description: "The provider API key (svc-provider-...), as the daemons send it: the credential when no header or query `key` carries one.",
  },
  key: { type: "string", description: "The provider API key, as `api_key` (the name the interface gives it on pause, resume and preferences)." },
};

function operation(b: Builder, service: DescService, method: DescMethod, httpMethod: string, template: string, idSuffix: string): Operation {
  const opts = getOption(method, route);
  const status = opts.status || 200;
  const params = pathParams(template);
  const input = method.input;
  // What the server refuses a request without (requireMembers, src/domain/shared/validate.ts).
  const required = new Set(input.fields.filter((f) => getOption(f, requiredMember)));
  const parameters: Schema[] = [];
  const bodyProps: Record<string, Schema> = {};
  const bodyRequired: string[] = [];
  let wholeBody = false;
  let rawBody = false;
  for (const f of input.fields) {
    const o = fieldOptionsOf(f);
    if (params.includes(f.name)) {
      const credential = f.name === pathKeyOf(template) ? { description: `The ${roleWords(opts.roles)} API key: this route's credential.` } : {};
      parameters.push({ name: f.name, in: "path", required: true, ...credential, schema: b.valueSchema(f) });
    } else if (o.fromHeader) {
      parameters.push({ name: o.fromHeader, in: "header", required: false, schema: { type: "string" } });
    } else if (o.rawBody) {
      rawBody = true;
    } else if (o.wholeBody) {
      wholeBody = true; // the other members are documented still: the domain reads them from this object, leniently
    } else if (httpMethod === "GET" || httpMethod === "DELETE") {
      const queryable = f.fieldKind === "scalar" || f.fieldKind === "enum" || (f.fieldKind === "list" && f.listKind !== "message");
      if (queryable) {
        parameters.push({ name: f.name, in: "query", required: required.has(f), schema: b.valueSchema(f), ...(f.fieldKind === "list" ? { explode: true } : {}) });
      }
    } else {
      // A body read as a whole is read leniently: its members are not held to their lists' bounds.
      bodyProps[f.name] = b.inputSchema(f, required.has(f), !input.fields.some((x) => fieldOptionsOf(x).wholeBody));
      if (required.has(f)) bodyRequired.push(f.name);
    }
  }
  if (takesBodyKey(method, httpMethod)) for (const [k, s] of Object.entries(BODY_KEY)) bodyProps[k] ??= s;
  const bodyLimit = bodyLimitBytesOf(method);
  let requestBody: Schema | undefined;
  if (httpMethod !== "GET" && httpMethod !== "DELETE") {
    const schema: Schema = rawBody
      ? { type: "object", additionalProperties: true }
      : { type: "object", properties: bodyProps, ...(bodyRequired.length ? { required: bodyRequired } : {}), additionalProperties: true };
    const read = rawBody ? "; read as raw bytes (signed)" : wholeBody ? "; read as a whole, leniently" : "";
    requestBody = {
      required: bodyRequired.length > 0,
      description: `JSON object of at most ${bodyLimit} bytes; unknown members are ignored${read}.`,
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
    ...(opts.description ? { description: opts.description } : {}),
    security: securityOf(method, httpMethod, template),
    ...(parameters.length ? { parameters } : {}),
    ...(requestBody ? { requestBody } : {}),
    responses,
    "x-roles": roles,
    "x-rate-limit-row": opts.rateLimit || "default",
    "x-body-limit-bytes": bodyLimit,
  };
}

export interface OpenApiOptions {
  /** The server package's version, given as info.x-package-version. */
  packageVersion?: string;
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
      version: INTERFACE_VERSION,
      ...(opts.packageVersion ? { "x-package-version": opts.packageVersion } : {}),
      description:
        "The JSON-over-HTTP `/api` routes, generated from the proto (`proto/svc/v1`). The same RPCs are served as gRPC and Connect " +
        "on the same port. Amounts are integer halala (1 SAR = 100). 64-bit integers are JSON numbers. A failure answers " +
        "`{\"error\": \"...\"}` with its status; 429 and 503 may carry `Retry-After`. A renter or provider key goes in its header " +
        "or the `key` query parameter; provider routes with a JSON body also take it as the body's `api_key` (or `key`), as the " +
        "daemons send it (the empty security requirement), and the routes with `{api_key}` in their path take it there. " +
        "`info.version` is the interface's version, `x-package-version` the server's.",
    },
    servers: [{ url: opts.serverUrl ?? "/" }],
    paths: sortedPaths,
    components: {
      schemas,
      securitySchemes: {
        renterKey: { type: "apiKey", in: "header", name: "x-renter-key", description: "A renter API key (svc-renter-...)." },
        renterKeyQuery: {
          type: "apiKey",
          in: "query",
          name: "key",
          description: "A renter API key (svc-renter-...) in the query (`api_key` is read too); the header keeps it out of URLs and the logs that keep them.",
        },
        providerKey: { type: "apiKey", in: "header", name: "x-provider-key", description: "A provider API key (svc-provider-...)." },
        providerKeyQuery: {
          type: "apiKey",
          in: "query",
          name: "key",
          description: "A provider API key (svc-provider-...) in the query (`api_key` is read too), as the daemons and installers send it.",
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
