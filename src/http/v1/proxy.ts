// Proxies one chat completion to the serving endpoints, in the picker's order.
// Nothing reaches the client until an upstream has answered 200 and (when
// streaming) sent its first event, so any failure before that is retried on
// the next endpoint. A client disconnect or the request's deadline aborts the
// upstream call (`signal`).
import type { IncomingMessage } from "node:http";
import { addDelivered, deliveredText, type DeliveredText, type TokenCounts } from "../../domain/money/token-pricing.js";
import type { NodeResponse } from "../rest.js";
import type { EndpointPicker, Upstream } from "./endpoints.js";
import { V1Error } from "./errors.js";
import { MAX_SSE_EVENT_LENGTH, SseReader, sseEvent } from "./sse.js";
import { postJson, readAll } from "./upstream.js";
import { drained } from "../drained.js";

/** Largest non-streamed upstream answer accepted. */
const MAX_RESPONSE_BYTES = 32 * 1024 * 1024;
/**
 * Most bytes read from one streamed upstream answer (twice the non-streamed cap: every chunk repeats
 * the id, model and choice framing). Past it, or past one event of MAX_SSE_EVENT_LENGTH, the stream is
 * cut like one that broke off: failover when nothing was sent yet, else an error event.
 */
export const MAX_STREAM_BYTES = 2 * MAX_RESPONSE_BYTES;

export interface TokenUsage {
  promptTokens: number;
  completionTokens: number;
  /** Counted by the gateway because the upstream sent none. */
  estimated: boolean;
}

export interface ProxyRequest {
  upstreams: Upstream[];
  picker: EndpointPicker;
  /** The body sent upstream (stream_options.include_usage already set when streaming). */
  body: Record<string, unknown>;
  stream: boolean;
  /** The client asked for the usage chunk itself (stream_options.include_usage). */
  clientWantsUsage: boolean;
  /** Prompt tokens to assume if the upstream never reports usage. */
  promptTokensEstimate: number;
  /** The tokens billed of a reported usage, given the text delivered so far; the client's copy of `usage` shows these. */
  billedUsage: (reported: TokenCounts, delivered: DeliveredText) => TokenCounts;
  /** Longest wait for response headers, and between two streamed chunks. */
  timeoutMs: number;
  /** Aborted on client disconnect (reason "client_closed") or at the deadline (reason "deadline"). */
  signal: AbortSignal;
  maxAttempts: number;
  /** Connect to endpoints on private/loopback addresses (SVC_V1_PRIVATE_UPSTREAMS). */
  allowPrivate: boolean;
  /** Where a stream is written (non-streaming answers are sent by the caller). */
  res: NodeResponse;
  /** Headers for the client's response (request id). */
  headers: Record<string, string>;
  /** Told of each endpoint attempt that failed and moved on (metrics), with its error code. */
  onUpstreamError?: (code: string) => void;
}

export type ProxyResult =
  /** Non-streaming success: the caller settles, then sends `json`. */
  | { kind: "json"; upstream: Upstream; json: Record<string, unknown>; usage: TokenUsage; delivered: DeliveredText }
  /**
   * Streaming: the response was started and the upstream's events written. The caller settles,
   * then (when `error` says the stream broke off) writes the error event, and ends it.
   */
  | { kind: "streamed"; upstream: Upstream; usage: TokenUsage; delivered: DeliveredText; error?: V1Error }
  /** Nothing was sent; the caller answers with `error`. */
  | { kind: "failed"; error: V1Error };

type Attempt = ProxyResult | { kind: "retry"; error: V1Error };

const TIMEOUT = Symbol("upstream timeout");

function usageOf(json: unknown): { promptTokens: number; completionTokens: number } | undefined {
  const u = (json as { usage?: { prompt_tokens?: unknown; completion_tokens?: unknown } } | null)?.usage;
  if (!u || typeof u !== "object") return undefined;
  const p = Number(u.prompt_tokens);
  const c = Number(u.completion_tokens);
  if (!Number.isSafeInteger(p) || !Number.isSafeInteger(c) || p < 0 || c < 0) return undefined;
  return { promptTokens: p, completionTokens: c };
}

/** The upstream's usage object with the billed counts in place of the reported ones. */
function billedUsageJson(raw: unknown, billed: TokenCounts): Record<string, unknown> {
  return {
    ...(raw as Record<string, unknown>),
    prompt_tokens: billed.promptTokens,
    completion_tokens: billed.completionTokens,
    total_tokens: billed.promptTokens + billed.completionTokens,
  };
}

function upstreamMessage(text: string): string {
  try {
    const j = JSON.parse(text);
    const m = j?.error?.message ?? j?.message ?? j?.detail;
    if (typeof m === "string") return m.slice(0, 2000);
  } catch {}
  return text.slice(0, 500);
}

