"""Camera rendering benchmark: f-theta rolling-shutter frames of the built-in scene.

Usage::

    python benchmarks/camera.py [--quick] [--device cpu|cuda] [--out FILE.md]

Renders the built-in street block's ``camera_front_wide_120fov`` (f-theta, ROLLING_TOP_TO_BOTTOM, moving with the
scene's ego trajectory over a 30 ms frame) at 512×320 and 1920×1080, COLOR (sun + sky, one shadow ray per lit pixel)
and DISTANCE, and prints a Markdown table: frame time (best of several runs after a warm-up), the bare closest-hit
trace of the very same primary rays and the ratio frame / bare, primary rays per second, and memory (peak resident set size of the process, and the peak of Python allocations traced by ``tracemalloc`` during
one more, untimed render: tracing allocations slows the host side). Falls back to a synthetic scene (and says so) when the built-in scene cannot be loaded. The table is
written to ``benchmarks/RESULTS_camera.md`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import warp as wp

wp.config.quiet = True

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import wsim  # noqa: E402
from wsim import launch as wlaunch  # noqa: E402
from wsim.scene import CameraCalibration, Material, MeshData, Part, Scene, Trajectory  # noqa: E402
from wsim.kernels.lens import LensParams  # noqa: E402
from wsim.kernels.pose import lerp_pose  # noqa: E402
from wsim.kernels.shading import pixel_ray  # noqa: E402
from wsim.sensors.camera import Camera, CameraProduct  # noqa: E402

TARGETS = {(512, 320): 0.03, (1920, 1080): 0.25}  # COLOR frame-time targets [s] on a 2-core CPU


@wp.kernel
def _pixel_rays_kernel(lens: LensParams, shutter: int, poses: wp.array[wp.transform], t0: float, t1: float,
                       origin: wp.array[wp.vec3], direction: wp.array[wp.vec3], ray_time: wp.array[float]):
    """World primary ray of each pixel (row-major) as the renderer casts it: the pose at the pixel's rolling-shutter
    time (a pixel outside the field of view, which the renderer skips, is traced along +z)."""
    i = wp.tid()
    pr = pixel_ray(lens, shutter, i)
    pose = lerp_pose(poses[0], poses[1], pr[0])
    origin[i] = wp.transform_get_translation(pose)
    d = wp.vec3(0.0, 0.0, 1.0)
    if pr[4] > 0.0:
        d = wp.normalize(wp.quat_rotate(wp.transform_get_rotation(pose), wp.vec3(pr[1], pr[2], pr[3])))
    direction[i] = d
    ray_time[i] = t0 + pr[0] * (t1 - t0)


def _bare_trace_time(cam: Camera, geo: Any, t0: float, t1: float, runs: int) -> float:
    """Best time [s] of the bare closest-hit trace (``SceneGeometry.trace``, all threads) of the frame's primary
    rays, with the frame's time window held as the render holds it."""
    n = cam.width * cam.height
    dev = geo.device
    poses = cam._pose_array(t0, t1, None, None)[0]
    o = wp.empty(n, dtype=wp.vec3, device=dev)
    d = wp.empty(n, dtype=wp.vec3, device=dev)
    tt = wp.empty(n, dtype=float, device=dev)
    wp.launch(_pixel_rays_kernel, n, [cam._params, cam.shutter.device_code, poses, t0, t1, o, d, tt], device=dev)
    with geo.hold_time_window(t0, t1):
        geo.trace(o, d, tt, t_max=1.0e4)  # warm-up
        return _best(lambda: (geo.trace(o, d, tt, t_max=1.0e4), wp.synchronize_device(dev)), runs)


def _synthetic_scene() -> Scene:
    """Ground, rows of boxes and an ego trajectory with the built-in camera's calibration."""
    rng = np.random.default_rng(0)
    pts, faces, off = [], [], 0

    def add_box(lo, hi):
        nonlocal off
        lo, hi = np.asarray(lo, float), np.asarray(hi, float)
        p = np.array([[x, y, z] for z in (lo[2], hi[2]) for y in (lo[1], hi[1]) for x in (lo[0], hi[0])])
        f = np.array([[0, 2, 1], [1, 2, 3], [4, 5, 6], [5, 7, 6], [0, 1, 4], [1, 5, 4], [2, 6, 3], [3, 6, 7],
                      [0, 4, 2], [2, 4, 6], [1, 3, 5], [3, 7, 5]])
        pts.append(p)
        faces.append(f + off)
        off += 8

    add_box([-100, -100, -0.1], [300, 100, 0.0])
    for _ in range(400):
        c = rng.uniform([-50, -60, 0], [250, 60, 0])
        if abs(c[1]) < 8:
            continue
        s = rng.uniform([2, 2, 2], [12, 12, 25])
        add_box(c - s * [0.5, 0.5, 0], c + s * [0.5, 0.5, 1])
    s = Scene(MeshData(np.concatenate(pts), np.concatenate(faces), 1))
    s.materials.append(Material("grey", (0.5, 0.5, 0.5)))
    s.parts.append(Part("all", 1, s.semantic_class_index("building")))
    s.ego_trajectory = Trajectory([0.0, 12.0], [[0, 0, 0], [120, 0, 0]], [[0, 0, 0, 1.0]] * 2)
    bw = [0.0, 0.001, 4e-08, 7.1e-11, -1.5e-14, 0.0]
    rot = np.array([0.5, -0.5, 0.5, -0.5])  # OpenCV camera looking along rig +x
    s.cameras["camera_front_wide_120fov"] = CameraCalibration(
        "camera_front_wide_120fov", "ftheta",
        {"principal_point_x": 958.7, "principal_point_y": 541.3, "reference_poly": "PIXELDIST_TO_ANGLE",
         "pixeldist_to_angle_poly": bw, "max_angle": 1.1}, (1920, 1080), (np.array([1.5, 0, 1.5]), rot),
        "ROLLING_TOP_TO_BOTTOM")
    return s


