// ProviderService: thin translation between messages and domain calls.
import type { ServiceImpl } from "@connectrpc/connect";
import { ProviderLoginEmailRequestSchema, ProviderService, RegisterProviderRequestSchema } from "../../gen/svc/v1/providers_pb.js";
import { loginByEmail } from "../domain/accounts/login.js";
import {
  PROVIDER_OS,
  pauseProvider,
  providerByEmail,
  providerById,
  providerMessage,
  registerProvider,
  resumeProvider,
} from "../domain/providers/providers.js";
import { activeJobOfProvider, jobMessage, recentJobsOfProvider } from "../domain/jobs/jobs.js";
import { checkEmail, checkEnum, iso, optionalText, page, requireMembers } from "../domain/shared/validate.js";
import { MAX_VRAM_MIB, recordHeartbeat } from "../domain/providers/heartbeat.js";
import { count } from "../domain/shared/lenient.js";
import { recordDaemonEvent } from "../domain/providers/daemon-events.js";
import { recordReadiness } from "../domain/providers/readiness.js";
import { preferenceFields, setPreferences } from "../domain/providers/preferences.js";
import { isLive } from "../domain/shared/liveness.js";
import { offerWorkTo } from "../domain/dispatch/job-hooks.js";
import {
  DISCOVERY_HEALTH,
  DISCOVERY_MODE,
  MARKETPLACE_MAX_AGE_SECONDS,
  AVAILABLE_COUNT_REUSE_MS,
  availableCount,
  availableProviders,
  marketplaceSummaries,
} from "../domain/providers/marketplace.js";
import { reusedFor } from "../domain/shared/reuse.js";
import { providerRecentEarnings } from "../domain/money/daily-reports.js";
import { notFound, or500 } from "../errors.js";
import { callerKeys, callerProviderId, type Deps } from "./deps.js";
import { rotateKeys } from "../domain/accounts/key-rotation.js";

/** The installer of a key (register and rotate-key answer it): the spec's path, the key in its query. */
const installerPath = (apiKey: string, os: string) => `/api/providers/installer?key=${encodeURIComponent(apiKey)}&os=${encodeURIComponent(os)}`;

/** available-providers answers at most this many per page. */
const AVAILABLE_PAGE_MAX = 1000;

