"""Camera rendering on the device: per-pixel timed rays through a lens, closest hits, shading.

Every pixel's ray is generated at the pixel's own rolling-shutter time (:func:`wsim.kernels.lens.relative_time`): the
camera pose is interpolated with :func:`wsim.kernels.pose.lerp_pose` and the scene's moving instances are placed at that
time by :func:`wsim.kernels.trace.closest_hit`.

Shading (COLOR): linear albedo (material base colour, or interpolated vertex colours where the mesh has them) lit by a
directional sun (Lambert, with an any-hit shadow ray toward the sun) plus a hemispherical sky ambient term; rays that
miss see a sky gradient (horizon → zenith, a darker ground below the horizon). Sub-pixel samples are averaged in linear
space, then sRGB-encoded to 8 bits.
"""

import warp as wp

from .colormap import turbo
from .lens import LensParams, relative_time, unproject
from .pose import lerp_pose, sample_keys
from .texture import sample_texture
from .packet import mat64x3, mat64x4, vec64f, vec64i, wide_packet16, wide_packet_any_from
from .trace import (MAX_LISTED, Hit, Listed, SceneGeo, closest_hit, closest_hit_listed, hit_distance,
                    instances_may_meet, miss, packet_instances, ray_box_entry, tile_indices)
from .widebvh import wide_any, wide_any_from


@wp.struct
class ShadeTables:
    """Colour tables of a scene (built once per device geometry by the camera).

    Attributes:
        material_color: Linear base colour per material.
        static_colors: Linear colour per static-mesh vertex (one dummy entry when ``static_has_colors`` is 0).
        static_has_colors: 1 if the static mesh has vertex colours.
        inst_color_offset: Per instance, offset of its prototype's vertex colours in ``proto_colors`` (-1: none).
        proto_colors: Concatenated prototype vertex colours.
        material_texture: Per material (texel offset, width, height, enabled) into ``texels`` (linear RGB).
        static_uv, proto_uv: Per-corner texture coordinates (3 per triangle); ``inst_uv_offset`` per instance.
        srgb: :func:`srgb_table_kernel`'s 256 thresholds (the sRGB8 encoding without a power per channel).
    """

    material_color: wp.array[wp.vec3]
    static_colors: wp.array[wp.vec3]
    static_has_colors: wp.int32
    inst_color_offset: wp.array[wp.int32]
    proto_colors: wp.array[wp.vec3]
    material_texture: wp.array[wp.vec4i]
    texels: wp.array[wp.vec3]
    static_uv: wp.array[wp.vec2]
    inst_uv_offset: wp.array[wp.int32]
    proto_uv: wp.array[wp.vec2]
    srgb: wp.array[float]


#: Length of a shadow ray toward the sun [m].
SHADOW_REACH = wp.constant(1.0e4)
#: A camera run's shadow rays (parallel, toward the sun) go through the static 8-wide BVH as packets of this many
#: neighbouring pixels (:func:`wsim.kernels.packet.wide_packet_any_from`) ...
SHADOW_PACKET = wp.constant(16)
#: ... where their origins lie within a box of this size [m] (larger, the packet's bounds take in so much of the
#: tree that its rays alone cost less: measured on the built-in street, 1080p 18 % faster, 512×320 14 %; without the
#: limit 512×320 went 17 % slower).
SHADOW_SPREAD = wp.constant(3.0)


@wp.struct
class Lighting:
    """Sun and sky.

    Attributes:
        sun_dir: Unit direction toward the sun (world, Z up).
        sun_color: Sun irradiance (linear RGB, 1 = white at normal incidence).
        sky_zenith, sky_horizon, ground: Linear colours of the sky gradient and below the horizon.
        ambient: Linear sky ambient radiance on an upward-facing surface.
        shadows: 1 to trace shadow rays.
    """

    sun_dir: wp.vec3
    sun_color: wp.vec3
    sky_zenith: wp.vec3
    sky_horizon: wp.vec3
    ground: wp.vec3
    ambient: wp.vec3
    shadows: wp.int32


