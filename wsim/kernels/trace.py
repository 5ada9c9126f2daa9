"""Ray–scene traversal: a static BVH mesh plus instanced (possibly moving) prototype meshes under a top-level BVH.

Every ray carries a time [s]; instance transforms are interpolated at that time (:func:`wsim.kernels.pose.sample_keys`).
The result of a query is one :class:`Hit` record, consumed alike by lidar intensity and camera shading.
"""

import math
from typing import Any

import warp as wp

from .packet import (SHUFFLES16, group_kind, mat64x3, mat64x4, packet_brief_source, unit_dirs, vec64f, vec64i,
                     wide_packet16, wide_packet16_shared_at, wide_packet_at)
from .pose import difference_window, sample_keys
from .widebvh import wide_box_any, wide_closest, wide_closest_from, wide_closest_past, wide_slot

#: Restart offset past a hit for continuing queries: ``HIT_EPS_ABS + HIT_EPS_REL * t`` [m]. Large enough that the
#: second triangle of a shared edge (same t up to float error) is not reported again.
HIT_EPS_ABS = wp.constant(1.0e-4)
HIT_EPS_REL = wp.constant(1.0e-6)


@wp.struct
class Hit:
    """One ray–surface intersection.

    Attributes:
        t: Distance from the ray origin along the unit direction [m]; ``face < 0`` means no hit.
        point: World hit point [m].
        normal: Unit geometric normal in world space (triangle winding order, not flipped toward the ray).
        face: Triangle index within its mesh (static mesh or the instance's prototype), -1 for a miss.
        instance: Instance index, -1 for static geometry.
        part: Index into the scene's part table.
        material: Index into the scene's material table.
        material_id: Encoded SimReady MaterialId.
        object_id: Stable object id.
        semantic: Semantic class index (0 = unlabeled).
        u: Barycentric weight of the face's first vertex (Warp: p = u·p0 + v·p1 + (1 − u − v)·p2).
        v: Barycentric weight of the face's second vertex.
        time: The ray's time [s].
    """

    t: float
    point: wp.vec3
    normal: wp.vec3
    face: wp.int32
    instance: wp.int32
    part: wp.int32
    material: wp.int32
    material_id: wp.int32
    object_id: wp.int32
    semantic: wp.int32
    u: float
    v: float
    time: float


@wp.struct
class SceneGeo:
    """Device handles and tables of a scene (built by :class:`wsim.scene.geometry.SceneGeometry`)."""

    static_mesh: wp.uint64
    static_tri_part: wp.array[wp.int32]
    # the top-level BVH over the instances traced as instances: num_instances of them, inst_traced[j] the index of
    # its j-th (instances baked into the static wide BVH, below, are not among them)
    tlas: wp.uint64
    num_instances: wp.int32
    inst_traced: wp.array[wp.int32]
    traced_lo: wp.vec3  # the box of their boxes (none traced: zeros, unused)
    traced_hi: wp.vec3
    inst_lo: wp.array[wp.vec3]  # each instance's world bounds over the time window (by instance index)
    inst_hi: wp.array[wp.vec3]
    # CPU: an 8-wide tree over the traced instances' boxes (wsim.scene.widebvh.box_tree) telling the rays that meet
    # none of them
    # (use_inst_cull = 0: every ray queries the top level)
    use_inst_cull: wp.int32
    inst_cull_boxes: wp.array[float]
    inst_cull_child: wp.array[wp.int32]
    inst_mesh: wp.array[wp.uint64]
    inst_part_offset: wp.array[wp.int32]
    inst_key_start: wp.array[wp.int32]
    inst_key_count: wp.array[wp.int32]
    inst_object: wp.array[wp.int32]
    inst_semantic: wp.array[wp.int32]
    proto_tri_part: wp.array[wp.int32]
    key_time: wp.array[float]
    key_pos: wp.array[wp.vec3]
    key_rot: wp.array[wp.quat]
    key_scale: wp.array[wp.vec3]
    part_material: wp.array[wp.int32]
    part_object: wp.array[wp.int32]
    part_semantic: wp.array[wp.int32]
    material_code: wp.array[wp.int32]
    # the static mesh's 8-wide BVH (CPU only; use_wide = 0 keeps mesh_query_ray), see wsim.kernels.widebvh
    use_wide: wp.int32
    wide_boxes: wp.array[float]
    wide_child: wp.array[wp.int32]
    wide_v0: wp.array[wp.vec3]
    wide_e1: wp.array[wp.vec3]
    wide_e2: wp.array[wp.vec3]
    wide_fid: wp.array[wp.int32]
    # parked instances baked into it (world-space copies of their triangles): a face index fid >= baked_from is
    # instance baked_inst[fid - baked_from]'s face baked_face[fid - baked_from]
    baked_from: wp.int32
    baked_inst: wp.array[wp.int32]
    baked_face: wp.array[wp.int32]
    # the prototypes' 8-wide BVHs in one pool (CPU only): root wide node per instance, -1 keeps mesh_query_ray
    inst_wide_root: wp.array[wp.int32]
    proto_wide_boxes: wp.array[float]
    proto_wide_child: wp.array[wp.int32]
    proto_wide_v0: wp.array[wp.vec3]
    proto_wide_v1: wp.array[wp.vec3]
    proto_wide_v2: wp.array[wp.vec3]
    proto_wide_fid: wp.array[wp.int32]
    # angle-weighted vertex normals (SceneGeometry.ensure_vertex_normals; 1-entry placeholders until then): static mesh
    # vertices, the prototypes' vertices one after the other, and each instance's first entry among those
    static_vn: wp.array[wp.vec3]
    proto_vn: wp.array[wp.vec3]
    inst_vn_start: wp.array[wp.int32]


@wp.func
def miss() -> Hit:
    h = Hit()
    h.t = 0.0
    h.face = -1
    h.instance = -1
    h.part = -1
    h.material = -1
    h.material_id = 0
    h.object_id = 0
    h.semantic = 0
    return h


@wp.struct
class HitBrief:
    """The nearest surface of a ray alone, as a ray caster's preliminary intersection gives it: what names the
    triangle and where on it, for a :class:`Hit` to be made later, or a distance image.

    Attributes:
        t: Distance from the ray origin along the unit direction [m]; ``face < 0`` means no hit (t then 0).
        face: Triangle index within its mesh (static mesh or the instance's prototype), -1 for a miss.
        instance: Instance index, -1 for static geometry.
        u: Barycentric weight of the face's first vertex (as :class:`Hit`).
        v: Barycentric weight of the face's second vertex.
    """

    t: float
    face: wp.int32
    instance: wp.int32
    u: float
    v: float


@wp.func(inline=True)
def _put(out: wp.array[Hit], i: int, h: Hit):
    """Store ray ``i``'s record."""
    out[i] = h


@wp.func(inline=True)
def _put(out: wp.array[HitBrief], i: int, h: Hit):  # noqa: F811 - the overload for brief records
    """Store ray ``i``'s brief record (the rest of ``h`` is never computed: the tracing functions are inlined)."""
    b = HitBrief()
    b.t = h.t
    b.face = h.face
    b.instance = h.instance
    b.u = h.u
    b.v = h.v
    out[i] = b


@wp.func(inline=True)
def _put_static(out: wp.array[Hit], geo: SceneGeo, o: wp.vec3, dirs: mat64x3, time: float, idx: vec64i, m: int,
                t_min: float, t_max: float, res: mat64x4):
    """Store the records of rays ``idx[k]``, ``k < m``, from ``o`` along unit ``dirs[k]`` at ``time`` [s] whose
    nearest surface is the one their packet found in the static wide BVH (``res[k]``, from ``o + dirs[k]·t_min``):
    no instance traced as an instance is near them."""
    for k in range(m):
        _put(out, idx[k], static_hit(geo, o, wp.vec3(dirs[k, 0], dirs[k, 1], dirs[k, 2]), time, t_min, t_max,
                                     wp.vec4(res[k, 0], res[k, 1], res[k, 2], res[k, 3])))


@wp.func_native(packet_brief_source())
def wide_packet16_brief(boxes: wp.array[float], child: wp.array[wp.int32], v0: wp.array[wp.vec3],
                        v1: wp.array[wp.vec3], v2: wp.array[wp.vec3], fid: wp.array[wp.int32], org: wp.vec3,
                        dirs: mat64x3, t_min: vec64f, t_max: vec64f, n: int, out: wp.array[HitBrief], idx: vec64i,
                        t0: float, baked_from: int, baked_inst: wp.array[wp.int32], baked_face: wp.array[wp.int32]):
    """:func:`wsim.kernels.packet.wide_packet16`'s traversal with each ray's brief record written at once
    (``out[idx[k]]``, the rays starting ``t0`` [m] along their directions): the brief records of
    :func:`_put_static`'s full ones, the same bits. CPU only (nothing on CUDA)."""
    ...


@wp.func(inline=True)
def _packet_static(out: wp.array[Hit], geo: SceneGeo, o: wp.vec3, dirs: mat64x3, time: float, idx: vec64i, m: int,
                   t_min: float, t_max: float, lo: vec64f, hi: vec64f):
    """The records of rays ``idx[k]``, ``k < m``, from ``o`` along unit ``dirs[k]`` at ``time`` [s] over ``lo[k]``
    to ``hi[k]`` [m] (the group's ``t_min`` to ``t_max``) with no instance near them: one packet through the static
    wide BVH (:func:`_put_static`)."""
    res = wide_packet16(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid, o,
                        dirs, lo, hi, m)
    _put_static(out, geo, o, dirs, time, idx, m, t_min, t_max, res)