/** Tokens in a chunk's deltas, for the estimate when usage never comes: about one per content delta. */
function deltaTokens(chunk: Record<string, unknown>): number {
  const choices = Array.isArray(chunk.choices) ? (chunk.choices as { delta?: Record<string, unknown> }[]) : [];
  let n = 0;
  for (const c of choices) {
    const d = c?.delta ?? {};
    if ((typeof d.content === "string" && d.content) || (typeof d.reasoning_content === "string" && d.reasoning_content) || d.tool_calls) n++;
  }
  return n;
}

/**
 * Writes to the client, waiting out backpressure (or the client leaving), but
 * not past `signal`: a client that stops reading must not hold its request
 * open beyond the gateway's time limit, where it could outlive its price-cap
 * reservation and end unbilled.
 */
export async function write(res: NodeResponse, data: string, signal?: AbortSignal): Promise<void> {
  const out = res as unknown as NodeJS.EventEmitter & { destroyed?: boolean; write(d: string): boolean };
  if (out.destroyed || out.write(data) || signal?.aborted) return;
  if (!signal) return drained(out);
  let onAbort = () => {};
  const aborted = new Promise<void>((resolve) => {
    onAbort = () => resolve();
    signal.addEventListener("abort", onAbort, { once: true });
  });
  await Promise.race([drained(out), aborted]);
  signal.removeEventListener("abort", onAbort);
}

export async function proxyChatCompletion(p: ProxyRequest): Promise<ProxyResult> {
  let last: V1Error = new V1Error("no_capacity_available", `no endpoint is serving model "${String(p.body.model)}" right now`);
  for (const u of p.upstreams.slice(0, p.maxAttempts)) {
    if (p.signal.aborted) break;
    const release = p.picker.acquire(u);
    try {
      const r = await attempt(p, u);
      if (r.kind === "retry") {
        p.onUpstreamError?.(r.error.code);
        p.picker.failed(u);
        last = r.error;
        continue;
      }
      if (r.kind !== "failed") p.picker.succeeded(u);
      return r;
    } finally {
      release();
    }
  }
  if (p.signal.aborted) last = abortError(p.signal);
  return { kind: "failed", error: last };
}

function abortError(signal: AbortSignal): V1Error {
  return signal.reason === "deadline"
    ? new V1Error("upstream_timeout", "the request ran past the gateway's time limit")
    : new V1Error("invalid_request", "the client closed the connection", { status: 499 });
}

async function attempt(p: ProxyRequest, u: Upstream): Promise<Attempt> {
  const ctl = new AbortController();
  const onOuter = () => ctl.abort(p.signal.reason);
  p.signal.addEventListener("abort", onOuter, { once: true });
  let timer: NodeJS.Timeout | undefined;
  const arm = () => {
    clearTimeout(timer);
    timer = setTimeout(() => ctl.abort(TIMEOUT), p.timeoutMs);
  };
  const failure = (what: string): Attempt => {
    if (p.signal.aborted) return { kind: "failed", error: abortError(p.signal) };
    if (ctl.signal.reason === TIMEOUT) {
      return { kind: "retry", error: new V1Error("upstream_timeout", `the serving endpoint did not answer within ${p.timeoutMs} ms`) };
    }
    return { kind: "retry", error: new V1Error("provider_unavailable", `the serving endpoint failed: ${what}`) };
  };
  arm();
  try {
    let res: IncomingMessage;
    try {
      res = await postJson(u.url, JSON.stringify(p.body), {
        signal: ctl.signal,
        accept: p.stream ? "text/event-stream" : "application/json",
        allowPrivate: p.allowPrivate,
        apiKey: u.apiKey,
      });
    } catch (err) {
      return failure((err as Error).message);
    }
    const status = res.statusCode ?? 0;
    if (status < 200 || status > 299) {
      const text = await readAll(res, 64 * 1024).catch(() => "");
      // The model server refused the request itself (context too long, bad parameter): the client's to fix.
      if ([400, 413, 422].includes(status)) {
        return { kind: "failed", error: new V1Error("invalid_request", upstreamMessage(text) || `upstream refused the request (${status})`, { status: status === 413 ? 413 : 400 }) };
      }
      return failure(`HTTP ${status} ${upstreamMessage(text)}`.trim());
    }
    if (!p.stream) {
      let json: Record<string, unknown>;
      try {
        json = JSON.parse(await readAll(res, MAX_RESPONSE_BYTES)) as Record<string, unknown>;
      } catch (err) {
        return failure(`unreadable response (${(err as Error).message})`);
      }
      if (!json || typeof json !== "object" || !Array.isArray(json.choices)) return failure("response without choices");
      const usage = usageOf(json);
      const delivered = deliveredText(json.choices, "message");
      if (usage) json.usage = billedUsageJson(json.usage, p.billedUsage(usage, delivered));
      return {
        kind: "json",
        upstream: u,
        json,
        delivered,
        usage: usage
          ? { ...usage, estimated: false }
          : { promptTokens: p.promptTokensEstimate, completionTokens: estimateCompletion(json), estimated: true },
      };
    }
    return await relayStream(p, u, res, ctl, arm, () => clearTimeout(timer), failure);
  } finally {
    clearTimeout(timer);
    p.signal.removeEventListener("abort", onOuter);
  }
}

