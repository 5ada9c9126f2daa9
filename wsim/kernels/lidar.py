"""Lidar physics on the device: one ``@wp.func`` per physical step, composed by two kernels.

The steps, in the order a firing runs them (RGL's orthogonal steps):

1. schedule — :func:`schedule`: which emitter of which tick, its firing time and delivered angles, whether it fires
   (step window, azimuth window);
2. firing pose — :func:`sensor_pose`, :func:`firing_ray`: the sensor pose at the firing time (kept as trajectory key +
   displacement for sensor-relative arithmetic), the emitter's origin and direction;
3. beam sub-rays — :func:`beam_offset`, :func:`subray_dir`: the footprint's sub-rays and their weights;
4. surface walk — :func:`deliver_idealized`, :func:`walk_beam`: the surfaces along each (sub-)ray, continuing through
   transmissive materials;
5. echo merge — :func:`ranked_echoes` (:func:`merge_peaks` for the gradients): beam contributions merged into
   peaks, strongest first;
6. detection and intensity — :func:`echo_surface`, :func:`return_noise` (keyed by the return, not the launch),
   :func:`detection_flags`, :func:`intensity_from`;
7. output frame — :func:`output_frame`, :func:`measured_point`, :func:`coords_from`, :func:`to_output`,
   :func:`relative_velocity`;
8. slot write — :func:`deliver_hit` (with steps 6–7), :func:`write_blank`: the delivered returns only, packed by
   batch of firings; the compaction adds the identity channels (:func:`firing_identity`).

:func:`lidar_fire_kernel` runs all of them for one firing (not differentiable: it picks the surfaces);
:mod:`wsim.kernels.lidar_diff` recomputes Coordinates and Intensity of the delivered returns from those surfaces with
the same step functions. Every firing is independent; nothing is written that a backward pass would need again.
"""

import warp as wp

# re-exported: the host side reads the tables and records through this module
from .lidar_types import (  # noqa: F401
    LidarParams, EmitterTable, TickTable, Slots, Firing, FiringRay, Contributions, Peaks, Echoes, EchoSurfaces,
    OutputFrame,
    FiringPose, Members, MAX_CONTRIB, MAX_ECHOES, vec64f, vec64i, vec8f, vec8i, FLAG_VALID, FLAG_NEW_SCAN, RETRO_GAIN,
    RAY_IDEALIZED, RAY_GAUSSIAN, RAY_UNIFORM, FRAME_SENSOR, FRAME_WORLD, FRAME_CUSTOM, WANT_NORMAL, WANT_VELOCITY,
    WANT_OBJECT, WANT_MATERIAL, WANT_SEMANTIC, WANT_DIFF,
)
from .pose import difference_window, key_segment, quat_slerp_shortest
from .packet import mat64x3, mat64x4, vec64f, wide_packet, wide_packet_from
from .widebvh import wide_slot
from .trace import (HIT_EPS_ABS, HIT_EPS_REL, PACKET_COS, PACKET_REACH, Hit, Listed, SceneGeo, closest_hit,
                    closest_hit_beyond, closest_hit_given, cone_instances, continue_past, hit_distance, hit_record,
                    listed_packet, miss, nearest_hit, point_velocity, shading_normal, static_hit)


# ---------------------------------------------------------------------------------------------- small helpers
INV_2PI = wp.constant(0.15915494309189535)  # 1 / (2π)


@wp.func(inline=True)
def unit_near(v: wp.vec3) -> wp.vec3:
    """``v`` normalised when it is already unit to within float32 rounding (a rotated unit vector): one Newton step
    of 1/|v|, v·(3 − |v|²)/2, in place of a square root and a division (the same to an ulp, differentiable with
    normalisation's Jacobian at unit length); any other ``v`` through :func:`wp.normalize`."""
    q = wp.dot(v, v)
    if wp.abs(q - 1.0) > 1.0e-4:
        return wp.normalize(v)
    return v * (1.5 - 0.5 * q)


@wp.func(inline=True)
def wrap_pi(a: float) -> float:
    """Angle wrapped to (−π, π] (by the reciprocal of 2π: no division on the firing's path)."""
    twopi = 2.0 * wp.pi
    r = a - twopi * wp.floor(a * INV_2PI)  # [0, 2π)
    if r > wp.pi:
        r = r - twopi
    return r


@wp.func(inline=True)
def sph_dir(az: float, el: float) -> wp.vec3:
    ce = wp.cos(el)
    return wp.vec3(ce * wp.cos(az), ce * wp.sin(az), wp.sin(el))


# ------------------------------------------------------------------------------------------------ 1. schedule
@wp.func(inline=True)
def spin_angle(p: LidarParams, ticks: TickTable, ti: int, fire_ns: wp.int64) -> float:
    """Firing angle φ [rad] in [0, 2π) of a rotary head, from the scan start to the firing: the fraction of a turn
    (time × scan rate, no division) times 2π."""
    turns = (ticks.rel_scan[ti] + float(fire_ns) * 1.0e-9) * p.scan_rate
    return 2.0 * wp.pi * (turns - wp.floor(turns))


@wp.func(inline=True)
def fires_in_window(p: LidarParams, ticks: TickTable, ti: int, fire_ns: wp.int64, phi: float) -> wp.int32:
    """1 when the firing lies in this step's window (partialOutputs) and, rotary, in the azimuth window."""
    # step assignment key: the firing time clamped inside its tick's period
    key = wp.min(fire_ns, ticks.period_ns[ti] - wp.int64(1))
    if p.window_filter != 0:
        if key < ticks.window_lo_ns[ti] or key >= ticks.window_hi_ns[ti]:
            return 0
    if p.rotary != 0:
        inside = phi >= p.valid_start and phi <= p.valid_end
        if p.valid_start > p.valid_end:
            inside = phi >= p.valid_start or phi <= p.valid_end
        if not inside:
            return 0
    return 1


@wp.func(inline=True)
def firing_phase(p: LidarParams, ticks: TickTable, ti: int, fire_ns: wp.int64):
    """What the azimuth and the windows make of a firing at delay ``fire_ns`` [ns] in tick row ``ti``, the same for
    every emitter firing then (:func:`firing_pose_kernel` keeps it per tick and firing delay): the delivered
    azimuth less the emitter's table azimuth [rad], CW ``wrap(startAzimuthOffset − φ)``, CCW
    ``wrap(startAzimuthOffset + φ)``, solid state ``wrap(startAzimuthOffset)``; and whether it fires."""
    phi = spin_angle(p, ticks, ti, fire_ns)
    fires = fires_in_window(p, ticks, ti, fire_ns, phi)
    ph = p.start_az_offset
    if p.rotary != 0:
        if p.ccw != 0:
            ph = ph + phi
        else:
            ph = ph - phi
    return wrap_pi(ph), fires


@wp.func(inline=True)
def firing_of(p: LidarParams, em: EmitterTable, ticks: TickTable, f: int) -> Firing:
    """Firing ``f``'s tick, emitter and state, firing time, TimeOffsetNs and elevation (its azimuth and whether it
    fires: :func:`delivered_azimuth`, :func:`firing_phase`)."""
    fr = Firing()
    ne = p.num_emitters
    fr.index = f
    fr.tick = f // ne
    fr.emitter = f - fr.tick * ne
    fr.state = ticks.state[fr.tick]
    fr.table = fr.state * ne + fr.emitter
    fr.fire_ns = wp.int64(em.fire_ns[fr.table])
    fr.time = ticks.time[fr.tick] + float(fr.fire_ns) * 1.0e-9
    fr.offset_ns = ticks.offset_ns[fr.tick] + fr.fire_ns
    if p.instant != 0:
        fr.time = ticks.time[0]
        fr.offset_ns = wp.int64(0)
    fr.el = em.el[fr.table]
    return fr


@wp.func(inline=True)
def delivered_azimuth(em: EmitterTable, fr: Firing, phase: float) -> float:
    """The delivered azimuth [rad] in (−π, π]: the emitter's table azimuth plus the firing's phase
    (:func:`firing_phase`), wrapped when the sum leaves (−π, π]."""
    a = em.az[fr.table] + phase
    if a > wp.pi or a <= -wp.pi:
        a = wrap_pi(a)
    return a


@wp.func(inline=True)
def schedule(p: LidarParams, em: EmitterTable, ticks: TickTable, f: int) -> Firing:
    """Firing ``f``: its tick, emitter and state, firing time, TimeOffsetNs, delivered angles, and whether it fires
    (:func:`firing_of`, :func:`firing_phase`, :func:`delivered_azimuth`; the kernels with a firing-pose table take
    the phase from it, the same bits)."""
    fr = firing_of(p, em, ticks, f)
    phase, fires = firing_phase(p, ticks, fr.tick, fr.fire_ns)
    fr.fires = fires
    fr.phase = phase
    fr.az = delivered_azimuth(em, fr, phase)
    return fr


@wp.func(inline=True)
def scheduled(em: EmitterTable, fr: Firing, fp: FiringPose) -> Firing:
    """:func:`schedule`'s Firing from :func:`firing_of`'s and the firing-pose table's phase."""
    out = fr
    out.fires = fp.fires
    out.phase = fp.phase
    out.az = delivered_azimuth(em, fr, fp.phase)
    return out


