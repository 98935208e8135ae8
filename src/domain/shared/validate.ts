// Area shared (src/domain/shared): the leaves every other area may use —
// input validation, lenient parsing of daemon reports, the audit record, the
// liveness window and the jobs row type. It imports nothing of the domain.
//
// Input rules shared by every service: each failure is a 400 naming the field.
import { getOption, type DescField, type DescMessage } from "@bufbuild/protobuf";
import { required } from "../../../gen/svc/v1/options_pb.js";
import { badRequest } from "../../errors.js";

const EMAIL = /^[^\s@]+@[^\s@]+\.[^\s@]+$/;

/** 400 listing every missing required field at once (`text` before the list). */
export function requireFields(values: Record<string, unknown>, text = "missing required fields"): void {
  const missing = Object.entries(values)
    .filter(([, v]) => v === undefined || v === null || (typeof v === "string" && v.trim() === ""))
    .map(([k]) => k);
  if (missing.length > 0) throw badRequest(`${text}: ${missing.join(", ")}`);
}

const requiredCache = new WeakMap<DescMessage, DescField[]>();

/** The members a request message's proto marks `(svc.v1.required)`, in field order (the API document lists them as required). */
function requiredMembersOf(desc: DescMessage): DescField[] {
  let fields = requiredCache.get(desc);
  if (!fields) {
    fields = desc.fields.filter((f) => getOption(f, required));
    requiredCache.set(desc, fields);
  }
  return fields;
}

/**
 * 400 listing every member of `desc` marked `(svc.v1.required)` that `value` lacks (absent, null or
 * blank): the request message itself, or an input holding its members under the same names.
 */
export function requireMembers(desc: DescMessage, value: object, text?: string): void {
  const members = value as Record<string, unknown>;
  requireFields(Object.fromEntries(requiredMembersOf(desc).map((f) => [f.name, members[f.localName]])), text);
}

export function checkEmail(email: string, field = "email"): string {
  const e = email.trim();
  if (!EMAIL.test(e) || e.length > 254) throw badRequest(`${field} must be a valid email address`);
  return e.toLowerCase();
}

export function checkEnum<T extends string>(value: string, allowed: readonly T[], field: string): T {
  if (!allowed.includes(value as T)) throw badRequest(`${field} must be one of ${allowed.join(", ")}`);
  return value as T;
}

export function checkRange(value: number, min: number, max: number, field: string, integer = false): number {
  if (!Number.isFinite(value) || value < min || value > max || (integer && !Number.isInteger(value))) {
    throw badRequest(`${field} must be ${integer ? "an integer" : "a number"} between ${min} and ${max}`);
  }
  return value;
}

export function checkLength(value: string | undefined, max: number, field: string): string | undefined {
  if (value !== undefined && value.length > max) throw badRequest(`${field} must be at most ${max} characters`);
  return value;
}

/** Trims, and maps "" to undefined for optional text. */
/** Longest reason an action takes (a cancel, a suspension, a re-queue...): past it, 400 naming the field. */
export const REASON_MAX_CHARS = 1000;

export function optionalText(value: string | undefined, max: number, field: string): string | undefined {
  const v = value?.trim();
  return v ? checkLength(v, max, field) : undefined;
}

/**
 * The largest `offset` of a list. A page reads every row before its offset
 * (SQL OFFSET): bounded, a page costs at most this many rows plus itself,
 * however long the history behind the list.
 */
export const LIST_OFFSET_MAX = 10_000;

/**
 * Rows a list's `total` counts at most where it is counted (not kept in
 * counters), or up to one past the page asked for when that is more: a total
 * at that bound says only that more rows follow the page.
 */
export const LIST_COUNTED = 10_000;

/** How many rows a bounded total counts for a page: LIST_COUNTED, or one past the page when that is more. */
export const countedFor = (p: { limit: number; offset: number }): number => Math.max(LIST_COUNTED, p.offset + p.limit + 1);

/**
 * Paging with sane bounds: `limit` 1 to `max`, `offset` 0 to LIST_OFFSET_MAX
 * (`offsetMax` for a list that bounds its offsets itself). Past the bound a 400
 * names the field and says how to reach the rows past it (`beyond`).
 */
export function page(
  limit: number | undefined,
  offset: number | undefined,
  max = 200,
  beyond = "narrow the list with its filters",
  offsetMax = LIST_OFFSET_MAX,
): { limit: number; offset: number } {
  const l = limit === undefined ? 50 : checkRange(limit, 1, max, "limit", true);
  if (offset !== undefined && offsetMax === LIST_OFFSET_MAX && Number.isInteger(offset) && offset > offsetMax) {
    throw badRequest(
      `offset must be an integer between 0 and ${offsetMax}: a page reads every row before its offset, so pages reach the first ` +
        `${offsetMax} rows; to reach rows past them, ${beyond}`,
    );
  }
  const o = offset === undefined ? 0 : checkRange(offset, 0, offsetMax, "offset", true);
  return { limit: l, offset: o };
}

export const iso = (d: Date | string | null | undefined): string | undefined =>
  d === null || d === undefined ? undefined : new Date(d).toISOString();
