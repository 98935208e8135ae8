// Shared pieces: labelled fields, errors in place, empty states, tables and their
// pager, loaders that retry a lost connection, charts (uPlot), the progress bar.
import type { ComponentChildren } from "preact";
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import uPlot from "uplot";
import { isConnectionLost, messageOf, retryAfterMs, signOutIfRefused } from "./api.js";
import { utcTickLabels } from "./format.js";

// ---- connection state, shown once for the whole page --------------------------------------
let lostLoaders = 0;
const connectionListeners = new Set<(lost: boolean) => void>();
function setLost(delta: number) {
  lostLoaders += delta;
  connectionListeners.forEach((l) => l(lostLoaders > 0));
}

export function useConnectionLost(): boolean {
  const [lost, set] = useState(lostLoaders > 0);
  useEffect(() => {
    connectionListeners.add(set);
    return () => void connectionListeners.delete(set);
  }, []);
  return lost;
}

export interface Loaded<T> {
  data: T | undefined;
  error: string | undefined;
  lost: boolean;
  reload(): void;
}

const sameDeps = (a: unknown[] | undefined, b: unknown[]) => a !== undefined && a.length === b.length && a.every((v, i) => Object.is(v, b[i]));

/**
 * Loads `fn` now, again whenever `deps` change, and every `everyMs` when
 * given. A lost connection is retried with backoff (1 s doubling up to 10 s)
 * until the service answers; a server error is kept for showing in place, and
 * one that names a Retry-After is loaded again after it.
 * What was loaded for other `deps` (another filter, page or id) is never
 * answered for these: it is loading, or the service's error alone.
 */
export function useLoad<T>(fn: () => Promise<T>, deps: unknown[], everyMs?: number): Loaded<T> {
  const [state, setState] = useState<{ data?: T; error?: string; lost: boolean; of?: unknown[] }>({ lost: false });
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let lost = false;
    let backoff = 1000;
    const markLost = (v: boolean) => {
      if (v !== lost) setLost(v ? 1 : -1);
      lost = v;
    };
    const run = async () => {
      try {
        const data = await fn();
        if (stopped) return;
        markLost(false);
        backoff = 1000;
        setState({ data, lost: false, of: deps });
        if (everyMs) timer = setTimeout(run, everyMs);
      } catch (err) {
        if (stopped) return;
        signOutIfRefused(err);
        if (isConnectionLost(err)) {
          markLost(true);
          setState((s) => (sameDeps(s.of, deps) ? { ...s, lost: true } : { lost: true, of: deps }));
          timer = setTimeout(run, backoff);
          backoff = Math.min(backoff * 2, 10_000);
          return;
        }
        markLost(false);
        setState((s) => ({ data: sameDeps(s.of, deps) ? s.data : undefined, error: messageOf(err), lost: false, of: deps }));
        // A "try again later" (429, 503 with Retry-After) is read again once that time has passed, on every
        // page, never sooner; a polled page waits for the later of the two.
        const later = retryAfterMs(err);
        if (everyMs || later) timer = setTimeout(run, Math.max(everyMs ?? 0, later));
      }
    };
    void run();
    return () => {
      stopped = true;
      if (timer) clearTimeout(timer);
      markLost(false);
    };
  }, [...deps, tick]);
  const current = sameDeps(state.of, deps);
  return { data: current ? state.data : undefined, error: current ? state.error : undefined, lost: current && state.lost, reload: () => setTick((t) => t + 1) };
}

/** Runs an action (a button, a form): busy while it runs, its error shown in place. */
export function useAction() {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string>();
  const run = async <T,>(fn: () => Promise<T>): Promise<T | undefined> => {
    setBusy(true);
    setError(undefined);
    try {
      return await fn();
    } catch (err) {
      signOutIfRefused(err);
      setError(messageOf(err));
      return undefined;
    } finally {
      setBusy(false);
    }
  };
  return { busy, error, run, setError };
}

/** An object URL for `blob` that lives as long as the component. */
export function useObjectUrl(blob: Blob | undefined): string | undefined {
  const url = useMemo(() => (blob ? URL.createObjectURL(blob) : undefined), [blob]);
  useEffect(() => () => (url ? URL.revokeObjectURL(url) : undefined), [url]);
  return url;
}

// ---- small components ---------------------------------------------------------------------
export function ErrorBox({ error }: { error?: string }) {
  if (!error) return null;
  return (
    <p class="error" role="alert">
      {error}
    </p>
  );
}

export function Empty({ children }: { children: ComponentChildren }) {
  return <p class="empty">{children}</p>;
}

export function Loading({ what }: { what: string }) {
  return (
    <p class="loading" aria-live="polite">
      Loading {what}…
    </p>
  );
}

/** Shows a loader's error or spinner, else its content. */
export function Show<T>({ l, what, children }: { l: Loaded<T>; what: string; children: (data: T) => ComponentChildren }) {
  if (l.data === undefined) return l.error ? <ErrorBox error={l.error} /> : <Loading what={what} />;
  return (
    <>
      <ErrorBox error={l.error} />
      {children(l.data)}
    </>
  );
}