# ------------------------------------------------------------------------------------------- 2. firing pose
@wp.func(inline=True)
def sensor_pose(times: wp.array[float], poses: wp.array[wp.transform], t: float):
    """The sensor pose at time t [s] — translation lerp and shortest-arc slerp between the keys around t, clamped
    outside them (the interpolation of :func:`wsim.kernels.pose.sample_trajectory`) — with the key i of its segment
    and the in-segment displacement T(t) − T(key i) [m], for sensor-relative arithmetic. The translation is
    T(key i) + displacement: one rounding at the key's magnitude."""
    return pose_in_segment(times, poses, t, key_segment(times, 0, times.shape[0], t))


@wp.func(inline=True)
def sensor_pose_near(times: wp.array[float], poses: wp.array[wp.transform], t: float, hint: int):
    """:func:`sensor_pose` where t most likely lies in the key segment ``hint`` (a time a millisecond from one
    whose segment is known): that segment when it holds t strictly inside the trajectory, else the search."""
    n = times.shape[0]
    if hint >= 0 and hint + 1 < n:
        if t > times[0] and t < times[n - 1] and times[hint] <= t and t < times[hint + 1]:
            return pose_in_segment(times, poses, t, wp.vec2i(hint, 1))
    return pose_in_segment(times, poses, t, key_segment(times, 0, n, t))


@wp.func(inline=True)
def pose_in_segment(times: wp.array[float], poses: wp.array[wp.transform], t: float, seg: wp.vec2i):
    """:func:`sensor_pose` in the key segment ``seg`` (:func:`wsim.kernels.pose.key_segment`)."""
    i = seg[0]
    if seg[1] == 0:
        return poses[i], i, wp.vec3(0.0, 0.0, 0.0)
    s = (t - times[i]) / (times[i + 1] - times[i])
    t0 = wp.transform_get_translation(poses[i])
    d = (wp.transform_get_translation(poses[i + 1]) - t0) * s
    q = quat_slerp_shortest(wp.transform_get_rotation(poses[i]), wp.transform_get_rotation(poses[i + 1]), s)
    return wp.transform(t0 + d, q), i, d


@wp.func(inline=True)
def displacement(poses: wp.array[wp.transform], i0: int, d0: wp.vec3, i1: int, d1: wp.vec3) -> wp.vec3:
    """T(t1) − T(t0) from two :func:`sensor_pose` keys and displacements: a key difference (exact between nearby
    float32 keys) plus in-segment offsets, never the difference of two world positions (which kilometres from the
    origin carry float32 rounding of about 1 mm)."""
    return (wp.transform_get_translation(poses[i1]) - wp.transform_get_translation(poses[i0])) + (d1 - d0)


@wp.func(inline=True)
def firing_ray(em: EmitterTable, fr: Firing, pose_times: wp.array[float], poses: wp.array[wp.transform]) -> FiringRay:
    """The sensor pose at the firing time (rolling) and the emitter's ray; the horizontal offset is radial along
    the emitter's azimuth (it turns with the head), the vertical one along z."""
    sensor, key, offset = sensor_pose(pose_times, poses, fr.time)
    return emitter_ray(em, fr, sensor, key, offset, poses)


@wp.func(inline=True)
def direction_cs(t: wp.vec4, phase_cs: wp.vec2) -> wp.vec4:
    """(cos, sin) of the delivered azimuth and (cos, sin) of the elevation from the emitter's (``t``:
    :class:`EmitterTable` ``trig``) and the firing phase's (cos, sin): the angle sum, no trigonometry a firing."""
    return wp.vec4(t[0] * phase_cs[0] - t[1] * phase_cs[1], t[1] * phase_cs[0] + t[0] * phase_cs[1], t[2], t[3])


@wp.func(inline=True)
def emitter_cs(em: EmitterTable, fr: Firing) -> wp.vec4:
    """:func:`direction_cs` with the emitter's and the phase's cosines and sines computed here (the
    differentiable pass: the same bits as :func:`emitter_trig_kernel`'s table and the firing-pose table's)."""
    az = em.az[fr.table]
    t = wp.vec4(wp.cos(az), wp.sin(az), wp.cos(fr.el), wp.sin(fr.el))
    return direction_cs(t, wp.vec2(wp.cos(fr.phase), wp.sin(fr.phase)))


@wp.func(inline=True)
def emitter_ray(em: EmitterTable, fr: Firing, sensor: wp.transform, key: int, offset: wp.vec3,
                poses: wp.array[wp.transform]) -> FiringRay:
    """The emitter's ray from the sensor pose at the firing (:func:`sensor_pose`'s pose, key and displacement)."""
    return emitter_ray_cs(em, fr, emitter_cs(em, fr), sensor, key, offset, poses)


@wp.func(inline=True)
def emitter_ray_cs(em: EmitterTable, fr: Firing, cs: wp.vec4, sensor: wp.transform, key: int, offset: wp.vec3,
                   poses: wp.array[wp.transform]) -> FiringRay:
    """:func:`emitter_ray` given the delivered direction's (cos az, sin az, cos el, sin el) (:func:`direction_cs`)."""
    ray = FiringRay()
    ray.sensor = sensor
    ray.key = key
    ray.offset = offset
    ray.dir_s = wp.vec3(cs[2] * cs[0], cs[2] * cs[1], cs[3])  # sph_dir
    ray.cos_el = cs[2]
    hor = em.hor[fr.table]
    ray.origin_s = wp.vec3(hor * cs[0], hor * cs[1], em.vert[fr.table])
    # key translation + (in-segment displacement + rotated offset): one rounding at the key's magnitude
    rel = offset + wp.transform_vector(sensor, ray.origin_s)
    ray.origin = wp.transform_get_translation(poses[key]) + rel
    ray.dir = unit_near(wp.transform_vector(sensor, ray.dir_s))
    return ray


# ----------------------------------------------------------------------------------------- 3. beam sub-rays
@wp.func(inline=True)
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


@wp.func(inline=True)
def beam_weight_sum(n: int, gaussian: int) -> float:
    s = float(0.0)
    for k in range(n):
        s += beam_offset(k, n, gaussian)[2]
    return s


@wp.kernel
def emitter_trig_kernel(az: wp.array[float], el: wp.array[float], out: wp.array[wp.vec4]):
    """Each emitter-table entry's (cos az, sin az, cos el, sin el) (:class:`EmitterTable` ``trig``)."""
    i = wp.tid()
    out[i] = wp.vec4(wp.cos(az[i]), wp.sin(az[i]), wp.cos(el[i]), wp.sin(el[i]))


@wp.kernel
def beam_table_kernel(p: LidarParams, out: wp.array[wp.vec3]):
    """The beam's sub-rays once per render: (tan of the horizontal offset angle, tan of the vertical one, weight
    normalised by the sum of weights) of sub-ray k (the table :func:`subray_dir` and :func:`walk_beam` read)."""
    k = wp.tid()
    gauss = wp.where(p.ray_type == RAY_GAUSSIAN, 1, 0)
    o = beam_offset(k, p.beam_n, gauss)
    out[k] = wp.vec3(wp.tan(o[0] * 0.5 * p.div_h), wp.tan(o[1] * 0.5 * p.div_v), o[2] / beam_weight_sum(p.beam_n, gauss))


@wp.func(inline=True)
def beam_h(d: wp.vec3) -> wp.vec3:
    """The beam footprint's horizontal axis around centre direction d (unit): up × d (y when d is vertical)."""
    up = wp.vec3(0.0, 0.0, 1.0)
    h = wp.cross(up, d)
    if wp.length(h) < 1.0e-6:
        h = wp.vec3(0.0, 1.0, 0.0)
    return wp.normalize(h)


@wp.func(inline=True)
def subray_in(d: wp.vec3, h: wp.vec3, k: int, p: LidarParams) -> wp.vec3:
    """Direction of beam sub-ray k around the centre direction d, the footprint's horizontal axis h known."""
    if p.ray_type == RAY_IDEALIZED or k == 0:
        return d
    b = p.beam[k]
    return wp.normalize(d + h * b[0] + wp.cross(d, h) * b[1])


@wp.func(inline=True)
def subray_dir(d: wp.vec3, k: int, p: LidarParams) -> wp.vec3:
    """Direction of beam sub-ray k around the centre direction d (unit)."""
    if p.ray_type == RAY_IDEALIZED or k == 0:
        return d
    return subray_in(d, beam_h(d), k, p)


# ----------------------------------------------------------------------------------------- 4. surface walk
@wp.func(inline=True)
def signal_from(rho: float, retro: int, n: wp.vec3, d: wp.vec3, r: float) -> float:
    """ρ_eff·|cos θ|/r² for a surface of reflectance ρ and normal n hit at distance r along unit direction d."""
    c = wp.abs(wp.dot(n, d))
    if retro != 0:
        c2 = c * c
        rho = rho * (1.0 + RETRO_GAIN * c2 * c2)
    rr = wp.max(r, 1.0e-3)
    return rho * c / (rr * rr)


@wp.func(inline=True)
def surface_signal(geo: SceneGeo, p: LidarParams, hit: Hit, d: wp.vec3, refl: wp.array[float]) -> float:
    """Per-unit-weight, per-unit-transmittance signal of a hit (both faces return)."""
    return signal_from(refl[hit.material], wp.where((hit.material_id >> 11) & 2 != 0, 1, 0),
                       signal_normal(geo, p, hit), d, hit.t)


@wp.func(inline=True)
def signal_normal(geo: SceneGeo, p: LidarParams, hit: Hit) -> wp.vec3:
    """The normal of the incidence angle in a return's signal and intensity: the smooth (interpolated vertex)
    normal when ``p.smooth``, else the face's."""
    if p.smooth != 0:
        return shading_normal(geo, hit)
    return hit.normal


