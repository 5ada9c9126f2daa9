"""An 8-wide BVH traversal for the CPU (a native snippet: clang vector types test 8 child boxes at once).

Warp's ``mesh_query_ray`` traverses a binary BVH with scalar box tests; on the CPU this snippet, over the same
triangles collapsed into an 8-wide tree (built by :mod:`wsim.scene.widebvh`), traces about 3× faster. A leaf's triangles are tested 4 at a time (SIMD
lanes); the result names the hit triangle by its slot in the tree's order, whose vertices are at hand there. On CUDA the
snippet compiles to a stub and the tracer keeps ``mesh_query_ray``.

Watertight: a ray through an edge or vertex shared by triangles hits at least one of them. Triangles are tested with
Woop, Benthin & Wald's algorithm (JCGT 2013: vertices taken relative to the ray origin and sheared so that the ray
is +z, edge functions evaluated without FMA so that a shared edge gets exactly opposite values in its two triangles)
on the mesh's exact vertices; the hit distance is then taken from the triangle's plane. Boxes are tested
conservatively (bound − origin before scaling by 1/d, far distances widened by the rounding bound, rays lying in a
box face kept), so no box a ray touches is culled; all of it is independent of where the world origin is.

Order independent: of the triangles a ray hits at the same distance the one of smallest face index wins, and a box is
culled only when its entry lies beyond the current hit by more than ``CULL`` (0.1 %, far more than a plane distance's
rounding error short of grazing incidence), so the triangle found does not depend on the order the leaves are visited
in: :mod:`wsim.kernels.packet` traces beams of rays through the same tree with bit-identical results.

Node layout: ``boxes`` [n, 6, 8] flat = (lo x, y, z, hi x, y, z) per child lane (empty lanes hold an empty box);
``child`` [n, 8] = inner child index (>= 0) or a leaf ``~(start << 3 | (count − 1))`` into the reordered triangles
(``v0``, ``v1``, ``v2``: their vertices; ``fid``: original face index).
"""

import warp as wp

