"""rendering inside the job's container (Blender): renders the frames of the
scene into the output folder and reports them as base64 files. scene_url is
a .blend to download, or a built-in scene ("builtin:...") that Blender
builds procedurally: the default of a rendering job that names no scene. A
URL is fetched through svc_fetch (beside this file): never from the
provider's own network, at most MAX_SCENE_BYTES."""
import base64
import glob
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

# The most of scene_url downloaded (4 GiB: a .blend with its textures packed): a larger one fails the job.
MAX_SCENE_BYTES = 4 * 1024 * 1024 * 1024

# A fixed benchmark scene: 25 spheres of graded colour, metalness and
# roughness on a floor, lit by a sun and an area light (reflections, soft
# shadows, glossy and diffuse surfaces). Run by Blender on its factory scene.
BENCHMARK_SCENE = r'''
import bpy, math
s = bpy.context.scene
for o in list(bpy.data.objects):
    bpy.data.objects.remove(o, do_unlink=True)
def material(name, rgb, metallic, roughness):
    m = bpy.data.materials.new(name)
    m.use_nodes = True
    b = m.node_tree.nodes["Principled BSDF"]
    b.inputs["Base Color"].default_value = (rgb[0], rgb[1], rgb[2], 1.0)
    b.inputs["Metallic"].default_value = metallic
    b.inputs["Roughness"].default_value = roughness
    return m
bpy.ops.mesh.primitive_plane_add(size=60)
bpy.context.object.data.materials.append(material("floor", (0.8, 0.8, 0.8), 0.0, 0.6))
for i in range(5):
    for j in range(5):
        bpy.ops.mesh.primitive_uv_sphere_add(segments=64, ring_count=32, radius=0.9, location=((i - 2) * 2.4, (j - 2) * 2.4, 0.9))
        o = bpy.context.object
        for poly in o.data.polygons:
            poly.use_smooth = True
        o.data.materials.append(material("sphere_%d_%d" % (i, j), (0.2 + 0.15 * i, 0.3 + 0.1 * j, 0.9 - 0.15 * i), i / 4.0, 0.05 + j / 5.0))
bpy.ops.object.light_add(type="SUN", rotation=(math.radians(50), 0, math.radians(30)))
bpy.context.object.data.energy = 4.0
bpy.ops.object.light_add(type="AREA", location=(0, -6, 8))
bpy.context.object.data.energy = 800.0
bpy.context.object.data.size = 6.0
bpy.ops.object.camera_add(location=(0, -16, 10), rotation=(math.radians(58), 0, 0))
s.camera = bpy.context.object
w = bpy.data.worlds.new("sky")
w.use_nodes = True
w.node_tree.nodes["Background"].inputs["Color"].default_value = (0.05, 0.07, 0.1, 1.0)
s.world = w
# Raw samples: the same work on every build (some Blender builds lack the denoiser).
s.cycles.use_denoising = False
'''

BUILTIN_SCENES = {"builtin:benchmark-scene": BENCHMARK_SCENE}
ENGINES = {"cycles": "CYCLES", "eevee": "BLENDER_EEVEE"}


def blender_argv(inputs, out_dir):
    """The blender command line of a render; downloads the scene when it is a URL."""
    scene_url = inputs.get("scene_url") or "builtin:benchmark-scene"
    settings = ("import bpy; s=bpy.context.scene; s.render.resolution_x=%d; s.render.resolution_y=%d; "
                "s.render.resolution_percentage=100; s.cycles.samples=%d" % (
                    int(inputs.get("resolution_x", 1920)), int(inputs.get("resolution_y", 1080)), int(inputs.get("samples", 128))))
    if scene_url.startswith("builtin:"):
        if scene_url not in BUILTIN_SCENES:
            raise SystemExit("unknown built-in scene %r (this daemon knows %s)" % (scene_url, ", ".join(sorted(BUILTIN_SCENES))))
        # No .blend: the factory scene, rebuilt by the scene program before the settings apply.
        head = ["blender", "--factory-startup", "-b", "--python-expr", BUILTIN_SCENES[scene_url]]
    else:
        scene = os.path.join(out_dir, "scene.blend")
        print("SVC_PROGRESS 2 downloading scene", flush=True)
        try:
            svc_fetch.fetch_to_file(scene_url, scene, MAX_SCENE_BYTES)
        except svc_fetch.FetchError as err:
            raise SystemExit("scene_url: %s" % err)
        head = ["blender", "-b", scene]
    start, end = int(inputs.get("frame_start", 1)), int(inputs.get("frame_end", 1))
    return head + ["-E", ENGINES[inputs.get("engine", "cycles")], "--python-expr", settings,
                   "-o", os.path.join(out_dir, "frame_####"), "-F", inputs.get("output_format", "PNG"),
                   "-s", str(start), "-e", str(end), "-a"]


def main():
    task = json.load(open(os.environ["SVC_TASK_FILE"]))["task_spec"]
    inputs = task.get("inputs") or {}
    out_dir = os.path.dirname(os.environ["SVC_RESULT_FILE"])
    fmt = inputs.get("output_format", "PNG")
    cmd = blender_argv(inputs, out_dir)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    total = int(inputs.get("frame_end", 1)) - int(inputs.get("frame_start", 1)) + 1
    done = 0
    for line in proc.stdout:
        line = line.rstrip()
        print(line, flush=True)
        if line.startswith("Saved:"):
            done += 1
            print("SVC_PROGRESS %d rendering" % (5 + 95 * done // max(1, total)), flush=True)
    if proc.wait() != 0:
        raise SystemExit(proc.returncode)
    files = []
    for path in sorted(glob.glob(os.path.join(out_dir, "frame_*"))):
        files.append({"name": os.path.basename(path), "data": base64.b64encode(open(path, "rb").read()).decode("ascii")})
    json.dump({"files": files, "frames": len(files), "format": fmt}, open(os.environ["SVC_RESULT_FILE"], "w"))


if __name__ == "__main__":
    main()
