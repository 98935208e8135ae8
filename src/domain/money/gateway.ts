// The card gateway client (Moyasar-style API). A top-up becomes a hosted
// invoice: POST {PAYMENT_GATEWAY_URL}/v1/invoices with HTTP basic auth (the
// secret key as user name, empty password); the answer's `url` is the
// checkout page the renter is sent to. The outcome arrives later on
// POST /api/payments/webhook.
import { apiError } from "../../errors.js";

export interface GatewayConfig {
  url: string;
  secretKey: string;
  timeoutMs?: number;
}

export interface InvoiceRequest {
  amountHalala: number;
  description: string;
  /** Where the gateway sends the renter after paying, and notifies the frontend. */
  callbackUrl: string;
  successUrl: string;
  backUrl: string;
  metadata: Record<string, string>;
}

export interface Invoice {
  id: string;
  status: string;
  url: string;
  amount: number;
  currency: string;
}

export function basicAuth(secretKey: string): string {
  return "Basic " + Buffer.from(`${secretKey}:`).toString("base64");
}

/** Creates a hosted invoice. Gateway trouble is a 502 with what the gateway said (never the key). */
export async function createInvoice(cfg: GatewayConfig, req: InvoiceRequest): Promise<Invoice> {
  let res: Response;
  try {
    res = await fetch(`${cfg.url}/v1/invoices`, {
      method: "POST",
      headers: { authorization: basicAuth(cfg.secretKey), "content-type": "application/json", accept: "application/json" },
      body: JSON.stringify({
        amount: req.amountHalala,
        currency: "SAR",
        description: req.description,
        callback_url: req.callbackUrl,
        success_url: req.successUrl,
        back_url: req.backUrl,
        metadata: req.metadata,
      }),
      redirect: "error",
      signal: AbortSignal.timeout(cfg.timeoutMs ?? 15_000),
    });
  } catch (err) {
    throw apiError(502, `payment gateway unreachable: ${(err as Error).name === "TimeoutError" ? "timed out" : (err as Error).message}`);
  }
  const text = await res.text();
  let body: Record<string, unknown> = {};
  try {
    body = JSON.parse(text);
  } catch {
    // handled below
  }
  if (!res.ok) {
    const detail = typeof body.message === "string" ? body.message : `HTTP ${res.status}`;
    if (res.status === 401 || res.status === 403) throw apiError(502, `payment gateway rejected our credentials (${detail})`);
    throw apiError(502, `payment gateway refused the invoice: ${detail}`);
  }
  const { id, url, status, amount, currency } = body;
  if (typeof id !== "string" || typeof url !== "string") throw apiError(502, "payment gateway answered without an invoice id and url");
  if (amount !== undefined && amount !== req.amountHalala) throw apiError(502, `payment gateway created an invoice for ${amount}, not ${req.amountHalala}`);
  return { id, url, status: typeof status === "string" ? status : "initiated", amount: req.amountHalala, currency: typeof currency === "string" ? currency : "SAR" };
}