export function providerService(deps: Deps): Partial<ServiceImpl<typeof ProviderService>> {
  const { sql, config, log } = deps;
  const marketplace = marketplaceSummaries(sql);
  const countAvailable = reusedFor(() => availableCount(sql), AVAILABLE_COUNT_REUSE_MS);
  return {
    async register(req) {
      requireMembers(RegisterProviderRequestSchema, req);
      const os = checkEnum(req.os.trim().toLowerCase(), PROVIDER_OS, "os");
      const input = {
        name: optionalText(req.name, 200, "name")!,
        email: checkEmail(req.email),
        gpuModel: optionalText(req.gpuModel, 200, "gpu_model")!,
        os,
        phone: optionalText(req.phone, 50, "phone"),
        resourceSpec: req.resourceSpec,
      };
      const { id, apiKey } = await sql.begin((tx) => registerProvider(tx, input));
      log.info({ providerId: id }, "provider registered");
      return {
        success: true,
        providerId: BigInt(id),
        apiKey,
        installerUrl: installerPath(apiKey, os),
        message: "Provider registered. Save your API key now: it is shown only once. Your account awaits admin approval.",
      };
    },

    async loginEmail(req) {
      requireMembers(ProviderLoginEmailRequestSchema, req);
      const provider = await providerByEmail(sql, checkEmail(req.email));
      if (!provider) throw notFound("no provider with that email");
      const outcome = await loginByEmail(sql, config, log, "provider", provider.id, provider.email, req.code);
      if (outcome.kind === "code_sent") return { success: true, message: outcome.message, statusCode: 202 };
      return {
        success: true,
        apiKey: outcome.apiKey,
        provider: { id: BigInt(provider.id), name: provider.name, email: provider.email, gpuModel: provider.gpu_model, status: provider.status },
      };
    },

    async getMe(_req, ctx) {
      const id = callerProviderId(ctx);
      // One snapshot: a job settling meanwhile is in every figure (earnings, job count, recent and active jobs) or in none.
      const [provider, recent, active, earnings] = await sql.begin("isolation level repeatable read read only", (tx) =>
        Promise.all([providerById(tx, id), recentJobsOfProvider(tx, id), activeJobOfProvider(tx, id), providerRecentEarnings(tx, id)]),
      );
      const telemetry = (provider.gpu_telemetry ?? {}) as Record<string, unknown>;
      const num = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v : 0);
      // Figures past any card's size are not believed (as the heartbeat stores none): a used figure stays a whole number of MiB.
      const vramTotal = count(telemetry.gpu_vram_mib, MAX_VRAM_MIB) || provider.gpu_vram_mib || 0;
      const vramFree = typeof telemetry.free_vram_mib === "number" ? count(telemetry.free_vram_mib, MAX_VRAM_MIB) : undefined;
      return {
        provider: {
          provider: providerMessage(provider),
          gpuMetrics: {
            utilizationPct: num(telemetry.gpu_util_pct),
            // Unknown until the daemon reports free VRAM: 0, as the other figures it has not reported.
            vramUsedMib: BigInt(vramFree === undefined ? 0 : Math.max(0, vramTotal - vramFree)),
            temperatureC: num(telemetry.temp_c),
          },
          todayEarningsHalala: BigInt(earnings.today),
          weekEarningsHalala: BigInt(earnings.week),
          activeJob: active ? jobMessage(active) : undefined,
        },
        recentJobs: recent.map(jobMessage),
      };
    },

    async heartbeat(req, ctx) {
      const id = callerProviderId(ctx);
      const answer = await or500(log, "heartbeat failed", { providerId: id }, () => recordHeartbeat(deps, id, req));
      deps.metrics?.heartbeat("legacy");
      return answer;
    },

    daemonEvent(req, ctx) {
      return recordDaemonEvent(deps, callerProviderId(ctx), req);
    },

    readiness(req, ctx) {
      return recordReadiness(deps, callerProviderId(ctx), req);
    },

    async pause(_req, ctx) {
      return { success: true, status: await pauseProvider(sql, callerProviderId(ctx)) };
    },

    async resume(_req, ctx) {
      const id = callerProviderId(ctx);
      const { status, becameOnline } = await resumeProvider(sql, id);
      if (becameOnline) await offerWorkTo(sql, log, id);
      return { success: true, status };
    },

    async setPreferences(req, ctx) {
      const id = callerProviderId(ctx);
      const prefs = await sql.begin((tx) =>
        setPreferences(tx, id, {
          runMode: req.runMode,
          scheduledStart: req.scheduledStart,
          scheduledEnd: req.scheduledEnd,
          gpuUsageCapPct: req.gpuUsageCapPct,
          vramReserveGb: req.vramReserveGb,
          tempLimitC: req.tempLimitC,
        }),
      );
      // A change can widen what the provider takes (always-on again, less VRAM held back): offered queued work now.
      await offerWorkTo(sql, log, id);
      return {
        success: true,
        preferences: preferenceFields(prefs),
      };
    },

    async rotateKey(_req, ctx) {
      const id = callerProviderId(ctx);
      const apiKey = await sql.begin((tx) => rotateKeys(tx, "provider", id, callerKeys(ctx)));
      const provider = await providerById(sql, id);
      log.info({ providerId: id }, "provider key rotated");
      return {
        success: true,
        message:
          "API key rotated. Every earlier key of this provider stopped working and its daemon was disconnected: " +
          "run the installer again (or restart the daemon with the new key). Save this key now: it is shown only once.",
        apiKey,
        providerId: BigInt(id),
        installerUrl: installerPath(apiKey, provider.os),
      };
    },

    async getStatus(_req, ctx) {
      // Live by the database's clock, which stored the last heartbeat (docs/architecture.md: one clock).
      const [p, [{ now }]] = await Promise.all([providerById(sql, callerProviderId(ctx)), sql<{ now: Date }[]>`SELECT now()`]);
      return {
        providerId: BigInt(p.id),
        name: p.name,
        status: p.status,
        gpuModel: p.gpu_model,
        lastHeartbeat: iso(p.last_heartbeat),
        totalEarnings: p.total_earnings_halala,
        totalJobs: BigInt(p.total_jobs),
        uptimePercent: p.uptime_percent,
        isLive: isLive(p.last_heartbeat, now),
        approvalStatus: p.approval_status,
        isPaused: p.is_paused,
        reliabilityScore: p.reliability_score ?? undefined,
        taskKeyMismatch: p.task_key_mismatch ?? undefined,
      };
    },

    async listAvailable(req) {
      const { limit, offset } = page(req.limit ?? AVAILABLE_PAGE_MAX, req.offset, AVAILABLE_PAGE_MAX, undefined, 1_000_000_000);
      const { providers, total } = await availableProviders(sql, limit, offset, countAvailable);
      return { providers, total: BigInt(total), discoveryMode: DISCOVERY_MODE, discoveryHealth: DISCOVERY_HEALTH };
    },

    async getMarketplace(_req, ctx) {
      ctx.responseHeader.set("cache-control", `public, max-age=${MARKETPLACE_MAX_AGE_SECONDS}`);
      return marketplace();
    },
  };
}
