// The job page's Receipt card, for a job that has ended: what its signed
// receipt says (docs/receipts.md), the receipt file to download for
// `svc receipt verify`, its signatures checked in the browser against the
// published keys, and the output the service serves now checked against its
// output_sha256 (src/console/receipt.ts).
import { Code, ConnectError } from "@connectrpc/connect";
import type { ComponentChildren } from "preact";
import { useEffect, useMemo, useState } from "preact/hooks";
import type { Verification } from "../../shared/receipt-check.js";
import { api, messageOf } from "../api.js";
import { sar, when } from "../format.js";
import { checkJobOutput, checkReceiptFile, receiptFileText, type OutputCheck, type ReceiptCheck } from "../receipt.js";
import { Card, Empty, ErrorBox, Loading, useLoad, useObjectUrl } from "../ui.js";

type Json = Record<string, unknown>;
const obj = (v: unknown): Json => (v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Json) : {});
const text = (v: unknown): string => (typeof v === "string" && v !== "" ? v : "—");
const halala = (v: unknown) => (typeof v === "number" ? sar(v) : "—");

/** A SHA-256 shown short; the whole of it in its title, on a click, and copied by its button. */
function Hash({ label, value }: { label: string; value: string }) {
  const [whole, setWhole] = useState(false);
  const [copied, setCopied] = useState(false);
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(value);
      setCopied(true);
    } catch {
      // No clipboard here (a page not served over HTTPS): the whole hash, to select by hand.
      setWhole(true);
    }
  };
  return (
    <span class="hash">
      <code title={value} data-hash={value} onClick={() => setWhole(true)}>{whole ? value : `${value.slice(0, 12)}…`}</code>
      <button type="button" class="secondary tiny" aria-label={`Copy ${label}`} onClick={() => void copy()}>{copied ? "Copied" : "Copy"}</button>
    </span>
  );
}

function AttestationFact({ att }: { att: Json }) {
  if (att.status === "attested") return <>attested by provider #{String(att.provider_id)} (key <span class="mono">{text(att.key_id)}</span>)</>;
  const detail = typeof att.detail === "string" && att.detail !== "" ? `: ${att.detail}` : "";
  return <>none ({text(att.reason)}){detail}</>;
}

/** The server signature's line: verified, or why not. */
function serverLine(v: Verification): { ok: boolean; line: string } {
  const s = v.server;
  const key = s.keyId ?? "(none named)";
  switch (s.verdict) {
    case "valid":
      return { ok: true, line: `Signature verified (key ${key}${s.resignedFor ? `; signed again: issued under ${s.resignedFor}, since revoked` : ""})` };
    case "revoked":
      return { ok: false, line: `Signed by a revoked key (${key}${s.revokedAt ? `, revoked ${when(s.revokedAt)}` : ""}): the signature proves nothing. Reload the page for the receipt signed by a key in force.` };
    case "unknown_key":
      return { ok: false, line: `Signature does not verify: key ${key} is not among the published keys.` };
    case "wrong_key":
      return { ok: false, line: `Signature does not verify: the published key ${key} is not the key its id names.` };
    case "invalid":
      return { ok: false, line: "Signature does not verify: the receipt was changed, or signed by another key." };
    default:
      return { ok: false, line: "Signature not checked: this is not a receipt file." };
  }
}

/** The provider attestation's line. */
function attestationLine(v: Verification): { ok: boolean | undefined; line: string } {
  const a = v.attestation;
  switch (a.verdict) {
    case "none":
      return { ok: undefined, line: `No provider attestation (${a.reason}).` };
    case "missing":
      return { ok: false, line: "The receipt has no provider attestation member." };
    case "valid":
      return a.matches
        ? { ok: true, line: `Provider attestation verified (provider #${a.providerId}, key ${a.keyId})` }
        : { ok: false, line: "Provider attestation does not verify: it is about another job or output than the receipt." };
    case "unknown_key":
      return { ok: false, line: `Provider attestation does not verify: key ${a.keyId ?? "(none named)"} is not among the published keys.` };
    case "wrong_key":
      return { ok: false, line: `Provider attestation does not verify: key ${a.keyId ?? "(none named)"} is not provider #${a.providerId}'s published key.` };
    default:
      return { ok: false, line: "Provider attestation does not verify: its signature does not match its statement." };
  }
}

const mark = (ok: boolean | undefined) => (ok === true ? "✓" : ok === false ? "✗" : "·");

