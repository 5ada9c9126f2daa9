"""Packet traversal of the 8-wide BVH (CPU): up to 64 rays from one origin, each with its own direction and range,
traced together (a lidar beam's sub-rays, which lie in a cone of a few tenths of a degree; a run of a camera row's
pixels).

The tree is walked once per packet. At inner nodes one interval test stands for all rays: the rays' start points and
reciprocal directions are bounded per axis, and since rounding is monotone the bounds of the slab distances computed
from them bound every ray's own (rounded) slab distances — a child that any ray's box test would keep is kept. At a
leaf each ray, 8 rays per SIMD vector, gets the very box test, watertight triangle test and plane distance of
:func:`wsim.kernels.widebvh.wide_closest`, lane by lane in the same float operations (:func:`wide_packet16`: 16
rays per vector where the CPU has AVX-512, for packets of 16 or 64 rays). With that traversal's
order-independent rules (equal distances: smallest face index; a box culled only beyond ``CULL`` × the current hit)
every ray's result (t, slot, u, v) is bit-identical to tracing it alone with ``wide_closest`` (the triangle's slot as
its int32 bits, :func:`wsim.kernels.widebvh.wide_slot`). Callers: :func:`wsim.kernels.lidar.walk_beam` and
:func:`wsim.kernels.shading.render_rows_kernel`, then :func:`wsim.kernels.trace.closest_hit_given` /
``closest_hit_listed`` per ray for the instances and the hit record; the camera's shadow rays through the any-hit
variant (:func:`wide_packet_any_from`: a ray is done at its first triangle, so the answer per ray is whether it meets
one, as :func:`wsim.kernels.widebvh.wide_any`'s).

On CUDA the snippet compiles to a stub returning misses; the host selects the packet paths on the CPU only
(``LidarParams.packet``, ``ROW_PACKETS``).
"""

import re

import warp as wp

#: Rays per packet at most.
PACKET = 64
vec64f = wp.types.vector(length=PACKET, dtype=float)
vec64i = wp.types.vector(length=PACKET, dtype=wp.int32)
mat64x3 = wp.types.matrix(shape=(PACKET, 3), dtype=float)
mat64x4 = wp.types.matrix(shape=(PACKET, 4), dtype=float)

