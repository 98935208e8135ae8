// JobTypeService: the job-type rules (public), for forms and tools.
import type { ServiceImpl } from "@connectrpc/connect";
import type { JobTypeService } from "../../gen/svc/v1/job_types_pb.js";
import { estimateFor, jobTypeRules } from "../domain/jobs/job-rules.js";
import type { Deps } from "./deps.js";

export function jobTypeService(_deps: Deps): Partial<ServiceImpl<typeof JobTypeService>> {
  // The rules are constants of this build: computed once.
  const rules = jobTypeRules();
  return {
    async listJobTypes() {
      return rules;
    },

    async estimateJob(req) {
      const e = estimateFor(req.jobType, req.durationMinutes);
      return { jobType: e.jobType, durationMinutes: e.durationMinutes, rateHalalaPerMinute: BigInt(e.rate), estimateHalala: BigInt(e.estimate) };
    },
  };
}
