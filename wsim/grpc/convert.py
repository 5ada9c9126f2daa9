"""Protobuf ⇄ wsim translation: poses, trajectories, camera specs, times. Validation errors name the request field.

Conventions: wsim quaternions are (x, y, z, w); ``common.Quat`` puts w first on the wire (field 1). A ``common.Pose``
maps child to parent (p_parent = R(quat)·p_child + vec), like wsim's (translation, quaternion) pairs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..scene.scene import CameraCalibration, Trajectory
from .errors import clip, invalid
from .stubs import common_pb2, sensorsim_pb2

Pose = tuple[np.ndarray, np.ndarray]

FTHETA_POLY = sensorsim_pb2.FthetaCameraParam.PolynomialType
WINDSHIELD_REF = sensorsim_pb2.BivariateWindshieldModelParameters.ReferencePolynomial

# --------------------------------------------------------------------------------------------------------- poses


def pose_from_proto(msg: Any, has: bool, field: str) -> Pose:
    """(translation (3,), unit quaternion xyzw (4,)) of a ``common.Pose``; ``has`` tells whether it was set."""
    if not has:
        raise invalid(f"{field}: not set")
    t = np.array([msg.vec.x, msg.vec.y, msg.vec.z], np.float64)
    q = np.array([msg.quat.x, msg.quat.y, msg.quat.z, msg.quat.w], np.float64)
    if not np.all(np.isfinite(t)):
        raise invalid(f"{field}.vec: non-finite translation {t.tolist()}")
    if not np.all(np.isfinite(q)):
        raise invalid(f"{field}.quat: non-finite quaternion")
    n = float(np.linalg.norm(q))
    if n < 1e-6:
        raise invalid(f"{field}.quat: zero quaternion")
    return t, q / n


def pose_pair_from_proto(msg: Any, has: bool, field: str) -> tuple[Pose, Pose]:
    """(start pose, end pose) of a ``PosePair``."""
    if not has:
        raise invalid(f"{field}: not set")
    return (pose_from_proto(msg.start_pose, msg.HasField("start_pose"), f"{field}.start_pose"),
            pose_from_proto(msg.end_pose, msg.HasField("end_pose"), f"{field}.end_pose"))


def pose_to_proto(pose: tuple[Any, Any]) -> common_pb2.Pose:
    t, q = (np.asarray(a, np.float64).reshape(-1) for a in pose)
    return common_pb2.Pose(vec=common_pb2.Vec3(x=t[0], y=t[1], z=t[2]),
                           quat=common_pb2.Quat(w=q[3], x=q[0], y=q[1], z=q[2]))


def trajectory_to_proto(traj: Trajectory, time_origin_us: int) -> common_pb2.Trajectory:
    """A scene trajectory (scene seconds) as absolute-microsecond ``common.Trajectory``."""
    out = common_pb2.Trajectory()
    for t, tr, q in zip(traj.times, traj.translations, traj.rotations):
        out.poses.add(pose=pose_to_proto((tr, q)), timestamp_us=int(time_origin_us + round(float(t) * 1e6)))
    return out


# --------------------------------------------------------------------------------------------------------- time


#: How far outside the scene's time range a frame may lie [s]: sensor and object poses are held (clamped) there.
MAX_TIME_OUTSIDE_S = 600.0


def frame_times(start_us: int, end_us: int, time_origin_us: int,
                time_range: tuple[float, float] | None = None) -> tuple[float, float]:
    """Scene seconds of a frame's [start, end] absolute microseconds (end ≥ start).

    With ``time_range`` (the scene's, [s]) both ends must lie within :data:`MAX_TIME_OUTSIDE_S` of it: times far
    outside are a client's mistake (e.g. seconds sent as microseconds), and would overflow nanosecond clocks.
    """
    if end_us < start_us:
        raise invalid(f"frame_end_us: {end_us} is before frame_start_us {start_us}")
    if time_range is not None:
        lo_us = time_origin_us + int(round((time_range[0] - MAX_TIME_OUTSIDE_S) * 1e6))
        hi_us = time_origin_us + int(round((time_range[1] + MAX_TIME_OUTSIDE_S) * 1e6))
        for name, v in (("frame_start_us", start_us), ("frame_end_us", end_us)):
            if not lo_us <= v <= hi_us:
                a, b = (time_origin_us + round(t * 1e6) for t in time_range)
                raise invalid(f"{name}: {v} us is outside the scene's time range [{a}, {b}] us by more than "
                              f"{MAX_TIME_OUTSIDE_S:.0f} s")
    return (start_us - time_origin_us) * 1e-6, (end_us - time_origin_us) * 1e-6


# --------------------------------------------------------------------------------------------------------- cameras

SHUTTER_NAMES = {v: k for k, v in sensorsim_pb2.ShutterType.items()}


def _enum_value(enum: Any, value: Any, default: int = 0) -> int:
    if isinstance(value, str):
        key = value.strip().upper()
        return enum.Value(key) if key in enum.keys() else default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def calibration_to_spec(cal: CameraCalibration) -> sensorsim_pb2.CameraSpec:
    """The ``CameraSpec`` of a scene camera at its native resolution (``logical_id`` set)."""
    p = cal.params
    spec = sensorsim_pb2.CameraSpec(logical_id=cal.logical_id, trajectory_idx=0, resolution_w=int(cal.resolution[0]),
                                    resolution_h=int(cal.resolution[1]),
                                    shutter_type=_enum_value(sensorsim_pb2.ShutterType, cal.shutter_type))
    if cal.model == "ftheta":
        cde = p.get("linear_cde", (1.0, 0.0, 0.0))
        if isinstance(cde, dict):
            cde = (cde.get("linear_c", 1.0), cde.get("linear_d", 0.0), cde.get("linear_e", 0.0))
        spec.ftheta_param.CopyFrom(sensorsim_pb2.FthetaCameraParam(
            principal_point_x=p["principal_point_x"], principal_point_y=p["principal_point_y"],
            reference_poly=_enum_value(FTHETA_POLY, p.get("reference_poly", "PIXELDIST_TO_ANGLE"), 1),
            pixeldist_to_angle_poly=list(p.get("pixeldist_to_angle_poly") or []),
            angle_to_pixeldist_poly=list(p.get("angle_to_pixeldist_poly") or []),
            max_angle=float(p.get("max_angle", 0.0) or 0.0),
            linear_cde=sensorsim_pb2.LinearCde(linear_c=cde[0], linear_d=cde[1], linear_e=cde[2])))
    elif cal.model == "opencv_pinhole":
        spec.opencv_pinhole_param.CopyFrom(sensorsim_pb2.OpenCVPinholeCameraParam(
            principal_point_x=p["principal_point_x"], principal_point_y=p["principal_point_y"],
            focal_length_x=p["focal_length_x"], focal_length_y=p["focal_length_y"],
            radial_coeffs=list(p.get("radial_coeffs") or []), tangential_coeffs=list(p.get("tangential_coeffs") or []),
            thin_prism_coeffs=list(p.get("thin_prism_coeffs") or [])))
    elif cal.model == "opencv_fisheye":
        spec.opencv_fisheye_param.CopyFrom(sensorsim_pb2.OpenCVFisheyeCameraParam(
            principal_point_x=p["principal_point_x"], principal_point_y=p["principal_point_y"],
            focal_length_x=p["focal_length_x"], focal_length_y=p["focal_length_y"],
            radial_coeffs=list(p.get("radial_coeffs") or []), max_angle=float(p.get("max_angle", 0.0) or 0.0)))
    ws = p.get("bivariate_windshield_model_param")
    if ws:
        spec.bivariate_windshield_model_param.CopyFrom(sensorsim_pb2.BivariateWindshieldModelParameters(
            reference_poly=_enum_value(WINDSHIELD_REF, ws.get("reference_poly", "FORWARD")),
            horizontal_poly=list(ws.get("horizontal_poly") or []), vertical_poly=list(ws.get("vertical_poly") or []),
            horizontal_poly_inverse=list(ws.get("horizontal_poly_inverse") or []),
            vertical_poly_inverse=list(ws.get("vertical_poly_inverse") or [])))
    return spec


def _finite(value: float, field: str) -> float:
    if not math.isfinite(value):
        raise invalid(f"{field}: must be finite, got {value}")
    return float(value)


def spec_to_lens_args(spec: sensorsim_pb2.CameraSpec, field: str,
                      cameras: dict[str, CameraCalibration]) -> tuple[str, dict, tuple[int, int], str, str]:
    """(model, params with CameraSpec names, native (width, height), shutter name, field prefix of the params) of a
    request's ``CameraSpec``. A spec without ``camera_param`` falls back to the scene camera named by its
    ``logical_id``; a zero native resolution to that camera's."""
    which = spec.WhichOneof("camera_param")
    cal = cameras.get(spec.logical_id) if spec.logical_id else None
    if which is None:
        if cal is None:
            raise invalid(f"{field}.camera_param: not set (and logical_id {clip(spec.logical_id)} names no scene camera)")
        params = dict(cal.params)
        params.pop("bivariate_windshield_model_param", None)
        model, prefix = cal.model, f"{field}."
    elif which == "ftheta_param":
        m = spec.ftheta_param
        if m.reference_poly not in FTHETA_POLY.values():
            raise invalid(f"{field}.ftheta_param.reference_poly: unknown value {m.reference_poly}")
        ref = m.reference_poly or FTHETA_POLY.Value("PIXELDIST_TO_ANGLE")
        poly_name = "pixeldist_to_angle_poly" if ref == FTHETA_POLY.Value("PIXELDIST_TO_ANGLE") \
            else "angle_to_pixeldist_poly"
        if len(getattr(m, poly_name)) == 0:
            raise invalid(f"{field}.ftheta_param.{poly_name}: empty polynomial (it is the reference polynomial)")
        params = {"principal_point_x": _finite(m.principal_point_x, f"{field}.ftheta_param.principal_point_x"),
                  "principal_point_y": _finite(m.principal_point_y, f"{field}.ftheta_param.principal_point_y"),
                  "reference_poly": int(ref),
                  "pixeldist_to_angle_poly": list(m.pixeldist_to_angle_poly),
                  "angle_to_pixeldist_poly": list(m.angle_to_pixeldist_poly),
                  "max_angle": _finite(m.max_angle, f"{field}.ftheta_param.max_angle"),
                  "linear_cde": ((m.linear_cde.linear_c, m.linear_cde.linear_d, m.linear_cde.linear_e)
                                 if m.HasField("linear_cde") else (1.0, 0.0, 0.0))}
        model, prefix = "ftheta", f"{field}.ftheta_param."
    elif which == "opencv_pinhole_param":
        m = spec.opencv_pinhole_param
        for name, allowed in (("radial_coeffs", (0, 2, 3, 4, 5, 6)), ("tangential_coeffs", (0, 2)),
                              ("thin_prism_coeffs", (0, 4))):
            if len(getattr(m, name)) not in allowed:
                raise invalid(f"{field}.opencv_pinhole_param.{name}: expected "
                              f"{' or '.join(map(str, allowed[1:]))} coefficients, got {len(getattr(m, name))}")
        params = {k: getattr(m, k) for k in ("principal_point_x", "principal_point_y", "focal_length_x",
                                             "focal_length_y")}
        params.update(radial_coeffs=list(m.radial_coeffs), tangential_coeffs=list(m.tangential_coeffs),
                      thin_prism_coeffs=list(m.thin_prism_coeffs))
        model, prefix = "opencv_pinhole", f"{field}.opencv_pinhole_param."
    else:
        m = spec.opencv_fisheye_param
        if len(m.radial_coeffs) not in (0, 4):
            raise invalid(f"{field}.opencv_fisheye_param.radial_coeffs: expected 4 coefficients, "
                          f"got {len(m.radial_coeffs)}")
        params = {k: getattr(m, k) for k in ("principal_point_x", "principal_point_y", "focal_length_x",
                                             "focal_length_y", "max_angle")}
        params["radial_coeffs"] = list(m.radial_coeffs)
        model, prefix = "opencv_fisheye", f"{field}.opencv_fisheye_param."
    if model != "ftheta":
        for k in ("principal_point_x", "principal_point_y", "focal_length_x", "focal_length_y"):
            _finite(params[k], f"{prefix}{k}")
        for k in ("focal_length_x", "focal_length_y"):
            if params[k] <= 0:
                raise invalid(f"{prefix}{k}: must be positive, got {params[k]}")
    if spec.HasField("bivariate_windshield_model_param"):
        ws = spec.bivariate_windshield_model_param
        params["bivariate_windshield_model_param"] = {
            "reference_poly": int(ws.reference_poly), "horizontal_poly": list(ws.horizontal_poly),
            "vertical_poly": list(ws.vertical_poly), "horizontal_poly_inverse": list(ws.horizontal_poly_inverse),
            "vertical_poly_inverse": list(ws.vertical_poly_inverse)}
    w, h = int(spec.resolution_w), int(spec.resolution_h)
    if w == 0 and h == 0 and cal is not None:
        w, h = cal.resolution
    for name, v in (("resolution_w", w), ("resolution_h", h)):
        if v <= 0:
            raise invalid(f"{field}.{name}: native resolution must be > 0, got {v}")
        if v > 16384:
            raise invalid(f"{field}.{name}: absurd native resolution {v} (at most 16384)")
    if spec.shutter_type not in SHUTTER_NAMES:
        raise invalid(f"{field}.shutter_type: unknown value {spec.shutter_type}")
    shutter = SHUTTER_NAMES[spec.shutter_type]
    if which is None and spec.shutter_type == 0 and cal is not None:
        shutter = cal.shutter_type
    return model, params, (w, h), shutter, prefix


# --------------------------------------------------------------------------------------------------------- lidar


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint((field << 3) | 2) + _varint(len(payload)) + payload


def lidar_return(xyz: np.ndarray, intensities: np.ndarray) -> sensorsim_pb2.LidarRenderReturn:
    """A ``LidarRenderReturn`` with both encodings of the points: the packed repeated floats (fields 1, 2) and the
    little-endian float32 byte buffers (fields 4, 5), plus num_points (field 3).

    A packed repeated float field holds exactly the little-endian float32 bytes on the wire, so the message is
    assembled from the arrays' bytes and parsed once, rather than appending hundreds of thousands of Python floats.
    """
    xyz_b = np.ascontiguousarray(xyz, dtype="<f4").reshape(-1).tobytes()
    int_b = np.ascontiguousarray(intensities, dtype="<f4").reshape(-1).tobytes()
    n = len(int_b) // 4
    if len(xyz_b) != 12 * n:
        raise ValueError(f"xyz: expected {n} points, got {len(xyz_b) // 12}")
    raw = b"".join([_length_delimited(1, xyz_b) if n else b"", _length_delimited(2, int_b) if n else b"",
                    _varint(3 << 3) + _varint(n) if n else b"", _length_delimited(4, xyz_b) if n else b"",
                    _length_delimited(5, int_b) if n else b""])
    return sensorsim_pb2.LidarRenderReturn.FromString(raw)
