"""Pose maths on the device: the one implementation of pose interpolation used by lidar, camera and scene.

Quaternions are (x, y, z, w) (Warp's order). A pose maps child to parent: p_parent = R(q) p_child + t.
Interpolation between key samples: translation lerp, rotation shortest-arc slerp, clamped outside the keys.
"""

import warp as wp


@wp.func
def sinc(x: float) -> float:
    """sin(x)/x, 1 at 0 (Taylor below 1e-4, where the ratio would be rounding-limited)."""
    if wp.abs(x) < 1.0e-4:
        return 1.0 - x * x / 6.0
    return wp.sin(x) / x


@wp.func
def quat_slerp_shortest(q0: wp.quat, q1: wp.quat, s: float) -> wp.quat:
    """Shortest-arc slerp between unit quaternions, accurate to float32 rounding at every angle.

    The angle Ω between the quaternions is 2·atan2(|q1 − q0|, |q1 + q0|) (after flipping q1 onto q0's hemisphere),
    which keeps full relative precision for small rotations where acos(q0·q1) loses it; the weights
    sin((1 − s)Ω)/sin Ω and sin(sΩ)/sin Ω are written with sinc so they tend to 1 − s and s without a cut-off. The
    inputs (keys rounded to float32 are unit only to rounding) and the result are normalised.
    """
    p0 = wp.normalize(q0)
    if q0 == q1:
        # the same key rotation twice (a track that does not turn): Ω = 0, sinc(0) = 1, so the weights below are
        # exactly 1 − s and s; the trigonometry is skipped, with the very same bits
        return wp.normalize((1.0 - s) * p0 + s * p0)
    p1 = wp.normalize(q1)
    if wp.dot(p0, p1) < 0.0:
        p1 = -p1
    om = 2.0 * wp.atan2(wp.length(p1 - p0), wp.length(p1 + p0))
    inv = 1.0 / sinc(om)
    a = (1.0 - s) * sinc((1.0 - s) * om) * inv
    b = s * sinc(s * om) * inv
    return wp.normalize(a * p0 + b * p1)


@wp.func
def lerp_pose(p0: wp.transform, p1: wp.transform, s: float) -> wp.transform:
    """Interpolate two rigid poses at fraction s in [0, 1] (translation t0 + s·(t1 − t0): exact at s = 0 and for a
    pose that does not move, wherever it is)."""
    t0 = wp.transform_get_translation(p0)
    t = t0 + s * (wp.transform_get_translation(p1) - t0)
    q = quat_slerp_shortest(wp.transform_get_rotation(p0), wp.transform_get_rotation(p1), s)
    return wp.transform(t, q)


@wp.func
def key_segment(times: wp.array[float], start: int, count: int, t: float) -> wp.vec2i:
    """Index i of the key segment [i, i+1] containing t (binary search), and 1 if inside else 0 (clamped)."""
    if count <= 1 or t <= times[start]:
        return wp.vec2i(start, 0)
    last = start + count - 1
    if t >= times[last]:
        return wp.vec2i(last, 0)
    lo = start
    hi = last
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if times[mid] <= t:
            lo = mid
        else:
            hi = mid
    return wp.vec2i(lo, 1)


@wp.struct
class KeyedTransform:
    """An affine transform at time t: translation, rotation, per-axis scale."""

    pos: wp.vec3
    rot: wp.quat
    scale: wp.vec3


@wp.func
def sample_keys(
    times: wp.array[float],
    pos: wp.array[wp.vec3],
    rot: wp.array[wp.quat],
    scale: wp.array[wp.vec3],
    start: int,
    count: int,
    t: float,
) -> KeyedTransform:
    """Transform of a keyed track at time t [s] (lerp + shortest-arc slerp + scale lerp, clamped)."""
    seg = key_segment(times, start, count, t)
    i = seg[0]
    out = KeyedTransform()
    if seg[1] == 0:
        out.pos = pos[i]
        out.rot = rot[i]
        out.scale = scale[i]
        return out
    s = (t - times[i]) / (times[i + 1] - times[i])
    out.pos = pos[i] + s * (pos[i + 1] - pos[i])
    out.rot = quat_slerp_shortest(rot[i], rot[i + 1], s)
    out.scale = wp.lerp(scale[i], scale[i + 1], s)
    return out


@wp.func
def sample_trajectory(times: wp.array[float], poses: wp.array[wp.transform], t: float) -> wp.transform:
    """Rigid pose of a trajectory (key times [s], child-to-world poses) at time t, clamped outside the keys."""
    seg = key_segment(times, 0, times.shape[0], t)
    i = seg[0]
    if seg[1] == 0:
        return poses[i]
    s = (t - times[i]) / (times[i + 1] - times[i])
    return lerp_pose(poses[i], poses[i + 1], s)


@wp.func
def difference_window(t_first: float, t_last: float, t: float, h: float) -> wp.vec2:
    """Times (t−h, t+h) for a central difference, shifted to stay inside [t_first, t_last] when t is inside it
    (so velocities at the first and last keys are one-sided rather than halved by the clamp)."""
    ta = t - h
    tb = t + h
    if t >= t_first and t <= t_last and t_last - t_first >= 2.0 * h:
        if ta < t_first:
            ta = t_first
            tb = t_first + 2.0 * h
        if tb > t_last:
            tb = t_last
            ta = t_last - 2.0 * h
    return wp.vec2(ta, tb)
