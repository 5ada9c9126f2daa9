"""A small AlpaSim-style closed loop over the sensorsim protocol.

An ego starts on the scene's recorded trajectory. Each step (0.1 s) it:

1. renders every camera of the scene with ``batch_render_rgb`` (and a PANDAR128 sweep with ``render_lidar``) at the
   ego's current pose,
2. forwards the images and the ego's pose history to a driver — an ``EgodriverService`` implemented here that plans a
   constant-velocity trajectory,
3. moves the ego along the plan to the next step.

Only the protocol is used: the sensorsim server is reached over gRPC (``--sensorsim HOST:PORT``, e.g. a running
``wsim serve``); without that option the example starts one in-process on a free loopback port. The driver runs on
its own loopback port, as AlpaSim's driver service would.

    python examples/closed_loop.py --steps 20
"""

from __future__ import annotations

import argparse
import io
import threading
import time
import uuid
from concurrent import futures

import grpc
import numpy as np

from wsim.grpc.stubs import common_pb2, egodriver_pb2, egodriver_pb2_grpc, sensorsim_pb2, sensorsim_pb2_grpc

OPTIONS = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
STEP_US = 100_000          # control period
CAMERA_EXPOSURE_US = 30_000
LIDAR_MOUNT = (np.array([1.0, 0.0, 1.9]), np.array([0.0, 0.0, 0.0, 1.0]))  # lidar-to-rig (x y z, qx qy qz qw)


# ---------------------------------------------------------------------------------------------------------- pose maths
def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array([aw * bx + ax * bw + ay * bz - az * by, aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw, aw * bw - ax * bx - ay * by - az * bz])


def quat_rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    u, w = q[:3], q[3]
    return v + 2.0 * np.cross(u, np.cross(u, v) + w * v)


def compose(a, b):
    """a ∘ b for (translation, quaternion xyzw) poses."""
    return quat_rotate(a[1], b[0]) + a[0], quat_mul(a[1], b[1])


def to_proto(pose) -> common_pb2.Pose:
    t, q = pose
    return common_pb2.Pose(vec=common_pb2.Vec3(x=t[0], y=t[1], z=t[2]),
                           quat=common_pb2.Quat(w=q[3], x=q[0], y=q[1], z=q[2]))


def from_proto(p: common_pb2.Pose):
    return np.array([p.vec.x, p.vec.y, p.vec.z]), np.array([p.quat.x, p.quat.y, p.quat.z, p.quat.w])


def interpolate(traj: common_pb2.Trajectory, t_us: int):
    """Pose of a ``common.Trajectory`` at t_us (lerp + nlerp, clamped)."""
    ts = np.array([p.timestamp_us for p in traj.poses], np.int64)
    k = int(np.clip(np.searchsorted(ts, t_us) - 1, 0, len(ts) - 2)) if len(ts) > 1 else 0
    a = from_proto(traj.poses[k].pose)
    if len(ts) == 1:
        return a
    b = from_proto(traj.poses[k + 1].pose)
    s = float(np.clip((t_us - ts[k]) / max(1, ts[k + 1] - ts[k]), 0.0, 1.0))
    qb = b[1] if np.dot(a[1], b[1]) >= 0 else -b[1]
    q = (1 - s) * a[1] + s * qb
    return (1 - s) * a[0] + s * b[0], q / np.linalg.norm(q)


