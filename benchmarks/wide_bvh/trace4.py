"""Closest-hit traversal of the BVH4 from bvhw.py written in Warp: ordered stack traversal, 4-lane slab test on
vec4 child boxes (sign-ordered near/far planes), Moller-Trumbore on precomputed (v0, e1, e2)."""
from __future__ import annotations

import warp as wp

STACK = 64
vstack_i = wp.types.vector(length=STACK, dtype=wp.int32)
vstack_f = wp.types.vector(length=STACK, dtype=wp.float32)
INF = 3.0e38


@wp.func
def safe_rcp(x: float):
    y = x
    if y == 0.0:
        y = 1.0e-20
    return 1.0 / y


@wp.func
def cas(ta: float, ca: int, tb: float, cb: int):
    # returns (min pair, max pair)
    sw = tb < ta
    return wp.where(sw, tb, ta), wp.where(sw, cb, ca), wp.where(sw, ta, tb), wp.where(sw, ca, cb)


@wp.kernel
def trace_bvh4(boxes: wp.array(dtype=wp.vec4), child: wp.array(dtype=wp.vec4i),
               v0: wp.array(dtype=wp.vec3), e1: wp.array(dtype=wp.vec3), e2: wp.array(dtype=wp.vec3),
               fid: wp.array(dtype=wp.int32), max_t: float,
               o: wp.array(dtype=wp.vec3), d: wp.array(dtype=wp.vec3),
               t_out: wp.array(dtype=float), f_out: wp.array(dtype=wp.int32)):
    i = wp.tid()
    org = o[i]
    dir = d[i]
    rx = safe_rcp(dir[0])
    ry = safe_rcp(dir[1])
    rz = safe_rcp(dir[2])
    nx = wp.where(rx >= 0.0, 0, 3)
    ny = wp.where(ry >= 0.0, 1, 4)
    nz = wp.where(rz >= 0.0, 2, 5)
    fx = 3 - nx
    fy = 5 - ny
    fz = 7 - nz
    rx4 = wp.vec4(rx)
    ry4 = wp.vec4(ry)
    rz4 = wp.vec4(rz)
    ox4 = wp.vec4(org[0] * rx)
    oy4 = wp.vec4(org[1] * ry)
    oz4 = wp.vec4(org[2] * rz)
    zero4 = wp.vec4(0.0)

    tmax = float(max_t)
    hit_face = int(-1)
    st_n = vstack_i()
    st_t = vstack_f()
    sp = int(0)
    ref = int(0)
    while True:
        if ref >= 0:
            b = ref * 6
            tnx = wp.cw_mul(boxes[b + nx], rx4) - ox4
            tny = wp.cw_mul(boxes[b + ny], ry4) - oy4
            tnz = wp.cw_mul(boxes[b + nz], rz4) - oz4
            tfx = wp.cw_mul(boxes[b + fx], rx4) - ox4
            tfy = wp.cw_mul(boxes[b + fy], ry4) - oy4
            tfz = wp.cw_mul(boxes[b + fz], rz4) - oz4
            tn = wp.max(wp.max(tnx, tny), wp.max(tnz, zero4))
            tf = wp.min(wp.min(tfx, tfy), wp.min(tfz, wp.vec4(tmax)))
            c = child[ref]
            t0 = wp.where(tn[0] <= tf[0], tn[0], INF)
            t1 = wp.where(tn[1] <= tf[1], tn[1], INF)
            t2 = wp.where(tn[2] <= tf[2], tn[2], INF)
            t3 = wp.where(tn[3] <= tf[3], tn[3], INF)
            c0 = c[0]
            c1 = c[1]
            c2 = c[2]
            c3 = c[3]
            # sorting network on (t, child)
            t0, c0, t1, c1 = cas(t0, c0, t1, c1)
            t2, c2, t3, c3 = cas(t2, c2, t3, c3)
            t0, c0, t2, c2 = cas(t0, c0, t2, c2)
            t1, c1, t3, c3 = cas(t1, c1, t3, c3)
            t1, c1, t2, c2 = cas(t1, c1, t2, c2)
            if t0 < INF:
                st_n[sp] = c3
                st_t[sp] = t3
                sp += wp.where(t3 < INF, 1, 0)
                st_n[sp] = c2
                st_t[sp] = t2
                sp += wp.where(t2 < INF, 1, 0)
                st_n[sp] = c1
                st_t[sp] = t1
                sp += wp.where(t1 < INF, 1, 0)
                ref = c0
                continue
        else:
            code = -ref - 1
            k0 = code >> 3
            k1 = k0 + (code & 7) + 1
            for k in range(k0, k1):
                a = e1[k]
                bb = e2[k]
                p = wp.cross(dir, bb)
                det = wp.dot(a, p)
                inv = 1.0 / det
                s = org - v0[k]
                u = wp.dot(s, p) * inv
                q = wp.cross(s, a)
                v = wp.dot(dir, q) * inv
                t = wp.dot(bb, q) * inv
                if u >= 0.0 and v >= 0.0 and u + v <= 1.0 and t >= 0.0 and t < tmax:
                    tmax = t
                    hit_face = fid[k]
        # pop
        found = int(0)
        while sp > 0:
            sp -= 1
            if st_t[sp] < tmax:
                ref = st_n[sp]
                found = 1
                break
        if found == 0:
            break
    if hit_face >= 0:
        t_out[i] = tmax
    else:
        t_out[i] = -1.0
    f_out[i] = hit_face
