"""Shared helpers: scenes, lidar rays, reference traces with wp.mesh_query_ray, timing (the BVH export is wsim's)."""
from __future__ import annotations

import sys
import time

import numpy as np
import warp as wp

from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(_ROOT))
sys.path.insert(0, str(_ROOT / "benchmarks"))

wp.config.quiet = True


def best_of(fn, reps=5):
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def load_scenes():
    """[(name, points float32 (N,3), faces int32 (M,3), origin)]."""
    import wsim
    import raycast as rc

    out = []
    s = wsim.load_scene("builtin")
    pts = np.ascontiguousarray(s.static.points, np.float32)
    fac = np.ascontiguousarray(s.static.indices.reshape(-1, 3), np.int32)
    from wsim.scene import geometry as wgeo
    geo = wgeo.SceneGeometry(s, "cpu")
    origin = rc.street_origin(s, geo)
    out.append(("street", pts, fac, origin))
    syn, o = rc.synthetic_scene()
    out.append(("synthetic", np.ascontiguousarray(syn.static.points, np.float32),
                np.ascontiguousarray(syn.static.indices.reshape(-1, 3), np.int32), o))
    return out


def lidar_rays(origin, n_el=128, n_az=3600):
    import raycast as rc
    return rc.lidar_rays(origin, n_el, n_az)


@wp.kernel
def ref_kernel(mesh: wp.uint64, o: wp.array(dtype=wp.vec3), d: wp.array(dtype=wp.vec3),
               t_out: wp.array(dtype=float), f_out: wp.array(dtype=int)):
    i = wp.tid()
    q = wp.mesh_query_ray(mesh, o[i], d[i], 1.0e6)
    if q.result:
        t_out[i] = q.t
        f_out[i] = q.face
    else:
        t_out[i] = -1.0
        f_out[i] = -1


def make_mesh(pts, fac, leaf=2, ctor="sah"):
    p = wp.array(pts, dtype=wp.vec3, device="cpu")
    ix = wp.array(fac.reshape(-1), dtype=wp.int32, device="cpu")
    return wp.Mesh(points=p, indices=ix, bvh_constructor=ctor, bvh_leaf_size=leaf)


from wsim.scene.widebvh import export_bvh  # noqa: E402,F401 - the BVH export wsim itself uses


def agreement(t_ref, t, tol=1e-4):
    hr = t_ref >= 0
    h = t >= 0
    ok = (hr == h) & (~hr | (np.abs(t_ref - t) <= tol))
    return ok.mean()
