"""NuRec-style USDZ artifacts: loading a hand-built artifact, write/load round trip, determinism, bad input."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from plyfile import PlyData, PlyElement

from wsim.scene.materials import Material
from wsim.scene.nurec import load_nurec, rle_decode, rle_encode, srgb_to_linear, write_nurec
from wsim.scene.scene import CameraCalibration, Instance, MeshData, Part, Scene, SceneError, Trajectory
from wsim.scene.transforms import compose_matrix, quat_from_axis_angle, quat_to_matrix

T0 = 1_600_000_000_000_000  # metadata time_range.start [us]


def _ply_plane(colors: bool = True, nan: bool = False, bad_index: bool = False) -> bytes:
    """Binary PLY: a 10 x 10 m plane at z = 1 made of two triangles, with vertex colours."""
    vdt = [("x", "f4"), ("y", "f4"), ("z", "f4")] + ([("red", "u1"), ("green", "u1"), ("blue", "u1")] if colors else [])
    v = np.zeros(4, dtype=vdt)
    v["x"], v["y"], v["z"] = [0, 10, 10, 0], [0, 0, 10, 10], 1.0
    if nan:
        v["y"][2] = np.nan
    if colors:
        v["red"], v["green"], v["blue"] = [255, 0, 0, 128], [0, 255, 0, 128], [0, 0, 255, 128]
    f = np.empty(2, dtype=[("vertex_indices", "i4", (3,))])
    f["vertex_indices"] = [[0, 1, 2], [0, 2, 7 if bad_index else 3]]
    buf = io.BytesIO()
    PlyData([PlyElement.describe(v, "vertex"), PlyElement.describe(f, "face")], text=False).write(buf)
    return buf.getvalue()


# ASCII PLY with a single quad face (fan-triangulated on load) and no colours.
_GROUND_ASCII = b"""ply
format ascii 1.0
element vertex 4
property float x
property float y
property float z
element face 1
property list uchar int vertex_indices
end_header
-50 -50 0
50 -50 0
50 50 0
-50 50 0
4 0 1 2 3
"""


def _rig_doc(world_to_nre: np.ndarray | None = None) -> dict:
    yaw = quat_from_axis_angle([0, 0, 1], np.pi / 2)
    poses = [compose_matrix([0, 0, 0], [0, 0, 0, 1]), compose_matrix([5, 0, 0], [0, 0, 0, 1]),
             compose_matrix([10, 0, 0], yaw)]
    cam_rot = np.array([[0, 0, 1], [-1, 0, 0], [0, -1, 0]], float)  # camera z → rig x, x → -y, y → -z
    t_sensor_rig = np.eye(4)
    t_sensor_rig[:3, :3] = cam_rot
    t_sensor_rig[:3, 3] = [1.7, 0.0, 1.5]
    return {
        "world_to_nre": {"matrix": (np.eye(4) if world_to_nre is None else world_to_nre).tolist()},
        "camera_calibrations": {
            "cam_front@rig0": {
                "logical_sensor_name": "camera_front_wide_120fov",
                "camera_model": {"type": "ftheta", "parameters": {
                    "resolution": [1920, 1080], "shutter_type": "ROLLING_TOP_TO_BOTTOM",
                    "principal_point_x": 955.5, "principal_point_y": 540.25, "reference_poly": "PIXELDIST_TO_ANGLE",
                    "pixeldist_to_angle_poly": [0.0, 1.05e-3, 1e-8, 0.0, 0.0, 0.0],
                    "angle_to_pixeldist_poly": [0.0, 952.0, -8.0, 0.0, 0.0, 0.0],
                    "max_angle": 1.1, "linear_cde": [1.0, 0.0, 0.0]}},
                "T_sensor_rig": t_sensor_rig.tolist(),
            }
        },
        "rig_trajectories": [{
            "sequence_id": "seq-A",
            "T_rig_world_timestamps_us": [T0, T0 + 500_000, T0 + 1_000_000],
            "T_rig_worlds": [p.tolist() for p in poses],
            "cameras_frame_timestamps_us": {"cam_front@rig0": [[T0, T0 + 30_000], [T0 + 33_333, T0 + 63_333]]},
            "rig_bbox": {"centroid": [1.4, 0, 0.8], "dim": [4.8, 2.0, 1.6], "rot": [0, 0, 0]},
        }],
        "T_world_base": np.eye(4).tolist(),
    }


def _tracks_doc() -> dict:
    q = [0.0, 0.0, 0.0, 1.0]
    return {"seq-A": {
        "tracks_data": {
            "tracks_id": ["car_1", "ped_2"],
            "tracks_label_class": ["Automobile", "pedestrian"],
            "tracks_flags": [0, 0],
            "tracks_timestamps_us": [[T0, T0 + 500_000, T0 + 1_000_000], [T0 + 250_000]],
            "tracks_poses": [[[20, 2, 0.8, *q], [25, 2, 0.8, *q], [30, 2, 0.8, *q]], [[15, -6, 0.9, *q]]],
        },
        "cuboidtracks_data": {"cuboids_dims": [[4.6, 1.9, 1.6], [0.6, 0.6, 1.8]]},
    }}


def _members(**override) -> dict[str, bytes | None]:
    m: dict[str, bytes | None] = {
        "metadata.yaml": yaml.safe_dump({
            "scene_id": "clipgt-test-0001", "version_string": "25.1", "uuid": "0001",
            "sensors": {"camera_ids": ["camera_front_wide_120fov"], "lidar_ids": ["lidar_top_360fov"]},
            "time_range": {"start": T0, "end": T0 + 2_000_000}}).encode(),
        "rig_trajectories.json": json.dumps(_rig_doc()).encode(),
        "sequence_tracks.json": json.dumps(_tracks_doc()).encode(),
        "mesh.ply": _ply_plane(),
        "mesh_ground.ply": _GROUND_ASCII,
    }
    m.update(override)
    return m


def _write_zip(path: Path, members: dict[str, bytes | None]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            if data is not None:
                zf.writestr(name, data)
    return path


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    return _write_zip(tmp_path / "clip.usdz", _members())


def test_load_hand_built_artifact(artifact: Path) -> None:
    s = load_nurec(artifact)
    assert s.scene_id == "clipgt-test-0001"
    assert s.source == str(artifact)
    assert s.metadata["version_string"] == "25.1"
    assert s.time_origin_us == T0
    assert s.time_range == (0.0, 2.0)
    # geometry: 2 triangles from mesh.ply + the quad of mesh_ground.ply fan-triangulated into 2
    assert s.static.num_triangles == 4
    assert s.static.colors is not None
    np.testing.assert_allclose(s.static.colors[0], [1, 0, 0], atol=1e-6)
    np.testing.assert_allclose(s.static.colors[3], srgb_to_linear([128 / 255] * 3), atol=1e-6)
    ground_parts = {int(p) for p in s.static.tri_part[2:]}
    assert len(ground_parts) == 1
    gp = s.parts[ground_parts.pop()]
    assert s.semantic_classes[gp.semantic_class] == "road"
    assert s.materials[gp.material].name.endswith("asphalt")
    # tracks
    assert [i.name for i in s.instances] == ["car_1", "ped_2"]
    car, ped = s.instances
    np.testing.assert_allclose(car.times, [0.0, 0.5, 1.0])
    np.testing.assert_allclose(car.translations[:, 0], [20, 25, 30])
    np.testing.assert_allclose(car.cuboid, [4.6, 1.9, 1.6])
    assert s.semantic_classes[car.semantic_class] == "automobile"
    assert car.is_moving and not ped.is_moving
    np.testing.assert_allclose(ped.times, [0.25])
    assert s.semantic_classes[ped.semantic_class] == "pedestrian"
    proto = s.prototypes[car.prototype]
    np.testing.assert_allclose(proto.points.min(axis=0), [-2.3, -0.95, -0.8], atol=1e-6)
    np.testing.assert_allclose(proto.points.max(axis=0), [2.3, 0.95, 0.8], atol=1e-6)
    assert car.prototype != ped.prototype
    assert s.materials[s.parts[proto.tri_part[0]].material].material_id & 0xFF == 2  # steel
    assert car.object_id != ped.object_id
    # ego trajectory: lerp + slerp between the rig poses
    ego = s.ego_trajectory
    np.testing.assert_allclose(ego.times, [0.0, 0.5, 1.0])
    t, q = ego.pose_at(0.25)
    np.testing.assert_allclose(t, [2.5, 0, 0], atol=1e-9)
    np.testing.assert_allclose(q, [0, 0, 0, 1], atol=1e-9)
    t, q = ego.pose_at(0.75)
    np.testing.assert_allclose(t, [7.5, 0, 0], atol=1e-9)
    np.testing.assert_allclose(q, quat_from_axis_angle([0, 0, 1], np.pi / 4), atol=1e-9)
    t, _ = ego.pose_at(5.0)  # clamped
    np.testing.assert_allclose(t, [10, 0, 0])
    # camera
    cam = s.cameras["camera_front_wide_120fov"]
    assert cam.model == "ftheta"
    assert cam.unique_id == "cam_front@rig0"
    assert cam.resolution == (1920, 1080)
    assert cam.shutter_type == "ROLLING_TOP_TO_BOTTOM"
    assert cam.params["principal_point_x"] == 955.5
    assert cam.params["reference_poly"] == "PIXELDIST_TO_ANGLE"
    assert cam.params["pixeldist_to_angle_poly"][1] == pytest.approx(1.05e-3)
    assert cam.params["max_angle"] == 1.1
    tr, rq = cam.camera_to_rig
    np.testing.assert_allclose(tr, [1.7, 0, 1.5])
    r = quat_to_matrix(rq)
    np.testing.assert_allclose(r @ [0, 0, 1], [1, 0, 0], atol=1e-12)  # optical axis → rig forward
    np.testing.assert_allclose(r @ [1, 0, 0], [0, -1, 0], atol=1e-12)
    np.testing.assert_allclose(r @ [0, 1, 0], [0, 0, -1], atol=1e-12)
    assert s.metadata["nurec"]["sequence_id"] == "seq-A"
    assert s.metadata["nurec"]["cameras_frame_timestamps_us"]["cam_front@rig0"][1] == [T0 + 33_333, T0 + 63_333]


def test_world_to_nre_is_applied(tmp_path: Path) -> None:
    w2n = np.eye(4)
    w2n[:3, 3] = [-100.0, 50.0, 0.0]
    p = _write_zip(tmp_path / "a.usdz", _members(**{"rig_trajectories.json": json.dumps(_rig_doc(w2n)).encode()}))
    s = load_nurec(p)
    np.testing.assert_allclose(s.ego_trajectory.translations[1], [-95, 50, 0])
    np.testing.assert_allclose(s.instances[0].translations[0], [-80, 52, 0.8])


def test_members_in_a_folder_and_optional_tables(tmp_path: Path) -> None:
    m = _members()
    m = {f"clip/{k}": v for k, v in m.items() if k not in ("sequence_tracks.json", "rig_trajectories.json")}
    s = load_nurec(_write_zip(tmp_path / "b.usdz", m))
    assert s.static.num_triangles == 4 and not s.instances and s.ego_trajectory is None and not s.cameras


def _small_scene() -> Scene:
    s = Scene(static=MeshData(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0)))
    road = s.add_part(Part("/road", s.add_material(Material.from_labels("asphalt", "asphalt", base_color=(0.05,) * 3)),
                           s.semantic_class_index("road"), 1))
    wall = s.add_part(Part("/wall", s.add_material(Material.from_labels("brick", "brick", base_color=(0.3, 0.1, 0.05))),
                           s.semantic_class_index("building"), 2))
    glass = s.add_part(Part("/win", s.add_material(Material.from_labels("glass", "clear_glass", "none",
                                                                        ["visually_transparent"])),
                            s.semantic_class_index("building"), 2))
    body = s.add_part(Part("/car/body", s.add_material(Material.from_labels("paint", "steel", "paint",
                                                                           base_color=(0.5, 0.0, 0.0))),
                           s.semantic_class_index("car"), 0))
    pts = np.array([[0, 0, 0], [10, 0, 0], [10, 10, 0], [0, 10, 0], [0, 20, 0], [0, 20, 5], [5, 20, 5], [5, 20, 0]])
    s.static = MeshData(pts, [[0, 1, 2], [0, 2, 3], [4, 6, 5], [4, 7, 6]], [road, road, wall, glass])
    s.prototypes = [MeshData([[-1, -1, -0.5], [1, -1, -0.5], [1, 1, -0.5], [0, 0, 0.5]],
                             [[0, 2, 1], [0, 1, 3], [1, 2, 3], [2, 0, 3]], body, name="/proto/car")]
    q = quat_from_axis_angle([0, 0, 1], 0.3)
    s.instances = [
        Instance(0, [0.0], [[3, 3, 0.5]], [q], object_id=10, name="parked",
                 semantic_class=s.semantic_class_index("car")),
        Instance(0, [0.0, 0.1, 0.2], [[0, 0, 0.5], [1, 0, 0.5], [2, 0, 0.5]], [[0, 0, 0, 1]] * 3, object_id=11,
                 name="mover", semantic_class=s.semantic_class_index("car"), cuboid=np.array([2.0, 2.0, 1.0])),
    ]
    s.ego_trajectory = Trajectory([0.0, 1.0], [[0, 0, 0], [8, 0, 0]], [[0, 0, 0, 1]] * 2)
    s.cameras = {"cam": CameraCalibration("cam", "opencv_pinhole", {
        "principal_point_x": 320.0, "principal_point_y": 240.0, "focal_length_x": 500.0, "focal_length_y": 500.0,
        "radial_coeffs": [0.1, 0, 0, 0, 0, 0], "tangential_coeffs": [0, 0], "thin_prism_coeffs": [0, 0, 0, 0]},
        (640, 480), (np.array([1.0, 0, 1.5]), np.array([-0.5, 0.5, -0.5, 0.5])), "GLOBAL", "cam@x")}
    s.scene_id = "small"
    s.time_range = (0.0, 1.0)
    s.time_origin_us = 1_700_000_000_000_000
    s.metadata = {"sensor_rig": {"lidars": {"top": {"type": "PANDAR128"}}}}
    s.validate()
    return s


def test_write_load_round_trip(tmp_path: Path) -> None:
    s = _small_scene()
    p = tmp_path / "small.usdz"
    write_nurec(s, p)
    with zipfile.ZipFile(p) as zf:
        names = zf.namelist()
        meta = yaml.safe_load(zf.read("metadata.yaml"))
        ground = PlyData.read(io.BytesIO(zf.read("mesh_ground.ply")))
        tracks = json.loads(zf.read("sequence_tracks.json"))["small"]["tracks_data"]
    assert {"metadata.yaml", "rig_trajectories.json", "sequence_tracks.json", "mesh.ply", "mesh_ground.ply",
            "wsim_materials.json", "prototypes/0.ply"} <= set(names)
    assert meta["scene_id"] == "small"
    assert meta["time_range"] == {"start": 1_700_000_000_000_000, "end": 1_700_000_001_000_000}
    assert meta["sensors"]["lidar_ids"] == ["top"]
    assert len(ground["face"].data) == 2  # the road triangles
    assert tracks["tracks_id"] == ["parked", "mover"]
    assert tracks["tracks_timestamps_us"][1] == [1_700_000_000_000_000, 1_700_000_000_100_000, 1_700_000_000_200_000]

    r = load_nurec(p)
    assert r.scene_id == "small" and r.time_origin_us == s.time_origin_us
    assert r.num_triangles == s.num_triangles
    assert r.static.num_triangles == 4
    assert len(r.prototypes) == 1  # both tracks share the stored prototype (not box proxies)
    assert [i.prototype for i in r.instances] == [0, 0]
    np.testing.assert_allclose(r.prototypes[0].points, s.prototypes[0].points)
    assert [m.name for m in r.materials] == [m.name for m in s.materials]
    assert [m.material_id for m in r.materials] == [m.material_id for m in s.materials]
    assert r.semantic_classes == s.semantic_classes
    assert [(p.name, p.material, p.semantic_class, p.object_id) for p in r.parts] == \
        [(p.name, p.material, p.semantic_class, p.object_id) for p in s.parts]
    # static triangles: mesh.ply (wall, glass) first, then mesh_ground.ply (road)
    assert sorted(r.static.tri_part.tolist()) == sorted(s.static.tri_part.tolist())
    # vertex colours carry the material base colours (through sRGB uchar)
    road_v = r.static.indices[r.static.tri_part == 1].ravel()
    np.testing.assert_allclose(r.static.colors[road_v], 0.05, atol=3e-3)
    parked, mover = r.instances
    assert parked.object_id == 10 and mover.object_id == 11
    np.testing.assert_allclose(parked.rotations[0], s.instances[0].rotations[0], atol=1e-12)
    np.testing.assert_allclose(mover.translations, s.instances[1].translations)
    np.testing.assert_allclose(mover.times, [0.0, 0.1, 0.2])
    np.testing.assert_allclose(mover.cuboid, [2, 2, 1])
    np.testing.assert_allclose(parked.cuboid, [2, 2, 1])  # from the prototype bounds
    assert r.semantic_classes[mover.semantic_class] == "car"
    np.testing.assert_allclose(r.ego_trajectory.translations, s.ego_trajectory.translations)
    cam = r.cameras["cam"]
    assert cam.model == "opencv_pinhole" and cam.resolution == (640, 480) and cam.shutter_type == "GLOBAL"
    assert cam.params == s.cameras["cam"].params and cam.unique_id == "cam@x"
    np.testing.assert_allclose(cam.camera_to_rig[1], s.cameras["cam"].camera_to_rig[1], atol=1e-12)
    assert r.metadata["sensor_rig"] == s.metadata["sensor_rig"]


def test_write_is_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a.usdz", tmp_path / "b.usdz"
    write_nurec(_small_scene(), a)
    write_nurec(_small_scene(), b)
    assert a.read_bytes() == b.read_bytes()
    c = tmp_path / "c.usdz"  # loading and writing again gives the same file
    write_nurec(load_nurec(a), c)
    assert c.read_bytes() == a.read_bytes()


def test_rle() -> None:
    v = np.array([3, 3, 3, 1, 1, 7, 3, 3])
    assert rle_encode(v) == [3, 3, 1, 2, 7, 1, 3, 2]
    np.testing.assert_array_equal(rle_decode(rle_encode(v)), v)
    assert rle_encode([]) == [] and len(rle_decode([])) == 0


@pytest.mark.parametrize(
    "case, match",
    [
        ("missing_file", r"nope\.usdz: no such file"),
        ("not_zip", r"not a zip"),
        ("no_metadata", r"missing member metadata\.yaml"),
        ("no_scene_id", r"metadata\.yaml: missing field 'scene_id'"),
        ("bad_yaml", r"metadata\.yaml: malformed YAML"),
        ("bad_json_rig", r"rig_trajectories\.json: malformed JSON"),
        ("bad_json_tracks", r"sequence_tracks\.json: malformed JSON"),
        ("bad_index", r"mesh\.ply: face 1 vertex index out of range"),
        ("nan_vertex", r"mesh\.ply: non-finite .*vertex at index 2"),
        ("not_ply", r"mesh_ground\.ply: not a readable PLY"),
        ("no_mesh", r"missing member mesh\.ply"),
        ("track_lengths", r"sequence_tracks\.json: seq-A: track car_1: 3 timestamps but 2 poses"),
        ("bad_camera", r"camera_calibrations\.cam_front@rig0\.camera_model: unknown type"),
    ],
)
def test_bad_input_raises_scene_error(tmp_path: Path, case: str, match: str) -> None:
    p = tmp_path / "clip.usdz"
    if case == "missing_file":
        p = tmp_path / "nope.usdz"
    elif case == "not_zip":
        p.write_text("this is not a zip archive")
    else:
        over: dict[str, bytes | None] = {}
        if case == "no_metadata":
            over["metadata.yaml"] = None
        elif case == "no_scene_id":
            over["metadata.yaml"] = yaml.safe_dump({"version_string": "1", "time_range": {"start": 0}}).encode()
        elif case == "bad_yaml":
            over["metadata.yaml"] = b"scene_id: [unclosed\n  - : :"
        elif case == "bad_json_rig":
            over["rig_trajectories.json"] = b'{"rig_trajectories": [1, 2,'
        elif case == "bad_json_tracks":
            over["sequence_tracks.json"] = b"not json"
        elif case == "bad_index":
            over["mesh.ply"] = _ply_plane(bad_index=True)
        elif case == "nan_vertex":
            over["mesh.ply"] = _ply_plane(nan=True)
        elif case == "not_ply":
            over["mesh_ground.ply"] = b"garbage\x00\x01"
        elif case == "no_mesh":
            over["mesh.ply"] = None
            over["mesh_ground.ply"] = None
        elif case == "track_lengths":
            doc = _tracks_doc()
            doc["seq-A"]["tracks_data"]["tracks_poses"][0].pop()
            over["sequence_tracks.json"] = json.dumps(doc).encode()
        elif case == "bad_camera":
            doc = _rig_doc()
            doc["camera_calibrations"]["cam_front@rig0"]["camera_model"]["type"] = "weird"
            over["rig_trajectories.json"] = json.dumps(doc).encode()
        _write_zip(p, _members(**over))
    with pytest.raises(SceneError, match=match) as ei:
        load_nurec(p)
    assert p.name in str(ei.value)


def test_usd_layer_in_the_archive_gives_the_geometry(tmp_path: Path) -> None:
    from wsim.scene import usd

    assert hasattr(usd, "load_usd")
    layer = b"""#usda 1.0
(
    metersPerUnit = 1
    upAxis = "Z"
)
def Xform "World"
{
    def Mesh "tri"
    {
        int[] faceVertexCounts = [3, 3, 3]
        int[] faceVertexIndices = [0, 1, 2, 0, 2, 3, 0, 3, 1]
        point3f[] points = [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]
    }
}
"""
    p = _write_zip(tmp_path / "layer.usdz", _members(**{"scene.usda": layer}))
    s = load_nurec(p)
    assert s.static.num_triangles == 3  # from the USD layer, not the PLY meshes
    assert s.scene_id == "clipgt-test-0001"
    assert [i.name for i in s.instances][-2:] == ["car_1", "ped_2"]
    assert "camera_front_wide_120fov" in s.cameras
