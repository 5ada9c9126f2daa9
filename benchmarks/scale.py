"""Tracer build and throughput at scale: the street block tiled into cities of 0.1-20 M triangles.

Usage::

    python benchmarks/scale.py [--sizes 0.1,1,5,20] [--reps 2] [--out FILE.md]

Per size (``wsim.scene.builtin.build_city`` with n x m tiles, 98,836 static triangles a tile plus the tiles' cars,
which wsim traces as instances of one prototype and the peers get flattened into one mesh at the scene's first time):

* build [s]: wsim's whole tracer (``SceneGeometry``: static ``wp.Mesh`` with its SAH BVH, the 8-wide BVH, the
  prototype's BLAS and wide BVH, the instance table and top-level BVH), Embree's scene commit (embreex, triangles
  already flattened; committed on the first query) and Open3D's ``RaycastingScene`` (add_triangles + first cast, which
  builds its BVH); best of ``--reps``;
* peak memory: the process's resident-set high-water mark during the build above its resident set before it (the
  kernel's peak counter is reset first, ``/proc/self/clear_refs``), in MiB and bytes per triangle; input arrays made
  before the build are not counted;
* closest-hit rays/s on a 128 x 3600 lidar fan from 2 m above the ego's first pose (tile 0): wsim on all cores
  (2 here) and one thread, Embree on one thread (embreex rtcIntersect1 loop), Open3D ``cast_rays`` (its own threads);
* PANDAR128 IDEALIZED sweep [s] on the city (``wsim.Lidar.preset``, roof mount, ``render(1.9, 2.0)``), best of 3.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import platform
import sys
import time
from pathlib import Path

import numpy as np
import warp as wp

wp.config.quiet = True

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import raycast as rc  # noqa: E402 - flatten, lidar_rays, street_origin, best_of, embree_scene

import wsim  # noqa: E402
from wsim import launch as wlaunch  # noqa: E402
from wsim.scene.builtin import build_city, build_street_scene  # noqa: E402
from wsim.scene.geometry import SceneGeometry  # noqa: E402

TILES = {0.1: (1, 1), 1: (2, 5), 5: (5, 10), 10: (10, 10), 20: (10, 20)}


def _status(key: str) -> float:
    return float(open("/proc/self/status").read().split(key + ":")[1].split()[0]) / 1024.0  # MiB


def measured(fn, reps: int):
    """(best time [s], peak resident memory above the start [MiB], last result) of ``reps`` calls of ``fn``."""
    best, peak, out = float("inf"), 0.0, None
    for _ in range(reps):
        out = None
        gc.collect()
        base = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        peak = max(peak, _status("VmHWM") - base)
    return best, peak, out


def open3d_build(verts: np.ndarray, faces: np.ndarray):
    import open3d as o3d

    s = o3d.t.geometry.RaycastingScene()
    s.add_triangles(o3d.core.Tensor(verts), o3d.core.Tensor(faces.astype(np.uint32)))
    s.cast_rays(o3d.core.Tensor(np.array([[0, 0, 0, 0, 0, 1]], np.float32)))  # builds the BVH
    return s


def bench(size: float, reps: int, block) -> dict:
    n, m = TILES[size]
    scene = build_city(n, m, block=block)
    t0 = scene.time_range[0]
    row = dict(size=size, tiles=f"{n}x{m}", tris=scene.num_triangles, static=scene.static.num_triangles,
               instances=len(scene.instances))
    cache = scene._device_cache  # noqa: SLF001 - dropped between reps so that each rep builds anew

    def build_wsim():
        cache.clear()
        return SceneGeometry(scene, "cpu")

    row["wsim_build"], row["wsim_mem"], geo = measured(build_wsim, reps)
    cache["cpu"] = geo
    verts, faces = rc.flatten(scene, t0)
    row["flat_tris"] = len(faces)
    row["embree_build"], row["embree_mem"], escene = measured(lambda: rc.embree_scene(verts, faces), reps)
    try:
        import open3d as o3d

        row["o3d_build"], row["o3d_mem"], oscene = measured(lambda: open3d_build(verts, faces), reps)
    except ImportError:
        o3d = oscene = None

    origin = rc.street_origin(scene, geo)
    o_np, d_np = rc.lidar_rays(origin, 128, 3600)
    nr = len(o_np)
    o = wp.array(o_np, dtype=wp.vec3, device="cpu")
    d = wp.array(d_np, dtype=wp.vec3, device="cpu")
    tt = wp.full(nr, t0, dtype=float, device="cpu")
    # the moving cars' top-level bounds over the rays' time, as every sensor sets them for its frame (without a
    # window they span each car's whole path and a 5 M city traces at about 0.6x the rate)
    geo.set_time_window(t0, t0)
    geo.trace(o, d, tt)
    row["threads"] = wlaunch.cpu_threads()
    row["wsim_rays"] = nr / rc.best_of(lambda: geo.trace(o, d, tt), 5)
    row["wsim_rays1"] = nr / rc.best_of(lambda: geo.trace(o, d, tt, threads=1), 3)
    escene.run(o_np, d_np, query="INTERSECT", output=1)
    row["embree_rays"] = nr / rc.best_of(lambda: escene.run(o_np, d_np, query="INTERSECT", output=1), 3)
    h = geo.trace(o, d, tt).numpy()
    r = escene.run(o_np, d_np, query="INTERSECT", output=1)
    e_hit, w_hit = r["geomID"] >= 0, h["face"] >= 0
    row["agree"] = float(((e_hit == w_hit) & (~w_hit | (np.abs(h["t"] - r["tfar"]) < 1e-3))).mean())
    if oscene is not None:
        rays = o3d.core.Tensor(np.concatenate([o_np, d_np], 1))
        oscene.cast_rays(rays)
        row["o3d_rays"] = nr / rc.best_of(lambda: oscene.cast_rays(rays), 3)
    del escene, oscene

    from wsim.cli import _mount

    lid = wsim.Lidar.preset("PANDAR128", scene=scene, rig=scene.ego_trajectory, mount=_mount(scene, "PANDAR128"),
                            device="cpu")
    lid.render(1.9, 2.0)
    row["sweep"] = rc.best_of(lambda: lid.render(1.9, 2.0), 3)
    return row


def table(rows: list[dict]) -> str:
    head = ["triangles (tiles)", "wsim build s", "Embree commit s", "Open3D build s", "wsim / Embree build",
            "wsim peak MiB (B/tri)", "Embree peak MiB (B/tri)", "Open3D peak MiB (B/tri)",
            "wsim Mrays/s 2T (1T)", "Embree Mrays/s 1T", "Open3D Mrays/s", "wsim 2T / Embree 1T",
            "agree with Embree", "PANDAR128 sweep s"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        def mem(k):
            return f"{r[k]:.0f} ({r[k] * 2**20 / r['tris']:.0f})" if k in r else "n/a"
        out.append("| " + " | ".join([
            f"{r['tris'] / 1e6:.2f} M ({r['tiles']})", f"{r['wsim_build']:.2f}", f"{r['embree_build']:.2f}",
            f"{r['o3d_build']:.2f}" if "o3d_build" in r else "n/a", f"{r['wsim_build'] / r['embree_build']:.2f}",
            mem("wsim_mem"), mem("embree_mem"), mem("o3d_mem"),
            f"{r['wsim_rays'] / 1e6:.2f} ({r['wsim_rays1'] / 1e6:.2f})", f"{r['embree_rays'] / 1e6:.2f}",
            f"{r['o3d_rays'] / 1e6:.2f}" if "o3d_rays" in r else "n/a", f"{r['wsim_rays'] / r['embree_rays']:.2f}",
            f"{100 * r['agree']:.2f} %", f"{r['sweep']:.3f}"]) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="0.1,1,5,20", help="million triangles, from " + ", ".join(map(str, TILES)))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    wp.init()
    block = build_street_scene()
    rows = []
    for s in (float(x) if float(x) != int(float(x)) else int(float(x)) for x in args.sizes.split(",")):
        rows.append(bench(s, args.reps, block))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        gc.collect()
    import embreex

    try:
        import open3d

        o3v = open3d.__version__
    except ImportError:
        o3v = "not installed"
    text = (f"{table(rows)}\n\n{platform.processor() or platform.machine()}, {wlaunch.cpu_threads()} threads, "
            f"Python {platform.python_version()}, Warp {wp.__version__}, embreex "
            f"{getattr(embreex, '__version__', '?')}, Open3D {o3v}; {datetime.date.today()}\n")
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
