"""Writers of a shard's outputs: the plain folder layout (PLY + PNG + NPY + JSON per frame) and one MCAP file per shard
with Foxglove's well-known schemas.

Every file is written under a temporary name (``.<name>.partial`` in the same folder) and renamed into place with
``os.replace`` once complete, so a file with its final name is always whole. Payloads are deterministic: the same
frame gives the same bytes whatever process renders it (no wall-clock times, hosts or process ids in them).

MCAP: the container is written by the ``mcap`` package's writer; the messages are Foxglove's well-known protobuf
schemas, encoded by ``foxglove-sdk`` (which carries the schema definitions and needs no protobuf runtime). Topics of a
shard file (``log_time`` = ``publish_time`` = the frame's start time [ns] on the scene's absolute clock):

- ``/tf`` (foxglove.FrameTransform): ``world`` → ``rig`` per frame (the ego pose at the frame time); ``rig`` → each
  sensor once, at the shard's first frame (mounts are fixed within a shard).
- ``/lidar/<id>/points`` (foxglove.PointCloud): every channel of the lidar PointCloud as packed fields.
- ``/camera/<id>/image`` (foxglove.CompressedImage, PNG), ``/camera/<id>/calibration`` (foxglove.CameraCalibration),
  ``/camera/<id>/distance`` (foxglove.RawImage, 32FC1 [m]).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import threading
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------------------------------
# files


def partial_name(path: Path) -> Path:
    """The temporary name a file is written under before it is renamed to ``path``."""
    return path.with_name(f".{path.name}.partial")


def atomic_write(path: Path, data: bytes) -> int:
    """Write ``data`` to ``path`` through a temporary file of this process and thread and a rename (workers that
    write the same file at once, such as the shards of one sequence its ``rig.json``, do not share a temporary
    file); returns the size [bytes]."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.partial")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return len(data)


def to_jsonable(x: Any) -> Any:
    """NumPy arrays and scalars, tuples, enums and dataclasses → JSON types."""
    if isinstance(x, np.ndarray):
        return [to_jsonable(v) for v in x.tolist()] if x.dtype.kind in "fc" else x.tolist()
    if isinstance(x, (np.floating, float)):
        return float(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, Enum):
        return x.name
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: to_jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    return x


def param_value(v: Any) -> Any:
    """A PointCloud param as JSON: one-element arrays (the contract's scalars) as a number, others as lists."""
    a = np.asarray(v)
    if a.dtype.kind in "iufb" and a.size == 1:
        return to_jsonable(a.reshape(-1)[0])
    return to_jsonable(v)


def params_json(params: dict[str, Any]) -> dict[str, Any]:
    return {str(k): param_value(v) for k, v in params.items()}


def json_bytes(doc: Any) -> bytes:
    return (json.dumps(to_jsonable(doc), indent=1, sort_keys=False) + "\n").encode()


def pose_dict(pose: Any) -> dict[str, list[float]]:
    t, q = pose
    return {"translation": [float(v) for v in np.asarray(t).reshape(3)],
            "rotation_xyzw": [float(v) for v in np.asarray(q).reshape(4)]}


# ---------------------------------------------------------------------------------------------------------------------
# point clouds

#: PointCloud channel → the columns it becomes in the PLY and the foxglove.PointCloud (little-endian, packed).
POINT_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "Intensity": [("intensity", "<f4")],
    "Flags": [("flags", "u1")],
    "TimeOffsetNs": [("time_offset_ns", "<i4")],
    "EmitterId": [("emitter_id", "<u4")],
    "ChannelId": [("channel_id", "<u4")],
    "TickId": [("tick_id", "<u4")],
    "EchoId": [("echo_id", "u1")],
    "TickState": [("tick_state", "u1")],
    "MaterialId": [("material_id", "<u4")],
    "ObjectId": [(f"object_id_{i}", "<u4") for i in range(4)],
    "HitNormal": [("normal_x", "<f4"), ("normal_y", "<f4"), ("normal_z", "<f4")],
    "Velocity": [("velocity_x", "<f4"), ("velocity_y", "<f4"), ("velocity_z", "<f4")],
    "SemanticId": [("semantic_id", "<i4")],
}


def point_table(pc: Any) -> np.ndarray:
    """A lidar PointCloud as one packed structured array: x, y, z [m] (Cartesian, in the output frame; converted
    from spherical coordinates when the lidar outputs those, which are then kept as azimuth_deg, elevation_deg,
    distance_m), then one column per component of every other channel (:data:`POINT_COLUMNS`)."""
    n = pc.count
    ch = {k: v.numpy() for k, v in pc.channels.items()}
    spherical = param_value(pc.params.get("coordsType", 0)) == 1
    cols = [("x", "<f4"), ("y", "<f4"), ("z", "<f4")]
    if spherical:
        cols += [("azimuth_deg", "<f4"), ("elevation_deg", "<f4"), ("distance_m", "<f4")]
    present = [c for c in POINT_COLUMNS if c in ch]
    for c in present:
        cols += POINT_COLUMNS[c]
    out = np.zeros(n, np.dtype(cols))  # a packed dtype: no padding between fields
    xyz = pc.xyz().astype(np.float32) if n else np.zeros((0, 3), np.float32)
    out["x"], out["y"], out["z"] = xyz[:, 0], xyz[:, 1], xyz[:, 2]
    if spherical:
        coords = ch["Coordinates"]
        out["azimuth_deg"], out["elevation_deg"], out["distance_m"] = coords[0, :n], coords[1, :n], coords[2, :n]
    for c in present:
        a = ch[c][:n]
        names = [name for name, _ in POINT_COLUMNS[c]]
        if len(names) == 1:
            out[names[0]] = a
        else:
            for i, name in enumerate(names):
                out[name] = a[:, i]
    return out


