"""``wsim serve`` under load: concurrent mixed clients, a long soak, and the memory of one maximal-budget request.

A ``wsim serve`` subprocess on 127.0.0.1 (default options: 4 workers, default request budget, warm-up on), called
through the generated stubs; its memory is read from ``/proc/<pid>/status`` (VmRSS; the peak of one request from
VmHWM after resetting it through ``/proc/<pid>/clear_refs``, or from 10 ms polling of VmRSS where that is refused).

1. Mixed load: ``--clients`` clients (one channel each) × ``--requests`` requests each, every tenth request of a
   client in this order: render_rgb 64×40 JPEG ×3, render_rgb 512×320 JPEG, render_camera 256×160 (COLOR, DISTANCE,
   SEMANTICS; PNG), render_lidar PANDAR128 (one 0.1 s frame), and four queries (get_version, get_available_cameras,
   get_dynamic_objects, get_server_config). Reports errors, p50 / p95 latency per kind and the throughput.
2. Soak: ``--soak`` small renders (render_rgb 64×40 JPEG, times spread over the scene) from one client; server RSS
   every 25 renders; the slope [MB per render] is a least-squares fit after the first 10 % (warm-up).
3. Worst case: requests at the default budget limits (3 × 3840×2160 RGB; 12 × 1920×1080 RGB; 4 × 1920×1080 camera
   items with all three products; an aggregate of 12 × 1920×1080 RGB and 8 lidar frames), each alone; reports the
   server's RSS peak increase over its RSS before the request. (One 3840×2160 camera item with three products is
   refused before rendering: its 75 MB of pixels exceed the 64 MiB message limit.)

    python benchmarks/server_load.py [--clients 8] [--requests 50] [--soak 1000] [--out benchmarks/RESULTS_server_load.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

# The benchmarks folder holds a grpc.py: keep it off the import path so ``import grpc`` finds grpcio.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
ROOT = _HERE.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import wsim  # noqa: E402
from wsim.grpc import channel_options  # noqa: E402
from wsim.grpc.budget import RequestBudget  # noqa: E402
from wsim.grpc.stubs import common_pb2 as C  # noqa: E402
from wsim.grpc.stubs import sensorsim_pb2 as S  # noqa: E402
from wsim.grpc.stubs import sensorsim_pb2_grpc as SG  # noqa: E402
from wsim.sensors.camera import compose_poses  # noqa: E402

WIDE = "camera_front_wide_120fov"
LIDAR_MOUNT = ((1.0, 0.0, 1.9), (0.0, 0.0, 0.0, 1.0))
MB = 1024 * 1024
TIMEOUT_S = 600.0


# ------------------------------------------------------------------------------------------------------- server
class Server:
    """A ``wsim serve`` subprocess and its memory counters."""

    def __init__(self, device: str, workers: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wsim.cli", "serve", "--port", "0", "--device", device, "--max-workers",
             str(workers)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        t = time.perf_counter()
        for line in self.proc.stdout:
            if "listening on" in line:
                self.address = line.split("listening on ")[1].split()[0]
                break
        else:
            raise RuntimeError("wsim serve exited before listening")
        self.start_s = time.perf_counter() - t
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # keep the pipe drained

    def _status(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    def rss(self) -> int:
        return self._status("VmRSS")

    def reset_peak(self) -> bool:
        try:
            Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
            return True
        except OSError:
            return False

    def peak(self) -> int:
        return self._status("VmHWM")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ------------------------------------------------------------------------------------------------------- requests
def to_pose(pose) -> C.Pose:
    t, q = (np.asarray(a, float) for a in pose)
    return C.Pose(vec=C.Vec3(x=t[0], y=t[1], z=t[2]), quat=C.Quat(w=q[3], x=q[0], y=q[1], z=q[2]))


class Requests:
    def __init__(self, scene, stub) -> None:
        self.scene = scene
        self.specs = {c.logical_id: c.intrinsics for c in stub.get_available_cameras(
            S.AvailableCamerasRequest(scene_id=scene.scene_id)).available_cameras}

    def us(self, t: float) -> int:
        return int(self.scene.time_origin_us + round(t * 1e6))

    def pair(self, mount, t0: float, t1: float) -> S.PosePair:
        traj = self.scene.ego_trajectory
        return S.PosePair(start_pose=to_pose(compose_poses(traj.pose_at(t0), mount)),
                          end_pose=to_pose(compose_poses(traj.pose_at(t1), mount)))

    def rgb(self, w: int, h: int, t0: float, fmt=S.JPEG) -> S.RGBRenderRequest:
        c2r = self.scene.cameras[WIDE].camera_to_rig
        return S.RGBRenderRequest(scene_id=self.scene.scene_id, resolution_w=w, resolution_h=h,
                                  camera_intrinsics=self.specs[WIDE], frame_start_us=self.us(t0),
                                  frame_end_us=self.us(t0 + 0.03), sensor_pose=self.pair(c2r, t0, t0 + 0.03),
                                  image_format=fmt, image_quality=90)

    def camera(self, w: int, h: int, t0: float) -> S.CameraRenderRequest:
        c2r = self.scene.cameras[WIDE].camera_to_rig
        return S.CameraRenderRequest(
            scene_id=self.scene.scene_id, resolution_w=w, resolution_h=h, camera_intrinsics=self.specs[WIDE],
            frame_start_us=self.us(t0), frame_end_us=self.us(t0 + 0.03), sensor_pose=self.pair(c2r, t0, t0 + 0.03),
            image_format=S.PNG, render_products=[S.CAMERA_RENDER_PRODUCT_COLOR,
                                                 S.CAMERA_RENDER_PRODUCT_DISTANCE_COLORIZED,
                                                 S.CAMERA_RENDER_PRODUCT_SEMANTICS_COLORIZED])

    def lidar(self, t0: float, kind=S.PANDAR128) -> S.LidarRenderRequest:
        return S.LidarRenderRequest(scene_id=self.scene.scene_id, lidar_config=S.LidarSpec(lidar_type=kind),
                                    frame_start_us=self.us(t0), frame_end_us=self.us(t0 + 0.1),
                                    sensor_pose=self.pair(LIDAR_MOUNT, t0, t0 + 0.1))


#: Request kinds of the mixed load, one cycle of ten.
CYCLE = ["rgb 64x40", "rgb 64x40", "rgb 64x40", "rgb 512x320", "camera 256x160 x3", "lidar PANDAR128 0.1 s",
         "get_version", "get_available_cameras", "get_dynamic_objects", "get_server_config"]


def call(stub, reqs: Requests, kind: str, t0: float):
    sid = reqs.scene.scene_id
    if kind == "rgb 64x40":
        assert stub.render_rgb(reqs.rgb(64, 40, t0), timeout=TIMEOUT_S).image_bytes
    elif kind == "rgb 512x320":
        assert stub.render_rgb(reqs.rgb(512, 320, t0), timeout=TIMEOUT_S).image_bytes
    elif kind == "camera 256x160 x3":
        assert len(stub.render_camera(reqs.camera(256, 160, t0), timeout=TIMEOUT_S).camera_render_outputs) == 3
    elif kind == "lidar PANDAR128 0.1 s":
        assert stub.render_lidar(reqs.lidar(t0), timeout=TIMEOUT_S).num_points > 100_000
    elif kind == "get_version":
        assert stub.get_version(C.Empty(), timeout=TIMEOUT_S).version_id.startswith("wsim-")
    elif kind == "get_available_cameras":
        assert len(stub.get_available_cameras(S.AvailableCamerasRequest(scene_id=sid), timeout=TIMEOUT_S)
                   .available_cameras) == len(reqs.scene.cameras)
    elif kind == "get_dynamic_objects":
        assert stub.get_dynamic_objects(S.AvailableDynamicObjectsRequest(scene_id=sid),
                                        timeout=TIMEOUT_S).dynamic_objects
    else:
        assert stub.get_server_config(C.Empty(), timeout=TIMEOUT_S).scene_ids == [sid]


def percentile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q)) if values else float("nan")


# ------------------------------------------------------------------------------------------------------- phases
def mixed_load(address: str, reqs: Requests, clients: int, per_client: int):
    lat: dict[str, list[float]] = {k: [] for k in dict.fromkeys(CYCLE)}
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    lo, hi = reqs.scene.time_range

    def client(k: int) -> None:
        with grpc.insecure_channel(address, options=channel_options()) as ch:
            stub = SG.SensorsimServiceStub(ch)
            stub.get_version(C.Empty(), timeout=TIMEOUT_S)  # connected before the clock starts
            barrier.wait()
            for i in range(per_client):
                kind = CYCLE[(i + k) % len(CYCLE)]
                t0 = lo + 0.5 + (hi - lo - 1.5) * ((17 * k + 7 * i) % 100) / 100
                t = time.perf_counter()
                try:
                    call(stub, reqs, kind, t0)
                except Exception as e:  # noqa: BLE001 - counted and reported
                    with lock:
                        errors.append(f"client {k} request {i} ({kind}): {type(e).__name__}: {str(e)[:200]}")
                    continue
                with lock:
                    lat[kind].append(time.perf_counter() - t)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t = time.perf_counter()
    for th in threads:
        th.join()
    return lat, errors, time.perf_counter() - t


def soak(server: Server, address: str, reqs: Requests, n: int, every: int = 25):
    samples = [(0, server.rss())]
    errors = 0
    lo, hi = reqs.scene.time_range
    t = time.perf_counter()
    with grpc.insecure_channel(address, options=channel_options()) as ch:
        stub = SG.SensorsimServiceStub(ch)
        for i in range(1, n + 1):
            try:
                assert stub.render_rgb(reqs.rgb(64, 40, lo + 0.5 + (hi - lo - 1.0) * (i % 97) / 97),
                                       timeout=TIMEOUT_S).image_bytes
            except Exception:  # noqa: BLE001 - counted
                errors += 1
            if i % every == 0 or i == n:
                samples.append((i, server.rss()))
    return samples, errors, time.perf_counter() - t


def slope_mb_per_render(samples: list[tuple[int, int]], warm_up: int) -> float:
    pts = [(i, r) for i, r in samples if i >= warm_up]
    if len(pts) < 2:
        return float("nan")
    x, y = np.array(pts, float).T
    return float(np.polyfit(x, y / MB, 1)[0])


def worst_case(device: str, workers: int, reqs: Requests):
    """RSS peak increase of requests at the default budget limits, each sent alone to a fresh (warmed-up) server."""
    b = RequestBudget()
    t0 = 4.0
    uhd = (3840, 2160)
    fhd = (1920, 1080)
    n_uhd = b.max_request_pixels // (uhd[0] * uhd[1])  # 3
    n_fhd = b.max_request_pixels // (fhd[0] * fhd[1])  # 12
    cases = [
        (f"batch_render_rgb {n_uhd} × 3840×2160 PNG", "batch_render_rgb", S.BatchRGBRenderRequest(items=[
            S.BatchRGBRenderRequest.Item(camera_name=f"c{k}", request=reqs.rgb(*uhd, t0, S.PNG)) for k in range(n_uhd)])),
        (f"batch_render_rgb {n_fhd} × 1920×1080 PNG", "batch_render_rgb", S.BatchRGBRenderRequest(items=[
            S.BatchRGBRenderRequest.Item(camera_name=f"c{k}", request=reqs.rgb(*fhd, t0, S.PNG)) for k in range(n_fhd)])),
        (f"batch_render_camera {n_fhd // 3} × 1920×1080 × 3 products PNG", "batch_render_camera",
         S.BatchCameraRenderRequest(items=[S.BatchCameraRenderRequestItem(camera_name=f"c{k}", request=reqs.camera(
             *fhd, t0)) for k in range(n_fhd // 3)])),
        (f"render_aggregated {n_fhd} × 1920×1080 JPEG + {b.max_lidar_sweeps} PANDAR128 frames", "render_aggregated",
         S.AggregatedRenderRequest(rgb_requests=[reqs.rgb(*fhd, t0) for _ in range(n_fhd)],
                                   lidar_requests=[reqs.lidar(t0 + 0.1 * k) for k in range(b.max_lidar_sweeps)])),
    ]
    rows = []
    for label, rpc, req in cases:
        server = Server(device, workers)
        try:
            with grpc.insecure_channel(server.address, options=channel_options()) as ch:
                rows.append(_one_request(server, SG.SensorsimServiceStub(ch), label, rpc, req))
        finally:
            server.stop()
    return rows, rows[0][-1] if rows else ""


def _one_request(server: Server, stub, label: str, rpc: str, req):
    """Send one request; returns (label, status, seconds, answer bytes, RSS before, peak, RSS after, method)."""
    before = server.rss()
    use_hwm = server.reset_peak()
    polled = [before]
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.01):
            polled.append(server.rss())

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t = time.perf_counter()
    status = "OK"
    try:
        out = getattr(stub, rpc)(req, timeout=TIMEOUT_S)
        failed = [i.error_message for i in getattr(out, "items", []) if not i.success]
        if failed:
            status = f"item failed: {failed[0][:80]}"
        size = out.ByteSize()
    except grpc.RpcError as e:
        status, size = f"{e.code().name}: {e.details()[:80]}", 0
    dt = time.perf_counter() - t
    done.set()
    poller.join()
    peak = max(server.peak() if use_hwm else 0, max(polled), server.rss())
    print(f"  {label}: {status}, {dt:.1f} s, answer {size / MB:.1f} MB, RSS {before / MB:.0f} -> peak "
          f"{peak / MB:.0f} MB (+{(peak - before) / MB:.0f}), after {server.rss() / MB:.0f} MB", flush=True)
    return (label, status, dt, size, before, peak, server.rss(),
            "VmHWM after clear_refs" if use_hwm else "10 ms polling of VmRSS")


# ------------------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=50, help="requests per client in the mixed load")
    ap.add_argument("--soak", type=int, default=1000, help="small renders in the soak")
    ap.add_argument("--workers", type=int, default=4, help="wsim serve --max-workers")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-worst-case", action="store_true", help="skip the maximal-budget requests")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS_server_load.md"))
    ap.add_argument("--note", default="", help="a sentence about the machine for the results file")
    a = ap.parse_args()

    load_start = os.getloadavg()[0]
    t_all = time.perf_counter()
    scene = wsim.load_scene("builtin:nurec")
    server = Server(a.device, a.workers)
    try:
        print(f"wsim serve on {server.address} (pid {server.proc.pid}) listening after {server.start_s:.1f} s; "
              f"RSS {server.rss() / MB:.0f} MB", flush=True)
        with grpc.insecure_channel(server.address, options=channel_options()) as ch:
            reqs = Requests(scene, SG.SensorsimServiceStub(ch))
        rss_idle = server.rss()

        print(f"mixed load: {a.clients} clients × {a.requests} requests", flush=True)
        lat, errors, wall = mixed_load(server.address, reqs, a.clients, a.requests)
        total = a.clients * a.requests
        print(f"  {total} requests in {wall:.1f} s ({total / wall:.1f} req/s), {len(errors)} errors", flush=True)
        for e in errors[:5]:
            print("   ", e)
        rows = []
        for kind, v in lat.items():
            rows.append((kind, len(v), percentile_ms(v, 50), percentile_ms(v, 95), percentile_ms(v, 100)))
            print(f"  {kind:24s} n={len(v):4d} p50 {rows[-1][2]:8.1f} ms  p95 {rows[-1][3]:8.1f} ms", flush=True)
        rss_after_mixed = server.rss()

        print(f"soak: {a.soak} render_rgb 64×40", flush=True)
        samples, soak_errors, soak_wall = soak(server, server.address, reqs, a.soak)
        warm = max(a.soak // 10, 1)
        slope = slope_mb_per_render(samples, warm)
        base = min((i for i, _ in samples if i >= warm), default=0)
        rise = max(r for i, r in samples if i >= warm) - dict(samples)[base]
        marks = sorted({0, a.soak // 4, a.soak // 2, a.soak})
        at = {i: r for i, r in samples}
        nearest = lambda i: at[min(at, key=lambda j: abs(j - i))]  # noqa: E731
        print(f"  {a.soak} renders in {soak_wall:.1f} s ({a.soak / soak_wall:.1f}/s), {soak_errors} errors; RSS "
              + ", ".join(f"{m}: {nearest(m) / MB:.1f} MB" for m in marks)
              + f"; slope after {warm} renders {slope:+.4f} MB/render, largest rise {rise / MB:+.1f} MB", flush=True)

        worst, peak_method = ([], "")
        if not a.no_worst_case:
            print("maximal-budget requests (default budget), each on a fresh server", flush=True)
    finally:
        server.stop()
    if not a.no_worst_case:
        worst, peak_method = worst_case(a.device, a.workers, reqs)
    load_end = os.getloadavg()[0]
    minutes = (time.perf_counter() - t_all) / 60

    cpu = platform.processor() or platform.machine()
    lines = [
        "# wsim sensorsim server under load",
        "",
        f"`python benchmarks/server_load.py --clients {a.clients} --requests {a.requests} --soak {a.soak}` — {cpu}, "
        f"{os.cpu_count()} cores, device `{a.device}`, `wsim serve` subprocess on 127.0.0.1 with {a.workers} workers and "
        f"the default request budget, built-in street block (NuRec form). 1-min load average {load_start:.1f} at the "
        f"start and {load_end:.1f} at the end; the whole run took {minutes:.1f} min.",
        *([f"", a.note] if a.note else []),
        "",
        f"## Mixed load: {a.clients} clients × {a.requests} requests",
        "",
        f"{total} requests in {wall:.1f} s: **{total / wall:.1f} requests/s**, **{len(errors)} errors**. Each client "
        "cycles through 3 × render_rgb 64×40 JPEG, 1 × render_rgb 512×320 JPEG, 1 × render_camera 256×160 "
        "(COLOR + DISTANCE + SEMANTICS, PNG), 1 × render_lidar PANDAR128 (one 0.1 s frame) and 4 queries, offset by "
        "its index; times spread over the scene. Latency is the client's, queueing included: with more clients than "
        "workers a query waits for a worker that is rendering, hence the queries' p95.",
        "",
        "| request kind | n | p50 [ms] | p95 [ms] | max [ms] |",
        "|---|---:|---:|---:|---:|",
        *[f"| {k} | {n} | {p50:.1f} | {p95:.1f} | {mx:.1f} |" for k, n, p50, p95, mx in rows],
        "",
        f"## Soak: {a.soak} render_rgb 64×40 JPEG, one client",
        "",
        f"{a.soak / soak_wall:.1f} renders/s, {soak_errors} errors. Server RSS: idle after warm-up "
        f"{rss_idle / MB:.1f} MB, after the mixed load {rss_after_mixed / MB:.1f} MB.",
        "",
        "| soak renders | " + " | ".join(str(m) for m in marks) + " |",
        "|---|" + "---:|" * len(marks),
        "| server RSS [MB] | " + " | ".join(f"{nearest(m) / MB:.1f}" for m in marks) + " |",
        "",
        "Every 100 renders [MB]: " + ", ".join(f"{r / MB:.1f}" for i, r in samples if i % 100 == 0) + ".",
        "",
        f"Slope after the first {warm} renders (least squares over {len([s for s in samples if s[0] >= warm])} "
        f"samples, one per 25 renders): **{slope:+.4f} MB per render** (target < 0.05). Largest rise over the RSS at "
        f"render {base}: {rise / MB:+.1f} MB ({rise / MB / max(a.soak - base, 1):+.4f} MB per render); a drop is "
        "the allocator returning memory freed after the mixed load.",
        "",
    ]
    if worst:
        worst_peak = max(r[5] - r[4] for r in worst)
        lines += [
            "## Worst-case memory of one request at the default budget",
            "",
            f"Each request alone on a fresh `wsim serve` (warmed up, idle); peak from {peak_method}. Default budget: "
            f"{RequestBudget().max_image_pixels:,} pixels per image, {RequestBudget().max_request_pixels:,} per "
            f"request, {RequestBudget().max_images} images, {RequestBudget().max_lidar_sweeps} lidar sweeps.",
            "",
            "| request | status | time [s] | answer [MB] | RSS before [MB] | peak [MB] | peak increase [MB] "
            "| RSS after [MB] |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
            *[f"| {lbl} | {st} | {dt:.1f} | {size / MB:.1f} | {b / MB:.0f} | {p / MB:.0f} | {(p - b) / MB:.0f} "
              f"| {after / MB:.0f} |" for lbl, st, dt, size, b, p, after, _ in worst],
            "",
            f"Worst case: **+{worst_peak / MB:.0f} MB** over the server's RSS before the request.",
            "",
        ]
    Path(a.out).write_text("\n".join(lines))
    print(f"wrote {a.out} ({minutes:.1f} min)")
    return 1 if errors or soak_errors else 0


if __name__ == "__main__":
    sys.exit(main())
