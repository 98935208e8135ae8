// The prompt bound counts the JSON a chat template prints (tools, assistant tool call arguments,
// documents, chat_template_kwargs) as Python writes it, not as the renter sent it: vLLM json.loads
// each tool call's `arguments` and templates print with `tojson` (transformers: json.dumps with
// ensure_ascii=False, ", " and ": " separators, some with indent=4), which rewrites numbers
// (1e15 -> 1000000000000000.0); and Qwen2's pre-tokenizer makes every digit and every space after a
// comma a token of its own. Checked here against a reference of Python's json.dumps written in
// TypeScript (pinned to outputs of CPython 3.11), a rendering of Qwen2.5's template fragments with
// it, and Qwen2's pre-tokenizer (a token never spans two of its pieces, so their count is a floor on
// the prompt's tokens); then through the gateway, where the bound is what the renter is billed at most.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import {
  PROMPT_TOKENS_PER_MESSAGE,
  PROMPT_TOKENS_PER_REQUEST,
  PROMPT_TOKENS_PER_TOOL_CALL,
  promptTokensBound,
  pythonJsonBytes,
  pythonNumberBytes,
  stringBytes,
  unboundedPrompt,
} from "../../src/domain/money/token-pricing.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { OVERSTATED_TOKENS, startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel } from "./serving.js";

// ---- A reference of Python's json.loads + json.dumps(ensure_ascii=False, indent=...), on JSON text ----

type Py = { num: string } | { str: string } | { lit: string } | { arr: Py[] } | { obj: Map<string, Py> };

