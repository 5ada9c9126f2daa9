"""Wide-BVH closest-hit traversal as a Warp native snippet (wp.func_native) using clang vector extensions
(ext_vector_type) for the W-lane slab test; same data layout as bvhw.py (boxes[n, 6, W] flat, child[n, W] flat)."""
from __future__ import annotations

import warp as wp

_SRC = r"""
using namespace wp;
typedef float vf __attribute__((ext_vector_type(WIDTH)));
typedef int vi __attribute__((ext_vector_type(WIDTH)));
const float* B = boxes.data;
const int* C = child.data;
const vec3* V0 = v0.data;
const vec3* E1 = e1.data;
const vec3* E2 = e2.data;
const int* F = fid.data;
vec3 o = org;
vec3 d = dir;
float rx = 1.0f / (d[0] == 0.0f ? 1.0e-20f : d[0]);
float ry = 1.0f / (d[1] == 0.0f ? 1.0e-20f : d[1]);
float rz = 1.0f / (d[2] == 0.0f ? 1.0e-20f : d[2]);
const int nx = rx >= 0.0f ? 0 : 3, ny = ry >= 0.0f ? 1 : 4, nz = rz >= 0.0f ? 2 : 5;
const int fx = 3 - nx, fy = 5 - ny, fz = 7 - nz;
const vf RX = rx, RY = ry, RZ = rz;
const vf OX = o[0] * rx, OY = o[1] * ry, OZ = o[2] * rz;
const vf ZERO = 0.0f;
float tmax = max_t;
int hitf = -1;
int st_n[96];
float st_t[96];
int sp = 0;
int ref = 0;
while (true) {
    bool descend = false;
    if (ref >= 0) {
        const float* nb = B + (size_t)ref * (6 * WIDTH);
        vf lx, ly, lz, ux, uy, uz;
        __builtin_memcpy(&lx, nb + nx * WIDTH, sizeof(vf));
        __builtin_memcpy(&ly, nb + ny * WIDTH, sizeof(vf));
        __builtin_memcpy(&lz, nb + nz * WIDTH, sizeof(vf));
        __builtin_memcpy(&ux, nb + fx * WIDTH, sizeof(vf));
        __builtin_memcpy(&uy, nb + fy * WIDTH, sizeof(vf));
        __builtin_memcpy(&uz, nb + fz * WIDTH, sizeof(vf));
        vf tn = __builtin_elementwise_max(__builtin_elementwise_max(lx * RX - OX, ly * RY - OY),
                                          __builtin_elementwise_max(lz * RZ - OZ, ZERO));
        vf tf = __builtin_elementwise_min(__builtin_elementwise_min(ux * RX - OX, uy * RY - OY),
                                          __builtin_elementwise_min(uz * RZ - OZ, (vf)tmax));
        vi m = tn <= tf;
        unsigned mask = 0;
        for (int l = 0; l < WIDTH; ++l) mask |= (unsigned)(m[l] & 1) << l;
        if (mask) {
            const int* cc = C + (size_t)ref * WIDTH;
            float tl[WIDTH];
            __builtin_memcpy(tl, &tn, sizeof(vf));
            int l0 = __builtin_ctz(mask);
            mask &= mask - 1;
            if (!mask) {
                ref = cc[l0];
                continue;
            }
            int base = sp;
            st_n[sp] = cc[l0]; st_t[sp] = tl[l0]; ++sp;
            while (mask) {
                int l = __builtin_ctz(mask);
                mask &= mask - 1;
                // insertion into [base, sp) kept in descending t order
                float t = tl[l];
                int c = cc[l];
                int j = sp;
                while (j > base && st_t[j - 1] < t) { st_t[j] = st_t[j - 1]; st_n[j] = st_n[j - 1]; --j; }
                st_t[j] = t; st_n[j] = c; ++sp;
            }
            ref = st_n[--sp];
            continue;
        }
    } else {
        int code = -ref - 1;
        int k0 = code >> 3;
        int k1 = k0 + (code & 7) + 1;
        for (int k = k0; k < k1; ++k) {
            vec3 a = E1[k], b = E2[k];
            vec3 p = cross(d, b);
            float det = dot(a, p);
            float inv = 1.0f / det;
            vec3 s = o - V0[k];
            float u = dot(s, p) * inv;
            vec3 q = cross(s, a);
            float v = dot(d, q) * inv;
            float t = dot(b, q) * inv;
            if (u >= 0.0f && v >= 0.0f && u + v <= 1.0f && t >= 0.0f && t < tmax) { tmax = t; hitf = F[k]; }
        }
    }
    while (sp > 0) {
        --sp;
        if (st_t[sp] < tmax) { ref = st_n[sp]; descend = true; break; }
    }
    if (!descend) break;
}
t_out.data[i] = hitf >= 0 ? tmax : -1.0f;
f_out.data[i] = hitf;
"""


def make(width):
    @wp.func_native(_SRC.replace("WIDTH", str(width)))
    def trace_native(boxes: wp.array(dtype=float), child: wp.array(dtype=wp.int32), v0: wp.array(dtype=wp.vec3),
                     e1: wp.array(dtype=wp.vec3), e2: wp.array(dtype=wp.vec3), fid: wp.array(dtype=wp.int32),
                     org: wp.vec3, dir: wp.vec3, max_t: float, i: int, t_out: wp.array(dtype=float),
                     f_out: wp.array(dtype=wp.int32)): ...

    @wp.kernel(module="unique")
    def k(boxes: wp.array(dtype=float), child: wp.array(dtype=wp.int32), v0: wp.array(dtype=wp.vec3),
          e1: wp.array(dtype=wp.vec3), e2: wp.array(dtype=wp.vec3), fid: wp.array(dtype=wp.int32), max_t: float,
          o: wp.array(dtype=wp.vec3), d: wp.array(dtype=wp.vec3), t_out: wp.array(dtype=float),
          f_out: wp.array(dtype=wp.int32)):
        i = wp.tid()
        trace_native(boxes, child, v0, e1, e2, fid, o[i], d[i], max_t, i, t_out, f_out)

    return k


KERNELS = {4: make(4), 8: make(8)}
