"""The sensorsim gRPC server over real loopback connections with the generated clients (wsim.grpc).

One server per module (built-in street block, NuRec form) on an ephemeral 127.0.0.1 port; small resolutions keep the
module fast on a 2-core CPU.
"""

from __future__ import annotations

import importlib.util
import io
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from PIL import Image

import wsim
from wsim.grpc import SensorsimServer, channel_options
from wsim.grpc import codegen
from wsim.grpc.stubs import common_pb2 as C
from wsim.grpc.stubs import ipc_pb2
from wsim.grpc.stubs import sensorsim_pb2 as S
from wsim.grpc.stubs import sensorsim_pb2_grpc as SG
from wsim.sensors.camera import Camera, compose_poses
from wsim.sensors.lens import lens_from_calibration, windshield_from_params
from wsim.sensors.lidar_config import CoordsType, FrameOfReference, MotionCompensation

ROOT = Path(__file__).resolve().parent.parent
SCENE = "wsim-street-block"
WIDE = "camera_front_wide_120fov"
LIDAR_MOUNT = ((1.0, 0.0, 1.9), (0.0, 0.0, 0.0, 1.0))
PROTOBUF_425 = "protobuf==4.25.9"


# ---------------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def masks_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ego_masks") / "hyperion_8_1"
    d.mkdir()
    m = np.zeros((108, 192, 4), np.uint8)
    m[80:, :, :3] = (20, 20, 20)
    m[80:, :, 3] = 255  # opaque hood over the bottom quarter
    Image.fromarray(m, "RGBA").save(d / f"{WIDE}.png")
    return d.parent


@pytest.fixture(scope="module")
def server(masks_dir):
    srv = SensorsimServer(port=0, device="cpu", ego_masks_dir=masks_dir, max_workers=4, cache_size=2)
    srv.preload()
    srv.start()
    yield srv
    srv.shutdown(grace=1.0)


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.address, options=channel_options())
    yield SG.SensorsimServiceStub(channel)
    channel.close()


@pytest.fixture(scope="module")
def scene():
    return wsim.load_scene("builtin:nurec")


# ---------------------------------------------------------------------------------------------------------- helpers
def to_pose(pose) -> C.Pose:
    t, q = (np.asarray(a, float) for a in pose)
    return C.Pose(vec=C.Vec3(x=t[0], y=t[1], z=t[2]), quat=C.Quat(w=q[3], x=q[0], y=q[1], z=q[2]))


def from_pose(p: C.Pose):
    """What the server reads from a pose (float32 on the wire, normalised quaternion)."""
    t = np.array([p.vec.x, p.vec.y, p.vec.z], np.float64)
    q = np.array([p.quat.x, p.quat.y, p.quat.z, p.quat.w], np.float64)
    return t, q / np.linalg.norm(q)


def us(scene, t: float) -> int:
    return int(scene.time_origin_us + round(t * 1e6))


def seconds(scene, t_us: int) -> float:
    return (t_us - scene.time_origin_us) * 1e-6


def camera_pair(scene, logical_id: str, t0: float, t1: float) -> S.PosePair:
    c2r = scene.cameras[logical_id].camera_to_rig
    return S.PosePair(start_pose=to_pose(compose_poses(scene.ego_trajectory.pose_at(t0), c2r)),
                      end_pose=to_pose(compose_poses(scene.ego_trajectory.pose_at(t1), c2r)))


def rgb_request(stub_or_spec, scene, *, camera=WIDE, h=40, w=64, t0=2.0, fmt=S.JPEG, **kw) -> S.RGBRenderRequest:
    spec = stub_or_spec
    return S.RGBRenderRequest(scene_id=SCENE, resolution_h=h, resolution_w=w, camera_intrinsics=spec,
                              frame_start_us=us(scene, t0), frame_end_us=us(scene, t0 + 0.03),
                              sensor_pose=camera_pair(scene, camera, t0, t0 + 0.03), image_format=fmt,
                              image_quality=90, **kw)


def lidar_request(scene, kind, t0=3.0, **kw) -> S.LidarRenderRequest:
    a = compose_poses(scene.ego_trajectory.pose_at(t0), LIDAR_MOUNT)
    b = compose_poses(scene.ego_trajectory.pose_at(t0 + 0.1), LIDAR_MOUNT)
    return S.LidarRenderRequest(scene_id=SCENE, lidar_config=S.LidarSpec(lidar_type=kind),
                                frame_start_us=us(scene, t0), frame_end_us=us(scene, t0 + 0.1),
                                sensor_pose=S.PosePair(start_pose=to_pose(a), end_pose=to_pose(b)), **kw)


@pytest.fixture(scope="module")
def specs(stub):
    cams = stub.get_available_cameras(S.AvailableCamerasRequest(scene_id=SCENE)).available_cameras
    return {c.logical_id: c.intrinsics for c in cams}


def decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def python_lidar(scene, name: str, req: S.LidarRenderRequest):
    """The same frame through the Python API: SENSOR frame, COMPENSATED to the end pose, partial outputs."""
    lid = wsim.Lidar.preset(name, scene=scene, device="cpu", output_frame_of_reference=FrameOfReference.SENSOR,
                            output_motion_compensation_state=MotionCompensation.COMPENSATED,
                            elements_coords_type=CoordsType.CARTESIAN, partial_outputs=True, instant_lidar=False)
    pc = lid.render(seconds(scene, req.frame_start_us), seconds(scene, req.frame_end_us),
                    sensor_poses=(from_pose(req.sensor_pose.start_pose), from_pose(req.sensor_pose.end_pose)),
                    compensation_reference="end")
    return pc.xyz(), pc["Intensity"].numpy()


# ---------------------------------------------------------------------------------------------------------- stubs
def test_stubs_are_generated_from_the_current_protos():
    assert codegen.stamped_digest() == codegen.sources_digest(), (
        "wsim/grpc/stubs are stale: regenerate with `python -m wsim.grpc.codegen` (grpcio-tools 1.62.x)")
    for name in ("common", "ipc", "sensorsim", "egodriver"):
        text = (codegen.STUBS / f"{name}_pb2.py").read_text()
        assert "alpasim_grpc.v0 import" not in text and "_POOL.AddSerializedFile(" in text


def test_wire_names_and_field_numbers():
    svc = S.DESCRIPTOR.services_by_name["SensorsimService"]
    assert svc.full_name == "nre.grpc.protos.sensorsim.SensorsimService"
    assert {m.name for m in svc.methods} >= {
        "render_rgb", "batch_render_rgb", "render_camera", "batch_render_camera", "render_lidar", "render_aggregated",
        "get_version", "get_available_scenes", "get_loaded_scenes", "get_available_cameras",
        "get_available_trajectories", "get_available_ego_masks", "get_server_config", "get_dynamic_objects",
        "shut_down", "create_harmonizer_session", "end_harmonizer_session", "open_ipc_session", "close_ipc_session",
        "get_external_asset_objects", "edit_assets", "restore_model_parameters"}
    num = lambda msg, f: msg.DESCRIPTOR.fields_by_name[f].number  # noqa: E731
    assert [num(C.Quat, f) for f in "wxyz"] == [1, 2, 3, 4]
    assert num(S.LidarSpec, "lidar_type") == 2 and S.LidarSpec().lidar_type == S.PANDAR128 == 0
    assert num(S.RGBRenderRequest, "harmonizer_session_id") == 20 and num(S.CameraRenderRequest, "apply_harmonizer") == 21
    assert num(S.CameraSpec, "trajectory_idx") == 6 and num(S.CameraSpec, "bivariate_windshield_model_param") == 10
    assert num(S.LidarRenderReturn, "point_intensities_buffer") == 5
    assert C.Empty.DESCRIPTOR.full_name == "common.Empty"


