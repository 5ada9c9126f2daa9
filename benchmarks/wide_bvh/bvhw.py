"""Wide BVH (BVH4 / BVH8) built on the host by collapsing Warp's own binary SAH BVH, stored SoA for Warp kernels.

Node layout (width W): boxes[n, 6, W] = (lo_x, lo_y, lo_z, hi_x, hi_y, hi_z) per child lane; empty lanes hold an
empty box (lo = +inf, hi = -inf), which the sign-ordered slab test never hits. child[n, W]: inner child index (>= 0)
or a leaf reference ~(start << 3 | (count - 1)) into the reordered triangle arrays (count <= 8).
"""
from __future__ import annotations

import time

import numpy as np

from common import export_bvh, make_mesh


def _area(lo, hi):
    e = np.maximum(hi - lo, 0.0)
    return e[..., 0] * e[..., 1] + e[..., 1] * e[..., 2] + e[..., 2] * e[..., 0]


def collapse(b, width=4, max_leaf=4):
    """Collapse a binary BVH (export_bvh dict) into a width-`width` BVH; subtrees with <= max_leaf primitives whose
    primitives are contiguous become one leaf. Returns dict(boxes, child, order, root_ref)."""
    lo, hi, ia, ib, leaf = b["lo"], b["hi"], b["ia"], b["ib"], b["leaf"]
    nn = len(lo)
    # BFS levels for bottom-up counts / ranges
    levels = [np.array([b["root"]])]
    while True:
        cur = levels[-1]
        inner = cur[~leaf[cur]]
        if len(inner) == 0:
            break
        levels.append(np.concatenate([ia[inner], ib[inner]]))
    cnt = np.zeros(nn, np.int64)
    start = np.zeros(nn, np.int64)
    end = np.zeros(nn, np.int64)
    for lv in reversed(levels):
        lf = lv[leaf[lv]]
        cnt[lf] = ib[lf] - ia[lf]
        start[lf] = ia[lf]
        end[lf] = ib[lf]
        inn = lv[~leaf[lv]]
        cnt[inn] = cnt[ia[inn]] + cnt[ib[inn]]
        start[inn] = np.minimum(start[ia[inn]], start[ib[inn]])
        end[inn] = np.maximum(end[ia[inn]], end[ib[inn]])
    eff_leaf = leaf | ((cnt <= max_leaf) & (end - start == cnt))
    area = _area(lo, hi)

    eff_l = eff_leaf.tolist()
    ia_l = ia.tolist()
    ib_l = ib.tolist()
    area_l = area.tolist()
    start_l = start.tolist()
    cnt_l = cnt.tolist()

    # greedy collapse: expand the largest-area non-leaf entry until `width` entries
    wide_children = []  # per wide node: list of binary node ids
    queue = [b["root"]]
    wide_id = {b["root"]: 0}
    qi = 0
    while qi < len(queue):
        n = queue[qi]
        qi += 1
        ents = [ia_l[n], ib_l[n]]
        while len(ents) < width:
            best, ba = -1, -1.0
            for k, e in enumerate(ents):
                if not eff_l[e] and area_l[e] > ba:
                    best, ba = k, area_l[e]
            if best < 0:
                break
            e = ents.pop(best)
            ents += [ia_l[e], ib_l[e]]
        wide_children.append(ents)
        for e in ents:
            if not eff_l[e]:
                wide_id[e] = len(queue)
                queue.append(e)
    nw = len(queue)
    boxes = np.empty((nw, 6, width), np.float32)
    boxes[:, :3, :] = np.inf
    boxes[:, 3:, :] = -np.inf
    child = np.full((nw, width), -1, np.int32)
    # empty lanes: leaf ref with count 1 at start 0 is harmless since its box is never hit; use ~0 = -1
    for w, ents in enumerate(wide_children):
        for k, e in enumerate(ents):
            boxes[w, :3, k] = lo[e]
            boxes[w, 3:, k] = hi[e]
            if eff_l[e]:
                c = cnt_l[e]
                assert 1 <= c <= 8
                child[w, k] = ~((start_l[e] << 3) | (c - 1))
            else:
                child[w, k] = wide_id[e]
    return dict(boxes=boxes, child=child, order=b["prim"], root_ref=0, n_nodes=nw)


def build(points, faces, width=4, bin_leaf=2, max_leaf=4, ctor="sah"):
    """Returns (wide bvh dict, build seconds incl. Warp's binary build, triangle arrays)."""
    t0 = time.perf_counter()
    mesh = make_mesh(points, faces, leaf=bin_leaf, ctor=ctor)
    b = export_bvh(mesh)
    t1 = time.perf_counter()
    w = collapse(b, width, max_leaf)
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


def pack_tri4(w):
    """Repack leaves into blocks of 4 SoA triangles: tri[blk, 9, 4] = (v0 xyz, e1 xyz, e2 xyz) per lane, fid4[blk, 4];
    padding lanes are degenerate (e1 = e2 = 0, never hit). Leaf refs become ~(block << 3 | (blocks - 1))."""
    child = w["child"].copy()
    leaf_mask = child < 0
    codes = ~child[leaf_mask]
    uniq, inv = np.unique(codes, return_inverse=True)
    st = (uniq >> 3).astype(np.int64)
    cn = (uniq & 7).astype(np.int64) + 1
    nb = (cn + 3) // 4
    boff = np.concatenate([[0], np.cumsum(nb)[:-1]])
    nblk = int(nb.sum())
    lane_leaf = np.repeat(np.arange(len(uniq)), nb * 4)
    lane_j = np.arange(nblk * 4) - np.repeat(boff * 4, nb * 4)
    valid = lane_j < cn[lane_leaf]
    tri_idx = np.where(valid, st[lane_leaf] + lane_j, 0)
    tri = np.zeros((nblk * 4, 9), np.float32)
    tri[:, 0:3] = w["v0"][tri_idx]
    tri[:, 3:6] = np.where(valid[:, None], w["e1"][tri_idx], 0.0)
    tri[:, 6:9] = np.where(valid[:, None], w["e2"][tri_idx], 0.0)
    tri = np.ascontiguousarray(tri.reshape(nblk, 4, 9).transpose(0, 2, 1))
    fid4 = np.where(valid, w["fid"][tri_idx], -1).astype(np.int32).reshape(nblk, 4)
    assert nb.max() <= 8
    child[leaf_mask] = ~((boff[inv] << 3) | (nb[inv] - 1)).astype(np.int32)
    return dict(child=child, tri=tri, fid4=fid4, n_blocks=nblk)
