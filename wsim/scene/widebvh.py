"""Host-side build of the 8-wide BVH traced by :func:`wsim.kernels.widebvh.wide_closest` on the CPU: Warp's binary
SAH BVH of a ``wp.Mesh`` is read back and collapsed (greedily expanding the largest child) into nodes of 8 children,
stored structure-of-arrays; leaves hold up to :data:`MAX_LEAF` contiguous triangles as their three vertices."""

from __future__ import annotations

import numpy as np
import warp as wp

from ..kernels import widebvh as _kw

WIDTH = 8
#: Triangles a wide leaf holds at most (a subtree of that many contiguous triangles becomes a leaf). Measured on one
#: thread against 4: 1080p camera rays 7 % faster on the synthetic scene, 1-2 % on the street; the lidar fan the same;
#: PANDAR128 / AT128 IDEALIZED sweeps 2-7 % and GAUSSIAN_BEAM 4-10 % faster (2: camera alike, sweeps in between).
MAX_LEAF = 3
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


def box_tree_order(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """An order of boxes along a Morton curve of their centres (10 bits an axis over the boxes' extent): neighbours
    in it lie close, so :func:`box_tree`'s groups of 8 are compact."""
    c = 0.5 * (np.asarray(lo, np.float64) + np.asarray(hi, np.float64))
    span = np.maximum(c.max(0) - c.min(0), 1e-30)
    q = np.clip(((c - c.min(0)) / span * 1023.0).astype(np.int64), 0, 1023)
    code = np.zeros(len(c), np.int64)
    for bit in range(10):
        for a in range(3):
            code |= ((q[:, a] >> bit) & 1) << (3 * bit + a)
    return np.argsort(code, kind="stable").astype(np.int64)


def box_tree(lo: np.ndarray, hi: np.ndarray, order: np.ndarray, width: int = WIDTH) -> tuple[np.ndarray, np.ndarray]:
    """An 8-wide tree over boxes (``lo``, ``hi``: (n, 3) [m]; n >= 1) in :func:`wsim.kernels.widebvh.wide_closest`'s
    node layout, for :func:`wsim.kernels.widebvh.wide_box_any`: boxes taken in ``order`` and grouped 8 by 8, level by
    level up to one root (node 0); leaf entry ``~(i << 3)`` is box i, grown by 1e-5 · (1 + its largest coordinate
    magnitude) [m]. The same ``order`` gives the same ``child`` (refit: new boxes, same topology).

    Returns:
        boxes (num_nodes · 48,) float32 and child (num_nodes · 8,) int32, flat.
    """
    lo = np.asarray(lo, np.float64)
    hi = np.asarray(hi, np.float64)
    pad = 1e-5 * (1.0 + np.maximum(np.abs(lo), np.abs(hi)).max(1, keepdims=True))
    ent_lo, ent_hi = lo[order] - pad[order], hi[order] + pad[order]
    ent_ref = ~(np.asarray(order, np.int64) << 3)  # leaf codes; node entries: their index within the level below
    levels = []  # bottom-up: (lo, hi, ref, is_leaf) of each level's entries, grouped width by width into its nodes
    leaf = True
    while True:
        m = len(ent_ref)
        g = max(1, -(-m // width))
        pl = np.full((g * width, 3), np.inf)
        ph = np.full((g * width, 3), -np.inf)
        pr = np.full(g * width, -1, np.int64)
        pl[:m], ph[:m], pr[:m] = ent_lo, ent_hi, ent_ref
        levels.append((pl, ph, pr, leaf))
        if g == 1:
            break
        ent_lo = pl.reshape(g, width, 3).min(1)
        ent_hi = ph.reshape(g, width, 3).max(1)
        ent_ref = np.arange(g, dtype=np.int64)
        leaf = False
    levels.reverse()  # top-down: level k's nodes are numbered after those of the levels above it
    counts = [len(lv[2]) // width for lv in levels]
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    boxes = np.empty((starts[-1], 6, width), np.float32)
    child = np.empty((starts[-1], width), np.int32)
    for k, (pl, ph, pr, is_leaf) in enumerate(levels):
        g = counts[k]
        sl = slice(starts[k], starts[k + 1])
        boxes[sl, 0:3] = pl.reshape(g, width, 3).transpose(0, 2, 1)
        boxes[sl, 3:6] = ph.reshape(g, width, 3).transpose(0, 2, 1)
        ref = pr.reshape(g, width)
        if not is_leaf:
            ref = np.where(ref >= 0, ref + starts[k + 1], -1)
        child[sl] = ref
    return boxes.reshape(-1), child.reshape(-1)