@wp.func
def occluded(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_max: float, time: float) -> bool:
    """Whether anything lies on ``origin + t·direction``, 0 < t < t_max [m], with the scene at ``time`` [s]."""
    hit = occluded_static(geo, origin, direction, t_max)
    if not hit and instances_may_meet(geo, origin, direction, t_max):
        bq = wp.bvh_query_ray(geo.tlas, origin, direction)
        idx = int(0)
        while wp.bvh_query_next(bq, idx, t_max):
            if not hit:
                hit = instance_occludes(geo, geo.inst_traced[idx], origin, direction, t_max, time)
    return hit


@wp.func(inline=True)
def occluded_static(geo: SceneGeo, origin: wp.vec3, direction: wp.vec3, t_max: float) -> bool:
    """:func:`occluded` by the static mesh alone."""
    hit = bool(False)
    if geo.static_mesh != wp.uint64(0):
        if geo.use_wide != 0:  # the 8-wide BVH's any-hit query (about 3x the scalar tree's on the CPU)
            hit = wide_any(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid,
                           origin, direction, t_max)[1] >= 0.0
        else:
            hit = wp.mesh_query_ray_anyhit(geo.static_mesh, origin, direction, t_max)
    return hit


@wp.func(inline=True)
def instance_occludes(geo: SceneGeo, idx: int, origin: wp.vec3, direction: wp.vec3, t_max: float,
                      time: float) -> bool:
    """Whether instance ``idx`` (placed at ``time`` [s]) lies on ``origin + t·direction``, 0 < t < t_max [m]."""
    xf = sample_keys(geo.key_time, geo.key_pos, geo.key_rot, geo.key_scale, geo.inst_key_start[idx],
                     geo.inst_key_count[idx], time)
    inv = wp.quat_inverse(xf.rot)
    lo = wp.cw_div(wp.quat_rotate(inv, origin - xf.pos), xf.scale)
    ld = wp.cw_div(wp.quat_rotate(inv, direction), xf.scale)
    root = geo.inst_wide_root[idx]
    hit = bool(False)
    if root >= 0:  # the prototype's 8-wide BVH (CPU)
        hit = wide_any_from(geo.proto_wide_boxes, geo.proto_wide_child, geo.proto_wide_v0, geo.proto_wide_v1,
                            geo.proto_wide_v2, geo.proto_wide_fid, root, lo, ld, t_max)[1] >= 0.0
    else:
        hit = wp.mesh_query_ray_anyhit(geo.inst_mesh[idx], lo, ld, t_max)
    return hit


@wp.func(inline=True)
def parallel_instances(geo: SceneGeo, lo: wp.vec3, hi: wp.vec3, direction: wp.vec3, t_max: float) -> Listed:
    """The instances (in index order) whose top-level box a ray along ``direction`` from any point of the box
    [``lo``, ``hi``] may enter before ``t_max`` [m] (parallel shadow rays from a camera run's surfaces): conservatively,
    the ray from the box's centre against each instance box grown by the origins' half-extent (plus a margin)."""
    out = Listed()
    out.n = 0
    if geo.num_instances > MAX_LISTED:
        out.n = -1
        return out
    c = (lo + hi) * 0.5
    ext = (hi - lo) * 0.5
    big = wp.max(wp.max(wp.abs(c[0]), wp.abs(c[1])), wp.abs(c[2]))
    m = ext + wp.vec3(1.0e-4 * (1.0 + big + wp.length(ext)))
    rcp = wp.vec3(1.0 / direction[0], 1.0 / direction[1], 1.0 / direction[2])
    reach = t_max * 1.001 + 2.0 * wp.length(m) + 1.0e-3
    for j in range(geo.num_instances):
        i = geo.inst_traced[j]
        if ray_box_entry(c, rcp, geo.inst_lo[i] - m, geo.inst_hi[i] + m, reach) != 0:
            out.idx[out.n] = i
            out.n += 1
    return out


@wp.func
def sky(light: Lighting, d: wp.vec3) -> wp.vec3:
    """Radiance of the sky (or the ground below the horizon) in direction ``d``."""
    z = d[2]
    if z >= 0.0:
        return wp.lerp(light.sky_horizon, light.sky_zenith, wp.sqrt(z))
    return wp.lerp(light.sky_horizon, light.ground, wp.min(1.0, -z * 8.0))