@wp.func(inline=True)
def _packet_static(out: wp.array[HitBrief], geo: SceneGeo, o: wp.vec3, dirs: mat64x3,  # noqa: F811 - brief records
                   time: float, idx: vec64i, m: int, t_min: float, t_max: float, lo: vec64f, hi: vec64f):
    """The brief records of :func:`_packet_static`'s rays, written by the packet itself
    (:func:`wide_packet16_brief`, the same bits)."""
    wide_packet16_brief(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid, o, dirs,
                        lo, hi, m, out, idx, t_min, geo.baked_from, geo.baked_inst, geo.baked_face)


@wp.struct
class Nearest:
    """The nearest surface found so far along a ray: distance from the ray's origin [m], face (−1: none), instance
    (−1: static), barycentrics and the (unnormalised) world normal."""

    t: float
    face: wp.int32
    inst: wp.int32
    u: float
    v: float
    n: wp.vec3


@wp.func(inline=True)
def _try_instance(geo: SceneGeo, idx: int, origin: wp.vec3, direction: wp.vec3, t_min: float, time: float,
                  b: Nearest) -> Nearest:
    """``b``, or instance ``idx``'s surface where it is nearer."""
    start = origin + direction * t_min
    xf = sample_keys(
        geo.key_time,
        geo.key_pos,
        geo.key_rot,
        geo.key_scale,
        geo.inst_key_start[idx],
        geo.inst_key_count[idx],
        time,
    )
    inv = wp.quat_inverse(xf.rot)
    lo = wp.cw_div(wp.quat_rotate(inv, start - xf.pos), xf.scale)
    ld = wp.cw_div(wp.quat_rotate(inv, direction), xf.scale)
    root = geo.inst_wide_root[idx]
    if root >= 0:
        w = wide_closest_from(geo.proto_wide_boxes, geo.proto_wide_child, geo.proto_wide_v0,
                              geo.proto_wide_v1, geo.proto_wide_v2, geo.proto_wide_fid, root, lo, ld,
                              b.t - t_min)
        if w[1] >= 0.0:
            k = wide_slot(w[1])
            b.t = t_min + w[0]
            b.face = geo.proto_wide_fid[k]
            b.inst = idx
            b.u = w[2]
            b.v = w[3]
            a = geo.proto_wide_v0[k]  # the face's vertices as the prototype mesh has them
            ln = wp.normalize(wp.cross(geo.proto_wide_v1[k] - a, geo.proto_wide_v2[k] - a))
            b.n = wp.quat_rotate(xf.rot, wp.cw_div(ln, xf.scale))
    else:
        q = wp.mesh_query_ray(geo.inst_mesh[idx], lo, ld, b.t - t_min)
        if q.result:
            b.t = t_min + q.t
            b.face = q.face
            b.inst = idx
            b.u = q.u
            b.v = q.v
            # normals transform with the inverse transpose of R·S, i.e. R·S⁻¹
            b.n = wp.quat_rotate(xf.rot, wp.cw_div(q.normal, xf.scale))
    return b


@wp.func(inline=True)
def _nearest(static_t: float, static_face: int, su: float, sv: float, sn: wp.vec3) -> Nearest:
    b = Nearest()
    b.t = static_t
    b.face = static_face
    b.inst = -1
    b.u = su
    b.v = sv
    b.n = sn
    return b


@wp.func(inline=True)
def _with_instances(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_min: float, time: float,
                    b: Nearest) -> Hit:
    """The closest of the static surface found ``b`` (``b.face`` < 0: none, ``b.t`` then the range's end) and the
    instances' surfaces nearer than it (through the top-level BVH), as a Hit."""
    return _hit_of(geo, origin, direction, time, _instances_nearer(geo, origin, direction, t_min, time, b))


@wp.func(inline=True)
def _instances_nearer(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_min: float, time: float,
                      b: Nearest) -> Nearest:
    """``b``, or the nearest instance surface strictly nearer than ``b.t`` [m] (the first in the top-level BVH's
    order among equals)."""
    if instances_may_meet(geo, origin, direction, b.t):
        bq = wp.bvh_query_ray(geo.tlas, origin, direction)
        idx = int(0)
        while wp.bvh_query_next(bq, idx, b.t):
            b = _try_instance(geo, geo.inst_traced[idx], origin, direction, t_min, time, b)
    return b


@wp.func(inline=True)
def instances_may_meet(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_max: float) -> bool:
    """False only when the top-level query of ``origin + t·direction``, t < ``t_max`` [m], would find no instance:
    the 8-wide tree over the same boxes (:func:`wsim.kernels.widebvh.wide_box_any`, conservative) says so."""
    if geo.num_instances == 0:
        return False
    if geo.use_inst_cull == 0:
        return True
    return wide_box_any(geo.inst_cull_boxes, geo.inst_cull_child, geo.inst_lo, geo.inst_lo, geo.inst_lo,
                        geo.inst_cull_child, origin, direction, t_max)[1] >= 0.0


@wp.func(inline=True)
def _wide_nearest(geo: SceneGeo, t_min: float, t_max: float, w: wp.vec4) -> Nearest:
    """The static surface the wide BVH found, ``w`` = (t from ``origin + direction·t_min`` [m], slot, u, v) as
    :func:`wsim.kernels.widebvh.wide_closest` gives it (slot < 0: none, the range's end ``t_max`` then)."""
    b = _nearest(t_max, -1, 0.0, 0.0, wp.vec3(0.0, 0.0, 1.0))
    if w[1] >= 0.0:
        k = wide_slot(w[1])
        b = _nearest(t_min + w[0], geo.wide_fid[k], w[2], w[3], _static_normal(geo, k))
        if b.face >= geo.baked_from:  # a parked instance's triangle
            j = b.face - geo.baked_from
            b.inst = geo.baked_inst[j]
            b.face = geo.baked_face[j]
    return b


@wp.func(inline=True)
def _hit_of(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, time: float, b: Nearest) -> Hit:
    if b.face < 0:
        h = miss()
        h.time = time
        return h
    return hit_record(geo, origin, direction, time, b.t, b.face, b.inst, b.u, b.v, wp.normalize(b.n))


@wp.func(inline=True)
def hit_record(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, time: float, best_t: float, best_face: int,
               best_inst: int, bu: float, bv: float, normal: wp.vec3) -> Hit:
    """The Hit record of a surface found along ``origin + t·direction`` at ``time`` [s]: distance ``best_t`` [m],
    face, instance (−1: static), barycentrics and unit world ``normal``, as :func:`closest_hit` returns it (the
    same bits, given the fields of a Hit it returned)."""
    h = Hit()
    h.t = best_t
    h.point = origin + direction * best_t
    h.normal = normal
    h.face = best_face
    h.instance = best_inst
    h.u = bu
    h.v = bv
    h.time = time
    if best_inst < 0:
        part = geo.static_tri_part[best_face]
        h.part = part
        h.object_id = geo.part_object[part]
        h.semantic = geo.part_semantic[part]
    else:
        part = geo.proto_tri_part[geo.inst_part_offset[best_inst] + best_face]
        h.part = part
        h.object_id = geo.inst_object[best_inst]
        sem = geo.inst_semantic[best_inst]
        if sem <= 0:
            sem = geo.part_semantic[part]
        h.semantic = sem
    h.material = geo.part_material[h.part]
    h.material_id = geo.material_code[h.material]
    return h


#: Instances a beam's sub-rays are tested against one by one at most (more: each sub-ray queries the top level).
MAX_LISTED = 32
vec_listed = wp.types.vector(length=MAX_LISTED, dtype=wp.int32)


@wp.struct
class Listed:
    """The instances whose bounds a narrow cone of rays from one origin may meet (:func:`cone_instances`)."""

    n: wp.int32  # −1: not listed (too many instances): query the top-level BVH per ray
    idx: vec_listed


@wp.func(inline=True)
def cone_instances(geo: SceneGeo, origin: wp.vec3, axis: wp.vec3, tan_cone: float) -> Listed:
    """The instances (in index order) whose top-level box a ray from ``origin`` within the cone of half-angle
    atan(``tan_cone``) around unit ``axis`` may meet — conservatively, through the box's bounding sphere: the ray's
    point at distance s lies within s·tan_cone of the axis, and a point of the sphere within |c − o| + R of the
    origin."""
    out = Listed()
    out.n = 0
    if geo.num_instances > MAX_LISTED:
        out.n = -1
        return out
    spread = tan_cone * 1.01 + 1.0e-5
    rcp = wp.vec3(1.0 / axis[0], 1.0 / axis[1], 1.0 / axis[2])
    for j in range(geo.num_instances):
        i = geo.inst_traced[j]
        if cone_meets_box(origin, axis, rcp, spread, geo.inst_lo[i], geo.inst_hi[i]):
            out.idx[out.n] = i
            out.n += 1
    return out


@wp.func(inline=True)
def cone_meets_box(origin: wp.vec3, axis: wp.vec3, rcp: wp.vec3, spread: float, lo: wp.vec3, hi: wp.vec3) -> bool:
    """False only where no ray from ``origin`` within the cone around unit ``axis`` (reciprocal ``rcp``) whose
    half-angle's tangent is below ``spread`` meets the box [``lo``, ``hi``] (:func:`cone_instances`' test)."""
    c = (lo + hi) * 0.5
    r = wp.length(hi - lo) * 0.5
    v = c - origin
    dist = wp.length(v)
    along = wp.dot(v, axis)
    slack = r * 1.0001 + 1.0e-4 * (1.0 + dist)
    meets = bool(False)
    if along >= -slack:
        reach = slack + (dist + r) * spread
        if wp.length(v - axis * along) <= reach:
            # and the axis meets the box grown by that reach: a ray of the cone enters the box at a distance
            # s <= dist + r, where the axis lies within s·tan_cone of it
            e = reach - r  # (the rounding slack stays)
            grow = wp.vec3(e, e, e)
            meets = axis_meets_box(origin, rcp, lo - grow, hi + grow)
    return meets


