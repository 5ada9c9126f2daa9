"""Cameras: rolling-shutter rendering and point projection for f-theta, OpenCV pinhole, OpenCV fisheye and
windshield-distorted lenses.

A :class:`Camera` is a lens (:mod:`wsim.sensors.lens`) + optional windshield + resolution + :class:`ShutterType` +
poses. Poses are camera-to-world ``(translation (3,), quaternion xyzw (4,))`` with OpenCV camera axes (x right, y down,
z forward); a frame is exposed from ``t0`` (first readout line) to ``t1`` (last line), scene seconds. A camera either
gets explicit start/end poses per frame (as the sensorsim ``sensor_pose`` PosePair) or owns a rig trajectory and a
camera-to-rig pose (camera-to-world = ego(t) ∘ camera_to_rig).

Products (:class:`CameraProduct`) stay Warp arrays on the camera's device until ``.numpy()``:

- COLOR: (H, W, 3) uint8 sRGB (sun + sky ambient + shadow rays, sky gradient for misses).
- DISTANCE: (H, W) float32 ‖hit − camera centre‖ [m]; **0.0 where the ray misses** (or the pixel is outside the lens's
  field of view), like the lidar and panorama range images.
- DISTANCE_COLORIZED: (H, W, 3) uint8 Turbo over [0, vmax]; misses black.
- SEMANTICS: (H, W) int32 class index into ``scene.semantic_classes`` (0 = unlabeled / miss).
- SEMANTICS_COLORIZED: (H, W, 3) uint8 class colours, with :attr:`CameraFrame.semantic_classes` as the table.
- NORMALS: (H, W, 3) float32 world unit normals turned toward the camera; (0, 0, 0) for misses.

Raw products (distance, semantics, normals) come from the pixel-centre ray; ``supersample`` only affects COLOR.
"""

from __future__ import annotations

import io
import json
import math
import weakref
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from pathlib import Path
from typing import Any

import numpy as np
import warp as wp

from .. import launch as _launch
from ..kernels import lens as _klens
from ..kernels import shading as _kshade
from ..scene.textures import build_texture_tables
from ..scene.scene import CameraCalibration, Scene, Trajectory
from ..scene.transforms import decompose_matrix, quat_multiply, quat_to_matrix
from .lens import (BivariateWindshield, FThetaLens, Lens, OpenCVFisheyeLens, OpenCVPinholeLens, lens_from_calibration,
                   lens_from_params, windshield_from_params)

Pose = tuple[np.ndarray, np.ndarray]


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


class CameraProduct(str, Enum):
    """What :meth:`Camera.render` produces."""

    COLOR = "color"
    DISTANCE = "distance"
    DISTANCE_COLORIZED = "distance_colorized"
    SEMANTICS = "semantics"
    SEMANTICS_COLORIZED = "semantics_colorized"
    NORMALS = "normals"

    @classmethod
    def parse(cls, value: CameraProduct | str) -> CameraProduct:
        if isinstance(value, cls):
            return value
        key = str(value).strip().upper().removeprefix("CAMERA_RENDER_PRODUCT_")
        if key in cls.__members__:
            return cls[key]
        raise ValueError(f"products: unknown camera product {value!r} (one of {[p.name for p in cls]})")


