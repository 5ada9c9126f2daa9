"""Closest-hit ray casting benchmark: wsim (Warp BVH) against the fastest CPU ray casters on the same cores.

Usage::

    python benchmarks/raycast.py [--quick] [--threads N] [--device cpu|cuda] [--out FILE.md]
    ./dev.sh bench raycast [options]          # installs the peers first (the ``bench`` extra)

Every engine traces the very same rays against the very same triangles, closest hit only, in one run.

Scenes:

- the built-in street block (``wsim.load_scene("builtin")``, when ``wsim/data/street_block.usdc`` exists; about 0.1 M
  triangles, its two moving cars traced through wsim's two-level BVH and its six parked ones baked into its static
  tree, all flattened into one mesh for the peers);
- a generated ~0.5 M-triangle scene (200 m noisy terrain, random boxes, subdivided spheres);
- 9 copies of that scene on a 3 x 3 grid 205 m apart (no overlap; about 4.5 M triangles; ``--quick``: 2 x 2 copies,
  about 2 M triangles).

Ray sets, both cast from the scene's sensor point (the ego vehicle's first pose on the street, the centre of the
generated scene):

- lidar: 128 elevations (-25..+15 deg) x 3600 azimuths (``--quick``: 1800) from 2 m above the ground, in firing order
  (azimuth-major, one column of elevations per azimuth);
- camera: primary rays of a 1920 x 1080 pinhole camera (``--quick``: 960 x 540) with a 60 deg horizontal field of view,
  1.6 m above the ground, looking along the street (the ego heading) or along +x across the generated scenes; pixel
  centres in row-major order.

Engines and how they are timed: every call casts all rays of the set and returns their hits; after one warm-up call
each, the engines are called in turn, one call each per round, for several rounds (7; 5 on the tiled scene; 3 with
``--quick``), and each keeps its best time, so that a busy spell on a shared machine slows all of them alike:

- wsim: ``SceneGeometry.trace`` with full Hit records (t, point, normal, face, uv, part, material, ids, ...), on 1
  and on N CPU threads (``--threads``, default 2), and with brief records on N threads (``trace(..., brief=True)``:
  t, face, instance, u, v — what Mitsuba's preliminary intersection returns: t, prim_uv, prim_index, shape,
  instance); static meshes use the 8-wide BVH collapsed from Warp's SAH tree. Build: the static ``wp.Mesh`` plus the
  wide BVH, single-threaded.
- Embree 1T: ``embreex`` (Embree 4) ``EmbreeScene.run(..., query="INTERSECT", output=1)``, a C loop of
  ``rtcIntersect1`` on one thread returning u, v, Ng, tfar, primID and geomID. Build: mesh + scene commit (embreex
  commits on the first query, with Embree's own thread pool on all cores).
- Open3D NT: ``open3d.t.geometry.RaycastingScene`` (package ``open3d-cpu``, Embree inside),
  ``cast_rays(rays, nthreads=N)`` on an (n, 6) float32 tensor built before timing; returns t_hit, geometry and
  primitive ids, uvs and normals. Build: ``RaycastingScene(nthreads=N)`` + ``add_triangles`` + the first query (the
  BVH is committed lazily).
- Mitsuba NT: Mitsuba 3 variant ``llvm_ad_rgb`` (Dr.Jit's LLVM backend, Embree inside), ``Scene.ray_intersect_
  preliminary`` on an ``mi.Ray3f`` built and evaluated before timing; inside the timed region ``dr.eval`` of the whole
  PreliminaryIntersection (t, prim_uv, prim_index, shape, ...) and ``dr.sync_thread()``, so the lazy trace runs in
  full; the warm-up call absorbs the JIT compile, later calls hit Dr.Jit's kernel cache but still pay the per-call
  tracing and launch. Timed with ``coherent=True`` (what Mitsuba's path integrator passes for camera rays) and
  ``coherent=False``, which set Embree's coherent/incoherent ray-query flag on the ray packets Dr.Jit hands to
  Embree; the table's Mitsuba column is the faster of the two.
  ``dr.set_thread_count(N)`` before the first scene sizes both Dr.Jit's pool and Mitsuba's Embree device. Build:
  ``mi.Mesh`` filled from NumPy + ``mi.load_dict({"type": "scene", ...})``.

Columns of the main table: Mrays/s of each engine; "fastest peer" is the fastest of Embree 1T, Open3D NT and
Mitsuba NT; "wsim NT brief / fastest peer" is wsim's N-thread rate with brief records over it, target >= 1.0
("met": like for like with Mitsuba, the fastest peer here, whose preliminary intersection holds what a brief record
holds), and the last column the same with full Hit records. A second table gives
the build times, a third the share of rays on which each peer agrees with wsim (same hit/miss and, for hits,
distance within 1 mm), the share of rays that hit, wsim's N-thread scaling and Mitsuba's coherent=False rate.

A peer that is not installed is reported on one line (``./dev.sh bench`` installs them all) and its columns show
"-". With ``--device cuda`` wsim is also timed on the GPU with the lbvh, sah and cubql constructors.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import warp as wp

wp.config.quiet = True

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import wsim  # noqa: E402
from wsim import launch as wlaunch  # noqa: E402
from wsim.scene import MeshData, Scene  # noqa: E402
from wsim.scene import geometry as wgeo  # noqa: E402
from wsim.kernels import trace as _trace  # noqa: E402
from wsim.scene.builtin import icosphere  # noqa: E402
from wsim.scene.widebvh import build_wide_bvh  # noqa: E402
from wsim.scene.transforms import interpolate_pose, quat_to_matrix  # noqa: E402

STREET_FILE = ROOT / "wsim" / "data" / "street_block.usdc"
TILE_PITCH = 205.0  # [m] between copies of the 200 m generated scene
INSTALL_HINT = "./dev.sh bench installs it"

#: Tuning measurements behind wsim's CPU settings (2-core AMD EPYC, synthetic scene, 230k-460k lidar rays, one thread
#: unless noted); written into the report so that reruns keep them.
TUNING_NOTES = """\
## Tuning measurements (CPU)

