"""PyTorch autograd bridge for the lidar.

``lidar_render`` runs :meth:`wsim.Lidar.render` with ``requires_grad=True`` (a first pass picks each return's surface;
a second, differentiable Warp kernel recomputes Coordinates and Intensity from that surface) and returns torch tensors
sharing the Warp arrays' memory. ``.backward()`` seeds the Warp tape with the output gradients and hands the input
gradients back to torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import warp as wp

from ..scene.scene import Trajectory
from ..sensors.lidar import Lidar


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
    def forward(ctx, lidar: Lidar, t0: float, t1: float, pose_times, scene, *tensors):  # noqa: D401
        ins = dict(zip(_ORDER, tensors))
        if ins["translations"] is not None or ins["rotations"] is not None:
            base = lidar.trajectory
            times = np.asarray(pose_times if pose_times is not None else base.times, np.float64)
            tr = _f32(ins["translations"]) if ins["translations"] is not None else base.translations
            q = _f32(ins["rotations"]) if ins["rotations"] is not None else base.rotations
            traj = Trajectory(times, tr, q)
            traj.rotations = np.asarray(q, np.float64)  # as given (no renormalisation): exact gradients
            lidar.trajectory = traj
            lidar._history.clear()  # noqa: SLF001 - explicit poses replace remembered ones
        em = lidar._emitter_table()  # noqa: SLF001
        if ins["azimuth_deg"] is not None:
            em.az.assign(np.deg2rad(_f32(ins["azimuth_deg"])))
        if ins["elevation_deg"] is not None:
            em.el.assign(np.deg2rad(_f32(ins["elevation_deg"])))
        if ins["gain"] is not None:
            lidar.set_gain(_f32(ins["gain"]))
        scene = lidar._scene(scene)  # noqa: SLF001
        refl = lidar._scene_tables(scene)[0]  # noqa: SLF001
        if ins["reflectance"] is not None:
            refl.assign(_f32(ins["reflectance"]))
        geo = scene.device_geometry(lidar.device)
        if ins["vertex_offsets"] is not None:
            pts = geo.static_mesh.points
            pts.assign(scene.static.points + _f32(ins["vertex_offsets"]))
            geo.refit_static()
        pc = lidar.render(t0, t1, scene=scene, requires_grad=True)
        ctx.pc = pc
        ctx.shapes = [(t.shape, t.dtype, t.device) if t is not None else None for t in tensors]
        coords = wp.to_torch(pc["Coordinates"], requires_grad=False)
        inten = wp.to_torch(pc["Intensity"], requires_grad=False)
        return coords, inten

    @staticmethod
    def backward(ctx, g_coords, g_inten):
        pc = ctx.pc
        tape = pc.tape
        inputs = pc.inputs
        grads = {}
        if pc.count:
            grads[pc["Coordinates"]] = wp.from_torch(g_coords.detach().to(torch.float32).contiguous())
            grads[pc["Intensity"]] = wp.from_torch(g_inten.detach().to(torch.float32).contiguous())
            tape.backward(grads=grads)
        out = []
        for name, shp in zip(_ORDER, ctx.shapes):
            if shp is None:
                out.append(None)
                continue
            shape, dtype, device = shp
            if not pc.count:
                out.append(torch.zeros(shape, dtype=dtype, device=device))
                continue
            if name in ("translations", "rotations"):
                g = inputs["poses"].grad.numpy().reshape(-1, 7)
                g = g[:, :3] if name == "translations" else g[:, 3:]
            elif name in ("azimuth_deg", "elevation_deg"):
                arr = inputs["azimuth" if name == "azimuth_deg" else "elevation"]
                g = arr.grad.numpy() * (np.pi / 180.0)
            elif name == "gain":
                g = inputs["gain"].grad.numpy()
            elif name == "reflectance":
                g = inputs["reflectance"].grad.numpy()
            else:
                g = inputs["static_points"].grad.numpy()
            out.append(torch.as_tensor(np.array(g).reshape(shape), dtype=dtype, device=device))
        # the input arrays are reused by later renders: clear their gradients
        for arr in (inputs.get("azimuth"), inputs.get("elevation"), inputs.get("gain"), inputs.get("reflectance"),
                    inputs.get("static_points"), *inputs.get("prototype_points", [])):
            if arr is not None and arr.grad is not None:
                arr.grad.zero_()
        tape.zero()
        return (None, None, None, None, None, *out)


def point_cloud_of(coords: torch.Tensor) -> Any:
    """The :class:`wsim.PointCloud` behind the ``coords`` returned by :func:`lidar_render` (its id channels, e.g.
    TickId and EmitterId to match returns between renders, and params). Needs an input that requires grad."""
    fn = getattr(coords, "grad_fn", None)
    if fn is None or not hasattr(fn, "pc"):
        raise ValueError("coords: not an output of lidar_render with inputs that require grad")
    return fn.pc


def lidar_render(lidar: Lidar, t0: float, t1: float, inputs: LidarInputs | None = None, *,
                 scene: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable lidar render.

    Args:
        lidar: The sensor (its config decides frame, coordinates type, ray type, ...).
        t0, t1: Render step [s] (scene clock); the same delivery rules as :meth:`wsim.Lidar.render`.
        inputs: Torch tensors to differentiate with respect to (see :class:`LidarInputs`).
        scene: Scene (default: the lidar's).

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
    return _LidarRender.apply(lidar, float(t0), float(t1), inputs.pose_times, scene, *tensors)