@dataclass(frozen=True)
class SunSky:
    """Lighting of COLOR renders (linear RGB).

    Attributes:
        sun_elevation_deg: Sun elevation above the horizon [deg]. sun_azimuth_deg: counter-clockwise from +x [deg].
        sun_color: Sun irradiance at normal incidence.
        ambient: Sky ambient radiance on an upward-facing surface.
        sky_zenith, sky_horizon, ground: Colours of the background gradient.
        shadows: Trace a shadow ray toward the sun per shaded sample.
    """

    sun_elevation_deg: float = 50.0
    sun_azimuth_deg: float = 210.0
    sun_color: tuple[float, float, float] = (1.15, 1.1, 1.0)
    ambient: tuple[float, float, float] = (0.28, 0.31, 0.36)
    sky_zenith: tuple[float, float, float] = (0.22, 0.40, 0.80)
    sky_horizon: tuple[float, float, float] = (0.72, 0.80, 0.92)
    ground: tuple[float, float, float] = (0.20, 0.19, 0.17)
    shadows: bool = True

    def to_warp(self) -> _kshade.Lighting:
        el, az = math.radians(self.sun_elevation_deg), math.radians(self.sun_azimuth_deg)
        light = _kshade.Lighting()
        light.sun_dir = wp.vec3(math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el))
        light.sun_color = wp.vec3(*self.sun_color)
        light.ambient = wp.vec3(*self.ambient)
        light.sky_zenith = wp.vec3(*self.sky_zenith)
        light.sky_horizon = wp.vec3(*self.sky_horizon)
        light.ground = wp.vec3(*self.ground)
        light.shadows = 1 if self.shadows else 0
        return light


@dataclass(frozen=True)
class SemanticClassEntry:
    """One row of the SEMANTICS_COLORIZED class table (sensorsim ``SemanticsClassEntry``)."""

    class_index: int
    class_name: str
    color: tuple[int, int, int]


# Cityscapes-like colours for common labels; other labels get a stable hashed colour.
_CLASS_COLORS = {
    "unlabeled": (0, 0, 0), "road": (128, 64, 128), "sidewalk": (244, 35, 232), "building": (70, 70, 70),
    "wall": (102, 102, 156), "fence": (190, 153, 153), "pole": (153, 153, 153), "traffic_light": (250, 170, 30),
    "traffic_sign": (220, 220, 0), "vegetation": (107, 142, 35), "tree": (107, 142, 35), "terrain": (152, 251, 152),
    "grass": (152, 251, 152), "sky": (70, 130, 180), "person": (220, 20, 60), "pedestrian": (220, 20, 60),
    "rider": (255, 0, 0), "car": (0, 0, 142), "vehicle": (0, 0, 142), "automobile": (0, 0, 142),
    "truck": (0, 0, 70), "bus": (0, 60, 100), "train": (0, 80, 100), "motorcycle": (0, 0, 230),
    "bicycle": (119, 11, 32), "curb": (196, 196, 196), "lane_marking": (255, 255, 255), "ground": (81, 0, 81),
}


def semantic_palette(class_names: Sequence[str]) -> np.ndarray:
    """(C, 3) uint8 colour per semantic class (index 0 = unlabeled = black)."""
    out = np.zeros((len(class_names), 3), np.uint8)
    for i, name in enumerate(class_names):
        key = name.strip().lower().replace(" ", "_").replace("-", "_")
        if i == 0 and key in ("", "unlabeled", "unlabelled"):
            continue
        if key in _CLASS_COLORS:
            out[i] = _CLASS_COLORS[key]
            continue
        h = zlib.crc32(key.encode())
        hue, sat, val = (h % 360) / 360.0, 0.55 + 0.4 * ((h >> 9) % 100) / 100.0, 0.6 + 0.4 * ((h >> 17) % 100) / 100
        k = np.array([5.0, 3.0, 1.0])
        kk = (k + hue * 6.0) % 6.0
        rgb = val - val * sat * np.clip(np.minimum(kk, 4.0 - kk), 0.0, 1.0)
        out[i] = np.round(rgb * 255).astype(np.uint8)
    return out


