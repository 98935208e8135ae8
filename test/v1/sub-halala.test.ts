// /v1 token charges below one halala: a request's exact cost (micro-halala) is
// carried per renter, and the provider's 75 % per provider, so that at list
// rates (a few thousandths of a halala a request) the renter pays the exact
// total rounded down once, the provider earns 75 % of it and the platform the
// rest, instead of 1 halala a request, all to the platform. The cap reserved
// before proxying still bounds a charge, a repeat touches no carry, concurrent
// requests lose no carry update, and the ledger stays whole and balanced.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { auditLedgerNow } from "../../src/domain/money/ledger-audit.js";
import { ledgerProblems } from "../../src/domain/money/ledger.js";
import { providerShareMicro } from "../../src/domain/money/pricing.js";
import { tokenCostHalala, tokenCostMicro } from "../../src/domain/money/token-pricing.js";
import { chargeTokenUsage, reserveTokenBudget } from "../../src/domain/money/usage-billing.js";
import { makeRenter } from "../helpers/fixtures.js";
import { client } from "../helpers/http.js";
import { useTestServer } from "../helpers/server.js";
import { PROMPT_TOKENS, REPLY_WORDS, startFakeVllm, type FakeVllm } from "./fake-vllm.js";
import { serveModel, type Serving } from "./serving.js";

const MICRO = 1_000_000;
// The list rate of the built-in table: 100 halala per million prompt tokens, 300 per million completion tokens.
const LIST_MODEL = "Qwen/Qwen2.5-7B-Instruct";
const LIST_RATE = { input: 100, output: 300 };
// 100 times the list rate: still under a halala a request (0.29), so a sequence shows the carry at work.
const SMALL_MODEL = "meta-llama/Llama-3.1-8B-Instruct";
const SMALL_RATE = { input: 10_000, output: 30_000 };
// A request of several halala, not a whole number of them (8.333325).
const DEAR_MODEL = "google/gemma-2-9b-it";
const DEAR_RATE = { input: 333_333, output: 777_777 };
// Dear completion tokens: with max_tokens 1 the cap is far below what the reply costs.
const CAP_MODEL = "mistralai/Mistral-7B-Instruct-v0.3";
const CAP_RATE = { input: 10_000, output: 2_500_000 };
// The concurrent requests: the small rate, on an endpoint of their own.
const BUSY_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0";

const costMicro = (rate: { input: number; output: number }) => PROMPT_TOKENS * rate.input + REPLY_WORDS.length * rate.output;
/** The prompt bound of one user message "hi" (token-pricing.ts): its text, the role, 8 per message, 64 per request. */
const HI_PROMPT_BOUND = 2 + "user".length + 8 + 64;
const START = 100_000;

let vllm: FakeVllm;
const serving: Record<string, Serving> = {};

const RATES = { [LIST_MODEL]: LIST_RATE, [SMALL_MODEL]: SMALL_RATE, [DEAR_MODEL]: DEAR_RATE, [CAP_MODEL]: CAP_RATE, [BUSY_MODEL]: SMALL_RATE };
const srv = useTestServer({ SVC_V1_TOKEN_RATES: JSON.stringify(RATES), SVC_JOB_SWEEP_MS: "60000", SVC_LIVENESS_SWEEP_SECONDS: "0" });
beforeAll(async () => {
  vllm = await startFakeVllm("sub-halala");
  // One provider per model: each provider's carry is this file's to predict.
  for (const model of Object.keys(RATES)) serving[model] = await serveModel(srv, model, vllm.url);
});
afterAll(async () => {
  expect(await ledgerProblems(srv.sql)).toEqual([]);
  expect((await auditLedgerNow(srv.sql, { full: true })).discrepancies).toEqual([]);
  await vllm?.close();
});

interface Answer {
  status: number;
  requestId: string;
  /** x-svc-cost-halala: what this request was charged, whole halala. */
  charged: number;
  /** x-svc-cost-micro-halala: what it cost exactly. */
  micro: number;
}

