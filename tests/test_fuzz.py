"""Fuzzing with hypothesis: the sensorsim server over every RPC, and the scene loaders over crafted files.

Server: a real server on an ephemeral 127.0.0.1 port, driven through the generated clients. Requests are valid ones
mutated field by field (NaN / inf floats, extreme integers of each field's range, empty and 1 MB strings, unknown enum
values, cleared sub-messages, repeated fields emptied or multiplied) and raw bytes sent through a generic unary call
(identity serializers) to every method path. Every answer must be OK or a status the server documents
(:mod:`wsim.grpc.errors`: INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED; PERMISSION_DENIED is
shut_down's only, which is not fuzzed, and CANCELLED needs a client that goes away, which these do not) with a status
message under 2,000 characters; INTERNAL, UNKNOWN or a deadline are failures. Afterwards the server still renders a
reference RGB frame and lidar frame bit-identically to before.

Loaders: ``wsim.load_scene`` on mutations of the shipped NuRec artifact, on small USD stages written with pxr with
hostile attribute values, on random bytes under scene-file suffixes and on folders named like scene files. Each must
load or raise ``wsim.SceneError`` naming the file; any other exception is a failure.

Reproducible: ``derandomize=True`` (the examples depend only on the test code and hypothesis' version), no example
database, no shrinking (a failing example is reported as drawn, with the mutations listed by ``note``).
"""

from __future__ import annotations

import io
import itertools
import json
import math
import resource
import time
import zipfile
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from google.protobuf.descriptor import FieldDescriptor as FD
from hypothesis import HealthCheck, Phase, assume, event, given, note, settings
from hypothesis import strategies as st
from PIL import Image

import wsim
from test_grpc import ROOT, SCENE, WIDE, camera_pair, lidar_request, rgb_request, to_pose, us
from wsim.grpc import SensorsimServer, channel_options
from wsim.grpc.budget import RequestBudget
from wsim.grpc.stubs import common_pb2 as C
from wsim.grpc.stubs import ipc_pb2
from wsim.grpc.stubs import sensorsim_pb2 as S
from wsim.grpc.stubs import sensorsim_pb2_grpc as SG

pytestmark = pytest.mark.slow  # about 30 s of fuzzing: ./dev.sh test --fast skips it

SERVICE = S.DESCRIPTOR.services_by_name["SensorsimService"]
SHIPPED = ROOT / "wsim" / "data" / "street_block.usdz"

#: Statuses the server documents for requests it refuses (wsim/grpc/errors.py), besides OK.
DOCUMENTED = {"INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"}
#: Longest status message the server sends (wsim.grpc.errors.MAX_MESSAGE_CHARS).
MAX_DETAILS = 2000
#: Client deadline per call [s]: a render of the fuzz budget takes well under a second; more is a hang.
CALL_TIMEOUT_S = 60.0
#: The fuzz server's request budget: small, so that a mutated size costs milliseconds, not seconds, of CPU.
BUDGET = RequestBudget(max_image_pixels=96 * 64, max_request_pixels=4 * 96 * 64, max_images=6, max_lidar_sweeps=1)
#: Largest mutated request sent [bytes] (repeated fields multiplied past this are left as they are).
MAX_REQUEST_BYTES = 4 * 1024 * 1024
LIDAR_FRAME_US = 10_000  # 10 ms lidar frames: 1/10 of a sweep

_COMMON = dict(deadline=None, derandomize=True, database=None, phases=(Phase.explicit, Phase.generate),
               print_blob=False, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                        HealthCheck.data_too_large])


def fuzz(n: int):
    """hypothesis settings of this module with ``n`` examples."""
    return settings(max_examples=n, **_COMMON)


class Quiet(dict):
    """A fixture value that hypothesis prints by name in a failing example (not as megabytes of messages)."""

    def __repr__(self) -> str:
        return f"<{', '.join(self)}>"