@wp.func(inline=True)
def nth_hit(geo: SceneGeo, o: wp.vec3, d: wp.vec3, depth: int, t_max: float, time: float) -> Hit:
    h = closest_hit(geo, o, d, 0.0, t_max, time)
    for _k in range(depth):
        if h.face >= 0:
            h = continue_past(geo, o, d, h.t, t_max, time)
    return h


@wp.func(inline=True)
def walk_beam(geo: SceneGeo, p: LidarParams, ray: FiringRay, time: float, refl: wp.array[float],
              trans: wp.array[float]) -> Contributions:
    """Every sub-ray's surfaces (up to hits_per_subray each, through transmissive ones) as contributions
    w·τ·ρ·|cos θ|/r², sorted by range (equal ranges in arrival order): :func:`walk_beam_rays`, or with
    ``p.packet`` the packet walk (:func:`_walk_packets`), the same contributions."""
    if p.packet != 0:
        listed = cone_instances(geo, ray.origin, ray.dir, p.beam_tan)  # the instances the beam may meet
        if listed.n == 0:
            return walk_packets_static(geo, p, ray, time, refl, trans, listed)
        return walk_packets_listed(geo, p, ray, time, refl, trans, listed)
    return walk_beam_rays(geo, p, ray, time, refl, trans)


@wp.func(inline=True)
def walk_beam_rays(geo: SceneGeo, p: LidarParams, ray: FiringRay, time: float, refl: wp.array[float],
                   trans: wp.array[float]) -> Contributions:
    """:func:`walk_beam` sub-ray by sub-ray, each surface after the one before it, kept sorted by range
    (insertion)."""
    hps = p.hits_per_subray
    cr = vec64f()
    cs = vec64f()
    cc = vec64i()
    ct = vec64f()
    face = vec64i()
    inst = vec64i()
    su = vec64f()
    sv = vec64f()
    nx = vec64f()
    ny = vec64f()
    nz = vec64f()
    m = int(0)
    bh = beam_h(ray.dir)
    for k in range(p.beam_n):
        w = p.beam[k][2]
        dk = subray_in(ray.dir, bh, k, p)
        tau = float(1.0)
        h = closest_hit(geo, ray.origin, dk, 0.0, p.far, time)
        depth = int(0)
        while h.face >= 0 and depth < hps and m < MAX_CONTRIB:
            code = k * hps + depth
            s = w * tau * surface_signal(geo, p, h, dk, refl)
            j = m - 1
            while j >= 0 and cr[j] > h.t:
                cr[j + 1] = cr[j]
                cs[j + 1] = cs[j]
                cc[j + 1] = cc[j]
                ct[j + 1] = ct[j]
                j -= 1
            cr[j + 1] = h.t
            cs[j + 1] = s
            cc[j + 1] = code
            ct[j + 1] = w * tau
            m += 1
            face[code] = h.face
            inst[code] = h.instance
            su[code] = h.u
            sv[code] = h.v
            nx[code] = h.normal[0]
            ny[code] = h.normal[1]
            nz[code] = h.normal[2]
            tr = trans[h.material]
            if tr <= 0.0 or depth + 1 >= hps:  # opaque, or the sub-ray's last surface
                break
            tau = tau * tr
            h = continue_past(geo, ray.origin, dk, h.t, p.far, time)
            depth += 1
    c = Contributions()
    c.m = m
    c.r = cr
    c.s = cs
    c.code = cc
    c.tau = ct
    c.face = face
    c.inst = inst
    c.u = su
    c.v = sv
    c.nx = nx
    c.ny = ny
    c.nz = nz
    return c


def _walk_packets(listing: bool, echoes: bool):
    """:func:`walk_beam` depth by depth (CPU, static scene on the 8-wide BVH): at each depth the sub-rays still
    going (all at depth 0, then those that went through a transmissive surface, from just past it) traverse the
    static tree as one packet (:func:`wsim.kernels.packet.wide_packet` over per-ray ranges: each ray's own query,
    bit for bit) and the instances listed once for the beam's cone as packets
    (:func:`wsim.kernels.trace.listed_packet`; too many to list: ray by ray through the top level); a sub-ray on
    the static triangle of the sub-ray before it takes that one's record with its own t, point, u and v (most of a
    beam's sub-rays meet one triangle); then the contributions are inserted in :func:`walk_beam`'s order, so equal
    ranges rank alike. The same bits as :func:`walk_beam`. ``listed``: :func:`wsim.kernels.trace.cone_instances` for
    the beam.

    Variants (Warp declares and zeroes every vector a function assigns, once per call, so each keeps only the ones
    it needs): ``listing`` False for a beam that lists no instance (its static answers alone, nothing kept for the
    instances), True otherwise; ``echoes`` True returns :func:`echoes_of` the contributions (the fire kernel), False
    the :class:`Contributions` (the differentiable pass). One call site per traversal, the records kept by code,
    the ranges, signals and weights sorted in place."""

    def walk(geo: SceneGeo, p: LidarParams, ray: FiringRay, time: float, refl: wp.array[float],
             trans: wp.array[float], listed: Listed):
        hps = p.hits_per_subray
        n = p.beam_n
        dirs = mat64x3()
        lo = vec64f()
        hi = vec64f()
        tau = vec64f()
        found = vec64i()  # surfaces found so far per sub-ray
        if wp.static(listing):
            going = vec64i()  # 1: the sub-ray goes on at this depth
        r_of = vec64f()  # by code k·hps + depth: range, signal, weight·τ ...
        s_of = vec64f()
        t_of = vec64f()
        fc = vec64i()  # ... and the surface: face, instance, barycentrics, unit normal
        ic = vec64i()
        uc = vec64f()
        vc = vec64f()
        xc = vec64f()
        yc = vec64f()
        zc = vec64f()
        bh = beam_h(ray.dir)
        for k in range(n):
            dk = subray_in(ray.dir, bh, k, p)
            dirs[k, 0] = dk[0]
            dirs[k, 1] = dk[1]
            dirs[k, 2] = dk[2]
            hi[k] = p.far
            tau[k] = 1.0
        for depth in range(hps):
            res = wide_packet(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2,
                              geo.wide_fid, ray.origin, dirs, lo, hi, n)
            if wp.static(listing):
                for k in range(n):
                    going[k] = wp.where(hi[k] > 0.0, 1, 0)
                lt, lf, li, lu, lv, lnx, lny, lnz = listed_packet(geo, ray.origin, dirs, n, lo, going, p.far, time,
                                                                  res, listed)
            more = int(0)
            # the static triangle (slot) of the sub-ray before and its record: a beam's sub-rays mostly meet one
            # triangle, whose record differs only in t, point, u and v (the same bits as static_hit makes them)
            c_slot = int(-1)
            c_h = miss()
            for k in range(n):
                if found[k] == depth and hi[k] > 0.0:
                    dk = wp.vec3(dirs[k, 0], dirs[k, 1], dirs[k, 2])
                    w = wp.vec4(res[k, 0], res[k, 1], res[k, 2], res[k, 3])
                    h = miss()
                    if wp.static(not listing):
                        if w[1] >= 0.0 and wide_slot(w[1]) == c_slot:  # (compared as ints: no denormal rule)
                            h = c_h
                            h.t = lo[k] + w[0]
                            h.point = ray.origin + dk * h.t
                            h.u = w[2]
                            h.v = w[3]
                        else:
                            h = static_hit(geo, ray.origin, dk, time, lo[k], p.far, w)
                            c_h = h
                            c_slot = wp.where(w[1] >= 0.0, wide_slot(w[1]), -1)
                    elif listed.n < 0:
                        h = closest_hit_given(geo, ray.origin, dk, lo[k], p.far, time, w)
                    else:
                        h = nearest_hit(geo, ray.origin, dk, time, lt[k], lf[k], li[k], lu[k], lv[k],
                                        wp.vec3(lnx[k], lny[k], lnz[k]))
                    hi[k] = 0.0  # done, unless it goes on through this surface
                    lo[k] = 0.0
                    if h.face >= 0:
                        wt = p.beam[k][2]
                        code = k * hps + depth
                        r_of[code] = h.t
                        s_of[code] = wt * tau[k] * surface_signal(geo, p, h, dk, refl)
                        t_of[code] = wt * tau[k]
                        fc[code] = h.face
                        ic[code] = h.instance
                        uc[code] = h.u
                        vc[code] = h.v
                        xc[code] = h.normal[0]
                        yc[code] = h.normal[1]
                        zc[code] = h.normal[2]
                        found[k] = depth + 1
                        tr = trans[h.material]
                        if tr > 0.0 and depth + 1 < hps:  # from just past it, as continue_past
                            tau[k] = tau[k] * tr
                            lo[k] = h.t + HIT_EPS_ABS + HIT_EPS_REL * h.t
                            hi[k] = p.far
                            more = 1
            if more == 0:
                break
        # in walk_beam's arrival order (ascending code), each inserted by range into the sorted ones before it: the
        # sorted prefix never reaches past the code read, so it is built in place
        cc = vec64i()
        m = int(0)
        for k in range(n):
            for depth in range(found[k]):
                code = k * hps + depth
                if m < MAX_CONTRIB:
                    r = r_of[code]
                    sg = s_of[code]
                    wt = t_of[code]
                    j = m - 1
                    while j >= 0 and r_of[j] > r:
                        r_of[j + 1] = r_of[j]
                        s_of[j + 1] = s_of[j]
                        cc[j + 1] = cc[j]
                        t_of[j + 1] = t_of[j]
                        j -= 1
                    r_of[j + 1] = r
                    s_of[j + 1] = sg
                    cc[j + 1] = code
                    t_of[j + 1] = wt
                    m += 1
        if wp.static(echoes):
            ech = ranked_of(p, m, r_of, s_of, cc, t_of)
            return ech, surfaces_of(ech, fc, ic, uc, vc, xc, yc, zc)
        else:
            c = Contributions()
            c.m = m
            c.r = r_of
            c.s = s_of
            c.code = cc
            c.tau = t_of
            c.face = fc
            c.inst = ic
            c.u = uc
            c.v = vc
            c.nx = xc
            c.ny = yc
            c.nz = zc
            return c

    name = "walk_packets_" + ("listed" if listing else "static") + ("_echoes" if echoes else "")
    return wp.func(walk, name=name, inline=True)


