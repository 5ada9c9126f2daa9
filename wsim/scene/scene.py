"""Host-side scene description shared by every loader (USD, NuRec USDZ, built-in) and every sensor.

Conventions (one source of truth, used everywhere):
- Units are SI: metres, seconds, radians. The world is Z up.
- Quaternions are stored (x, y, z, w), Warp's order. A pose maps child to parent: ``p_parent = R(q) p_child + t``.
- Times are seconds on the scene's clock (for USD: time code / timeCodesPerSecond; for NuRec: (us - time_origin_us)/1e6).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import math

import numpy as np

from .materials import Material


#: Builds (or returns the cached) device geometry of a scene on a device: ``SceneGeometry.of``, installed by
#: :mod:`wsim.scene.geometry` when it is imported (the package ``wsim.scene`` imports it). Geometry depends on this
#: module, never the reverse: :class:`Scene` stays a plain host description.
_device_geometry_builder: Callable[[Scene, str | None], Any] | None = None


def set_device_geometry_builder(builder: Callable[[Scene, str | None], Any]) -> None:
    """Install the function :meth:`Scene.device_geometry` calls (done by :mod:`wsim.scene.geometry`)."""
    global _device_geometry_builder
    _device_geometry_builder = builder


#: Adds a mesh file to a scene as an instanced prototype: ``wsim.scene.mesh_files.add_asset``, installed by
#: :mod:`wsim.scene.mesh_files` when it is imported (:mod:`wsim.scene.loader` imports it). Same pattern as above.
_asset_adder: Callable[..., Any] | None = None


def set_asset_adder(adder: Callable[..., Any]) -> None:
    """Install the function :meth:`Scene.add_asset` calls (done by :mod:`wsim.scene.mesh_files`)."""
    global _asset_adder
    _asset_adder = adder


class SceneError(ValueError):
    """A scene file or prim is malformed. The message names the file and/or prim."""


#: Largest camera side accepted in a calibration [px].
MAX_CAMERA_SIDE = 65536
#: Parameters each camera model needs (CameraSpec field names).
CAMERA_REQUIRED = {"ftheta": ("principal_point_x", "principal_point_y"),
                   "opencv_pinhole": ("principal_point_x", "principal_point_y", "focal_length_x", "focal_length_y"),
                   "opencv_fisheye": ("principal_point_x", "principal_point_y", "focal_length_x", "focal_length_y")}


def _numbers(value: Any) -> list[float] | None:
    """The numbers of a scalar or (nested) list, or None if anything in it is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float, np.integer, np.floating)):
        return [float(value)]
    if isinstance(value, (list, tuple, np.ndarray)):
        out: list[float] = []
        for v in value:
            n = _numbers(v)
            if n is None:
                return None
            out += n
        return out
    return None


def _check_calibration(cal: Any, where: str) -> None:
    """A camera calibration that every lens model can be built from: known model, sane resolution, the model's
    required parameters, every numeric parameter finite."""
    if cal.model not in CAMERA_REQUIRED:
        raise SceneError(f"{where}: unknown camera model {cal.model!r} ({', '.join(CAMERA_REQUIRED)})")
    w, h = cal.resolution
    if not all(isinstance(v, (int, np.integer)) and 1 <= v <= MAX_CAMERA_SIDE for v in (w, h)):
        raise SceneError(f"{where}: resolution {cal.resolution} must be two integers in [1, {MAX_CAMERA_SIDE}]")
    for name in CAMERA_REQUIRED[cal.model]:
        if name not in cal.params:
            raise SceneError(f"{where}: missing parameter {name!r}")
    if cal.model == "ftheta" and not (cal.params.get("pixeldist_to_angle_poly")
                                      or cal.params.get("angle_to_pixeldist_poly")):
        raise SceneError(f"{where}: an f-theta lens needs pixeldist_to_angle_poly or angle_to_pixeldist_poly")
    for name, value in cal.params.items():
        if isinstance(value, (str, dict)) or value is None:
            continue
        nums = _numbers(value)
        if nums is None:
            raise SceneError(f"{where}: parameter {name!r} must be numbers, got {value!r:.80}")
        if not all(math.isfinite(v) for v in nums):
            raise SceneError(f"{where}: parameter {name!r} is not finite")
    for name in ("focal_length_x", "focal_length_y"):
        if name in cal.params and not float(cal.params[name]) > 0:
            raise SceneError(f"{where}: {name} must be > 0, got {cal.params[name]}")
    t, q = (np.asarray(a, dtype=np.float64) for a in cal.camera_to_rig)
    if t.shape != (3,) or q.shape != (4,) or not (np.all(np.isfinite(t)) and np.all(np.isfinite(q))) or \
            abs(np.linalg.norm(q) - 1.0) > 1e-3:
        raise SceneError(f"{where}: camera-to-rig pose must be a finite translation and a unit quaternion")