def short(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


# ===================================================================================================== value strategies
SPECIAL_FLOATS = [math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 1e-45, 5e-324, 3.4e38, 1e39,
                  1.7e308, -1.7e308, 1e-300, 2.0**53 + 1]
INT_RANGES = {FD.CPPTYPE_INT32: (-2**31, 2**31 - 1), FD.CPPTYPE_INT64: (-2**63, 2**63 - 1),
              FD.CPPTYPE_UINT32: (0, 2**32 - 1), FD.CPPTYPE_UINT64: (0, 2**64 - 1)}
STRINGS = st.one_of(
    st.sampled_from(["", SCENE, WIDE, "camera_front_tele_30fov", "camera_rear_fisheye_200fov", "parked_car_0",
                     "moving_car_eastbound", "crate", "fuzz_crate", "builtin", "builtin:usd", "../../../etc/passwd",
                     "/dev/zero", "\x00", "%s%n{0}", "x" * 8 * 1024, "y" * 1_000_000, "é✓\u202e" * 300]),
    st.text(max_size=24))


def floats_near(current: float) -> st.SearchStrategy:
    return st.one_of(st.sampled_from(SPECIAL_FLOATS), st.floats(),
                     st.floats(-10, 10).map(lambda d: current + d if math.isfinite(current) else d))


def ints_in(lo: int, hi: int, current: int = 0) -> st.SearchStrategy:
    bounds = sorted({lo, hi, 0, 1, hi // 2, lo // 2, min(max(-1, lo), hi)})
    return st.one_of(st.sampled_from(bounds), st.integers(lo, hi), st.integers(max(lo, -100), min(hi, 100)),
                     st.integers(-10**7, 10**7).map(lambda d: min(max(current + d, lo), hi)))


def scalar_values(f, current) -> st.SearchStrategy:
    t = f.cpp_type
    if t in (FD.CPPTYPE_DOUBLE, FD.CPPTYPE_FLOAT):
        return floats_near(float(current or 0.0))
    if t == FD.CPPTYPE_BOOL:
        return st.booleans()
    if t == FD.CPPTYPE_ENUM:  # proto3 enums are open: unknown numbers go on the wire as they are
        return st.one_of(st.sampled_from([v.number for v in f.enum_type.values]), st.integers(-3, 12),
                         st.integers(-2**31, 2**31 - 1))
    if t in INT_RANGES:
        return ints_in(*INT_RANGES[t], int(current or 0))
    if f.type == FD.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"\xff" * 1_000_000))
    return STRINGS


# ===================================================================================================== request mutation
def _repeated(f) -> bool:
    is_rep = getattr(f, "is_repeated", None)  # protobuf >= 6 (``label`` is deprecated there)
    return bool(is_rep) if is_rep is not None else f.label == FD.LABEL_REPEATED


def mutate(draw, msg, log: list[str], path: str = "") -> None:
    """Apply one random mutation somewhere inside ``msg`` (in place); append what was done to ``log``."""
    fields = msg.DESCRIPTOR.fields
    if not fields:
        return
    f = draw(st.sampled_from(list(fields)))
    name = path + f.name
    value = getattr(msg, f.name)
    if _repeated(f):
        op = draw(st.sampled_from(["clear", "append", "multiply", "into"] if f.message_type else
                                  ["clear", "append", "multiply"]))
        if op == "clear":
            msg.ClearField(f.name)
            log.append(f"{name}: cleared")
        elif op == "append":
            if f.message_type:
                value.add()
                log.append(f"{name}: appended an empty element")
            else:
                vals = draw(st.lists(scalar_values(f, 0), min_size=1, max_size=6))
                try:
                    value.extend(vals)
                    log.append(f"{name}: appended {short(vals)}")
                except (TypeError, ValueError, OverflowError) as e:
                    log.append(f"{name}: append {short(vals)} refused by protobuf ({type(e).__name__})")
        elif op == "multiply":
            k = draw(st.sampled_from([2, 7, 40, 1000]))
            if len(value) and msg.ByteSize() * k <= MAX_REQUEST_BYTES:
                items = list(value)
                for _ in range(k - 1):
                    if f.message_type:
                        for it in items:
                            value.add().CopyFrom(it)
                    else:
                        value.extend(items)
                log.append(f"{name}: elements repeated x{k} ({len(value)})")
        elif len(value):
            i = draw(st.integers(0, len(value) - 1))
            mutate(draw, value[i], log, f"{name}[{i}].")
        else:
            mutate(draw, value.add(), log, f"{name}[0].")
    elif f.message_type is not None:
        op = draw(st.sampled_from(["clear", "empty", "into", "into", "into"]))
        if op == "clear":
            msg.ClearField(f.name)
            log.append(f"{name}: cleared (missing sub-message)")
        elif op == "empty":
            msg.ClearField(f.name)
            getattr(msg, f.name).SetInParent()
            log.append(f"{name}: empty sub-message")
        else:
            mutate(draw, value, log, name + ".")
    else:
        v = draw(scalar_values(f, value))
        try:
            setattr(msg, f.name, v)
            log.append(f"{name} = {short(v)}")
        except (TypeError, ValueError, OverflowError) as e:
            log.append(f"{name} = {short(v)} refused by protobuf ({type(e).__name__})")


def encode_varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


@st.composite
def wire_records(draw, well_formed: bool = False, depth: int = 0) -> bytes:
    """A sequence of protobuf wire records with random field numbers (known and unknown), wire types and payloads;
    ``well_formed``: only the four wire types of proto3, lengths that match and UTF-8 or nested-record payloads (such
    bytes mostly parse as any message)."""
    out = b""
    for _ in range(draw(st.integers(1, 8))):
        field = draw(st.one_of(st.integers(1, 32), st.sampled_from([1000, 2**29 - 1])))
        wt = draw(st.sampled_from([0, 1, 2, 5]) if well_formed else st.integers(0, 7))
        out += encode_varint((field << 3) | wt)
        if wt == 0:
            out += encode_varint(draw(st.integers(0, 2**64 - 1)))
        elif wt == 1:
            out += draw(st.binary(min_size=8, max_size=8))
        elif wt == 2:
            if well_formed:
                payload = draw(st.one_of(st.text(max_size=24).map(str.encode),
                                         wire_records(True, depth + 1) if depth < 2 else st.just(b"")))
                out += encode_varint(len(payload)) + payload
            else:
                payload = draw(st.binary(max_size=48))
                out += encode_varint(draw(st.sampled_from([len(payload)] * 4 + [len(payload) + 5, 2**32]))) + payload
        elif wt == 5:
            out += draw(st.binary(min_size=4, max_size=4))
        else:  # groups (3, 4) and the invalid wire types 6, 7
            out += draw(st.binary(max_size=8))
    return out


def raw_bytes(valid: bytes) -> st.SearchStrategy:
    """Bytes for a method whose valid request serializes to ``valid``: random, wire records, and the valid request
    with bytes flipped, cut short or followed by junk."""

    @st.composite
    def flipped(draw):
        if not valid:
            return draw(st.binary(min_size=1, max_size=16))
        b = bytearray(valid)
        for _ in range(draw(st.integers(1, 6))):
            b[draw(st.integers(0, len(b) - 1))] ^= draw(st.integers(1, 255))
        return bytes(b)

    return st.one_of(st.binary(max_size=512), wire_records(), wire_records(True), flipped(),
                     wire_records(True).map(lambda extra: valid + extra),
                     st.integers(0, max(len(valid) - 1, 0)).map(lambda n: valid[:n]),
                     st.binary(min_size=1, max_size=32).map(lambda junk: valid + junk))


# ===================================================================================================== server fixtures
def make_server_dirs(root: Path) -> dict[str, Path]:
    """An assets folder with one 2 m crate stage and an ego-mask folder with a mask for the wide camera."""
    from pxr import Usd, UsdGeom

    from conftest import box_mesh

    assets, masks = root / "assets", root / "masks" / "rig"
    assets.mkdir()
    masks.mkdir(parents=True)
    stage = Usd.Stage.CreateNew(str(assets / "crate.usda"))
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    mesh = UsdGeom.Mesh.Define(stage, "/crate")
    p, f = box_mesh((0, 0, 0), (2.0, 2.0, 2.0))
    mesh.CreatePointsAttr([tuple(map(float, x)) for x in p])
    mesh.CreateFaceVertexCountsAttr([3] * len(f))
    mesh.CreateFaceVertexIndicesAttr([int(i) for i in f.reshape(-1)])
    stage.GetRootLayer().Save()
    m = np.zeros((48, 64, 4), np.uint8)
    m[36:, :, :3], m[36:, :, 3] = 20, 255
    Image.fromarray(m, "RGBA").save(masks / f"{WIDE}.png")
    return {"assets": assets, "masks": masks.parent}


def make_server(root: Path) -> SensorsimServer:
    """The fuzz server (built-in scene, CPU, the small :data:`BUDGET`, assets and ego masks), not started."""
    dirs = make_server_dirs(root)
    return SensorsimServer(port=0, device="cpu", max_workers=4, budget=BUDGET, assets_dir=dirs["assets"],
                           ego_masks_dir=dirs["masks"])


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    srv = make_server(tmp_path_factory.mktemp("fuzz_server"))
    srv.preload()
    srv.start()
    yield srv
    srv.shutdown(grace=1.0)


@pytest.fixture(scope="module")
def channel(fuzz_server):
    with grpc.insecure_channel(fuzz_server.address, options=channel_options()) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel):
    return SG.SensorsimServiceStub(channel)