@wp.func
def corner_mix(a: wp.vec3, b: wp.vec3, c: wp.vec3, u: float, v: float) -> wp.vec3:
    """Interpolate per-corner values with Warp's barycentrics (p = u·p0 + v·p1 + (1 − u − v)·p2)."""
    return a * u + b * v + c * (1.0 - u - v)


@wp.func
def albedo(geo: SceneGeo, tables: ShadeTables, face: int, instance: int, material: int, u: float, v: float) -> wp.vec3:
    """Linear diffuse colour at a hit: the material's texture through the mesh's UVs, else vertex colours where the
    mesh has them, else the material's base colour."""
    tex = tables.material_texture[material]
    if tex[3] != 0:
        base = face * 3
        if instance >= 0:
            base = tables.inst_uv_offset[instance] + face * 3
            a = tables.proto_uv[base]
            b = tables.proto_uv[base + 1]
            c = tables.proto_uv[base + 2]
        else:
            a = tables.static_uv[base]
            b = tables.static_uv[base + 1]
            c = tables.static_uv[base + 2]
        uv = a * u + b * v + c * (1.0 - u - v)
        return sample_texture(tables.texels, tex, uv)
    if instance < 0:
        if tables.static_has_colors != 0:
            idx = wp.mesh_get(geo.static_mesh).indices
            return corner_mix(tables.static_colors[idx[face * 3]], tables.static_colors[idx[face * 3 + 1]],
                              tables.static_colors[idx[face * 3 + 2]], u, v)
    else:
        off = tables.inst_color_offset[instance]
        if off >= 0:
            idx = wp.mesh_get(geo.inst_mesh[instance]).indices
            return corner_mix(tables.proto_colors[off + idx[face * 3]], tables.proto_colors[off + idx[face * 3 + 1]],
                              tables.proto_colors[off + idx[face * 3 + 2]], u, v)
    return tables.material_color[material]


@wp.func
def srgb_u8(x: float) -> wp.uint8:
    c = wp.clamp(x, 0.0, 1.0)
    s = float(0.0)
    if c <= 0.0031308:
        s = 12.92 * c
    else:
        s = 1.055 * wp.pow(c, 1.0 / 2.4) - 0.055
    return wp.uint8(int(s * 255.0 + 0.5))


@wp.kernel
def srgb_table_kernel(out: wp.array[float]):
    """``out[v]``: the least float in [0, 1] that :func:`srgb_u8` encodes as v or more (``out[0]`` = 0), by
    bisection down to neighbouring floats with the very function (and this device's power)."""
    v = wp.tid()
    out[v] = 0.0
    if v > 0:
        lo = float(0.0)  # srgb_u8(lo) < v <= srgb_u8(hi)
        hi = float(1.0)
        for _k in range(200):
            mid = lo + 0.5 * (hi - lo)
            if mid <= lo or mid >= hi:
                break
            if int(srgb_u8(mid)) >= v:
                hi = mid
            else:
                lo = mid
        out[v] = hi


@wp.func(inline=True)
def srgb_of(table: wp.array[float], x: float) -> wp.uint8:
    """:func:`srgb_u8` by the thresholds of :func:`srgb_table_kernel`: the largest v with ``table[v]`` <= x, in 8
    comparisons (the same bytes: the encoding is monotone in x; a NaN gives 0)."""
    c = wp.clamp(x, 0.0, 1.0)
    v = int(0)
    step = int(128)
    while step > 0:
        if v + step <= 255:
            if c >= table[v + step]:
                v += step
        step = step // 2
    return wp.uint8(v)


@wp.func(inline=True)
def write_rgb(color: wp.array3d[wp.uint8], row: int, col: int, acc: wp.vec3, srgb: wp.array[float]):
    """A pixel's linear radiance as sRGB8 (``srgb``: :attr:`ShadeTables.srgb`)."""
    color[row, col, 0] = srgb_of(srgb, acc[0])
    color[row, col, 1] = srgb_of(srgb, acc[1])
    color[row, col, 2] = srgb_of(srgb, acc[2])


