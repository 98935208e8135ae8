// Renders the files providers download: the legacy daemon and the installer
// scripts, with the backend URL, the provider key (and, for the daemon, the
// task-signing secret and version) filled in. Each value is written as a
// literal of the file's own language, so no value can break out of it.
import crypto from "node:crypto";
import fs from "node:fs";

export interface RenderValues {
  backendUrl: string;
  apiKey: string;
  hmacSecret: string;
  daemonVersion: string;
}

type Quote = (value: string) => string;

const quoteFor: Record<"python" | "shell" | "powershell", Quote> = {
  // A JSON string literal is a valid Python string literal.
  python: (v) => JSON.stringify(v),
  shell: (v) => `'${v.replace(/'/g, `'\\''`)}'`,
  powershell: (v) => `'${v.replace(/'/g, "''")}'`,
};

const quoteChar = { python: '"', shell: "'", powershell: "'" } as const;

export const LEGACY_DAEMON_FILE = new URL("./legacy/svc_daemon.py", import.meta.url);
export const SETUP_SH_FILE = new URL("./installers/setup.sh", import.meta.url);
export const SETUP_PS1_FILE = new URL("./installers/setup-windows.ps1", import.meta.url);
/** The in-container programs of the built-in job types, shared by both daemons. */
export const CONTAINER_SCRIPTS_DIR = new URL("./ts/container-scripts/", import.meta.url);

let containerScripts: string | undefined;
/** {"llm.py": "<source>", ...} as JSON text, which is also a Python dict literal of strings. */
function containerScriptsLiteral(): string {
  if (containerScripts === undefined) {
    const files = fs.readdirSync(CONTAINER_SCRIPTS_DIR).filter((f) => f.endsWith(".py")).sort();
    containerScripts = JSON.stringify(Object.fromEntries(files.map((f) => [f, fs.readFileSync(new URL(f, CONTAINER_SCRIPTS_DIR), "utf8")])));
  }
  return containerScripts;
}

const cache = new Map<string, string>();
function template(file: URL): string {
  let text = cache.get(file.href);
  if (text === undefined) {
    text = fs.readFileSync(file, "utf8");
    cache.set(file.href, text);
  }
  return text;
}

function fill(text: string, lang: keyof typeof quoteFor, values: Record<string, string>): string {
  const q = quoteChar[lang];
  for (const [name, value] of Object.entries(values)) {
    if (/[\r\n\0]/.test(value)) throw new Error(`${name} contains a line break`);
    // Quoted occurrences become a literal of the language; the rest (comments) the bare value.
    text = text.split(`${q}{{${name}}}${q}`).join(quoteFor[lang](value));
    text = text.split(`{{${name}}}`).join(value);
  }
  return text;
}

export function renderLegacyDaemon(v: RenderValues): string {
  const text = template(LEGACY_DAEMON_FILE);
  // Only the constants are filled; the placeholder check inside the code stays as written.
  return text
    .replace(`DAEMON_VERSION = "{{DAEMON_VERSION}}"`, `DAEMON_VERSION = ${quoteFor.python(v.daemonVersion)}`)
    .replace(`BACKEND_URL = "{{BACKEND_URL}}"`, `BACKEND_URL = ${quoteFor.python(v.backendUrl)}`)
    .replace(`API_KEY = "{{API_KEY}}"`, `API_KEY = ${quoteFor.python(v.apiKey)}`)
    .replace(`HMAC_SECRET = "{{HMAC_SECRET}}"`, `HMAC_SECRET = ${quoteFor.python(v.hmacSecret)}`)
    .replace("CONTAINER_SCRIPTS = {}  # {{CONTAINER_SCRIPTS}}", () => `CONTAINER_SCRIPTS = ${containerScriptsLiteral()}`);
}

export function renderSetupShell(v: Pick<RenderValues, "backendUrl" | "apiKey">): string {
  return fill(template(SETUP_SH_FILE), "shell", { API_KEY: v.apiKey, BACKEND_URL: v.backendUrl });
}

export function renderSetupPowerShell(v: Pick<RenderValues, "backendUrl" | "apiKey">): string {
  return fill(template(SETUP_PS1_FILE), "powershell", { API_KEY: v.apiKey, BACKEND_URL: v.backendUrl });
}

export function sha256Hex(data: string | Buffer): string {
  return crypto.createHash("sha256").update(data).digest("hex");
}
