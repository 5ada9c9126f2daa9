"""gRPC overhead and throughput of ``wsim serve``.

Latency: render_rgb (512×320 JPEG, f-theta camera_front_wide_120fov) and render_lidar (PANDAR128, AT128; one 0.1 s
spin) over loopback against a ``wsim serve`` subprocess, vs the same render in-process through the Python API
(Camera.render + JPEG encode; Lidar.render + float32 buffers). Overhead ratio = loopback median / in-process median.
Throughput: requests/s with 1, 2 and 4 concurrent clients (one channel each).

    python benchmarks/grpc.py [--repeat 15] [--out benchmarks/RESULTS_grpc.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

# This file is named like the grpc package: keep its folder off the import path so ``import grpc`` finds grpcio.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
ROOT = _HERE.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import wsim  # noqa: E402
from wsim.grpc import channel_options  # noqa: E402
from wsim.grpc.stubs import common_pb2 as C  # noqa: E402
from wsim.grpc.stubs import sensorsim_pb2 as S  # noqa: E402
from wsim.grpc.stubs import sensorsim_pb2_grpc as SG  # noqa: E402
from wsim.sensors.camera import Camera, compose_poses, encode_jpeg  # noqa: E402
from wsim.sensors.lens import lens_from_calibration  # noqa: E402
from wsim.sensors.lidar_config import CoordsType, FrameOfReference, MotionCompensation  # noqa: E402

WIDE = "camera_front_wide_120fov"
MOUNT = ((1.0, 0.0, 1.9), (0.0, 0.0, 0.0, 1.0))


def to_pose(pose):
    t, q = (np.asarray(a, float) for a in pose)
    return C.Pose(vec=C.Vec3(x=t[0], y=t[1], z=t[2]), quat=C.Quat(w=q[3], x=q[0], y=q[1], z=q[2]))


def back(p):
    t = np.array([p.vec.x, p.vec.y, p.vec.z])
    q = np.array([p.quat.x, p.quat.y, p.quat.z, p.quat.w])
    return t, q / np.linalg.norm(q)


def start_server(device: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "wsim.cli", "serve", "--port", "0", "--device", device,
                             "--max-workers", "4"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=ROOT)
    for line in proc.stdout:
        if "listening on" in line:
            return proc, line.split("listening on ")[1].split()[0]
    raise RuntimeError("server did not start")


def medians_s(remote, local, repeat: int) -> tuple[float, float]:
    """Median times of ``remote`` and ``local``, run alternately so that load changes affect both alike."""
    remote(), local()  # warm-up (kernel load, caches)
    tr, tl = [], []
    for _ in range(repeat):
        for fn, out in ((remote, tr), (local, tl)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return statistics.median(tr), statistics.median(tl)


def throughput(address: str, make_call, clients: int, per_client: int) -> float:
    stubs = [SG.SensorsimServiceStub(grpc.insecure_channel(address, options=channel_options()))
             for _ in range(clients)]
    for s in stubs:
        make_call(s)()
    barrier = threading.Barrier(clients + 1)

    def work(s):
        call = make_call(s)
        barrier.wait()
        for _ in range(per_client):
            call()

    threads = [threading.Thread(target=work, args=(s,)) for s in stubs]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return clients * per_client / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--per-client", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS_grpc.md"))
    a = ap.parse_args()

    scene = wsim.load_scene("builtin:nurec")
    proc, address = start_server(a.device)
    try:
        stub = SG.SensorsimServiceStub(grpc.insecure_channel(address, options=channel_options()))
        spec = {c.logical_id: c.intrinsics for c in stub.get_available_cameras(
            S.AvailableCamerasRequest(scene_id=scene.scene_id)).available_cameras}[WIDE]
        t0, t1 = 3.0, 3.03
        us = lambda t: int(scene.time_origin_us + round(t * 1e6))  # noqa: E731
        c2r = scene.cameras[WIDE].camera_to_rig
        rgb = S.RGBRenderRequest(
            scene_id=scene.scene_id, resolution_h=320, resolution_w=512, camera_intrinsics=spec,
            frame_start_us=us(t0), frame_end_us=us(t1), image_format=S.JPEG, image_quality=90,
            sensor_pose=S.PosePair(start_pose=to_pose(compose_poses(scene.ego_trajectory.pose_at(t0), c2r)),
                                   end_pose=to_pose(compose_poses(scene.ego_trajectory.pose_at(t1), c2r))))
        cal = scene.cameras[WIDE]
        cam = Camera(lens_from_calibration(cal), width=512, height=320, shutter=cal.shutter_type, device=a.device)
        sp, ep = back(rgb.sensor_pose.start_pose), back(rgb.sensor_pose.end_pose)
        ts, te = (rgb.frame_start_us - scene.time_origin_us) * 1e-6, (rgb.frame_end_us - scene.time_origin_us) * 1e-6

        def rgb_local():
            encode_jpeg(cam.render(scene, ts, te, ["COLOR"], sp, ep).color.numpy(), 90)

        lidar_reqs, lidar_local = {}, {}
        for kind, name in ((S.PANDAR128, "PANDAR128"), (S.AT128, "AT128")):
            a0 = compose_poses(scene.ego_trajectory.pose_at(t0), MOUNT)
            a1 = compose_poses(scene.ego_trajectory.pose_at(t0 + 0.1), MOUNT)
            req = S.LidarRenderRequest(scene_id=scene.scene_id, lidar_config=S.LidarSpec(lidar_type=kind),
                                       frame_start_us=us(t0), frame_end_us=us(t0 + 0.1),
                                       sensor_pose=S.PosePair(start_pose=to_pose(a0), end_pose=to_pose(a1)))
            lidar_reqs[name] = req
            poses = (back(req.sensor_pose.start_pose), back(req.sensor_pose.end_pose))

            def local(name=name, poses=poses):
                lid = wsim.Lidar.preset(name, scene=scene, device=a.device,
                                        output_frame_of_reference=FrameOfReference.SENSOR,
                                        output_motion_compensation_state=MotionCompensation.COMPENSATED,
                                        elements_coords_type=CoordsType.CARTESIAN, partial_outputs=True)
                pc = lid.render(t0, t0 + 0.1, sensor_poses=poses, compensation_reference="end",
                                channels=["Coordinates", "Intensity"])
                pc.xyz().astype("<f4").tobytes()
                pc["Intensity"].numpy().astype("<f4").tobytes()

            lidar_local[name] = local

        rows = []
        lat = [("render_rgb 512×320 JPEG", lambda: stub.render_rgb(rgb), rgb_local)]
        for name in ("PANDAR128", "AT128"):
            lat.append((f"render_lidar {name}", lambda n=name: stub.render_lidar(lidar_reqs[n]), lidar_local[name]))
        for label, remote, local in lat:
            r, loc = medians_s(remote, local, a.repeat)
            rows.append((label, loc * 1e3, r * 1e3, r / loc))
            print(f"{label:28s} in-process {loc * 1e3:7.1f} ms  loopback {r * 1e3:7.1f} ms  ratio {r / loc:.2f}")
        thr = []
        for label, make in (("render_rgb 512×320 JPEG", lambda s: (lambda: s.render_rgb(rgb))),
                            ("render_lidar PANDAR128", lambda s: (lambda: s.render_lidar(lidar_reqs["PANDAR128"])))):
            vals = [throughput(address, make, n, a.per_client) for n in (1, 2, 4)]
            thr.append((label, vals))
            print(f"{label:28s} req/s with 1/2/4 clients: " + " / ".join(f"{v:.1f}" for v in vals))
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    lines = [
        "# wsim sensorsim server: gRPC overhead and throughput",
        "",
        f"`python benchmarks/grpc.py` — {platform.processor() or platform.machine()}, {os.cpu_count()} cores, device "
        f"`{a.device}` (1-min load average {os.getloadavg()[0]:.1f} at the end: other work on the machine makes "
        "ratios below 1 possible), built-in street block (NuRec form), median of {a.repeat} runs after one warm-up, loopback and in-process runs alternating. Loopback = "
        "a `wsim serve` subprocess on 127.0.0.1 called through the generated stubs; in-process = the same render "
        "through the Python API (Camera.render + JPEG encode; Lidar.render + little-endian float32 buffers).",
        "",
        "## Latency",
        "",
        "| request | in-process [ms] | over loopback [ms] | overhead ratio (target ≤ 1.15) |",
        "|---|---:|---:|---:|",
        *[f"| {lbl} | {loc:.1f} | {rem:.1f} | {ratio:.2f} |" for lbl, loc, rem, ratio in rows],
        "",
        "## Throughput (requests/s, one channel per client)",
        "",
        "| request | 1 client | 2 clients | 4 clients |",
        "|---|---:|---:|---:|",
        *[f"| {lbl} | {v[0]:.1f} | {v[1]:.1f} | {v[2]:.1f} |" for lbl, v in thr],
        "",
        "On the CPU every render already shards its rays over all cores (wsim.launch), so more clients add queueing, "
        "not speed; on CUDA, requests render concurrently on the device. render_lidar answers carry every point "
        "twice (repeated float fields and the float32 byte buffers), about 32 bytes per point.",
        "",
    ]
    Path(a.out).write_text("\n".join(lines))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
