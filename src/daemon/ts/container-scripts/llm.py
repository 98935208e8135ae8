"""llm-inference inside the job's container (transformers). Reads the task
from $SVC_TASK_FILE, writes {"response": ...} to $SVC_RESULT_FILE."""
import json
import os

task = json.load(open(os.environ["SVC_TASK_FILE"]))["task_spec"]
inputs = task.get("inputs") or {}
model_id = task.get("model") or inputs.get("model")
print("SVC_PROGRESS 5 loading model", flush=True)
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

tokenizer = AutoTokenizer.from_pretrained(model_id)
model = AutoModelForCausalLM.from_pretrained(
    model_id, torch_dtype=torch.float16 if torch.cuda.is_available() else torch.float32,
    device_map="auto" if torch.cuda.is_available() else None)
messages = ([{"role": "system", "content": inputs["system"]}] if inputs.get("system") else []) + [
    {"role": "user", "content": inputs["prompt"]}]
if getattr(tokenizer, "chat_template", None):
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
else:
    ids = tokenizer(inputs["prompt"], return_tensors="pt").input_ids
ids = ids.to(model.device)
print("SVC_PROGRESS 40 generating", flush=True)
kwargs = {"max_new_tokens": int(inputs.get("max_tokens", 512)), "do_sample": True,
          "temperature": float(inputs.get("temperature", 0.7))}
if inputs.get("top_p") is not None:
    kwargs["top_p"] = float(inputs["top_p"])
out = model.generate(ids, **kwargs)
new_tokens = out[0][ids.shape[-1]:]
text = tokenizer.decode(new_tokens, skip_special_tokens=True)
print("SVC_PROGRESS 100 done", flush=True)
json.dump({"response": text, "model": model_id, "tokens": int(new_tokens.shape[-1])}, open(os.environ["SVC_RESULT_FILE"], "w"))