@wp.func(inline=True)
def shade_ray(geo: SceneGeo, tables: ShadeTables, light: Lighting, origin: wp.vec3, d: wp.vec3, t_max: float,
              time: float) -> wp.vec3:
    """Linear radiance seen along a ray."""
    return shade_hit(geo, tables, light, d, closest_hit(geo, origin, d, 0.0, t_max, time), time)


@wp.struct
class ShadeTerms:
    """The shading of a surface hit before its shadow ray: albedo, n·l toward the sun (lit = 1 where > 0), ambient
    term, and the shadow ray's origin (just off the surface, on the camera's side) [m]."""

    albedo: wp.vec3
    ndl: float
    lit: wp.int32
    amb: wp.vec3
    shadow_origin: wp.vec3


@wp.func(inline=True)
def shade_terms(geo: SceneGeo, tables: ShadeTables, light: Lighting, d: wp.vec3, h: Hit) -> ShadeTerms:
    """:class:`ShadeTerms` of the hit ``h`` (``face >= 0``) seen along unit direction ``d``."""
    n = h.normal
    if wp.dot(n, d) > 0.0:
        n = -n
    st = ShadeTerms()
    st.albedo = albedo(geo, tables, h.face, h.instance, h.material, h.u, h.v)
    st.ndl = wp.dot(n, light.sun_dir)
    st.lit = wp.where(st.ndl > 0.0, 1, 0)
    st.amb = light.ambient * (0.6 + 0.4 * n[2])
    st.shadow_origin = h.point + n * (1.0e-3 + 1.0e-5 * h.t)
    return st


@wp.func(inline=True)
def shade_lit(light: Lighting, st: ShadeTerms, vis: float) -> wp.vec3:
    """Linear radiance of shaded terms with sun visibility ``vis`` (1 lit, 0 in shadow)."""
    direct = wp.vec3(0.0)
    if st.lit != 0:
        direct = light.sun_color * (st.ndl * vis)
    return wp.cw_mul(st.albedo, direct + st.amb)


@wp.func(inline=True)
def shade_hit(geo: SceneGeo, tables: ShadeTables, light: Lighting, d: wp.vec3, h: Hit, time: float) -> wp.vec3:
    """Linear radiance seen along unit direction ``d`` whose closest surface is ``h`` (a miss: the sky)."""
    if h.face < 0:
        return sky(light, d)
    st = shade_terms(geo, tables, light, d, h)
    vis = float(1.0)
    if st.lit != 0 and light.shadows != 0:
        if occluded(geo, st.shadow_origin, light.sun_dir, SHADOW_REACH, time):
            vis = 0.0
    return shade_lit(light, st, vis)


@wp.func(inline=True)
def pixel_hit(geo: SceneGeo, origin: wp.vec3, rot: wp.quat, ray: wp.vec4, t_max: float, time: float) -> Hit:
    """The surface a pixel sees: ``ray`` = camera-frame direction and validity (from ``unproject``). Misses and rays
    outside the lens's field of view give t = 0, semantic 0, normal 0, face and instance −1; the normal of a hit is
    turned toward the camera."""
    h = miss()
    h.normal = wp.vec3(0.0)
    if ray[3] > 0.0:
        d = wp.normalize(wp.quat_rotate(rot, wp.vec3(ray[0], ray[1], ray[2])))
        hit = closest_hit(geo, origin, d, 0.0, t_max, time)
        if hit.face >= 0:
            h = hit
            if wp.dot(h.normal, d) > 0.0:
                h.normal = -h.normal
    return h


