// A small async queue: producers push, one consumer iterates until the queue
// is closed (then the remaining items are still delivered, and then the
// failure it was closed with, if any). Used for the
// outgoing side of bidirectional streams, on the server and in the TypeScript
// daemon. A push always succeeds; a producer that can wait (one that reads
// what it answers from the other side) awaits room() first, so that a
// consumer that stops taking items holds back that producer instead of
// letting the queue grow.
export class AsyncQueue<T> implements AsyncIterable<T> {
  private items: T[] = [];
  private waiter: (() => void) | undefined;
  private roomWaiters: (() => void)[] = [];
  private closed = false;
  private failure: { err: unknown } | undefined;

  /** `highWater`: room() waits while this many items are queued (unbounded when not given). */
  constructor(private readonly highWater = Infinity) {}

  push(item: T): boolean {
    if (this.closed) return false;
    this.items.push(item);
    this.wake();
    return true;
  }

  /** No more items; `failure`: the consumer's last step rejects with it, once the items left are taken. */
  close(failure?: { err: unknown }): void {
    if (!this.closed) this.failure = failure;
    this.closed = true;
    this.wake();
    this.freeRoom();
  }

  get isClosed(): boolean {
    return this.closed;
  }

  get size(): number {
    return this.items.length;
  }

  /** Whether room() would resolve at once. */
  get hasRoom(): boolean {
    return this.closed || this.items.length < this.highWater;
  }

  /**
   * Resolves at once while fewer than highWater items are queued; else once the consumer has
   * taken the queue down to half of it, or the queue is closed.
   */
  room(): Promise<void> {
    if (this.closed || this.items.length < this.highWater) return Promise.resolve();
    return new Promise((resolve) => this.roomWaiters.push(resolve));
  }

  /**
   * The one consumer is gone: nothing queued or pushed will be taken. The items are let go, pushes
   * refused, and producers waiting for room() go on (to find the queue closed).
   */
  private abandon() {
    this.closed = true;
    this.items = [];
    this.wake();
    this.freeRoom();
  }

  private wake() {
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }

  private freeRoom() {
    const waiters = this.roomWaiters;
    this.roomWaiters = [];
    for (const w of waiters) w();
  }

  /** The one consumer's iterator: a plain object, not a generator (no promise per item while items wait). */
  [Symbol.asyncIterator](): AsyncIterator<T> {
    let over = false;
    const step = (): IteratorResult<T> | undefined => {
      if (this.items.length > 0) {
        const value = this.items.shift()!;
        if (this.roomWaiters.length > 0 && this.items.length <= this.highWater / 2) this.freeRoom();
        return { value, done: false };
      }
      if (!this.closed) return undefined;
      if (this.failure) {
        over = true;
        throw this.failure.err;
      }
      return { value: undefined, done: true };
    };
    return {
      next: () => {
        if (over) return Promise.resolve({ value: undefined, done: true });
        let ready: IteratorResult<T> | undefined;
        try {
          ready = step();
        } catch (err) {
          return Promise.reject(err);
        }
        if (ready) return Promise.resolve(ready);
        return new Promise<IteratorResult<T>>((resolve, reject) => {
          const wait = () => {
            if (over) return resolve({ value: undefined, done: true });
            try {
              const r = step();
              if (r) resolve(r);
              else this.waiter = wait;
            } catch (err) {
              reject(err);
            }
          };
          this.waiter = wait;
        });
      },
      // The consumer stopped: what is still queued is not delivered (as a generator returned at its yield).
      return: (value?: unknown) => {
        over = true;
        this.abandon();
        return Promise.resolve({ value: value as T, done: true });
      },
      throw: (err?: unknown) => {
        over = true;
        this.abandon();
        return Promise.reject(err);
      },
    };
  }
}
