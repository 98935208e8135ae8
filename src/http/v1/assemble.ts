// The gateway asks every serving endpoint for a stream (proxy.ts), also when
// its client wants one JSON answer: a generation is then watched chunk by
// chunk (the idle limit applies between chunks, not to the whole generation)
// and the endpoint's usage is known as it goes. This builds the
// `chat.completion` object vLLM would have answered from the
// `chat.completion.chunk` events: each choice's delta merged into its
// message (text appended, tool calls by their index), logprobs concatenated,
// the finish reason, choices in index order; and it keeps track of the usage
// the endpoint reported.

/** Token counts an endpoint reported, with the `usage` object they came in. */
export interface ReportedUsage {
  promptTokens: number;
  completionTokens: number;
  raw: Record<string, unknown>;
}

export function usageOf(json: unknown): ReportedUsage | undefined {
  const u = (json as { usage?: unknown } | null)?.usage as { prompt_tokens?: unknown; completion_tokens?: unknown } | null | undefined;
  if (!u || typeof u !== "object" || Array.isArray(u)) return undefined;
  const p = Number(u.prompt_tokens);
  const c = Number(u.completion_tokens);
  if (!Number.isSafeInteger(p) || !Number.isSafeInteger(c) || p < 0 || c < 0) return undefined;
  return { promptTokens: p, completionTokens: c, raw: u as Record<string, unknown> };
}

/**
 * The usage an endpoint reported during a stream. The usage-only chunk that ends a stream
 * (`choices: []`, include_usage) is the total. Before it, `continuous_usage_stats` puts usage on
 * every chunk, and vLLM counts there the completion tokens of that chunk's choice only: a stream
 * cut before its end is billed the prompt last reported and the sum, over the choices, of the
 * latest count of each (with n = 1, simply the last usage reported).
 */
export class UsageTracker {
  private total: ReportedUsage | undefined;
  private last: ReportedUsage | undefined;
  private readonly perChoice = new Map<number, number>();

  see(chunk: Record<string, unknown>, reported: ReportedUsage | undefined): void {
    if (!reported) return;
    const choices = Array.isArray(chunk.choices) ? (chunk.choices as { index?: unknown }[]) : [];
    if (choices.length === 0) {
      this.total = reported;
      return;
    }
    this.last = reported;
    if (choices.length === 1) {
      const i = Number.isSafeInteger(choices[0]?.index) ? (choices[0].index as number) : 0;
      this.perChoice.set(i, Math.max(this.perChoice.get(i) ?? 0, reported.completionTokens));
    }
  }

  get(): ReportedUsage | undefined {
    if (this.total) return this.total;
    if (!this.last) return undefined;
    let sum = 0;
    for (const n of this.perChoice.values()) sum += n;
    return { ...this.last, completionTokens: Math.max(this.last.completionTokens, sum) };
  }
}

type Json = Record<string, unknown>;

interface ChoiceParts {
  index: number;
  message: Json;
  /** Tool calls by their stream index. */
  toolCalls: Map<number, Json>;
  logprobs: Json | null;
  finishReason: unknown;
  /** Other fields of the choice (vLLM's stop_reason, token_ids). */
  extra: Json;
}

const isObject = (v: unknown): v is Json => !!v && typeof v === "object" && !Array.isArray(v);

/**
 * Keys never merged from an endpoint's chunks. JSON.parse makes "__proto__" an own key; assigned or
 * followed on a plain object it reaches Object.prototype, which every object of the process inherits
 * from (a "*" there becomes every model's rate). No OpenAI or vLLM field has these names.
 */
const UNSAFE_KEYS = new Set(["__proto__", "constructor", "prototype"]);

/** The fields of a chunk's object that may be merged: own, and not UNSAFE_KEYS. */
const safeEntries = (o: Json): [string, unknown][] => Object.entries(o).filter(([k]) => !UNSAFE_KEYS.has(k));

/** Appends `items` to `into` in place: copying what came before on every chunk would make an answer of N chunks cost N². */
function append(into: unknown[], items: unknown[]): void {
  for (const x of items) into.push(x);
}

/** Merges a streamed object into what came before: strings appended, objects merged, arrays concatenated, anything else replaced. */
function mergeInto(target: Json, delta: Json): void {
  for (const [k, v] of safeEntries(delta)) {
    const had = Object.hasOwn(target, k) ? target[k] : undefined;
    if (typeof v === "string") target[k] = typeof had === "string" ? had + v : v;
    else if (isObject(v)) {
      if (!isObject(had)) target[k] = {};
      mergeInto(target[k] as Json, v);
    } else if (Array.isArray(v)) {
      if (Array.isArray(had)) append(had, v);
      else target[k] = [...v];
    } else if (v !== null || !Object.hasOwn(target, k)) target[k] = v;
  }
}