export interface Column<T> {
  head: string;
  cell(row: T): ComponentChildren;
  /** The cell's class (e.g. "mono"), the same on every row. */
  class?: string;
}

/**
 * A list as a table, one row per item, inside the `.table-wrap` that narrow
 * screens stack as cards (style.css, main.tsx labels the cells). With `empty`,
 * no rows shows that note instead of a bare heading row.
 */
export function DataTable<T>({ rows, columns, empty, rowAttrs, testid }: {
  rows: T[];
  columns: Column<T>[];
  empty?: ComponentChildren;
  /** data-* attributes of a row, for finding it (e.g. data-job). */
  rowAttrs?(row: T): Record<`data-${string}`, string>;
  testid?: string;
}) {
  if (rows.length === 0 && empty !== undefined) return <Empty>{empty}</Empty>;
  return (
    <div class="table-wrap">
      <table data-testid={testid}>
        <thead>
          <tr>{columns.map((c) => <th>{c.head}</th>)}</tr>
        </thead>
        <tbody>
          {rows.map((row) => (
            <tr {...rowAttrs?.(row)}>{columns.map((c) => <td class={c.class}>{c.cell(row)}</td>)}</tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

// ---- paging -------------------------------------------------------------------------------
export interface Paging {
  limit: number;
  offset: number;
  setOffset(offset: number): void;
}

/**
 * The page of a list the service counts, `size` rows at a time. Any change
 * of `filters` goes back to the first page: an offset into another filter's
 * rows means nothing.
 */
export function usePaging(size: number, filters: unknown[]): Paging {
  const key = JSON.stringify(filters);
  const at = useRef({ key, offset: 0 });
  const [, rerender] = useState(0);
  if (at.current.key !== key) at.current = { key, offset: 0 };
  return {
    limit: size,
    offset: at.current.offset,
    setOffset: (offset) => {
      at.current = { key, offset };
      rerender((n) => n + 1);
    },
  };
}

/**
 * "1–100 of 523" with previous and next, from a list's answer (its echoed
 * offset and limit, its total). A page left empty by rows that went away
 * (approved, filtered out) moves back to the last page that has rows.
 */
/** The largest offset a list takes (src/domain/shared/validate.ts LIST_OFFSET_MAX). */
const LIST_OFFSET_MAX = 10_000;

export function Pager({ paging, page, shown }: { paging: Paging; page: { total: bigint; offset: number; limit: number }; shown: number }) {
  const total = Number(page.total);
  const empty = shown === 0 && page.offset > 0;
  useEffect(() => {
    if (empty) paging.setOffset(Math.max(0, Math.floor((total - 1) / page.limit) * page.limit));
  }, [empty, total, page.limit]);
  if (total === 0 || empty) return null;
  const first = page.offset + 1;
  const last = page.offset + shown;
  // The service pages the first LIST_OFFSET_MAX rows of a list by offset (a deeper one is 400).
  const more = page.offset + page.limit < total && page.offset + page.limit <= LIST_OFFSET_MAX;
  return (
    <div class="pager" role="navigation" aria-label="Pages">
      <span aria-live="polite">
        {first}–{last} of {total}
      </span>
      {page.offset > 0 || more ? (
        <span class="buttons">
          <button class="secondary" disabled={page.offset === 0} onClick={() => paging.setOffset(Math.max(0, page.offset - page.limit))}>
            Previous
          </button>
          <button class="secondary" disabled={!more} onClick={() => paging.setOffset(page.offset + page.limit)}>
            Next
          </button>
        </span>
      ) : null}
    </div>
  );
}

let fieldSeq = 0;
export function useId(prefix: string): string {
  const ref = useRef<string | undefined>(undefined);
  ref.current ??= `${prefix}-${++fieldSeq}`;
  return ref.current;
}

/** A labelled field: the label names the control for screen readers and tests. */
export function Field({ label, hint, children, id }: { label: string; hint?: string; id: string; children: ComponentChildren }) {
  return (
    <div class="field">
      <label for={id}>{label}</label>
      {children}
      {hint ? (
        <small id={`${id}-hint`} class="hint">
          {hint}
        </small>
      ) : null}
    </div>
  );
}

/**
 * A list's text filter, applied on change (Enter, or leaving the field) rather than at each
 * key. It keeps what is typed itself: a list that loads re-renders its page, and a field bound
 * to the applied value would be put back to it mid-typing.
 */
export function FilterInput({ id, value, onApply, search, placeholder, numeric, invalid }: {
  id: string;
  value: string;
  onApply(value: string): void;
  search?: boolean;
  placeholder?: string;
  numeric?: boolean;
  invalid?: boolean;
}) {
  const [typed, setTyped] = useState(value);
  useEffect(() => setTyped(value), [value]);
  const common = {
    id,
    placeholder,
    inputMode: numeric ? "numeric" : undefined,
    "aria-invalid": invalid || undefined,
    value: typed,
    onInput: (e: Event) => setTyped((e.target as HTMLInputElement).value),
    onChange: (e: Event) => onApply((e.target as HTMLInputElement).value),
  } as const;
  return search ? <input type="search" {...common} /> : <input {...common} />;
}

export function Card({ title, children, actions }: { title: string; children: ComponentChildren; actions?: ComponentChildren }) {
  return (
    <section class="card" aria-label={title}>
      <header>
        <h2>{title}</h2>
        {actions}
      </header>
      {children}
    </section>
  );
}

export function Stat({ label, value, testid }: { label: string; value: ComponentChildren; testid?: string }) {
  return (
    <div class="stat" data-testid={testid}>
      <span class="stat-label">{label}</span>
      <span class="stat-value">{value}</span>
    </div>
  );
}

export function StatusBadge({ status }: { status: string }) {
  return <span class={`badge badge-${status}`}>{status}</span>;
}

export function ProgressBar({ pct, status, label }: { pct: number; status: string; label: string }) {
  const v = Math.max(0, Math.min(100, Math.round(pct)));
  return (
    <div class="progress" role="progressbar" aria-label={label} aria-valuemin={0} aria-valuemax={100} aria-valuenow={v} data-status={status}>
      <div class={`progress-fill progress-${status}`} style={{ width: `${v}%` }} />
      <span class="progress-text">
        {v}% · {status}
      </span>
    </div>
  );
}

// ---- charts -------------------------------------------------------------------------------
export interface Series {
  label: string;
  values: (number | null)[];
  color: string;
  bars?: boolean;
}

// Bars of several series stand side by side (two at most here: left and right of the tick).
const barsFor = (i: number, n: number) => uPlot.paths.bars!({ size: [0.7 / n, 40], align: n === 1 ? 0 : i === 0 ? -1 : 1 });

const halfStep = (x: number[]) => (x.length > 1 ? (x[1] - x[0]) / 2 : 43_200);

/**
 * A uPlot chart that follows its container's width; x is seconds since 1970 (UTC) unless `labels` name categories.
 * The plot is made once per title and shape; its axis and range callbacks read the latest x and labels (refs), so a
 * refresh that brings new data (another order of categories, more days) is drawn and labelled by that data.
 */
export function Chart({ title, x, series, height = 200, labels }: { title: string; x: number[]; series: Series[]; height?: number; labels?: string[] }) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | undefined>(undefined);
  const latest = useRef({ x, labels });
  latest.current = { x, labels };
  const categories = labels !== undefined;
  useEffect(() => {
    const el = box.current!;
    const opts: uPlot.Options = {
      width: Math.max(el.clientWidth, 200),
      height,
      title,
      // With labels, x is a category index (0, 1, …) named by labels.
      // Bars get half a step of room at both ends, so the first and last are drawn whole.
      scales: categories
        ? { x: { time: false, range: () => [-0.5, Math.max(latest.current.x.length - 0.5, 0.5)] } }
        : { x: { time: true, range: series.some((s) => s.bars) ? (_u, min, max) => [min - halfStep(latest.current.x), max + halfStep(latest.current.x)] : undefined } },
      // Time in UTC, as everywhere in the console: uPlot's ticks and labels follow the browser's zone otherwise.
      tzDate: (t) => uPlot.tzDate(new Date(t * 1000), "Etc/UTC"),
      axes: [
        categories
          ? { splits: () => latest.current.x, values: (_u: uPlot, vals: number[]) => vals.map((v) => latest.current.labels?.[v] ?? "") }
          : { values: (_u: uPlot, ticks: number[], _axis: number, _space: number, step: number) => utcTickLabels(ticks, step) },
        { size: 60 },
      ],
      legend: { live: false },
      series: [
        {},
        ...series.map((s) => ({
          label: s.label,
          stroke: s.color,
          fill: s.bars ? s.color + "cc" : s.color + "22",
          width: 2,
          paths: s.bars ? barsFor(series.filter((x) => x.bars).indexOf(s), series.filter((x) => x.bars).length) : undefined,
          points: { show: !s.bars && x.length < 40 },
        })),
      ],
    };
    plot.current = new uPlot(opts, [x, ...series.map((s) => s.values)] as uPlot.AlignedData, el);
    const ro = new ResizeObserver(() => plot.current?.setSize({ width: Math.max(el.clientWidth, 200), height }));
    ro.observe(el);
    return () => {
      ro.disconnect();
      plot.current?.destroy();
    };
  }, [title, series.length, categories]);
  useEffect(() => {
    // Scales are reset from the new data (the range callbacks read it through `latest`); the axes are
    // recomputed too, as uPlot keeps a scale's tick labels while its range stays the same (categories
    // reordered: the same range, other names).
    plot.current?.setData([x, ...series.map((s) => s.values)] as uPlot.AlignedData);
    plot.current?.redraw(false, true);
  }, [x, series, labels]);
  return <div class="chart" ref={box} role="img" aria-label={title} />;
}
