"""Closest-hit ray casting benchmark: wsim (Warp BVH) against Embree (embreex, one thread).

Usage::

    python benchmarks/raycast.py [--quick] [--device cpu|cuda] [--out FILE.md]

Prints a Markdown table with, per scene, the BVH build time (wsim's static ``wp.Mesh`` and Embree's scene commit) and
the closest-hit throughput on lidar-like rays (128 elevations from -25 to +15 degrees times a few thousand azimuths,
cast from about 2 m above the ground): wsim on one CPU thread, wsim on all cores, Embree on one thread, their ratio,
the CPU scaling of wsim, and the share of rays on which wsim and Embree agree (same hit/miss and, for hits, distance
within 1 mm). With ``--device cuda`` wsim is also timed on the GPU with the lbvh, sah and cubql constructors.

Scenes: the built-in street block (``wsim.load_scene("builtin")``, when ``wsim/data/street_block.usdc`` exists) and
a generated ~500k-triangle scene (noisy terrain, random boxes, subdivided spheres). Kernels are compiled and warmed up
before timing; every figure is the best of several runs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import warp as wp

wp.config.quiet = True

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import wsim  # noqa: E402
from wsim import launch as wlaunch  # noqa: E402
from wsim.scene import MeshData, Scene  # noqa: E402
from wsim.scene import geometry as wgeo  # noqa: E402
from wsim.scene.builtin import icosphere  # noqa: E402
from wsim.scene.widebvh import build_wide_bvh  # noqa: E402
from wsim.scene.transforms import interpolate_pose, quat_to_matrix  # noqa: E402

STREET_FILE = ROOT / "wsim" / "data" / "street_block.usdc"

#: Tuning measurements behind wsim's CPU settings (2-core AMD EPYC, synthetic scene, 230k-460k lidar rays, one thread
#: unless noted); written into the report so that reruns keep them.
TUNING_NOTES = """\
## Tuning measurements (CPU)

Synthetic scene (504,642 triangles), lidar rays as above. Run-to-run spread on this shared VM is about +-10 %.