_PACKET_LANES = r"""
#if defined(__CUDA_ARCH__)
wp::mat_t<64, 4, float> res;
for (int k = 0; k < 64; ++k) { res.data[k][0] = -1.0f; res.data[k][1] = -1.0f; }
return res;
#else
using namespace wp;
typedef float vf __attribute__((ext_vector_type(8)));
typedef int vi __attribute__((ext_vector_type(8)));
// rays are tested RW at a time at the leaves, a node's 8 children at once
@LANES@
typedef float rf __attribute__((ext_vector_type(RW)));
typedef int ri __attribute__((ext_vector_type(RW)));
// RW rows of 3 floats (x y z x y z ...) as three vectors of x, y and z
auto deinterleave = [](const float* p, rf* out) {
    rf q0, q1, q2;
    __builtin_memcpy(&q0, p, sizeof(rf));
    __builtin_memcpy(&q1, p + RW, sizeof(rf));
    __builtin_memcpy(&q2, p + 2 * RW, sizeof(rf));
#if RW == 16
    const rf ax = __builtin_shufflevector(q0, q1, 0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0, 0, 0, 0, 0);
    const rf ay = __builtin_shufflevector(q0, q1, 1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 0, 0, 0, 0, 0);
    const rf az = __builtin_shufflevector(q0, q1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0, 0, 0, 0, 0, 0);
    out[0] = __builtin_shufflevector(ax, q2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17, 20, 23, 26, 29);
    out[1] = __builtin_shufflevector(ay, q2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 18, 21, 24, 27, 30);
    out[2] = __builtin_shufflevector(az, q2, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 19, 22, 25, 28, 31);
#else
    const rf ax = __builtin_shufflevector(q0, q1, 0, 3, 6, 9, 12, 15, 0, 0);
    const rf ay = __builtin_shufflevector(q0, q1, 1, 4, 7, 10, 13, 0, 0, 0);
    const rf az = __builtin_shufflevector(q0, q1, 2, 5, 8, 11, 14, 0, 0, 0);
    out[0] = __builtin_shufflevector(ax, q2, 0, 1, 2, 3, 4, 5, 10, 13);
    out[1] = __builtin_shufflevector(ay, q2, 0, 1, 2, 3, 4, 8, 11, 14);
    out[2] = __builtin_shufflevector(az, q2, 0, 1, 2, 3, 4, 9, 12, 15);
#endif
};
const float* B = boxes.data;
const int* C = child.data;
const vec3* V0 = v0.data;
const vec3* V1 = v1.data;
const vec3* V2 = v2.data;
const int* F = fid.data;
// the constants of wide_closest, and its NaN-dropping max / min (the second operand when unordered)
const float WIDEN = 1.0f + 4.76837158203125e-7f;
#define VMAX(a, b) ({ const __typeof__(a) a_ = (a), b_ = (b); a_ > b_ ? a_ : b_; })
#define VMIN(a, b) ({ const __typeof__(a) a_ = (a), b_ = (b); a_ < b_ ? a_ : b_; })
// halving trees of vector min / max (one instruction a step; __builtin_reduce_min / max keep NaN rules that compiled
// to a scalar chain of compares here); the values they reduce hold no NaN (see the bounds below)
typedef float f8 __attribute__((ext_vector_type(8)));
typedef float f4 __attribute__((ext_vector_type(4)));
typedef float f2 __attribute__((ext_vector_type(2)));
#if RW == 16
#define HTREE(x, OP) ({ const f8 h8_ = OP(__builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7), \
                                  __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15)); \
                    const f4 h4_ = OP(__builtin_shufflevector(h8_, h8_, 0, 1, 2, 3), \
                                      __builtin_shufflevector(h8_, h8_, 4, 5, 6, 7)); \
                    const f2 h2_ = OP(__builtin_shufflevector(h4_, h4_, 0, 1), __builtin_shufflevector(h4_, h4_, 2, 3)); \
                    OP(h2_[0], h2_[1]); })
#else
#define HTREE(x, OP) ({ const f4 h4_ = OP(__builtin_shufflevector(x, x, 0, 1, 2, 3), \
                                      __builtin_shufflevector(x, x, 4, 5, 6, 7)); \
                    const f2 h2_ = OP(__builtin_shufflevector(h4_, h4_, 0, 1), __builtin_shufflevector(h4_, h4_, 2, 3)); \
                    OP(h2_[0], h2_[1]); })
#endif
const float CULL = 1.0f + 9.765625e-4f;
// the result, zeroed by its constructor; every row is written below: a hit's (t, slot, u, v), else (−1, −1, 0, 0)
mat_t<64, 4, float> res;
auto miss_rows = [&](int from) {
    typedef float f4r __attribute__((ext_vector_type(4)));
    const f4r MISS = {-1.0f, -1.0f, 0.0f, 0.0f};
    for (int k = from; k < 64; ++k) __builtin_memcpy(&res.data[k][0], &MISS, sizeof(MISS));
};
const int N = n < 0 ? 0 : (n > 64 ? 64 : n);

auto bits = [](vi m) -> unsigned {
#if defined(__AVX__)
    typedef float v8sf __attribute__((__vector_size__(32)));
    v8sf mf;
    __builtin_memcpy(&mf, &m, sizeof(mf));
    return (unsigned)__builtin_ia32_movmskps256(mf);
#else
    unsigned r = 0;
    for (int l = 0; l < 8; ++l) r |= (unsigned)(m[l] & 1) << l;
    return r;
#endif
};

auto anyr = [](ri m) -> bool { return __builtin_reduce_or(m) != 0; };

// ---- the active rays (t_max > t_min) in lanes of 8, each set up exactly as wide_closest sets up its ray
const int MAXC = 64 / RW;
rf cOx[MAXC], cOy[MAXC], cOz[MAXC];       // start points o + d·t_min
rf cDx[MAXC], cDy[MAXC], cDz[MAXC];       // directions
rf cRx[MAXC], cRy[MAXC], cRz[MAXC];       // 1/d (+inf for 0)
rf cFx[MAXC], cFy[MAXC], cFz[MAXC];       // 1/d widened (far slabs)
ri cNx[MAXC], cNy[MAXC], cNz[MAXC];       // -1 where 1/d < 0: the near plane is the box's upper bound
rf cTM[MAXC], cTF[MAXC];                  // current hit distance, its culling bound
ri cHF[MAXC];                             // hit face (-1)
ri cHK[MAXC];                             // its slot in the tree's triangle order
rf cHU[MAXC], cHV[MAXC];
rf cSx[MAXC], cSy[MAXC];                  // shear of the watertight test
rf cOkx[MAXC], cOky[MAXC], cOkz[MAXC];    // the start point's (kx, ky, kz) components (uniform permutation)
ri cKX[MAXC], cKY[MAXC], cKZ[MAXC];        // (kx, ky, kz) per lane
int cUni[MAXC];                           // 1: every lane of the chunk has the same (kx, ky, kz)
int cRay[MAXC][RW];                        // the packet row of each lane, -1 for padding
ri cVal[MAXC];                            // -1 for a ray's lane, 0 for padding
// frustum bounds per axis over the active rays: start range, 1/d ranges of the rays going + and −
float slo[3], shi[3], rpl[3], rph[3], fpl[3], fph[3], rnl[3], rnh[3], fnl[3], fnh[3];
int pos[3] = {0, 0, 0}, neg[3] = {0, 0, 0}, drop[3] = {0, 0, 0};
// the active rays (t_max > t_min; wide_closest misses the others) in packet order
int act[64];
int na = 0;
{
    int inactive = 0;  // (a loop without a carried count: vectorised)
    for (int k = 0; k < N; ++k) inactive |= !(t_max.c[k] - t_min.c[k] > 0.0f);
    if (!inactive) {
        for (int k = 0; k < N; ++k) act[k] = k;
        na = N;
    } else {
        for (int k = 0; k < N; ++k) {
            const float span = t_max.c[k] - t_min.c[k];
            if (span > 0.0f) act[na++] = k;
        }
    }
}
if (na == 0) {
    miss_rows(0);
    return res;
}
const int nc = (na + RW - 1) / RW;
{
    const rf VZ = 0.0f, VPI = INFINITY, VNI = -INFINITY, VONE = 1.0f, VM1 = -1.0f;
    const ri IZ = 0, I1 = 1, I2 = 2;
    rf aSL[3] = {VPI, VPI, VPI}, aSH[3] = {VNI, VNI, VNI};
    // the reciprocals' range over the lanes that count (valid, finite): that of the rays going + or −, where all go
    // one way (a packet in one octant); both split after the loop where they do not
    rf aRL[3] = {VPI, VPI, VPI}, aRH[3] = {VNI, VNI, VNI};
    ri aPos[3] = {IZ, IZ, IZ}, aNeg[3] = {IZ, IZ, IZ}, aDrop[3] = {IZ, IZ, IZ};
    // a chunk of 8 lanes at a time, each lane set up exactly as wide_closest sets up its ray; a padding lane is a
    // copy of its chunk's first ray that can hit nothing (t_max = -1)
    for (int c = 0; c < nc; ++c) {
        rf D[3], O[3], SP, T, G[3];
        ri valid;
        (void)G;
        {
            const int c0 = c * RW;
            if (c0 + RW <= na && act[c0 + RW - 1] == c0 + RW - 1) {  // RW rays in a row, all active
                // their rows loaded as three vectors and split into components (no lane-by-lane stores: a vector
                // load of just-stored lanes waits for the stores)
                deinterleave(&dirs.data[c0][0], D);
                @FAST_ORG@
                __builtin_memcpy(&T, &t_min.c[c0], sizeof(rf));
                rf TX;
                __builtin_memcpy(&TX, &t_max.c[c0], sizeof(rf));
                SP = TX - T;
                valid = -1;
                for (int l = 0; l < RW; ++l) cRay[c][l] = c0 + l;
            } else {
                // the lanes' values gathered in plain arrays, then loaded as vectors (not inserted lane by lane)
                float gD[3][RW], gT[RW], gS[RW], gO[3][RW];
                int gV[RW];
                (void)gO;
                for (int l = 0; l < RW; ++l) {
                    const int j = c0 + l;
                    const int k = act[j < na ? j : c0];
                    gD[0][l] = dirs.data[k][0]; gD[1][l] = dirs.data[k][1]; gD[2][l] = dirs.data[k][2];
                    @GATHER_ORG(k)@
                    gT[l] = t_min.c[k];
                    gS[l] = t_max.c[k] - t_min.c[k];
                    gV[l] = j < na ? -1 : 0;
                    cRay[c][l] = j < na ? k : -1;
                }
                __builtin_memcpy(&D[0], gD[0], sizeof(rf));
                __builtin_memcpy(&D[1], gD[1], sizeof(rf));
                __builtin_memcpy(&D[2], gD[2], sizeof(rf));
                __builtin_memcpy(&T, gT, sizeof(rf));
                __builtin_memcpy(&SP, gS, sizeof(rf));
                __builtin_memcpy(&valid, gV, sizeof(ri));
                @LOAD_ORG@
            }
            @START@
        }
        rf R[3], W[3];
        for (int a = 0; a < 3; ++a) {
            R[a] = D[a] == VZ ? VPI : VONE / D[a];  // 1/d (+inf for 0)
            W[a] = R[a] * WIDEN;
        }
        cOx[c] = O[0]; cOy[c] = O[1]; cOz[c] = O[2];
        cDx[c] = D[0]; cDy[c] = D[1]; cDz[c] = D[2];
        cRx[c] = R[0]; cRy[c] = R[1]; cRz[c] = R[2];
        cFx[c] = W[0]; cFy[c] = W[1]; cFz[c] = W[2];
        cNx[c] = ~(R[0] >= VZ); cNy[c] = ~(R[1] >= VZ); cNz[c] = ~(R[2] >= VZ);
        cTM[c] = valid ? SP : VM1;
        cTF[c] = valid ? SP * CULL : VM1;
        {
            // (values the compiler cannot see: else it hoists these stores out of the loop into four calls of memset,
            // each after a vzeroupper — 0.6 % of tracing camera tiles in a profile)
            ri none = -1;
            rf zero = 0.0f;
#if defined(__x86_64__)
            __asm__("" : "+v"(none), "+v"(zero));
#endif
            cHF[c] = none; cHK[c] = none; cHU[c] = zero; cHV[c] = zero;
        }
        // the watertight test's axes: kz the largest |d| component, (kx, ky) the next two, swapped where d[kz] < 0
        const rf A0 = D[0] < VZ ? -D[0] : D[0], A1 = D[1] < VZ ? -D[1] : D[1], A2 = D[2] < VZ ? -D[2] : D[2];
        const ri kz = (A0 > A1) ? ((A0 > A2) ? IZ : I2) : ((A1 > A2) ? I1 : I2);
        ri kx = kz == I2 ? IZ : kz + 1;
        ri ky = kx == I2 ? IZ : kx + 1;
        auto pick = [](ri kk, rf x, rf y, rf z) -> rf { const ri K0 = 0, K1 = 1; return kk == K0 ? x : (kk == K1 ? y : z); };
        const rf dkz = pick(kz, D[0], D[1], D[2]);
        const ri flip = dkz < VZ;
        cUni[c] = !anyr((kz != (ri)kz[0]) | (flip != (ri)flip[0]));
        if (cUni[c]) {
            // one axis permutation for every lane (a packet within a few degrees): the components by index
            const int z0 = kz[0];
            const int x0 = flip[0] ? ky[0] : kx[0], y0 = flip[0] ? kx[0] : ky[0];
            cSx[c] = D[x0] / dkz;
            cSy[c] = D[y0] / dkz;
            cOkx[c] = O[x0]; cOky[c] = O[y0]; cOkz[c] = O[z0];
            cKX[c] = x0; cKY[c] = y0; cKZ[c] = z0;
        } else {
            const ri kx0 = kx;
            kx = flip ? ky : kx;
            ky = flip ? kx0 : ky;
            cSx[c] = pick(kx, D[0], D[1], D[2]) / dkz;
            cSy[c] = pick(ky, D[0], D[1], D[2]) / dkz;
            cOkx[c] = pick(kx, O[0], O[1], O[2]);
            cOky[c] = pick(ky, O[0], O[1], O[2]);
            cOkz[c] = pick(kz, O[0], O[1], O[2]);
            cKX[c] = kx; cKY[c] = ky; cKZ[c] = kz;  // ((kx, ky) follow from kz and the flip: not uniform)
        }
        // the frustum over the chunk's active lanes
        for (int a = 0; a < 3; ++a) {
            // (a NaN start point is passed over: VMIN / VMAX give their second operand when unordered)
            aSL[a] = valid ? VMIN(O[a], aSL[a]) : aSL[a];
            aSH[a] = valid ? VMAX(O[a], aSH[a]) : aSH[a];
            const ri fin = (R[a] - R[a] == VZ) & (W[a] - W[a] == VZ);
            const ri ok = valid & fin;
            aDrop[a] |= valid & ~fin;
            aPos[a] |= ok & (R[a] > VZ);
            aNeg[a] |= ok & ~(R[a] > VZ);
            aRL[a] = ok ? VMIN(aRL[a], R[a]) : aRL[a];
            aRH[a] = ok ? VMAX(aRH[a], R[a]) : aRH[a];
        }
        cVal[c] = valid;
    }
    // (no bound is NaN: NaN start points are passed over, the reciprocals that are not finite dropped above)
    auto hmin = [](rf x) -> float { return HTREE(x, VMIN); };
    auto hmax = [](rf x) -> float { return HTREE(x, VMAX); };
    for (int a = 0; a < 3; ++a) {
        slo[a] = hmin(aSL[a]); shi[a] = hmax(aSH[a]);
        pos[a] = anyr(aPos[a]) != 0; neg[a] = anyr(aNeg[a]) != 0; drop[a] = anyr(aDrop[a]) != 0;
        rpl[a] = rnl[a] = INFINITY; rph[a] = rnh[a] = -INFINITY;
        if (pos[a] && neg[a]) {  // rays going both ways: each way's range from the chunks' reciprocals
            rf pl = VPI, ph = VNI, nl = VPI, nh = VNI;
            for (int c = 0; c < nc; ++c) {
                const rf Ra = a == 0 ? cRx[c] : (a == 1 ? cRy[c] : cRz[c]);
                const rf Wa = Ra * WIDEN;
                const ri ok = cVal[c] & (Ra - Ra == VZ) & (Wa - Wa == VZ);
                const ri ps = ok & (Ra > VZ), ng = ok & ~(Ra > VZ);
                pl = ps ? VMIN(pl, Ra) : pl; ph = ps ? VMAX(ph, Ra) : ph;
                nl = ng ? VMIN(nl, Ra) : nl; nh = ng ? VMAX(nh, Ra) : nh;
            }
            rpl[a] = hmin(pl); rph[a] = hmax(ph); rnl[a] = hmin(nl); rnh[a] = hmax(nh);
        } else if (pos[a]) {
            rpl[a] = hmin(aRL[a]); rph[a] = hmax(aRH[a]);
        } else if (neg[a]) {
            rnl[a] = hmin(aRL[a]); rnh[a] = hmax(aRH[a]);
        }
        // the widened reciprocals' range: rounding is monotone, so the widened bound is the bound widened (a lane
        // whose widened reciprocal overflows is dropped above, and then the axis bounds nothing)
        fpl[a] = rpl[a] * WIDEN; fph[a] = rph[a] * WIDEN; fnl[a] = rnl[a] * WIDEN; fnh[a] = rnh[a] * WIDEN;
    }
}
// one start point (the same float bits) and one watertight axis permutation for every lane of the packet (a camera's
// or a lidar's rays from one origin, t_min 0): a leaf's triangles are then set up once for all chunks of rays — the
// start-relative vertex components and the plane distance's numerator are the same for every lane, the same
// operations on the same values as lane by lane
bool pOne = true;
{
    const int kx0 = cKX[0][0], ky0 = cKY[0][0], kz0 = cKZ[0][0];
    ri o0[3];
    __builtin_memcpy(&o0[0], &cOx[0], sizeof(ri));
    __builtin_memcpy(&o0[1], &cOy[0], sizeof(ri));
    __builtin_memcpy(&o0[2], &cOz[0], sizeof(ri));
    const ri ox0 = o0[0][0], oy0 = o0[1][0], oz0 = o0[2][0];
    for (int c = 0; c < nc && pOne; ++c) {
        ri ob[3];
        __builtin_memcpy(&ob[0], &cOx[c], sizeof(ri));
        __builtin_memcpy(&ob[1], &cOy[c], sizeof(ri));
        __builtin_memcpy(&ob[2], &cOz[c], sizeof(ri));
        pOne = cUni[c] && cKX[c][0] == kx0 && cKY[c][0] == ky0 && cKZ[c][0] == kz0 &&
               !anyr((ob[0] != ox0) | (ob[1] != oy0) | (ob[2] != oz0));
    }
}
// the packet's culling bound: the largest of the rays'
auto packet_far = [&]() -> float {
    rf m = cTF[0];
    for (int c = 1; c < nc; ++c) m = VMAX(m, cTF[c]);
    return HTREE(m, VMAX);
};
float tfar = packet_far();

// ---- interval test of a node's 8 child boxes against all rays: a lower bound of every ray's near distance
// (tn) and an upper bound of its far distance; a lane fails only if every ray's own test fails
const vf ZERO = 0.0f;
const rf RZERO = 0.0f;
const vf PINF = INFINITY, NINF = -INFINITY;
const vf SLX = slo[0], SLY = slo[1], SLZ = slo[2], SHX = shi[0], SHY = shi[1], SHZ = shi[2];
// (finite reciprocal bounds, so no NaN arises here)
auto axis = [&](int a, vf lo, vf hi, vf SL, vf SH, vf& nl, vf& fu) {
    if (drop[a]) { nl = NINF; fu = PINF; return; }
    nl = PINF; fu = NINF;
    const vf bl = lo - SH;  // the smallest lo − o of all rays (rounding is monotone)
    const vf bh = hi - SL;  // the largest hi − o
    if (pos[a]) {  // near = (lo − o)·r, far = (hi − o)·r·WIDEN with r > 0
        nl = VMIN(bl * rpl[a], bl * rph[a]);
        fu = VMAX(bh * fpl[a], bh * fph[a]);
    }
    if (neg[a]) {  // near = (hi − o)·r, far = (lo − o)·r·WIDEN with r < 0: largest hi − o, smallest lo − o
        nl = VMIN(nl, VMIN(bh * rnl[a], bh * rnh[a]));
        fu = VMAX(fu, VMAX(bl * fnl[a], bl * fnh[a]));
    }
};

// ---- one leaf against every chunk of rays: the box test of wide_closest, then its triangle test
auto leaf = [&](int slot, int code) -> bool {
    const float* nb = B + (size_t)(slot >> 3) * 48 + (slot & 7);
    const rf LOX = nb[0], LOY = nb[8], LOZ = nb[16], HIX = nb[24], HIY = nb[32], HIZ = nb[40];
    const int k0 = code >> 3;
    const int k1 = k0 + (code & 7) + 1;
    bool hit = false;
    // the chunks whose rays may enter the leaf's box (wide_closest's box test, lane by lane)
    ri bms[MAXC];
    int live[MAXC];
    int nl = 0;
    for (int c = 0; c < nc; ++c) {
        const rf lx = cNx[c] ? HIX : LOX, ux = cNx[c] ? LOX : HIX;
        const rf ly = cNy[c] ? HIY : LOY, uy = cNy[c] ? LOY : HIY;
        const rf lz = cNz[c] ? HIZ : LOZ, uz = cNz[c] ? LOZ : HIZ;
        const rf tn = VMAX((lx - cOx[c]) * cRx[c], VMAX((ly - cOy[c]) * cRy[c], VMAX((lz - cOz[c]) * cRz[c], RZERO)));
        const rf tf = VMIN((ux - cOx[c]) * cFx[c], VMIN((uy - cOy[c]) * cFy[c], VMIN((uz - cOz[c]) * cFz[c], cTF[c])));
        const ri bm = tn <= tf;
        if (!anyr(bm)) continue;
        bms[nl] = bm;
        live[nl++] = c;
    }
    if (nl == 0) return false;
    // the watertight test's edge functions from the sheared vertices (wide_closest's own expressions, no FMA) and
    // which rays it lets through: inside all three edges or on them (not all zero), a non-zero determinant
    auto edges = [&](rf Ax, rf Ay, rf Bx, rf By, rf Cx, rf Cy, rf& U, rf& V, rf& W) {
#pragma clang fp contract(off)
        U = Cx * By - Cy * Bx;
        V = Ax * Cy - Ay * Cx;
        W = Bx * Ay - By * Ax;
    };
    auto inside = [&](ri mask, rf U, rf V, rf W, rf& det) -> ri {
        const ri out = ((U < RZERO) | (V < RZERO) | (W < RZERO)) & ((U > RZERO) | (V > RZERO) | (W > RZERO));
        {
#pragma clang fp contract(off)
            det = U + V + W;
        }
        return mask & ~out & (det != RZERO);
    };
    // a ray's triangle test once it is through the watertight test: the plane distance from the start point
    // (numerator, denominator: wide_closest's own scalar expression lane by lane, so it rounds alike) and the
    // nearest-hit update
    auto accept = [&](int c, int k, ri through, rf num, rf U, rf V, rf det, const vec3& nrm) {
        const rf NX = nrm[0], NY = nrm[1], NZ = nrm[2];
        const rf den = NX * cDx[c] + NY * cDy[c] + NZ * cDz[c];
        const rf t = through ? num / den : RZERO;
        const ri f = F[k];
        const ri acc = through & (t >= RZERO) & ((t < cTM[c]) | ((t == cTM[c]) & (f < cHF[c])));
        if (!anyr(acc)) return;
        const rf inv = 1.0f / det;
        cTM[c] = acc ? t : cTM[c];
        cTF[c] = cTM[c] * CULL;
        cHF[c] = acc ? f : cHF[c];
        cHK[c] = acc ? (ri)k : cHK[c];
        cHU[c] = acc ? U * inv : cHU[c];
        cHV[c] = acc ? V * inv : cHV[c];
        hit = true;
    };
    if (pOne) {
        // triangle by triangle, each set up once for every chunk
        const int kx = cKX[0][0], ky = cKY[0][0], kz = cKZ[0][0];
        const float ox = cOx[0][0], oy = cOy[0][0], oz = cOz[0][0];
        const float okx = cOkx[0][0], oky = cOky[0][0], okz = cOkz[0][0];
        for (int k = k0; k < k1; ++k) {
            const vec3 pa = V0[k], pb = V1[k], pc = V2[k];
            float az, bz, cz, ax, ay, bx, by, cx, cy;
            {
#pragma clang fp contract(off)
                az = pa[kz] - okz; bz = pb[kz] - okz; cz = pc[kz] - okz;
                ax = pa[kx] - okx; ay = pa[ky] - oky;
                bx = pb[kx] - okx; by = pb[ky] - oky;
                cx = pc[kx] - okx; cy = pc[ky] - oky;
            }
            const vec3 nrm = cross(pb - pa, pc - pa);
            const float NX = nrm[0], NY = nrm[1], NZ = nrm[2];
            const float num = NX * (pa[0] - ox) + NY * (pa[1] - oy) + NZ * (pa[2] - oz);
            for (int j = 0; j < nl; ++j) {
                const int c = live[j];
                rf U, V, W;
                {
#pragma clang fp contract(off)
                    edges((rf)ax - cSx[c] * az, (rf)ay - cSy[c] * az, (rf)bx - cSx[c] * bz, (rf)by - cSy[c] * bz,
                          (rf)cx - cSx[c] * cz, (rf)cy - cSy[c] * cz, U, V, W);
                }
                rf det;
                const ri through = inside(bms[j], U, V, W, det);
                if (!anyr(through)) continue;
                accept(c, k, through, (rf)num, U, V, det, nrm);
            }
        }
        return hit;
    }
    for (int j = 0; j < nl; ++j) {
        const int c = live[j];
        const ri bm = bms[j];
        for (int k = k0; k < k1; ++k) {
            const vec3 pa = V0[k], pb = V1[k], pc = V2[k];
            rf U, V, W;
            if (cUni[c]) {
#pragma clang fp contract(off)
                const int kx = cKX[c][0], ky = cKY[c][0], kz = cKZ[c][0];
                const rf az = pa[kz] - cOkz[c], bz = pb[kz] - cOkz[c], cz = pc[kz] - cOkz[c];
                edges((pa[kx] - cOkx[c]) - cSx[c] * az, (pa[ky] - cOky[c]) - cSy[c] * az,
                      (pb[kx] - cOkx[c]) - cSx[c] * bz, (pb[ky] - cOky[c]) - cSy[c] * bz,
                      (pc[kx] - cOkx[c]) - cSx[c] * cz, (pc[ky] - cOky[c]) - cSy[c] * cz, U, V, W);
            } else {
                for (int l = 0; l < RW; ++l) {
                    const int kx = cKX[c][l], ky = cKY[c][l], kz = cKZ[c][l];
                    const float ox = cOkx[c][l], oy = cOky[c][l], oz = cOkz[c][l];
                    const float sx = cSx[c][l], sy = cSy[c][l];
                    {
#pragma clang fp contract(off)
                        const float az = pa[kz] - oz, bz = pb[kz] - oz, cz = pc[kz] - oz;
                        const float Ax = (pa[kx] - ox) - sx * az, Ay = (pa[ky] - oy) - sy * az;
                        const float Bx = (pb[kx] - ox) - sx * bz, By = (pb[ky] - oy) - sy * bz;
                        const float Cx = (pc[kx] - ox) - sx * cz, Cy = (pc[ky] - oy) - sy * cz;
                        U[l] = Cx * By - Cy * Bx;
                        V[l] = Ax * Cy - Ay * Cx;
                        W[l] = Bx * Ay - By * Ax;
                    }
                }
            }
            rf det;
            const ri through = inside(bm, U, V, W, det);
            if (!anyr(through)) continue;
            const vec3 nrm = cross(pb - pa, pc - pa);
            const rf NX = nrm[0], NY = nrm[1], NZ = nrm[2];
            accept(c, k, through, NX * ((rf)pa[0] - cOx[c]) + NY * ((rf)pa[1] - cOy[c]) + NZ * ((rf)pa[2] - cOz[c]),
                   U, V, det, nrm);
        }
    }
    return hit;
};

// a child taken later (pushed): its boxes, or its triangles' vertices, fetched meanwhile
auto fetch = [&](int c) {
    if (c >= 0) {
        const float* p = B + (size_t)c * 48;
        __builtin_prefetch(p); __builtin_prefetch(p + 16); __builtin_prefetch(p + 32);
    } else {
        const int k = (-c - 1) >> 3;
        __builtin_prefetch(&V0[k]); __builtin_prefetch(&V1[k]); __builtin_prefetch(&V2[k]);
    }
};

// ---- depth-first, nearest child first (by the packet's near bound), as wide_closest
int st_n[128];
float st_t[128];
int st_s[128];  // a leaf's slot in its parent node (node · 8 + lane): where its box is
int sp = 0;
int ref = 0, slot = 0;
while (true) {
    bool descend = false;
    if (ref >= 0) {
        const float* nb = B + (size_t)ref * 48;
        vf lx, ly, lz, ux, uy, uz;
        __builtin_memcpy(&lx, nb, sizeof(vf));
        __builtin_memcpy(&ly, nb + 8, sizeof(vf));
        __builtin_memcpy(&lz, nb + 16, sizeof(vf));
        __builtin_memcpy(&ux, nb + 24, sizeof(vf));
        __builtin_memcpy(&uy, nb + 32, sizeof(vf));
        __builtin_memcpy(&uz, nb + 40, sizeof(vf));
        vf nlx, fux, nly, fuy, nlz, fuz;
        axis(0, lx, ux, SLX, SHX, nlx, fux);
        axis(1, ly, uy, SLY, SHY, nly, fuy);
        axis(2, lz, uz, SLZ, SHZ, nlz, fuz);
        const vf tn = VMAX(nlx, VMAX(nly, VMAX(nlz, ZERO)));
        const vf tf = VMIN(fux, VMIN(fuy, VMIN(fuz, (vf)tfar)));
        // empty lanes (lo > hi) fail even where no axis bounds the rays
        unsigned mask = bits((tn <= tf) & (lx <= ux));
        if (mask) {
            const int* cc = C + (size_t)ref * 8;
            float tl[8];
            __builtin_memcpy(tl, &tn, sizeof(vf));
            const int base8 = ref * 8;
            int l0 = __builtin_ctz(mask);
            mask &= mask - 1;
            if (!mask) {
                slot = base8 + l0;
                ref = cc[l0];
                continue;
            }
            int base = sp;
            st_n[sp] = cc[l0]; st_t[sp] = tl[l0]; st_s[sp] = base8 + l0; ++sp;
            fetch(cc[l0]);
            while (mask) {
                int l = __builtin_ctz(mask);
                mask &= mask - 1;
                float t = tl[l];
                fetch(cc[l]);
                int j = sp;
                while (j > base && st_t[j - 1] < t) {
                    st_t[j] = st_t[j - 1]; st_n[j] = st_n[j - 1]; st_s[j] = st_s[j - 1]; --j;
                }
                st_t[j] = t; st_n[j] = cc[l]; st_s[j] = base8 + l; ++sp;
            }
            --sp;
            ref = st_n[sp];
            slot = st_s[sp];
            continue;
        }
    } else {
        if (leaf(slot, -ref - 1)) {
            tfar = packet_far();
        }
    }
    while (sp > 0) {
        --sp;
        if (st_t[sp] <= tfar) { ref = st_n[sp]; slot = st_s[sp]; descend = true; break; }
    }
    if (!descend) break;
}
if (na == N) {
    // every ray active, in packet order (chunk c's lane l is row c·RW + l): the rows of a chunk as whole vectors,
    // its four result vectors interleaved (a lane by lane loop of scalar stores cost 3-4 % of tracing camera tiles)
    typedef long long lr __attribute__((ext_vector_type(RW / 2)));  // RW floats as RW / 2 pairs
    const ri MISS_SLOT = (int)0xBF800000;  // the bits of −1.0f
    for (int c = 0; c < nc; ++c) {
        const ri hm = cHF[c] >= 0;
        const rf T = hm ? cTM[c] : (rf)-1.0f, U = hm ? cHU[c] : RZERO, V = hm ? cHV[c] : RZERO;
        const ri Si = hm ? cHK[c] : MISS_SLOT;
        rf S;
        __builtin_memcpy(&S, &Si, sizeof(rf));
#if RW == 16
        const rf ts0 = __builtin_shufflevector(T, S, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const rf ts1 = __builtin_shufflevector(T, S, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        const rf uv0 = __builtin_shufflevector(U, V, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const rf uv1 = __builtin_shufflevector(U, V, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        lr a0, a1, b0, b1;
        __builtin_memcpy(&a0, &ts0, sizeof(lr)); __builtin_memcpy(&a1, &ts1, sizeof(lr));
        __builtin_memcpy(&b0, &uv0, sizeof(lr)); __builtin_memcpy(&b1, &uv1, sizeof(lr));
        const lr r[4] = {__builtin_shufflevector(a0, b0, 0, 8, 1, 9, 2, 10, 3, 11),
                         __builtin_shufflevector(a0, b0, 4, 12, 5, 13, 6, 14, 7, 15),
                         __builtin_shufflevector(a1, b1, 0, 8, 1, 9, 2, 10, 3, 11),
                         __builtin_shufflevector(a1, b1, 4, 12, 5, 13, 6, 14, 7, 15)};
#else
        const rf ts0 = __builtin_shufflevector(T, S, 0, 8, 1, 9, 2, 10, 3, 11);
        const rf ts1 = __builtin_shufflevector(T, S, 4, 12, 5, 13, 6, 14, 7, 15);
        const rf uv0 = __builtin_shufflevector(U, V, 0, 8, 1, 9, 2, 10, 3, 11);
        const rf uv1 = __builtin_shufflevector(U, V, 4, 12, 5, 13, 6, 14, 7, 15);
        lr a0, a1, b0, b1;
        __builtin_memcpy(&a0, &ts0, sizeof(lr)); __builtin_memcpy(&a1, &ts1, sizeof(lr));
        __builtin_memcpy(&b0, &uv0, sizeof(lr)); __builtin_memcpy(&b1, &uv1, sizeof(lr));
        const lr r[4] = {__builtin_shufflevector(a0, b0, 0, 4, 1, 5), __builtin_shufflevector(a0, b0, 2, 6, 3, 7),
                         __builtin_shufflevector(a1, b1, 0, 4, 1, 5), __builtin_shufflevector(a1, b1, 2, 6, 3, 7)};
#endif
        const int c0 = c * RW;
        if (c0 + RW <= N) {
            for (int q = 0; q < 4; ++q) __builtin_memcpy(&res.data[c0 + q * (RW / 4)][0], &r[q], sizeof(lr));
        } else {
            __builtin_memcpy(&res.data[c0][0], r, (size_t)(N - c0) * 4 * sizeof(float));
        }
    }
    miss_rows(N);
    return res;
}
miss_rows(0);
for (int c = 0; c < nc; ++c) {
    for (int l = 0; l < RW; ++l) {
        const int k = cRay[c][l];
        if (k < 0 || cHF[c][l] < 0) continue;
        // Warp's barycentrics: p = u·p0 + v·p1 + (1 − u − v)·p2
        res.data[k][0] = cTM[c][l];
        const int tri = cHK[c][l];  // (a scalar first: a vector element is no operand for the bit cast)
        float tri_bits;
        __builtin_memcpy(&tri_bits, &tri, sizeof(float));
        res.data[k][1] = tri_bits;  // the triangle's slot (wide_slot)
        res.data[k][2] = cHU[c][l];
        res.data[k][3] = cHV[c][l];
    }
}
#undef VMAX
#undef VMIN
#undef HTREE
#undef RW
return res;
#endif
"""


