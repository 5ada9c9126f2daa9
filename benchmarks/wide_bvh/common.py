"""Shared helpers: scenes, lidar rays, reference traces with wp.mesh_query_ray, Warp BVH export, timing."""
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


@wp.func_native("""
using namespace wp;
Mesh m = mesh_get(id);
meta.data[0] = m.bvh.num_nodes;
meta.data[1] = *m.bvh.root;
meta.data[2] = m.bvh.num_items;
meta.data[3] = m.bvh.max_depth;
""")
def _bvh_meta(id: wp.uint64, meta: wp.array(dtype=int)): ...


@wp.func_native("""
using namespace wp;
Mesh m = mesh_get(id);
for (int n = 0; n < m.bvh.num_nodes; ++n) {
    BVHPackedNodeHalf a = m.bvh.node_lowers[n];
    BVHPackedNodeHalf b = m.bvh.node_uppers[n];
    lo.data[n] = vec3(a.x, a.y, a.z);
    hi.data[n] = vec3(b.x, b.y, b.z);
    ia.data[n] = int(a.i);
    ib.data[n] = int(b.i);
    leaf.data[n] = int(a.b);
}
for (int k = 0; k < m.bvh.num_items; ++k) prim.data[k] = m.bvh.primitive_indices[k];
""")
def _bvh_nodes(id: wp.uint64, lo: wp.array(dtype=wp.vec3), hi: wp.array(dtype=wp.vec3), ia: wp.array(dtype=int),
               ib: wp.array(dtype=int), leaf: wp.array(dtype=int), prim: wp.array(dtype=int)): ...


@wp.kernel
def _meta_k(id: wp.uint64, meta: wp.array(dtype=int)):
    _bvh_meta(id, meta)


@wp.kernel
def _nodes_k(id: wp.uint64, lo: wp.array(dtype=wp.vec3), hi: wp.array(dtype=wp.vec3), ia: wp.array(dtype=int),
             ib: wp.array(dtype=int), leaf: wp.array(dtype=int), prim: wp.array(dtype=int)):
    _bvh_nodes(id, lo, hi, ia, ib, leaf, prim)


def export_bvh(mesh):
    """Warp's binary BVH of a CPU wp.Mesh as NumPy arrays."""
    meta = wp.zeros(4, dtype=int, device="cpu")
    wp.launch(_meta_k, 1, inputs=[mesh.id, meta], device="cpu")
    nn, root, ni, depth = meta.numpy().tolist()
    arrs = [wp.zeros(nn, dtype=wp.vec3, device="cpu"), wp.zeros(nn, dtype=wp.vec3, device="cpu"),
            wp.zeros(nn, dtype=int, device="cpu"), wp.zeros(nn, dtype=int, device="cpu"),
            wp.zeros(nn, dtype=int, device="cpu"), wp.zeros(ni, dtype=int, device="cpu")]
    wp.launch(_nodes_k, 1, inputs=[mesh.id, *arrs], device="cpu")
    lo, hi, ia, ib, leaf, prim = (a.numpy() for a in arrs)
    return dict(lo=lo, hi=hi, ia=ia, ib=ib, leaf=leaf.astype(bool), prim=prim, root=root, depth=depth)


def agreement(t_ref, t, tol=1e-4):
    hr = t_ref >= 0
    h = t >= 0
    ok = (hr == h) & (~hr | (np.abs(t_ref - t) <= tol))
    return ok.mean()
