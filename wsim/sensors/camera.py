"""Cameras: the camera model (lens + shutter + poses), rolling-shutter point projection and overlays for f-theta,
OpenCV pinhole, OpenCV fisheye and windshield-distorted lenses.

A :class:`Camera` is a lens (:mod:`wsim.sensors.lens`) + optional windshield + resolution + :class:`ShutterType` +
poses. Poses are camera-to-world ``(translation (3,), quaternion xyzw (4,))`` with OpenCV camera axes (x right, y down,
z forward); a frame is exposed from ``t0`` (first readout line) to ``t1`` (last line), scene seconds. A camera either
gets explicit start/end poses per frame (as the sensorsim ``sensor_pose`` PosePair) or owns a rig trajectory and a
camera-to-rig pose (camera-to-world = ego(t) ∘ camera_to_rig).

:meth:`Camera.render` produces a :class:`CameraFrame`; the products, the render itself and the image encoders live in
:mod:`wsim.sensors.camera_render` and are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
import warp as wp

from .. import launch as _launch
from ..kernels import lens as _klens
from ..scene.scene import CameraCalibration, Scene, Trajectory
from ..scene.transforms import decompose_matrix, quat_multiply, quat_to_matrix
from .camera_render import (CameraFrame, CameraProduct, Pose, SemanticClassEntry, SunSky, _image_u8,
                            composite_ego_mask, encode_jpeg, encode_png, encode_rgb_planar, render_frame,
                            semantic_palette)
from .lens import (BivariateWindshield, FThetaLens, Lens, OpenCVFisheyeLens, OpenCVPinholeLens, lens_from_calibration,
                   windshield_from_params)


class ShutterType(IntEnum):
    """Shutter (sensorsim ``ShutterType`` numbers). UNKNOWN renders as GLOBAL."""

    UNKNOWN = 0
    ROLLING_TOP_TO_BOTTOM = 1
    ROLLING_LEFT_TO_RIGHT = 2
    ROLLING_BOTTOM_TO_TOP = 3
    ROLLING_RIGHT_TO_LEFT = 4
    GLOBAL = 5

    @classmethod
    def parse(cls, value: ShutterType | str | int | None) -> ShutterType:
        """From an enum, a number or a name (``"ROLLING_TOP_TO_BOTTOM"``, ``"rolling_top_to_bottom"``,
        ``"SHUTTER_TYPE_GLOBAL"``, ...). None → UNKNOWN."""
        if value is None:
            return cls.UNKNOWN
        if isinstance(value, str):
            key = value.strip().upper().removeprefix("SHUTTER_TYPE_")
            if key in cls.__members__:
                return cls[key]
            if "ROLLING_" + key in cls.__members__:
                return cls["ROLLING_" + key]
            raise ValueError(f"shutter_type: unknown shutter type {value!r}")
        try:
            return cls(int(value))
        except ValueError as e:
            raise ValueError(f"shutter_type: unknown shutter type {value!r}") from e

    @property
    def device_code(self) -> int:
        """The code the kernels use (:data:`wsim.kernels.lens.SHUTTER_GLOBAL`, ...)."""
        return {ShutterType.ROLLING_TOP_TO_BOTTOM: 1, ShutterType.ROLLING_LEFT_TO_RIGHT: 2,
                ShutterType.ROLLING_BOTTOM_TO_TOP: 3, ShutterType.ROLLING_RIGHT_TO_LEFT: 4}.get(self, 0)


@dataclass
class Projection:
    """Result of :meth:`Camera.project` (Warp arrays; iterate to unpack ``pixels, depths, times, valid``).

    Attributes:
        pixels: (N,) vec2 (u, v) [px], corner origin. depths: (N,) camera-frame z [m] at the point's time.
        times: (N,) time [s] of the pixel row/column that images the point. valid: (N,) int32 1/0.
    """

    pixels: wp.array
    depths: wp.array
    times: wp.array
    valid: wp.array

    def __iter__(self):
        return iter((self.pixels, self.depths, self.times, self.valid))

    def numpy(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(pixels (N, 2), depths (N,), times (N,), valid (N,) bool)."""
        return self.pixels.numpy(), self.depths.numpy(), self.times.numpy(), self.valid.numpy().astype(bool)


