"""Host-side build of the 8-wide BVH traced by :func:`wsim.kernels.widebvh.wide_closest` on the CPU: Warp's binary
SAH BVH of a ``wp.Mesh`` is read back and collapsed (greedily expanding the largest child) into nodes of 8 children,
stored structure-of-arrays; leaves hold up to 4 contiguous triangles as their three vertices."""

from __future__ import annotations

import numpy as np
import warp as wp

from ..kernels import widebvh as _kw

WIDTH = 8
MAX_LEAF = 4


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


def build_wide_bvh(mesh: wp.Mesh, points: np.ndarray, indices: np.ndarray) -> dict | None:
    """Device arrays (CPU) of the 8-wide BVH of a CPU ``wp.Mesh`` (built from ``points`` (N, 3) and ``indices``
    (M, 3)), or None where the wide traversal cannot serve it (deeper than its stack, more faces than a float holds)."""
    if len(indices) == 0 or len(indices) >= 1 << 24:
        return None
    b = export_bvh(mesh)
    w = collapse(b)
    if w["depth"] * (WIDTH - 1) + 1 > _kw.WIDE_STACK:
        return None
    order = b["prim"]
    f = np.asarray(indices)[order]
    p = np.asarray(points, np.float32)
    v0 = p[f[:, 0]]
    arr = lambda a, dt: wp.array(np.ascontiguousarray(a), dtype=dt, device="cpu")  # noqa: E731
    # the three vertices exactly as the mesh has them (edges rebuilt as v0 + (v1 − v0) are rounded, and two triangles
    # sharing an edge would then disagree on it: the watertight test needs the very same coordinates); the keys
    # e1/e2 name the SceneGeo fields they fill
    return dict(boxes=arr(w["boxes"].reshape(-1), float), child=arr(w["child"].reshape(-1), wp.int32),
                v0=arr(v0, wp.vec3), e1=arr(p[f[:, 1]], wp.vec3), e2=arr(p[f[:, 2]], wp.vec3),
                fid=arr(order.astype(np.int32), wp.int32))
