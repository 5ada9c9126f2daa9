"""The worker side: :func:`render_shard` renders one shard and writes its files. Serial runs, local worker processes
and Ray tasks all call it with the same :class:`~wsim.dataset.plan.ShardTask`.

A worker process keeps the scene of its last shard loaded (with its device geometry), so consecutive shards of one
scene pay for loading and BVH builds once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..launch import init_warp
from .plan import ShardTask
from .writers import (CameraFrameOut, FolderWriter, FrameOut, LidarFrame, McapShardWriter, atomic_write, json_bytes,
                      params_json, point_table, pose_dict, to_jsonable)

#: Test hook: ``N`` or ``N:MARKER`` — a worker process (never the driver) exits hard (``os._exit``) after rendering N
#: frames; with MARKER, only the first process to create that file does (one crash per run).
CRASH_ENV = "WSIM_DATASET_TEST_CRASH"
CRASH_EXIT_CODE = 86

_SCENES: dict[str, Any] = {}
_frames_rendered = 0
_warp_ready = False


def init_worker(threads: int | None = None, verbose: bool = False) -> None:
    """Prepare this process to render: ``WSIM_NUM_THREADS`` (CPU threads of each launch) and a quiet Warp."""
    global _warp_ready
    if threads:
        os.environ["WSIM_NUM_THREADS"] = str(int(threads))
    if not _warp_ready:
        init_warp(verbose)
        _warp_ready = True


def _scene(source: str):
    if source not in _SCENES:
        from ..scene.loader import load_scene

        _SCENES.clear()  # one scene resident per worker
        _SCENES[source] = load_scene(source)
    return _SCENES[source]


def _maybe_crash(may_crash: bool) -> None:
    spec = os.environ.get(CRASH_ENV)
    if not may_crash or not spec:
        return
    n, _, marker = spec.partition(":")
    if _frames_rendered < int(n):
        return
    if marker:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os._exit(CRASH_EXIT_CODE)


def foxglove_calibration(cam: Any) -> dict[str, Any]:
    """The foxglove.CameraCalibration fields of a camera: K (3x3), R (identity), P (3x4), distortion model and D.

    OpenCV pinhole lenses map to ``plumb_bob`` (k1, k2, p1, p2, k3) or ``rational_polynomial`` (k1..k6),
    fisheye lenses to ``kannala_brandt`` (k1..k4). An f-theta lens has no such model: it is fitted by
    ``kannala_brandt`` (least squares of r(θ) = f·(θ + k1θ³ + k2θ⁵ + k3θ⁷ + k4θ⁹) over its field of view; the
    fit's RMS and largest error [px] are given as ``fit_rms_px`` / ``fit_max_px``), with its principal point moved to
    the pixel-corner origin of the OpenCV models. wsim's own lens parameters are in ``rig.json``.
    """
    from ..sensors.lens import FThetaLens, OpenCVFisheyeLens, OpenCVPinholeLens

    lens = cam.lens
    out: dict[str, Any] = {"R": [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]}
    if isinstance(lens, FThetaLens):
        cx, cy = lens.principal_point_x + 0.5, lens.principal_point_y + 0.5
        r_max = max(np.hypot(x - cx, y - cy) for x in (0, lens.width) for y in (0, lens.height))
        r = np.linspace(0.0, r_max, 400)[1:]
        if lens.pixeldist_to_angle_poly:
            th = np.polynomial.polynomial.polyval(r, lens.pixeldist_to_angle_poly)
        else:
            th = np.linspace(0.0, lens.max_angle if lens.max_angle > 0 else np.pi / 2, 400)[1:]
            r = np.polynomial.polynomial.polyval(th, lens.angle_to_pixeldist_poly)
        keep = (th > 0) & ((th <= lens.max_angle) if lens.max_angle > 0 else True)
        th, r = th[keep], r[keep]
        a = np.stack([th, th ** 3, th ** 5, th ** 7, th ** 9], 1)
        sol = np.linalg.lstsq(a, r, rcond=None)[0]
        f = float(sol[0])
        err = a @ sol - r
        out.update(distortion_model="kannala_brandt", D=[float(c / f) for c in sol[1:]], fx=f, fy=f, cx=cx, cy=cy,
                   fit_rms_px=float(np.sqrt(np.mean(err ** 2))), fit_max_px=float(np.abs(err).max()))
    elif isinstance(lens, OpenCVFisheyeLens):
        k = list(lens.radial_coeffs) or [0.0] * 4
        out.update(distortion_model="kannala_brandt", D=[float(x) for x in k], fx=lens.focal_length_x,
                   fy=lens.focal_length_y, cx=lens.principal_point_x, cy=lens.principal_point_y)
    elif isinstance(lens, OpenCVPinholeLens):
        k = list(lens.radial_coeffs) + [0.0] * (6 - len(lens.radial_coeffs))
        p = list(lens.tangential_coeffs) or [0.0, 0.0]
        if any(k[3:]):
            model, d = "rational_polynomial", [k[0], k[1], p[0], p[1], k[2], k[3], k[4], k[5]]
        else:
            model, d = "plumb_bob", [k[0], k[1], p[0], p[1], k[2]]
        out.update(distortion_model=model, D=[float(x) for x in d], fx=lens.focal_length_x, fy=lens.focal_length_y,
                   cx=lens.principal_point_x, cy=lens.principal_point_y)
    fx, fy, cx, cy = (float(out[k]) for k in ("fx", "fy", "cx", "cy"))
    out["K"] = [fx, 0.0, cx, 0.0, fy, cy, 0.0, 0.0, 1.0]
    out["P"] = [fx, 0.0, cx, 0.0, 0.0, fy, cy, 0.0, 0.0, 0.0, 1.0, 0.0]
    return out


def _sensors(task: ShardTask, scene: Any) -> tuple[list, list]:
    from ..scene.scene import Trajectory
    from ..sensors.camera import Camera
    from ..sensors.lidar import Lidar

    rig = scene.ego_trajectory or Trajectory([0.0], [[0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0, 1.0]])
    lidars = [(lt, Lidar.preset(lt.preset, scene=scene, rig=rig, mount=(lt.translation, lt.rotation_xyzw),
                                device=task.device, **dict(lt.config))) for lt in task.lidars]
    cams = []
    for ct in task.cameras:
        cam = Camera.from_calibration(scene.cameras[ct.id], rig, width=ct.width, height=ct.height,
                                      device=task.device)
        cam.camera_to_rig = (np.asarray(ct.translation, float), np.asarray(ct.rotation_xyzw, float))
        cams.append((ct, cam))
    return lidars, cams


def rig_document(task: ShardTask, lidars: list, cams: list, calibrations: dict[str, dict]) -> dict[str, Any]:
    """``rig.json``: the sensors of a scene and variant — lidar presets, mounts and config overrides; camera lenses
    (wsim's parameters at the rendered resolution), shutter, camera-to-rig, Foxglove calibration; the frame rate."""
    from ..sensors.lidar_config import FrameOfReference

    # no file paths: the same scene bytes give the same rig.json wherever the scene file lies
    doc: dict[str, Any] = {"scene": task.scene_name, "variant": task.variant, "frame_span_s": task.frame_span_s,
                           "lidars": {}, "cameras": {}}
    for lt, lidar in lidars:
        c = lidar.config
        doc["lidars"][lt.id] = {
            "preset": lt.preset, "sensor_to_rig": pose_dict((lt.translation, lt.rotation_xyzw)),
            "config_overrides": dict(lt.config), "output_frame_of_reference": c.output_frame_of_reference.name,
            "coords_type": c.elements_coords_type.name, "motion_compensation": c.output_motion_compensation_state.name,
            "points_frame_id": "world" if c.output_frame_of_reference is FrameOfReference.WORLD else lt.id,
            "channels": list(lidar.channels)}
    for ct, cam in cams:
        doc["cameras"][ct.id] = {
            "model": type(cam.lens).__name__, "width": cam.width, "height": cam.height, "shutter": cam.shutter.name,
            "readout_s": ct.readout_s, "products": list(ct.products),
            "camera_to_rig": pose_dict((ct.translation, ct.rotation_xyzw)), "lens": to_jsonable(cam.lens),
            "foxglove_calibration": calibrations[ct.id]}
    return doc


def render_shard(task: ShardTask, root: str | os.PathLike, *, progress: Callable[[int, int], None] | None = None,
                 may_crash: bool = False) -> dict[str, Any]:
    """Render every frame of ``task`` and write its outputs under ``root``.

    Args:
        task: The shard.
        root: Dataset folder (``--out``).
        progress: Called after each frame with (points, images) of that frame.
        may_crash: This is a worker process: the :data:`CRASH_ENV` test hook may end it.

    Returns:
        {shard_id, inputs_hash, outputs {relative path: bytes}, frames, points, images, seconds}.
    """
    global _frames_rendered
    from ..sensors.camera import CameraProduct, encode_png
    from ..sensors.lidar_config import FrameOfReference

    t_start = time.perf_counter()
    root = Path(root)
    scene = _scene(task.scene_source)
    lidars, cams = _sensors(task, scene)
    calibrations = {ct.id: foxglove_calibration(cam) for ct, cam in cams}
    mounts = {lt.id: (lt.translation, lt.rotation_xyzw) for lt, _ in lidars}
    mounts.update({ct.id: (ct.translation, ct.rotation_xyzw) for ct, _ in cams})
    origin_ns = int(scene.time_origin_us * 1000)
    folder = FolderWriter(root, task) if "folder" in task.formats else None
    mcap = None
    if "mcap" in task.formats:
        mcap = McapShardWriter(root / task.mcap_path, task.mcap_compression, metadata={
            "scene": task.scene_name, "variant": task.variant, "shard": task.shard_id,
            "frames": f"{task.frames[0][0]}-{task.frames[-1][0]}", "inputs_hash": task.inputs_hash})
    outputs: dict[str, int] = {}
    points = images = 0
    try:
        for k, t in task.frames:
            ego = scene.ego_trajectory.pose_at(t) if scene.ego_trajectory is not None else (
                np.zeros(3), np.array([0.0, 0.0, 0.0, 1.0]))
            fr = FrameOut(k, t, origin_ns + int(round(t * 1e9)), ego)
            n_pts = n_img = 0
            for lt, lidar in lidars:
                lidar.frame_id = k - 1  # frameId = the global frame index, whichever shard or worker renders it
                pc = lidar.render(t, t + task.frame_span_s)
                table = point_table(pc)
                world = lidar.config.output_frame_of_reference is FrameOfReference.WORLD
                params = params_json(pc.params)
                fr.lidars.append(LidarFrame(lt.id, table, params, "world" if world else lt.id,
                                            (t, t + task.frame_span_s), int(params["timestampNs"])))
                n_pts += len(table)
            for ct, cam in cams:
                prods = [CameraProduct.COLOR] * ("color" in ct.products) + \
                        [CameraProduct.DISTANCE] * ("distance" in ct.products)
                f = cam.render(scene, t, t + ct.readout_s, products=prods)
                cf = CameraFrameOut(ct.id, cam.width, cam.height, (t, t + ct.readout_s), fr.timestamp_ns,
                                    f.start_pose, f.end_pose)
                if "color" in ct.products:
                    cf.png = encode_png(f.color.numpy())
                    n_img += 1
                if "distance" in ct.products:
                    cf.distance = f.distance.numpy().astype(np.float32)
                    n_img += 1
                fr.cameras.append(cf)
            if folder is not None:
                outputs.update(folder.write_frame(fr))
            if mcap is not None:
                mcap.write_frame(fr, mounts, calibrations)
            points += n_pts
            images += n_img
            _frames_rendered += 1
            if progress is not None:
                progress(n_pts, n_img)
            _maybe_crash(may_crash)
        if folder is not None:
            rel = f"{task.seq_dir}/rig.json"
            outputs[rel] = atomic_write(root / rel, json_bytes(rig_document(task, lidars, cams, calibrations)))
        if mcap is not None:
            outputs[task.mcap_path] = mcap.close()
            mcap = None
    finally:
        if mcap is not None:
            mcap.abort()
    return {"shard_id": task.shard_id, "inputs_hash": task.inputs_hash, "outputs": dict(sorted(outputs.items())),
            "frames": task.num_frames, "points": points, "images": images,
            "seconds": time.perf_counter() - t_start}


__all__ = ["CRASH_ENV", "foxglove_calibration", "init_worker", "render_shard"]
