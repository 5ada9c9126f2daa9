"""Lidar physics on the device, as orthogonal steps inside one kernel per firing:
schedule (firing time, angle) → pose at the firing time → rays (one, or a beam of sub-rays) → trace (continuing
through transmissive materials) → echoes (beam contributions merged into peaks, strongest first) → intensity and
detection → output frame. Every firing is independent; nothing is written that a backward pass would need again.
"""

import warp as wp

from .pose import difference_window, sample_trajectory
from .trace import Hit, SceneGeo, closest_hit, continue_past, hit_distance, hit_triangle, miss, point_velocity

MAX_CONTRIB = 64  # beam contributions per firing (sub-rays × surfaces per sub-ray)
vec64f = wp.types.vector(length=MAX_CONTRIB, dtype=float)
vec64i = wp.types.vector(length=MAX_CONTRIB, dtype=wp.int32)

FLAG_VALID = wp.constant(wp.uint8(0x40))
FLAG_NEW_SCAN = wp.constant(wp.uint8(0x20))
#: Retroreflective gain: the effective reflectance is ρ·(1 + RETRO_GAIN·cos⁴θ) (strong only near normal incidence).
RETRO_GAIN = wp.constant(20.0)

RAY_IDEALIZED = 0
RAY_GAUSSIAN = 1
RAY_UNIFORM = 2


@wp.struct
class LidarParams:
    """Scalar settings of a lidar render (SI units; angles in radians)."""

    num_emitters: wp.int32
    rotary: wp.int32
    ccw: wp.int32
    scan_period: float
    start_az_offset: float
    valid_start: float
    valid_end: float
    near: float
    far: float
    range_res: float
    min_echo_dist: float
    max_returns: wp.int32
    ray_type: wp.int32
    beam_n: wp.int32
    hits_per_subray: wp.int32
    div_h: float
    div_v: float
    processing: wp.int32  # 0 RAW, 1 NORMALIZATION, 2 CORRECTION
    nonlinear: wp.int32
    scale: float
    detect_threshold: float
    range_noise: float
    az_noise: float
    el_noise: float
    seed: wp.int32
    instant: wp.int32
    window_filter: wp.int32
    frame: wp.int32  # 0 sensor, 1 world, 2 custom
    compensated: wp.int32
    spherical: wp.int32


@wp.struct
class EmitterTable:
    """Per-state emitter arrays, flattened [state · num_emitters + emitter]; angles [rad], offsets [m]."""

    az: wp.array[float]
    el: wp.array[float]
    fire_ns: wp.array[wp.int32]
    channel: wp.array[wp.uint32]
    hor: wp.array[float]
    vert: wp.array[float]
    dcorr: wp.array[float]


@wp.struct
class TickTable:
    """The ticks of one render: time on the scene clock [s], offset from timestampNs [ns], ids."""

    time: wp.array[float]
    rel_scan: wp.array[float]  # tick time − its scan's start [s]
    offset_ns: wp.array[wp.int64]  # tick time − timestampNs [ns]
    window_lo_ns: wp.array[wp.int64]  # step window relative to the tick [ns]: fire if lo <= key < hi
    window_hi_ns: wp.array[wp.int64]
    period_ns: wp.array[wp.int64]  # tick period [ns] (key = min(fire time, period − 1))
    tick_id: wp.array[wp.int32]
    state: wp.array[wp.int32]
    scan: wp.array[wp.int32]


