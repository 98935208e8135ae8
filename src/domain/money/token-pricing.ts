// Per-token prices for the OpenAI-compatible /v1 gateway, in one place:
// the rate table (halala per million tokens, per model), the cost of a
// response, and the price cap held before a request is proxied.
// The 75/25 split is pricing.ts's rule (providerShareMicro), applied at settlement
// with sub-halala carries (usage-billing.ts).

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

/** Completion tokens allowed (and held for) when a request to a paid endpoint names no max_tokens. */
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

/**
 * The rate for a model: its configured entry, the configured "*", its built-in entry, the built-in default.
 * Own entries only: the model is the client's string ("constructor", "__proto__" would otherwise read
 * Object.prototype), and nothing inherited may stand in for a rate.
 */
export function tokenRate(model: string, overrides: TokenRates = {}): TokenRate {
  const own = (table: TokenRates, key: string) => (Object.hasOwn(table, key) ? table[key] : undefined);
  return own(overrides, model) ?? own(overrides, "*") ?? own(TOKEN_RATES, model) ?? DEFAULT_TOKEN_RATE;
}

/**
 * Exact cost of tokens in micro-halala (millionths of a halala): a rate in halala per
 * million tokens times a token count. A bigint: rates up to 1e12 times safe-integer
 * counts pass 2^53. What a /v1 request costs (usage-billing.ts carries what is below one halala).
 */
export function tokenCostMicro(rate: TokenRate, promptTokens: number, completionTokens: number): bigint {
  for (const n of [promptTokens, completionTokens, rate.input, rate.output]) {
    if (!Number.isSafeInteger(n) || n < 0) throw new Error(`invalid token count or rate ${n}`);
  }
  return BigInt(promptTokens) * BigInt(rate.input) + BigInt(completionTokens) * BigInt(rate.output);
}

/**
 * The exact token price rounded up to a whole halala (0 only for 0 tokens): the price cap a
 * request reserves. A charge never exceeds it: the cost of tokens within the cap is at most
 * cap x 1e6 micro-halala and a renter's carry is below 1e6, so their whole halala are at most cap.
 */
export function tokenCostHalala(rate: TokenRate, promptTokens: number, completionTokens: number): number {
  const micro = tokenCostMicro(rate, promptTokens, completionTokens);
  return Number((micro + BigInt(PER) - 1n) / BigInt(PER));
}

// What the gateway can bill is bounded by what it can see. A byte-level BPE
// token decodes to at least one byte, so text of B UTF-8 bytes is at most B
// tokens; the allowances below cover the tokens that never appear as text.
// Usage an endpoint reports beyond these bounds is not billed (usage-billing.ts
// records it against the provider, reputation.ts docks its reliability).

/** Prompt tokens a chat template adds around each message (role header, separators, end marker). */
export const PROMPT_TOKENS_PER_MESSAGE = 8;
/** Prompt tokens a template adds once per request (BOS, generation prompt, a model's default system prompt). */
export const PROMPT_TOKENS_PER_REQUEST = 64;
/** Completion tokens per choice beyond its delivered text (end of sequence and other special tokens, stripped reasoning markers). */
export const COMPLETION_TOKENS_PER_CHOICE = 16;
/** Completion tokens per tool call beyond its name and arguments (the model's tool-call markup, parsed away). */
export const COMPLETION_TOKENS_PER_TOOL_CALL = 16;

export interface TokenCounts {
  promptTokens: number;
  completionTokens: number;
}

/** UTF-8 bytes of every string inside a JSON value (object keys excluded). Iterative: a request's nesting cannot overflow the stack. */
export function stringBytes(value: unknown): number {
  let n = 0;
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const v = stack.pop();
    if (typeof v === "string") n += Buffer.byteLength(v);
    else if (Array.isArray(v)) for (const x of v) stack.push(x);
    else if (v && typeof v === "object") for (const x of Object.values(v)) stack.push(x);
  }
  return n;
}

