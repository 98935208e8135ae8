// The OpenAI-compatible /v1 group: plain Node handlers beside the Connect
// router (DESIGN §2), with renter-key auth, a per-renter rate limit, the /v1
// error envelope, token billing through the ledger, and the proxy to managed
// vLLM endpoints.
//   GET  /v1/models               models served right now (plus SVC_V1_MODELS)
//   GET  /v1/models/{model}       one of them
//   POST /v1/chat/completions     OpenAI chat completions, JSON or SSE
//   GET  /v1/usage                the renter's running token and cost totals
// Failed authentication (no key, an invalid one, a suspended renter's) counts against the client IP
// on the rate-limit table's default row, as a failed /api call does; an
// address over it is refused before its key is looked up. A chat completion
// is registered with the open streams (domain/accounts/open-streams.ts) while
// it runs: revoking the key that authenticated it (rotation, suspension) aborts
// it as a client disconnect would, and what was delivered until then is billed.
import crypto from "node:crypto";
import type { Config } from "../../config.js";
import type { Sql } from "../../db/index.js";
import { LLM_MODELS } from "../../domain/jobs/job-schemas.js";
import { roleOfKey } from "../../domain/accounts/keys.js";
import { cachedLookupKey, keyHashOf } from "../../domain/accounts/key-cache.js";
import { watchRevocation } from "../../domain/accounts/open-streams.js";
import { renterFunds } from "../../domain/money/ledger.js";
import { halalaToSar } from "../../domain/money/pricing.js";
import {
  billableTokens,
  completionTokensBound,
  promptTokensBound,
  mayGenerateSpecialTokens,
  specialTokenFieldsInvalid,
  unboundedCompletion,
  unboundedPrompt,
  TOKEN_RATES,
  tokenCostMicro,
  tokenRate,
  type DeliveredText,
  type TokenCounts,
} from "../../domain/money/token-pricing.js";
import { chargeTokenUsage, releaseTokenBudget, reserveTokenBudget, usageTotals } from "../../domain/money/usage-billing.js";
import { maskSecrets, type Logger } from "../../log.js";
import type { Metrics } from "../../metrics/metrics.js";
import { readBody } from "../body.js";
import { credentialsFromHeaders } from "../credentials.js";
import type { NodeRequest, NodeResponse } from "../rest.js";
import { clientIpOf } from "../rest.js";
import type { RateLimits } from "../rate-limits.js";
import { toHttpError } from "../errors.js";
import { EndpointPicker, endpointsFor, servingEndpoints, type Upstream } from "./endpoints.js";
import { envelope, sendV1Error, toV1Error, v1Error, V1Error } from "./errors.js";
import { JsonDepthMeter, MAX_JSON_DEPTH, tooDeepMessage } from "../json-depth.js";
import { createV1Limiter } from "./limits.js";
import { proxyChatCompletion, write, type TokenUsage } from "./proxy.js";
import { sseEvent } from "./sse.js";

export interface V1Deps {
  config: Config;
  sql: Sql;
  log: Logger;
  metrics?: Metrics;
  /** The rate-limit table (off: undefined): failed authentication counts per client IP on its default row. */
  rateLimits?: Pick<RateLimits, "check" | "refuseIfOver">;
}

/** The rate-limit table's row that failed /v1 authentication counts on, per client IP (as failed /api calls do). */
const FAILED_AUTH_ROW = "default";
/** Failed authentication: no key, an invalid one, or a suspended renter's (as on /api, where each counts per client IP). */
const FAILED_AUTH_CODES = new Set(["missing_api_key", "invalid_api_key", "account_suspended"]);

/** The route label of a /v1 request in the metrics (unknown paths: "other"). */
const V1_ROUTE_LABELS = { chat: "POST /v1/chat/completions", models: "GET /v1/models", model: "GET /v1/models/{model}", usage: "GET /v1/usage" } as const;

/** Chat requests carry whole conversations (and images as data URLs): a larger limit than /api. */
const BODY_LIMIT_BYTES = 4 * 1024 * 1024;
/** Endpoints tried for one request before giving up (each failure before the first byte moves on). */
const MAX_ATTEMPTS = 3;

