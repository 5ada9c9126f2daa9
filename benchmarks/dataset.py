"""Dataset benchmark: frames per second of ``wsim dataset`` with 1 and 2 local workers and on Ray (2 CPUs), against a
single-process loop that renders and writes the same frames.

Usage::

    python benchmarks/dataset.py [--frames N] [--quick] [--out FILE.md]

The spec: the built-in street block, its roof PANDAR128 (full 10 Hz sweeps, every channel) and the front f-theta
camera at 480 x 270 (COLOR PNG + DISTANCE), ``--frames`` frames at 10 Hz (default 60) in shards of 10, both outputs
(MCAP, zstd, and the folder layout). Every configuration runs in a fresh process and is timed from the process start
to its exit (interpreter start, imports, scene loading and BVH builds included), so each pays for what a user's
command pays for:

- **loop**: one process loading the scene once and rendering every frame in order, writing the same files with the
  same writers (PLY + PNG + NPY + frame JSON, one MCAP file per 10 frames), all cores for each launch;
- **1 worker**: ``wsim dataset --workers 1`` (one worker process with all cores: the job system's overhead is this
  against the loop — planning, the driver's scene load, the worker's start, the manifest, the progress bar);
- **2 workers**: ``--workers 2`` (two processes x 1 thread);
- **Ray**: ``--ray auto`` (a local Ray instance with 2 CPUs, one task per shard; its start-up is included).

Each run's CPU time (user + system of the process and the descendants it waited for: the workers; Ray's
daemons partly) is reported too: on a machine shared with other work it varies less than the wall time. The loop's
frame files are compared with the datasets' (byte-identical). Every run imports a copy of ``wsim/`` made
at the start (the same code throughout, even while the checkout changes), configurations take turns (``--repeat``
rounds; best and median reported). Results go to ``benchmarks/RESULTS_dataset.md`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 10


def spec_text(frames: int) -> str:
    return f"""name: bench
scenes: [builtin]
rig:
  lidars:
    - preset: PANDAR128          # the scene rig's roof mount (lidar_top_360fov)
  cameras:
    - {{id: camera_front_wide_120fov, width: 480, height: 270}}
