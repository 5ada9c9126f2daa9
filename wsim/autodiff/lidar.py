"""PyTorch autograd bridge for the lidar.

``lidar_render`` runs :meth:`wsim.Lidar.render` with ``requires_grad=True`` (a first pass picks each return's surface;
a second, differentiable Warp kernel recomputes Coordinates and Intensity from that surface) and returns torch tensors
sharing the Warp arrays' memory. ``.backward()`` seeds the Warp tape with the output gradients and hands the input
gradients back to torch.

Each call is self-contained: the poses, emitter angles, gain and reflectance it differentiates are copies owned by
that render's tape (the lidar's own trajectory, emitter table, gain and the scene's reflectance table are never
written); ``vertex_offsets`` move the shared device mesh for the render only (restored and refitted afterwards, and
set again, without refit, around the backward pass, whose mesh gradients are kept apart from other renders'). Renders
and backwards can therefore be interleaved freely, and later plain renders (lidar or camera) are unaffected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import warp as wp

from ..scene.scene import Trajectory
from ..sensors.lidar import Lidar
from .camera import _mesh_point_arrays, _StaticPoints


@dataclass
class LidarInputs:
    """Differentiable inputs of a lidar render (each optional; None keeps the lidar's/scene's own value).

    Attributes:
        pose_times: (K,) key times [s] of the sensor trajectory (not differentiable); with ``translations`` and
            ``rotations``.
        translations: (K, 3) sensor-to-world translations [m].
        rotations: (K, 4) sensor-to-world quaternions (x, y, z, w) (used as given: keep them unit length).
        azimuth_deg, elevation_deg: (S·E,) emitter angle offsets [deg] per state × emitter.
        gain: (E,) per-emitter intensity gain.
        reflectance: (M,) material reflectance (scene material order).
        vertex_offsets: (V, 3) offsets [m] added to the static mesh's vertices (the BVH is refitted).
    """

    pose_times: Any = None
    translations: torch.Tensor | None = None
    rotations: torch.Tensor | None = None
    azimuth_deg: torch.Tensor | None = None
    elevation_deg: torch.Tensor | None = None
    gain: torch.Tensor | None = None
    reflectance: torch.Tensor | None = None
    vertex_offsets: torch.Tensor | None = None


_ORDER = ("translations", "rotations", "azimuth_deg", "elevation_deg", "gain", "reflectance", "vertex_offsets")


def _f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()


class _LidarRender(torch.autograd.Function):
    @staticmethod
    def forward(ctx, lidar: Lidar, t0: float, t1: float, pose_times, scene, comp_ref: str, *tensors):  # noqa: D401
        ins = dict(zip(_ORDER, tensors))
        ov: dict = {}
        if ins["translations"] is not None or ins["rotations"] is not None:
            base = lidar._pose_trajectory()  # noqa: SLF001
            times = np.asarray(pose_times if pose_times is not None else base.times, np.float64)
            tr = _f32(ins["translations"]) if ins["translations"] is not None else base.translations
            q = _f32(ins["rotations"]) if ins["rotations"] is not None else base.rotations
            traj = Trajectory(times, tr, q)
            traj.rotations = np.asarray(q, np.float64)  # as given (no renormalisation): exact gradients
            ov["trajectory"] = traj
        for name, key in (("azimuth_deg", "azimuth"), ("elevation_deg", "elevation")):
            if ins[name] is not None:
                ov[key] = np.deg2rad(_f32(ins[name]))
        for key in ("gain", "reflectance"):
            if ins[key] is not None:
                ov[key] = _f32(ins[key])
        scene = lidar._scene(scene)  # noqa: SLF001
        geo = scene.device_geometry(lidar.device)
        offsets = None
        if ins["vertex_offsets"] is not None:
            if geo.static_mesh is None:
                raise ValueError("vertex_offsets: the scene has no static mesh")
            nv = len(scene.static.points)
            if tuple(ins["vertex_offsets"].shape) != (nv, 3):
                raise ValueError(f"vertex_offsets: expected ({nv}, 3), got {tuple(ins['vertex_offsets'].shape)}")
            offsets = ins["vertex_offsets"].detach().to(torch.float32)
        frame_id = lidar.frame_id
        # the render sees the offset vertices; the shared device mesh is restored (and refitted) afterwards
        with _StaticPoints(geo, offsets, refit=True):
            pc = lidar.render(t0, t1, scene=scene, compensation_reference=comp_ref, requires_grad=True,
                               _overrides=ov)
        lidar.frame_id = frame_id  # a differentiable render leaves no trace on the sensor
        ctx.pc, ctx.geo, ctx.offsets = pc, geo, offsets
        ctx.shapes = [(t.shape, t.dtype, t.device) if t is not None else None for t in tensors]
        coords = wp.to_torch(pc["Coordinates"], requires_grad=False)
        inten = wp.to_torch(pc["Intensity"], requires_grad=False)
        return coords, inten

    @staticmethod
    def backward(ctx, g_coords, g_inten):
        pc = ctx.pc
        tape = pc.tape
        inputs = pc.inputs
        grads_out: dict[str, np.ndarray] = {}
        if pc.count:
            dev = wp.device_to_torch(pc["Coordinates"].device)
            gc = torch.zeros((3, pc.count), device=dev) if g_coords is None else g_coords
            gi = torch.zeros(pc.count, device=dev) if g_inten is None else g_inten
            grads = {pc["Coordinates"]: wp.from_torch(gc.detach().to(dev, torch.float32).contiguous()),
                     pc["Intensity"]: wp.from_torch(gi.detach().to(dev, torch.float32).contiguous())}
            # the mesh vertex arrays are shared with every render: keep their accumulated gradients aside
            mesh_pts = _mesh_point_arrays(inputs)
            saved = [wp.clone(a.grad) for a in mesh_pts]
            for a in mesh_pts:
                a.grad.zero_()
            try:
                with _StaticPoints(ctx.geo, ctx.offsets, refit=False):  # the vertices the forward pass saw
                    tape.backward(grads=grads)
                g = inputs["poses"].grad.numpy().reshape(-1, 7)
                grads_out["translations"], grads_out["rotations"] = g[:, :3].copy(), g[:, 3:].copy()
                grads_out["azimuth_deg"] = inputs["azimuth"].grad.numpy() * (np.pi / 180.0)
                grads_out["elevation_deg"] = inputs["elevation"].grad.numpy() * (np.pi / 180.0)
                grads_out["gain"] = inputs["gain"].grad.numpy().copy()
                grads_out["reflectance"] = inputs["reflectance"].grad.numpy().copy()
                if ctx.offsets is not None:
                    grads_out["vertex_offsets"] = inputs["static_points"].grad.numpy().copy()
            finally:
                tape.zero()
                for a, s in zip(mesh_pts, saved):
                    wp.copy(a.grad, s)
        out = []
        for name, shp in zip(_ORDER, ctx.shapes):
            if shp is None:
                out.append(None)
                continue
            shape, dtype, device = shp
            g = grads_out.get(name)
            out.append(torch.zeros(shape, dtype=dtype, device=device) if g is None
                       else torch.as_tensor(np.array(g).reshape(shape), dtype=dtype, device=device))
        return (None, None, None, None, None, None, *out)


def point_cloud_of(coords: torch.Tensor) -> Any:
    """The :class:`wsim.PointCloud` behind the ``coords`` returned by :func:`lidar_render` (its id channels, e.g.
    TickId and EmitterId to match returns between renders, and params). Needs an input that requires grad."""
    fn = getattr(coords, "grad_fn", None)
    if fn is None or not hasattr(fn, "pc"):
        raise ValueError("coords: not an output of lidar_render with inputs that require grad")
    return fn.pc


def lidar_render(lidar: Lidar, t0: float, t1: float, inputs: LidarInputs | None = None, *,
                 scene: Any = None, compensation_reference: str = "start") -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable lidar render.

    Args:
        lidar: The sensor (its config decides frame, coordinates type, ray type, ...).
        t0, t1: Render step [s] (scene clock); the same delivery rules as :meth:`wsim.Lidar.render`.
        inputs: Torch tensors to differentiate with respect to (see :class:`LidarInputs`).
        scene: Scene (default: the lidar's).
        compensation_reference: "start" (timestampNs) or "end" (frame end): the reference instant of SENSOR +
            COMPENSATED output, as for :meth:`wsim.Lidar.render`.

    Returns:
        ``coords`` (3, N) float32 — Coordinates, component-first, in the lidar's output frame and representation —
        and ``intensity`` (N,) float32, on the lidar's device, sharing memory with the point cloud's Warp arrays.
        Gradients flow to every tensor of ``inputs`` with ``requires_grad``; :func:`point_cloud_of` gives the point
        cloud (id channels, params) behind ``coords``. Returns are selected by a
        non-differentiable pass: a return appearing or disappearing (silhouettes, range limits, detection threshold,
        echo splits) is a discontinuity the gradient does not see.
    """
    inputs = inputs or LidarInputs()
    tensors = [getattr(inputs, k) for k in _ORDER]
    return _LidarRender.apply(lidar, float(t0), float(t1), inputs.pose_times, scene, compensation_reference,
                              *tensors)
