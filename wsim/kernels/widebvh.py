"""An 8-wide BVH traversal for the CPU (a native snippet: clang vector types test 8 child boxes at once).

Warp's ``mesh_query_ray`` traverses a binary BVH with scalar box tests; on the CPU this snippet, over the same
triangles collapsed into an 8-wide tree (built by :mod:`wsim.scene.widebvh`), traces about 3× faster. On CUDA the
snippet compiles to a stub and the tracer keeps ``mesh_query_ray``.

Node layout: ``boxes`` [n, 6, 8] flat = (lo x, y, z, hi x, y, z) per child lane (empty lanes hold an empty box);
``child`` [n, 8] = inner child index (>= 0) or a leaf ``~(start << 3 | (count − 1))`` into the reordered triangles
(``v0``, ``e1``, ``e2``: first vertex and edges; ``fid``: original face index).
"""

import warp as wp

WIDE_STACK = 128  # traversal stack entries; the build checks depth · 7 + 1 fits

_TRACE = r"""
#if defined(__CUDA_ARCH__)
return wp::vec4(-1.0f, -1.0f, 0.0f, 0.0f);
#else
using namespace wp;
typedef float vf __attribute__((ext_vector_type(8)));
typedef int vi __attribute__((ext_vector_type(8)));
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
float hu = 0.0f, hv = 0.0f;
int st_n[128];
float st_t[128];
int sp = 0;
int ref = 0;
while (true) {
    bool descend = false;
    if (ref >= 0) {
        const float* nb = B + (size_t)ref * 48;
        vf lx, ly, lz, ux, uy, uz;
        __builtin_memcpy(&lx, nb + nx * 8, sizeof(vf));
        __builtin_memcpy(&ly, nb + ny * 8, sizeof(vf));
        __builtin_memcpy(&lz, nb + nz * 8, sizeof(vf));
        __builtin_memcpy(&ux, nb + fx * 8, sizeof(vf));
        __builtin_memcpy(&uy, nb + fy * 8, sizeof(vf));
        __builtin_memcpy(&uz, nb + fz * 8, sizeof(vf));
        vf tn = __builtin_elementwise_max(__builtin_elementwise_max(lx * RX - OX, ly * RY - OY),
                                          __builtin_elementwise_max(lz * RZ - OZ, ZERO));
        vf tf = __builtin_elementwise_min(__builtin_elementwise_min(ux * RX - OX, uy * RY - OY),
                                          __builtin_elementwise_min(uz * RZ - OZ, (vf)tmax));
        vi m = tn <= tf;
        unsigned mask = 0;
        for (int l = 0; l < 8; ++l) mask |= (unsigned)(m[l] & 1) << l;
        if (mask) {
            const int* cc = C + (size_t)ref * 8;
            float tl[8];
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
            if (u >= 0.0f && v >= 0.0f && u + v <= 1.0f && t >= 0.0f && t < tmax) { tmax = t; hitf = F[k]; hu = u; hv = v; }
        }
    }
    while (sp > 0) {
        --sp;
        if (st_t[sp] < tmax) { ref = st_n[sp]; descend = true; break; }
    }
    if (!descend) break;
}
if (hitf < 0) return wp::vec4(-1.0f, -1.0f, 0.0f, 0.0f);
// Warp's barycentrics: p = u·p0 + v·p1 + (1 − u − v)·p2
return wp::vec4(tmax, float(hitf), 1.0f - hu - hv, hu);
#endif
"""


@wp.func_native(_TRACE)
def wide_closest(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3], e1: wp.array[wp.vec3],
                 e2: wp.array[wp.vec3], fid: wp.array[wp.int32], org: wp.vec3, dir: wp.vec3,
                 max_t: float) -> wp.vec4:
    """Closest triangle along ``org + t·dir`` with 0 <= t < max_t: (t, face, u, v), face −1 for a miss."""
    ...


@wp.func_native("""
#if !defined(__CUDA_ARCH__)
using namespace wp;
Mesh m = mesh_get(id);
meta.data[0] = m.bvh.num_nodes;
meta.data[1] = *m.bvh.root;
meta.data[2] = m.bvh.num_items;
meta.data[3] = m.bvh.max_depth;
#endif
""")
def _bvh_meta(id: wp.uint64, meta: wp.array[int]): ...


@wp.func_native("""
#if !defined(__CUDA_ARCH__)
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
#endif
""")
def _bvh_nodes(id: wp.uint64, lo: wp.array[wp.vec3], hi: wp.array[wp.vec3], ia: wp.array[int], ib: wp.array[int],
               leaf: wp.array[int], prim: wp.array[int]): ...


@wp.kernel
def bvh_meta_kernel(id: wp.uint64, meta: wp.array[int]):
    """Node count, root, item count and depth of a CPU ``wp.Mesh``'s binary BVH."""
    _bvh_meta(id, meta)


@wp.kernel
def bvh_nodes_kernel(id: wp.uint64, lo: wp.array[wp.vec3], hi: wp.array[wp.vec3], ia: wp.array[int],
                     ib: wp.array[int], leaf: wp.array[int], prim: wp.array[int]):
    """The binary BVH's node boxes, children / leaf ranges and primitive order."""
    _bvh_nodes(id, lo, hi, ia, ib, leaf, prim)