def ply_bytes(table: np.ndarray, comments: list[str] = ()) -> bytes:
    """Binary little-endian PLY of a :func:`point_table` (one ``vertex`` element, a property per column)."""
    from plyfile import PlyData, PlyElement

    buf = io.BytesIO()
    PlyData([PlyElement.describe(table, "vertex")], byte_order="<", comments=list(comments)).write(buf)
    return buf.getvalue()


def npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------------------------------
# one rendered frame


@dataclass
class LidarFrame:
    id: str
    table: np.ndarray  # point_table
    params: dict[str, Any]  # PointCloud.params
    frame_id: str  # Foxglove frame of the points: the lidar id (SENSOR), "world" (WORLD)
    interval_s: tuple[float, float]
    timestamp_ns: int


@dataclass
class CameraFrameOut:
    id: str
    width: int
    height: int
    interval_s: tuple[float, float]
    timestamp_ns: int
    start_pose: Any  # camera-to-world at the first readout line
    end_pose: Any
    png: bytes | None = None
    distance: np.ndarray | None = None


@dataclass
class FrameOut:
    index: int
    time_s: float
    timestamp_ns: int
    ego_pose: Any  # rig-to-world at time_s
    lidars: list[LidarFrame] = field(default_factory=list)
    cameras: list[CameraFrameOut] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------------
# folder layout


class FolderWriter:
    """``<seq_dir>/frames/<k>/``: ``<lidar>.ply``, ``<camera>.png``, ``<camera>.distance.npy`` and ``frame.json``."""

    def __init__(self, root: Path, task: Any) -> None:
        self.root = root
        self.task = task

    def write_frame(self, fr: FrameOut) -> dict[str, int]:
        rel = self.task.frame_dir(fr.index)
        d = self.root / rel
        out: dict[str, int] = {}
        doc: dict[str, Any] = {
            "frame": fr.index, "time_s": fr.time_s, "timestamp_ns": fr.timestamp_ns,
            "scene": self.task.scene_name, "variant": self.task.variant,
            "ego_pose": pose_dict(fr.ego_pose), "lidars": {}, "cameras": {},
        }
        for lf in fr.lidars:
            name = f"{lf.id}.ply"
            out[f"{rel}/{name}"] = atomic_write(d / name, ply_bytes(lf.table, [
                f"wsim lidar {lf.id} frame {fr.index} of {self.task.scene_name}/{self.task.variant}",
                f"timestampNs {lf.params.get('timestampNs', 0)}", f"frame {lf.frame_id}"]))
            doc["lidars"][lf.id] = {"file": name, "points": int(len(lf.table)), "interval_s": list(lf.interval_s),
                                    "frame_id": lf.frame_id, "columns": list(lf.table.dtype.names),
                                    "params": lf.params}
        for cf in fr.cameras:
            entry: dict[str, Any] = {"width": cf.width, "height": cf.height, "interval_s": list(cf.interval_s),
                                     "start_pose": pose_dict(cf.start_pose), "end_pose": pose_dict(cf.end_pose)}
            if cf.png is not None:
                entry["color"] = f"{cf.id}.png"
                out[f"{rel}/{cf.id}.png"] = atomic_write(d / f"{cf.id}.png", cf.png)
            if cf.distance is not None:
                entry["distance"] = f"{cf.id}.distance.npy"
                out[f"{rel}/{cf.id}.distance.npy"] = atomic_write(d / f"{cf.id}.distance.npy", npy_bytes(cf.distance))
            doc["cameras"][cf.id] = entry
        out[f"{rel}/frame.json"] = atomic_write(d / "frame.json", json_bytes(doc))
        return out


# ---------------------------------------------------------------------------------------------------------------------
# MCAP


def _fg_field_type(dt: np.dtype) -> Any:
    from foxglove.messages import PackedElementFieldNumericType as T

    return {("u", 1): T.Uint8, ("i", 1): T.Int8, ("u", 2): T.Uint16, ("i", 2): T.Int16, ("u", 4): T.Uint32,
            ("i", 4): T.Int32, ("f", 4): T.Float32, ("f", 8): T.Float64}[(dt.kind, dt.itemsize)]


