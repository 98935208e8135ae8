// Who reads a job's receipt. Its renter and admins; and every provider that
// held an attempt of the job, also after the job moved on to another provider
// (unlike the job itself, its output and its logs, which a former provider no
// longer reads): the receipt is a former provider's proof of how its attempt
// ended and what it was paid. It carries the task's and the output's hashes,
// never the output, the logs or the endpoint, and the signature covers the
// whole document, so it is shown whole or not at all.
import type { Sql } from "../../db/index.js";
import { forbidden, notFound } from "../../errors.js";
import { storedReceipt } from "../money/receipts.js";
import type { ReceiptFile } from "../../shared/receipt.js";
import type { JobReader } from "./jobs.js";

export async function receiptForReader(db: Sql, jobId: string, reader: JobReader): Promise<ReceiptFile> {
  const [job] = await db<{ id: number; renter_id: number; provider_id: number | null; status: string; held_by: boolean }[]>`
    SELECT j.id, j.renter_id, j.provider_id, j.status,
           EXISTS (SELECT 1 FROM job_attempts a WHERE a.job_id = j.id AND a.provider_id = ${reader.role === "provider" ? reader.providerId : null}) AS held_by
    FROM jobs j WHERE j.job_id = ${jobId}`;
  if (!job) throw notFound("job not found");
  const allowed =
    reader.role === "admin" ||
    (reader.role === "renter" && job.renter_id === reader.renterId) ||
    (reader.role === "provider" && (job.provider_id === reader.providerId || job.held_by));
  if (!allowed) throw forbidden("this job belongs to another caller");
  const receipt = await storedReceipt(db, job.id);
  if (receipt) return receipt;
  if (job.status === "queued" || job.status === "pending" || job.status === "running") {
    throw notFound(`no receipt yet: the job is ${job.status}; its receipt is issued when it settles`);
  }
  throw notFound("this job ended before receipts were issued: it has no receipt");
}
