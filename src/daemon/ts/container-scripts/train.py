"""training inside the job's container: fine-tunes a causal LM on the text
lines of dataset_url (LoRA when peft is installable, else full), keeps
checkpoints in the workspace volume, and reports the artifacts.
dataset_url may name a built-in dataset ("builtin:..."), generated here
without a download: the default of a training job that names no data. A URL
is fetched through svc_fetch (beside this file): never from the provider's own
network, at most MAX_DATASET_BYTES."""
import json
import os
import subprocess
import sys

# svc_fetch lies beside this file (/svc-scripts, read-only in the container): no bytecode cache is written there.
_cache, sys.dont_write_bytecode = sys.dont_write_bytecode, True
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import svc_fetch  # noqa: E402

sys.dont_write_bytecode = _cache

# The most of dataset_url downloaded (256 MiB of text lines, held in memory): a larger one fails the job.
MAX_DATASET_BYTES = 256 * 1024 * 1024


def tiny_instruct():
    """128 one-line question/answer pairs of small sums and products, the same on every run."""
    lines = []
    for a in range(2, 10):
        for b in range(2, 10):
            lines.append("Question: What is %d plus %d? Answer: %d" % (a, b, a + b))
            lines.append("Question: What is %d times %d? Answer: %d" % (a, b, a * b))
    return lines


BUILTIN_DATASETS = {"builtin:tiny-instruct": tiny_instruct}


def load_lines(source):
    """The non-empty text lines of the training data: a built-in dataset or an http(s) URL."""
    if source.startswith("builtin:"):
        if source not in BUILTIN_DATASETS:
            raise SystemExit("unknown built-in dataset %r (this daemon knows %s)" % (source, ", ".join(sorted(BUILTIN_DATASETS))))
        return BUILTIN_DATASETS[source]()
    try:
        data = svc_fetch.fetch_bytes(source, MAX_DATASET_BYTES)
    except svc_fetch.FetchError as err:
        raise SystemExit("dataset_url: %s" % err)
    return [l.strip() for l in data.decode("utf-8").splitlines() if l.strip()]


def main():
    task = json.load(open(os.environ["SVC_TASK_FILE"]))["task_spec"]
    inputs = task.get("inputs") or {}
    workspace = (task.get("workspace") or {}).get("mount_path", "/workspace")
    base = inputs.get("base_model") or task.get("model")
    method = inputs.get("method", "lora")
    print("SVC_PROGRESS 1 loading data", flush=True)
    lines = load_lines(inputs.get("dataset_url") or "builtin:tiny-instruct")
    if method in ("lora", "qlora"):
        subprocess.call([sys.executable, "-m", "pip", "install", "-q", "peft"])
    import torch
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                              TrainerCallback, TrainingArguments)

    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    if method in ("lora", "qlora"):
        try:
            from peft import LoraConfig, get_peft_model
            model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, task_type="CAUSAL_LM"))
        except ImportError:
            print("peft is unavailable: training all weights", flush=True)
    enc = tokenizer(lines, truncation=True, max_length=512)

    class Lines(torch.utils.data.Dataset):
        def __len__(self):
            return len(enc["input_ids"])

        def __getitem__(self, i):
            ids = enc["input_ids"][i]
            return {"input_ids": ids, "attention_mask": enc["attention_mask"][i], "labels": ids}

    class Progress(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.max_steps:
                print("SVC_PROGRESS %d training" % (5 + 90 * state.global_step // state.max_steps), flush=True)

    out = os.path.join(workspace, inputs.get("output_name") or "model")
    args = TrainingArguments(output_dir=out, num_train_epochs=int(inputs.get("epochs", 3)),
                             per_device_train_batch_size=int(inputs.get("batch_size", 8)),
                             learning_rate=float(inputs.get("learning_rate", 2e-4)),
                             max_steps=int(inputs.get("max_steps", -1)), save_strategy="epoch", logging_steps=10, report_to=[])
    trainer = Trainer(model=model, args=args, train_dataset=Lines(), callbacks=[Progress()],
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    result = trainer.train()
    trainer.save_model(out)
    json.dump({"artifacts": [out], "train_loss": result.training_loss, "steps": result.global_step},
              open(os.environ["SVC_RESULT_FILE"], "w"))
    print("SVC_PROGRESS 100 done", flush=True)


if __name__ == "__main__":
    main()