/** Python's repr of a float (the shortest digits that read back; fixed from 1e-4 to below 1e16, else an exponent of 2+ digits). */
function pyFloatRepr(x: number): string {
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x < 0 ? "-Infinity" : "Infinity";
  const sign = x < 0 || Object.is(x, -0) ? "-" : "";
  if (x === 0) return `${sign}0.0`;
  const [mantissa, e] = Math.abs(x).toExponential().split("e");
  const digits = mantissa.replace(".", "");
  const exp = Number(e);
  if (exp >= -4 && exp < 16) {
    if (exp >= digits.length - 1) return `${sign}${digits}${"0".repeat(exp - digits.length + 1)}.0`;
    if (exp >= 0) return `${sign}${digits.slice(0, exp + 1)}.${digits.slice(exp + 1)}`;
    return `${sign}0.${"0".repeat(-exp - 1)}${digits}`;
  }
  const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  return `${sign}${m}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
}

/** json.loads: numbers keep their source text (an int is Python's int, anything with . or e a float). */
function pyLoads(text: string): Py {
  let i = 0;
  const ws = () => {
    while (" \t\n\r".includes(text[i]) && i < text.length) i++;
  };
  const value = (): Py => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const obj = new Map<string, Py>();
      ws();
      if (text[i] === "}") return i++, { obj };
      for (;;) {
        ws();
        const key = (value() as { str: string }).str;
        ws();
        i++; // :
        obj.set(key, value()); // a repeated key keeps its first place and its last value, as a dict does
        ws();
        if (text[i++] === "}") return { obj };
      }
    }
    if (c === "[") {
      i++;
      const arr: Py[] = [];
      ws();
      if (text[i] === "]") return i++, { arr };
      for (;;) {
        arr.push(value());
        ws();
        if (text[i++] === "]") return { arr };
      }
    }
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      const str = JSON.parse(text.slice(i, j + 1)) as string;
      i = j + 1;
      return { str };
    }
    const m = /^(?:true|false|null|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)/.exec(text.slice(i, i + 1000))!;
    i += m[0].length;
    return /^[tfn]/.test(m[0]) ? { lit: m[0] } : { num: m[0] };
  };
  return value();
}

function pyString(s: string): string {
  let out = '"';
  for (const ch of s) {
    const code = ch.codePointAt(0)!;
    if (ch === '"') out += '\\"';
    else if (ch === "\\") out += "\\\\";
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (ch === "\b") out += "\\b";
    else if (ch === "\f") out += "\\f";
    else if (code < 0x20) out += `\\u${code.toString(16).padStart(4, "0")}`;
    else out += ch;
  }
  return out + '"';
}

/** json.dumps(value, ensure_ascii=False, indent=indent): ", " and ": " without an indent, "," and ": " with one. */
function pyDumps(v: Py, indent?: number, depth = 0): string {
  if ("num" in v) return /[.eE]/.test(v.num) ? pyFloatRepr(Number(v.num)) : BigInt(v.num).toString();
  if ("str" in v) return pyString(v.str);
  if ("lit" in v) return v.lit;
  const items = "arr" in v ? v.arr.map((x) => pyDumps(x, indent, depth + 1)) : [...v.obj].map(([k, x]) => `${pyString(k)}: ${pyDumps(x, indent, depth + 1)}`);
  const [open, close] = "arr" in v ? ["[", "]"] : ["{", "}"];
  if (items.length === 0) return open + close;
  if (indent === undefined) return open + items.join(", ") + close;
  const pad = (d: number) => "\n" + " ".repeat(indent * d);
  return open + pad(depth + 1) + items.join("," + pad(depth + 1)) + pad(depth) + close;
}

const tojson = (text: string, indent?: number) => pyDumps(pyLoads(text), indent);
const bytes = (s: string) => Buffer.byteLength(s);

// ---- Qwen2.5-7B-Instruct's template (tools header, user / assistant tool calls / tool turns) and Qwen2's pre-tokenizer ----

const QWEN_PRETOKEN = /'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;
const pretokens = (text: string) => text.match(QWEN_PRETOKEN)?.length ?? 0;

interface Msg {
  role: string;
  content?: string;
  tool_calls?: { id: string; type: string; function: { name: string; arguments: unknown } }[];
}

/** The prompt vLLM renders for `body` with Qwen2.5's template: tools as vLLM dumps them, tool call arguments json.loads'ed. */
function renderQwen(body: { messages: Msg[]; tools?: Record<string, unknown>[] }): string {
  let out = "";
  if (body.tools?.length) {
    out +=
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const t of body.tools) {
      const fn = t.function as Record<string, unknown>;
      out += "\n" + tojson(JSON.stringify({ type: "function", ...t, function: { ...fn, description: fn.description ?? null, parameters: fn.parameters ?? null } }));
    }
    out +=
      '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n';
  }
  for (const m of body.messages) {
    if (m.role === "user") out += `<|im_start|>user\n${m.content}<|im_end|>\n`;
    else if (m.role === "assistant") {
      out += "<|im_start|>assistant";
      for (const c of m.tool_calls ?? []) {
        // vLLM json.loads a string of arguments ("" is {}), and keeps an object as it is.
        const args = c.function.arguments;
        out += `\n<tool_call>\n{"name": "${c.function.name}", "arguments": ${tojson(typeof args === "string" ? args || "{}" : JSON.stringify(args))}}\n</tool_call>`;
      }
      out += "<|im_end|>\n";
    } else if (m.role === "tool") out += `<|im_start|>user\n<tool_response>\n${m.content}\n</tool_response><|im_end|>\n`;
  }
  return out + "<|im_start|>assistant\n";
}

const MODEL = "Qwen/Qwen2.5-7B-Instruct";

/** An assistant turn calling `f` with `args`, and the tool's answer. */
const withCall = (args: unknown, calls = 1) => ({
  model: MODEL,
  messages: [
    { role: "user", content: "go" },
    { role: "assistant", content: "", tool_calls: Array.from({ length: calls }, (_, k) => ({ id: `c${k}`, type: "function", function: { name: "f", arguments: args } })) },
    { role: "tool", tool_call_id: "c0", content: "ok" },
  ] as Msg[],
});
const ARGS_1E15 = JSON.stringify({ v: new Array(2000).fill(0) }).replace(/0/g, "1e15");
const withTools = (tools: Record<string, unknown>[]) => ({ model: MODEL, messages: [{ role: "user", content: "go" }] as Msg[], tools });
const ENUM_TOOL = { type: "function", function: { name: "f", parameters: { type: "object", properties: { v: { type: "integer", enum: new Array(5000).fill(0) } } } } };

describe("the reference", () => {
  it("writes what CPython's json.dumps writes", () => {
    const text = '{"v": [1e15, 1E16, 1e-5, 1e-7, 0.0001, 1e400, -1e400, -0.0, 0.1e1, 12345678901234567890, -0, 2.5, 1e21, 5e-324, "é\\u0001\\/\\ud83d\\ude00"], "o": {}, "a": [[]], "b": true, "n": null}';
    expect(tojson(text)).toBe(
      '{"v": [1000000000000000.0, 1e+16, 1e-05, 1e-07, 0.0001, Infinity, -Infinity, -0.0, 1.0, 12345678901234567890, 0, 2.5, 1e+21, 5e-324, "é\\u0001/😀"], "o": {}, "a": [[]], "b": true, "n": null}',
    );
    expect(tojson(text, 4)).toBe(
      '{\n    "v": [\n        1000000000000000.0,\n        1e+16,\n        1e-05,\n        1e-07,\n        0.0001,\n        Infinity,\n        -Infinity,\n        -0.0,\n        1.0,\n        12345678901234567890,\n        0,\n        2.5,\n        1e+21,\n        5e-324,\n        "é\\u0001/😀"\n    ],\n    "o": {},\n    "a": [\n        []\n    ],\n    "b": true,\n    "n": null\n}',
    );
  });

  it("renders and pre-tokenizes as measured with jinja2 and Qwen2's tokenizer.json pattern", () => {
    // Measured with the template fragments in jinja2 (transformers' tojson) and the `regex` module; the tool as
    // vLLM dumps it (its function's description null).
    const rendered = renderQwen(withCall(ARGS_1E15));
    expect({ bytes: bytes(rendered), pretokens: pretokens(rendered) }).toEqual({ bytes: 40208, pretokens: 40063 });
    const tools = renderQwen(withTools([ENUM_TOOL]));
    expect({ bytes: bytes(tools), pretokens: pretokens(tools) }).toEqual({ bytes: 15678, pretokens: 15169 });
  });
});

describe("pythonNumberBytes", () => {
  it.each([
    ["0", "0"],
    ["-0", "0"],
    ["12345678901234567890", "12345678901234567890"],
    ["1e15", "1000000000000000.0"],
    ["1E15", "1000000000000000.0"],
    ["9.999999999999998e15", "9999999999999998.0"],
    ["9.999999999999999e15", "1e+16"], // the nearest double is 1e16
    ["1e16", "1e+16"],
    ["1e-4", "0.0001"],
    ["1.25e-4", "0.000125"],
    ["1e-5", "1e-05"],
    ["1e-7", "1e-07"],
    ["-1.5e-300", "-1.5e-300"],
    ["1e400", "Infinity"],
    ["-1e400", "-Infinity"],
    ["1e-400", "0.0"],
    ["-0.0", "-0.0"],
    ["0.1e1", "1.0"],
    ["1e1", "10.0"],
    ["12.50", "12.5"],
    ["1.7976931348623157e308", "1.7976931348623157e+308"],
    ["5e-324", "5e-324"],
  ])("%s is written back as %s", (literal, python) => {
    expect(tojson(literal)).toBe(python);
    expect(pythonNumberBytes(literal)).toBe(python.length);
  });

  it("is exact for any number's source text", () => {
    let seed = 1;
    const rnd = () => (seed = (seed * 48271) % 2147483647) / 2147483647;
    for (let k = 0; k < 5000; k++) {
      const int = String(Math.floor(rnd() * 10 ** Math.floor(rnd() * 17)));
      const frac = rnd() < 0.5 ? `.${Math.floor(rnd() * 1e7)}` : "";
      const exp = rnd() < 0.7 ? `${rnd() < 0.5 ? "e" : "E"}${["", "+", "-"][Math.floor(rnd() * 3)]}${Math.floor(rnd() * 40)}` : "";
      const literal = `${rnd() < 0.3 ? "-" : ""}${int}${frac}${exp}`;
      expect(pythonNumberBytes(literal), literal).toBe(bytes(tojson(literal)));
    }
  });
});

describe("pythonJsonBytes", () => {
  const strings = ["", "a", "é", "😀", "\\u0001", "\\n", "\\/", "\\ud83d\\ude00", "\\\\", '\\"', "\u2028", "x y"];
  const numbers = ["0", "-0", "1e15", "1e-7", "1e400", "0.1", "123456789012345678901234567890", "2.5E+3", "-0.0"];
  let seed = 7;
  const rnd = () => (seed = (seed * 48271) % 2147483647) / 2147483647;
  const pick = <T>(a: T[]) => a[Math.floor(rnd() * a.length)];
  const space = () => pick(["", "", " ", "\n  "]);
  const value = (depth: number): string => {
    const r = rnd();
    if (depth > 6 || r < 0.35) return r < 0.2 ? pick(numbers) : r < 0.3 ? `"${pick(strings)}${pick(strings)}"` : pick(["true", "false", "null"]);
    const n = Math.floor(rnd() * 4);
    if (r < 0.65) return `[${space()}${Array.from({ length: n }, () => value(depth + 1)).join(`${space()},${space()}`)}]`;
    return `{${Array.from({ length: n }, (_, k) => `"${pick(strings)}${k % 2}"${space()}:${space()}${value(depth + 1)}`).join(",")}}`;
  };

  it("bounds json.dumps of any JSON text, with any indent up to 4 or none", () => {
    for (let k = 0; k < 2000; k++) {
      const text = value(0);
      JSON.parse(text); // only JSON is measured
      const bound = pythonJsonBytes(text);
      for (const indent of [undefined, 0, 1, 2, 4]) expect(bound, `${text} (indent ${indent})`).toBeGreaterThanOrEqual(bytes(tojson(text, indent)));
    }
  });

  it("is exactly json.dumps with indent 4 where nothing is shortened (no escapes, repeated keys or source whitespace)", () => {
    const text = '{"v":[1e15,1e-7,-0.0,12345678901234567890,"é"],"o":{},"a":[[]],"b":true,"n":null}';
    expect(pythonJsonBytes(text)).toBe(bytes(tojson(text, 4)));
  });

  it("measures a nesting deeper than any stack", () => {
    // Level L of D nested arrays writes "[", a newline and 4(L+1) spaces, its item, a newline and 4L spaces, "]".
    const nested = (d: number) => "[".repeat(d) + "1e15" + "]".repeat(d);
    const expected = (d: number) => "1000000000000000.0".length + 8 * d + 4 * d * (d - 1);
    for (const d of [1, 2, 5, 30]) expect(bytes(tojson(nested(d), 4))).toBe(expected(d));
    expect(pythonJsonBytes(nested(200_000))).toBe(expected(200_000));
  });
});

describe("promptTokensBound", () => {
  const cases: [string, ReturnType<typeof withCall> | ReturnType<typeof withTools>][] = [
    ["assistant tool call arguments of 2,000 numbers 1e15 (each 1000000000000000.0, 18 tokens, then ', ')", withCall(ARGS_1E15)],
    ["arguments of 2,000 numbers 1e-7 (each 1e-07)", withCall(ARGS_1E15.replace(/1e15/g, "1e-7"))],
    ["arguments sent as an object (vLLM keeps it) of 3,000 zeros", withCall({ v: new Array(3000).fill(0) })],
    ["arguments with whitespace and escapes", withCall('{ "a" : [ 1 , 2 , "\\u00e9" ] , "b" : { } }')],
    ["1,000 tool calls of {} (the markup around each call)", withCall("{}", 1000)],
    ["1,000 tool calls with empty arguments", withCall("", 1000)],
    ["a tool with an enum of 5,000 zeros (a digit and ', ' each)", withTools([ENUM_TOOL])],
    ["a tool with an enum of 3,000 numbers 1e-7 (written 1e-7 upstream, 1e-07 by Python)", withTools([{ ...ENUM_TOOL, function: { name: "g", parameters: { enum: new Array(3000).fill(1e-7) } } }])],
    ["500 tools without type, description or parameters (vLLM dumps them with their defaults)", withTools(new Array(500).fill({ function: { name: "f" } }))],
  ];

  it.each(cases)("bounds the tokens of the prompt Qwen2.5's template renders: %s", (_name, body) => {
    expect(unboundedPrompt(body)).toBeUndefined();
    const rendered = renderQwen(body);
    expect(promptTokensBound(body), `${bytes(rendered)} bytes rendered`).toBeGreaterThanOrEqual(pretokens(rendered));
  });

  it("counts tools and arguments as json.dumps writes them with indent 4 (Llama 3.1's tools), which bounds any smaller indent", () => {
    const tool = { type: "function", function: { name: "f", description: "d", parameters: { type: "object", properties: { v: { enum: [1e21, 0.5] } } } } };
    const messages = [{ role: "user", content: "go" }];
    const base = PROMPT_TOKENS_PER_REQUEST + PROMPT_TOKENS_PER_MESSAGE + "user".length + "go".length;
    expect(promptTokensBound({ messages, tools: [tool] })).toBe(base + bytes(tojson(JSON.stringify(tool), 4)));
    const call = { role: "assistant", content: "", tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: '{"v":[1e15,-0.0]}' } }] };
    expect(promptTokensBound({ messages: [...messages, call] })).toBe(
      base + PROMPT_TOKENS_PER_MESSAGE + "assistant".length + "c".length + "function".length + "f".length + PROMPT_TOKENS_PER_TOOL_CALL + bytes(tojson('{"v":[1e15,-0.0]}', 4)),
    );
    expect(tojson('{"v":[1e15,-0.0]}', 4)).toBe('{\n    "v": [\n        1000000000000000.0,\n        -0.0\n    ]\n}');
  });

  it.each([["{bad"], ["[NaN]"], ['{"v": Infinity}'], ["{'a': 1}"]])("refuses tool call arguments %s that are not JSON, naming the field", (args) => {
    expect(unboundedPrompt(withCall(args))).toBe("messages[1].tool_calls[0].function.arguments must be a JSON text: the model server parses it to render the prompt");
  });

  it("reads tool calls on assistant messages only, as vLLM does: another role's arguments are strings, counted as sent", () => {
    const body = withCall("{bad");
    const messages = body.messages as { role: string }[];
    const asUser = { ...body, messages: messages.map((m, i) => (i === 1 ? { ...m, role: "user" } : m)) };
    expect(unboundedPrompt(asUser)).toBeUndefined();
    const call = (messages[1] as unknown as { tool_calls: unknown[] }).tool_calls;
    // The same message without its tool calls, plus their strings' bytes: no markup, no re-serialization.
    const without = { ...asUser, messages: asUser.messages.map((m, i) => (i === 1 ? { ...m, tool_calls: undefined } : m)) };
    expect(promptTokensBound(asUser)).toBe(promptTokensBound(without) + stringBytes(call));
  });
});

describe("through the gateway", () => {
  const srv = useTestServer({ SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
  let over: FakeVllm;
  beforeAll(async () => {
    over = await startFakeVllm("over", "overstate"); // reports OVERSTATED_TOKENS: the renter is billed the bound
    await serveModel(srv, MODEL, over.url);
  });
  afterAll(async () => {
    expect(await ledgerProblems(srv.sql)).toEqual([]);
    await over?.close();
  });

  it("bills a prompt of tool call arguments 1e15 up to at least its tokens (not its bytes as sent)", async () => {
    const renter = await makeRenter(srv, 1_000_000);
    const body = { ...withCall(ARGS_1E15), max_tokens: 8 };
    const r = await client(srv.url).post("/v1/chat/completions", body, { authorization: `Bearer ${renter.key}` });
    expect(r.status, r.text).toBe(200);
    const [row] = await srv.sql<{ state: string; prompt_tokens: number; reported_prompt_tokens: number }[]>`
      SELECT state, prompt_tokens, reported_prompt_tokens FROM v1_usage WHERE request_id = ${r.headers.get("x-request-id")!}`;
    expect(row).toMatchObject({ state: "settled", prompt_tokens: promptTokensBound(body), reported_prompt_tokens: OVERSTATED_TOKENS });
    // At least the pre-tokens of the prompt Qwen2.5's template renders (40,063), far above the 10,129 the bytes sent came to.
    expect(row.prompt_tokens).toBeGreaterThanOrEqual(pretokens(renderQwen(body)));
  });

  it("refuses tool call arguments that are not JSON (400 naming the field), reserving and forwarding nothing", async () => {
    const renter = await makeRenter(srv, 1_000_000);
    const before = over.requests.length;
    const r = await client(srv.url).post("/v1/chat/completions", withCall("[NaN, Infinity]"), { authorization: `Bearer ${renter.key}` });
    expect(r.status).toBe(400);
    expect(r.body.error).toMatchObject({ code: "invalid_request", message: expect.stringContaining("messages[1].tool_calls[0].function.arguments must be a JSON text") });
    expect(await srv.sql`SELECT 1 FROM v1_usage WHERE renter_id = ${renter.id}`).toHaveLength(0);
    expect(over.requests.length).toBe(before);
  });
});
