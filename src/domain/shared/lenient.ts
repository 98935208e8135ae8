// Reading what real daemons send: numbers as strings, JSON objects as
// strings, lists as comma-separated text. Each reader returns undefined for
// what it cannot use instead of rejecting the whole report.
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import { mayEscapeUnstorable, storableText, withoutNul } from "../../shared/nul-text.js";

export function num(v: unknown): number | undefined {
  if (typeof v === "number") return Number.isFinite(v) ? v : undefined;
  if (typeof v === "string" && v.trim() !== "") {
    const n = Number(v.trim().replace(/\s*(mib|mb|%|c|w|°c)$/i, ""));
    return Number.isFinite(n) ? n : undefined;
  }
  return undefined;
}

/** A non-negative integer at most `max`. */
export function count(v: unknown, max = 2 ** 31 - 1): number | undefined {
  const n = num(v);
  return n === undefined || n < 0 || n > max ? undefined : Math.round(n);
}

/** Trimmed text of at most `max` characters, made storable (src/shared/nul-text.ts: no U+0000, no lone surrogate). */
export function text(v: unknown, max = 200): string | undefined {
  if (typeof v === "number" && Number.isFinite(v)) return String(v);
  if (typeof v !== "string") return undefined;
  const t = storableText(v).trim();
  return t ? truncate(t, max).value : undefined;
}

/**
 * JSON text of a value, made storable in every string and key (withoutNul). Rare: the text is
 * checked first (JSON.stringify escapes U+0000 and a lone surrogate, never a paired one).
 */
export function storableJson(v: unknown): string {
  const json = JSON.stringify(v);
  return mayEscapeUnstorable(json) ? JSON.stringify(withoutNul(v)) : json;
}

export { withoutNul };

/** An object, or a string holding a JSON object. */
export function object(v: unknown): JsonObject | undefined {
  if (v && typeof v === "object" && !Array.isArray(v)) return v as JsonObject;
  if (typeof v === "string" && v.trim().startsWith("{")) {
    try {
      const parsed = JSON.parse(v);
      if (parsed && typeof parsed === "object" && !Array.isArray(parsed)) return parsed as JsonObject;
    } catch {
      /* not JSON: ignored */
    }
  }
  return undefined;
}

/** An array, or a string holding a JSON array. */
export function array(v: unknown): JsonValue[] | undefined {
  if (Array.isArray(v)) return v;
  if (typeof v === "string" && v.trim().startsWith("[")) {
    try {
      const parsed = JSON.parse(v);
      if (Array.isArray(parsed)) return parsed;
    } catch {
      /* not JSON: ignored */
    }
  }
  return undefined;
}

/**
 * A list of names: ["a", "b"], [{"name": "a"}], a JSON array in a string, or
 * "a, b". Deduplicated, at most `maxItems` names of at most `maxLen` characters.
 */
export function names(v: unknown, maxItems = 500, maxLen = 300): string[] | undefined {
  let items: unknown[] | undefined = array(v);
  if (!items && typeof v === "string") items = v.split(",");
  if (!items) return undefined;
  const out = new Set<string>();
  for (const item of items) {
    const o = object(item);
    const name = o ? text(o.name ?? o.model_name ?? o.model ?? o.id, maxLen) : text(item, maxLen);
    if (name) out.add(name);
    if (out.size >= maxItems) break;
  }
  return [...out];
}

/** Truncates to `max` characters (code points, so no surrogate pair is split). */
export function truncate(s: string, max: number): { value: string; truncated: boolean; length: number } {
  if (s.length <= max) return { value: s, truncated: false, length: s.length };
  const points = Array.from(s);
  if (points.length <= max) return { value: s, truncated: false, length: points.length };
  return { value: points.slice(0, max).join(""), truncated: true, length: points.length };
}
