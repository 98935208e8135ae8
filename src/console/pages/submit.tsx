// The submit form, generated from the job-type rules the server validates
// with (JobTypeService.ListJobTypes): types, parameters with their ranges and
// defaults, per-minute rates and the submit limits. Nothing here restates them.
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import { toJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { useState } from "preact/hooks";
import type { JobParam, JobTypeRule, ListJobTypesResponse } from "../../../gen/svc/v1/job_types_pb.js";
import { api } from "../api.js";
import { sar } from "../format.js";
import { go, href } from "../router.js";
import { Card, ErrorBox, Field, Show, useAction, useId, useLoad } from "../ui.js";

const defaultOf = (p: JobParam): JsonValue | undefined => (p.defaultValue ? toJson(ValueSchema, p.defaultValue) : undefined);

function rangeText(p: JobParam): string {
  const parts: string[] = [];
  if (p.minimum !== undefined && p.maximum !== undefined) parts.push(`${p.exclusiveMinimum ? "above" : "from"} ${p.minimum} to ${p.maximum}`);
  else if (p.maximum !== undefined) parts.push(`at most ${p.maximum}`);
  if (p.maxLength !== undefined) parts.push(`up to ${p.maxLength} characters`);
  if (p.patternMessage) parts.push(p.patternMessage);
  const d = defaultOf(p);
  if (d !== undefined) parts.push(`default ${typeof d === "string" ? d : JSON.stringify(d)}`);
  return [p.description, parts.join(", ")].filter(Boolean).join(" — ");
}

/** The form's text for a parameter, turned into the JSON value the server expects; undefined when left empty. */
function valueOf(p: JobParam, text: string): JsonValue | undefined {
  if (text.trim() === "") return undefined;
  switch (p.type) {
    case "integer":
    case "number":
      return Number(text);
    case "boolean":
      return text === "true";
    case "array":
      return text.split("\n").map((l) => l.trim()).filter(Boolean);
    case "object": {
      const o: JsonObject = {};
      for (const line of text.split("\n")) {
        const i = line.indexOf("=");
        if (line.trim() && i > 0) o[line.slice(0, i).trim()] = line.slice(i + 1);
      }
      return o;
    }
    default:
      return text;
  }
}

function ParamField({ p, value, onChange }: { p: JobParam; value: string; onChange(v: string): void }) {
  const id = useId(`param-${p.name}`);
  const label = `${p.name.replace(/_/g, " ")}${p.required ? "" : " (optional)"}`;
  const hint = rangeText(p);
  const common = { id, "aria-describedby": hint ? `${id}-hint` : undefined, required: p.required, name: p.name };
  const input = (e: Event) => onChange((e.target as HTMLInputElement).value);
  let control;
  if (p.choices.length > 0) {
    const d = defaultOf(p);
    control = (
      <select {...common} value={value} onChange={input}>
        {!p.required ? <option value="">{d !== undefined ? `default (${String(d)})` : "none"}</option> : null}
        {p.choices.map((c) => <option value={c}>{c}</option>)}
      </select>
    );
  } else if (p.type === "integer" || p.type === "number") {
    const d = defaultOf(p);
    control = (
      <input {...common} type="number" inputMode={p.type === "integer" ? "numeric" : "decimal"} step={p.type === "integer" ? 1 : "any"}
        min={p.exclusiveMinimum ? undefined : p.minimum} max={p.maximum} placeholder={d !== undefined ? String(d) : ""} value={value} onInput={input} />
    );
  } else if (p.type === "boolean") {
    control = <input {...common} type="checkbox" checked={value === "true"} onChange={(e) => onChange((e.target as HTMLInputElement).checked ? "true" : "")} />;
  } else if (p.type === "array" || p.type === "object" || (p.maxLength ?? 0) > 500) {
    const d = defaultOf(p);
    const ph = p.type === "array" ? "one item per line" : p.type === "object" ? "NAME=value, one per line" : typeof d === "string" ? d : "";
    control = <textarea {...common} rows={p.type === "string" ? 4 : 3} maxLength={p.maxLength} placeholder={ph} value={value} onInput={input} />;
  } else {
    const d = defaultOf(p);
    control = <input {...common} type="text" maxLength={p.maxLength} placeholder={typeof d === "string" ? d : ""} value={value} onInput={input} />;
  }
  return (
    <Field id={id} label={label} hint={hint}>
      {control}
    </Field>
  );
}


function SubmitForm({ rules }: { rules: ListJobTypesResponse }) {
  const [type, setType] = useState(rules.jobTypes[0]?.jobType ?? "");
  const [params, setParams] = useState<Record<string, string>>({});
  const [minutes, setMinutes] = useState(String(rules.durationMinutes?.defaultValue ?? 10));
  const [maxSeconds, setMaxSeconds] = useState("");
  const [priority, setPriority] = useState(String(rules.priority?.defaultValue ?? 2));
  const [vram, setVram] = useState("");
  const [gpuModel, setGpuModel] = useState("");
  const [templateId, setTemplateId] = useState("");
  const templates = useLoad(() => api.templates.list({ jobType: type }), [type]);
  const a = useAction();
  const ids = { type: useId("type"), minutes: useId("minutes"), max: useId("maxsec"), prio: useId("prio"), vram: useId("vram"), model: useId("gpumodel"), tpl: useId("tpl") };
  const rule = rules.jobTypes.find((t) => t.jobType === type)!;
  const m = Number(minutes);
  // The server's estimate rule (EstimateJob), so the form never restates it.
  const est = useLoad(() => (m > 0 ? api.jobTypes.estimateJob({ jobType: type, durationMinutes: m }) : Promise.resolve(undefined)), [type, m]);
  const d = rules.durationMinutes!;
  const submit = () =>
    a.run(async () => {
      const p: JsonObject = {};
      for (const param of rule.params) {
        const v = valueOf(param, params[param.name] ?? "");
        if (v !== undefined) p[param.name] = v;
      }
      // The number field passes "1e3" and "1500.0" as whole numbers; BigInt() takes digits alone.
      const maxRun = maxSeconds.trim() ? Number(maxSeconds) : undefined;
      if (maxRun !== undefined && !Number.isSafeInteger(maxRun)) throw new Error("Longest run (seconds) must be a whole number of seconds, e.g. 3600.");
      const gpu: JsonObject = {};
      if (vram) gpu.min_vram_gb = Number(vram);
      if (gpuModel.trim()) gpu.gpu_model = gpuModel.trim();
      const r = await api.jobs.submit({
        jobType: type,
        durationMinutes: m,
        params: p,
        priority: Number(priority),
        idempotencyKey: crypto.randomUUID(),
        ...(maxRun !== undefined ? { maxDurationSeconds: BigInt(maxRun) } : {}),
        ...(Object.keys(gpu).length ? { gpuRequirements: gpu } : {}),
        ...(templateId ? { templateId } : {}),
      });
      go("renter", "jobs", r.job!.job!.jobId);
    });
  return (
    <form
      class="submit-form"
      onSubmit={(e) => {
        e.preventDefault();
        void submit();
      }}
    >
      <div class="grid2">
        <div>
          <Field id={ids.type} label="Job type">
            <select id={ids.type} value={type} onChange={(e) => { setType((e.target as HTMLSelectElement).value); setParams({}); setTemplateId(""); }}>
              {rules.jobTypes.map((t) => (
                <option value={t.jobType}>{t.jobType} — {sar(t.rateHalalaPerMinute)}/min</option>
              ))}
            </select>
          </Field>
          <Field id={ids.tpl} label="Template (optional)">
            <select id={ids.tpl} value={templateId} onChange={(e) => setTemplateId((e.target as HTMLSelectElement).value)}>
              <option value="">none</option>
              {(templates.data?.templates ?? []).map((t) => <option value={t.id}>{t.name}</option>)}
            </select>
          </Field>
          <fieldset>
            <legend>Parameters of {type}</legend>
            {rule.params.map((p) => (
              <ParamField key={`${type}-${p.name}`} p={p} value={params[p.name] ?? ""} onChange={(v) => setParams({ ...params, [p.name]: v })} />
            ))}
          </fieldset>
        </div>
        <div>
          <fieldset>
            <legend>Time and cost</legend>
            <Field id={ids.minutes} label="Duration (minutes)" hint={`${d.minimum} to ${d.maximum}; the estimate is held from your balance, and you pay for the minutes used`}>
              <input id={ids.minutes} type="number" required step="any" min={d.minimum} max={d.maximum} value={minutes} aria-describedby={`${ids.minutes}-hint`}
                onInput={(e) => setMinutes((e.target as HTMLInputElement).value)} />
            </Field>
            <p class="estimate" data-testid="estimate" aria-live="polite">
              Estimate: <strong>{est.data && !est.error && est.data.jobType === type && est.data.durationMinutes === m ? sar(est.data.estimateHalala) : "—"}</strong> ({sar(rule.rateHalalaPerMinute)} per minute)
            </p>
            <Field id={ids.max} label="Longest run (seconds, optional)"
              hint={`${rules.maxDurationSeconds!.minimum} to ${rules.maxDurationSeconds!.maximum}, default ${rules.maxDurationSeconds!.defaultValue}`}>
              <input id={ids.max} type="number" step={1} min={rules.maxDurationSeconds!.minimum} max={rules.maxDurationSeconds!.maximum}
                placeholder={String(rules.maxDurationSeconds!.defaultValue)} value={maxSeconds} onInput={(e) => setMaxSeconds((e.target as HTMLInputElement).value)} />
            </Field>
            <Field id={ids.prio} label="Priority">
              <select id={ids.prio} value={priority} onChange={(e) => setPriority((e.target as HTMLSelectElement).value)}>
                {[1, 2, 3].filter((v) => v >= rules.priority!.minimum && v <= rules.priority!.maximum).map((v) => (
                  <option value={String(v)}>{v === 1 ? "1 — high" : v === 2 ? "2 — normal" : "3 — low"}</option>
                ))}
              </select>
            </Field>
          </fieldset>
          <fieldset>
            <legend>GPU requirements (optional)</legend>
            <Field id={ids.vram} label="Minimum VRAM (GB)">
              <input id={ids.vram} type="number" step="any" min={rules.minVramGb!.minimum} max={rules.minVramGb!.maximum} value={vram}
                onInput={(e) => setVram((e.target as HTMLInputElement).value)} />
            </Field>
            <Field id={ids.model} label="GPU model contains">
              <input id={ids.model} maxLength={100} placeholder="e.g. 4090" value={gpuModel} onInput={(e) => setGpuModel((e.target as HTMLInputElement).value)} />
            </Field>
          </fieldset>
          <ErrorBox error={a.error} />
          <button type="submit" disabled={a.busy}>Submit job</button>
        </div>
      </div>
    </form>
  );
}

export function SubmitPage() {
  const rules = useLoad(() => api.jobTypes.listJobTypes({}), []);
  return (
    <>
      <h1>New job</h1>
      <p>
        Funds are held when you submit and settled by the minutes used. <a href={href("renter")}>Check your balance</a>.
      </p>
      <Card title="Job">
        <Show l={rules} what="job types">{(r) => <SubmitForm rules={r} />}</Show>
      </Card>
    </>
  );
}
