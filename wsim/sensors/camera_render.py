"""Camera rendering: the products of a frame, the render itself, overlays' helpers and image encoders.

:meth:`wsim.sensors.camera.Camera.render` (the camera model, poses and projection live in
:mod:`wsim.sensors.camera`) calls :func:`render_frame` with plain values: the scene's device geometry, the packed
lens, the shutter code and the start/end poses. Products (:class:`CameraProduct`) stay Warp arrays on the camera's
device until ``.numpy()``:

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
import math
import os
import weakref
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import warp as wp

from .. import launch as _launch
from ..kernels import lens as _klens
from ..kernels import shading as _kshade
from ..scene.scene import Scene
from ..scene.textures import build_texture_tables

#: A pose: (translation (3,), quaternion xyzw (4,)).
Pose = tuple[np.ndarray, np.ndarray]


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


#: On the CPU, runs of up to 64 pixels exposed at the same instant are traced as one packet through the 8-wide BVH
#: (:func:`wsim.kernels.shading.render_rows_kernel`; bit-identical to pixel by pixel; not with supersampling): runs
#: of a row (global and top/bottom rolling shutters) or of a column (left/right ones). False (or
#: ``WSIM_CAMERA_PACKETS=0``) renders pixel by pixel; CUDA always does.
ROW_PACKETS = os.environ.get("WSIM_CAMERA_PACKETS", "1") != "0"


def _packet_tile(shutter: int) -> tuple[int, int]:
    """Rows × columns of :func:`wsim.kernels.shading.render_rows_kernel`'s tile: pixels exposed at one instant."""
    if shutter in (int(_klens.SHUTTER_LEFT_TO_RIGHT), int(_klens.SHUTTER_RIGHT_TO_LEFT)):
        return _kshade.ROW_PACKET, 1
    return 1, _kshade.ROW_PACKET  # (a global shutter too: 4 × 16 tiles measured no faster there)

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


# ---------------------------------------------------------------------------------------------------------------------
# shading tables (built once per device geometry)

_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


_SRGB: dict[str, wp.array] = {}


def srgb_table(device: Any) -> wp.array:
    """The sRGB8 encoding's 256 thresholds on ``device`` (:func:`wsim.kernels.shading.srgb_table_kernel`), made
    once per device."""
    key = str(wp.get_device(device))
    if key not in _SRGB:
        table = wp.empty(256, dtype=float, device=device)
        wp.launch(_kshade.srgb_table_kernel, 256, [table], device=device)
        _SRGB[key] = table
    return _SRGB[key]


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
    t.srgb = srgb_table(d)
    _TABLES[geo] = t
    return t


# ---------------------------------------------------------------------------------------------------------------------
# rendering