@wp.kernel
def render_kernel(
    geo: SceneGeo,
    tables: ShadeTables,
    light: Lighting,
    lens: LensParams,
    shutter: int,
    cam_poses: wp.array[wp.transform],
    t0: float,
    t1: float,
    t_max: float,
    supersample: int,
    want_color: int,
    want_raw: int,
    offset: int,
    color: wp.array3d[wp.uint8],
    distance: wp.array2d[float],
    semantic: wp.array2d[wp.int32],
    normal: wp.array2d[wp.vec3],
):
    """One pixel: raw products from the pixel-centre ray (distance ‖hit − camera centre‖ [m], 0 for a miss; semantic
    class, 0 for a miss; world normal facing the camera, 0 for a miss) and, if asked, the colour averaged over
    ``supersample``² sub-pixel rays. Pixels outside the lens's field of view are black / 0."""
    i = wp.tid() + offset
    w = lens.width
    row = i / w
    col = i - row * w
    centre = wp.vec2(float(col) + 0.5, float(row) + 0.5)
    tau = relative_time(shutter, lens.width, lens.height, centre)
    time = t0 + tau * (t1 - t0)
    pose = lerp_pose(cam_poses[0], cam_poses[1], tau)
    origin = wp.transform_get_translation(pose)
    rot = wp.transform_get_rotation(pose)
    if want_raw != 0:
        h = pixel_hit(geo, origin, rot, unproject(lens, centre), t_max, time)
        distance[row, col] = h.t
        semantic[row, col] = h.semantic
        normal[row, col] = h.normal
    if want_color != 0:
        acc = wp.vec3(0.0)
        inv = 1.0 / float(supersample)
        for a in range(supersample):
            for b in range(supersample):
                uv = wp.vec2(float(col) + (float(b) + 0.5) * inv, float(row) + (float(a) + 0.5) * inv)
                r = unproject(lens, uv)
                if r[3] > 0.0:
                    d = wp.normalize(wp.quat_rotate(rot, wp.vec3(r[0], r[1], r[2])))
                    acc += shade_ray(geo, tables, light, origin, d, t_max, time)
        write_rgb(color, row, col, acc * (inv * inv), tables.srgb)


#: Pixels traced as one packet by :func:`render_rows_kernel` at most (a tile of its pixels).
ROW_PACKET = 64


