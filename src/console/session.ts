// Who is signed in. The secret (API key or admin token) lives in memory and in
// sessionStorage (gone when the tab closes); only with "remember me" is an API
// key put in localStorage (the admin token never is). It is never put in a URL
// or logged. Sign-out forgets both.
export type Role = "renter" | "provider" | "admin";

export interface Session {
  role: Role;
  secret: string;
  /** Shown in the header, e.g. the account name. */
  label: string;
}

const STORE_KEY = "svc-console-session";

/**
 * Whether this tab's session was signed in with "remember me" (kept in localStorage too). Told by
 * the tab itself: localStorage is shared with the device's other tabs, and what it holds may be
 * another tab's session.
 */
let remembered = false;
let current: Session | undefined = read();
/** The role of a session the service stopped accepting, until the next sign-in or sign-out: the sign-in page says why. */
let refused: Role | undefined;
const listeners = new Set<() => void>();

function read(): Session | undefined {
  for (const store of [sessionStorage, localStorage]) {
    try {
      const raw = store.getItem(STORE_KEY);
      if (!raw) continue;
      const s = JSON.parse(raw) as Session;
      if ((s.role === "renter" || s.role === "provider" || s.role === "admin") && typeof s.secret === "string") {
        // A session this tab kept for itself was remembered when localStorage holds that same session.
        remembered = store === localStorage || sameSession(s, localStorage.getItem(STORE_KEY));
        return s;
      }
    } catch {
      store.removeItem(STORE_KEY);
    }
  }
  return undefined;
}

function sameSession(s: Session, raw: string | null): boolean {
  try {
    const o = raw ? (JSON.parse(raw) as Session) : undefined;
    return o?.role === s.role && o.secret === s.secret;
  } catch {
    return false;
  }
}

export function session(): Session | undefined {
  return current;
}

/**
 * Signs in, keeping the session for the tab, and with `remember` on this device too; never the
 * operator's token, which opens every account and should not outlive the tab.
 */
export function signIn(s: Session, remember: boolean): void {
  current = s;
  refused = undefined;
  remembered = remember && s.role !== "admin";
  sessionStorage.setItem(STORE_KEY, JSON.stringify(s));
  if (remember && s.role !== "admin") localStorage.setItem(STORE_KEY, JSON.stringify(s));
  else localStorage.removeItem(STORE_KEY);
  listeners.forEach((l) => l());
}

/**
 * Replaces the secret after a key rotation where this tab's session was kept: the tab's storage,
 * and localStorage only when the session was remembered and localStorage still holds it (not
 * another tab's session, nor one signed out since).
 */
export function replaceSecret(secret: string): void {
  if (!current) return;
  const old = current;
  current = { ...old, secret };
  sessionStorage.setItem(STORE_KEY, JSON.stringify(current));
  if (remembered && sameSession(old, localStorage.getItem(STORE_KEY))) localStorage.setItem(STORE_KEY, JSON.stringify(current));
  listeners.forEach((l) => l());
}

export function signOut(): void {
  end(undefined);
}

/**
 * Signs out a session whose secret the service refused (a key rotated in another tab or on another
 * device, revoked, an admin token changed), keeping that for the sign-in page to say. `secret`: the
 * one the refused call carried; a session with another secret (rotated in this tab since) stays.
 */
export function signOutRefused(secret: string | undefined): void {
  if (current && secret !== undefined && current.secret === secret) end(current.role);
}

/** The role whose session ended because the service refused its secret; undefined after a sign-out or sign-in. */
export function refusedRole(): Role | undefined {
  return refused;
}

function end(refusedAs: Role | undefined): void {
  refused = refusedAs;
  current = undefined;
  remembered = false;
  sessionStorage.removeItem(STORE_KEY);
  localStorage.removeItem(STORE_KEY);
  listeners.forEach((l) => l());
}

export function onSessionChange(l: () => void): () => void {
  listeners.add(l);
  return () => listeners.delete(l);
}
