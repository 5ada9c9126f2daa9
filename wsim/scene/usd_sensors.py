"""Sensor prims of a USD stage read into plain values (the sensors in :mod:`wsim.sensors` never see pxr).

:func:`read_camera_prim` turns a ``UsdGeom.Camera`` prim into a :class:`CameraPrim`: a :class:`CameraCalibration`
(lens model, parameters with the sensorsim CameraSpec field names, native resolution, shutter, logical id) and the
prim's camera-to-world :class:`Trajectory`. :meth:`wsim.Camera.from_usd_prim` builds a camera from it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .scene import CameraCalibration, Trajectory
from .transforms import decompose_matrix
from .usd_stage import _RX180, _attr_value, _col, _pxr, _up_matrix, pxr_error_message

#: The attribute that carries a full calibration as JSON (see :func:`read_camera_prim`).
CALIBRATION_ATTRIBUTE = "wsim:camera:calibration"
#: ``int2`` (width, height) [px] of a camera described by its USD lens attributes.
RESOLUTION_ATTRIBUTE = "wsim:camera:resolution"


@dataclass
class CameraPrim:
    """A ``UsdGeom.Camera`` prim as plain values.

    Attributes:
        calibration: Model, params, native resolution, shutter type and logical id; ``camera_to_rig`` is the
            identity (the prim's pose is :attr:`trajectory`).
        trajectory: Camera-to-world poses over time (OpenCV camera axes: x right, y down, z forward; metres, Z up;
            scene seconds = time code / timeCodesPerSecond). One key for an unanimated prim.
        where: ``"<stage>:<prim path>"``, for messages.
        source: Where the calibration came from: :data:`CALIBRATION_ATTRIBUTE` or ``"USD lens attributes"``
            (messages about its fields name it).
    """

    calibration: CameraCalibration
    trajectory: Trajectory
    where: str
    source: str


def read_camera_prim(stage_path: str | Path, prim_path: str) -> CameraPrim:
    """Read a ``UsdGeom.Camera`` prim.

    Without extra attributes the prim is an undistorted OpenCV pinhole (model ``opencv_pinhole``):
    fx = focalLength / horizontalAperture · W, fy = focalLength / verticalAperture · H, principal point at the image
    centre shifted by horizontalApertureOffset / verticalApertureOffset (USD's y points up, the image's down). The
    resolution is ``int2 wsim:camera:resolution`` (W, H) if authored, else W = 1920 and H = W · verticalAperture /
    horizontalAperture. The shutter is GLOBAL.

    A stage authors the other models (and windshields, shutters) with one custom attribute holding JSON::

        string wsim:camera:calibration = '{"model": "ftheta", "resolution": [1920, 1080],
            "shutter_type": "ROLLING_TOP_TO_BOTTOM", "logical_id": "camera_front_wide_120fov",
            "params": {"principal_point_x": 959.5, "principal_point_y": 539.5,
                       "reference_poly": "PIXELDIST_TO_ANGLE", "pixeldist_to_angle_poly": [0, 1e-3, ...],
                       "angle_to_pixeldist_poly": [], "max_angle": 1.2, "linear_cde": [1, 0, 0],
                       "bivariate_windshield_model_param": {"reference_poly": "FORWARD",
                           "horizontal_poly": [...], "vertical_poly": [...],
                           "horizontal_poly_inverse": [...], "vertical_poly_inverse": [...]}}}'

    ``model`` is ``ftheta``, ``opencv_pinhole`` or ``opencv_fisheye``; ``params`` uses the sensorsim CameraSpec field
    names (as :attr:`CameraCalibration.params`); ``resolution`` may also be given inside ``params``; ``shutter_type``
    defaults to ROLLING_TOP_TO_BOTTOM; ``logical_id`` to the prim's name; ``unique_id`` may be added. When present the
    attribute overrides the USD lens attributes. The USD scene loader reads the same attribute into
    ``Scene.cameras``. The parameters themselves are checked where a lens is built from them
    (:func:`wsim.sensors.lens.lens_from_calibration`).

    The pose is the prim's local-to-world transform turned to OpenCV camera axes (USD cameras look down -z with +y
    up), scaled by metersPerUnit and rotated to Z up for Y-up stages; an animated transform (time samples on the prim
    or its ancestors) becomes a trajectory keyed at every time sample.

    Raises:
        ValueError: The stage does not open, the prim is missing or not a Camera, or an attribute is malformed (the
            message names the stage, the prim and the field).
    """
    _, _, Usd, UsdGeom, _, _ = _pxr()
    try:
        stage = Usd.Stage.Open(str(stage_path))
    except Exception as e:  # noqa: BLE001 - pxr raises Tf.ErrorException
        raise ValueError(f"stage_path: cannot open {stage_path}: {pxr_error_message(e, str(stage_path))}") from e
    if stage is None:
        raise ValueError(f"stage_path: cannot open {stage_path}")
    prim = stage.GetPrimAtPath(prim_path)
    if not prim or not prim.IsValid():
        raise ValueError(f"prim_path: {stage_path} has no prim {prim_path}")
    if not prim.IsA(UsdGeom.Camera):
        raise ValueError(f"prim_path: {prim_path} is a {prim.GetTypeName() or 'typeless prim'}, not a Camera")
    where = f"{stage_path}:{prim_path}"
    raw = _attr_value(prim, CALIBRATION_ATTRIBUTE)
    if raw is not None:
        calib, source = _calibration_from_json(raw, prim.GetName(), where), CALIBRATION_ATTRIBUTE
    else:
        calib, source = _pinhole_from_lens_attributes(prim, UsdGeom, where), "USD lens attributes"
    return CameraPrim(calib, _trajectory(stage, prim, Usd, UsdGeom), where, source)


def _calibration_from_json(raw, name: str, where: str) -> CameraCalibration:
    try:
        doc = json.loads(str(raw))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {CALIBRATION_ATTRIBUTE} is not valid JSON: {e}") from e
    if not isinstance(doc, dict) or "model" not in doc:
        raise ValueError(f"{where}: {CALIBRATION_ATTRIBUTE} needs at least 'model', 'params', 'resolution'")
    params = doc.get("params") or {}
    if not isinstance(params, dict):
        raise ValueError(f"{where}: {CALIBRATION_ATTRIBUTE}: params: expected an object, got {params!r}")
    res = doc.get("resolution", params.get("resolution"))
    try:
        resolution = (int(res[0]), int(res[1]))
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise ValueError(f"{where}: {CALIBRATION_ATTRIBUTE}: resolution: expected (width, height), got {res!r}") from e
    return CameraCalibration(
        logical_id=str(doc.get("logical_id", name)),
        model=str(doc["model"]),
        params=dict(params),
        resolution=resolution,
        camera_to_rig=(np.zeros(3), np.array([0.0, 0.0, 0.0, 1.0])),
        shutter_type=str(doc.get("shutter_type") or params.get("shutter_type") or "ROLLING_TOP_TO_BOTTOM"),
        unique_id=str(doc.get("unique_id") or ""),
    )


def _pinhole_from_lens_attributes(prim, UsdGeom, where: str) -> CameraCalibration:  # noqa: N803 - pxr module
    cam = UsdGeom.Camera(prim)
    f = float(cam.GetFocalLengthAttr().Get() or 0.0)
    ha = float(cam.GetHorizontalApertureAttr().Get() or 0.0)
    va = float(cam.GetVerticalApertureAttr().Get() or 0.0)
    ho = float(cam.GetHorizontalApertureOffsetAttr().Get() or 0.0)
    vo = float(cam.GetVerticalApertureOffsetAttr().Get() or 0.0)
    for name, v in (("focalLength", f), ("horizontalAperture", ha), ("verticalAperture", va)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{where}: {name} must be positive, got {v}")
    res = _attr_value(prim, RESOLUTION_ATTRIBUTE)
    if res is not None:
        try:
            w, h = (int(x) for x in res)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {RESOLUTION_ATTRIBUTE}: expected (width, height), got {res!r}") from e
    else:
        w = 1920
        h = max(1, int(round(w * va / ha)))
    params = {"principal_point_x": w / 2.0 + ho / ha * w, "principal_point_y": h / 2.0 - vo / va * h,
              "focal_length_x": f / ha * w, "focal_length_y": f / va * h}
    return CameraCalibration(logical_id=prim.GetName(), model="opencv_pinhole", params=params, resolution=(w, h),
                             camera_to_rig=(np.zeros(3), np.array([0.0, 0.0, 0.0, 1.0])), shutter_type="GLOBAL")


def _trajectory(stage, prim, Usd, UsdGeom) -> Trajectory:  # noqa: N803 - pxr modules
    """The prim's camera-to-world pose at every time sample of its and its ancestors' transforms (or once)."""
    up = _up_matrix(UsdGeom.GetStageUpAxis(stage), float(UsdGeom.GetStageMetersPerUnit(stage) or 1.0))
    tps = float(stage.GetTimeCodesPerSecond() or 24.0)
    samples: set[float] = set()
    p = prim
    while p and p.GetPath() != p.GetPath().absoluteRootPath:
        if p.IsA(UsdGeom.Xformable):
            for op in UsdGeom.Xformable(p).GetOrderedXformOps():
                samples.update(op.GetTimeSamples())
        p = p.GetParent()
    codes = sorted(samples) if len(samples) > 1 else [samples.pop() if samples else None]
    xf = UsdGeom.Xformable(prim)
    ts, qs, tt = [], [], []
    for code in codes:
        m = up @ _col(xf.ComputeLocalToWorldTransform(Usd.TimeCode.Default() if code is None else Usd.TimeCode(code)))
        t, q, _ = decompose_matrix(m @ _RX180)
        ts.append(t)
        qs.append(q)
        tt.append(0.0 if code is None else code / tps)
    return Trajectory(np.asarray(tt), np.asarray(ts), np.asarray(qs))


__all__ = ["CALIBRATION_ATTRIBUTE", "RESOLUTION_ATTRIBUTE", "CameraPrim", "read_camera_prim"]
