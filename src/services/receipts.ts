// ReceiptService: a job's signed receipt, the public keys that verify
// receipts, and rotation and revocation of the server's receipt keys (domain:
// src/domain/money/receipts.ts, src/domain/jobs/job-receipts.ts).
import type { JsonObject } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import type { ReceiptService } from "../../gen/svc/v1/receipts_pb.js";
import { receiptForReader } from "../domain/jobs/job-receipts.js";
import type { JobReader } from "../domain/jobs/jobs.js";
import {
  checkProviderKeysOffset,
  publishedKeys,
  resignRevokedReceipts,
  revokeReceiptKey,
  rotateReceiptKey,
  type ServerKeyView,
} from "../domain/money/receipts.js";
import { recordAudit } from "../domain/shared/audit.js";
import { checkId } from "../domain/admin/admin.js";
import { checkLength, checkRange, iso, optionalText, REASON_MAX_CHARS } from "../domain/shared/validate.js";
import { SIGNATURE_ALGORITHM } from "../shared/receipt.js";
import { auditActor, principalOf, type Deps } from "./deps.js";

const serverKey = (k: ServerKeyView) => ({
  keyId: k.keyId,
  algorithm: SIGNATURE_ALGORITHM,
  publicKey: k.publicKey,
  createdAt: iso(k.createdAt)!,
  retiredAt: iso(k.retiredAt),
  current: k.retiredAt === null,
  revokedAt: iso(k.revokedAt),
  revocationReason: k.revocationReason ?? undefined,
});

/** How long a revocation re-signs its key's receipts before it answers; the periodic sweep does the rest. */
const RESIGN_IN_REQUEST_MS = 5_000;

export function receiptService({ sql }: Deps): Partial<ServiceImpl<typeof ReceiptService>> {
  return {
    async getJobReceipt(req, ctx) {
      const r = await receiptForReader(sql, req.jobId, principalOf(ctx) as JobReader);
      return { receipt: r.receipt as JsonObject, signature: { algorithm: r.signature.algorithm, keyId: r.signature.key_id, value: r.signature.value } };
    },

    async listReceiptKeys(req) {
      const limit = req.limit === undefined ? 100 : checkRange(req.limit, 1, 1000, "limit", true);
      const offset = req.offset === undefined ? 0 : checkProviderKeysOffset(req.offset);
      const providerId = req.providerId === undefined ? undefined : checkId(req.providerId, "provider_id");
      const keyId = optionalText(req.keyId, 64, "key_id");
      const afterProviderId = req.afterProviderId === undefined ? undefined : checkId(req.afterProviderId, "after_provider_id");
      const k = await publishedKeys(sql, { providerId, keyId, afterProviderId, limit, offset });
      return {
        serverKeys: k.server.filter((s) => keyId === undefined || s.keyId === keyId).map(serverKey),
        providerKeys: k.providers.map((p) => ({
          keyId: p.keyId,
          providerId: BigInt(p.providerId),
          algorithm: SIGNATURE_ALGORITHM,
          publicKey: p.publicKey,
          registeredAt: iso(p.registeredAt)!,
        })),
        providerKeysTotal: BigInt(k.providerTotal),
      };
    },

    async rotateReceiptKey(_req, ctx) {
      const { actor, ip } = auditActor(ctx);
      return sql.begin(async (tx) => {
        const r = await rotateReceiptKey(tx);
        await recordAudit(tx, actor, "receipts.rotate_key", "receipt_key", r.current.keyId, { retired_key_id: r.retired, ip });
        return { current: serverKey(r.current), retiredKeyId: r.retired ?? "" };
      });
    },

    async revokeReceiptKey(req, ctx) {
      const { actor, ip } = auditActor(ctx);
      const keyId = checkLength(req.keyId, 64, "key_id")!;
      const reason = optionalText(req.reason, REASON_MAX_CHARS, "reason") ?? null;
      const r = await sql.begin(async (tx) => {
        const r = await revokeReceiptKey(tx, keyId, reason);
        if (!r.alreadyRevoked) {
          await recordAudit(tx, actor, "receipts.revoke_key", "receipt_key", keyId, { reason, current_key_id: r.current.keyId, ip });
        }
        return r;
      });
      // After the revocation committed: each batch is a transaction of its own.
      const s = await resignRevokedReceipts(sql, { keyId, until: Date.now() + RESIGN_IN_REQUEST_MS });
      return {
        key: serverKey(r.key),
        current: serverKey(r.current),
        alreadyRevoked: r.alreadyRevoked,
        receiptsResigned: BigInt(s.resigned),
        resigningDone: s.done,
      };
    },
  };
}