| setting | result |
|---|---|
| BVH leaf size, SAH (1 / 2 / 3 / 4 / 8) | 1.71 / 1.78 / 1.79 / 1.79 / 1.76 Mrays/s per thread (2 threads: 3.36 / 3.46 / 3.47 / 3.33); build 0.31 / 0.22 / 0.19 / 0.15 / 0.12 s. Leaf 2 kept (ties with 3; stays clear of the 32-entry traversal stack limit). |
| constructor on CPU (leaf 2): sah / cubql / median | 1.78 / 1.70 / 1.08 Mrays/s; build 0.22 / 0.06 / 0.16 s. SAH kept as the CPU default. |
| Warp CPU compile options for the tracing kernel (-O2 default, -O3, plain -march=native, no vectorisation) | 1.66-1.84 Mrays/s, all within noise: no change. |
| triangle order (as generated / shuffled / Morton-sorted triangles / + vertices renumbered) | 1.80 / 1.78 / 1.84 / 1.83 Mrays/s: memory layout is not the bottleneck; no reordering. |
| CPU shards for 2 threads (2 / 4 / 8 / 16) | 3.19 / 3.27 / 3.32 / 3.39 Mrays/s: the current 8 shards per thread (16) kept. |
| bare `wp.mesh_query_ray` writing only t, against the full Hit-record kernel | about 1.78 vs 1.68 Mrays/s (about 5 %): not worth a second kernel. |
| 8-wide BVH (Warp's binary SAH tree collapsed, leaves of ≤ 4 triangles) traversed by a native snippet with 8-lane box tests (`wsim/kernels/widebvh.py`), against `mesh_query_ray` | about 3.2× per thread (`benchmarks/wide_bvh/`): adopted for static meshes on the CPU; `WSIM_WIDE_BVH=0` switches it off. |

With Warp's scalar binary-BVH traversal (`mesh_query_ray`, about 1.7-2.0 Mrays/s per core) two cores top out near
0.5x single-thread Embree (SIMD 4/8-wide BVH, 6.5-8.7 Mrays/s); the 8-wide traversal for static meshes on the CPU
reaches about 5 Mrays/s per core, about 1-1.3x single-thread Embree on two cores. Instanced prototypes still use
`mesh_query_ray`.
"""


# ----------------------------------------------------------------------------------------------------------- scenes
def _box(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.array([[x, y, z] for z in (lo[2], hi[2]) for y in (lo[1], hi[1]) for x in (lo[0], hi[0])])
    f = np.array([[0, 2, 1], [1, 2, 3], [4, 5, 6], [5, 7, 6], [0, 1, 4], [1, 5, 4], [2, 6, 3], [3, 6, 7],
                  [0, 4, 2], [2, 4, 6], [1, 3, 5], [3, 7, 5]])
    return p, f


def _terrain_height(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return 0.8 * np.sin(x / 11.0) * np.cos(y / 17.0) + 0.3 * np.sin(x / 3.1 + y / 4.3)


def synthetic_scene(seed: int = 7) -> tuple[Scene, np.ndarray]:
    """~500k triangles: a 200 m noisy terrain grid, 400 random boxes and 8 subdivided spheres; returns the scene and a
    lidar origin 2 m above the ground at its centre."""
    rng = np.random.default_rng(seed)
    n, half = 480, 100.0
    xs = np.linspace(-half, half, n)
    gx, gy = np.meshgrid(xs, xs, indexing="xy")
    gz = _terrain_height(gx, gy) + rng.normal(0.0, 0.03, gx.shape)
    pts = [np.column_stack([gx.ravel(), gy.ravel(), gz.ravel()])]
    i = np.arange(n - 1)
    a = (i[None, :] + n * i[:, None]).ravel()
    faces = [np.concatenate([np.column_stack([a, a + 1, a + n + 1]), np.column_stack([a, a + n + 1, a + n])])]
    off = len(pts[0])

    def add(p: np.ndarray, f: np.ndarray) -> None:
        nonlocal off
        pts.append(p)
        faces.append(f + off)
        off += len(p)

    placed = 0
    while placed < 400:
        c = rng.uniform(-half * 0.9, half * 0.9, 2)
        if np.hypot(*c) < 6.0:  # keep the sensor free
            continue
        size = rng.uniform([0.5, 0.5, 0.5], [8.0, 8.0, 15.0])
        z0 = float(_terrain_height(c[0], c[1])) - 0.5
        add(*_box(np.array([c[0] - size[0] / 2, c[1] - size[1] / 2, z0]),
                  np.array([c[0] + size[0] / 2, c[1] + size[1] / 2, z0 + size[2]])))
        placed += 1
    sp, sf = icosphere(4)  # 5120 triangles (the built-in scene's icosphere)
    for k in range(8):
        ang = 2 * np.pi * k / 8 + 0.3
        r = rng.uniform(10.0, 40.0)
        rad = rng.uniform(1.0, 4.0)
        c = np.array([r * np.cos(ang), r * np.sin(ang), float(_terrain_height(r * np.cos(ang), r * np.sin(ang))) + rad])
        add(sp * rad + c, sf)
    scene = Scene(MeshData(np.concatenate(pts), np.concatenate(faces), 0))
    origin = np.array([0.0, 0.0, float(_terrain_height(0.0, 0.0)) + 2.0])
    return scene, origin


def flatten(scene: Scene, t: float) -> tuple[np.ndarray, np.ndarray]:
    """World-space triangles of the scene at time ``t`` [s] (instances placed by their interpolated keys)."""
    pts = [scene.static.points.astype(np.float64)]
    faces = [scene.static.indices]
    off = len(pts[0])
    for inst in scene.instances:
        proto = scene.prototypes[inst.prototype]
        if not proto.num_triangles:
            continue
        tr, q = interpolate_pose(inst.times, inst.translations, inst.rotations, t)
        sc = np.ones(3) if inst.scales is None else np.asarray(inst.scales, float).reshape(-1, 3)
        if len(sc) > 1:
            sc = np.column_stack([np.interp(t, inst.times, sc[:, k]) for k in range(3)])[0]
        else:
            sc = sc[0]
        pts.append((proto.points * sc) @ quat_to_matrix(q).T + tr)
        faces.append(proto.indices + off)
        off += len(proto.points)
    return np.concatenate(pts).astype(np.float32), np.concatenate(faces).astype(np.int32)


def street_origin(scene: Scene, geo: wgeo.SceneGeometry) -> np.ndarray:
    """A point 2 m above the ground under the ego vehicle's first pose (or the scene centre)."""
    if scene.ego_trajectory is not None:
        xy = np.asarray(scene.ego_trajectory.pose_at(scene.time_range[0])[0], float)[:2]
    else:
        v = scene.static.points
        xy = 0.5 * (v.min(0) + v.max(0))[:2]
    top = float(scene.static.points[:, 2].max()) + 100.0 if scene.static.num_triangles else 100.0
    h = geo.trace(np.array([[xy[0], xy[1], top]]), np.array([[0.0, 0.0, -1.0]]), scene.time_range[0]).numpy()
    ground = float(h["point"][0, 2]) if h["face"][0] >= 0 else 0.0
    return np.array([xy[0], xy[1], ground + 2.0])


# ------------------------------------------------------------------------------------------------------------ rays
def lidar_rays(origin: np.ndarray, n_el: int, n_az: int) -> tuple[np.ndarray, np.ndarray]:
    """Spinning-lidar ray fan in firing order (azimuth-major, one column of elevations per azimuth)."""
    el = np.deg2rad(np.linspace(-25.0, 15.0, n_el))
    az = np.linspace(0.0, 2 * np.pi, n_az, endpoint=False)
    A, E = np.meshgrid(az, el, indexing="ij")
    d = np.stack([np.cos(E) * np.cos(A), np.cos(E) * np.sin(A), np.sin(E)], -1).reshape(-1, 3)
    o = np.broadcast_to(np.asarray(origin, np.float32), d.shape)
    return np.ascontiguousarray(o, np.float32), np.ascontiguousarray(d, np.float32)


def best_of(fn, reps: int, sync=None) -> float:
    """Best wall time [s] of ``reps`` calls of ``fn``."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        best = min(best, time.perf_counter() - t0)
    return best


# ---------------------------------------------------------------------------------------------------------- engines
def wsim_build_time(scene: Scene, device: str, ctor: str | None, reps: int) -> float:
    """Build time [s] of the static ``wp.Mesh`` (points/indices already on the device) plus, on the CPU, the
    8-wide BVH the tracer uses."""
    d = wp.get_device(device)
    pts = wp.array(scene.static.points, dtype=wp.vec3, device=d)
    idx = wp.array(scene.static.indices.reshape(-1), dtype=wp.int32, device=d)
    c = wgeo._constructor(d, ctor)  # noqa: SLF001 - the constructor SceneGeometry would pick
    keep = []

    def build() -> None:
        mesh = wp.Mesh(points=pts, indices=idx, bvh_constructor=c, bvh_leaf_size=wgeo.BVH_LEAF_SIZE)
        keep.append(mesh)
        if not d.is_cuda and wgeo.WIDE_BVH:
            keep.append(build_wide_bvh(mesh, scene.static.points, scene.static.indices))
        del keep[:-2]

    build()  # warm-up (allocators, module load)
    return best_of(build, reps, sync=lambda: wp.synchronize_device(d))


def embree_scene(verts: np.ndarray, faces: np.ndarray):
    from embreex import mesh_construction, rtcore_scene

    s = rtcore_scene.EmbreeScene()
    mesh_construction.TriangleMesh(s, verts, faces)
    # embreex commits the scene on the first query
    s.run(np.zeros((1, 3), np.float32), np.array([[0, 0, 1]], np.float32))
    return s


def embree_build_time(verts: np.ndarray, faces: np.ndarray, reps: int) -> tuple[float, object]:
    scenes = []

    def build() -> None:
        scenes[:] = [embree_scene(verts, faces)]

    build()
    return best_of(build, reps), scenes[0]


def fmt_rate(n: int, t: float) -> str:
    return f"{n / t / 1e6:.2f}"


# ---------------------------------------------------------------------------------------------------------- driver
def bench_cpu(name: str, scene: Scene, origin_fn, args, rows: list[list[str]], notes: list[str]) -> None:
    reps_build = 2 if args.quick else 3
    reps = 3 if args.quick else 7
    n_az = 1800 if args.quick else 3600
    t_scene = scene.time_range[0]
    tri = scene.num_triangles
    wb = wsim_build_time(scene, "cpu", None, reps_build) if scene.static.num_triangles else float("nan")
    verts, faces = flatten(scene, t_scene)
    eb, escene = embree_build_time(verts, faces, reps_build)

    geo = wgeo.SceneGeometry(scene, "cpu")
    origin = origin_fn(geo)
    o_np, d_np = lidar_rays(origin, 128, n_az)
    n = len(o_np)
    o = wp.array(o_np, dtype=wp.vec3, device="cpu")
    d = wp.array(d_np, dtype=wp.vec3, device="cpu")
    tt = wp.full(n, t_scene, dtype=float, device="cpu")
    cores = wlaunch.cpu_threads()

    geo.trace(o, d, tt, threads=1)  # compile + warm-up
    geo.trace(o, d, tt)
    w1 = best_of(lambda: geo.trace(o, d, tt, threads=1), reps)
    wn = best_of(lambda: geo.trace(o, d, tt), reps)
    escene.run(o_np, d_np, query="INTERSECT", output=1)
    e1 = best_of(lambda: escene.run(o_np, d_np, query="INTERSECT", output=1), reps)

    h = geo.trace(o, d, tt).numpy()
    r = escene.run(o_np, d_np, query="INTERSECT", output=1)
    e_hit = r["geomID"] >= 0
    w_hit = h["face"] >= 0
    agree = (e_hit == w_hit) & (~w_hit | (np.abs(h["t"] - r["tfar"]) < 1e-3))
    rows.append([
        name, f"{tri:,}", f"{n:,}", f"{wb:.3f}", f"{eb:.3f}",
        fmt_rate(n, w1), fmt_rate(n, wn), fmt_rate(n, e1),
        f"{e1 / wn:.2f}", f"{w1 / wn:.2f}", f"{100.0 * agree.mean():.3f} ({100.0 * w_hit.mean():.0f}% hit)",
    ])
    if scene.instances:
        notes.append(f"{name}: {len(scene.instances)} instances traced through wsim's two-level BVH; Embree gets the "
                     "same triangles flattened into one mesh at the ray time.")
    del geo, escene


def bench_cuda(name: str, scene: Scene, origin_fn, args, rows: list[list[str]], device: str = "cuda") -> None:
    dev = wp.get_device(device)
    reps = 5 if args.quick else 20
    t_scene = scene.time_range[0]
    origin = origin_fn(wgeo.SceneGeometry(scene, "cpu"))
    o_np, d_np = lidar_rays(origin, 128, 16384)  # 2.1M rays
    n = len(o_np)
    o = wp.array(o_np, dtype=wp.vec3, device=dev)
    d = wp.array(d_np, dtype=wp.vec3, device=dev)
    tt = wp.full(n, t_scene, dtype=float, device=dev)
    for ctor in ("lbvh", "sah", "cubql"):
        try:
            wb = wsim_build_time(scene, device, ctor, 3)
            geo = wgeo.SceneGeometry(scene, device, bvh_constructor=ctor)
            geo.trace(o, d, tt)
            wp.synchronize_device(dev)
            tr = best_of(lambda: geo.trace(o, d, tt), reps, sync=lambda: wp.synchronize_device(dev))
            rows.append([name, ctor, f"{scene.num_triangles:,}", f"{n:,}", f"{wb * 1e3:.1f}", fmt_rate(n, tr)])
            del geo
        except Exception as e:  # noqa: BLE001 - an unsupported constructor is reported, not fatal
            rows.append([name, ctor, f"{scene.num_triangles:,}", f"{n:,}", "n/a", f"failed: {e}"])


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import embreex

    return (f"{cpu}, {wlaunch.cpu_threads()} cores usable, {os.cpu_count()} logical CPUs; Python "
            f"{platform.python_version()}, Warp {wp.__version__}, embreex {getattr(embreex, '__version__', '?')}, "
            f"NumPy {np.__version__}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rays and repetitions (< 30 s)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="also time wsim on CUDA")
    ap.add_argument("--out", help="also write the report to this Markdown file")
    args = ap.parse_args(argv)

    wp.init()
    t_start = time.perf_counter()
    rows: list[list[str]] = []
    cuda_rows: list[list[str]] = []
    notes: list[str] = []

    scenes = []
    if STREET_FILE.exists():
        try:
            street = wsim.load_scene("builtin")
            scenes.append(("street block (builtin)", street, lambda g, s=street: street_origin(s, g)))
        except Exception as e:  # noqa: BLE001 - report and continue with the synthetic scene
            rows.append(["street block (builtin)", "-", "-", *["-"] * 7, f"load failed: {type(e).__name__}: {e}"])
    else:
        rows.append(["street block (builtin)", "-", "-", *["-"] * 7, f"skipped: {STREET_FILE.name} not present"])
    syn, syn_origin = synthetic_scene()
    scenes.append(("synthetic terrain+boxes+spheres", syn, lambda g: syn_origin))

    for name, scene, ofn in scenes:
        bench_cpu(name, scene, ofn, args, rows, notes)
    if args.device == "cuda":
        if wp.get_cuda_device_count() == 0:
            notes.append("--device cuda: no CUDA device available; GPU rows skipped.")
        else:
            for name, scene, ofn in scenes:
                bench_cuda(name, scene, ofn, args, cuda_rows)

    cores = wlaunch.cpu_threads()
    header = ["scene", "triangles", "rays", "wsim build [s]", "Embree commit [s]", "wsim 1 thread [Mrays/s]",
              f"wsim {cores} threads [Mrays/s]", "Embree 1 thread [Mrays/s]", "wsim all / Embree 1T",
              "wsim scaling all/1", "agree within 1 mm [%]"]
    text = [table(header, rows)]
    if cuda_rows:
        text += ["", table(["scene", "constructor", "triangles", "rays", "build [ms]", "wsim CUDA [Mrays/s]"],
                           cuda_rows)]
    text += ["", f"Closest-hit queries; lidar fan of 128 elevations (-25..+15 deg) x "
             f"{1800 if args.quick else 3600} azimuths from 2 m above the ground; best of "
             f"{3 if args.quick else 7} runs after warm-up. wsim: static wp.Mesh "
             f"({wgeo._constructor(wp.get_device('cpu'), None)}, leaf size {wgeo.BVH_LEAF_SIZE}) collapsed into an "  # noqa: SLF001
             f"8-wide BVH for the CPU traversal ({'on' if wgeo.WIDE_BVH else 'off'}), full Hit records; "
             "Embree: embreex rtcIntersect1 loop (u, v, Ng, tfar, primID, geomID). Embree's commit uses its own "
             "thread pool; wsim's CPU build is single-threaded."]
    text += [f"- {n}" for n in notes]
    text += ["", f"Total benchmark time {time.perf_counter() - t_start:.1f} s."]
    report = "\n".join(text)
    print(report)
    if args.out:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        Path(args.out).write_text(f"# Ray casting benchmark\n\nMachine: {machine()}\n\nDate: {stamp}\n\n"
                                  f"Command: `python benchmarks/raycast.py{' --quick' if args.quick else ''}"
                                  f"{' --device cuda' if args.device == 'cuda' else ''}`\n\n{report}\n\n{TUNING_NOTES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