@dataclass
class CameraFrame:
    """The products of one :meth:`Camera.render` (Warp arrays on the camera's device; None if not asked).

    Attributes:
        width, height: Image size [px]. t0, t1: Frame start / end [s].
        color: (H, W, 3) uint8 sRGB. distance: (H, W) float32 [m], 0 for misses.
        distance_colorized: (H, W, 3) uint8. semantics: (H, W) int32. semantics_colorized: (H, W, 3) uint8.
        normals: (H, W) vec3 (``.numpy()`` gives (H, W, 3)) world normals facing the camera, 0 for misses.
        semantic_classes: Class table (index, name, colour) of SEMANTICS_COLORIZED (all scene classes).
        vmax: Upper end [m] of the DISTANCE_COLORIZED colormap.
        start_pose, end_pose: Camera-to-world poses at t0 and t1.
        tape: With ``render(..., requires_grad=True)``, the ``wp.Tape`` that recorded ``distance``.
        inputs: The differentiable inputs of that tape (their ``.grad`` after ``tape.backward``): ``poses`` ((2,)
            wp.transform camera-to-world start/end poses), ``frame_times`` ((2,) float t0, t1 [s]; gradients only
            through moving instances), ``static_points`` (the static mesh's vertices, or None) and
            ``prototype_points`` (one vertex array per prototype, None for an empty one). Also ``face`` and
            ``instance``: (H, W) int32 surface picked per pixel (-1: miss / static), not differentiable.
    """

    width: int
    height: int
    t0: float
    t1: float
    color: wp.array | None = None
    distance: wp.array | None = None
    distance_colorized: wp.array | None = None
    semantics: wp.array | None = None
    semantics_colorized: wp.array | None = None
    normals: wp.array | None = None
    semantic_classes: list[SemanticClassEntry] = field(default_factory=list)
    vmax: float = 80.0
    start_pose: Pose | None = None
    end_pose: Pose | None = None
    tape: Any = None
    inputs: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, product: CameraProduct | str) -> wp.array:
        arr = getattr(self, CameraProduct.parse(product).value)
        if arr is None:
            raise KeyError(f"product {CameraProduct.parse(product).name} was not rendered")
        return arr

    def numpy(self) -> dict[str, np.ndarray]:
        """Every rendered product as a NumPy array, keyed by product value (``"color"``, ``"distance"``, ...)."""
        return {p.value: getattr(self, p.value).numpy() for p in CameraProduct if getattr(self, p.value) is not None}


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
# OpenCV camera axes (x right, y down, z forward) → USD camera axes (x right, y up, looking down -z)
_CV_TO_USD_CAMERA = np.diag([1.0, -1.0, -1.0, 1.0])


# ---------------------------------------------------------------------------------------------------------------------
# shading tables (built once per device geometry)