/**
 * Indentation allowed to a template's `tojson` (Llama 3.1 prints each tool with `tojson(indent=4)`). Python's
 * json.dumps with an indent writes a newline and the indentation before every item and closing bracket: never
 * fewer bytes than without one (", " and ": " separators), nor than with a smaller indent.
 */
export const TOJSON_INDENT = 4;
/** Prompt tokens a template adds around each tool call of an assistant message (Qwen2.5's `<tool_call>` markup, `{"name": "...", "arguments": ...}`). */
export const PROMPT_TOKENS_PER_TOOL_CALL = 16;

/**
 * Bytes Python writes for a JSON number of source text `literal` once json.loads has read it (vLLM, pydantic) and
 * json.dumps writes it again (a template's `tojson`): an integer (no `.`, `e`) as its digits, a float as Python's
 * repr (shortest digits; fixed notation with ".0" from 1e-4 to below 1e16, else an exponent of at least two digits:
 * 1e15 is "1000000000000000.0", 1e-7 "1e-07", 1e400 "Infinity").
 */
export function pythonNumberBytes(literal: string): number {
  if (!/[.eE]/.test(literal)) return literal === "-0" ? 1 : literal.length; // an int: its digits ("-0" prints as "0")
  const x = Number(literal); // correctly rounded, as Python's float()
  if (!Number.isFinite(x)) return x < 0 ? "-Infinity".length : "Infinity".length;
  const sign = x < 0 || Object.is(x, -0) ? 1 : 0;
  if (x === 0) return sign + "0.0".length;
  // The shortest digits that read back as x (Python's repr picks as many), and the decimal exponent.
  const [mantissa, e] = Math.abs(x).toExponential().split("e");
  const digits = mantissa.replace(".", "").length;
  const exp = Number(e);
  if (exp >= -4 && exp < 16) {
    if (exp >= digits - 1) return sign + exp + 1 + ".0".length; // 1000000000000000.0
    if (exp >= 0) return sign + digits + ".".length; // 12.5
    return sign + "0.".length + (-exp - 1) + digits; // 0.00125
  }
  return sign + (digits > 1 ? digits + 1 : 1) + "e+".length + Math.max(2, String(Math.abs(exp)).length); // 1.5e-07
}

/**
 * An upper bound on the UTF-8 bytes of Python's `json.dumps(json.loads(text), ensure_ascii=False, indent=i)` for any
 * indent i from none to TOJSON_INDENT: how chat templates print a value (`tojson`, as transformers defines it) that the
 * engine read from JSON `text`. Counted on the text's tokens: each string at its bytes in `text` (Python escapes only
 * what JSON text must, so it writes no more), each number by pythonNumberBytes, `true`/`false`/`null` as they are,
 * ": " per key, and a newline and the indentation before every item and closing bracket of a non-empty container
 * (the "," before an item too). `text` must be JSON (JSON.parse accepts it); whitespace in it counts for nothing.
 * A scan, not a recursion: any nesting is measured.
 */
export function pythonJsonBytes(text: string): number {
  let n = 0;
  /** Per open container: whether an item was seen. */
  const open: boolean[] = [];
  const line = () => 1 + TOJSON_INDENT * open.length; // "\n" and the indentation of the current depth
  const item = () => {
    if (open.length > 0 && !open[open.length - 1]) {
      open[open.length - 1] = true;
      n += line();
    }
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === " " || c === "\t" || c === "\n" || c === "\r") {
      i++;
    } else if (c === "{" || c === "[") {
      item();
      n += 1;
      open.push(false);
      i++;
    } else if (c === "}" || c === "]") {
      if (open.pop()) n += line();
      n += 1;
      i++;
    } else if (c === ",") {
      n += 1 + line();
      i++;
    } else if (c === ":") {
      n += 2;
      i++;
    } else if (c === '"') {
      let j = i + 1;
      while (j < text.length && text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      j++;
      item();
      n += Buffer.byteLength(text.slice(i, j));
      i = j;
    } else {
      let j = i + 1;
      while (j < text.length && !' \t\n\r,:]}'.includes(text[j])) j++;
      const t = text.slice(i, j);
      item();
      n += t === "true" || t === "false" || t === "null" ? t.length : pythonNumberBytes(t);
      i = j;
    }
  }
  return n;
}