@pytest.fixture(scope="module")
def scene():
    return wsim.load_scene("builtin:nurec")


@pytest.fixture(scope="module")
def specs(stub):
    cams = stub.get_available_cameras(S.AvailableCamerasRequest(scene_id=SCENE), timeout=CALL_TIMEOUT_S)
    return {c.logical_id: c.intrinsics for c in cams.available_cameras}


def _reference_requests(scene, specs) -> tuple[S.RGBRenderRequest, S.LidarRenderRequest]:
    return (rgb_request(specs[WIDE], scene, h=48, w=64, t0=2.0, fmt=S.PNG), lidar_request(scene, S.PANDAR128, t0=3.0))


def _render_reference(stub, scene, specs) -> tuple[bytes, bytes, bytes]:
    rgb, lidar = _reference_requests(scene, specs)
    img = stub.render_rgb(rgb, timeout=CALL_TIMEOUT_S).image_bytes
    pc = stub.render_lidar(lidar, timeout=CALL_TIMEOUT_S)
    return img, pc.point_xyzs_buffer, pc.point_intensities_buffer


@pytest.fixture(scope="module")
def reference(stub, scene, specs) -> Quiet:
    """The reference frames, rendered before any fuzzing (every fuzz test asks for this fixture)."""
    return Quiet(zip(("png", "xyz", "intensity"), _render_reference(stub, scene, specs)))


def _override(scene, track: str, t0: float, t1: float) -> S.DynamicObject:
    a = scene.ego_trajectory.pose_at(t0)
    b = scene.ego_trajectory.pose_at(t1)
    shift = lambda p: (np.asarray(p[0], float) + (12.0, 0.0, 0.5), p[1])  # noqa: E731 - 12 m ahead of the ego
    return S.DynamicObject(track_id=track, pose_pair=S.PosePair(start_pose=to_pose(shift(a)),
                                                               end_pose=to_pose(shift(b))))


@pytest.fixture(scope="module")
def templates(scene, specs) -> Quiet:
    return make_templates(scene, specs)


