"""wsim's NuRec USDZ artifacts against the schema AlpaSim's runtime reads (its artifact reader, rig and traffic loaders,
track smoothing and scene metadata), written out here field by field with the types AlpaSim's code assumes.

The checker is independent of wsim's reader: it opens the zip with :mod:`zipfile` and checks the raw JSON/YAML.
"""

from __future__ import annotations

import copy
import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

import wsim
from wsim.scene.nurec import load_nurec, write_nurec

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "wsim" / "data" / "street_block.usdz"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_matrix(m) -> bool:
    return (isinstance(m, list) and len(m) == 4 and all(isinstance(r, list) and len(r) == 4 for r in m)
            and all(_is_num(v) for r in m for v in r))


def _rigid(m) -> bool:
    a = np.asarray(m, float)
    r = a[:3, :3]
    return np.allclose(r @ r.T, np.eye(3), atol=1e-5) and np.linalg.det(r) > 0 and np.allclose(a[3], [0, 0, 0, 1])


def metadata_problems(meta) -> list[str]:
    p = []
    if not isinstance(meta, dict):
        return ["metadata.yaml: not a mapping"]
    for key in ("scene_id", "version_string", "training_date", "dataset_hash", "uuid"):
        if not (isinstance(meta.get(key), str) and meta[key]):
            p.append(f"metadata.{key}: must be a non-empty string, got {meta.get(key)!r}")
    if not isinstance(meta.get("is_resumable"), bool):
        p.append(f"metadata.is_resumable: must be a bool, got {meta.get('is_resumable')!r}")
    sensors = meta.get("sensors")
    if not isinstance(sensors, dict):
        p.append("metadata.sensors: must be a mapping")
    else:
        for k in ("camera_ids", "lidar_ids"):
            v = sensors.get(k, [])
            if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
                p.append(f"metadata.sensors.{k}: must be a list of strings")
    logger = meta.get("logger")
    if not isinstance(logger, dict):
        p.append("metadata.logger: must be a mapping")
    else:
        for k in ("name", "run_id", "run_url"):
            if logger.get(k) is not None and not isinstance(logger[k], str):
                p.append(f"metadata.logger.{k}: must be a string or null")
    tr = meta.get("time_range")
    if not (isinstance(tr, dict) and _is_num(tr.get("start")) and _is_num(tr.get("end")) and tr["start"] < tr["end"]):
        p.append(f"metadata.time_range: needs numeric start < end [us], got {tr!r}")
    return p