_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _shade_tables(geo: Any) -> _kshade.ShadeTables:
    tab = _TABLES.get(geo)
    if tab is not None:
        return tab
    scene: Scene = geo.scene
    d = geo.device
    t = _kshade.ShadeTables()
    t.material_color = wp.array(np.array([m.base_color for m in scene.materials], np.float32).reshape(-1, 3),
                                dtype=wp.vec3, device=d)
    sc = scene.static.colors
    if sc is not None and len(sc) == len(scene.static.points) and scene.static.num_triangles:
        t.static_colors = wp.array(np.asarray(sc, np.float32).reshape(-1, 3), dtype=wp.vec3, device=d)
        t.static_has_colors = 1
    else:
        t.static_colors = wp.zeros(1, dtype=wp.vec3, device=d)
        t.static_has_colors = 0
    offs, chunks, n = {}, [], 0
    for k, p in enumerate(scene.prototypes):
        if p.colors is not None and len(p.colors) == len(p.points):
            offs[k] = n
            chunks.append(np.asarray(p.colors, np.float32).reshape(-1, 3))
            n += len(p.points)
    t.inst_color_offset = wp.array([offs.get(i.prototype, -1) for i in geo.instances] or [-1], dtype=wp.int32,
                                   device=d)
    t.proto_colors = wp.array(np.concatenate(chunks) if chunks else np.zeros((1, 3), np.float32), dtype=wp.vec3,
                              device=d)
    tex = build_texture_tables(scene)
    t.material_texture = wp.array(tex.material_texture, dtype=wp.vec4i, device=d)
    t.texels = wp.array(tex.texels, dtype=wp.vec3, device=d)
    t.static_uv = wp.array(tex.static_uv, dtype=wp.vec2, device=d)
    t.proto_uv = wp.array(tex.proto_uv, dtype=wp.vec2, device=d)
    t.inst_uv_offset = wp.array([int(tex.proto_uv_offset[i.prototype]) for i in geo.instances] or [0],
                                dtype=wp.int32, device=d)
    _TABLES[geo] = t
    return t


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
        """A camera from a USD ``Camera`` prim.

        Without extra attributes the prim is an undistorted OpenCV pinhole: fx = focalLength / horizontalAperture · W,
        fy = focalLength / verticalAperture · H, principal point at the image centre shifted by
        horizontalApertureOffset / verticalApertureOffset (USD's y points up, the image's down). The resolution is
        ``int2 wsim:camera:resolution`` (W, H) if authored, else W = 1920 and H = W · verticalAperture /
        horizontalAperture. The shutter is GLOBAL.

        A stage authors the other models (and windshields, shutters) with one custom attribute holding JSON::

            string wsim:camera:calibration = '{"model": "ftheta", "resolution": [1920, 1080],
                "shutter_type": "ROLLING_TOP_TO_BOTTOM", "logical_id": "camera_front_wide_120fov",
                "params": {"principal_point_x": 959.5, "principal_point_y": 539.5,
                           "reference_poly": "PIXELDIST_TO_ANGLE", "pixeldist_to_angle_poly": [0, 1e-3, ...],
                           "angle_to_pixeldist_poly": [], "max_angle": 1.2, "linear_cde": [1, 0, 0],
                           "bivariate_windshield_model_param": {"reference_poly": "FORWARD",
                               "horizontal_poly": [...], "vertical_poly": [...],
                               "horizontal_poly_inverse": [...], "vertical_poly_inverse": [...]}}}'

        ``model`` is ``ftheta``, ``opencv_pinhole`` or ``opencv_fisheye``; ``params`` uses the sensorsim CameraSpec
        field names (as :class:`wsim.scene.CameraCalibration.params`); ``shutter_type`` defaults to
        ROLLING_TOP_TO_BOTTOM; ``unique_id`` may be added (the loader keeps it). When present the attribute overrides
        the USD lens attributes. The USD loader reads the same attribute into ``Scene.cameras``.

        The pose is the prim's local-to-world transform, turned to OpenCV axes (USD cameras look down -z with +y up),
        scaled by metersPerUnit and rotated to Z up for Y-up stages. An animated transform becomes the camera's
        trajectory (time codes / timeCodesPerSecond = scene seconds).

        Raises:
            ValueError: Missing prim, not a Camera, or malformed attributes (the message names the prim and field).
        """
        from pxr import Usd, UsdGeom  # USD stays inside this constructor

        stage = Usd.Stage.Open(str(stage_path))
        if stage is None:
            raise ValueError(f"stage_path: cannot open {stage_path}")
        prim = stage.GetPrimAtPath(prim_path)
        if not prim or not prim.IsValid():
            raise ValueError(f"prim_path: {stage_path} has no prim {prim_path}")
        if not prim.IsA(UsdGeom.Camera):
            raise ValueError(f"prim_path: {prim_path} is a {prim.GetTypeName() or 'typeless prim'}, not a Camera")
        where = f"{stage_path}:{prim_path}"
        shutter = ShutterType.GLOBAL
        windshield = None
        logical = prim.GetName()
        attr = prim.GetAttribute("wsim:camera:calibration")
        if attr and attr.HasAuthoredValue():
            try:
                doc = json.loads(attr.Get())
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}: wsim:camera:calibration is not valid JSON: {e}") from e
            if not isinstance(doc, dict) or "model" not in doc:
                raise ValueError(f"{where}: wsim:camera:calibration needs at least 'model', 'params', 'resolution'")
            params = dict(doc.get("params") or {})
            try:
                lens = lens_from_params(doc["model"], params, doc.get("resolution", params.get("resolution")))
                windshield = windshield_from_params(params)
                shutter = ShutterType.parse(doc.get("shutter_type") or params.get("shutter_type")
                                            or "ROLLING_TOP_TO_BOTTOM")
            except ValueError as e:
                raise ValueError(f"{where}: wsim:camera:calibration: {e}") from e
            logical = str(doc.get("logical_id", logical))
        else:
            cam = UsdGeom.Camera(prim)
            f = float(cam.GetFocalLengthAttr().Get() or 0.0)
            ha = float(cam.GetHorizontalApertureAttr().Get() or 0.0)
            va = float(cam.GetVerticalApertureAttr().Get() or 0.0)
            ho = float(cam.GetHorizontalApertureOffsetAttr().Get() or 0.0)
            vo = float(cam.GetVerticalApertureOffsetAttr().Get() or 0.0)
            for name, v in (("focalLength", f), ("horizontalAperture", ha), ("verticalAperture", va)):
                if not (math.isfinite(v) and v > 0):
                    raise ValueError(f"{where}: {name} must be positive, got {v}")
            res_attr = prim.GetAttribute("wsim:camera:resolution")
            if res_attr and res_attr.HasAuthoredValue():
                w, h = (int(x) for x in res_attr.Get())
            else:
                w = 1920
                h = max(1, int(round(w * va / ha)))
            lens = OpenCVPinholeLens(w, h, w / 2.0 + ho / ha * w, h / 2.0 - vo / va * h, f / ha * w, f / va * h)
        # pose (trajectory if animated)
        mpu = float(UsdGeom.GetStageMetersPerUnit(stage) or 1.0)
        tps = float(stage.GetTimeCodesPerSecond() or 24.0)
        up = np.eye(4)
        if UsdGeom.GetStageUpAxis(stage) == UsdGeom.Tokens.y:
            up[:3, :3] = [[1, 0, 0], [0, 0, -1], [0, 1, 0]]
        samples: set[float] = set()
        p = prim
        while p and p.GetPath() != p.GetPath().absoluteRootPath:
            if p.IsA(UsdGeom.Xformable):
                for op in UsdGeom.Xformable(p).GetOrderedXformOps():
                    samples.update(op.GetTimeSamples())
            p = p.GetParent()
        cache_times = sorted(samples) if len(samples) > 1 else [samples.pop() if samples else None]
        ts, qs, tt = [], [], []
        xf = UsdGeom.Xformable(prim)
        for tc in cache_times:
            code = Usd.TimeCode.Default() if tc is None else Usd.TimeCode(tc)
            m = np.array(xf.ComputeLocalToWorldTransform(code), np.float64).T  # USD is row-vector
            m = up @ m @ _CV_TO_USD_CAMERA
            t, q, _s = decompose_matrix(m)
            ts.append(t * mpu)
            qs.append(q)
            tt.append(0.0 if tc is None else tc / tps)
        traj = Trajectory(np.asarray(tt), np.asarray(ts), np.asarray(qs))
        return cls(lens, width=width, height=height, shutter=shutter, windshield=windshield, trajectory=traj,
                   logical_id=logical, device=device)

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
            pts, pts_origin = wp.array((a - origin).astype(np.float32), dtype=wp.vec3, device=d), zero
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
        prods = {CameraProduct.parse(p) for p in products}
        if not prods:
            raise ValueError("products: nothing to render")
        if int(supersample) < 1 or int(supersample) > 16:
            raise ValueError(f"supersample: must be in [1, 16], got {supersample}")
        if not (vmax > 0 and math.isfinite(vmax)):
            raise ValueError(f"vmax: must be a positive distance, got {vmax}")
        geo = scene.device_geometry(self.device) if isinstance(scene, Scene) else scene
        if wp.get_device(geo.device) != self.device:
            raise ValueError(f"scene: geometry is on {geo.device}, the camera on {self.device}")
        geo.set_time_window(t0, t1)
        poses, p0, p1 = self._pose_array(t0, t1, start_pose, end_pose)
        d, h, w = self.device, self.height, self.width
        if requires_grad:
            prods.add(CameraProduct.DISTANCE)
            if not poses.requires_grad:
                poses = wp.array(poses.numpy(), dtype=wp.transform, device=d, requires_grad=True)
        want_color = CameraProduct.COLOR in prods
        raw = {CameraProduct.DISTANCE, CameraProduct.DISTANCE_COLORIZED, CameraProduct.SEMANTICS,
               CameraProduct.SEMANTICS_COLORIZED, CameraProduct.NORMALS}
        want_raw = bool(prods & raw)
        rh, rw = (h, w) if want_raw else (1, 1)
        color = wp.empty((h, w, 3) if want_color else (1, 1, 3), dtype=wp.uint8, device=d)
        distance = wp.empty((rh, rw), dtype=float, device=d)
        semantic = wp.empty((rh, rw), dtype=wp.int32, device=d)
        normal = wp.empty((rh, rw), dtype=wp.vec3, device=d)
        light = (lighting or SunSky()).to_warp()
        if want_color or not requires_grad:
            _launch.launch(_kshade.render_kernel, h * w,
                           [geo.geo, _shade_tables(geo), light, self._params, self.shutter.device_code, poses, t0, t1,
                            float(t_max), int(supersample), int(want_color), int(want_raw and not requires_grad)],
                           [color, distance, semantic, normal], device=d)
        frame = CameraFrame(w, h, t0, t1, vmax=float(vmax), start_pose=p0, end_pose=p1)
        if requires_grad:
            distance = self._distance_with_tape(geo, poses, t0, t1, float(t_max), distance, semantic, normal, frame)
        if want_color:
            frame.color = color
        if CameraProduct.DISTANCE in prods:
            frame.distance = distance
        if CameraProduct.SEMANTICS in prods:
            frame.semantics = semantic
        if CameraProduct.NORMALS in prods:
            frame.normals = normal
        if CameraProduct.DISTANCE_COLORIZED in prods:
            out = wp.empty((h, w, 3), dtype=wp.uint8, device=d)
            _launch.launch(_kshade.colorize_distance_kernel, h * w, [distance, float(vmax)], [out], device=d)
            frame.distance_colorized = out
        if CameraProduct.SEMANTICS_COLORIZED in prods:
            names = list(geo.scene.semantic_classes)
            pal = semantic_palette(names)
            out = wp.empty((h, w, 3), dtype=wp.uint8, device=d)
            _launch.launch(_kshade.colorize_semantics_kernel, h * w,
                           [semantic, wp.array(pal, dtype=wp.uint8, device=d)], [out], device=d)
            frame.semantics_colorized = out
            frame.semantic_classes = [SemanticClassEntry(i, n, tuple(int(c) for c in pal[i]))
                                      for i, n in enumerate(names)]
        return frame

    def _distance_with_tape(self, geo: Any, poses: wp.array, t0: float, t1: float, t_max: float, distance: wp.array,
                            semantic: wp.array, normal: wp.array, frame: CameraFrame) -> wp.array:
        """Raw products plus the surface per pixel (one trace), then DISTANCE recomputed on a ``wp.Tape`` from those
        surfaces; fills ``frame.tape`` / ``frame.inputs`` and returns the differentiable distance image."""
        d, h, w = self.device, self.height, self.width
        face = wp.empty((h, w), dtype=wp.int32, device=d)
        inst = wp.empty((h, w), dtype=wp.int32, device=d)
        _launch.launch(_kshade.render_raw_kernel, h * w,
                       [geo.geo, self._params, self.shutter.device_code, poses, t0, t1, t_max],
                       [distance, semantic, normal, face, inst], device=d)
        times = wp.array([t0, t1], dtype=float, device=d, requires_grad=True)
        out = wp.zeros((h, w), dtype=float, device=d, requires_grad=True)
        tape = wp.Tape()
        with tape:
            wp.launch(_kshade.distance_diff_kernel, h * w,
                      [geo.geo, self._params, self.shutter.device_code, poses, times, face, inst, distance], [out],
                      device=d)
        frame.tape = tape
        frame.inputs = {
            "poses": poses, "frame_times": times,
            "static_points": geo.static_mesh.points if geo.static_mesh is not None else None,
            "prototype_points": [m.points if m is not None else None for m in geo.prototype_meshes],
            "face": face, "instance": inst,
        }
        return out