WIDE_STACK = 128  # traversal stack entries; the build checks depth · 7 + 1 fits
#: Culling margin: a box whose entry distance exceeds the current hit's t by more than this factor is skipped. The
#: triangle of smallest (t, face) is then found whatever the visiting order, unless its plane distance comes out
#: more than 0.1 % short of its box's entry (a ray within about 1e-4 rad of grazing the triangle's plane).
CULL = 1.0 + 2.0**-10

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
const vec3* V1 = v1.data;
const vec3* V2 = v2.data;
const int* F = fid.data;
vec3 o = org;
vec3 d = dir;
// 1/d, +inf for a zero component: that slab is then (-inf, +inf) when the origin lies between its planes, empty when
// outside, and 0·inf = NaN (ignored by the NaN-dropping max/min below) when the origin lies on one of them, so a ray
// running inside a box's face is not culled
const float rx = d[0] == 0.0f ? INFINITY : 1.0f / d[0];
const float ry = d[1] == 0.0f ? INFINITY : 1.0f / d[1];
const float rz = d[2] == 0.0f ? INFINITY : 1.0f / d[2];
const int nx = rx >= 0.0f ? 0 : 3, ny = ry >= 0.0f ? 1 : 4, nz = rz >= 0.0f ? 2 : 5;
const int fx = 3 - nx, fy = 5 - ny, fz = 7 - nz;
// Robust slab test (Woop, Benthin & Wald 2013, section 5): t = (bound − origin)·(1/d), the origin subtracted first so
// that the error is relative to t wherever the origin is. A near distance carries at most 3 roundings, a far one 4
// (its reciprocal is pre-scaled by WIDEN = 1 + 2^-21 ≥ (1 + ε)³/(1 − ε)⁴): a box the ray touches is never culled.
const float WIDEN = 1.0f + 4.76837158203125e-7f;
// max / min dropping a NaN first operand (the second when unordered, as x86 maxps / minps): every chain below ends in
// an operand that is never NaN, so a NaN slab distance is ignored
#define VMAX(a, b) ({ const vf a_ = (a), b_ = (b); a_ > b_ ? a_ : b_; })
#define VMIN(a, b) ({ const vf a_ = (a), b_ = (b); a_ < b_ ? a_ : b_; })
// BOX_ONLY (a tree of boxes, not triangles): near distances scaled down and far ones up by 2^-16 more, a margin
// far beyond any rounding of another box test of the same ray (1 for the triangle traversals: the same bits)
const float NEAR_S = BOX_ONLY ? 1.0f - 1.52587890625e-5f : 1.0f, FAR_S = BOX_ONLY ? 1.0f + 1.52587890625e-5f : 1.0f;
const vf RX = rx * NEAR_S, RY = ry * NEAR_S, RZ = rz * NEAR_S;
const vf FX = rx * WIDEN * FAR_S, FY = ry * WIDEN * FAR_S, FZ = rz * WIDEN * FAR_S;
const vf OX = o[0], OY = o[1], OZ = o[2];
const vf ZERO = 0.0f;
// a box beyond the current hit by more than the margin CULL (>= WIDEN) is culled: the result is the triangle of
// smallest (t, face) whatever order the leaves are visited in (the packet traversal's order differs)
const float CULL = 1.0f + 9.765625e-4f;
float tmax = max_t;
vf TFAR = tmax * CULL;
// Watertight triangle test set-up: kz = the dominant axis of d, (kx, ky) the others in the order that keeps the
// winding, and the shear (Sx, Sy) that maps the ray onto the kz axis through the origin.
int kz = fabsf(d[0]) > fabsf(d[1]) ? (fabsf(d[0]) > fabsf(d[2]) ? 0 : 2) : (fabsf(d[1]) > fabsf(d[2]) ? 1 : 2);
int kx = kz == 2 ? 0 : kz + 1;
int ky = kx == 2 ? 0 : kx + 1;
if (d[kz] < 0.0f) { int tmp = kx; kx = ky; ky = tmp; }
const float Sx = d[kx] / d[kz], Sy = d[ky] / d[kz];
int hitf = -1, hitk = -1;
typedef float v4f __attribute__((ext_vector_type(4)));
typedef int v4i __attribute__((ext_vector_type(4)));
const v4f OKX = o[kx], OKY = o[ky], OKZ = o[kz], SX4 = Sx, SY4 = Sy, Z4 = 0.0f;
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
        vf tn = VMAX((lx - OX) * RX, VMAX((ly - OY) * RY, VMAX((lz - OZ) * RZ, ZERO)));
        vf tf = VMIN((ux - OX) * FX, VMIN((uy - OY) * FY, VMIN((uz - OZ) * FZ, TFAR)));
        vi m = tn <= tf;
#if defined(__AVX__)
        typedef float v8sf __attribute__((__vector_size__(32)));
        v8sf mf;
        __builtin_memcpy(&mf, &m, sizeof(mf));
        unsigned mask = (unsigned)__builtin_ia32_movmskps256(mf);
#else
        unsigned mask = 0;
        for (int l = 0; l < 8; ++l) mask |= (unsigned)(m[l] & 1) << l;