function CheckResult({ check, jobId }: { check: ReceiptCheck; jobId: string }) {
  if (check.state === "unavailable") {
    return (
      <div class="receipt-check" role="status" data-testid="receipt-verification" data-verified="unavailable">
        <p>
          Verification is not available in this browser: it has no Ed25519 in WebCrypto (or the page is not served over HTTPS).
          The signature was not checked. Download the receipt and check it with <code>svc receipt verify {jobId}.receipt.json</code>.
        </p>
      </div>
    );
  }
  const v = check.verification;
  const server = serverLine(v);
  const att = attestationLine(v);
  return (
    <div class={`receipt-check ${v.ok ? "verified" : "failed"}`} role="status" data-testid="receipt-verification" data-verified={v.ok ? "true" : "false"}>
      <p class={server.ok ? "ok" : "bad"}>{mark(server.ok)} {server.line}</p>
      <p class={att.ok === false ? "bad" : att.ok ? "ok" : "muted"}>{mark(att.ok)} {att.line}</p>
      {v.ok ? null : (
        <>
          <p class="bad"><strong>This receipt does not verify.</strong></p>
          <ul class="problems">{v.problems.map((p) => <li>{p}</li>)}</ul>
        </>
      )}
    </div>
  );
}

/** A hash in a sentence: short, whole in its title. */
const short = (h: string) => <code title={h}>{h.slice(0, 12)}…</code>;

/** The output check's line: the output the service serves now against the receipt's output_sha256. */
function outputLine(check: OutputCheck, jobId: string): { ok: boolean | undefined; line: ComponentChildren } {
  switch (check.state) {
    case "unavailable":
      return {
        ok: undefined,
        line: <>Output not checked: this browser has no SHA-256 in WebCrypto (or the page is not served over HTTPS). Check it with <code>svc receipt output {jobId} -o output.json</code> and <code>svc receipt verify {jobId}.receipt.json --output output.json</code>.</>,
      };
    case "match":
      return { ok: true, line: <>Output matches the receipt: the output the service serves now hashes to its output_sha256 ({short(check.actual)}).</> };
    case "mismatch":
      return check.expected === null
        ? { ok: false, line: <>Output does not match the receipt: the receipt records no output, but the service serves one (SHA-256 {short(check.actual)}).</> }
        : {
            ok: false,
            line: <>Output does not match the receipt: the output the service serves now hashes to {short(check.actual)}, not the receipt's output_sha256 {short(check.expected)}. It is not the output the receipt was signed over.</>,
          };
    case "none":
      return check.expected === null
        ? { ok: undefined, line: <>No output: the receipt records none, and the service serves none.</> }
        : { ok: false, line: <>No output: the service serves none, but the receipt names one (output_sha256 {short(check.expected)}; the service answers: {check.reason}).</> };
  }
}

function OutputResult({ check, jobId }: { check: OutputCheck; jobId: string }) {
  const { ok, line } = outputLine(check, jobId);
  return (
    <div class={`receipt-check ${ok === true ? "verified" : ok === false ? "failed" : ""}`} role="status" data-testid="receipt-output" data-output={check.state}>
      <p class={ok === false ? "bad" : ok ? "ok" : "muted"}>{mark(ok)} {line}</p>
    </div>
  );
}

/** The receipt file's check, run again when the file changes or on `again`. */
function useReceiptCheck(fileText: string | undefined) {
  const [state, setState] = useState<{ check?: ReceiptCheck; error?: string; of?: string }>({});
  const [tries, setTries] = useState(0);
  useEffect(() => {
    if (fileText === undefined) return;
    let stopped = false;
    setState({ of: fileText });
    checkReceiptFile(fileText).then(
      (check) => !stopped && setState({ check, of: fileText }),
      (err: unknown) => !stopped && setState({ error: messageOf(err), of: fileText }),
    );
    return () => void (stopped = true);
  }, [fileText, tries]);
  const current = state.of === fileText;
  return { check: current ? state.check : undefined, error: current ? state.error : undefined, again: () => setTries((t) => t + 1) };
}