/** pythonJsonBytes of a JSON value the gateway holds (it forwards the request as JSON.stringify writes it). */
export function pythonValueBytes(value: unknown): number {
  const text = JSON.stringify(value);
  return text === undefined ? 0 : pythonJsonBytes(text);
}

/**
 * A tool as vLLM's request model dumps it for the template (`tool.model_dump()`): its `type` ("function" when
 * absent), and the function's `description` and `parameters` (null when absent).
 */
function dumpedTool(tool: unknown): unknown {
  if (!tool || typeof tool !== "object" || Array.isArray(tool)) return tool;
  const dumped: Record<string, unknown> = { type: "function", ...(tool as Record<string, unknown>) };
  const fn = dumped.function;
  if (fn && typeof fn === "object" && !Array.isArray(fn)) dumped.function = { description: null, parameters: null, ...(fn as Record<string, unknown>) };
  return dumped;
}

/**
 * The tool calls of an assistant message, each with its `function` object: vLLM parses the arguments of
 * those only (another role's are left as sent, and counted as the strings they are).
 */
function toolCallsOf(message: unknown): { function: Record<string, unknown> }[] {
  const m = message as { role?: unknown; tool_calls?: unknown } | null;
  const calls = m?.role === "assistant" ? m.tool_calls : undefined;
  if (!Array.isArray(calls)) return [];
  return calls.filter((c): c is { function: Record<string, unknown> } => {
    const fn = (c as { function?: unknown } | null)?.function;
    return !!fn && typeof fn === "object" && !Array.isArray(fn);
  });
}

/**
 * Why a message's tool call arguments cannot be measured, or undefined: vLLM json.loads a string of arguments
 * before the template prints them, so a string must be JSON (Python's reader also takes NaN and Infinity, which
 * print longer and which no OpenAI client sends; the engine refuses anything else).
 */
function toolCallArgumentsInvalid(messages: unknown[]): string | undefined {
  for (const [i, m] of messages.entries()) {
    for (const [j, call] of toolCallsOf(m).entries()) {
      const args = call.function.arguments;
      if (typeof args !== "string" || args === "") continue;
      try {
        JSON.parse(args);
      } catch {
        return `messages[${i}].tool_calls[${j}].function.arguments must be a JSON text: the model server parses it to render the prompt`;
      }
    }
  }
  return undefined;
}

/**
 * The bytes an assistant tool call's `arguments` count for: vLLM reads a string with json.loads ("" and other
 * empty values become {}) and the template prints the value with `tojson`, so its pythonJsonBytes; never less
 * than the string's own bytes (a template that printed it as sent).
 */
function argumentsBytes(args: unknown): number {
  if (typeof args === "string") return Math.max(Buffer.byteLength(args), args === "" ? 2 : pythonJsonBytes(args));
  return Math.max(2, pythonValueBytes(args ?? {}));
}

/**
 * The most prompt tokens a chat request can make: the text of its messages
 * (every string in them: content and its parts, names, tool calls) plus
 * PROMPT_TOKENS_PER_MESSAGE each, what the model's template renders from the
 * request besides them (tools and functions as JSON, documents,
 * chat_template_kwargs), and PROMPT_TOKENS_PER_REQUEST. Also the prompt part
 * of the price cap held before the request is proxied. Only for a request
 * unboundedPrompt accepts.
 *
 * What a template prints as JSON (`tojson`) is counted as Python writes it
 * (pythonJsonBytes): `tools` (each as vLLM dumps it), `functions`, `documents`,
 * `chat_template_kwargs`, and each assistant tool call's `arguments` (which
 * vLLM parses from their string first), with PROMPT_TOKENS_PER_TOOL_CALL for
 * the markup around each call. A token is at least one byte, so every digit,
 * separator and indentation byte is allowed a token of its own.
 */
