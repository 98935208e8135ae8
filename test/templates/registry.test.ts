// The container registry: built-in images, renters' requests, admin review
// (audited), and isImageApproved for custom_container jobs.
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { BUILTIN_IMAGES, isImageApproved, MAX_PENDING_IMAGE_REQUESTS } from "../../src/domain/jobs/registry.js";
import { client } from "../helpers/http.js";
import { makeRenter } from "../helpers/fixtures.js";
import { useTestServer } from "../helpers/server.js";
import { ADMIN } from "../admin/helpers.js";

const srv = useTestServer();
/** A reference pinned by digest (the contents an approval is for), the digest made from `name`. */
const TRAINER = `ghcr.io/acme/trainer:2.1.0@sha256:${"c".repeat(64)}`;
const TOOL = `ghcr.io/bob/tool:0.1@sha256:${"d".repeat(64)}`;
const pinned = (name: string) => `${name}@sha256:${createHash("sha256").update(name).digest("hex")}`;
const api = client(srv);

describe("container registry", () => {
  it("lists the built-in images publicly", async () => {
    const r = await api.get("/api/registry/images");
    expect(r.status).toBe(200);
    expect(r.body.images.map((i: any) => i.image)).toEqual(BUILTIN_IMAGES.map((b) => b.image));
    for (const i of r.body.images) {
      expect(i).toMatchObject({ source: "builtin", scan_status: "passed", request_id: null });
      expect(new Date(i.approved_at).toISOString()).toBe(i.approved_at);
    }
    expect(await isImageApproved(srv.sql, "docker.io/" + BUILTIN_IMAGES[0].image)).toBe(true);
    expect(await isImageApproved(srv.sql, "ghcr.io/evil/miner:1.0")).toBe(false);
  });

  it("validates requested references: tag or digest, no latest, well-formed, not already approved", async () => {
    const renter = await makeRenter(srv);
    const cases: [string, RegExp][] = [
      ["ghcr.io/acme/app", /explicit tag/],
      ["ghcr.io/acme/app:latest", /latest/],
      ["ghcr.io/acme/app:1.0.0", /must pin its contents with an @sha256 digest \(e\.g\. ghcr\.io\/acme\/app:1\.0\.0@sha256:/],
      ["Not A Ref", /image reference/],
      ["ghcr.io/acme/app:1.0; rm -rf /", /image reference/],
      ["a".repeat(300) + ":1", /at most 255/],
      ["", /missing required fields: image/],
    ];
    for (const [image, msg] of cases) {
      const r = await api.post("/api/registry/requests", { image }, renter.headers);
      expect(r.status, image).toBe(400);
      expect(r.body.error).toMatch(msg);
    }
    const builtin = await api.post("/api/registry/requests", { image: `docker.io/${BUILTIN_IMAGES[1].image}` }, renter.headers);
    expect(builtin.status).toBe(409);
    const digest = `ghcr.io/acme/app@sha256:${"a".repeat(64)}`;
    expect((await api.post("/api/registry/requests", { image: digest }, renter.headers)).status).toBe(201);
  });

  it("holds a renter to MAX_PENDING_IMAGE_REQUESTS waiting for review, concurrent requests included; a review makes room", async () => {
    const renter = await makeRenter(srv, 0);
    const ask = (i: number) => api.post("/api/registry/requests", { image: pinned(`registry.example.com/team/img${i}:1.0.${i}`), reason: "needed" }, renter.headers);
    const replies = await Promise.all(Array.from({ length: MAX_PENDING_IMAGE_REQUESTS + 5 }, (_, i) => ask(i)));
    expect(replies.filter((r) => r.status === 201)).toHaveLength(MAX_PENDING_IMAGE_REQUESTS);
    const refused = replies.filter((r) => r.status !== 201);
    expect(refused.map((r) => r.status)).toEqual(Array(5).fill(409));
    expect(refused[0].body.error).toMatch(/20 image requests waiting for review, the most one account may have/);
    // Another renter is not affected; a reviewed request frees a place.
    expect((await api.post("/api/registry/requests", { image: pinned("registry.example.com/other/x:1.0.0") }, (await makeRenter(srv, 0)).headers)).status).toBe(201);
    const { id } = replies.find((r) => r.status === 201)!.body;
    expect((await api.post(`/api/admin/registry/requests/${id}/reject`, { note: "not needed" }, ADMIN)).status).toBe(200);
    expect((await ask(100)).status).toBe(201);
    expect((await ask(101)).status).toBe(409);
  });

  it("lets a renter request, see only their own requests, and an admin approve or reject (audited)", async () => {
    const alice = await makeRenter(srv);
    const bob = await makeRenter(srv);
    const req = await api.post("/api/registry/requests", { image: TRAINER, reason: "our trainer" }, alice.headers);
    expect(req.status).toBe(201);
    expect(req.body).toEqual({
      id: expect.any(Number), image: TRAINER, renter_id: alice.id, status: "pending",
      reason: "our trainer", review_note: null, created_at: expect.stringMatching(/Z$/), reviewed_at: null, scan_status: null,
    });
    expect((await api.post("/api/registry/requests", { image: TRAINER }, alice.headers)).status).toBe(409);
    const other = await api.post("/api/registry/requests", { image: TOOL }, bob.headers);
    expect(other.status).toBe(201);

    const mine = await api.get("/api/registry/requests", alice.headers);
    expect(mine.status).toBe(200);
    expect(mine.body.requests.map((r: any) => r.renter_id)).toEqual([alice.id]);
    const all = await api.get("/api/registry/requests?status=pending", ADMIN);
    expect(all.body.requests.map((r: any) => r.id)).toEqual(expect.arrayContaining([req.body.id, other.body.id]));
    expect((await api.get("/api/registry/requests?status=maybe", ADMIN)).status).toBe(400);

    // A renter cannot review.
    expect((await api.post(`/api/admin/registry/requests/${req.body.id}/approve`, {}, alice.headers)).status).toBe(401);
    expect(await isImageApproved(srv.sql, TRAINER)).toBe(false);

    const ok = await api.post(
      `/api/admin/registry/requests/${req.body.id}/approve`,
      { note: "scanned with trivy", scan_status: "passed", description: "Training image (PyTorch, CUDA 12)" },
      ADMIN,
    );
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ status: "approved", review_note: "scanned with trivy", scan_status: "passed", reviewed_at: expect.stringMatching(/Z$/) });
    expect(await isImageApproved(srv.sql, TRAINER)).toBe(true);
    // The public description is the reviewer's; the renter's reason stays private.
    const images = (await api.get("/api/registry/images")).body.images;
    expect(images.at(-1)).toMatchObject({ image: TRAINER, source: "request", request_id: req.body.id, scan_status: "passed", description: "Training image (PyTorch, CUDA 12)" });
    expect((await api.post(`/api/admin/registry/requests/${req.body.id}/reject`, {}, ADMIN)).status).toBe(409);

    const no = await api.post(`/api/admin/registry/requests/${other.body.id}/reject`, { note: "unknown publisher" }, ADMIN);
    expect(no.body).toMatchObject({ status: "rejected", review_note: "unknown publisher", scan_status: null });
    expect(await isImageApproved(srv.sql, TOOL)).toBe(false);
    expect((await api.post(`/api/admin/registry/requests/999999/approve`, {}, ADMIN)).status).toBe(404);
    expect((await api.post(`/api/admin/registry/requests/${other.body.id}/approve`, { scan_status: "clean" }, ADMIN)).status).toBe(400);

    const log = (await api.get("/api/admin/audit?target_type=image_request", ADMIN)).body.entries;
    const byTarget = Object.fromEntries(log.map((e: any) => [e.target_id, e]));
    expect(byTarget[String(req.body.id)]).toMatchObject({
      action: "registry.approve",
      details: { image: TRAINER, scan_status: "passed", description: "Training image (PyTorch, CUDA 12)" },
    });
    expect(byTarget[String(other.body.id)]).toMatchObject({ action: "registry.reject", details: { note: "unknown publisher" } });
  });

  it("never publishes a renter's reason: an approval without a description has an empty one", async () => {
    const alice = await makeRenter(srv);
    const image = pinned("registry.acme-internal.example/secret-project/trainer:0.9");
    const reason = "fine-tuning on customer X's records, contact alice@acme.example";
    const req = await api.post("/api/registry/requests", { image, reason }, alice.headers);
    expect(req.status, req.text).toBe(201);
    expect((await api.post(`/api/admin/registry/requests/${req.body.id}/approve`, { scan_status: "passed" }, ADMIN)).status).toBe(200);
    const pub = await api.get("/api/registry/images"); // no credential
    expect(pub.body.images.find((i: any) => i.image === image)).toMatchObject({ source: "request", description: "" });
    expect(pub.text).not.toContain("alice@acme.example");
    // The requester still sees their reason on their own request.
    const mine = await api.get("/api/registry/requests", alice.headers);
    expect(mine.body.requests.find((r: any) => r.id === req.body.id)).toMatchObject({ reason, status: "approved" });
    // A description longer than any note is refused.
    const other = await api.post("/api/registry/requests", { image: pinned("ghcr.io/acme/long:1.0") }, alice.headers);
    const long = await api.post(`/api/admin/registry/requests/${other.body.id}/approve`, { description: "x".repeat(1001) }, ADMIN);
    expect(long.status).toBe(400);
    expect(long.body.error).toMatch(/description/);
  });

  it("approving a second renter's request for an image already approved writes the reviewer's description and scan to the public list", async () => {
    const alice = await makeRenter(srv);
    const bob = await makeRenter(srv);
    const image = pinned("ghcr.io/acme/shared-tool:2.0");
    const first = await api.post("/api/registry/requests", { image }, alice.headers);
    const second = await api.post("/api/registry/requests", { image }, bob.headers);
    expect([first.status, second.status]).toEqual([201, 201]);
    // Approved unscanned and undescribed first; the second review scanned it and describes it.
    expect((await api.post(`/api/admin/registry/requests/${first.body.id}/approve`, {}, ADMIN)).status).toBe(200);
    const listed = async () => (await api.get("/api/registry/images")).body.images.find((i: any) => i.image === image);
    expect(await listed()).toMatchObject({ scan_status: "pending", description: "", request_id: first.body.id });
    const ok = await api.post(
      `/api/admin/registry/requests/${second.body.id}/approve`,
      { note: "scanned", scan_status: "passed", description: "Shared tool 2.0" },
      ADMIN,
    );
    expect(ok.status, ok.text).toBe(200);
    expect(ok.body).toMatchObject({ status: "approved", scan_status: "passed" });
    // What the decision and its audit entry say is what the list shows.
    expect(await listed()).toMatchObject({ source: "request", scan_status: "passed", description: "Shared tool 2.0", request_id: first.body.id });
    // A later approval that scanned nothing and describes nothing takes neither away: the digest pins the contents scanned.
    const third = await api.post("/api/registry/requests", { image }, (await makeRenter(srv)).headers);
    // (A request for an approved image is refused; one already waiting, as here, is reviewed as any other.)
    expect(third.status).toBe(409);
    await srv.sql`INSERT INTO image_requests (image, renter_id, reason) VALUES (${image}, ${alice.id}, 'again')`;
    const [{ id: againId }] = await srv.sql<{ id: number }[]>`SELECT id FROM image_requests WHERE image = ${image} AND status = 'pending'`;
    expect((await api.post(`/api/admin/registry/requests/${againId}/approve`, {}, ADMIN)).status).toBe(200);
    expect(await listed()).toMatchObject({ scan_status: "passed", description: "Shared tool 2.0" });
  });

  it("migration 057 clears the descriptions earlier approvals copied from requests' reasons, and only those", async () => {
    const r = await makeRenter(srv);
    const [copied] = await srv.sql`
      INSERT INTO image_requests (image, renter_id, status, reason) VALUES (${pinned("acme/copied:1")}, ${r.id}, 'approved', 'for customer Jane, jane@example.com') RETURNING id`;
    const [given] = await srv.sql`
      INSERT INTO image_requests (image, renter_id, status, reason) VALUES (${pinned("acme/given:1")}, ${r.id}, 'approved', 'private') RETURNING id`;
    await srv.sql`
      INSERT INTO approved_images (image, description, request_id, scan_status) VALUES
        (${pinned("acme/copied:1")}, 'for customer Jane, jane@example.com', ${copied.id}, 'passed'),
        (${pinned("acme/given:1")}, 'Python 3.12 tools', ${given.id}, 'passed')`;
    await srv.sql.unsafe(fs.readFileSync(path.join(process.cwd(), "src/db/migrations/057_registry_descriptions.sql"), "utf8"));
    const rows = await srv.sql`SELECT image, description FROM approved_images WHERE request_id IN (${copied.id}, ${given.id}) ORDER BY image`;
    expect(Object.fromEntries(rows.map((x) => [x.image, x.description]))).toEqual({ [pinned("acme/copied:1")]: "", [pinned("acme/given:1")]: "Python 3.12 tools" });
  });
});
