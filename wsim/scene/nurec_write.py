"""Writing a :class:`~wsim.scene.scene.Scene` as a NuRec-style USDZ scene artifact (:func:`write_nurec`; the layout and
wsim's choices, the writing rules included, are described in :mod:`wsim.scene.nurec`)."""

from __future__ import annotations

import hashlib
import io
import json
import math
import uuid as _uuid
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .nurec_format import SIDECAR, _material_vertex_colors, linear_to_srgb, ply_bytes, rle_encode
from .scene import MeshData, Scene
from .transforms import compose_matrix

__all__ = ["write_nurec", "GROUND_CLASSES", "NOT_TRAINED_DATE"]

#: ``training_date`` written for scenes that were not trained (built or converted by wsim) and carry none.
NOT_TRAINED_DATE = "1970-01-01"
GROUND_CLASSES = ("road", "sidewalk", "ground")
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


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


def _zip_write(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    info.create_system = 3
    zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)


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
    """Write ``scene`` as a NuRec-style USDZ (zip) at ``path`` (layout and choices: :mod:`wsim.scene.nurec`).

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
