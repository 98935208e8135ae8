// Sign up and sign in, for each role. A new key is shown once, here.
import { useState } from "preact/hooks";
import { api } from "../api.js";
import { go } from "../router.js";
import { refusedRole, signIn, type Role } from "../session.js";
import { settings } from "../settings.js";
import { Card, ErrorBox, Field, useAction, useId } from "../ui.js";

const KEY_HEADER = { renter: "x-renter-key", provider: "x-provider-key", admin: "x-admin-token" } as const;

/**
 * A character no key or token has: a control character, or one past Latin-1, which no header can
 * carry (the browser refuses to send it at all, and that read as a lost connection). The Install
 * page's shortened key ends in one ("…").
 */
const UNSENDABLE = /[^\t\x20-\x7e\x80-\xff]/;

/** Checks the secret with a read of the role's own account, then signs in. */
async function verifyAndSignIn(role: Role, typed: string, remember: boolean): Promise<void> {
  const secret = typed.trim();
  const bad = UNSENDABLE.exec(secret)?.[0];
  if (bad !== undefined) {
    const what = role === "admin" ? "admin token" : "API key";
    throw new Error(`This is not a whole ${what}: it has "${bad}" in it, which no ${what} has. Paste it whole, as it was shown when it was made.`);
  }
  const headers = { [KEY_HEADER[role]]: secret };
  let label = "operator";
  if (role === "renter") label = (await api.renters.getMe({}, { headers })).renter?.name ?? "renter";
  else if (role === "provider") label = (await api.providers.getMe({}, { headers })).provider?.provider?.name ?? "provider";
  else await api.admin.getDashboard({}, { headers });
  signIn({ role, secret, label }, remember);
  go(role);
}

function Remember({ value, onChange }: { value: boolean; onChange(v: boolean): void }) {
  const id = useId("remember");
  return (
    <div class="check">
      <input id={id} type="checkbox" checked={value} onChange={(e) => onChange((e.target as HTMLInputElement).checked)} />
      <label for={id}>Remember me on this device</label>
    </div>
  );
}

function KeySignIn({ role }: { role: Role }) {
  const [secret, setSecret] = useState("");
  const [remember, setRemember] = useState(false);
  const a = useAction();
  const id = useId("key");
  const label = role === "admin" ? "Admin token" : "API key";
  return (
    <form
      onSubmit={(e) => {
        e.preventDefault();
        void a.run(() => verifyAndSignIn(role, secret, remember));
      }}
    >
      <Field id={id} label={label} hint={role === "admin" ? "The operator's SVC_ADMIN_TOKEN." : `Starts with svc-${role}-.`}>
        <input id={id} type="password" autocomplete="off" required value={secret} aria-describedby={`${id}-hint`}
          onInput={(e) => setSecret((e.target as HTMLInputElement).value)} />
      </Field>
      {role === "admin" ? null : <Remember value={remember} onChange={setRemember} />}
      <ErrorBox error={a.error} />
      <button type="submit" disabled={a.busy}>
        Sign in
      </button>
    </form>
  );
}

function EmailSignIn({ role }: { role: "renter" | "provider" }) {
  const [email, setEmail] = useState("");
  const [code, setCode] = useState("");
  const [codeSent, setCodeSent] = useState<string>();
  const [remember, setRemember] = useState(false);
  const a = useAction();
  const emailId = useId("email");
  const codeId = useId("code");
  const submit = async () => {
    const req = { email, ...(codeSent ? { code } : {}) };
    const r = role === "renter" ? await api.renters.loginEmail(req) : await api.providers.loginEmail(req);
    if (r.apiKey) return verifyAndSignIn(role, r.apiKey, remember);
    setCodeSent(r.message ?? "We sent a one-time code to that address.");
  };
  return (
    <form
      onSubmit={(e) => {
        e.preventDefault();
        void a.run(submit);
      }}
    >
      <Field id={emailId} label="Email">
        <input id={emailId} type="email" autocomplete="email" required value={email} onInput={(e) => setEmail((e.target as HTMLInputElement).value)} />
      </Field>
      {codeSent ? (
        <>
          <p class="note">{codeSent}</p>
          <Field id={codeId} label="One-time code">
            <input id={codeId} inputMode="numeric" autocomplete="one-time-code" required value={code} onInput={(e) => setCode((e.target as HTMLInputElement).value)} />
          </Field>
        </>
      ) : null}
      <Remember value={remember} onChange={setRemember} />
      <ErrorBox error={a.error} />
      <button type="submit" disabled={a.busy}>
        {codeSent ? "Sign in with code" : settings.emailCodes ? "Email me a code" : "Sign in with email"}
      </button>
    </form>
  );
}

function NewKey({ role, apiKey, name }: { role: Role; apiKey: string; name: string }) {
  const [remember, setRemember] = useState(false);
  const keyId = useId("newkey");
  return (
    <div class="newkey" role="status">
      <p>
        <strong>Your API key, shown once.</strong> Keep it somewhere safe: the service stores only its hash.
      </p>
      <Field id={keyId} label="Your new API key">
        <input id={keyId} readOnly value={apiKey} onFocus={(e) => (e.target as HTMLInputElement).select()} />
      </Field>
      <Remember value={remember} onChange={setRemember} />
      <button
        onClick={() => {
          signIn({ role, secret: apiKey, label: name }, remember);
          go(role);
        }}
      >
        Continue to the console
      </button>
    </div>
  );
}