# ---------------------------------------------------------------------------------------------------------- the driver
class ConstantVelocityDriver(egodriver_pb2_grpc.EgodriverServiceServicer):
    """Plans the ego forward at the velocity of its last two poses (heading kept)."""

    def __init__(self, horizon_s: float = 4.0, dt_s: float = 0.1) -> None:
        self.horizon_s, self.dt_s = horizon_s, dt_s
        self.sessions: dict[str, dict] = {}
        self.lock = threading.Lock()

    def start_session(self, request, context):
        with self.lock:
            self.sessions[request.session_uuid] = {
                "cameras": [c.logical_id for c in request.rollout_spec.vehicle.available_cameras],
                "images": 0, "trajectory": None}
        return common_pb2.SessionRequestStatus()

    def close_session(self, request, context):
        with self.lock:
            self.sessions.pop(request.session_uuid, None)
        return common_pb2.Empty()

    def submit_image_observation(self, request, context):
        from PIL import Image  # the driver decodes what it receives, as a perception stack would

        img = Image.open(io.BytesIO(request.camera_image.image_bytes))
        img.load()
        with self.lock:
            self.sessions[request.session_uuid]["images"] += 1
        return common_pb2.Empty()

    def submit_egomotion_observation(self, request, context):
        with self.lock:
            self.sessions[request.session_uuid]["trajectory"] = request.trajectory
        return common_pb2.Empty()

    def submit_route(self, request, context):
        return common_pb2.Empty()

    def submit_recording_ground_truth(self, request, context):
        return common_pb2.Empty()

    def drive(self, request, context):
        with self.lock:
            traj = self.sessions[request.session_uuid]["trajectory"]
        poses = traj.poses
        p1 = from_proto(poses[-1].pose)
        if len(poses) > 1:
            p0 = from_proto(poses[-2].pose)
            v = (p1[0] - p0[0]) / max(1e-6, (poses[-1].timestamp_us - poses[-2].timestamp_us) * 1e-6)
        else:
            v = np.zeros(3)
        out = egodriver_pb2.DriveResponse()
        t_last = poses[-1].timestamp_us
        for k in range(int(round(self.horizon_s / self.dt_s)) + 1):
            t_us = request.time_query_us + int(k * self.dt_s * 1e6)
            out.trajectory.poses.add(pose=to_proto((p1[0] + v * (t_us - t_last) * 1e-6, p1[1])), timestamp_us=t_us)
        return out

    def get_version(self, request, context):
        return common_pb2.VersionId(version_id="constant-velocity-example-driver")

    def shut_down(self, request, context):
        return common_pb2.Empty()


