// Job parameters of `svc submit`: --param key=value typed as the job type
// declares the parameter, --param-json key=JSON as given, or read from a
// file (key=@FILE) or standard input (key=@-), which keeps a value that is a
// secret (a custom_container's env) off svc's command line.
import fs from "node:fs";
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import type { JobParam } from "../../gen/svc/v1/job_types_pb.js";
import type { Clients } from "./clients.js";
import { UsageError } from "./profiles.js";

/** --param or --param-json: [option, key, text of the value]. */
export type ParamArg = ["param" | "param-json", string, string];
/** Parses key=value into `into` (both options share it, so the last one given wins). */
export const paramArg = (option: ParamArg[0], into: ParamArg[]) => (text: string): ParamArg[] => {
  const i = text.indexOf("=");
  if (i <= 0) throw new UsageError(`--${option} wants key=value, got "${text}"`);
  into.push([option, text.slice(0, i), text.slice(i + 1)]);
  return into;
};

export const PARAM_HELP = `
Parameters: each --param key=value takes the type the job type declares for that
parameter (svc reads them from the server, GET /api/job-types): text for a string
(prompt=2024 stays "2024"), a number for an integer or a number, true or false for a
boolean, JSON for an array or an object. A parameter the job type does not declare is
JSON when it parses as JSON, else text. --param-json key=JSON gives a value as JSON,
whatever the declared type (e.g. --param-json 'stop=["\\n"]'). --param-json key=@FILE
reads the JSON from FILE, and key=@- from standard input (piped: svc login reads a key
the same way): a value that holds secrets (a custom_container's env) stays off the
command line, where every user of the host can read it (ps):
  svc submit custom_container --param-json env=@- ... < env.json`;

/** The params of a submit: each --param typed by the job type's declared parameters, each --param-json parsed. */
export async function buildParams(c: Clients, jobType: string, args: ParamArg[]): Promise<JsonObject | undefined> {
  if (args.length === 0) return undefined;
  let declared = new Map<string, JobParam>();
  if (args.some(([option]) => option === "param")) {
    try {
      const rule = (await c.jobTypes.listJobTypes({})).jobTypes.find((t) => t.jobType === jobType);
      declared = new Map((rule?.params ?? []).map((p) => [p.name, p]));
    } catch {
      // A server that does not say: every value is taken as JSON when it parses, as for an undeclared parameter.
    }
  }
  if (args.filter(([option, , text]) => option === "param-json" && text === "@-").length > 1) {
    throw new UsageError("--param-json: only one value can be read from standard input (@-); give the others as @FILE");
  }
  const params: JsonObject = {};
  for (const [option, key, text] of args) {
    if (option === "param-json" && text.startsWith("@")) {
      params[key] = await jsonFrom(key, text.slice(1));
    } else if (option === "param-json") {
      try {
        params[key] = JSON.parse(text) as JsonValue;
      } catch {
        throw new UsageError(`--param-json ${key}: not JSON: ${text}`);
      }
    } else params[key] = typedParam(text, declared.get(key)?.type);
  }
  return params;
}

/**
 * The JSON of --param-json key=@FILE (key=@-: standard input, which must be piped or redirected).
 * What it read is never repeated in a message: it may be a secret.
 */
async function jsonFrom(key: string, source: string): Promise<JsonValue> {
  if (!source) throw new UsageError(`--param-json ${key}=@ names no file (@FILE, or @- for standard input)`);
  let text: string;
  const from = source === "-" ? "standard input" : source;
  if (source === "-") {
    if (process.stdin.isTTY) throw new UsageError(`--param-json ${key}=@- reads standard input: pipe or redirect the JSON into svc (… < FILE)`);
    text = "";
    process.stdin.setEncoding("utf8");
    for await (const chunk of process.stdin) text += chunk;
  } else {
    try {
      text = fs.readFileSync(source, "utf8");
    } catch (err) {
      throw new UsageError(`--param-json ${key}=@${source}: cannot read it (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
    }
  }
  try {
    return JSON.parse(text) as JsonValue;
  } catch {
    throw new UsageError(`--param-json ${key}: ${from} does not hold one JSON value`);
  }
}

function typedParam(text: string, type: string | undefined): JsonValue {
  const json = (): JsonValue | undefined => {
    try {
      return JSON.parse(text) as JsonValue;
    } catch {
      return undefined;
    }
  };
  switch (type) {
    case "string":
      return text;
    case "integer":
    case "number":
      // Not a number: sent as given, and the server says what it wants.
      return text.trim() !== "" && Number.isFinite(Number(text)) ? Number(text) : text;
    case "boolean":
      return text === "true" ? true : text === "false" ? false : text;
    default:
      return json() ?? text;
  }
}
