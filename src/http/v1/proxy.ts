// Proxies one chat completion to the serving endpoints, in the picker's order.
// Every endpoint is asked for a stream with usage on every chunk
// (stream_options include_usage and continuous_usage_stats), also for a client
// that wants one JSON answer: the gateway builds that answer from the chunks
// (assemble.ts). So the idle limit (`timeoutMs`) counts between events, never
// over a whole generation, and what an endpoint did is known when it stops.
// An endpoint that fails before its first event (no answer, an error status, a
// stream that ends, drops or stalls first) is left for the next one; from its
// first event on the request is that endpoint's: never tried elsewhere, and
// settled for the usage it reported within what was delivered. An endpoint that
// refuses the request (400, 413, 422: the client's to fix, if the model server
// is right) gets a second opinion from the next endpoint: if that one serves
// it, the first refused wrongly and rests; if it refuses too, the client gets
// the refusal. A client disconnect, the request's deadline or the revocation of
// its key aborts the upstream call (`signal`).
import type { IncomingMessage } from "node:http";
import { deliveredText, StreamedText, type DeliveredText, type TokenCounts } from "../../domain/money/token-pricing.js";
import type { NodeResponse } from "../rest.js";
import { CompletionBuilder, UsageTracker, usageOf } from "./assemble.js";
import type { EndpointPicker, Upstream } from "./endpoints.js";
import { V1Error } from "./errors.js";
import { jsonDepthExceeds, MAX_JSON_DEPTH } from "../json-depth.js";
import { MAX_SSE_EVENT_LENGTH, SseReader, sseEvent } from "./sse.js";
import { postJson, readAll } from "./upstream.js";
import { drained } from "../drained.js";

/** Largest JSON answer the gateway builds for a non-streaming client; past it the answer is cut there (finish_reason "length"). */
export const MAX_RESPONSE_BYTES = 32 * 1024 * 1024;
/**
 * Most bytes read from one streamed upstream answer (twice the non-streamed cap: every chunk repeats
 * the id, model and choice framing). Past it, or past one event of MAX_SSE_EVENT_LENGTH, the stream is
 * cut like one that broke off: failover when nothing was sent yet, else an error event. (For a
 * non-streaming client, past it the answer is cut as at MAX_RESPONSE_BYTES.)
 */
export const MAX_STREAM_BYTES = 2 * MAX_RESPONSE_BYTES;

export interface TokenUsage {
  promptTokens: number;
  completionTokens: number;
  /** Counted by the gateway because the upstream sent none. */
  estimated: boolean;
}

/** Why a non-streaming client's answer was cut short by the gateway (header x-svc-truncated). */
export type Truncation = "response_too_large" | "deadline";

