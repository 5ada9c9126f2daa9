"""NuRec-style USDZ scene artifacts: :func:`load_nurec` reads one into a :class:`~wsim.scene.scene.Scene`,
:func:`write_nurec` writes a Scene in that form (used to ship the built-in scene).

The artifact is a zip archive (read with :mod:`zipfile`, never extracted into the working directory) holding:

``metadata.yaml``
    ``scene_id`` (required), ``version_string``, ``training_date``, ``dataset_hash``, ``uuid``, ``is_resumable``,
    ``sensors.{camera_ids, lidar_ids}``, ``logger.{name, run_id, run_url}``, ``time_range.{start, end}`` [us] (the
    fields AlpaSim's ``Metadata`` requires). Every other key is kept as is (``write_nurec`` stores the rest of
    ``Scene.metadata`` there, e.g. the built-in scene's ``sensor_rig``).
``rig_trajectories.json``
    ``world_to_nre.matrix`` (4x4), ``camera_calibrations`` {unique_id: {logical_sensor_name, camera_model:
    {type, parameters}, T_sensor_rig}}, ``rig_trajectories`` [{sequence_id, T_rig_world_timestamps_us, T_rig_worlds,
    cameras_frame_timestamps_us, rig_bbox}], ``T_world_base``.
``sequence_tracks.json``
    {sequence_id: {tracks_data: {tracks_id, tracks_label_class, tracks_flags, tracks_timestamps_us, tracks_poses},
    cuboidtracks_data: {cuboids_dims}}}. ``tracks_flags`` entries are lists of flag strings (``["CONTROLLABLE"]``)
    or one ``|``-separated string; the integer 0 of older wsim files reads as no flags.
``mesh.ply``, ``mesh_ground.ply``
    Binary or ASCII PLY: vertex x, y, z (+ optional red, green, blue) and face vertex_indices (polygons are
    fan-triangulated).

Choices made where the public format leaves room (wsim's own conventions):

- **Frames.** ``mesh.ply`` / ``mesh_ground.ply`` are in the scene's local ("nre") frame. ``T_rig_worlds`` and the track
  poses are in the world frame and are mapped into the local frame with ``world_to_nre.matrix`` (identity when absent).
  ``T_world_base`` is kept in ``Scene.metadata["nurec"]`` but not applied.
- **Time.** ``Scene.time_origin_us`` = ``time_range.start``; scene seconds = (us - origin) / 1e6; the scene's
  ``time_range`` is (0, (end - start) / 1e6).
- **Rig.** The ego trajectory comes from the first entry of ``rig_trajectories``; the other entries are kept in
  ``Scene.metadata["nurec"]["other_rig_trajectories"]`` (sequence ids only). ``T_sensor_rig`` maps camera (OpenCV axes)
  to rig. In ``camera_model.parameters``, ``resolution`` [w, h] and ``shutter_type`` become the
  :class:`CameraCalibration` fields of the same meaning; the remaining entries are the calibration's ``params``.
- **Tracks.** A track pose is the local pose of the cuboid centre, (x, y, z, qx, qy, qz, qw). Each track becomes an
  :class:`Instance`; without a stored mesh its prototype is a proxy box of the cuboid size centred on the local origin
  (one prototype per track, painted steel, the track's label lowercased as semantic class). A single-timestamp track
  is a static instance, and so is a track whose poses are all equal. ``tracks_flags`` are kept per track id in
  ``Scene.metadata["nurec"]["tracks_flags"][sequence_id]`` and not interpreted.
- **Colours.** PLY vertex colours are sRGB (uchar, or float in [0, 1]); they are converted to the linear colours of
  :attr:`MeshData.colors`. ``write_nurec`` writes each vertex with the sRGB-encoded base colour of its triangle's
  material (or the mesh's own colours when it has them).
- **Default materials.** Without a sidecar, ``mesh.ply`` gets a generic material (class "unlabeled") and
  ``mesh_ground.ply`` asphalt with class "road".
- **Sidecar ``wsim_materials.json``** (written by ``write_nurec``, optional on load) keeps what the NuRec files
  cannot carry: the material table (all :class:`Material` fields), the semantic class table, the part table, the
  per-triangle part index of each PLY (run-length encoded as a flat ``[value, count, value, count, ...]`` list), the
  prototype meshes (members ``prototypes/<n>.ply`` with their own per-triangle parts), and per-track extras
  (prototype index, object id, semantic class, scales). When present, a track's stored prototype is used instead of
  the proxy box, so the geometry is the same in both forms and instances keep sharing their prototype.
- **USD layer.** When the zip holds a ``*.usda`` / ``*.usdc`` / ``*.usd`` layer, geometry comes from it through
  :func:`wsim.scene.usd.load_usd` (the archive is unpacked into a temporary directory for that); the PLY meshes are
  then ignored. Tracks whose id matches no instance name of the USD scene are added as proxies; ego trajectory and
  cameras still come from ``rig_trajectories.json``.
- **Writing** (what AlpaSim's runtime reads; the README's NuRec section maps each field to its source).
  ``mesh_ground.ply`` holds the static triangles whose part has class "road", "sidewalk" or "ground";
  ``mesh.ply`` the rest. Every instance becomes a track; track id = instance name (made unique). A moving instance
  is flagged ``["CONTROLLABLE"]`` (AlpaSim treats exactly those as dynamic), a static one ``[]`` and written with two
  samples at the start and end of the scene's time range (AlpaSim smooths every track, which needs two samples, and
  drops tracks shorter than 3 s); flags read from a NuRec file are written back as they were. Camera parameters
  use NuRec's ``principal_point`` / ``focal_length`` [x, y] lists (both forms are read). ``training_date`` is the
  scene's own or ``1970-01-01`` (wsim's scenes are not trained), ``is_resumable`` false, ``logger`` fields null,
  ``dataset_hash`` the SHA-256 of every other member. Members are written in a fixed order with fixed zip timestamps and deflate, so the same
  scene always gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import tempfile
import uuid as _uuid
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .materials import Material
from .scene import CameraCalibration, Instance, MeshData, Part, Scene, SceneError, Trajectory
from .transforms import compose_matrix, decompose_matrix

__all__ = [
    "load_nurec",
    "write_nurec",
    "read_ply_mesh",
    "ply_bytes",
    "srgb_to_linear",
    "linear_to_srgb",
    "rle_encode",
    "rle_decode",
    "GROUND_CLASSES",
    "SIDECAR",
]

SIDECAR = "wsim_materials.json"
#: ``training_date`` written for scenes that were not trained (built or converted by wsim) and carry none.
NOT_TRAINED_DATE = "1970-01-01"
GROUND_CLASSES = ("road", "sidewalk", "ground")
_USD_EXT = (".usda", ".usdc", ".usd")
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


# ---------------------------------------------------------------------------------------------------------------------
# small helpers


def srgb_to_linear(c: np.ndarray) -> np.ndarray:
    """sRGB-encoded values in [0, 1] → linear."""
    c = np.clip(np.asarray(c, dtype=np.float64), 0.0, 1.0)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def linear_to_srgb(c: np.ndarray) -> np.ndarray:
    """Linear values in [0, 1] → sRGB-encoded values in [0, 1]."""
    c = np.clip(np.asarray(c, dtype=np.float64), 0.0, 1.0)
    return np.where(c <= 0.0031308, c * 12.92, 1.055 * np.power(c, 1 / 2.4) - 0.055)


def rle_encode(values: np.ndarray) -> list[int]:
    """Run-length encode an int array as a flat ``[value, count, value, count, ...]`` list."""
    v = np.asarray(values, dtype=np.int64).ravel()
    if len(v) == 0:
        return []
    starts = np.concatenate([[0], np.nonzero(np.diff(v))[0] + 1])
    counts = np.diff(np.concatenate([starts, [len(v)]]))
    out = np.empty(2 * len(starts), dtype=np.int64)
    out[0::2] = v[starts]
    out[1::2] = counts
    return [int(x) for x in out]


def rle_decode(rle: list[int]) -> np.ndarray:
    """Inverse of :func:`rle_encode`."""
    a = np.asarray(rle, dtype=np.int64)
    if len(a) % 2:
        raise ValueError("run-length list has an odd number of entries")
    if len(a) == 0:
        return np.zeros(0, dtype=np.int32)
    if np.any(a[1::2] < 0):
        raise ValueError("negative run length")
    return np.repeat(a[0::2], a[1::2]).astype(np.int32)


def _plain(obj: Any) -> Any:
    """Numpy scalars/arrays and tuples → plain Python (for JSON/YAML)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _plain(obj.tolist())
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