def make_templates(scene, specs) -> Quiet:
    """One valid request per RPC: small images, 10 ms lidar frames, one dynamic-object override each."""
    t0, t1 = 2.0, 2.03

    def rgb(fmt=S.PNG, h=24, w=32):
        r = rgb_request(specs[WIDE], scene, h=h, w=w, t0=t0, fmt=fmt)
        r.dynamic_objects.append(_override(scene, "moving_car_eastbound", t0, t1))
        r.insert_ego_mask = True
        r.ego_mask_id.CopyFrom(S.EgoMaskId(camera_logical_id=WIDE, rig_config_id="rig"))
        r.ego_pose.CopyFrom(r.sensor_pose)
        return r

    def camera(logical=WIDE):
        return S.CameraRenderRequest(
            scene_id=SCENE, resolution_h=24, resolution_w=32, camera_intrinsics=specs[logical],
            frame_start_us=us(scene, t0), frame_end_us=us(scene, t1), sensor_pose=camera_pair(scene, logical, t0, t1),
            dynamic_objects=[_override(scene, "parked_car_1", t0, t1)], image_format=S.JPEG, image_quality=80,
            render_products=[S.CAMERA_RENDER_PRODUCT_COLOR, S.CAMERA_RENDER_PRODUCT_DISTANCE_COLORIZED,
                             S.CAMERA_RENDER_PRODUCT_SEMANTICS_COLORIZED],
            overlay_bounding_boxes=S.OVERLAY_BOUNDING_BOX_SOURCE_ARTIFACT, distance_colormap_vmax_m=60.0,
            bbox_color=S.BboxColor(r=255, g=0, b=0))

    def lidar(kind=S.PANDAR128):
        r = lidar_request(scene, kind, t0=3.0)
        r.frame_end_us = r.frame_start_us + LIDAR_FRAME_US
        r.dynamic_objects.append(_override(scene, "moving_car_westbound", 3.0, 3.01))
        return r

    start = us(scene, 3.0)
    crate_pose = to_pose(((400.0, 400.0, 0.0), (0.0, 0.0, 0.0, 1.0)))  # far off the street: renders unchanged
    edit = S.EditAssetsRequest(scene_id=SCENE, edits=[
        S.AssetEdit(asset_id="crate", new_track_id="fuzz_crate", trajectory=C.Trajectory(poses=[
            C.PoseAtTime(pose=crate_pose, timestamp_us=start), C.PoseAtTime(pose=crate_pose, timestamp_us=start + 10**6)])),
        S.AssetEdit(asset_id="crate", replace_track_id="parked_car_5")])
    return Quiet({
        "render_rgb": rgb(),
        "render_camera": camera(),
        "batch_render_rgb": S.BatchRGBRenderRequest(items=[S.BatchRGBRenderRequest.Item(camera_name="a", request=rgb()),
                                                           S.BatchRGBRenderRequest.Item(camera_name="b",
                                                                                        request=rgb(S.JPEG, 16, 16))]),
        "batch_render_camera": S.BatchCameraRenderRequest(items=[
            S.BatchCameraRenderRequestItem(camera_name="tele", request=camera("camera_front_tele_30fov")),
            S.BatchCameraRenderRequestItem(camera_name="fisheye", request=camera("camera_rear_fisheye_200fov"))]),
        "render_lidar": lidar(),
        "render_aggregated": S.AggregatedRenderRequest(rgb_requests=[rgb(S.RGB_UINT8_PLANAR)],
                                                       lidar_requests=[lidar(S.AT128)]),
        "edit_assets": edit,
        "get_version": C.Empty(),
        "get_available_scenes": C.Empty(),
        "get_loaded_scenes": C.Empty(),
        "get_available_cameras": S.AvailableCamerasRequest(scene_id=SCENE),
        "get_available_trajectories": S.AvailableTrajectoriesRequest(scene_id=SCENE),
        "get_available_ego_masks": C.Empty(),
        "get_server_config": C.Empty(),
        "get_dynamic_objects": S.AvailableDynamicObjectsRequest(scene_id=SCENE),
        "get_external_asset_objects": S.ExternalAssetObjectsRequest(scene_id=SCENE),
        "restore_model_parameters": S.RestoreModelParametersRequest(scene_id=SCENE),
        "create_harmonizer_session": C.Empty(),
        "end_harmonizer_session": S.HarmonizerSessionId(session_id="session"),
        "open_ipc_session": ipc_pb2.OpenIpcSessionRequest(num_buffers=2, buffer_bytes=3 * 32 * 24),
        "close_ipc_session": ipc_pb2.CloseIpcSessionRequest(session_id="session"),
    })


RENDER_RPCS = ["render_rgb", "render_camera", "batch_render_rgb", "batch_render_camera", "render_lidar",
               "render_aggregated", "edit_assets"]
QUERY_RPCS = ["get_version", "get_available_scenes", "get_loaded_scenes", "get_available_cameras",
              "get_available_trajectories", "get_available_ego_masks", "get_server_config", "get_dynamic_objects",
              "get_external_asset_objects", "restore_model_parameters", "create_harmonizer_session",
              "end_harmonizer_session", "open_ipc_session", "close_ipc_session"]
ALL_RPCS = RENDER_RPCS + QUERY_RPCS