@wp.struct
class Slots:
    """Per (firing, echo) outputs before compaction."""

    present: wp.array[wp.uint8]
    flags: wp.array[wp.uint8]
    coords: wp.array[wp.vec3]
    intensity: wp.array[float]
    time_offset_ns: wp.array[wp.int32]
    emitter: wp.array[wp.uint32]
    channel: wp.array[wp.uint32]
    tick: wp.array[wp.uint32]
    echo: wp.array[wp.uint8]
    state: wp.array[wp.uint8]
    material_id: wp.array[wp.uint32]
    object_id: wp.array[wp.vec4ui]
    normal: wp.array[wp.vec3]
    velocity: wp.array[wp.vec3]
    semantic: wp.array[wp.int32]
    # what the differentiable pass needs to recompute a return from its surface
    fire: wp.array[wp.int32]  # firing index
    face: wp.array[wp.int32]
    inst: wp.array[wp.int32]
    material: wp.array[wp.int32]
    subray: wp.array[wp.int32]
    tau: wp.array[float]  # sub-ray weight × transmittance before the surface
    rep_t: wp.array[float]  # representative surface distance [m] (forward value)
    rep_s: wp.array[float]  # representative contribution signal (forward value)
    peak_r: wp.array[float]  # echo range before corrections [m]
    peak_s: wp.array[float]  # echo signal
    noise: wp.array[wp.vec3]  # range [m], azimuth [rad], elevation [rad] noise drawn for this return


@wp.func
def wrap_pi(a: float) -> float:
    """Angle wrapped to (−π, π]."""
    twopi = 2.0 * wp.pi
    r = a - twopi * wp.floor(a / twopi)  # [0, 2π)
    if r > wp.pi:
        r = r - twopi
    return r


@wp.func
def sph_dir(az: float, el: float) -> wp.vec3:
    ce = wp.cos(el)
    return wp.vec3(ce * wp.cos(az), ce * wp.sin(az), wp.sin(el))


@wp.func
def beam_offset(k: int, n: int, gaussian: int) -> wp.vec3:
    """Sub-ray k of n over the unit footprint disc: centre, then hexagonal rings of 6, 12, … points.

    Returns (x, y, weight) with x, y in units of the footprint semi-axes (1 = the 1/e² contour for Gaussian beams,
    the edge for uniform beams). Weights are not normalised.
    """
    if k == 0:
        return wp.vec3(0.0, 0.0, 1.0)
    # number of rings R: 1 + 3R(R+1) >= n
    rings = int(1)
    while 1 + 3 * rings * (rings + 1) < n:
        rings += 1
    ring = int(1)
    first = int(1)
    while k >= first + 6 * ring:
        first += 6 * ring
        ring += 1
    in_ring = 6 * ring
    if ring == rings:
        in_ring = n - first  # last ring takes what is left, spread evenly
    j = k - first
    r = float(ring) / float(rings)
    phi = 2.0 * wp.pi * float(j) / float(in_ring) + 0.5 * float(ring - 1) * wp.pi / float(in_ring)
    x = r * wp.cos(phi)
    y = r * wp.sin(phi)
    w = float(1.0)
    if gaussian != 0:
        w = wp.exp(-2.0 * (x * x + y * y))
    # area each sample stands for grows with its ring radius
    w = w * float(ring) / float(in_ring) * 6.0
    return wp.vec3(x, y, w)


@wp.func
def beam_weight_sum(n: int, gaussian: int) -> float:
    s = float(0.0)
    for k in range(n):
        s += beam_offset(k, n, gaussian)[2]
    return s


@wp.func
def subray_dir(d: wp.vec3, k: int, p: LidarParams) -> wp.vec3:
    """Direction of beam sub-ray k around the centre direction d (unit)."""
    if p.ray_type == RAY_IDEALIZED or k == 0:
        return d
    o = beam_offset(k, p.beam_n, wp.where(p.ray_type == RAY_GAUSSIAN, 1, 0))
    up = wp.vec3(0.0, 0.0, 1.0)
    h = wp.cross(up, d)
    if wp.length(h) < 1.0e-6:
        h = wp.vec3(0.0, 1.0, 0.0)
    h = wp.normalize(h)
    v = wp.cross(d, h)
    return wp.normalize(d + h * wp.tan(o[0] * 0.5 * p.div_h) + v * wp.tan(o[1] * 0.5 * p.div_v))


@wp.func
def signal_from(rho: float, retro: int, n: wp.vec3, d: wp.vec3, r: float) -> float:
    """ρ_eff·|cos θ|/r² for a surface of reflectance ρ and normal n hit at distance r along unit direction d."""
    c = wp.abs(wp.dot(n, d))
    if retro != 0:
        c2 = c * c
        rho = rho * (1.0 + RETRO_GAIN * c2 * c2)
    rr = wp.max(r, 1.0e-3)
    return rho * c / (rr * rr)


