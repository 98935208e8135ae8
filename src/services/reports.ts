// ReportService: figures per day for charts (a provider's earnings, a renter's /v1 usage, the platform's).
import type { ServiceImpl } from "@connectrpc/connect";
import type { ReportService } from "../../gen/svc/v1/reports_pb.js";
import { platformByDay, providerEarningsByDay, renterUsageByDay, reportDays } from "../domain/money/daily-reports.js";
import { callerProviderId, callerRenterId, type Deps } from "./deps.js";

export function reportService({ sql }: Deps): Partial<ServiceImpl<typeof ReportService>> {
  return {
    async getProviderEarnings(req, ctx) {
      return providerEarningsByDay(sql, callerProviderId(ctx), reportDays(req.days));
    },
    async getRenterUsage(req, ctx) {
      return renterUsageByDay(sql, callerRenterId(ctx), reportDays(req.days));
    },
    async getPlatformDaily(req) {
      return platformByDay(sql, reportDays(req.days));
    },
  };
}
