// A provider's own task-signing secret for the legacy JSON protocol. The
// legacy daemon's only check on what it runs is task_spec_hmac, and its file
// carries the secret that checks it; deriving one secret per provider (and
// per key epoch: rotating the provider's key rotates it) means a file leaked
// by one provider signs nothing that another provider's daemon accepts.
import crypto from "node:crypto";
import type { Db } from "../../db/index.js";

export function providerTaskSecret(serviceSecret: string, providerId: number, epoch: number): string {
  return crypto.createHmac("sha256", serviceSecret).update(`svc-legacy-task-secret/v1/${providerId}/${epoch}`).digest("hex");
}

export interface LegacySigning {
  /** Which secret the provider's legacy daemon holds: its own, or (a file from before per-provider secrets) the service's. */
  holds: "service" | "provider";
  epoch: number;
}

export async function legacySigningOf(db: Db, providerId: number): Promise<LegacySigning> {
  const [row] = await db<{ legacy_task_secret: "service" | "provider"; task_secret_epoch: number }[]>`
    SELECT legacy_task_secret, task_secret_epoch FROM providers WHERE id = ${providerId}`;
  return { holds: row?.legacy_task_secret ?? "service", epoch: row?.task_secret_epoch ?? 0 };
}