def _answer(call, request) -> tuple[str, str]:
    """(status code name, status message) of one call; a batch answered OK is refused by its first failing item's
    status (items carry ``"CODE: message"``)."""
    try:
        out = call(request, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""
    for item in getattr(out, "items", ()):
        if not item.success:
            code, _, message = item.error_message.partition(": ")
            return ("OK" if code in DOCUMENTED else f"item {code}"), message
    return "OK", ""


def _check(rpc: str, code: str, details: str, what: str) -> None:
    assert code == "OK" or code in DOCUMENTED, f"{rpc}: {code} {details[:500]!r} for {what}"
    assert len(details) < MAX_DETAILS, f"{rpc}: {len(details)}-character status message for {what}"


def test_every_rpc_is_fuzzed_and_every_template_is_answered(stub, templates, reference):
    assert set(ALL_RPCS) == {m.name for m in SERVICE.methods} - {"shut_down"}
    for rpc in ALL_RPCS:
        code, details = _answer(getattr(stub, rpc), templates[rpc])
        expected = {"OK"} if rpc in RENDER_RPCS[:-1] or rpc.startswith("get_") else {"OK"} | DOCUMENTED
        assert code in expected, f"{rpc}: {code} {details!r}"
    for rpc in ("batch_render_rgb", "batch_render_camera"):
        out = getattr(stub, rpc)(templates[rpc], timeout=CALL_TIMEOUT_S)
        assert [i.success for i in out.items] == [True, True], [i.error_message for i in out.items]
    stub.restore_model_parameters(S.RestoreModelParametersRequest(scene_id=SCENE), timeout=CALL_TIMEOUT_S)


def _fuzz_mutated(stub, templates, rpc: str, data) -> None:
    req = type(templates[rpc])()
    req.CopyFrom(templates[rpc])
    log: list[str] = []
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        mutate(data.draw, req, log)
    note("mutations:\n  " + "\n  ".join(log))
    code, details = _answer(getattr(stub, rpc), req)
    event(code)
    _check(rpc, code, details, "mutations " + "; ".join(log))


@pytest.mark.parametrize("rpc", RENDER_RPCS)
@fuzz(30)
@given(data=st.data())
def test_mutated_render_requests_get_documented_statuses(stub, templates, reference, rpc, data):
    _fuzz_mutated(stub, templates, rpc, data)


@pytest.mark.parametrize("rpc", QUERY_RPCS)
@fuzz(12)
@given(data=st.data())
def test_mutated_query_requests_get_documented_statuses(stub, templates, reference, rpc, data):
    _fuzz_mutated(stub, templates, rpc, data)


def _raw_call(channel, rpc: str, payload: bytes) -> tuple[str, str]:
    call = channel.unary_unary(f"/{SERVICE.full_name}/{rpc}")  # no serializers: bytes in, bytes out
    return _answer(call, payload)


def _decodes(cls, payload: bytes) -> bool:
    try:
        cls.FromString(payload)
        return True
    except Exception:  # noqa: BLE001 - DecodeError and friends
        return False


@pytest.mark.parametrize("rpc", ALL_RPCS)
@fuzz(12)
@given(data=st.data())
def test_raw_bytes_that_parse_get_documented_statuses(channel, templates, reference, rpc, data):
    payload = data.draw(raw_bytes(templates[rpc].SerializeToString()), label="payload")
    assume(_decodes(type(templates[rpc]), payload))
    code, details = _raw_call(channel, rpc, payload)
    event(code)
    _check(rpc, code, details, f"raw bytes {short(payload)}")


@fuzz(40)
@given(data=st.data())
def test_raw_bytes_that_do_not_parse_are_invalid_arguments(channel, templates, reference, data):
    """Bytes that are no valid request message are the client's error (INVALID_ARGUMENT), not the server's."""
    rpc = data.draw(st.sampled_from(ALL_RPCS), label="rpc")
    payload = data.draw(raw_bytes(templates[rpc].SerializeToString()), label="payload")
    assume(not _decodes(type(templates[rpc]), payload))
    code, details = _raw_call(channel, rpc, payload)
    _check(rpc, code, details, f"undecodable bytes {short(payload)}")


@pytest.mark.parametrize("rpc,record", [("batch_render_rgb", b"\x0a\x00"), ("batch_render_camera", b"\x0a\x00"),
                                        ("render_aggregated", b"\x0a\x00"), ("render_aggregated", b"\x12\x00")],
                         ids=["batch_render_rgb", "batch_render_camera", "aggregated-rgb", "aggregated-lidar"])
def test_millions_of_empty_items_are_refused_without_walking_them(channel, reference, rpc, record):
    """Found by the fuzzing: 2,000,000 empty items (4 MB of request) kept the server 2-6 s walking them in the budget
    check before RESOURCE_EXHAUSTED (a 64 MiB request of them over a minute); the item count alone refuses them."""
    t = time.perf_counter()
    code, details = _raw_call(channel, rpc, record * 2_000_000)
    assert code == "RESOURCE_EXHAUSTED" and "or more exceed" in details, (code, details)
    assert time.perf_counter() - t < 1.5


def test_server_still_renders_the_reference_frames_bit_identically(stub, scene, specs, reference):
    """After the fuzzing (which may have edited assets into the scene: restore_model_parameters undoes that)."""
    assert stub.get_version(C.Empty(), timeout=CALL_TIMEOUT_S).version_id.startswith("wsim-")
    stub.restore_model_parameters(S.RestoreModelParametersRequest(scene_id=SCENE), timeout=CALL_TIMEOUT_S)
    img, xyz, intensity = _render_reference(stub, scene, specs)
    assert img == reference["png"], "render_rgb PNG differs from the one rendered before the fuzzing"
    assert len(xyz) > 100_000 * 12 and xyz == reference["xyz"], "render_lidar points differ"
    assert intensity == reference["intensity"], "render_lidar intensities differ"


# ===================================================================================================== loaders
_CASE = itertools.count()
#: Address space the loader may add while loading one file [bytes]: a corrupt count that makes it allocate more
#: fails as MemoryError (a loader failure) instead of swapping the machine.
LOAD_HEADROOM_BYTES = 6 * 1024**3


@pytest.fixture(scope="module")
def case_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz_scenes")


def _case_dir(root: Path) -> Path:
    d = root / f"case{next(_CASE):05d}"
    d.mkdir()
    return d


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def assert_loads_or_scene_error(path: Path, what: str) -> None:
    """``wsim.load_scene(path)`` returns a Scene or raises SceneError naming the file; anything else propagates."""
    note(f"input: {what} ({path})")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    vm = _vm_bytes()
    limit = vm + LOAD_HEADROOM_BYTES if vm else resource.RLIM_INFINITY
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        scene = wsim.load_scene(path)
    except wsim.SceneError as e:
        assert path.name in str(e), f"SceneError does not name the file: {str(e)[:300]!r}"
        return
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert isinstance(scene, wsim.Scene)


# ----------------------------------------------------------------------------------------------- NuRec artifacts
@pytest.fixture(scope="module")
def shipped() -> Quiet:
    with zipfile.ZipFile(SHIPPED) as z:
        return Quiet({n: z.read(n) for n in z.namelist()})


def write_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                        st.sampled_from([0, -1, 2**31, 2**63, -2**63 - 1, 10**30, 10**9]),
                        st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 1e-320]), st.floats(-1e6, 1e6),
                        st.text(max_size=12), st.sampled_from(["", "CONTROLLABLE", "ftheta", "x" * 100_000]))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda kids: st.one_of(st.lists(kids, max_size=5),
                                                               st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                           max_leaves=10)


def replace_in(draw, doc, log: list[str]):
    """``doc`` with one value somewhere inside replaced by a random JSON value (or a key / element deleted)."""
    path, node = [], doc
    while isinstance(node, (dict, list)) and node and draw(st.integers(0, 4)) > 0:
        key = draw(st.sampled_from(sorted(node, key=str))) if isinstance(node, dict) else \
            draw(st.integers(0, len(node) - 1))
        path.append(key)
        node = node[key]
    if not path:
        new = draw(JSON_VALUES)
        log.append(f"whole document -> {short(new)}")
        return new
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if draw(st.integers(0, 3)) == 0:
        del parent[path[-1]]
        log.append(f"{path}: deleted")
    else:
        parent[path[-1]] = draw(JSON_VALUES)
        log.append(f"{path} -> {short(parent[path[-1]])}")
    return doc


NUREC_CLASSES = ["members dropped", "JSON field replaced", "metadata.yaml field replaced", "member truncated",
                 "member bytes flipped", "archive bytes flipped", "PLY header counts", "USD layer of junk added"]


