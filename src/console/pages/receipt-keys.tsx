// The operator's receipt keys (docs/receipts.md "Keys, rotation and revocation"): every server key
// with its status, rotation after a confirmation, revocation of one key with a required reason after
// a confirmation that says what it does (and what the service answered: receipts signed again now or
// left to its sweep, a key that was revoked already), and the providers' registered keys, counted
// and paged.
import { useRef, useState } from "preact/hooks";
import type { ServerReceiptKey } from "../../../gen/svc/v1/receipts_pb.js";
import { api } from "../api.js";
import { idFilter, when } from "../format.js";
import { Card, DataTable, ErrorBox, Field, FilterInput, Pager, Show, Stat, StatusBadge, useAction, useId, useLoad, usePaging } from "../ui.js";

/** Provider keys the service counts at most (a total at that bound says only that more follow), and pages by offset. */
const PROVIDER_KEYS_COUNTED = 10_000;

const keyStatus = (k: ServerReceiptKey) => (k.revokedAt ? "revoked" : k.current ? "current" : "retired");
const plural = (n: bigint, one: string, many: string) => `${String(n)} ${n === 1n ? one : many}`;

export function ReceiptKeysPage() {
  // Server keys come with every listing; one provider key asked for keeps the answer small.
  const keys = useLoad(() => api.receipts.listReceiptKeys({ limit: 1 }), []);
  const [revoking, setRevoking] = useState<ServerReceiptKey>();
  const [outcome, setOutcome] = useState<string>();
  const done = (message: string) => {
    setOutcome(message);
    setRevoking(undefined);
    keys.reload();
  };
  return (
    <>
      <h1>Receipt keys</h1>
      <Card title="Server keys">
        <p>
          One key is current and signs new receipts. A retired key signs nothing more and stays published, so the receipts
          it signed keep verifying; a revoked key is trusted no more. Keep a copy of the keys you rely on
          (<code>svc receipt keys --out keys.json</code>).
        </p>
        <Show l={keys} what="receipt keys">
          {(r) => (
            <>
              <DataTable rows={[...r.serverKeys].reverse()} testid="server-keys" rowAttrs={(k) => ({ "data-key": k.keyId })} columns={[
                { head: "Key", cell: (k) => <><code>{k.keyId}</code><br /><small class="mono muted small" title="Ed25519 public key (base64)">{k.publicKey}</small></> },
                {
                  head: "Status",
                  cell: (k) => (
                    <>
                      <StatusBadge status={keyStatus(k)} />
                      {k.revokedAt ? (
                        <>
                          <br /><small>{when(k.revokedAt)}</small>
                          <br /><small class="small" data-testid="revocation-reason">{k.revocationReason ?? "no reason given"}</small>
                        </>
                      ) : null}
                    </>
                  ),
                },
                { head: "Created", cell: (k) => when(k.createdAt) },
                { head: "Retired", cell: (k) => when(k.retiredAt) },
                {
                  head: "Actions",
                  cell: (k) => k.revokedAt ? null : (
                    <div class="actions">
                      <button class="danger" aria-label={`Revoke ${k.keyId}`} aria-expanded={revoking?.keyId === k.keyId}
                        onClick={() => { setOutcome(undefined); setRevoking(k); }}>Revoke…</button>
                    </div>
                  ),
                },
              ]} />
              <RotateReceiptKey onDone={done} onStart={() => { setOutcome(undefined); setRevoking(undefined); }} />
            </>
          )}
        </Show>
        {outcome ? <p class="ok" role="status">{outcome}</p> : null}
      </Card>
      {revoking ? <RevokeReceiptKey key={revoking.keyId} k={revoking} onDone={done} onCancel={() => setRevoking(undefined)} /> : null}
      <ProviderKeys />
    </>
  );
}

