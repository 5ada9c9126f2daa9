"""The differentiable pass of the lidar (after :mod:`wsim.kernels.lidar`'s forward pass picked the surfaces).

:func:`echo_members_kernel` walks each delivered beam echo again (the same walk, merge and ranking as the forward
pass, not differentiable) to list every contributing sub-ray; :func:`echo_sums_kernel` recomputes each member's range
and signal from its face, so an echo's range (Σ s·r / Σ s) and signal (Σ s) differentiate through every member;
:func:`lidar_diff_kernel` recomputes Coordinates and Intensity of the delivered returns from those surfaces with the
forward pass's step functions, on a ``wp.Tape``.
"""

import warp as wp

from .lidar import (
    beyond_peak, firing_ray, intensity_from, measured_coords, merge_peaks, nth_hit, output_frame, peak_mean,
    schedule, signal_from, subray_dir, walk_beam,
)
from .lidar_types import (
    Contributions, EmitterTable, FiringRay, LidarParams, Members, Peaks, RAY_IDEALIZED, Slots, TickTable, vec64f,
    vec64i,
)
from .trace import SceneGeo, hit_distance, hit_triangle, miss, smooth_normal_at


@wp.func
def peak_members(p: LidarParams, c: Contributions) -> vec64i:
    """The peak (index in range order) each contribution joins: :func:`merge_peaks`'s grouping, step for step."""
    pr = vec64f()
    ps = vec64f()
    pn = vec64f()
    pm = vec64f()
    own = vec64i()
    npk = int(0)
    for j in range(c.m):
        start_new = npk == 0
        if not start_new:
            q = npk - 1
            start_new = beyond_peak(c.r[j], pr[q], ps[q], pn[q], pm[q], p.min_echo_dist)
        if start_new:
            npk += 1
        q = npk - 1
        pr[q] = pr[q] + c.s[j] * c.r[j]
        ps[q] = ps[q] + c.s[j]
        pn[q] = pn[q] + 1.0
        pm[q] = pm[q] + c.r[j]
        own[j] = q
    return own


@wp.func
def echo_peak(p: LidarParams, pk: Peaks, e: int) -> int:
    """The peak (of :func:`merge_peaks`) :func:`wsim.kernels.lidar.ranked_echoes` delivers as echo ``e`` (-1: none)."""
    ps = pk.sum_s
    pn = pk.count
    found = int(-1)
    n = int(0)
    for _e in range(p.max_returns):
        best = int(-1)
        for q in range(pk.n):
            if pn[q] > 0.0 and (best < 0 or ps[q] > ps[best]):
                best = q
        if best >= 0:
            if n == e:
                found = best
            n += 1
            pn[best] = 0.0
    return found


@wp.kernel(enable_backward=False)
def echo_members_kernel(
    geo: SceneGeo,
    p: LidarParams,
    em: EmitterTable,
    ticks: TickTable,
    pose_times: wp.array[float],
    poses: wp.array[wp.transform],
    refl: wp.array[float],
    trans: wp.array[float],
    slots: Slots,
    src: wp.array[wp.int32],
    fill: int,
    end: wp.array[wp.int32],
    count: wp.array[wp.int32],
    mem: Members,
):
    """The contributions of each delivered beam echo, re-found by walking its firing's beam again (the same walk,
    merge and ranking as :func:`lidar_fire_kernel`). ``fill`` 0: count them per return; 1: write them to ``mem`` at
    [end[j] − count[j], end[j]) (``end`` = inclusive scan of the counts)."""
    j = wp.tid()
    i = src[j]
    slot = slots.slot_id[i]  # firing f's echo slot
    f = slot // p.max_returns
    fr = schedule(p, em, ticks, f)
    ray = firing_ray(em, fr, pose_times, poses)
    c = walk_beam(geo, p, ray, fr.time, refl, trans)
    q = echo_peak(p, merge_peaks(p, c), slot - f * p.max_returns)
    own = peak_members(p, c)
    base = int(0)
    if fill != 0:
        base = end[j] - count[j]
    k = int(0)
    for a in range(c.m):
        if own[a] == q and q >= 0:
            if fill != 0 and k < count[j]:
                code = c.code[a]
                sr = code // p.hits_per_subray
                h = nth_hit(geo, ray.origin, subray_dir(ray.dir, sr, p), code - sr * p.hits_per_subray, p.far,
                            fr.time)
                t = base + k
                mem.owner[t] = j
                mem.subray[t] = sr
                mem.face[t] = h.face
                mem.inst[t] = h.instance
                mem.material[t] = h.material
                mem.tau[t] = c.tau[a]
            k += 1
    if fill == 0:
        count[j] = k