@dataclass
class Cuboid:
    """An oriented box moving over a frame, for :func:`draw_boxes`.

    Attributes:
        size: (3,) edge lengths [m], centred on the local origin.
        start_pose: Local-to-world pose of the centre at the frame start; end_pose: at the frame end (None: static).
        label: Free text (track id).
    """

    size: np.ndarray
    start_pose: Pose
    end_pose: Pose | None = None
    label: str = ""


# ---------------------------------------------------------------------------------------------------------------------
# poses


def as_pose(value: Any, name: str = "pose") -> Pose:
    """A pose from ``(translation (3,), quaternion xyzw (4,))``, a 7-vector (x, y, z, qx, qy, qz, qw), a 4×4
    column-vector matrix or a ``wp.transform``; raises ValueError naming ``name`` for malformed / non-finite input."""
    try:
        if isinstance(value, tuple) and len(value) == 2:
            t = np.asarray(value[0], np.float64).reshape(3)
            q = np.asarray(value[1], np.float64).reshape(4)
        else:
            a = np.asarray(value, np.float64)
            if a.shape == (4, 4):
                t, q, _ = decompose_matrix(a)
            elif a.size == 7:
                t, q = a.reshape(7)[:3], a.reshape(7)[3:]
            else:
                raise ValueError
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: expected (translation (3,), quaternion xyzw (4,)), a 7-vector or a 4x4 matrix") \
            from e
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(q))):
        raise ValueError(f"{name}: non-finite pose")
    n = np.linalg.norm(q)
    if n < 1e-9:
        raise ValueError(f"{name}: zero quaternion")
    return t, q / n


def compose_poses(a: Pose, b: Pose) -> Pose:
    """a ∘ b (apply b, then a)."""
    return quat_to_matrix(a[1]) @ b[0] + a[0], quat_multiply(a[1], b[1])


_IDENTITY: Pose = (np.zeros(3), np.array([0.0, 0.0, 0.0, 1.0]))


# ---------------------------------------------------------------------------------------------------------------------
# the camera