interface Call {
  req: NodeRequest;
  res: NodeResponse;
  url: URL;
  requestId: string;
  headers: Record<string, string>;
  log: Record<string, unknown>;
  /**
   * Aborted with "client_closed" when the client goes away (watched from the start), "deadline", or
   * the V1Error to answer when the key that authenticated the call is revoked.
   */
  abort: AbortController;
}

function sendJson(call: Call, status: number, body: unknown, extra: Record<string, string> = {}) {
  const data = JSON.stringify(body);
  call.res.writeHead(status, { "content-type": "application/json; charset=utf-8", "content-length": Buffer.byteLength(data), ...call.headers, ...extra });
  call.res.end(data);
}

/** The call was aborted because the key that authenticated it was revoked (not a fault of the endpoint). */
const revoked = (call: Call) => call.abort.signal.reason instanceof V1Error;

const isInt = (v: unknown, min: number, max: number) => Number.isSafeInteger(v) && (v as number) >= min && (v as number) <= max;

interface Authenticated {
  renterId: number;
  key: string;
  /** keyHashOf(key): how the open streams know the key. */
  keyHash: string;
}

interface ChatRequest {
  body: Record<string, unknown>;
  model: string;
  /** The request lets the model call tools (or functions): only then can an answer's tool calls be the model's. */
  tools: boolean;
  stream: boolean;
  clientWantsUsage: boolean;
  clientWantsContinuousUsage: boolean;
  maxTokens?: number;
  choices: number;
}

/** Checks the fields the gateway itself relies on; everything else is the model server's to judge. */
function parseChatRequest(raw: Buffer): ChatRequest {
  // The body is walked and serialized (its prompt's bound, the request forwarded): a deep enough nesting overflows
  // the stack, and a deep enough text holds the parser for seconds. Measured before it is parsed (json-depth.ts),
  // and refused naming the top-level member that nests too deep, as /api does.
  const depth = new JsonDepthMeter(MAX_JSON_DEPTH);
  if (depth.exceeds(raw)) throw v1Error("invalid_request", tooDeepMessage("request body", depth.member()));
  let body: unknown;
  try {
    body = JSON.parse(raw.toString("utf8"));
  } catch {
    throw v1Error("invalid_request", "request body must be JSON");
  }
  if (!body || typeof body !== "object" || Array.isArray(body)) throw v1Error("invalid_request", "request body must be a JSON object");
  const b = body as Record<string, unknown>;
  const missing = ["model", "messages"].filter((f) => b[f] === undefined || b[f] === null || b[f] === "");
  if (missing.length) throw v1Error("invalid_request", `missing required field(s): ${missing.join(", ")}`);
  // The model is looked up and recorded: PostgreSQL text cannot hold U+0000.
  if (typeof b.model !== "string" || b.model.length > 256 || b.model.includes("\0")) {
    throw v1Error("invalid_request", "model must be a string (at most 256 characters, no NUL)");
  }
  if (!Array.isArray(b.messages) || b.messages.length === 0) throw v1Error("invalid_request", "messages must be a non-empty array");
  if (b.stream !== undefined && b.stream !== null && typeof b.stream !== "boolean") throw v1Error("invalid_request", "stream must be a boolean");
  for (const f of ["max_tokens", "max_completion_tokens"]) {
    if (b[f] !== undefined && b[f] !== null && !isInt(b[f], 1, 10_000_000)) throw v1Error("invalid_request", `${f} must be a positive integer`);
  }
  if (b.n !== undefined && b.n !== null && !isInt(b.n, 1, 16)) throw v1Error("invalid_request", "n must be an integer from 1 to 16");
  // vLLM generates best_of sequences and returns the best n: its usage, the delivered text that bounds
  // the bill and the price cap all count the n returned, so the rest would be GPU time nobody pays for.
  const n = typeof b.n === "number" ? b.n : 1;
  if (b.best_of !== undefined && b.best_of !== null && b.best_of !== n) {
    throw v1Error("invalid_request", `best_of must be absent or equal to n (${n}): only the completions returned are billed`);
  }
  // vLLM's beam search (use_beam_search) expands beams that are never returned, likewise unbilled.
  if (b.use_beam_search !== undefined && b.use_beam_search !== null && b.use_beam_search !== false) {
    throw v1Error("invalid_request", "use_beam_search is not accepted: the beams a search expands and drops would be generated but never billed");
  }
  // Every answer is streamed from the endpoint (proxy.ts), and vLLM computes prompt logprobs only for an unstreamed one.
  if (b.prompt_logprobs !== undefined && b.prompt_logprobs !== null && b.prompt_logprobs !== 0) {
    throw v1Error("invalid_request", "prompt_logprobs is not accepted: the gateway streams every answer from the serving endpoint, which gives prompt logprobs only unstreamed");
  }
  const unbounded = unboundedPrompt(b) ?? unboundedCompletion(b) ?? specialTokenFieldsInvalid(b);
  if (unbounded) throw v1Error("invalid_request", unbounded);
  const so = b.stream_options;
  if (so !== undefined && so !== null && (typeof so !== "object" || Array.isArray(so))) throw v1Error("invalid_request", "stream_options must be an object");
  const limits = [b.max_tokens, b.max_completion_tokens].filter((v): v is number => typeof v === "number");
  return {
    body: b,
    model: b.model,
    tools: offersTools(b),
    stream: b.stream === true,
    clientWantsUsage: (so as { include_usage?: unknown } | undefined)?.include_usage === true,
    clientWantsContinuousUsage: (so as { continuous_usage_stats?: unknown } | undefined)?.continuous_usage_stats === true,
    maxTokens: limits.length ? Math.min(...limits) : undefined,
    choices: n,
  };
}

