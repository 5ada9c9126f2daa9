"""A small reader/writer for sensor prims: sensors read their USD prims through here (USD types stay in wsim.scene).

Matrices are returned in the column-vector convention (``p' = M @ p``): USD's row-vector matrices are transposed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .scene import SceneError, Trajectory
from .transforms import decompose_matrix


@dataclass
class SensorPrim:
    """A sensor prim's authored attributes and world trajectory.

    Attributes:
        path: Prim path of the sensor (for a RenderProduct: the prim its ``camera`` relation names).
        type_name: USD type name of the sensor prim.
        attributes: Full attribute name → value (NumPy arrays for arrays, str for tokens, 4x4 column-vector matrices).
        trajectory: Sensor-to-world poses at the stage's time samples (metres, Z up).
        channels: Channels selected by a RenderProduct's RenderVar (``channels`` token[]), else None.
        stage_file: File of the stage's root layer ("" for in-memory stages).
    """

    path: str
    type_name: str
    attributes: dict[str, Any]
    trajectory: Trajectory
    channels: list[str] | None = None
    stage_file: str = ""
    skipped: list[str] = field(default_factory=list)


def _open(source: Any, prim_path: str | None):
    from pxr import Usd

    if isinstance(source, Usd.Prim):
        if not source.IsValid():
            raise SceneError("invalid USD prim")
        return source.GetStage(), source
    if isinstance(source, Usd.Stage):
        stage = source
    else:
        path = os.fspath(source)
        if not os.path.exists(path):
            raise SceneError(f"{path}: no such USD file")
        try:
            stage = Usd.Stage.Open(path)
        except Exception as e:  # noqa: BLE001 - pxr raises Tf errors of several types
            raise SceneError(f"{path}: not a readable USD stage ({e})") from None
    if prim_path is None:
        raise SceneError(f"{_stage_file(stage)}: a prim path is required")
    prim = stage.GetPrimAtPath(prim_path)
    if not prim or not prim.IsValid():
        raise SceneError(f"{_stage_file(stage)}: no prim at {prim_path}")
    return stage, prim


def _stage_file(stage) -> str:
    try:
        return stage.GetRootLayer().realPath or stage.GetRootLayer().identifier
    except Exception:  # noqa: BLE001
        return "<stage>"


def _value(v: Any) -> Any:
    from pxr import Gf

    if isinstance(v, (Gf.Matrix4d, Gf.Matrix4f)):
        return np.array(v, dtype=np.float64).T  # row-vector → column-vector convention
    if hasattr(v, "__len__") and not isinstance(v, (str, bytes)):
        try:
            return np.array(v)
        except Exception:  # noqa: BLE001
            return list(v)
    return v


def read_sensor_prim(source: Any, prim_path: str | None = None) -> SensorPrim:
    """Read a sensor prim (or a RenderProduct naming one through ``rel camera``).

    Args:
        source: A ``pxr.Usd.Prim``, a ``pxr.Usd.Stage`` or a USD file path.
        prim_path: Prim path when ``source`` is a stage or file.

    Raises:
        SceneError: Missing file or prim, or a RenderProduct without a valid ``camera`` target.
    """
    from pxr import Usd, UsdGeom

    stage, prim = _open(source, prim_path)
    channels = None
    if prim.GetTypeName() == "RenderProduct":
        targets = prim.GetRelationship("camera").GetTargets() if prim.GetRelationship("camera") else []
        if not targets:
            raise SceneError(f"{_stage_file(stage)}: RenderProduct {prim.GetPath()} has no 'camera' relationship")
        rv = prim.GetRelationship("orderedVars")
        for var_path in (rv.GetTargets() if rv else []):
            var = stage.GetPrimAtPath(var_path)
            if var and var.GetAttribute("channels"):
                channels = [str(c) for c in (var.GetAttribute("channels").Get() or [])]
        prim = stage.GetPrimAtPath(targets[0])
        if not prim:
            raise SceneError(f"{_stage_file(stage)}: RenderProduct camera target {targets[0]} does not exist")
    attrs = {}
    for a in prim.GetAttributes():
        name = a.GetName()
        if name.startswith("omni:sensor:") or name.startswith("wsim:"):
            if a.HasAuthoredValue() or a.HasValue():
                attrs[name] = _value(a.Get())
    # world trajectory of the prim at every time sample of it and its ancestors
    times: set[float] = set()
    p = prim
    while p and p.GetPath() != p.GetPath().absoluteRootPath:
        xf = UsdGeom.Xformable(p)
        if xf:
            times.update(xf.GetTimeSamples())
        p = p.GetParent()
    codes = sorted(times) or [Usd.TimeCode.Default()]
    tcps = stage.GetTimeCodesPerSecond() or 24.0
    mpu = UsdGeom.GetStageMetersPerUnit(stage) or 1.0
    up = UsdGeom.GetStageUpAxis(stage)
    fix = np.eye(4)
    if up == UsdGeom.Tokens.y:
        fix[:3, :3] = [[1, 0, 0], [0, 0, -1], [0, 1, 0]]  # Y-up → Z-up: +90° about X
    ts, tr, qs = [], [], []
    for c in codes:
        m = np.array(UsdGeom.XformCache(c).GetLocalToWorldTransform(prim), dtype=np.float64).T
        m = fix @ m
        m[:3, 3] *= mpu
        t, q, _ = decompose_matrix(m)
        ts.append(0.0 if c == Usd.TimeCode.Default() else float(c) / tcps)
        tr.append(t)
        qs.append(q)
    return SensorPrim(str(prim.GetPath()), str(prim.GetTypeName()), attrs, Trajectory(ts, tr, qs), channels,
                      _stage_file(stage))


def write_lidar_usd(path: str | os.PathLike, prim_path: str, attributes: dict[str, Any],
                    type_name: str = "OmniLidar") -> None:
    """Write a stage holding one lidar prim with the given ``omni:sensor:Core:*`` attributes (Z up, metres)."""
    from pxr import Sdf, Usd, UsdGeom

    path = os.fspath(path)
    if os.path.exists(path):
        os.remove(path)
    stage = Usd.Stage.CreateNew(path)
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    prim = stage.DefinePrim(prim_path, type_name)
    stage.SetDefaultPrim(prim)
    for name, v in attributes.items():
        if isinstance(v, str):
            t, val = Sdf.ValueTypeNames.Token, v
        elif isinstance(v, (bool, np.bool_)):
            t, val = Sdf.ValueTypeNames.Bool, bool(v)
        elif isinstance(v, (int, np.integer)):
            t, val = Sdf.ValueTypeNames.UInt, int(v)
        elif isinstance(v, (float, np.floating)):
            t, val = Sdf.ValueTypeNames.Float, float(v)
        else:
            a = np.asarray(v)
            if a.shape == (4, 4) and a.dtype.kind == "f":
                from pxr import Gf

                t, val = Sdf.ValueTypeNames.Matrix4d, Gf.Matrix4d(a.T.tolist())
            elif a.dtype.kind == "u":
                t, val = Sdf.ValueTypeNames.UIntArray, a.astype(np.uint32).tolist()
            elif a.dtype.kind == "i":
                t, val = Sdf.ValueTypeNames.IntArray, a.astype(np.int32).tolist()
            else:
                t, val = Sdf.ValueTypeNames.FloatArray, a.astype(np.float32).tolist()
        prim.CreateAttribute(name, t, custom=False).Set(val)
    stage.GetRootLayer().Save()