_CONE_OF = r"""
#if defined(__CUDA_ARCH__)
float ax = 0.0f, ay = 0.0f, az = 0.0f;
for (int j = 0; j < n; ++j) {
    if (ok.c[j] != 0.0f) { ax += dirs.data[j][0]; ay += dirs.data[j][1]; az += dirs.data[j][2]; }
}
const float len = sqrtf(ax * ax + ay * ay + az * az);
if (!(len > 0.0f)) return wp::vec4(0.0f, 0.0f, 0.0f, -2.0f);
ax /= len; ay /= len; az /= len;
float cmin = 1.0f;
for (int j = 0; j < n; ++j) {
    const float c = ax * dirs.data[j][0] + ay * dirs.data[j][1] + az * dirs.data[j][2];
    if (ok.c[j] != 0.0f) cmin = cmin < c ? cmin : c;
}
return wp::vec4(ax, ay, az, cmin);
#else
typedef float v16 __attribute__((ext_vector_type(16)));
typedef int i16 __attribute__((ext_vector_type(16)));
typedef float v8 __attribute__((ext_vector_type(8)));
typedef float v4 __attribute__((ext_vector_type(4)));
@SHUFFLES16@
const int N = n < 0 ? 0 : (n > 64 ? 64 : n);
const int nc = (N + 15) / 16;
const i16 IOTA = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
const v16 ZERO = 0.0f;
auto hsum = [](v16 v) -> float {
    const v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
};
v16 X[4], Y[4], Z[4];
i16 MK[4];
v16 sx = ZERO, sy = ZERO, sz = ZERO;
for (int c = 0; c < nc; ++c) {
    v16 q[3];
    __builtin_memcpy(q, &dirs.data[16 * c][0], sizeof(q));
    SPLIT16(q, X[c], Y[c], Z[c]);
    v16 okv;
    __builtin_memcpy(&okv, &ok.c[16 * c], sizeof(v16));
    MK[c] = (okv != ZERO) & ((16 * c + IOTA) < N);
    sx += MK[c] ? X[c] : ZERO;
    sy += MK[c] ? Y[c] : ZERO;
    sz += MK[c] ? Z[c] : ZERO;
}
float ax = hsum(sx), ay = hsum(sy), az = hsum(sz);
float len;
{
#pragma clang fp contract(off)
    len = __builtin_sqrtf(ax * ax + ay * ay + az * az);
}
if (!(len > 0.0f)) return wp::vec4(0.0f, 0.0f, 0.0f, -2.0f);
ax /= len; ay /= len; az /= len;
v16 cm = 1.0f;
i16 nan = 0;
for (int c = 0; c < nc; ++c) {
    v16 d;
    {
#pragma clang fp contract(off)
        d = X[c] * ax + Y[c] * ay + Z[c] * az;
    }
    nan |= MK[c] & (d != d);
    cm = MK[c] ? (cm < d ? cm : d) : cm;
}
float cmin = 1.0f;
for (int l = 0; l < 16; ++l) cmin = cmin < cm[l] ? cmin : cm[l];
return wp::vec4(ax, ay, az, __builtin_reduce_or(nan) ? __builtin_nanf("") : cmin);
#endif
"""


@wp.func_native(_CONE_OF.replace("@SHUFFLES16@", SHUFFLES16))
def cone_of(dirs: mat64x3, n: int, ok: vec64f) -> wp.vec4:
    """A cone around the mean direction of unit ``dirs[k]``, ``k < n`` with ``ok[k]`` != 0, that holds them:
    (its unit axis, the least cosine of a ray to it); cosine −2 where there is no such ray (or the directions sum to
    zero), NaN where a cosine is NaN. Vectorised on the CPU."""
    ...


def _cone_of_all(src: str) -> str:
    """:data:`_CONE_OF` with every ray ``k < n`` taken (no mask to read)."""
    for a, b in (("    v16 okv;\n    __builtin_memcpy(&okv, &ok.c[16 * c], sizeof(v16));\n"
                  "    MK[c] = (okv != ZERO) & ((16 * c + IOTA) < N);", "    MK[c] = (16 * c + IOTA) < N;"),
                 ("if (ok.c[j] != 0.0f) {", "{"), ("if (ok.c[j] != 0.0f) cmin", "cmin")):
        assert src.count(a) >= 1, a
        src = src.replace(a, b)
    return src


@wp.func_native(_cone_of_all(_CONE_OF.replace("@SHUFFLES16@", SHUFFLES16)))
def cone_of_all(dirs: mat64x3, n: int) -> wp.vec4:
    """:func:`cone_of` of every ray ``k < n`` (a tile's: no mask to make and read)."""
    ...


@wp.func(inline=True)
def cone_listed(geo: SceneGeo, origin: wp.vec3, cone: wp.vec4) -> Listed:
    """:func:`cone_instances` of a cone from :func:`cone_of`: at most 60° (a wider one, or no ray: ``n`` = −1, not
    listed)."""
    listed = Listed()
    listed.n = -1
    cmin = cone[3]
    if cmin > 0.5:  # a cone of at most 60 degrees
        listed = cone_instances(geo, origin, wp.vec3(cone[0], cone[1], cone[2]), wp.sqrt(1.0 - cmin * cmin) / cmin)
    return listed


@wp.func(inline=True)
def packet_instances(geo: SceneGeo, origin: wp.vec3, dirs: mat64x3, n: int, ok: vec64f) -> Listed:
    """:func:`cone_instances` for the rays ``k < n`` with ``ok[k]`` != 0 from ``origin`` along unit ``dirs[k]``: a
    cone around their mean direction that holds them all (:func:`cone_of`), of at most 60° (a wider one, or no ray:
    ``n`` = −1, not listed)."""
    return cone_listed(geo, origin, cone_of(dirs, n, ok))


@wp.func(inline=True)
def axis_meets_box(origin: wp.vec3, rcp: wp.vec3, lo: wp.vec3, hi: wp.vec3) -> bool:
    """False only where the ray from ``origin`` with reciprocal direction ``rcp`` surely misses the box (slabs;
    an undefined slab, 0·∞, rejects nothing)."""
    near = float(-1.0e30)
    far = float(1.0e30)
    for a in range(3):
        t1 = (lo[a] - origin[a]) * rcp[a]
        t2 = (hi[a] - origin[a]) * rcp[a]
        if t1 == t1 and t2 == t2:
            near = wp.max(near, wp.min(t1, t2))
            far = wp.min(far, wp.max(t1, t2))
    return not (far < 0.0 or near > far)


@wp.func(inline=True)
def ray_box_entry(origin: wp.vec3, rcp: wp.vec3, lo: wp.vec3, hi: wp.vec3, max_dist: float) -> int:
    """1 where the ray meets the box before ``max_dist``: the very slab test (and rounding) of the top-level BVH
    query, ``rcp`` = 1/direction per component."""
    l1 = (lo[0] - origin[0]) * rcp[0]
    l2 = (hi[0] - origin[0]) * rcp[0]
    lmin = wp.min(l1, l2)
    lmax = wp.max(l1, l2)
    l1 = (lo[1] - origin[1]) * rcp[1]
    l2 = (hi[1] - origin[1]) * rcp[1]
    lmin = wp.max(wp.min(l1, l2), lmin)
    lmax = wp.min(wp.max(l1, l2), lmax)
    l1 = (lo[2] - origin[2]) * rcp[2]
    l2 = (hi[2] - origin[2]) * rcp[2]
    lmin = wp.max(wp.min(l1, l2), lmin)
    lmax = wp.min(wp.max(l1, l2), lmax)
    hit = int(0)
    if lmax >= 0.0 and lmax >= lmin and not (lmin >= max_dist):
        hit = 1
    return hit