/** A generation's growth in JSON bytes when `value` is merged into it (what the answer cap counts). */
const jsonBytes = (value: unknown): number => (value === undefined || value === null ? 0 : Buffer.byteLength(JSON.stringify(value)));

export class CompletionBuilder {
  private head: Json | undefined;
  private readonly choices = new Map<number, ChoiceParts>();
  /** About the size in bytes of the answer built so far. */
  bytes = 0;

  constructor(private readonly maxBytes: number) {}

  get empty(): boolean {
    return this.choices.size === 0;
  }

  /** Takes one chunk; false (and nothing taken) when it would grow the answer past the cap. */
  add(chunk: Json): boolean {
    const choices = Array.isArray(chunk.choices) ? (chunk.choices as unknown[]).filter(isObject) : [];
    // Every field of a choice but its index grows the answer (delta, logprobs, and the extra fields such as
    // vLLM's token_ids, which are concatenated too).
    let growth = 0;
    for (const c of choices) for (const [k, v] of Object.entries(c)) if (k !== "index") growth += jsonBytes(v);
    if (this.bytes + growth > this.maxBytes) return false;
    this.bytes += growth;
    if (!this.head) this.head = {};
    for (const [k, v] of safeEntries(chunk)) {
      if (k !== "choices" && k !== "usage" && k !== "object" && !Object.hasOwn(this.head, k)) this.head[k] = v;
    }
    for (const c of choices) {
      const index = Number.isSafeInteger(c.index) ? (c.index as number) : 0;
      let parts = this.choices.get(index);
      if (!parts) {
        parts = { index, message: {}, toolCalls: new Map(), logprobs: null, finishReason: null, extra: {} };
        this.choices.set(index, parts);
      }
      for (const [k, v] of safeEntries(c)) {
        if (k === "index") continue;
        if (k === "delta") {
          if (isObject(v)) this.mergeDelta(parts, v);
        } else if (k === "logprobs") {
          if (isObject(v)) mergeInto((parts.logprobs ??= {}), v);
        } else if (k === "finish_reason") {
          if (v !== null && v !== undefined) parts.finishReason = v;
        } else if (Array.isArray(v)) {
          const had = Object.hasOwn(parts.extra, k) ? parts.extra[k] : undefined;
          if (Array.isArray(had)) append(had, v);
          else parts.extra[k] = [...v];
        } else if (v !== null || !Object.hasOwn(parts.extra, k)) {
          parts.extra[k] = v;
        }
      }
    }
    return true;
  }

  private mergeDelta(parts: ChoiceParts, delta: Json): void {
    for (const [k, v] of safeEntries(delta)) {
      if (k === "role") {
        if (typeof v === "string") parts.message.role = v;
      } else if (k === "tool_calls") {
        if (!Array.isArray(v)) continue;
        for (const [pos, call] of v.entries()) {
          if (!isObject(call)) continue;
          const i = Number.isSafeInteger(call.index) ? (call.index as number) : pos;
          const { index: _index, ...rest } = call;
          let acc = parts.toolCalls.get(i);
          if (!acc) parts.toolCalls.set(i, (acc = {}));
          // A call's id, type and name come once, in its first delta; its arguments in pieces.
          for (const f of ["id", "type"]) if (typeof rest[f] === "string" && typeof acc[f] !== "string") acc[f] = rest[f];
          const { id: _id, type: _type, ...more } = rest;
          mergeInto(acc, more);
        }
      } else {
        mergeInto(parts.message, { [k]: v });
      }
    }
  }

  /**
   * The `chat.completion` object: `finishAs` is the finish reason of choices the stream ended
   * before they finished (the gateway cut the answer: "length"); `usage` the usage object to show.
   */
  build(opts: { usage?: Record<string, unknown>; finishAs?: string } = {}): Json {
    const { id, created, model, ...rest } = this.head ?? {};
    const choices = [...this.choices.values()]
      .sort((a, b) => a.index - b.index)
      .map((c) => {
        const { role, content, ...fields } = c.message;
        const message: Json = { role: role ?? "assistant", content: content ?? null, ...fields };
        if (c.toolCalls.size > 0) {
          // A message that only calls tools has no content (null, as vLLM's own unstreamed answer and OpenAI's),
          // though vLLM's streamed role delta carries "".
          if (content === "") message.content = null;
          message.tool_calls = [...c.toolCalls.entries()]
            .sort(([a], [b]) => a - b)
            .map(([, call]) => ({ id: call.id, type: call.type ?? "function", ...call }));
        }
        return { index: c.index, message, logprobs: c.logprobs, finish_reason: c.finishReason ?? opts.finishAs ?? null, ...c.extra };
      });
    return { id, object: "chat.completion", created, model, ...rest, choices, ...(opts.usage ? { usage: opts.usage } : {}) };
  }
}