walk_packets_static = _walk_packets(False, False)
walk_packets_listed = _walk_packets(True, False)


# ------------------------------------------------------------------------------------------- 5. echo merge
@wp.func(inline=True)
def peak_mean(sum_sr: float, sum_s: float, count: float, sum_r: float) -> float:
    """A peak's range: the signal-weighted mean of its members' ranges (plain mean when its signal is 0) [m]."""
    mean = sum_r / count
    if sum_s > 0.0:
        mean = sum_sr / sum_s
    return mean


@wp.func(inline=True)
def beyond_peak(r: float, sum_sr: float, sum_s: float, count: float, sum_r: float, dist: float) -> wp.bool:
    """Whether range ``r`` [m] lies more than ``dist`` beyond the :func:`peak_mean` of a peak's sums: the
    comparison multiplied out by the peak's (positive) weight, no division on the merge's critical path."""
    if sum_s > 0.0:
        return r * sum_s - sum_sr > dist * sum_s
    return r * count - sum_r > dist * count


@wp.func(inline=True)
def merge_peaks(p: LidarParams, c: Contributions) -> Peaks:
    """Range-sorted contributions into peaks: one joins the current peak when it lies within min_echo_dist of the
    peak's mean range, else it starts a new one."""
    cr = c.r
    cs = c.s
    pr = vec64f()
    ps = vec64f()
    pn = vec64f()
    pm = vec64f()
    pb = vec64f()
    pc = vec64i()
    pt = vec64f()
    pbr = vec64f()
    npk = int(0)
    for j in range(c.m):
        start_new = npk == 0
        if not start_new:
            q = npk - 1
            start_new = beyond_peak(cr[j], pr[q], ps[q], pn[q], pm[q], p.min_echo_dist)
        if start_new:
            pb[npk] = -1.0
            npk += 1
        q = npk - 1
        pr[q] = pr[q] + cs[j] * cr[j]
        ps[q] = ps[q] + cs[j]
        pn[q] = pn[q] + 1.0
        pm[q] = pm[q] + cr[j]
        if cs[j] > pb[q]:
            pb[q] = cs[j]
            pc[q] = c.code[j]
            pt[q] = c.tau[j]
            pbr[q] = cr[j]
    pk = Peaks()
    pk.n = npk
    pk.sum_sr = pr
    pk.sum_s = ps
    pk.count = pn
    pk.sum_r = pm
    pk.best_s = pb
    pk.best_code = pc
    pk.best_tau = pt
    pk.best_r = pbr
    return pk


@wp.func(inline=True)
def ranked_of(p: LidarParams, m: int, cr: vec64f, cs: vec64f, cc: vec64i, ct: vec64f) -> Echoes:
    """The echoes of the ``m`` range-sorted contributions (ranges ``cr`` [m], signals ``cs``, codes ``cc``, weights·τ
    ``ct``): :func:`merge_peaks`'s peaks, strongest signal first (EchoId 0 = strongest; equal signals: the nearer
    peak first), capped at max_returns, each with its strongest member as the representative surface. One pass: a
    peak, once its last member is in, takes its place among the strongest so far (the same sums in the same order
    as :func:`merge_peaks`, no table of every peak)."""
    ech = Echoes()
    r = vec8f()
    s = vec8f()
    code = vec8i()
    taus = vec8f()
    rep = vec8f()
    n = int(0)
    # the open peak: sums of signal·range, signal, members, range; its strongest member (signal, code, τ, range)
    sum_sr = float(0.0)
    sum_s = float(0.0)
    count = float(0.0)
    sum_r = float(0.0)
    best_s = float(-1.0)
    best_code = int(0)
    best_tau = float(0.0)
    best_r = float(0.0)
    for j in range(m + 1):
        close = j == m
        if j > 0 and j < m:
            close = beyond_peak(cr[j], sum_sr, sum_s, count, sum_r, p.min_echo_dist)
        if close and j > 0:
            i = n
            while i > 0 and s[i - 1] < sum_s:
                i -= 1
            if i < p.max_returns:
                k = wp.min(n, p.max_returns - 1)
                while k > i:
                    r[k] = r[k - 1]
                    s[k] = s[k - 1]
                    code[k] = code[k - 1]
                    taus[k] = taus[k - 1]
                    rep[k] = rep[k - 1]
                    k -= 1
                r[i] = peak_mean(sum_sr, sum_s, count, sum_r)
                s[i] = sum_s
                code[i] = best_code
                taus[i] = best_tau
                rep[i] = best_r
                n = wp.min(n + 1, p.max_returns)
            sum_sr = 0.0
            sum_s = 0.0
            count = 0.0
            sum_r = 0.0
            best_s = -1.0
        if j < m:
            sum_sr = sum_sr + cs[j] * cr[j]
            sum_s = sum_s + cs[j]
            count = count + 1.0
            sum_r = sum_r + cr[j]
            if cs[j] > best_s:
                best_s = cs[j]
                best_code = cc[j]
                best_tau = ct[j]
                best_r = cr[j]
    ech.n = n
    ech.r = r
    ech.s = s
    ech.code = code
    ech.tau = taus
    ech.rep_r = rep
    return ech


@wp.func(inline=True)
def ranked_echoes(p: LidarParams, c: Contributions) -> Echoes:
    """:func:`ranked_of` the contributions ``c``."""
    return ranked_of(p, c.m, c.r, c.s, c.code, c.tau)


@wp.func(inline=True)
def surfaces_of(ech: Echoes, face: vec64i, inst: vec64i, u: vec64f, v: vec64f, nx: vec64f, ny: vec64f,
                nz: vec64f) -> EchoSurfaces:
    """Each echo's representative surface from the records by code (face, instance, barycentrics, unit normal)."""
    srf = EchoSurfaces()
    for r in range(ech.n):
        code = ech.code[r]
        srf.face[r] = face[code]
        srf.inst[r] = inst[code]
        srf.u[r] = u[code]
        srf.v[r] = v[code]
        srf.nx[r] = nx[code]
        srf.ny[r] = ny[code]
        srf.nz[r] = nz[code]
    return srf


@wp.func(inline=True)
def echoes_of(p: LidarParams, c: Contributions):
    """Step 5: range-sorted contributions merged and ranked into echoes (:func:`ranked_echoes`), with each echo's
    representative surface (:class:`EchoSurfaces`)."""
    ech = ranked_echoes(p, c)
    return ech, surfaces_of(ech, c.face, c.inst, c.u, c.v, c.nx, c.ny, c.nz)


@wp.func(inline=True)
def rays_echoes(geo: SceneGeo, p: LidarParams, ray: FiringRay, time: float, refl: wp.array[float],
                trans: wp.array[float]):
    """:func:`echoes_of` :func:`walk_beam_rays`."""
    ech, srf = echoes_of(p, walk_beam_rays(geo, p, ray, time, refl, trans))
    return ech, srf


walk_packets_static_echoes = _walk_packets(False, True)
walk_packets_listed_echoes = _walk_packets(True, True)


@wp.func(inline=True)
def beam_echoes(geo: SceneGeo, p: LidarParams, ray: FiringRay, time: float, refl: wp.array[float],
                trans: wp.array[float]):
    """Steps 3–5 for a beam: :func:`echoes_of` :func:`walk_beam`, with no :class:`Contributions` passed between
    them (the walk's variant that ranks its own)."""
    if p.packet != 0:
        listed = cone_instances(geo, ray.origin, ray.dir, p.beam_tan)  # the instances the beam may meet
        if listed.n == 0:
            ech, srf = walk_packets_static_echoes(geo, p, ray, time, refl, trans, listed)
            return ech, srf
        ech, srf = walk_packets_listed_echoes(geo, p, ray, time, refl, trans, listed)
        return ech, srf
    ech, srf = rays_echoes(geo, p, ray, time, refl, trans)
    return ech, srf


# ------------------------------------------------------------------------------- 6. detection and intensity
@wp.func(inline=True)
def echo_surface(geo: SceneGeo, p: LidarParams, ray: FiringRay, time: float, code: int, rep_r: float,
                 face: int, inst: int, u: float, v: float, n: wp.vec3):
    """A beam echo's representative surface (code, distance ``rep_r`` [m] along its sub-ray), the sub-ray and its
    direction: its Hit rebuilt from the record the walk kept (face, instance, barycentrics, unit normal ``n``:
    :class:`EchoSurfaces`), without a second query."""
    k = code // p.hits_per_subray
    dk = subray_dir(ray.dir, k, p)
    return hit_record(geo, ray.origin, dk, time, rep_r, face, inst, u, v, n), k, dk


@wp.func(inline=True)
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