@wp.func
def surface_contribution(geo: SceneGeo, p: LidarParams, ray: FiringRay, time: float, subray: int, face: int,
                         inst: int, mid: int, tau: float, refl: wp.array[float]):
    """A surface's distance [m] along a sub-ray, its signal τ·ρ_eff·|cos θ|/r², its normal and the sub-ray direction,
    recomputed from the face's vertices (differentiable w.r.t. the ray, the vertices and the reflectance)."""
    dk = subray_dir(ray.dir, subray, p)
    h = miss()
    h.face = face
    h.instance = inst
    h.time = time
    tri = hit_triangle(geo, h)
    n = wp.normalize(wp.cross(tri[1] - tri[0], tri[2] - tri[0]))
    t = hit_distance(geo, h, ray.origin, dk)
    if p.smooth != 0:  # the interpolated vertex normals at the point hit (the vertex normals held constant)
        e0 = tri[1] - tri[0]
        e1 = tri[2] - tri[0]
        q = ray.origin + dk * t - tri[0]
        d00 = wp.dot(e0, e0)
        d01 = wp.dot(e0, e1)
        d11 = wp.dot(e1, e1)
        d20 = wp.dot(q, e0)
        d21 = wp.dot(q, e1)
        den = d00 * d11 - d01 * d01
        wb = (d11 * d20 - d01 * d21) / den
        wc = (d00 * d21 - d01 * d20) / den
        n = smooth_normal_at(geo, face, inst, time, 1.0 - wb - wc, wb, wc, n)
    retro = int(0)
    if (geo.material_code[mid] >> 11) & 2 != 0:
        retro = 1
    return t, tau * signal_from(refl[mid], retro, n, dk, t), n, dk


@wp.kernel
def echo_sums_kernel(
    geo: SceneGeo,
    p: LidarParams,
    em: EmitterTable,
    ticks: TickTable,
    pose_times: wp.array[float],
    poses: wp.array[wp.transform],
    refl: wp.array[float],
    slots: Slots,
    src: wp.array[wp.int32],
    mem: Members,
    sum_sr: wp.array[float],
    sum_s: wp.array[float],
    sum_r: wp.array[float],
):
    """Σ s·r, Σ s and Σ r over each delivered beam echo's contributions, recomputed differentiably (one thread per
    contribution)."""
    t = wp.tid()
    if mem.face[t] < 0:
        return
    j = mem.owner[t]
    fr = schedule(p, em, ticks, slots.slot_id[src[j]] // p.max_returns)
    ray = firing_ray(em, fr, pose_times, poses)
    r, s, _n, _dk = surface_contribution(geo, p, ray, fr.time, mem.subray[t], mem.face[t], mem.inst[t],
                                         mem.material[t], mem.tau[t], refl)
    wp.atomic_add(sum_sr, j, s * r)
    wp.atomic_add(sum_s, j, s)
    wp.atomic_add(sum_r, j, r)


@wp.func
def recompute_echo(geo: SceneGeo, p: LidarParams, slots: Slots, i: int, ray: FiringRay, time: float,
                   refl: wp.array[float], members: int, sum_sr: float, sum_s: float, sum_r: float):
    """Slot i's echo range [m], signal, surface normal and sub-ray direction, recomputed differentiably. Idealized:
    from its surface (face, instance). Beam: the echo's signal-weighted mean range Σ s·r / Σ s and signal Σ s over
    its ``members`` contributions (sums from :func:`echo_sums_kernel`, each contribution's range and signal
    differentiated); the normal and direction are the representative (strongest) surface's, for the incidence
    cosine. A beam echo without recorded members carries its representative surface's change instead."""
    t_rep, s_rep, n, dk = surface_contribution(geo, p, ray, time, slots.subray[i], slots.face[i], slots.inst[i],
                                               slots.material[i], slots.tau[i], refl)
    rng = t_rep
    signal = s_rep
    if p.ray_type != RAY_IDEALIZED:
        if members > 0:
            rng = peak_mean(sum_sr, sum_s, float(members), sum_r)
            signal = sum_s
        else:
            rng = slots.peak_r[i] + (t_rep - slots.rep_t[i])
            signal = slots.peak_s[i] * s_rep / wp.max(slots.rep_s[i], 1.0e-30)
    return rng, signal, n, dk


@wp.kernel
def lidar_diff_kernel(
    geo: SceneGeo,
    p: LidarParams,
    em: EmitterTable,
    ticks: TickTable,
    pose_times: wp.array[float],
    poses: wp.array[wp.transform],
    ref_time: float,
    refl: wp.array[float],
    gain: wp.array[float],
    slots: Slots,
    src: wp.array[wp.int32],
    members: wp.array[wp.int32],
    sum_sr: wp.array[float],
    sum_s: wp.array[float],
    sum_r: wp.array[float],
    coords: wp.array2d[float],
    intensity: wp.array[float],
):
    """Recompute the Coordinates and Intensity of delivered returns from their surfaces, differentiably w.r.t. the
    sensor poses, emitter angles, per-emitter gain, material reflectance and mesh vertices. The surfaces (face,
    instance) come from :func:`lidar_fire_kernel` (and :func:`echo_members_kernel` for beams): the BVH query only
    picks them. Values equal the forward pass's (up to float rounding of the recomputed distances)."""
    j = wp.tid()
    i = src[j]
    fr = schedule(p, em, ticks, slots.slot_id[i] // p.max_returns)
    ray = firing_ray(em, fr, pose_times, poses)
    k = int(0)  # idealized rays: the per-echo sums are not used (1-element placeholders)
    if p.ray_type != RAY_IDEALIZED:
        k = j
    rng, signal, n, dk = recompute_echo(geo, p, slots, i, ray, fr.time, refl, members[k], sum_sr[k], sum_s[k],
                                        sum_r[k])
    of = output_frame(p, pose_times, poses, ray, fr.time, ref_time)
    c = measured_coords(p, em, fr, ray, of, rng, slots.noise[i])
    coords[0, j] = c[0]
    coords[1, j] = c[1]
    coords[2, j] = c[2]
    intensity[j] = intensity_from(p, signal, rng, wp.abs(wp.dot(n, dk)), gain[fr.emitter])