#: Where each ray starts: ``org + dirs[k]·t_min[k]`` (one origin), ``orgs[k] + dirs[k]·t_min[k]`` ("from"),
#: ``orgs[k]`` ("at") or ``org`` ("shared": every ray at the very same point), computed as ``wide_closest``'s callers
#: compute it (the product rounded before the sum).
_START = {
    "one": "for (int a = 0; a < 3; ++a) {\n#pragma clang fp contract(off)\n"
           "    const rf P = D[a] * T;\n    O[a] = (rf)org[a] + P;\n}",
    "from": "for (int a = 0; a < 3; ++a) {\n#pragma clang fp contract(off)\n"
            "    const rf P = D[a] * T;\n    O[a] = G[a] + P;\n}",
    "at": "for (int a = 0; a < 3; ++a) O[a] = G[a];",
    "shared": "for (int a = 0; a < 3; ++a) O[a] = (rf)org[a];",
}


def _packet_source(lanes: str, origins: str) -> str:
    """The packet snippet with rays tested ``lanes`` ("8", or "16" where the CPU has AVX-512) at a time at the leaves,
    starting where ``origins`` says (:data:`_START`)."""
    width = ("#define RW 8" if lanes == "8" else
             "#if defined(__AVX512F__)\n#define RW 16\n#else\n#define RW 8\n#endif")
    one = origins in ("one", "shared")  # an origin for all rays, not a row each
    gather = "" if one else r"gO[0][l] = orgs.data[\1][0]; gO[1][l] = orgs.data[\1][1]; gO[2][l] = orgs.data[\1][2];"
    src = re.sub(r"@GATHER_ORG\((.*?)\)@", gather, _PACKET_LANES)
    src = src.replace("@FAST_ORG@", "" if one else "deinterleave(&orgs.data[c0][0], G);")
    src = src.replace("@LOAD_ORG@", "" if one else
                      "for (int a = 0; a < 3; ++a) __builtin_memcpy(&G[a], gO[a], sizeof(rf));")
    return src.replace("@LANES@", width).replace("@START@", _START[origins].replace("\n", "\n            "))


