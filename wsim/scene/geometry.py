"""Device-side geometry of a :class:`~wsim.scene.scene.Scene`: the static ``wp.Mesh``, one ``wp.Mesh`` (BLAS) per
prototype, the instance table with transform keys, and a top-level ``wp.Bvh`` over instance bounds swept over a time
window. Built once per scene and device; a new time window only refits the top level."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import warp as wp

from .. import launch as _launch
from ..kernels import trace as _trace
from .scene import Scene, set_device_geometry_builder
from .widebvh import box_tree, box_tree_order, build_wide_bvh, build_wide_pool
from .transforms import quat_slerp, quat_to_matrix

BVH_LEAF_SIZE = 2  # measured best for closest-hit rays on the CPU (SAH); see benchmarks/raycast.py
#: Trace the static mesh through an 8-wide BVH on the CPU (about 3× Warp's mesh_query_ray; benchmarks/wide_bvh);
#: WSIM_WIDE_BVH=0 switches it off.
WIDE_BVH = os.environ.get("WSIM_WIDE_BVH", "1") != "0"
#: Parked instances (one transform for all time, positive scales) whose triangles may be copied, in world space, into
#: the static mesh's 8-wide BVH on the CPU, at most: traced there, a parked car costs its triangles alone, not a second
#: traversal in its own frame (the street block's 1080p camera rays 1.3x faster). Their hits keep their instance and
#: prototype face. 0 switches it off (WSIM_BAKE_PARKED=0 too).
BAKE_MAX_TRIANGLES = 2_000_000 if os.environ.get("WSIM_BAKE_PARKED", "1") != "0" else 0


def _constructor(device: wp.context.Device, name: str | None) -> str:
    if name:
        return name
    return "lbvh" if device.is_cuda else "sah"


@dataclass
class Hits:
    """Hit records of a batch of rays (device arrays; convert with :meth:`numpy`).

    Attributes:
        records: ``wp.array`` of :class:`wsim.kernels.trace.Hit` (or :class:`wsim.kernels.trace.HitBrief`: ``trace(...,
            brief=True)``), shape (N,) or (N, max_hits).
        counts: For multi-hit queries, (N,) number of surfaces found per ray; else None.
    """

    records: wp.array
    counts: wp.array | None = None

    def numpy(self) -> dict[str, np.ndarray]:
        """Fields of the hit records as NumPy arrays keyed by field name (``t``, ``point``, ``face``, ...)."""
        rec = self.records.numpy()
        out = {name: rec[name] for name in rec.dtype.names}
        if self.counts is not None:
            out["count"] = self.counts.numpy()
        return out


def _rays_array(x: np.ndarray | wp.array, device) -> wp.array:
    """(N, 3) points or vectors as a ``wp.vec3`` array on ``device``: a Warp array as it is; a float32 C-contiguous
    NumPy array is aliased on the CPU (no copy: :meth:`SceneGeometry.trace` only reads it while it runs), others
    converted once."""
    if isinstance(x, wp.array):
        return x
    a = np.ascontiguousarray(np.asarray(x, np.float32).reshape(-1, 3))
    return wp.array(a, dtype=wp.vec3, device=device, copy=not device.is_cpu)


def _tile(directions: wp.array, rows: int, cols: int) -> tuple[int, int]:
    """Rows × columns of :func:`wsim.kernels.trace.trace_closest_tiles_kernel`'s tile for a row-major grid of rays
    (directions on the CPU): ``TILE_LONG`` along the axis whose neighbours, at the grid's centre, are the nearer in
    angle (a lidar's azimuths, finer than its elevations), ``TILE_SHORT`` along the other (an image's rows)."""
    long, short = _trace.TILE_LONG, _trace.TILE_SHORT
    if rows < 2 or cols < 2:
        return (long * short, 1) if cols < 2 else (1, long * short)
    i = (rows // 2 - 1) * cols + cols // 2 - 1
    # the centre ray, its right and lower neighbours (three rows of the host view: a slice of the wp.array and its
    # 1921 rows cost 50-250 µs a trace)
    d = directions.numpy()[[i, i + 1, i + cols]].astype(np.float64)
    d /= np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-30)
    along_row, along_col = float(d[0] @ d[1]), float(d[0] @ d[2])  # cosines: the larger, the nearer
    return (long, short) if along_col > along_row else (short, long)


class SceneGeometry:
    """The device geometry of a scene. Obtain it with :meth:`Scene.device_geometry` (or :meth:`of`), which builds it
    once per scene and device.

    Args:
        scene: The host scene.
        device: Warp device ("cpu", "cuda:0", ...).
        bvh_constructor: "sah", "lbvh", "median" or "cubql" (default: sah on CPU, lbvh on CUDA).
        leaf_size: BVH leaf size of the static and prototype meshes.
        wide: On the CPU, trace the static mesh and the instance prototypes through 8-wide BVHs (default
            :data:`WIDE_BVH`).
    """

    def __init__(self, scene: Scene, device: str | None = None, *, bvh_constructor: str | None = None,
                 leaf_size: int = BVH_LEAF_SIZE, wide: bool = WIDE_BVH) -> None:
        scene.validate()
        self.scene = scene
        self.device = wp.get_device(device)
        self._answers: dict[tuple, wp.array] = {}  # trace's latest answer arrays, see _answer_array
        self._answers_lock = threading.Lock()
        self._times: dict[int, tuple] = {}  # trace's latest one-time array, see _times_array
        ctor = _constructor(self.device, bvh_constructor)
        d = self.device
        self._keep: list = []
        self._owner = self  # the geometry whose meshes and wide BVHs this one uses (a view: its base)
        self._mesh_options = (ctor, leaf_size)
        self._wide_cache: dict[tuple[int, ...], tuple | None] = {}  # static wide BVHs by the instances baked in

        def mesh(m) -> wp.Mesh:
            pts = wp.array(m.points, dtype=wp.vec3, device=d, requires_grad=True)  # vertex gradients
            idx = wp.array(m.indices.reshape(-1), dtype=wp.int32, device=d)
            msh = wp.Mesh(points=pts, indices=idx, bvh_constructor=ctor, bvh_leaf_size=leaf_size)
            self._keep.append(msh)
            return msh

        geo = _trace.SceneGeo()
        self._wide = wide and not self.device.is_cuda
        if scene.static.num_triangles:
            self.static_mesh = mesh(scene.static)
            geo.static_mesh = self.static_mesh.id
            geo.static_tri_part = wp.array(scene.static.tri_part, dtype=wp.int32, device=d)
        else:
            self.static_mesh = None
            geo.static_mesh = wp.uint64(0)
            geo.static_tri_part = wp.zeros(1, dtype=wp.int32, device=d)

        self.prototype_meshes = [mesh(p) if p.num_triangles else None for p in scene.prototypes]
        proto_offsets = np.cumsum([0] + [p.num_triangles for p in scene.prototypes])
        proto_parts = (np.concatenate([p.tri_part for p in scene.prototypes]) if scene.prototypes
                       else np.zeros(1, np.int32))
        insts = [i for i in scene.instances if self.prototype_meshes[i.prototype] is not None]
        self.instances = insts
        geo.inst_mesh = wp.array([self.prototype_meshes[i.prototype].id for i in insts] or [0], dtype=wp.uint64,
                                 device=d)
        geo.inst_part_offset = wp.array([int(proto_offsets[i.prototype]) for i in insts] or [0], dtype=wp.int32,
                                        device=d)
        self._upload_keys(geo)
        geo.inst_object = wp.array([i.object_id for i in insts] or [0], dtype=wp.int32, device=d)
        geo.inst_semantic = wp.array([i.semantic_class for i in insts] or [0], dtype=wp.int32, device=d)
        geo.proto_tri_part = wp.array(proto_parts, dtype=wp.int32, device=d)

        geo.part_material = wp.array([p.material for p in scene.parts], dtype=wp.int32, device=d)
        geo.part_object = wp.array([p.object_id for p in scene.parts], dtype=wp.int32, device=d)
        geo.part_semantic = wp.array([p.semantic_class for p in scene.parts], dtype=wp.int32, device=d)
        geo.material_code = wp.array([m.material_id for m in scene.materials], dtype=wp.int32, device=d)

        self._local_bounds = [
            (scene.prototypes[i.prototype].points.min(0).astype(np.float64),
             scene.prototypes[i.prototype].points.max(0).astype(np.float64)) for i in insts
        ]
        self.baked = self._parked()
        self._set_wide(geo)
        self._build_tlas(geo, None)
        self._set_proto_wide(geo)
        geo.static_vn = geo.proto_vn = wp.zeros(1, dtype=wp.vec3, device=d)  # ensure_vertex_normals fills them
        starts = np.cumsum([0] + [len(p.points) for p in scene.prototypes])
        geo.inst_vn_start = wp.array([int(starts[i.prototype]) for i in insts] or [0], dtype=wp.int32, device=d)
        self._vertex_normals: tuple[wp.array, wp.array] | None = None
        self.geo = geo

    @classmethod
    def of(cls, scene: Scene, device: str | None = None) -> SceneGeometry:
        """The geometry of ``scene`` on ``device``, built on first use and cached on the scene by device name (what
        :meth:`Scene.device_geometry` returns)."""
        key = str(wp.get_device(device))
        cache = scene._device_cache  # noqa: SLF001 - the scene's slot for derived device data
        if key not in cache:
            cache[key] = cls(scene, device=key)
        return cache[key]

    def _parked(self) -> list[int]:
        """The instances to bake into the static wide BVH (:data:`BAKE_MAX_TRIANGLES`): on the CPU with a wide static
        tree, those whose keys all hold one transform with positive scales, in index order while their triangles fit."""
        if not (self._wide and self.static_mesh is not None and BAKE_MAX_TRIANGLES > 0):
            return []
        out, total = [], 0
        for i, inst in enumerate(self.instances):
            nt = self.scene.prototypes[inst.prototype].num_triangles
            fixed = all(np.all(a == a[0]) for a in (inst.translations, inst.rotations, inst.scales))
            if fixed and np.all(inst.scales[0] > 0) and total + nt <= BAKE_MAX_TRIANGLES:
                out.append(i)
                total += nt
        return out

    def _static_wide(self, baked: tuple[int, ...]) -> tuple[dict, np.ndarray, np.ndarray] | None:
        """The 8-wide BVH of the static mesh with the world-space triangles of instances ``baked`` after its own
        (made once per set, by the owner geometry), and the instance and prototype face of each baked triangle; None
        where the wide traversal can't serve it."""
        owner = self._owner
        if baked in owner._wide_cache:
            return owner._wide_cache[baked]
        if not baked:
            w = build_wide_bvh(self.static_mesh)
            out = None if w is None else (w, np.zeros(1, np.int32), np.zeros(1, np.int32))
        else:
            # the static mesh's vertices as the device mesh has them now (refit_static: edited in place)
            st_pts = self.static_mesh.points.numpy()
            pts, idx, inst_of, face_of = [st_pts], [self.static_mesh.indices.numpy().reshape(-1, 3)], [], []
            off = len(st_pts)
            for i in baked:
                inst = self.instances[i]
                proto = self.scene.prototypes[inst.prototype]
                # the transform as sample_keys places it: rotate the scaled point, then translate
                p = (proto.points.astype(np.float64) * inst.scales[0]) @ quat_to_matrix(inst.rotations[0]).T
                pts.append(p + inst.translations[0])
                idx.append(proto.indices.reshape(-1, 3) + off)
                off += len(proto.points)
                inst_of.append(np.full(proto.num_triangles, i, np.int32))
                face_of.append(np.arange(proto.num_triangles, dtype=np.int32))
            ctor, leaf = owner._mesh_options
            mesh = wp.Mesh(points=wp.array(np.concatenate(pts).astype(np.float32), dtype=wp.vec3, device=self.device),
                           indices=wp.array(np.concatenate(idx).astype(np.int32).reshape(-1), dtype=wp.int32,
                                            device=self.device),
                           bvh_constructor=ctor, bvh_leaf_size=leaf)
            w = build_wide_bvh(mesh)  # (the tree holds copies of the vertices: the mesh is not kept)
            out = None if w is None else (w, np.concatenate(inst_of), np.concatenate(face_of))
        owner._wide_cache[baked] = out
        return out

    def _set_wide(self, geo: _trace.SceneGeo) -> None:
        """Attach the static mesh's 8-wide BVH (CPU), with the instances :attr:`baked` in it, to ``geo``, or switch it
        off (CUDA, or a mesh it can't serve; nothing baked then)."""
        d = self.device
        got = self._static_wide(tuple(self.baked)) if self._wide and self.static_mesh is not None else None
        geo.use_wide = 0 if got is None else 1
        if got is None:
            self.baked = []
            w = {k: wp.zeros(1, dtype=dt, device=d) for k, dt in (
                ("boxes", float), ("child", wp.int32), ("v0", wp.vec3), ("e1", wp.vec3), ("e2", wp.vec3),
                ("fid", wp.int32))}
            inst_of = face_of = np.zeros(1, np.int32)
        else:
            w, inst_of, face_of = got
        for k, v in w.items():
            setattr(geo, "wide_" + k, v)
        geo.baked_from = self.scene.static.num_triangles if self.baked else np.iinfo(np.int32).max
        geo.baked_inst = wp.array(inst_of, dtype=wp.int32, device=d)
        geo.baked_face = wp.array(face_of, dtype=wp.int32, device=d)

    def _set_proto_wide(self, geo: _trace.SceneGeo) -> None:
        """Attach the prototypes' 8-wide BVHs (one pool, CPU) and each instance's root in it to ``geo``; −1 roots
        (CUDA, or a prototype the wide traversal can't serve) keep ``mesh_query_ray``."""
        d = self.device
        pool = build_wide_pool(self.prototype_meshes) if self._wide and self.instances else None
        if pool is None:
            roots = [-1] * len(self.prototype_meshes)
            w = {k: wp.zeros(1, dtype=dt, device=d) for k, dt in (
                ("boxes", float), ("child", wp.int32), ("v0", wp.vec3), ("e1", wp.vec3), ("e2", wp.vec3),
                ("fid", wp.int32))}
        else:
            w, roots = pool
        self._proto_wide_roots = roots
        geo.inst_wide_root = wp.array([roots[i.prototype] for i in self.instances] or [-1], dtype=wp.int32,
                                      device=d)
        for k, name in (("boxes", "boxes"), ("child", "child"), ("v0", "v0"), ("e1", "v1"), ("e2", "v2"),
                        ("fid", "fid")):
            setattr(geo, "proto_wide_" + name, w[k])

    def refit_static(self) -> None:
        """After editing the static mesh's points in place (``static_mesh.points``): refit its BVH and rebuild the
        wide BVH the CPU traversal uses."""
        if self.static_mesh is None:
            return
        self.static_mesh.refit()
        self._owner._wide_cache.clear()
        self._set_wide(self.geo)

    def _upload_keys(self, geo: _trace.SceneGeo) -> None:
        """Upload the instances' transform keys (times, translations, rotations, scales) into ``geo``."""
        d, insts = self.device, self.instances
        counts = [len(i.times) for i in insts]
        geo.inst_key_start = wp.array(np.cumsum([0] + counts[:-1]).astype(np.int32) if insts else [0],
                                      dtype=wp.int32, device=d)
        geo.inst_key_count = wp.array(counts or [0], dtype=wp.int32, device=d)

        def cat(attr: str, width: int) -> np.ndarray:
            if not insts:
                return np.zeros((1, width), np.float32)
            return np.concatenate([np.asarray(getattr(i, attr)).reshape(-1, width) for i in insts]).astype(np.float32)

        geo.key_time = wp.array(cat("times", 1).reshape(-1), dtype=float, device=d)
        geo.key_pos = wp.array(cat("translations", 3), dtype=wp.vec3, device=d)
        geo.key_rot = wp.array(cat("rotations", 4), dtype=wp.quat, device=d)
        geo.key_scale = wp.array(cat("scales", 3), dtype=wp.vec3, device=d)

    def _build_tlas(self, geo: _trace.SceneGeo, window: tuple[float, float] | None) -> None:
        """The top-level BVH over the bounds of the instances traced as instances (all but :attr:`baked`) swept over
        ``window`` [s] (None: all key times)."""
        self.tlas = None
        self.time_window = window
        self._window_lock = threading.Lock()
        self._window_users = 0  # open time_window blocks
        baked = set(self.baked)
        self._traced = np.array([i for i in range(len(self.instances)) if i not in baked], np.int64)
        geo.num_instances = len(self._traced)
        geo.inst_traced = wp.array(self._traced.astype(np.int32) if len(self._traced) else [0], dtype=wp.int32,
                                   device=self.device)
        if self.instances:
            lo, hi = self._swept_bounds(window)
            geo.inst_lo = wp.array(lo, dtype=wp.vec3, device=self.device)
            geo.inst_hi = wp.array(hi, dtype=wp.vec3, device=self.device)
            lo, hi = lo[self._traced], hi[self._traced]
        else:
            geo.inst_lo = geo.inst_hi = wp.zeros(1, dtype=wp.vec3, device=self.device)  # (a struct's arrays are set)
            lo = hi = np.zeros((0, 3), np.float32)
        self._set_traced_box(geo, lo, hi)
        if len(self._traced):
            self._tlas_lowers = wp.array(lo, dtype=wp.vec3, device=self.device)  # refit in place with the tree
            self._tlas_uppers = wp.array(hi, dtype=wp.vec3, device=self.device)
            self.tlas = wp.Bvh(self._tlas_lowers, self._tlas_uppers)
            geo.tlas = self.tlas.id
        else:
            geo.tlas = wp.uint64(0)
        # CPU: an 8-wide tree over the same boxes tells the rays that cannot meet any (most of them) before the
        # top-level query; its topology stays, its boxes are refit with the top level's
        geo.use_inst_cull = int(bool(len(self._traced)) and self._wide)
        if geo.use_inst_cull:
            self._cull_order = box_tree_order(lo, hi)
            boxes, child = box_tree(lo, hi, self._cull_order)
            geo.inst_cull_boxes = wp.array(boxes, dtype=float, device=self.device)
            geo.inst_cull_child = wp.array(child, dtype=wp.int32, device=self.device)
        else:
            geo.inst_cull_boxes = wp.zeros(1, dtype=float, device=self.device)
            geo.inst_cull_child = wp.zeros(1, dtype=wp.int32, device=self.device)

    def _set_traced_box(self, geo: _trace.SceneGeo, lo: np.ndarray, hi: np.ndarray) -> None:
        """The box of the traced instances' boxes ``lo``, ``hi`` (zeros where there are none: then unused)."""
        if len(lo):
            geo.traced_lo, geo.traced_hi = wp.vec3(*lo.min(0)), wp.vec3(*hi.max(0))
        else:
            geo.traced_lo = geo.traced_hi = wp.vec3(0.0, 0.0, 0.0)

    def with_instances(self, scene: Scene, instances: list, window: tuple[float, float] | None = None
                       ) -> SceneGeometry:
        """A geometry sharing this one's meshes (no BLAS rebuild) whose instances carry other transform keys — the
        same prototypes in the same order as :attr:`instances` — with its own key arrays and top-level BVH.
        For per-request overrides of moving objects; this geometry is not modified.

        Args:
            scene: The scene the view belongs to (its instance list holds ``instances``).
            instances: One instance per entry of :attr:`instances`.
            window: Time window [s] of the view's top-level bounds (None: all key times).
        """
        if len(instances) != len(self.instances) or any(
                a.prototype != b.prototype for a, b in zip(instances, self.instances)):
            raise ValueError("instances: one per instance of the base geometry, same prototypes and order")
        view = object.__new__(SceneGeometry)
        view.scene, view.device = scene, self.device
        view.static_mesh, view.prototype_meshes = self.static_mesh, self.prototype_meshes
        view._keep = [self]  # the meshes' owner lives as long as the view
        view._answers, view._answers_lock, view._times = {}, threading.Lock(), {}  # (its own answers)
        view.instances = list(instances)
        view._local_bounds = self._local_bounds
        if all(a is b for a, b in zip(view.instances, self.instances)):  # the same keys: the same key boxes
            view._key_box_cache = getattr(self, "_key_box_cache", None)
        view._wide = self._wide
        view._vertex_normals = self._vertex_normals
        view._owner = self._owner
        geo = _trace.SceneGeo()
        for name in _trace.SceneGeo.vars:
            setattr(geo, name, getattr(self.geo, name))
        if any(a is not b for a, b in zip(view.instances, self.instances)):
            view._upload_keys(geo)
        # the baked instances stay baked while the view keeps them; one moved, the static tree without them (made
        # once) and every instance traced as one
        view.baked = self.baked
        if any(view.instances[i] is not self.instances[i] for i in self.baked):
            view.baked = []
            view._set_wide(geo)
        view._build_tlas(geo, window)
        view.geo = geo
        return view

    def ensure_vertex_normals(self) -> None:
        """Compute (once) the vertex normals of the static mesh and the prototypes (angle-weighted, see
        :func:`_vertex_normals`) and put them in :attr:`geo`, where smooth shading normals read them: a surface
        whose faces share vertices shades smoothly, one whose faces do not (split vertices) keeps its creases."""
        if self._vertex_normals is None:
            base = self._keep[0] if self._keep and isinstance(self._keep[0], SceneGeometry) else self
            if base is not self:
                base.ensure_vertex_normals()
                self._vertex_normals = base._vertex_normals
            else:
                d = self.device
                sv = _vertex_normals(self.scene.static) if self.scene.static.num_triangles else np.zeros((1, 3))
                pv = [_vertex_normals(p) for p in self.scene.prototypes]
                pv = np.concatenate(pv) if pv and sum(len(v) for v in pv) else np.zeros((1, 3))
                self._vertex_normals = (wp.array(sv.astype(np.float32), dtype=wp.vec3, device=d),
                                        wp.array(pv.astype(np.float32), dtype=wp.vec3, device=d))
        self.geo.static_vn, self.geo.proto_vn = self._vertex_normals

    @property
    def num_triangles(self) -> int:
        return self.scene.num_triangles

    def set_time_window(self, t0: float | None, t1: float | None = None) -> None:
        """Tighten the top-level bounds to the instances' motion over [t0, t1] [s] (None: all key times).

        Rays whose time lies outside the window may miss moving objects. Not for geometry other threads trace at
        the same time: sensors use :meth:`hold_time_window`.
        """
        window = None if t0 is None else (float(t0), float(t1 if t1 is not None else t0))
        with self._window_lock:
            self._refit_window(window)

    @contextmanager
    def hold_time_window(self, t0: float | None, t1: float | None = None) -> Iterator[None]:
        """Within the block, the top-level bounds cover the instances' motion over [t0, t1] [s] (None: all key
        times) — tight when no other block is open, else the union with the windows of the blocks open in other
        threads (the bounds then only grow while those renders trace, so none of them misses a moving object)."""
        window = None if t0 is None else (float(t0), float(t1 if t1 is not None else t0))
        with self._window_lock:
            if self._window_users:
                cur = self.time_window
                window = None if window is None or cur is None else (min(cur[0], window[0]), max(cur[1], window[1]))
            self._window_users += 1
            self._refit_window(window)
        try:
            yield
        finally:
            with self._window_lock:
                self._window_users -= 1

    def _refit_window(self, window: tuple[float, float] | None) -> None:
        if self.tlas is None or window == self.time_window:
            return
        lo, hi = self._swept_bounds(window)
        self.geo.inst_lo.assign(lo)
        self.geo.inst_hi.assign(hi)
        lo, hi = lo[self._traced], hi[self._traced]
        self._set_traced_box(self.geo, lo, hi)
        self._tlas_lowers.assign(lo)
        self._tlas_uppers.assign(hi)
        self.tlas.refit()
        if self.geo.use_inst_cull:
            self.geo.inst_cull_boxes.assign(box_tree(lo, hi, self._cull_order)[0])
        self.time_window = window

    def _swept_bounds(self, window: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray]:
        """World bounds (float32 lows, highs) of each instance's local box swept over its key segments inside
        ``window`` (None: all keys): corners at 4 sub-steps per segment, padded by the arc between them — the
        union of the boxes of those segments (:meth:`_key_boxes`, made once), or of the one key that holds the
        window."""
        seg_lo, seg_hi, seg_pad, seg_big, soff, key_lo, key_hi, key_big, koff = self._key_boxes()
        n = len(self.instances)
        lo = np.empty((n, 3))
        hi = np.empty((n, 3))
        pad = np.zeros(n)
        big = np.empty(n)
        for idx, inst in enumerate(self.instances):
            ts = inst.times
            if window is None or len(ts) == 1:
                i0, i1 = 0, len(ts) - 1
            else:
                t0, t1 = window
                i0 = max(0, int(np.searchsorted(ts, t0, side="right")) - 1)
                i1 = min(len(ts) - 1, int(np.searchsorted(ts, t1, side="left")))
            if i1 == i0:
                k = koff[idx] + i0
                lo[idx], hi[idx], big[idx] = key_lo[k], key_hi[k], key_big[k]
            else:
                r = slice(soff[idx] + i0, soff[idx] + i1)
                lo[idx], hi[idx] = seg_lo[r].min(0), seg_hi[r].max(0)
                pad[idx], big[idx] = seg_pad[r].max(), seg_big[r].max()
        eps = 1e-4 * (1.0 + big)
        return ((lo - (pad + eps)[:, None]).astype(np.float32), (hi + (pad + eps)[:, None]).astype(np.float32))

    def _key_boxes(self) -> tuple:
        """Per key segment of every instance (rows ``soff[i]`` on for instance i) the box of its local box's corners
        at 4 sub-steps, the arc between sub-steps and the largest coordinate magnitude; per key (rows ``koff[i]``
        on) the box of the corners and the largest magnitude. Made once (the instances' keys are fixed for the
        life of a geometry, as its device key arrays are), all segments in one vectorised pass."""
        cached = getattr(self, "_key_box_cache", None)
        if cached is not None:
            return cached
        insts = self.instances
        counts = np.array([len(i.times) for i in insts])
        koff = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        nseg = np.maximum(counts - 1, 0)
        soff = np.concatenate([[0], np.cumsum(nseg)[:-1]]).astype(np.int64)
        q_all = np.concatenate([np.asarray(i.rotations, np.float64).reshape(-1, 4) for i in insts])
        s_all = np.concatenate([np.asarray(i.scales, np.float64).reshape(-1, 3) for i in insts])
        t_all = np.concatenate([np.asarray(i.translations, np.float64).reshape(-1, 3) for i in insts])
        blo = np.array([b[0] for b in self._local_bounds])
        bhi = np.array([b[1] for b in self._local_bounds])
        corners = np.stack([np.stack([blo[:, 0] if x == 0 else bhi[:, 0], blo[:, 1] if y == 0 else bhi[:, 1],
                                      blo[:, 2] if z == 0 else bhi[:, 2]], -1)
                            for x in (0, 1) for y in (0, 1) for z in (0, 1)], 1)  # (n, 8, 3)
        # every key: its corners
        k_own = np.repeat(np.arange(len(insts)), counts)
        v = corners[k_own] * s_all[:, None]
        p = np.einsum("mcj,mij->mci", v, quat_to_matrix(q_all)) + t_all[:, None]
        key_lo, key_hi, key_big = p.min(1), p.max(1), np.abs(p).max((1, 2))
        # every segment: its corners at the sub-steps, and the arc between them
        own = np.repeat(np.arange(len(insts)), nseg)
        a = np.concatenate([np.arange(c - 1) + k for c, k in zip(counts, koff)]).astype(np.int64) if len(own) \
            else np.zeros(0, np.int64)
        seg_lo, seg_hi = np.zeros((len(a), 3)), np.zeros((len(a), 3))
        seg_pad, seg_big = np.zeros(len(a)), np.zeros(len(a))
        if len(a):
            b = a + 1
            qa, qb = q_all[a], q_all[b]
            sub = 4  # sub-steps per key segment; the arc between them is covered by the pad
            ang = 2 * np.arccos(np.minimum(1.0, np.abs(np.sum(qa * qb, -1))))
            rad = np.linalg.norm(corners[own], axis=2).max(1) * np.maximum(np.abs(s_all[a]).max(1),
                                                                            np.abs(s_all[b]).max(1))
            seg_pad = np.maximum(0.0, rad * (1 - np.cos(ang / sub / 2)))
            f = np.linspace(0, 1, sub + 1)
            q = quat_slerp(qa[:, None], qb[:, None], f[None, :])  # (m, 5, 4)
            sc = (1 - f)[None, :, None] * s_all[a][:, None] + f[None, :, None] * s_all[b][:, None]
            tr = (1 - f)[None, :, None] * t_all[a][:, None] + f[None, :, None] * t_all[b][:, None]
            v = corners[own][:, None] * sc[:, :, None]  # (m, 5, 8, 3)
            p = (np.einsum("mscj,msij->msci", v, quat_to_matrix(q)) + tr[:, :, None]).reshape(len(a), -1, 3)
            seg_lo, seg_hi, seg_big = p.min(1), p.max(1), np.abs(p).max((1, 2))
        self._key_box_cache = (seg_lo, seg_hi, seg_pad, seg_big, soff, key_lo, key_hi, key_big, koff)
        return self._key_box_cache

    def _times_array(self, times: np.ndarray | wp.array | float, n: int) -> wp.array:
        """The rays' times as a Warp array of ``n``: a Warp array as it is; one time for all rays in an array kept for
        reuse once nothing holds it (a fresh 8 MB array a 1080p trace was paid page by page; refilled only when the
        time changes); float32 C-contiguous (n,) NumPy times aliased on the CPU, others converted once."""
        if isinstance(times, wp.array):
            return times
        x = np.asarray(times, np.float32)
        if x.size != 1:
            a = np.ascontiguousarray(x if x.shape == (n,) else np.broadcast_to(x, (n,)))
            return wp.array(a, dtype=float, device=self.device, copy=not self.device.is_cpu)
        value = np.float32(x.reshape(-1)[0])
        with self._answers_lock:
            arr, held = self._times.get(n, (None, None))
            # references: the dict's tuple, the local name and getrefcount's argument; one more is a trace's
            if arr is None or sys.getrefcount(arr) > 3 or not self.device.is_cpu:
                arr, held = wp.empty(n, dtype=float, device=self.device), None
            if held is None or held.tobytes() != value.tobytes():
                arr.fill_(float(value))
            self._times = {n: (arr, value)}  # (the latest only)
            return arr

    #: Answer arrays kept for reuse (the latest shapes).
    ANSWERS_KEPT = 4

    def _answer_array(self, shape: int | tuple[int, ...], dtype) -> wp.array:
        """An array for :meth:`trace`'s answer (contents undefined): on the CPU the array of an earlier answer of the
        same shape and type once nothing else holds it — neither its :class:`Hits` nor a NumPy or torch view of it
        (each holds a reference) — else a new one. Fresh host memory is paid for at the first write, page by page
        (faulted in and zeroed by the kernel): about a third of the time of tracing a 1920 × 1080 camera's rays.
        The arrays of the latest :data:`ANSWERS_KEPT` shapes stay allocated."""
        if not self.device.is_cpu:  # (CUDA allocations come from Warp's memory pool)
            return wp.empty(shape, dtype=dtype, device=self.device)
        key = (shape if isinstance(shape, tuple) else (shape,), dtype)
        with self._answers_lock:
            arr = self._answers.pop(key, None)
            # references: the local name and getrefcount's argument; one more is a holder's
            if arr is None or sys.getrefcount(arr) > 2:
                arr = wp.empty(shape, dtype=dtype, device=self.device)
            self._answers[key] = arr  # (the latest last)
            while len(self._answers) > self.ANSWERS_KEPT:
                self._answers.pop(next(iter(self._answers)))
            return arr

    def trace(
        self,
        origins: np.ndarray | wp.array,
        directions: np.ndarray | wp.array,
        times: np.ndarray | wp.array | float = 0.0,
        *,
        t_min: float = 0.0,
        t_max: float = 1.0e6,
        max_hits: int = 1,
        threads: int | None = None,
        grid: tuple[int, int] | None = None,
        brief: bool = False,
    ) -> Hits:
        """Trace rays; each ray sees the scene at its own time.

        On the CPU, closest-hit rays are taken 16 at a time and a coherent group from one origin (a lidar column, a
        camera row: consecutive rays, within 6° of each other) is traced as one packet — the same hits, bit for bit,
        as ray by ray; give such rays in that order to profit. Rays that form a grid (an image's pixels, a lidar's
        azimuths × elevations: ``grid`` or (H, W, 3) arrays) are taken in tiles of 64 neighbours instead (16 along
        the finer axis, 4 along the other), a narrower packet than a run of one row (1080p camera rays about 1.25–1.4×
        as fast).

        Args:
            origins: (N, 3) ray origins [m] (world), or (H, W, 3) for a grid of rays.
            directions: (N, 3) directions (normalised internally; t is then in metres), or (H, W, 3).
            times: (N,) ray times [s] on the scene clock, or one time for all rays.
            t_min: Near limit [m]; t_max: far limit [m].
            max_hits: 1 for the closest hit; > 1 for up to that many surfaces in path order (continuing queries).
            threads: CPU threads (default: all cores).
            grid: (H, W) when the N = H·W rays are a row-major grid of neighbours (taken from (H, W, 3) NumPy
                directions when not given); it changes the speed, not the hits.
            brief: Closest hits as :class:`wsim.kernels.trace.HitBrief` records (t, face, instance, u, v: a ray
                caster's preliminary answer, what a distance image needs), the same values as the full records'
                fields; the rest of a Hit is not computed (1080p camera rays about 1.2-1.4x as fast on the CPU).
                Only with ``max_hits == 1``.

        Moving instances are bounded over the rays' own times (their top-level boxes refit to that span while the
        rays are traced, as :meth:`hold_time_window` does), so a window set before does not hide them and rays at
        one instant test a moving car's box there, not along its whole path.

        Returns:
            :class:`Hits`: records of shape (N,) for ``max_hits == 1`` (a grid's in row-major order), else
            (N, max_hits) with per-ray counts. On
            the CPU its arrays are those of an earlier answer of the same shape once nothing holds that answer (nor
            a NumPy, torch or Warp view of it): keep the answer, or a view, to keep its values.
        """
        d = self.device
        if brief and int(max_hits) != 1:
            raise ValueError(f"brief: brief records are closest hits only (max_hits is {max_hits}, not 1)")
        if grid is None and not isinstance(directions, wp.array) and np.ndim(directions) == 3:
            grid = tuple(np.shape(directions)[:2])
        o, r = _rays_array(origins, d), _rays_array(directions, d)
        n = o.shape[0]
        if r.shape[0] != n:
            raise ValueError(f"directions has {r.shape[0]} rays, origins has {n}")
        if grid is not None:
            rows, cols = grid = (int(grid[0]), int(grid[1]))
            if rows < 1 or cols < 1 or rows * cols != n:
                raise ValueError(f"grid: {rows} x {cols} is not the {n} rays")
        tt = self._times_array(times, n)
        window = self._rays_window(times, tt) if self.tlas is not None else None
        with self.hold_time_window(*window) if window is not None else nullcontext():
            return self._trace(o, r, tt, n, float(t_min), float(t_max), int(max_hits), threads, grid, bool(brief))

    def _rays_window(self, times, tt: wp.array) -> tuple[float, float] | None:
        """The span [s] of the rays' times (None where one is not finite: then all key times)."""
        x = tt.numpy() if isinstance(times, wp.array) else np.asarray(times, np.float32)  # (as the kernels see them)
        if x.size == 0:
            return None
        lo, hi = float(x.min()), float(x.max())
        return (lo, hi) if np.isfinite(lo) and np.isfinite(hi) else None

    def _trace(self, o: wp.array, r: wp.array, tt: wp.array, n: int, t_min: float, t_max: float, max_hits: int,
               threads: int | None, grid: tuple[int, int] | None, brief: bool = False) -> Hits:
        """:meth:`trace` of checked rays (``tt``: one time per ray)."""
        d = self.device
        if grid is not None:
            rows, cols = grid
        if max_hits == 1:
            hits = self._answer_array(n, _trace.HitBrief if brief else _trace.Hit)
            if self.geo.use_wide and grid is not None:  # CPU: a grid's tiles of neighbours as packets
                tr, tc = _tile(r, rows, cols)
                per = _trace.TILES_PER_THREAD
                # brief records fetched ahead for writing, except rows of 16 (streamed past the caches)
                tiles = -(-rows // tr) * -(-cols // tc)
                _launch.launch(_trace.trace_closest_tiles_kernel, -(-tiles // per),
                               [self.geo, o, r, tt, t_min, t_max, rows, cols, tr, tc, per, wp.uint64(hits.ptr),
                                hits.strides[0] if brief and tc != _trace.TILE_LONG else 0], [hits],
                               device=d, threads=threads, min_shard=max(1, _launch.MIN_SHARD // (tr * tc * per)))
            elif self.geo.use_wide:  # CPU: rays sharing an origin, 16 at a time, as packets
                p = _trace.TRACE_PACKET * _trace.PACKETS_PER_THREAD
                _launch.launch(_trace.trace_closest_packets_kernel, -(-n // p),
                               [self.geo, o, r, tt, t_min, t_max, n], [hits], device=d, threads=threads,
                               min_shard=max(1, _launch.MIN_SHARD // p))
            else:
                _launch.launch(_trace.trace_closest_kernel, n, [self.geo, o, r, tt, t_min, t_max],
                               [hits], device=d, threads=threads)
            return Hits(hits)
        hits = self._answer_array((n, max_hits), _trace.Hit)
        counts = self._answer_array(n, wp.int32)
        _launch.launch(_trace.trace_all_kernel, n, [self.geo, o, r, tt, t_min, t_max, max_hits],
                       [hits, counts], device=d, threads=threads)
        return Hits(hits, counts)


set_device_geometry_builder(SceneGeometry.of)


def _vertex_normals(mesh) -> np.ndarray:
    """(V, 3) float64 unit vertex normals of a MeshData: the sum of the unit normals of a vertex's faces, each
    weighted by the face's angle at that vertex (so a box's corner gets the diagonal however large its faces are);
    zero for vertices of no face, or whose faces' normals cancel."""
    p = np.asarray(mesh.points, np.float64)
    f = np.asarray(mesh.indices, np.int64).reshape(-1, 3)
    fn = np.cross(p[f[:, 1]] - p[f[:, 0]], p[f[:, 2]] - p[f[:, 0]])
    ln = np.linalg.norm(fn, axis=1, keepdims=True)
    fn = np.divide(fn, ln, out=np.zeros_like(fn), where=ln > 0)
    vn = np.zeros((len(p), 3))
    for k in range(3):
        e1 = p[f[:, (k + 1) % 3]] - p[f[:, k]]
        e2 = p[f[:, (k + 2) % 3]] - p[f[:, k]]
        angle = np.arctan2(np.linalg.norm(np.cross(e1, e2), axis=1), np.sum(e1 * e2, axis=1))
        for a in range(3):
            vn[:, a] += np.bincount(f[:, k], weights=fn[:, a] * angle, minlength=len(p))
    ln = np.linalg.norm(vn, axis=1, keepdims=True)
    return np.divide(vn, ln, out=np.zeros_like(vn), where=ln > 0)
