"""Lidar sweep benchmark: full wsim lidar sweeps on the built-in street block, against Embree (embreex, one thread).

Usage::

    python benchmarks/lidar.py [--quick] [--device cpu|cuda] [--out FILE.md]

Rows (sensors on the ego vehicle's ``SENSOR_RIG`` mounts, one full sweep delivered per 0.1 s step, partialOutputs
false):

* PANDAR128, IDEALIZED rays;
* PANDAR128, GAUSSIAN_BEAM (beamSamples 19 sub-rays per firing, maxReturns 2);
* AT128, IDEALIZED rays.

Per row, in a fresh subprocess (so that memory figures do not mix):

* wall time per sweep: best of N consecutive 0.1 s steps (``render(0.1 k, 0.1 (k + 1))``, k = 1..N) after a warm-up
  render of [0, 0.1] (kernel compile/load, scene BVH, emitter and material tables); each timed call returns the
  whole scan as a PointCloud (compacted Warp arrays on the device; Counts read back);
* points delivered (``PointCloud.count``: valid returns);
* rays/s: firings x sub-rays / sweep time, where firings = scan ticks x emitters (every fired emitter, hit or miss)
  and sub-rays = 1 (IDEALIZED) or beamSamples (beam models). It counts primary closest-hit queries only: extra BVH
  queries for further returns (``continue_past`` behind transmissive surfaces or for the second echo) are not counted;
* memory: (a) Warp's own allocation tracker (``wp.config.track_memory``), peak bytes allocated through Warp during
  one extra sweep -- per-firing slot buffers, compaction scan, output channels; the scene BVH built earlier is not
  included; (b) the process RSS high-water mark (``getrusage(RUSAGE_SELF).ru_maxrss``) after the warm-up and timed
  sweeps minus the one before the Lidar was created (scene loaded, BVH built and kernel module loaded by then): host
  memory the sweeps added, Warp CPU arrays and NumPy temporaries included;
* time split of one extra profiled sweep: the firing/tracing kernel against the rest (scan, compaction kernel,
  host-side tick tables and allocations);
* the bare trace of the very same rays: each timed step's ``Lidar.firing_rays`` (the sweep's first queries, one per
  firing and sub-ray, at the firing's own time and pose) through wsim's closest-hit kernel alone
  (``SceneGeometry.trace``, same threads) right after that step's sweep, best of the N steps, and the ratio
  sweep / bare: what the sensor costs beyond tracing its rays;
* Embree on the first timed step's rays (``rtcIntersect1`` loop in embreex, one thread, tfar = farRange; CPU runs only), the scene
  frozen at the sweep's mid time (moving actors flattened into one mesh there; wsim traces each ray at its own
  time), and the hit agreement with wsim's bare trace.

Scene construction for Embree is reused from ``benchmarks/raycast.py``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import warp as wp

wp.config.quiet = True

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import raycast  # noqa: E402  (Embree scene helpers, table/machine formatting)

#: Row key -> (label, preset, mount (rig frame), overrides).
ROWS = {
    "pandar_ideal": ("PANDAR128 IDEALIZED", "PANDAR128", "lidar_top_360fov", {}),
    "pandar_gauss": ("PANDAR128 GAUSSIAN_BEAM (19 sub-rays, maxReturns 2)", "PANDAR128", "lidar_top_360fov",
                     {"ray_type": "GAUSSIAN_BEAM", "max_returns": 2}),
    "at128_ideal": ("AT128 IDEALIZED", "AT128", "lidar_front_at128", {}),
}

#: Sweep-time targets [s] for (device kind, ray model): this 2-core machine class on CPU, one GPU on CUDA.
TARGETS = {("cpu", "IDEALIZED"): 0.25, ("cpu", "GAUSSIAN_BEAM"): 0.25,
           ("cuda", "IDEALIZED"): 1e-3, ("cuda", "GAUSSIAN_BEAM"): 5e-3}
#: Sweep / bare-trace targets for (device kind, ray model): what the sensor may cost on top of tracing its rays.
RATIO_TARGETS = {("cpu", "IDEALIZED"): 1.5}

STEP = 0.1  # application step [s]: one 10 Hz sweep per step


# ------------------------------------------------------------------------------------------------------ helpers
def _rss_mib() -> float:
    """Process RSS high-water mark [MiB] (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


#: Warp's tracker prints binary multiples with "KB"/"MB"/"GB" (10 * 2**20 bytes shows as "10.00 MB").
_UNITS = {"B": 1.0, "KB": 1024.0, "MB": 1024.0**2, "GB": 1024.0**3, "KIB": 1024.0, "MIB": 1024.0**2, "GIB": 1024.0**3}


def _tracker_peak(report: str, device: str) -> float | None:
    """Peak bytes for ``device`` from a ``wp.ScopedMemoryTracker`` report ("Peak usage:" section)."""
    sec = report.split("Peak usage:", 1)
    if len(sec) < 2:
        return None
    for line in sec[1].splitlines()[1:]:
        m = re.match(r"\s+(\S+)\s+([\d.]+)\s*([KMG]?i?B)\s*$", line)
        if not m:
            break
        if m.group(1) == device:
            return float(m.group(2)) * _UNITS[m.group(3).upper()]
    return None


# ---------------------------------------------------------------------------------------------------------- row
def run_row(key: str, device: str, reps: int, embree_reps: int) -> dict:
    """Measure one row (called in a fresh process); returns plain numbers."""
    wp.config.track_memory = True  # Warp allocation tracker (before wp.init); a few dozen allocations per sweep
    wp.init()
    import wsim
    import wsim.launch as wlaunch
    from wsim.scene.builtin import SENSOR_RIG
    from wsim.sensors.lidar import Lidar

    label, name, mount_key, overrides = ROWS[key]
    dev = wp.get_device(device)
    scene = wsim.load_scene("builtin")
    scene.device_geometry(str(dev))  # scene BVH: built before the baseline
    wp.load_module("wsim.kernels.lidar", device=dev)
    m = SENSOR_RIG["lidars"][mount_key]
    mount = (tuple(m["translation"]), tuple(m["rotation_xyzw"]))
    sync = (lambda: wp.synchronize_device(dev)) if dev.is_cuda else (lambda: None)

    rss0 = _rss_mib()
    lid = Lidar.preset(name, scene=scene, rig=scene.ego_trajectory, mount=mount, device=str(dev), **overrides)
    c = lid.config
    lid.render(0.0, STEP).count  # warm-up: compile/load, tables, first allocations
    sync()
    for k in range(1, reps + 1):  # the sweeps the memory figures cover (timed below, in turn with the bare traces)
        lid.render(k * STEP, (k + 1) * STEP).count
        sync()
    rss_delta = _rss_mib() - rss0

    # Warp allocations during one more sweep
    k = reps + 1
    reports: list[str] = []
    with wp.ScopedMemoryTracker("sweep", print=False, report_func=reports.append) as tracker:
        tracker.clear()
        lid.render(k * STEP, (k + 1) * STEP).count
        sync()
        tracker.report(max_items=1)
    warp_peak = _tracker_peak(reports[-1], str(dev)) if reports else None

    # time split of one more sweep: kernels launched through wsim.launch.launch, synchronised
    split: dict[str, float] = {}
    orig = wlaunch.launch

    def timed_launch(kernel, *a, **kw):
        s = time.perf_counter()
        orig(kernel, *a, **kw)
        sync()
        split[kernel.key] = split.get(kernel.key, 0.0) + time.perf_counter() - s

    k += 1
    wlaunch.launch = timed_launch
    try:
        s = time.perf_counter()
        lid.render(k * STEP, (k + 1) * STEP).count
        sync()
        split["total"] = time.perf_counter() - s
    finally:
        wlaunch.launch = orig

    ticks = len(lid._scan_ticks_ns())  # noqa: SLF001 - the render's own schedule
    firings = ticks * c.number_of_emitters
    sub = 1 if c.ray_type.name == "IDEALIZED" else c.beam_samples
    out = dict(key=key, label=label, ray_type=c.ray_type.name, device=str(dev), threads=wlaunch.cpu_threads(),
               reps=reps, ticks=ticks, emitters=c.number_of_emitters, firings=firings,
               sub_rays=sub, max_returns=c.max_returns, rss_delta_mib=rss_delta, warp_peak_bytes=warp_peak,
               split=split)

    # the very same rays, bare: each timed step's first queries (one per firing and sub-ray, at their own times)
    # through wsim's closest-hit kernel alone, traced right after that step's sweep; and the first step's rays through
    # Embree on the scene frozen at its mid time
    geo = scene.device_geometry(str(dev))

    def step_rays(kj: int):
        rays = lid.firing_rays(kj * STEP, (kj + 1) * STEP)
        fired = rays["fires"] != 0
        o, d, tm = rays["origin"][fired], rays["direction"][fired], rays["time"][fired]
        arrs = [wp.array(a, dtype=dt, device=dev) for a, dt in ((o, wp.vec3), (d, wp.vec3), (tm, float))]
        window = (float(tm.min()) - 1e-3, float(tm.max()) + 1e-3)  # as the render bounds its moving actors
        return (o, d, tm), arrs, window

    k += 1
    t0, t1 = k * STEP, (k + 1) * STEP
    # the reported sweep and bare times: each step's sweep, then the bare trace of its own rays, best of each over
    # the same steps (a busy spell on a shared machine then slows both alike and their ratio holds; each render
    # bounds the moving actors for its own window, each bare trace for its rays' times, outside the timing)
    best, count, bare_s, hits = float("inf"), 0, float("inf"), None
    for j in range(reps):
        kj = k + j
        host, (wo, wd, wt), window = step_rays(kj)  # (outside the timing)
        if j == 0:
            o, d = host[0], host[1]
        sync()
        t_a = time.perf_counter()
        pc = lid.render(kj * STEP, (kj + 1) * STEP)
        n = pc.count
        sync()
        dt = time.perf_counter() - t_a
        if dt < best:
            best, count = dt, n
        del pc
        geo.set_time_window(*window)
        t_a = time.perf_counter()
        h = geo.trace(wo, wd, wt, t_max=c.far_range_m)
        sync()
        bare_s = min(bare_s, time.perf_counter() - t_a)
        if j == 0:
            hits = h.numpy().copy()
        del h  # (held, it would keep the next trace from reusing its answer arrays)
    out.update(sweep_s=best, points=count, bare_s=bare_s, bare_rays=len(o))
    if dev.is_cpu:
        verts, faces = raycast.flatten(scene, 0.5 * (t0 + t1))
        escene = raycast.embree_scene(verts, faces)
        far = np.full(len(o), c.far_range_m, np.float32)
        run = lambda: escene.run(o, d, dists=far.copy(), query="INTERSECT", output=1)  # noqa: E731
        r = run()
        e_best = raycast.best_of(run, embree_reps)
        e_hit = r["geomID"] >= 0
        w_hit = hits["face"] >= 0
        agree = (e_hit == w_hit) & (~w_hit | (np.abs(hits["t"] - r["tfar"]) < 0.01))
        n_static = int(scene.static.num_triangles)  # raycast.flatten puts the static mesh first
        dis = ~agree
        actor = (e_hit & (r["primID"] >= n_static)) | (hits["instance"] >= 0)
        out.update(embree_s=e_best, embree_agree=float(agree.mean()),
                   actor_share=float((dis & actor).sum() / max(1, dis.sum())), wsim_hit_share=float(w_hit.mean()),
                   embree_tri=int(len(faces)))
    return out


# ------------------------------------------------------------------------------------------------------- driver
def _fmt_time(s: float, device: str) -> str:
    return f"{s * 1e3:.3f} ms" if device.startswith("cuda") else f"{s:.3f} s"


def _row_cells(r: dict, device: str) -> list[str]:
    t = r["sweep_s"]
    rays = r["firings"] * r["sub_rays"]
    kind = "cuda" if device.startswith("cuda") else "cpu"
    target = TARGETS[(kind, r["ray_type"])]
    ratio_target = RATIO_TARGETS.get((kind, r["ray_type"]))
    split = r.get("split", {})
    fire = split.get("lidar_fire_kernel", float("nan")) + split.get("lidar_first_kernel", 0.0)
    share = f"{100.0 * fire / split['total']:.0f} %" if split.get("total") else "-"
    peak = r.get("warp_peak_bytes")
    mem = f"{peak / 2**20:.1f} / {r['rss_delta_mib']:.1f}" if peak is not None else f"- / {r['rss_delta_mib']:.1f}"
    bare = r["bare_s"]
    ratio = t / bare
    met = t <= target and (ratio_target is None or ratio <= ratio_target)
    if "embree_s" in r:
        e = r["embree_s"]
        emb = [f"{e:.3f} s ({r['bare_rays'] / e / 1e6:.2f})", f"{100.0 * r['embree_agree']:.2f}"]
    else:
        emb = ["-", "-"]
    return [r["label"], _fmt_time(t, device), _fmt_time(target, device), f"{r['points']:,}",
            f"{r['firings']:,} x {r['sub_rays']}", f"{rays / t / 1e6:.2f}",
            f"{_fmt_time(bare, device)} ({r['bare_rays'] / bare / 1e6:.2f})", f"{ratio:.2f}",
            f"{ratio_target:.1f}" if ratio_target else "-", "yes" if met else "**no**", *emb, share, mem]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (about 30 s)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="Warp device for the lidar")
    ap.add_argument("--out", help="also write the report to this Markdown file")
    ap.add_argument("--row", choices=sorted(ROWS), help=argparse.SUPPRESS)  # internal: one row, JSON on stdout
    ap.add_argument("--reps", type=int, default=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.row:
        res = run_row(args.row, args.device, args.reps, args.reps)
        print("ROW-JSON " + json.dumps(res))
        return 0

    t_start = time.perf_counter()
    device = args.device
    notes: list[str] = []
    if device == "cuda":
        wp.init()
        if wp.get_cuda_device_count() == 0:
            notes.append("--device cuda: no CUDA device available; measured on the CPU instead.")
            device = "cpu"
    results: list[dict] = []
    failed: list[list[str]] = []
    for key, (label, *_rest) in ROWS.items():
        gauss = "gauss" in key
        reps = (1 if gauss else 3) if args.quick else (10 if gauss else 20)
        if device == "cuda":
            reps = 5 if args.quick else 20
        cmd = [sys.executable, str(Path(__file__).resolve()), "--row", key, "--device", device, "--reps", str(reps)]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT))
        line = [s for s in p.stdout.splitlines() if s.startswith("ROW-JSON ")]
        if p.returncode != 0 or not line:
            tail = (p.stderr.strip().splitlines() or ["?"])[-1]
            failed.append([label, f"failed (rc {p.returncode}): {tail}"])
            continue
        r = json.loads(line[-1][len("ROW-JSON "):])
        print(f"  {label}: {_fmt_time(r['sweep_s'], device)} per sweep", file=sys.stderr)
        results.append(r)

    header = ["sensor / ray model", "sweep (best)", "target", "points", "firings x sub-rays", "rays/s [M]",
              "bare trace, same rays (Mrays/s)", "sweep / bare", "target", "met", "Embree 1T, same rays (Mrays/s)",
              "hit agreement [%]", "fire kernel share", "Warp peak / RSS delta [MiB]"]
    rows = [_row_cells(r, device) for r in results]
    text = [raycast.table(header, rows)]
    text += [f"- {lbl}: {msg}" for lbl, msg in failed]
    text += [""]
    if results:
        r0 = results[0]
        dev_desc = (f"CPU, {r0['threads']} threads (wsim.launch shards)" if device == "cpu"
                    else f"{r0['device']}")
        text += [f"Built-in street block, sensors on the SENSOR_RIG mounts of the ego vehicle; wsim on {dev_desc}. "
                 "Sweep = one `render(t, t + 0.1)` call delivering a whole 10 Hz scan (partialOutputs false), best "
                 "of consecutive steps after a warm-up render "
                 f"({', '.join(str(r['reps']) for r in results)} timed steps per row). Points = delivered valid "
                 "returns. rays/s = firings (scan ticks x emitters, hits and misses) x sub-rays (1 for IDEALIZED, "
                 "beamSamples for GAUSSIAN_BEAM) / sweep time: primary closest-hit queries only, not the further "
                 "`continue_past` queries for second echoes or transmissive surfaces."]
        text += ["", "Memory: *Warp peak* = peak bytes allocated through Warp during one sweep (Warp's allocation "
                 "tracker: slot buffers for every firing x maxReturns, compaction scan, output channels; the scene "
                 "BVH, built once before, is not included). *RSS delta* = process RSS high-water mark "
                 "(`getrusage(...).ru_maxrss`, fresh process per row) after the warm-up and timed sweeps minus the "
                 "value before the Lidar was created (scene, BVH and kernel module already loaded): all host memory "
                 "the sweeps added on top of the scene."]
        text += ["", "Fire kernel share = time in `lidar_fire_kernel` (firing schedule, pose, tracing, echoes, "
                 "intensity, output frame) and `lidar_first_kernel` (IDEALIZED on the CPU: the firings' first static "
                 "surfaces as packets of neighbouring firings) / a profiled sweep; the rest is the firing-pose table, "
                 "the prefix scan of the batch counts, compaction kernel and host work (tick tables, array allocation, "
                 "Counts read-back)."]
        for r in results:
            sp = r.get("split", {})
            parts = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sp.items() if k != "total")
            other = sp.get("total", 0.0) - sum(v for k, v in sp.items() if k != "total")
            text += [f"- {r['label']}: profiled sweep {sp.get('total', float('nan')) * 1e3:.1f} ms = {parts}, "
                     f"other (host) {other * 1e3:.1f} ms."]
        text += ["", "*Bare trace* = the sweep's first queries alone: each timed step's rays (`Lidar.firing_rays`: "
                 "one per firing and sub-ray, world origin and direction at the firing's own time and pose) traced "
                 "by wsim's closest-hit kernel (`SceneGeometry.trace`, same threads, the same time window) right "
                 "after that step's sweep, best over the same steps (sweep and bare in turn: a busy spell on a "
                 "shared machine slows both alike). "
                 "*sweep / bare* is what the sensor costs on top of tracing its rays: schedule, "
                 "poses, further queries behind transmissive surfaces and for later echoes, echo merging, intensity, "
                 "output frame, every channel written, compaction."]
        emb = [r for r in results if "embree_s" in r]
        if emb:
            text += ["", "Embree: embreex `rtcIntersect1` loop on one thread (closest hit, tfar = farRange, full hit "
                     "records) on the first timed step's rays, best of the same number of runs, the scene frozen at "
                     "that sweep's mid time (moving actors flattened into one mesh of "
                     + ", ".join(f"{r['embree_tri']:,}" for r in emb[:1])
                     + " triangles; wsim traces every ray at its own time through its two-level BVH). Hit agreement "
                     "= same hit/miss as wsim's bare trace and, for hits, range within 1 cm. Share of the disagreeing "
                     "rays on a moving actor (in Embree's or wsim's hit): "
                     + ", ".join(f"{r['label']} {100.0 * r['actor_share']:.0f} %" for r in emb)
                     + ". wsim hit share: "
                     + ", ".join(f"{r['label']} {100.0 * r['wsim_hit_share']:.1f} %" for r in emb) + "."]
    text += [f"- {n}" for n in notes]
    text += ["", f"Total benchmark time {time.perf_counter() - t_start:.1f} s."]
    report = "\n".join(text)
    print(report)
    if args.out:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        tgt = ("Targets (this 2-core machine class): IDEALIZED sweep <= 1.5x the bare trace of its rays (and <= 0.25 "
               "s), GAUSSIAN_BEAM sweep <= 0.25 s; on CUDA: IDEALIZED <= 1 ms, GAUSSIAN_BEAM <= 5 ms.")
        Path(args.out).write_text(f"# Lidar sweep benchmark\n\nMachine: {raycast.machine({})}\n\nDate: {stamp}\n\n"
                                  f"Command: `python benchmarks/lidar.py{' --quick' if args.quick else ''}"
                                  f"{' --device cuda' if args.device == 'cuda' else ''}`\n\n{tgt}\n\n{report}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
