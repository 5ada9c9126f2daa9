"""Differentiable rigid-pose helpers in PyTorch (quaternions (x, y, z, w), as everywhere in wsim).

They mirror the NumPy helpers of :mod:`wsim.scene.transforms` but keep the autograd graph, so that a calibration
parameter (a mount, a small tangent-space correction) can be composed with a rig trajectory and fed to a
differentiable render (:func:`wsim.torch.lidar_render`, the camera functions) with gradients flowing back.

Conventions: a pose ``(t, q)`` maps child coordinates to parent coordinates, ``p_parent = R(q) p_child + t``;
``compose(a, b)`` is ``a ∘ b`` (apply ``b`` first). Tangent vectors are rotation vectors [rad] (axis · angle).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "as_tensor",
    "quat_multiply",
    "quat_conjugate",
    "quat_rotate",
    "quat_to_matrix",
    "so3_exp",
    "so3_log",
    "compose",
    "inverse",
    "retract",
    "rig_sensor_keys",
    "trajectory_at",
    "rotation_angle_deg",
    "pose_errors",
]

_SMALL = 1e-6


def as_tensor(x: Any, like: torch.Tensor | None = None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``x`` as a tensor (dtype/device of ``like`` when given), without copying a tensor that already fits."""
    if like is not None:
        return torch.as_tensor(x, dtype=like.dtype, device=like.device)
    return torch.as_tensor(x, dtype=dtype)


def quat_multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product ``a * b`` of quaternions (..., 4) (x, y, z, w); broadcasts."""
    ax, ay, az, aw = a.unbind(-1)
    bx, by, bz, bw = b.unbind(-1)
    return torch.stack([
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
        aw * bw - ax * bx - ay * by - az * bz,
    ], -1)


def quat_conjugate(q: torch.Tensor) -> torch.Tensor:
    """Conjugate (the inverse of a unit quaternion)."""
    return torch.cat([-q[..., :3], q[..., 3:]], -1)


def quat_rotate(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotate vectors (..., 3) by unit quaternions (..., 4); broadcasts."""
    shape = torch.broadcast_shapes(q.shape[:-1], v.shape[:-1])
    q, v = q.expand(*shape, 4), v.expand(*shape, 3)
    u, w = q[..., :3], q[..., 3:]
    t = 2.0 * torch.cross(u, v, dim=-1)
    return v + w * t + torch.cross(u, t, dim=-1)