def _best(fn, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one timed run per configuration")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS_camera.md"))
    args = ap.parse_args()
    dev = wp.get_device(args.device)
    runs = 1 if args.quick else 10

    note = ""
    try:
        scene = wsim.load_scene("builtin")
        name = "built-in street block (`wsim.load_scene(\"builtin\")`)"
        if "camera_front_wide_120fov" not in scene.cameras or scene.ego_trajectory is None:
            raise RuntimeError("the built-in scene has no camera_front_wide_120fov / ego trajectory")
    except Exception as e:  # noqa: BLE001 - any failure falls back to the synthetic scene, reported in the table
        scene = _synthetic_scene()
        name = "synthetic scene (ground + 400 boxes)"
        note = f"The built-in scene could not be used ({type(e).__name__}: {e}); a synthetic scene was rendered."
    t0 = float(scene.time_range[0]) + 1.0
    t1 = t0 + 0.030
    geo = scene.device_geometry(dev)

    rows = []
    for (w, h) in ((512, 320), (1920, 1080)):
        cam = Camera.from_scene(scene, "camera_front_wide_120fov", width=w, height=h, device=dev)
        bare = _bare_trace_time(cam, geo, t0, t1, runs)
        for prod, label in ((CameraProduct.COLOR, "COLOR (sun, sky, shadow rays)"), (CameraProduct.DISTANCE,
                                                                                      "DISTANCE")):
            def frame():
                fr = cam.render(geo, t0, t1, (prod,))
                wp.synchronize_device(dev)
                return fr

            fr = frame()  # compile / warm up
            dt = _best(frame, runs)
            tracemalloc.start()  # (one more frame, untimed: tracing every Python allocation slows the host side)
            frame()
            py_peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
            arr = fr[prod].numpy()
            hit = float(np.mean(arr.reshape(h * w, -1).max(axis=1) > 0)) if prod == CameraProduct.DISTANCE else None
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            target = TARGETS.get((w, h)) if prod == CameraProduct.COLOR else None
            rows.append((f"{w}×{h}", label, dt, w * h / dt / 1e6, rss, py_peak, target, hit, bare))

    lines = [
        "# Camera rendering benchmark",
        "",
        f"- Date: {datetime.date.today().isoformat()}; host: {platform.machine()} {platform.processor() or ''}, "
        f"{wlaunch.cpu_threads()} CPU threads; device: {dev}; Warp {wp.__version__}.",
        f"- Scene: {name}, {scene.num_triangles:,} triangles, {len(scene.instances)} instances.",
        "- Camera: `camera_front_wide_120fov` (f-theta), ROLLING_TOP_TO_BOTTOM, frame of 30 ms on the ego trajectory "
        f"from t = {t0:.3f} s; one ray per pixel (supersample 1), scene instances placed at each pixel's time.",
        f"- Frame time: best of {runs} run(s) after a warm-up; Mrays/s counts primary rays (COLOR adds one shadow "
        "ray per sunlit pixel). Peak RSS is the process maximum so far (includes Python, Warp, the scene); Python peak "
        "is tracemalloc's peak during one more render after the timed ones (tracing allocations slows them).",
    ]
    if note:
        lines.append(f"- **Note:** {note}")
    lines += ["- Bare trace: the frame's very primary rays (each pixel's pose and time) traced alone, closest hit only "
              "(`SceneGeometry.trace`, same threads); frame / bare is the sensor's cost over its rays' (COLOR also "
              "shades and casts shadow rays).",
              "", "| resolution | product | frame time [s] | target [s] | bare trace [s] | frame / bare | Mrays/s | "
              "peak RSS [MiB] | Python peak [MiB] |",
              "|---|---|---|---|---|---|---|---|---|"]
    for res, label, dt, mrays, rss, py, target, _hit, bare in rows:
        tgt = f"≤ {target} ({'met' if dt <= target else 'missed'})" if target else "—"
        lines.append(f"| {res} | {label} | {dt:.3f} | {tgt} | {bare:.3f} | {dt / bare:.2f} | {mrays:.2f} | "
                     f"{rss:.0f} | {py:.2f} |")
    hits = [r[7] for r in rows if r[7] is not None]
    if hits:
        lines += ["", f"Share of pixels that hit geometry (DISTANCE > 0): {hits[-1]:.1%}."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        print(f"written to {os.path.relpath(args.out)}")


if __name__ == "__main__":
    main()
