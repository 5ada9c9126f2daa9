"""PyTorch autograd bridge for cameras: differentiable DISTANCE images and rolling-shutter point projection.

Each operation is one small function with its tensor contract in the docstring:

- :func:`camera_distance` — (H, W) metric ray distance image; gradients w.r.t. the start/end camera poses, the frame
  times (through moving objects only) and offsets of the static mesh's vertices.
- :func:`project_points` — (N, 2) pixels, (N,) depths, (N,) validity of world points (optionally their (N,) times);
  gradients w.r.t. the points, the start/end camera poses and the frame times (times output only).
- Pose helpers: :func:`se3_exp` (a tangent step, optionally applied to a base pose), :func:`pose_compose`,
  :func:`pose_interpolate`, :func:`trajectory_pose` and :func:`rig_frame_poses` (camera start/end poses of a frame
  from a rig trajectory, a camera-to-rig mount and a differentiable rolling-shutter readout time).

Poses are 7-vectors ``(x, y, z, qx, qy, qz, qw)``: camera-to-world translation [m] and quaternion (x, y, z, w), OpenCV
camera axes (x right, y down, z forward). Quaternions are normalised inside the functions (the gradient is that of the
normalised pose, so it has no component along the quaternion). Tensors may be float32 or float64 on any device;
the renderer works in float32 on the camera's Warp device: outputs are float32 on that device, sharing memory with the
Warp arrays (no copy), and input gradients come back in the inputs' dtype and device.

What is differentiable and what is not:

- Each pixel's rolling-shutter time τ and camera-frame ray (lens unprojection) are constants. The pose at τ is the
  lerp/slerp of the start and end poses (:func:`wsim.kernels.pose.lerp_pose`), so gradients reach both poses.
- DISTANCE: a first pass picks the triangle each pixel sees; the distance is then recomputed from that triangle's
  vertices. Which triangle a pixel sees does not change with the inputs: silhouettes (a pixel switching surface or
  becoming a miss) are discontinuities the gradient does not see. Misses are 0 with zero gradient. Across a crease
  (two non-coplanar faces) the distance is continuous but its gradient jumps.
- Projection: τ is solved by fixed-point iteration on the pixel row/column (piecewise constant, not differentiated);
  pixels and depths are one projection at that τ. Points that are not valid (outside the image or the lens's field
  of view, behind the camera) get zero gradient. A point crossing a readout row/column boundary changes τ: a jump.
- Readout time: the frame end time ``t1`` (= ``t0`` + readout time) enters (a) the end pose — make it a function of
  the readout time with :func:`rig_frame_poses` (the pose along the rig trajectory at ``t0 + readout``), (b) the
  time of each pixel, which places moving objects (DISTANCE, gradient through instance motion), and (c) the times
  output of :func:`project_points` (``t0 + τ (t1 - t0)``). Pass ``t0``/``t1`` as tensors to get (b) and (c).
- Intrinsics (lens parameters), COLOR, SEMANTICS and NORMALS are not differentiable.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import warp as wp

from ..scene.scene import Scene, Trajectory
from ..sensors.camera import Camera
from .poses import quat_multiply, quat_rotate, so3_exp

__all__ = [
    "camera_distance",
    "project_points",
    "se3_exp",
    "pose_compose",
    "pose_interpolate",
    "trajectory_pose",
    "rig_frame_poses",
]

_SMALL2 = 1e-8  # θ² below which series expansions are used


# ---------------------------------------------------------------------------------------------------------------------
# pose helpers (torch, differentiable)


def se3_exp(xi: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """Exponential map of an se(3) tangent vector, optionally applied to a base pose.

    Args:
        xi: (6,) float tensor (ρ (3) [m], φ (3) [rad]): translational and rotational parts.
        base: Optional (7,) pose (x, y, z, qx, qy, qz, qw).

    Returns:
        (7,) pose in ``xi``'s dtype and device: ``exp(ξ)`` = (V(φ) ρ, q(φ)), or ``exp(ξ) ∘ base`` when ``base``
        is given (a step in the world frame; for a step in the base's own frame use
        ``pose_compose(base, se3_exp(xi))``).
        Smooth and differentiable everywhere, including ξ = 0 (series expansions for small angles).
    """
    xi = torch.as_tensor(xi)
    if xi.shape[-1] != 6:
        raise ValueError(f"xi: expected (6,) (rho, phi), got {tuple(xi.shape)}")
    rho, phi = xi[..., :3], xi[..., 3:]
    th2 = (phi * phi).sum(-1, keepdim=True)
    small = th2 < _SMALL2
    th = torch.sqrt(torch.where(small, torch.ones_like(th2), th2))
    b = torch.where(small, 0.5 - th2 / 24.0, (1.0 - torch.cos(th)) / torch.where(small, torch.ones_like(th2), th2))
    c = torch.where(small, 1.0 / 6.0 - th2 / 120.0, (th - torch.sin(th)) / (th * th * th))
    pxr = torch.cross(phi, rho, dim=-1)
    t = rho + b * pxr + c * torch.cross(phi, pxr, dim=-1)
    q = so3_exp(phi)
    pose = torch.cat([t, q], -1)
    if base is None:
        return pose
    return pose_compose(pose, torch.as_tensor(base, dtype=xi.dtype, device=xi.device))


def _normalized(pose: torch.Tensor) -> torch.Tensor:
    q = pose[..., 3:]
    return torch.cat([pose[..., :3], q / q.norm(dim=-1, keepdim=True)], -1)


def pose_compose(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a ∘ b`` (apply ``b`` first) of (..., 7) poses (x, y, z, qx, qy, qz, qw); quaternions are normalised."""
    a, b = _normalized(a), _normalized(b)
    return torch.cat([a[..., :3] + quat_rotate(a[..., 3:], b[..., :3]), quat_multiply(a[..., 3:], b[..., 3:])], -1)


