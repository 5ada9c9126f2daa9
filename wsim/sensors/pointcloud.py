"""The lidar ``PointCloud``: the channels and params of the RTX lidar PointCloud output, on the device."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import warp as wp

FLAG_VALID = 0x40
FLAG_NEW_SCAN = 0x20

#: Channel name → (dtype, layout) of every per-point channel (N = Counts[0] = maxPoints).
CHANNELS: dict[str, tuple[str, str]] = {
    "Counts": ("int32", "[1]"),
    "Flags": ("uint8", "[N]"),
    "Coordinates": ("float32", "[3, N] component-first (x, y, z [m] or azimuth [deg], elevation [deg], distance [m])"),
    "Intensity": ("float32", "[N] in [0, intensityScalePercent/100]"),
    "TimeOffsetNs": ("int32", "[N] ns from timestampNs"),
    "EmitterId": ("uint32", "[N]"),
    "ChannelId": ("uint32", "[N]"),
    "TickId": ("uint32", "[N]"),
    "EchoId": ("uint8", "[N]"),
    "TickState": ("uint8", "[N]"),
    "MaterialId": ("uint32", "[N]"),
    "ObjectId": ("uint32", "[N, 4] point-first"),
    "HitNormal": ("float32", "[N, 3] point-first"),
    "Velocity": ("float32", "[N, 3] point-first [m/s]"),
}
ALWAYS = ("Counts", "Flags")

#: Param name → (dtype, shape) of every param, as the RTX output contract has them (host NumPy arrays).
PARAMS: dict[str, tuple[str, tuple[int, ...]]] = {
    "frameId": ("uint64", (1,)),
    "timestampNs": ("uint64", (1,)),
    "modality": ("uint32", (1,)),
    "frameOfReference": ("uint16", (1,)),
    "coordsType": ("uint32", (1,)),
    "modelToAppTransform": ("float32", (4, 4)),
    "frameStartTimeStampNs": ("uint64", (1,)),
    "frameStartPosM": ("float32", (3,)),
    "frameStartOrientation": ("float32", (4,)),
    "frameEndTimeStampNs": ("uint64", (1,)),
    "frameEndPosM": ("float32", (3,)),
    "frameEndOrientation": ("float32", (4,)),
    "maxPoints": ("uint32", (1,)),
    "motionCompensationState": ("uint16", (1,)),
    "compactionType": ("uint32", (1,)),
}


def typed_params(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every contract param (:data:`PARAMS`) as a NumPy array of its dtype and shape; other entries
    (wsim's own, e.g. ``compensationReference``) are kept as they are.

    Raises:
        ValueError: A value does not fit its type (e.g. a negative timestamp for uint64); the message names it.
    """
    out = dict(values)
    for name, (dtype, shape, size, bounds) in _PARAM_TYPES.items():
        if name not in out:
            continue
        v = out[name]
        arr = np.asarray(v)
        ok = arr.size == size
        if bounds is not None:
            ok = ok and arr.dtype.kind in "iu"
            if ok:  # (a single value read as an int: an array's min and max cost some microseconds each)
                lo, hi = (int(arr.reshape(-1)[0]),) * 2 if size == 1 else (int(arr.min()), int(arr.max()))
                ok = bounds[0] <= lo and hi <= bounds[1]
        if not ok:
            raise ValueError(f"param {name}: {v!r} is not a {dtype} of shape {list(shape)}")
        out[name] = arr.astype(dtype).reshape(shape)
    return out


#: :data:`PARAMS` with each one's element count and, for integers, its dtype's (min, max).
_PARAM_TYPES = {name: (dtype, shape, int(np.prod(shape)),
                       (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)) if np.dtype(dtype).kind in "iu" else None)
                for name, (dtype, shape) in PARAMS.items()}


