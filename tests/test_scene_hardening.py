"""Scene loaders under hostile files: size limits (zip bombs, PLY headers that lie, run-length bombs), every failure a
SceneError naming the file and member, and corrupt content refused at load instead of failing later."""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

import wsim
from wsim.scene.nurec_format import rle_decode

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "wsim" / "data" / "street_block.usdz"


def _artifact(dst: Path, edit=None, replace: dict[str, bytes] | None = None, drop=(),
              compress=zipfile.ZIP_DEFLATED) -> Path:
    """The shipped artifact with its JSON/YAML documents edited by ``edit(name, doc)``, members replaced or dropped."""
    with zipfile.ZipFile(SHIPPED) as src, zipfile.ZipFile(dst, "w", compression=compress) as out:
        for name in src.namelist():
            if name in drop:
                continue
            data = src.read(name)
            if replace and name in replace:
                data = replace[name]
            elif edit is not None and name.endswith((".json", ".yaml")):
                doc = yaml.safe_load(data) if name.endswith(".yaml") else json.loads(data)
                doc = edit(name, doc) or doc
                data = (yaml.safe_dump(doc) if name.endswith(".yaml") else json.dumps(doc)).encode()
            out.writestr(name, data)
    return dst


def _load_fails(path: Path, *words: str) -> str:
    with pytest.raises(wsim.SceneError) as e:
        wsim.load_scene(path)
    msg = str(e.value)
    assert str(path) in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


# ------------------------------------------------------------------------------------------------- size limits
def test_zip_bomb_member_is_refused_before_it_is_expanded(tmp_path):
    bomb = b"\0" * (64 << 20)  # 64 MiB of zeros deflate to ~64 KiB
    _load_fails(_artifact(tmp_path / "bomb.usdz", replace={"mesh.ply": bomb}), "mesh.ply", "expands")


def test_ply_header_promising_more_than_its_bytes_is_refused(tmp_path):
    lie = b"ply\nformat binary_little_endian 1.0\nelement vertex 500000000\nproperty float x\nproperty float y\n" \
          b"property float z\nelement face 0\nproperty list uchar int vertex_indices\nend_header\n" + b"\0" * 100
    _load_fails(_artifact(tmp_path / "lie.usdz", replace={"mesh.ply": lie}, drop=("wsim_materials.json",)),
                "mesh.ply", "500,000,000 vertex")


def test_run_length_bomb_in_the_sidecar_is_refused(tmp_path):
    def edit(name, doc):
        if name == "wsim_materials.json":
            doc["meshes"]["mesh.ply"]["tri_part"] = [0, 10**12]
    _load_fails(_artifact(tmp_path / "rle.usdz", edit), "wsim_materials.json", "expands")
    with pytest.raises(ValueError, match="expands"):
        rle_decode([1, 2**62, 1, 2**62], max_length=100)
    assert rle_decode([3, 2, 1, 1]).tolist() == [3, 3, 1]


# ------------------------------------------------------------------------------------------------- exception types
def test_every_loader_failure_is_a_scene_error(tmp_path):
    d = tmp_path / "folder.usdz"
    d.mkdir()
    _load_fails(d, "directory")
    good = _artifact(tmp_path / "g.usdz")
    raw = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as z:
        info = z.getinfo("mesh.ply")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    raw[start + 10: start + 200] = b"\xff" * 190  # corrupt deflate data of mesh.ply
    bad = tmp_path / "zlib.usdz"
    bad.write_bytes(bytes(raw))
    _load_fails(bad, "mesh.ply")
    deep = tmp_path / "deep.usdz"
    _artifact(deep, lambda name, doc: {**doc, "camera_calibrations": "[" * 100000} if name == "rig_trajectories.json"
              else None)
    _load_fails(deep, "camera_calibrations")


# ------------------------------------------------------------------------------------------------- load-time validation
def _usd_stage(path: Path, mpu=1.0, up="Z") -> Path:
    from pxr import Usd, UsdGeom

    stage = Usd.Stage.CreateNew(str(path))
    UsdGeom.SetStageMetersPerUnit(stage, mpu)
    stage.SetMetadata("upAxis", up)
    mesh = UsdGeom.Mesh.Define(stage, "/World/ground")
    mesh.CreatePointsAttr([(0, 0, 0), (1, 0, 0), (0, 1, 0)])
    mesh.CreateFaceVertexCountsAttr([3])
    mesh.CreateFaceVertexIndicesAttr([0, 1, 2])
    stage.GetRootLayer().Save()
    return path


@pytest.mark.parametrize("mpu", [0.0, -1.0, math.nan])
def test_usd_meters_per_unit_must_be_positive(tmp_path, mpu):
    _load_fails(_usd_stage(tmp_path / "m.usda", mpu=mpu), "metersPerUnit")


def test_usd_up_axis_must_be_y_or_z(tmp_path):
    _load_fails(_usd_stage(tmp_path / "q.usda", up="Q"), "upAxis")
    assert wsim.load_scene(_usd_stage(tmp_path / "y.usda", up="Y")).num_triangles == 1


def _camera_edit(change):
    def edit(name, doc):
        if name == "rig_trajectories.json":
            cal = doc["camera_calibrations"]["camera_front_wide_120fov@wsim"]
            change(cal["camera_model"]["parameters"], doc)
    return edit


@pytest.mark.parametrize("case,change,words", [
    ("no-principal-point", lambda p, d: p.pop("principal_point"), ["principal_point_x", "missing"]),
    ("huge-resolution", lambda p, d: p.update(resolution=[1e30, 1080]), ["resolution"]),
    ("nan-poly", lambda p, d: p.update(pixeldist_to_angle_poly=[0.0, float("nan")]), ["pixeldist_to_angle_poly"]),
    ("no-poly", lambda p, d: (p.pop("pixeldist_to_angle_poly"), p.pop("angle_to_pixeldist_poly")), ["f-theta"]),
    ("2d-rig-timestamps", lambda p, d: d["rig_trajectories"][0].update(
        T_rig_world_timestamps_us=[[t, t] for t in d["rig_trajectories"][0]["T_rig_world_timestamps_us"]]),
     ["T_rig_world_timestamps_us"]),
])
def test_corrupt_calibrations_and_trajectories_fail_at_load(tmp_path, case, change, words):
    _load_fails(_artifact(tmp_path / f"{case}.usdz", _camera_edit(change)), *words)


def test_the_shipped_artifact_still_loads(tmp_path):
    s = wsim.load_scene(_artifact(tmp_path / "same.usdz"))
    assert s.num_triangles == wsim.load_scene("builtin:nurec").num_triangles
    assert np.isfinite(s.ego_trajectory.translations).all()
