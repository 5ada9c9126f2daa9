"""Per-request device geometry: the scene's BLASes (static mesh, prototype meshes) shared, the instance key table and
the top-level BVH owned by the request.

A request may override the poses of tracks for its frame (sensorsim ``DynamicObject``). The shared
:class:`~wsim.scene.geometry.SceneGeometry` of a scene is never modified by a request: :func:`request_scene` returns
a shallow copy of the scene whose instance list carries the overrides and whose device geometry is a view
(:meth:`SceneGeometry.with_instances`) — the same meshes, new key arrays (only when there are overrides) and its own
small top-level BVH over the instances. Building one costs a few small uploads and a BVH over the instance boxes,
never a BLAS rebuild; concurrent requests therefore never share a mutable top level.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..scene.scene import Instance, Scene

Pose = tuple[np.ndarray, np.ndarray]


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
    applied to a copy of the instance table, with a view of the shared geometry as its device geometry on ``device``.

    The shared scene and its geometry are not modified (the shared geometry is built on first use)."""
    base = scene.device_geometry(device)
    instances = list(scene.instances)
    for k, (start, end) in overrides.items():
        instances[k] = override_instance(instances[k], t0, t1, start, end)
    view_scene = dataclasses.replace(scene, instances=instances, _device_cache={})
    by_id = {id(i): n for n, i in enumerate(scene.instances)}
    view_insts = [instances[by_id[id(i)]] for i in base.instances]
    view = base.with_instances(view_scene, view_insts, (t0, t1))
    view_scene._device_cache[str(base.device)] = view
    return view_scene