@pytest.fixture(scope="session")
def protobuf_425_dir(request) -> Path:
    """protobuf 4.25 (AlpaSim's pin) installed with ``pip --target`` into pytest's cache folder of this checkout
    (``.pytest_cache/d/``), one folder per exact version and interpreter; reused only when the install completed and
    its metadata names that version."""
    version = PROTOBUF_425.split("==")[1]
    root = Path(request.config.cache.mkdir(f"protobuf-{version}-{sys.implementation.cache_tag}-{sys.platform}"))
    target, done = root / "site", root / "installed"
    if not (done.exists() and (target / f"protobuf-{version}.dist-info").is_dir()):
        shutil.rmtree(target, ignore_errors=True)
        done.unlink(missing_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--no-deps", "--target", str(target), PROTOBUF_425],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            pytest.fail(f"cannot install {PROTOBUF_425} for the compatibility check: {r.stderr.strip()[-300:]}")
        done.write_text(PROTOBUF_425 + "\n")
    return target


_IMPORT_CHECK = r"""
import google.protobuf, sys
from google.protobuf import descriptor_pb2, descriptor_pool
# AlpaSim's own common.proto already in the default pool: wsim's stubs must not collide with it
fd = descriptor_pb2.FileDescriptorProto(name="alpasim_grpc/v0/common.proto", package="common", syntax="proto3")
fd.message_type.add(name="Empty")
descriptor_pool.Default().Add(fd)
from wsim.grpc.stubs import common_pb2, sensorsim_pb2, sensorsim_pb2_grpc, egodriver_pb2, egodriver_pb2_grpc
r = sensorsim_pb2.RGBRenderRequest(scene_id="s", resolution_h=320, image_format=sensorsim_pb2.JPEG,
    sensor_pose=sensorsim_pb2.PosePair(start_pose=common_pb2.Pose(quat=common_pb2.Quat(w=1.0))))
back = sensorsim_pb2.RGBRenderRequest.FromString(r.SerializeToString())
assert back.resolution_h == 320 and back.sensor_pose.start_pose.quat.w == 1.0
assert hasattr(sensorsim_pb2_grpc, "SensorsimServiceStub") and hasattr(egodriver_pb2_grpc, "EgodriverServiceStub")
print(google.protobuf.__file__)
print(google.protobuf.__version__)
"""


def test_stubs_import_with_protobuf_4_25(protobuf_425_dir):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(protobuf_425_dir), str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    origin, version = r.stdout.strip().splitlines()[-2:]
    assert version == PROTOBUF_425.split("==")[1], r.stdout  # the pinned release, not whatever is installed
    assert Path(origin).resolve().is_relative_to(protobuf_425_dir.resolve()), origin  # imported from the cache


def test_stubs_import_with_current_protobuf():
    r = subprocess.run([sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-2000:]
    import google.protobuf

    assert r.stdout.strip().splitlines()[-1] == google.protobuf.__version__


# ---------------------------------------------------------------------------------------------------------- AlpaSim start-up
def test_alpasim_startup_sequence(stub, scene, specs):
    v = stub.get_version(C.Empty())
    assert v.version_id.startswith("wsim-") and v.HasField("grpc_api_version")
    assert SCENE in stub.get_available_scenes(C.Empty()).scene_ids
    cams = stub.get_available_cameras(S.AvailableCamerasRequest(scene_id=SCENE)).available_cameras
    by_id = {c.logical_id: c for c in cams}
    assert set(by_id) == set(scene.cameras)
    for lid, c in by_id.items():
        assert c.intrinsics.logical_id == lid
    wide = by_id[WIDE]
    assert wide.intrinsics.WhichOneof("camera_param") == "ftheta_param"
    assert (wide.intrinsics.resolution_h, wide.intrinsics.resolution_w) == (1080, 1920)
    t, q = from_pose(wide.rig_to_camera)  # camera-to-rig on the wire
    assert np.allclose(t, scene.cameras[WIDE].camera_to_rig[0], atol=1e-5)
    masks = stub.get_available_ego_masks(C.Empty()).ego_mask_metadata
    assert [(m.ego_mask_id.camera_logical_id, m.ego_mask_id.rig_config_id) for m in masks] == [(WIDE, "hyperion_8_1")]
    # render_rgb at 320x512 from the native 1080x1920 intrinsics
    img = stub.render_rgb(rgb_request(wide.intrinsics, scene, h=320, w=512))
    pil = Image.open(io.BytesIO(img.image_bytes))
    assert pil.format == "JPEG" and pil.size == (512, 320)
    arr = np.asarray(pil)
    assert arr.std() > 10  # a real image, not a flat fill
    # batch: every camera answered exactly once, a failing item does not stop the others
    batch = S.BatchRGBRenderRequest()
    for lid in sorted(specs):
        batch.items.add(camera_name=lid, request=rgb_request(specs[lid], scene, camera=lid, h=32, w=48))
    bad = rgb_request(specs[WIDE], scene, h=32, w=48)
    bad.resolution_w = 0
    batch.items.add(camera_name="broken", request=bad)
    out = stub.batch_render_rgb(batch)
    assert [i.camera_name for i in out.items] == sorted(specs) + ["broken"]
    for item in out.items[:-1]:
        assert item.success and decode(item.result.image_bytes).shape == (32, 48, 3)
    assert not out.items[-1].success and "resolution_w" in out.items[-1].error_message


def test_query_rpcs(stub, scene, server):
    trajs = stub.get_available_trajectories(S.AvailableTrajectoriesRequest(scene_id=SCENE)).available_trajectories
    assert len(trajs) == 1 and len(trajs[0].trajectory.poses) == len(scene.ego_trajectory.times)
    p = trajs[0].trajectory.poses[20]
    assert p.timestamp_us == us(scene, scene.ego_trajectory.times[20])
    assert np.allclose(from_pose(p.pose)[0], scene.ego_trajectory.translations[20], atol=1e-4)
    loaded = stub.get_loaded_scenes(C.Empty())
    assert [e.scene_id for e in loaded.scenes] == [SCENE] and loaded.loaded_instance_capacity == 2
    cfg = stub.get_server_config(C.Empty())
    assert cfg.device == "cpu" and list(cfg.scene_ids) == [SCENE] and not cfg.harmonizer_enabled
    dyn = stub.get_dynamic_objects(S.AvailableDynamicObjectsRequest(scene_id=SCENE)).dynamic_objects
    names = {d.track_id: d for d in dyn}
    assert {"parked_car_0", "moving_car_eastbound"} <= set(names)
    assert names["parked_car_0"].is_static and not names["moving_car_eastbound"].is_static
    assert names["parked_car_0"].label_class == "car" and abs(names["parked_car_0"].aabb.size_x - 4.5) < 1e-5
    assert stub.get_external_asset_objects(S.ExternalAssetObjectsRequest(scene_id=SCENE)).assets == []


# ---------------------------------------------------------------------------------------------------------- cameras
def test_render_camera_products_agree_with_python_api(stub, scene, specs):
    t0 = 2.5
    req = S.CameraRenderRequest(scene_id=SCENE, resolution_h=48, resolution_w=80, camera_intrinsics=specs[WIDE],
                                frame_start_us=us(scene, t0), frame_end_us=us(scene, t0 + 0.03),
                                sensor_pose=camera_pair(scene, WIDE, t0, t0 + 0.03), image_format=S.PNG,
                                render_products=[S.CAMERA_RENDER_PRODUCT_COLOR,
                                                 S.CAMERA_RENDER_PRODUCT_DISTANCE_COLORIZED,
                                                 S.CAMERA_RENDER_PRODUCT_SEMANTICS_COLORIZED],
                                distance_colormap_vmax_m=60.0)
    out = stub.render_camera(req).camera_render_outputs
    assert [o.render_product for o in out] == list(req.render_products)
    assert all((o.image_height, o.image_width) == (48, 80) for o in out)
    assert out[1].distance_colormap_vmax_m == 60.0 and not out[0].HasField("distance_colormap_vmax_m")
    classes = {e.class_name: e for e in out[2].semantics_class_mapping}
    assert {"road", "car", "building"} <= set(classes)
    cal = scene.cameras[WIDE]
    cam = Camera(lens_from_calibration(cal), width=80, height=48, shutter=cal.shutter_type,
                 windshield=windshield_from_params(cal.params))
    frame = cam.render(scene, seconds(scene, req.frame_start_us), seconds(scene, req.frame_end_us),
                       ["COLOR", "DISTANCE", "DISTANCE_COLORIZED", "SEMANTICS_COLORIZED"],
                       from_pose(req.sensor_pose.start_pose), from_pose(req.sensor_pose.end_pose), vmax=60.0)
    np.testing.assert_array_equal(decode(out[1].image_bytes), frame.distance_colorized.numpy())
    np.testing.assert_array_equal(decode(out[0].image_bytes), frame.color.numpy())
    np.testing.assert_array_equal(decode(out[2].image_bytes), frame.semantics_colorized.numpy())
    assert (frame.distance.numpy() > 0).mean() > 0.5
    # the road class colour is where the python API sees road
    sem = decode(out[2].image_bytes)
    road = classes["road"]
    assert np.all(sem[-1, 40] == (road.color_r, road.color_g, road.color_b))


def test_render_camera_overlay_ego_mask_and_formats(stub, scene, specs):
    t0 = 2.0
    base = dict(scene_id=SCENE, resolution_h=54, resolution_w=96, camera_intrinsics=specs[WIDE],
                frame_start_us=us(scene, t0), frame_end_us=us(scene, t0 + 0.03),
                sensor_pose=camera_pair(scene, WIDE, t0, t0 + 0.03), image_format=S.PNG)
    plain = decode(stub.render_camera(S.CameraRenderRequest(**base)).camera_render_outputs[0].image_bytes)
    boxed = decode(stub.render_camera(S.CameraRenderRequest(
        **base, overlay_bounding_boxes=S.OVERLAY_BOUNDING_BOX_SOURCE_ARTIFACT,
        bbox_color=S.BboxColor(r=255, g=0, b=255))).camera_render_outputs[0].image_bytes)
    changed = np.any(boxed != plain, axis=2)
    assert changed.sum() > 20 and np.all(boxed[changed] == (255, 0, 255))
    masked = decode(stub.render_camera(S.CameraRenderRequest(
        **base, insert_ego_mask=True, ego_mask_id=S.EgoMaskId(camera_logical_id=WIDE, rig_config_id="hyperion_8_1"))
    ).camera_render_outputs[0].image_bytes)
    assert np.all(masked[-5:] == 20) and np.array_equal(masked[:30], plain[:30])
    raw = stub.render_rgb(S.RGBRenderRequest(**{**base, "image_format": S.RGB_UINT8_PLANAR})).image_bytes
    planar = np.frombuffer(raw, np.uint8).reshape(3, 54, 96)
    np.testing.assert_array_equal(planar.transpose(1, 2, 0), plain)
    # a dynamic-object override moves a parked car; the shared scene stays as it was
    keys_before = [i.translations.copy() for i in scene.instances]
    ahead = (scene.ego_trajectory.pose_at(t0)[0] + np.array([10.0, 0.0, 0.0]), np.array([0.0, 0.0, 0.0, 1.0]))
    ahead[0][2] = 0.75
    moved = S.DynamicObject(track_id="parked_car_0", pose_pair=S.PosePair(start_pose=to_pose(ahead),
                                                                          end_pose=to_pose(ahead)))
    over = decode(stub.render_camera(S.CameraRenderRequest(**base, dynamic_objects=[moved])
                                     ).camera_render_outputs[0].image_bytes)
    assert np.any(over[27] != plain[27], axis=1).sum() > 5  # the car now stands in front of the camera
    again = decode(stub.render_camera(S.CameraRenderRequest(**base)).camera_render_outputs[0].image_bytes)
    np.testing.assert_array_equal(again, plain)
    assert all(np.array_equal(a, i.translations) for a, i in zip(keys_before, scene.instances))


# ---------------------------------------------------------------------------------------------------------- lidar
@pytest.mark.parametrize("kind,name", [(S.PANDAR128, "PANDAR128"), (S.AT128, "AT128")])
def test_render_lidar_agrees_with_python_api(stub, scene, kind, name):
    req = lidar_request(scene, kind)
    out = stub.render_lidar(req)
    n = out.num_points
    assert n > 50_000
    xyz = np.asarray(out.point_xyzs, np.float32).reshape(-1, 3)
    inten = np.asarray(out.point_intensities, np.float32)
    assert xyz.shape == (n, 3) and inten.shape == (n,)
    np.testing.assert_array_equal(np.frombuffer(out.point_xyzs_buffer, "<f4").reshape(-1, 3), xyz)
    np.testing.assert_array_equal(np.frombuffer(out.point_intensities_buffer, "<f4"), inten)
    assert inten.min() >= 0.0 and inten.max() <= 1.0
    ref_xyz, ref_int = python_lidar(scene, name, req)
    assert len(ref_xyz) == n
    np.testing.assert_allclose(xyz, ref_xyz, atol=1e-5)
    np.testing.assert_allclose(inten, ref_int, atol=1e-6)
    if name == "AT128":  # forward-looking: points ahead of the sensor
        assert np.median(xyz[:, 0]) > 0


def test_render_lidar_default_spec_is_pandar128_and_overrides_apply(stub, scene):
    req = lidar_request(scene, S.PANDAR128)
    req.ClearField("lidar_config")
    a = stub.render_lidar(req)
    b = stub.render_lidar(lidar_request(scene, S.PANDAR128))
    assert a.num_points == b.num_points and a.point_xyzs_buffer == b.point_xyzs_buffer
    # a car placed 6 m ahead of the sensor (lidar frame: x forward) shows up at that range
    t_end = seconds(scene, req.frame_end_us)
    ego_t, ego_q = scene.ego_trajectory.pose_at(t_end)
    car = (ego_t + np.array([1.0 + 6.0 + 2.25, 0.0, 0.75]), ego_q)
    req.dynamic_objects.add(track_id="parked_car_3", pose_pair=S.PosePair(start_pose=to_pose(car),
                                                                          end_pose=to_pose(car)))
    c = stub.render_lidar(req)
    xyz_b = np.frombuffer(b.point_xyzs_buffer, "<f4").reshape(-1, 3)
    xyz_c = np.frombuffer(c.point_xyzs_buffer, "<f4").reshape(-1, 3)
    ahead = lambda p: np.sum((np.abs(p[:, 1]) < 0.5) & (p[:, 0] > 5.5) & (p[:, 0] < 6.5) & (p[:, 2] > -1.5))  # noqa
    assert ahead(xyz_c) > 20 * max(1, ahead(xyz_b))


def test_render_aggregated(stub, scene, specs):
    out = stub.render_aggregated(S.AggregatedRenderRequest(
        rgb_requests=[rgb_request(specs[WIDE], scene, h=24, w=40)], lidar_requests=[lidar_request(scene, S.AT128)]))
    assert len(out.rgb_returns) == 1 and decode(out.rgb_returns[0].image_bytes).shape == (24, 40, 3)
    assert len(out.lidar_returns) == 1 and out.lidar_returns[0].num_points > 0


# ---------------------------------------------------------------------------------------------------------- errors
def _rgb(specs, scene, edit=None, **fields) -> S.RGBRenderRequest:
    r = rgb_request(specs[WIDE], scene)
    for k, v in fields.items():
        setattr(r, k, v)
    if edit is not None:
        edit(r)
    return r


MALFORMED = [
    # (id, rpc, request factory(specs, scene), code, text the message must contain)
    ("zero-height", "render_rgb", lambda sp, sc: _rgb(sp, sc, resolution_h=0), "INVALID_ARGUMENT", "resolution_h"),
    ("absurd-width", "render_rgb", lambda sp, sc: _rgb(sp, sc, resolution_w=100_000), "INVALID_ARGUMENT",
     "resolution_w"),
    ("too-large", "render_rgb", lambda sp, sc: _rgb(sp, sc, resolution_w=16000, resolution_h=16000),
     "RESOURCE_EXHAUSTED", "resolution"),
    ("nan-pose", "render_rgb", lambda sp, sc: _rgb(sp, sc, edit=(
        lambda r: setattr(r.sensor_pose.start_pose.vec, "x", math.nan))), "INVALID_ARGUMENT",
     "sensor_pose.start_pose.vec"),
    ("zero-quat", "render_rgb", lambda sp, sc: _rgb(sp, sc, edit=(
        lambda r: r.sensor_pose.end_pose.quat.CopyFrom(C.Quat()))), "INVALID_ARGUMENT", "sensor_pose.end_pose.quat"),
    ("no-pose", "render_rgb", lambda sp, sc: _rgb(sp, sc, edit=(lambda r: r.ClearField("sensor_pose"))),
     "INVALID_ARGUMENT", "sensor_pose"),
    ("end-before-start", "render_rgb", lambda sp, sc: _rgb(sp, sc, edit=(
        lambda r: setattr(r, "frame_end_us", r.frame_start_us - 1))), "INVALID_ARGUMENT", "frame_end_us"),
    ("empty-poly", "render_rgb", lambda sp, sc: _rgb(sp, sc, edit=(
        lambda r: r.camera_intrinsics.ftheta_param.ClearField("pixeldist_to_angle_poly"))), "INVALID_ARGUMENT",
     "ftheta_param.pixeldist_to_angle_poly"),
    ("pinhole-coeffs", "render_rgb", lambda sp, sc: (lambda r: (r.camera_intrinsics.CopyFrom(
        sp["camera_front_tele_30fov"]), r.camera_intrinsics.opencv_pinhole_param.radial_coeffs.append(0.1), r)[-1])(
        _rgb(sp, sc)), "INVALID_ARGUMENT", "opencv_pinhole_param.radial_coeffs"),
    ("fisheye-coeffs", "render_rgb", lambda sp, sc: (lambda r: (r.camera_intrinsics.CopyFrom(
        sp["camera_rear_fisheye_200fov"]), r.camera_intrinsics.opencv_fisheye_param.radial_coeffs.pop(), r)[-1])(
        _rgb(sp, sc)), "INVALID_ARGUMENT", "opencv_fisheye_param.radial_coeffs"),
    ("jpeg2000", "render_rgb", lambda sp, sc: _rgb(sp, sc, image_format=S.JPEG2000), "INVALID_ARGUMENT",
     "JPEG2000"),
    ("unknown-track", "render_rgb", lambda sp, sc: _rgb(sp, sc, edit=(lambda r: r.dynamic_objects.add(
        track_id="no_such_car", pose_pair=r.sensor_pose))), "NOT_FOUND", "dynamic_objects[0].track_id"),
    ("unknown-scene", "render_rgb", lambda sp, sc: _rgb(sp, sc, scene_id="clipgt-missing"), "NOT_FOUND",
     "scene_id"),
    ("unknown-ego-mask", "render_rgb", lambda sp, sc: _rgb(sp, sc, insert_ego_mask=True), "INVALID_ARGUMENT",
     "ego_mask_id"),
    ("harmonizer", "render_rgb", lambda sp, sc: _rgb(sp, sc, apply_harmonizer=True), "FAILED_PRECONDITION",
     "apply_harmonizer"),
    ("duplicate-product", "render_camera", lambda sp, sc: S.CameraRenderRequest(
        scene_id=SCENE, resolution_h=8, resolution_w=8, render_products=[1, 1]), "INVALID_ARGUMENT",
     "render_products[1]"),
    ("bbox-color", "render_camera", lambda sp, sc: S.CameraRenderRequest(
        scene_id=SCENE, bbox_color=S.BboxColor(r=300)), "INVALID_ARGUMENT", "bbox_color.r"),
    ("lidar-type", "render_lidar", lambda sp, sc: (lambda r: (setattr(r.lidar_config, "lidar_type", 7), r)[-1])(
        lidar_request(sc, S.PANDAR128)), "INVALID_ARGUMENT", "lidar_config.lidar_type"),
    ("lidar-nan", "render_lidar", lambda sp, sc: (lambda r: (setattr(r.sensor_pose.end_pose.quat, "w", math.inf),
                                                             r)[-1])(lidar_request(sc, S.AT128)), "INVALID_ARGUMENT",
     "sensor_pose.end_pose.quat"),
    ("lidar-too-long", "render_lidar", lambda sp, sc: (lambda r: (setattr(r, "frame_end_us", r.frame_start_us + 100_000_000),
                                                                  r)[-1])(lidar_request(sc, S.PANDAR128)),
     "RESOURCE_EXHAUSTED", "frame_end_us"),
    ("lidar-unknown-scene", "render_lidar", lambda sp, sc: S.LidarRenderRequest(scene_id="nope"), "NOT_FOUND",
     "scene_id"),
    ("cameras-unknown-scene", "get_available_cameras", lambda sp, sc: S.AvailableCamerasRequest(scene_id="nope"),
     "NOT_FOUND", "scene_id"),
    ("harmonizer-session", "create_harmonizer_session", lambda sp, sc: C.Empty(), "FAILED_PRECONDITION",
     "harmonizer"),
    ("ipc-on-cpu", "open_ipc_session", lambda sp, sc: ipc_pb2.OpenIpcSessionRequest(), "FAILED_PRECONDITION", "CUDA"),
    ("edit-without-assets", "edit_assets", lambda sp, sc: S.EditAssetsRequest(scene_id=SCENE), "FAILED_PRECONDITION",
     "assets"),
]


@pytest.mark.parametrize("rpc,make,code,text", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_requests_get_their_status_and_the_server_keeps_serving(stub, scene, specs, rpc, make, code, text):
    with pytest.raises(grpc.RpcError) as e:
        getattr(stub, rpc)(make(specs, scene))
    assert e.value.code().name == code, e.value.details()
    assert text in e.value.details()
    assert stub.get_version(C.Empty()).version_id.startswith("wsim-")


# ---------------------------------------------------------------------------------------------------------- concurrency
def test_four_concurrent_clients_fifty_mixed_requests(server, scene, specs):
    ref_lidar = None
    first = SG.SensorsimServiceStub(grpc.insecure_channel(server.address, options=channel_options()))
    lreq = lidar_request(scene, S.AT128, t0=5.0)
    ref_lidar = first.render_lidar(lreq).point_xyzs_buffer
    creq = S.CameraRenderRequest(scene_id=SCENE, resolution_h=24, resolution_w=40, camera_intrinsics=specs[WIDE],
                                 frame_start_us=us(scene, 4.0), frame_end_us=us(scene, 4.03),
                                 sensor_pose=camera_pair(scene, WIDE, 4.0, 4.03), image_format=S.PNG,
                                 render_products=[S.CAMERA_RENDER_PRODUCT_DISTANCE_COLORIZED])
    ref_dist = first.render_camera(creq).camera_render_outputs[0].image_bytes
    errors: list[str] = []
    counts = [0] * 4

    def client(k: int) -> None:
        with grpc.insecure_channel(server.address, options=channel_options()) as ch:
            st = SG.SensorsimServiceStub(ch)
            for i in range(50):
                try:
                    kind = (i + k) % 5
                    if kind == 0:
                        t = 1.0 + 0.1 * k + 0.01 * i
                        img = decode(st.render_rgb(rgb_request(specs[WIDE], scene, h=24, w=40, t0=t)).image_bytes)
                        assert img.shape == (24, 40, 3)
                    elif kind == 1:
                        assert st.render_camera(creq).camera_render_outputs[0].image_bytes == ref_dist
                    elif kind == 2:
                        assert len(st.get_available_cameras(S.AvailableCamerasRequest(scene_id=SCENE))
                                   .available_cameras) == 3
                    elif kind == 3:
                        assert st.get_version(C.Empty()).version_id.startswith("wsim-")
                    elif i % 10 == 4:
                        assert st.render_lidar(lreq).point_xyzs_buffer == ref_lidar
                    else:
                        assert st.get_available_scenes(C.Empty()).scene_ids == [SCENE]
                    counts[k] += 1
                except Exception as e:  # noqa: BLE001 - collected and reported below
                    errors.append(f"client {k} request {i}: {e!r}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:5]
    assert counts == [50] * 4


# ---------------------------------------------------------------------------------------------------------- example, lifecycle
def test_closed_loop_example_runs_20_steps(server):
    spec = importlib.util.spec_from_file_location("closed_loop", ROOT / "examples" / "closed_loop.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    s = mod.run(server.address, steps=20, width=48, height=32, lidar=True)
    assert s["steps"] == 20 and s["images"] == 60 and len(s["lidar_points"]) == 20
    assert min(s["lidar_points"]) > 10_000
    moved = np.linalg.norm(s["positions"][-1] - s["positions"][0])
    assert 10.0 < moved < 25.0  # constant velocity ~8 m/s over 2 s


def test_shut_down_rpc_stops_a_server():
    srv = SensorsimServer(port=0, device="cpu")
    srv.start()
    with grpc.insecure_channel(srv.address) as ch:
        st = SG.SensorsimServiceStub(ch)
        st.get_version(C.Empty())
        st.shut_down(C.Empty())
    assert srv.wait(timeout=20)


def test_wsim_serve_stops_gracefully_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "wsim.cli", "serve", "--port", "0", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "listening on" in line:
                break
        address = lines[-1].split("listening on ")[1].split()[0]
        with grpc.insecure_channel(address) as ch:
            assert SG.SensorsimServiceStub(ch).get_available_scenes(C.Empty()).scene_ids == [SCENE]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        rest = proc.stdout.read()
        assert "get_available_scenes OK" in "".join(lines) + rest
    finally:
        if proc.poll() is None:
            proc.kill()


def test_lidar_return_encodings_match_for_empty_and_full_clouds():
    from wsim.grpc import convert

    empty = convert.lidar_return(np.zeros((0, 3), np.float32), np.zeros(0, np.float32))
    assert empty.num_points == 0 and not empty.point_xyzs and empty.point_xyzs_buffer == b""
    xyz = np.arange(12, dtype=np.float32).reshape(4, 3) - 5.5
    out = convert.lidar_return(xyz, np.linspace(0, 1, 4))
    assert out.num_points == 4 and list(out.point_xyzs) == xyz.reshape(-1).tolist()
    assert out.point_xyzs_buffer == xyz.astype("<f4").tobytes() and len(out.point_intensities) == 4


def test_edit_assets_inserts_and_restore_undoes(tmp_path, scene):
    from pxr import Usd, UsdGeom

    from tests.conftest import box_mesh

    stage = Usd.Stage.CreateNew(str(tmp_path / "crate.usda"))
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    mesh = UsdGeom.Mesh.Define(stage, "/crate")
    p, f = box_mesh((0, 0, 0), (2.0, 2.0, 2.0))
    mesh.CreatePointsAttr([tuple(map(float, x)) for x in p])
    mesh.CreateFaceVertexCountsAttr([3] * len(f))
    mesh.CreateFaceVertexIndicesAttr([int(i) for i in f.reshape(-1)])
    stage.GetRootLayer().Save()
    srv = SensorsimServer(port=0, device="cpu", assets_dir=tmp_path)
    srv.start()
    try:
        with grpc.insecure_channel(srv.address, options=channel_options()) as ch:
            st = SG.SensorsimServiceStub(ch)
            assets = st.get_external_asset_objects(S.ExternalAssetObjectsRequest(scene_id=SCENE)).assets
            assert [a.asset_id for a in assets] == ["crate"] and abs(assets[0].aabb.size_x - 2.0) < 1e-5
            req = lidar_request(scene, S.AT128, t0=3.0)
            first = st.render_lidar(req)
            before = first.num_points
            ego_t, ego_q = scene.ego_trajectory.pose_at(3.1)
            pose = to_pose((ego_t + np.array([3.6 + 5.0, 0.0, 1.0]), ego_q))
            edit = S.AssetEdit(asset_id="crate", new_track_id="crate_0", trajectory=C.Trajectory(
                poses=[C.PoseAtTime(pose=pose, timestamp_us=req.frame_start_us)]))
            assert list(st.edit_assets(S.EditAssetsRequest(scene_id=SCENE, edits=[edit])).track_ids) == ["crate_0"]
            near = lambda r: int(np.sum((lambda p: (p[:, 0] > 6.3) & (p[:, 0] < 6.9) & (np.abs(p[:, 1]) < 0.9)  # noqa
                                                    & (p[:, 2] > -1.8))(np.frombuffer(r.point_xyzs_buffer, "<f4")
                                                                        .reshape(-1, 3))))
            assert near(st.render_lidar(req)) > 100 + 10 * near(first)  # the crate's face 6.6 m ahead of the lidar
            st.restore_model_parameters(S.RestoreModelParametersRequest(scene_id=SCENE))
            assert st.render_lidar(req).num_points == before
    finally:
        srv.shutdown(grace=1.0)


# ---------------------------------------------------------------------------------------------------------- warm-up
def _start_serve(args: list[str], env: dict) -> tuple[subprocess.Popen, str, list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "wsim.cli", "serve", "--port", "0", "--device", "cpu", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "listening on" in line:
            return proc, line.split("listening on ")[1].split()[0], lines
    proc.kill()
    raise AssertionError("wsim serve exited before listening:\n" + "".join(lines))


@pytest.mark.slow
def test_fresh_server_answers_its_first_requests_as_fast_as_its_tenth(tmp_path, scene):
    """A fresh `wsim serve` (empty Warp kernel cache, as on a new machine) compiles and loads every kernel and builds
    the scene's BVHs before it listens: its first render_lidar and render_rgb take < 3x its tenth."""
    env = {**os.environ, "WARP_CACHE_PATH": str(tmp_path / "kernel-cache")}
    proc, address, lines = _start_serve([], env)
    try:
        warm = [x for x in lines if "warmed up in" in x]
        assert len(warm) == 1, lines
        assert sum("listening on" in x for x in lines) == 1
        with grpc.insecure_channel(address, options=channel_options()) as ch:
            st = SG.SensorsimServiceStub(ch)
            spec = {c.logical_id: c.intrinsics for c in
                    st.get_available_cameras(S.AvailableCamerasRequest(scene_id=SCENE)).available_cameras}[WIDE]
            for rpc, make in ((st.render_lidar, lambda: lidar_request(scene, S.PANDAR128)),
                              (st.render_rgb, lambda: rgb_request(spec, scene, h=320, w=512))):
                took = []
                for _ in range(10):
                    req = make()
                    t = time.perf_counter()
                    rpc(req)
                    took.append(time.perf_counter() - t)
                assert took[0] < 3.0 * took[-1], (rpc, took)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_unknown_tracks_ignore_renders_without_them_and_warns_once(scene, caplog):
    srv = SensorsimServer(port=0, device="cpu", unknown_tracks="ignore")
    srv.start()
    try:
        with grpc.insecure_channel(srv.address, options=channel_options()) as ch:
            st = SG.SensorsimServiceStub(ch)
            spec = {c.logical_id: c.intrinsics for c in
                    st.get_available_cameras(S.AvailableCamerasRequest(scene_id=SCENE)).available_cameras}[WIDE]
            plain = decode(st.render_rgb(rgb_request(spec, scene, fmt=S.PNG)).image_bytes)
            ghost = S.DynamicObject(track_id="not-in-this-scene", pose_pair=camera_pair(scene, WIDE, 2.0, 2.03))
            with caplog.at_level("WARNING", logger="wsim.grpc"):
                for _ in range(3):
                    img = decode(st.render_rgb(rgb_request(spec, scene, fmt=S.PNG, dynamic_objects=[ghost]))
                                 .image_bytes)
                    assert np.array_equal(img, plain)
            warned = [r for r in caplog.records if "not-in-this-scene" in r.getMessage()]
            assert len(warned) == 1
    finally:
        srv.shutdown(grace=1.0)
    with pytest.raises(ValueError, match="unknown_tracks"):
        SensorsimServer(port=0, device="cpu", unknown_tracks="skip")