@wp.func
def surface_signal(hit: Hit, d: wp.vec3, refl: wp.array[float]) -> float:
    """Per-unit-weight, per-unit-transmittance signal of a hit (both faces return)."""
    return signal_from(refl[hit.material], wp.where((hit.material_id >> 11) & 2 != 0, 1, 0), hit.normal, d, hit.t)


@wp.func
def intensity_from(p: LidarParams, signal: float, r: float, cosv: float, gain: float) -> float:
    """Processing (RAW / NORMALIZATION / CORRECTION), mapping, per-emitter gain, clip to [0, 1], scale."""
    x = signal
    if p.processing >= 1:
        x = signal * r * r
    if p.processing == 2:
        x = x / wp.max(cosv, 1.0e-3)
    if p.nonlinear != 0:
        x = wp.sqrt(wp.max(x, 1.0e-12))
    return wp.clamp(x * gain, 0.0, 1.0) * p.scale


@wp.func
def coords_from(p: LidarParams, pw: wp.vec3, sensor: wp.transform, ref: wp.transform, custom: wp.mat44) -> wp.vec3:
    """A world point in the output frame and representation (Cartesian [m] or azimuth/elevation [deg], range [m])."""
    c = to_output(p, pw, 1, sensor, ref, custom)
    if p.spherical != 0:
        rxy = wp.sqrt(c[0] * c[0] + c[1] * c[1])
        c = wp.vec3(wp.degrees(wp.atan2(c[1], c[0])), wp.degrees(wp.atan2(c[2], rxy)), wp.length(c))
    return c


@wp.func
def firing_angles(p: LidarParams, em: EmitterTable, ticks: TickTable, ti: int, ei: int) -> wp.vec2:
    """Delivered azimuth and elevation [rad] of emitter ``ei`` fired in tick ``ti``."""
    az = em.az[ei]
    if p.rotary != 0:
        fire_s = float(wp.int64(em.fire_ns[ei])) * 1.0e-9
        phi = 2.0 * wp.pi * (ticks.rel_scan[ti] + fire_s) / p.scan_period
        phi = phi - 2.0 * wp.pi * wp.floor(phi / (2.0 * wp.pi))
        if p.ccw != 0:
            az = az + phi
        else:
            az = az - phi
    return wp.vec2(wrap_pi(az + p.start_az_offset), em.el[ei])


@wp.func
def nth_hit(geo: SceneGeo, o: wp.vec3, d: wp.vec3, depth: int, t_max: float, time: float) -> Hit:
    h = closest_hit(geo, o, d, 0.0, t_max, time)
    for _k in range(depth):
        if h.face >= 0:
            h = continue_past(geo, o, d, h.t, t_max, time)
    return h


@wp.func
def to_output(p: LidarParams, v: wp.vec3, is_point: int, sensor: wp.transform, ref: wp.transform,
              custom: wp.mat44) -> wp.vec3:
    """World point (is_point=1) or world vector (0) into the output frame."""
    if p.frame == 1:
        return v
    if p.frame == 2:
        if is_point != 0:
            return wp.transform_point(custom, v)
        return wp.transform_vector(custom, v)
    tf = sensor
    if p.compensated != 0:
        tf = ref
    if is_point != 0:
        return wp.transform_point(wp.transform_inverse(tf), v)
    return wp.quat_rotate_inv(wp.transform_get_rotation(tf), v)


@wp.func
def fired_time(p: LidarParams, em: EmitterTable, ticks: TickTable, ti: int, ei: int) -> float:
    """Firing time [s] on the scene clock (the tick's start for an instant lidar)."""
    if p.instant != 0:
        return ticks.time[0]
    return ticks.time[ti] + float(wp.int64(em.fire_ns[ei])) * 1.0e-9