#: The end of :func:`wide_packet16`'s snippet where the answers go straight into brief records (``out[idx[k]]``: the
#: full records' t, face, instance, u and v, the same bits) from the packet's own lanes: 16 records of a chunk whose
#: rays lie in a row of the grid as five vector stores (``BRIEF_ROWS16``); no result rows made, copied and read back,
#: no face looked up again from its slot. Measured, one thread, alternating processes, against result rows and a
#: native loop writing the records: 1080p camera rays 12 % faster on the synthetic scene, 8 % on the street; the
#: lidar fan 2-3 %.
_BRIEF_END = r"""
{
    // one record from lane l of chunk c: a hit's (t from the group's start, face, instance, u, v), else a miss
    auto put = [&](int c, int l, int k) {
        auto& r = wp::index(out, idx.c[k]);
        const int f = cHF[c][l];
        if (f >= 0) {
            r.t = t0 + cTM[c][l];
            r.u = cHU[c][l];
            r.v = cHV[c][l];
            if (f >= baked_from) {  // a parked instance's triangle (see _wide_nearest)
                r.face = wp::index(baked_face, f - baked_from);
                r.instance = wp::index(baked_inst, f - baked_from);
            } else {
                r.face = f;
                r.instance = -1;
            }
        } else {
            r.t = 0.0f; r.face = -1; r.instance = -1; r.u = 0.0f; r.v = 0.0f;
        }
    };
    if (na < N) {  // inactive rays are misses (the active ones are written below)
        for (int k = 0; k < N; ++k) {
            auto& r = wp::index(out, idx.c[k]);
            r.t = 0.0f; r.face = -1; r.instance = -1; r.u = 0.0f; r.v = 0.0f;
        }
    }
#if RW == 16
    typedef float v64r __attribute__((ext_vector_type(64)));
    const ri IOTA = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const bool rows = na == N && out.strides[0] == 5 * (int)sizeof(float);
#endif
    for (int c = 0; c < nc; ++c) {
#if RW == 16
        if (rows && c * RW + RW <= N) {
            ri ids;
            __builtin_memcpy(&ids, &idx.c[c * RW], sizeof(ri));
            const ri hm = cHF[c] >= 0;
            if (!anyr(ids != ids[0] + IOTA) && !anyr(hm & (cHF[c] >= baked_from))) {
                // 16 records in a row, none on a parked instance: interleaved, five vector stores
                const rf T = hm ? (rf)t0 + cTM[c] : RZERO, U = hm ? cHU[c] : RZERO, V = hm ? cHV[c] : RZERO;
                const ri Fi = hm ? cHF[c] : (ri)-1, Ii = -1;
                rf F, I;
                __builtin_memcpy(&F, &Fi, sizeof(rf));
                __builtin_memcpy(&I, &Ii, sizeof(rf));
                const v64r all = __builtin_shufflevector(
                    __builtin_shufflevector(T, F, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                            19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31),
                    __builtin_shufflevector(I, U, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                            19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31),
                    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                    27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,
                    52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63);
                const v64r vv = __builtin_shufflevector(V, V, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                    14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                rf q[5];
                BRIEF_ROWS16(q, all, vv);
                char* dst = (char*)&wp::index(out, ids[0]);
                if (((unsigned long long)dst & 63ull) == 0) {
                    // five whole cache lines: streaming stores, past the caches (no line read before it is
                    // written, no BVH node or ray evicted by records nobody reads here: 1080p camera rays 4-5 %
                    // faster, one thread); the tracing kernel fences them (store_fence)
                    for (int j = 0; j < 5; ++j) __builtin_nontemporal_store(q[j], (rf*)dst + j);
                    continue;
                }
                __builtin_memcpy(dst, q, sizeof(q));
                continue;
            }
        }
#endif
        for (int l = 0; l < RW; ++l) {
            const int k = cRay[c][l];
            if (k >= 0) put(c, l, k);
        }
    }
}
#undef VMAX
#undef VMIN
#undef HTREE
#undef RW
return;
#endif
"""


