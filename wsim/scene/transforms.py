"""Host-side (NumPy) pose helpers. They mirror the Warp functions in :mod:`wsim.kernels.pose` (the reference the
kernels are tested against); quaternions are (x, y, z, w)."""

from __future__ import annotations

import numpy as np


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    """Rotation matrix (..., 3, 3) of unit quaternions (..., 4) in (x, y, z, w) order."""
    q = np.asarray(q, dtype=np.float64)
    x, y, z, w = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
            np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
            np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )


def matrix_to_quat(m: np.ndarray) -> np.ndarray:
    """Unit quaternion (x, y, z, w) of a 3x3 rotation matrix (w >= 0)."""
    m = np.asarray(m, dtype=np.float64)
    tr = np.trace(m)
    if tr > 0:
        s = np.sqrt(tr + 1.0) * 2
        q = [(m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s, 0.25 * s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2]) * 2
        q = [0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s, (m[2, 1] - m[1, 2]) / s]
    elif m[1, 1] > m[2, 2]:
        s = np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2]) * 2
        q = [(m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s, (m[0, 2] - m[2, 0]) / s]
    else:
        s = np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1]) * 2
        q = [(m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s, (m[1, 0] - m[0, 1]) / s]
    q = np.asarray(q)
    q /= np.linalg.norm(q)
    return -q if q[3] < 0 else q


def decompose_matrix(m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split a 4x4 column-vector affine matrix (p' = M[:3,:3] p + M[:3,3]) into translation, quaternion, scale.

    Shear is dropped (the nearest rotation is kept); a negative determinant flips the sign of the x scale.
    """
    m = np.asarray(m, dtype=np.float64)
    t = m[:3, 3].copy()
    a = m[:3, :3]
    s = np.linalg.norm(a, axis=0)
    if np.any(s < 1e-12):
        raise ValueError("degenerate transform (zero scale)")
    r = a / s
    if np.linalg.det(r) < 0:
        s[0] = -s[0]
        r[:, 0] = -r[:, 0]
    u, _, vt = np.linalg.svd(r)
    r = u @ vt
    return t, matrix_to_quat(r), s


def compose_matrix(t: np.ndarray, q: np.ndarray, s: np.ndarray | None = None) -> np.ndarray:
    """4x4 column-vector matrix of translation, quaternion (x, y, z, w) and optional scale."""
    m = np.eye(4)
    r = quat_to_matrix(q)
    m[:3, :3] = r * (np.ones(3) if s is None else np.asarray(s))[None, :]
    m[:3, 3] = t
    return m


def _sinc(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    small = np.abs(x) < 1e-4
    return np.where(small, 1.0 - x * x / 6.0, np.sin(np.where(small, 1.0, x)) / np.where(small, 1.0, x))


def quat_slerp(q0: np.ndarray, q1: np.ndarray, s: float | np.ndarray) -> np.ndarray:
    """Shortest-arc spherical interpolation between unit quaternions (x, y, z, w) (..., 4) at fraction(s) ``s``.

    The host mirror of :func:`wsim.kernels.pose.quat_slerp_shortest` (same formula, float64): the angle between the
    quaternions is Ω = 2·atan2(|q1 − q0|, |q1 + q0|), the weights (1 − s)·sinc((1 − s)Ω)/sinc(Ω) and
    s·sinc(sΩ)/sinc(Ω); the inputs and the result are normalised.
    """
    q0 = np.asarray(q0, dtype=np.float64)
    q1 = np.asarray(q1, dtype=np.float64)
    q0 = q0 / np.linalg.norm(q0, axis=-1, keepdims=True)
    q1 = q1 / np.linalg.norm(q1, axis=-1, keepdims=True)
    s = np.asarray(s, dtype=np.float64)[..., None]
    q1 = np.where(np.sum(q0 * q1, axis=-1, keepdims=True) < 0, -q1, q1)
    om = 2.0 * np.arctan2(np.linalg.norm(q1 - q0, axis=-1, keepdims=True),
                          np.linalg.norm(q1 + q0, axis=-1, keepdims=True))
    inv = 1.0 / _sinc(om)
    q = (1.0 - s) * _sinc((1.0 - s) * om) * inv * q0 + s * _sinc(s * om) * inv * q1
    return q / np.linalg.norm(q, axis=-1, keepdims=True)


def interpolate_pose(
    times: np.ndarray, translations: np.ndarray, rotations: np.ndarray, t: float
) -> tuple[np.ndarray, np.ndarray]:
    """Pose at time t [s] from key samples: translation lerp, rotation shortest-arc slerp, clamped at the ends."""
    times = np.asarray(times, dtype=np.float64)
    if len(times) == 1 or t <= times[0]:
        return np.asarray(translations[0], float), np.asarray(rotations[0], float)
    if t >= times[-1]:
        return np.asarray(translations[-1], float), np.asarray(rotations[-1], float)
    i = int(np.searchsorted(times, t, side="right")) - 1
    s = (t - times[i]) / (times[i + 1] - times[i])
    tr = (1 - s) * np.asarray(translations[i]) + s * np.asarray(translations[i + 1])
    return tr, quat_slerp(rotations[i], rotations[i + 1], s)


def quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product a*b of quaternions (x, y, z, w)."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array(
        [
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
            aw * bw - ax * bx - ay * by - az * bz,
        ]
    )


def quat_from_axis_angle(axis: np.ndarray, angle: float) -> np.ndarray:
    """Quaternion (x, y, z, w) rotating by ``angle`` [rad] about ``axis``."""
    axis = np.asarray(axis, dtype=np.float64)
    axis = axis / np.linalg.norm(axis)
    return np.concatenate([axis * np.sin(angle / 2), [np.cos(angle / 2)]])