/**
 * The request lets the model call a tool: it offers tools (or legacy functions) and does not forbid
 * calling them (`tool_choice` / `function_call` "none", under which vLLM parses no calls).
 */
function offersTools(b: Record<string, unknown>): boolean {
  const tools = Array.isArray(b.tools) && b.tools.length > 0 && b.tool_choice !== "none";
  const functions = Array.isArray(b.functions) && b.functions.length > 0 && b.function_call !== "none";
  return tools || functions;
}

export function createV1Handler(deps: V1Deps) {
  const { config, sql } = deps;
  const picker = new EndpointPicker();
  const limiter = config.rateLimits ? createV1Limiter(sql, config.v1.rateLimitPerMinute, deps.log) : undefined;
  const startedAt = Math.floor(Date.now() / 1000);
  const knownModels = new Set<string>([...config.v1.models, ...LLM_MODELS, ...Object.keys(TOKEN_RATES), ...Object.keys(config.v1.tokenRates)]);
  knownModels.delete("*");

  /**
   * Counts into the metrics, never failing the request: a charge may already be committed, and a throw
   * out of handleV1's finally would be a rejection nobody handles.
   */
  function metric(count: (m: Metrics) => void): void {
    if (!deps.metrics) return;
    try {
      count(deps.metrics);
    } catch (err) {
      deps.log.warn({ err }, "/v1 metrics failed");
    }
  }

  /** A 429 of the rate-limit table as the /v1 envelope's rate_limit_exceeded; anything else as it is. */
  function asV1RateLimit(err: unknown): unknown {
    const e = toHttpError(err);
    if (e.status !== 429) return err;
    const retry = Number(e.headers["retry-after"]);
    const seconds = Number.isFinite(retry) && retry > 0 ? retry : 1;
    return v1Error("rate_limit_exceeded", `too many requests that failed authentication from this address; retry in ${seconds} s`, seconds * 1000);
  }

  /**
   * authenticate, counting a failure (no key, an invalid one, a suspended renter's) against the client IP on the
   * FAILED_AUTH_ROW; an address already over that row is refused first, before any key lookup.
   */
  async function authenticateCounted(call: Call): Promise<Authenticated> {
    const limits = deps.rateLimits;
    if (!limits) return authenticate(call);
    const ip = clientIpOf(call.req, config.trustProxy);
    try {
      await limits.refuseIfOver(FAILED_AUTH_ROW, ip);
    } catch (err) {
      throw asV1RateLimit(err);
    }
    try {
      return await authenticate(call);
    } catch (err) {
      if (err instanceof V1Error && FAILED_AUTH_CODES.has(err.code)) {
        try {
          await limits.check(FAILED_AUTH_ROW, ip);
        } catch (over) {
          throw asV1RateLimit(over);
        }
      }
      throw err;
    }
  }

  /** The calling renter and the key that authenticated, from `Authorization: Bearer` or `x-renter-key`. */
  async function authenticate(call: Call): Promise<Authenticated> {
    const creds = credentialsFromHeaders(call.req.headers, "", call.requestId);
    if (creds.keys.length === 0) throw v1Error("missing_api_key", "missing API key: send Authorization: Bearer <renter key> or x-renter-key");
    for (const key of creds.keys.filter((k) => roleOfKey(k) === "renter")) {
      const keyHash = keyHashOf(key);
      const owner = await cachedLookupKey(sql, key, keyHash);
      if (owner?.role !== "renter") continue;
      if (owner.suspended) throw v1Error("account_suspended", "this renter account is suspended");
      return { renterId: owner.accountId, key, keyHash };
    }
    if (creds.keys.some((k) => roleOfKey(k) === "provider")) throw v1Error("invalid_api_key", "/v1 needs a renter API key (svc-renter-...), not a provider key");
    throw v1Error("invalid_api_key", "invalid API key");
  }

  async function limit(call: Call, renterKey: string): Promise<void> {
    if (!limiter) return;
    const r = await limiter.consume(renterKey);
    call.headers["x-ratelimit-limit-requests"] = String(r.limit);
    if (r.ok) {
      call.headers["x-ratelimit-remaining-requests"] = String(r.remaining);
      call.headers["x-ratelimit-reset-requests"] = `${Math.ceil(r.resetMs / 1000)}s`;
      return;
    }
    call.headers["x-ratelimit-remaining-requests"] = "0";
    throw v1Error("rate_limit_exceeded", `rate limit of ${r.limit} /v1 requests per minute exceeded for this API key; retry later`, r.retryAfterMs);
  }

  /** The models served to this renter (its own endpoints and the public ones) and the configured catalog. */
  async function listModels(renterId: number): Promise<Record<string, unknown>[]> {
    const served = new Map<string, { endpoints: number; since: number }>();
    for (const u of await servingEndpoints(sql, { renterId })) {
      const m = served.get(u.model) ?? { endpoints: 0, since: Number.MAX_SAFE_INTEGER };
      m.endpoints++;
      m.since = Math.min(m.since, Math.floor(u.startedAt.getTime() / 1000));
      served.set(u.model, m);
    }
    const ids = [...new Set([...served.keys(), ...config.v1.models])].sort();
    return ids.map((id) => {
      const rate = tokenRate(id, config.v1.tokenRates);
      return {
        id,
        object: "model",
        created: served.get(id)?.since ?? startedAt,
        owned_by: "svc-marketplace",
        endpoints: served.get(id)?.endpoints ?? 0,
        pricing: { input_halala_per_million_tokens: rate.input, output_halala_per_million_tokens: rate.output },
      };
    });
  }

  async function usage(call: Call, renterId: number) {
    const [{ total, byModel }, funds] = await Promise.all([usageTotals(sql, renterId), renterFunds(sql, renterId)]);
    sendJson(call, 200, {
      object: "usage",
      renter_id: renterId,
      requests: total.requests,
      prompt_tokens: total.promptTokens,
      completion_tokens: total.completionTokens,
      total_tokens: total.promptTokens + total.completionTokens,
      cost_halala: total.costHalala,
      cost_sar: halalaToSar(total.costHalala),
      in_flight: total.inFlight,
      reserved_halala: total.reservedHalala,
      accrued_micro_halala: total.accruedMicro,
      balance_halala: funds.balance,
      available_halala: funds.available,
      by_model: byModel.map((m) => ({
        model: m.model,
        requests: m.requests,
        prompt_tokens: m.promptTokens,
        completion_tokens: m.completionTokens,
        total_tokens: m.promptTokens + m.completionTokens,
        cost_halala: m.costHalala,
      })),
    });
  }

  /** Bills the tokens of `u` that what was forwarded and delivered can account for (token-pricing.ts bounds). */
  async function settle(call: Call, renterId: number, requestId: string, upstream: Upstream, model: string, u: TokenUsage, billed: TokenCounts) {
    // On the renter's own serving job the tokens are recorded, not charged: its GPU is paid by the minute.
    const cost = upstream.own ? 0n : tokenCostMicro(tokenRate(model, config.v1.tokenRates), billed.promptTokens, billed.completionTokens);
    const charge = await sql.begin((tx) =>
      chargeTokenUsage(tx, renterId, upstream.providerId, requestId, cost, {
        ...billed,
        estimated: u.estimated,
        reported: u.estimated ? undefined : { promptTokens: u.promptTokens, completionTokens: u.completionTokens },
        jobId: upstream.jobId,
      }),
    );
    metric((m) => m.v1Tokens(billed.promptTokens, billed.completionTokens));
    const overstated = u.promptTokens + u.completionTokens - billed.promptTokens - billed.completionTokens;
    Object.assign(call.log, { cost: charge.charged, costMicro: String(cost), tokens: billed.promptTokens + billed.completionTokens, providerId: upstream.providerId });
    if (overstated > 0 && !u.estimated) call.log.overstatedTokens = overstated;
    return charge;
  }

  async function chatCompletions(call: Call, renterId: number) {
    const chat = parseChatRequest(await readBody(call.req, BODY_LIMIT_BYTES));
    call.log.model = chat.model;
    const { upstreams, own } = await endpointsFor(sql, renterId, chat.model);
    if (upstreams.length === 0) {
      if (knownModels.has(chat.model)) {
        throw v1Error("no_capacity_available", `no provider is serving model "${chat.model}" right now; retry later`);
      }
      throw v1Error("model_not_found", `model "${maskSecrets(chat.model)}" is not served here; GET /v1/models lists the models`);
    }
    const rate = tokenRate(chat.model, config.v1.tokenRates);
    const promptBound = promptTokensBound(chat.body);
    // vLLM parses tool calls out of a generation only for a request that offers tools: calls in an answer to any
    // other are the endpoint's own making, their text billed as delivered but no allowance for markup never generated.
    const billedUsage = (reported: TokenCounts, delivered: DeliveredText) =>
      billableTokens(reported, {
        promptTokens: promptBound,
        completionTokens: completionTokensBound(chat.tools ? delivered : { ...delivered, toolCalls: 0 }, chat.choices, chat.body.stop),
      });
    const requestId = call.requestId;
    const reservation = await sql.begin((tx) =>
      reserveTokenBudget(tx, {
        requestId,
        renterId,
        model: chat.model,
        stream: chat.stream,
        rate,
        promptTokens: promptBound,
        maxTokens: chat.maxTokens,
        choices: chat.choices,
        ttlSeconds: config.v1.maxRequestSeconds + 60,
        free: own,
      }),
    );

    const body: Record<string, unknown> = { ...chat.body };
    // The engine gets the completion limit the price cap was reserved for, in whichever field it reads:
    // engines prefer max_completion_tokens when both are set, older ones know only max_tokens (and
    // without it generate to the end of the context), and a charge never exceeds the reserved cap.
    // The renter's own endpoint reserves nothing: a request naming no limit is sent without one.
    if (reservation.maxTokens !== undefined) {
      body.max_tokens = reservation.maxTokens;
      if (body.max_completion_tokens !== undefined && body.max_completion_tokens !== null) body.max_completion_tokens = reservation.maxTokens;
    }
    // Special tokens the request can make the model generate are delivered, and so billed (token-pricing.ts).
    if (mayGenerateSpecialTokens(chat.body)) body.skip_special_tokens = false;
    // vLLM generates a reasoning model's reasoning whatever include_reasoning says, and with false (or what it
    // coerces to false) leaves it out of the answer: generated, never delivered, so never billed.
    if (body.include_reasoning !== undefined) body.include_reasoning = true;
    // The endpoint always streams, with usage on every chunk: a non-streamed answer is built from the chunks
    // (proxy.ts), the idle limit counts between chunks, and a stream cut short (client gone, endpoint failed,
    // answer too large) is billed by the last usage the endpoint reported, whatever stream_options the renter
    // sent (what its client is shown stays as it asked).
    body.stream = true;
    body.stream_options = { ...(chat.stream ? (chat.body.stream_options as object | undefined) : {}), include_usage: true, continuous_usage_stats: true };

    /** The reservation was settled or released: from then on a throw is the request's answer, not a loose end. */
    let ended = false;
    const release = async () => {
      await releaseTokenBudget(sql, requestId);
      ended = true;
    };
    const settled = async (result: { upstream: Upstream; usage: TokenUsage; delivered: DeliveredText }) => {
      const charge = await settle(call, renterId, requestId, result.upstream, chat.model, result.usage, billedUsage(result.usage, result.delivered));
      ended = true;
      return charge;
    };
    const { abort } = call;
    let deadline: NodeJS.Timeout | undefined;
    try {
      if (abort.signal.aborted) {
        await release();
        if (abort.signal.reason instanceof V1Error) throw abort.signal.reason;
        return 499;
      }
      deadline = setTimeout(() => abort.abort("deadline"), config.v1.maxRequestSeconds * 1000);
      const result = await proxyChatCompletion({
        upstreams: picker.order(upstreams),
        picker,
        body,
        stream: chat.stream,
        clientWantsUsage: chat.clientWantsUsage,
        clientWantsContinuousUsage: chat.clientWantsContinuousUsage,
        choices: chat.choices,
        promptTokensEstimate: Math.ceil(promptBound / 4),
        billedUsage,
        timeoutMs: config.v1.upstreamTimeoutMs,
        signal: abort.signal,
        maxAttempts: MAX_ATTEMPTS,
        onUpstreamError: (code) => metric((m) => m.v1UpstreamError(code)),
        allowPrivate: config.v1.allowPrivateUpstreams,
        res: call.res,
        headers: { ...call.headers },
      });
      if (result.kind === "failed") {
        await release();
        throw result.error;
      }
      call.log.jobId = result.upstream.jobId;
      if (result.kind === "streamed") {
        const { error } = result;
        if (error) {
          call.log.streamError = error.code;
          // A client that left, or whose key was revoked, is no failure of the endpoint's (as in "broken" below).
          if (error.status !== 499 && !revoked(call)) metric((m) => m.v1UpstreamError(error.code));
        }
        // The stream is over (fully or broken off): what was delivered is billed before the response ends
        // (or carries its error event), so a client that saw the end also sees the charge.
        try {
          await settled(result);
        } finally {
          if (result.error) await write(call.res, sseEvent(JSON.stringify(envelope(result.error))), call.abort.signal);
          call.res.end();
        }
        return 200;
      }
      if (result.kind === "broken") {
        // The endpoint started, then failed (or the client left, or its key was revoked) before anything was
        // sent: not tried elsewhere. A client that left, or whose key went, is billed the usage reported within
        // what was delivered (nothing: the prompt). An endpoint's failure is charged nothing: the client got
        // nothing but a retryable error, and OpenAI's SDKs retry such a 5xx on their own (a charge for each try
        // would bill one answer several times).
        call.log.streamError = result.error.code;
        if (result.error.status === 499 || revoked(call)) await settled(result);
        else {
          metric((m) => m.v1UpstreamError(result.error.code));
          await release();
        }
        throw result.error;
      }
      const charge = await settled(result);
      if (result.truncated) call.log.truncated = result.truncated;
      // What this request was charged (whole halala, its carry included) and what it cost exactly.
      sendJson(call, 200, result.json, {
        "x-svc-cost-halala": String(charge.charged),
        "x-svc-cost-micro-halala": String(charge.costMicro),
        ...(result.truncated ? { "x-svc-truncated": result.truncated } : {}),
      });
      return 200;
    } catch (err) {
      // Whatever an endpoint did once it had started comes back as a result and is settled above; a throw that
      // leaves the reservation open (a failure of the gateway's own, the charge's transaction included) gives
      // the cap back now rather than holding it until it expires. A no-op when the charge did commit.
      if (!ended) await releaseTokenBudget(sql, requestId).catch((e) => deps.log.error({ err: e, requestId }, "/v1 reservation not released"));
      throw err;
    } finally {
      clearTimeout(deadline);
    }
  }

  // The server's fallback drops the promise a plain handler returns, and an unhandled rejection ends the
  // process (every request in flight with it): serveV1 answers every failure itself, and anything thrown
  // while doing so stops here.
  return async function handleV1(req: NodeRequest, res: NodeResponse, url: URL): Promise<boolean> {
    if (url.pathname !== "/v1" && !url.pathname.startsWith("/v1/")) return false;
    try {
      await serveV1(req, res, url);
    } catch (err) {
      deps.log.error({ err }, "/v1 request failed while answering");
      if (!res.writableEnded) res.destroy();
    }
    return true;
  };

  async function serveV1(req: NodeRequest, res: NodeResponse, url: URL): Promise<void> {
    const started = performance.now();
    // Always our own id: it keys the request's billing (v1_usage, ledger idempotency), so a client must not choose it.
    const requestId = `req-${crypto.randomUUID()}`;
    const clientRequestId = typeof req.headers["x-request-id"] === "string" ? req.headers["x-request-id"].slice(0, 100) : undefined;
    const call: Call = { req, res, url, requestId, headers: { "x-request-id": requestId }, log: clientRequestId ? { clientRequestId } : {}, abort: new AbortController() };
    const onClose = () => {
      if (!res.writableFinished) call.abort.abort("client_closed");
    };
    res.on("close", onClose);
    const method = (req.method ?? "GET").toUpperCase();
    const path = url.pathname.replace(/\/+$/, "");
    let status = 500;
    let route: "chat" | "models" | "model" | "usage" | undefined;
    let release: (() => void) | undefined;
    try {
      route =
        path === "/v1/chat/completions" ? "chat" : path === "/v1/models" ? "models" : path.startsWith("/v1/models/") ? "model" : path === "/v1/usage" ? "usage" : undefined;
      // The path as sent, a key typed into it masked (log.ts maskSecrets), as every answer and log line has it.
      if (!route) throw v1Error("unknown_url", `unknown /v1 route: ${method} ${maskSecrets(url.pathname)}`);
      const wanted = route === "chat" ? "POST" : "GET";
      if (method !== wanted) {
        call.headers.allow = wanted;
        throw v1Error("method_not_allowed", `${maskSecrets(url.pathname)} accepts ${wanted}, not ${method}`);
      }
      const { renterId, key, keyHash } = await authenticateCounted(call);
      // Only a chat completion lasts (and bills) long enough to need ending; watched from before anything
      // else is awaited, so that no revocation notice falls between its key check and the watch.
      if (route === "chat") {
        release = watchRevocation(sql, { role: "renter", accountId: renterId, keyHash }, (reason) => call.abort.abort(v1Error("invalid_api_key", reason)));
      }
      call.log.renterId = renterId;
      await limit(call, key);
      if (route === "chat") {
        status = await chatCompletions(call, renterId);
      } else if (route === "usage") {
        await usage(call, renterId);
        status = 200;
      } else {
        const models = await listModels(renterId);
        if (route === "models") {
          sendJson(call, 200, { object: "list", data: models });
        } else {
          const raw = path.slice("/v1/models/".length);
          let id: string;
          try {
            id = decodeURIComponent(raw);
          } catch {
            throw v1Error("invalid_request", `the model id in the path is not valid percent-encoding: "${maskSecrets(raw)}"`);
          }
          const m = models.find((x) => x.id === id);
          if (!m) throw v1Error("model_not_found", `model "${maskSecrets(id)}" is not served here`);
          sendJson(call, 200, m);
        }
        status = 200;
      }
    } catch (err) {
      const e = toV1Error(err);
      status = e.status;
      if (status === 500) deps.log.error({ err, requestId }, "/v1 request failed");
      if (!res.headersSent && !(res as { destroyed?: boolean }).destroyed) sendV1Error(res, e, call.headers);
      else if (!res.writableEnded) res.end();
    } finally {
      release?.();
      res.off("close", onClose);
      metric((m) => m.request("v1", route ? V1_ROUTE_LABELS[route] : "other", status, (performance.now() - started) / 1000));
      deps.log.info(
        { requestId, method, path: maskSecrets(url.pathname), status, ms: Math.round(performance.now() - started), ip: clientIpOf(req, config.trustProxy), ...call.log },
        "request",
      );
    }
  }
}