def _brief_rows16() -> str:
    """C++ (CPU): ``BRIEF_ROWS16(q, all, v)`` interleaves 16 brief records (t, face, instance, u, v: 20 bytes each,
    80 floats) into ``q[0..4]`` from ``all`` (64 lanes: the 16 t, faces, instances and u in turn, as float bits) and
    ``v`` (the 16 v in its first lanes)."""
    out = ["#define BRIEF_ROWS16(q, all, v) do { \\"]
    for j in range(5):
        lanes = []
        for e in range(16):
            r, f = divmod(16 * j + e, 5)  # record r's field f
            lanes.append(64 + r if f == 4 else 16 * f + r)
        out.append(f"    q[{j}] = __builtin_shufflevector(all, v, {', '.join(map(str, lanes))}); \\")
    out.append("} while (0)")
    return "\n".join(out) + "\n"


def packet_brief_source() -> str:
    """:func:`wide_packet16`'s snippet (rays from one origin, 16 lanes where the CPU has AVX-512) for a native
    function that writes brief records (:data:`_BRIEF_END`) instead of returning result rows; it takes, after
    :func:`wide_packet16`'s arguments, ``out`` (the records), ``idx`` (ray k's record), ``t0`` (the rays' common
    start [m], added to their distances) and the parked instances' ``baked_from``, ``baked_inst``,
    ``baked_face``. Nothing on CUDA."""
    src = _packet_source("16", "one")
    cuda = src[src.index("#if defined(__CUDA_ARCH__)"):src.index("#else")]
    src = src.replace(cuda, "#if defined(__CUDA_ARCH__)\nreturn;\n")
    res = src[src.index("// the result, zeroed by its constructor"):src.index("const int N = ")]
    src = src.replace(res, "")
    src = src.replace("if (na == 0) {\n    miss_rows(0);\n    return res;\n}",
                      "if (na == 0) {\n    for (int k = 0; k < N; ++k) {\n"
                      "        auto& r = wp::index(out, idx.c[k]);\n"
                      "        r.t = 0.0f; r.face = -1; r.instance = -1; r.u = 0.0f; r.v = 0.0f;\n    }\n    return;\n}")
    end = src[src.index("if (na == N) {\n    // every ray active"):]
    src = src.replace(end, _BRIEF_END)
    return _brief_rows16() + src