@dataclass
class PointCloud:
    """One lidar frame.

    Attributes:
        channels: Channel name → Warp array (see :data:`CHANNELS` for dtypes and layouts). Counts and Flags are
            always present; others only if selected. wsim also delivers ``SemanticId`` (int32 [N]) when asked.
        params: frameId, timestampNs, modality, frameOfReference, coordsType, modelToAppTransform,
            frameStartTimeStampNs, frameEndTimeStampNs, frameStartPosM, frameEndPosM, frameStartOrientation,
            frameEndOrientation (x, y, z, w), maxPoints, motionCompensationState, compactionType: host NumPy arrays
            typed as the contract has them (see :data:`PARAMS`: e.g. timestampNs uint64 [1], frameOfReference
            uint16 [1]); :meth:`value` gives a [1]-shaped one as a Python int. wsim adds compensationReference
            ("start" or "end").
        tape: With ``render(..., requires_grad=True)``, the ``wp.Tape`` that recorded Coordinates and Intensity.
        inputs: The differentiable inputs of that tape (their ``.grad`` after ``tape.backward``): ``poses`` (sensor
            key poses, ``wp.transform`` at ``pose_times``), ``azimuth``/``elevation`` (emitter offsets [rad], per
            state × emitter), ``gain`` (per emitter), ``reflectance`` (per material), ``static_points`` and
            ``prototype_points`` (mesh vertices [m]).
    """

    channels: dict[str, wp.array]
    params: dict[str, Any] = field(default_factory=dict)
    tape: Any = None
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def count(self) -> int:
        """Number of delivered entries (Counts[0])."""
        return int(self.channels["Counts"].numpy()[0])

    def __len__(self) -> int:
        return self.count

    def value(self, name: str, default: Any = None) -> Any:
        """Param ``name`` as a plain Python value: an int for the integer params of shape [1] (frameId,
        timestampNs, frameOfReference, ...), the array itself for the others; ``default`` if absent.

        The typed [1] arrays do not mix safely with other integer arrays in NumPy arithmetic (uint64 with int32
        gives float64): add timestamps as ints, e.g. ``pc.value("timestampNs") + TimeOffsetNs.astype(np.int64)``.
        """
        if name not in self.params:
            return default
        v = self.params[name]
        if isinstance(v, np.ndarray) and v.shape == (1,) and v.dtype.kind in "iu":
            return int(v[0])
        return v

    def __getitem__(self, name: str) -> wp.array:
        return self.channels[name]

    @property
    def valid(self) -> np.ndarray:
        """Boolean mask of entries carrying the VALID flag (0x40)."""
        return (self.channels["Flags"].numpy() & FLAG_VALID) != 0

    def numpy(self) -> dict[str, np.ndarray]:
        """Every channel as a NumPy array (host copy for device arrays)."""
        return {k: v.numpy() for k, v in self.channels.items()}

    def torch(self) -> dict[str, Any]:
        """Every channel as a torch tensor sharing the Warp array's memory (DLPack; no copy on the same device).

        uint32 channels are exposed as torch.int32 views of the same bits where torch lacks the unsigned type.
        """
        import torch

        out = {}
        for k, v in self.channels.items():
            try:
                out[k] = wp.to_torch(v, requires_grad=False)
            except (RuntimeError, TypeError, ValueError):
                # (the view holds the channel through its deleter: a lidar reuses a channel's memory once the
                # channel is gone)
                view = wp.array(ptr=v.ptr, dtype=wp.int32, shape=v.shape, device=v.device,
                                deleter=lambda _p, _s, _owner=v: None) if v.dtype == wp.uint32 else v
                out[k] = wp.to_torch(view, requires_grad=False)
            _ = torch
        return out

    def xyz(self) -> np.ndarray:
        """(N, 3) Cartesian coordinates in the output frame [m] (converted if the frame is spherical)."""
        c = self.channels["Coordinates"].numpy()
        if self.value("coordsType", 0) == 1:
            az, el, r = np.deg2rad(c[0]), np.deg2rad(c[1]), c[2]
            return np.stack([r * np.cos(el) * np.cos(az), r * np.cos(el) * np.sin(az), r * np.sin(el)], 1)
        return c.T.copy()

    def to_las_array(self) -> np.ndarray:
        """A NumPy structured array with LAS point-record fields (x, y, z [m] float64, intensity uint16,
        return_number, number_of_returns, gps_time [s], scan_angle [deg], user_data (channel), point_source_id
        (emitter), classification (semantic class, clipped to 255))."""
        n = self.count
        xyz = self.xyz()
        ch = self.numpy()
        echo = ch.get("EchoId", np.zeros(n, np.uint8)).astype(np.uint8)
        dt = np.dtype([("x", "f8"), ("y", "f8"), ("z", "f8"), ("intensity", "u2"), ("return_number", "u1"),
                       ("number_of_returns", "u1"), ("gps_time", "f8"), ("scan_angle", "f4"), ("user_data", "u1"),
                       ("point_source_id", "u2"), ("classification", "u1")])
        out = np.zeros(n, dt)
        out["x"], out["y"], out["z"] = xyz[:, 0], xyz[:, 1], xyz[:, 2]
        if "Intensity" in ch:
            out["intensity"] = np.round(np.clip(ch["Intensity"], 0, 1) * 65535).astype(np.uint16)
        out["return_number"] = echo + 1
        if n:
            # returns per firing: group by (time, emitter)
            key = ch.get("TimeOffsetNs", np.zeros(n)).astype(np.int64) * 1_000_003 + ch.get(
                "EmitterId", np.zeros(n)).astype(np.int64)
            _, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
            out["number_of_returns"] = cnt[inv]
        off = ch.get("TimeOffsetNs", np.zeros(n, np.int64)).astype(np.int64)
        out["gps_time"] = (self.value("timestampNs", 0) + off) * 1e-9
        out["scan_angle"] = np.degrees(np.arctan2(xyz[:, 1], xyz[:, 0]))
        out["user_data"] = ch.get("ChannelId", np.zeros(n)).astype(np.uint8)
        out["point_source_id"] = ch.get("EmitterId", np.zeros(n)).astype(np.uint16)
        out["classification"] = np.clip(ch.get("SemanticId", np.zeros(n)), 0, 255).astype(np.uint8)
        return out

    def write_ply(self, path: str | os.PathLike) -> None:
        """Write a binary PLY: x, y, z (Cartesian, output frame), intensity, and the id channels present."""
        from plyfile import PlyData, PlyElement

        n = self.count
        xyz = self.xyz().astype(np.float32)
        ch = self.numpy()
        cols = [("x", "f4"), ("y", "f4"), ("z", "f4")]
        data = {"x": xyz[:, 0], "y": xyz[:, 1], "z": xyz[:, 2]}
        for name, ply, key in (("Intensity", "f4", "intensity"), ("TimeOffsetNs", "i4", "time_offset_ns"),
                               ("ChannelId", "u4", "channel"), ("EchoId", "u1", "echo"),
                               ("MaterialId", "u4", "material_id"), ("Flags", "u1", "flags")):
            if name in ch:
                cols.append((key, ply))
                data[key] = ch[name][:n]
        arr = np.zeros(n, dtype=cols)
        for k, v in data.items():
            arr[k] = v
        PlyData([PlyElement.describe(arr, "vertex")]).write(os.fspath(path))
