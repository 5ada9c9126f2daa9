"""Per-request device geometry: the scene's BLASes (static mesh, prototype meshes) shared, the instance key table and
the top-level BVH owned by the request.

A request may override the poses of tracks for its frame (sensorsim ``DynamicObject``). The shared
:class:`~wsim.scene.geometry.SceneGeometry` of a scene is never modified by a request: :func:`request_scene` returns
a shallow copy of the scene whose instance list carries the overrides and whose device geometry is a
:class:`GeometryView` — a new ``SceneGeo`` struct with the same mesh ids, new key arrays (only when there are
overrides) and its own small top-level BVH over the instances. Building one costs a few small uploads and a BVH over
the instance boxes, never a BLAS rebuild; concurrent requests therefore never share a mutable top level.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import warp as wp

from ..kernels import trace as _trace
from ..scene.geometry import SceneGeometry
from ..scene.scene import Instance, Scene

Pose = tuple[np.ndarray, np.ndarray]


class GeometryView(SceneGeometry):
    """Device geometry of one request, sharing the meshes of ``base``.

    It is a :class:`SceneGeometry` (sensors use it like one: ``geo``, ``set_time_window``, ``trace``) whose
    ``instances`` may differ from the base's only in their key samples.

    Args:
        base: The scene's shared geometry.
        scene: The request's scene copy (its ``instances`` hold the overrides).
        instances: The request's instances, one per ``base.instances`` entry, same order and prototypes.
        window: Initial time window [s] of the top-level bounds (None: all key times).
    """

    def __init__(self, base: SceneGeometry, scene: Scene, instances: Sequence[Instance],
                 window: tuple[float, float] | None = None) -> None:  # noqa: D107 - no super().__init__: no rebuild
        if len(instances) != len(base.instances):
            raise ValueError("instances: one per instance of the base geometry")
        self.scene = scene
        self.device = base.device
        self.static_mesh = base.static_mesh
        self.prototype_meshes = base.prototype_meshes
        self._keep = [base]  # the meshes' owner stays alive as long as the view
        self.instances = list(instances)
        self._local_bounds = base._local_bounds
        b = base.geo
        geo = _trace.SceneGeo()
        for name in ("static_mesh", "static_tri_part", "num_instances", "inst_mesh", "inst_part_offset",
                     "inst_object", "inst_semantic", "proto_tri_part", "part_material", "part_object",
                     "part_semantic", "material_code"):
            setattr(geo, name, getattr(b, name))
        changed = any(a is not o for a, o in zip(self.instances, base.instances))
        if changed:
            d, insts = self.device, self.instances
            counts = [len(i.times) for i in insts]
            geo.inst_key_start = wp.array(np.cumsum([0] + counts[:-1]).astype(np.int32), dtype=wp.int32, device=d)
            geo.inst_key_count = wp.array(counts, dtype=wp.int32, device=d)

            def cat(attr: str, width: int) -> np.ndarray:
                return np.concatenate([np.asarray(getattr(i, attr)).reshape(-1, width) for i in insts]).astype(
                    np.float32)

            geo.key_time = wp.array(cat("times", 1).reshape(-1), dtype=float, device=d)
            geo.key_pos = wp.array(cat("translations", 3), dtype=wp.vec3, device=d)
            geo.key_rot = wp.array(cat("rotations", 4), dtype=wp.quat, device=d)
            geo.key_scale = wp.array(cat("scales", 3), dtype=wp.vec3, device=d)
        else:
            for name in ("inst_key_start", "inst_key_count", "key_time", "key_pos", "key_rot", "key_scale"):
                setattr(geo, name, getattr(b, name))
        self.tlas = None
        self.time_window = window
        if self.instances:
            lo, hi = self._swept_bounds(window)
            self._tlas_lowers = wp.array(lo, dtype=wp.vec3, device=self.device)
            self._tlas_uppers = wp.array(hi, dtype=wp.vec3, device=self.device)
            self.tlas = wp.Bvh(self._tlas_lowers, self._tlas_uppers)
            geo.tlas = self.tlas.id
        else:
            geo.tlas = wp.uint64(0)
        self.geo = geo


def track_index(scene: Scene) -> dict[str, int]:
    """Track id → index into ``scene.instances``. An instance answers to its name and, for USD prim paths, to the
    last path element (``/World/Instances/car_3`` is also ``car_3``) when that is unambiguous."""
    out: dict[str, int] = {}
    short: dict[str, list[int]] = {}
    for k, inst in enumerate(scene.instances):
        if inst.name:
            out[inst.name] = k
            if "/" in inst.name:
                short.setdefault(inst.name.rstrip("/").rsplit("/", 1)[-1], []).append(k)
    for name, ks in short.items():
        if len(ks) == 1 and name not in out:
            out[name] = ks[0]
    return out


def override_instance(inst: Instance, t0: float, t1: float, start: Pose, end: Pose) -> Instance:
    """A copy of ``inst`` whose keys are ``start`` at t0 and ``end`` at t1 [s] (one key when t0 == t1); the scale is
    the instance's scale at t0."""
    k = int(np.clip(np.searchsorted(inst.times, t0), 0, len(inst.times) - 1))
    scale = inst.scales[k]
    if t1 > t0:
        times, tr, rot, sc = [t0, t1], [start[0], end[0]], [start[1], end[1]], [scale, scale]
    else:
        times, tr, rot, sc = [t0], [start[0]], [start[1]], [scale]
    return dataclasses.replace(inst, times=np.asarray(times, float), translations=np.asarray(tr, float),
                               rotations=np.asarray(rot, float), scales=np.asarray(sc, float))


def request_scene(scene: Scene, device: str, overrides: dict[int, tuple[Pose, Pose]], t0: float, t1: float) -> Scene:
    """The scene as one request sees it: ``overrides`` (instance index → (start pose, end pose) over [t0, t1] [s])
    applied to a copy of the instance table, with a :class:`GeometryView` as its device geometry on ``device``.

    The shared scene and its geometry are not modified (the shared geometry is built on first use)."""
    base = scene.device_geometry(device)
    instances = list(scene.instances)
    for k, (start, end) in overrides.items():
        instances[k] = override_instance(instances[k], t0, t1, start, end)
    view_scene = dataclasses.replace(scene, instances=instances, _device_cache={})
    by_id = {id(i): n for n, i in enumerate(scene.instances)}
    view_insts = [instances[by_id[id(i)]] for i in base.instances]
    view = GeometryView(base, view_scene, view_insts, (t0, t1))
    view_scene._device_cache[str(base.device)] = view
    return view_scene
