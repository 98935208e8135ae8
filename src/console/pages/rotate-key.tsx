// The "API key" card of the renter's and the provider's pages: rotate after a confirmation, show the
// new key once, and sign the console in with it (the old one stopped working).
import type { ComponentChildren } from "preact";
import { useState } from "preact/hooks";
import { replaceSecret } from "../session.js";
import { Card, ErrorBox, Field, useAction, useId } from "../ui.js";

export function RotateKey({ explain, rotate, after }: { explain: string; rotate: () => Promise<string>; after?: ComponentChildren }) {
  const [confirming, setConfirming] = useState(false);
  const [key, setKey] = useState<string>();
  const a = useAction();
  const id = useId("rotated");
  return (
    <Card title="API key">
      <p>{explain}</p>
      {key ? (
        <>
          <Field id={id} label="Your new API key (shown once)">
            <input id={id} readOnly value={key} onFocus={(e) => (e.target as HTMLInputElement).select()} />
          </Field>
          {after}
        </>
      ) : confirming ? (
        <div class="buttons">
          <button class="danger" disabled={a.busy}
            onClick={() => void a.run(async () => {
              const k = await rotate();
              replaceSecret(k);
              setKey(k);
            })}>
            Yes, rotate my key
          </button>
          <button class="secondary" onClick={() => setConfirming(false)}>Keep the current key</button>
        </div>
      ) : (
        <button onClick={() => setConfirming(true)}>Rotate key…</button>
      )}
      <ErrorBox error={a.error} />
    </Card>
  );
}