@wp.kernel
def render_rows_kernel(
    geo: SceneGeo,
    tables: ShadeTables,
    light: Lighting,
    lens: LensParams,
    shutter: int,
    cam_poses: wp.array[wp.transform],
    t0: float,
    t1: float,
    t_max: float,
    want_color: int,
    want_raw: int,
    tile_rows: int,
    tile_cols: int,
    offset: int,
    color: wp.array3d[wp.uint8],
    distance: wp.array2d[float],
    semantic: wp.array2d[wp.int32],
    normal: wp.array2d[wp.vec3],
):
    """:func:`render_kernel` without supersampling for a tile of ``tile_rows`` × ``tile_cols`` pixels (at most
    ``ROW_PACKET``: a run of one row for a global or top/bottom rolling shutter, of one column for a left/right one;
    CPU, static mesh on the 8-wide BVH): the pixels exposed at the same instant
    share the camera's position, so their rays find their static surfaces in one packet traversal and the instances
    their cone may meet are listed once; their shadow rays (parallel, toward the sun) are traced once the tile's lit
    surfaces are known, against the instances listed for the box of their origins. The same bits as pixel by pixel,
    and one trace serves both the raw products and the colour."""
    pix, n = tile_indices(wp.tid() + offset, lens.height, lens.width, tile_rows, tile_cols)
    px_r = vec64i()  # the tile's pixels (inside the image)
    px_c = vec64i()
    for j in range(n):
        px_r[j] = pix[j] / lens.width
        px_c[j] = pix[j] - px_r[j] * lens.width
    tau = relative_time(shutter, lens.width, lens.height, wp.vec2(float(px_c[0]) + 0.5, float(px_r[0]) + 0.5))
    same = int(1)
    for j in range(n):
        if relative_time(shutter, lens.width, lens.height,
                         wp.vec2(float(px_c[j]) + 0.5, float(px_r[j]) + 0.5)) != tau:
            same = 0
    first = mat64x4()
    dirs = mat64x3()
    lo = vec64f()
    hi = vec64f()
    ok = vec64f()  # 1 where the pixel's ray lies in the lens's field of view
    origin = wp.vec3()
    rot = wp.quat()
    listed = Listed()
    listed.n = -1  # the instances through the top-level BVH, unless listed below
    # the lit surfaces whose shadow rays wait for the run's list of instances: albedo, ambient, n·l, shadow origin
    s_alb = mat64x3()
    s_amb = mat64x3()
    s_org = mat64x3()
    s_ndl = vec64f()
    s_lit = vec64f()
    s_lo = wp.vec3(1.0e30)
    s_hi = wp.vec3(-1.0e30)
    n_lit = int(0)
    if same != 0:
        pose = lerp_pose(cam_poses[0], cam_poses[1], tau)
        origin = wp.transform_get_translation(pose)
        rot = wp.transform_get_rotation(pose)
        for j in range(n):
            r = unproject(lens, wp.vec2(float(px_c[j]) + 0.5, float(px_r[j]) + 0.5))
            if r[3] > 0.0:
                d = wp.normalize(wp.quat_rotate(rot, wp.vec3(r[0], r[1], r[2])))
                dirs[j, 0] = d[0]
                dirs[j, 1] = d[1]
                dirs[j, 2] = d[2]
                hi[j] = t_max
                ok[j] = 1.0
        first = wide_packet16(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid,
                              origin, dirs, lo, hi, n)
        if geo.num_instances > 0:  # the instances the run's rays may meet, listed once (a cone around their mean)
            listed = packet_instances(geo, origin, dirs, n, ok)
    for j in range(n):
        row = px_r[j]
        col = px_c[j]
        centre = wp.vec2(float(col) + 0.5, float(row) + 0.5)
        time = t0 + tau * (t1 - t0)
        if same == 0:  # each pixel at its own instant: one by one
            tau_j = relative_time(shutter, lens.width, lens.height, centre)
            time = t0 + tau_j * (t1 - t0)
            pose = lerp_pose(cam_poses[0], cam_poses[1], tau_j)
            origin = wp.transform_get_translation(pose)
            rot = wp.transform_get_rotation(pose)
        h = miss()
        h.normal = wp.vec3(0.0)
        d = wp.vec3(0.0, 0.0, 1.0)
        valid = int(0)
        if same != 0:  # the packet's ray
            if ok[j] != 0.0:
                valid = 1
                d = wp.vec3(dirs[j, 0], dirs[j, 1], dirs[j, 2])
        else:
            r = unproject(lens, centre)
            if r[3] > 0.0:
                valid = 1
                d = wp.normalize(wp.quat_rotate(rot, wp.vec3(r[0], r[1], r[2])))
        if valid != 0:
            hit = miss()
            if same != 0:
                hit = closest_hit_listed(geo, origin, d, t_max, time,
                                         wp.vec4(first[j, 0], first[j, 1], first[j, 2], first[j, 3]), listed)
            else:
                hit = closest_hit(geo, origin, d, 0.0, t_max, time)
            if want_raw != 0 and hit.face >= 0:
                h = hit
                if wp.dot(h.normal, d) > 0.0:
                    h.normal = -h.normal
            if want_color != 0:
                if same != 0 and light.shadows != 0 and hit.face >= 0:
                    # shaded now; its shadow ray is traced below, once the run's lit surfaces are all known
                    st = shade_terms(geo, tables, light, d, hit)
                    if st.lit != 0:
                        for k in range(3):
                            s_alb[j, k] = st.albedo[k]
                            s_amb[j, k] = st.amb[k]
                            s_org[j, k] = st.shadow_origin[k]
                        s_ndl[j] = st.ndl
                        s_lit[j] = 1.0
                        s_lo = wp.min(s_lo, st.shadow_origin)
                        s_hi = wp.max(s_hi, st.shadow_origin)
                        n_lit += 1
                    else:
                        write_rgb(color, row, col, shade_lit(light, st, 1.0), tables.srgb)
                else:
                    write_rgb(color, row, col, shade_hit(geo, tables, light, d, hit, time), tables.srgb)
        elif want_color != 0:
            write_rgb(color, row, col, wp.vec3(0.0), tables.srgb)
        if want_raw != 0:
            distance[row, col] = h.t
            semantic[row, col] = h.semantic
            normal[row, col] = h.normal
    if n_lit > 0:
        # the run's shadow rays (parallel, toward the sun): the instances any of them may meet listed once, each ray
        # then tests those with the top-level BVH's own box test (the same answer as through the BVH)
        time = t0 + tau * (t1 - t0)
        sun = light.sun_dir
        shadow_list = Listed()
        shadow_list.n = 0
        if geo.num_instances > 0:
            shadow_list = parallel_instances(geo, s_lo, s_hi, sun, SHADOW_REACH)
        rcp = wp.vec3(1.0 / sun[0], 1.0 / sun[1], 1.0 / sun[2])
        s_dir = mat64x3()
        for j in range(n):
            for k in range(3):
                s_dir[j, k] = sun[k]
        s_blk = vec64f()  # 1: the static mesh blocks the pixel's shadow ray
        if geo.static_mesh != wp.uint64(0) and shadow_list.n >= 0:  # neighbours' shadow rays as packets, where
            # their origins lie close, else one by one: the same answers (any triangle met) as ray by ray
            for g in range(0, n, SHADOW_PACKET):
                s_far = vec64f()
                m = int(0)
                g_lo = wp.vec3(1.0e30)
                g_hi = wp.vec3(-1.0e30)
                for j in range(g, wp.min(g + SHADOW_PACKET, n)):
                    if s_lit[j] > 0.0:
                        s_far[j] = SHADOW_REACH
                        m += 1
                        o = wp.vec3(s_org[j, 0], s_org[j, 1], s_org[j, 2])
                        g_lo = wp.min(g_lo, o)
                        g_hi = wp.max(g_hi, o)
                ext = g_hi - g_lo
                if m > 1 and wp.max(ext[0], wp.max(ext[1], ext[2])) <= SHADOW_SPREAD:
                    s_hit = wide_packet_any_from(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1,
                                                 geo.wide_e2, geo.wide_fid, s_org, s_dir, lo, s_far, n)
                    for j in range(g, wp.min(g + SHADOW_PACKET, n)):
                        if s_far[j] > 0.0 and s_hit[j, 1] >= 0.0:
                            s_blk[j] = 1.0
                elif m > 0:
                    for j in range(g, wp.min(g + SHADOW_PACKET, n)):
                        if s_far[j] > 0.0:
                            if occluded_static(geo, wp.vec3(s_org[j, 0], s_org[j, 1], s_org[j, 2]), sun,
                                               SHADOW_REACH):
                                s_blk[j] = 1.0
        for j in range(n):
            if s_lit[j] > 0.0:
                st = ShadeTerms()
                st.albedo = wp.vec3(s_alb[j, 0], s_alb[j, 1], s_alb[j, 2])
                st.amb = wp.vec3(s_amb[j, 0], s_amb[j, 1], s_amb[j, 2])
                st.ndl = s_ndl[j]
                st.lit = 1
                o = wp.vec3(s_org[j, 0], s_org[j, 1], s_org[j, 2])
                blocked = bool(False)
                if shadow_list.n < 0:
                    blocked = occluded(geo, o, sun, SHADOW_REACH, time)
                else:
                    blocked = s_blk[j] != 0.0
                    for q in range(shadow_list.n):
                        idx = shadow_list.idx[q]
                        if not blocked:
                            if ray_box_entry(o, rcp, geo.inst_lo[idx], geo.inst_hi[idx], SHADOW_REACH) != 0:
                                blocked = instance_occludes(geo, idx, o, sun, SHADOW_REACH, time)
                vis = float(1.0)
                if blocked:
                    vis = 0.0
                write_rgb(color, px_r[j], px_c[j], shade_lit(light, st, vis), tables.srgb)