# ---------------------------------------------------------------------------------------------------------------------
# overlays and encoders


def _image_u8(image: Any, name: str = "image") -> np.ndarray:
    a = image.numpy() if isinstance(image, wp.array) else np.asarray(image)
    if a.dtype != np.uint8:
        raise ValueError(f"{name}: expected uint8 pixels, got {a.dtype}")
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise ValueError(f"{name}: expected an (H, W, 3) image, got shape {a.shape}")
    return a


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


def composite_ego_mask(image: Any, rgba_mask: Any) -> np.ndarray:
    """Alpha-composite an RGBA ego mask (uint8 (h, w, 4) array, PIL image or file path) over an RGB image; the mask
    is resized (bilinear) to the image size when they differ. Returns a new (H, W, 3) uint8 image."""
    from PIL import Image

    img = _image_u8(image)[..., :3]
    if isinstance(rgba_mask, (str, Path)):
        m = Image.open(rgba_mask).convert("RGBA")
    elif isinstance(rgba_mask, Image.Image):
        m = rgba_mask.convert("RGBA")
    else:
        arr = np.asarray(rgba_mask)
        if arr.ndim != 3 or arr.shape[2] != 4 or arr.dtype != np.uint8:
            raise ValueError(f"rgba_mask: expected an (h, w, 4) uint8 RGBA image, got {arr.shape} {arr.dtype}")
        m = Image.fromarray(arr, "RGBA")
    if m.size != (img.shape[1], img.shape[0]):
        m = m.resize((img.shape[1], img.shape[0]), Image.BILINEAR)
    mm = np.asarray(m).astype(np.float32)
    a = mm[..., 3:4] / 255.0
    out = img.astype(np.float32) * (1.0 - a) + mm[..., :3] * a
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def encode_png(image: Any) -> bytes:
    """PNG bytes of an (H, W, 3) uint8 image (NumPy or Warp array)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(_image_u8(image)[..., :3])).save(buf, format="PNG")
    return buf.getvalue()


def encode_jpeg(image: Any, quality: float = 90) -> bytes:
    """JPEG bytes of an (H, W, 3) uint8 image; ``quality`` in [1, 100] (values in (0, 1] are read as fractions)."""
    from PIL import Image

    q = float(quality)
    if not math.isfinite(q) or q <= 0:
        raise ValueError(f"quality: must be in (0, 100], got {quality}")
    if q <= 1.0:
        q *= 100.0
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(_image_u8(image)[..., :3])).save(buf, format="JPEG",
                                                                         quality=int(round(min(q, 100))))
    return buf.getvalue()


def encode_rgb_planar(image: Any) -> bytes:
    """Raw C×H×W uint8 bytes (sensorsim RGB_UINT8_PLANAR)."""
    return np.ascontiguousarray(_image_u8(image)[..., :3].transpose(2, 0, 1)).tobytes()


__all__ = [
    "Camera", "CameraFrame", "CameraProduct", "Cuboid", "Projection", "SemanticClassEntry", "ShutterType", "SunSky",
    "as_pose", "composite_ego_mask", "cuboids_from_scene", "draw_boxes", "encode_jpeg", "encode_png",
    "encode_rgb_planar", "semantic_palette",
]
