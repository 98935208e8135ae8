"""image_generation inside the job's container (diffusers, installed at
start when the image lacks it). Writes {"data": base64 PNG, "format": "png"}."""
import base64
import io
import json
import os
import subprocess
import sys

task = json.load(open(os.environ["SVC_TASK_FILE"]))["task_spec"]
inputs = task.get("inputs") or {}
model_id = task.get("model") or inputs.get("model")
try:
    import diffusers  # noqa: F401
except ImportError:
    print("SVC_PROGRESS 2 installing diffusers", flush=True)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "diffusers", "transformers", "accelerate"])
import torch  # noqa: E402
from diffusers import AutoPipelineForText2Image  # noqa: E402

print("SVC_PROGRESS 10 loading model", flush=True)
cuda = torch.cuda.is_available()
pipe = AutoPipelineForText2Image.from_pretrained(model_id, torch_dtype=torch.float16 if cuda else torch.float32)
pipe = pipe.to("cuda" if cuda else "cpu")
steps = int(inputs.get("steps", 30))


def on_step(pipeline, step, timestep, kwargs):
    print("SVC_PROGRESS %d denoising" % (10 + 85 * (step + 1) // steps), flush=True)
    return kwargs


generator = torch.Generator("cuda" if cuda else "cpu").manual_seed(int(inputs["seed"])) if "seed" in inputs else None
args = {"prompt": inputs["prompt"], "num_inference_steps": steps, "width": int(inputs.get("width", 1024)),
        "height": int(inputs.get("height", 1024)), "generator": generator, "callback_on_step_end": on_step}
if inputs.get("negative_prompt"):
    args["negative_prompt"] = inputs["negative_prompt"]
if inputs.get("guidance_scale") is not None:
    args["guidance_scale"] = float(inputs["guidance_scale"])
image = pipe(**args).images[0]
buf = io.BytesIO()
image.save(buf, format="PNG")
json.dump({"data": base64.b64encode(buf.getvalue()).decode("ascii"), "format": "png", "model": model_id},
          open(os.environ["SVC_RESULT_FILE"], "w"))
print("SVC_PROGRESS 100 done", flush=True)