# ---------------------------------------------------------------------------------------------------------------------
# PLY


def ply_bytes(points: np.ndarray, indices: np.ndarray, colors_u8: np.ndarray | None = None) -> bytes:
    """A binary little-endian PLY (float x, y, z, optional uchar red/green/blue; uchar+int face vertex_indices)."""
    points = np.asarray(points, dtype="<f4").reshape(-1, 3)
    indices = np.asarray(indices, dtype="<i4").reshape(-1, 3)
    head = ["ply", "format binary_little_endian 1.0", f"element vertex {len(points)}",
            "property float x", "property float y", "property float z"]
    vfields = [("x", "<f4"), ("y", "<f4"), ("z", "<f4")]
    if colors_u8 is not None:
        head += ["property uchar red", "property uchar green", "property uchar blue"]
        vfields += [("red", "u1"), ("green", "u1"), ("blue", "u1")]
    head += [f"element face {len(indices)}", "property list uchar int vertex_indices", "end_header"]
    v = np.empty(len(points), dtype=vfields)
    v["x"], v["y"], v["z"] = points[:, 0], points[:, 1], points[:, 2]
    if colors_u8 is not None:
        c = np.asarray(colors_u8, dtype=np.uint8).reshape(-1, 3)
        v["red"], v["green"], v["blue"] = c[:, 0], c[:, 1], c[:, 2]
    f = np.empty(len(indices), dtype=[("n", "u1"), ("i", "<i4", (3,))])
    f["n"] = 3
    f["i"] = indices
    return ("\n".join(head) + "\n").encode("ascii") + v.tobytes() + f.tobytes()


