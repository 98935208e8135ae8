// The daemon's start-up readiness report: ready when CUDA and PyTorch are
// present and the GPU has at least 4 GB of VRAM; stored on the provider.
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ReadinessRequest, ReadinessResponseSchema } from "../../../gen/svc/v1/providers_pb.js";
import type { Db } from "../../db/index.js";
import { checkEnum } from "../shared/validate.js";

export const MIN_READY_VRAM_GB = 4;

export interface ReadinessChecks {
  cuda?: boolean;
  pytorch?: boolean;
  vram_gb?: number;
  driver?: string;
}

export function readinessOf(c: ReadinessChecks): "ready" | "failed" {
  return c.cuda === true && c.pytorch === true && typeof c.vram_gb === "number" && c.vram_gb >= MIN_READY_VRAM_GB ? "ready" : "failed";
}

const TASK_SIGNING = ["service", "provider"] as const;

/**
 * Records the readiness report of an authenticated provider (both wires) and
 * returns `{success, readiness_status, checks}` with the checks echoed.
 */
export async function recordReadiness(
  deps: { sql: Db },
  providerId: number,
  req: ReadinessRequest,
): Promise<MessageInitShape<typeof ReadinessResponseSchema>> {
  const c = req.checks;
  const checks: ReadinessChecks = {};
  if (c?.cuda !== undefined) checks.cuda = c.cuda;
  if (c?.pytorch !== undefined) checks.pytorch = c.pytorch;
  if (c?.vramGb !== undefined && Number.isFinite(c.vramGb)) checks.vram_gb = c.vramGb;
  if (c?.driver !== undefined) checks.driver = c.driver.slice(0, 64);
  const readinessStatus = readinessOf(checks);
  const daemonVersion = req.daemonVersion?.trim().slice(0, 64) || null;
  const taskSigning = req.taskSigning === undefined ? null : checkEnum(req.taskSigning, TASK_SIGNING, "task_signing");
  await deps.sql`
    UPDATE providers SET readiness_status = ${readinessStatus}, readiness_checks = ${deps.sql.json(checks as never)},
      readiness_at = now(), daemon_version = coalesce(${daemonVersion}::text, daemon_version),
      legacy_task_secret = coalesce(${taskSigning}::text, legacy_task_secret), updated_at = now()
    WHERE id = ${providerId}`;
  return {
    success: true,
    readinessStatus,
    checks: { cuda: checks.cuda, pytorch: checks.pytorch, vramGb: checks.vram_gb, driver: checks.driver },
  };
}
