// Per-token prices for the OpenAI-compatible /v1 gateway, in one place:
// the rate table (halala per million tokens, per model), the cost of a
// response, and the price cap held before a request is proxied.
// The 75/25 split is pricing.ts's rule (splitRevenue), applied at settlement.

export interface TokenRate {
  /** Halala per 1,000,000 prompt tokens. */
  input: number;
  /** Halala per 1,000,000 completion tokens. */
  output: number;
}

export type TokenRates = Record<string, TokenRate>;

/** The rate of a model the built-in table does not name. */
export const DEFAULT_TOKEN_RATE: TokenRate = { input: 100, output: 300 };

/** Built-in rates by served model name; SVC_V1_TOKEN_RATES entries replace or extend them, and its "*" replaces them all. */
export const TOKEN_RATES: TokenRates = {
  "TinyLlama/TinyLlama-1.1B-Chat-v1.0": { input: 20, output: 60 },
  "microsoft/Phi-3-mini-4k-instruct": { input: 50, output: 150 },
  "meta-llama/Llama-3.1-8B-Instruct": { input: 100, output: 300 },
  "mistralai/Mistral-7B-Instruct-v0.3": { input: 100, output: 300 },
  "Qwen/Qwen2.5-7B-Instruct": { input: 100, output: 300 },
  "humain-ai/ALLaM-7B-Instruct-preview": { input: 100, output: 300 },
  "google/gemma-2-9b-it": { input: 120, output: 360 },
};

/** Completion tokens allowed (and held for) when a request names no max_tokens. */
export const DEFAULT_MAX_COMPLETION_TOKENS = 4096;

const PER = 1_000_000;

/**
 * Parses SVC_V1_TOKEN_RATES: a JSON object `{"<model>" | "*": {"input": n, "output": n}}`
 * with non-negative integer halala per million tokens. Throws a message naming the bad entry.
 */
export function parseTokenRates(raw: string | undefined): TokenRates {
  if (!raw) return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    throw new Error("SVC_V1_TOKEN_RATES must be a JSON object");
  }
  if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("SVC_V1_TOKEN_RATES must be a JSON object");
  const out: TokenRates = {};
  for (const [model, rate] of Object.entries(parsed as Record<string, unknown>)) {
    const r = rate as Record<string, unknown> | null;
    const ok = (v: unknown) => Number.isSafeInteger(v) && (v as number) >= 0 && (v as number) <= 1e12;
    if (!r || typeof r !== "object" || !ok(r.input) || !ok(r.output)) {
      throw new Error(`SVC_V1_TOKEN_RATES["${model}"] must be {"input": n, "output": n} with integer halala per million tokens`);
    }
    out[model] = { input: r.input as number, output: r.output as number };
  }
  return out;
}

/** The rate for a model: its configured entry, the configured "*", its built-in entry, the built-in default. */
export function tokenRate(model: string, overrides: TokenRates = {}): TokenRate {
  return overrides[model] ?? overrides["*"] ?? TOKEN_RATES[model] ?? DEFAULT_TOKEN_RATE;
}

/** Cost of a response: the exact token price rounded up to a whole halala (0 only for 0 tokens). */
export function tokenCostHalala(rate: TokenRate, promptTokens: number, completionTokens: number): number {
  return Math.ceil((promptTokens * rate.input + completionTokens * rate.output) / PER);
}

/**
 * An upper bound of the prompt's tokens without its tokenizer: byte-level BPE
 * tokens cover at least one byte each, and the JSON quoting and keys we count
 * exceed the chat template's few tokens per message.
 */
export function promptTokensBound(promptParts: unknown): number {
  return Buffer.byteLength(JSON.stringify(promptParts ?? "")) + 16;
}

/** The most completion tokens `availableHalala` pays for after the prompt (may be <= 0). */
export function affordableCompletionTokens(rate: TokenRate, availableHalala: number, promptTokens: number, choices = 1): number {
  if (rate.output === 0) return Number.MAX_SAFE_INTEGER;
  return Math.floor((availableHalala * PER - promptTokens * rate.input) / (rate.output * choices));
}
