// The job-type rules as data for clients (forms, CLIs): read from the same
// schemas, rates and limits that submit validates with, never restated.
import { fromJson, type JsonObject, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import type { JobParamSchema, ListJobTypesResponseSchema } from "../../../gen/svc/v1/job_types_pb.js";
import { PARAMS_SCHEMAS } from "./job-schemas.js";
import { JOB_TYPES, PROVIDER_SHARE_PERCENT, RATE_HALALA_PER_MINUTE, estimateHalala, type JobType } from "../money/pricing.js";
import { checkEnum, checkRange } from "../shared/validate.js";
import { SUBMIT_LIMITS } from "./submit.js";

type Schema = Record<string, unknown>;

const num = (v: unknown): number | undefined => (typeof v === "number" ? v : undefined);

function paramOf(name: string, s: Schema, required: boolean): MessageInitShape<typeof JobParamSchema> {
  const exclusiveMinimum = num(s.exclusiveMinimum);
  return {
    name,
    type: typeof s.type === "string" ? s.type : "string",
    description: typeof s.description === "string" ? s.description : "",
    required,
    minimum: num(s.minimum) ?? exclusiveMinimum,
    maximum: num(s.maximum),
    exclusiveMinimum: exclusiveMinimum !== undefined,
    defaultValue: s.default === undefined ? undefined : fromJson(ValueSchema, s.default as JsonValue),
    choices: Array.isArray(s.enum) ? s.enum.map(String) : [],
    maxLength: num(s.maxLength),
    pattern: typeof s.pattern === "string" ? s.pattern : undefined,
    patternMessage: typeof s["x-error"] === "string" ? s["x-error"] : undefined,
  };
}

/** What a submit of `jobType` for `durationMinutes` holds, validated as submit validates them. */
export function estimateFor(jobType: string, durationMinutes: number | undefined): { jobType: JobType; durationMinutes: number; rate: number; estimate: number } {
  const type = checkEnum(jobType, JOB_TYPES, "job_type") as JobType;
  const L = SUBMIT_LIMITS.durationMinutes;
  const minutes = checkRange(durationMinutes ?? L.default, L.min, L.max, "duration_minutes");
  const rate = RATE_HALALA_PER_MINUTE[type];
  return { jobType: type, durationMinutes: minutes, rate, estimate: estimateHalala(rate, minutes) };
}

/** Every job type with its parameters (schema order), rate and the submit limits. */
export function jobTypeRules(): MessageInitShape<typeof ListJobTypesResponseSchema> {
  const range = (r: { min: number; max: number; default?: number }) => ({ minimum: r.min, maximum: r.max, defaultValue: r.default ?? r.min });
  return {
    jobTypes: JOB_TYPES.map((jobType) => {
      const schema = PARAMS_SCHEMAS[jobType];
      const required = new Set((schema.required as string[] | undefined) ?? []);
      const props = (schema.properties ?? {}) as Record<string, Schema>;
      return {
        jobType,
        rateHalalaPerMinute: BigInt(RATE_HALALA_PER_MINUTE[jobType]),
        params: Object.entries(props).map(([name, s]) => paramOf(name, s, required.has(name))),
        paramsSchema: schema as JsonObject,
      };
    }),
    durationMinutes: range(SUBMIT_LIMITS.durationMinutes),
    maxDurationSeconds: range(SUBMIT_LIMITS.maxDurationSeconds),
    priority: range(SUBMIT_LIMITS.priority),
    minVramGb: range(SUBMIT_LIMITS.minVramGb),
    providerSharePercent: PROVIDER_SHARE_PERCENT,
  };
}