export interface ProxyRequest {
  upstreams: Upstream[];
  picker: EndpointPicker;
  /** The body sent upstream: always `stream: true`, with stream_options include_usage and continuous_usage_stats. */
  body: Record<string, unknown>;
  /** The client asked for a stream (else it gets one JSON answer). */
  stream: boolean;
  /** The client asked for the usage chunk itself (stream_options.include_usage). */
  clientWantsUsage: boolean;
  /** The client asked for usage on every chunk (stream_options.continuous_usage_stats); else the chunks' usage is not relayed. */
  clientWantsContinuousUsage: boolean;
  /** The choices asked for (n): the answer is whole once each has its finish_reason. */
  choices: number;
  /** Prompt tokens to assume if the upstream never reports usage. */
  promptTokensEstimate: number;
  /** The tokens billed of a reported usage, given the text delivered so far; the client's copy of `usage` shows these. */
  billedUsage: (reported: TokenCounts, delivered: DeliveredText) => TokenCounts;
  /** Longest wait for response headers, for the first event, and between two events (bytes that complete none do not count). */
  timeoutMs: number;
  /**
   * Aborted on client disconnect (reason "client_closed"), at the deadline (reason "deadline"), or
   * with the V1Error to answer (the key that authenticated the request was revoked).
   */
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
  /**
   * Non-streaming success: the caller settles, then sends `json`. `truncated`: the gateway cut the
   * answer (its size cap, the request's deadline); the choices it cut end with finish_reason "length".
   */
  | { kind: "json"; upstream: Upstream; json: Record<string, unknown>; usage: TokenUsage; delivered: DeliveredText; truncated?: Truncation }
  /**
   * Streaming: the response was started and the upstream's events written. The caller settles,
   * then (when `error` says the stream broke off) writes the error event, and ends it.
   */
  | { kind: "streamed"; upstream: Upstream; usage: TokenUsage; delivered: DeliveredText; error?: V1Error }
  /**
   * The endpoint had sent its first event, then failed (or the client left) before anything was
   * sent to the client: not retried elsewhere; the caller settles, then answers with `error`.
   */
  | { kind: "broken"; upstream: Upstream; usage: TokenUsage; delivered: DeliveredText; error: V1Error }
  /** Nothing was sent and nothing started; the caller releases the reservation and answers with `error`. */
  | { kind: "failed"; error: V1Error };

type Attempt =
  | ProxyResult
  /** The endpoint failed before its first event: the next one is asked. */
  | { kind: "retry"; error: V1Error }
  /** The endpoint refused the request (400, 413, 422) before its first event. */
  | { kind: "refused"; error: V1Error };

const TIMEOUT = Symbol("upstream timeout");

/** The upstream's usage object with the billed counts in place of the reported ones. */
function billedUsageJson(raw: unknown, billed: TokenCounts): Record<string, unknown> {
  return {
    ...(raw as Record<string, unknown>),
    prompt_tokens: billed.promptTokens,
    completion_tokens: billed.completionTokens,
    total_tokens: billed.promptTokens + billed.completionTokens,
  };
}

/**
 * What a renter is told of a connection to an endpoint that failed: the error's code, never its
 * message, which names the provider's address ("connect ECONNREFUSED 203.0.113.7:8000"), and a
 * public endpoint serves renters who have no business knowing where the provider's machine is.
 */
function connectionFailure(err: unknown): string {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (typeof code === "string" && /^[A-Z0-9_]{1,40}$/.test(code)) return `connection failed (${code})`;
  // The refusal of a private address (upstream.ts, address.ts) names the host as well.
  if (/private address/.test(String((err as Error | undefined)?.message))) return "the endpoint's host is a private address, which this server does not connect to";
  return "connection failed";
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
  /** The first endpoint that refused the request, waiting for the next one's opinion. */
  let refusal: { u: Upstream; error: V1Error } | undefined;
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
      if (r.kind === "refused") {
        // Refused by two: the request's own fault, answered as the model server put it.
        if (refusal) return { kind: "failed", error: refusal.error };
        refusal = { u, error: r.error };
        continue;
      }
      if (r.kind !== "failed") {
        // One that failed after its first event (dropped, stalled, sent what cannot be read) is not tried
        // elsewhere, but rests as one that failed before it: failing fast, it would have the fewest requests
        // in flight and draw the most. The client leaving, the deadline or a revoked key is no fault of it.
        const brokeOff = (r.kind === "broken" || (r.kind === "streamed" && r.error !== undefined)) && !p.signal.aborted;
        if (brokeOff) p.picker.failed(u);
        else p.picker.succeeded(u);
        // Another endpoint served what the first refused: that one refuses wrongly (a broken engine, another model).
        if (refusal) {
          p.onUpstreamError?.("upstream_refused");
          p.picker.failed(refusal.u);
        }
      }
      return r;
    } finally {
      release();
    }
  }
  if (p.signal.aborted) return { kind: "failed", error: abortError(p.signal) };
  // No other endpoint gave an opinion: the refusal is the only answer there is.
  return { kind: "failed", error: refusal?.error ?? last };
}

function abortError(signal: AbortSignal): V1Error {
  if (signal.reason instanceof V1Error) return signal.reason;
  return signal.reason === "deadline"
    ? new V1Error("upstream_timeout", "the request ran past the gateway's time limit")
    : new V1Error("invalid_request", "the client closed the connection", { status: 499 });
}