class Camera:
    """A camera: lens + optional windshield + resolution + shutter + poses.

    Args:
        lens: :class:`FThetaLens`, :class:`OpenCVPinholeLens` or :class:`OpenCVFisheyeLens` at its native resolution.
        width, height: Render resolution [px] (default: the lens's); the lens is rescaled to it
            (sensorsim-api.md "Resolution").
        shutter: :class:`ShutterType` (or its name/number); UNKNOWN is treated as GLOBAL.
        windshield: Optional :class:`BivariateWindshield`.
        camera_to_rig: Camera-to-rig pose (default identity).
        trajectory: Rig-to-world :class:`Trajectory` used when a frame is rendered without explicit poses
            (camera-to-world = trajectory(t) ∘ camera_to_rig).
        logical_id: Logical sensor name.
        device: Warp device of renders and projections (default: Warp's default device).
    """

    def __init__(self, lens: Lens, *, width: int | None = None, height: int | None = None,
                 shutter: ShutterType | str | int = ShutterType.GLOBAL, windshield: BivariateWindshield | None = None,
                 camera_to_rig: Any = None, trajectory: Trajectory | None = None, logical_id: str = "",
                 device: Any = None) -> None:
        if not isinstance(lens, (FThetaLens, OpenCVPinholeLens, OpenCVFisheyeLens)):
            raise ValueError(f"lens: expected a lens model, got {type(lens).__name__}")
        self.native_lens = lens
        self.lens = lens.rescaled(lens.width if width is None else width, lens.height if height is None else height)
        self.windshield = windshield
        self.shutter = ShutterType.parse(shutter)
        self.camera_to_rig = _IDENTITY if camera_to_rig is None else as_pose(camera_to_rig, "camera_to_rig")
        self.trajectory = trajectory
        self.logical_id = logical_id
        self.device = wp.get_device(device)
        self._params = self.lens.to_warp(windshield)

    # -- constructors

    @classmethod
    def from_calibration(cls, calibration: CameraCalibration, trajectory: Trajectory | None = None, *,
                         width: int | None = None, height: int | None = None, device: Any = None) -> Camera:
        """A camera of a scene's rig: lens, windshield (params key ``bivariate_windshield_model_param``), shutter and
        camera-to-rig from the calibration; ``trajectory`` is the scene's ego (rig-to-world) trajectory."""
        return cls(lens_from_calibration(calibration), width=width, height=height,
                   shutter=ShutterType.parse(calibration.shutter_type),
                   windshield=windshield_from_params(calibration.params), camera_to_rig=calibration.camera_to_rig,
                   trajectory=trajectory, logical_id=calibration.logical_id, device=device)

    @classmethod
    def from_scene(cls, scene: Scene, logical_id: str, *, width: int | None = None, height: int | None = None,
                   device: Any = None) -> Camera:
        """The rig camera ``logical_id`` of a scene, moving with the scene's ego trajectory."""
        if logical_id not in scene.cameras:
            raise ValueError(f"logical_id: scene has no camera {logical_id!r} (has {sorted(scene.cameras)})")
        return cls.from_calibration(scene.cameras[logical_id], scene.ego_trajectory, width=width, height=height,
                                    device=device)

    @classmethod
    def from_usd_prim(cls, stage_path: str | Path, prim_path: str, *, width: int | None = None,
                      height: int | None = None, device: Any = None) -> Camera:
        """A camera from a USD ``Camera`` prim, read by :func:`wsim.scene.usd_sensors.read_camera_prim` (which
        documents the attributes): an undistorted pinhole from the USD lens attributes, or any model from
        ``string wsim:camera:calibration`` JSON; the prim's (possibly animated) transform becomes the camera's
        trajectory.

        Raises:
            ValueError: Missing prim, not a Camera, or malformed attributes (the message names the prim and field).
        """
        from ..scene.usd_sensors import read_camera_prim  # USD is read in wsim.scene; the camera takes plain values

        prim = read_camera_prim(stage_path, prim_path)
        c = prim.calibration
        try:
            lens = lens_from_calibration(c)
            windshield = windshield_from_params(c.params)
            shutter = ShutterType.parse(c.shutter_type)
        except ValueError as e:
            raise ValueError(f"{prim.where}: {prim.source}: {e}") from e
        return cls(lens, width=width, height=height, shutter=shutter, windshield=windshield,
                   trajectory=prim.trajectory, logical_id=c.logical_id, device=device)

    # -- properties

    @property
    def width(self) -> int:
        return self.lens.width

    @property
    def height(self) -> int:
        return self.lens.height

    @property
    def params(self) -> _klens.LensParams:
        """The packed lens (kernel struct)."""
        return self._params

    def __repr__(self) -> str:
        return (f"Camera({type(self.lens).__name__}, {self.width}x{self.height}, {self.shutter.name}"
                f"{', windshield' if self.windshield else ''}{', ' + self.logical_id if self.logical_id else ''})")

    # -- poses

    def frame_poses(self, t0: float, t1: float, start_pose: Any = None, end_pose: Any = None) -> tuple[Pose, Pose]:
        """Camera-to-world poses at the frame start and end.

        ``start_pose``/``end_pose`` are camera-to-world poses (``end_pose`` None: the camera does not move). If
        ``start_pose`` is a :class:`Trajectory` (rig-to-world) or None (the camera's own trajectory), the poses are
        trajectory(t0/t1) ∘ camera_to_rig.
        """
        traj = None
        if isinstance(start_pose, Trajectory):
            traj, start_pose = start_pose, None
        if start_pose is None:
            traj = traj or self.trajectory
            if traj is None:
                raise ValueError("start_pose: no pose given and the camera has no trajectory")
            return (compose_poses(traj.pose_at(t0), self.camera_to_rig),
                    compose_poses(traj.pose_at(t1), self.camera_to_rig))
        p0 = as_pose(start_pose, "start_pose")
        p1 = p0 if end_pose is None else as_pose(end_pose, "end_pose")
        return p0, p1

    def _pose_array(self, t0: float, t1: float, start_pose: Any, end_pose: Any,
                    origin: np.ndarray | None = None) -> tuple[wp.array, Pose, Pose]:
        """The (2,) wp.transform start/end poses for the kernels, and the float64 poses. With ``origin`` (world
        position [m]) the device poses are in a frame with its origin there (translations shifted in float64); a
        Warp array passed as ``start_pose`` is used as it is."""
        if isinstance(start_pose, wp.array):  # (2,) wp.transform, e.g. with requires_grad for a Tape
            if start_pose.shape != (2,) or start_pose.dtype != wp.transform:
                raise ValueError("start_pose: a Warp array of poses must be (2,) wp.transform (start, end)")
            a = start_pose.numpy().astype(np.float64)
            return start_pose, (a[0, :3], a[0, 3:]), (a[1, :3], a[1, 3:])
        p0, p1 = self.frame_poses(t0, t1, start_pose, end_pose)
        o = np.zeros(3) if origin is None else np.asarray(origin, np.float64)
        arr = np.array([np.concatenate([p0[0] - o, p0[1]]), np.concatenate([p1[0] - o, p1[1]])], np.float32)
        return wp.array(arr, dtype=wp.transform, device=self.device), p0, p1

    @staticmethod
    def _check_times(t0: float, t1: float) -> tuple[float, float]:
        t0, t1 = float(t0), float(t1)
        if not (math.isfinite(t0) and math.isfinite(t1)):
            raise ValueError("t0/t1: non-finite frame time")
        if t1 < t0:
            raise ValueError(f"t1: frame end {t1} is before frame start {t0}")
        return t0, t1

    # -- lens queries

    def _vec2_array(self, pixels: Any, name: str) -> wp.array:
        if isinstance(pixels, wp.array):
            return pixels
        a = np.asarray(pixels, np.float32).reshape(-1, 2)
        return wp.array(a, dtype=wp.vec2, device=self.device)

    def unproject(self, pixels: Any) -> tuple[wp.array, wp.array]:
        """Unit camera-frame rays (N,) vec3 and validity (N,) int32 of pixel positions (N, 2) (u, v) [px]
        (corner origin: the centre of pixel (row i, column j) is (j + 0.5, i + 0.5))."""
        px = self._vec2_array(pixels, "pixels")
        n = px.shape[0]
        rays = wp.empty(n, dtype=wp.vec3, device=self.device)
        valid = wp.empty(n, dtype=wp.int32, device=self.device)
        _launch.launch(_klens.unproject_kernel, n, [self._params, px], [rays, valid], device=self.device)
        return rays, valid

    def relative_times(self, pixels: Any) -> wp.array:
        """Relative exposure times in [0, 1] of pixel positions (N, 2) under this camera's shutter."""
        px = self._vec2_array(pixels, "pixels")
        tau = wp.empty(px.shape[0], dtype=float, device=self.device)
        _launch.launch(_klens.relative_time_kernel, px.shape[0],
                       [self.shutter.device_code, self.width, self.height, px], [tau], device=self.device)
        return tau

    # -- projection

    def project(self, points_world: Any, t0: float, t1: float, start_pose: Any = None, end_pose: Any = None, *,
                point_object: Any = None, object_poses: Any = None) -> Projection:
        """Rolling-shutter projection of world points.

        Each point is projected with the start pose, then τ = rel_time(pixel) and the pose at τ are iterated until the
        pixel moves < 1e-3 px or 10 iterations (GLOBAL: the start pose). A point is invalid if neither its start- nor
        end-pose projection is valid, or if its final projection is outside the image / lens field of view.

        Args:
            points_world: (N, 3) world points [m] (NumPy or a ``wp.array`` of vec3).
            t0, t1: Frame start / end [s].
            start_pose, end_pose: See :meth:`frame_poses`; or a (2,) ``wp.array`` of ``wp.transform`` (start, end)
                to differentiate through with a ``wp.Tape``.
            point_object: Optional (N,) int: for k ≥ 0 the point is in the frame of moving object k.
            object_poses: (K, 2) object local-to-world poses at the frame start and end (``wp.array2d`` of
                ``wp.transform``, or (K, 2, 7) NumPy (x, y, z, qx, qy, qz, qw)).

        Returns:
            :class:`Projection` (pixels [px], camera-frame depth z [m], times [s], valid).

        The result does not depend on where the world origin is: NumPy points and object poses are taken in float64
        and moved, in float64, into a frame at the camera's start position before they are rounded to float32 (Warp
        arrays of points or object poses are moved there on the device; poses given as a Warp array are used as
        they are), and the kernel subtracts the camera translation before rotating.
        """
        t0, t1 = self._check_times(t0, t1)
        d = self.device
        # Camera-relative arithmetic: with host poses the kernel works in a frame whose origin is the camera's start
        # position (rounded to float32), and float64 host points / object poses are shifted into it in float64 before
        # they become float32; Warp arrays (world coordinates, float32) are shifted on the device.
        origin = np.zeros(3)
        if not isinstance(start_pose, wp.array):
            origin = self.frame_poses(t0, t1, start_pose, end_pose)[0][0].astype(np.float32).astype(np.float64)
        poses, _, _ = self._pose_array(t0, t1, start_pose, end_pose, origin)
        o32 = wp.vec3(*origin)
        zero = wp.vec3(0.0, 0.0, 0.0)
        if isinstance(points_world, wp.array):
            pts, pts_origin = points_world, o32
        else:
            a = np.asarray(points_world, np.float64).reshape(-1, 3)
            if not np.all(np.isfinite(a)):
                raise ValueError("points_world: non-finite point")
            world = np.ones(len(a), bool)  # points in an object's frame are not shifted: its pose is
            if point_object is not None and not isinstance(point_object, wp.array):
                world = np.asarray(point_object).reshape(-1) < 0
            elif point_object is not None:
                world = point_object.numpy().reshape(-1) < 0
            a = a - np.where(world[:, None], origin, 0.0)
            pts, pts_origin = wp.array(a.astype(np.float32), dtype=wp.vec3, device=d), zero
        n = pts.shape[0]
        if point_object is None:
            obj = wp.full(max(n, 1), -1, dtype=wp.int32, device=d)
        else:
            obj = point_object if isinstance(point_object, wp.array) else wp.array(
                np.asarray(point_object, np.int32).reshape(-1), dtype=wp.int32, device=d)
        obj_origin = zero
        if object_poses is None:
            op = wp.empty((1, 2), dtype=wp.transform, device=d)
        elif isinstance(object_poses, wp.array):
            op, obj_origin = object_poses, o32
        else:
            a = np.array(object_poses, np.float64).reshape(-1, 2, 7)
            a[..., :3] -= origin
            op = wp.array(a.astype(np.float32), dtype=wp.transform, device=d)
        pixels = wp.empty(n, dtype=wp.vec2, device=d, requires_grad=poses.requires_grad or pts.requires_grad)
        depths = wp.empty(n, dtype=float, device=d, requires_grad=pixels.requires_grad)
        times = wp.empty(n, dtype=float, device=d)
        valid = wp.empty(n, dtype=wp.int32, device=d)
        args = [self._params, self.shutter.device_code, poses, t0, t1, pts, pts_origin, obj, op, obj_origin]
        if poses.requires_grad or pts.requires_grad:  # one launch, so a wp.Tape can record it
            wp.launch(_klens.project_points_kernel, n, [*args, 0], [pixels, depths, times, valid], device=d)
        else:
            _launch.launch(_klens.project_points_kernel, n, args, [pixels, depths, times, valid], device=d)
        return Projection(pixels, depths, times, valid)

    # -- rendering

    def render(self, scene: Any, t0: float, t1: float, products: Iterable[CameraProduct | str] = (CameraProduct.COLOR,),
               start_pose: Any = None, end_pose: Any = None, *, supersample: int = 1, vmax: float = 80.0,
               t_max: float = 1.0e4, lighting: SunSky | None = None, requires_grad: bool = False) -> CameraFrame:
        """Render one frame; each pixel's ray is traced at its own rolling-shutter time with the scene at that time.

        Args:
            scene: A :class:`wsim.Scene` (its device geometry is built once and cached) or its ``SceneGeometry``.
            t0, t1: Frame start (first readout line) and end (last line) [s].
            products: :class:`CameraProduct` values or names.
            start_pose, end_pose: See :meth:`frame_poses`.
            supersample: COLOR uses supersample² rays per pixel (stratified), averaged in linear light.
            vmax: Upper end of DISTANCE_COLORIZED [m].
            t_max: Far limit of camera rays [m].
            lighting: Sun and sky (default :class:`SunSky`).
            requires_grad: Record DISTANCE (always rendered then) on ``CameraFrame.tape``, a ``wp.Tape``: the
                first pass picks the surface of each pixel, a second kernel recomputes the distance from that
                triangle's vertices, so gradients reach ``CameraFrame.inputs`` — the start/end poses (pass a (2,)
                ``wp.array`` of ``wp.transform`` with ``requires_grad=True`` as ``start_pose`` to own it, else one
                is made), the frame times (through moving instances) and the mesh vertices. Each pixel's
                rolling-shutter time and camera-frame ray are constants; misses keep 0 with zero gradient; the surface
                a pixel sees does not change with the inputs (silhouettes are discontinuities with no gradient).
                COLOR, SEMANTICS and NORMALS are not differentiable.

        Returns:
            :class:`CameraFrame` with the asked products as Warp arrays on the camera's device.
        """
        t0, t1 = self._check_times(t0, t1)
        geo = scene.device_geometry(self.device) if isinstance(scene, Scene) else scene
        if wp.get_device(geo.device) != self.device:
            raise ValueError(f"scene: geometry is on {geo.device}, the camera on {self.device}")
        poses, p0, p1 = self._pose_array(t0, t1, start_pose, end_pose)
        return render_frame(geo, self._params, self.shutter.device_code, poses, p0, p1, t0, t1, products,
                            supersample=supersample, vmax=vmax, t_max=t_max, lighting=lighting,
                            requires_grad=requires_grad)