def _check_trajectory(traj: Any, where: str) -> None:
    times = np.asarray(traj.times)
    if times.ndim != 1 or len(times) == 0:
        raise SceneError(f"{where}: timestamps must be a non-empty 1-D list, got shape {times.shape}")
    if not np.all(np.isfinite(times)) or np.any(np.diff(times) <= 0):
        raise SceneError(f"{where}: timestamps must be finite and strictly increasing")
    if traj.translations.shape != (len(times), 3) or traj.rotations.shape != (len(times), 4):
        raise SceneError(f"{where}: {len(times)} timestamps but {len(traj.translations)} translations and "
                         f"{len(traj.rotations)} rotations")
    if not (np.all(np.isfinite(traj.translations)) and np.all(np.isfinite(traj.rotations))):
        raise SceneError(f"{where}: non-finite pose")
    if np.any(np.abs(np.linalg.norm(traj.rotations, axis=1) - 1.0) > 1e-3):
        raise SceneError(f"{where}: rotations must be unit quaternions")


@dataclass
class Part:
    """A group of triangles with one material and one semantic class (a GeomSubset, or a whole mesh).

    Attributes:
        name: Prim path (plus ``.subset`` name for a GeomSubset).
        material: Index into :attr:`Scene.materials`.
        semantic_class: Index into :attr:`Scene.semantic_classes` (0 = unlabeled).
        object_id: Stable id of the object the part belongs to (for static geometry; instances carry their own).
    """

    name: str
    material: int = 0
    semantic_class: int = 0
    object_id: int = 0


@dataclass
class MeshData:
    """A triangle mesh in its own frame (metres, Z up).

    Attributes:
        points: (N, 3) float32 vertex positions [m].
        indices: (M, 3) int32 triangle vertex indices.
        tri_part: (M,) int32 index into :attr:`Scene.parts` per triangle.
        colors: Optional (N, 3) float32 linear vertex colours in [0, 1].
        uvs: Optional (M, 3, 2) float32 face-varying texture coordinates.
        name: Prototype or prim name.
    """

    points: np.ndarray
    indices: np.ndarray
    tri_part: np.ndarray
    colors: np.ndarray | None = None
    uvs: np.ndarray | None = None
    name: str = ""

    def __post_init__(self) -> None:
        self.points = np.ascontiguousarray(self.points, dtype=np.float32).reshape(-1, 3)
        self.indices = np.ascontiguousarray(self.indices, dtype=np.int32).reshape(-1, 3)
        self.tri_part = np.ascontiguousarray(np.broadcast_to(self.tri_part, (len(self.indices),)), dtype=np.int32)

    @property
    def num_triangles(self) -> int:
        return int(len(self.indices))

    def validate(self, where: str) -> None:
        """Raise :class:`SceneError` naming ``where`` for NaN/inf points or out-of-range indices."""
        if not np.all(np.isfinite(self.points)):
            bad = int(np.argwhere(~np.isfinite(self.points).all(axis=1))[0, 0])
            raise SceneError(f"{where}: non-finite point at index {bad}")
        if len(self.indices) and (self.indices.min() < 0 or self.indices.max() >= len(self.points)):
            raise SceneError(
                f"{where}: face vertex index out of range [0, {len(self.points)}) "
                f"(min {int(self.indices.min())}, max {int(self.indices.max())})"
            )

    @staticmethod
    def concatenate(meshes: list[MeshData], name: str = "") -> MeshData:
        """Join meshes into one (indices re-based; colours/uvs kept only if every mesh has them)."""
        if not meshes:
            return MeshData(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0), name=name)
        offs = np.cumsum([0] + [len(m.points) for m in meshes[:-1]])
        colors = None
        if all(m.colors is not None for m in meshes):
            colors = np.concatenate([m.colors for m in meshes])
        uvs = None
        if all(m.uvs is not None for m in meshes):
            uvs = np.concatenate([m.uvs for m in meshes])
        return MeshData(
            np.concatenate([m.points for m in meshes]),
            np.concatenate([m.indices + o for m, o in zip(meshes, offs)]),
            np.concatenate([m.tri_part for m in meshes]),
            colors,
            uvs,
            name,
        )