#endif
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
            if (cc[l0] >= 0) __builtin_prefetch(B + (size_t)cc[l0] * 48);  // popped later: fetch it meanwhile
            while (mask) {
                int l = __builtin_ctz(mask);
                mask &= mask - 1;
                float t = tl[l];
                int c = cc[l];
                int j = sp;
                while (j > base && st_t[j - 1] < t) { st_t[j] = st_t[j - 1]; st_n[j] = st_n[j - 1]; --j; }
                st_t[j] = t; st_n[j] = c; ++sp;
                if (c >= 0) __builtin_prefetch(B + (size_t)c * 48);
            }
            ref = st_n[--sp];
            continue;
        }
    } else {
        if (BOX_ONLY) return wp::vec4(0.0f, __builtin_bit_cast(float, -ref - 1), 0.0f, 0.0f);  // a leaf box is met
        int code = -ref - 1;
        int k0 = code >> 3;
        int k1 = k0 + (code & 7) + 1;
        // the leaf's triangles 4 at a time: Woop, Benthin & Wald 2013's test with the vertices relative to the ray
        // origin, sheared so that the ray is +z, and the edge functions, lane by lane; no FMA contraction here, so a
        // vertex gets the same coordinates in every triangle that has it and an edge shared by two triangles
        // (traversed in opposite directions) gets exactly opposite values in both: a ray through it cannot miss both
        for (int g = k0; g < k1; g += 4) {
            const int cnt = k1 - g < 4 ? k1 - g : 4;
            v4f ax, ay, az, bx, by, bz, cx, cy, cz;
            for (int j = 0; j < 4; ++j) {
                const int k = g + (j < cnt ? j : 0);
                const float* a = (const float*)&V0[k];
                const float* b = (const float*)&V1[k];
                const float* c = (const float*)&V2[k];
                ax[j] = a[kx]; ay[j] = a[ky]; az[j] = a[kz];
                bx[j] = b[kx]; by[j] = b[ky]; bz[j] = b[kz];
                cx[j] = c[kx]; cy[j] = c[ky]; cz[j] = c[kz];
            }
            v4f U, V, W, det;
            {
#pragma clang fp contract(off)
                const v4f Az = az - OKZ, Bz = bz - OKZ, Cz = cz - OKZ;
                const v4f Ax = (ax - OKX) - SX4 * Az, Ay = (ay - OKY) - SY4 * Az;
                const v4f Bx = (bx - OKX) - SX4 * Bz, By = (by - OKY) - SY4 * Bz;
                const v4f Cx = (cx - OKX) - SX4 * Cz, Cy = (cy - OKY) - SY4 * Cz;
                U = Cx * By - Cy * Bx;
                V = Ax * Cy - Ay * Cx;
                W = Bx * Ay - By * Ax;
                det = U + V + W;
            }
            const v4i in = ~(((U < Z4) | (V < Z4) | (W < Z4)) & ((U > Z4) | (V > Z4) | (W > Z4))) & (det != Z4);
            unsigned pass = 0;
            for (int j = 0; j < 4; ++j) pass |= (unsigned)(in[j] & 1) << j;
            pass &= (1u << cnt) - 1u;
            // the ray passes through these triangles (in index order): the distance from the plane through the exact
            // vertices (Woop's T/det loses digits for large triangles seen at grazing angles); spelt out without FMA,
            // as the packet traversal evaluates it lane by lane
            while (pass) {
                const int j = __builtin_ctz(pass);
                pass &= pass - 1;
                const int k = g + j;
                const vec3 pa = V0[k], pb = V1[k], pc = V2[k];
                const vec3 n = cross(pb - pa, pc - pa);
                const float t = dot(n, pa - o) / dot(n, d);
                // equal distances: the smaller face index wins (hitf = -1 until the first hit, so t < max_t then)
                if (!(t >= 0.0f && (t < tmax || (t == tmax && F[k] < hitf)))) continue;
                const float inv = 1.0f / det[j];
                tmax = t;
                TFAR = tmax * CULL;
                hitf = F[k];
                hitk = k;
                hu = U[j] * inv;
                hv = V[j] * inv;
                if (ANY_HIT) return wp::vec4(tmax, __builtin_bit_cast(float, hitk), hu, hv);
            }
        }
    }
    while (sp > 0) {
        --sp;
        if (st_t[sp] <= tmax * CULL) { ref = st_n[sp]; descend = true; break; }
    }
    if (!descend) break;
}
if (hitf < 0) return wp::vec4(-1.0f, -1.0f, 0.0f, 0.0f);
// Warp's barycentrics: p = u·p0 + v·p1 + (1 − u − v)·p2
return wp::vec4(tmax, __builtin_bit_cast(float, hitk), hu, hv);  // the triangle's slot: see wide_slot
#undef VMAX
#undef VMIN
#endif
"""


@wp.func_native("const bool ANY_HIT = false, BOX_ONLY = false;\n" + _TRACE)
def wide_closest(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3], v1: wp.array[wp.vec3],
                 v2: wp.array[wp.vec3], fid: wp.array[wp.int32], org: wp.vec3, dir: wp.vec3,
                 max_t: float) -> wp.vec4:
    """Closest triangle along ``org + t·dir`` with 0 <= t < max_t: (t, slot, u, v), slot −1 for a miss (the
    triangle's slot in the tree's order as :func:`wide_slot` decodes it; its face is ``fid[slot]``); u, v are the
    weights of the face's first and second vertices (Warp's convention: p = u·p0 + v·p1 + (1 − u − v)·p2)."""
    ...



@wp.func_native("const bool ANY_HIT = false, BOX_ONLY = false;\n"
                + _TRACE.replace("const vf ZERO = 0.0f;", "const vf ZERO = min_t;", 1))
def wide_closest_past(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3],
                      v1: wp.array[wp.vec3], v2: wp.array[wp.vec3], fid: wp.array[wp.int32], org: wp.vec3,
                      dir: wp.vec3, min_t: float, max_t: float) -> wp.vec4:
    """:func:`wide_closest` of a ray known to meet no triangle nearer than ``min_t`` [m] (0 <= min_t): the boxes it
    leaves before ``min_t`` are not entered, the rest as there (the same answer, not looked for where it cannot
    be)."""
    ...


@wp.func_native("const bool ANY_HIT = true, BOX_ONLY = false;\n" + _TRACE)
def wide_any(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3], v1: wp.array[wp.vec3],
             v2: wp.array[wp.vec3], fid: wp.array[wp.int32], org: wp.vec3, dir: wp.vec3, max_t: float) -> wp.vec4:
    """:func:`wide_closest`'s traversal stopping at the first triangle it finds with 0 <= t < max_t (some hit, not
    necessarily the closest; the same result layout, slot −1 for none): for shadow and visibility rays."""
    ...


@wp.func_native("const bool ANY_HIT = false, BOX_ONLY = false;\n" + _TRACE.replace("int ref = 0;\n", "int ref = root;\n"))
def wide_closest_from(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3],
                      v1: wp.array[wp.vec3], v2: wp.array[wp.vec3], fid: wp.array[wp.int32], root: int,
                      org: wp.vec3, dir: wp.vec3, max_t: float) -> wp.vec4:
    """:func:`wide_closest` from wide node ``root`` of a pool of several trees (the instance prototypes': child
    references, leaf ranges and slots absolute in the pool, faces local to the tree's mesh). ``dir`` need not be
    unit length (an instance's ray in its prototype's frame): t is in units of ``dir``."""
    ...

@wp.func_native("const bool ANY_HIT = true, BOX_ONLY = false;\n" + _TRACE.replace("int ref = 0;\n", "int ref = root;\n"))
def wide_any_from(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3], v1: wp.array[wp.vec3],
                  v2: wp.array[wp.vec3], fid: wp.array[wp.int32], root: int, org: wp.vec3, dir: wp.vec3,
                  max_t: float) -> wp.vec4:
    """:func:`wide_any` from wide node ``root`` of a pool of trees (as :func:`wide_closest_from`): for shadow rays
    against an instance's prototype."""
    ...


@wp.func_native("const bool ANY_HIT = true, BOX_ONLY = true;\n"
                + _TRACE.replace("return wp::vec4(-1.0f, -1.0f, 0.0f, 0.0f);\n#else", "return wp::vec4(0.0f);\n#else", 1))
def wide_box_any(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3], v1: wp.array[wp.vec3],
                 v2: wp.array[wp.vec3], fid: wp.array[wp.int32], org: wp.vec3, dir: wp.vec3, max_t: float) -> wp.vec4:
    """Whether ``org + t·dir`` may meet a leaf box of a tree of boxes (the same node layout; a leaf entry ``~code``
    stands for a box, not triangles) with its entry before ``max_t`` × (1 + 2^-10): entry ``[1]`` >= 0.0 if so (the
    first such leaf's code as int32 bits), −1 if not. Conservative: near distances are taken 2^-16 short and far
    ones 2^-16 long, so every box another slab test of the same ray (Warp's top-level query) meets before
    ``max_t`` is met here. On CUDA: always met (``[1]`` = 0). The triangle arrays are unused (1-entry arrays do)."""
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


