// ReceiptService: a job's signed receipt, the public keys that verify
// receipts, and rotation of the server's receipt key (domain:
// src/domain/money/receipts.ts, src/domain/jobs/job-receipts.ts).
import type { JsonObject } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import type { ReceiptService } from "../../gen/svc/v1/receipts_pb.js";
import { receiptForReader } from "../domain/jobs/job-receipts.js";
import type { JobReader } from "../domain/jobs/jobs.js";
import { checkProviderKeysOffset, publishedKeys, rotateReceiptKey, type ServerKeyView } from "../domain/money/receipts.js";
import { recordAudit } from "../domain/shared/audit.js";
import { checkId } from "../domain/admin/admin.js";
import { checkRange, iso, optionalText } from "../domain/shared/validate.js";
import { SIGNATURE_ALGORITHM } from "../shared/receipt.js";
import { auditActor, principalOf, type Deps } from "./deps.js";

const serverKey = (k: ServerKeyView) => ({
  keyId: k.keyId,
  algorithm: SIGNATURE_ALGORITHM,
  publicKey: k.publicKey,
  createdAt: iso(k.createdAt)!,
  retiredAt: iso(k.retiredAt),
  current: k.retiredAt === null,
});

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
      const k = await publishedKeys(sql, { providerId, keyId, limit, offset });
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
  };
}
