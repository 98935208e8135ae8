// Reads of the published receipt keys and of a job's receipt, each expected to answer 200.
import { expect } from "vitest";
import type { PublishedKeys } from "../../src/shared/receipt.js";
import type { client } from "../helpers/http.js";

export function receiptReads(api: ReturnType<typeof client>) {
  return {
    /** `T`: the listing as the test reads it (the verifier's PublishedKeys by default). */
    async keys<T = PublishedKeys>(): Promise<T> {
      const r = await api.get("/api/receipts/keys");
      expect(r.status, r.text).toBe(200);
      return r.body;
    },
    async receiptOf(jobId: string, headers: Record<string, string>) {
      const r = await api.get(`/api/jobs/${jobId}/receipt`, headers);
      expect(r.status, r.text).toBe(200);
      return r.body;
    },
  };
}