@wp.func(inline=True)
def noise_state(seed: int, scan: int, tick: int, emitter: int, echo: int) -> wp.uint32:
    """RNG state of one return's noise, a hash of its identity (seed, scan, tick, emitter, echo): the same whatever
    the launch shape, partialOutputs slicing or thread count, and independent between returns and between scans."""
    s = wp.rand_init(seed, scan)
    s = wp.rand_init(wp.int32(s), tick)
    s = wp.rand_init(wp.int32(s), emitter)
    return wp.rand_init(wp.int32(s), echo)


@wp.func(inline=True)
def return_noise(p: LidarParams, ticks: TickTable, fr: Firing, echo: int) -> wp.vec3:
    """Gaussian noise of echo ``echo`` of a firing: range [m], azimuth [rad], elevation [rad] (three draws in this
    order from the return's own state, so each component does not depend on which others are enabled)."""
    if p.range_noise <= 0.0 and p.az_noise <= 0.0 and p.el_noise <= 0.0:
        return wp.vec3(0.0, 0.0, 0.0)
    rng = noise_state(p.seed, ticks.scan[fr.tick], ticks.tick_id[fr.tick], fr.emitter, echo)
    dr = wp.randn(rng)
    da = wp.randn(rng)
    de = wp.randn(rng)
    return wp.vec3(p.range_noise * dr, p.az_noise * da, p.el_noise * de)


@wp.func(inline=True)
def detection_flags(p: LidarParams, em: EmitterTable, ticks: TickTable, fr: Firing, signal: float,
                    r: float) -> wp.uint8:
    """VALID when the signal reaches the detection threshold inside [near, far]; NEW_SCAN on a valid return of a
    scan's first tick (rotary) or of its earliest-firing emitters (solid state)."""
    flags = wp.uint8(0)
    if signal >= p.detect_threshold and r >= p.near and r <= p.far:
        flags = FLAG_VALID
        earliest = fr.fire_ns == wp.int64(em.fire_ns[fr.state * p.num_emitters])
        if ticks.tick_id[fr.tick] == 0 and (p.rotary != 0 or earliest):
            flags = flags | FLAG_NEW_SCAN
    return flags


# -------------------------------------------------------------------------------------------- 7. output frame
@wp.func(inline=True)
def output_frame(p: LidarParams, pose_times: wp.array[float], poses: wp.array[wp.transform], ray: FiringRay,
                 time: float, ref_time: float) -> OutputFrame:
    """The poses of the output step: at the firing and at the compensation reference (COMPENSATED), with the
    sensor's displacement between them; when Velocity is wanted, the affine map of a surface point's position and
    velocity to its velocity relative to the sensor (:func:`velocity_map`)."""
    of = OutputFrame()
    of.sensor = ray.sensor
    of.ref = ray.sensor
    if p.compensated != 0:
        ref, i_r, d_r = sensor_pose(pose_times, poses, ref_time)
        of.ref = ref
        of.shift_ref = displacement(poses, ray.key, ray.offset, i_r, d_r)
    if (p.want & WANT_VELOCITY) == 0:
        return of
    return velocity_map(p, pose_times, poses, ray, time, of)


@wp.func
def velocity_map(p: LidarParams, pose_times: wp.array[float], poses: wp.array[wp.transform], ray: FiringRay,
                 time: float, of: OutputFrame) -> OutputFrame:
    """``of`` with its velocity map: a point's velocity relative to the sensor is the difference quotient, over
    the ±1 ms window around the firing (one-sided at the ends of the trajectory), of its position in the sensor
    frame, p(t') = R(t')ᵀ (q − s(t') + v_w (t' − t)) with q the point from the sensor at the firing and s the
    sensor's displacement since (sensor-relative: no world positions subtracted), turned into the world axes at
    the firing, then the output frame's. Linear in q and v_w: (pb − pa)/Δ = M q + c + N v_w with
    M = (Rbᵀ − Raᵀ)/Δ, c = (Raᵀ sa − Rbᵀ sb)/Δ, N = (Rbᵀ (wb − t) − Raᵀ (wa − t))/Δ, each premultiplied by the
    output axes G·R(t) (G = R(t)ᵀ: the identity, SENSOR uncompensated), once per firing pose."""
    win = difference_window(pose_times[0], pose_times[pose_times.shape[0] - 1], time, 1.0e-3)
    before, i_a, d_a = sensor_pose_near(pose_times, poses, win[0], ray.key)
    after, i_b, d_b = sensor_pose_near(pose_times, poses, win[1], ray.key)
    sa = displacement(poses, ray.key, ray.offset, i_a, d_a)
    sb = displacement(poses, ray.key, ray.offset, i_b, d_b)
    ra = wp.transpose(wp.quat_to_matrix(wp.transform_get_rotation(before)))
    rb = wp.transpose(wp.quat_to_matrix(wp.transform_get_rotation(after)))
    inv = 1.0 / (win[1] - win[0])
    m = (rb - ra) * inv
    c = (ra * sa - rb * sb) * inv
    n = (rb * (win[1] - time) - ra * (win[0] - time)) * inv
    if p.frame == FRAME_SENSOR and p.compensated == 0:  # the firing's own axes
        of.vel_q = m
        of.vel_c = c
        of.vel_w = n
        return of
    g = wp.quat_to_matrix(wp.transform_get_rotation(ray.sensor))  # WORLD
    if p.frame == FRAME_CUSTOM:
        g = wp.mat33(p.custom[0, 0], p.custom[0, 1], p.custom[0, 2], p.custom[1, 0], p.custom[1, 1],
                     p.custom[1, 2], p.custom[2, 0], p.custom[2, 1], p.custom[2, 2]) * g
    elif p.frame == FRAME_SENSOR:
        g = wp.transpose(wp.quat_to_matrix(wp.transform_get_rotation(of.ref))) * g
    of.vel_q = g * m
    of.vel_c = g * c
    of.vel_w = g * n
    return of


@wp.func(inline=True)
def quantize_range(r: float, res: float) -> float:
    """Range ``r`` rounded to a multiple of ``res`` [m] (range quantisation). Its gradient is straight-through:
    d quantize_range / dr := 1 (the true derivative, 0 almost everywhere, would silently zero every range gradient;
    :func:`adj_quantize_range`). ``res`` is not differentiated."""
    return wp.round(r / res) * res


@wp.func_grad(quantize_range)
def adj_quantize_range(r: float, res: float, adj_ret: float):
    wp.adjoint[r] += adj_ret


@wp.func(inline=True)
def measured_point(p: LidarParams, em: EmitterTable, fr: Firing, ray: FiringRay, of: OutputFrame, rng: float,
                   noise: wp.vec3) -> wp.vec3:
    """The reported point in the output frame, Cartesian [m]: range + distance correction + range noise, quantized,
    along the delivered (noisy) angles from the emitter.

    SENSOR frame: formed in the sensor frame and, COMPENSATED, moved to the reference pose by the sensor's
    displacement (sensor-relative arithmetic: the point never passes through world coordinates, whose float32
    rounding is about 1 mm ten kilometres from the origin). WORLD and CUSTOM: through the world point.
    """
    rep = rng + em.dcorr[fr.table] + noise[0]
    if p.range_res > 0.0:
        rep = quantize_range(rep, p.range_res)
    dir_s = ray.dir_s  # the emitter's direction, unless the delivered angles are noisy
    if noise[1] != 0.0 or noise[2] != 0.0:
        dir_s = sph_dir(fr.az + noise[1], fr.el + noise[2])
    if p.frame == FRAME_SENSOR:
        c = ray.origin_s + dir_s * rep
        if p.compensated != 0:
            c_w = wp.quat_rotate(wp.transform_get_rotation(of.sensor), c) - of.shift_ref  # world axes, from T(ref)
            c = wp.quat_rotate_inv(wp.transform_get_rotation(of.ref), c_w)
        return c
    pw = ray.origin + wp.transform_vector(ray.sensor, dir_s) * rep
    if p.frame == FRAME_CUSTOM:
        return wp.transform_point(p.custom, pw)
    return pw


@wp.func(inline=True)
def polar_sensor(p: LidarParams) -> wp.bool:
    """Spherical output in the uncompensated SENSOR frame without azimuth noise: a return's coordinates come from
    its delivered angles (:func:`sensor_polar`)."""
    return p.spherical != 0 and p.frame == FRAME_SENSOR and p.compensated == 0 and p.az_noise <= 0.0


@wp.func(inline=True)
def sensor_polar(p: LidarParams, em: EmitterTable, fr: Firing, ray: FiringRay, rng: float,
                 noise: wp.vec3) -> wp.vec3:
    """A return's (azimuth, elevation [deg], range [m]) in the sensor frame (:func:`polar_sensor`), from the
    delivered angles: the point lies along the emitter's azimuth a from its origin, itself offset radially along a
    (origin_s = (h cos a, h sin a, v), direction D = (cos e cos a, cos e sin a, sin e)), so its azimuth is a, its
    horizontal distance u = h + r cos e and its height w = v + r sin e; its elevation is e plus the angle between D
    and the point, atan(x) with x = (v cos e − h sin e)/(r + h cos e + v sin e) — a few terms of the series where
    |x| ≤ 0.01 (offsets of centimetres at a metre and more), else atan2(w, u) (a negative u: the opposite
    azimuth). No atan2 of the azimuth, no rounding of a Cartesian point in any of them."""
    rep = rng + em.dcorr[fr.table] + noise[0]
    if p.range_res > 0.0:
        rep = quantize_range(rep, p.range_res)
    e = fr.el
    ce = ray.cos_el
    se = ray.dir_s[2]
    if noise[2] != 0.0:
        e = fr.el + noise[2]
        ce = wp.cos(e)
        se = wp.sin(e)
    hor = em.hor[fr.table]
    vert = em.vert[fr.table]
    u = hor + rep * ce
    w = vert + rep * se
    rng_out = wp.sqrt(u * u + w * w)
    along = rep + hor * ce + vert * se
    across = vert * ce - hor * se
    if along > 0.0 and wp.abs(across) <= 0.01 * along:
        x = across / along
        x2 = x * x
        return wp.vec3(wp.degrees(fr.az), wp.degrees(e + x * (1.0 - x2 * (1.0 / 3.0 - x2 * 0.2))), rng_out)
    a = wp.degrees(fr.az)
    if u < 0.0:
        u = -u
        a = a - 180.0
        if a <= -180.0:
            a = a + 360.0
    return wp.vec3(a, wp.degrees(fast_atan2(w, u)), rng_out)