@wp.kernel
def lidar_fire_kernel(
    geo: SceneGeo,
    p: LidarParams,
    em: EmitterTable,
    ticks: TickTable,
    pose_times: wp.array[float],
    poses: wp.array[wp.transform],
    ref_time: float,
    custom: wp.mat44,
    refl: wp.array[float],
    trans: wp.array[float],
    gain: wp.array[float],
    obj_hash: wp.array[wp.vec3ui],
    part_number: wp.array[wp.uint32],
    offset: int,
    out: Slots,
):
    """One firing: schedule check, pose, rays, trace, echoes, intensity, output frame (not differentiable; the
    differentiable values are recomputed from the chosen surfaces by :func:`lidar_diff_kernel`)."""
    f = wp.tid() + offset
    ne = p.num_emitters
    ti = f // ne
    e = f - ti * ne
    st = ticks.state[ti]
    ei = st * ne + e
    base = f * p.max_returns
    for r in range(p.max_returns):
        out.present[base + r] = wp.uint8(0)
        out.flags[base + r] = wp.uint8(0)
    fire_ns = wp.int64(em.fire_ns[ei])
    # step assignment key: the firing time clamped inside its tick's period
    key = wp.min(fire_ns, ticks.period_ns[ti] - wp.int64(1))
    if p.window_filter != 0:
        if key < ticks.window_lo_ns[ti] or key >= ticks.window_hi_ns[ti]:
            return
    t_fire = fired_time(p, em, ticks, ti, ei)
    time_offset = ticks.offset_ns[ti] + fire_ns
    if p.instant != 0:
        time_offset = wp.int64(0)
    if p.rotary != 0:
        phi = 2.0 * wp.pi * (ticks.rel_scan[ti] + float(fire_ns) * 1.0e-9) / p.scan_period
        phi = phi - 2.0 * wp.pi * wp.floor(phi / (2.0 * wp.pi))
        inside = phi >= p.valid_start and phi <= p.valid_end
        if p.valid_start > p.valid_end:
            inside = phi >= p.valid_start or phi <= p.valid_end
        if not inside:
            return
    ang = firing_angles(p, em, ticks, ti, ei)
    az = ang[0]
    el = ang[1]
    # identity channels for every slot of a fired emitter (invalid entries keep them too)
    for r in range(p.max_returns):
        out.present[base + r] = wp.uint8(1)
        out.time_offset_ns[base + r] = wp.int32(time_offset)
        out.emitter[base + r] = wp.uint32(e)
        out.channel[base + r] = em.channel[ei]
        out.tick[base + r] = wp.uint32(ticks.tick_id[ti])
        out.echo[base + r] = wp.uint8(r)
        out.state[base + r] = wp.uint8(st)
        out.fire[base + r] = f
    # pose at the firing time, emitter origin and direction
    sensor = sample_trajectory(pose_times, poses, t_fire)
    ref_pose = sample_trajectory(pose_times, poses, ref_time)
    d_s = sph_dir(az, el)
    o_s = wp.vec3(em.hor[ei] * wp.cos(az), em.hor[ei] * wp.sin(az), em.vert[ei])
    o = wp.transform_point(sensor, o_s)
    d = wp.normalize(wp.transform_vector(sensor, d_s))
    # echoes: (range, signal, code = sub-ray · K + depth of the representative surface, its weight·τ)
    er = vec64f()
    es = vec64f()
    ec = vec64i()
    et = vec64f()
    ne_out = int(0)
    first = miss()
    if p.ray_type == RAY_IDEALIZED:
        tau = float(1.0)
        h = closest_hit(geo, o, d, 0.0, p.far, t_fire)
        first = h
        depth = int(0)
        while h.face >= 0 and ne_out < p.max_returns:
            er[ne_out] = h.t
            es[ne_out] = tau * surface_signal(h, d, refl)
            ec[ne_out] = depth
            et[ne_out] = tau
            ne_out += 1
            tr = trans[h.material]
            if tr <= 0.0:
                break
            tau = tau * tr
            h = continue_past(geo, o, d, h.t, p.far, t_fire)
            depth += 1
    else:
        cr = vec64f()
        cs = vec64f()
        cc = vec64i()
        ct = vec64f()
        m = int(0)
        gauss = wp.where(p.ray_type == RAY_GAUSSIAN, 1, 0)
        wsum = beam_weight_sum(p.beam_n, gauss)
        for k in range(p.beam_n):
            w = beam_offset(k, p.beam_n, gauss)[2] / wsum
            dk = subray_dir(d, k, p)
            tau = float(1.0)
            h = closest_hit(geo, o, dk, 0.0, p.far, t_fire)
            depth = int(0)
            while h.face >= 0 and depth < p.hits_per_subray and m < MAX_CONTRIB:
                # insertion by range keeps the list sorted
                s = w * tau * surface_signal(h, dk, refl)
                j = m - 1
                while j >= 0 and cr[j] > h.t:
                    cr[j + 1] = cr[j]
                    cs[j + 1] = cs[j]
                    cc[j + 1] = cc[j]
                    ct[j + 1] = ct[j]
                    j -= 1
                cr[j + 1] = h.t
                cs[j + 1] = s
                cc[j + 1] = k * p.hits_per_subray + depth
                ct[j + 1] = w * tau
                m += 1
                tr = trans[h.material]
                if tr <= 0.0:
                    break
                tau = tau * tr
                h = continue_past(geo, o, dk, h.t, p.far, t_fire)
                depth += 1
        # merge into peaks: a contribution within min_echo_dist of the current peak's mean range joins it
        pr = vec64f()  # Σ s·r
        ps = vec64f()  # Σ s
        pn = vec64f()  # members
        pm = vec64f()  # Σ r (unweighted, for zero-signal peaks)
        pb = vec64f()  # strongest member's signal
        pc = vec64i()  # strongest member's code
        pt = vec64f()  # strongest member's weight·τ
        npk = int(0)
        for j in range(m):
            start_new = npk == 0
            if not start_new:
                q = npk - 1
                mean = pm[q] / pn[q]
                if ps[q] > 0.0:
                    mean = pr[q] / ps[q]
                start_new = cr[j] - mean > p.min_echo_dist
            if start_new:
                pr[npk] = 0.0
                ps[npk] = 0.0
                pn[npk] = 0.0
                pm[npk] = 0.0
                pb[npk] = -1.0
                npk += 1
            q = npk - 1
            pr[q] = pr[q] + cs[j] * cr[j]
            ps[q] = ps[q] + cs[j]
            pn[q] = pn[q] + 1.0
            pm[q] = pm[q] + cr[j]
            if cs[j] > pb[q]:
                pb[q] = cs[j]
                pc[q] = cc[j]
                pt[q] = ct[j]
        # strongest first, capped at max_returns
        for k in range(p.max_returns):
            best = int(-1)
            for q in range(npk):
                if pn[q] > 0.0 and (best < 0 or ps[q] > ps[best]):
                    best = q
            if best >= 0:
                mean = pm[best] / pn[best]
                if ps[best] > 0.0:
                    mean = pr[best] / ps[best]
                er[ne_out] = mean
                es[ne_out] = ps[best]
                ec[ne_out] = pc[best]
                et[ne_out] = pt[best]
                ne_out += 1
                pn[best] = 0.0
    # outputs
    rng = wp.rand_init(p.seed, f + ticks.scan[ti] * 7919)
    win = difference_window(pose_times[0], pose_times[pose_times.shape[0] - 1], t_fire, 1.0e-3)
    sa = sample_trajectory(pose_times, poses, win[0])
    sb = sample_trajectory(pose_times, poses, win[1])
    for r in range(ne_out):
        slot = base + r
        code = ec[r]
        k = int(0)
        depth = code
        if p.ray_type != RAY_IDEALIZED:
            k = code // p.hits_per_subray
            depth = code - k * p.hits_per_subray
        dk = subray_dir(d, k, p)
        h = first
        if p.ray_type != RAY_IDEALIZED or r > 0:
            h = nth_hit(geo, o, dk, depth, p.far, t_fire)
        if h.face < 0:
            continue
        rng_m = er[r]
        if p.ray_type == RAY_IDEALIZED:
            rng_m = hit_distance(geo, h, o, d)  # from the face's vertices, as the differentiable pass does
        signal = es[r]
        inten = intensity_from(p, signal, rng_m, wp.abs(wp.dot(h.normal, dk)), gain[e])
        detected = signal >= p.detect_threshold and rng_m >= p.near and rng_m <= p.far
        noise = wp.vec3(0.0, 0.0, 0.0)
        if p.range_noise > 0.0:
            noise[0] = p.range_noise * wp.randn(rng)
        if p.az_noise > 0.0 or p.el_noise > 0.0:
            noise[1] = p.az_noise * wp.randn(rng)
            noise[2] = p.el_noise * wp.randn(rng)
        rep = rng_m + em.dcorr[ei] + noise[0]
        if p.range_res > 0.0:
            rep = wp.round(rep / p.range_res) * p.range_res
        pw = o + wp.transform_vector(sensor, sph_dir(az + noise[1], el + noise[2])) * rep
        flags = wp.uint8(0)
        if detected:
            flags = FLAG_VALID
            if ticks.tick_id[ti] == 0 and (p.rotary != 0 or fire_ns == wp.int64(em.fire_ns[st * ne])):
                flags = flags | FLAG_NEW_SCAN
        # velocity of the hit point relative to the sensor, in the sensor axes at the firing pose
        vw = point_velocity(geo, h)
        pa = wp.transform_point(wp.transform_inverse(sa), h.point + vw * (win[0] - t_fire))
        pb2 = wp.transform_point(wp.transform_inverse(sb), h.point + vw * (win[1] - t_fire))
        v_s = (pb2 - pa) / (win[1] - win[0])
        v_w = wp.transform_vector(sensor, v_s)
        out.flags[slot] = flags
        out.coords[slot] = coords_from(p, pw, sensor, ref_pose, custom)
        out.intensity[slot] = inten
        out.material_id[slot] = wp.uint32(h.material_id)
        oh = obj_hash[h.object_id]
        out.object_id[slot] = wp.vec4ui(oh[0], oh[1], oh[2], part_number[h.part])
        out.normal[slot] = to_output(p, h.normal, 0, sensor, ref_pose, custom)
        out.velocity[slot] = to_output(p, v_w, 0, sensor, ref_pose, custom)
        out.semantic[slot] = h.semantic
        out.face[slot] = h.face
        out.inst[slot] = h.instance
        out.material[slot] = h.material
        out.subray[slot] = k
        out.tau[slot] = et[r]
        out.rep_t[slot] = h.t
        out.rep_s[slot] = et[r] * surface_signal(h, dk, refl)
        out.peak_r[slot] = er[r]
        out.peak_s[slot] = es[r]
        out.noise[slot] = noise