async function attempt(p: ProxyRequest, u: Upstream): Promise<Attempt> {
  const ctl = new AbortController();
  const onOuter = () => ctl.abort(p.signal.reason);
  p.signal.addEventListener("abort", onOuter, { once: true });
  let timer: NodeJS.Timeout | undefined;
  const arm = (ms = p.timeoutMs) => {
    clearTimeout(timer);
    timer = setTimeout(() => ctl.abort(TIMEOUT), ms);
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
        accept: "text/event-stream",
        allowPrivate: p.allowPrivate,
        apiKey: u.apiKey,
      });
    } catch (err) {
      return failure(connectionFailure(err));
    }
    const status = res.statusCode ?? 0;
    if (status < 200 || status > 299) {
      const text = await readAll(res, 64 * 1024).catch(() => "");
      // The model server refused the request itself (context too long, bad parameter): the client's to fix.
      if ([400, 413, 422].includes(status)) {
        return { kind: "refused", error: new V1Error("invalid_request", upstreamMessage(text) || `upstream refused the request (${status})`, { status: status === 413 ? 413 : 400 }) };
      }
      return failure(`HTTP ${status} ${upstreamMessage(text)}`.trim());
    }
    return await readStream(p, u, res, ctl, arm, () => clearTimeout(timer), failure);
  } finally {
    clearTimeout(timer);
    p.signal.removeEventListener("abort", onOuter);
  }
}

/** How long an endpoint may take after [DONE] to end its response, and how much it may send meanwhile. */
export const AFTER_DONE_MS = 2_000;
const AFTER_DONE_BYTES = 64 * 1024;

/**
 * After [DONE]: the endpoint's response is read to its end (what comes is dropped), so that its connection
 * goes back to the agent for the next request; vLLM's server ends it in a write of its own, after the event.
 * One that has not ended it within AFTER_DONE_MS, or sends more than AFTER_DONE_BYTES, is hung up on: its
 * connection would otherwise stay open, neither read nor reused, for as long as the endpoint kept it, one
 * for every request.
 */
async function afterDone(upstream: IncomingMessage, reader: AsyncIterator<Buffer>): Promise<void> {
  await reader.return?.(); // the reader lets go of the response (no longer paused under it), which stays open
  if (upstream.readableEnded) return;
  let left = AFTER_DONE_BYTES;
  const hangUp = () => upstream.destroy();
  const timer = setTimeout(hangUp, AFTER_DONE_MS).unref();
  const onData = (c: Buffer) => {
    left -= c.length;
    if (left < 0) hangUp();
  };
  const done = () => {
    clearTimeout(timer);
    upstream.off("data", onData);
  };
  upstream.on("data", onData);
  upstream.once("end", done);
  upstream.once("close", done);
  upstream.resume();
}

/**
 * Reads an endpoint's stream: relays it to a streaming client (events written as they come,
 * backpressure minded) or builds the JSON answer of a non-streaming one.
 */
