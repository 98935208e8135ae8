// TemplateService: the built-in compute templates (public).
import type { ServiceImpl } from "@connectrpc/connect";
import type { TemplateService } from "../../gen/svc/v1/templates_pb.js";
import { listTemplates, templateById, templateMessage } from "../domain/jobs/templates.js";
import { optionalText } from "../domain/shared/validate.js";
import type { Deps } from "./deps.js";

export function templateService(_deps: Deps): Partial<ServiceImpl<typeof TemplateService>> {
  return {
    async list(req) {
      const tag = optionalText(req.tag, 100, "tag");
      const jobType = optionalText(req.jobType, 100, "job_type");
      return { templates: listTemplates({ tag, jobType }).map(templateMessage) };
    },
    async get(req) {
      return templateMessage(templateById(req.id));
    },
  };
}
