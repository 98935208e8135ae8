// The container registry: which images custom_container jobs may run. The
// built-in list ships with the service; renters request more, and an admin
// approves or rejects each request (audited by the caller).
import type { Db, Tx } from "../../db/index.js";
import { badRequest, conflict, isUniqueViolation, notFound } from "../../errors.js";
import { checkEnum } from "../shared/validate.js";

export interface BuiltinImage {
  image: string;
  description: string;
}

/** Pinned, vendor-published images reviewed with each release of the service. */
export const BUILTIN_IMAGES: readonly BuiltinImage[] = [
  { image: "vllm/vllm-openai:v0.6.3", description: "vLLM OpenAI-compatible server (vllm_serve jobs)" },
  { image: "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime", description: "PyTorch with CUDA 12.1 (training, diffusers image generation)" },
  { image: "nvidia/cuda:12.4.1-runtime-ubuntu22.04", description: "CUDA 12.4 runtime on Ubuntu 22.04 (benchmarks, custom code; custom_container's default image)" },
  { image: "linuxserver/blender:4.2.3", description: "Blender 4.2 with Cycles GPU rendering" },
  { image: "huggingface/transformers-pytorch-gpu:4.41.3", description: "Hugging Face Transformers on PyTorch GPU" },
  { image: "tensorflow/tensorflow:2.17.0-gpu", description: "TensorFlow 2.17 with GPU support" },
];

/** When the built-in list above was last reviewed (reported as its approved_at). */
export const BUILTIN_REVIEWED_AT = new Date("2026-11-01T00:00:00Z");

export const REQUEST_STATUSES = ["pending", "approved", "rejected"] as const;
export const SCAN_STATUSES = ["passed", "pending"] as const;
export type ScanStatus = (typeof SCAN_STATUSES)[number];

const IMAGE_MAX = 255;
// [registry[:port]/]path[:tag][@sha256:digest], lowercase path components (Docker's reference grammar).
const COMPONENT = "[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*";
const REFERENCE = new RegExp(
  `^(?:(?<registry>[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?)/)?` +
    `(?<path>${COMPONENT}(?:/${COMPONENT})*)(?::(?<tag>[\\w][\\w.-]{0,127}))?(?:@(?<digest>sha256:[a-f0-9]{64}))?$`,
);

/**
 * The canonical form of an image reference: Docker Hub's implicit prefixes
 * dropped (docker.io/library/x:1 == x:1) so one image has one name.
 */
export function canonicalImage(ref: string): string {
  let s = ref.trim();
  for (const prefix of ["docker.io/", "index.docker.io/", "registry-1.docker.io/"]) {
    if (s.startsWith(prefix)) s = s.slice(prefix.length);
  }
  if (s.startsWith("library/") && s.split("/").length === 2) s = s.slice("library/".length);
  return s;
}

/**
 * Validates a reference a renter asks for: a well-formed name with an explicit
 * tag other than `latest`, or a digest. Approval is for fixed contents; a
 * moving tag would let the image change after review.
 */
export function checkImageReference(raw: string, field = "image"): string {
  const image = canonicalImage(raw);
  if (!image) throw badRequest(`missing required fields: ${field}`);
  if (image.length > IMAGE_MAX) throw badRequest(`${field} must be at most ${IMAGE_MAX} characters`);
  const m = REFERENCE.exec(image);
  if (!m) throw badRequest(`${field} must be an image reference like registry.example.com/team/app:1.2.0`);
  const { tag, digest } = m.groups!;
  if (!tag && !digest) throw badRequest(`${field} needs an explicit tag or an @sha256 digest`);
  if (tag === "latest" && !digest) throw badRequest(`${field} must not use the moving tag 'latest': pin a version or digest`);
  return image;
}

/**
 * Validates the reference of an image a renter asks to have approved: as checkImageReference, and
 * pinned by digest. Approval is for the contents reviewed; a tag can be pushed again after the
 * review, a digest cannot.
 */
export function checkRequestedImage(raw: string, field = "image"): string {
  const image = checkImageReference(raw, field);
  if (!REFERENCE.exec(image)!.groups!.digest) {
    throw badRequest(
      `${field} must pin its contents with an @sha256 digest (e.g. ${image.split("@")[0]}@sha256:<64 hex digits>, as docker inspect shows it): ` +
        "an approval is for the contents reviewed, and a tag can be pushed again after the review",
    );
  }
  return image;
}

const BUILTIN = new Set(BUILTIN_IMAGES.map((b) => b.image));

/** Whether an image is one of the platform's own (BUILTIN_IMAGES), not one approved at a renter's request. */
export const isBuiltinImage = (image: string): boolean => BUILTIN.has(image);

/** True when custom_container jobs may run this image (built-in or approved by an admin). */
export async function isImageApproved(db: Db, image: string): Promise<boolean> {
  const name = canonicalImage(image);
  if (BUILTIN.has(name)) return true;
  const [row] = await db`SELECT 1 FROM approved_images WHERE image = ${name}`;
  return row !== undefined;
}

export interface ApprovedImageRow {
  image: string;
  description: string;
  source: "builtin" | "request";
  request_id: number | null;
  scan_status: ScanStatus;
  approved_at: Date;
}