@dataclass
class Instance:
    """A placed copy of a prototype mesh, possibly moving.

    The transform at time t is interpolated from the key samples (translation lerp, rotation shortest-arc slerp,
    scale lerp) and clamped outside the key range.

    Attributes:
        prototype: Index into :attr:`Scene.prototypes`.
        times: (K,) key times [s], strictly increasing (K >= 1).
        translations: (K, 3) [m].
        rotations: (K, 4) unit quaternions (x, y, z, w).
        scales: (K, 3) per-axis scale.
        object_id: Stable object id reported in hits.
        name: Prim path or track id.
        semantic_class: If > 0, overrides the parts' semantic class for this instance.
        cuboid: Optional (3,) size [m] of the object's cuboid (tracks / bounding boxes), centred on the local origin.
    """

    prototype: int
    times: np.ndarray
    translations: np.ndarray
    rotations: np.ndarray
    scales: np.ndarray | None = None
    object_id: int = 0
    name: str = ""
    semantic_class: int = 0
    cuboid: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.times = np.atleast_1d(np.asarray(self.times, dtype=np.float64))
        k = len(self.times)
        self.translations = np.asarray(self.translations, dtype=np.float64).reshape(k, 3)
        self.rotations = np.asarray(self.rotations, dtype=np.float64).reshape(k, 4)
        norms = np.linalg.norm(self.rotations, axis=1, keepdims=True)
        if not np.all(np.isfinite(self.rotations)) or np.any(norms < 1e-9):
            raise SceneError(f"instance {self.name!r}: invalid rotation quaternion")
        self.rotations = self.rotations / norms
        self.scales = np.ones((k, 3)) if self.scales is None else np.asarray(self.scales, dtype=np.float64).reshape(k, 3)
        if not (np.all(np.isfinite(self.translations)) and np.all(np.isfinite(self.scales))):
            raise SceneError(f"instance {self.name!r}: non-finite transform")
        if k > 1 and np.any(np.diff(self.times) <= 0):
            raise SceneError(f"instance {self.name!r}: key times must be strictly increasing")

    @property
    def is_moving(self) -> bool:
        return len(self.times) > 1


