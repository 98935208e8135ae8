// RegistryService: approved images, renters' image requests, admin review.
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { RequestImageRequestSchema, type RegistryService } from "../../gen/svc/v1/templates_pb.js";
import { checkId } from "../domain/admin/admin.js";
import { recordAudit } from "../domain/shared/audit.js";
import {
  checkImageReference,
  listApprovedImages,
  listImageRequests,
  requestImage,
  reviewImageRequest,
  SCAN_STATUSES,
  type ImageRequestRow,
} from "../domain/jobs/registry.js";
import { checkEnum, iso, optionalText, page, requireMembers } from "../domain/shared/validate.js";
import { principalOf, callerRenterId, type Deps, auditActor } from "./deps.js";

const TEXT_MAX = 1000;

function requestMessage(r: ImageRequestRow) {
  return {
    id: BigInt(r.id),
    image: r.image,
    renterId: BigInt(r.renter_id),
    status: r.status,
    reason: r.reason ?? undefined,
    reviewNote: r.review_note ?? undefined,
    createdAt: iso(r.created_at)!,
    reviewedAt: iso(r.reviewed_at),
    scanStatus: r.scan_status ?? undefined,
  };
}

export function registryService(deps: Deps): Partial<ServiceImpl<typeof RegistryService>> {
  const { sql } = deps;

  async function review(
    id: bigint,
    decision: "approved" | "rejected",
    note: string | undefined,
    scan: string | undefined,
    describe: string | undefined,
    ctx: HandlerContext,
  ) {
    const requestId = checkId(id, "id");
    const reviewNote = optionalText(note, TEXT_MAX, "note");
    const scanStatus = scan === undefined || scan === "" ? "pending" : checkEnum(scan, SCAN_STATUSES, "scan_status");
    const description = optionalText(describe, TEXT_MAX, "description");
    const { actor, ip } = auditActor(ctx);
    return sql.begin(async (tx) => {
      const row = await reviewImageRequest(tx, requestId, decision, reviewNote, scanStatus, description);
      await recordAudit(tx, actor, decision === "approved" ? "registry.approve" : "registry.reject", "image_request", requestId, {
        image: row.image,
        renter_id: row.renter_id,
        note: reviewNote ?? null,
        ...(decision === "approved" ? { scan_status: scanStatus, description: description ?? null } : {}),
        ip,
      });
      return requestMessage(row);
    });
  }

  return {
    async listImages() {
      const rows = await listApprovedImages(sql);
      return {
        images: rows.map((r) => ({
          image: r.image,
          description: r.description,
          source: r.source,
          approvedAt: iso(r.approved_at)!,
          scanStatus: r.scan_status,
          requestId: r.request_id === null ? undefined : BigInt(r.request_id),
        })),
      };
    },

    async requestImage(req, ctx) {
      const renterId = callerRenterId(ctx);
      requireMembers(RequestImageRequestSchema, req);
      const image = checkImageReference(req.image);
      const reason = optionalText(req.reason, TEXT_MAX, "reason");
      return requestMessage(await sql.begin((tx) => requestImage(tx, renterId, image, reason)));
    },

    async listRequests(req, ctx) {
      const p = page(req.limit, req.offset);
      const who = principalOf(ctx);
      const renterId = who.role === "renter" ? who.renterId : undefined;
      const { rows, total } = await listImageRequests(sql, { renterId, status: req.status, ...p });
      return { requests: rows.map(requestMessage), total: BigInt(total), ...p };
    },

    approveRequest: (req, ctx) => review(req.id, "approved", req.note, req.scanStatus, req.description, ctx),
    rejectRequest: (req, ctx) => review(req.id, "rejected", req.note, undefined, undefined, ctx),
  };
}
