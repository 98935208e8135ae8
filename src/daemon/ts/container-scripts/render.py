"""rendering inside the job's container (Blender): downloads the scene,
renders the frames into the output folder, reports them as base64 files."""
import base64
import glob
import json
import os
import subprocess
import urllib.request

task = json.load(open(os.environ["SVC_TASK_FILE"]))["task_spec"]
inputs = task.get("inputs") or {}
out_dir = os.path.dirname(os.environ["SVC_RESULT_FILE"])
scene = os.path.join(out_dir, "scene.blend")
print("SVC_PROGRESS 2 downloading scene", flush=True)
urllib.request.urlretrieve(inputs["scene_url"], scene)
engine = {"cycles": "CYCLES", "eevee": "BLENDER_EEVEE"}[inputs.get("engine", "cycles")]
fmt = inputs.get("output_format", "PNG")
start, end = int(inputs.get("frame_start", 1)), int(inputs.get("frame_end", 1))
expr = ("import bpy; s=bpy.context.scene; s.render.resolution_x=%d; s.render.resolution_y=%d; "
        "s.render.resolution_percentage=100; s.cycles.samples=%d" % (
            int(inputs.get("resolution_x", 1920)), int(inputs.get("resolution_y", 1080)), int(inputs.get("samples", 128))))
cmd = ["blender", "-b", scene, "-E", engine, "--python-expr", expr, "-o", os.path.join(out_dir, "frame_####"),
       "-F", fmt, "-s", str(start), "-e", str(end), "-a"]
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
total = end - start + 1
done = 0
for line in proc.stdout:
    line = line.rstrip()
    print(line, flush=True)
    if line.startswith("Saved:"):
        done += 1
        print("SVC_PROGRESS %d rendering" % (5 + 95 * done // total), flush=True)
if proc.wait() != 0:
    raise SystemExit(proc.returncode)
files = []
for path in sorted(glob.glob(os.path.join(out_dir, "frame_*"))):
    files.append({"name": os.path.basename(path), "data": base64.b64encode(open(path, "rb").read()).decode("ascii")})
json.dump({"files": files, "frames": len(files), "format": fmt}, open(os.environ["SVC_RESULT_FILE"], "w"))