/** Built-in images first (in their order), then approved requests, oldest first. */
export async function listApprovedImages(db: Db): Promise<ApprovedImageRow[]> {
  const rows = await db<Omit<ApprovedImageRow, "source">[]>`
    SELECT image, description, request_id, scan_status, approved_at FROM approved_images ORDER BY approved_at, image`;
  return [
    ...BUILTIN_IMAGES.map((b) => ({ ...b, source: "builtin" as const, request_id: null, scan_status: "passed" as const, approved_at: BUILTIN_REVIEWED_AT })),
    ...rows.filter((r) => !BUILTIN.has(r.image)).map((r) => ({ ...r, source: "request" as const })),
  ];
}

export interface ImageRequestRow {
  id: number;
  image: string;
  renter_id: number;
  status: (typeof REQUEST_STATUSES)[number];
  reason: string | null;
  review_note: string | null;
  scan_status: ScanStatus | null;
  created_at: Date;
  reviewed_at: Date | null;
}

/**
 * How many requests one renter may have waiting for review at once: each is an admin's work, and
 * they cost the renter nothing, so without a bound one account could fill the review queue.
 */
export const MAX_PENDING_IMAGE_REQUESTS = 20;

/** Advisory-lock namespace of a renter's image requests (two-key form: the renter id is the second key). */
const REQUEST_LOCK_NS = 0x7269;

export async function requestImage(tx: Tx, renterId: number, image: string, reason: string | undefined): Promise<ImageRequestRow> {
  if (await isImageApproved(tx, image)) throw conflict(`image ${image} is already approved`);
  checkRequestedImage(image);
  // One renter's requests one at a time, so that concurrent ones cannot pass the bound together.
  await tx`SELECT pg_advisory_xact_lock(${REQUEST_LOCK_NS}, ${renterId % 2147483647}::int)`;
  const [{ pending }] = await tx<{ pending: number }[]>`
    SELECT count(*)::int AS pending FROM image_requests WHERE renter_id = ${renterId} AND status = 'pending'`;
  if (pending >= MAX_PENDING_IMAGE_REQUESTS) {
    throw conflict(`you have ${pending} image requests waiting for review, the most one account may have; request more once some are reviewed`);
  }
  try {
    const [row] = await tx<ImageRequestRow[]>`
      INSERT INTO image_requests (image, renter_id, reason) VALUES (${image}, ${renterId}, ${reason ?? null}) RETURNING *`;
    return row;
  } catch (err) {
    if (isUniqueViolation(err, "image_requests_open_key")) throw conflict(`you already have an open request for ${image}`);
    throw err;
  }
}

export async function listImageRequests(
  db: Db,
  f: { renterId?: number; status?: string; limit: number; offset: number },
): Promise<{ rows: ImageRequestRow[]; total: number }> {
  const status = f.status === undefined ? undefined : checkEnum(f.status, REQUEST_STATUSES, "status");
  const where = () => db`
    WHERE true
      ${f.renterId ? db`AND renter_id = ${f.renterId}` : db``}
      ${status ? db`AND status = ${status}` : db``}`;
  const [rows, [c]] = await Promise.all([
    db<ImageRequestRow[]>`SELECT * FROM image_requests ${where()} ORDER BY id DESC LIMIT ${f.limit} OFFSET ${f.offset}`,
    db<{ n: number }[]>`SELECT count(*)::bigint AS n FROM image_requests ${where()}`,
  ]);
  return { rows, total: c.n };
}

/**
 * Approves or rejects a pending request; an approval adds the image to the approved list, described
 * publicly by `description`, the reviewer's (the request's reason is the renter's, and stays private).
 */
export async function reviewImageRequest(
  tx: Tx,
  id: number,
  decision: "approved" | "rejected",
  note: string | undefined,
  scanStatus: ScanStatus,
  description?: string,
): Promise<ImageRequestRow> {
  const [current] = await tx<ImageRequestRow[]>`SELECT * FROM image_requests WHERE id = ${id} FOR UPDATE`;
  if (!current) throw notFound("image request not found");
  if (current.status !== "pending") throw conflict(`image request ${id} was already ${current.status}`);
  const [row] = await tx<ImageRequestRow[]>`
    UPDATE image_requests SET status = ${decision}, review_note = ${note ?? null},
      scan_status = ${decision === "approved" ? scanStatus : null}, reviewed_at = now()
    WHERE id = ${id} RETURNING *`;
  if (decision === "approved") {
    // An image already approved at another request (several renters may wait for one image) takes
    // this review's description when it gives one, and its scan unless one passed already: the
    // reference pins the contents by digest, so a passed scan stays true of them.
    await tx`
      INSERT INTO approved_images (image, description, request_id, scan_status)
      VALUES (${row.image}, ${description ?? ""}, ${row.id}, ${scanStatus})
      ON CONFLICT (image) DO UPDATE SET
        description = CASE WHEN ${description !== undefined} THEN EXCLUDED.description ELSE approved_images.description END,
        scan_status = CASE WHEN approved_images.scan_status = 'passed' THEN 'passed' ELSE EXCLUDED.scan_status END`;
  }
  return row;
}