@wp.func(inline=True)
def measured_coords(p: LidarParams, em: EmitterTable, fr: Firing, ray: FiringRay, of: OutputFrame, rng: float,
                    noise: wp.vec3) -> wp.vec3:
    """:func:`coords_from` :func:`measured_point`, or :func:`sensor_polar` (the same point, where
    :func:`polar_sensor`)."""
    if polar_sensor(p):
        return sensor_polar(p, em, fr, ray, rng, noise)
    return coords_from(p, measured_point(p, em, fr, ray, of, rng, noise))


@wp.func(inline=True)
def to_output(p: LidarParams, v: wp.vec3, of: OutputFrame) -> wp.vec3:
    """A world vector (normal, velocity) into the output frame's axes."""
    if p.frame == FRAME_WORLD:
        return v
    if p.frame == FRAME_CUSTOM:
        return wp.transform_vector(p.custom, v)
    tf = of.sensor
    if p.compensated != 0:
        tf = of.ref
    return wp.quat_rotate_inv(wp.transform_get_rotation(tf), v)


#: Cephes' atanf polynomial on [0, tan(π/8)]: atan(u) ≈ u + u·u²·P(u²).
ATAN_P0 = wp.constant(8.05374449538e-2)
ATAN_P1 = wp.constant(-1.38776856032e-1)
ATAN_P2 = wp.constant(1.99777106478e-1)
ATAN_P3 = wp.constant(-3.33329491539e-1)
TAN_PI_8 = wp.constant(0.41421356237)
#: π/4, π/2, π, each rounded once to float32.
PI_4 = wp.constant(0.7853981633974483)
PI_2 = wp.constant(1.5707963267948966)
PI_1 = wp.constant(3.141592653589793)


@wp.func(inline=True)
def fast_atan2(y: float, x: float) -> float:
    """atan2(y, x) [rad] in [−π, π] within 3 float32 ulp (2.6e-7 rad; the libm call it replaces costs some 12 ns, a
    third of a return's output step): the smaller of |x|, |y| over the larger, reduced to [0, tan(π/8)] by
    atan(t) = π/4 + atan((t − 1)/(t + 1)), a degree-9 odd polynomial there, then the octant. Differentiable (the
    polynomial's derivative, within 1e-6 relative of 1/(1 + t²)); (0, 0) gives 0."""
    ax = wp.abs(x)
    ay = wp.abs(y)
    mx = ax  # (a branch, not max/min: at |x| = |y| each keeps its own gradient)
    mn = ay
    if ay > ax:
        mx = ay
        mn = ax
    num = mn
    den = mx
    base = float(0.0)
    if mn > TAN_PI_8 * mx:
        num = mn - mx
        den = mn + mx
        base = PI_4
    if den <= 0.0:
        den = 1.0
    u = num / den
    z = u * u
    r = base + (u + u * z * (((ATAN_P0 * z + ATAN_P1) * z + ATAN_P2) * z + ATAN_P3))
    if ay > ax:
        r = PI_2 - r
    if x < 0.0:
        r = PI_1 - r
    if y < 0.0:
        r = -r
    return r


@wp.func(inline=True)
def coords_from(p: LidarParams, c: wp.vec3) -> wp.vec3:
    """An output-frame point in the output representation (Cartesian [m] or azimuth/elevation [deg], range [m])."""
    if p.spherical != 0:
        rxy = wp.sqrt(c[0] * c[0] + c[1] * c[1])
        return wp.vec3(wp.degrees(fast_atan2(c[1], c[0])), wp.degrees(fast_atan2(c[2], rxy)), wp.length(c))
    return c


@wp.func(inline=True)
def relative_velocity(geo: SceneGeo, h: Hit, of: OutputFrame) -> wp.vec3:
    """Velocity of the hit point (carried by its object) relative to the moving sensor, in the output frame's axes
    [m/s]: :func:`velocity_map` of the point taken from the sensor at the firing (sensor-relative) and of its
    object's velocity."""
    v = of.vel_q * (h.point - wp.transform_get_translation(of.sensor)) + of.vel_c
    if h.instance >= 0:
        v = v + of.vel_w * point_velocity(geo, h)
    return v


@wp.func(inline=True)
def firing_identity(p: LidarParams, em: EmitterTable, ticks: TickTable, tick: int, emitter: int):
    """The identity channels of the firing of ``emitter`` in tick row ``tick``, as :func:`schedule` has them (no
    trigonometry): TimeOffsetNs [ns], EmitterId, ChannelId, TickId, TickState."""
    ne = p.num_emitters
    state = ticks.state[tick]
    table = state * ne + emitter
    offset_ns = ticks.offset_ns[tick] + wp.int64(em.fire_ns[table])
    if p.instant != 0:
        offset_ns = wp.int64(0)
    return (wp.int32(offset_ns), wp.uint32(emitter), em.channel[table], wp.uint32(ticks.tick_id[tick]),
            wp.uint8(state))


@wp.func(inline=True)
def write_blank(p: LidarParams, out: Slots, slot: int, q: int) -> int:
    """Echo slot ``slot`` of a fired emitter without a return: delivered only when includeInvalidPoints, as an
    invalid point (zeros in its measured channels) at entry ``q``. The entries written (0 or 1)."""
    if p.keep_invalid == 0:
        return 0
    out.slot_id[q] = slot
    out.flags[q] = wp.uint8(0)
    out.coords[q] = wp.vec3(0.0, 0.0, 0.0)
    out.intensity[q] = 0.0
    if (p.want & WANT_MATERIAL) != 0:
        out.material_id[q] = wp.uint32(0)
    if (p.want & WANT_OBJECT) != 0:
        out.object_id[q] = wp.vec4ui(wp.uint32(0), wp.uint32(0), wp.uint32(0), wp.uint32(0))
    if (p.want & WANT_NORMAL) != 0:
        out.normal[q] = wp.vec3(0.0, 0.0, 0.0)
    if (p.want & WANT_VELOCITY) != 0:
        out.velocity[q] = wp.vec3(0.0, 0.0, 0.0)
    if (p.want & WANT_SEMANTIC) != 0:
        out.semantic[q] = 0
    if (p.want & WANT_DIFF) == 0:
        return 1
    out.face[q] = 0
    out.inst[q] = 0
    out.material[q] = 0
    out.subray[q] = 0
    out.tau[q] = 0.0
    out.rep_t[q] = 0.0
    out.rep_s[q] = 0.0
    out.peak_r[q] = 0.0
    out.peak_s[q] = 0.0
    out.noise[q] = wp.vec3(0.0, 0.0, 0.0)
    return 1


@wp.func(inline=True)
def deliver_echo(geo: SceneGeo, p: LidarParams, em: EmitterTable, ticks: TickTable, fr: Firing, ray: FiringRay,
                 of: OutputFrame, r: int, code: int, rep_r: float, peak_r: float, peak_s: float,
                 tau: float, face: int, inst: int, u: float, v: float, n: wp.vec3, refl: wp.array[float],
                 gain: wp.array[float], obj_hash: wp.array[wp.vec3ui], part_number: wp.array[wp.uint32], out: Slots,
                 slot: int, q: int) -> int:
    """Steps 6–8 for echo r (its :class:`Echoes` and :class:`EchoSurfaces` entries) in echo slot ``slot``: its
    return, or a blank one where its surface is not found again, at entry ``q`` if delivered; the entries written.
    (Early returns, no struct chosen after a branch: Warp copies a struct assigned under a condition once more.)"""
    h, k, dk = echo_surface(geo, p, ray, fr.time, code, rep_r, face, inst, u, v, n)
    if h.face < 0:
        return write_blank(p, out, slot, q)
    return deliver_hit(geo, p, em, ticks, fr, ray, of, h, r, k, dk, peak_r, peak_s, tau, refl, gain, obj_hash,
                       part_number, out, slot, q)