def _slerp_shortest(q0: torch.Tensor, q1: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Shortest-arc slerp of unit quaternions, normalised lerp for nearly equal rotations (as on the device)."""
    d = (q0 * q1).sum(-1, keepdim=True)
    q1 = torch.where(d < 0, -q1, q1)
    d = d.abs()
    near = d > 0.9995
    nl = q0 + s * (q1 - q0)
    nl = nl / nl.norm(dim=-1, keepdim=True)
    th = torch.acos(torch.clamp(d, -1.0, 0.9995))  # the clamp keeps the unused branch finite
    sth = torch.sin(th)
    sl = (torch.sin((1.0 - s) * th) / sth) * q0 + (torch.sin(s * th) / sth) * q1
    return torch.where(near, nl, sl)


def pose_interpolate(p0: torch.Tensor, p1: torch.Tensor, s: torch.Tensor | float) -> torch.Tensor:
    """Pose at fraction ``s`` between (7,) poses: translation lerp, shortest-arc slerp (the renderer's convention).

    Differentiable w.r.t. both poses and ``s`` (a float or a 0-d tensor)."""
    p0, p1 = _normalized(p0), _normalized(p1)
    s = torch.as_tensor(s, dtype=p0.dtype, device=p0.device)
    return torch.cat([p0[..., :3] + s * (p1[..., :3] - p0[..., :3]), _slerp_shortest(p0[..., 3:], p1[..., 3:], s)],
                     -1)


def _trajectory_tensors(trajectory: Any, like: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    if isinstance(trajectory, Trajectory):
        times = np.asarray(trajectory.times, np.float64)
        poses = np.concatenate([trajectory.translations, trajectory.rotations], 1)
        return times, torch.as_tensor(poses, dtype=like.dtype, device=like.device)
    times, poses = trajectory
    times = np.asarray(times.detach().cpu().numpy() if torch.is_tensor(times) else times, np.float64).reshape(-1)
    poses = torch.as_tensor(poses, dtype=like.dtype, device=like.device).reshape(-1, 7)
    if len(times) != poses.shape[0] or len(times) == 0:
        raise ValueError(f"trajectory: {len(times)} times for {poses.shape[0]} poses")
    return times, poses


def trajectory_pose(trajectory: Any, t: torch.Tensor | float) -> torch.Tensor:
    """Pose of a trajectory at time ``t`` [s], differentiable w.r.t. ``t`` and the key poses.

    Args:
        trajectory: A :class:`wsim.Trajectory` (child-to-world keys) or ``(times (K,), poses (K, 7))`` with ``poses`` a
            tensor (may require grad); key times are constants.
        t: Time [s] (float or 0-d tensor).

    Returns:
        (7,) pose (lerp + shortest-arc slerp between the enclosing keys; clamped to the first/last key outside them,
        where the derivative w.r.t. ``t`` is 0), in ``t``'s dtype when a tensor (else float64).
    """
    like = t if torch.is_tensor(t) and t.is_floating_point() else torch.zeros((), dtype=torch.float64)
    t = torch.as_tensor(t, dtype=like.dtype, device=like.device)
    times, poses = _trajectory_tensors(trajectory, like)
    tv = float(t.detach())
    if not np.isfinite(tv):
        raise ValueError(f"t: time must be finite, got {tv}")
    if len(times) == 1 or tv <= times[0]:
        return _normalized(poses[0])
    if tv >= times[-1]:
        return _normalized(poses[-1])
    i = int(np.searchsorted(times, tv, side="right")) - 1
    s = (t - float(times[i])) / float(times[i + 1] - times[i])
    return pose_interpolate(poses[i], poses[i + 1], s)


def rig_frame_poses(trajectory: Any, t0: torch.Tensor | float, readout_time: torch.Tensor | float,
                    camera_to_rig: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Start and end camera-to-world poses of a rolling-shutter frame of a camera mounted on a moving rig.

    Args:
        trajectory: Rig-to-world trajectory (see :func:`trajectory_pose`).
        t0: Frame start [s] (first readout line).
        readout_time: Frame duration [s] (last line at ``t0 + readout_time``); a tensor to calibrate it.
        camera_to_rig: Optional (7,) mount pose (identity if None); a tensor to calibrate the extrinsics.

    Returns:
        ``(start_pose (7,), end_pose (7,), t1)`` with ``t1 = t0 + readout_time``: pass them to :func:`camera_distance`
        / :func:`project_points`. Gradients flow to ``readout_time`` (through the end pose and ``t1``), ``t0`` and
        ``camera_to_rig``.
    """
    ref = next((x for x in (readout_time, t0, camera_to_rig) if torch.is_tensor(x) and x.is_floating_point()), None)
    dt = ref.dtype if ref is not None else torch.float64
    dev = ref.device if ref is not None else None
    t0 = torch.as_tensor(t0, dtype=dt, device=dev)
    t1 = t0 + torch.as_tensor(readout_time, dtype=dt, device=dev)
    start, end = trajectory_pose(trajectory, t0), trajectory_pose(trajectory, t1)
    if camera_to_rig is not None:
        mount = torch.as_tensor(camera_to_rig, dtype=dt, device=dev)
        start, end = pose_compose(start, mount), pose_compose(end, mount)
    return start, end, t1


# ---------------------------------------------------------------------------------------------------------------------
# conversions


def _torch_device(camera: Camera) -> torch.device:
    return wp.device_to_torch(camera.device)


def _pose_input(pose: Any, name: str, camera: Camera) -> torch.Tensor:
    """(7,) float32 normalised pose on the camera's device (differentiable conversion)."""
    if not torch.is_tensor(pose):
        if isinstance(pose, tuple) and len(pose) == 2:
            pose = np.concatenate([np.asarray(pose[0], np.float64).reshape(3), np.asarray(pose[1], np.float64)])
        pose = torch.as_tensor(np.asarray(pose, np.float64))
    if pose.shape != (7,) or not pose.is_floating_point():
        raise ValueError(f"{name}: expected a (7,) float tensor (x, y, z, qx, qy, qz, qw), got {tuple(pose.shape)} "
                         f"{pose.dtype}")
    if not bool(torch.isfinite(pose.detach()).all()):
        raise ValueError(f"{name}: non-finite pose")
    if float(pose.detach()[3:].norm()) < 1e-9:
        raise ValueError(f"{name}: zero quaternion")
    return _normalized(pose).to(device=_torch_device(camera), dtype=torch.float32)


def _times_input(t0: Any, t1: Any, camera: Camera) -> tuple[torch.Tensor, float, float]:
    """(2,) float32 tensor (t0, t1) on the camera's device, and the two times as floats."""
    dev = _torch_device(camera)
    parts = [(t if torch.is_tensor(t) else torch.tensor(float(t), dtype=torch.float64)).reshape(()) for t in (t0, t1)]
    f0, f1 = float(parts[0].detach()), float(parts[1].detach())
    Camera._check_times(f0, f1)  # noqa: SLF001 - the camera's own validation and messages
    times = torch.stack([p.to(device=dev, dtype=torch.float32) for p in parts])
    return times, f0, f1


def _warp_input(t: torch.Tensor, dtype: Any) -> wp.array:
    """A Warp copy of a float32 tensor, with its own gradient buffer."""
    return wp.clone(wp.from_torch(t.detach().contiguous(), dtype=dtype, requires_grad=False), requires_grad=True)


def _grad_out(arr: wp.array, like: torch.Tensor, shape: tuple) -> torch.Tensor:
    return wp.to_torch(arr.grad, requires_grad=False).clone().reshape(shape).to(like.dtype)


def _geometry(camera: Camera, scene: Any) -> Any:
    return scene.device_geometry(camera.device) if isinstance(scene, Scene) else scene


class _StaticPoints:
    """Temporarily sets the static mesh's device vertices to the scene's vertices + offsets; restores them on exit."""

    def __init__(self, geo: Any, offsets: torch.Tensor | None, refit: bool) -> None:
        self.geo, self.offsets, self.refit = geo, offsets, refit
        self.saved: torch.Tensor | None = None

    def __enter__(self) -> _StaticPoints:
        if self.offsets is not None:
            view = wp.to_torch(self.geo.static_mesh.points, requires_grad=False)
            self.saved = view.clone()
            base = torch.as_tensor(np.asarray(self.geo.scene.static.points, np.float32), device=view.device)
            view.copy_(base + self.offsets.to(view.device))
            if self.refit:
                self.geo.refit_static()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            wp.to_torch(self.geo.static_mesh.points, requires_grad=False).copy_(self.saved)
            if self.refit:
                self.geo.refit_static()


def _mesh_point_arrays(inputs: dict) -> list[wp.array]:
    return [a for a in (inputs.get("static_points"), *inputs.get("prototype_points", [])) if a is not None]


# ---------------------------------------------------------------------------------------------------------------------
# DISTANCE


class _CameraDistance(torch.autograd.Function):
    @staticmethod
    def forward(ctx, camera: Camera, geo: Any, t_max: float, t0: float, t1: float, poses: torch.Tensor,
                times: torch.Tensor, offsets: torch.Tensor | None):
        # ``times`` carries (t0, t1) for autograd; the render uses the float values
        poses_wp = _warp_input(poses, wp.transform)
        off = offsets.detach() if offsets is not None else None
        with _StaticPoints(geo, off, refit=True):
            frame = camera.render(geo, t0, t1, ("distance",), poses_wp, t_max=t_max, requires_grad=True)
        ctx.frame, ctx.geo, ctx.offsets = frame, geo, off
        ctx.shapes = (poses.shape, times.shape, None if offsets is None else offsets.shape)
        return wp.to_torch(frame.distance, requires_grad=False)

    @staticmethod
    def backward(ctx, grad_distance: torch.Tensor | None):
        frame, geo = ctx.frame, ctx.geo
        inputs = frame.inputs
        g_poses = g_times = g_off = None
        if grad_distance is not None:
            seed = wp.from_torch(grad_distance.detach().to(torch.float32).contiguous(), requires_grad=False)
            mesh_pts = _mesh_point_arrays(inputs)
            # the mesh vertex arrays are shared with other renders: keep their accumulated gradients aside
            saved = [wp.clone(a.grad) for a in mesh_pts]
            for a in mesh_pts:
                a.grad.zero_()
            try:
                with _StaticPoints(geo, ctx.offsets, refit=False):  # the vertices the forward pass saw
                    frame.tape.backward(grads={frame.distance: seed})
                g_poses = wp.to_torch(inputs["poses"].grad, requires_grad=False).clone()
                g_times = wp.to_torch(inputs["frame_times"].grad, requires_grad=False).clone()
                if ctx.offsets is not None:
                    g_off = wp.to_torch(inputs["static_points"].grad, requires_grad=False).clone()
            finally:
                frame.tape.zero()
                for a, s in zip(mesh_pts, saved):
                    wp.copy(a.grad, s)
        return None, None, None, None, None, g_poses, g_times, g_off


def camera_distance(camera: Camera, scene: Any, t0: float | torch.Tensor, t1: float | torch.Tensor,
                    start_pose: torch.Tensor, end_pose: torch.Tensor | None = None,
                    vertex_offsets: torch.Tensor | None = None, *, t_max: float = 1.0e4) -> torch.Tensor:
    """Differentiable DISTANCE image (metric ‖hit − camera centre‖ per pixel, rolling shutter).

    Args:
        camera: The :class:`wsim.Camera` (lens, shutter, resolution H × W, Warp device).
        scene: A :class:`wsim.Scene` or its ``SceneGeometry`` (device geometry, cached per scene and device).
        t0, t1: Frame start / end [s] (floats, or 0-d float tensors to differentiate w.r.t. them: only moving
            instances depend on them; see :func:`rig_frame_poses` for a readout time that also moves the end pose).
        start_pose: (7,) float camera-to-world pose at ``t0`` (x, y, z, qx, qy, qz, qw), any device.
        end_pose: (7,) pose at ``t1`` (None: equal to ``start_pose``).
        vertex_offsets: Optional (V, 3) float offsets [m] added to the scene's static mesh vertices
            (``scene.static.points``; V = their count). The device mesh is updated and refitted for the render and
            restored afterwards (and again, without refit, around the backward pass).
        t_max: Far limit [m] of the rays.

    Returns:
        (H, W) float32 tensor on the camera's device (shares memory with the Warp array
        ``CameraFrame.distance``); 0 where the ray misses or the pixel is outside the lens's field of view.
        Differentiable w.r.t. ``start_pose``, ``end_pose``, ``t0``/``t1`` (tensors) and ``vertex_offsets``.
        Misses have zero gradient; silhouettes are not differentiated (module docstring).
    """
    geo = _geometry(camera, scene)
    poses = torch.stack([_pose_input(start_pose, "start_pose", camera),
                         _pose_input(start_pose if end_pose is None else end_pose, "end_pose", camera)])
    times, f0, f1 = _times_input(t0, t1, camera)
    offsets = None
    if vertex_offsets is not None:
        if geo.static_mesh is None:
            raise ValueError("vertex_offsets: the scene has no static mesh")
        nv = len(geo.scene.static.points)
        if not torch.is_tensor(vertex_offsets):
            vertex_offsets = torch.as_tensor(np.asarray(vertex_offsets, np.float64))
        if tuple(vertex_offsets.shape) != (nv, 3) or not vertex_offsets.is_floating_point():
            raise ValueError(f"vertex_offsets: expected ({nv}, 3) float (one per static vertex), got "
                             f"{tuple(vertex_offsets.shape)} {vertex_offsets.dtype}")
        if not bool(torch.isfinite(vertex_offsets.detach()).all()):
            raise ValueError("vertex_offsets: non-finite offset")
        offsets = vertex_offsets.to(device=_torch_device(camera), dtype=torch.float32)
    return _CameraDistance.apply(camera, geo, float(t_max), f0, f1, poses, times, offsets)


# ---------------------------------------------------------------------------------------------------------------------
# projection


class _ProjectPoints(torch.autograd.Function):
    @staticmethod
    def forward(ctx, camera: Camera, points: torch.Tensor, poses: torch.Tensor):
        pts_wp = _warp_input(points, wp.vec3)
        poses_wp = _warp_input(poses, wp.transform)
        tape = wp.Tape()
        with tape:
            # frame times (0, 1): the kernel's times output is then the relative time τ itself
            proj = camera.project(pts_wp, 0.0, 1.0, poses_wp)
        valid = wp.to_torch(proj.valid, requires_grad=False) > 0
        ctx.tape, ctx.proj, ctx.pts, ctx.poses, ctx.valid = tape, proj, pts_wp, poses_wp, valid
        pixels = wp.to_torch(proj.pixels, requires_grad=False)
        depths = wp.to_torch(proj.depths, requires_grad=False)
        tau = wp.to_torch(proj.times, requires_grad=False)
        ctx.mark_non_differentiable(tau, valid)
        return pixels, depths, tau, valid

    @staticmethod
    def backward(ctx, g_pixels, g_depths, _g_tau, _g_valid):
        proj, n = ctx.proj, ctx.valid.shape[0]
        if n == 0 or (g_pixels is None and g_depths is None):
            return None, None, None
        m = ctx.valid.to(torch.float32)
        dev = ctx.valid.device
        gp = torch.zeros((n, 2), dtype=torch.float32, device=dev) if g_pixels is None else g_pixels.to(torch.float32)
        gd = torch.zeros(n, dtype=torch.float32, device=dev) if g_depths is None else g_depths.to(torch.float32)
        gp = (gp * m[:, None]).contiguous()  # invalid points: zero gradient
        gd = (gd * m).contiguous()
        try:
            ctx.tape.backward(grads={proj.pixels: wp.from_torch(gp, dtype=wp.vec2, requires_grad=False),
                                     proj.depths: wp.from_torch(gd, requires_grad=False)})
            g_pts = wp.to_torch(ctx.pts.grad, requires_grad=False).clone()
            g_poses = wp.to_torch(ctx.poses.grad, requires_grad=False).clone()
        finally:
            ctx.tape.zero()
        return None, g_pts, g_poses


def project_points(camera: Camera, points: torch.Tensor, t0: float | torch.Tensor, t1: float | torch.Tensor,
                   start_pose: torch.Tensor, end_pose: torch.Tensor | None = None, *,
                   return_times: bool = False) -> tuple[torch.Tensor, ...]:
    """Differentiable rolling-shutter projection of world points (:meth:`wsim.Camera.project`).

    Args:
        camera: The :class:`wsim.Camera`.
        points: (N, 3) float world points [m], any device.
        t0, t1: Frame start / end [s] (floats or 0-d tensors; they only enter the times output).
        start_pose, end_pose: (7,) camera-to-world poses at ``t0``/``t1`` (``end_pose`` None: equal to the start).
        return_times: Also return the (N,) times.

    Returns:
        ``pixels`` (N, 2) float32 (u, v) [px] (corner origin), ``depths`` (N,) float32 camera-frame z [m],
        ``valid`` (N,) bool, on the camera's device (pixels and depths share memory with the Warp arrays); with
        ``return_times`` also ``times`` (N,) = t0 + τ (t1 − t0) [s] in float64 when ``t0``/``t1`` are floats, else in
        their dtype. Pixels and depths are differentiable w.r.t. ``points``, ``start_pose`` and ``end_pose`` (zero
        gradient for invalid points); times w.r.t. ``t0`` and ``t1``. τ (the readout row/column) is piecewise
        constant and not differentiated.
    """
    if not torch.is_tensor(points):
        points = torch.as_tensor(np.asarray(points, np.float64))
    if points.dim() != 2 or points.shape[1] != 3 or not points.is_floating_point():
        raise ValueError(f"points: expected an (N, 3) float tensor, got {tuple(points.shape)} {points.dtype}")
    if not bool(torch.isfinite(points.detach()).all()):
        raise ValueError("points: non-finite point")
    poses = torch.stack([_pose_input(start_pose, "start_pose", camera),
                         _pose_input(start_pose if end_pose is None else end_pose, "end_pose", camera)])
    _times_input(t0, t1, camera)  # validation
    pts = points.to(device=_torch_device(camera), dtype=torch.float32)
    pixels, depths, tau, valid = _ProjectPoints.apply(camera, pts, poses)
    if not return_times:
        return pixels, depths, valid
    ref = next((t for t in (t0, t1) if torch.is_tensor(t) and t.is_floating_point()), None)
    dt = ref.dtype if ref is not None else torch.float64
    a = torch.as_tensor(t0, dtype=dt, device=tau.device)
    b = torch.as_tensor(t1, dtype=dt, device=tau.device)
    return pixels, depths, valid, a + tau.to(dt) * (b - a)
