// Display helpers. Amounts are integer halala (1 SAR = 100 halala).
export function sar(halala: bigint | number | undefined | null): string {
  if (halala === undefined || halala === null) return "—";
  const n = Number(halala);
  return `${(n / 100).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 })} SAR`;
}

/**
 * What the gateway gave back of a payment (`refunded_halala`: its refunds' running total, or all of it on a
 * void), in SAR; "—" for a payment nothing was refunded of (the field is absent then).
 */
export function refunded(p: { refundedHalala?: bigint }): string {
  return p.refundedHalala === undefined ? "—" : sar(p.refundedHalala);
}

const inSarOf = (n: string) => sar(Number(n));

/**
 * A message of the service as the console shows it: amounts in SAR, as its pages and forms have them.
 * The service states amounts in halala ("150 halala", "15 halala/min"), with more figures of the same
 * sentence bare ("300 needed", "30 is reserved", "hold 60 more") and fields named in halala
 * ("amount_halala", "monthly_spend_limit_halala is 5000"); shown as "1.50 SAR", "0.15 SAR/min",
 * "3.00 SAR needed", "amount", "monthly_spend_limit is 50.00 SAR". A message without halala is as it came.
 */
export function inSar(message: string): string {
  if (!message.includes("halala")) return message;
  return message
    .replace(/(?<![\w.])(-?\d+) halala\b/g, (_, n: string) => inSarOf(n))
    .replace(/\b([a-z_]+)_halala is (-?\d+)(?![\w.])/g, (_, name: string, n: string) => `${name} is ${inSarOf(n)}`)
    .replace(/\b([a-z_]+)_halala\b/g, "$1")
    .replace(/(?<![\w.])(\d+)( is)? (needed|reserved|owed)\b/g, (_, n: string, is: string | undefined, what: string) => `${inSarOf(n)}${is ?? ""} ${what}`)
    .replace(/\bhold (\d+) more\b/g, (_, n: string) => `hold ${inSarOf(n)} more`);
}

export function when(iso: string | undefined | null): string {
  if (!iso) return "—";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString("en-GB", { dateStyle: "medium", timeStyle: "medium", timeZone: "UTC" }) + " UTC";
}

export function ago(iso: string | undefined | null): string {
  if (!iso) return "never";
  const s = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${Math.max(s, 0)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

const DAY = new Intl.DateTimeFormat("en-GB", { day: "numeric", month: "short", timeZone: "UTC" });
const TIME = new Intl.DateTimeFormat("en-GB", { hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZone: "UTC" });
const SECONDS = new Intl.DateTimeFormat("en-GB", { second: "2-digit", timeZone: "UTC" });

/**
 * Labels of a time axis's ticks (seconds since 1970) `step` seconds apart, in UTC as every time the console
 * shows: days as "17 Nov"; times of day as "14:05", or "14:05:10" when ticks are under a minute apart, then
 * ":20" while the minute stays the same; the day under the first tick and under each tick that starts another day.
 */
export function utcTickLabels(ticks: number[], step: number): string[] {
  if (step >= 86_400) return ticks.map((t) => DAY.format(t * 1000));
  return ticks.map((t, i) => {
    const ms = t * 1000;
    const before = i === 0 ? undefined : ticks[i - 1] * 1000;
    const seconds = `:${SECONDS.format(ms).padStart(2, "0")}`;
    const sameMinute = before !== undefined && TIME.format(before) === TIME.format(ms);
    const time = step >= 60 || seconds === ":00" ? TIME.format(ms) : sameMinute ? seconds : TIME.format(ms) + seconds;
    return before === undefined || DAY.format(before) !== DAY.format(ms) ? `${time}\n${DAY.format(ms)}` : time;
  });
}

/** "YYYY-MM-DD" (UTC) as chart x value, in seconds. */
export function dayToSeconds(day: string): number {
  return Date.UTC(Number(day.slice(0, 4)), Number(day.slice(5, 7)) - 1, Number(day.slice(8, 10))) / 1000;
}

export { isTerminal } from "../shared/job-status.js";

/** An amount typed in SAR ("12.5", "-3", "0.01") as halala; undefined when it is not one (more than two decimals among them). */
export function parseSar(typed: string): bigint | undefined {
  const m = /^\s*(-?)(\d{0,13})(?:\.(\d{1,2}))?\s*$/.exec(typed);
  if (!m || (!m[2] && !m[3])) return undefined;
  const halala = BigInt(m[2] || "0") * 100n + BigInt((m[3] ?? "").padEnd(2, "0"));
  return m[1] ? -halala : halala;
}

/** An id filter as typed: blank (no filter), an id, or what is wrong with it. */
export function idFilter(label: string, typed: string): { id?: bigint; error?: string } {
  const v = typed.trim();
  if (!v) return {};
  return /^\d{1,18}$/.test(v) ? { id: BigInt(v) } : { error: `${label} must be a whole number, e.g. 42.` };
}