# ---------------------------------------------------------------------------------------------------------------------
# Native build of the 8-wide BVH straight from a CPU wp.Mesh's binary BVH (wsim.scene.widebvh): the same greedy
# collapse as the reference (expand the child of largest surface area until 8 children; subtrees of at most max_leaf
# contiguous triangles become leaves), in O(nodes) without copying the binary tree out.

_EXPAND = r"""
// children of binary node n in the wide node: expand the non-leaf entry of largest surface area (the first of equal
// ones) until `width` entries; the surface area is evaluated in float32 without FMA, as the reference collapse does
auto area = [&](int e) -> float {
#pragma clang fp contract(off)
    float ex = U[e].x - L[e].x, ey = U[e].y - L[e].y, ez = U[e].z - L[e].z;
    ex = ex > 0.0f ? ex : 0.0f;
    ey = ey > 0.0f ? ey : 0.0f;
    ez = ez > 0.0f ? ez : 0.0f;
    return ex * ey + ey * ez + ez * ex;
};
auto expand = [&](int n, int* ents) -> int {
    int ne = 2;
    ents[0] = int(L[n].i);
    ents[1] = int(U[n].i);
    while (ne < width) {
        int best = -1;
        float ba = -1.0f;
        for (int k = 0; k < ne; ++k) {
            const int e = ents[k];
            if (!EF[e]) {
                const float a = area(e);
                if (a > ba) { best = k; ba = a; }
            }
        }
        if (best < 0) break;
        const int e = ents[best];
        for (int k = best; k < ne - 1; ++k) ents[k] = ents[k + 1];
        ents[ne - 1] = int(L[e].i);
        ents[ne] = int(U[e].i);
        ++ne;
    }
    return ne;
};
"""

