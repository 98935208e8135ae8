// This process's clock moved away from PostgreSQL's, for the rules that must go by the database's
// (a test server runs in the test's process): Date only, still advancing, `ms` ahead (behind when
// negative). Each call site restores it with useRealClock, in an afterEach.
import { afterEach, vi } from "vitest";

export function skewAppClock(ms: number): void {
  vi.useFakeTimers({ toFake: ["Date"], shouldAdvanceTime: true });
  vi.setSystemTime(new Date(performance.timeOrigin + performance.now() + ms));
}

/** Registers the afterEach that gives the process its real clock back. */
export function restoreClockAfterEach(): void {
  afterEach(() => {
    vi.useRealTimers();
  });
}
