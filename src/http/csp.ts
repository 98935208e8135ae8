// The Content-Security-Policy of the pages this server serves (the console,
// the API reference): everything from this origin only, no plugins, no
// <base>, never framed. A page may widen its styles and images only.

type Widened = "style-src" | "img-src";

/** The self-only policy, with `allow`'s sources added after 'self' to its directives. */
export function selfOnlyCsp(allow: Partial<Record<Widened, string[]>> = {}): string {
  const extra: Readonly<Record<string, string[] | undefined>> = allow;
  const self = (directive: string) => [directive, "'self'", ...(extra[directive] ?? [])].join(" ");
  return [
    self("default-src"),
    self("script-src"),
    self("style-src"),
    self("img-src"),
    self("connect-src"),
    self("font-src"),
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
  ].join("; ");
}