function estimateCompletion(json: Record<string, unknown>): number {
  const choices = (json.choices as { message?: { content?: unknown } }[]) ?? [];
  const chars = choices.reduce((n, c) => n + (typeof c?.message?.content === "string" ? c.message.content.length : 0), 0);
  return Math.ceil(chars / 4);
}

async function relayStream(
  p: ProxyRequest,
  u: Upstream,
  upstream: IncomingMessage,
  ctl: AbortController,
  arm: () => void,
  disarm: () => void,
  failure: (what: string) => Attempt,
): Promise<Attempt> {
  const reader = (upstream as AsyncIterable<Buffer>)[Symbol.asyncIterator]();
  const sse = new SseReader();
  let started = false;
  let finished = false;
  let usage: { promptTokens: number; completionTokens: number } | undefined;
  let counted = 0;
  /** Bytes read from the upstream so far (MAX_STREAM_BYTES). */
  let received = 0;
  let out: string[] = [];
  // Without include_usage from the client, finishing chunks wait for the usage chunk and carry its usage.
  let held: Record<string, unknown>[] = [];
  /** Generated text written to the client: what the completion tokens are bounded by. */
  let delivered: DeliveredText = { bytes: 0, toolCalls: 0 };
  const emit = (chunk: Record<string, unknown>) => {
    delivered = addDelivered(delivered, deliveredText(chunk.choices, "delta"));
    const reported = usageOf(chunk);
    if (reported) chunk.usage = billedUsageJson(chunk.usage, p.billedUsage(reported, delivered));
    out.push(sseEvent(JSON.stringify(chunk)));
  };
  const flushHeld = () => {
    held.forEach(emit);
    held = [];
  };

  /** Takes one upstream event; returns an error when the upstream reported one. */
  const take = (data: string): V1Error | undefined => {
    if (data === "[DONE]") {
      flushHeld();
      out.push(sseEvent("[DONE]"));
      finished = true;
      return undefined;
    }
    let chunk: Record<string, unknown>;
    try {
      chunk = JSON.parse(data);
    } catch {
      return new V1Error("provider_unavailable", "the serving endpoint sent an unreadable event");
    }
    if (!chunk || typeof chunk !== "object") return new V1Error("provider_unavailable", "the serving endpoint sent an unreadable event");
    if (chunk.error) return new V1Error("provider_unavailable", `the serving endpoint failed: ${upstreamMessage(data)}`);
    const reported = usageOf(chunk);
    if (reported) usage = reported;
    counted += deltaTokens(chunk);
    const choices = Array.isArray(chunk.choices) ? (chunk.choices as { finish_reason?: unknown }[]) : [];
    if (choices.length === 0 && reported) {
      if (p.clientWantsUsage) {
        flushHeld();
        emit(chunk);
      } else if (held.length > 0) {
        held[held.length - 1].usage = chunk.usage;
        flushHeld();
      }
      return undefined;
    }
    if (!p.clientWantsUsage && choices.some((c) => c?.finish_reason != null)) {
      held.push(chunk);
      return undefined;
    }
    emit(chunk);
    return undefined;
  };

  let error: V1Error | undefined;
  try {
    while (!finished && !error) {
      let r: IteratorResult<Buffer>;
      arm(); // the idle limit counts while waiting on the upstream, not while the client drains
      try {
        r = await reader.next();
      } catch (err) {
        if (!started) return failure((err as Error).message);
        const f = failure("the stream broke off");
        error = f.kind === "retry" || f.kind === "failed" ? f.error : undefined;
        break;
      }
      disarm();
      if (!r.done) received += r.value.length;
      if (received > MAX_STREAM_BYTES) {
        error = new V1Error("provider_unavailable", `the serving endpoint's stream exceeded ${MAX_STREAM_BYTES} bytes`);
      } else {
        const events = r.done ? sse.end() : sse.push(r.value);
        for (const data of events) {
          error = take(data);
          if (error || finished) break;
        }
        if (!error && !finished && sse.overflowed) {
          error = new V1Error("provider_unavailable", `the serving endpoint sent an event longer than ${MAX_SSE_EVENT_LENGTH} characters`);
        }
        if (r.done && !finished && !error) error = new V1Error("provider_unavailable", "the serving endpoint ended the stream early");
      }
      if (!started && error) return { kind: "retry", error };
      if (out.length > 0) {
        if (!started) {
          started = true;
          p.res.writeHead(200, {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",
            ...p.headers,
          });
        }
        const batch = out.join("");
        out = [];
        await write(p.res, batch, p.signal);
      }
    }
  } finally {
    if (finished) {
      upstream.resume(); // drain what follows [DONE] so the connection can be reused
    } else {
      // Closing the connection is how vLLM learns to stop generating.
      ctl.abort();
      upstream.destroy();
    }
  }
  return {
    kind: "streamed",
    upstream: u,
    delivered,
    usage: usage ? { ...usage, estimated: false } : { promptTokens: p.promptTokensEstimate, completionTokens: counted, estimated: true },
    error,
  };
}
