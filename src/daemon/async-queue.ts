// A small unbounded async queue: producers push, one consumer iterates until
// the queue is closed (then the remaining items are still delivered). Used
// for the outgoing side of bidirectional streams, on the server and in the
// TypeScript daemon.
export class AsyncQueue<T> implements AsyncIterable<T> {
  private items: T[] = [];
  private waiter: (() => void) | undefined;
  private closed = false;

  push(item: T): boolean {
    if (this.closed) return false;
    this.items.push(item);
    this.wake();
    return true;
  }

  close(): void {
    this.closed = true;
    this.wake();
  }

  get isClosed(): boolean {
    return this.closed;
  }

  private wake() {
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      while (this.items.length > 0) yield this.items.shift()!;
      if (this.closed) return;
      await new Promise<void>((resolve) => (this.waiter = resolve));
    }
  }
}
