"""Benchmark: wp.mesh_query_ray vs Warp-written wide-BVH traversals, one thread, best of 5 after warm-up."""
from __future__ import annotations

import argparse
import importlib
import time

import numpy as np

from common import agreement, best_of, lidar_rays, load_scenes, make_mesh, ref_kernel, wp
import bvhw

ap = argparse.ArgumentParser()
ap.add_argument("--variants", default="bvh4")
ap.add_argument("--opt", type=int, default=None)
ap.add_argument("--flags", default=None)
ap.add_argument("--scenes", default="street,synthetic")
ap.add_argument("--embree", action="store_true")
args = ap.parse_args()
wp.init()
if args.opt is not None:
    wp.config.optimization_level = args.opt
if args.flags is not None:
    wp.config.cpu_compiler_flags = args.flags
wp.config.enable_backward = False

import variants  # noqa: E402

rows = []
for name, pts, fac, org in load_scenes():
    if name not in args.scenes.split(","):
        continue
    o, d = lidar_rays(org)
    n = len(o)
    wo = wp.array(o, dtype=wp.vec3, device="cpu")
    wd = wp.array(d, dtype=wp.vec3, device="cpu")
    t_ref = wp.zeros(n, dtype=float, device="cpu")
    f_ref = wp.zeros(n, dtype=wp.int32, device="cpu")
    tb = best_of(lambda: make_mesh(pts, fac), 3)
    mesh = make_mesh(pts, fac)
    tr = best_of(lambda: wp.launch(ref_kernel, n, inputs=[mesh.id, wo, wd, t_ref, f_ref], device="cpu"))
    rref = n / tr / 1e6
    rows.append((name, "mesh_query_ray (binary SAH, leaf 2)", f"{tb:.3f}", f"{rref:.2f}", "1.00x", "reference"))
    tr_np = t_ref.numpy().copy()
    fr_np = f_ref.numpy().copy()
    if args.embree:
        from embreex import mesh_construction, rtcore_scene
        es = rtcore_scene.EmbreeScene()
        mesh_construction.TriangleMesh(es, pts, fac)
        te = best_of(lambda: es.run(o, d, query="INTERSECT", output=1))
        r = es.run(o, d, query="INTERSECT", output=1)
        et = np.where(r["geomID"] >= 0, r["tfar"], -1.0)
        rows.append((name, "Embree (embreex, 1 thread)", "-", f"{n/te/1e6:.2f}", f"{tr/te:.2f}x",
                     f"{100*agreement(tr_np, et):.3f}%"))
    for v in args.variants.split(","):
        build_fn, run_fn = variants.VARIANTS[v]
        t0 = time.perf_counter()
        data = build_fn(pts, fac)
        tbuild = time.perf_counter() - t0
        t_out = wp.zeros(n, dtype=float, device="cpu")
        f_out = wp.zeros(n, dtype=wp.int32, device="cpu")
        tv = best_of(lambda: run_fn(data, wo, wd, t_out, f_out))
        ag = agreement(tr_np, t_out.numpy())
        rows.append((name, v, f"{tbuild:.3f}", f"{n/tv/1e6:.2f}", f"{tr/tv:.2f}x", f"{100*ag:.3f}%"))
        print(rows[-1], flush=True)
print("| scene | variant | build [s] | Mrays/s (1 thread) | vs mesh_query_ray | agreement |")
print("|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
