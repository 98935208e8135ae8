// The pool's queues of postgres.js as bin/patch-postgres.mjs leaves them: a
// queue that never empties (a pool under steady load) must keep first-in,
// first-out order and remove() across the points where its holes are dropped.
import { createRequire } from "node:module";
import path from "node:path";
import { describe, expect, it } from "vitest";

// The package's folder: its "exports" hides the queue module from a bare import.
let root = path.dirname(createRequire(import.meta.url).resolve("postgres"));
while (path.basename(root) !== "postgres") root = path.dirname(root);
type Q = { length: number; push(x: unknown): unknown; shift(): unknown; remove(x: unknown): unknown };
const load = async (): Promise<(initial?: unknown[]) => Q> => (await import(path.join(root, "src", "queue.js"))).default;

describe("postgres.js pool queue (patched)", () => {
  it("carries the patch", async () => {
    const fs = await import("node:fs");
    for (const f of ["src/queue.js", "cjs/src/queue.js", "cf/src/queue.js"]) {
      expect(fs.readFileSync(path.join(root, f), "utf8")).toContain("svc patch: the queue's holes");
    }
  });

  it("keeps order and removes the right element while it never empties", async () => {
    const Queue = await load();
    const q = Queue();
    const model: number[] = [];
    let next = 0;
    // Two connections always queued, one in and one out per step, and now and then one taken from the middle.
    for (let i = 0; i < 2; i++) model.push(q.push(next++) as number);
    for (let step = 0; step < 50_000; step++) {
      model.push(q.push(next++) as number);
      expect(q.shift()).toBe(model.shift());
      if (step % 97 === 0) {
        const victim = model[1];
        expect(q.remove(victim)).toBe(victim);
        model.splice(1, 1);
        model.push(q.push(next++) as number);
      }
      expect(q.remove(-1)).toBeNull();
      expect(q.length).toBe(model.length);
    }
    while (model.length) expect(q.shift()).toBe(model.shift());
    expect(q.length).toBe(0);
  });
});