def quat_to_matrix(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrices (..., 3, 3) of unit quaternions (..., 4)."""
    x, y, z, w = q.unbind(-1)
    return torch.stack([
        torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
        torch.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
        torch.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
    ], -2)


def so3_exp(phi: torch.Tensor) -> torch.Tensor:
    """Unit quaternion (..., 4) of rotation vectors (..., 3) [rad]; smooth (and differentiable) at zero."""
    th2 = (phi * phi).sum(-1, keepdim=True)
    small = th2 < _SMALL ** 2
    th = torch.sqrt(torch.where(small, torch.ones_like(th2), th2))
    half_sinc = torch.where(small, 0.5 - th2 / 48.0, torch.sin(0.5 * th) / th)
    w = torch.where(small, 1.0 - th2 / 8.0, torch.cos(0.5 * th))
    return torch.cat([phi * half_sinc, w], -1)


def so3_log(q: torch.Tensor) -> torch.Tensor:
    """Rotation vector (..., 3) [rad] of unit quaternions (..., 4) (the shortest arc: |angle| <= pi)."""
    q = torch.where(q[..., 3:] < 0, -q, q)
    u, w = q[..., :3], q[..., 3:].clamp(-1.0, 1.0)
    s2 = (u * u).sum(-1, keepdim=True)
    small = s2 < _SMALL ** 2
    s = torch.sqrt(torch.where(small, torch.ones_like(s2), s2))
    scale = torch.where(small, 2.0 / w * (1.0 - s2 / (3.0 * w * w)), 2.0 * torch.atan2(s, w) / s)
    return u * scale


def compose(ta: torch.Tensor, qa: torch.Tensor, tb: torch.Tensor, qb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a ∘ b`` of poses given as (translations (..., 3), quaternions (..., 4)); broadcasts."""
    return ta + quat_rotate(qa, tb), quat_multiply(qa, qb)


def inverse(t: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse pose."""
    qi = quat_conjugate(q)
    return -quat_rotate(qi, t), qi


def retract(t: torch.Tensor, q: torch.Tensor, xi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A pose moved by a tangent vector ``xi`` = (δt (3) [m], δφ (3) [rad]): ``(t + δt, exp(δφ) * q)``.

    The translation step is in the parent frame and the rotation step is a rotation about parent-frame axes, so
    ``xi`` reads directly as "how far the pose is off, in the parent frame" (for a mount: in the rig frame).
    """
    return t + xi[..., :3], quat_multiply(so3_exp(xi[..., 3:]), q)


def rig_sensor_keys(rig, mount_t: torch.Tensor, mount_q: torch.Tensor, t0: float, t1: float,
                    margin_keys: int = 1) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Sensor-to-world key poses ``rig(t_k) ∘ mount`` for the rig keys around a render step [t0, t1].

    Args:
        rig: A rig-to-world :class:`wsim.Trajectory` (e.g. ``scene.ego_trajectory``).
        mount_t, mount_q: Sensor-to-rig translation (3,) [m] and quaternion (4,) (torch, may require grad).
        t0, t1: The render step [s].
        margin_keys: Extra rig keys kept on each side of the step (the renderer samples a little outside the step
            for velocities).

    Returns:
        ``(times (K,) numpy, translations (K, 3), rotations (K, 4))`` — the last two differentiable w.r.t. the mount,
        in the mount's dtype; pass them as ``LidarInputs(pose_times=..., translations=..., rotations=...)``.
        Rig and sensor keys share their times, so the renderer's lerp/slerp between keys equals ``rig(t) ∘ mount``
        whenever the rig's rotation is constant between keys (and is its usual key interpolation otherwise).
    """
    times = np.asarray(rig.times, np.float64)
    lo = max(0, int(np.searchsorted(times, t0, side="right")) - 1 - margin_keys)
    hi = min(len(times), int(np.searchsorted(times, t1, side="left")) + 1 + margin_keys)
    sel = slice(lo, hi)
    rt = as_tensor(rig.translations[sel], like=mount_t)
    rq = as_tensor(rig.rotations[sel], like=mount_q)
    tr, q = compose(rt, rq, mount_t.expand(rt.shape), mount_q.expand(rq.shape))
    return times[sel].copy(), tr, q


def trajectory_at(times, translations: torch.Tensor, rotations: torch.Tensor,
                  t: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Poses at times ``t`` (N,) from key poses, as the renderers interpolate them: translation lerp, rotation
    shortest-arc slerp, clamped at the ends. Differentiable w.r.t. the keys (and ``t``)."""
    translations = torch.as_tensor(translations)
    rotations = torch.as_tensor(rotations, dtype=translations.dtype)
    tk = torch.as_tensor(np.asarray(times, np.float64), dtype=translations.dtype)
    t = torch.as_tensor(t, dtype=translations.dtype).reshape(-1)
    if len(tk) == 1:
        n = t.shape[0]
        return translations[0].expand(n, 3), rotations[0].expand(n, 4)
    tc = t.clamp(tk[0], tk[-1])
    i = (torch.searchsorted(tk, tc.detach(), right=True) - 1).clamp(0, len(tk) - 2)
    s = ((tc - tk[i]) / (tk[i + 1] - tk[i]))[:, None]
    tr = (1 - s) * translations[i] + s * translations[i + 1]
    q0, q1 = rotations[i], rotations[i + 1]
    q1 = torch.where((q0 * q1).sum(-1, keepdim=True) < 0, -q1, q1)
    rel = so3_log(quat_multiply(quat_conjugate(q0), q1))
    return tr, quat_multiply(q0, so3_exp(s * rel))


def rotation_angle_deg(qa: torch.Tensor | np.ndarray, qb: torch.Tensor | np.ndarray) -> float:
    """Angle [deg] of the relative rotation between two unit quaternions."""
    qa = torch.as_tensor(np.asarray(qa, np.float64) if not torch.is_tensor(qa) else qa.detach().double())
    qb = torch.as_tensor(np.asarray(qb, np.float64) if not torch.is_tensor(qb) else qb.detach().double())
    d = quat_multiply(quat_conjugate(qb / qb.norm()), qa / qa.norm())
    return float(torch.rad2deg(so3_log(d).norm()))


def pose_errors(t_est, q_est, t_true, q_true) -> tuple[float, float]:
    """(rotation error [deg], translation error [m]) between an estimated and a true pose."""
    te = torch.as_tensor(np.asarray(t_est, np.float64) if not torch.is_tensor(t_est) else t_est.detach().double())
    tt = torch.as_tensor(np.asarray(t_true, np.float64) if not torch.is_tensor(t_true) else t_true.detach().double())
    return rotation_angle_deg(q_est, q_true), float((te - tt).norm())