@wp.kernel
def lidar_diff_kernel(
    geo: SceneGeo,
    p: LidarParams,
    em: EmitterTable,
    ticks: TickTable,
    pose_times: wp.array[float],
    poses: wp.array[wp.transform],
    ref_time: float,
    custom: wp.mat44,
    refl: wp.array[float],
    gain: wp.array[float],
    slots: Slots,
    src: wp.array[wp.int32],
    coords: wp.array2d[float],
    intensity: wp.array[float],
):
    """Recompute the Coordinates and Intensity of delivered returns from their surfaces, differentiably w.r.t. the
    sensor poses, emitter angles, per-emitter gain, material reflectance and mesh vertices. The surface (face,
    instance) comes from :func:`lidar_fire_kernel`: the BVH query only picks it. Values equal the forward pass's.

    Beam echoes carry the representative surface's change: range = forward range + Δ(representative distance),
    signal = forward signal · (representative signal / its forward value).
    """
    j = wp.tid()
    i = src[j]
    f = slots.fire[i]
    ne = p.num_emitters
    ti = f // ne
    e = f - ti * ne
    ei = ticks.state[ti] * ne + e
    t_fire = fired_time(p, em, ticks, ti, ei)
    ang = firing_angles(p, em, ticks, ti, ei)
    sensor = sample_trajectory(pose_times, poses, t_fire)
    ref_pose = sample_trajectory(pose_times, poses, ref_time)
    d_s = sph_dir(ang[0], ang[1])
    o_s = wp.vec3(em.hor[ei] * wp.cos(ang[0]), em.hor[ei] * wp.sin(ang[0]), em.vert[ei])
    o = wp.transform_point(sensor, o_s)
    d = wp.normalize(wp.transform_vector(sensor, d_s))
    dk = subray_dir(d, slots.subray[i], p)
    h = miss()
    h.face = slots.face[i]
    h.instance = slots.inst[i]
    h.time = t_fire
    tri = hit_triangle(geo, h)
    n = wp.normalize(wp.cross(tri[1] - tri[0], tri[2] - tri[0]))
    t_rep = hit_distance(geo, h, o, dk)
    mid = slots.material[i]
    retro = int(0)
    if (geo.material_code[mid] >> 11) & 2 != 0:
        retro = 1
    s_rep = slots.tau[i] * signal_from(refl[mid], retro, n, dk, t_rep)
    rng_m = t_rep
    signal = s_rep
    if p.ray_type != RAY_IDEALIZED:
        rng_m = slots.peak_r[i] + (t_rep - slots.rep_t[i])
        signal = slots.peak_s[i] * s_rep / wp.max(slots.rep_s[i], 1.0e-30)
    noise = slots.noise[i]
    rep = rng_m + em.dcorr[ei] + noise[0]
    if p.range_res > 0.0:
        rep = wp.round(rep / p.range_res) * p.range_res
    pw = o + wp.transform_vector(sensor, sph_dir(ang[0] + noise[1], ang[1] + noise[2])) * rep
    c = coords_from(p, pw, sensor, ref_pose, custom)
    coords[0, j] = c[0]
    coords[1, j] = c[1]
    coords[2, j] = c[2]
    intensity[j] = intensity_from(p, signal, rng_m, wp.abs(wp.dot(n, dk)), gain[e])


