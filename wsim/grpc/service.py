"""The sensorsim servicer: translates protobuf requests into :class:`wsim.Camera` / :class:`wsim.Lidar` renders on
the scenes of a :class:`~wsim.grpc.scenes.SceneStore`, and wsim results back into protobuf. Protobuf types stay in
this package.

Rendering semantics (sensorsim-api.md):

- Times are absolute microseconds; scene seconds = (us − scene.time_origin_us) / 1e6.
- ``sensor_pose`` gives the sensor-to-local pose at ``frame_start_us`` and ``frame_end_us``; wsim interpolates between
  them (lerp / shortest-arc slerp) at each pixel row's or lidar firing's time.
- Cameras render at the request's resolution with intrinsics rescaled from the CameraSpec's native resolution.
- ``render_lidar`` returns one frame covering [frame_start_us, frame_end_us] (for AlpaSim: one full spin of
  1 / scan rate): every firing in the window (partial outputs, not an instantaneous scan), output in the SENSOR frame,
  motion-compensated to the sensor pose at ``frame_end_us`` (the end-of-spin lidar frame), Cartesian coordinates.
- ``dynamic_objects`` override the listed tracks for the frame (local → cuboid-centre pose at start / end); other
  tracks move as recorded. The shared scene is never modified (see :mod:`wsim.grpc.geometry`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import uuid
from pathlib import Path
from typing import Any, Callable

import grpc
import numpy as np

from .. import __version__
from ..launch import Cancelled, check_cancelled
from ..scene.scene import Scene, SceneError, Trajectory
from ..sensors.lidar import Lidar
from ..sensors.lidar_config import CoordsType, FrameOfReference, MotionCompensation
from ..sensors.presets import preset as lidar_preset
from . import convert
from .assets import AssetEditing
from .budget import RequestBudget, camera_products
from .errors import RequestError, as_request_error, clip, exhausted, invalid, not_found, precondition
from .geometry import request_scene, track_index
from .rpc import rpc as _rpc
from .scenes import SceneStore
from .stubs import common_pb2, ipc_pb2, sensorsim_pb2, sensorsim_pb2_grpc

log = logging.getLogger("wsim.grpc")

#: Default send/receive limit [bytes] (AlpaSim's channel allows 64 MiB each way).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: gRPC API version reported by get_version unless the server is given another.
API_VERSION = (0, 1, 0)
#: Largest accepted image side [px].
MAX_IMAGE_SIDE = 16384
#: JPEG quality used when a request leaves image_quality at 0.
DEFAULT_JPEG_QUALITY = 90.0
#: Default upper end of the distance colormap [m].
DEFAULT_VMAX_M = 80.0
#: Default bounding-box colour.
DEFAULT_BBOX_COLOR = (0, 255, 0)

_FORMATS = sensorsim_pb2.ImageFormat
_PRODUCTS = {sensorsim_pb2.CAMERA_RENDER_PRODUCT_COLOR: "COLOR",
             sensorsim_pb2.CAMERA_RENDER_PRODUCT_DISTANCE_COLORIZED: "DISTANCE_COLORIZED",
             sensorsim_pb2.CAMERA_RENDER_PRODUCT_SEMANTICS_COLORIZED: "SEMANTICS_COLORIZED"}
_LIDARS = {sensorsim_pb2.PANDAR128: "PANDAR128", sensorsim_pb2.AT128: "AT128"}
_SUPPORTED_FORMATS = ("PNG", "JPEG", "RGB_UINT8_PLANAR")


def _is_local_peer(peer: str) -> bool:
    """Whether a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:...``) is on this machine."""
    import ipaddress

    kind, _, rest = peer.partition(":")
    if kind == "unix":
        return True
    host = rest.rsplit(":", 1)[0].strip("[]") if kind in ("ipv4", "ipv6") else ""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


@dataclasses.dataclass
class _IpcSession:
    buffers: list
    nbytes: int
    next: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class SensorsimServicer(AssetEditing, sensorsim_pb2_grpc.SensorsimServiceServicer):
    """Implements every RPC of ``nre.grpc.protos.sensorsim.SensorsimService``.

    Args:
        store: The scenes to serve.
        device: Warp device of the renders ("cpu", "cuda:0").
        ego_masks_dir: Folder of RGBA ego-mask PNGs: ``<rig_config_id>/<camera_logical_id>.png`` (a PNG directly in
            the folder has rig_config_id "").
        assets_dir: Folder of asset stages (USD) for edit_assets; the file stem is the asset id.
        max_message_bytes: Send / receive limit; larger answers fail with RESOURCE_EXHAUSTED.
        max_workers: Reported by get_server_config.
        api_version: (major, minor, patch) reported by get_version.
        on_shutdown: Called (in a new thread) by shut_down.
        allow_remote_shutdown: Accept shut_down from clients that are not on this machine (loopback ones always may).
        budget: Work one request may ask for (:class:`~wsim.grpc.budget.RequestBudget`), checked before rendering.
        unknown_tracks: ``"error"``: a ``dynamic_objects`` entry naming a track the scene lacks answers NOT_FOUND;
            ``"ignore"``: it is logged (one warning per track id) and the frame renders without it.
    """

    def __init__(self, store: SceneStore, *, device: str = "cpu", ego_masks_dir: str | Path | None = None,
                 assets_dir: str | Path | None = None, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 budget: RequestBudget | None = None,
                 max_workers: int = 4, api_version: tuple[int, int, int] = API_VERSION,
                 on_shutdown: Callable[[], None] | None = None, unknown_tracks: str = "error",
                 allow_remote_shutdown: bool = False) -> None:
        import warp as wp

        if unknown_tracks not in ("error", "ignore"):
            raise ValueError(f"unknown_tracks: expected 'error' or 'ignore', got {unknown_tracks!r}")
        self.unknown_tracks = unknown_tracks
        self.allow_remote_shutdown = bool(allow_remote_shutdown)
        self._warned_tracks: set[tuple[str, str]] = set()
        self.store = store
        self.device = str(wp.get_device(device))
        self.is_cuda = wp.get_device(device).is_cuda
        self.max_message_bytes = int(max_message_bytes)
        self.budget = budget or RequestBudget()
        self.max_workers = int(max_workers)
        self.api_version = tuple(int(v) for v in api_version)
        self.on_shutdown = on_shutdown
        self.ego_masks_dir = str(ego_masks_dir or "")
        self.assets_dir = str(assets_dir or "")
        self.ego_masks = self._find_ego_masks(ego_masks_dir)
        self._mask_cache: dict[tuple[str, str], np.ndarray] = {}
        self._lidar_configs: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._inflight = 0
        self._inflight_lock = threading.Lock()
        self._ipc: dict[str, _IpcSession] = {}

    # ------------------------------------------------------------------------------------------------ helpers
    @staticmethod
    def _find_ego_masks(folder: str | Path | None) -> dict[tuple[str, str], Path]:
        if not folder:
            return {}
        root = Path(folder)
        if not root.is_dir():
            raise ValueError(f"ego_masks_dir: {folder} is not a folder")
        out = {}
        for f in sorted(root.rglob("*.png")):
            rel = f.relative_to(root)
            rig = "/".join(rel.parts[:-1])
            out[(f.stem, rig)] = f
        return out

    def _scene(self, scene_id: str) -> Scene:
        if not scene_id:
            raise invalid("scene_id: empty")
        try:
            return self.store.get(scene_id)
        except KeyError:
            ids = self.store.scene_ids
            known = ", ".join(ids[:10]) + (f", ... ({len(ids)} scenes; get_available_scenes lists them)"
                                           if len(ids) > 10 else "")
            raise not_found(f"scene_id: unknown scene {clip(scene_id)} (available: {known})") from None
        except SceneError as e:  # the server's own file is broken: not the client's fault; no server paths to it
            log.error("scene %s cannot be loaded: %s", scene_id, e)
            raise precondition(f"scene_id: scene {clip(scene_id)} cannot be loaded on this server (see its log)") \
                from None

    def _request_scene(self, scene: Scene, objects: Any, t0: float, t1: float, field: str) -> Scene:
        tracks = track_index(scene)
        overrides: dict[int, tuple] = {}
        for i, obj in enumerate(objects):
            f = f"{field}[{i}]"
            if not obj.track_id:
                raise invalid(f"{f}.track_id: empty")
            k = tracks.get(obj.track_id)
            if k is None and self.unknown_tracks == "ignore":
                key = (scene.scene_id, obj.track_id)
                with self._lock:
                    first = key not in self._warned_tracks
                    self._warned_tracks.add(key)
                if first:
                    log.warning("%s.track_id: unknown track %r in scene %r: rendering without it (warned once)",
                                f, obj.track_id[:200], scene.scene_id)
                continue
            if k is None:
                raise not_found(f"{f}.track_id: unknown track {clip(obj.track_id)} in scene {scene.scene_id!r}")
            if k in overrides:
                raise invalid(f"{f}.track_id: track {clip(obj.track_id)} listed twice")
            overrides[k] = convert.pose_pair_from_proto(obj.pose_pair, obj.HasField("pose_pair"), f"{f}.pose_pair")
        return request_scene(scene, self.device, overrides, t0, t1)

    @staticmethod
    def _check_harmonizer(req: Any) -> None:
        if req.HasField("apply_harmonizer") and req.apply_harmonizer:
            raise precondition("apply_harmonizer: this server has no harmonizer (wsim renders without one)")

    def _resolution(self, req: Any) -> tuple[int, int]:
        w, h = int(req.resolution_w), int(req.resolution_h)
        for name, v in (("resolution_w", w), ("resolution_h", h)):
            if v == 0:
                raise invalid(f"{name}: must be > 0")
            if v > MAX_IMAGE_SIDE:
                raise invalid(f"{name}: absurd resolution {v} (at most {MAX_IMAGE_SIDE})")
        return w, h

    @staticmethod
    def _format(value: int) -> str:
        if value not in _FORMATS.values():
            raise invalid(f"image_format: unknown value {value}")
        name = _FORMATS.Name(value)
        if name == "UNDEFINED":
            return "PNG"
        if name not in _SUPPORTED_FORMATS:
            raise invalid(f"image_format: {name} is not supported (supported: {', '.join(_SUPPORTED_FORMATS)})")
        return name

    @staticmethod
    def _quality(value: float) -> float:
        q = float(value)
        if q == 0.0:
            return DEFAULT_JPEG_QUALITY
        if not math.isfinite(q) or q < 0 or q > 100:
            raise invalid(f"image_quality: must be in (0, 1] or (1, 100], got {value}")
        return q

    def _encode(self, img: np.ndarray, fmt: str, quality: float) -> bytes:
        from ..sensors.camera import encode_jpeg, encode_png, encode_rgb_planar

        if fmt == "JPEG":
            return encode_jpeg(img, quality)
        if fmt == "PNG":
            return encode_png(img)
        return encode_rgb_planar(img)

    def _ego_mask(self, req: Any) -> np.ndarray | None:
        if not req.insert_ego_mask:
            return None
        key = (req.ego_mask_id.camera_logical_id, req.ego_mask_id.rig_config_id)
        path = self.ego_masks.get(key)
        if path is None:
            raise invalid(f"ego_mask_id: no ego mask for camera {clip(key[0])} and rig config {clip(key[1])} "
                          f"(see get_available_ego_masks)")
        with self._lock:
            mask = self._mask_cache.get(key)
        if mask is None:
            from PIL import Image

            mask = np.asarray(Image.open(path).convert("RGBA"))
            with self._lock:
                self._mask_cache[key] = mask
        return mask

    # ------------------------------------------------------------------------------------------------ cameras
    def _render_images(self, req: Any, products: list[str], *, overlay: bool = False, vmax: float = DEFAULT_VMAX_M,
                       bbox_color: tuple[int, int, int] = DEFAULT_BBOX_COLOR) -> tuple[list[np.ndarray], Any]:
        """Render ``products`` (COLOR, DISTANCE_COLORIZED, SEMANTICS_COLORIZED) of a camera request; returns the
        (H, W, 3) uint8 images in order and the camera frame."""
        from ..sensors.camera import Camera, composite_ego_mask, cuboids_from_scene, draw_boxes
        from ..sensors.lens import lens_from_params, windshield_from_params

        scene = self._scene(req.scene_id)
        self._check_harmonizer(req)
        w, h = self._resolution(req)
        self.budget.image("", w, h)
        fmt = self._format(req.image_format)
        if fmt == "JPEG":
            self._quality(req.image_quality)
        if 3 * w * h * len(products) > self.max_message_bytes:
            raise exhausted(f"resolution_w, resolution_h: {w}x{h} x {len(products)} image(s) exceed the "
                            f"{self.max_message_bytes} byte message limit")
        model, params, native, shutter, prefix = convert.spec_to_lens_args(req.camera_intrinsics,
                                                                             "camera_intrinsics", scene.cameras)
        try:
            lens = lens_from_params(model, params, native)
        except ValueError as e:
            raise invalid(f"{prefix}{e}") from None
        try:
            windshield = windshield_from_params(params)
        except ValueError as e:
            raise invalid(f"camera_intrinsics.bivariate_windshield_model_param.{e}") from None
        try:
            camera = Camera(lens, width=w, height=h, shutter=shutter, windshield=windshield,
                            logical_id=req.camera_intrinsics.logical_id, device=self.device)
        except ValueError as e:
            raise invalid(f"camera_intrinsics: {e}") from None
        t0, t1 = convert.frame_times(req.frame_start_us, req.frame_end_us, scene.time_origin_us,
                                     scene.time_range)
        start, end = convert.pose_pair_from_proto(req.sensor_pose, req.HasField("sensor_pose"), "sensor_pose")
        mask = self._ego_mask(req)
        view = self._request_scene(scene, req.dynamic_objects, t0, t1, "dynamic_objects")
        frame = camera.render(view, t0, t1, products, start, end, vmax=vmax)
        images = [frame[p].numpy() for p in products]
        if overlay:
            cubs = cuboids_from_scene(view, t0, t1)
            images = [draw_boxes(img, camera, cubs, t0, t1, start, end, color=bbox_color) for img in images]
        if mask is not None:
            images = [composite_ego_mask(img, mask) if p == "COLOR" else img for img, p in zip(images, products)]
        return images, frame

    def _rgb(self, req: sensorsim_pb2.RGBRenderRequest) -> sensorsim_pb2.RGBRenderReturn:
        if req.HasField("ipc_session_id"):
            return self._rgb_ipc(req)
        (img,), _ = self._render_images(req, ["COLOR"])
        fmt = self._format(req.image_format)
        return sensorsim_pb2.RGBRenderReturn(image_bytes=self._encode(img, fmt, self._quality(req.image_quality)))

    def _camera(self, req: sensorsim_pb2.CameraRenderRequest) -> sensorsim_pb2.CameraRenderReturn:
        prods: list[str] = []
        for i, p in enumerate(req.render_products or [sensorsim_pb2.CAMERA_RENDER_PRODUCT_COLOR]):
            if p not in _PRODUCTS:
                raise invalid(f"render_products[{i}]: unknown product {p}")
            if _PRODUCTS[p] in prods:
                raise invalid(f"render_products[{i}]: {sensorsim_pb2.CameraRenderProduct.Name(p)} listed twice")
            prods.append(_PRODUCTS[p])
        src = req.overlay_bounding_boxes
        if src not in sensorsim_pb2.OverlayBoundingBoxSource.values():
            raise invalid(f"overlay_bounding_boxes: unknown value {src}")
        vmax = DEFAULT_VMAX_M
        if req.HasField("distance_colormap_vmax_m"):
            vmax = float(req.distance_colormap_vmax_m)
            if not (math.isfinite(vmax) and vmax > 0):
                raise invalid(f"distance_colormap_vmax_m: must be a positive distance, got {vmax}")
        color = DEFAULT_BBOX_COLOR
        if req.HasField("bbox_color"):
            color = (req.bbox_color.r, req.bbox_color.g, req.bbox_color.b)
            for name, v in zip("rgb", color):
                if v > 255:
                    raise invalid(f"bbox_color.{name}: must be in [0, 255], got {v}")
        images, frame = self._render_images(req, prods, overlay=src != 0, vmax=vmax, bbox_color=color)
        fmt = self._format(req.image_format)
        q = self._quality(req.image_quality) if fmt == "JPEG" else 0.0
        out = sensorsim_pb2.CameraRenderReturn()
        for name, img in zip(prods, images):
            o = out.camera_render_outputs.add(image_bytes=self._encode(img, fmt, q), image_height=img.shape[0],
                                              image_width=img.shape[1],
                                              render_product=sensorsim_pb2.CameraRenderProduct.Value(
                                                  "CAMERA_RENDER_PRODUCT_" + name))
            if name == "DISTANCE_COLORIZED":
                o.distance_colormap_vmax_m = vmax
            if name == "SEMANTICS_COLORIZED":
                for e in frame.semantic_classes:
                    o.semantics_class_mapping.add(class_index=e.class_index, class_name=e.class_name,
                                                  color_r=e.color[0], color_g=e.color[1], color_b=e.color[2])
        return out

    # ------------------------------------------------------------------------------------------------ lidar
    def lidar_config(self, name: str):
        """The preset configuration the server renders ``name`` with (see the module docstring)."""
        with self._lock:
            cfg = self._lidar_configs.get(name)
            if cfg is None:
                cfg = lidar_preset(name, output_frame_of_reference=FrameOfReference.SENSOR,
                                   output_motion_compensation_state=MotionCompensation.COMPENSATED,
                                   elements_coords_type=CoordsType.CARTESIAN, partial_outputs=True,
                                   instant_lidar=False)
                self._lidar_configs[name] = cfg
        return cfg

    def _lidar(self, req: sensorsim_pb2.LidarRenderRequest) -> sensorsim_pb2.LidarRenderReturn:
        scene = self._scene(req.scene_id)
        kind = req.lidar_config.lidar_type
        if kind not in _LIDARS:
            raise invalid(f"lidar_config.lidar_type: unknown lidar type {kind} (PANDAR128 = 0, AT128 = 1)")
        cfg = self.lidar_config(_LIDARS[kind])
        self.budget.lidar("", [(req.frame_start_us, req.frame_end_us, cfg.scan_rate_base_hz)])
        t0, t1 = convert.frame_times(req.frame_start_us, req.frame_end_us, scene.time_origin_us,
                                     scene.time_range)
        spins = math.floor((t1 - t0) * cfg.scan_rate_base_hz) + 2
        worst = spins * cfg.number_of_emitters * cfg.ticks_per_scan * cfg.max_returns * 32
        if worst > self.max_message_bytes:
            raise exhausted(f"frame_end_us: a {t1 - t0:.3f} s frame may hold more points than the "
                            f"{self.max_message_bytes} byte message limit allows")
        start, end = convert.pose_pair_from_proto(req.sensor_pose, req.HasField("sensor_pose"), "sensor_pose")
        view = self._request_scene(scene, req.dynamic_objects, t0, t1, "dynamic_objects")
        lidar = Lidar(config=cfg, scene=view, channels=["Coordinates", "Intensity"], device=self.device)
        pc = lidar.render(t0, t1, sensor_poses=(start, end), compensation_reference="end")
        return convert.lidar_return(pc.xyz(), pc["Intensity"].numpy())

    # ------------------------------------------------------------------------------------------------ render RPCs
    def _check_images(self, field: str, reqs: Any, request: Callable[[Any], Any] = lambda r: r) -> None:
        # each request is at least one image: millions of (empty) items are refused without walking them all
        if len(reqs) > self.budget.max_images:
            raise exhausted(f"{field}: {len(reqs)} images or more exceed the server's limit of "
                            f"{self.budget.max_images} per request (--max-images)")
        self.budget.images(field, [(r.resolution_w, r.resolution_h, camera_products(r)) for r in map(request, reqs)])

    @_rpc
    def render_rgb(self, request, context):
        return self._rgb(request)

    @_rpc
    def render_camera(self, request, context):
        return self._camera(request)

    @_rpc
    def render_lidar(self, request, context):
        return self._lidar(request)

    def _batch(self, items: Any, render: Callable, out: Any) -> Any:
        self._check_images("items", items, lambda item: item.request)
        for item in items:
            check_cancelled()  # the client may have gone between items
            entry = out.items.add(camera_name=item.camera_name)
            try:
                entry.result.CopyFrom(render(item.request))
                entry.success = True
            except Exception as e:  # noqa: BLE001 - a failing item is answered; the others still render
                if isinstance(e, Cancelled):
                    raise
                err = as_request_error(e)
                if err.code is grpc.StatusCode.INTERNAL:
                    log.exception("batch item %r failed", item.camera_name)
                entry.success = False
                entry.error_message = f"{err.code.name}: {err.message}"
        if out.ByteSize() > self.max_message_bytes:
            raise exhausted(f"items: the batch answer ({out.ByteSize()} bytes) exceeds the "
                            f"{self.max_message_bytes} byte message limit")
        return out

    @_rpc
    def batch_render_rgb(self, request, context):
        return self._batch(request.items, self._rgb, sensorsim_pb2.BatchRGBRenderReturn())

    @_rpc
    def batch_render_camera(self, request, context):
        return self._batch(request.items, self._camera, sensorsim_pb2.BatchCameraRenderReturn())

    @_rpc
    def render_aggregated(self, request, context):
        out = sensorsim_pb2.AggregatedRenderReturn()
        self._check_images("rgb_requests", request.rgb_requests)
        if len(request.lidar_requests) > self.budget.max_lidar_sweeps:  # each request is at least one sweep
            raise exhausted(f"lidar_requests: {len(request.lidar_requests)} lidar sweeps or more exceed the server's "
                            f"limit of {self.budget.max_lidar_sweeps} per request (--max-lidar-sweeps)")
        rates = {k: self.lidar_config(name).scan_rate_base_hz for k, name in _LIDARS.items()}
        self.budget.lidar("lidar_requests: ", [(r.frame_start_us, r.frame_end_us, rates.get(r.lidar_config.lidar_type,
                                                                                              10.0))
                                               for r in request.lidar_requests])
        for i, r in enumerate(request.rgb_requests):
            try:
                out.rgb_returns.append(self._rgb(r))
            except RequestError as e:
                raise RequestError(e.code, f"rgb_requests[{i}].{e.message}") from None
        for i, r in enumerate(request.lidar_requests):
            try:
                out.lidar_returns.append(self._lidar(r))
            except RequestError as e:
                raise RequestError(e.code, f"lidar_requests[{i}].{e.message}") from None
        if out.ByteSize() > self.max_message_bytes:
            raise exhausted(f"rgb_requests, lidar_requests: the answer ({out.ByteSize()} bytes) exceeds the "
                            f"{self.max_message_bytes} byte message limit")
        return out

    # ------------------------------------------------------------------------------------------------ queries
    @_rpc
    def get_version(self, request, context):
        major, minor, patch = self.api_version
        return common_pb2.VersionId(version_id=f"wsim-{__version__}", git_hash="",
                                    grpc_api_version=common_pb2.APIVersion(major=major, minor=minor, patch=patch))

    @_rpc
    def get_available_scenes(self, request, context):
        return common_pb2.AvailableScenesReturn(scene_ids=self.store.scene_ids)

    @_rpc
    def get_loaded_scenes(self, request, context):
        out = sensorsim_pb2.LoadedScenesReturn(loaded_instance_capacity=self.store.cache_size)
        for sid in self.store.loaded():  # one shared instance per scene, usable by every request
            out.scenes.add(scene_id=sid, loaded_instance_count=1, reusable_instance_count=1)
        return out

    @_rpc
    def get_available_cameras(self, request, context):
        scene = self._scene(request.scene_id)
        out = sensorsim_pb2.AvailableCamerasReturn()
        for lid in sorted(scene.cameras):
            cal = scene.cameras[lid]
            out.available_cameras.add(intrinsics=convert.calibration_to_spec(cal),
                                      rig_to_camera=convert.pose_to_proto(cal.camera_to_rig), logical_id=lid,
                                      trajectory_idx=0)
        return out

    @_rpc
    def get_available_trajectories(self, request, context):
        scene = self._scene(request.scene_id)
        out = sensorsim_pb2.AvailableTrajectoriesReturn()
        if scene.ego_trajectory is not None:
            out.available_trajectories.add(
                trajectory_idx=0, trajectory=convert.trajectory_to_proto(scene.ego_trajectory, scene.time_origin_us))
        return out

    @_rpc
    def get_available_ego_masks(self, request, context):
        out = sensorsim_pb2.AvailableEgoMasksReturn()
        for cam, rig in sorted(self.ego_masks):
            out.ego_mask_metadata.add(ego_mask_id=sensorsim_pb2.EgoMaskId(camera_logical_id=cam, rig_config_id=rig))
        return out

    @_rpc
    def get_server_config(self, request, context):
        ids = self.store.scene_ids
        return sensorsim_pb2.ServerConfig(
            version_id=f"wsim-{__version__}", device=self.device, scene_ids=ids,
            scene_sources=[self.store.entries[s].source for s in ids], cache_size=self.store.cache_size,
            max_workers=self.max_workers, harmonizer_enabled=False, cuda_ipc_available=self.is_cuda,
            ego_masks_dir=self.ego_masks_dir, assets_dir=self.assets_dir, max_message_bytes=self.max_message_bytes,
            lidar_types=list(_LIDARS.values()), image_formats=list(_SUPPORTED_FORMATS))

    @_rpc
    def get_dynamic_objects(self, request, context):
        scene = self._scene(request.scene_id)
        out = sensorsim_pb2.AvailableDynamicObjectsReturn()
        for inst in scene.instances:
            if inst.cuboid is None:
                continue
            size = np.asarray(inst.cuboid, float).reshape(3)
            traj = Trajectory(inst.times, inst.translations, inst.rotations)
            label = scene.semantic_classes[inst.semantic_class] if inst.semantic_class < len(
                scene.semantic_classes) else ""
            out.dynamic_objects.add(track_id=inst.name, label_class=label,
                                    aabb=common_pb2.AABB(size_x=size[0], size_y=size[1], size_z=size[2]),
                                    trajectory=convert.trajectory_to_proto(traj, scene.time_origin_us),
                                    is_static=not inst.is_moving)
        return out

    @_rpc
    def shut_down(self, request, context):
        if not self.allow_remote_shutdown and not _is_local_peer(context.peer()):
            raise RequestError(grpc.StatusCode.PERMISSION_DENIED, "shut_down: only clients on the server's machine may "
                               "stop it (start wsim serve with --allow-remote-shutdown to allow others)")
        if self.on_shutdown is not None:
            threading.Thread(target=self.on_shutdown, name="wsim-shutdown", daemon=True).start()
        return common_pb2.Empty()

    # ------------------------------------------------------------------------------------------------ harmonizer
    @_rpc
    def create_harmonizer_session(self, request, context):
        raise precondition("create_harmonizer_session: this server has no harmonizer")

    @_rpc
    def end_harmonizer_session(self, request, context):
        raise precondition("end_harmonizer_session: this server has no harmonizer")

    # ------------------------------------------------------------------------------------------------ CUDA IPC
    @_rpc
    def open_ipc_session(self, request, context):
        if not self.is_cuda:
            raise precondition(f"open_ipc_session: CUDA IPC needs a CUDA device; this server renders on {self.device}")
        import warp as wp

        n = int(request.num_buffers or 2)
        nbytes = int(request.buffer_bytes or 3 * 1080 * 1920)
        if n > 16:
            raise invalid(f"num_buffers: at most 16, got {n}")
        if n * nbytes > 4 * 1024 ** 3:
            raise exhausted(f"buffer_bytes: {n} x {nbytes} bytes is more than 4 GiB")
        bufs = [wp.zeros(nbytes, dtype=wp.uint8, device=self.device) for _ in range(n)]
        sid = uuid.uuid4().hex
        with self._lock:
            self._ipc[sid] = _IpcSession(bufs, nbytes)
        return ipc_pb2.OpenIpcSessionResponse(session_id=sid, buffer_handles=[bytes(b.ipc_handle()) for b in bufs],
                                              buffer_bytes=nbytes, device_ordinal=wp.get_device(self.device).ordinal)

    @_rpc
    def close_ipc_session(self, request, context):
        with self._lock:
            sess = self._ipc.pop(request.session_id, None)
        if sess is None:
            raise not_found(f"session_id: no IPC session {clip(request.session_id)}")
        return ipc_pb2.CloseIpcSessionResponse(closed=True)

    def _rgb_ipc(self, req: sensorsim_pb2.RGBRenderRequest) -> sensorsim_pb2.RGBRenderReturn:
        import warp as wp

        if not self.is_cuda:
            raise precondition(f"ipc_session_id: CUDA IPC needs a CUDA device; this server renders on {self.device}")
        with self._lock:
            sess = self._ipc.get(req.ipc_session_id)
        if sess is None:
            raise not_found(f"ipc_session_id: no IPC session {clip(req.ipc_session_id)}")
        (img,), _ = self._render_images(req, ["COLOR"])
        planar = np.ascontiguousarray(img.transpose(2, 0, 1)).reshape(-1)
        if planar.nbytes > sess.nbytes:
            raise exhausted(f"resolution_w, resolution_h: {planar.nbytes} bytes do not fit the session's "
                            f"{sess.nbytes} byte buffers")
        with sess.lock:
            k = sess.next
            sess.next = (k + 1) % len(sess.buffers)
        wp.copy(sess.buffers[k], wp.array(planar, dtype=wp.uint8, device=self.device), count=planar.nbytes)
        wp.synchronize_device(self.device)
        return sensorsim_pb2.RGBRenderReturn(ipc_buffer_index=k)