_BOX_ENTRIES = r"""
wp::vec_t<64, float> out;
const int N = n < 0 ? 0 : (n > 64 ? 64 : n);
#if defined(__CUDA_ARCH__)
for (int k = 0; k < N; ++k) {
    if (active.c[k] == 0) continue;
    const wp::vec3 rcp(1.0f / dirs.data[k][0], 1.0f / dirs.data[k][1], 1.0f / dirs.data[k][2]);
    float lmin = 0.0f, lmax = 0.0f;
    for (int a = 0; a < 3; ++a) {
        const float l1 = (lo[a] - origin[a]) * rcp[a], l2 = (hi[a] - origin[a]) * rcp[a];
        const float mn = wp::min(l1, l2), mx = wp::max(l1, l2);
        lmin = a == 0 ? mn : wp::max(mn, lmin);
        lmax = a == 0 ? mx : wp::min(mx, lmax);
    }
    if (lmax >= 0.0f && lmax >= lmin && !(lmin >= bt.c[k])) out.c[k] = bt.c[k] - t_min.c[k];
}
#else
typedef float v16 __attribute__((ext_vector_type(16)));
typedef int i16 __attribute__((ext_vector_type(16)));
@SHUFFLES16@
// Warp's float min / max (C's fmin / fmax: a NaN operand is dropped), lane by lane
#define FMINV(a, b) ({ const v16 a_ = (a), b_ = (b); (a_ <= b_) ? a_ : ((b_ == b_) ? b_ : a_); })
#define FMAXV(a, b) ({ const v16 a_ = (a), b_ = (b); (a_ >= b_) ? a_ : ((b_ == b_) ? b_ : a_); })
const i16 IOTA = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
const v16 ZERO = 0.0f, ONE = 1.0f;
const float nx = lo[0] - origin[0], ny = lo[1] - origin[1], nz = lo[2] - origin[2];
const float fx = hi[0] - origin[0], fy = hi[1] - origin[1], fz = hi[2] - origin[2];
for (int c = 0; c * 16 < N; ++c) {
    v16 q[3], x, y, z, b, t0;
    __builtin_memcpy(q, &dirs.data[16 * c][0], sizeof(q));
    SPLIT16(q, x, y, z);
    __builtin_memcpy(&b, &bt.c[16 * c], sizeof(v16));
    __builtin_memcpy(&t0, &t_min.c[16 * c], sizeof(v16));
    i16 act;
    __builtin_memcpy(&act, &active.c[16 * c], sizeof(i16));
    const v16 rx = ONE / x, ry = ONE / y, rz = ONE / z;
    v16 l1 = nx * rx, l2 = fx * rx;
    v16 lmin = FMINV(l1, l2), lmax = FMAXV(l1, l2);
    l1 = ny * ry; l2 = fy * ry;
    lmin = FMAXV(FMINV(l1, l2), lmin);
    lmax = FMINV(FMAXV(l1, l2), lmax);
    l1 = nz * rz; l2 = fz * rz;
    lmin = FMAXV(FMINV(l1, l2), lmin);
    lmax = FMINV(FMAXV(l1, l2), lmax);
    const i16 hit = (lmax >= ZERO) & (lmax >= lmin) & ~(lmin >= b) & (act != 0) & ((16 * c + IOTA) < N);
    const v16 r = hit ? b - t0 : ZERO;
    __builtin_memcpy(&out.c[16 * c], &r, sizeof(v16));
}
#undef FMINV
#undef FMAXV
#endif
return out;
"""


@wp.func_native(_BOX_ENTRIES.replace("@SHUFFLES16@", SHUFFLES16))
def box_entries(origin: wp.vec3, dirs: mat64x3, n: int, active: vec64i, lo: wp.vec3, hi: wp.vec3, bt: vec64f,
                t_min: vec64f) -> vec64f:
    """Per ray ``k < n`` from ``origin`` along unit ``dirs[k]`` with ``active[k]`` != 0: ``bt[k] − t_min[k]`` where
    :func:`ray_box_entry` (its very arithmetic, 1/direction included) says the ray meets the box ``lo``..``hi``
    before ``bt[k]`` [m], else 0. Vectorised on the CPU."""
    ...


@wp.func_native(r"""
const int N = n < 0 ? 0 : (n > 64 ? 64 : n);
int any = 0;  // (no early exit: vectorised)
for (int k = 0; k < 64; ++k) any |= (k < N) & (v.c[k] > 0.0f);
return any;
""")
def any_positive(v: vec64f, n: int) -> int:
    """1 where some ``v[k]`` > 0, ``k < n``, else 0."""
    ...


@wp.func_native(r"""
const int N = n < 0 ? 0 : (n > 64 ? 64 : n);
int first = -1;
for (int k = 0; k < N; ++k) {
    if (!(hi.c[k] > 0.0f)) continue;
    if (first < 0) { first = k; continue; }
#if defined(__CUDA_ARCH__)
    for (int c = 0; c < 3; ++c)
        if (__float_as_int(rows.data[k][c]) != __float_as_int(rows.data[first][c])) return -1;
#else
    if (__builtin_memcmp(&rows.data[k][0], &rows.data[first][0], 3 * sizeof(float)) != 0) return -1;
#endif
}
return first;
""")
def shared_row(rows: mat64x3, hi: vec64f, n: int) -> int:
    """The first row ``k < n`` with ``hi[k]`` > 0 where every such row holds the very same bits, else −1 (none, or
    rows that differ)."""
    ...


@wp.func(inline=True)
def closest_hit_listed(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_max: float, time: float,
                       w: wp.vec4, listed: Listed) -> Hit:
    """:func:`closest_hit_given` from ``t_min`` = 0 with the instances to test listed by :func:`cone_instances`
    for a cone that holds ``direction`` (``listed.n`` = −1: through the top-level BVH)."""
    if listed.n < 0:
        return closest_hit_given(geo, origin, direction, 0.0, t_max, time, w)
    b = _wide_nearest(geo, 0.0, t_max, w)
    rcp = wp.vec3(1.0 / direction[0], 1.0 / direction[1], 1.0 / direction[2])
    for j in range(listed.n):
        idx = listed.idx[j]
        if ray_box_entry(origin, rcp, geo.inst_lo[idx], geo.inst_hi[idx], b.t) != 0:
            b = _try_instance(geo, idx, origin, direction, 0.0, time, b)
    return _hit_of(geo, origin, direction, time, b)


@wp.func(inline=True)
def listed_packet(geo: SceneGeo, origin: wp.vec3, dirs: mat64x3, n: int, t_min: vec64f, active: vec64i,
                  t_max: float, time: float, res: mat64x4, listed: Listed):
    """:func:`closest_hit_listed` for rays ``k < n`` from ``origin`` along unit ``dirs[k]`` (a beam's sub-rays, in
    the cone ``listed`` was made for; ``listed.n`` >= 0), ``res[k]`` their static answers (a packet traversal's):
    each listed instance is traversed once, in the same order, by the rays that enter its box, as one packet through
    its prototype's 8-wide tree in its local frame (:func:`wsim.kernels.packet.wide_packet_at`, each ray's own
    result), with the very arithmetic of :func:`_try_instance`. Per ray the nearest surface: distance [m], face,
    instance (−1: static; face −1: none), barycentrics u, v and the unnormalised world normal's components — for
    :func:`nearest_hit`, the same bits as :func:`closest_hit_listed` ray by ray. Rays with ``active[k]`` = 0 are
    left out (misses); ``t_min[k]`` [m]: where ray k starts (0, or just past a transmissive surface: then its result
    is :func:`closest_hit_given`'s from there, ``res[k]`` the static answer from there)."""
    bt = vec64f()
    bf = vec64i()
    bi = vec64i()
    bu = vec64f()
    bv = vec64f()
    nx = vec64f()
    ny = vec64f()
    nz = vec64f()
    for k in range(n):
        b = _wide_nearest(geo, t_min[k], t_max, wp.vec4(res[k, 0], res[k, 1], res[k, 2], res[k, 3]))
        if active[k] == 0:
            b = _nearest(0.0, -1, 0.0, 0.0, wp.vec3(0.0, 0.0, 1.0))
        bt[k] = b.t
        bf[k] = b.face
        bi[k] = b.inst
        bu[k] = b.u
        bv[k] = b.v
        nx[k] = b.n[0]
        ny[k] = b.n[1]
        nz[k] = b.n[2]
    return listed_onto(geo, origin, dirs, n, t_min, active, time, listed, bt, bf, bi, bu, bv, nx, ny, nz)


@wp.func(inline=True)
def listed_onto(geo: SceneGeo, origin: wp.vec3, dirs: mat64x3, n: int, t_min: vec64f, active: vec64i, time: float,
                listed: Listed, bt: vec64f, bf: vec64i, bi: vec64i, bu: vec64f, bv: vec64f, nx: vec64f, ny: vec64f,
                nz: vec64f):
    """:func:`listed_packet`'s instances over the nearest surfaces found so far (``bt`` [m], ``bf`` face −1: none,
    the range's end then, ``bi``, ``bu``, ``bv``, ``nx``, ``ny``, ``nz`` as it gives them): each listed instance
    traversed once as a packet by the rays that enter its box before their ``bt``; the nearest surfaces then."""
    orgs = mat64x3()
    lds = mat64x3()
    lo = vec64f()
    for j in range(listed.n):
        idx = listed.idx[j]
        hi = box_entries(origin, dirs, n, active, geo.inst_lo[idx], geo.inst_hi[idx], bt, t_min)
        if any_positive(hi, n) == 0:  # (no ray enters the box: the instance can change no ray's answer)
            continue
        xf = sample_keys(geo.key_time, geo.key_pos, geo.key_rot, geo.key_scale, geo.inst_key_start[idx],
                         geo.inst_key_count[idx], time)
        inv = wp.quat_inverse(xf.rot)
        root = geo.inst_wide_root[idx]
        for k in range(n):
            if hi[k] > 0.0:
                d = wp.vec3(dirs[k, 0], dirs[k, 1], dirs[k, 2])
                lo_k = wp.cw_div(wp.quat_rotate(inv, (origin + d * t_min[k]) - xf.pos), xf.scale)
                ld_k = wp.cw_div(wp.quat_rotate(inv, d), xf.scale)
                for c in range(3):
                    orgs[k, c] = lo_k[c]
                    lds[k, c] = ld_k[c]
        if root >= 0:
            first = int(-1)
            if n > 32:  # (a beam's 19 sub-rays: 8 a time, as wide_packet_at tests them)
                first = shared_row(orgs, hi, n)
            if first >= 0:  # every ray from the same point (from 0, at one time): one origin, 16 rays a time
                w = wide_packet16_shared_at(geo.proto_wide_boxes, geo.proto_wide_child, geo.proto_wide_v0,
                                            geo.proto_wide_v1, geo.proto_wide_v2, geo.proto_wide_fid, root,
                                            wp.vec3(orgs[first, 0], orgs[first, 1], orgs[first, 2]), lds, lo, hi, n)
            else:
                w = wide_packet_at(geo.proto_wide_boxes, geo.proto_wide_child, geo.proto_wide_v0, geo.proto_wide_v1,
                                   geo.proto_wide_v2, geo.proto_wide_fid, root, orgs, lds, lo, hi, n)
            for k in range(n):
                if hi[k] > 0.0 and w[k, 1] >= 0.0:
                    s = wide_slot(w[k, 1])
                    bt[k] = t_min[k] + w[k, 0]
                    bf[k] = geo.proto_wide_fid[s]
                    bi[k] = idx
                    bu[k] = w[k, 2]
                    bv[k] = w[k, 3]
                    p0 = geo.proto_wide_v0[s]
                    ln = wp.normalize(wp.cross(geo.proto_wide_v1[s] - p0, geo.proto_wide_v2[s] - p0))
                    nw = wp.quat_rotate(xf.rot, wp.cw_div(ln, xf.scale))
                    nx[k] = nw[0]
                    ny[k] = nw[1]
                    nz[k] = nw[2]
        else:
            for k in range(n):
                if hi[k] > 0.0:
                    q = wp.mesh_query_ray(geo.inst_mesh[idx], wp.vec3(orgs[k, 0], orgs[k, 1], orgs[k, 2]),
                                          wp.vec3(lds[k, 0], lds[k, 1], lds[k, 2]), bt[k] - t_min[k])
                    if q.result:
                        bt[k] = t_min[k] + q.t
                        bf[k] = q.face
                        bi[k] = idx
                        bu[k] = q.u
                        bv[k] = q.v
                        nw = wp.quat_rotate(xf.rot, wp.cw_div(q.normal, xf.scale))
                        nx[k] = nw[0]
                        ny[k] = nw[1]
                        nz[k] = nw[2]
    return bt, bf, bi, bu, bv, nx, ny, nz