@wp.kernel
def keep_mask_kernel(present: wp.array[wp.uint8], flags: wp.array[wp.uint8], include_invalid: int,
                     offset: int, keep: wp.array[wp.int32]):
    i = wp.tid() + offset
    k = int(0)
    if include_invalid != 0:
        if present[i] != wp.uint8(0):
            k = 1
    elif (flags[i] & FLAG_VALID) != wp.uint8(0):
        k = 1
    keep[i] = k


@wp.kernel
def compact_kernel(
    src: Slots,
    keep: wp.array[wp.int32],
    index: wp.array[wp.int32],
    offset: int,
    flags: wp.array[wp.uint8],
    coords: wp.array2d[float],
    intensity: wp.array[float],
    time_offset_ns: wp.array[wp.int32],
    emitter: wp.array[wp.uint32],
    channel: wp.array[wp.uint32],
    tick: wp.array[wp.uint32],
    echo: wp.array[wp.uint8],
    state: wp.array[wp.uint8],
    material_id: wp.array[wp.uint32],
    object_id: wp.array2d[wp.uint32],
    normal: wp.array2d[float],
    velocity: wp.array2d[float],
    semantic: wp.array[wp.int32],
    src_slot: wp.array[wp.int32],
):
    i = wp.tid() + offset
    if keep[i] == 0:
        return
    j = index[i] - 1  # inclusive scan
    src_slot[j] = i
    flags[j] = src.flags[i]
    c = src.coords[i]
    n = src.normal[i]
    v = src.velocity[i]
    o = src.object_id[i]
    for a in range(3):
        coords[a, j] = c[a]
        normal[j, a] = n[a]
        velocity[j, a] = v[a]
    for a in range(4):
        object_id[j, a] = o[a]
    intensity[j] = src.intensity[i]
    time_offset_ns[j] = src.time_offset_ns[i]
    emitter[j] = src.emitter[i]
    channel[j] = src.channel[i]
    tick[j] = src.tick[i]
    echo[j] = src.echo[i]
    state[j] = src.state[i]
    material_id[j] = src.material_id[i]
    semantic[j] = src.semantic[i]
