// Async iterators that pass another's items through by hand. An async
// generator that re-yields an iterable (`yield* inner`) costs several promises
// and microtask turns per item, and a daemon stream's every answer passes
// through a few such layers (interceptors, the key's revocation watch); these
// forward each step with one `then`.

export interface Observer {
  /** Called once, when the iteration ends: with the error it ended with, or undefined (finished, or stopped by its consumer). */
  onEnd?(err: unknown): void;
  /** Replaces an error of the source before its consumer sees it. */
  mapError?(err: unknown): unknown;
}

const DONE: IteratorReturnResult<undefined> = Object.freeze({ done: true, value: undefined });

/** `source`'s items, telling `o` how the iteration ended (as a generator's finally would), errors mapped by it. */
export function observed<T>(source: AsyncIterable<T>, o: Observer): AsyncIterableIterator<T> {
  let it: AsyncIterator<T> | undefined;
  const inner = () => (it ??= source[Symbol.asyncIterator]());
  let ended = false;
  const end = (err: unknown) => {
    if (ended) return;
    ended = true;
    o.onEnd?.(err);
  };
  const step = (p: Promise<IteratorResult<T>>) =>
    p.then(
      (r) => {
        if (r.done) end(undefined);
        return r;
      },
      (err: unknown) => {
        end(err);
        throw o.mapError ? o.mapError(err) : err;
      },
    );
  const self: AsyncIterableIterator<T> = {
    next: () => (ended ? Promise.resolve(DONE) : step(inner().next())),
    return(value?: unknown) {
      const ret = inner().return;
      if (ended || !ret) {
        end(undefined);
        return Promise.resolve({ done: true, value } as IteratorReturnResult<T>);
      }
      return step(ret.call(it, value as T));
    },
    throw(err?: unknown) {
      const i = inner();
      if (ended) return Promise.reject(err);
      if (!i.throw) {
        void i.return?.()?.catch(() => {});
        end(err);
        return Promise.reject(o.mapError ? o.mapError(err) : err);
      }
      return step(i.throw(err));
    },
    [Symbol.asyncIterator]: () => self,
  };
  return self;
}

/**
 * `it`'s items until `stop` rejects: then the step waiting (or the next one) rejects with its reason
 * and the iteration is over. `onEnd` runs once when it is over, however it ended; `it` is then
 * returned. One reaction on `stop` for the whole iteration: a race per step would add one each time,
 * and every item raced would stay reachable from `stop` until it settled.
 */
export function untilRejected<T>(it: AsyncIterator<T>, stop: Promise<never>, onEnd: () => void): AsyncIterableIterator<T> {
  let reason: unknown;
  let stopped = false;
  let over = false;
  let waiting: ((err: unknown) => void) | undefined;
  const finish = () => {
    if (over) return;
    over = true;
    onEnd();
    void it.return?.()?.catch(() => {});
  };
  stop.catch((err: unknown) => {
    reason = err;
    stopped = true;
    const reject = waiting;
    waiting = undefined;
    reject?.(err);
  });
  const self: AsyncIterableIterator<T> = {
    next() {
      if (over) return Promise.resolve(DONE);
      if (stopped) {
        finish();
        return Promise.reject(reason);
      }
      return new Promise<IteratorResult<T>>((resolve, reject) => {
        waiting = (err) => {
          finish();
          reject(err);
        };
        it.next().then(
          (r) => {
            waiting = undefined;
            if (r.done) finish();
            resolve(r);
          },
          (err: unknown) => {
            waiting = undefined;
            finish();
            reject(err);
          },
        );
      });
    },
    return(value?: unknown) {
      finish();
      return Promise.resolve({ done: true, value } as IteratorReturnResult<T>);
    },
    throw(err?: unknown) {
      finish();
      return Promise.reject(err);
    },
    [Symbol.asyncIterator]: () => self,
  };
  return self;
}

/**
 * An iterator that calls `start` on its first step and then is the iterator `start` gave: what an
 * async generator whose body sets up and then `yield*`s another iterable does, without the generator
 * between each item. A return() or throw() before the first step ends it without calling `start`.
 */
export function deferred<T>(start: () => Promise<AsyncIterator<T>>): AsyncIterableIterator<T> {
  let started: Promise<AsyncIterator<T>> | undefined;
  let it: AsyncIterator<T> | undefined;
  let over = false;
  const begin = () =>
    (started ??= start().then(
      (i) => (it = i),
      (err: unknown) => {
        over = true;
        throw err;
      },
    ));
  const self: AsyncIterableIterator<T> = {
    next() {
      if (it) return it.next();
      if (over) return Promise.resolve(DONE);
      return begin().then((i) => i.next());
    },
    return(value?: unknown) {
      const done = { done: true, value } as IteratorReturnResult<T>;
      if (it) return it.return ? it.return(value as T) : Promise.resolve(done);
      over = true;
      if (!started) return Promise.resolve(done);
      return started.then((i) => (i.return ? i.return(value as T) : done), () => done);
    },
    throw(err?: unknown) {
      if (it) {
        if (it.throw) return it.throw(err);
        void it.return?.()?.catch(() => {});
        return Promise.reject(err);
      }
      over = true;
      if (started) void started.then((i) => i.return?.()?.catch(() => {}), () => {});
      return Promise.reject(err);
    },
    [Symbol.asyncIterator]: () => self,
  };
  return self;
}
