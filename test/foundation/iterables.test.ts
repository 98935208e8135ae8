// The hand-written iterators a daemon stream's answers pass through (src/shared/iterables.ts):
// what each does when its source ends, fails, or is stopped by its consumer, and that an open
// stream does not keep the answers it has already passed on.
import v8 from "node:v8";
import vm from "node:vm";
import { describe, expect, it } from "vitest";
import { deferred, observed, untilRejected } from "../../src/shared/iterables.js";
import { AsyncQueue } from "../../src/daemon/async-queue.js";

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;

/** Collects from a timer's callback: a WeakRef keeps its target until the task that made or read it is over. */
const collectedLater = (ref: WeakRef<object>) =>
  new Promise<boolean>((resolve) =>
    setTimeout(() => {
      gc();
      resolve(ref.deref() === undefined);
    }, 5),
  );

async function* items<T>(list: T[], fail?: Error) {
  for (const x of list) yield x;
  if (fail) throw fail;
}

async function drain<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

describe("untilRejected", () => {
  it("does not keep the items it passed on while its stop promise is pending", async () => {
    const queue = new AsyncQueue<object>();
    const stop = new Promise<never>(() => {});
    const it = untilRejected(queue[Symbol.asyncIterator](), stop, () => {});
    const passed = async (): Promise<WeakRef<object>> => {
      const item = { answer: new Array(10_000).fill(1) };
      queue.push(item);
      const r = await it.next();
      expect(r.value).toBe(item);
      return new WeakRef(item);
    };
    const ref = await passed();
    // The stream stays open: the next step waits.
    const waiting = it.next();
    expect(await collectedLater(ref)).toBe(true);
    queue.close();
    expect((await waiting).done).toBe(true);
  });

  it("rejects the waiting step with the stop's reason, then is over, returning its source once", async () => {
    let stopWith!: (err: Error) => void;
    const stop = new Promise<never>((_, reject) => (stopWith = reject));
    let returned = 0;
    let ended = 0;
    const source: AsyncIterator<number> = {
      next: () => new Promise(() => {}), // never answers: only the stop can end the step
      return: async () => {
        returned++;
        return { done: true, value: undefined };
      },
    };
    const it = untilRejected(source, stop, () => ended++);
    const step = it.next();
    stopWith(new Error("key revoked"));
    await expect(step).rejects.toThrow("key revoked");
    expect((await it.next()).done).toBe(true);
    expect(ended).toBe(1);
    expect(returned).toBe(1);
  });

  it("refuses the first step once stopped before it, and ends once when its source finishes", async () => {
    const stopped = Promise.reject(new Error("revoked before"));
    let ended = 0;
    const it = untilRejected(items([1]), stopped, () => ended++);
    await new Promise((r) => setTimeout(r, 0));
    await expect(it.next()).rejects.toThrow("revoked before");
    expect(ended).toBe(1);

    let ended2 = 0;
    expect(await drain(untilRejected(items([1, 2, 3]), new Promise<never>(() => {}), () => ended2++))).toEqual([1, 2, 3]);
    expect(ended2).toBe(1);
  });
});

describe("observed", () => {
  it("tells how the iteration ended, once: finished, failed (mapped), or stopped by its consumer", async () => {
    const ends: unknown[] = [];
    expect(await drain(observed(items([1, 2]), { onEnd: (e) => ends.push(e) }))).toEqual([1, 2]);
    expect(ends).toEqual([undefined]);

    const failed: unknown[] = [];
    const mapped = observed(items([1], new Error("boom")), { onEnd: (e) => failed.push((e as Error).message), mapError: (e) => new Error(`mapped ${(e as Error).message}`) });
    await expect(drain(mapped)).rejects.toThrow("mapped boom");
    expect(failed).toEqual(["boom"]);
    expect((await mapped.next()).done).toBe(true);

    const stopped: unknown[] = [];
    const early = observed(items([1, 2, 3]), { onEnd: (e) => stopped.push(e) });
    for await (const x of early) if (x === 1) break;
    expect(stopped).toEqual([undefined]);
  });

  it("passes a consumer's throw to its source, and the error that comes back through mapError", async () => {
    let seen: unknown;
    async function* source() {
      try {
        yield 1;
        yield 2;
      } catch (err) {
        seen = err;
        throw err;
      }
    }
    const ends: string[] = [];
    const it = observed(source(), { onEnd: (e) => ends.push((e as Error).message), mapError: (e) => new Error(`logged: ${(e as Error).message}`) });
    await it.next();
    await expect(it.throw!(new Error("stream closed"))).rejects.toThrow("logged: stream closed");
    expect((seen as Error).message).toBe("stream closed");
    expect(ends).toEqual(["stream closed"]);
  });
});

describe("deferred", () => {
  it("starts on the first step, and a return before it ends the iteration without starting", async () => {
    let starts = 0;
    const it = deferred(async () => {
      starts++;
      return items(["a", "b"]);
    });
    expect(starts).toBe(0);
    expect(await drain(it)).toEqual(["a", "b"]);
    expect(starts).toBe(1);

    const never = deferred(async () => {
      starts++;
      return items(["x"]);
    });
    expect((await never.return!()).done).toBe(true);
    expect((await never.next()).done).toBe(true);
    expect(starts).toBe(1);
  });

  it("fails its first step when starting fails, and is over after", async () => {
    const it = deferred<number>(async () => {
      throw new Error("hello missing");
    });
    await expect(it.next()).rejects.toThrow("hello missing");
    expect((await it.next()).done).toBe(true);
  });
});

describe("AsyncQueue", () => {
  for (const how of ["return", "throw"] as const) {
    it(`once its consumer stopped (${how}), lets go of what is queued, refuses pushes and frees producers waiting for room`, async () => {
      const queue = new AsyncQueue<object>(2);
      const it = queue[Symbol.asyncIterator]();
      const kept = (): WeakRef<object> => {
        const item = { answer: new Array(10_000).fill(1) };
        queue.push(item);
        return new WeakRef(item);
      };
      const ref = kept();
      queue.push({});
      const producer = queue.room(); // full: waits for the consumer
      if (how === "return") await it.return!();
      else await it.throw!(new Error("consumer failed")).catch(() => {});
      await producer; // freed, or this test times out
      expect(queue.isClosed).toBe(true);
      expect(queue.size).toBe(0);
      expect(queue.push({})).toBe(false);
      expect(await collectedLater(ref)).toBe(true);
      expect((await it.next()).done).toBe(true);
    });
  }
});