@wp.func(inline=True)
def nearest_hit(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, time: float, t: float, face: int, inst: int,
                u: float, v: float, n: wp.vec3) -> Hit:
    """The Hit record of a nearest surface as :func:`listed_packet` gives it (face −1: a miss), as
    :func:`closest_hit` builds it."""
    b = Nearest()
    b.t = t
    b.face = face
    b.inst = inst
    b.u = u
    b.v = v
    b.n = n
    return _hit_of(geo, origin, direction, time, b)


@wp.func(inline=True)
def static_hit(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, time: float, t_min: float, t_max: float,
               w: wp.vec4) -> Hit:
    """The Hit record of the static surface ``w`` (as for :func:`closest_hit_given`) alone, as :func:`nearest_hit`
    builds it from :func:`listed_packet` when no instance is listed: the same bits."""
    return _hit_of(geo, origin, direction, time, _wide_nearest(geo, t_min, t_max, w))


@wp.func(inline=True)
def _static_normal(geo: SceneGeo, k: int) -> wp.vec3:
    """The unnormalised normal of the static triangle in slot ``k`` of the wide BVH (its vertices exactly as the
    mesh has them, at hand after the traversal), as every wide path of :func:`closest_hit` computes it."""
    a = geo.wide_v0[k]
    return wp.cross(geo.wide_e1[k] - a, geo.wide_e2[k] - a)


@wp.func
def closest_hit(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_min: float, t_max: float, time: float) -> Hit:
    """Closest surface along ``origin + t·direction`` with ``t_min < t < t_max`` [m], the scene placed at ``time`` [s].

    ``direction`` must be unit length (then t is in metres).
    """
    b = _nearest(t_max, -1, 0.0, 0.0, wp.vec3(0.0, 0.0, 1.0))
    start = origin + direction * t_min
    span = t_max - t_min
    if geo.static_mesh != wp.uint64(0):
        if geo.use_wide != 0:
            b = _wide_nearest(geo, t_min, t_max, wide_closest(geo.wide_boxes, geo.wide_child, geo.wide_v0,
                                                              geo.wide_e1, geo.wide_e2, geo.wide_fid, start,
                                                              direction, span))
        else:
            q = wp.mesh_query_ray(geo.static_mesh, start, direction, span)
            if q.result:
                b = _nearest(t_min + q.t, q.face, q.u, q.v, q.normal)
    return _with_instances(geo, origin, direction, t_min, time, b)


@wp.func(inline=True)
def closest_hit_given(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_min: float, t_max: float, time: float,
                      w: wp.vec4) -> Hit:
    """:func:`closest_hit` with the static wide BVH's answer already known: ``w`` = (t from ``origin +
    direction·t_min`` [m], slot, u, v) as :func:`wsim.kernels.widebvh.wide_closest` (or a packet traversal, which
    gives the same bits) finds it over ``t_max − t_min``, slot < 0 for none. Only for ``geo.use_wide != 0``."""
    return _with_instances(geo, origin, direction, t_min, time, _wide_nearest(geo, t_min, t_max, w))


@wp.func(inline=True)
def closest_hit_beyond(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_max: float, reach: float,
                       time: float) -> Hit:
    """:func:`closest_hit` from 0 to ``t_max`` [m] of a ray whose static surfaces all lie at ``reach`` [m] or beyond
    (the static wide BVH over [0, reach] found none: a packet said so), the same bits: the instances first, over the
    whole range; one nearer than the reach is the answer (no static surface is), else the static wide BVH is traversed
    only up to it, and the static surface wins a tie as in :func:`closest_hit`. Only for ``geo.use_wide != 0``. (A
    lidar ray over a car's roof or bonnet: its static surface is tens of metres on, past the car.)"""
    bi = _instances_nearer(geo, origin, direction, 0.0, time, _nearest(t_max, -1, 0.0, 0.0, wp.vec3(0.0, 0.0, 1.0)))
    if bi.face >= 0 and bi.t < reach:
        return _hit_of(geo, origin, direction, time, bi)
    span = t_max
    if bi.face >= 0:
        span = wp.min(t_max, bi.t * BEYOND_MARGIN)  # (> bi.t: a static surface at bi.t is found, and wins)
    # (the static surfaces from just short of the reach on: the packet met none nearer)
    w = wide_closest_past(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid,
                          origin, direction, reach * PAST_REACH, span)
    if w[1] >= 0.0 and (bi.face < 0 or w[0] <= bi.t):
        return _hit_of(geo, origin, direction, time, _wide_nearest(geo, 0.0, t_max, w))
    return _hit_of(geo, origin, direction, time, bi)


#: :func:`closest_hit_beyond`'s static traversal enters only boxes the ray leaves beyond this share of the reach
#: (short of it: a surface at the reach itself, which a packet over [0, reach) does not report, is found)
PAST_REACH = wp.constant(0.999)
#: :func:`closest_hit_beyond`'s static range past the instance's hit, as a factor: anything above 1 + 2⁻²³ finds a
#: static surface at the very same distance; the static answer within it is the whole range's (same bits).
BEYOND_MARGIN = wp.constant(1.001)


@wp.func
def continue_past(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, prev_t: float, t_max: float, time: float) -> Hit:
    """The next surface strictly beyond a previous hit at ``prev_t`` [m] (shared-edge duplicates skipped)."""
    return closest_hit(geo, origin, direction, prev_t + HIT_EPS_ABS + HIT_EPS_REL * prev_t, t_max, time)


@wp.kernel(enable_backward=False)  # (traced forward only: no adjoint code to compile)
def trace_closest_kernel(
    geo: SceneGeo,
    origins: wp.array[wp.vec3],
    directions: wp.array[wp.vec3],
    times: wp.array[float],
    t_min: float,
    t_max: float,
    offset: int,
    hits: wp.array(dtype=Any),
):
    i = wp.tid() + offset
    _put(hits, i, closest_hit(geo, origins[i], wp.normalize(directions[i]), t_min, t_max, times[i]))


#: Rays a thread of :func:`trace_closest_packets_kernel` takes together (a packet when they share their origin).
TRACE_PACKET = wp.constant(16)
#: Groups of rays a thread of :func:`trace_closest_packets_kernel` takes in a row (as :data:`TILES_PER_THREAD`).
PACKETS_PER_THREAD = wp.constant(8)
#: How far [m] such a packet looks: rays diverging far beyond it are traced better one by one (the packet's bounds
#: widen with distance), rays that meet a surface inside it (the road and the cars around a lidar, most camera
#: pixels) are done.
PACKET_REACH = wp.constant(50.0)
#: ... and its rays must lie within acos(PACKET_COS) = 6° of its first one and in one octant (no direction component
#: of another sign, or zero): the packet's interval bounds cover every ray between them, so a wider fan (a Pandar128
#: tick's 16 emitters spread over 15° of azimuth) or one straddling an axis plane costs many times its rays alone.
PACKET_COS = wp.constant(0.9945219)


