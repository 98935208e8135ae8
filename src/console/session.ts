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

let current: Session | undefined = read();
const listeners = new Set<() => void>();

function read(): Session | undefined {
  for (const store of [sessionStorage, localStorage]) {
    try {
      const raw = store.getItem(STORE_KEY);
      if (!raw) continue;
      const s = JSON.parse(raw) as Session;
      if ((s.role === "renter" || s.role === "provider" || s.role === "admin") && typeof s.secret === "string") return s;
    } catch {
      store.removeItem(STORE_KEY);
    }
  }
  return undefined;
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
  sessionStorage.setItem(STORE_KEY, JSON.stringify(s));
  if (remember && s.role !== "admin") localStorage.setItem(STORE_KEY, JSON.stringify(s));
  else localStorage.removeItem(STORE_KEY);
  listeners.forEach((l) => l());
}

/** Replaces the secret after a key rotation, wherever it was kept. */
export function replaceSecret(secret: string): void {
  if (!current) return;
  const remembered = localStorage.getItem(STORE_KEY) !== null;
  signIn({ ...current, secret }, remembered);
}

export function signOut(): void {
  current = undefined;
  sessionStorage.removeItem(STORE_KEY);
  localStorage.removeItem(STORE_KEY);
  listeners.forEach((l) => l());
}

export function onSessionChange(l: () => void): () => void {
  listeners.add(l);
  return () => listeners.delete(l);
}