def rig_problems(rig) -> list[str]:
    p = []
    if not isinstance(rig, dict):
        return ["rig_trajectories.json: not an object"]
    if not (isinstance(rig.get("world_to_nre"), dict) and _is_matrix(rig["world_to_nre"].get("matrix"))):
        p.append("world_to_nre.matrix: must be a 4x4 number matrix")
    if "T_world_base" in rig and not _is_matrix(rig["T_world_base"]):
        p.append("T_world_base: must be a 4x4 number matrix")
    cals = rig.get("camera_calibrations")
    if not isinstance(cals, dict):
        return p + ["camera_calibrations: must be an object"]
    for uid, cal in cals.items():
        if not (isinstance(cal, dict) and isinstance(cal.get("logical_sensor_name"), str)):
            p.append(f"camera_calibrations.{uid}.logical_sensor_name: must be a string")
            continue
        model = cal.get("camera_model", {})
        params = model.get("parameters", {}) if isinstance(model, dict) else {}
        if model.get("type") not in ("ftheta", "opencv_pinhole", "opencv_fisheye"):
            p.append(f"camera_calibrations.{uid}.camera_model.type: {model.get('type')!r}")
        res = params.get("resolution")
        if not (isinstance(res, list) and len(res) == 2 and all(_is_int(v) and v > 0 for v in res)):
            p.append(f"camera_calibrations.{uid}: resolution must be [w, h] positive ints")
        pp = params.get("principal_point")
        if not (isinstance(pp, list) and len(pp) == 2 and all(_is_num(v) for v in pp)):
            p.append(f"camera_calibrations.{uid}: principal_point must be [x, y] numbers")
        if not (_is_matrix(cal.get("T_sensor_rig")) and _rigid(cal["T_sensor_rig"])):
            p.append(f"camera_calibrations.{uid}.T_sensor_rig: must be a rigid 4x4 matrix")
    trajs = rig.get("rig_trajectories")
    if not (isinstance(trajs, list) and len(trajs) == 1):
        return p + ["rig_trajectories: AlpaSim reads exactly one entry"]
    t = trajs[0]
    if not isinstance(t.get("sequence_id"), str):
        p.append("rig_trajectories[0].sequence_id: must be a string")
    ts, mats = t.get("T_rig_world_timestamps_us"), t.get("T_rig_worlds")
    if not (isinstance(ts, list) and ts and all(_is_int(v) and v >= 0 for v in ts)):
        p.append("T_rig_world_timestamps_us: must be a non-empty list of ints >= 0")
    elif any(b <= a for a, b in zip(ts, ts[1:])):
        p.append("T_rig_world_timestamps_us: must be strictly increasing")
    if not (isinstance(mats, list) and isinstance(ts, list) and len(mats) == len(ts)
            and all(_is_matrix(m) and _rigid(m) for m in mats)):
        p.append("T_rig_worlds: one rigid 4x4 matrix per timestamp")
    frames = t.get("cameras_frame_timestamps_us")
    if not isinstance(frames, dict):
        p.append("cameras_frame_timestamps_us: required object")
    else:
        for uid, fr in frames.items():
            if uid not in cals:
                p.append(f"cameras_frame_timestamps_us.{uid}: not in camera_calibrations")
            if not (isinstance(fr, list) and fr):
                p.append(f"cameras_frame_timestamps_us.{uid}: must be a non-empty list of frames")
                continue
            for k, f in enumerate(fr):
                if not (isinstance(f, list) and len(f) >= 2 and _is_int(f[0]) and _is_int(f[1]) and f[1] > f[0]):
                    p.append(f"cameras_frame_timestamps_us.{uid}[{k}]: must be [start_us, end_us] ints, end > start")
                    break
            if any(b[0] < a[0] for a, b in zip(fr, fr[1:])):
                p.append(f"cameras_frame_timestamps_us.{uid}: frames out of time order")
        for uid in cals:
            if uid not in frames:
                p.append(f"cameras_frame_timestamps_us: no frames for camera {uid}")
    bbox = t.get("rig_bbox")
    if not isinstance(bbox, dict):
        p.append("rig_bbox: required (AlpaSim's ego box)")
    else:
        for k in ("centroid", "dim", "rot"):
            if not (isinstance(bbox.get(k), list) and len(bbox[k]) == 3 and all(_is_num(v) for v in bbox[k])):
                p.append(f"rig_bbox.{k}: must be 3 numbers")
        if isinstance(bbox.get("rot"), list) and any(abs(v) >= 1e-4 for v in bbox["rot"] if _is_num(v)):
            p.append("rig_bbox.rot: AlpaSim rejects a rotated rig box")
        if isinstance(bbox.get("dim"), list) and not all(_is_num(v) and v > 0 for v in bbox["dim"]):
            p.append("rig_bbox.dim: must be positive")
    return p


