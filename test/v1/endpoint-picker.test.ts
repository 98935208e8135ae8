// The order /v1 tries a model's endpoints in: ones that failed rest for
// REST_MS behind the others, as do ones the health probe finds failing; the
// least busy first; a rest that ran out is forgotten, so endpoints that failed
// once are not remembered for good.
import { describe, expect, it } from "vitest";
import { EndpointPicker, REST_MS, type Upstream } from "../../src/http/v1/endpoints.js";

const upstream = (jobId: number): Upstream => ({ jobId, providerId: jobId, model: "m", url: `http://10.0.0.${jobId}/v1/chat/completions`, startedAt: new Date(0), own: false });

describe("the endpoint picker", () => {
  it("tries a failed endpoint last until its rest runs out, and the least busy first", () => {
    const picker = new EndpointPicker();
    const [a, b, c] = [upstream(1), upstream(2), upstream(3)];
    picker.failed(a, 1_000);
    const releaseB = picker.acquire(b);
    expect(picker.order([a, b, c], 2_000).map((u) => u.jobId)).toEqual([3, 2, 1]);
    // Rested: a is no longer behind the busy one.
    expect(picker.order([a, b, c], 1_000 + REST_MS).map((u) => u.jobId).at(-1)).toBe(2);
    releaseB();
    picker.failed(b, 3_000);
    picker.succeeded(b);
    expect(picker.order([b, c], 4_000).map((u) => u.jobId).sort()).toEqual([2, 3]);
  });

  it("tries an endpoint the health probe finds failing after the unsuspected ones, and after resting ones when it also rests", () => {
    const picker = new EndpointPicker();
    const [a, b, c] = [{ ...upstream(1), failing: true }, upstream(2), upstream(3)];
    const releaseB = picker.acquire(b);
    // Failing beats busy: b has a request in flight and still comes before a.
    expect(picker.order([a, b, c], 1_000).map((u) => u.jobId)).toEqual([3, 2, 1]);
    releaseB();
    picker.failed(b, 1_000);
    picker.failed(a, 1_000);
    // Resting alone (b) before failing and resting (a).
    expect(picker.order([a, b, c], 2_000).map((u) => u.jobId)).toEqual([3, 2, 1]);
  });

  it("forgets rests that ran out: a thousand endpoints that failed once leave one behind", () => {
    const picker = new EndpointPicker();
    for (let i = 0; i < 1_000; i++) picker.failed(upstream(i), i * REST_MS);
    expect(picker.resting).toBe(1);
  });
});
