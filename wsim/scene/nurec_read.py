"""Reading NuRec-style USDZ scene artifacts into a :class:`~wsim.scene.scene.Scene` (:func:`load_nurec`; the layout and
wsim's choices are described in :mod:`wsim.scene.nurec`)."""

from __future__ import annotations

import json
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from .materials import Material
from .nurec_format import SIDECAR, _material_vertex_colors, read_ply_mesh, rle_decode
from .scene import CameraCalibration, Instance, MeshData, Part, Scene, SceneError, Trajectory
from .transforms import compose_matrix, decompose_matrix

__all__ = ["load_nurec"]

_USD_EXT = (".usda", ".usdc", ".usd")
#: Largest uncompressed member of an artifact [bytes].
MAX_MEMBER_BYTES = 4 << 30
#: Largest uncompressed artifact, all members [bytes].
MAX_ARCHIVE_BYTES = 16 << 30
#: Largest compression ratio of a member over 16 MiB (real meshes compress 1-4x; a zip bomb by 1000x).
MAX_COMPRESSION_RATIO = 200


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
        total = 0
        for info in self.zf.infolist():
            total += info.file_size
            if info.file_size > MAX_MEMBER_BYTES:
                raise SceneError(f"{path}: member {info.filename} is {info.file_size:,} bytes uncompressed, more than "
                                 f"the {MAX_MEMBER_BYTES:,} a member may be")
            if info.file_size > 16 << 20 and info.file_size > MAX_COMPRESSION_RATIO * max(info.compress_size, 1):
                raise SceneError(f"{path}: member {info.filename} expands {info.file_size / max(info.compress_size, 1):.0f}"
                                 f"x ({info.compress_size:,} → {info.file_size:,} bytes): not a plausible scene member")
        if total > MAX_ARCHIVE_BYTES:
            raise SceneError(f"{path}: {total:,} bytes uncompressed, more than the {MAX_ARCHIVE_BYTES:,} an artifact "
                             "may be")
        #: Upper bound on triangles any mesh member can hold (a binary triangle takes at least 13 bytes).
        self.max_triangles = total // 13 + 1
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
        except (zipfile.BadZipFile, KeyError, OSError, RuntimeError, EOFError, zlib.error, NotImplementedError) as e:
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
    """Load a NuRec-style USDZ scene artifact (see :mod:`wsim.scene.nurec` for the layout and wsim's choices).

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
    side = _parse_sidecar(sidecar, src, ar.max_triangles) if sidecar is not None else None
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


def _parse_sidecar(doc: Any, src: str, max_triangles: int | None = None) -> dict[str, Any]:
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
        meshes = {k: rle_decode(v["tri_part"], max_triangles) for k, v in doc.get("meshes", {}).items()}
        prototypes = [dict(member=str(p["member"]), name=str(p.get("name", "")),
                           tri_part=rle_decode(p["tri_part"], max_triangles)) for p in doc.get("prototypes", [])]
        tracks = dict(doc.get("tracks", {}))
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
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
