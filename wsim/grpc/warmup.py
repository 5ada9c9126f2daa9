"""Server warm-up: one small render of every kind a client asks for, so the first real request costs what the
hundredth does.

Warp compiles (or loads from its kernel cache) a kernel module the first time it is launched, and builds a scene's
BVHs the first time the scene is traced. :func:`warm_up` pays both before the server reports that it is listening: for
each resident scene it renders every camera (each lens model is its own kernel specialisation) through the same
request path as ``render_rgb`` / ``render_camera`` (all products, box overlay, a dynamic-object override), and a short
``render_lidar`` frame of each lidar type. The images are tiny and the lidar frames a few milliseconds long, so on a
warm kernel cache the whole warm-up takes well under a second per scene.
"""

from __future__ import annotations

import time

from ..scene.scene import Scene
from ..scene.transforms import interpolate_pose
from ..sensors.camera import compose_poses
from . import convert
from .stubs import sensorsim_pb2

#: Image size of the warm-up renders [px].
WARMUP_SIZE = (32, 18)
#: Length of the warm-up lidar frames [s].
WARMUP_LIDAR_S = 0.002


def _pose_pair(scene: Scene, t0: float, t1: float, mount) -> sensorsim_pb2.PosePair:
    def at(t: float):
        rig = scene.ego_trajectory.pose_at(t) if scene.ego_trajectory is not None else ((0.0, 0.0, 0.0),
                                                                                         (0.0, 0.0, 0.0, 1.0))
        return convert.pose_to_proto(compose_poses(rig, mount))

    return sensorsim_pb2.PosePair(start_pose=at(t0), end_pose=at(t1))


def _us(scene: Scene, t: float) -> int:
    return int(scene.time_origin_us + round(t * 1e6))


def _override(scene: Scene, t0: float, t1: float) -> list[sensorsim_pb2.DynamicObject]:
    """A dynamic-object override of the scene's first track (its own recorded poses), for the per-request view."""
    for inst in scene.instances:
        if inst.name:
            def at(t: float):
                return convert.pose_to_proto(interpolate_pose(inst.times, inst.translations, inst.rotations, t))

            pair = sensorsim_pb2.PosePair(start_pose=at(t0), end_pose=at(t1))
            return [sensorsim_pb2.DynamicObject(track_id=inst.name, pose_pair=pair)]
    return []


def warm_up_scene(servicer, scene_id: str) -> None:
    """Render each camera of ``scene_id`` and each lidar type once, small, through the servicer's request path."""
    scene = servicer.store.get(scene_id)  # loads the scene and builds its geometry
    t0 = float(scene.time_range[0])
    w, h = WARMUP_SIZE
    for logical_id in sorted(scene.cameras):
        cal = scene.cameras[logical_id]
        t1 = t0 + 0.001
        req = dict(scene_id=scene_id, resolution_w=w, resolution_h=h,
                   camera_intrinsics=convert.calibration_to_spec(cal), frame_start_us=_us(scene, t0),
                   frame_end_us=_us(scene, t1), sensor_pose=_pose_pair(scene, t0, t1, cal.camera_to_rig),
                   dynamic_objects=_override(scene, t0, t1))
        servicer._rgb(sensorsim_pb2.RGBRenderRequest(image_format=sensorsim_pb2.JPEG, image_quality=90, **req))
        servicer._camera(sensorsim_pb2.CameraRenderRequest(
            image_format=sensorsim_pb2.PNG, render_products=list(sensorsim_pb2.CameraRenderProduct.values()),
            overlay_bounding_boxes=sensorsim_pb2.OVERLAY_BOUNDING_BOX_SOURCE_ARTIFACT, **req))
    mount = ((1.0, 0.0, 1.9), (0.0, 0.0, 0.0, 1.0))
    t1 = t0 + WARMUP_LIDAR_S
    for kind in (sensorsim_pb2.PANDAR128, sensorsim_pb2.AT128):
        servicer._lidar(sensorsim_pb2.LidarRenderRequest(
            scene_id=scene_id, lidar_config=sensorsim_pb2.LidarSpec(lidar_type=kind), frame_start_us=_us(scene, t0),
            frame_end_us=_us(scene, t1), sensor_pose=_pose_pair(scene, t0, t1, mount),
            dynamic_objects=_override(scene, t0, t1)))


def warm_up(servicer, scene_ids: list[str]) -> float:
    """Warm up every scene in ``scene_ids`` (see the module docstring); returns the time it took [s]."""
    start = time.perf_counter()
    for sid in scene_ids:
        warm_up_scene(servicer, sid)
    return time.perf_counter() - start


__all__ = ["warm_up", "warm_up_scene", "WARMUP_SIZE", "WARMUP_LIDAR_S"]
