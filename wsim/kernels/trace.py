"""Ray–scene traversal: a static BVH mesh plus instanced (possibly moving) prototype meshes under a top-level BVH.

Every ray carries a time [s]; instance transforms are interpolated at that time (:func:`wsim.kernels.pose.sample_keys`).
The result of a query is one :class:`Hit` record, consumed alike by lidar intensity and camera shading.
"""

import warp as wp

from .pose import difference_window, sample_keys
from .widebvh import wide_closest, wide_closest_from

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
    tlas: wp.uint64
    num_instances: wp.int32
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
    # the prototypes' 8-wide BVHs in one pool (CPU only): root wide node per instance, -1 keeps mesh_query_ray
    inst_wide_root: wp.array[wp.int32]
    proto_wide_boxes: wp.array[float]
    proto_wide_child: wp.array[wp.int32]
    proto_wide_v0: wp.array[wp.vec3]
    proto_wide_v1: wp.array[wp.vec3]
    proto_wide_v2: wp.array[wp.vec3]
    proto_wide_fid: wp.array[wp.int32]


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


@wp.func(inline=True)
def _with_instances(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_min: float, time: float, static_t: float,
                    static_face: int, su: float, sv: float, sn: wp.vec3) -> Hit:
    """The closest of the static surface found (``static_face`` < 0: none, ``static_t`` then the range's end) and
    the instances' surfaces nearer than it, as a Hit."""
    best_t = static_t
    best_face = static_face
    best_inst = int(-1)
    bu = su
    bv = sv
    bn = sn
    start = origin + direction * t_min
    if geo.num_instances > 0:
        bq = wp.bvh_query_ray(geo.tlas, origin, direction)
        idx = int(0)
        while wp.bvh_query_next(bq, idx, best_t):
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
                                      best_t - t_min)
                if w[1] >= 0.0:
                    best_t = t_min + w[0]
                    best_face = int(w[1])
                    best_inst = idx
                    bu = w[2]
                    bv = w[3]
                    m = wp.mesh_get(geo.inst_mesh[idx])
                    a = m.points[m.indices[best_face * 3]]
                    ln = wp.normalize(wp.cross(m.points[m.indices[best_face * 3 + 1]] - a,
                                               m.points[m.indices[best_face * 3 + 2]] - a))
                    bn = wp.quat_rotate(xf.rot, wp.cw_div(ln, xf.scale))
            else:
                q = wp.mesh_query_ray(geo.inst_mesh[idx], lo, ld, best_t - t_min)
                if q.result:
                    best_t = t_min + q.t
                    best_face = q.face
                    best_inst = idx
                    bu = q.u
                    bv = q.v
                    # normals transform with the inverse transpose of R·S, i.e. R·S⁻¹
                    bn = wp.quat_rotate(xf.rot, wp.cw_div(q.normal, xf.scale))
    if best_face < 0:
        h = miss()
        h.time = time
        return h
    h = Hit()
    h.t = best_t
    h.point = origin + direction * best_t
    h.normal = wp.normalize(bn)
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


@wp.func
def closest_hit(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_min: float, t_max: float, time: float) -> Hit:
    """Closest surface along ``origin + t·direction`` with ``t_min < t < t_max`` [m], the scene placed at ``time`` [s].

    ``direction`` must be unit length (then t is in metres).
    """
    best_t = t_max
    best_face = int(-1)
    bu = float(0.0)
    bv = float(0.0)
    bn = wp.vec3(0.0, 0.0, 1.0)
    start = origin + direction * t_min
    span = t_max - t_min
    if geo.static_mesh != wp.uint64(0):
        if geo.use_wide != 0:
            w = wide_closest(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid,
                             start, direction, span)
            if w[1] >= 0.0:
                best_t = t_min + w[0]
                best_face = int(w[1])
                bu = w[2]
                bv = w[3]
                m = wp.mesh_get(geo.static_mesh)
                a = m.points[m.indices[best_face * 3]]
                bn = wp.cross(m.points[m.indices[best_face * 3 + 1]] - a, m.points[m.indices[best_face * 3 + 2]] - a)
        else:
            q = wp.mesh_query_ray(geo.static_mesh, start, direction, span)
            if q.result:
                best_t = t_min + q.t
                best_face = q.face
                bu = q.u
                bv = q.v
                bn = q.normal
    return _with_instances(geo, origin, direction, t_min, time, best_t, best_face, bu, bv, bn)


@wp.func
def closest_hit_given(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_min: float, t_max: float, time: float,
                      w: wp.vec4) -> Hit:
    """:func:`closest_hit` with the static wide BVH's answer already known: ``w`` = (t from ``origin +
    direction·t_min`` [m], face, u, v) as :func:`wsim.kernels.widebvh.wide_closest` (or a packet traversal, which
    gives the same bits) finds it over ``t_max − t_min``, face < 0 for none. Only for ``geo.use_wide != 0``."""
    best_t = t_max
    best_face = int(-1)
    bu = float(0.0)
    bv = float(0.0)
    bn = wp.vec3(0.0, 0.0, 1.0)
    if w[1] >= 0.0:
        best_t = t_min + w[0]
        best_face = int(w[1])
        bu = w[2]
        bv = w[3]
        m = wp.mesh_get(geo.static_mesh)
        a = m.points[m.indices[best_face * 3]]
        bn = wp.cross(m.points[m.indices[best_face * 3 + 1]] - a, m.points[m.indices[best_face * 3 + 2]] - a)
    return _with_instances(geo, origin, direction, t_min, time, best_t, best_face, bu, bv, bn)


@wp.func
def continue_past(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, prev_t: float, t_max: float, time: float) -> Hit:
    """The next surface strictly beyond a previous hit at ``prev_t`` [m] (shared-edge duplicates skipped)."""
    return closest_hit(geo, origin, direction, prev_t + HIT_EPS_ABS + HIT_EPS_REL * prev_t, t_max, time)


@wp.kernel
def trace_closest_kernel(
    geo: SceneGeo,
    origins: wp.array[wp.vec3],
    directions: wp.array[wp.vec3],
    times: wp.array[float],
    t_min: float,
    t_max: float,
    offset: int,
    hits: wp.array[Hit],
):
    i = wp.tid() + offset
    hits[i] = closest_hit(geo, origins[i], wp.normalize(directions[i]), t_min, t_max, times[i])


@wp.kernel
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
