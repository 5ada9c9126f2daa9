"""Wide BVH (BVH4 / BVH8) built on the host by collapsing Warp's own binary SAH BVH (wsim.scene.widebvh), stored SoA
for Warp kernels.

Node layout (width W): boxes[n, 6, W] = (lo_x, lo_y, lo_z, hi_x, hi_y, hi_z) per child lane; empty lanes hold an
empty box (lo = +inf, hi = -inf), which the sign-ordered slab test never hits. child[n, W]: inner child index (>= 0)
or a leaf reference ~(start << 3 | (count - 1)) into the reordered triangle arrays (count <= 8).
"""
from __future__ import annotations

import time

import numpy as np

from common import export_bvh, make_mesh

from wsim.scene.widebvh import collapse as _collapse


def build(points, faces, width=4, bin_leaf=2, max_leaf=4, ctor="sah"):
    """Returns (wide bvh dict, build seconds incl. Warp's binary build, triangle arrays)."""
    t0 = time.perf_counter()
    mesh = make_mesh(points, faces, leaf=bin_leaf, ctor=ctor)
    b = export_bvh(mesh)
    t1 = time.perf_counter()
    w = _collapse(b, width, max_leaf)
    w.update(order=b["prim"], n_nodes=len(w["boxes"]))
    f = faces[w["order"]]
    v0 = points[f[:, 0]]
    e1 = points[f[:, 1]] - v0
    e2 = points[f[:, 2]] - v0
    w.update(v0=np.ascontiguousarray(v0, np.float32), e1=np.ascontiguousarray(e1, np.float32),
             e2=np.ascontiguousarray(e2, np.float32), fid=np.ascontiguousarray(w["order"], np.int32))
    t2 = time.perf_counter()
    w["t_binary"] = t1 - t0
    w["t_collapse"] = t2 - t1
    return w, mesh


if __name__ == "__main__":
    from common import load_scenes, wp
    wp.init()
    for name, pts, fac, org in load_scenes():
        for W in (4, 8):
            w, _ = build(pts, fac, width=W)
            print(name, W, w["n_nodes"], f"binary {w['t_binary']:.3f}s collapse {w['t_collapse']:.3f}s")
