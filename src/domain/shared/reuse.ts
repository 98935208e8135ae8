// A read that many callers may ask for at once and that may be a few seconds
// old: public figures whose exact value costs more than a request should.

/** `read`, run at most once per `reuseMs` (of `clock`); callers that arrive during a read share it, and a failed read is not reused. */
export function reusedFor<T>(read: () => Promise<T>, reuseMs: number, clock: () => number = Date.now): () => Promise<T> {
  let last: { at: number; value: Promise<T> } | undefined;
  return () => {
    const now = clock();
    if (!last || now - last.at >= reuseMs) {
      const value = read();
      last = { at: now, value };
      value.catch(() => {
        if (last?.value === value) last = undefined;
      });
    }
    return last.value;
  };
}