_PLAN = r"""
#if !defined(__CUDA_ARCH__)
using namespace wp;
Mesh m = mesh_get(id);
const BVHPackedNodeHalf* L = m.bvh.node_lowers;
const BVHPackedNodeHalf* U = m.bvh.node_uppers;
const int root = *m.bvh.root;
int* Q = queue.data;   // first the breadth-first order of all nodes, then the queue of wide nodes (binary ids)
int* CN = cnt.data;
int* ST = start.data;
int* W = wid.data;     // first the end of each subtree's primitive range, then the wide id of each wide node
unsigned char* EF = eff.data;
int head = 0, tail = 0;
Q[tail++] = root;
while (head < tail) {
    const int n = Q[head++];
    if (!L[n].b) { Q[tail++] = int(L[n].i); Q[tail++] = int(U[n].i); }
}
int max_leaf_cnt = 0;
for (int k = tail - 1; k >= 0; --k) {
    const int n = Q[k];
    int c, s, e;
    if (L[n].b) {
        s = int(L[n].i); e = int(U[n].i); c = e - s;
        if (c > max_leaf_cnt) max_leaf_cnt = c;
    } else {
        const int a = int(L[n].i), b = int(U[n].i);
        c = CN[a] + CN[b];
        s = ST[a] < ST[b] ? ST[a] : ST[b];
        e = W[a] > W[b] ? W[a] : W[b];
    }
    CN[n] = c; ST[n] = s; W[n] = e;
    EF[n] = (unsigned char)(L[n].b || (c <= max_leaf && e - s == c));
}
""" + _EXPAND + r"""
int nw = 0, depth = 0;
if (EF[root]) {  // a tiny mesh: one wide node holding the single leaf
    Q[0] = root;
    nw = 1;
    depth = 1;
} else {
    int qh = 0, qt = 0, lvl_end = 1, cur = 1;
    Q[qt++] = root;
    W[root] = 0;
    int ents[8];
    while (qh < qt) {
        if (qh == lvl_end) { ++cur; lvl_end = qt; }
        const int n = Q[qh++];
        depth = cur;
        const int ne = expand(n, ents);
        for (int k = 0; k < ne; ++k) {
            const int e = ents[k];
            if (!EF[e]) { W[e] = qt; Q[qt++] = e; }
        }
    }
    nw = qt;
}
meta.data[0] = nw;
meta.data[1] = depth;
meta.data[2] = max_leaf_cnt;
meta.data[3] = EF[root];
#endif
"""

_FILL = r"""
#if !defined(__CUDA_ARCH__)
using namespace wp;
Mesh m = mesh_get(id);
const BVHPackedNodeHalf* L = m.bvh.node_lowers;
const BVHPackedNodeHalf* U = m.bvh.node_uppers;
const unsigned char* EF = eff.data;
""" + _EXPAND + r"""
int ents[8];
int ne;
const int n = queue.data[w];
if (single) { ents[0] = n; ne = 1; } else ne = expand(n, ents);
float* B = boxes.data + (size_t)(node_off + w) * 48;
int* C = child.data + (size_t)(node_off + w) * 8;
for (int k = 0; k < 8; ++k) {
    if (k < ne) {
        const int e = ents[k];
        B[k] = L[e].x; B[8 + k] = L[e].y; B[16 + k] = L[e].z;
        B[24 + k] = U[e].x; B[32 + k] = U[e].y; B[40 + k] = U[e].z;
        C[k] = EF[e] ? ~(((start.data[e] + tri_off) << 3) | (cnt.data[e] - 1)) : wid.data[e] + node_off;
    } else {
        B[k] = INFINITY; B[8 + k] = INFINITY; B[16 + k] = INFINITY;
        B[24 + k] = -INFINITY; B[32 + k] = -INFINITY; B[40 + k] = -INFINITY;
        C[k] = -1;
    }
}
#endif
"""


