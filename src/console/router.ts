// Hash routes (#/renter/jobs/<id>): the server serves one page, and nothing
// secret is ever part of a route.
import { useEffect, useState } from "preact/hooks";

export function currentRoute(): string[] {
  return location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
}

export function useRoute(): string[] {
  const [route, setRoute] = useState(currentRoute());
  useEffect(() => {
    const on = () => setRoute(currentRoute());
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return route;
}

export function go(...parts: string[]): void {
  location.hash = "#/" + parts.map(encodeURIComponent).join("/");
}

export const href = (...parts: string[]) => "#/" + parts.map(encodeURIComponent).join("/");