export function promptTokensBound(body: Record<string, unknown>): number {
  const messages = Array.isArray(body.messages) ? body.messages : [];
  let n = PROMPT_TOKENS_PER_REQUEST + stringBytes(messages) + messages.length * PROMPT_TOKENS_PER_MESSAGE;
  for (const m of messages) {
    for (const call of toolCallsOf(m)) {
      const args = call.function.arguments;
      // stringBytes counted the arguments' own strings: they count as printed instead.
      n += PROMPT_TOKENS_PER_TOOL_CALL + argumentsBytes(args) - stringBytes(args);
    }
  }
  if (Array.isArray(body.tools)) for (const t of body.tools) n += pythonValueBytes(dumpedTool(t));
  else if (body.tools != null) n += pythonValueBytes(body.tools);
  // chat_template_kwargs reach the template as variables it may print (Llama 3.1's date_string, custom_tools).
  for (const f of ["functions", "documents", "chat_template_kwargs"]) if (body[f] != null) n += pythonValueBytes(body[f]);
  return n;
}

/**
 * The names a template renders besides chat_template_kwargs, which those would replace (the
 * tokenizer passes the special tokens and then the kwargs over them): `bos_token`, `eos_token`,
 * `additional_special_tokens`..., and the arguments of the render itself.
 */
const templateArgument = (name: string) =>
  /_tokens?$/.test(name) || ["chat_template", "messages", "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message"].includes(name);

/** OpenAI's limit on logit_bias entries: with more, a request could bias the whole vocabulary. */
export const LOGIT_BIAS_MAX_ENTRIES = 300;

/**
 * Why a chat request's completion tokens cannot be bounded by the text
 * delivered, or undefined when they can: `allowed_token_ids` (a completion
 * restricted to tokens that may print nothing), or more logit_bias entries
 * than OpenAI takes (enough to bias a vocabulary away from everything that
 * prints).
 */
export function unboundedCompletion(body: Record<string, unknown>): string | undefined {
  if (body.allowed_token_ids !== undefined && body.allowed_token_ids !== null) {
    return "allowed_token_ids is not accepted: a completion restricted to chosen token ids may deliver no text for what it generates, so it could not be bounded for billing";
  }
  const bias = body.logit_bias;
  if (bias === undefined || bias === null) return undefined;
  if (typeof bias !== "object" || Array.isArray(bias)) return "logit_bias must be an object of token ids to numbers";
  const n = Object.keys(bias).length;
  if (n > LOGIT_BIAS_MAX_ENTRIES) return `logit_bias may name at most ${LOGIT_BIAS_MAX_ENTRIES} tokens (${n} given)`;
  return undefined;
}

/**
 * Why the fields that decide whether a request can generate special tokens
 * (mayGenerateSpecialTokens) are not of the type the gateway reads, or
 * undefined when they are. vLLM's request model coerces what it is sent
 * ("true" or 1 for ignore_eos, "100" for a bias): such a value would boost or
 * unban tokens there while the gateway saw none, so only JSON booleans and
 * numbers are accepted (for min_tokens, integers of 0 or more).
 */
export function specialTokenFieldsInvalid(body: Record<string, unknown>): string | undefined {
  if (body.ignore_eos !== undefined && body.ignore_eos !== null && typeof body.ignore_eos !== "boolean") return "ignore_eos must be a boolean";
  if (body.min_tokens !== undefined && body.min_tokens !== null && !(Number.isSafeInteger(body.min_tokens) && (body.min_tokens as number) >= 0)) {
    return `min_tokens must be an integer of 0 or more (${JSON.stringify(body.min_tokens) ?? typeof body.min_tokens} given)`;
  }
  const bias = body.logit_bias;
  if (bias && typeof bias === "object" && !Array.isArray(bias)) {
    const bad = Object.entries(bias).find(([, v]) => typeof v !== "number" || !Number.isFinite(v));
    if (bad) return `logit_bias values must be numbers (logit_bias[${JSON.stringify(bad[0])}] is ${JSON.stringify(bad[1]) ?? typeof bad[1]})`;
  }
  return undefined;
}

