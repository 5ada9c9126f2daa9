"""Shared fixtures: every test that takes ``device`` runs on each available Warp device (the CPU always)."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp

wp.config.log_level = wp.LOG_WARNING
wp.init()

DEVICES = ["cpu"] + [str(d) for d in wp.get_cuda_devices()]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def unbaked(monkeypatch) -> None:
    """Parked instances traced as instances, not baked into the static wide BVH (tests of the instance paths)."""
    from wsim.scene import geometry

    monkeypatch.setattr(geometry, "BAKE_MAX_TRIANGLES", 0)


def box_mesh(lo, hi, inward: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """12-triangle axis-aligned box from corner ``lo`` to ``hi``; normals outward (or inward)."""
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    p = np.array([[x, y, z] for z in (lo[2], hi[2]) for y in (lo[1], hi[1]) for x in (lo[0], hi[0])])
    f = np.array([
        [0, 2, 1], [1, 2, 3],  # z-
        [4, 5, 6], [5, 7, 6],  # z+
        [0, 1, 4], [1, 5, 4],  # y-
        [2, 6, 3], [3, 6, 7],  # y+
        [0, 4, 2], [2, 4, 6],  # x-
        [1, 3, 5], [3, 7, 5],  # x+
    ])
    if inward:
        f = f[:, ::-1]
    return p, f


def quad_mesh(center, u, v) -> tuple[np.ndarray, np.ndarray]:
    """Two-triangle parallelogram centred at ``center`` with half-edge vectors ``u`` and ``v`` (normal u × v)."""
    c, u, v = (np.asarray(a, float) for a in (center, u, v))
    p = np.array([c - u - v, c + u - v, c + u + v, c - u + v])
    return p, np.array([[0, 1, 2], [0, 2, 3]])


def box_room_scene(lo, hi, *, base: str = "calibration_lambertian", coating: str = "none", attributes=(),
                   reflectance: float | None = None, semantic: str = "wall"):
    """A closed room (inward-facing box) with one material: every ray from inside hits a wall."""
    from wsim.scene import Material, MeshData, Part, Scene

    p, f = box_mesh(lo, hi, inward=True)
    s = Scene(MeshData(p, f, 1), source="box_room")
    s.materials.append(Material.from_labels("wall", base, coating, attributes, reflectance=reflectance))
    s.parts.append(Part("/World/Room", material=1, semantic_class=s.semantic_class_index(semantic), object_id=1))
    return s


def add_static(scene, points, faces, *, name: str, base: str = "calibration_lambertian", coating: str = "none",
               attributes=(), reflectance: float | None = None, transmittance: float | None = None,
               semantic: str = "") -> int:
    """Append a static mesh with its own material, part and object id; returns the part index."""
    from wsim.scene import Material, MeshData, Part

    mat = scene.add_material(Material.from_labels(name, base, coating, attributes, reflectance=reflectance,
                                                  transmittance=transmittance))
    oid = max([p.object_id for p in scene.parts] + [i.object_id for i in scene.instances] + [0]) + 1
    part = scene.add_part(Part(f"/World/{name}", material=mat, semantic_class=scene.semantic_class_index(semantic),
                               object_id=oid))
    scene.static = MeshData.concatenate([scene.static, MeshData(points, faces, part)])
    scene._device_cache.clear()
    return part


def empty_scene():
    from wsim.scene import MeshData, Scene

    return Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), 0), source="test")


def uv_sphere(center, radius: float, n_lon: int = 24, n_lat: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """A UV sphere whose faces share their vertices (outward winding): the poles and n_lat − 1 rings of n_lon."""
    th = np.linspace(0.0, np.pi, n_lat + 1)[1:-1]
    ph = np.linspace(0.0, 2 * np.pi, n_lon, endpoint=False)
    ring = np.stack([np.outer(np.sin(th), np.cos(ph)), np.outer(np.sin(th), np.sin(ph)),
                     np.outer(np.cos(th), np.ones(n_lon))], -1).reshape(-1, 3)
    pts = np.concatenate([[[0, 0, 1.0]], ring, [[0, 0, -1.0]]]) * radius + np.asarray(center, float)
    last = len(pts) - 1

    def at(i, j):
        return 1 + i * n_lon + (j % n_lon)

    faces = [[0, at(0, j), at(0, j + 1)] for j in range(n_lon)]
    for i in range(n_lat - 2):
        for j in range(n_lon):
            faces += [[at(i, j), at(i + 1, j), at(i + 1, j + 1)], [at(i, j), at(i + 1, j + 1), at(i, j + 1)]]
    faces += [[last, at(n_lat - 2, j + 1), at(n_lat - 2, j)] for j in range(n_lon)]
    return pts, np.array(faces)