def _ts(ns: int) -> Any:
    from foxglove.messages import Timestamp

    return Timestamp(int(ns // 1_000_000_000), int(ns % 1_000_000_000))


class McapShardWriter:
    """One MCAP file per shard (see the module docstring for topics and schemas)."""

    def __init__(self, path: Path, compression: str = "zstd", metadata: dict[str, str] | None = None) -> None:
        from mcap.writer import LIBRARY_IDENTIFIER, CompressionType, Writer

        from .. import __version__

        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._tmp = partial_name(path)
        self._file = open(self._tmp, "wb")
        comp = {"zstd": CompressionType.ZSTD, "lz4": CompressionType.LZ4, "none": CompressionType.NONE}[compression]
        self._w = Writer(self._file, compression=comp, chunk_size=4 << 20)
        self._w.start(profile="", library=f"wsim {__version__}; {LIBRARY_IDENTIFIER}")
        if metadata:
            self._w.add_metadata("wsim", {str(k): str(v) for k, v in metadata.items()})
        self._schemas: dict[str, int] = {}
        self._channels: dict[str, int] = {}
        self._seq: dict[str, int] = {}
        self._mounts_written = False
        self.messages = 0

    def _channel(self, topic: str, cls: Any) -> int:
        if topic not in self._channels:
            schema = cls.get_schema()
            if schema.name not in self._schemas:
                self._schemas[schema.name] = self._w.register_schema(schema.name, schema.encoding, bytes(schema.data))
            self._channels[topic] = self._w.register_channel(topic, "protobuf", self._schemas[schema.name])
            self._seq[topic] = 0
        return self._channels[topic]

    def _log(self, topic: str, msg: Any, t_ns: int) -> None:
        cid = self._channel(topic, type(msg))
        self._w.add_message(cid, log_time=int(t_ns), data=msg.encode(), publish_time=int(t_ns),
                            sequence=self._seq[topic])
        self._seq[topic] += 1
        self.messages += 1

    def _transform(self, parent: str, child: str, pose: Any, t_ns: int) -> None:
        from foxglove.messages import FrameTransform, Quaternion, Vector3

        t, q = (np.asarray(pose[0], float).reshape(3), np.asarray(pose[1], float).reshape(4))
        self._log("/tf", FrameTransform(timestamp=_ts(t_ns), parent_frame_id=parent, child_frame_id=child,
                                        translation=Vector3(x=float(t[0]), y=float(t[1]), z=float(t[2])),
                                        rotation=Quaternion(x=float(q[0]), y=float(q[1]), z=float(q[2]),
                                                            w=float(q[3]))), t_ns)

    def write_frame(self, fr: FrameOut, mounts: dict[str, Any], calibrations: dict[str, dict]) -> None:
        """Log one frame. ``mounts``: sensor id → sensor-to-rig pose; ``calibrations``: camera id → the
        foxglove.CameraCalibration fields (:func:`wsim.dataset.render.foxglove_calibration`)."""
        from foxglove.messages import CameraCalibration, CompressedImage, PackedElementField, PointCloud, RawImage

        t = fr.timestamp_ns
        self._transform("world", "rig", fr.ego_pose, t)
        if not self._mounts_written:
            for sid, pose in mounts.items():
                self._transform("rig", sid, pose, t)
            self._mounts_written = True
        for lf in fr.lidars:
            names = lf.table.dtype.names
            flds = [PackedElementField(name=n, offset=int(lf.table.dtype.fields[n][1]),
                                       type=_fg_field_type(lf.table.dtype.fields[n][0])) for n in names]
            self._log(f"/lidar/{lf.id}/points",
                      PointCloud(timestamp=_ts(lf.timestamp_ns), frame_id=lf.frame_id,
                                 point_stride=int(lf.table.dtype.itemsize), fields=flds, data=lf.table.tobytes()), t)
        for cf in fr.cameras:
            cal = calibrations[cf.id]
            self._log(f"/camera/{cf.id}/calibration",
                      CameraCalibration(timestamp=_ts(cf.timestamp_ns), frame_id=cf.id, width=cf.width,
                                        height=cf.height, distortion_model=cal["distortion_model"], D=cal["D"],
                                        K=cal["K"], R=cal["R"], P=cal["P"]), t)
            if cf.png is not None:
                self._log(f"/camera/{cf.id}/image", CompressedImage(timestamp=_ts(cf.timestamp_ns), frame_id=cf.id,
                                                                    data=cf.png, format="png"), t)
            if cf.distance is not None:
                d = np.ascontiguousarray(cf.distance, dtype="<f4")
                self._log(f"/camera/{cf.id}/distance",
                          RawImage(timestamp=_ts(cf.timestamp_ns), frame_id=cf.id, width=cf.width, height=cf.height,
                                   encoding="32FC1", step=cf.width * 4, data=d.tobytes()), t)

    def close(self) -> int:
        """Finish the file and rename it into place; returns its size [bytes]."""
        self._w.finish()
        self._file.flush()
        self._file.close()
        os.replace(self._tmp, self.path)
        return self.path.stat().st_size

    def abort(self) -> None:
        try:
            self._file.close()
        finally:
            self._tmp.unlink(missing_ok=True)


__all__ = ["FolderWriter", "FrameOut", "McapShardWriter", "atomic_write", "partial_name", "point_table",
           "ply_bytes", "to_jsonable"]