@wp.kernel
def colorize_semantics_kernel(semantic: wp.array2d[wp.int32], palette: wp.array2d[wp.uint8], offset: int,
                              out: wp.array3d[wp.uint8]):
    """RGB8 of class ids through a (C, 3) palette (ids outside it → black)."""
    i = wp.tid() + offset
    w = semantic.shape[1]
    row = i / w
    col = i - row * w
    s = semantic[row, col]
    for c in range(3):
        v = wp.uint8(0)
        if s >= 0 and s < palette.shape[0]:
            v = palette[s, c]
        out[row, col, c] = v


@wp.kernel
def colorize_distance_kernel(distance: wp.array2d[float], vmax: float, offset: int, out: wp.array3d[wp.uint8]):
    """RGB8 of distance / vmax through Turbo; distances ≤ 0 (misses) become black."""
    i = wp.tid() + offset
    w = distance.shape[1]
    row = i / w
    col = i - row * w
    v = distance[row, col]
    c = wp.vec3(0.0)
    if v > 0.0:
        c = turbo(v / vmax)
    for k in range(3):
        out[row, col, k] = wp.uint8(int(c[k] * 255.0 + 0.5))


# ---------------------------------------------------------------------------------------------------------------------
# differentiable DISTANCE (Camera.render(..., requires_grad=True))