#: The widest packet of :func:`trace_closest_packets_kernel` that is traced over its whole range at once: rays within
#: 3° of its first (a camera row's run, a tile of a lidar's 16 azimuths × 4 elevations) stay a narrow packet out of
#: the scene (the lidar fan 6–9 % faster so, in 16 × 4 tiles) ...
WHOLE_COS = wp.constant(0.9986295)
#: ... and list the instances their cone may meet, at one instant from 0: those are traversed as packets, the rest
#: of the rays go by none (built-in street, one thread: camera rays 25 % faster than with per-ray top-level queries;
#: a lidar's 16 × 4 tiles 6–8 % faster listed at 3° than at 1°, the same bits; a 5° lidar column was 8 % slower).
LIST_COS = WHOLE_COS
#: Instances traced as instances up to which a narrow packet's cone is first tested against each one's box (more:
#: against the box of all).
PRETEST_EACH = wp.constant(4)
#: The tangent of LIST_COS's angle, with cone_instances' margin.
LIST_SPREAD = wp.constant(math.sqrt(1.0 - float(WHOLE_COS) ** 2) / float(WHOLE_COS) * 1.01 + 1.0e-5)
#: A narrow packet within 1° of its first ray (a camera tile: 16 × 4 pixels of a 1920-pixel, 60° image span 0.5°) is
#: pre-tested with a cone of 1° (``PRETEST_SPREAD``) instead of LIST_COS's 3°: on the built-in street's 1080p camera
#: 2,600 of 32,400 tiles then meet a moving car's box instead of 6,100 (the 1,700 that list one are the same), the
#: others skip the listing that finds nothing.
PRETEST_COS = wp.constant(0.9998477)
#: The tangent of PRETEST_COS's angle, with cone_instances' margin.
PRETEST_SPREAD = wp.constant(math.sqrt(1.0 - float(PRETEST_COS) ** 2) / float(PRETEST_COS) * 1.01 + 1.0e-5)


@wp.func_native(r"""
#if defined(__CUDA_ARCH__)
return __int_as_float(__float_as_int(x) + 1);
#else
int b;
__builtin_memcpy(&b, &x, sizeof(int));
b += 1;
float r;
__builtin_memcpy(&r, &b, sizeof(float));
return r;
#endif
""")
def _next_up(x: float) -> float:
    """The float just above ``x`` (finite, >= 0)."""
    ...


@wp.func(inline=True)
def _put_instances_first(geo: SceneGeo, o: wp.vec3, dirs: mat64x3, m: int, lo: vec64f, t_max: float, time: float,
                         idx: vec64i, listed: Listed, hits: wp.array(dtype=Any)):
    """:func:`_trace_instances_first`'s records where instances are listed: each traversed once as a packet
    (:func:`listed_packet`, from no static answer), then the static 8-wide BVH as one packet, each ray only up to
    its instance surface, that distance included (a static surface there wins, as in :func:`closest_hit`): a ray
    on a moving car no longer looks for the street behind it. (Its own function: its records are declared, and
    zeroed, only for such packets.)"""
    # (listed_packet from no static answer: every ray at its range's end, no face; set up as vectors)
    zero = vec64f()
    lt, lf, li, lu, lv, lnx, lny, lnz = listed_onto(geo, o, dirs, m, lo, vec64i(1), time, listed, vec64f(t_max),
                                                    vec64i(-1), vec64i(-1), zero, zero, zero, zero, vec64f(1.0))
    hi = vec64f()
    for k in range(m):
        hi[k] = t_max
        if lf[k] >= 0:
            hi[k] = wp.min(t_max, _next_up(lt[k]))
    res = wide_packet16(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid, o,
                        dirs, lo, hi, m)
    for k in range(m):
        d = wp.vec3(dirs[k, 0], dirs[k, 1], dirs[k, 2])
        if res[k, 1] >= 0.0:
            _put(hits, idx[k], static_hit(geo, o, d, time, 0.0, t_max,
                                          wp.vec4(res[k, 0], res[k, 1], res[k, 2], res[k, 3])))
        else:
            _put(hits, idx[k], nearest_hit(geo, o, d, time, lt[k], lf[k], li[k], lu[k], lv[k],
                                           wp.vec3(lnx[k], lny[k], lnz[k])))


@wp.func(inline=True)
def _trace_instances_first(geo: SceneGeo, o: wp.vec3, dirs: mat64x3, m: int, lo: vec64f, t_max: float,
                           times: wp.array[float], idx: vec64i, hits: wp.array(dtype=Any)) -> int:
    """:func:`_trace_group`'s narrow packet (rays ``idx[k]``, ``k < m``, over their whole range) at one instant, from
    0, whose cone may meet the instances: those its rays may meet listed once (:func:`packet_instances`' cone, all
    rays taken). 2: some are, and the records are written (:func:`_put_instances_first`); 1: none is (the static
    packet's answers are the records); 0: too many to list (ray by ray through the top level)."""
    listed = cone_listed(geo, o, cone_of_all(dirs, m))
    if listed.n < 0:
        return 0
    if listed.n == 0:
        return 1
    _put_instances_first(geo, o, dirs, m, lo, t_max, times[idx[0]], idx, listed, hits)
    return 2


@wp.func(inline=True)
def _trace_narrow(geo: SceneGeo, o: wp.vec3, dirs: mat64x3, m: int, t_min: float, t_max: float,
                  times: wp.array[float], idx: vec64i, res: mat64x4, hits: wp.array(dtype=Any)):
    """:func:`_trace_group`'s hits of a narrow packet (rays within ``LIST_COS`` of its first; ``res``: their
    packet's answers over their whole range, a narrow packet staying narrow out of the scene) whose instances were
    neither traversed first nor known to be out of reach (several instants, too many listed): each ray's instances
    through the top level."""
    for k in range(m):
        i = idx[k]
        _put(hits, i, closest_hit_given(geo, o, wp.vec3(dirs[k, 0], dirs[k, 1], dirs[k, 2]), t_min, t_max,
                                        times[i], wp.vec4(res[k, 0], res[k, 1], res[k, 2], res[k, 3])))


@wp.func(inline=True)
def _trace_group(geo: SceneGeo, origins: wp.array[wp.vec3], directions: wp.array[wp.vec3], times: wp.array[float],
                 t_min: float, t_max: float, idx: vec64i, m: int, hits: wp.array(dtype=Any)):
    """The closest hits of rays ``idx[k]``, ``k < m`` (m ≤ 64; CPU, ``geo.use_wide``), each as
    :func:`closest_hit` finds it, bit for bit. When they start at the same point (a lidar's column of emitters, a
    camera's pixels) they traverse the static 8-wide BVH as one packet (:func:`wsim.kernels.packet.wide_packet16`,
    which gives each ray its own traversal's result) over the first ``PACKET_REACH`` metres of their range, then
    the instances ray by ray through the top level (the closest hit inside the reach is the closest hit of the whole
    range); a ray that meets nothing there is traced alone, from 0 instances first (:func:`closest_hit_beyond`). A
    group within ``WHOLE_COS`` is traced over its whole range at once (a narrow packet stays narrow out of the
    scene); of a narrow one (within ``LIST_COS``) at one instant (from 0) the instances its rays may meet are listed
    once and traversed first, as packets (:func:`_trace_instances_first`), then the static tree up to their
    surfaces; else :func:`_trace_narrow`'s. Groups of rays from several origins, or not within ``PACKET_COS`` of one
    direction and octant: ray by ray."""
    o = origins[idx[0]]
    dirs = unit_dirs(directions, idx, m)
    kind = group_kind(origins, times, dirs, idx, m, PACKET_COS, LIST_COS, WHOLE_COS, PRETEST_COS)
    shared = (kind & 1) != 0
    narrow = (kind & 2) != 0  # all within LIST_COS of the first
    whole = (kind & 4) != 0
    same_time = (kind & 8) != 0
    if shared:
        reach = wp.min(t_max, t_min + PACKET_REACH)
        if whole:
            reach = t_max  # a narrow packet stays narrow out of the scene: its whole range at once
        lo = vec64f(t_min)  # (every lane: one vector store, not a loop of 64)
        hi = vec64f(reach)
        listing = int(0)
        if narrow and whole and same_time and t_min == 0.0 and geo.num_instances > 0:
            # first, cheaply, the cone of LIST_COS around the first ray (it holds a narrow packet's rays) against the
            # boxes of the instances traced as instances (each one's, up to PRETEST_EACH of them; else the box of
            # all): most packets meet none. (Here, not in a function taking
            # the scene: Warp passes a function's arguments by value, and a copy of SceneGeo, 4.4 kB, for every
            # packet cost a 1080p camera 3 ms with two cars 1 km away.)
            d0 = wp.vec3(dirs[0, 0], dirs[0, 1], dirs[0, 2])
            rcp0 = wp.vec3(1.0 / d0[0], 1.0 / d0[1], 1.0 / d0[2])
            spread = wp.where((kind & 16) != 0, PRETEST_SPREAD, LIST_SPREAD)  # (all within PRETEST_COS: its cone)
            listing = 1
            meets = bool(False)
            if geo.num_instances <= PRETEST_EACH:  # each instance's own box
                for j in range(geo.num_instances):
                    i = geo.inst_traced[j]
                    if not meets:
                        meets = cone_meets_box(o, d0, rcp0, spread, geo.inst_lo[i], geo.inst_hi[i])
            else:
                meets = cone_meets_box(o, d0, rcp0, spread, geo.traced_lo, geo.traced_hi)
            if meets:
                listing = _trace_instances_first(geo, o, dirs, m, lo, t_max, times, idx, hits)
                if listing == 2:
                    return
        if narrow and same_time and (geo.num_instances == 0 or listing == 1):  # no instance near: static only
            _packet_static(hits, geo, o, dirs, times[idx[0]], idx, m, t_min, t_max, lo, hi)
            return
        res = wide_packet16(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid, o,
                            dirs, lo, hi, m)
        if narrow:
            _trace_narrow(geo, o, dirs, m, t_min, t_max, times, idx, res, hits)
            return
        for k in range(m):
            i = idx[k]
            d = wp.vec3(dirs[k, 0], dirs[k, 1], dirs[k, 2])
            if res[k, 1] >= 0.0 or reach >= t_max:
                w = wp.vec4(res[k, 0], res[k, 1], res[k, 2], res[k, 3])
                _put(hits, i, closest_hit_given(geo, o, d, t_min, t_max, times[i], w))
            elif t_min == 0.0:
                _put(hits, i, closest_hit_beyond(geo, o, d, t_max, reach, times[i]))
            else:
                _put(hits, i, closest_hit(geo, o, d, t_min, t_max, times[i]))
    else:
        for k in range(m):
            i = idx[k]
            _put(hits, i, closest_hit(geo, origins[i], wp.vec3(dirs[k, 0], dirs[k, 1], dirs[k, 2]), t_min, t_max,
                                      times[i]))


