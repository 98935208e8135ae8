// Patches the ES module builds of @connectrpc/connect and @connectrpc/connect-node
// 2.1.x (run by `npm install`/`npm ci`: package.json postinstall).
//
// Connect's packages are compiled for ES2017, so every async generator of its
// pipeline (a stream's parsing, serialisation, envelope framing, the request
// body's reader, the handler's invocation: about a dozen per open stream) is
// emulated by TypeScript's __asyncGenerator helper: a sync generator driven by
// promises, with a queue array and nine closures per generator, and a promise,
// an array and several closure calls per step. Node has had native async
// generators since version 10. On a daemon stream the emulation was the top of
// the server's CPU profile after the garbage collector (resume, fulfill,
// settle) and most of the memory each open stream holds.
//
// The patch turns each emulated generator back into the native form it was
// compiled from; the semantics are the language's own:
//   function g(params) { return __asyncGenerator(this, arguments, function* f() { BODY }); }
//                                   -> async function* g(params) { BODY }
//   (any other use)                 -> (async function* f() { BODY }).apply(this, arguments)
//   yield __await(x)               -> await (x)       (the helper's marker for `await`)
//   yield yield __await(x)         -> yield (x)       (a native `yield` awaits its operand)
//   __asyncDelegator(__asyncValues(x)) -> ((x))       (`yield*` of an async iterable)
// The helpers' definitions stay (for-await loops still call __asyncValues).
//
// Second, two functions of its protocol code (`untilFirst`, which every unary
// call's answer goes through, and `normalizeIterable`) assign arrow functions
// straight to properties of the iterator they return. V8 allocates such a
// function in the old generation, where only a full collection frees it, and
// whatever its scope reaches (the call's whole output pipeline) survives every
// young collection until then (test/foundation/young-closures.test.ts). The
// patch assigns the same functions from locals, which V8 allocates young.
//
// Third, a request whose binary message does not decode is answered
// invalid_argument, not internal (REQUEST below).
//
// Checked: a version outside 2.1.x, or code that does not have the expected
// shape (the counts of each form, every generator closed, no marker left),
// stops the install with a message instead of patching blindly.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";

const MARK = "svc patch: native async generators";
const require = createRequire(import.meta.url);

/** The package's folder: up from its entry point ("exports" hides its package.json). */
function rootOf(name) {
  let dir = path.dirname(require.resolve(name));
  const nameAt = (d) => (fs.existsSync(path.join(d, "package.json")) ? JSON.parse(fs.readFileSync(path.join(d, "package.json"), "utf8")).name : undefined);
  while (nameAt(dir) !== name && path.dirname(dir) !== dir) dir = path.dirname(dir);
  return dir;
}

function fail(message) {
  console.error(`bin/patch-connect.mjs: ${message}`);
  process.exit(1);
}