function RenterSignUp() {
  const [form, setForm] = useState({ name: "", email: "", organization: "" });
  const [created, setCreated] = useState<string>();
  const a = useAction();
  const ids = { name: useId("name"), email: useId("email"), org: useId("org") };
  if (created) return <NewKey role="renter" apiKey={created} name={form.name} />;
  const set = (k: keyof typeof form) => (e: Event) => setForm({ ...form, [k]: (e.target as HTMLInputElement).value });
  return (
    <form
      onSubmit={(e) => {
        e.preventDefault();
        void a.run(async () => {
          const r = await api.renters.register({ name: form.name, email: form.email, ...(form.organization ? { organization: form.organization } : {}) });
          setCreated(r.apiKey);
        });
      }}
    >
      <Field id={ids.name} label="Name">
        <input id={ids.name} required autocomplete="name" value={form.name} onInput={set("name")} />
      </Field>
      <Field id={ids.email} label="Email">
        <input id={ids.email} type="email" required autocomplete="email" value={form.email} onInput={set("email")} />
      </Field>
      <Field id={ids.org} label="Organization (optional)">
        <input id={ids.org} autocomplete="organization" value={form.organization} onInput={set("organization")} />
      </Field>
      <ErrorBox error={a.error} />
      <button type="submit" disabled={a.busy}>
        Create renter account
      </button>
    </form>
  );
}

function ProviderSignUp() {
  const [form, setForm] = useState({ name: "", email: "", gpuModel: "", os: "linux" });
  const [created, setCreated] = useState<string>();
  const a = useAction();
  const ids = { name: useId("pname"), email: useId("pemail"), gpu: useId("gpu"), os: useId("os") };
  if (created) return <NewKey role="provider" apiKey={created} name={form.name} />;
  const set = (k: keyof typeof form) => (e: Event) => setForm({ ...form, [k]: (e.target as HTMLInputElement).value });
  return (
    <form
      onSubmit={(e) => {
        e.preventDefault();
        void a.run(async () => setCreated((await api.providers.register(form)).apiKey));
      }}
    >
      <Field id={ids.name} label="Name">
        <input id={ids.name} required value={form.name} onInput={set("name")} />
      </Field>
      <Field id={ids.email} label="Email">
        <input id={ids.email} type="email" required value={form.email} onInput={set("email")} />
      </Field>
      <Field id={ids.gpu} label="GPU model" hint="As nvidia-smi names it, e.g. NVIDIA GeForce RTX 4090">
        <input id={ids.gpu} required value={form.gpuModel} aria-describedby={`${ids.gpu}-hint`} onInput={set("gpuModel")} />
      </Field>
      <Field id={ids.os} label="Operating system">
        <select id={ids.os} value={form.os} onChange={set("os")}>
          <option value="linux">Linux</option>
          <option value="windows">Windows</option>
          <option value="mac">macOS</option>
        </select>
      </Field>
      <ErrorBox error={a.error} />
      <button type="submit" disabled={a.busy}>
        Register provider
      </button>
    </form>
  );
}

const ROLES: [Role, string][] = [["renter", "Renter"], ["provider", "Provider"], ["admin", "Operator"]];

export function SignIn() {
  const refused = refusedRole();
  const [role, setRole] = useState<Role>(refused ?? "renter");
  return (
    <div class="signin">
      <h1>Sign in to svc</h1>
      {refused ? (
        <p class="note" role="status">
          {refused === "admin"
            ? "Your session ended: the admin token it used is no longer valid (changed, or revoked). Sign in again with the current token."
            : "Your session ended: the API key it used is no longer valid (rotated, or revoked). Sign in again with your current key."}
        </p>
      ) : null}
      <div class="tabs" role="tablist" aria-label="Account type">
        {ROLES.map(([r, name]) => (
          <button role="tab" id={`tab-${r}`} aria-selected={role === r} aria-controls={`panel-${r}`} tabIndex={role === r ? 0 : -1} onClick={() => setRole(r)}
            onKeyDown={(e) => {
              const i = ROLES.findIndex(([x]) => x === role);
              const d = e.key === "ArrowRight" ? 1 : e.key === "ArrowLeft" ? -1 : 0;
              if (!d) return;
              const next = ROLES[(i + d + ROLES.length) % ROLES.length][0];
              setRole(next);
              document.getElementById(`tab-${next}`)?.focus();
            }}
          >
            {name}
          </button>
        ))}
      </div>
      <div role="tabpanel" id={`panel-${role}`} aria-labelledby={`tab-${role}`} class="grid2">
        {role === "admin" ? (
          <Card title="Operator sign-in">
            <KeySignIn role="admin" />
          </Card>
        ) : (
          <>
            <Card title={role === "renter" ? "New renter" : "New provider"}>{role === "renter" ? <RenterSignUp /> : <ProviderSignUp />}</Card>
            <div>
              <Card title="Sign in with an API key">
                <KeySignIn key={role} role={role} />
              </Card>
              <Card title="Sign in with email">
                <EmailSignIn key={role} role={role} />
              </Card>
            </div>
          </>
        )}
      </div>
    </div>
  );
}