frames: {{rate_hz: 10, start_s: 1.0, count: {frames}, chunk: {CHUNK}}}
"""


LOOP = r'''
import sys, time
from pathlib import Path
from wsim.dataset import load_spec, plan_dataset
from wsim.dataset.render import foxglove_calibration, init_worker, _sensors
from wsim.dataset.writers import (CameraFrameOut, FolderWriter, FrameOut, LidarFrame, McapShardWriter, params_json,
                                  point_table)
from wsim.scene.loader import load_scene
from wsim.sensors.camera import encode_png

init_worker()
spec_path, out = sys.argv[1], Path(sys.argv[2])
scene = load_scene("builtin")
plan = plan_dataset(load_spec(spec_path), scenes={"builtin": scene})  # the same sensors, mounts and frame times
task0 = plan.shards[0]
lidars, cams = _sensors(task0, scene)
cal = {ct.id: foxglove_calibration(cam) for ct, cam in cams}
mounts = {lt.id: (lt.translation, lt.rotation_xyzw) for lt, _ in lidars}
mounts.update({ct.id: (ct.translation, ct.rotation_xyzw) for ct, _ in cams})
origin = int(scene.time_origin_us * 1000)
for task in plan.shards:
    folder, mcap = FolderWriter(out, task), McapShardWriter(out / task.mcap_path)
    for k, t in task.frames:
        fr = FrameOut(k, t, origin + int(round(t * 1e9)), scene.ego_trajectory.pose_at(t))
        for lt, lidar in lidars:
            lidar.frame_id = k - 1
            pc = lidar.render(t, t + task.frame_span_s)
            p = params_json(pc.params)
            fr.lidars.append(LidarFrame(lt.id, point_table(pc), p, lt.id, (t, t + task.frame_span_s),
                                        int(p["timestampNs"])))
        for ct, cam in cams:
            f = cam.render(scene, t, t + ct.readout_s, products=("color", "distance"))
            fr.cameras.append(CameraFrameOut(ct.id, cam.width, cam.height, (t, t + ct.readout_s), fr.timestamp_ns,
                                             f.start_pose, f.end_pose, encode_png(f.color.numpy()),
                                             f.distance.numpy()))
        folder.write_frame(fr)
        mcap.write_frame(fr, mounts, cal)
    mcap.close()
'''


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall [s], CPU [s]: user + system of the process and every descendant it waited for)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"benchmark: {' '.join(cmd[:4])} failed:\n{r.stderr[-3000:]}")
    return dt, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def frame_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("frames/*/*")) if p.is_file()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--quick", action="store_true", help="20 frames, Ray skipped")
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration, round robin (best and median "
                    "reported)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS_dataset.md"))
    args = ap.parse_args()
    frames = 20 if args.quick else args.frames
    py = sys.executable
    wsim_cmd = [py, "-m", "wsim.cli", "dataset"]
    has_ray = not args.quick and importlib.util.find_spec("ray") is not None
    work = Path(tempfile.mkdtemp(prefix="wsim-bench-dataset-"))
    spec = work / "spec.yaml"
    spec.write_text(spec_text(frames))
    shutil.copytree(ROOT / "wsim", work / "src" / "wsim", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(work / "src")}  # a snapshot: every run renders with the same code
    env.pop("WSIM_NUM_THREADS", None)
    configs = [("loop (1 process, 2 threads)", [py, "-c", LOOP, str(spec), "{out}"]),
               ("wsim dataset --workers 1 (1 x 2 threads)", wsim_cmd + [str(spec), "--out", "{out}", "--workers", "1",
                                                                      "--quiet"]),
               ("wsim dataset --workers 2 (2 x 1 thread)", wsim_cmd + [str(spec), "--out", "{out}", "--workers", "2",
                                                                     "--quiet"])]
    if has_ray:
        configs.append(("wsim dataset --ray auto (2 CPUs, 1 thread per task)",
                        wsim_cmd + [str(spec), "--out", "{out}", "--ray", "auto", "--quiet"]))
    # warm Warp's kernel cache (a first compile would be charged to whichever runs first)
    (work / "warm.yaml").write_text(spec_text(1))
    run(wsim_cmd + [str(work / "warm.yaml"), "--out", str(work / "warm"), "--workers", "0", "--quiet"], env, work)
    shutil.rmtree(work / "warm", ignore_errors=True)
    times: dict[str, list[float]] = {name: [] for name, _ in configs}
    cpu_s: dict[str, list[float]] = {name: [] for name, _ in configs}
    digests: dict[str, dict] = {}
    sizes: dict[str, int] = {}
    for _ in range(args.repeat):  # round robin, so that a busy spell of the machine hits every configuration
        for name, cmd in configs:
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            wall, cpu = run([c.replace("{out}", str(out)) for c in cmd], env, work)
            times[name].append(wall)
            cpu_s[name].append(cpu)
            digests[name] = frame_digest(out)
            sizes[name] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            print(f"{name:<55} {wall:7.2f} s wall {cpu:7.2f} s CPU", flush=True)
    ref = digests[configs[0][0]]
    rows = [(name, min(times[name]), statistics.median(times[name]), min(cpu_s[name]), digests[name] == ref,
             sizes[name]) for name, _ in configs]
    shutil.rmtree(work, ignore_errors=True)
    loop_s = rows[0][1]
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [
        "# wsim dataset benchmark",
        "",
        f"{datetime.date.today().isoformat()}, {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"CPU only. `python benchmarks/dataset.py --frames {frames}`.",
        "",
        f"Spec: the built-in street block, PANDAR128 full sweeps (every channel, about 210k points) + "
        f"camera_front_wide_120fov 480x270 (COLOR PNG + DISTANCE), {frames} frames at 10 Hz in shards of {CHUNK}, "
        "MCAP (zstd) + folder layout. Each configuration is a fresh process timed from start to exit (imports, scene "
        "loading, BVH builds, worker start-up and, for Ray, its start-up included); the frame files of every run are "
        "compared with the loop's.",
        "",
        f"| configuration | best wall [s] | frames/s | wall vs loop | median wall of {args.repeat} [s] | CPU [s] | "
        "CPU vs loop | frame files identical to the loop's | dataset size |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    loop_cpu = rows[0][3]
    for name, s, med, cpu, same, size in rows:
        # Ray's workers are children of its raylet, which is not waited for: their CPU time is not counted
        cpu_cells = ("n/a", "n/a") if "--ray" in name else (f"{cpu:.1f}", f"{cpu / loop_cpu:.3f}x")
        lines.append(f"| {name} | {s:.2f} | {frames / s:.2f} | {s / loop_s:.3f}x | {med:.2f} | {cpu_cells[0]} | "
                     f"{cpu_cells[1]} | {'yes' if same else 'NO'} | {size / 2**20:.0f} MiB |")
    if len(rows) > 1:
        lines += ["", f"Job-system overhead (1 worker against the loop, same cores): "
                  f"{(rows[1][1] / loop_s - 1) * 100:+.1f} % wall (best of {args.repeat}), "
                  f"{(rows[1][3] / loop_cpu - 1) * 100:+.1f} % CPU (target <= 10 %)."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
