"""Residuals that do not jump while a calibration moves: point-to-plane distances to the rendered model surface.

A range residual (model range − measured range of the same firing) jumps whenever a firing's return moves to
another surface or appears/disappears (silhouettes, the valid mask), and its gradient does not see those jumps.
Point-to-plane residuals with a **fixed correspondence set** avoid that:

1. *Select* (between solver steps, e.g. :func:`wsim.autodiff.solve.least_squares`'s ``reselect``): render the model
   at the current estimate (a plain render, CARTESIAN coordinates with the ``HitNormal`` channel) and match each
   measured return to the model's return of the same firing (:func:`firing_keys`): its surface point ``q`` and unit
   normal ``n`` (:func:`match_surface`).
2. *Residual* (smooth in the parameters, the set fixed): place each measured point with the parameters being
   solved for (mount, trajectory, emitter angles: torch code) and take its signed distance to the tangent plane
   of its model surface point, ``n · (p(θ) − q)`` [m] (:meth:`SurfaceMatch.residuals`).

The residual is zero where the measured point lies on the model surface; to first order it equals the range
residual times the incidence cosine. Measured returns with no model return (clutter in front of the model, misses)
are simply not matched; returns matched to the wrong surface (a model edge between the two renders) are outliers
for a robust loss and are re-matched at the next selection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..sensors.lidar_config import CoordsType

__all__ = ["firing_keys", "sensor_points", "material_indices", "SurfaceMatch", "match_surface"]


def firing_keys(pc: Any, lidar: Any) -> np.ndarray:
    """(N,) int64 firing keys of a point cloud's returns: equal for the same firing (tick, emitter, echo) of two
    renders of the same sensor configuration, e.g. a measured sweep and a model sweep.

    Args:
        pc: A :class:`wsim.PointCloud` with TickId and EmitterId (and EchoId with more than one return).
        lidar: The :class:`wsim.Lidar` that rendered it (its emitter count and max returns).
    """
    e = int(lidar.config.number_of_emitters)
    key = pc["TickId"].numpy().astype(np.int64) * e + pc["EmitterId"].numpy().astype(np.int64)
    m = int(lidar.config.max_returns)
    if m > 1:
        key = key * m + pc["EchoId"].numpy().astype(np.int64)
    return key


def sensor_points(pc: Any, lidar: Any) -> torch.Tensor:
    """(N, 3) float64 Cartesian points [m] of a point cloud in its own output frame (SPHERICAL coordinates
    (azimuth [deg], elevation [deg], range [m]) are converted: x = r cos(el) cos(az), y = r cos(el) sin(az),
    z = r sin(el))."""
    c = pc["Coordinates"].numpy().astype(np.float64)
    if lidar.config.elements_coords_type is CoordsType.SPHERICAL:
        az, el, r = np.deg2rad(c[0]), np.deg2rad(c[1]), c[2]
        c = np.stack([r * np.cos(el) * np.cos(az), r * np.cos(el) * np.sin(az), r * np.sin(el)])
    return torch.from_numpy(np.ascontiguousarray(c.T))


def material_indices(pc: Any, scene: Any) -> np.ndarray:
    """(N,) int64 index into ``scene.materials`` of the surface each return hit, from the ObjectId channel (the hit
    object's prim-path hash and part number); e.g. to give each intensity residual its material's reflectance as the
    only parameter it depends on.

    −1 where the ObjectId does not name one material: objects whose parts share a hashed prim path and part number
    but differ in material (the built-in block's multi-part static objects all hash their common path
    ``/World/Static``; give each part its own ``object_id`` before the first render to tell them apart), and
    misses."""
    from ..sensors.lidar import object_id_tables

    table, part_number = object_id_tables(scene)
    lookup: dict[tuple[int, ...], int] = {}

    def add(key: tuple[int, ...], material: int) -> None:
        lookup[key] = material if lookup.get(key, material) == material else -1

    for i, part in enumerate(scene.parts):
        if part.object_id:
            add((*table[part.object_id].tolist(), int(part_number[i])), int(part.material))
    for inst in scene.instances:
        for part in np.unique(scene.prototypes[inst.prototype].tri_part):
            add((*table[inst.object_id].tolist(), int(part_number[part])), int(scene.parts[part].material))
    oid = pc["ObjectId"].numpy().reshape(-1, 4)
    if not len(oid):
        return np.zeros(0, np.int64)
    first, inverse = np.unique(_words_key(oid), return_index=True, return_inverse=True)[1:]
    mats = np.array([lookup.get(tuple(row), -1) for row in oid[first].astype(np.int64).tolist()], np.int64)
    return mats[inverse.reshape(-1)]


def _words_key(w: np.ndarray) -> np.ndarray:
    """One uint64 per row of four uint32 words (a 64-bit mix: distinct ObjectIds collide with probability ~2⁻⁶⁴)."""
    w = w.astype(np.uint64)
    with np.errstate(over="ignore"):
        a = (w[:, 0] << np.uint64(32)) | w[:, 1]
        b = (w[:, 2] << np.uint64(32)) | w[:, 3]
        return a * np.uint64(0x9E3779B97F4A7C15) ^ b


@dataclass
class SurfaceMatch:
    """Measured returns matched to the model surface: the fixed correspondence set of point-to-plane residuals.

    Attributes:
        index: (N,) int64 positions of the matched returns among the measured keys given to :func:`match_surface`.
        points: (N, 3) float64 model surface points [m], in the model point cloud's output frame.
        normals: (N, 3) float64 unit surface normals there (same frame; their sign is the mesh winding's).
        model_index: (N,) int64 positions of the matched returns in the model point cloud (to read its other
            channels: intensity, material, firing time).
    """

    index: torch.Tensor
    points: torch.Tensor
    normals: torch.Tensor
    model_index: torch.Tensor

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def residuals(self, points: torch.Tensor) -> torch.Tensor:
        """Signed point-to-plane distances ``n · (p − q)`` [m] (N,) (or (R, N) for (R, N, 3) points) of the
        matched measured points ``points`` (N, 3) placed in the model's frame (differentiable w.r.t. ``points``)."""
        return ((points - self.points) * self.normals).sum(-1)

    def subset(self, keep: torch.Tensor | np.ndarray) -> SurfaceMatch:
        """The correspondences where ``keep`` (N,) bool (or the listed positions) holds."""
        keep = torch.as_tensor(keep)
        return SurfaceMatch(self.index[keep], self.points[keep], self.normals[keep], self.model_index[keep])


def match_surface(measured_keys: np.ndarray, model_pc: Any, model_lidar: Any) -> SurfaceMatch:
    """Match measured returns to a model render's returns of the same firings.

    Args:
        measured_keys: (M,) int64 :func:`firing_keys` of the measured returns.
        model_pc: The model's point cloud: CARTESIAN coordinates (output frame: the frame the residuals are formed
            in, usually WORLD) and the HitNormal channel.
        model_lidar: The :class:`wsim.Lidar` that rendered ``model_pc``.

    Returns:
        The :class:`SurfaceMatch` of every measured return whose firing has a model return (first echo of that
        key when the model has several).
    """
    if model_lidar.config.elements_coords_type is not CoordsType.CARTESIAN:
        raise ValueError("match_surface: the model render needs CARTESIAN coordinates")
    if "HitNormal" not in model_pc.channels:
        raise ValueError("match_surface: the model render needs the HitNormal channel")
    mkey = firing_keys(model_pc, model_lidar)
    order = np.argsort(mkey, kind="stable")
    sk = mkey[order]
    measured_keys = np.asarray(measured_keys, np.int64)
    pos = np.clip(np.searchsorted(sk, measured_keys), 0, max(len(sk) - 1, 0))
    found = (sk[pos] == measured_keys) if len(sk) else np.zeros(len(measured_keys), bool)
    src = order[pos[found]]
    q = model_pc["Coordinates"].numpy().astype(np.float64)[:, src].T
    n = model_pc["HitNormal"].numpy().astype(np.float64)[src]
    n /= np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-12)
    return SurfaceMatch(torch.from_numpy(np.nonzero(found)[0].astype(np.int64)),
                        torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(np.ascontiguousarray(n)),
                        torch.from_numpy(src.astype(np.int64)))