@st.composite
def nurec_cases(draw, kind: str, members: dict[str, bytes]) -> tuple[dict[str, bytes] | bytes, str]:
    m = dict(members)
    names = sorted(m)
    if kind == "members dropped":
        drop = draw(st.sets(st.sampled_from(names), min_size=1, max_size=3))
        for n in drop:
            del m[n]
        return m, f"dropped {sorted(drop)}"
    if kind == "JSON field replaced":
        name = draw(st.sampled_from([n for n in names if n.endswith(".json")]))
        log: list[str] = []
        doc = json.loads(m[name])
        for _ in range(draw(st.integers(1, 3))):
            doc = replace_in(draw, doc, log)
        m[name] = json.dumps(doc).encode()
        return m, f"{name}: {'; '.join(log)}"
    if kind == "metadata.yaml field replaced":
        log = []
        doc = replace_in(draw, yaml.safe_load(m["metadata.yaml"]), log)
        m["metadata.yaml"] = yaml.safe_dump(doc).encode()
        return m, f"metadata.yaml: {'; '.join(log)}"
    if kind == "member truncated":
        name = draw(st.sampled_from(names))
        n = draw(st.integers(0, len(m[name]) - 1))
        m[name] = m[name][:n]
        return m, f"{name} cut to {n} of {len(members[name])} bytes"
    if kind == "member bytes flipped":
        name = draw(st.sampled_from(names))
        b = bytearray(m[name])
        at = [draw(st.integers(0, len(b) - 1)) for _ in range(draw(st.integers(1, 8)))]
        for i in at:
            b[i] ^= draw(st.integers(1, 255))
        m[name] = bytes(b)
        return m, f"{name}: bytes flipped at {at}"
    if kind == "archive bytes flipped":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for n, d in m.items():
                z.writestr(n, d)
        b = bytearray(buf.getvalue())
        at = [draw(st.integers(0, len(b) - 1)) for _ in range(draw(st.integers(1, 8)))]
        for i in at:
            b[i] ^= draw(st.integers(1, 255))
        return bytes(b), f"archive bytes flipped at {at}"
    if kind == "PLY header counts":
        name = draw(st.sampled_from([n for n in names if n.endswith(".ply")]))
        data = m[name]
        end = data.index(b"end_header\n")
        lines = data[:end].decode().splitlines()
        k = draw(st.sampled_from([i for i, line in enumerate(lines) if line.startswith("element ")]))
        _, elem, count = lines[k].split()
        new = draw(st.sampled_from(["0", "1", str(int(count) - 1), str(int(count) + 1), str(2 * int(count)),
                                    str(10**6), "99999999", str(2**31 - 1), str(2**32 + 1), str(2**63 + 5), "-1", "x", ""]))
        lines[k] = f"element {elem} {new}"
        m[name] = ("\n".join(lines) + "\n").encode() + data[end:]
        return m, f"{name}: element {elem} {count} -> {new!r}"
    if kind == "USD layer of junk added":
        name = draw(st.sampled_from(["scene.usda", "scene.usdc", "layer.usd"]))
        prefix = draw(st.sampled_from([b"", b"#usda 1.0\n", b"PXR-USDC"]))
        m[name] = prefix + draw(st.binary(max_size=256))
        return m, f"added {name} = {short(m[name])}"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", NUREC_CLASSES)
@fuzz(12)
@given(data=st.data())
def test_mutated_nurec_artifacts_load_or_raise_scene_error(shipped, case_root, kind, data):
    content, what = data.draw(nurec_cases(kind, shipped), label="case")
    path = _case_dir(case_root) / "scene.usdz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        write_zip(path, content)
    assert_loads_or_scene_error(path, f"NuRec artifact, {kind}: {what}")


# ----------------------------------------------------------------------------------------------- USD stages
NAN, INF = math.nan, math.inf
USD_VALUES = {
    "metersPerUnit": st.sampled_from([0.0, -1.0, NAN, INF, -INF, 1e-300, 1e300, 0.01]),
    "upAxis": st.one_of(st.sampled_from(["Q", "", "x", "y", "Z ", "XY", "é", "Y"]), st.text(max_size=4)),
    "timeCodesPerSecond": st.sampled_from([0.0, -1.0, NAN, INF, 1e-300, 1e300]),
    "timeCodes": st.sampled_from([(NAN, 1.0), (0.0, INF), (-1e300, 1e300), (5.0, 1.0)]),
    "points": st.lists(st.sampled_from([NAN, INF, -INF, 1e38, -1e38, 3e38, 0.0]), min_size=1, max_size=4),
    "points count": st.sampled_from([0, 1, 2, 7]),
    "indices": st.lists(st.sampled_from([-1, 8, 9, 2**31 - 1, -2**31]), min_size=1, max_size=3),
    "counts": st.sampled_from([[0], [-1], [1], [2], [2**31 - 1], [3] * 11, [3] * 13, [4] * 9, [1000], [3, -3] * 6]),
    "points typed string": st.just(True),
    "translate": st.sampled_from([(NAN, 0.0, 0.0), (INF, 0.0, 0.0), (1e30, 1e30, 1e30)]),
    "scale": st.sampled_from([(0.0, 0.0, 0.0), (NAN, 1.0, 1.0), (-1.0, 1.0, 1.0), (1e30, 1.0, 1.0), (0.0, 1.0, 1.0)]),
    "sphere radius": st.sampled_from([NAN, -1.0, 0.0, INF, 1e30, 1e-30]),
    "moving samples": st.sampled_from([[(0.0, (NAN, 0, 0)), (1.0, (1, 0, 0))], [(0.0, (0, 0, 0)), (1e30, (1, 0, 0))],
                                       [(-5.0, (0, 0, 0)), (-5.0, (1, 0, 0))], [(0.0, (INF, 0, 0))]]),
    "instancer protoIndices": st.sampled_from([[-1], [1], [2**31 - 1], [0, 0, 5]]),
    "instancer positions": st.sampled_from([[(NAN, 0, 0)], [], [(0, 0, 0)] * 5, [(INF, 0, 0)]]),
    "instancer orientations": st.sampled_from([[(0.0, 0.0, 0.0, 0.0)], [(NAN, 0.0, 0.0, 1.0)], []]),
    "camera calibration": st.one_of(
        st.sampled_from(["", "{", "[]", "null", "1e400", '{"model": "ftheta"}',
                         '{"model": "opencv_pinhole", "params": {"principal_point_x": NaN}, "resolution": [64, 48]}',
                         '{"model": "opencv_pinhole", "params": {}, "resolution": [-1, 0]}',
                         '{"model": "opencv_pinhole", "params": {}, "resolution": [1e30, 48]}',
                         '{"model": "ftheta", "params": {"pixeldist_to_angle_poly": [NaN]}, "resolution": [64, 48]}',
                         '{"model": "unknown", "params": {}, "resolution": [64, 48]}',
                         '{"model": "opencv_pinhole", "params": [], "resolution": "64x48"}']),
        JSON_VALUES.map(json.dumps)),
    "camera focal": st.sampled_from([0.0, NAN, -1.0, INF]),
    "ego samples": st.sampled_from([[], [(NAN, (0, 0, 0))], [(0.0, (NAN, 0, 0)), (1.0, (0, 0, 0))],
                                    [(0.0, (0, 0, 0)), (0.0, (1, 0, 0))]]),
    "ego rotate": st.sampled_from([(NAN, 0.0, 0.0), (0.0, 0.0, 1e30)]),
    "semantic label": st.sampled_from([7, 1.5, "", "x" * 100_000]),
    "object id": st.sampled_from([-1, 2**31 - 1, 0]),
    "cuboid": st.sampled_from([(NAN, 1.0, 1.0), (-1.0, -1.0, -1.0), (INF, 0.0, 0.0)]),
}