/** The card for a job that has ended; a job without a receipt (it ended before receipts were issued) says so plainly. */
export function ReceiptCard({ jobId }: { jobId: string }) {
  const loaded = useLoad(async () => {
    try {
      return { file: receiptFileText(await api.receipts.getJobReceipt({ jobId })) };
    } catch (err) {
      if (err instanceof ConnectError && err.code === Code.NotFound) return { missing: err.rawMessage };
      throw err;
    }
  }, [jobId]);
  const fileText = loaded.data?.file;
  const doc = useMemo(() => (fileText === undefined ? undefined : obj(JSON.parse(fileText))), [fileText]);
  const blob = useMemo(() => (fileText === undefined ? undefined : new Blob([fileText], { type: "application/json" })), [fileText]);
  const url = useObjectUrl(blob);
  const check = useReceiptCheck(fileText);
  const output = useLoad(async () => {
    if (fileText === undefined) return undefined;
    const sha = obj(obj(JSON.parse(fileText)).receipt).output_sha256;
    return checkJobOutput(jobId, typeof sha === "string" ? sha : null);
  }, [jobId, fileText]);

  let content;
  if (!loaded.data) content = loaded.error ? <ErrorBox error={loaded.error} /> : <Loading what="receipt" />;
  else if (loaded.data.missing !== undefined) content = <Empty>{loaded.data.missing.charAt(0).toUpperCase() + loaded.data.missing.slice(1)}.</Empty>;
  else {
    const r = obj(doc!.receipt);
    const sig = obj(doc!.signature);
    const signer = obj(r.signer);
    const b = obj(r.billing);
    const att = obj(r.provider_attestation);
    const uncovered = typeof b.uncovered_halala === "number" && b.uncovered_halala > 0 ? b.uncovered_halala : 0;
    content = (
      <>
        <dl class="facts" data-testid="receipt">
          <dt>Receipt</dt><dd class="mono">{text(r.receipt_id)}</dd>
          <dt>Issued</dt><dd>{when(r.issued_at as string)}</dd>
          <dt>Signer key</dt>
          <dd>
            <span class="mono">{text(sig.key_id)}</span>
            {sig.key_id !== signer.key_id ? <span class="muted"> (signed again; issued under {text(signer.key_id)}, since revoked)</span> : null}
          </dd>
          <dt>Status</dt><dd>{text(r.status)}</dd>
          <dt>End reason</dt><dd>{text(r.end_reason)}</dd>
          <dt>Fault</dt><dd>{text(r.fault)}</dd>
          <dt>Held</dt><dd>{halala(b.held_halala)}</dd>
          <dt>Charged</dt><dd>{halala(b.charged_halala)}</dd>
          <dt>Provider's share</dt><dd>{halala(b.provider_share_halala)}</dd>
          <dt>Platform fee</dt><dd>{halala(b.platform_share_halala)}</dd>
          <dt>Refunded</dt><dd>{halala(b.refunded_halala)}</dd>
          <dt>Billed</dt><dd>{String(b.billed_minutes ?? "—")} min at {halala(b.rate_halala_per_minute)}/min</dd>
          {uncovered > 0 ? (
            <>
              <dt>Uncovered</dt><dd>{sar(uncovered)} <span class="muted">(billed minutes the renter's funds did not cover)</span></dd>
            </>
          ) : null}
          <dt>Provider attestation</dt><dd><AttestationFact att={att} /></dd>
          <dt>Task spec SHA-256</dt>
          <dd>{typeof r.task_spec_sha256 === "string" ? <Hash label="task spec hash" value={r.task_spec_sha256} /> : "—"}</dd>
          <dt>Output SHA-256</dt>
          <dd>{typeof r.output_sha256 === "string" ? <Hash label="output hash" value={r.output_sha256} /> : "none (no output stored)"}</dd>
        </dl>
        {check.check ? (
          <CheckResult check={check.check} jobId={jobId} />
        ) : check.error ? (
          <div class="receipt-check" role="status" data-testid="receipt-verification" data-verified="error">
            <ErrorBox error={`The signature could not be checked: ${check.error}`} />
            <button type="button" class="secondary" onClick={check.again}>Check again</button>
          </div>
        ) : (
          <p class="loading" aria-live="polite">Checking the signature…</p>
        )}
        {output.data ? (
          <OutputResult check={output.data} jobId={jobId} />
        ) : output.error ? (
          <div class="receipt-check" role="status" data-testid="receipt-output" data-output="error">
            <ErrorBox error={`The output could not be checked: ${output.error}`} />
            <button type="button" class="secondary" onClick={output.reload}>Check again</button>
          </div>
        ) : (
          <p class="loading" aria-live="polite">Checking the output…</p>
        )}
        {url ? <a class="button" href={url} download={`${jobId}.receipt.json`}>Download receipt</a> : null}
      </>
    );
  }
  return <Card title="Receipt">{content}</Card>;
}
