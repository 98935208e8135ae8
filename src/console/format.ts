// Display helpers. Amounts are integer halala (1 SAR = 100 halala).
export function sar(halala: bigint | number | undefined | null): string {
  if (halala === undefined || halala === null) return "—";
  const n = Number(halala);
  return `${(n / 100).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 })} SAR`;
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

/** "YYYY-MM-DD" (UTC) as chart x value, in seconds. */
export function dayToSeconds(day: string): number {
  return Date.UTC(Number(day.slice(0, 4)), Number(day.slice(5, 7)) - 1, Number(day.slice(8, 10))) / 1000;
}

export const TERMINAL = new Set(["completed", "failed", "cancelled"]);

/** An amount typed in SAR ("12.5", "-3", "0.01") as halala; undefined when it is not one (more than two decimals among them). */
export function parseSar(typed: string): bigint | undefined {
  const m = /^\s*(-?)(\d{0,13})(?:\.(\d{1,2}))?\s*$/.exec(typed);
  if (!m || (!m[2] && !m[3])) return undefined;
  const halala = BigInt(m[2] || "0") * 100n + BigInt((m[3] ?? "").padEnd(2, "0"));
  return m[1] ? -halala : halala;
}
