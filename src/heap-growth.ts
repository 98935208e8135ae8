// How far V8 grows the heap past its live set (SVC_HEAP_GROWTH_PERCENT).
import v8 from "node:v8";

/**
 * Sets V8's heap growing factor to 1 + percent/100 for the rest of the
 * process. V8 reads the flag each time it sizes the heap after a full GC, so
 * setting it at start takes effect (the flag is not allowed in NODE_OPTIONS).
 * A --heap-growing-percent given to node itself wins. Returns whether it set it.
 */
export function applyHeapGrowth(percent: number, execArgv: readonly string[] = process.execArgv): boolean {
  if (percent <= 0 || execArgv.some((a) => a.startsWith("--heap-growing-percent"))) return false;
  v8.setFlagsFromString(`--heap-growing-percent=${Math.trunc(percent)}`);
  return true;
}