async function readStream(
  p: ProxyRequest,
  u: Upstream,
  upstream: IncomingMessage,
  ctl: AbortController,
  arm: (ms: number) => void,
  disarm: () => void,
  failure: (what: string) => Attempt,
): Promise<Attempt> {
  // Stopped without destroying the response after [DONE], so that what follows it can be read (afterDone).
  const reader = upstream.iterator({ destroyOnReturn: false }) as AsyncIterator<Buffer>;
  const sse = new SseReader();
  /** The endpoint sent its first well-formed event: from here on the request is its own (no failover). */
  let committed = false;
  /** The client's response was started (streaming). */
  let started = false;
  let finished = false;
  /** Indexes of the choices that have their finish_reason. */
  const finishedChoices = new Set<number>();
  /**
   * The answer was whole when the stream broke (before its usage chunk or [DONE]): answered as a finished one, since
   * the client has all it asked for and the usage of the last chunk. The connection, broken, is not reused.
   */
  let lostEnd = false;
  const usage = new UsageTracker();
  let counted = 0;
  /** Bytes read from the upstream so far (MAX_STREAM_BYTES). */
  let received = 0;
  let out: string[] = [];
  // Without include_usage from the client, finishing chunks wait for the usage chunk and carry its usage.
  let held: Record<string, unknown>[] = [];
  /** Generated text written to the client: what the completion tokens are bounded by. */
  const streamed = new StreamedText();
  /** The answer of a non-streaming client. */
  const answer = p.stream ? undefined : new CompletionBuilder(MAX_RESPONSE_BYTES);
  /** The non-streaming answer outgrew its cap (MAX_RESPONSE_BYTES, MAX_STREAM_BYTES): cut there. */
  let overflowed = false;

  const emit = (chunk: Record<string, unknown>) => {
    streamed.add(chunk.choices);
    const reported = usageOf(chunk);
    if (reported) chunk.usage = billedUsageJson(reported.raw, p.billedUsage(reported, streamed.delivered));
    out.push(sseEvent(JSON.stringify(chunk)));
  };
  /**
   * The usage the request is billed by, before its bounds (emit applies them): the last the endpoint reported, or
   * the gateway's estimate when it reported none (TokenUsage.estimated).
   */
  const lastUsage = (): Record<string, unknown> => {
    const reported = usage.get();
    if (!reported) return { prompt_tokens: p.promptTokensEstimate, completion_tokens: counted, total_tokens: p.promptTokensEstimate + counted };
    return { ...reported.raw, prompt_tokens: reported.promptTokens, completion_tokens: reported.completionTokens, total_tokens: reported.promptTokens + reported.completionTokens };
  };
  /** Id, created and model of the endpoint's first chunk: a usage chunk the gateway writes itself carries them. */
  let head: Record<string, unknown> | undefined;
  /** The client asked for the usage chunk and was sent one. */
  let usageChunkSent = false;
  const flushHeld = () => {
    const lastHeld = held.at(-1);
    // The usage chunk never came: the finishing chunk carries the last usage (flushed only at the usage chunk or the end).
    if (lastHeld && !usageOf(lastHeld)) lastHeld.usage = lastUsage();
    held.forEach(emit);
    held = [];
  };

  /** The stream's end as the client sees it: the held finishing chunks, the usage chunk if asked for, [DONE]. */
  const endStream = () => {
    flushHeld();
    // The endpoint sent no usage chunk (it reported usage only on its chunks, or none): a client that asked for one gets it.
    if (p.clientWantsUsage && !usageChunkSent) emit({ ...head, object: "chat.completion.chunk", choices: [], usage: lastUsage() });
    out.push(sseEvent("[DONE]"));
  };

  /** Takes one upstream event; returns an error when the upstream reported one. */
  const take = (data: string): V1Error | undefined => {
    if (data === "[DONE]") {
      // A stream that ends before its first event failed, [DONE] or not: the next endpoint is asked.
      if (!committed) return new V1Error("provider_unavailable", "the serving endpoint ended the stream before its first event");
      if (!answer) endStream();
      finished = true;
      return undefined;
    }
    let chunk: Record<string, unknown>;
    try {
      chunk = JSON.parse(data);
    } catch {
      return new V1Error("provider_unavailable", "the serving endpoint sent an unreadable event");
    }
    // A chunk is a JSON object: anything else (an array, a string, a number) is as unreadable as broken JSON.
    if (!chunk || typeof chunk !== "object" || Array.isArray(chunk)) return new V1Error("provider_unavailable", "the serving endpoint sent an unreadable event");
    // Before anything walks it (the answer's assembly, JSON.stringify), which a deep enough nesting would overflow.
    if (jsonDepthExceeds(chunk)) return new V1Error("provider_unavailable", `the serving endpoint sent an event nested deeper than ${MAX_JSON_DEPTH} levels`);
    if (chunk.error) return new V1Error("provider_unavailable", `the serving endpoint failed: ${upstreamMessage(data)}`);
    committed = true;
    head ??= { id: chunk.id, created: chunk.created, model: chunk.model };
    const reported = usageOf(chunk);
    usage.see(chunk, reported);
    counted += deltaTokens(chunk);
    const choices = Array.isArray(chunk.choices) ? (chunk.choices as { index?: unknown; finish_reason?: unknown }[]) : [];
    for (const c of choices) {
      if (c?.finish_reason != null && Number.isInteger(c.index) && (c.index as number) >= 0 && (c.index as number) < p.choices) finishedChoices.add(c.index as number);
    }
    if (answer) {
      if (choices.length > 0 && !answer.add(chunk)) overflowed = true;
      return undefined;
    }
    if (choices.length === 0 && reported) {
      if (p.clientWantsUsage) {
        flushHeld();
        emit(chunk);
        usageChunkSent = true;
      } else if (held.length > 0) {
        held[held.length - 1].usage = chunk.usage;
        flushHeld();
      }
      return undefined;
    }
    // Usage on every chunk is the gateway's (continuous_usage_stats, for billing a cut stream): relayed only when asked for.
    if (!p.clientWantsContinuousUsage && choices.length > 0) delete chunk.usage;
    if (!p.clientWantsUsage && choices.some((c) => c?.finish_reason != null)) {
      held.push(chunk);
      return undefined;
    }
    emit(chunk);
    return undefined;
  };

  /** Writes what is ready for a streaming client, starting the response at the first write. */
  const send = async () => {
    if (out.length === 0) return;
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
  };

  let error: V1Error | undefined;
  /**
   * What is left of the idle limit: it counts while waiting on the upstream (not while the client drains), from
   * the headers or the last event on. Bytes that complete no event (SSE comments, keep-alive pings) leave it running.
   */
  let idleLeft = p.timeoutMs;
  try {
    while (!finished && !error && !overflowed) {
      let r: IteratorResult<Buffer>;
      const waitedFrom = performance.now();
      arm(idleLeft);
      try {
        r = await reader.next();
      } catch (err) {
        if (!committed) return failure(connectionFailure(err));
        const f = failure("the stream broke off");
        error = f.kind === "retry" || f.kind === "failed" ? f.error : undefined;
        break;
      }
      disarm();
      idleLeft -= performance.now() - waitedFrom;
      if (!r.done) received += r.value.length;
      if (received > MAX_STREAM_BYTES) {
        if (answer && committed) overflowed = true;
        else error = new V1Error("provider_unavailable", `the serving endpoint's stream exceeded ${MAX_STREAM_BYTES} bytes`);
      } else {
        const events = r.done ? sse.end() : sse.push(r.value);
        if (events.length > 0) idleLeft = p.timeoutMs;
        for (const data of events) {
          try {
            error = take(data);
          } catch (err) {
            // Whatever an event makes the gateway throw, the request ends as for any failure of the endpoint:
            // tried elsewhere before its first event, settled for what was delivered after.
            error = new V1Error("provider_unavailable", `the serving endpoint sent an event the gateway could not process: ${(err as Error).message}`);
          }
          if (error || finished || overflowed) break;
        }
        if (!error && !finished && !overflowed && sse.overflowed) {
          error = new V1Error("provider_unavailable", `the serving endpoint sent an event longer than ${MAX_SSE_EVENT_LENGTH} characters`);
        }
        if (r.done && !finished && !error && !overflowed) error = new V1Error("provider_unavailable", "the serving endpoint ended the stream early");
      }
      if (!committed && error) return { kind: "retry", error };
      await send();
    }
    if (error && committed && !overflowed && !p.signal.aborted) {
      if (finishedChoices.size >= p.choices) {
        // Only the answer's end was lost (its usage chunk, [DONE]): what the client asked for has all come.
        if (!answer) endStream();
        error = undefined;
        finished = lostEnd = true;
      } else if (!answer) {
        // Broken off: the finishing chunks held for the usage chunk are text the client is owed (and billed for).
        flushHeld();
      }
      await send();
    }
  } finally {
    if (finished && !lostEnd) {
      await afterDone(upstream, reader);
    } else {
      // Closing the connection is how vLLM learns to stop generating.
      ctl.abort();
      upstream.destroy();
    }
  }
  const reported = usage.get();
  const tokens = (): TokenUsage =>
    reported
      ? { promptTokens: reported.promptTokens, completionTokens: reported.completionTokens, estimated: false }
      : { promptTokens: p.promptTokensEstimate, completionTokens: counted, estimated: true };

  if (answer) {
    // A generation the gateway's own limits cut (the answer's size, the request's deadline) is answered
    // with what was generated, as max_tokens would have cut it, and billed; any other break is an error.
    const truncated: Truncation | undefined = overflowed ? "response_too_large" : error && p.signal.reason === "deadline" ? "deadline" : undefined;
    if ((finished || truncated) && !answer.empty) {
      const json = answer.build({ finishAs: truncated ? "length" : undefined });
      const shown = deliveredText(json.choices, "message");
      const billed = tokens();
      json.usage = billedUsageJson(reported?.raw ?? {}, p.billedUsage(billed, shown));
      return { kind: "json", upstream: u, json, delivered: shown, usage: billed, ...(truncated ? { truncated } : {}) };
    }
    error ??= new V1Error("provider_unavailable", "the serving endpoint's answer had no choices");
    return { kind: "broken", upstream: u, usage: tokens(), delivered: { bytes: 0, toolCalls: 0 }, error };
  }
  if (!started) {
    // Started, then failed before anything could be written (its only chunks were held): an error answer, settled.
    return { kind: "broken", upstream: u, usage: tokens(), delivered: streamed.delivered, error: error ?? new V1Error("provider_unavailable", "the serving endpoint ended the stream early") };
  }
  return { kind: "streamed", upstream: u, delivered: streamed.delivered, usage: tokens(), error };
}