@wp.func(inline=True)
def deliver_hit(geo: SceneGeo, p: LidarParams, em: EmitterTable, ticks: TickTable, fr: Firing, ray: FiringRay,
                of: OutputFrame, h: Hit, r: int, k: int, dk: wp.vec3, peak_r: float, peak_s: float, tau: float,
                refl: wp.array[float], gain: wp.array[float], obj_hash: wp.array[wp.vec3ui],
                part_number: wp.array[wp.uint32], out: Slots, slot: int, q: int) -> int:
    """Steps 6–8 for echo r (range ``peak_r`` [m], signal ``peak_s``, weight·transmittance ``tau`` of its surface)
    on surface ``h`` (sub-ray k along ``dk``) in echo slot ``slot``: range and detection; then, if the return is
    delivered (valid, or every one when includeInvalidPoints), its channels at entry ``q`` — those always delivered,
    the wanted ones in the output frame, and (for the differentiable pass) its surface and signals. The entries
    written (0 or 1)."""
    rng = peak_r
    if p.ray_type == RAY_IDEALIZED:
        # from the face's vertices, as the differentiable pass does; the first echo on the static mesh already has it:
        # the 8-wide traversal's plane distance from the ray's origin is this very expression (the same bits)
        if r > 0 or h.instance >= 0 or geo.use_wide == 0:
            rng = hit_distance(geo, h, ray.origin, ray.dir)
        else:
            rng = h.t
    flags = detection_flags(p, em, ticks, fr, peak_s, rng)
    if p.keep_invalid == 0 and (flags & FLAG_VALID) == wp.uint8(0):
        return 0
    noise = return_noise(p, ticks, fr, r)
    out.slot_id[q] = slot
    out.flags[q] = flags
    out.coords[q] = measured_coords(p, em, fr, ray, of, rng, noise)
    out.intensity[q] = intensity_from(p, peak_s, rng, wp.abs(wp.dot(signal_normal(geo, p, h), dk)),
                                      gain[fr.emitter])
    if (p.want & WANT_MATERIAL) != 0:
        out.material_id[q] = wp.uint32(h.material_id)
    if (p.want & WANT_OBJECT) != 0:
        oh = obj_hash[h.object_id]
        out.object_id[q] = wp.vec4ui(oh[0], oh[1], oh[2], part_number[h.part])
    if (p.want & WANT_NORMAL) != 0:
        out.normal[q] = to_output(p, h.normal, of)
    if (p.want & WANT_VELOCITY) != 0:
        out.velocity[q] = relative_velocity(geo, h, of)
    if (p.want & WANT_SEMANTIC) != 0:
        out.semantic[q] = h.semantic
    if (p.want & WANT_DIFF) == 0:
        return 1
    out.face[q] = h.face
    out.inst[q] = h.instance
    out.material[q] = h.material
    out.subray[q] = k
    out.tau[q] = tau
    out.rep_t[q] = h.t
    out.rep_s[q] = tau * surface_signal(geo, p, h, dk, refl)
    out.peak_r[q] = peak_r
    out.peak_s[q] = peak_s
    out.noise[q] = noise
    return 1


@wp.func(inline=True)
def deliver_idealized(geo: SceneGeo, p: LidarParams, em: EmitterTable, ticks: TickTable, fr: Firing,
                      ray: FiringRay, of: OutputFrame, first: wp.vec4, refl: wp.array[float], trans: wp.array[float],
                      gain: wp.array[float], obj_hash: wp.array[wp.vec3ui], part_number: wp.array[wp.uint32],
                      out: Slots, base: int, q: int) -> int:
    """Steps 4–8 of an idealized firing (echo slots ``base`` on): its echoes in path order — the first surface, then
    the surfaces behind transmissive ones (their transmittance τ carried on), up to max_returns; an opaque surface
    ends the ray — each delivered as the walk meets it (nothing kept, no later surface found again); blank slots
    after the last. The delivered ones are written from entry ``q`` on; returns the entry after them. ``first``: the
    static wide BVH's answer for the whole range as :func:`lidar_first_kernel` found it, ``FIRST_BEYOND`` in ``[1]``
    (no static surface within the packet's reach) or ``FIRST_UNKNOWN`` (then the ray is traced here)."""
    h = miss()
    if first[1] >= -1.0:  # the static answer: a slot, or none (-1)
        h = closest_hit_given(geo, ray.origin, ray.dir, 0.0, p.far, fr.time, first)
    elif first[1] == FIRST_BEYOND:
        h = closest_hit_beyond(geo, ray.origin, ray.dir, p.far, wp.min(p.far, PACKET_REACH), fr.time)
    else:
        h = closest_hit(geo, ray.origin, ray.dir, 0.0, p.far, fr.time)
    n = int(0)
    tau = float(1.0)
    at = q
    while h.face >= 0 and n < p.max_returns:
        at += deliver_hit(geo, p, em, ticks, fr, ray, of, h, n, 0, ray.dir, h.t,
                          tau * surface_signal(geo, p, h, ray.dir, refl), tau, refl, gain, obj_hash, part_number, out,
                          base + n, at)
        n += 1
        tr = trans[h.material]
        if tr <= 0.0 or n >= p.max_returns:  # an opaque surface, or no echo left to fill
            break
        tau = tau * tr
        h = continue_past(geo, ray.origin, ray.dir, h.t, p.far, fr.time)
    for r in range(n, p.max_returns):
        at += write_blank(p, out, base + r, at)
    return at


# ---------------------------------------------------------------------------------------------------- kernels
#: Firings a CPU thread of :func:`lidar_fire_kernel` takes in turn.
FIRE_BATCH = 16


@wp.kernel(enable_backward=False)
def lidar_fire_kernel(
    geo: SceneGeo,
    p: LidarParams,
    em: EmitterTable,
    ticks: TickTable,
    poses: wp.array[wp.transform],
    refl: wp.array[float],
    trans: wp.array[float],
    gain: wp.array[float],
    obj_hash: wp.array[wp.vec3ui],
    part_number: wp.array[wp.uint32],
    fire_slot: wp.array[wp.int32],
    n_slots: int,
    fposes: wp.array[FiringPose],
    first: wp.array[wp.vec4],
    n_fire: int,
    batch: int,
    offset: int,
    out: Slots,
    counts: wp.array[wp.int32],
):
    """One firing, step by step (not differentiable; :func:`lidar_diff_kernel` recomputes the differentiable values
    from the surfaces chosen here). Its poses come from :func:`firing_pose_kernel`'s table (``fire_slot``: the
    firing-time slot of each emitter-table entry); ``first``: each firing's static first surface from
    :func:`lidar_first_kernel` (empty: none, every ray traced here). A thread takes firings ``batch · tid`` on, up to
    ``batch`` of the ``n_fire`` (CPU: :data:`FIRE_BATCH`: Warp copies a kernel's arguments and zeroes its locals once
    per thread, some 10 KB here; CUDA: 1), and writes their delivered returns packed from entry ``batch · tid ·
    max_returns`` on (:class:`Slots`), their count in ``counts[tid]``: the compaction reads only those, written
    together."""
    b = wp.tid() + offset
    s = b * batch
    q0 = s * p.max_returns
    q = q0
    for f in range(s, wp.min(s + batch, n_fire)):
        base = f * p.max_returns
        fr0 = firing_of(p, em, ticks, f)
        fp = fposes[fr0.tick * n_slots + fire_slot[fr0.table]]
        if fp.fires == 0:
            continue
        fr = scheduled(em, fr0, fp)
        ray = emitter_ray_cs(em, fr, direction_cs(em.trig[fr.table], fp.phase_cs), fp.frame.sensor, fp.key,
                         fp.offset, poses)
        w = wp.vec4(0.0, FIRST_UNKNOWN, 0.0, 0.0)
        if first.shape[0] > 0:
            w = first[f]
        of = fp.frame
        if p.ray_type == RAY_IDEALIZED:
            q = deliver_idealized(geo, p, em, ticks, fr, ray, of, w, refl, trans, gain, obj_hash, part_number, out,
                                  base, q)
            continue
        ech, srf = beam_echoes(geo, p, ray, fr.time, refl, trans)
        for r in range(p.max_returns):
            if r < ech.n:
                q += deliver_echo(geo, p, em, ticks, fr, ray, of, r, ech.code[r], ech.rep_r[r], ech.r[r],
                                  ech.s[r], ech.tau[r], srf.face[r], srf.inst[r], srf.u[r], srf.v[r],
                                  wp.vec3(srf.nx[r], srf.ny[r], srf.nz[r]), refl, gain, obj_hash, part_number, out,
                                  base + r, q)
            else:
                q += write_blank(p, out, base + r, q)
    counts[b] = q - q0


#: The angle [deg] a group of :func:`lidar_first_kernel` spans: neighbouring firings up to it (a Pandar128 emitter over
#: 24 ticks, 48 neighbours in a row of AT128's grid), under the 6° of ``PACKET_COS`` (measured: groups of 16 → 48
#: firings cut AT128's first-surface kernel by 12 %, 16 → 24 Pandar128's by 6 %; wider ones, 64 and 32, fall apart).
FIRST_SPAN_DEG = 4.8
#: Most firings a group of :func:`lidar_first_kernel` takes (the rows of its packet matrices).
FIRST_GROUP_MAX = 64
#: ``first[f][1]`` of a firing whose static surface :func:`lidar_first_kernel` did not find (the fire kernel traces
#: it over its whole range); a slot's int32 bits as a float are never negative, a miss is −1.
FIRST_UNKNOWN = wp.constant(-2.0)
#: ``first[f][1]`` of a firing whose static surface lies beyond ``PACKET_REACH`` (:func:`lidar_first_kernel`'s
#: packet met none within it): the fire kernel looks for the instances first (:func:`closest_hit_beyond`).
FIRST_BEYOND = wp.constant(-3.0)