#: Rays tested 8 at a time at the leaves (a 256-bit vector): a beam's 19 sub-rays fill 3 such chunks.
_PACKET = _packet_source("8", "one")
#: ... or 16 at a time where the CPU has 512-bit vectors (AVX-512): packets of 16 and 64 rays (a tile of camera pixels
#: or lidar directions, a camera row's run) fill whole vectors of 16. Measured on one thread: 1080p camera tiles 3-5 %
#: faster, a GAUSSIAN_BEAM sweep's 19 sub-rays 10 % slower in two chunks of 16 (they keep 8).
_PACKET_16 = _packet_source("16", "one")

@wp.func_native(_PACKET)
def wide_packet(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3], v1: wp.array[wp.vec3],
                v2: wp.array[wp.vec3], fid: wp.array[wp.int32], org: wp.vec3, dirs: mat64x3, t_min: vec64f,
                t_max: vec64f, n: int) -> mat64x4:
    """Rays ``k < n`` from ``org`` [m] along ``dirs[k]``, each over its own range ``t_min[k] < t < t_max[k]``
    [m], through one 8-wide BVH. Row k of the result is exactly :func:`wsim.kernels.widebvh.wide_closest` of that
    ray alone, i.e. of ``org + dirs[k]·t_min[k]`` along ``dirs[k]`` with ``max_t = t_max[k] − t_min[k]``: (t from
    that start point, slot, u, v), slot −1 for a miss. A ray with ``t_max[k] <= t_min[k]`` is inactive (a miss, at
    no cost); rows >= n are misses. CPU only: on CUDA every row is a miss."""
    ...


@wp.func_native(_PACKET_16)
def wide_packet16(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3], v1: wp.array[wp.vec3],
                  v2: wp.array[wp.vec3], fid: wp.array[wp.int32], org: wp.vec3, dirs: mat64x3, t_min: vec64f,
                  t_max: vec64f, n: int) -> mat64x4:
    """:func:`wide_packet`, the same results bit for bit, with the rays tested 16 at a time at the leaves where the
    CPU has 512-bit vectors (packets of 16 or 64 rays). CPU only: on CUDA every row is a miss."""
    ...


_PACKET_FROM = _packet_source("8", "from")


@wp.func_native(_PACKET_FROM)
def wide_packet_from(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3],
                     v1: wp.array[wp.vec3], v2: wp.array[wp.vec3], fid: wp.array[wp.int32], orgs: mat64x3,
                     dirs: mat64x3, t_min: vec64f, t_max: vec64f, n: int) -> mat64x4:
    """:func:`wide_packet` with an origin per ray (row k of ``orgs`` [m]): rays from nearby points along nearby
    directions (one lidar emitter over consecutive ticks of a moving sensor). Row k of the result is exactly
    :func:`wsim.kernels.widebvh.wide_closest` of ``orgs[k] + dirs[k]·t_min[k]`` along ``dirs[k]`` over
    ``t_max[k] − t_min[k]``. CPU only: on CUDA every row is a miss."""
    ...


#: The any-hit variant: a ray that meets a triangle is done (its culling bound drops below every box), the packet
#: once all its rays are.
_PACKET_ANY_FROM = _PACKET_FROM.replace("        cTF[c] = cTM[c] * CULL;\n",
                                        "        cTF[c] = acc ? (rf)(-1.0f) : cTF[c];\n")
assert _PACKET_ANY_FROM != _PACKET_FROM


@wp.func_native(_PACKET_ANY_FROM)
def wide_packet_any_from(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3],
                         v1: wp.array[wp.vec3], v2: wp.array[wp.vec3], fid: wp.array[wp.int32], orgs: mat64x3,
                         dirs: mat64x3, t_min: vec64f, t_max: vec64f, n: int) -> mat64x4:
    """Visibility of rays ``k < n`` from ``orgs[k]`` along ``dirs[k]`` over ``t_max[k] − t_min[k]`` from
    ``orgs[k] + dirs[k]·t_min[k]`` (a camera run's shadow rays: parallel, from nearby surface points): row k's slot
    ``[1]`` is >= 0 exactly where :func:`wsim.kernels.widebvh.wide_any` of that ray alone finds a triangle — the
    same triangle test, and every leaf box that ray's traversal would enter is entered — (t, slot, u, v) of some
    triangle it meets, not necessarily the nearest. CPU only: on CUDA every row is a miss."""
    ...


_PACKET_AT = _packet_source("8", "at").replace("int ref = 0, slot = 0;", "int ref = root, slot = 0;")
assert "int ref = root" in _PACKET_AT