def tracks_problems(doc) -> list[str]:
    p = []
    if not (isinstance(doc, dict) and len(doc) == 1):
        return ["sequence_tracks.json: AlpaSim reads exactly one sequence key"]
    (seq,) = doc.values()
    td = seq.get("tracks_data") if isinstance(seq, dict) else None
    dims = (seq.get("cuboidtracks_data") or {}).get("cuboids_dims") if isinstance(seq, dict) else None
    keys = ("tracks_id", "tracks_label_class", "tracks_flags", "tracks_timestamps_us", "tracks_poses")
    if not (isinstance(td, dict) and all(isinstance(td.get(k), list) for k in keys) and isinstance(dims, list)):
        return ["tracks_data / cuboidtracks_data.cuboids_dims: every list is required"]
    n = len(td["tracks_id"])
    if any(len(td[k]) != n for k in keys) or len(dims) != n:
        p.append("tracks_data: the lists must have one entry per track (AlpaSim zips them and drops the rest)")
    if not all(isinstance(i, str) for i in td["tracks_id"]) or len(set(td["tracks_id"])) != n:
        p.append("tracks_id: must be unique strings")
    for k in range(min(n, len(dims), *(len(td[key]) for key in keys))):
        tid = td["tracks_id"][k]
        if not isinstance(td["tracks_label_class"][k], str):
            p.append(f"{tid}: label class must be a string")
        flags = td["tracks_flags"][k]
        if not (isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
            p.append(f"{tid}: flags must be a list of flag strings, got {flags!r}")
        if not (isinstance(dims[k], list) and len(dims[k]) == 3 and all(_is_num(v) and v > 0 for v in dims[k])):
            p.append(f"{tid}: cuboid dims must be 3 positive numbers")
        ts, poses = td["tracks_timestamps_us"][k], td["tracks_poses"][k]
        if not (isinstance(ts, list) and len(ts) >= 2 and all(_is_int(v) and v >= 0 for v in ts)):
            p.append(f"{tid}: needs >= 2 integer timestamps >= 0 (AlpaSim's track smoothing)")
        elif any(b <= a for a, b in zip(ts, ts[1:])):
            p.append(f"{tid}: timestamps must be strictly increasing")
        if not (isinstance(poses, list) and len(poses) == len(ts)
                and all(isinstance(r, list) and len(r) == 7 and all(_is_num(v) for v in r) for r in poses)):
            p.append(f"{tid}: one [x, y, z, qx, qy, qz, qw] row per timestamp")
        elif not np.allclose(np.linalg.norm(np.asarray(poses, float)[:, 3:], axis=1), 1.0, atol=1e-6):
            p.append(f"{tid}: quaternions must be unit")
    return p


def artifact_problems(path: Path) -> list[str]:
    """Every way the artifact at ``path`` departs from what AlpaSim's runtime reads (empty: none)."""
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        missing = [m for m in ("metadata.yaml", "rig_trajectories.json", "sequence_tracks.json", "mesh.ply",
                               "mesh_ground.ply") if m not in names]
        if missing:
            return [f"missing members at the archive root: {missing}"]
        meta = yaml.safe_load(z.read("metadata.yaml"))
        rig = json.loads(z.read("rig_trajectories.json"))
        tracks = json.loads(z.read("sequence_tracks.json"))
    return metadata_problems(meta) + rig_problems(rig) + tracks_problems(tracks)


# ------------------------------------------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[wsim.Scene, Path]:
    scene = wsim.load_scene("builtin")
    path = tmp_path_factory.mktemp("nurec") / "street_block.usdz"
    write_nurec(scene, path, sequence_id=scene.scene_id)
    return scene, path


def test_written_builtin_scene_matches_alpasims_schema(written):
    assert artifact_problems(written[1]) == []


def test_shipped_artifact_matches_alpasims_schema():
    assert artifact_problems(SHIPPED) == []


def test_moving_tracks_are_controllable_and_static_ones_span_the_scene(written):
    scene, path = written
    with zipfile.ZipFile(path) as z:
        td = next(iter(json.loads(z.read("sequence_tracks.json")).values()))["tracks_data"]
        meta = yaml.safe_load(z.read("metadata.yaml"))
    moving = {i.name for i in scene.instances if i.is_moving}
    assert moving and len(moving) < len(scene.instances)
    for tid, flags, ts in zip(td["tracks_id"], td["tracks_flags"], td["tracks_timestamps_us"]):
        assert ("CONTROLLABLE" in flags) == (tid in moving)
        if tid not in moving:  # held for the whole clip, so AlpaSim's 3 s minimum track length keeps it
            assert ts == [meta["time_range"]["start"], meta["time_range"]["end"]]


def test_written_artifact_reads_back_equal(written):
    scene, path = written
    back = load_nurec(path)
    assert back.scene_id == scene.scene_id and back.time_range == scene.time_range
    assert back.num_triangles == scene.num_triangles
    np.testing.assert_array_equal(back.static.indices, back.static.indices)
    assert [i.name for i in back.instances] == [i.name for i in scene.instances]
    for a, b in zip(back.instances, scene.instances):
        assert a.is_moving == b.is_moving and a.object_id == b.object_id and a.prototype == b.prototype
        np.testing.assert_allclose(a.times, b.times, atol=1e-6)
        np.testing.assert_allclose(a.translations, b.translations, atol=1e-9)
        np.testing.assert_allclose(a.rotations, b.rotations, atol=1e-12)
    assert set(back.cameras) == set(scene.cameras)
    for k, cam in scene.cameras.items():
        got = back.cameras[k]
        assert got.model == cam.model and got.resolution == cam.resolution and got.shutter_type == cam.shutter_type
        assert got.params.keys() == cam.params.keys()
        for p, v in cam.params.items():
            np.testing.assert_allclose(np.asarray(got.params[p], float), np.asarray(v, float), err_msg=p) \
                if not isinstance(v, str) else None
    np.testing.assert_allclose(back.ego_trajectory.translations, scene.ego_trajectory.translations, atol=1e-9)
    for key in ("training_date", "dataset_hash", "is_resumable", "logger"):
        assert key in back.metadata


def test_checker_catches_what_alpasim_rejects(written):
    """The schema is not vacuous: each defect AlpaSim's loader trips on is reported."""
    _, path = written
    with zipfile.ZipFile(path) as z:
        meta = yaml.safe_load(z.read("metadata.yaml"))
        rig = json.loads(z.read("rig_trajectories.json"))
        tracks = json.loads(z.read("sequence_tracks.json"))
    bad_meta = {k: v for k, v in meta.items() if k not in ("training_date", "is_resumable")}
    assert {x.split(":")[0] for x in metadata_problems(bad_meta)} == {"metadata.training_date", "metadata.is_resumable"}
    old = copy.deepcopy(tracks)
    td = next(iter(old.values()))["tracks_data"]
    td["tracks_flags"] = [0] * len(td["tracks_id"])  # wsim's former integer flags
    td["tracks_timestamps_us"][0] = td["tracks_timestamps_us"][0][:1]
    td["tracks_poses"][0] = td["tracks_poses"][0][:1]
    found = tracks_problems(old)
    assert any("flags must be a list" in x for x in found) and any(">= 2 integer timestamps" in x for x in found)
    r = copy.deepcopy(rig)
    del r["rig_trajectories"][0]["cameras_frame_timestamps_us"]
    assert any("cameras_frame_timestamps_us" in x for x in rig_problems(r))


def test_loader_reads_alpasim_style_flags_and_older_wsim_files(written, tmp_path):
    """String flags ("DYNAMIC|CONTROLLABLE"), lists of strings, and wsim's former integer 0 all load; the flags are
    kept per track in metadata["nurec"]["tracks_flags"]; a constant two-sample track is a static instance."""
    _, path = written
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    doc = json.loads(members["sequence_tracks.json"])
    seq = next(iter(doc))
    td = doc[seq]["tracks_data"]
    n = len(td["tracks_id"])
    for flags in (["DYNAMIC|CONTROLLABLE"] * n, [0] * n, [["NONE"]] * n):
        td["tracks_flags"] = flags
        members["sequence_tracks.json"] = json.dumps(doc).encode()
        p = tmp_path / "variant.usdz"
        with zipfile.ZipFile(p, "w") as z:
            for name, data in members.items():
                z.writestr(name, data)
        s = load_nurec(p)
        got = s.metadata["nurec"]["tracks_flags"][seq]
        want = ["DYNAMIC", "CONTROLLABLE"] if flags[0] == "DYNAMIC|CONTROLLABLE" else []
        assert all(got[t] == want for t in td["tracks_id"])
        assert sum(i.is_moving for i in s.instances) == 2 and len(s.instances) == n
    td["tracks_flags"] = [{"x": 1}] * n
    members["sequence_tracks.json"] = json.dumps(doc).encode()
    with zipfile.ZipFile(p, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    with pytest.raises(wsim.SceneError, match="tracks_flags"):
        load_nurec(p)