@wp.kernel(enable_backward=False)
def lidar_first_kernel(
    geo: SceneGeo,
    p: LidarParams,
    em: EmitterTable,
    ticks: TickTable,
    fire_slot: wp.array[wp.int32],
    n_slots: int,
    fposes: wp.array[FiringPose],
    poses: wp.array[wp.transform],
    order: wp.array[wp.int32],
    by_position: int,
    group: int,
    n: int,
    offset: int,
    first: wp.array[wp.vec4],
):
    """The static surface the first ray of firings ``order[group · tid + k]`` meets (IDEALIZED, CPU, wide BVH,
    ``group`` <= :data:`FIRST_GROUP_MAX`): the group's rays — one emitter over consecutive ticks of a spinning head,
    neighbours of one row of a solid state's grid: origins millimetres apart, directions tenths of a degree — traverse
    the static 8-wide BVH as multi-origin packets (:func:`wsim.kernels.packet.wide_packet_from`, each ray's own result
    bit for bit) over the first ``PACKET_REACH`` metres, a packet for each run of rays within ``PACKET_COS`` of the
    run's first one and in its octant (a wider packet would cost more than its rays alone: a group across an axis
    plane or the end of a row is two runs). ``first[f]`` = (t, slot, u, v) as
    :func:`wsim.kernels.widebvh.wide_closest` finds it over the whole range, ``FIRST_BEYOND`` in ``[1]``: none within
    the reach, or ``FIRST_UNKNOWN``: a run of one ray. ``by_position`` 1: ``em`` and ``fire_slot`` are in the groups'
    order too (entry ``s + k`` of a tick's block for the firing at position ``s + k``: read in turn, not far apart),
    0: by firing."""
    s = (wp.tid() + offset) * group
    m = wp.min(group, n - s)
    orgs = mat64x3()
    dirs = mat64x3()
    lo = vec64f()
    hi = vec64f()
    run = vec64i()  # each row's run (−1: the firing does not fire)
    reach = wp.min(p.far, PACKET_REACH)
    d0 = wp.vec3(0.0, 0.0, 0.0)
    runs = int(0)
    active = int(0)
    for k in range(m):
        f = order[s + k]
        first[f] = wp.vec4(0.0, FIRST_UNKNOWN, 0.0, 0.0)
        g = f
        if by_position != 0:
            g = s + k
        fr0 = firing_of(p, em, ticks, g)
        fp = fposes[fr0.tick * n_slots + fire_slot[fr0.table]]
        run[k] = -1
        if fp.fires != 0:
            fr = scheduled(em, fr0, fp)
            ray = emitter_ray_cs(em, fr, direction_cs(em.trig[fr.table], fp.phase_cs), fp.frame.sensor, fp.key,
                                 fp.offset, poses)
            d = ray.dir
            for a in range(3):
                orgs[k, a] = ray.origin[a]
                dirs[k, a] = d[a]
            hi[k] = reach
            if active == 0 or wp.dot(d, d0) < PACKET_COS or d[0] * d0[0] <= 0.0 or d[1] * d0[1] <= 0.0 or (
                    d[2] * d0[2] <= 0.0):
                d0 = d  # a new run: this ray is not within PACKET_COS of the run's first one, or not in its octant
                runs += 1
            run[k] = runs - 1
            active += 1
    if active < 2:
        return
    for r in range(runs):
        if runs > 1:  # (most groups are one run: hi is set)
            size = int(0)
            for k in range(m):
                hi[k] = 0.0
                if run[k] == r:
                    hi[k] = reach
                    size += 1
            if size < 2:
                continue
        res = wide_packet_from(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid,
                               orgs, dirs, lo, hi, m)
        for k in range(m):
            if run[k] == r:
                if res[k, 1] >= 0.0 or reach >= p.far:
                    first[order[s + k]] = wp.vec4(res[k, 0], res[k, 1], res[k, 2], res[k, 3])
                else:
                    first[order[s + k]] = wp.vec4(0.0, FIRST_BEYOND, 0.0, 0.0)


@wp.kernel(enable_backward=False)
def firing_pose_kernel(
    p: LidarParams,
    ticks: TickTable,
    slot_ns: wp.array[wp.int32],
    n_slots: int,
    pose_times: wp.array[float],
    poses: wp.array[wp.transform],
    ref_time: float,
    offset: int,
    out: wp.array[FiringPose],
):
    """The poses of firing-time slot ``s`` of tick ``k`` (``tid = k · n_slots + s``; ``slot_ns[state · n_slots +
    s]`` = the slot's firing delay [ns]): the same :func:`sensor_pose` and :func:`output_frame` values a firing at that
    time computes, once for all emitters that fire together."""
    i = wp.tid() + offset
    k = i // n_slots
    fire_ns = wp.int64(slot_ns[ticks.state[k] * n_slots + (i - k * n_slots)])
    time = ticks.time[k] + float(fire_ns) * 1.0e-9  # as schedule() times a firing
    if p.instant != 0:
        time = ticks.time[0]
    sensor, key, off = sensor_pose(pose_times, poses, time)
    ray = FiringRay()
    ray.sensor = sensor
    ray.key = key
    ray.offset = off
    fp = FiringPose()
    fp.key = key
    fp.offset = off
    phase, fires = firing_phase(p, ticks, k, fire_ns)
    fp.phase = phase
    fp.fires = fires
    fp.phase_cs = wp.vec2(wp.cos(phase), wp.sin(phase))
    fp.frame = output_frame(p, pose_times, poses, ray, time, ref_time)
    out[i] = fp


@wp.kernel(enable_backward=False)
def firing_rays_kernel(
    p: LidarParams,
    em: EmitterTable,
    ticks: TickTable,
    fire_slot: wp.array[wp.int32],
    n_slots: int,
    fposes: wp.array[FiringPose],
    poses: wp.array[wp.transform],
    offset: int,
    origin: wp.array[wp.vec3],
    direction: wp.array[wp.vec3],
    time: wp.array[float],
    fires: wp.array[wp.int32],
):
    """Sub-ray ``k`` of firing ``f`` (``tid = f · beam_n + k``) as :func:`lidar_fire_kernel` traces it first: world
    origin, direction and time, and whether the firing fires."""
    i = wp.tid() + offset
    f = i // p.beam_n
    fr0 = firing_of(p, em, ticks, f)
    fp = fposes[fr0.tick * n_slots + fire_slot[fr0.table]]
    fr = scheduled(em, fr0, fp)
    ray = emitter_ray_cs(em, fr, direction_cs(em.trig[fr.table], fp.phase_cs), fp.frame.sensor, fp.key,
                         fp.offset, poses)
    origin[i] = ray.origin
    direction[i] = subray_dir(ray.dir, i - f * p.beam_n, p)
    time[i] = fr.time
    fires[i] = fr.fires


@wp.kernel
def compact_kernel(
    src: Slots,
    p: LidarParams,
    em: EmitterTable,
    ticks: TickTable,
    counts: wp.array[wp.int32],
    ends: wp.array[wp.int32],
    want: int,
    batch: int,
    offset: int,
    flags: wp.array[wp.uint8],
    coords: wp.array2d[float],
    intensity: wp.array[float],
    time_offset_ns: wp.array[wp.int32],
    emitter: wp.array[wp.uint32],
    channel: wp.array[wp.uint32],
    tick: wp.array[wp.uint32],
    echo_id: wp.array[wp.uint8],
    state: wp.array[wp.uint8],
    material_id: wp.array[wp.uint32],
    object_id: wp.array2d[wp.uint32],
    normal: wp.array2d[float],
    velocity: wp.array2d[float],
    semantic: wp.array[wp.int32],
    src_slot: wp.array[wp.int32],
):
    """The delivered returns of :func:`lidar_fire_kernel`'s batch ``tid`` (``counts[tid]`` entries from ``batch ·
    tid · max_returns`` on, :class:`Slots`) to delivered points ``ends[tid] − counts[tid]`` on (``ends``: the
    inclusive scan of the counts): the wanted channels, and the identity ones of each one's firing and echo
    (``src_slot``: each point's entry)."""
    b = wp.tid() + offset
    m = counts[b]
    q0 = b * batch * p.max_returns
    j0 = ends[b] - m
    # entries in slot order: the firing of each followed from the batch's first (no division an entry)
    f_slot = q0  # the first echo slot of firing (tk_row, e_col)
    tk_row = (b * batch) // p.num_emitters
    e_col = b * batch - tk_row * p.num_emitters
    for k in range(m):
        q = q0 + k
        i = src.slot_id[q]
        while i >= f_slot + p.max_returns:
            f_slot += p.max_returns
            e_col += 1
            if e_col == p.num_emitters:
                e_col = 0
                tk_row += 1
        j = j0 + k
        src_slot[j] = q
        flags[j] = src.flags[q]
        c = src.coords[q]
        for a in range(3):
            coords[a, j] = c[a]
        if (want & WANT_NORMAL) != 0:
            nv = src.normal[q]
            for a in range(3):
                normal[j, a] = nv[a]
        if (want & WANT_VELOCITY) != 0:
            v = src.velocity[q]
            for a in range(3):
                velocity[j, a] = v[a]
        if (want & WANT_OBJECT) != 0:
            o = src.object_id[q]
            for a in range(4):
                object_id[j, a] = o[a]
        if (want & WANT_MATERIAL) != 0:
            material_id[j] = src.material_id[q]
        if (want & WANT_SEMANTIC) != 0:
            semantic[j] = src.semantic[q]
        intensity[j] = src.intensity[q]
        off, e, ch, tk, st = firing_identity(p, em, ticks, tk_row, e_col)
        time_offset_ns[j] = off
        emitter[j] = e
        channel[j] = ch
        tick[j] = tk
        state[j] = st
        echo_id[j] = wp.uint8(i - f_slot)