@wp.func
def pixel_ray(lens: LensParams, shutter: int, i: int) -> wp.spatial_vector:
    """Pixel ``i`` (row-major): relative time τ, and the camera-frame unit ray with its validity, as
    (τ, ray x, ray y, ray z, valid, 0); both depend only on the pixel, not on the poses."""
    w = lens.width
    row = i / w
    col = i - row * w
    centre = wp.vec2(float(col) + 0.5, float(row) + 0.5)
    tau = relative_time(shutter, lens.width, lens.height, centre)
    r = unproject(lens, centre)
    return wp.spatial_vector(tau, r[0], r[1], r[2], r[3], 0.0)


@wp.kernel
def render_raw_kernel(
    geo: SceneGeo,
    lens: LensParams,
    shutter: int,
    cam_poses: wp.array[wp.transform],
    t0: float,
    t1: float,
    t_max: float,
    offset: int,
    distance: wp.array2d[float],
    semantic: wp.array2d[wp.int32],
    normal: wp.array2d[wp.vec3],
    face: wp.array2d[wp.int32],
    instance: wp.array2d[wp.int32],
):
    """The raw products of :func:`render_kernel` (same rays, same values) plus the surface each pixel sees: face index
    (-1 for a miss or a pixel outside the lens's field of view) and instance (-1 for static geometry). Not
    differentiated: :func:`distance_diff_kernel` recomputes DISTANCE from these surfaces."""
    i = wp.tid() + offset
    w = lens.width
    row = i / w
    col = i - row * w
    pr = pixel_ray(lens, shutter, i)
    tau = pr[0]
    time = t0 + tau * (t1 - t0)
    pose = lerp_pose(cam_poses[0], cam_poses[1], tau)
    origin = wp.transform_get_translation(pose)
    rot = wp.transform_get_rotation(pose)
    h = pixel_hit(geo, origin, rot, wp.vec4(pr[1], pr[2], pr[3], pr[4]), t_max, time)
    distance[row, col] = h.t
    semantic[row, col] = h.semantic
    normal[row, col] = h.normal
    face[row, col] = h.face
    instance[row, col] = h.instance


@wp.kernel
def distance_diff_kernel(
    geo: SceneGeo,
    lens: LensParams,
    shutter: int,
    cam_poses: wp.array[wp.transform],
    frame_times: wp.array[float],
    face: wp.array2d[wp.int32],
    instance: wp.array2d[wp.int32],
    forward_distance: wp.array2d[float],
    distance: wp.array2d[float],
):
    """DISTANCE recomputed from the surface :func:`render_raw_kernel` picked per pixel, differentiably w.r.t. the
    camera's start/end poses ``cam_poses`` (camera-to-world), the frame times ``frame_times`` = (t0, t1) [s] (through
    moving instances placed at the pixel's time) and the mesh vertices (static and prototype ``wp.Mesh`` points).

    The pixel's relative time τ and its camera-frame ray are fixed (piecewise constant in every input); the distance is
    the one along the ray from the camera centre at τ to the plane of the picked triangle. Misses stay 0 with zero
    gradient."""
    i = wp.tid()
    w = lens.width
    row = i / w
    col = i - row * w
    f = face[row, col]
    out = float(0.0)
    if f >= 0:
        pr = pixel_ray(lens, shutter, i)
        tau = pr[0]
        pose = lerp_pose(cam_poses[0], cam_poses[1], tau)
        origin = wp.transform_get_translation(pose)
        d = wp.normalize(wp.quat_rotate(wp.transform_get_rotation(pose), wp.vec3(pr[1], pr[2], pr[3])))
        h = miss()
        h.face = f
        h.instance = instance[row, col]
        h.t = forward_distance[row, col]
        h.time = frame_times[0] + tau * (frame_times[1] - frame_times[0])
        out = hit_distance(geo, h, origin, d)
    distance[row, col] = out