@dataclass
class Trajectory:
    """Timed poses (child-to-world): times [s], translations (K, 3) [m], rotations (K, 4) quaternions (x, y, z, w)."""

    times: np.ndarray
    translations: np.ndarray
    rotations: np.ndarray

    def __post_init__(self) -> None:
        self.times = np.atleast_1d(np.asarray(self.times, dtype=np.float64))
        self.translations = np.asarray(self.translations, dtype=np.float64).reshape(-1, 3)
        self.rotations = np.asarray(self.rotations, dtype=np.float64).reshape(-1, 4)

    def pose_at(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Pose at time ``t`` [s] (lerp + shortest-arc slerp, clamped): (translation (3,), quaternion xyzw (4,))."""
        from .transforms import interpolate_pose

        return interpolate_pose(self.times, self.translations, self.rotations, t)


@dataclass
class CameraCalibration:
    """A camera of the scene's rig as stored by the scene (the sensors package turns it into a lens model).

    Attributes:
        logical_id: Logical sensor name (e.g. ``camera_front_wide_120fov``).
        model: ``"ftheta"``, ``"opencv_pinhole"`` or ``"opencv_fisheye"``.
        params: Model parameters with the field names of the sensorsim CameraSpec (e.g. ``principal_point_x``,
            ``pixeldist_to_angle_poly``, ``focal_length_x``, ``radial_coeffs``, ``max_angle``, ``reference_poly``).
        resolution: (width, height) native resolution [px].
        camera_to_rig: (translation (3,), quaternion xyzw (4,)); camera axes x right, y down, z forward.
        shutter_type: ``GLOBAL``, ``ROLLING_TOP_TO_BOTTOM``, ...
        unique_id: Calibration key (NuRec ``camera_calibrations`` key).
    """

    logical_id: str
    model: str
    params: dict[str, Any]
    resolution: tuple[int, int]
    camera_to_rig: tuple[np.ndarray, np.ndarray]
    shutter_type: str = "ROLLING_TOP_TO_BOTTOM"
    unique_id: str = ""


@dataclass
class Scene:
    """Everything wsim knows about a scene, on the host. Device geometry is built from it by :meth:`device_geometry`.

    Attributes:
        static: Static triangles in world coordinates.
        prototypes: Meshes in local coordinates, placed by :attr:`instances` (one BLAS each).
        instances: Placed (possibly moving) copies of prototypes.
        materials: Material table (index 0 is the default material).
        parts: Part table referenced by every mesh's ``tri_part``.
        semantic_classes: Class names; index 0 is ``"unlabeled"``.
        scene_id: Identifier (NuRec metadata scene_id, or the file stem).
        source: File the scene was loaded from ("" for in-memory scenes).
        ego_trajectory: Rig-to-world trajectory, if the scene has one.
        cameras: Camera calibrations of the rig, by logical id.
        time_range: (start, end) [s] of the scene's recorded time.
        time_origin_us: Absolute time [us] of scene time 0 (NuRec timestamps); 0 for USD.
        lidar_prims: Prim paths of lidar prims found on a USD stage.
        camera_prims: Prim paths of USD Camera prims.
        metadata: Free-form loader metadata (e.g. NuRec metadata.yaml contents).
        skipped: Messages about prims that were skipped while loading.
        _device_cache: Device geometry built from this scene, by device name (filled by
            :meth:`wsim.scene.geometry.SceneGeometry.of`; the scene never looks inside).
    """

    static: MeshData
    prototypes: list[MeshData] = field(default_factory=list)
    instances: list[Instance] = field(default_factory=list)
    materials: list[Material] = field(default_factory=lambda: [Material("default")])
    parts: list[Part] = field(default_factory=lambda: [Part("default")])
    semantic_classes: list[str] = field(default_factory=lambda: ["unlabeled"])
    scene_id: str = ""
    source: str = ""
    ego_trajectory: Trajectory | None = None
    cameras: dict[str, CameraCalibration] = field(default_factory=dict)
    time_range: tuple[float, float] = (0.0, 0.0)
    time_origin_us: int = 0
    lidar_prims: list[str] = field(default_factory=list)
    camera_prims: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    _device_cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_triangles(self) -> int:
        """Triangles in the scene, counting each instance's prototype once per instance."""
        return self.static.num_triangles + sum(self.prototypes[i.prototype].num_triangles for i in self.instances)

    def semantic_class_index(self, name: str) -> int:
        """Index of a semantic class, appending it to the table if new ("" → 0, unlabeled)."""
        if not name:
            return 0
        if name not in self.semantic_classes:
            self.semantic_classes.append(name)
        return self.semantic_classes.index(name)

    def add_material(self, material: Material) -> int:
        """Append a material (or return the index of one with the same name)."""
        for i, m in enumerate(self.materials):
            if m.name == material.name:
                return i
        self.materials.append(material)
        return len(self.materials) - 1

    def add_part(self, part: Part) -> int:
        self.parts.append(part)
        return len(self.parts) - 1

    def validate(self) -> None:
        """Check every mesh and table reference; raise :class:`SceneError` naming the offending mesh."""
        src = self.source or "<scene>"
        self.static.validate(f"{src}: static geometry")
        for p in self.prototypes:
            p.validate(f"{src}: {p.name or 'prototype'}")
        for m in [self.static, *self.prototypes]:
            if len(m.tri_part) and (m.tri_part.min() < 0 or m.tri_part.max() >= len(self.parts)):
                raise SceneError(f"{src}: {m.name or 'mesh'} references an unknown part")
        for p in self.parts:
            if not 0 <= p.material < len(self.materials):
                raise SceneError(f"{src}: part {p.name} references unknown material {p.material}")
            if not 0 <= p.semantic_class < len(self.semantic_classes):
                raise SceneError(f"{src}: part {p.name} references unknown semantic class {p.semantic_class}")
        for inst in self.instances:
            if not 0 <= inst.prototype < len(self.prototypes):
                raise SceneError(f"{src}: instance {inst.name} references unknown prototype {inst.prototype}")
        if self.num_triangles == 0:
            raise SceneError(f"{src}: the scene has no geometry")
        t0, t1 = (float(t) for t in self.time_range)
        if not (math.isfinite(t0) and math.isfinite(t1) and t0 <= t1):
            raise SceneError(f"{src}: time range {self.time_range} is not a finite (start <= end) interval")
        if self.ego_trajectory is not None:
            _check_trajectory(self.ego_trajectory, f"{src}: ego trajectory")
        for lid, cal in self.cameras.items():
            _check_calibration(cal, f"{src}: camera {lid}")

    def add_asset(self, path: Any, poses: Any, **options: Any) -> list[Instance]:
        """Add a glTF/GLB, OBJ or PLY file as one instanced prototype placed at ``poses``.

        Returns :func:`wsim.scene.mesh_files.add_asset` ``(self, path, poses, **options)``: the new instances.
        ``poses`` is a list of (translation (3,) [m], quaternion xyzw (4,)) or a :class:`Trajectory` for a moving one;
        options ``semantic_class``, ``object_id``, ``mapping``, ``up_axis``, ``meters_per_unit``, ``name``.
        """
        if _asset_adder is None:
            raise RuntimeError("Scene.add_asset: wsim.scene.mesh_files is not imported")
        return _asset_adder(self, path, poses, **options)

    def device_geometry(self, device: str | None = None):
        """The device-side geometry (static wp.Mesh, prototype BLASes, instance table, TLAS), built once per device.

        Returns :meth:`wsim.scene.geometry.SceneGeometry.of` ``(self, device)``; the geometry is cached in
        ``_device_cache`` by device name.
        """
        if _device_geometry_builder is None:
            raise RuntimeError("Scene.device_geometry: wsim.scene.geometry is not imported")
        return _device_geometry_builder(self, device)
