// ProviderDownloadService: installer scripts and the legacy daemon, rendered
// for the calling provider (raw bodies; the transcoder writes the bytes, or
// streams the file a handler hands it: the Windows installer binary).
import fs from "node:fs/promises";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { RawBodySchema } from "../../gen/svc/v1/options_pb.js";
import { GetInstallerRequestSchema, ProviderDownloadService } from "../../gen/svc/v1/providers_pb.js";
import { renderLegacyDaemon, renderSetupPowerShell, renderSetupShell, sha256Hex } from "../daemon/render.js";
import { lookupKey, roleOfKey } from "../domain/accounts/keys.js";
import { legacySigningOf, providerTaskSecret } from "../domain/accounts/provider-secret.js";
import { providerById } from "../domain/providers/providers.js";
import { requireMembers } from "../domain/shared/validate.js";
import { apiError, badRequest, forbidden, notFound } from "../errors.js";
import { credentialsKey } from "../http/credentials.js";
import { rawFileSlotKey } from "../http/rest.js";
import { callerProviderId, type Deps } from "./deps.js";

type Raw = MessageInitShape<typeof RawBodySchema>;
type Platform = "unix" | "windows";

const SHELL_TYPE = "text/x-shellscript; charset=utf-8";
const POWERSHELL_TYPE = "text/plain; charset=utf-8";
const OCTETS = "application/octet-stream";

/** linux/mac/darwin → the shell installer, windows → PowerShell (case-insensitive). */
function platformOf(value: string, field: string): Platform {
  const v = value.trim().toLowerCase();
  if (["linux", "mac", "darwin", "macos", "osx"].includes(v)) return "unix";
  if (v === "windows" || v === "win") return "windows";
  throw badRequest(`${field} must be one of linux, mac, darwin, windows (got "${value}")`);
}

const text = (s: string) => new TextEncoder().encode(s);

export function downloadService(deps: Deps): Partial<ServiceImpl<typeof ProviderDownloadService>> {
  const { sql, config } = deps;

  /** The provider key the caller authenticated with: it is written into what they download. */
  async function callerKey(ctx: HandlerContext): Promise<string> {
    const providerId = callerProviderId(ctx);
    for (const key of ctx.values.get(credentialsKey).keys) {
      if (roleOfKey(key) !== "provider") continue;
      const owner = await lookupKey(sql, key);
      if (owner?.accountId === providerId) return key;
    }
    throw badRequest("API key required");
  }

  async function installer(ctx: HandlerContext, platform: Platform, attachment: boolean): Promise<Raw> {
    const values = { backendUrl: config.backendUrl, apiKey: await callerKey(ctx) };
    if (platform === "windows") {
      return { contentType: attachment ? OCTETS : POWERSHELL_TYPE, data: text(renderSetupPowerShell(values)), filename: attachment ? "svc-setup.ps1" : "" };
    }
    return { contentType: attachment ? OCTETS : SHELL_TYPE, data: text(renderSetupShell(values)), filename: attachment ? "svc-setup.sh" : "" };
  }

  /**
   * The Windows installer binary, when one is configured and readable. It is handed to
   * the REST transcoder as an open file, which streams it; a message would hold the whole
   * binary per download (for as long as a client takes to read it), so over gRPC and
   * Connect the call is refused instead.
   */
  async function windowsExe(ctx: HandlerContext): Promise<Raw | undefined> {
    if (!config.windowsExePath) return undefined;
    const slot = ctx.values.get(rawFileSlotKey);
    if (!slot) throw apiError(501, `the Windows installer binary is served over HTTP only: GET ${config.backendUrl}/api/providers/download-windows-exe`);
    const handle = await fs.open(config.windowsExePath).catch(() => undefined);
    if (!handle) return undefined;
    const stat = await handle.stat().catch(() => undefined);
    if (!stat?.isFile()) {
      await handle.close();
      return undefined;
    }
    slot.file = { handle, size: stat.size };
    return { contentType: "application/vnd.microsoft.portable-executable", filename: "svc-setup.exe" };
  }

  return {
    getSetupScript: (_req, ctx) => installer(ctx, "unix", false),
    getSetupWindowsScript: (_req, ctx) => installer(ctx, "windows", false),

    async download(req, ctx) {
      const platform = req.platform ? platformOf(req.platform, "platform") : platformOf((await providerById(sql, callerProviderId(ctx))).os, "platform");
      return installer(ctx, platform, true);
    },

    async downloadSetup(req, ctx) {
      const platform = req.os ? platformOf(req.os, "os") : platformOf((await providerById(sql, callerProviderId(ctx))).os, "os");
      return installer(ctx, platform, true);
    },

    async getInstaller(req, ctx) {
      requireMembers(GetInstallerRequestSchema, req, "Missing required fields");
      const platform = platformOf(req.os, "os");
      if (platform === "windows") return (await windowsExe(ctx)) ?? installer(ctx, "windows", true);
      return installer(ctx, platform, true);
    },

    async downloadDaemon(req, ctx) {
      const checkOnly = req.checkOnly.trim().toLowerCase();
      if (!["", "true", "false"].includes(checkOnly)) throw badRequest(`check_only must be true or false (got "${req.checkOnly}")`);
      const provider = await providerById(sql, callerProviderId(ctx));
      // The file carries the provider's own task-signing secret: only for a provider the operator approved.
      // The version check carries no secret (a digest of the file) and answers any provider.
      if (provider.approval_status !== "approved" && checkOnly !== "true") {
        throw forbidden(`the daemon file carries this provider's task-signing secret and is served once the provider is approved (approval: ${provider.approval_status})`);
      }
      const { epoch } = await legacySigningOf(sql, provider.id);
      const file = renderLegacyDaemon({
        backendUrl: config.backendUrl,
        apiKey: await callerKey(ctx),
        hmacSecret: providerTaskSecret(config.hmacSecret, provider.id, epoch),
        daemonVersion: config.daemonLatestVersion,
      });
      if (checkOnly === "true") {
        const info = {
          version: config.daemonLatestVersion,
          min_version: config.daemonMinVersion,
          download_url: `${config.backendUrl}/api/providers/download/daemon`,
          // Of the file this key downloads, so a self-updating daemon can verify it.
          sha256: sha256Hex(file),
        };
        return { contentType: "application/json", data: text(JSON.stringify(info)), filename: "" };
      }
      return { contentType: OCTETS, data: text(file), filename: "svc_daemon.py" };
    },

    async downloadWindowsExe(_req, ctx) {
      const exe = await windowsExe(ctx);
      if (!exe) {
        throw notFound(
          "The Windows installer binary is not built yet. Install with PowerShell instead: " +
            `irm '${config.backendUrl}/api/providers/setup-windows' -MaximumRedirection 0 -Headers @{ 'x-provider-key' = 'YOUR_KEY' } | iex`,
        );
      }
      return exe;
    },
  };
}