def read_ply_mesh(data: bytes, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Parse PLY bytes → (points (N,3) float32, triangles (M,3) int32, linear colours (N,3) float32 or None).

    Raises :class:`SceneError` naming ``where`` for unparsable data, NaN points or out-of-range face indices.
    """
    # plyfile reads binary triangle lists fast only from a real (memory-mapped) file: go through a temporary file.
    with tempfile.TemporaryDirectory(prefix="wsim_ply_") as tmp:
        fname = Path(tmp) / "mesh.ply"
        fname.write_bytes(data)
        with open(fname, "rb") as fh:
            return _read_ply_stream(fh, where)


def _read_ply_stream(fh, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    from plyfile import PlyData

    try:
        try:
            ply = PlyData.read(fh, mmap="c", known_list_len={"face": {"vertex_indices": 3}})
        except Exception:  # noqa: BLE001 - not all faces are triangles: the general reader
            fh.seek(0)
            ply = PlyData.read(fh)
    except Exception as e:  # noqa: BLE001 - plyfile raises several types
        raise SceneError(f"{where}: not a readable PLY file ({e})") from e
    names = [el.name for el in ply.elements]
    if "vertex" not in names:
        raise SceneError(f"{where}: PLY has no 'vertex' element")
    vert = ply["vertex"].data
    vprops = vert.dtype.names or ()
    for axis in "xyz":
        if axis not in vprops:
            raise SceneError(f"{where}: PLY vertex element has no '{axis}' property")
    points = np.stack([np.array(vert[a], dtype=np.float64) for a in "xyz"], axis=1)
    bad = ~np.isfinite(points).all(axis=1)
    if np.any(bad):
        raise SceneError(f"{where}: non-finite (NaN/inf) vertex at index {int(np.argmax(bad))}")
    colors = None
    if all(c in vprops for c in ("red", "green", "blue")):
        raw = np.stack([np.array(vert[c]) for c in ("red", "green", "blue")], axis=1)
        if np.issubdtype(raw.dtype, np.integer):
            enc = raw.astype(np.float64) / 255.0
        else:
            enc = raw.astype(np.float64)
        colors = srgb_to_linear(enc).astype(np.float32)
    tris = np.zeros((0, 3), dtype=np.int64)
    if "face" in names:
        fdata = ply["face"].data
        fprops = fdata.dtype.names or ()
        key = "vertex_indices" if "vertex_indices" in fprops else ("vertex_index" if "vertex_index" in fprops else None)
        if key is None:
            raise SceneError(f"{where}: PLY face element has no 'vertex_indices' property")
        col = fdata[key]
        if len(col) and col.dtype != object and col.ndim == 2 and col.shape[1] == 3:
            tris = np.array(col, dtype=np.int64)  # a copy: the source may be memory-mapped
        elif len(col):
            polys = [np.asarray(f, dtype=np.int64).ravel() for f in col]
            out = []
            for fi, p in enumerate(polys):
                if len(p) < 3:
                    raise SceneError(f"{where}: face {fi} has fewer than 3 vertices")
                for k in range(1, len(p) - 1):
                    out.append((p[0], p[k], p[k + 1]))
            tris = np.asarray(out, dtype=np.int64).reshape(-1, 3)
    if len(tris):
        lo, hi = int(tris.min()), int(tris.max())
        if lo < 0 or hi >= len(points):
            face = int(np.argmax(((tris < 0) | (tris >= len(points))).any(axis=1)))
            raise SceneError(
                f"{where}: face {face} vertex index out of range [0, {len(points)}) (min {lo}, max {hi})"
            )
    return points.astype(np.float32), tris.astype(np.int32), colors


# ---------------------------------------------------------------------------------------------------------------------
# loading


class _Archive:
    def __init__(self, path: Path):
        self.path = path
        if not path.exists():
            raise SceneError(f"{path}: no such file")
        if path.is_dir():
            raise SceneError(f"{path}: is a directory, not a NuRec USDZ (zip) file")
        try:
            self.zf = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as e:
            raise SceneError(f"{path}: not a zip archive (NuRec USDZ expected): {e}") from e
        self.names = self.zf.namelist()
        # Members may sit in a top-level folder; map base names → full member names (first one wins).
        self.by_base: dict[str, str] = {}
        for n in self.names:
            self.by_base.setdefault(n.rsplit("/", 1)[-1], n)

    def find(self, name: str) -> str | None:
        if name in self.names:
            return name
        return self.by_base.get(name)

    def read(self, member: str) -> bytes:
        try:
            return self.zf.read(member)
        except (zipfile.BadZipFile, KeyError, OSError, RuntimeError) as e:
            raise SceneError(f"{self.path}: cannot read member {member}: {e}") from e

    def json(self, name: str, required: bool = False) -> Any:
        m = self.find(name)
        if m is None:
            if required:
                raise SceneError(f"{self.path}: missing member {name}")
            return None
        try:
            return json.loads(self.read(m).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SceneError(f"{self.path}: member {name}: malformed JSON ({e})") from e


def _field(obj: Any, key: str, where: str, kind: type | tuple = object) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise SceneError(f"{where}: missing field '{key}'")
    val = obj[key]
    if not isinstance(val, kind):
        raise SceneError(f"{where}: field '{key}' has the wrong type ({type(val).__name__})")
    return val


def _matrix(val: Any, where: str) -> np.ndarray:
    try:
        m = np.asarray(val, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise SceneError(f"{where}: not a 4x4 matrix") from e
    if m.shape != (4, 4) or not np.all(np.isfinite(m)):
        raise SceneError(f"{where}: not a finite 4x4 matrix (shape {m.shape})")
    return m


def _decompose(m: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        t, q, _s = decompose_matrix(m)
    except ValueError as e:
        raise SceneError(f"{where}: {e}") from e
    return t, q


def load_nurec(path: str | Path) -> Scene:
    """Load a NuRec-style USDZ scene artifact (see the module docstring for the layout and wsim's choices).

    Raises:
        SceneError: naming the file and the member/field for a missing file, a non-zip file, a missing metadata.yaml
            or scene_id, malformed JSON/YAML, a PLY with out-of-range face indices or NaN vertices, bad tables.
    """
    import yaml

    path = Path(path)
    ar = _Archive(path)
    src = str(path)

    # ---- metadata.yaml
    mname = ar.find("metadata.yaml")
    if mname is None:
        raise SceneError(f"{src}: missing member metadata.yaml")
    try:
        meta = yaml.safe_load(ar.read(mname).decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise SceneError(f"{src}: member metadata.yaml: malformed YAML ({e})") from e
    if not isinstance(meta, dict):
        raise SceneError(f"{src}: member metadata.yaml: expected a mapping")
    scene_id = meta.get("scene_id")
    if not scene_id:
        raise SceneError(f"{src}: member metadata.yaml: missing field 'scene_id'")
    tr = meta.get("time_range") or {}
    try:
        t_start = int(tr["start"]) if "start" in tr else None
        t_end = int(tr["end"]) if "end" in tr else None
    except (TypeError, ValueError) as e:
        raise SceneError(f"{src}: member metadata.yaml: bad field 'time_range' ({e})") from e

    rig = ar.json("rig_trajectories.json")
    tracks_doc = ar.json("sequence_tracks.json")
    sidecar = ar.json(SIDECAR)

    # Time origin: metadata start, else the earliest rig timestamp, else 0.
    origin = t_start
    if origin is None and isinstance(rig, dict):
        try:
            origin = int(rig["rig_trajectories"][0]["T_rig_world_timestamps_us"][0])
        except (KeyError, IndexError, TypeError, ValueError):
            origin = None
    origin = int(origin or 0)

    def sec(us: Any) -> np.ndarray:
        return (np.asarray(us, dtype=np.int64) - origin).astype(np.float64) / 1e6

    nurec_meta: dict[str, Any] = {}
    scene: Scene
    side: dict[str, Any] | None = None
    usd_members = [n for n in ar.names if n.lower().endswith(_USD_EXT) and not n.endswith("/")]
    if usd_members:
        scene = _load_usd_layer(ar, usd_members[0])
        nurec_meta["usd_layer"] = usd_members[0]
    else:
        scene, side = _load_ply_geometry(ar, sidecar)

    scene.scene_id = str(scene_id)
    scene.source = src
    scene.time_origin_us = origin
    if t_start is not None and t_end is not None:
        scene.time_range = (0.0, (t_end - t_start) / 1e6)
    scene.metadata = dict(meta)

    # ---- rig_trajectories.json
    world_to_nre = np.eye(4)
    if rig is not None:
        rwhere = f"{src}: member rig_trajectories.json"
        if not isinstance(rig, dict):
            raise SceneError(f"{rwhere}: expected a JSON object")
        if "world_to_nre" in rig:
            w = rig["world_to_nre"]
            world_to_nre = _matrix(w.get("matrix") if isinstance(w, dict) else w, f"{rwhere}: world_to_nre.matrix")
        nurec_meta["world_to_nre"] = world_to_nre.tolist()
        if "T_world_base" in rig:
            nurec_meta["T_world_base"] = rig["T_world_base"]
        cals = rig.get("camera_calibrations") or {}
        if not isinstance(cals, dict):
            raise SceneError(f"{rwhere}: field 'camera_calibrations' must be an object")
        for uid, cal in cals.items():
            cw = f"{rwhere}: camera_calibrations.{uid}"
            cam = _parse_camera(uid, cal, cw)
            scene.cameras[cam.logical_id] = cam
        trajs = rig.get("rig_trajectories") or []
        if not isinstance(trajs, list):
            raise SceneError(f"{rwhere}: field 'rig_trajectories' must be a list")
        if trajs:
            tw = f"{rwhere}: rig_trajectories[0]"
            t0 = trajs[0]
            ts = _field(t0, "T_rig_world_timestamps_us", tw, list)
            mats = _field(t0, "T_rig_worlds", tw, list)
            if len(ts) != len(mats) or not ts:
                raise SceneError(f"{tw}: T_rig_world_timestamps_us ({len(ts)}) and T_rig_worlds ({len(mats)}) "
                                 "must have the same non-zero length")
            times = sec(ts)
            if np.any(np.diff(times) <= 0):
                raise SceneError(f"{tw}: T_rig_world_timestamps_us must be strictly increasing")
            trans, rots = [], []
            for k, m in enumerate(mats):
                t, q = _decompose(world_to_nre @ _matrix(m, f"{tw}: T_rig_worlds[{k}]"), f"{tw}: T_rig_worlds[{k}]")
                trans.append(t)
                rots.append(q)
            scene.ego_trajectory = Trajectory(times, np.array(trans), _continuous_quats(np.array(rots)))
            nurec_meta["sequence_id"] = t0.get("sequence_id", "")
            nurec_meta["rig_bbox"] = t0.get("rig_bbox")
            nurec_meta["cameras_frame_timestamps_us"] = t0.get("cameras_frame_timestamps_us", {})
            if t_start is None or t_end is None:
                scene.time_range = (float(times[0]), float(times[-1]))
        if len(trajs) > 1:
            nurec_meta["other_rig_trajectories"] = [t.get("sequence_id", "") for t in trajs[1:] if isinstance(t, dict)]

    # ---- sequence_tracks.json
    if tracks_doc is not None:
        _add_tracks(scene, ar, tracks_doc, side, world_to_nre, sec, nurec_meta)

    scene.metadata["nurec"] = nurec_meta
    scene.validate()
    return scene


def _continuous_quats(q: np.ndarray) -> np.ndarray:
    """Flip signs so consecutive quaternions lie in the same hemisphere."""
    q = q.copy()
    for i in range(1, len(q)):
        if np.dot(q[i], q[i - 1]) < 0:
            q[i] = -q[i]
    return q


def _parse_camera(uid: str, cal: Any, where: str) -> CameraCalibration:
    if not isinstance(cal, dict):
        raise SceneError(f"{where}: expected an object")
    logical = _field(cal, "logical_sensor_name", where, str)
    model = _field(cal, "camera_model", where, dict)
    mtype = str(_field(model, "type", f"{where}.camera_model", str)).lower()
    aliases = {"ftheta": "ftheta", "f_theta": "ftheta", "opencv_pinhole": "opencv_pinhole", "pinhole": "opencv_pinhole",
               "opencv_fisheye": "opencv_fisheye", "fisheye": "opencv_fisheye"}
    if mtype not in aliases:
        raise SceneError(f"{where}.camera_model: unknown type {mtype!r} (ftheta, opencv_pinhole, opencv_fisheye)")
    params = dict(_field(model, "parameters", f"{where}.camera_model", dict))
    for pair in ("principal_point", "focal_length"):  # NuRec's [x, y] lists → the CameraSpec's _x / _y fields
        if pair in params:
            xy = params.pop(pair)
            if not (isinstance(xy, (list, tuple)) and len(xy) == 2 and all(_is_number(v) for v in xy)):
                raise SceneError(f"{where}.camera_model.parameters: field '{pair}' must be [x, y] numbers, got {xy!r}")
            params[f"{pair}_x"], params[f"{pair}_y"] = float(xy[0]), float(xy[1])
    res = params.pop("resolution", None)
    if res is None and "resolution_w" in params:
        res = [params.pop("resolution_w"), params.pop("resolution_h", 0)]
    try:
        resolution = (int(res[0]), int(res[1]))
    except (TypeError, ValueError, IndexError) as e:
        raise SceneError(f"{where}.camera_model.parameters: missing or bad field 'resolution' [w, h]") from e
    if resolution[0] <= 0 or resolution[1] <= 0:
        raise SceneError(f"{where}.camera_model.parameters: field 'resolution' must be positive, got {list(res)}")
    shutter = str(params.pop("shutter_type", cal.get("shutter_type", "ROLLING_TOP_TO_BOTTOM")))
    m = _matrix(_field(cal, "T_sensor_rig", where), f"{where}: T_sensor_rig")
    t, q = _decompose(m, f"{where}: T_sensor_rig")
    return CameraCalibration(str(logical), aliases[mtype], params, resolution, (t, q), shutter, str(uid))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _track_flags(flags: Any, where: str) -> list[str]:
    """One track's ``tracks_flags`` entry as a list of flag strings. NuRec and AlpaSim write a list of strings
    (``["CONTROLLABLE"]``) or one string (``"DYNAMIC|CONTROLLABLE"``); wsim before the AlpaSim schema wrote 0."""
    if isinstance(flags, str):
        return [f for f in flags.replace(",", "|").split("|") if f and f != "NONE"]
    if isinstance(flags, list) and all(isinstance(f, str) for f in flags):
        return [f for f in flags if f != "NONE"]
    if _is_number(flags) and flags == 0:
        return []
    raise SceneError(f"{where}: tracks_flags entry must be a list of flag strings, got {flags!r}")


def _box_mesh(size: np.ndarray, part: int, name: str) -> MeshData:
    sx, sy, sz = (np.asarray(size, dtype=np.float64) / 2).tolist()
    p = np.array([[x, y, z] for z in (-sz, sz) for y in (-sy, sy) for x in (-sx, sx)])
    f = np.array([[0, 2, 1], [1, 2, 3], [4, 5, 6], [5, 7, 6], [0, 1, 4], [1, 5, 4],
                  [2, 6, 3], [3, 6, 7], [0, 4, 2], [2, 4, 6], [1, 3, 5], [3, 7, 5]])
    return MeshData(p, f, np.full(len(f), part), name=name)


def _load_ply_geometry(ar: _Archive, sidecar: Any) -> tuple[Scene, dict[str, Any] | None]:
    src = str(ar.path)
    side = _parse_sidecar(sidecar, src) if sidecar is not None else None
    scene = Scene(static=MeshData(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0), name="static"))
    if side is not None:
        scene.materials, scene.parts, scene.semantic_classes = side["materials"], side["parts"], side["classes"]
    meshes = []
    found_any = False
    for member, default in (("mesh.ply", "mesh"), ("mesh_ground.ply", "ground")):
        m = ar.find(member)
        if m is None:
            continue
        found_any = True
        pts, tris, cols = read_ply_mesh(ar.read(m), f"{src}: member {member}")
        if side is not None and member in side["meshes"]:
            tri_part = side["meshes"][member]
            if len(tri_part) != len(tris):
                raise SceneError(f"{src}: member {SIDECAR}: {member} has {len(tris)} triangles but the part table "
                                 f"lists {len(tri_part)}")
        else:
            if default == "ground":
                mat = scene.add_material(Material.from_labels("nurec/asphalt", "asphalt", base_color=(0.05,) * 3))
                cls = scene.semantic_class_index("road")
            else:
                mat = scene.add_material(Material.from_labels("nurec/generic", "none", base_color=(0.5, 0.5, 0.5)))
                cls = 0
            part = scene.add_part(Part(f"/{member}", mat, cls, object_id=len(scene.parts)))
            tri_part = np.full(len(tris), part, dtype=np.int32)
        meshes.append(MeshData(pts, tris, tri_part, cols, name=member))
    if not found_any:
        raise SceneError(f"{src}: missing member mesh.ply (and mesh_ground.ply); no geometry and no USD layer")
    if any(m.colors is not None for m in meshes):  # keep colours: fill a colourless PLY from its materials
        for m in meshes:
            if m.colors is None:
                m.colors = _material_vertex_colors(scene, m).astype(np.float32)
    static = MeshData.concatenate(meshes, name="static")
    static.validate(f"{src}: static geometry")
    scene.static = static
    if side is not None:
        protos = []
        for i, pr in enumerate(side["prototypes"]):
            member = pr["member"]
            mm = ar.find(member) if member in ar.names else None
            if mm is None:
                raise SceneError(f"{src}: member {SIDECAR}: prototype {i} refers to missing member {member}")
            pts, tris, cols = read_ply_mesh(ar.read(mm), f"{src}: member {member}")
            if len(pr["tri_part"]) != len(tris):
                raise SceneError(f"{src}: member {SIDECAR}: {member} has {len(tris)} triangles but the part table "
                                 f"lists {len(pr['tri_part'])}")
            protos.append(MeshData(pts, tris, pr["tri_part"], cols, name=pr.get("name", member)))
        scene.prototypes = protos
    return scene, side


def _parse_sidecar(doc: Any, src: str) -> dict[str, Any]:
    where = f"{src}: member {SIDECAR}"
    if not isinstance(doc, dict):
        raise SceneError(f"{where}: expected a JSON object")
    try:
        materials = []
        for m in doc["materials"]:
            materials.append(Material(str(m["name"]), tuple(float(x) for x in m["base_color"]), int(m["material_id"]),
                                      float(m["reflectance"]), float(m["transmittance"]), m.get("texture")))
        classes = [str(c) for c in doc["semantic_classes"]]
        parts = [Part(str(p["name"]), int(p["material"]), int(p["semantic_class"]), int(p.get("object_id", 0)))
                 for p in doc["parts"]]
        meshes = {k: rle_decode(v["tri_part"]) for k, v in doc.get("meshes", {}).items()}
        prototypes = [dict(member=str(p["member"]), name=str(p.get("name", "")), tri_part=rle_decode(p["tri_part"]))
                      for p in doc.get("prototypes", [])]
        tracks = dict(doc.get("tracks", {}))
    except (KeyError, TypeError, ValueError) as e:
        raise SceneError(f"{where}: malformed table ({type(e).__name__}: {e})") from e
    if not materials or not parts or not classes:
        raise SceneError(f"{where}: materials, parts and semantic_classes must not be empty")
    for arr in [*meshes.values(), *(p["tri_part"] for p in prototypes)]:
        if len(arr) and (arr.min() < 0 or arr.max() >= len(parts)):
            raise SceneError(f"{where}: per-triangle part index out of range [0, {len(parts)})")
    return dict(materials=materials, classes=classes, parts=parts, meshes=meshes, prototypes=prototypes, tracks=tracks)


def _load_usd_layer(ar: _Archive, member: str) -> Scene:
    from .usd import load_usd  # lazy: pxr is only needed for artifacts that carry a USD layer

    with tempfile.TemporaryDirectory(prefix="wsim_nurec_") as tmp:
        root = Path(tmp).resolve()
        for n in ar.names:
            if n.endswith("/"):
                continue
            dest = (root / n).resolve()
            if root not in dest.parents:  # refuse members that would escape the temporary directory
                raise SceneError(f"{ar.path}: member {n}: unsafe path")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(ar.read(n))
        try:
            scene = load_usd(root / member)
        except SceneError as e:
            raise SceneError(f"{ar.path}: member {member}: {e}") from e
    return scene


def _add_tracks(scene: Scene, ar: _Archive, doc: Any, side: dict[str, Any] | None, world_to_nre: np.ndarray, sec,
                nurec_meta: dict[str, Any]) -> None:
    src = str(ar.path)
    where = f"{src}: member sequence_tracks.json"
    if not isinstance(doc, dict):
        raise SceneError(f"{where}: expected a JSON object keyed by sequence_id")
    side_tracks = side["tracks"] if side else {}
    existing = {i.name for i in scene.instances}
    next_oid = max([p.object_id for p in scene.parts] + [i.object_id for i in scene.instances] + [0]) + 1
    steel = None
    flags_meta: dict[str, Any] = {}
    for seq_id, seq in doc.items():
        sw = f"{where}: {seq_id}"
        td = _field(seq, "tracks_data", sw, dict)
        ids = _field(td, "tracks_id", f"{sw}.tracks_data", list)
        n = len(ids)
        labels = td.get("tracks_label_class", [""] * n)
        stamps = _field(td, "tracks_timestamps_us", f"{sw}.tracks_data", list)
        poses = _field(td, "tracks_poses", f"{sw}.tracks_data", list)
        dims = ((seq.get("cuboidtracks_data") or {}).get("cuboids_dims")) or [[1.0, 1.0, 1.0]] * n
        for name, arr in (("tracks_label_class", labels), ("tracks_timestamps_us", stamps), ("tracks_poses", poses),
                          ("cuboidtracks_data.cuboids_dims", dims)):
            if not isinstance(arr, list) or len(arr) != n:
                raise SceneError(f"{sw}: field '{name}' must list one entry per track ({n})")
        flags = td.get("tracks_flags", [[]] * n)
        if not isinstance(flags, list) or len(flags) != n:
            raise SceneError(f"{sw}: field 'tracks_flags' must list one entry per track ({n})")
        flags_meta[str(seq_id)] = {str(ids[k]): _track_flags(flags[k], f"{sw}: track {ids[k]}") for k in range(n)}
        for k in range(n):
            tid = str(ids[k])
            tw = f"{sw}: track {tid}"
            try:
                times = sec(stamps[k])
                pose = np.asarray(poses[k], dtype=np.float64).reshape(-1, 7)
                dim = np.asarray(dims[k], dtype=np.float64).reshape(3)
            except (TypeError, ValueError) as e:
                raise SceneError(f"{tw}: malformed timestamps/poses/dims ({e})") from e
            if len(times) == 0 or len(pose) != len(times):
                raise SceneError(f"{tw}: {len(times)} timestamps but {len(pose)} poses")
            if not np.all(np.isfinite(pose)) or not np.all(np.isfinite(dim)):
                raise SceneError(f"{tw}: non-finite pose or cuboid dims")
            if np.any(np.diff(times) <= 0):
                raise SceneError(f"{tw}: timestamps must be strictly increasing")
            if len(times) > 1 and np.all(pose == pose[:1]):
                times, pose = times[:1], pose[:1]  # a static track sampled at both ends of the scene: one key
            if tid in existing:
                continue  # the USD layer already has this object
            if np.any(np.linalg.norm(pose[:, 3:], axis=1) < 1e-9):
                raise SceneError(f"{tw}: zero quaternion")
            if np.array_equal(world_to_nre, np.eye(4)):
                trans, rots = pose[:, :3], pose[:, 3:] / np.linalg.norm(pose[:, 3:], axis=1, keepdims=True)
            else:
                trans, rots = [], []
                for t, q in zip(pose[:, :3], pose[:, 3:]):
                    t2, q2 = _decompose(world_to_nre @ compose_matrix(t, q / np.linalg.norm(q)), tw)
                    trans.append(t2)
                    rots.append(q2)
            rots = _continuous_quats(np.array(rots))
            extra = side_tracks.get(tid, {}) if isinstance(side_tracks, dict) else {}
            label = str(extra.get("semantic_class", labels[k] or "")).lower()
            cls = scene.semantic_class_index(label)
            scales = None
            if "scales" in extra:
                scales = np.asarray(extra["scales"], dtype=np.float64).reshape(len(times), 3)
            if "prototype" in extra and 0 <= int(extra["prototype"]) < len(scene.prototypes):
                proto = int(extra["prototype"])
                oid = int(extra.get("object_id", next_oid))
            else:
                if steel is None:
                    steel = scene.add_material(Material.from_labels("nurec/painted_steel", "steel", "paint",
                                                                    base_color=(0.3, 0.3, 0.32)))
                oid = int(extra.get("object_id", next_oid))
                part = scene.add_part(Part(f"/tracks/{tid}/proxy", steel, cls, oid))
                scene.prototypes.append(_box_mesh(dim, part, f"/tracks/{tid}/proxy"))
                proto = len(scene.prototypes) - 1
            next_oid = max(next_oid, oid) + 1
            try:
                inst = Instance(proto, times, np.array(trans), rots, scales, object_id=oid, name=tid,
                                semantic_class=cls, cuboid=dim)
            except SceneError as e:
                raise SceneError(f"{tw}: {e}") from e
            scene.instances.append(inst)
    nurec_meta["tracks_flags"] = flags_meta


# ---------------------------------------------------------------------------------------------------------------------
# writing


def _zip_write(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    info.create_system = 3
    zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)


def _material_vertex_colors(scene: Scene, mesh: MeshData) -> np.ndarray:
    """Linear colour per vertex from the base colour of its triangles' material (the last triangle wins)."""
    mat_col = np.array([m.base_color for m in scene.materials], dtype=np.float64).reshape(-1, 3)
    part_mat = np.array([p.material for p in scene.parts], dtype=np.int64)
    tri_col = mat_col[part_mat[mesh.tri_part]] if len(mesh.tri_part) else np.zeros((0, 3))
    lin = np.full((len(mesh.points), 3), 0.5)
    lin[mesh.indices.reshape(-1)] = np.repeat(tri_col, 3, axis=0)
    return lin


def _vertex_colors_u8(scene: Scene, mesh: MeshData) -> np.ndarray:
    """uchar sRGB colours per vertex: the mesh's own colours, else its triangles' material base colours."""
    lin = np.asarray(mesh.colors, dtype=np.float64) if mesh.colors is not None else _material_vertex_colors(scene, mesh)
    return np.round(linear_to_srgb(lin) * 255.0).astype(np.uint8)


def _submesh(mesh: MeshData, tri_mask: np.ndarray) -> MeshData:
    idx = mesh.indices[tri_mask]
    used = np.unique(idx)
    remap = np.full(len(mesh.points), -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    return MeshData(mesh.points[used], remap[idx], mesh.tri_part[tri_mask],
                    None if mesh.colors is None else mesh.colors[used], name=mesh.name)


def _unique_names(names: list[str]) -> list[str]:
    out, seen = [], set()
    for i, n in enumerate(names):
        n = n or f"track_{i}"
        base, k = n, 1
        while n in seen:
            n, k = f"{base}_{k}", k + 1
        seen.add(n)
        out.append(n)
    return out


def write_nurec(
    scene: Scene, path: str | Path, *, version_string: str = "wsim-1", sequence_id: str | None = None
) -> None:
    """Write ``scene`` as a NuRec-style USDZ (zip) at ``path`` (layout and choices: module docstring).

    The output is deterministic: the same scene gives a byte-identical file.

    Args:
        scene: The scene to write (static geometry, instances, ego trajectory, cameras, metadata).
        path: Output file.
        version_string: metadata.yaml ``version_string``.
        sequence_id: Sequence id of the rig trajectory and the tracks (default: the one the scene was loaded with,
            else the scene id).
    """
    import yaml

    path = Path(path)
    nmeta = dict(scene.metadata.get("nurec") or {})
    seq = sequence_id or nmeta.get("sequence_id") or scene.scene_id or "sequence"
    origin = int(scene.time_origin_us)

    def us(t: float) -> int:
        return origin + int(round(float(t) * 1e6))

    members: list[tuple[str, bytes]] = []

    # ---- static geometry → mesh.ply / mesh_ground.ply
    classes = scene.semantic_classes
    ground_part = np.array([0 <= p.semantic_class < len(classes) and classes[p.semantic_class] in GROUND_CLASSES
                            for p in scene.parts], dtype=bool)
    st = scene.static
    is_ground = ground_part[st.tri_part] if len(st.tri_part) else np.zeros(0, dtype=bool)
    mesh_main, mesh_ground = _submesh(st, ~is_ground), _submesh(st, is_ground)
    members.append(("mesh.ply", ply_bytes(mesh_main.points, mesh_main.indices, _vertex_colors_u8(scene, mesh_main))))
    members.append(("mesh_ground.ply",
                    ply_bytes(mesh_ground.points, mesh_ground.indices, _vertex_colors_u8(scene, mesh_ground))))

    # ---- tracks (every instance)
    track_ids = _unique_names([i.name for i in scene.instances])
    t0, t1 = scene.time_range
    if scene.ego_trajectory is not None and t1 <= t0:
        t0, t1 = float(scene.ego_trajectory.times[0]), float(scene.ego_trajectory.times[-1])
    old_flags = nmeta.get("tracks_flags", {}).get(seq, {}) if isinstance(nmeta.get("tracks_flags"), dict) else {}
    tr_labels, tr_stamps, tr_poses, tr_dims, tr_flags, tr_extra = [], [], [], [], [], {}
    for inst, tid in zip(scene.instances, track_ids):
        proto = scene.prototypes[inst.prototype]
        if inst.semantic_class > 0:
            label = classes[inst.semantic_class]
        else:
            pc = [scene.parts[p].semantic_class for p in np.unique(proto.tri_part)] if proto.num_triangles else []
            pc = [c for c in pc if c > 0]
            label = classes[pc[0]] if pc else "unknown"
        if inst.cuboid is not None:
            dim = np.asarray(inst.cuboid, dtype=np.float64)
        elif len(proto.points):
            dim = (proto.points.max(axis=0) - proto.points.min(axis=0)).astype(np.float64) * np.abs(inst.scales[0])
        else:
            dim = np.ones(3)
        tr_labels.append(label)
        times, poses = inst.times, np.concatenate([inst.translations, inst.rotations], axis=1)
        if len(times) == 1:  # AlpaSim smooths every track: a static one is written at both ends of the scene
            times = np.array([t0, max(t1, t0 + 1e-6)])
            poses = np.repeat(poses, len(times), axis=0)
        tr_stamps.append([us(t) for t in times])
        tr_poses.append(poses.tolist())
        flags = old_flags.get(tid) if isinstance(old_flags, dict) else None
        if not (isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
            flags = ["CONTROLLABLE"] if inst.is_moving else []
        tr_flags.append(list(flags))
        tr_dims.append([float(x) for x in dim])
        extra: dict[str, Any] = {"prototype": int(inst.prototype), "object_id": int(inst.object_id),
                                 "semantic_class": label if inst.semantic_class > 0 else ""}
        if not np.allclose(inst.scales, 1.0):
            extra["scales"] = inst.scales.tolist()
        tr_extra[tid] = extra
    tracks_doc = {seq: {
        "tracks_data": {"tracks_id": track_ids, "tracks_label_class": tr_labels, "tracks_flags": tr_flags,
                        "tracks_timestamps_us": tr_stamps, "tracks_poses": tr_poses},
        "cuboidtracks_data": {"cuboids_dims": tr_dims},
    }}

    # ---- rig trajectories and cameras
    cams_doc: dict[str, Any] = {}
    for logical, cal in scene.cameras.items():
        uid = cal.unique_id or logical
        params = dict(_plain(cal.params))
        for pair in ("principal_point", "focal_length"):
            if f"{pair}_x" in params and f"{pair}_y" in params:
                params[pair] = [float(params.pop(f"{pair}_x")), float(params.pop(f"{pair}_y"))]
        params["resolution"] = [int(cal.resolution[0]), int(cal.resolution[1])]
        params["shutter_type"] = cal.shutter_type
        cams_doc[uid] = {"logical_sensor_name": cal.logical_id or logical,
                         "camera_model": {"type": cal.model, "parameters": params},
                         "T_sensor_rig": compose_matrix(*cal.camera_to_rig).tolist()}
    rig_entries = []
    if scene.ego_trajectory is not None:
        eg = scene.ego_trajectory
        frames = nmeta.get("cameras_frame_timestamps_us") or {}
        if not frames:
            for uid, c in cams_doc.items():
                rolling = c["camera_model"]["parameters"]["shutter_type"] not in ("GLOBAL", "UNKNOWN")
                period, exposure = 33_333, (30_000 if rolling else 1_000)
                n = int(math.floor((t1 - t0) * 1e6 - exposure) // period) + 1 if t1 > t0 else 0
                frames[uid] = [[us(t0) + k * period, us(t0) + k * period + exposure] for k in range(max(n, 0))]
        rig_entries.append({
            "sequence_id": seq,
            "T_rig_world_timestamps_us": [us(t) for t in eg.times],
            "T_rig_worlds": [compose_matrix(t, q).tolist() for t, q in zip(eg.translations, eg.rotations)],
            "cameras_frame_timestamps_us": frames,
            "rig_bbox": nmeta.get("rig_bbox") or {"centroid": [1.4, 0.0, 0.75], "dim": [4.8, 2.0, 1.5],
                                                  "rot": [0.0, 0.0, 0.0]},
        })
    rig_doc = {
        "world_to_nre": {"matrix": np.eye(4).tolist()},
        "camera_calibrations": cams_doc,
        "rig_trajectories": rig_entries,
        "T_world_base": nmeta.get("T_world_base") or np.eye(4).tolist(),
    }

    # ---- metadata.yaml
    meta = {k: v for k, v in scene.metadata.items() if k != "nurec"}
    lidar_ids = list(meta.get("sensors", {}).get("lidar_ids", [])) if isinstance(meta.get("sensors"), dict) else []
    if not lidar_ids and isinstance(meta.get("sensor_rig"), dict):
        lidar_ids = list((meta["sensor_rig"].get("lidars") or {}).keys())
    logger = meta.get("logger") if isinstance(meta.get("logger"), dict) else {}
    meta.update({
        "scene_id": scene.scene_id,
        "version_string": version_string,
        "training_date": str(meta.get("training_date") or NOT_TRAINED_DATE),
        "dataset_hash": "",  # filled below from the other members' bytes
        "uuid": str(meta.get("uuid") or _uuid.uuid5(_uuid.NAMESPACE_URL, f"wsim:{scene.scene_id}")),
        "is_resumable": bool(meta.get("is_resumable", False)) if isinstance(meta.get("is_resumable"), bool) else False,
        "sensors": {"camera_ids": [c.logical_id or k for k, c in scene.cameras.items()], "lidar_ids": lidar_ids},
        "logger": {k: (None if logger.get(k) is None else str(logger[k])) for k in ("name", "run_id", "run_url")},
        "time_range": {"start": us(t0), "end": us(t1)},
    })
    order = ["scene_id", "version_string", "training_date", "dataset_hash", "uuid", "is_resumable", "sensors",
             "logger", "time_range"]
    meta = {**{k: meta[k] for k in order}, **{k: v for k, v in meta.items() if k not in order}}

    # ---- sidecar + prototypes
    proto_members = []
    for i, pr in enumerate(scene.prototypes):
        member = f"prototypes/{i}.ply"
        proto_members.append((member, ply_bytes(pr.points, pr.indices, _vertex_colors_u8(scene, pr))))
    sidecar = {
        "format": "wsim-materials",
        "version": 1,
        "materials": [{"name": m.name, "base_color": [float(c) for c in m.base_color],
                       "material_id": int(m.material_id), "reflectance": float(m.reflectance), "transmittance": float(m.transmittance),
                       "texture": m.texture} for m in scene.materials],
        "semantic_classes": list(classes),
        "parts": [{"name": p.name, "material": int(p.material), "semantic_class": int(p.semantic_class),
                   "object_id": int(p.object_id)} for p in scene.parts],
        "meshes": {"mesh.ply": {"tri_part": rle_encode(mesh_main.tri_part)},
                   "mesh_ground.ply": {"tri_part": rle_encode(mesh_ground.tri_part)}},
        "prototypes": [{"member": m, "name": pr.name, "tri_part": rle_encode(pr.tri_part)}
                       for (m, _), pr in zip(proto_members, scene.prototypes)],
        "tracks": tr_extra,
    }

    def js(obj: Any) -> bytes:
        return json.dumps(_plain(obj), separators=(",", ":")).encode("utf-8")

    rest = [("rig_trajectories.json", js(rig_doc)), ("sequence_tracks.json", js(tracks_doc))] + members + [
        (SIDECAR, js(sidecar))] + proto_members
    digest = hashlib.sha256()
    for name, data in rest:
        digest.update(name.encode("utf-8") + b"\0" + len(data).to_bytes(8, "little") + data)
    meta["dataset_hash"] = digest.hexdigest()
    all_members = [("metadata.yaml", yaml.safe_dump(_plain(meta), sort_keys=False).encode("utf-8"))] + rest
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in all_members:
            _zip_write(zf, name, data)
    path.write_bytes(buf.getvalue())