/** "Rotate key…", then a confirmation saying what a rotation does; the new key and the one it retired are said. */
function RotateReceiptKey({ onDone, onStart }: { onDone(message: string): void; onStart(): void }) {
  const [confirming, setConfirming] = useState(false);
  const a = useAction();
  // A second press before the button is disabled would retire the new key too.
  const sending = useRef(false);
  const rotate = () => {
    if (sending.current) return;
    sending.current = true;
    void a.run(async () => {
      try {
        const r = await api.receipts.rotateReceiptKey({});
        setConfirming(false);
        const key = r.current?.keyId ?? "";
        onDone(r.retiredKeyId ? `${key} is now the current key; ${r.retiredKeyId} is retired and stays published.` : `${key} is now the current key.`);
      } finally {
        sending.current = false;
      }
    });
  };
  return (
    <div class="rotate">
      {confirming ? (
        <div class="note confirm" role="group" aria-label="Confirm rotation">
          <p>
            Rotate the receipt key? A new key is made current and signs every receipt from now on. The current key is retired: it
            signs nothing more and stays published, so the receipts it signed keep verifying. Nothing is re-signed; to stop trusting
            a key whose seed may have leaked, revoke it instead.
          </p>
          <div class="buttons">
            <button class="danger" disabled={a.busy} onClick={rotate}>Yes, rotate the key</button>
            <button class="secondary" disabled={a.busy} onClick={() => setConfirming(false)}>Keep the current key</button>
          </div>
        </div>
      ) : (
        <div class="buttons">
          <button onClick={() => { onStart(); a.setError(undefined); setConfirming(true); }}>Rotate key…</button>
        </div>
      )}
      <ErrorBox error={a.error} />
    </div>
  );
}

/**
 * Revokes one key, with a required reason (published with the key and kept in the audit log), after
 * a confirmation that says what revocation does. Revoking is idempotent at the service: a key
 * revoked meanwhile (from another tab, the CLI) is answered as it stands, and said so.
 */