@wp.func_native(_PACKET_AT)
def wide_packet_at(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3], v1: wp.array[wp.vec3],
                   v2: wp.array[wp.vec3], fid: wp.array[wp.int32], root: int, orgs: mat64x3, dirs: mat64x3,
                   t_min: vec64f, t_max: vec64f, n: int) -> mat64x4:
    """Rays ``k < n`` starting at ``orgs[k]`` exactly [m] along ``dirs[k]``, each over ``t_max[k] − t_min[k]``
    from there, through the 8-wide tree at node ``root`` of a pool of trees (an instance prototype's, in its local
    frame). Row k is exactly :func:`wsim.kernels.widebvh.wide_closest_from` of that ray alone (``org`` = ``orgs[k]``,
    ``max_t`` = ``t_max[k] − t_min[k]``): (t, slot, u, v), slot −1 for a miss. CPU only: on CUDA every row is a
    miss."""
    ...


_PACKET_SHARED_AT = _packet_source("16", "shared").replace("int ref = 0, slot = 0;", "int ref = root, slot = 0;")
assert "int ref = root" in _PACKET_SHARED_AT


@wp.func_native(_PACKET_SHARED_AT)
def wide_packet16_shared_at(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3],
                            v1: wp.array[wp.vec3], v2: wp.array[wp.vec3], fid: wp.array[wp.int32], root: int,
                            org: wp.vec3, dirs: mat64x3, t_min: vec64f, t_max: vec64f, n: int) -> mat64x4:
    """:func:`wide_packet_at` for rays that all start at ``org`` exactly (a camera tile's rays in an instance's
    frame), the same rows bit for bit, tested 16 at a time at the leaves where the CPU has 512-bit vectors. CPU
    only: on CUDA every row is a miss."""
    ...