def render_frame(geo: Any, params: _klens.LensParams, shutter: int, poses: wp.array, start_pose: Pose | None,
                 end_pose: Pose | None, t0: float, t1: float,
                 products: Iterable[CameraProduct | str] = (CameraProduct.COLOR,), *, supersample: int = 1,
                 vmax: float = 80.0, t_max: float = 1.0e4, lighting: SunSky | None = None,
                 requires_grad: bool = False) -> CameraFrame:
    """Render one frame of a camera (what :meth:`wsim.sensors.camera.Camera.render` does once it has resolved the
    scene's geometry and the poses); each pixel's ray is traced at its own rolling-shutter time with the scene at that
    time.

    Args:
        geo: The scene's ``SceneGeometry`` on the camera's device (held at the time window [t0, t1] while it
            traces).
        params: The packed lens (``Camera.params``); its width and height are the image size.
        shutter: Shutter code (``ShutterType.device_code``).
        poses: (2,) ``wp.transform`` camera-to-world start/end poses (``requires_grad`` arrays are differentiated).
        start_pose, end_pose: The same poses on the host, reported in the :class:`CameraFrame`.
        t0, t1: Frame start (first readout line) and end (last line) [s], t0 <= t1.
        products, supersample, vmax, t_max, lighting, requires_grad: As for ``Camera.render``.

    Returns:
        :class:`CameraFrame` with the asked products as Warp arrays on the geometry's device.
    """
    prods = {CameraProduct.parse(p) for p in products}
    if not prods:
        raise ValueError("products: nothing to render")
    if int(supersample) < 1 or int(supersample) > 16:
        raise ValueError(f"supersample: must be in [1, 16], got {supersample}")
    if not (vmax > 0 and math.isfinite(vmax)):
        raise ValueError(f"vmax: must be a positive distance, got {vmax}")
    d, h, w = wp.get_device(geo.device), params.height, params.width
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
    frame = CameraFrame(w, h, t0, t1, vmax=float(vmax), start_pose=start_pose, end_pose=end_pose)
    # the moving objects' top-level bounds cover the readout while this frame traces, whatever other threads render
    # on the same scene meanwhile
    with geo.hold_time_window(t0, t1):
        if (want_color or not requires_grad) and ROW_PACKETS and int(supersample) == 1 and d.is_cpu \
                and geo.geo.use_wide != 0:
            tr, tc = _packet_tile(shutter)
            _launch.launch(_kshade.render_rows_kernel, -(-h // tr) * -(-w // tc),
                           [geo.geo, _shade_tables(geo), light, params, shutter, poses, t0, t1,
                            float(t_max), int(want_color), int(want_raw and not requires_grad), tr, tc],
                           [color, distance, semantic, normal], device=d,
                           min_shard=max(1, _launch.MIN_SHARD // (tr * tc)))
        elif want_color or not requires_grad:
            _launch.launch(_kshade.render_kernel, h * w,
                           [geo.geo, _shade_tables(geo), light, params, shutter, poses, t0, t1,
                            float(t_max), int(supersample), int(want_color), int(want_raw and not requires_grad)],
                           [color, distance, semantic, normal], device=d)
        if requires_grad:
            distance = _distance_with_tape(geo, params, shutter, poses, t0, t1, float(t_max), distance, semantic,
                                          normal, frame)
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


def _distance_with_tape(geo: Any, params: _klens.LensParams, shutter: int, poses: wp.array, t0: float, t1: float,
                        t_max: float, distance: wp.array, semantic: wp.array, normal: wp.array,
                        frame: CameraFrame) -> wp.array:
    """Raw products plus the surface per pixel (one trace), then DISTANCE recomputed on a ``wp.Tape`` from those
    surfaces; fills ``frame.tape`` / ``frame.inputs`` and returns the differentiable distance image."""
    d, h, w = wp.get_device(geo.device), params.height, params.width
    face = wp.empty((h, w), dtype=wp.int32, device=d)
    inst = wp.empty((h, w), dtype=wp.int32, device=d)
    _launch.launch(_kshade.render_raw_kernel, h * w,
                   [geo.geo, params, shutter, poses, t0, t1, t_max],
                   [distance, semantic, normal, face, inst], device=d)
    times = wp.array([t0, t1], dtype=float, device=d, requires_grad=True)
    out = wp.zeros((h, w), dtype=float, device=d, requires_grad=True)
    tape = wp.Tape()
    with tape:
        wp.launch(_kshade.distance_diff_kernel, h * w,
                  [geo.geo, params, shutter, poses, times, face, inst, distance], [out],
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
# images: ego mask and encoders


def _image_u8(image: Any, name: str = "image") -> np.ndarray:
    a = image.numpy() if isinstance(image, wp.array) else np.asarray(image)
    if a.dtype != np.uint8:
        raise ValueError(f"{name}: expected uint8 pixels, got {a.dtype}")
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise ValueError(f"{name}: expected an (H, W, 3) image, got shape {a.shape}")
    return a


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
    "CameraFrame", "CameraProduct", "SemanticClassEntry", "SunSky", "composite_ego_mask", "encode_jpeg", "encode_png",
    "encode_rgb_planar", "render_frame", "semantic_palette",
]