function RevokeReceiptKey({ k, onDone, onCancel }: { k: ServerReceiptKey; onDone(message: string): void; onCancel(): void }) {
  const [reason, setReason] = useState("");
  const a = useAction();
  const id = useId("revoke-reason");
  const submit = (e: Event) => {
    e.preventDefault();
    const why = reason.trim();
    if (!why) return a.setError("Give a reason: it is published with the key and kept in the audit log.");
    void a.run(async () => {
      const r = await api.receipts.revokeReceiptKey({ keyId: k.keyId, reason: why });
      onDone(revocationOutcome(k, r));
    });
  };
  return (
    <Card title={`Revoke ${k.keyId}`}>
      <form onSubmit={submit} noValidate>
        <div class="note confirm">
          <p>
            A revoked key is trusted no more: verifiers (<code>svc receipt verify</code>, the console's receipt check) refuse
            every receipt it signed, so receipt files saved before now stop verifying and have to be fetched again.
          </p>
          <p>
            Every receipt stored under it is signed again with the current key (the receipts themselves are unchanged): the
            service does that for a few seconds now and leaves the rest to its periodic sweep; a receipt read meanwhile is
            signed on the read.
            {k.current ? " This is the current key: a new key is made current, as a rotation does." : null}
          </p>
          <p>A revocation cannot be undone.</p>
        </div>
        <Field id={id} label="Reason" hint="Required; published with the key and kept in the audit log (at most 1,000 characters).">
          <input id={id} required maxLength={1000} value={reason} aria-describedby={`${id}-hint`} autoFocus
            onInput={(e) => setReason((e.target as HTMLInputElement).value)} />
        </Field>
        <ErrorBox error={a.error} />
        <div class="buttons">
          <button type="submit" class="danger" disabled={a.busy}>Revoke the key</button>
          <button type="button" class="secondary" disabled={a.busy} onClick={onCancel}>Keep it</button>
        </div>
      </form>
    </Card>
  );
}

/** What a revocation's answer says: the receipts signed again now and whether any are left to the sweep, or a key revoked before. */
function revocationOutcome(
  asked: ServerReceiptKey,
  r: { key?: ServerReceiptKey; current?: ServerReceiptKey; alreadyRevoked: boolean; receiptsResigned: bigint; resigningDone: boolean },
): string {
  const key = r.key ?? asked;
  const signed = `${plural(r.receiptsResigned, "receipt", "receipts")} signed again with ${r.current?.keyId ?? "the current key"} now`;
  const rest = r.resigningDone ? "every receipt it signed is signed by a key in force." : "the rest are left to the service's periodic sweep.";
  if (r.alreadyRevoked) {
    const first = `${key.keyId} was already revoked on ${when(key.revokedAt)} (${key.revocationReason ?? "no reason given"}); nothing changed.`;
    return r.receiptsResigned > 0n || !r.resigningDone ? `${first} ${signed}; ${rest}` : first;
  }
  const replaced = asked.current && r.current ? ` ${r.current.keyId} is now the current key.` : "";
  return `Revoked ${key.keyId}. ${signed}; ${rest}${replaced}`;
}

/**
 * The providers' daemon keys (they sign result attestations; a provider has at most 20 and none is
 * removed): counted, 100 a page, or one provider's. Paging by offset stops at the count's bound; the
 * keys past it are one provider's away.
 */
function ProviderKeys() {
  const [provider, setProvider] = useState("");
  const fid = useId("pk-provider");
  const providerId = idFilter("Provider id", provider);
  const paging = usePaging(100, [provider]);
  const list = useLoad(
    async () => {
      if (providerId.error) throw new Error(providerId.error);
      return api.receipts.listReceiptKeys({ limit: paging.limit, offset: paging.offset, ...(providerId.id !== undefined ? { providerId: providerId.id } : {}) });
    },
    [provider, paging.offset],
  );
  return (
    <Card title="Provider keys">
      <p>
        Keys that provider daemons registered to sign their result attestations. They are the providers' own: they are not rotated
        or revoked here.
      </p>
      <div class="filters">
        <Field id={fid} label="Provider id"><FilterInput id={fid} numeric invalid={!!providerId.error} value={provider} onApply={setProvider} /></Field>
      </div>
      {providerId.error ? <ErrorBox error={providerId.error} /> : (
        <Show l={list} what="provider keys">
          {(r) => {
            const atBound = r.providerKeysTotal >= BigInt(PROVIDER_KEYS_COUNTED);
            const total = atBound ? BigInt(PROVIDER_KEYS_COUNTED) : r.providerKeysTotal;
            return (
              <>
                <div class="stats">
                  <Stat label="Registered keys" testid="provider-keys-total"
                    value={atBound ? `${PROVIDER_KEYS_COUNTED.toLocaleString("en-US")} or more` : r.providerKeysTotal.toLocaleString("en-US")} />
                </div>
                {atBound ? <p class="muted">Pages go up to the first {PROVIDER_KEYS_COUNTED.toLocaleString("en-US")} keys; a provider id lists that provider's keys wherever they are.</p> : null}
                <DataTable rows={r.providerKeys} testid="provider-keys" rowAttrs={(k) => ({ "data-key": k.keyId })}
                  empty={providerId.id !== undefined ? `Provider #${String(providerId.id)} has registered no key.` : "No provider key yet: a stream daemon registers its key when it first connects."}
                  columns={[
                    { head: "Key", class: "mono", cell: (k) => k.keyId },
                    { head: "Provider", cell: (k) => `#${String(k.providerId)}` },
                    { head: "Registered", cell: (k) => when(k.registeredAt) },
                    { head: "Public key", class: "mono small", cell: (k) => k.publicKey },
                  ]} />
                <Pager paging={paging} page={{ total, offset: paging.offset, limit: paging.limit }} shown={r.providerKeys.length} />
              </>
            );
          }}
        </Show>
      )}
    </Card>
  );
}