def _shuffles16() -> str:
    """C++ (CPU) for 16 rows of three 4-byte values: ``SPLIT16(q, x, y, z)`` splits them, loaded as three vectors of
    16 (``q[0..2]``: the rows' 48 values in order), into a vector per component; ``JOIN16(x, y, z, q)`` is its
    inverse. Two shuffles a vector (the index lists made here). ``LOAD4RUNS`` loads the 16 rows from four runs of 4,
    ``RUNS4`` tells such runs."""
    def split(comp):
        g = [3 * lane + comp for lane in range(16)]
        first = [x if x < 32 else 0 for x in g]
        second = [lane if x < 32 else 16 + x - 32 for lane, x in enumerate(g)]
        return first, second

    def join(chunk):
        g = [16 * chunk + e for e in range(16)]
        first = [r // 3 + (16 if r % 3 == 1 else 0) if r % 3 < 2 else 0 for r in g]
        second = [e if r % 3 < 2 else 16 + r // 3 for e, r in enumerate(g)]
        return first, second

    lst = lambda v: ", ".join(str(x) for x in v)  # noqa: E731
    out = ["#define SPLIT16(q, x, y, z) do { \\"]
    for comp, name in enumerate("xyz"):
        a, b = split(comp)
        out.append(f"    {name} = __builtin_shufflevector(__builtin_shufflevector(q[0], q[1], {lst(a)}), q[2], {lst(b)}); \\")
    out.append("} while (0)")
    out.append("#define JOIN16(x, y, z, q) do { \\")
    for chunk in range(3):
        a, b = join(chunk)
        out.append(f"    q[{chunk}] = __builtin_shufflevector(__builtin_shufflevector(x, y, {lst(a)}), z, {lst(b)}); \\")
    out.append("} while (0)")
    # four runs of 4 rows (a lidar tile's 4 elevations at 4 azimuths): the 48 values of rows k..k+15 gathered from
    # the runs' starts p[0..3] (12 values each) into three vectors, 16 bytes at a time (CAT4 joins four vectors of 4);
    # RUNS4 tests that the 16 indices ids form such runs
    out.append("#define CAT4(a, b, c, d) __builtin_shufflevector(__builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7), "
               "__builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)")
    out.append("#define LOAD4RUNS(T, p, q) do { \\")
    out.append("    typedef T t4_ __attribute__((ext_vector_type(4))); \\")
    out.append("    t4_ a_[12]; \\")
    out.append("    for (int r_ = 0; r_ < 4; ++r_) __builtin_memcpy(&a_[3 * r_], (p)[r_], 3 * sizeof(t4_)); \\")
    out.append("    for (int j_ = 0; j_ < 3; ++j_) q[j_] = CAT4(a_[4 * j_], a_[4 * j_ + 1], a_[4 * j_ + 2], a_[4 * j_ + 3]); \\")
    out.append("} while (0)")
    out.append("#define RUNS4(ids) (!__builtin_reduce_or((ids) != __builtin_shufflevector((ids), (ids), 0, 0, 0, 0, 4, 4, 4, 4, "
               "8, 8, 8, 8, 12, 12, 12, 12) + ((i16){0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3})))")
    return "\n".join(out) + "\n"


#: The C++ macros of :func:`_shuffles16` (SPLIT16, JOIN16, CAT4, LOAD4RUNS, RUNS4) for the CPU snippets here and
#: in trace.py.
SHUFFLES16 = _shuffles16()


#: The unit directions of a group of rays, 16 at a time (as many as AVX-512 takes; 8 or 4 per instruction elsewhere):
#: each row rounds as ``wp.normalize`` rounds it (the length from ``x·x + y·y + z·z`` in that order, no fused
#: multiply-add; each component divided by it; zero where the length is not positive). 16 rays in a row of the array
#: (a camera tile's run of an image row) are loaded as three vectors and split (``SPLIT16``), others one by one.
_UNIT_DIRS = r"""
wp::mat_t<64, 3, float> r;
const int M = m < 0 ? 0 : (m > 64 ? 64 : m);
#if defined(__CUDA_ARCH__)
for (int k = 0; k < M; ++k) {
    const wp::vec3 d = wp::normalize(wp::index(directions, idx.c[k]));
    r.data[k][0] = d[0]; r.data[k][1] = d[1]; r.data[k][2] = d[2];
}
#else
typedef float v16 __attribute__((ext_vector_type(16)));
typedef int i16 __attribute__((ext_vector_type(16)));
@SHUFFLES16@
const i16 IOTA = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
for (int c = 0; c < M; c += 16) {
    v16 x, y, z;
    i16 ids;
    bool row = false, runs = false;
    if (c + 16 <= M && directions.strides[0] == (int)sizeof(wp::vec3)) {
        __builtin_memcpy(&ids, &idx.c[c], sizeof(i16));
        row = !__builtin_reduce_or(ids != ids[0] + IOTA);
        runs = !row && RUNS4(ids);
    }
    if (row || runs) {
        // 16 rays in a row (a camera tile's run of a row): three vector loads; four runs of 4 (a lidar tile's
        // elevations): 16-byte loads, joined; split into components
        v16 q[3];
        if (row) {
            __builtin_memcpy(q, &wp::index(directions, ids[0]), sizeof(q));
        } else {
            const float* p[4] = {&wp::index(directions, ids[0])[0], &wp::index(directions, ids[4])[0],
                                 &wp::index(directions, ids[8])[0], &wp::index(directions, ids[12])[0]};
            LOAD4RUNS(float, p, q);
        }
        SPLIT16(q, x, y, z);
    } else {
        float gx[16], gy[16], gz[16];
#pragma clang loop vectorize(disable)  // (not as vector gathers: slow where they are microcoded, as on AMD)
        for (int l = 0; l < 16; ++l) {
            const wp::vec3& d = wp::index(directions, idx.c[c + l < M ? c + l : c]);
            gx[l] = d[0]; gy[l] = d[1]; gz[l] = d[2];
        }
        __builtin_memcpy(&x, gx, sizeof(v16));
        __builtin_memcpy(&y, gy, sizeof(v16));
        __builtin_memcpy(&z, gz, sizeof(v16));
    }
    v16 s;
    {
#pragma clang fp contract(off)
        s = x * x + y * y + z * z;
    }
    const v16 len = __builtin_elementwise_sqrt(s);
    const v16 ZERO = 0.0f;
    const auto ok = len > ZERO;
    x = ok ? x / len : ZERO;
    y = ok ? y / len : ZERO;
    z = ok ? z / len : ZERO;
    if (c + 16 <= M) {
        v16 q[3];
        JOIN16(x, y, z, q);
        __builtin_memcpy(&r.data[c][0], q, sizeof(q));
    } else {
        float gx[16], gy[16], gz[16];
        __builtin_memcpy(gx, &x, sizeof(v16));
        __builtin_memcpy(gy, &y, sizeof(v16));
        __builtin_memcpy(gz, &z, sizeof(v16));
        for (int l = 0; l < M - c; ++l) {
            r.data[c + l][0] = gx[l]; r.data[c + l][1] = gy[l]; r.data[c + l][2] = gz[l];
        }
    }
}
#endif
return r;
"""


@wp.func_native(_UNIT_DIRS.replace("@SHUFFLES16@", SHUFFLES16))
def unit_dirs(directions: wp.array[wp.vec3], idx: vec64i, m: int) -> mat64x3:
    """Rows ``k < m``: ``wp.normalize(directions[idx[k]])``, the same bits (zero where the direction has no
    positive length); the other rows zero. Vectorised on the CPU."""
    ...



#: How a group of rays (unit directions ``dirs``) may be traced together: bit 1 when they share their origin (the
#: same float bits), lie within ``packet_cos`` of the first ray's direction and in its octant (every component's
#: product with the first's positive), and are more than one; bit 2 when all lie within ``list_cos`` of the first,
#: bit 4 within ``whole_cos``, bit 16 within ``tight_cos``; bit 8 when their times have the same bits. A NaN cosine
#: fails no test (as ``c < cos``); the cosine rounds as ``wp.dot`` rounds it. Runs of 16 rays in a row are loaded as
#: vectors.
_GROUP_KIND = r"""
const int M = m < 0 ? 0 : (m > 64 ? 64 : m);
if (M == 0) return 2 | 4 | 8 | 16;
const int s = idx.c[0];
const wp::vec3 o = wp::index(origins, s);
const float t0 = wp::index(times, s);
const float ax = dirs.data[0][0], ay = dirs.data[0][1], az = dirs.data[0][2];
#if defined(__CUDA_ARCH__)
const int ob[3] = {__float_as_int(o[0]), __float_as_int(o[1]), __float_as_int(o[2])}, tb = __float_as_int(t0);
bool shared = M > 1, narrow = true, whole = true, tight = true, same_time = true;
for (int k = 0; k < M; ++k) {
    const int i = idx.c[k];
    const float x = dirs.data[k][0], y = dirs.data[k][1], z = dirs.data[k][2];
    const float c = x * ax + y * ay + z * az;
    const wp::vec3 p = wp::index(origins, i);
    narrow = narrow && !(c < list_cos);
    whole = whole && !(c < whole_cos);
    tight = tight && !(c < tight_cos);
    shared = shared && __float_as_int(p[0]) == ob[0] && __float_as_int(p[1]) == ob[1] &&
             __float_as_int(p[2]) == ob[2] && !(c < packet_cos) && !(x * ax <= 0.0f) && !(y * ay <= 0.0f) &&
             !(z * az <= 0.0f);
    same_time = same_time && __float_as_int(wp::index(times, i)) == tb;
}
return (shared ? 1 : 0) | (narrow ? 2 : 0) | (whole ? 4 : 0) | (same_time ? 8 : 0) | (tight ? 16 : 0);
#else
int ob[3], tb;
__builtin_memcpy(ob, &o, sizeof(ob));
__builtin_memcpy(&tb, &t0, sizeof(tb));
typedef float v16 __attribute__((ext_vector_type(16)));
typedef int i16 __attribute__((ext_vector_type(16)));
i16 bad_shared = 0, bad_narrow = 0, bad_whole = 0, bad_tight = 0, bad_time = 0;
@SHUFFLES16@
const i16 IOTA = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
// the first origin's bits repeated: 16 rows of (x, y, z) as three vectors (shuffles of one vector: a loop of 48
// stores with a remainder each cost 1.5 % of tracing camera tiles)
i16 OB[3];
{
    typedef int i4g __attribute__((ext_vector_type(4)));
    const i4g o4 = {ob[0], ob[1], ob[2], 0};
    OB[0] = __builtin_shufflevector(o4, o4, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0);
    OB[1] = __builtin_shufflevector(o4, o4, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1);
    OB[2] = __builtin_shufflevector(o4, o4, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2);
}
for (int c = 0; c < M; c += 16) {
    v16 x, y, z;
    i16 bad_org, t;
    i16 ids;
    bool row = false, runs = false;
    if (c + 16 <= M && origins.strides[0] == (int)sizeof(wp::vec3) && times.strides[0] == (int)sizeof(float)) {
        __builtin_memcpy(&ids, &idx.c[c], sizeof(i16));
        row = !__builtin_reduce_or(ids != ids[0] + IOTA);
        runs = !row && RUNS4(ids);
    }
    if (row || runs) {
        // 16 rays in a row (a camera tile's run of a row) or four runs of 4 (a lidar tile's elevations): vector
        // loads; the origins' 48 values compared as laid out with the first origin's repeated
        v16 q[3];
        __builtin_memcpy(q, &dirs.data[c][0], sizeof(q));
        SPLIT16(q, x, y, z);
        i16 qo[3];
        if (row) {
            __builtin_memcpy(qo, &wp::index(origins, ids[0]), sizeof(qo));
            __builtin_memcpy(&t, &wp::index(times, ids[0]), sizeof(i16));
        } else {
            const int* po[4] = {(const int*)&wp::index(origins, ids[0]), (const int*)&wp::index(origins, ids[4]),
                                (const int*)&wp::index(origins, ids[8]), (const int*)&wp::index(origins, ids[12])};
            LOAD4RUNS(int, po, qo);
            typedef int ti4 __attribute__((ext_vector_type(4)));
            ti4 tr[4];
            for (int r = 0; r < 4; ++r) __builtin_memcpy(&tr[r], &wp::index(times, ids[4 * r]), sizeof(ti4));
            t = CAT4(tr[0], tr[1], tr[2], tr[3]);
        }
        bad_org = (qo[0] != OB[0]) | (qo[1] != OB[1]) | (qo[2] != OB[2]);
    } else {
        float gx[16], gy[16], gz[16];
        int gp[3][16], gt[16];
#pragma clang loop vectorize(disable)  // (scalar loads, not vector gathers)
        for (int l = 0; l < 16; ++l) {
            const int k = c + l < M ? c + l : c;  // (the padding repeats a ray of the group: it changes no test)
            const int i = idx.c[k];
            gx[l] = dirs.data[k][0]; gy[l] = dirs.data[k][1]; gz[l] = dirs.data[k][2];
            const int* p = (const int*)&wp::index(origins, i);
            gp[0][l] = p[0]; gp[1][l] = p[1]; gp[2][l] = p[2];
            __builtin_memcpy(&gt[l], &wp::index(times, i), sizeof(int));
        }
        __builtin_memcpy(&x, gx, sizeof(v16));
        __builtin_memcpy(&y, gy, sizeof(v16));
        __builtin_memcpy(&z, gz, sizeof(v16));
        i16 px, py, pz;
        __builtin_memcpy(&px, gp[0], sizeof(i16));
        __builtin_memcpy(&py, gp[1], sizeof(i16));
        __builtin_memcpy(&pz, gp[2], sizeof(i16));
        __builtin_memcpy(&t, gt, sizeof(i16));
        bad_org = (px != ob[0]) | (py != ob[1]) | (pz != ob[2]);
    }
    v16 cs, sx, sy, sz;
    {
#pragma clang fp contract(off)
        cs = x * ax + y * ay + z * az;
        sx = x * ax; sy = y * ay; sz = z * az;
    }
    const v16 ZERO = 0.0f;
    bad_narrow |= cs < list_cos;
    bad_whole |= cs < whole_cos;
    bad_tight |= cs < tight_cos;
    bad_shared |= bad_org | (cs < packet_cos) | (sx <= ZERO) | (sy <= ZERO) | (sz <= ZERO);
    bad_time |= t != tb;
}
const bool shared = M > 1 && !__builtin_reduce_or(bad_shared);
return (shared ? 1 : 0) | (__builtin_reduce_or(bad_narrow) ? 0 : 2) | (__builtin_reduce_or(bad_whole) ? 0 : 4) |
       (__builtin_reduce_or(bad_time) ? 0 : 8) | (__builtin_reduce_or(bad_tight) ? 0 : 16);
#endif
"""


@wp.func_native(_GROUP_KIND.replace("@SHUFFLES16@", SHUFFLES16))
def group_kind(origins: wp.array[wp.vec3], times: wp.array[float], dirs: mat64x3, idx: vec64i, m: int,
               packet_cos: float, list_cos: float, whole_cos: float, tight_cos: float) -> int:
    """How rays ``idx[k]``, ``k < m``, with unit directions ``dirs[k]`` (:func:`unit_dirs`), may be traced
    together: bit 1 one packet (one origin, the same float bits; more than one ray; within ``packet_cos`` of the
    first ray's direction and in its octant), bit 2 all within ``list_cos`` of the first, bit 4 within
    ``whole_cos``, bit 16 within ``tight_cos``, bit 8 all at the first ray's time (the same bits). Vectorised on the
    CPU."""
    ...
