"""The built-in street block: in-memory build, the shipped USD and NuRec files, and that they are up to date."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wsim.scene.builtin import (
    DATA_DIR,
    NUREC_FILE,
    SCENE_ID,
    TIME_ORIGIN_US,
    USD_FILE,
    build_street_scene,
    geometry_checksum,
    load_builtin_scene,
    write_builtin_files,
)
from wsim.scene.materials import decode_material_id
from wsim.scene.scene import Scene
from wsim.scene.transforms import quat_to_matrix



@pytest.fixture(scope="module")
def built() -> Scene:
    return build_street_scene()


@pytest.fixture(scope="module", params=["usd", "nurec"])
def shipped(request) -> Scene:
    return load_builtin_scene(request.param)


def test_shipped_files_exist_and_are_small() -> None:
    for name in (USD_FILE, NUREC_FILE):
        p = DATA_DIR / name
        assert p.is_file(), f"{p} missing: run python -m wsim.scene.builtin"
        assert p.stat().st_size < 5_000_000


def test_both_forms_agree() -> None:
    usd, nurec = load_builtin_scene("usd"), load_builtin_scene("nurec")
    assert usd.num_triangles == nurec.num_triangles
    assert usd.static.num_triangles == nurec.static.num_triangles
    assert len(usd.instances) == len(nurec.instances) == 8
    assert len(usd.prototypes) == len(nurec.prototypes) == 1  # all cars share one prototype
    assert geometry_checksum(usd) == geometry_checksum(nurec)
    assert set(usd.cameras) == set(nurec.cameras)


def test_shipped_scene_content(shipped: Scene) -> None:
    s = shipped
    assert s.scene_id == SCENE_ID
    assert s.time_origin_us == TIME_ORIGIN_US
    assert 60_000 <= s.num_triangles <= 200_000
    for cls in ("road", "sidewalk", "building", "pole", "traffic_sign", "vegetation", "car"):
        assert cls in s.semantic_classes
    # camera_front_wide_120fov: f-theta as AlpaSim's driver requires
    cam = s.cameras["camera_front_wide_120fov"]
    assert cam.model == "ftheta"
    assert cam.resolution == (1920, 1080)
    assert cam.shutter_type == "ROLLING_TOP_TO_BOTTOM"
    assert cam.params["reference_poly"] == "PIXELDIST_TO_ANGLE"
    bw = np.asarray(cam.params["pixeldist_to_angle_poly"])
    fw = np.asarray(cam.params["angle_to_pixeldist_poly"])
    assert np.polyval(bw[::-1], 960.0) == pytest.approx(np.pi / 3, abs=1e-6)
    th = np.polyval(bw[::-1], np.linspace(0, 1000, 50))
    np.testing.assert_allclose(np.polyval(fw[::-1], th), np.linspace(0, 1000, 50), atol=0.05)
    t, q = cam.camera_to_rig
    np.testing.assert_allclose(t, [1.7, 0, 1.5], atol=1e-6)
    r = quat_to_matrix(q)
    np.testing.assert_allclose(r @ [0, 0, 1], [1, 0, 0], atol=1e-6)
    np.testing.assert_allclose(r @ [1, 0, 0], [0, -1, 0], atol=1e-6)
    assert s.cameras["camera_front_tele_30fov"].model == "opencv_pinhole"
    assert s.cameras["camera_rear_fisheye_200fov"].model == "opencv_fisheye"
    # ego trajectory and moving cars
    ego = s.ego_trajectory
    assert ego is not None and ego.times[-1] - ego.times[0] >= 10.0
    moving = [i for i in s.instances if i.is_moving]
    assert len(moving) >= 2
    dirs = set()
    for inst in moving:
        assert inst.times[-1] - inst.times[0] >= 10.0
        np.testing.assert_allclose(np.diff(inst.times), 0.1, atol=1e-6)
        v = np.linalg.norm(np.diff(inst.translations, axis=0), axis=1) / np.diff(inst.times)
        assert np.all((v >= 8.0) & (v <= 15.0))
        dirs.add(np.sign(inst.translations[-1, 0] - inst.translations[0, 0]))
        assert inst.cuboid is not None
    assert dirs == {-1.0, 1.0}
    assert sum(not i.is_moving for i in s.instances) >= 4
    assert all(s.semantic_classes[i.semantic_class] == "car" for i in s.instances)
    # lidar mounts
    lidars = {d["type"]: d["translation"] for d in s.metadata["sensor_rig"]["lidars"].values()}
    assert lidars == {"PANDAR128": [1.0, 0.0, 1.9], "AT128": [3.6, 0.0, 0.7]}


def test_materials(built: Scene) -> None:
    labels = {decode_material_id(m.material_id) for m in built.materials}
    bases = {b for b, _, _ in labels}
    assert {"asphalt", "concrete", "clear_glass", "steel", "aluminum", "bark", "leaf_grass", "rubber"} <= bases
    assert ("clear_glass", "none", ("visually_transparent",)) in labels
    assert ("aluminum", "paint", ("retroreflective",)) in labels  # sign faces
    assert ("steel", "paint", ()) in labels  # car body
    glass = [i for i, m in enumerate(built.materials) if decode_material_id(m.material_id)[0] == "clear_glass"]
    assert all(built.materials[i].transmittance > 0.5 for i in glass)
    # window panes are static building triangles with glass
    part_mat = np.array([p.material for p in built.parts])
    assert np.isin(part_mat[built.static.tri_part], glass).sum() > 1000
    car = built.prototypes[0]
    lo, hi = car.points.min(axis=0), car.points.max(axis=0)
    np.testing.assert_allclose(hi[[0, 2]] - lo[[0, 2]], [4.5, 1.5], atol=0.05)
    assert np.isin(part_mat[car.tri_part], glass).any()


def test_build_is_deterministic(built: Scene) -> None:
    assert geometry_checksum(build_street_scene()) == geometry_checksum(built)


def test_shipped_files_are_up_to_date(built: Scene, tmp_path: Path) -> None:
    usd_path, nurec_path = write_builtin_files(tmp_path, built)
    from wsim.scene.nurec import load_nurec
    from wsim.scene.usd import load_usd

    fresh = {"usd": load_usd(usd_path), "nurec": load_nurec(nurec_path)}
    for form, scene in fresh.items():
        ref = load_builtin_scene(form)
        assert scene.num_triangles == ref.num_triangles, f"{form}: regenerate with python -m wsim.scene.builtin"
        assert len(scene.instances) == len(ref.instances)
        assert geometry_checksum(scene) == geometry_checksum(ref), f"{form}: regenerate: python -m wsim.scene.builtin"
    assert geometry_checksum(fresh["nurec"]) == geometry_checksum(built)


def test_unknown_form() -> None:
    with pytest.raises(ValueError, match="form"):
        load_builtin_scene("obj")