/**
 * Whether a request can make the model generate special tokens on purpose (a
 * positive logit_bias, or ignore_eos, which lets it generate past its end of
 * sequence, or a positive min_tokens, which blocks its end of sequence and stop
 * tokens until that many tokens exist): the endpoint leaves special tokens out of the text by default, so
 * such tokens would be generated without being delivered or billed. The
 * gateway then asks for them to be delivered (skip_special_tokens false).
 * Only for a request specialTokenFieldsInvalid accepts.
 */
export function mayGenerateSpecialTokens(body: Record<string, unknown>): boolean {
  const bias = body.logit_bias;
  const boosted = !!bias && typeof bias === "object" && Object.values(bias).some((v) => typeof v === "number" && v > 0);
  return boosted || body.ignore_eos === true || (typeof body.min_tokens === "number" && body.min_tokens > 0);
}

/** Message content parts whose tokens are their text. */
const TEXT_PARTS = new Set(["text", "refusal"]);

/**
 * Why a chat request's prompt tokens cannot be bounded by its bytes, or
 * undefined when they can. A request's own chat_template may loop over the
 * messages (a short template, a prompt of any length), and an image, audio or
 * video part becomes as many tokens as its size and the model decide (a short
 * URL, or a small file of a large blank picture). Such a prompt would be
 * computed beyond what the renter is billed, and the provider's honest usage
 * recorded as overstated against it, so the gateway does not forward it.
 */
export function unboundedPrompt(body: Record<string, unknown>): string | undefined {
  if (body.chat_template !== undefined && body.chat_template !== null) {
    return "chat_template is not accepted: the prompt a request's own template renders cannot be bounded for billing; the model's template is used (chat_template_kwargs are accepted)";
  }
  const kwargs = body.chat_template_kwargs;
  if (kwargs !== undefined && kwargs !== null) {
    if (typeof kwargs !== "object" || Array.isArray(kwargs)) return "chat_template_kwargs must be an object";
    const overriding = Object.keys(kwargs).find(templateArgument);
    if (overriding !== undefined) {
      return `chat_template_kwargs.${overriding} is not accepted: it would replace a special token or an argument of the model's template, which may print it for every message, so the prompt could not be bounded for billing`;
    }
  }
  const messages = Array.isArray(body.messages) ? body.messages : [];
  const args = toolCallArgumentsInvalid(messages);
  if (args) return args;
  for (const [i, m] of messages.entries()) {
    const content = (m as { content?: unknown } | null)?.content;
    if (!Array.isArray(content)) continue;
    for (const part of content) {
      const type = (part as { type?: unknown } | null)?.type;
      if (!TEXT_PARTS.has(type as string)) {
        return `messages[${i}].content: a part of type ${JSON.stringify(type ?? null)} is not accepted: only text parts are, since the tokens of images, audio and video cannot be bounded for billing`;
      }
    }
  }
  return undefined;
}

/** Text of a completion the renter receives: bytes of its generated fields and the tool calls among them. */
export interface DeliveredText {
  bytes: number;
  toolCalls: number;
}

const GENERATED_TEXT = ["content", "reasoning_content", "reasoning", "refusal"] as const;

/**
 * Adds up the generated text of `choices` (their `message`, or a stream chunk's `delta`) into
 * `calls`, the tool calls named, each once by its choice and call index; returns the bytes.
 */