# ---------------------------------------------------------------------------------------------------------------------
# overlays


_BOX_EDGES = [(0, 1), (2, 3), (4, 5), (6, 7), (0, 2), (1, 3), (4, 6), (5, 7), (0, 4), (1, 5), (2, 6), (3, 7)]


def cuboids_from_scene(scene: Scene, t0: float, t1: float) -> list[Cuboid]:
    """The cuboids of the scene's instances that have one (tracks), posed at t0 and t1 [s]."""
    from ..scene.transforms import interpolate_pose

    out = []
    for inst in scene.instances:
        if inst.cuboid is None:
            continue
        a = interpolate_pose(inst.times, inst.translations, inst.rotations, t0)
        b = interpolate_pose(inst.times, inst.translations, inst.rotations, t1)
        out.append(Cuboid(np.asarray(inst.cuboid, float), a, b, inst.name))
    return out


def draw_boxes(image: Any, camera: Camera, cuboids: Iterable[Cuboid], t0: float, t1: float, start_pose: Any = None,
               end_pose: Any = None, *, color: tuple[int, int, int] = (255, 64, 0), thickness: int = 1) -> np.ndarray:
    """Overlay cuboid wireframes, each edge point placed where the camera images it under rolling shutter.

    Edge samples (spaced ≤ ~0.25 px on screen) are projected with :meth:`Camera.project` as points of their moving
    object: the object's pose (lerp/slerp of its start and end pose) and the camera's are both taken at the time of the
    pixel that images the sample.

    Returns:
        A new (H, W, 3) uint8 image.
    """
    img = _image_u8(image)[..., :3].copy()
    cubs = list(cuboids)
    if not cubs:
        return img
    h, w = img.shape[:2]
    signs = np.array([[x, y, z] for z in (-0.5, 0.5) for y in (-0.5, 0.5) for x in (-0.5, 0.5)])
    locals_, objs, poses = [], [], []
    for k, c in enumerate(cubs):
        a = as_pose(c.start_pose, f"cuboids[{k}].start_pose")
        b = a if c.end_pose is None else as_pose(c.end_pose, f"cuboids[{k}].end_pose")
        poses.append([np.concatenate(a), np.concatenate(b)])
        corners = signs * np.asarray(c.size, float).reshape(3)
        # on-screen length of each edge from a first projection of the corners (generous when off-screen)
        proj = camera.project(corners @ quat_to_matrix(a[1]).T + a[0], t0, t1, start_pose, end_pose).numpy()
        for i, j in _BOX_EDGES:
            if proj[3][i] and proj[3][j]:
                n = int(min(20000, 4 * np.linalg.norm(proj[0][i] - proj[0][j]) + 16))
            else:
                n = 4 * max(w, h)
            s = np.linspace(0.0, 1.0, n)[:, None]
            locals_.append(corners[i] * (1 - s) + corners[j] * s)
            objs.append(np.full(n, k, np.int32))
    pts = np.concatenate(locals_)
    proj = camera.project(pts, t0, t1, start_pose, end_pose, point_object=np.concatenate(objs),
                          object_poses=np.asarray(poses, np.float32)).numpy()
    uv = proj[0][proj[3]]
    r = max(0, int(thickness) - 1)
    cols = np.floor(uv[:, 0]).astype(int)
    rows = np.floor(uv[:, 1]).astype(int)
    for dy in range(-(r // 2), r - r // 2 + 1):
        for dx in range(-(r // 2), r - r // 2 + 1):
            rr, cc = rows + dy, cols + dx
            ok = (rr >= 0) & (rr < h) & (cc >= 0) & (cc < w)
            img[rr[ok], cc[ok]] = color
    return img


__all__ = [
    "Camera", "CameraFrame", "CameraProduct", "Cuboid", "Projection", "SemanticClassEntry", "ShutterType", "SunSky",
    "as_pose", "composite_ego_mask", "cuboids_from_scene", "draw_boxes", "encode_jpeg", "encode_png",
    "encode_rgb_planar", "semantic_palette",
]