async function chat(key: string, model: string, extra: Record<string, unknown> = {}): Promise<Answer> {
  const res = await fetch(`${srv.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], ...extra }),
  });
  await res.text();
  return {
    status: res.status,
    requestId: res.headers.get("x-request-id")!,
    charged: Number(res.headers.get("x-svc-cost-halala")),
    micro: Number(res.headers.get("x-svc-cost-micro-halala")),
  };
}

async function carry(kind: "renter" | "provider", id: number): Promise<number> {
  const [row] = await srv.sql<{ micro: number }[]>`SELECT micro FROM v1_accruals WHERE owner_kind = ${kind} AND owner_id = ${id}`;
  return row?.micro ?? 0;
}

async function available(renterId: number): Promise<number> {
  const [row] = await srv.sql<{ balance: number }[]>`SELECT balance FROM ledger_accounts WHERE kind = 'renter_available' AND owner_id = ${renterId}`;
  return row.balance;
}

interface Row {
  request_id: string;
  cost_halala: number;
  cost_micro: string | null;
  shortfall_halala: number;
  reserved_halala: number;
  provider_earned_halala: number;
  platform_fee_halala: number;
}

const rowsOf = (renterId: number) =>
  srv.sql<Row[]>`
    SELECT request_id, cost_halala, cost_micro::text, shortfall_halala, reserved_halala, provider_earned_halala, platform_fee_halala
    FROM v1_usage WHERE renter_id = ${renterId} AND state = 'settled' ORDER BY ended_at, request_id`;

/** What the renter's /v1 ledger legs moved, by kind. */
async function legsOf(renterId: number): Promise<{ provider: number; platform: number }> {
  const [row] = await srv.sql<{ provider: number; platform: number }[]>`
    SELECT coalesce(sum(t.amount) FILTER (WHERE t.kind = 'v1_charge_provider'), 0)::bigint AS provider,
           coalesce(sum(t.amount) FILTER (WHERE t.kind = 'v1_charge_platform'), 0)::bigint AS platform
    FROM ledger_transfers t JOIN ledger_accounts a ON a.id = t.debit_account_id
    WHERE a.kind = 'renter_available' AND a.owner_id = ${renterId} AND t.kind LIKE 'v1_charge_%'`;
  return row;
}

/** Every renter's and every provider's carry is exactly what its requests cost (or earned) beyond the whole halala. */
async function expectCarriesExact() {
  const renters = await srv.sql<{ renter_id: number; micro: string; whole: number; carry: number }[]>`
    SELECT u.renter_id, sum(u.cost_micro)::text AS micro, sum(u.cost_halala + u.shortfall_halala)::bigint AS whole,
           coalesce((SELECT micro FROM v1_accruals WHERE owner_kind = 'renter' AND owner_id = u.renter_id), 0) AS carry
    FROM v1_usage u WHERE u.state = 'settled' GROUP BY u.renter_id`;
  expect(renters.length).toBeGreaterThan(0);
  for (const r of renters) expect(BigInt(r.micro), `renter ${r.renter_id}`).toBe(BigInt(r.whole) * BigInt(MICRO) + BigInt(r.carry));
  const providers = await srv.sql<{ provider_id: number; charged: number; earned: number; fee: number; carry: number }[]>`
    SELECT u.provider_id, sum(u.cost_halala)::bigint AS charged, sum(u.provider_earned_halala)::bigint AS earned,
           sum(u.platform_fee_halala)::bigint AS fee,
           coalesce((SELECT micro FROM v1_accruals WHERE owner_kind = 'provider' AND owner_id = u.provider_id), 0) AS carry
    FROM v1_usage u WHERE u.state = 'settled' GROUP BY u.provider_id`;
  for (const p of providers) {
    expect(p.charged * 750_000, `provider ${p.provider_id}`).toBe(p.earned * MICRO + p.carry);
    expect(p.earned + p.fee).toBe(p.charged);
  }
}

describe("sub-halala accrual", () => {
  it("list rates: a request costs thousandths of a halala, and nothing is charged until they add up to one", async () => {
    const renter = await makeRenter(srv, START);
    const each = costMicro(LIST_RATE); // 2,900 micro-halala
    expect(each).toBe(2_900);
    for (let i = 0; i < 5; i++) {
      const a = await chat(renter.key, LIST_MODEL);
      expect(a).toMatchObject({ status: 200, charged: 0, micro: each });
    }
    expect(await available(renter.id)).toBe(START);
    expect(await carry("renter", renter.id)).toBe(5 * each);
    expect(await carry("provider", serving[LIST_MODEL].provider.id)).toBe(0);
    const rows = await rowsOf(renter.id);
    expect(rows.map((r) => [r.cost_halala, r.cost_micro, r.provider_earned_halala, r.platform_fee_halala])).toEqual(Array(5).fill([0, String(each), 0, 0]));
    const usage = await client(srv.url).get("/v1/usage", { authorization: `Bearer ${renter.key}` });
    expect(usage.body).toMatchObject({ requests: 5, cost_halala: 0, accrued_micro_halala: 5 * each, available_halala: START });
  });

  it("many small requests: the renter pays their exact total rounded down, the provider 75 % of that, the platform the rest", async () => {
    const renter = await makeRenter(srv, START);
    const provider = serving[SMALL_MODEL].provider.id;
    const each = costMicro(SMALL_RATE); // 290,000 micro-halala
    const n = 20;
    let charged = 0;
    for (let i = 1; i <= n; i++) {
      const a = await chat(renter.key, SMALL_MODEL);
      expect(a.status).toBe(200);
      // The whole halala the running total just passed.
      expect(a.charged).toBe(Math.floor((i * each) / MICRO) - Math.floor(((i - 1) * each) / MICRO));
      expect(a.micro).toBe(each);
      charged += a.charged;
    }
    const total = Math.floor((n * each) / MICRO); // 5.8 -> 5
    expect(charged).toBe(total);
    expect(await available(renter.id)).toBe(START - total);
    expect(await carry("renter", renter.id)).toBe(n * each - total * MICRO);
    const legs = await legsOf(renter.id);
    expect(legs.provider + legs.platform).toBe(total);
    expect(legs.provider).toBe(Math.floor((total * 75) / 100)); // a fresh provider: 3.75 -> 3, 0.75 carried
    expect(Math.abs(legs.provider - total * 0.75)).toBeLessThan(1);
    expect(await carry("provider", provider)).toBe(total * 750_000 - legs.provider * MICRO);
    const rows = await rowsOf(renter.id);
    expect(rows.reduce((s, r) => s + r.provider_earned_halala, 0)).toBe(legs.provider);
    expect(rows.reduce((s, r) => s + r.platform_fee_halala, 0)).toBe(legs.platform);
    expect(rows.every((r) => r.cost_micro === String(each) && r.shortfall_halala === 0)).toBe(true);
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });

  it("a request of several halala is charged its cost with the carry, split within a halala of 75/25; a repeat moves nothing", async () => {
    const renter = await makeRenter(srv, START);
    const provider = serving[DEAR_MODEL].provider.id;
    const each = costMicro(DEAR_RATE); // 8,333,325
    expect(each).toBe(8_333_325);
    const answers = [];
    for (let i = 0; i < 4; i++) answers.push(await chat(renter.key, DEAR_MODEL));
    // 8.33, 8.67, 9.00 (just under: 8.999975), 9.33: the carry makes the fourth 9.
    expect(answers.map((a) => a.charged)).toEqual([8, 8, 8, 9]);
    expect(answers.every((a) => a.micro === each)).toBe(true);
    expect(await carry("renter", renter.id)).toBe(4 * each - 33 * MICRO);
    expect(await available(renter.id)).toBe(START - 33);
    const rows = await rowsOf(renter.id);
    for (const r of rows) {
      expect(r.provider_earned_halala + r.platform_fee_halala).toBe(r.cost_halala);
      expect(Math.abs(r.provider_earned_halala - r.cost_halala * 0.75)).toBeLessThan(1);
    }
    // 6,000,000 x 3, then 6,750,000: 6 each, 0.75 carried.
    expect(rows.map((r) => r.provider_earned_halala)).toEqual([6, 6, 6, 6]);
    expect(await carry("provider", provider)).toBe(750_000);

    // Charged once: a repeat answers the first figures and leaves both carries alone.
    const first = answers[0].requestId;
    const again = await srv.sql.begin((tx) => chargeTokenUsage(tx, renter.id, provider, first, BigInt(each), { promptTokens: PROMPT_TOKENS, completionTokens: REPLY_WORDS.length }));
    expect(again).toEqual({ charged: 8, costMicro: BigInt(each), providerEarned: 6, platformFee: 2, shortfall: 0, moved: false });
    expect(await carry("renter", renter.id)).toBe(4 * each - 33 * MICRO);
    expect(await carry("provider", provider)).toBe(750_000);
    expect(await available(renter.id)).toBe(START - 33);
  });

  it("the reserved cap still bounds a charge; the carry never pushes one past it", async () => {
    const renter = await makeRenter(srv, START);
    const provider = serving[CAP_MODEL].provider.id;
    // max_tokens 1: the cap is the prompt bound and one completion token, 3.28 -> 4 halala; the reply's 6 tokens cost 15.11.
    const cap = Math.ceil((HI_PROMPT_BOUND * CAP_RATE.input + 1 * CAP_RATE.output) / MICRO);
    expect(cap).toBe(4);
    const a = await chat(renter.key, CAP_MODEL, { max_tokens: 1 });
    expect(a).toMatchObject({ status: 200, charged: cap, micro: costMicro(CAP_RATE) });
    const [row] = await rowsOf(renter.id);
    expect(row).toMatchObject({ reserved_halala: cap, cost_halala: cap, cost_micro: String(costMicro(CAP_RATE)), shortfall_halala: 15 - cap });
    expect(await carry("renter", renter.id)).toBe(costMicro(CAP_RATE) - 15 * MICRO);

    // The gateway's own steps: a carry just under a halala and a cost of exactly the cap still charge the cap, no more.
    const other = await makeRenter(srv, START);
    const charge = async (requestId: string, rate: { input: number; output: number }, promptTokens: number, maxTokens: number, micro: bigint) => {
      const r = await srv.sql.begin((tx) =>
        reserveTokenBudget(tx, { requestId, renterId: other.id, model: CAP_MODEL, stream: false, rate, promptTokens, maxTokens, choices: 1, ttlSeconds: 60 }),
      );
      const c = await srv.sql.begin((tx) => chargeTokenUsage(tx, other.id, provider, requestId, micro, { promptTokens, completionTokens: maxTokens }));
      return { reserved: r.reserved, ...c };
    };
    const tag = `cap-${other.id}`;
    expect(await charge(`${tag}-a`, { input: 999_999, output: 0 }, 1, 1, 999_999n)).toMatchObject({ reserved: 1, charged: 0, shortfall: 0 });
    expect(await carry("renter", other.id)).toBe(999_999);
    const perToken = { input: 1_000_000, output: 1_000_000 };
    expect(await charge(`${tag}-b`, perToken, 2, 1, 3_000_000n)).toMatchObject({ reserved: 3, charged: 3, shortfall: 0 });
    expect(await carry("renter", other.id)).toBe(999_999);
    // One micro-halala beyond the cap's price (usage within the delivered bound, beyond max_tokens): due 4, charged 3.
    expect(await charge(`${tag}-c`, perToken, 2, 1, 3_000_001n)).toMatchObject({ reserved: 3, charged: 3, shortfall: 1 });
    expect(await carry("renter", other.id)).toBe(0);
    expect(await available(other.id)).toBe(START - 6);
    await expectCarriesExact();
  });

  it("concurrent requests of one renter lose no carry update", async () => {
    const renter = await makeRenter(srv, START);
    const each = costMicro(SMALL_RATE);
    const n = 24;
    const answers = await Promise.all(
      Array.from({ length: n }, (_, i) => chat(renter.key, BUSY_MODEL, i % 2 ? { stream: true, stream_options: { include_usage: true } } : {})),
    );
    expect(answers.every((a) => a.status === 200)).toBe(true);
    const rows = await rowsOf(renter.id);
    expect(rows).toHaveLength(n);
    const charged = rows.reduce((s, r) => s + r.cost_halala, 0);
    const finalCarry = await carry("renter", renter.id);
    // The sum of the exact costs is what was charged plus what is carried: 6,960,000 = 6 halala + 960,000.
    expect(rows.reduce((s, r) => s + BigInt(r.cost_micro!), 0n)).toBe(BigInt(n * each));
    expect(charged * MICRO + finalCarry).toBe(n * each);
    expect(charged).toBe(6);
    expect(await available(renter.id)).toBe(START - charged);
    const legs = await legsOf(renter.id);
    expect(legs.provider + legs.platform).toBe(charged);
    expect(Math.abs(legs.provider - charged * 0.75)).toBeLessThan(1);
    await expectCarriesExact();
    expect(await ledgerProblems(srv.sql)).toEqual([]);
  });
});

describe("exact prices", () => {
  it("a cost is exact in micro-halala past 2^53, the cap is its exact ceiling, the provider's share is 75 % of a charge", () => {
    expect(tokenCostMicro(LIST_RATE, PROMPT_TOKENS, REPLY_WORDS.length)).toBe(2_900n);
    expect(tokenCostHalala(LIST_RATE, PROMPT_TOKENS, REPLY_WORDS.length)).toBe(1);
    const dear = { input: 1_000_000_000_000, output: 999_999_999_999 };
    expect(tokenCostMicro(dear, 9_000_000_000_000, 3)).toBe(9_000_000_000_000n * 1_000_000_000_000n + 3n * 999_999_999_999n);
    // 9,007,199,254.740991 halala: a float quotient would lose the last digits.
    expect(tokenCostHalala({ input: 1, output: 0 }, Number.MAX_SAFE_INTEGER, 0)).toBe(9_007_199_255);
    expect(tokenCostHalala({ input: 1_000_000, output: 0 }, Number.MAX_SAFE_INTEGER, 0)).toBe(Number.MAX_SAFE_INTEGER);
    expect(() => tokenCostMicro(LIST_RATE, 1.5, 0)).toThrow(/invalid/);
    expect([0, 1, 4, 33].map(providerShareMicro)).toEqual([0n, 750_000n, 3_000_000n, 24_750_000n]);
  });
});