def write_stage(path: Path, bad: dict) -> None:
    """A small stage (a box mesh, a sphere, a moving box, a point instancer, an ego rig with a camera) with the
    values in ``bad`` put in place of valid ones."""
    from pxr import Gf, Sdf, Usd, UsdGeom, Vt

    from conftest import box_mesh

    stage = Usd.Stage.CreateNew(str(path))
    stage.SetMetadata("upAxis", bad.get("upAxis", "Z"))
    stage.SetMetadata("metersPerUnit", bad.get("metersPerUnit", 1.0))
    stage.SetTimeCodesPerSecond(bad.get("timeCodesPerSecond", 1000.0))
    start, end = bad.get("timeCodes", (0.0, 2000.0))
    stage.SetStartTimeCode(start)
    stage.SetEndTimeCode(end)
    world = UsdGeom.Xform.Define(stage, "/World")
    stage.SetDefaultPrim(world.GetPrim())

    p, f = box_mesh((-1, -1, 0), (1, 1, 2))
    pts = [tuple(map(float, x)) for x in p][: bad.get("points count", 8)]
    for k, v in enumerate(bad.get("points", [])):
        pts[k % len(pts)] = (v, pts[k % len(pts)][1], pts[k % len(pts)][2]) if pts else (v, v, v)
    idx = [int(i) for i in f.reshape(-1)]
    for k, v in enumerate(bad.get("indices", [])):
        idx[(7 * k) % len(idx)] = v
    box = UsdGeom.Mesh.Define(stage, "/World/Box")
    if "points typed string" in bad:  # authored on the layer: Usd refuses a value of the wrong type for points
        spec = Sdf.AttributeSpec(stage.GetRootLayer().GetPrimAtPath("/World/Box"), "points",
                                 Sdf.ValueTypeNames.String)
        spec.default = "1 2 3"
    else:
        box.CreatePointsAttr(Vt.Vec3fArray([Gf.Vec3f(*x) for x in pts]))
    box.CreateFaceVertexCountsAttr(Vt.IntArray(bad.get("counts", [3] * 12)))
    box.CreateFaceVertexIndicesAttr(Vt.IntArray(idx))
    xf = UsdGeom.XformCommonAPI(box.GetPrim())
    xf.SetTranslate(Gf.Vec3d(*bad.get("translate", (10.0, 0.0, 0.0))))
    xf.SetScale(Gf.Vec3f(*bad.get("scale", (1.0, 1.0, 1.0))))
    label = bad.get("semantic label", "building")
    typ = Sdf.ValueTypeNames.String if isinstance(label, str) else (
        Sdf.ValueTypeNames.Int if isinstance(label, int) else Sdf.ValueTypeNames.Double)
    box.GetPrim().CreateAttribute("semantics:labels:class", typ).Set(label)

    ball = UsdGeom.Sphere.Define(stage, "/World/Ball")
    ball.CreateRadiusAttr(bad.get("sphere radius", 0.5))
    UsdGeom.XformCommonAPI(ball.GetPrim()).SetTranslate(Gf.Vec3d(0.0, 6.0, 1.0))

    car = UsdGeom.Xform.Define(stage, "/World/Car")
    op = car.AddTranslateOp()
    for code, v in bad.get("moving samples", [(0.0, (0, -6, 0)), (2000.0, (20, -6, 0))]):
        op.Set(Gf.Vec3d(*v), code)
    car.GetPrim().CreateAttribute("wsim:objectId", Sdf.ValueTypeNames.Int, custom=True).Set(bad.get("object id", 5))
    car.GetPrim().CreateAttribute("wsim:cuboid", Sdf.ValueTypeNames.Float3, custom=True).Set(
        Gf.Vec3f(*bad.get("cuboid", (2.0, 2.0, 2.0))))
    UsdGeom.Cube.Define(stage, "/World/Car/Body").CreateSizeAttr(2.0)

    inst = UsdGeom.PointInstancer.Define(stage, "/World/Trees")
    UsdGeom.Cube.Define(stage, "/World/Trees/Proto").CreateSizeAttr(1.0)
    inst.CreatePrototypesRel().SetTargets([Sdf.Path("/World/Trees/Proto")])
    inst.CreateProtoIndicesAttr(Vt.IntArray(bad.get("instancer protoIndices", [0, 0])))
    inst.CreatePositionsAttr(Vt.Vec3fArray([Gf.Vec3f(*x) for x in
                                            bad.get("instancer positions", [(0, 10, 0), (5, 10, 0)])]))
    if "instancer orientations" in bad:
        inst.CreateOrientationsAttr(Vt.QuathArray([Gf.Quath(q[3], q[0], q[1], q[2])
                                                   for q in bad["instancer orientations"]]))

    rig = UsdGeom.Xform.Define(stage, "/World/EgoRig")
    rig.GetPrim().CreateAttribute("wsim:egoRig", Sdf.ValueTypeNames.Bool, custom=True).Set(True)
    rop = rig.AddTranslateOp()
    for code, v in bad.get("ego samples", [(0.0, (-10, 0, 0)), (2000.0, (10, 0, 0))]):
        rop.Set(Gf.Vec3d(*v), code)
    if "ego rotate" in bad:
        rig.AddRotateXYZOp().Set(Gf.Vec3f(*bad["ego rotate"]))
    cam = UsdGeom.Camera.Define(stage, "/World/EgoRig/Front")
    cam.CreateFocalLengthAttr(bad.get("camera focal", 20.0))
    calib = bad.get("camera calibration", json.dumps({
        "model": "opencv_pinhole", "resolution": [64, 48], "shutter_type": "GLOBAL",
        "params": {"principal_point_x": 32.0, "principal_point_y": 24.0, "focal_length_x": 40.0,
                   "focal_length_y": 40.0}}))
    cam.GetPrim().CreateAttribute("wsim:camera:calibration", Sdf.ValueTypeNames.String, custom=True).Set(calib)
    stage.GetRootLayer().Save()