# ---------------------------------------------------------------------------------------------------------- the loop
def run(sensorsim: str | None = None, *, steps: int = 20, width: int = 256, height: int = 160, lidar: bool = True,
        scene_id: str | None = None, verbose: bool = False) -> dict:
    """Run the loop; returns a summary (steps, images and lidar points received, ego positions)."""
    own_server = None
    if sensorsim is None:
        from wsim.grpc import SensorsimServer  # only to have something to talk to

        own_server = SensorsimServer(port=0)
        own_server.start()
        sensorsim = own_server.address
    driver_impl = ConstantVelocityDriver()
    driver_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=OPTIONS)
    egodriver_pb2_grpc.add_EgodriverServiceServicer_to_server(driver_impl, driver_server)
    driver_port = driver_server.add_insecure_port("127.0.0.1:0")
    driver_server.start()
    sim_channel = grpc.insecure_channel(sensorsim, options=OPTIONS)
    drv_channel = grpc.insecure_channel(f"127.0.0.1:{driver_port}", options=OPTIONS)
    try:
        sim = sensorsim_pb2_grpc.SensorsimServiceStub(sim_channel)
        drv = egodriver_pb2_grpc.EgodriverServiceStub(drv_channel)
        empty = common_pb2.Empty()
        # AlpaSim's start-up sequence
        sim.get_version(empty, wait_for_ready=True, timeout=60)
        drv.get_version(empty)
        scenes = list(sim.get_available_scenes(empty).scene_ids)
        scene_id = scene_id or scenes[0]
        cameras = sim.get_available_cameras(sensorsim_pb2.AvailableCamerasRequest(scene_id=scene_id))
        sim.get_available_ego_masks(empty)
        recorded = sim.get_available_trajectories(
            sensorsim_pb2.AvailableTrajectoriesRequest(scene_id=scene_id)).available_trajectories[0].trajectory
        session = str(uuid.uuid4())
        drv.start_session(egodriver_pb2.DriveSessionRequest(
            session_uuid=session, random_seed=0,
            rollout_spec=egodriver_pb2.DriveSessionRequest.RolloutSpec(
                vehicle=egodriver_pb2.DriveSessionRequest.RolloutSpec.VehicleDefinition(
                    available_cameras=cameras.available_cameras))))
        t_us = recorded.poses[0].timestamp_us + STEP_US
        history = common_pb2.Trajectory()
        for t in (t_us - STEP_US, t_us):  # two recorded poses give the driver its initial velocity
            history.poses.add(pose=to_proto(interpolate(recorded, t)), timestamp_us=t)
        ego = interpolate(recorded, t_us)
        plan = None
        summary = {"steps": 0, "images": 0, "lidar_points": [], "positions": [ego[0].copy()], "render_s": 0.0}
        for step in range(steps):
            # the ego during the camera exposure (and the last lidar spin) follows the plan, or stands still
            def ego_at(tt):
                return interpolate(plan, tt) if plan is not None else ego

            batch = sensorsim_pb2.BatchRGBRenderRequest()
            for cam in cameras.available_cameras:
                c2r = from_proto(cam.rig_to_camera)  # (named rig_to_camera on the wire; it is camera-to-rig)
                t0, t1 = t_us - CAMERA_EXPOSURE_US, t_us
                batch.items.add(camera_name=cam.logical_id, request=sensorsim_pb2.RGBRenderRequest(
                    scene_id=scene_id, resolution_h=height, resolution_w=width, camera_intrinsics=cam.intrinsics,
                    frame_start_us=t0, frame_end_us=t1,
                    sensor_pose=sensorsim_pb2.PosePair(start_pose=to_proto(compose(ego_at(t0), c2r)),
                                                       end_pose=to_proto(compose(ego_at(t1), c2r))),
                    image_format=sensorsim_pb2.JPEG, image_quality=90))
            tic = time.perf_counter()
            images = sim.batch_render_rgb(batch)
            if lidar:
                lid = sim.render_lidar(sensorsim_pb2.LidarRenderRequest(
                    scene_id=scene_id, lidar_config=sensorsim_pb2.LidarSpec(lidar_type=sensorsim_pb2.PANDAR128),
                    frame_start_us=t_us - STEP_US, frame_end_us=t_us,
                    sensor_pose=sensorsim_pb2.PosePair(
                        start_pose=to_proto(compose(ego_at(t_us - STEP_US), LIDAR_MOUNT)),
                        end_pose=to_proto(compose(ego_at(t_us), LIDAR_MOUNT)))))
                summary["lidar_points"].append(lid.num_points)
            summary["render_s"] += time.perf_counter() - tic
            for item in images.items:
                if not item.success:
                    raise RuntimeError(f"{item.camera_name}: {item.error_message}")
                drv.submit_image_observation(egodriver_pb2.RolloutCameraImage(
                    session_uuid=session, camera_image=egodriver_pb2.RolloutCameraImage.CameraImage(
                        frame_start_us=t_us - CAMERA_EXPOSURE_US, frame_end_us=t_us,
                        image_bytes=item.result.image_bytes, logical_id=item.camera_name)))
                summary["images"] += 1
            drv.submit_egomotion_observation(egodriver_pb2.RolloutEgoTrajectory(
                session_uuid=session, trajectory=history, dynamic_state=common_pb2.DynamicState()))
            plan = drv.drive(egodriver_pb2.DriveRequest(session_uuid=session, time_now_us=t_us,
                                                        time_query_us=t_us)).trajectory
            t_us += STEP_US
            ego = interpolate(plan, t_us)
            history.poses.add(pose=to_proto(ego), timestamp_us=t_us)
            del history.poses[:-10]
            summary["steps"] += 1
            summary["positions"].append(ego[0].copy())
            if verbose:
                print(f"step {step:3d}  t={t_us} us  ego=({ego[0][0]:7.2f}, {ego[0][1]:6.2f})  "
                      f"images={len(images.items)}  lidar={summary['lidar_points'][-1] if lidar else '-'}")
        drv.close_session(egodriver_pb2.DriveSessionCloseRequest(session_uuid=session))
        return summary
    finally:
        sim_channel.close()
        drv_channel.close()
        driver_server.stop(1.0)
        if own_server is not None:
            own_server.shutdown(grace=1.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sensorsim", default=None, help="HOST:PORT of a sensorsim server (default: start one here)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--height", type=int, default=320)
    p.add_argument("--no-lidar", action="store_true")
    a = p.parse_args()
    s = run(a.sensorsim, steps=a.steps, width=a.width, height=a.height, lidar=not a.no_lidar, verbose=True)
    moved = np.linalg.norm(s["positions"][-1] - s["positions"][0])
    print(f"{s['steps']} steps, {s['images']} images, ego moved {moved:.2f} m, render {s['render_s']:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
