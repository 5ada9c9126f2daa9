"""Host-side build of the 8-wide BVH traced by :func:`wsim.kernels.widebvh.wide_closest` on the CPU: Warp's binary
SAH BVH of a ``wp.Mesh`` is read back and collapsed (greedily expanding the largest child) into nodes of 8 children,
stored structure-of-arrays; leaves hold up to 4 contiguous triangles as their three vertices."""

from __future__ import annotations

import numpy as np
import warp as wp

from ..kernels import widebvh as _kw

WIDTH = 8
MAX_LEAF = 4
#: Triangles a wide BVH (or the prototypes' pool) may hold: a leaf's first triangle is stored in 28 bits.
MAX_WIDE_TRIS = 1 << 28


def export_bvh(mesh: wp.Mesh) -> dict:
    """Warp's binary BVH of a CPU ``wp.Mesh`` as NumPy arrays (node boxes, children / leaf ranges, primitive order)."""
    meta = wp.zeros(4, dtype=int, device="cpu")
    wp.launch(_kw.bvh_meta_kernel, 1, inputs=[mesh.id, meta], device="cpu")
    nn, root, ni, _ = meta.numpy().tolist()
    arrs = [wp.zeros(nn, dtype=wp.vec3, device="cpu"), wp.zeros(nn, dtype=wp.vec3, device="cpu"),
            wp.zeros(nn, dtype=int, device="cpu"), wp.zeros(nn, dtype=int, device="cpu"),
            wp.zeros(nn, dtype=int, device="cpu"), wp.zeros(ni, dtype=int, device="cpu")]
    wp.launch(_kw.bvh_nodes_kernel, 1, inputs=[mesh.id, *arrs], device="cpu")
    lo, hi, ia, ib, leaf, prim = (a.numpy() for a in arrs)
    return dict(lo=lo, hi=hi, ia=ia, ib=ib, leaf=leaf.astype(bool), prim=prim, root=root)


