"""The sensorsim server under hostile input, load and faults: request budgets, time windows, long client strings,
broken server-side scenes, cancellation, unreadable scene files, shutdown, and who may stop the server.

Real servers on ephemeral 127.0.0.1 ports with the generated clients.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import grpc
import pytest
import yaml

import wsim
from test_grpc import ROOT, SCENE, WIDE, lidar_request, rgb_request, us
from wsim.grpc import SensorsimServer, channel_options
from wsim.grpc.budget import RequestBudget
from wsim.grpc.server import is_loopback
from wsim.grpc.service import _is_local_peer
from wsim.grpc.stubs import common_pb2 as C
from wsim.grpc.stubs import sensorsim_pb2 as S
from wsim.grpc.stubs import sensorsim_pb2_grpc as SG

SHIPPED = ROOT / "wsim" / "data" / "street_block.usdz"


@pytest.fixture(scope="module")
def scene():
    return wsim.load_scene("builtin:nurec")


@pytest.fixture(scope="module")
def server():
    srv = SensorsimServer(port=0, device="cpu", max_workers=4)
    srv.start()
    yield srv
    srv.shutdown(grace=1.0)


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address, options=channel_options()) as ch:
        yield SG.SensorsimServiceStub(ch)


@pytest.fixture(scope="module")
def spec(stub):
    cams = stub.get_available_cameras(S.AvailableCamerasRequest(scene_id=SCENE)).available_cameras
    return {c.logical_id: c.intrinsics for c in cams}[WIDE]


def _status(call, *args, **kw) -> tuple[str, str]:
    with pytest.raises(grpc.RpcError) as e:
        call(*args, **kw)
    return e.value.code().name, e.value.details()


def _copy_with_scene_id(dst: Path, scene_id: str, drop: str | None = None, corrupt: str | None = None) -> Path:
    """The shipped artifact with another scene_id (and optionally a member dropped or overwritten with junk)."""
    with zipfile.ZipFile(SHIPPED) as src, zipfile.ZipFile(dst, "w") as out:
        for name in src.namelist():
            if name == drop:
                continue
            data = src.read(name)
            if name == "metadata.yaml":
                meta = yaml.safe_load(data)
                meta["scene_id"] = scene_id
                data = yaml.safe_dump(meta).encode()
            if name == corrupt:
                data = b"ply\nformat binary_little_endian 1.0\nelement vertex 99999999\nend_header\n\0"
            out.writestr(name, data)
    return dst


# ------------------------------------------------------------------------------------------------- 1. request budget
def test_oversized_batch_is_refused_before_any_work(stub, scene, spec):
    batch = S.BatchRGBRenderRequest()
    for k in range(6):
        batch.items.add(camera_name=f"c{k}", request=rgb_request(spec, scene, h=4096, w=4096))
    t = time.perf_counter()
    code, text = _status(stub.batch_render_rgb, batch)
    assert time.perf_counter() - t < 2.0  # answered up front, not after minutes of rendering
    assert code == "RESOURCE_EXHAUSTED" and text.startswith("items:") and "--max-request-pixels" in text


def test_oversized_image_and_aggregate_are_refused(stub, scene, spec):
    code, text = _status(stub.render_rgb, rgb_request(spec, scene, h=4096, w=4096))
    assert code == "RESOURCE_EXHAUSTED" and "resolution_w" in text and "--max-image-pixels" in text
    agg = S.AggregatedRenderRequest(lidar_requests=[lidar_request(scene, S.PANDAR128) for _ in range(9)])
    code, text = _status(stub.render_aggregated, agg)
    assert code == "RESOURCE_EXHAUSTED" and text.startswith("lidar_requests") and "9 lidar sweeps" in text
    many = S.AggregatedRenderRequest(rgb_requests=[rgb_request(spec, scene, h=8, w=8) for _ in range(33)])
    code, text = _status(stub.render_aggregated, many)
    assert code == "RESOURCE_EXHAUSTED" and "33 images" in text
    assert stub.get_version(C.Empty()).version_id.startswith("wsim-")


def test_budget_is_configurable(scene, spec):
    srv = SensorsimServer(port=0, device="cpu", budget=RequestBudget(max_image_pixels=400))
    srv.start()
    try:
        with grpc.insecure_channel(srv.address) as ch:
            st = SG.SensorsimServiceStub(ch)
            assert st.render_rgb(rgb_request(spec, scene, h=20, w=20)).image_bytes
            code, text = _status(st.render_rgb, rgb_request(spec, scene, h=21, w=20))
            assert code == "RESOURCE_EXHAUSTED" and "400 pixels per image" in text
    finally:
        srv.shutdown(grace=1.0)
    with pytest.raises(ValueError, match="max_images"):
        RequestBudget(max_images=0)


# ------------------------------------------------------------------------------------------------- 3. frame times
@pytest.mark.parametrize("start_us", [2**62, 10**13 + 1_700_000_000_000_000, 0])
def test_frame_times_far_outside_the_scene_are_invalid_not_internal(stub, scene, spec, start_us):
    for make, call in ((lambda: lidar_request(scene, S.PANDAR128), stub.render_lidar),
                       (lambda: rgb_request(spec, scene), stub.render_rgb)):
        req = make()
        req.frame_start_us, req.frame_end_us = start_us, start_us + 100_000
        code, text = _status(call, req)
        assert code == "INVALID_ARGUMENT" and text.startswith("frame_start_us") and "time range" in text


def test_frames_just_outside_the_trajectory_render_with_clamped_poses(stub, scene, spec):
    lo, hi = scene.time_range
    inside = stub.render_lidar(lidar_request(scene, S.PANDAR128, t0=lo)).num_points
    for t0 in (lo - 1.0, hi + 1.0):
        assert stub.render_rgb(rgb_request(spec, scene, t0=t0)).image_bytes
        assert abs(stub.render_lidar(lidar_request(scene, S.PANDAR128, t0=t0)).num_points - inside) < 0.1 * inside


# ------------------------------------------------------------------------------------------------- 4. echoed strings
@pytest.mark.parametrize("size", [8 * 1024, 4 * 1024 * 1024])
def test_long_client_strings_are_cut_in_messages_and_the_status_survives(stub, scene, spec, size):
    r = rgb_request(spec, scene)
    r.dynamic_objects.add(track_id="x" * size, pose_pair=r.sensor_pose)
    code, text = _status(stub.render_rgb, r)
    assert code == "NOT_FOUND" and text.startswith("dynamic_objects[0].track_id") and len(text) < 2000
    assert f"({size} characters)" in text
    code, text = _status(stub.get_available_cameras, S.AvailableCamerasRequest(scene_id="y" * size))
    assert code == "NOT_FOUND" and len(text) < 2000


# ------------------------------------------------------------------------------------------------- 5, 8, 10. scenes
def test_unreadable_files_are_skipped_and_a_broken_scene_is_the_servers_fault(tmp_path, scene, spec, caplog):
    d = tmp_path / "scenes"
    d.mkdir()
    shutil.copy(SHIPPED, d / "good.usdz")
    (d / "junk.usda").write_text("#usda 1.0\n( this is not usd")
    (d / "empty.usdz").write_bytes(b"")
    _copy_with_scene_id(d / "broken.usdz", "broken-scene", corrupt="mesh.ply")
    with caplog.at_level(logging.WARNING, logger="wsim.grpc"):
        srv = SensorsimServer(d, port=0, device="cpu")
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping")]
    assert len(skipped) == 2 and any("junk.usda" in m for m in skipped)
    assert srv.store.scene_ids == ["broken-scene", SCENE]
    srv.start()
    try:
        with grpc.insecure_channel(srv.address) as ch:
            st = SG.SensorsimServiceStub(ch)
            assert st.render_rgb(rgb_request(spec, scene, h=16, w=16)).image_bytes
            broken = rgb_request(spec, scene, h=16, w=16)
            broken.scene_id = "broken-scene"
            code, text = _status(st.render_rgb, broken)
            assert code == "FAILED_PRECONDITION" and str(tmp_path) not in text
            assert st.render_rgb(rgb_request(spec, scene, h=16, w=16)).image_bytes  # still serving
    finally:
        srv.shutdown(grace=1.0)
    only_junk = tmp_path / "junk"
    only_junk.mkdir()
    (only_junk / "junk.usda").write_text("#usda 1.0\n( nope")
    with pytest.raises(wsim.SceneError, match="no readable scene"):
        SensorsimServer(only_junk, port=0, device="cpu")


def test_not_found_lists_at_most_ten_scene_ids(tmp_path):
    for k in range(12):
        _copy_with_scene_id(tmp_path / f"s{k}.usdz", f"scene-{k:02d}")
    srv = SensorsimServer(tmp_path, port=0, device="cpu")
    srv.start()
    try:
        with grpc.insecure_channel(srv.address) as ch:
            code, text = _status(SG.SensorsimServiceStub(ch).get_available_cameras,
                                 S.AvailableCamerasRequest(scene_id="nope"))
        assert code == "NOT_FOUND" and "scene-09" in text and "scene-10" not in text and "12 scenes" in text
    finally:
        srv.shutdown(grace=1.0)


# ------------------------------------------------------------------------------------------------- 7. cancellation
def test_renders_past_their_deadline_stop_and_free_the_server(scene, spec, caplog):
    srv = SensorsimServer(port=0, device="cpu", max_workers=4)
    srv.start()
    try:
        with grpc.insecure_channel(srv.address, options=channel_options()) as ch:
            st = SG.SensorsimServiceStub(ch)
            st.render_rgb(rgb_request(spec, scene, h=16, w=16))  # scene loaded, kernels ready
            big = rgb_request(spec, scene, h=2160, w=3840)  # ~3 s of CPU each: 4 of them ~6 s on 2 cores
            with caplog.at_level(logging.INFO, logger="wsim.grpc"):
                futures = [st.render_rgb.future(big, timeout=0.2) for _ in range(4)]
                for f in futures:
                    with pytest.raises(grpc.RpcError):
                        f.result()
                t = time.perf_counter()
                assert st.get_version(C.Empty()).version_id
                waited = time.perf_counter() - t
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and sum("render_rgb CANCELLED" in r.getMessage()
                                                          for r in caplog.records) < 4:
                    time.sleep(0.05)
            assert waited < 2.0
            assert sum("render_rgb CANCELLED" in r.getMessage() for r in caplog.records) == 4
    finally:
        srv.shutdown(grace=1.0)


# ------------------------------------------------------------------------------------------------- 9. shutdown
def test_second_signal_stops_at_once(scene, spec, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "wsim.cli", "serve", "--port", "0", "--device", "cpu",
                             "--no-warm-up"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "WSIM_NUM_THREADS": "1"})
    try:
        for line in proc.stdout:
            if "listening on" in line:
                address = line.split("listening on ")[1].split()[0]
                break
        ch = grpc.insecure_channel(address, options=channel_options())
        st = SG.SensorsimServiceStub(ch)
        st.render_rgb(rgb_request(spec, scene, h=16, w=16))
        agg = S.AggregatedRenderRequest(rgb_requests=[rgb_request(spec, scene, h=1080, w=1920) for _ in range(12)])
        fut = st.render_aggregated.future(agg)  # ~10 s of rendering on one thread
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        t = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert time.perf_counter() - t < 4.0
        with pytest.raises(grpc.RpcError):
            fut.result(timeout=10)
        ch.close()
    finally:
        if proc.poll() is None:
            proc.kill()


# ------------------------------------------------------------------------------------------------- 10. who may stop it
def test_only_local_clients_may_shut_down_by_default():
    assert _is_local_peer("ipv4:127.0.0.1:5555") and _is_local_peer("ipv6:[::1]:5555")
    assert _is_local_peer("ipv6:[::ffff:127.0.0.1]:5555") and _is_local_peer("unix:/tmp/s")
    assert not _is_local_peer("ipv4:10.1.2.3:5555") and not _is_local_peer("ipv6:[2001:db8::1]:5555")
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::")