def test_the_usd_template_stage_loads(tmp_path):
    for suffix in (".usda", ".usdc"):
        write_stage(tmp_path / f"ok{suffix}", {})
        s = wsim.load_scene(tmp_path / f"ok{suffix}")
        assert s.static.num_triangles > 12 and len(s.instances) >= 3 and list(s.cameras) == ["Front"]
        assert s.ego_trajectory is not None and len(s.ego_trajectory.times) == 2


USD_CLASSES = {
    "stage metadata (metersPerUnit, upAxis, timeCodesPerSecond, time codes)": ["metersPerUnit", "upAxis",
                                                                                "timeCodesPerSecond", "timeCodes"],
    "mesh points (NaN, inf, too few, wrong type)": ["points", "points count", "points typed string"],
    "mesh topology (indices out of range, bad or huge counts)": ["indices", "counts"],
    "transforms (NaN translate, zero scale, moving samples)": ["translate", "scale", "moving samples"],
    "gprims and point instancers": ["sphere radius", "instancer protoIndices", "instancer positions",
                                    "instancer orientations"],
    "cameras and ego rig": ["camera calibration", "camera focal", "ego samples", "ego rotate"],
    "labels and ids": ["semantic label", "object id", "cuboid"],
}


@st.composite
def usd_cases(draw, keys: list[str]) -> dict:
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True))
    bad = {k: draw(USD_VALUES[k], label=k) for k in chosen}
    if draw(st.booleans()):  # and sometimes one value from anywhere else
        k = draw(st.sampled_from(sorted(USD_VALUES)))
        bad.setdefault(k, draw(USD_VALUES[k], label=k))
    return bad


@pytest.mark.parametrize("kind", list(USD_CLASSES))
@fuzz(12)
@given(data=st.data())
def test_hostile_usd_stages_load_or_raise_scene_error(case_root, kind, data):
    bad = data.draw(usd_cases(USD_CLASSES[kind]), label="values")
    suffix = data.draw(st.sampled_from([".usda", ".usdc"]), label="suffix")
    path = _case_dir(case_root) / f"stage{suffix}"
    try:
        write_stage(path, bad)
    except Exception as e:  # noqa: BLE001 - pxr refused to author the value: not an input the loader can see
        note(f"pxr refused {short(bad)}: {e}")
        assume(False)
    assert_loads_or_scene_error(path, f"USD stage, {kind}: {short(bad, 400)}")


# ----------------------------------------------------------------------------------------------- random files
MAGIC = [b"", b"#usda 1.0\n", b"#usda 1.0\n(\n", b"#sdf 1.4.32\n", b"PXR-USDC", b"PXR-USDC\x00\x08\x00\x00",
         b"PK\x03\x04", b"PK\x05\x06" + b"\x00" * 18, b"ply\n", b"ply\nformat ascii 1.0\n", b"\x1f\x8b"]


@fuzz(60)
@given(suffix=st.sampled_from([".usda", ".usdc", ".usdz", ".usd", ".ply", ".USDZ"]), magic=st.sampled_from(MAGIC),
       body=st.one_of(st.binary(max_size=2048), st.text(max_size=512).map(str.encode)))
def test_random_bytes_with_scene_suffixes_load_or_raise_scene_error(case_root, suffix, magic, body):
    path = _case_dir(case_root) / f"junk{suffix}"
    path.write_bytes(magic + body)
    assert_loads_or_scene_error(path, f"random bytes {short(magic + body)} as {suffix}")


@fuzz(12)
@given(name=st.sampled_from(["scene.usda", "scene.usdc", "scene.usdz", "scene.usd", "scene.ply", "builtin.usdz"]),
       inside=st.sampled_from([None, "metadata.yaml", "scene.usda", "sub/dir.usdz"]))
def test_folders_named_like_scene_files_raise_scene_error(case_root, name, inside):
    path = _case_dir(case_root) / name
    path.mkdir()
    if inside:
        (path / inside).parent.mkdir(parents=True, exist_ok=True)
        (path / inside).write_text("#usda 1.0\n")
    assert_loads_or_scene_error(path, f"a folder named {name} holding {inside}")