Synthetic scene (504,642 triangles), lidar rays as above. Run-to-run spread on this shared VM is about +-10 %.

| setting | result |
|---|---|
| BVH leaf size, SAH (1 / 2 / 3 / 4 / 8) | 1.71 / 1.78 / 1.79 / 1.79 / 1.76 Mrays/s per thread (2 threads: 3.36 / 3.46 / 3.47 / 3.33); build 0.31 / 0.22 / 0.19 / 0.15 / 0.12 s. Leaf 2 kept (ties with 3; stays clear of the 32-entry traversal stack limit). |
| constructor on CPU (leaf 2): sah / cubql / median | 1.78 / 1.70 / 1.08 Mrays/s; build 0.22 / 0.06 / 0.16 s. SAH kept as the CPU default. |
| Warp CPU compile options for the tracing kernel (-O2 default, -O3, plain -march=native, no vectorisation) | 1.66-1.84 Mrays/s, all within noise: no change. |
| triangle order (as generated / shuffled / Morton-sorted triangles / + vertices renumbered) | 1.80 / 1.78 / 1.84 / 1.83 Mrays/s: memory layout is not the bottleneck; no reordering. |
| CPU shards for 2 threads (2 / 4 / 8 / 16) | 3.19 / 3.27 / 3.32 / 3.39 Mrays/s: the current 8 shards per thread (16) kept. |
| bare `wp.mesh_query_ray` writing only t, against the full Hit-record kernel | about 1.78 vs 1.68 Mrays/s (about 5 %): not worth a second kernel. |
| 8-wide BVH (Warp's binary SAH tree collapsed, leaves of ≤ 4 triangles) traversed by a native snippet with 8-lane box tests (`wsim/kernels/widebvh.py`), against `mesh_query_ray` | about 3.2× per thread (`benchmarks/wide_bvh/`): adopted for static meshes on the CPU; `WSIM_WIDE_BVH=0` switches it off. |

With Warp's scalar binary-BVH traversal (`mesh_query_ray`, about 1.7-2.0 Mrays/s per core) two cores top out near
0.5x single-thread Embree (SIMD 4/8-wide BVH, 6.5-8.7 Mrays/s); the 8-wide traversal for static meshes on the CPU
reaches about 5 Mrays/s per core, about 1-1.3x single-thread Embree on two cores. Instanced prototypes still use
`mesh_query_ray`.
"""


# ----------------------------------------------------------------------------------------------------------- scenes
def _box(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.array([[x, y, z] for z in (lo[2], hi[2]) for y in (lo[1], hi[1]) for x in (lo[0], hi[0])])
    f = np.array([[0, 2, 1], [1, 2, 3], [4, 5, 6], [5, 7, 6], [0, 1, 4], [1, 5, 4], [2, 6, 3], [3, 6, 7],
                  [0, 4, 2], [2, 4, 6], [1, 3, 5], [3, 7, 5]])
    return p, f


def _terrain_height(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return 0.8 * np.sin(x / 11.0) * np.cos(y / 17.0) + 0.3 * np.sin(x / 3.1 + y / 4.3)


def synthetic_scene(seed: int = 7) -> tuple[Scene, np.ndarray]:
    """~500k triangles: a 200 m noisy terrain grid, 400 random boxes and 8 subdivided spheres; returns the scene and a
    lidar origin 2 m above the ground at its centre."""
    rng = np.random.default_rng(seed)
    n, half = 480, 100.0
    xs = np.linspace(-half, half, n)
    gx, gy = np.meshgrid(xs, xs, indexing="xy")
    gz = _terrain_height(gx, gy) + rng.normal(0.0, 0.03, gx.shape)
    pts = [np.column_stack([gx.ravel(), gy.ravel(), gz.ravel()])]
    i = np.arange(n - 1)
    a = (i[None, :] + n * i[:, None]).ravel()
    faces = [np.concatenate([np.column_stack([a, a + 1, a + n + 1]), np.column_stack([a, a + n + 1, a + n])])]
    off = len(pts[0])

    def add(p: np.ndarray, f: np.ndarray) -> None:
        nonlocal off
        pts.append(p)
        faces.append(f + off)
        off += len(p)

    placed = 0
    while placed < 400:
        c = rng.uniform(-half * 0.9, half * 0.9, 2)
        if np.hypot(*c) < 6.0:  # keep the sensor free
            continue
        size = rng.uniform([0.5, 0.5, 0.5], [8.0, 8.0, 15.0])
        z0 = float(_terrain_height(c[0], c[1])) - 0.5
        add(*_box(np.array([c[0] - size[0] / 2, c[1] - size[1] / 2, z0]),
                  np.array([c[0] + size[0] / 2, c[1] + size[1] / 2, z0 + size[2]])))
        placed += 1
    sp, sf = icosphere(4)  # 5120 triangles (the built-in scene's icosphere)
    for k in range(8):
        ang = 2 * np.pi * k / 8 + 0.3
        r = rng.uniform(10.0, 40.0)
        rad = rng.uniform(1.0, 4.0)
        c = np.array([r * np.cos(ang), r * np.sin(ang), float(_terrain_height(r * np.cos(ang), r * np.sin(ang))) + rad])
        add(sp * rad + c, sf)
    scene = Scene(MeshData(np.concatenate(pts), np.concatenate(faces), 0))
    origin = np.array([0.0, 0.0, float(_terrain_height(0.0, 0.0)) + 2.0])
    return scene, origin


def flatten(scene: Scene, t: float) -> tuple[np.ndarray, np.ndarray]:
    """World-space triangles of the scene at time ``t`` [s] (instances placed by their interpolated keys)."""
    pts = [scene.static.points.astype(np.float64)]
    faces = [scene.static.indices]
    off = len(pts[0])
    for inst in scene.instances:
        proto = scene.prototypes[inst.prototype]
        if not proto.num_triangles:
            continue
        tr, q = interpolate_pose(inst.times, inst.translations, inst.rotations, t)
        sc = np.ones(3) if inst.scales is None else np.asarray(inst.scales, float).reshape(-1, 3)
        if len(sc) > 1:
            sc = np.column_stack([np.interp(t, inst.times, sc[:, k]) for k in range(3)])[0]
        else:
            sc = sc[0]
        pts.append((proto.points * sc) @ quat_to_matrix(q).T + tr)
        faces.append(proto.indices + off)
        off += len(proto.points)
    return np.concatenate(pts).astype(np.float32), np.concatenate(faces).astype(np.int32)


def tiled_scene(scene: Scene, n: int, pitch: float = TILE_PITCH) -> Scene:
    """``n`` x ``n`` copies of the static mesh of ``scene`` on a grid ``pitch`` [m] apart; the copy at grid index
    (0, 0) stays in place (so the sensor point is unchanged), the others lie at -n//2 .. n - n//2 - 1 pitches."""
    p, f = scene.static.points, scene.static.indices
    ks = range(-(n // 2), n - n // 2)
    offs = [np.array([pitch * i, pitch * j, 0.0], p.dtype) for j in ks for i in ks]
    pts = np.concatenate([p + o for o in offs])
    faces = np.concatenate([f + k * len(p) for k in range(len(offs))])
    return Scene(MeshData(pts, faces, 0))


def street_origin(scene: Scene, geo: wgeo.SceneGeometry, height: float = 2.0) -> np.ndarray:
    """A point ``height`` [m] above the ground under the ego vehicle's first pose (or the scene centre)."""
    if scene.ego_trajectory is not None:
        xy = np.asarray(scene.ego_trajectory.pose_at(scene.time_range[0])[0], float)[:2]
    else:
        v = scene.static.points
        xy = 0.5 * (v.min(0) + v.max(0))[:2]
    top = float(scene.static.points[:, 2].max()) + 100.0 if scene.static.num_triangles else 100.0
    h = geo.trace(np.array([[xy[0], xy[1], top]]), np.array([[0.0, 0.0, -1.0]]), scene.time_range[0]).numpy()
    ground = float(h["point"][0, 2]) if h["face"][0] >= 0 else 0.0
    return np.array([xy[0], xy[1], ground + height])


def street_heading(scene: Scene) -> np.ndarray:
    """Horizontal unit vector of the ego vehicle's forward (+x) axis at its first pose (+x without a trajectory)."""
    if scene.ego_trajectory is None:
        return np.array([1.0, 0.0, 0.0])
    q = scene.ego_trajectory.pose_at(scene.time_range[0])[1]
    f = quat_to_matrix(np.asarray(q, float))[:, 0] * np.array([1.0, 1.0, 0.0])
    n = np.linalg.norm(f)
    return f / n if n > 1e-9 else np.array([1.0, 0.0, 0.0])


# ------------------------------------------------------------------------------------------------------------ rays
def lidar_rays(origin: np.ndarray, n_el: int, n_az: int) -> tuple[np.ndarray, np.ndarray]:
    """Spinning-lidar ray fan in firing order (azimuth-major, one column of elevations per azimuth)."""
    el = np.deg2rad(np.linspace(-25.0, 15.0, n_el))
    az = np.linspace(0.0, 2 * np.pi, n_az, endpoint=False)
    A, E = np.meshgrid(az, el, indexing="ij")
    d = np.stack([np.cos(E) * np.cos(A), np.cos(E) * np.sin(A), np.sin(E)], -1).reshape(-1, 3)
    o = np.broadcast_to(np.asarray(origin, np.float32), d.shape)
    return np.ascontiguousarray(o, np.float32), np.ascontiguousarray(d, np.float32)


def camera_rays(origin: np.ndarray, forward: np.ndarray, width: int, height: int,
                hfov_deg: float = 60.0) -> tuple[np.ndarray, np.ndarray]:
    """Primary rays of a level pinhole camera (z up) through the pixel centres, row-major (row 0 at the top);
    unit directions."""
    f = np.asarray(forward, float) / np.linalg.norm(forward)
    right = np.cross(f, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, f)
    focal = 0.5 * width / np.tan(np.deg2rad(hfov_deg) / 2)
    u = np.arange(width) + 0.5 - 0.5 * width
    v = np.arange(height) + 0.5 - 0.5 * height
    V, U = np.meshgrid(v, u, indexing="ij")
    d = focal * f + U[..., None] * right - V[..., None] * up
    d = (d / np.linalg.norm(d, axis=-1, keepdims=True)).reshape(-1, 3)
    o = np.broadcast_to(np.asarray(origin, np.float32), d.shape)
    return np.ascontiguousarray(o, np.float32), np.ascontiguousarray(d, np.float32)


def best_of(fn, reps: int, sync=None) -> float:
    """Best wall time [s] of ``reps`` calls of ``fn``."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        best = min(best, time.perf_counter() - t0)
    return best


def round_robin(calls: dict, reps: int) -> dict[str, float]:
    """Best wall time [s] of each call over ``reps`` rounds, one call of each per round (after one warm-up call of
    each): on a shared machine a busy spell then slows every engine alike instead of one engine's whole series."""
    for fn in calls.values():
        fn()
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(reps):
        for key, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            best[key] = min(best[key], time.perf_counter() - t0)
    return best


# ---------------------------------------------------------------------------------------------------------- engines
def wsim_build_time(scene: Scene, device: str, ctor: str | None, reps: int, warmup: bool = True) -> float:
    """Build time [s] of the static ``wp.Mesh`` (points/indices already on the device) plus, on the CPU, the
    8-wide BVH the tracer uses."""
    d = wp.get_device(device)
    pts = wp.array(scene.static.points, dtype=wp.vec3, device=d)
    idx = wp.array(scene.static.indices.reshape(-1), dtype=wp.int32, device=d)
    c = wgeo._constructor(d, ctor)  # noqa: SLF001 - the constructor SceneGeometry would pick
    keep = []

    def build() -> None:
        mesh = wp.Mesh(points=pts, indices=idx, bvh_constructor=c, bvh_leaf_size=wgeo.BVH_LEAF_SIZE)
        keep.append(mesh)
        if not d.is_cuda and wgeo.WIDE_BVH:
            keep.append(build_wide_bvh(mesh, scene.static.points, scene.static.indices))
        del keep[:-2]

    if warmup:
        build()  # allocators, module load
    t = best_of(build, reps, sync=lambda: wp.synchronize_device(d))
    keep.clear()
    return t


class Peer:
    """A ray caster timed against wsim: ``build`` a scene from flat triangles, ``prepare`` rays once, ``cast`` them
    (the timed call), ``distances`` of a result (inf on a miss)."""

    name = "?"
    package = "?"
    version = "?"

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.scene = None

    def build(self, verts: np.ndarray, faces: np.ndarray) -> None:
        raise NotImplementedError

    def prepare(self, o: np.ndarray, d: np.ndarray):
        raise NotImplementedError

    def cast(self, rays, **kw):
        raise NotImplementedError

    def distances(self, result) -> np.ndarray:
        raise NotImplementedError

    def release(self) -> None:
        self.scene = None


def embree_scene(verts: np.ndarray, faces: np.ndarray):
    """An embreex scene of the triangles, committed (embreex commits on the first query)."""
    from embreex import mesh_construction, rtcore_scene

    s = rtcore_scene.EmbreeScene()
    mesh_construction.TriangleMesh(s, verts, faces)
    s.run(np.zeros((1, 3), np.float32), np.array([[0, 0, 1]], np.float32))
    return s


class EmbreePeer(Peer):
    name = "Embree"
    package = "embreex"

    def __init__(self, threads: int) -> None:
        import embreex

        super().__init__(1)
        self.version = getattr(embreex, "__version__", "?")

    def build(self, verts, faces) -> None:
        self.scene = None
        self.scene = embree_scene(verts, faces)

    def prepare(self, o, d):
        return o, d

    def cast(self, rays, **kw):
        return self.scene.run(rays[0], rays[1], query="INTERSECT", output=1)

    def distances(self, result):
        return np.where(result["geomID"] >= 0, result["tfar"], np.inf)


class Open3DPeer(Peer):
    name = "Open3D"
    package = "open3d-cpu"

    def __init__(self, threads: int) -> None:
        import open3d as o3d
        import open3d.core as o3c

        super().__init__(threads)
        self.version = o3d.__version__
        self._o3d, self._o3c = o3d, o3c

    def build(self, verts, faces) -> None:
        self.scene = None
        o3c = self._o3c
        s = self._o3d.t.geometry.RaycastingScene(nthreads=self.threads)
        s.add_triangles(o3c.Tensor(np.ascontiguousarray(verts, np.float32)),
                        o3c.Tensor(np.ascontiguousarray(faces, np.uint32)))
        s.cast_rays(o3c.Tensor(np.array([[0, 0, 0, 0, 0, 1]], np.float32)), nthreads=self.threads)  # lazy commit
        self.scene = s

    def prepare(self, o, d):
        return self._o3c.Tensor(np.ascontiguousarray(np.hstack([o, d]), np.float32))

    def cast(self, rays, **kw):
        return self.scene.cast_rays(rays, nthreads=self.threads)

    def distances(self, result):
        return result["t_hit"].numpy()


class MitsubaPeer(Peer):
    name = "Mitsuba"
    package = "mitsuba"
    variant = "llvm_ad_rgb"

    def __init__(self, threads: int) -> None:
        import drjit as dr
        import mitsuba as mi

        super().__init__(threads)
        mi.set_variant(self.variant)
        dr.set_thread_count(threads)  # before the first scene: Mitsuba sizes its Embree device from Dr.Jit's pool
        self.version = f"{mi.__version__} (Dr.Jit {dr.__version__})"
        self._mi, self._dr = mi, dr
        self.build(np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], np.float32), np.array([[0, 1, 2]], np.int32))
        self.scene = None  # the warm-up above loaded the plugins

    def build(self, verts, faces) -> None:
        mi, dr = self._mi, self._dr
        self.scene = None
        m = mi.Mesh("mesh", len(verts), len(faces), has_vertex_normals=False, has_vertex_texcoords=False)
        p = mi.traverse(m)
        p["vertex_positions"] = mi.Float(np.ascontiguousarray(verts, np.float32).ravel())
        p["faces"] = mi.UInt32(np.ascontiguousarray(faces, np.uint32).ravel())
        p.update()
        self.scene = mi.load_dict({"type": "scene", "mesh": m})
        dr.sync_thread()

    def prepare(self, o, d):
        mi, dr = self._mi, self._dr
        ray = mi.Ray3f(mi.Point3f(*(mi.Float(np.ascontiguousarray(o[:, k])) for k in range(3))),
                       mi.Vector3f(*(mi.Float(np.ascontiguousarray(d[:, k])) for k in range(3))))
        dr.eval(ray)
        dr.sync_thread()
        return ray

    def cast(self, rays, coherent: bool = True, **kw):
        pi = self.scene.ray_intersect_preliminary(rays, coherent=coherent)
        self._dr.eval(pi)
        self._dr.sync_thread()
        return pi

    def distances(self, result):
        return np.asarray(result.t.numpy(), np.float32)


PEERS = (EmbreePeer, Open3DPeer, MitsubaPeer)


def load_peers(threads: int, notes: list[str]) -> dict[str, Peer | None]:
    """Each peer, or None (with a line in ``notes`` and on stderr) where its package is missing or fails to start."""
    out: dict[str, Peer | None] = {}
    for cls in PEERS:
        try:
            out[cls.name] = cls(threads)
        except Exception as e:  # noqa: BLE001 - a missing peer leaves its columns empty
            line = (f"{cls.name} skipped ({type(e).__name__}: {e}): install the Python package `{cls.package}` "
                    f"({INSTALL_HINT}).")
            print(line, file=sys.stderr)
            notes.append(line)
            out[cls.name] = None
    return out


def fmt_rate(n: int, t: float) -> str:
    return f"{n / t / 1e6:.2f}"


def agreement(t_ref: np.ndarray, hit_ref: np.ndarray, t: np.ndarray) -> float:
    """Share [%] of rays with the same hit/miss as the reference and, for hits, the distance within 1 mm."""
    hit = np.isfinite(t)
    ok = (hit == hit_ref) & (~hit_ref | (np.abs(np.where(hit, t, 0.0) - t_ref) < 1e-3))
    return 100.0 * float(ok.mean())


# ---------------------------------------------------------------------------------------------------------- driver
def bench_cpu(name: str, scene: Scene, ray_sets, peers: dict[str, Peer | None], args, out: dict, first: bool) -> None:
    """Times wsim and every peer on ``ray_sets`` (label -> fn(geo) -> (origins, directions, their grid: wsim is told
    it, ``SceneGeometry.trace(grid=)``, and timed without it too)); appends rows to
    ``out["rates"]``, ``out["builds"]`` and ``out["agree"]``."""
    big = scene.num_triangles > 1_000_000
    reps_build = 1 if (args.quick or big) else 3
    reps = 3 if args.quick else (5 if big else 7)
    nt = args.threads
    t_scene = scene.time_range[0]
    tri = scene.num_triangles
    wb = (wsim_build_time(scene, "cpu", None, reps_build, warmup=first) if scene.static.num_triangles
          else float("nan"))
    verts, faces = flatten(scene, t_scene)
    builds = {}
    for key, peer in peers.items():
        if peer is None:
            builds[key] = None
            continue
        builds[key] = best_of(lambda p=peer: p.build(verts, faces), reps_build)
    out["builds"].append([name, f"{tri:,}", f"{wb:.3f}",
                          *("-" if builds[k] is None else f"{builds[k]:.3f}" for k in peers)])

    geo = wgeo.SceneGeometry(scene, "cpu")
    for label, rays_fn in ray_sets:
        o_np, d_np, grid = rays_fn(geo)
        n = len(o_np)
        o = wp.array(o_np, dtype=wp.vec3, device="cpu")
        d = wp.array(d_np, dtype=wp.vec3, device="cpu")
        tt = wp.full(n, t_scene, dtype=float, device="cpu")
        # every timed call of this ray set, warmed up once (wsim: kernel load; Dr.Jit: the JIT compile)
        calls = {"wsim 1T": lambda: geo.trace(o, d, tt, threads=1, grid=grid),
                 "wsim NT": lambda: geo.trace(o, d, tt, threads=nt, grid=grid),
                 "wsim NT flat": lambda: geo.trace(o, d, tt, threads=nt),
                 "wsim NT brief": lambda: geo.trace(o, d, tt, threads=nt, grid=grid, brief=True)}
        prepared = {}
        for key, peer in peers.items():
            if peer is None:
                continue
            prepared[key] = rays = peer.prepare(o_np, d_np)
            if key == "Mitsuba":
                calls["Mitsuba coherent"] = lambda p=peer, r=rays: p.cast(r, coherent=True)
                calls["Mitsuba incoherent"] = lambda p=peer, r=rays: p.cast(r, coherent=False)
            else:
                calls[key] = lambda p=peer, r=rays: p.cast(r)
        best = round_robin(calls, reps)
        w1, wn = best["wsim 1T"], best["wsim NT"]
        h = geo.trace(o, d, tt, threads=nt).numpy()
        w_hit = h["face"] >= 0
        w_t = np.where(w_hit, h["t"], 0.0)
        del h

        rate: dict[str, float | None] = {}
        agree: dict[str, float | None] = {}
        mi_incoherent = None
        for key, peer in peers.items():
            if peer is None:
                rate[key] = agree[key] = None
                continue
            if key == "Mitsuba":
                mi_incoherent = n / best["Mitsuba incoherent"] / 1e6
                coherent = best["Mitsuba coherent"] <= best["Mitsuba incoherent"]
                out["mitsuba_won"].add(f"coherent={coherent}")
                rate[key] = n / min(best["Mitsuba coherent"], best["Mitsuba incoherent"]) / 1e6
                result = peer.cast(prepared[key], coherent=coherent)
            else:
                rate[key] = n / best[key] / 1e6
                result = peer.cast(prepared[key])
            agree[key] = agreement(w_t, w_hit, peer.distances(result))
        prepared.clear()

        w1r, wnr, wbr = n / w1 / 1e6, n / wn / 1e6, n / best["wsim NT brief"] / 1e6
        avail = [r for r in rate.values() if r is not None]
        fastest = max(avail) if avail else None
        fastest_name = next((k for k, r in rate.items() if r == fastest), "-") if fastest else "-"
        ratio = wbr / fastest if fastest else None
        f2 = (lambda x: "-" if x is None else f"{x:.2f}")
        out["rates"].append([
            name, label, f"{tri:,}", f"{n:,}", f"{w1r:.2f}", f"{wnr:.2f}", f"{wbr:.2f}", f2(rate.get("Embree")),
            f2(rate.get("Open3D")), f2(rate.get("Mitsuba")),
            "-" if fastest is None else f"{fastest:.2f} ({fastest_name})", f2(ratio),
            "-" if ratio is None else ("yes" if ratio >= 1.0 else "no"), f2(wnr / fastest if fastest else None),
        ])
        f3 = (lambda x: "-" if x is None else f"{x:.3f}")
        out["agree"].append([
            name, label, f"{100.0 * w_hit.mean():.1f}", f3(agree.get("Embree")), f3(agree.get("Open3D")),
            f3(agree.get("Mitsuba")), f"{w1 / wn:.2f}", f"{n / best['wsim NT flat'] / 1e6:.2f}", f2(mi_incoherent),
        ])
    for peer in peers.values():
        if peer is not None:
            peer.release()
    if scene.instances:
        baked = len(geo.baked)
        out["notes"].append(f"{name}: {len(scene.instances) - baked} moving instances traced through wsim's two-level "
                            f"BVH and {baked} parked ones baked into its static 8-wide BVH (the build time is the "
                            "static mesh's alone); the peers get the same triangles flattened into one mesh at the ray "
                            "time.")


def bench_cuda(name: str, scene: Scene, origin_fn, args, rows: list[list[str]], device: str = "cuda") -> None:
    dev = wp.get_device(device)
    reps = 5 if args.quick else 20
    t_scene = scene.time_range[0]
    origin = origin_fn(wgeo.SceneGeometry(scene, "cpu"))
    o_np, d_np = lidar_rays(origin, 128, 16384)  # 2.1M rays
    n = len(o_np)
    o = wp.array(o_np, dtype=wp.vec3, device=dev)
    d = wp.array(d_np, dtype=wp.vec3, device=dev)
    tt = wp.full(n, t_scene, dtype=float, device=dev)
    for ctor in ("lbvh", "sah", "cubql"):
        try:
            wb = wsim_build_time(scene, device, ctor, 3)
            geo = wgeo.SceneGeometry(scene, device, bvh_constructor=ctor)
            geo.trace(o, d, tt)
            wp.synchronize_device(dev)
            tr = best_of(lambda: geo.trace(o, d, tt), reps, sync=lambda: wp.synchronize_device(dev))
            rows.append([name, ctor, f"{scene.num_triangles:,}", f"{n:,}", f"{wb * 1e3:.1f}", fmt_rate(n, tr)])
            del geo
        except Exception as e:  # noqa: BLE001 - an unsupported constructor is reported, not fatal
            rows.append([name, ctor, f"{scene.num_triangles:,}", f"{n:,}", "n/a", f"failed: {e}"])


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def machine(peers: dict[str, Peer | None]) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    libs = ", ".join(f"{p.package} {p.version}" for p in peers.values() if p is not None)
    return (f"{cpu}, {wlaunch.cpu_threads()} cores usable, {os.cpu_count()} logical CPUs; Python "
            f"{platform.python_version()}, Warp {wp.__version__}, NumPy {np.__version__}"
            f"{', ' + libs if libs else ''}")


def loadavg() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on Linux
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rays, repetitions and tiles (about a minute)")
    ap.add_argument("--threads", type=int, default=2, help="threads for wsim's, Open3D's and Mitsuba's N-thread "
                                                          "columns (default 2; Embree always runs on one)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="also time wsim on CUDA")
    ap.add_argument("--out", help="also write the report to this Markdown file")
    args = ap.parse_args(argv)
    nt = args.threads

    wp.init()
    t_start = time.perf_counter()
    load_start = loadavg()
    notes: list[str] = []
    out = {"rates": [], "builds": [], "agree": [], "notes": notes, "mitsuba_won": set()}
    cuda_rows: list[list[str]] = []
    peers = load_peers(nt, notes)

    n_az = 1800 if args.quick else 3600
    cam_w, cam_h = (960, 540) if args.quick else (1920, 1080)
    tiles = 2 if args.quick else 3

    def ray_sets(lidar_origin, camera):
        return [("lidar", lambda g: (*lidar_rays(lidar_origin(g), 128, n_az), (n_az, 128))),
                ("camera", lambda g: (*camera_rays(*camera(g), cam_w, cam_h), (cam_h, cam_w)))]

    scenes = []
    if STREET_FILE.exists():
        try:
            street = wsim.load_scene("builtin")
            scenes.append(("street block (builtin)", street,
                           lambda g, s=street: street_origin(s, g),
                           lambda g, s=street: (street_origin(s, g, 1.6), street_heading(s))))
        except Exception as e:  # noqa: BLE001 - report and continue with the synthetic scene
            notes.append(f"street block (builtin): load failed: {type(e).__name__}: {e}")
    else:
        notes.append(f"street block (builtin): skipped, {STREET_FILE.name} not present")
    syn, syn_origin = synthetic_scene()
    syn_camera = syn_origin - np.array([0.0, 0.0, 0.4])  # 1.6 m above the ground
    along_x = np.array([1.0, 0.0, 0.0])
    scenes.append(("synthetic terrain+boxes+spheres", syn, lambda g: syn_origin, lambda g: (syn_camera, along_x)))
    big = tiled_scene(syn, tiles)
    scenes.append((f"synthetic x {tiles * tiles} ({tiles}x{tiles} tiles)", big, lambda g: syn_origin,
                   lambda g: (syn_camera, along_x)))

    for k, (name, scene, ofn, cfn) in enumerate(scenes):
        print(f"{name}: {scene.num_triangles:,} triangles ...", file=sys.stderr, flush=True)
        bench_cpu(name, scene, ray_sets(ofn, cfn), peers, args, out, first=k == 0)
    if args.device == "cuda":
        if wp.get_cuda_device_count() == 0:
            notes.append("--device cuda: no CUDA device available; GPU rows skipped.")
        else:
            for name, scene, ofn, _ in scenes:
                bench_cuda(name, scene, ofn, args, cuda_rows)

    header = ["scene", "rays", "triangles", "ray count", "wsim 1T [Mrays/s]", f"wsim {nt}T [Mrays/s]",
              f"wsim {nt}T brief [Mrays/s]", "Embree 1T [Mrays/s]", f"Open3D {nt}T [Mrays/s]",
              f"Mitsuba {nt}T [Mrays/s]", "fastest peer", f"wsim {nt}T brief / fastest peer (target >= 1.0)", "met",
              f"wsim {nt}T Hit records / fastest peer"]
    text = [table(header, out["rates"])]
    text += ["", f"Build times [s] ({'one build each' if args.quick else 'best of 3; one build on the tiled scene'}):",
             "",
             table(["scene", "triangles", "wsim (1 thread)", "Embree commit (embreex, own pool)",
                    f"Open3D ({nt}T)", f"Mitsuba ({nt}T)"], out["builds"])]
    text += ["", "Agreement with wsim (same hit/miss and, for hits, distance within 1 mm) [%], and details:", "",
             table(["scene", "rays", "wsim hit [%]", "Embree", "Open3D", "Mitsuba", f"wsim scaling {nt}T/1T",
                    f"wsim {nt}T without the grid [Mrays/s]", f"Mitsuba {nt}T coherent=False [Mrays/s]"],
                   out["agree"])]
    if cuda_rows:
        text += ["", table(["scene", "constructor", "triangles", "rays", "build [ms]", "wsim CUDA [Mrays/s]"],
                           cuda_rows)]
    reps = "3" if args.quick else "7 (5 on the tiled scene)"
    ctor = wgeo._constructor(wp.get_device("cpu"), None)  # noqa: SLF001 - the constructor SceneGeometry picks
    won = " and ".join(sorted(out["mitsuba_won"])) or "-"
    won = won if len(out["mitsuba_won"]) != 1 else f"{won} on every row"
    text += ["", f"Closest-hit queries on the same rays and triangles for every engine. Lidar: 128 elevations "
             f"(-25..+15 deg) x {n_az} azimuths from 2 m above the ground, firing order. Camera: {cam_w} x {cam_h} "
             f"pinhole, 60 deg horizontal FOV, 1.6 m above the ground, row-major pixel order. Best of {reps} rounds "
             f"(one call of each engine per round) after a warm-up call each. wsim: static wp.Mesh ({ctor}, leaf "
             f"size {wgeo.BVH_LEAF_SIZE}) collapsed into an 8-wide BVH for the CPU traversal "
             f"({'on' if wgeo.WIDE_BVH else 'off'}), full Hit records on 1 and {nt} threads and brief records (t, face, "
             f"instance, u, v: like for like with Mitsuba's preliminary intersection) on {nt}, told the rays' grid "
             f"(azimuths x elevations, rows x columns: traced in tiles of {_trace.TILE_LONG * _trace.TILE_SHORT} "
             f"neighbours, {_trace.TILE_LONG} along the finer axis; the details table has it without); Embree: embreex "
             f"rtcIntersect1 loop on 1 thread (u, v, Ng, tfar, primID, geomID); Open3D: RaycastingScene.cast_rays("
             f"nthreads={nt}); Mitsuba: {MitsubaPeer.variant}, ray_intersect_preliminary + dr.eval + "
             f"dr.sync_thread with dr.set_thread_count({nt}), the faster of coherent=True and "
             f"coherent=False, Embree's coherent/incoherent ray-query flag (faster here: {won}). Open3D and Mitsuba "
             "both trace with Embree inside. The fastest peer is the fastest of Embree 1T, Open3D and Mitsuba."]
    text += [f"- wsim scaling {nt}T/1T well below {nt} marks a row where other load took cores during the "
             f"measurement; the other {nt}-thread columns of that row are slowed alike (round-robin timing)."]
    text += [f"- {n}" for n in notes]
    text += ["", f"Total benchmark time {time.perf_counter() - t_start:.1f} s; load average (1/5/15 min) "
             f"{load_start} at the start, {loadavg()} at the end."]
    report = "\n".join(text)
    print(report)
    if args.out:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        opts = (f"{' --quick' if args.quick else ''}{f' --threads {nt}' if nt != 2 else ''}"
                f"{' --device cuda' if args.device == 'cuda' else ''}")
        Path(args.out).write_text(f"# Ray casting benchmark\n\nMachine: {machine(peers)}\n\nDate: {stamp}\n\n"
                                  f"Command: `python benchmarks/raycast.py{opts}`\n\n{report}\n\n{TUNING_NOTES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
