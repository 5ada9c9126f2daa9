"""Variant registry: name -> (build(points, faces) -> data, run(data, o, d, t_out, f_out))."""
from __future__ import annotations

import numpy as np

import bvhw
import trace4
from common import wp

MAX_T = 1.0e6


def _upload4(w):
    nw = w["n_nodes"]
    return dict(
        boxes=wp.array(w["boxes"].reshape(nw * 6, 4), dtype=wp.vec4, device="cpu"),
        child=wp.array(w["child"], dtype=wp.vec4i, device="cpu"),
        v0=wp.array(w["v0"], dtype=wp.vec3, device="cpu"),
        e1=wp.array(w["e1"], dtype=wp.vec3, device="cpu"),
        e2=wp.array(w["e2"], dtype=wp.vec3, device="cpu"),
        fid=wp.array(w["fid"], dtype=wp.int32, device="cpu"),
        w=w,
    )


def b_bvh4(bin_leaf=2, max_leaf=4):
    def f(pts, fac):
        w, _ = bvhw.build(pts, fac, width=4, bin_leaf=bin_leaf, max_leaf=max_leaf)
        return _upload4(w)
    return f


def r_bvh4(g, o, d, t_out, f_out):
    wp.launch(trace4.trace_bvh4, len(o), inputs=[g["boxes"], g["child"], g["v0"], g["e1"], g["e2"], g["fid"], MAX_T,
                                                   o, d, t_out, f_out], device="cpu")


VARIANTS = {
    "bvh4": (b_bvh4(2, 4), r_bvh4),
    "bvh4_l2": (b_bvh4(2, 2), r_bvh4),
    "bvh4_l8": (b_bvh4(2, 8), r_bvh4),
}


from wsim.kernels.widebvh import wide_closest, wide_slot  # noqa: E402


@wp.kernel
def trace_wsim_wide(boxes: wp.array(dtype=float), child: wp.array(dtype=wp.int32), v0: wp.array(dtype=wp.vec3),
                    e1: wp.array(dtype=wp.vec3), e2: wp.array(dtype=wp.vec3), fid: wp.array(dtype=wp.int32),
                    max_t: float, o: wp.array(dtype=wp.vec3), d: wp.array(dtype=wp.vec3),
                    t_out: wp.array(dtype=float), f_out: wp.array(dtype=wp.int32)):
    i = wp.tid()
    r = wide_closest(boxes, child, v0, e1, e2, fid, o[i], d[i], max_t)
    t_out[i] = r[0]
    k = wide_slot(r[1])
    f_out[i] = -1
    if k >= 0:
        f_out[i] = fid[k]


def b_native8(pts, fac):
    w, _ = bvhw.build(pts, fac, width=8, bin_leaf=2, max_leaf=4)
    f = np.asarray(fac)[w["order"]]  # wsim's traversal takes the three vertices (watertight test), not edges
    vert = lambda k: wp.array(np.ascontiguousarray(np.asarray(pts, np.float32)[f[:, k]]), dtype=wp.vec3,  # noqa: E731
                              device="cpu")
    return dict(boxes=wp.array(w["boxes"].reshape(-1), dtype=float, device="cpu"),
                child=wp.array(w["child"].reshape(-1), dtype=wp.int32, device="cpu"),
                v0=vert(0), e1=vert(1), e2=vert(2),
                fid=wp.array(w["fid"], dtype=wp.int32, device="cpu"))


def r_native8(g, o, d, t_out, f_out):
    wp.launch(trace_wsim_wide, len(o), inputs=[g["boxes"], g["child"], g["v0"], g["e1"], g["e2"], g["fid"], MAX_T,
                                               o, d, t_out, f_out], device="cpu")


VARIANTS["native8"] = (b_native8, r_native8)  # wsim's own traversal (wsim.kernels.widebvh)