@wp.func_native(_PLAN)
def _wide_plan(id: wp.uint64, width: int, max_leaf: int, queue: wp.array[wp.int32], cnt: wp.array[wp.int32],
               start: wp.array[wp.int32], wid: wp.array[wp.int32], eff: wp.array[wp.uint8],
               meta: wp.array[wp.int32]): ...


@wp.func_native(_FILL)
def _wide_fill(id: wp.uint64, width: int, w: int, single: int, node_off: int, tri_off: int,
               queue: wp.array[wp.int32], cnt: wp.array[wp.int32], start: wp.array[wp.int32],
               wid: wp.array[wp.int32], eff: wp.array[wp.uint8], boxes: wp.array[float],
               child: wp.array[wp.int32]): ...


@wp.func_native("""
#if !defined(__CUDA_ARCH__)
return wp::mesh_get(id).bvh.primitive_indices[k];
#else
return 0;
#endif
""")
def _prim_index(id: wp.uint64, k: int) -> int: ...


@wp.kernel
def wide_plan_kernel(id: wp.uint64, width: int, max_leaf: int, queue: wp.array[wp.int32], cnt: wp.array[wp.int32],
                     start: wp.array[wp.int32], wid: wp.array[wp.int32], eff: wp.array[wp.uint8],
                     meta: wp.array[wp.int32]):
    """One thread: subtree sizes and leaf flags of the binary BVH, and the breadth-first list of wide nodes
    (``meta`` = wide node count, depth, largest binary leaf, root-is-a-leaf)."""
    _wide_plan(id, width, max_leaf, queue, cnt, start, wid, eff, meta)


@wp.kernel
def wide_fill_kernel(id: wp.uint64, width: int, single: int, node_off: int, tri_off: int,
                     queue: wp.array[wp.int32], cnt: wp.array[wp.int32], start: wp.array[wp.int32],
                     wid: wp.array[wp.int32], eff: wp.array[wp.uint8], offset: int, boxes: wp.array[float],
                     child: wp.array[wp.int32]):
    """Wide node ``tid``: its 8 child boxes and child references, written at ``node_off`` (children relocated by
    ``node_off``, leaf ranges by ``tri_off``)."""
    w = wp.tid() + offset
    _wide_fill(id, width, w, single, node_off, tri_off, queue, cnt, start, wid, eff, boxes, child)


@wp.kernel
def wide_triangles_kernel(id: wp.uint64, points: wp.array[wp.vec3], indices: wp.array[wp.int32], tri_off: int,
                          offset: int, v0: wp.array[wp.vec3], v1: wp.array[wp.vec3], v2: wp.array[wp.vec3],
                          fid: wp.array[wp.int32]):
    """The triangles in BVH order: their exact vertices and original face index, written at ``tri_off``."""
    k = wp.tid() + offset
    f = _prim_index(id, k)
    v0[tri_off + k] = points[indices[f * 3]]
    v1[tri_off + k] = points[indices[f * 3 + 1]]
    v2[tri_off + k] = points[indices[f * 3 + 2]]
    fid[tri_off + k] = f


@wp.func_native("""
return __builtin_bit_cast(int, x);
""")
def wide_slot(x: float) -> int:
    """The hit triangle's slot in the tree's triangle order, as :func:`wide_closest` (and the packet traversal)
    return it in the second entry of their result: its int32 bits, exact at any mesh size (−1.0 for a miss decodes to
    a negative number; a hit's entry is a non-negative float, so ``w[1] >= 0.0`` tells hits too). The face is
    ``fid[slot]``; ``v0/v1/v2[slot]`` are its vertices."""
    ...
