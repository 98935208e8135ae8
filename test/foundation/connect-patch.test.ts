// bin/patch-connect.mjs: Connect's ES2017 output made into native async
// generators. The transform is checked on TypeScript's own ES2017 output of
// generators that use every form it rewrites: both builds must behave alike
// when driven the same ways (to the end, stopped early, thrown into). The
// installed packages must carry the patch.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import ts from "typescript";
import { describe, expect, it } from "vitest";
// @ts-expect-error: a plain .mjs script without types
import { nativeAsyncGenerators } from "../../bin/patch-connect.mjs";

const SOURCE = `
export const log = [];
const tick = (v) => new Promise((r) => setTimeout(() => r(v), 1));
export async function* numbers(n) {
  try {
    for (let i = 0; i < n; i++) yield await tick(i);
    return "end";
  } finally {
    log.push("numbers:finally");
  }
}
export async function* doubled(source) {
  for await (const v of source) yield v * 2;
}
export async function* chained(n) {
  const r = yield* numbers(n);
  log.push("chained:" + r);
  yield tick("last");
}
export async function* caught() {
  try {
    yield 1;
    yield 2;
  } catch (e) {
    yield "caught:" + e.message;
  }
}
export class Box {
  constructor(items) { this.items = items; }
  async *[Symbol.asyncIterator]() {
    const inner = async function* (xs) { for (const x of xs) yield await tick(x); };
    yield* inner(this.items);
    yield arguments.length;
  }
}
`;

async function load(code: string, tag: string): Promise<Record<string, any>> {
  const file = path.join(os.tmpdir(), `connect-patch-${process.pid}-${tag}.mjs`);
  fs.writeFileSync(file, code);
  try {
    return await import(pathToFileURL(file).href);
  } finally {
    fs.rmSync(file, { force: true });
  }
}

async function collect(it: AsyncIterable<unknown>, limit = Infinity): Promise<unknown[]> {
  const out: unknown[] = [];
  for await (const v of it) {
    out.push(v);
    if (out.length >= limit) break;
  }
  return out;
}

/** Everything observable from one build, driven in each way. */
async function behaviour(m: Record<string, any>): Promise<unknown> {
  m.log.length = 0;
  const full = await collect(m.numbers(3));
  const early = await collect(m.numbers(5), 2);
  const mapped = await collect(m.doubled(m.numbers(3)));
  const chained = await collect(m.chained(2));
  const c = m.caught();
  const thrown = [await c.next(), await c.throw(new Error("boom")), await c.next()];
  const boxed = await collect(new m.Box(["a", "b"]));
  const it = m.numbers(4);
  const returned = [await it.next(), await it.return("stop"), await it.next()];
  return { full, early, mapped, chained, thrown, boxed, returned, log: [...m.log] };
}

describe("native async generators in Connect's build", () => {
  const es2017 = ts.transpileModule(SOURCE, { compilerOptions: { target: ts.ScriptTarget.ES2017, module: ts.ModuleKind.ES2020 } }).outputText;

  it("rewrites TypeScript's emulation into native generators that behave the same", async () => {
    expect(es2017).toContain("__asyncGenerator(this, arguments, function*");
    expect(es2017).toContain("__asyncDelegator(__asyncValues(");
    const { text, generators } = nativeAsyncGenerators(es2017);
    expect(generators).toBe(es2017.split("__asyncGenerator(this, arguments, function*").length - 1);
    expect(text).not.toContain("__asyncGenerator(this");
    expect(text).not.toContain("yield __await(");
    expect(text).toContain("async function*");

    const emulated = await behaviour(await load(es2017, "emulated"));
    const native = await behaviour(await load(text, "native"));
    expect(native).toEqual(emulated);
    expect(native).toMatchObject({
      full: [0, 1, 2],
      early: [0, 1],
      mapped: [0, 2, 4],
      chained: [0, 1, "last"],
      boxed: ["a", "b", 0],
    });
    expect((native as { log: string[] }).log).toContain("chained:end");
  });

  it("is applied to the installed @connectrpc/connect and @connectrpc/connect-node", () => {
    let patched = 0;
    for (const pkg of ["connect", "connect-node"]) {
      const dir = path.join(process.cwd(), "node_modules", "@connectrpc", pkg, "dist", "esm");
      const walk = (d: string): string[] =>
        fs.readdirSync(d, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? walk(path.join(d, e.name)) : e.name.endsWith(".js") ? [path.join(d, e.name)] : []));
      for (const file of walk(dir)) {
        const text = fs.readFileSync(file, "utf8");
        expect(text, file).not.toContain("__asyncGenerator(this, arguments");
        if (text.includes("svc patch: native async generators")) patched++;
      }
    }
    expect(patched).toBeGreaterThanOrEqual(7);
  });
});