function walkDelivered(choices: unknown, part: "message" | "delta", calls: Set<string>): number {
  let bytes = 0;
  if (!Array.isArray(choices)) return bytes;
  for (const c of choices) {
    const m = (c as Record<string, unknown> | null)?.[part] as Record<string, unknown> | undefined;
    if (!m || typeof m !== "object") continue;
    // Choice and call indexes as the answer's assembly takes them (assemble.ts): a missing one is choice 0, the call's position.
    const index = (c as { index?: unknown }).index;
    const choice = Number.isSafeInteger(index) ? (index as number) : 0;
    for (const f of GENERATED_TEXT) if (typeof m[f] === "string") bytes += Buffer.byteLength(m[f] as string);
    const named = (key: string, fn: unknown) => {
      if (!fn || typeof fn !== "object") return;
      const { name, arguments: args } = fn as { name?: unknown; arguments?: unknown };
      if (typeof name === "string") {
        bytes += Buffer.byteLength(name);
        if (name) calls.add(`${choice}:${key}`);
      }
      if (typeof args === "string") bytes += Buffer.byteLength(args);
    };
    if (Array.isArray(m.tool_calls)) {
      for (const [pos, call] of m.tool_calls.entries()) {
        const i = (call as { index?: unknown } | null)?.index;
        named(String(Number.isSafeInteger(i) ? i : pos), (call as { function?: unknown } | null)?.function);
      }
    }
    named("function_call", m.function_call);
  }
  return bytes;
}

/**
 * The generated text in a response's `choices` (their `message`, or a stream
 * chunk's `delta`): content, reasoning and refusal text, tool and function
 * call names and arguments. A tool call is counted where its name is sent; a
 * stream's calls are counted by StreamedText, once per call.
 */
export function deliveredText(choices: unknown, part: "message" | "delta"): DeliveredText {
  const calls = new Set<string>();
  const bytes = walkDelivered(choices, part, calls);
  return { bytes, toolCalls: calls.size };
}

/**
 * The generated text of a stream, chunk by chunk (their `delta`s): a tool call is counted once, by its
 * choice and call index, however many of its deltas name it (an endpoint may repeat or split the name).
 */
export class StreamedText {
  private bytes = 0;
  private readonly calls = new Set<string>();

  add(choices: unknown): void {
    this.bytes += walkDelivered(choices, "delta", this.calls);
  }

  get delivered(): DeliveredText {
    return { bytes: this.bytes, toolCalls: this.calls.size };
  }
}

/**
 * The most completion tokens behind `delivered`: its bytes, plus per requested
 * choice COMPLETION_TOKENS_PER_CHOICE and the longest `stop` string (generated,
 * then cut from the text), plus COMPLETION_TOKENS_PER_TOOL_CALL per tool call.
 */
export function completionTokensBound(delivered: DeliveredText, choices: number, stop: unknown): number {
  const stops = typeof stop === "string" ? [stop] : Array.isArray(stop) ? stop.filter((s): s is string => typeof s === "string") : [];
  const longestStop = stops.reduce((n, s) => Math.max(n, Buffer.byteLength(s)), 0);
  return delivered.bytes + choices * (COMPLETION_TOKENS_PER_CHOICE + longestStop) + delivered.toolCalls * COMPLETION_TOKENS_PER_TOOL_CALL;
}

/** The tokens billed of those reported: each count capped at its bound. */
export function billableTokens(reported: TokenCounts, bound: TokenCounts): TokenCounts {
  return {
    promptTokens: Math.min(reported.promptTokens, bound.promptTokens),
    completionTokens: Math.min(reported.completionTokens, bound.completionTokens),
  };
}

/** The most completion tokens `availableHalala` pays for after the prompt (may be <= 0). */
export function affordableCompletionTokens(rate: TokenRate, availableHalala: number, promptTokens: number, choices = 1): number {
  if (rate.output === 0) return Number.MAX_SAFE_INTEGER;
  return Math.floor((availableHalala * PER - promptTokens * rate.input) / (rate.output * choices));
}