const OPEN = /__asyncGenerator\(this, arguments, function\* ([A-Za-z0-9_$]*)\(\) \{/g;

/**
 * The index just past the `}` closing the block whose `{` is at text[start - 1]:
 * a scan that skips strings, template literals and comments (Connect's output
 * has no regular-expression literal with a brace in it; the result is parsed
 * before it is written, so a miscount cannot go unnoticed).
 */
function blockEnd(text, start) {
  const stack = ["{"];
  for (let i = start; i < text.length; i++) {
    const c = text[i];
    const top = stack[stack.length - 1];
    if (top === "`") {
      if (c === "\\") i++;
      else if (c === "`") stack.pop();
      else if (c === "$" && text[i + 1] === "{") (stack.push("${"), i++);
      continue;
    }
    if (c === "'" || c === '"') {
      for (i++; text[i] !== c; i++) if (text[i] === "\\") i++;
    } else if (c === "/" && text[i + 1] === "/") {
      i = text.indexOf("\n", i);
    } else if (c === "/" && text[i + 1] === "*") {
      i = text.indexOf("*/", i) + 1;
    } else if (c === "`") {
      stack.push("`");
    } else if (c === "{") {
      stack.push("{");
    } else if (c === "}") {
      stack.pop();
      if (stack.length === 0) return i + 1;
    }
  }
  return -1;
}

/**
 * The function that wraps the generator at `open`, when its whole body is
 * `return __asyncGenerator(...);` and its header is `function name?(params)`
 * with plain parameters: where that header starts and where the function ends.
 */
function wrapperAround(text, open, generatorEnd) {
  const head = /function(\s+[A-Za-z0-9_$]+)?\s*\(([^()]*)\)\s*\{\s*return\s+$/.exec(text.slice(Math.max(0, open - 300), open));
  const tail = /^\s*;\s*\}/.exec(text.slice(generatorEnd + 1));
  if (!head || !tail) return undefined;
  return { start: open - head[0].length, end: generatorEnd + 1 + tail[0].length, name: head[1] ?? "", params: head[2] };
}

/** The file with every emulated async generator made native; throws when the shape is not the expected one. */
export function nativeAsyncGenerators(text) {
  let out = "";
  let at = 0;
  let generators = 0;
  for (const m of text.matchAll(OPEN)) {
    if (m.index < at) continue; // nested: handled with its enclosing generator's body below
    const bodyStart = m.index + m[0].length;
    const end = blockEnd(text, bodyStart);
    if (end < 0 || text.slice(end, end + 1) !== ")") throw new Error(`the generator at offset ${m.index} does not close as expected`);
    const inner = nativeAsyncGenerators(text.slice(bodyStart, end - 1));
    generators += 1 + inner.generators;
    // The wrapper becomes the generator itself, as it was written: one function made once, not
    // a new generator function (with its own prototype and object shape) made at every call.
    const wrapper = wrapperAround(text, m.index, end);
    if (wrapper && wrapper.start >= at) {
      out += text.slice(at, wrapper.start) + `async function*${wrapper.name}(${wrapper.params}) {` + inner.text + "}";
      at = wrapper.end;
    } else {
      out += text.slice(at, m.index) + `(async function* ${m[1]}() {` + inner.text + "}).apply(this, arguments)";
      at = end + 1;
    }
  }
  out += text.slice(at);
  out = out.replaceAll("yield __await(", "await (").replaceAll("__asyncDelegator(__asyncValues(", "((");
  // A native async generator's `yield` awaits its operand itself: the explicit await is one more turn.
  out = out.replaceAll("yield await (", "yield (");
  return { text: out, generators };
}

/** Patches one file in place; answers how many generators it converted (0: already patched or none). */
function patchFile(file) {
  const text = fs.readFileSync(file, "utf8");
  if (text.includes(MARK) || !text.includes("__asyncGenerator(this, arguments")) return 0;
  const expected = text.split("__asyncGenerator(this, arguments, function*").length - 1;
  let result;
  try {
    result = nativeAsyncGenerators(text);
  } catch (err) {
    fail(`${file}: ${err.message}`);
  }
  if (result.generators !== expected) fail(`${file}: converted ${result.generators} of ${expected} generators`);
  for (const left of ["__asyncGenerator(this", "yield __await(", "__asyncDelegator(__asyncValues("]) {
    if (result.text.includes(left)) fail(`${file}: "${left}" is left after the patch`);
  }
  const patched = `// ${MARK} (bin/patch-connect.mjs)\n${result.text}`;
  // It must still parse as a module: checked by Node's own parser before it replaces the file.
  const probe = path.join(os.tmpdir(), `patch-connect-${process.pid}.mjs`);
  fs.writeFileSync(probe, patched);
  const check = spawnSync(process.execPath, ["--check", probe], { encoding: "utf8" });
  fs.rmSync(probe, { force: true });
  if (check.status !== 0) fail(`${file}: the patched file does not parse: ${check.stderr.trim().split("\n").slice(0, 5).join(" ")}`);
  fs.writeFileSync(file, patched);
  return result.generators;
}

const YOUNG_MARK = "svc patch: closures allocated young";
/** Per file: each replacement must match exactly once. */
const YOUNG = {
  "protocol/async-iterable.js": [
    [
      "            if (it.throw !== undefined) {\n                w.throw = (e) => it.throw(e);\n            }\n            if (it.return !== undefined) {\n                w.return = (value) => it.return(value);\n            }\n",
      `            // ${YOUNG_MARK}: a function literal written straight into a property is allocated old\n            const passThrow = (e) => it.throw(e), passReturn = (value) => it.return(value);\n            if (it.throw !== undefined) {\n                w.throw = passThrow;\n            }\n            if (it.return !== undefined) {\n                w.return = passReturn;\n            }\n`,
    ],
  ],
  "protocol/normalize.js": [
    [
      "            if (it.throw !== undefined) {\n                res.throw = (e) => it.throw(e).then(transform);\n            }\n            if (it.return !== undefined) {\n                res.return = (v) => it.return(v).then(transform);\n            }\n",
      `            // ${YOUNG_MARK}: a function literal written straight into a property is allocated old\n            const passThrow = (e) => it.throw(e).then(transform), passReturn = (v) => it.return(v).then(transform);\n            if (it.throw !== undefined) {\n                res.throw = passThrow;\n            }\n            if (it.return !== undefined) {\n                res.return = passReturn;\n            }\n`,
    ],
  ],
};

const REQUEST_MARK = "svc patch: an undecodable request is invalid_argument";
/**
 * Third: a request message whose binary encoding does not decode (a truncated field, an invalid
 * varint, a string that is not UTF-8) is the caller's error: invalid_argument (400), as an unreadable
 * JSON request already is, rather than internal (500). Only the server's reading of requests changes;
 * a client reading an answer it cannot decode still reports internal.
 */
const REQUEST = {
  "protocol/serialization.js": [
    [
      "    const inputBinary = limitSerialization(createBinarySerialization(method.input, binaryOptions), limitOptions);\n",
      `    // ${REQUEST_MARK}\n    const inputBinary = limitSerialization(createBinarySerialization(method.input, binaryOptions, true), limitOptions);\n`,
    ],
    [
      "export function createBinarySerialization(desc, options) {\n",
      "export function createBinarySerialization(desc, options, request = false) {\n",
    ],
    [
      "                throw new ConnectError(`parse binary: ${m}`, Code.Internal);\n",
      "                throw new ConnectError(`parse binary: ${m}`, request ? Code.InvalidArgument : Code.Internal);\n",
    ],
  ],
};

/** Applies `replacements` once to `file` (one carrying `mark` is done); each must match exactly once. */
function replaceExactly(file, replacements, mark) {
  let text = fs.readFileSync(file, "utf8");
  if (text.includes(mark)) return;
  for (const [from, to] of replacements) {
    const count = text.split(from).length - 1;
    if (count !== 1) fail(`${file}: expected 1 occurrence of ${JSON.stringify(from.trim().split("\n")[0])}, found ${count}`);
    text = text.replace(from, () => to);
  }
  fs.writeFileSync(file, text);
}

function walk(dir) {
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? walk(path.join(dir, e.name)) : e.name.endsWith(".js") ? [path.join(dir, e.name)] : []));
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname)) {
  for (const name of ["@connectrpc/connect", "@connectrpc/connect-node"]) {
    const root = rootOf(name);
    const version = JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8")).version;
    if (!/^2\.1\./.test(version)) fail(`${name} ${version} installed, the patch is for 2.1.x; check its build target and update or remove this patch`);
    for (const file of walk(path.join(root, "dist", "esm"))) patchFile(file);
    if (name !== "@connectrpc/connect") continue;
    for (const [rel, replacements] of Object.entries(YOUNG)) replaceExactly(path.join(root, "dist", "esm", rel), replacements, YOUNG_MARK);
    for (const [rel, replacements] of Object.entries(REQUEST)) replaceExactly(path.join(root, "dist", "esm", rel), replacements, REQUEST_MARK);
  }
}