def _area(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    e = np.maximum(hi - lo, 0.0)
    return e[..., 0] * e[..., 1] + e[..., 1] * e[..., 2] + e[..., 2] * e[..., 0]


def collapse(b: dict, width: int = WIDTH, max_leaf: int = MAX_LEAF) -> dict:
    """Collapse a binary BVH (:func:`export_bvh`) into nodes of ``width`` children; subtrees of at most ``max_leaf``
    contiguous primitives become leaves. Returns boxes (n, 6, width), child (n, width) and the tree depth."""
    lo, hi, ia, ib, leaf = b["lo"], b["hi"], b["ia"], b["ib"], b["leaf"]
    nn = len(lo)
    levels = [np.array([b["root"]])]
    while True:
        inner = levels[-1][~leaf[levels[-1]]]
        if len(inner) == 0:
            break
        levels.append(np.concatenate([ia[inner], ib[inner]]))
    cnt = np.zeros(nn, np.int64)
    start = np.zeros(nn, np.int64)
    end = np.zeros(nn, np.int64)
    for lv in reversed(levels):
        lf = lv[leaf[lv]]
        cnt[lf], start[lf], end[lf] = ib[lf] - ia[lf], ia[lf], ib[lf]
        inn = lv[~leaf[lv]]
        cnt[inn] = cnt[ia[inn]] + cnt[ib[inn]]
        start[inn] = np.minimum(start[ia[inn]], start[ib[inn]])
        end[inn] = np.maximum(end[ia[inn]], end[ib[inn]])
    eff = (leaf | ((cnt <= max_leaf) & (end - start == cnt))).tolist()
    area = _area(lo, hi).tolist()
    ia_l, ib_l, start_l, cnt_l = ia.tolist(), ib.tolist(), start.tolist(), cnt.tolist()
    root = b["root"]
    if eff[root]:  # a tiny mesh: one inner node holding the single leaf
        children, queue, depth = [[root]], [root], 1
        wide_id = {}
    else:
        children, queue, wide_id, depth = [], [root], {root: 0}, 0
        node_depth = {root: 1}
        qi = 0
        while qi < len(queue):
            n = queue[qi]
            qi += 1
            ents = [ia_l[n], ib_l[n]]
            while len(ents) < width:
                best, ba = -1, -1.0
                for k, e in enumerate(ents):
                    if not eff[e] and area[e] > ba:
                        best, ba = k, area[e]
                if best < 0:
                    break
                e = ents.pop(best)
                ents += [ia_l[e], ib_l[e]]
            children.append(ents)
            depth = max(depth, node_depth[n])
            for e in ents:
                if not eff[e]:
                    wide_id[e] = len(queue)
                    node_depth[e] = node_depth[n] + 1
                    queue.append(e)
    nw = len(children)
    boxes = np.empty((nw, 6, width), np.float32)
    boxes[:, :3, :] = np.inf
    boxes[:, 3:, :] = -np.inf
    child = np.full((nw, width), -1, np.int32)
    for w, ents in enumerate(children):
        for k, e in enumerate(ents):
            boxes[w, :3, k] = lo[e]
            boxes[w, 3:, k] = hi[e]
            child[w, k] = ~((start_l[e] << 3) | (cnt_l[e] - 1)) if eff[e] else wide_id[e]
    return dict(boxes=boxes, child=child, depth=depth)


class _Plan:
    """The first pass of the native build over one CPU ``wp.Mesh``: per binary node its subtree's triangle count,
    first triangle and leaf flag, and the breadth-first list of the wide nodes (scratch kept for :func:`_fill`)."""

    def __init__(self, mesh: wp.Mesh, width: int = WIDTH, max_leaf: int = MAX_LEAF) -> None:
        meta = wp.zeros(4, dtype=int, device="cpu")
        wp.launch(_kw.bvh_meta_kernel, 1, inputs=[mesh.id, meta], device="cpu")
        nn = int(meta.numpy()[0])
        z = lambda dt: wp.empty(nn, dtype=dt, device="cpu")  # noqa: E731
        self.mesh, self.width = mesh, width
        self.queue, self.cnt, self.start, self.wid, self.eff = z(wp.int32), z(wp.int32), z(wp.int32), z(wp.int32), \
            z(wp.uint8)
        out = wp.zeros(4, dtype=wp.int32, device="cpu")
        wp.launch(_kw.wide_plan_kernel, 1, inputs=[mesh.id, width, max_leaf, self.queue, self.cnt, self.start,
                                                   self.wid, self.eff, out], device="cpu")
        self.num_nodes, self.depth, self.max_leaf_count, self.single = (int(x) for x in out.numpy())
        self.num_tris = int(mesh.indices.shape[0]) // 3

    def usable(self) -> bool:
        """Whether the wide traversal can serve this tree (its stack, the 3-bit leaf count, leaf starts below
        2^28)."""
        return (0 < self.num_tris < MAX_WIDE_TRIS and self.max_leaf_count <= 8
                and self.depth * (self.width - 1) + 1 <= _kw.WIDE_STACK)

    def fill(self, out: dict, node_off: int = 0, tri_off: int = 0) -> None:
        """Write the wide nodes and the reordered triangles into ``out`` (boxes, child, v0, e1, e2, fid) at
        ``node_off`` / ``tri_off``, child references relocated accordingly."""
        from .. import launch as _launch

        m = self.mesh
        _launch.launch(_kw.wide_fill_kernel, self.num_nodes,
                       [m.id, self.width, self.single, node_off, tri_off, self.queue, self.cnt, self.start,
                        self.wid, self.eff], [out["boxes"], out["child"]], device="cpu")
        _launch.launch(_kw.wide_triangles_kernel, self.num_tris, [m.id, m.points, m.indices, tri_off],
                       [out["v0"], out["e1"], out["e2"], out["fid"]], device="cpu")


def _alloc(num_nodes: int, num_tris: int, width: int = WIDTH) -> dict:
    e = lambda n, dt: wp.empty(max(n, 1), dtype=dt, device="cpu")  # noqa: E731
    return dict(boxes=e(num_nodes * 6 * width, float), child=e(num_nodes * width, wp.int32),
                v0=e(num_tris, wp.vec3), e1=e(num_tris, wp.vec3), e2=e(num_tris, wp.vec3), fid=e(num_tris, wp.int32))


def build_wide_bvh(mesh: wp.Mesh, points: np.ndarray | None = None, indices: np.ndarray | None = None) -> dict | None:
    """Device arrays (CPU) of the 8-wide BVH of a CPU ``wp.Mesh``, or None where the wide traversal cannot serve it
    (deeper than its stack, more faces than a float holds). Built natively from the mesh's binary BVH (the same tree
    as :func:`collapse`); the triangles' vertices are the mesh's own (``points`` / ``indices`` are not needed and
    only kept for older callers)."""
    if mesh.indices.shape[0] == 0 or mesh.indices.shape[0] // 3 >= MAX_WIDE_TRIS:
        return None
    plan = _Plan(mesh)
    if not plan.usable():
        return None
    # the three vertices exactly as the mesh has them (edges rebuilt as v0 + (v1 − v0) are rounded, and two triangles
    # sharing an edge would then disagree on it: the watertight test needs the very same coordinates); the keys
    # e1/e2 name the SceneGeo fields they fill
    out = _alloc(plan.num_nodes, plan.num_tris)
    plan.fill(out)
    return out


def build_wide_pool(meshes: list) -> tuple[dict, list[int]] | None:
    """One set of wide-BVH arrays holding the 8-wide BVHs of several CPU meshes (the instance prototypes) one after
    another, and each mesh's root node (−1: traced by ``mesh_query_ray``, e.g. None or a tree too deep). None where no
    mesh can be served."""
    plans = []
    for m in meshes:
        p = None
        if m is not None and 0 < m.indices.shape[0] // 3 < MAX_WIDE_TRIS:
            p = _Plan(m)
            if not p.usable():
                p = None
        plans.append(p)
    if not any(plans):
        return None
    nodes = sum(p.num_nodes for p in plans if p)
    tris = sum(p.num_tris for p in plans if p)
    if tris >= MAX_WIDE_TRIS:
        return None
    out = _alloc(nodes, tris)
    roots, node_off, tri_off = [], 0, 0
    for p in plans:
        if p is None:
            roots.append(-1)
            continue
        p.fill(out, node_off, tri_off)
        roots.append(node_off)
        node_off += p.num_nodes
        tri_off += p.num_tris
    return out, roots