@wp.func_native(r"""
#if !defined(__CUDA_ARCH__) && defined(__x86_64__)
__builtin_ia32_sfence();
#endif
""")
def store_fence():
    """Order the streaming (non-temporal) stores made so far before any later store (x86 CPU; nothing else): the
    brief records written past the caches (:func:`wsim.kernels.packet.packet_brief_source`) are then seen by whoever
    reads them after the kernel."""
    ...


@wp.kernel(enable_backward=False)  # (traced forward only: no adjoint code to compile)
def trace_closest_packets_kernel(
    geo: SceneGeo,
    origins: wp.array[wp.vec3],
    directions: wp.array[wp.vec3],
    times: wp.array[float],
    t_min: float,
    t_max: float,
    n: int,
    offset: int,
    hits: wp.array(dtype=Any),
):
    """:func:`trace_closest_kernel` over ``PACKETS_PER_THREAD`` groups of ``TRACE_PACKET`` rays from ray
    ``TRACE_PACKET · PACKETS_PER_THREAD · tid`` on, each as one group (:func:`_trace_group`; CPU, ``geo.use_wide``)."""
    s0 = (wp.tid() + offset) * TRACE_PACKET * PACKETS_PER_THREAD
    for j in range(wp.min(PACKETS_PER_THREAD, (n - s0 + TRACE_PACKET - 1) // TRACE_PACKET)):
        s = s0 + j * TRACE_PACKET
        m = wp.min(TRACE_PACKET, n - s)
        idx = vec64i()
        for k in range(m):
            idx[k] = s + k
        _trace_group(geo, origins, directions, times, t_min, t_max, idx, m, hits)
    store_fence()


#: The tile of :func:`trace_closest_tiles_kernel`: 64 rays, 16 along the grid's finer axis (the smaller angle between
#: neighbours) and 4 along the other — an image's 4 rows × 16 columns, a lidar's 16 azimuths × 4 elevations (measured:
#: 1080p camera rays 4 × 16 25 % faster than 16 × 4 and 8 × 8, 2 × 32 5–15 % slower; the lidar fan 16 × 4 3–9 %
#: faster than 4 × 16, 32 × 2 and 8 × 8 5–20 % slower).
TILE_LONG = 16
TILE_SHORT = 4


@wp.func_native(r"""
wp::vec_t<64, int> idx;
const int per_row = (cols + tile_cols - 1) / tile_cols;
const int tr = t / per_row;
const int r0 = tr * tile_rows, c0 = (t - tr * per_row) * tile_cols;
const int nr = rows - r0 < tile_rows ? rows - r0 : tile_rows;
const int nc = cols - c0 < tile_cols ? cols - c0 : tile_cols;
#if !defined(__CUDA_ARCH__)
// whole runs of 16 (a camera tile's rows) or 4 (a lidar tile's) as vector stores: scalar stores, one per ray, cost
// more than the rest of the tile's set-up, and a vector load of just-stored lanes waits for them
typedef int i16 __attribute__((ext_vector_type(16)));
typedef int i4 __attribute__((ext_vector_type(4)));
if (nc == 16 && nr <= 4) {
    const i16 IOTA = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int j = 0; j < nr; ++j) {
        const i16 v = ((r0 + j) * cols + c0) + IOTA;
        __builtin_memcpy(&idx.c[16 * j], &v, sizeof(v));
    }
    return idx;
}
if (nc == 4 && nr <= 16) {
    const i4 IOTA = {0, 1, 2, 3};
    for (int j = 0; j < nr; ++j) {
        const i4 v = ((r0 + j) * cols + c0) + IOTA;
        __builtin_memcpy(&idx.c[4 * j], &v, sizeof(v));
    }
    return idx;
}
#endif
int m = 0;
for (int j = 0; j < nr; ++j) {
    const int b = (r0 + j) * cols + c0;
    for (int i = 0; i < nc && m < 64; ++i) idx.c[m++] = b + i;
}
return idx;
""")
def _tile_rays(t: int, rows: int, cols: int, tile_rows: int, tile_cols: int) -> vec64i:
    """:func:`tile_indices`' indices (the rest zero), built in plain loops (Warp's loop of appends cost about
    150 ns a tile: 5 % of tracing a 1080p camera's rays), rows of 16 or 4 as one vector each on the CPU (a loop of
    scalar stores: 5 % of tracing them again)."""
    ...


@wp.func
def tile_indices(t: int, rows: int, cols: int, tile_rows: int, tile_cols: int):
    """The row-major indices of tile ``t`` (tiles of ``tile_rows`` × ``tile_cols``, at most 64, row by row) of a
    ``rows`` × ``cols`` grid, those inside the grid, and their count."""
    per_row = (cols + tile_cols - 1) // tile_cols
    tr = t // per_row
    r0 = tr * tile_rows
    c0 = (t - tr * per_row) * tile_cols
    m = wp.min(wp.max(wp.min(tile_rows, rows - r0), 0) * wp.max(wp.min(tile_cols, cols - c0), 0), 64)
    return _tile_rays(t, rows, cols, tile_rows, tile_cols), m


#: Tiles ahead whose rays :func:`prefetch_tile` asks the CPU to fetch. Measured, 1080p camera rays, synthetic scene,
#: one thread, brief records: with the vector loads of a tile's runs (:func:`unit_dirs`, :func:`group_kind`) 39-41 ms
#: -> 32-36 ms at 2 tiles ahead, 4 the same; without the prefetch the vector loads alone gain nothing (the rays'
#: loads alone, without tracing: 15 -> 11 ms).
PREFETCH_AHEAD = 2
#: ... and tiles ahead whose rays (and brief records) it asks to have in the L2 cache meanwhile. Measured, one thread,
#: brief records: 1080p camera rays 3-5 % faster at 8 (16 and 32 alike), the lidar fan 0-2 %; two threads alike.
PREFETCH_FAR = 8


@wp.func_native(r"""
#if !defined(__CUDA_ARCH__)
const int per_row = (cols + tile_cols - 1) / tile_cols;
const int tr = t / per_row;
const int r0 = tr * tile_rows, c0 = (t - tr * per_row) * tile_cols;
if (r0 < rows && c0 < cols) {
    const int nr = rows - r0 < tile_rows ? rows - r0 : tile_rows;
    const int nc = cols - c0 < tile_cols ? cols - c0 : tile_cols;
    // the cache lines of `count` values from value `first` on (their last byte: that of the last value), to read or
    // to write, into every cache level (near) or into L2 and beyond (the hints must be constants)
    auto fetch = [near](const char* p, long long stride, long long first, int count, int size, bool write) {
        const unsigned long long a = (unsigned long long)(p + first * stride);
        const unsigned long long b = (unsigned long long)(p + (first + count - 1) * stride + size - 1);
        for (unsigned long long line = a & ~63ull; line <= b; line += 64) {
            const char* q = (const char*)line;
            if (write) {
                if (near) __builtin_prefetch(q, 1, 3); else __builtin_prefetch(q, 1, 2);
            } else {
                if (near) __builtin_prefetch(q, 0, 3); else __builtin_prefetch(q, 0, 2);
            }
        }
    };
    for (int j = 0; j < nr; ++j) {
        const long long first = (long long)(r0 + j) * cols + c0;
        fetch((const char*)directions.data, directions.strides[0], first, nc, 12, false);
        fetch((const char*)origins.data, origins.strides[0], first, nc, 12, false);
        fetch((const char*)times.data, times.strides[0], first, nc, 4, false);
        if (rec_size > 0) fetch((const char*)rec, rec_size, first, nc, rec_size, true);
    }
}
#endif
""")
def prefetch_tile(origins: wp.array[wp.vec3], directions: wp.array[wp.vec3], times: wp.array[float], t: int, rows: int,
                  cols: int, tile_rows: int, tile_cols: int, rec: wp.uint64, rec_size: int, near: int):
    """Ask the CPU to fetch the origins, directions and times of tile ``t`` (:func:`tile_indices`; none past the
    grid) into its caches; the tiles' rays lie in ``tile_rows`` runs of the arrays, which the hardware's own
    prefetch follows poorly. ``near``: into every level (1), or into L2 and the last-level cache (0, a tile due
    later). With ``rec_size`` > 0 also the tile's records (``rec_size`` bytes each from address
    ``rec`` on), for writing: measured, brief records (20 bytes), one thread, the lidar fan 1-4 % faster; full Hit
    records 20 % slower (a tile's records fill a sixth of the L1 cache), so not asked for them; nor for tiles
    whose rows of 16 records are streamed past the caches (a camera's: fetching them only costs). Nothing on
    CUDA."""
    ...


#: Tiles a kernel thread of :func:`trace_closest_tiles_kernel` takes in a row. Warp copies a kernel's arguments for
#: every thread it runs on the CPU (twice: ``SceneGeo`` alone is 78 arrays, 4.4 kB); one tile a thread spent 6-8 % of
#: tracing 1080p camera rays in those copies (line profile, synthetic scene). Measured, one thread, brief records,
#: against 1 tile a thread: 1080p camera rays 3-4 % faster at 4 tiles, 3-5 % at 16; the lidar fan 3-5 % at both
#: (two threads alike).
TILES_PER_THREAD = 16


@wp.kernel(enable_backward=False)  # (traced forward only: no adjoint code to compile)
def trace_closest_tiles_kernel(
    geo: SceneGeo,
    origins: wp.array[wp.vec3],
    directions: wp.array[wp.vec3],
    times: wp.array[float],
    t_min: float,
    t_max: float,
    rows: int,
    cols: int,
    tile_rows: int,
    tile_cols: int,
    per_thread: int,
    rec: wp.uint64,
    rec_size: int,
    offset: int,
    hits: wp.array(dtype=Any),
):
    """:func:`trace_closest_kernel` over a row-major grid of ``rows`` × ``cols`` rays (an image's pixels, a lidar's
    azimuths × elevations), a tile of ``tile_rows`` × ``tile_cols`` neighbours (at most 64) as one group
    (:func:`_trace_group`; CPU, ``geo.use_wide``): neighbours in two directions make a narrower packet than a run of
    one row. Each kernel thread takes ``per_thread`` tiles in a row (:data:`TILES_PER_THREAD`); ``rec`` (the
    address of ``hits``' data) and ``rec_size`` (> 0: its records' size, fetched ahead for writing) go to
    :func:`prefetch_tile`."""
    tiles = ((rows + tile_rows - 1) // tile_rows) * ((cols + tile_cols - 1) // tile_cols)
    t0 = (wp.tid() + offset) * per_thread
    for j in range(wp.min(per_thread, tiles - t0)):
        t = t0 + j
        for ahead in range(2):  # (near first, then far)
            prefetch_tile(origins, directions, times, t + wp.where(ahead == 0, PREFETCH_AHEAD, PREFETCH_FAR), rows,
                          cols, tile_rows, tile_cols, rec, rec_size, 1 - ahead)
        idx, m = tile_indices(t, rows, cols, tile_rows, tile_cols)
        _trace_group(geo, origins, directions, times, t_min, t_max, idx, m, hits)
    store_fence()


#: The closest-hit kernels are made for both records (explicitly: an instance made at a launch would rebuild the module).
for _kernel in (trace_closest_kernel, trace_closest_packets_kernel, trace_closest_tiles_kernel):
    for _record in (Hit, HitBrief):
        wp.overload(_kernel, {"hits": wp.array(dtype=_record)})


@wp.kernel(enable_backward=False)  # (traced forward only: no adjoint code to compile)
def trace_all_kernel(
    geo: SceneGeo,
    origins: wp.array[wp.vec3],
    directions: wp.array[wp.vec3],
    times: wp.array[float],
    t_min: float,
    t_max: float,
    max_hits: int,
    offset: int,
    hits: wp.array2d[Hit],
    counts: wp.array[wp.int32],
):
    """Up to ``max_hits`` surfaces per ray in path order (continuing queries)."""
    i = wp.tid() + offset
    o = origins[i]
    d = wp.normalize(directions[i])
    h = closest_hit(geo, o, d, t_min, t_max, times[i])
    n = int(0)
    while h.face >= 0 and n < max_hits:
        hits[i, n] = h
        n += 1
        h = continue_past(geo, o, d, h.t, t_max, times[i])
    for k in range(n, max_hits):
        hits[i, k] = miss()
    counts[i] = n


@wp.func
def instance_transform(geo: SceneGeo, inst: int, time: float):
    """(translation, rotation, scale) of instance ``inst`` at ``time`` [s]."""
    return sample_keys(geo.key_time, geo.key_pos, geo.key_rot, geo.key_scale, geo.inst_key_start[inst],
                       geo.inst_key_count[inst], time)


@wp.func
def shading_normal(geo: SceneGeo, hit: Hit) -> wp.vec3:
    """Unit smooth normal at a hit: the vertex normals of its face interpolated with its barycentrics (world axes;
    :meth:`wsim.scene.geometry.SceneGeometry.ensure_vertex_normals` must have run). Its sign is the vertex normals',
    not necessarily the geometric normal's; a miss, or a degenerate interpolation, gives ``hit.normal``."""
    if hit.face < 0:
        return hit.normal
    return smooth_normal_at(geo, hit.face, hit.instance, hit.time, hit.u, hit.v, 1.0 - hit.u - hit.v, hit.normal)


#: A vertex normal more than 45° off a face's own normal is not used at that face's corner (its face normal is):
#: the corners of a box whose faces share vertices stay flat, a finely tessellated curved surface shades smoothly.
SMOOTH_CREASE_COS = 0.70710678


@wp.func
def smooth_normal_at(geo: SceneGeo, face: int, inst: int, time: float, wa: float, wb: float, wc: float,
                     fallback: wp.vec3) -> wp.vec3:
    """Unit interpolation wa·n0 + wb·n1 + wc·n2 of the corner normals of ``face`` (static, or of instance ``inst``
    at ``time`` [s]) in world axes: each corner's vertex normal, or the face's own normal where the two differ by
    more than the crease angle (:data:`SMOOTH_CREASE_COS`); ``fallback`` where the interpolation vanishes."""
    mesh_id = geo.static_mesh
    if inst >= 0:
        mesh_id = geo.inst_mesh[inst]
    m = wp.mesh_get(mesh_id)
    i0 = m.indices[face * 3 + 0]
    i1 = m.indices[face * 3 + 1]
    i2 = m.indices[face * 3 + 2]
    fl = wp.cross(m.points[i1] - m.points[i0], m.points[i2] - m.points[i0])
    lf = wp.length(fl)
    if lf > 0.0:
        fl = fl / lf
    base = int(0)
    if inst >= 0:
        base = geo.inst_vn_start[inst]
    n0 = corner_normal(geo, inst, base + i0, i0, fl)
    n1 = corner_normal(geo, inst, base + i1, i1, fl)
    n2 = corner_normal(geo, inst, base + i2, i2, fl)
    n = n0 * wa + n1 * wb + n2 * wc
    if inst >= 0:
        xf = instance_transform(geo, inst, time)
        n = wp.quat_rotate(xf.rot, wp.cw_div(n, xf.scale))
    ln = wp.length(n)
    if ln < 1.0e-12:
        return fallback
    return n / ln


@wp.func
def corner_normal(geo: SceneGeo, inst: int, proto_index: int, static_index: int, face_n: wp.vec3) -> wp.vec3:
    """A face corner's normal (the mesh's own axes): its vertex normal within the crease angle of the face's unit
    normal ``face_n``, else ``face_n``."""
    vn = wp.vec3(0.0)
    if inst >= 0:
        vn = geo.proto_vn[proto_index]
    else:
        vn = geo.static_vn[static_index]
    if wp.dot(vn, face_n) < SMOOTH_CREASE_COS:
        return face_n
    return vn


@wp.func
def hit_triangle(geo: SceneGeo, hit: Hit) -> wp.mat33:
    """World-space vertices (rows) of the hit triangle at the hit's time."""
    mesh_id = geo.static_mesh
    if hit.instance >= 0:
        mesh_id = geo.inst_mesh[hit.instance]
    m = wp.mesh_get(mesh_id)
    a = m.points[m.indices[hit.face * 3 + 0]]
    b = m.points[m.indices[hit.face * 3 + 1]]
    c = m.points[m.indices[hit.face * 3 + 2]]
    if hit.instance >= 0:
        xf = instance_transform(geo, hit.instance, hit.time)
        a = xf.pos + wp.quat_rotate(xf.rot, wp.cw_mul(a, xf.scale))
        b = xf.pos + wp.quat_rotate(xf.rot, wp.cw_mul(b, xf.scale))
        c = xf.pos + wp.quat_rotate(xf.rot, wp.cw_mul(c, xf.scale))
    return wp.matrix_from_rows(a, b, c)


@wp.func
def hit_distance(geo: SceneGeo, hit: Hit, origin: wp.vec3, direction: wp.vec3) -> float:
    """Distance [m] along ``direction`` to the hit face's plane, recomputed from its vertices.

    Differentiable w.r.t. the ray and the mesh points (the BVH query only picks the face).
    """
    tri = hit_triangle(geo, hit)
    n = wp.cross(tri[1] - tri[0], tri[2] - tri[0])
    den = wp.dot(n, direction)
    if wp.abs(den) < 1.0e-20:
        return hit.t
    return wp.dot(n, tri[0] - origin) / den


@wp.func
def point_velocity(geo: SceneGeo, hit: Hit) -> wp.vec3:
    """World velocity [m/s] of the surface point hit (0 for static geometry), by central difference (±1 ms)."""
    if hit.instance < 0:
        return wp.vec3(0.0, 0.0, 0.0)
    xf = instance_transform(geo, hit.instance, hit.time)
    local = wp.cw_div(wp.quat_rotate_inv(xf.rot, hit.point - xf.pos), xf.scale)
    k0 = geo.inst_key_start[hit.instance]
    k1 = k0 + geo.inst_key_count[hit.instance] - 1
    w = difference_window(geo.key_time[k0], geo.key_time[k1], hit.time, 1.0e-3)
    a = instance_transform(geo, hit.instance, w[0])
    b = instance_transform(geo, hit.instance, w[1])
    pa = a.pos + wp.quat_rotate(a.rot, wp.cw_mul(local, a.scale))
    pb = b.pos + wp.quat_rotate(b.rot, wp.cw_mul(local, b.scale))
    return (pb - pa) / (w[1] - w[0])
