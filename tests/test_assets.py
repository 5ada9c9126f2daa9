"""Mesh files as scenes and assets: glTF 2.0 / GLB, OBJ + MTL and PLY written by trimesh and read back by
``wsim.load_scene`` (geometry, hierarchy, instancing, materials, textures, the mapping file, units and axes), bad files,
a lidar sweep of a glTF scene against the same scene authored in USD, ``Scene.add_asset`` and the city tiler."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import trimesh
from PIL import Image

import wsim
from wsim.scene import Instance, Material, MeshData, Part, Scene, SceneError, Trajectory
from wsim.scene.builtin import CITY_OBJECT_ID_STRIDE, CITY_TILE, build_city, build_street_scene
from wsim.scene.builtin import main as builtin_main
from wsim.scene.loader import SCENE_SUFFIXES
from wsim.scene.nurec_format import linear_to_srgb, srgb_to_linear
from wsim.scene.transforms import compose_matrix, quat_from_axis_angle, quat_to_matrix
from wsim.scene.usd import load_usd, save_usd

# wsim (Z up) → glTF (Y up): p_gltf = G p_wsim with G = Rx(-90°): (x, y, z) → (x, z, -y)
G = np.array([[1.0, 0, 0, 0], [0, 0, 1, 0], [0, -1, 0, 0], [0, 0, 0, 1]])
G_INV = G.T

CAR_SIZE = (4.5, 1.9, 1.0)
CABIN = ((-0.9, 0.0, 0.8), (2.0, 1.6, 0.6))  # centre, size (z from the car's origin)
BLOCK_T = np.array([2.0, 1.0, 0.0])
CARS_YAW = 0.1
CARS = {"car_a": ((6.0, -3.0, 0.5), 0.3), "car_b": ((-7.0, 4.0, 0.5), -2.0)}
PAINT_FACTOR = (0.2, 0.4, 0.6)
GLASS_TRANSMISSION = 0.8
COLORS = {"car_paint": PAINT_FACTOR, "car_glass": (0.1, 0.1, 0.1), "wall_concrete": (0.5, 0.45, 0.4),
          "ground_asphalt": (0.05, 0.05, 0.05)}
MAPPING = {
    "semantic_classes": {"car_*": "car", "building*": "building", "ground": "road"},
    "materials": {"ground_asphalt": "asphalt", "wall*": {"base": "concrete", "reflectance": 0.42},
                  "car_paint": {"base": "steel", "coating": "paint"},
                  "car_glass": {"base": "clear_glass", "attributes": ["visually_transparent"]}},
}


def _box(center, size) -> tuple[np.ndarray, np.ndarray]:
    b = trimesh.creation.box(size)
    return np.asarray(b.vertices) + np.asarray(center, float), np.asarray(b.faces)


def _ground() -> tuple[np.ndarray, np.ndarray]:
    p = np.array([[-30, -30, 0], [30, -30, 0], [30, 30, 0], [-30, 30, 0]], float)
    return p, np.array([[0, 1, 2], [0, 2, 3]])


def _to_gltf(points: np.ndarray) -> np.ndarray:
    return points @ G[:3, :3].T


def _mat_gltf(m_wsim: np.ndarray) -> np.ndarray:
    return G @ m_wsim @ G_INV


def _yaw(t, yaw) -> np.ndarray:
    return compose_matrix(np.asarray(t, float), quat_from_axis_angle([0, 0, 1], yaw))


def _car_uv(n: int) -> np.ndarray:
    return np.random.default_rng(3).random((n, 2))


def _texture_image() -> Image.Image:
    img = np.zeros((8, 16, 3), np.uint8)
    img[:, :8] = (255, 0, 0)
    img[:, 8:] = (0, 128, 255)
    return Image.fromarray(img, "RGB")


def write_gltf_scene(folder: Path, name: str = "street", *, glb: bool = True) -> Path:
    """The test street as glTF written by trimesh: city → block → {ground, building_01, cars → {car_a_body,
    car_a_cabin, car_b_body, car_b_cabin}}; both cars share the body mesh (textured paint) and the cabin mesh (glass,
    with KHR_materials_transmission added to the JSON)."""
    paint = trimesh.visual.material.PBRMaterial(name="car_paint", baseColorFactor=[*PAINT_FACTOR, 1.0],
                                                baseColorTexture=_texture_image())
    glass = trimesh.visual.material.PBRMaterial(name="car_glass", baseColorFactor=[0.1, 0.1, 0.1, 1.0])
    p, f = _box((0, 0, 0), CAR_SIZE)
    body = trimesh.Trimesh(_to_gltf(p), f, process=False)
    body.visual = trimesh.visual.TextureVisuals(uv=_car_uv(len(p)), material=paint)
    p, f = _box(*CABIN)
    cabin = trimesh.Trimesh(_to_gltf(p), f, process=False)
    cabin.visual = trimesh.visual.TextureVisuals(material=glass)
    wall = trimesh.visual.material.PBRMaterial(name="wall_concrete", baseColorFactor=[0.5, 0.45, 0.4, 1.0])
    p, f = _box((15.0, 0.0, 4.0), (6.0, 12.0, 8.0))
    building = trimesh.Trimesh(_to_gltf(p), f, process=False)
    building.visual = trimesh.visual.TextureVisuals(material=wall)
    asphalt = trimesh.visual.material.PBRMaterial(name="ground_asphalt", baseColorFactor=[0.05, 0.05, 0.05, 1.0])
    p, f = _ground()
    ground = trimesh.Trimesh(_to_gltf(p), f, process=False)
    ground.visual = trimesh.visual.TextureVisuals(material=asphalt)

    s = trimesh.Scene()
    base = s.graph.base_frame
    s.graph.update(frame_from=base, frame_to="city", matrix=np.eye(4))
    s.graph.update(frame_from="city", frame_to="block", matrix=_mat_gltf(compose_matrix(BLOCK_T, [0, 0, 0, 1])))
    s.add_geometry(ground, geom_name="ground", node_name="ground", parent_node_name="block")
    s.add_geometry(building, geom_name="building_01", node_name="building_01", parent_node_name="block")
    s.graph.update(frame_from="block", frame_to="cars", matrix=_mat_gltf(_yaw((0, 0, 0), CARS_YAW)))
    s.add_geometry(body, geom_name="car_body", node_name="car_a_body", parent_node_name="cars")
    s.add_geometry(cabin, geom_name="car_cabin", node_name="car_a_cabin", parent_node_name="cars")
    for node, (t, yaw) in CARS.items():
        m = _mat_gltf(_yaw(t, yaw))
        s.graph.update(frame_from="cars", frame_to=f"{node}_body", geometry="car_body", matrix=m)
        s.graph.update(frame_from="cars", frame_to=f"{node}_cabin", geometry="car_cabin", matrix=m)
    def patch(doc: dict) -> dict:
        for mat in doc["materials"]:  # trimesh stores colours as 8-bit: write the exact factors back
            mat["pbrMetallicRoughness"]["baseColorFactor"] = [*COLORS[mat["name"]], 1.0]
            if mat["name"] == "car_glass":
                mat.setdefault("extensions", {})["KHR_materials_transmission"] = {
                    "transmissionFactor": GLASS_TRANSMISSION}
        doc.setdefault("extensionsUsed", []).append("KHR_materials_transmission")
        return doc

    folder.mkdir(parents=True, exist_ok=True)
    if not glb:  # .gltf + .bin buffers + the PNG, as trimesh writes them
        files = trimesh.exchange.gltf.export_gltf(s)
        for fname, data in files.items():
            if fname != "model.gltf":
                (folder / fname).write_bytes(data)
        path = folder / f"{name}.gltf"
        path.write_text(json.dumps(patch(json.loads(files["model.gltf"]))))
        return path
    data = trimesh.exchange.gltf.export_glb(s)
    (n,) = struct.unpack_from("<I", data, 12)
    js = json.dumps(patch(json.loads(data[20 : 20 + n]))).encode()
    js += b" " * (-len(js) % 4)
    rest = data[20 + n :]  # the BIN chunk, header included
    path = folder / f"{name}.glb"
    path.write_bytes(struct.pack("<4sII", b"glTF", 2, 12 + 8 + len(js) + len(rest)) + struct.pack("<I4s", len(js), b"JSON")
                     + js + rest)
    return path


def reference_scene() -> Scene:
    """The same street built directly in wsim (Z up, metres) with the materials the mapping gives."""
    s = Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0)), source="reference")
    mats = {
        "ground": s.add_material(Material.from_labels("ground_asphalt", "asphalt", base_color=(0.05, 0.05, 0.05))),
        "wall": s.add_material(Material.from_labels("wall_concrete", "concrete", reflectance=0.42,
                                                    base_color=(0.5, 0.45, 0.4))),
        "paint": s.add_material(Material.from_labels("car_paint", "steel", "paint", base_color=PAINT_FACTOR)),
        "glass": s.add_material(Material.from_labels("car_glass", "clear_glass", "none", ["visually_transparent"],
                                                     transmittance=GLASS_TRANSMISSION, base_color=(0.1, 0.1, 0.1))),
    }
    block = compose_matrix(BLOCK_T, [0, 0, 0, 1])
    static = []
    for k, (name, geom, mat, cls) in enumerate([("ground", _ground(), "ground", "road"),
                                                ("building_01", _box((15.0, 0.0, 4.0), (6.0, 12.0, 8.0)), "wall",
                                                 "building")]):
        part = s.add_part(Part(f"/{name}", mats[mat], s.semantic_class_index(cls), k + 1))
        p, f = geom
        static.append(MeshData(p @ block[:3, :3].T + block[:3, 3], f, part))
    s.static = MeshData.concatenate(static, "static")
    body = s.add_part(Part("/car/body", mats["paint"], 0, 0))
    cabin = s.add_part(Part("/car/cabin", mats["glass"], 0, 0))
    pb, fb = _box((0, 0, 0), CAR_SIZE)
    pc, fc = _box(*CABIN)
    s.prototypes.append(MeshData.concatenate([MeshData(pb, fb, body), MeshData(pc, fc, cabin)], "car"))
    car = s.semantic_class_index("car")
    for k, (node, (t, yaw)) in enumerate(CARS.items()):
        w = block @ _yaw((0, 0, 0), CARS_YAW) @ _yaw(t, yaw)
        s.instances.append(Instance(0, [0.0], w[:3, 3][None], quat_from_axis_angle([0, 0, 1], CARS_YAW + yaw)[None],
                                    object_id=10 + k, name=node, semantic_class=car))
    s.validate()
    return s


def _world_triangles(scene: Scene) -> np.ndarray:
    """Every triangle's corners in world coordinates, (M, 3, 3), sorted canonically."""
    tris = [scene.static.points[scene.static.indices].astype(np.float64)]
    for inst in scene.instances:
        pr = scene.prototypes[inst.prototype]
        m = quat_to_matrix(inst.rotations[0]) * inst.scales[0][None, :]
        tris.append((pr.points.astype(np.float64) @ m.T + inst.translations[0])[pr.indices])
    t = np.concatenate(tris)
    c = t.mean(axis=1)
    return t[np.lexsort(np.round(c, 4).T[::-1])]


@pytest.fixture(scope="module")
def street_files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("street")
    glb = write_gltf_scene(d / "glb")
    gltf = write_gltf_scene(d / "gltf", glb=False)
    for p in (glb, gltf):
        (p.parent / f"{p.stem}.wsim.yaml").write_text(json.dumps(MAPPING))  # JSON is YAML
    return {"glb": glb, "gltf": gltf}


# --------------------------------------------------------------------------------------------------- glTF
@pytest.mark.parametrize("form", ["glb", "gltf"])
def test_gltf_geometry_hierarchy_and_instancing(street_files, form):
    scene = wsim.load_scene(street_files[form])
    ref = reference_scene()
    assert scene.num_triangles == ref.num_triangles == 2 + 12 + 2 * 24
    assert scene.static.num_triangles == 14
    # the two car meshes (body, cabin) are each shared by two nodes: two prototypes, four instances
    assert len(scene.prototypes) == 2 and len(scene.instances) == 4
    assert sorted(p.num_triangles for p in scene.prototypes) == [12, 12]
    np.testing.assert_allclose(_world_triangles(scene), _world_triangles(ref), atol=1e-5)
    by_name = {i.name.rsplit("/", 1)[-1]: i for i in scene.instances}
    for node, (t, yaw) in CARS.items():
        w = compose_matrix(BLOCK_T, [0, 0, 0, 1]) @ _yaw((0, 0, 0), CARS_YAW) @ _yaw(t, yaw)
        for kind in ("body", "cabin"):
            inst = by_name[f"{node}_{kind}"]
            np.testing.assert_allclose(inst.translations[0], w[:3, 3], atol=1e-6)
            np.testing.assert_allclose(quat_to_matrix(inst.rotations[0]), w[:3, :3], atol=1e-6)
            np.testing.assert_allclose(inst.scales[0], 1.0, atol=1e-6)
    assert by_name["car_a_body"].prototype == by_name["car_b_body"].prototype
    assert by_name["car_a_body"].prototype != by_name["car_a_cabin"].prototype
    assert scene.instances[0].name.startswith("/city/block/cars/")
    ids = [p.object_id for p in scene.parts if p.object_id] + [i.object_id for i in scene.instances]
    assert len(ids) == len(set(ids)) == 6
    assert scene.metadata["mesh_file"]["up_axis"] == "Y" and scene.metadata["mesh_file"]["format"] == "gltf"


@pytest.mark.parametrize("form", ["glb", "gltf"])
def test_gltf_materials_textures_and_mapping(street_files, form):
    scene = wsim.load_scene(street_files[form])
    mats = {m.name.split(":", 1)[1]: m for m in scene.materials[1:]}
    assert set(mats) == {"car_paint", "car_glass", "wall_concrete", "ground_asphalt"}
    ref = {m.name: m for m in reference_scene().materials}
    for name, m in mats.items():
        r = ref[name]
        assert m.material_id == r.material_id, name
        assert m.reflectance == pytest.approx(r.reflectance) and m.transmittance == pytest.approx(r.transmittance)
        np.testing.assert_allclose(m.base_color, r.base_color, atol=1e-7)  # float factors, not 8-bit
    assert mats["car_glass"].transmittance == pytest.approx(GLASS_TRANSMISSION)  # KHR_materials_transmission
    assert mats["wall_concrete"].reflectance == pytest.approx(0.42)
    # the texture, tinted by the base colour factor (glTF: colour = factor x texture)
    tex = mats["car_paint"].texture
    assert tex and Path(tex).is_file() and mats["car_glass"].texture is None
    with Image.open(tex) as im:
        rgb = np.asarray(im.convert("RGB"), np.float64) / 255.0
    assert rgb.shape == (8, 16, 3)
    expect = linear_to_srgb(srgb_to_linear(np.array([[1.0, 0, 0], [0, 128 / 255, 1.0]])) * PAINT_FACTOR)
    np.testing.assert_allclose(rgb[0, 0], expect[0], atol=1 / 255)
    np.testing.assert_allclose(rgb[0, 15], expect[1], atol=1 / 255)
    # UVs: glTF's top-left origin back to USD st, exactly trimesh's (bottom-left) UVs per corner
    body = next(p for p in scene.prototypes if scene.parts[p.tri_part[0]].name.endswith("car_paint"))
    assert body.uvs is not None and body.uvs.shape == (12, 3, 2)
    uv = _car_uv(8)
    corner = {tuple(np.round(_to_gltf(_box((0, 0, 0), CAR_SIZE)[0])[i] @ G[:3, :3], 5)): uv[i] for i in range(8)}
    for t in range(12):
        for c in range(3):
            key = tuple(np.round(body.points[body.indices[t, c]].astype(np.float64), 5))
            np.testing.assert_allclose(body.uvs[t, c], corner[key], atol=1e-6)
    # semantic classes from the mapping: node names for static parts and instances
    cls = {p.name.rsplit("/", 1)[-1].split(".")[0]: scene.semantic_classes[p.semantic_class] for p in scene.parts[1:]
           if p.object_id}
    assert cls == {"ground": "road", "building_01": "building"}
    assert {scene.semantic_classes[i.semantic_class] for i in scene.instances} == {"car"}
    assert scene.metadata["mesh_file"]["mapping"].endswith(".wsim.yaml")


def test_mapping_argument_and_units(street_files, tmp_path):
    path = street_files["glb"]
    bare = wsim.load_scene(path, mapping=False)
    glass = next(m for m in bare.materials if m.name.endswith("car_glass"))
    assert bare.semantic_classes == ["unlabeled"]
    assert all(m.material_id == 0 for m in bare.materials[1:] if m is not glass)
    assert glass.transmittance == pytest.approx(GLASS_TRANSMISSION) and glass.material_id == 8 << 11
    yml = tmp_path / "map.yaml"
    yml.write_text("semantic_classes:\n  'CAR_*': vehicle\nmaterials:\n  '*': {base: plastic}\n"
                   "meters_per_unit: 0.5\nup_axis: Z\n")
    s = wsim.load_scene(path, mapping=yml)
    assert {s.semantic_classes[i.semantic_class] for i in s.instances} == {"vehicle"}
    assert {m.name.split(":")[1]: m.material_id for m in s.materials[1:]} == {
        "car_paint": 11, "car_glass": 11 | 8 << 11, "wall_concrete": 11, "ground_asphalt": 11}  # transparency kept
    # Z up, half-metre units: the file's coordinates scaled and not rotated
    full = wsim.load_scene(path, mapping=False, up_axis="Z")
    np.testing.assert_allclose(s.static.points, full.static.points * 0.5, atol=1e-6)
    yup = bare.static.points
    np.testing.assert_allclose(full.static.points[:, [0, 2]] * [1, -1], yup[:, [0, 1]], atol=1e-5)
    assert s.metadata["mesh_file"]["meters_per_unit"] == 0.5


def test_gltf_primitives_trs_nodes_and_data_uris(street_files, tmp_path):
    """The .gltf form edited as other writers lay files out: both car meshes as two primitives of one mesh, node
    transforms as translation/rotation/scale, the buffers and the image inline as data URIs."""
    import base64

    from wsim.scene.transforms import decompose_matrix

    folder = street_files["gltf"].parent
    doc = json.loads(street_files["gltf"].read_text())
    names = [m["name"] for m in doc["meshes"]]
    body, cabin = names.index("car_body"), names.index("car_cabin")
    doc["meshes"][body]["primitives"] += doc["meshes"][cabin]["primitives"]
    for node in doc["nodes"]:
        if node.get("mesh") == cabin:
            del node["mesh"]
        if "matrix" in node:
            t, q, sc = decompose_matrix(np.array(node.pop("matrix")).reshape(4, 4).T)
            node.update(translation=t.tolist(), rotation=q.tolist(), scale=sc.tolist())
    for b in doc["buffers"]:
        b["uri"] = "data:application/octet-stream;base64," + base64.b64encode((folder / b["uri"]).read_bytes()).decode()
    for im in doc.get("images", []):
        if "uri" in im:
            im["uri"] = "data:image/png;base64," + base64.b64encode((folder / im["uri"]).read_bytes()).decode()
    path = tmp_path / "street.gltf"  # a folder of its own: nothing beside it to resolve
    path.write_text(json.dumps(doc))
    scene = wsim.load_scene(path, mapping=MAPPING)
    ref = reference_scene()
    assert len(scene.prototypes) == 1 and len(scene.instances) == 2
    assert scene.prototypes[0].num_triangles == 24
    assert len({scene.parts[p].material for p in scene.prototypes[0].tri_part}) == 2  # one part per primitive
    np.testing.assert_allclose(_world_triangles(scene), _world_triangles(ref), atol=1e-5)
    paint = next(m for m in scene.materials if m.name.endswith("car_paint"))
    assert paint.texture and Path(paint.texture).is_file()


# --------------------------------------------------------------------------------------------------- OBJ, PLY
def _write_obj(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    a = trimesh.Trimesh(*_box((0, 0, 0.5), (1.0, 2.0, 1.0)), process=False)
    uv = np.random.default_rng(1).random((8, 2))
    a.visual = trimesh.visual.TextureVisuals(uv=uv, material=trimesh.visual.material.SimpleMaterial(
        name="body_paint", diffuse=[200, 20, 20, 255], image=_texture_image()))
    b = trimesh.Trimesh(*_box((3.0, 0, 1.0), (1.0, 1.0, 2.0)), process=False)
    b.visual = trimesh.visual.TextureVisuals(material=trimesh.visual.material.SimpleMaterial(
        name="window_glass", diffuse=[20, 20, 20, 255]))
    s = trimesh.Scene()
    s.add_geometry(a, node_name="car_body", geom_name="car_body")
    s.add_geometry(b, node_name="car_window", geom_name="car_window")
    path = folder / "car.obj"
    trimesh.exchange.export.export_scene(s, path)
    mtl = folder / "material.mtl"
    assert mtl.is_file()
    text = mtl.read_text().replace("newmtl window_glass\n", "newmtl window_glass\nd 0.25\n")
    mtl.write_text(text)
    return path


def test_obj_with_mtl(tmp_path):
    path = _write_obj(tmp_path / "obj")
    (tmp_path / "obj" / "car.wsim.yaml").write_text(
        "semantic_classes:\n  car_*: car\nmaterials:\n  '*glass*': {base: clear_glass}\n")
    s = wsim.load_scene(path)
    assert s.num_triangles == 24 and not s.instances and s.metadata["mesh_file"]["up_axis"] == "Z"
    lo, hi = s.static.points.min(0), s.static.points.max(0)
    np.testing.assert_allclose(lo, [-0.5, -1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(hi, [3.5, 1.0, 2.0], atol=1e-6)
    mats = {m.name.split(":", 1)[1]: m for m in s.materials[1:]}
    assert set(mats) == {"body_paint", "window_glass"}
    # MTL Kd as written (floats, linear), map_Kd as the texture, d 0.25 → 75 % transmitted
    np.testing.assert_allclose(mats["body_paint"].base_color, np.array([200, 20, 20]) / 255, atol=1e-7)
    assert mats["body_paint"].texture and Path(mats["body_paint"].texture).is_file()
    with Image.open(mats["body_paint"].texture) as im:
        assert im.size == (16, 8) and im.convert("RGB").getpixel((0, 0)) == (255, 0, 0)
    assert mats["window_glass"].transmittance == pytest.approx(0.75)
    assert mats["window_glass"].material_id == 19 | (8 << 11)  # clear_glass from the mapping, transparent
    assert s.static.uvs is not None and s.static.uvs.shape == (24, 3, 2)
    painted = np.array([s.materials[s.parts[p].material].name.endswith("body_paint") for p in s.static.tri_part])
    got = np.sort(s.static.uvs[painted].reshape(-1, 2), axis=0)
    want = np.sort(np.random.default_rng(1).random((8, 2))[trimesh.creation.box((1, 2, 1)).faces].reshape(-1, 2),
                   axis=0)
    np.testing.assert_allclose(got, want, atol=1e-6)  # OBJ vt is already bottom-left st
    parts = {p.name: p for p in s.parts[1:]}
    assert {s.semantic_classes[p.semantic_class] for p in parts.values()} == {"car"}
    assert len({p.object_id for p in parts.values()}) == 2


def test_ply_vertex_colours_and_axes(tmp_path):
    p, f = _box((1.0, 2.0, 3.0), (2.0, 4.0, 6.0))
    colors = np.random.default_rng(2).integers(0, 256, (8, 4)).astype(np.uint8)
    colors[:, 3] = 255
    mesh = trimesh.Trimesh(p, f, vertex_colors=colors, process=False)
    path = tmp_path / "block.ply"
    path.write_bytes(trimesh.exchange.ply.export_ply(mesh, encoding="binary"))
    s = wsim.load_scene(path)
    assert s.num_triangles == 12
    np.testing.assert_allclose(s.static.points, p, atol=1e-6)
    np.testing.assert_allclose(s.static.colors, srgb_to_linear(colors[:, :3] / 255.0), atol=1e-6)
    (tmp_path / "block.wsim.yaml").write_text("semantic_classes: {block: building}\nmaterials: {block: brick}\n")
    y = wsim.load_scene(path, up_axis="Y", meters_per_unit=0.1)
    np.testing.assert_allclose(y.static.points, 0.1 * np.stack([p[:, 0], -p[:, 2], p[:, 1]], 1), atol=1e-6)
    assert y.semantic_classes[y.parts[y.static.tri_part[0]].semantic_class] == "building"
    assert y.materials[y.parts[y.static.tri_part[0]].material].material_id == 38  # brick
    ascii_path = tmp_path / "ascii.ply"
    ascii_path.write_bytes(trimesh.exchange.ply.export_ply(mesh, encoding="ascii"))
    np.testing.assert_allclose(wsim.load_scene(ascii_path).static.points, p, atol=1e-6)


# --------------------------------------------------------------------------------------------------- bad files
def _bad(path: Path, match: str, **kw) -> None:
    with pytest.raises(SceneError) as e:
        wsim.load_scene(path, **kw)
    assert str(path) in str(e.value), e.value
    assert match in str(e.value), e.value


def test_bad_files_name_the_file(tmp_path, street_files):
    g = tmp_path / "garbage.glb"
    g.write_bytes(b"\x00\x01not a gltf at all")
    _bad(g, "not a glTF file")
    t = tmp_path / "truncated.glb"
    t.write_bytes(street_files["glb"].read_bytes()[:200])
    _bad(t, "GLB")
    doc = json.loads((street_files["gltf"]).read_text())
    for name, edit, match in [
        ("draco", lambda d: d.update(extensionsRequired=["KHR_draco_mesh_compression"]), "KHR_draco_mesh_compression"),
        ("version", lambda d: d["asset"].update(version="1.0"), "glTF 2.0 only"),
        ("accessor", lambda d: d["accessors"][1].update(count=10**6), "do not fit"),
        ("zeros", lambda d: d["accessors"][1].update(count=10**9) or d["accessors"][1].pop("bufferView"),
         "without a bufferView"),
        ("index", lambda d: d["meshes"][0]["primitives"][0].update(indices=99), "accessors index 99 out of range"),
        ("cycle", lambda d: d["nodes"][-1].setdefault("children", []).append(0), "cycle"),
        ("buffer", lambda d: d["buffers"][0].update(uri="missing.bin"), "missing.bin"),
        ("matrix", lambda d: d["nodes"][0].update(matrix=[float("nan")] * 16), "matrix"),
    ]:
        d = json.loads(json.dumps(doc))
        edit(d)
        p = street_files["gltf"].parent / f"bad_{name}.gltf"
        p.write_text(json.dumps(d))
        _bad(p, match, mapping=False)
    o = tmp_path / "empty.obj"
    o.write_text("# nothing here\nv 0 0 0\n")
    _bad(o, "no triangles")
    pc = tmp_path / "points.ply"
    pc.write_bytes(trimesh.exchange.ply.export_ply(trimesh.PointCloud(np.random.rand(10, 3))))
    _bad(pc, "no faces")
    lie = tmp_path / "lie.ply"
    lie.write_bytes(b"ply\nformat binary_little_endian 1.0\nelement vertex 1000000\nproperty float x\n"
                    b"property float y\nproperty float z\nend_header\n" + b"\0" * 12)
    _bad(lie, "PLY header promises")
    bad_map = tmp_path / "m.yaml"
    bad_map.write_text("materials:\n  '*': {base: unobtainium}\n")
    with pytest.raises(SceneError, match="m.yaml.*unobtainium"):
        wsim.load_scene(street_files["glb"], mapping=bad_map)
    bad_map.write_text("semantic: {a: b}\n")
    with pytest.raises(SceneError, match="m.yaml: unknown key"):
        wsim.load_scene(street_files["glb"], mapping=bad_map)
    with pytest.raises(SceneError, match="apply to glTF, OBJ and PLY files only"):
        wsim.load_scene("builtin", mapping={})
    unknown = tmp_path / "x.fbx"
    unknown.write_bytes(b"x")
    _bad(unknown, "unknown scene file type")
    assert {".gltf", ".glb", ".obj", ".ply", ".usdz"} <= SCENE_SUFFIXES


# --------------------------------------------------------------------------------------------------- lidar
def _sweep(scene: Scene) -> dict[str, np.ndarray]:
    rig = Trajectory([0.0], [[0.0, 0.0, 1.8]], [[0.0, 0.0, 0.0, 1.0]])
    lid = wsim.Lidar.preset("PANDAR128", scene=scene, trajectory=rig, device="cpu", ray_type="IDEALIZED")
    pc = lid.render(0.0, 0.1)
    assert pc.count > 100_000
    return pc.numpy()


def test_lidar_sweep_of_gltf_equals_usd(street_files, tmp_path):
    usd_path = tmp_path / "street.usda"
    save_usd(reference_scene(), usd_path)
    a = _sweep(wsim.load_scene(street_files["glb"]))
    b = _sweep(load_usd(usd_path))
    assert a["Counts"][0] == b["Counts"][0]
    for k in ("Coordinates", "Intensity", "TimeOffsetNs", "EmitterId"):
        assert a[k].shape == b[k].shape, k
        np.testing.assert_allclose(a[k], b[k], atol=1e-5, rtol=0, err_msg=k)
    assert np.array_equal(a["SemanticId"], b["SemanticId"])
    # the sweep sees the cars (through the glass cabins too) and the building
    names = {k: i for i, k in enumerate(wsim.load_scene(street_files["glb"]).semantic_classes)}
    hit = set(np.unique(a["SemanticId"]).tolist())
    assert {names["car"], names["building"], names["road"]} <= hit


# --------------------------------------------------------------------------------------------------- add_asset
def test_add_asset_instances_and_trajectory(tmp_path, street_files):
    path = _write_obj(tmp_path / "asset")
    scene = wsim.load_scene(street_files["glb"])
    n_tris, n_inst = scene.num_triangles, len(scene.instances)
    top = max([p.object_id for p in scene.parts] + [i.object_id for i in scene.instances])
    q = quat_from_axis_angle([0, 0, 1], np.pi / 2)
    placed = scene.add_asset(path, [((0.0, 10.0, 0.0), (0, 0, 0, 1)), ((0.0, -10.0, 0.0), q)], semantic_class="truck")
    assert [i.object_id for i in placed] == [top + 1, top + 2]
    assert placed[0].prototype == placed[1].prototype == len(scene.prototypes) - 1
    assert scene.num_triangles == n_tris + 2 * 24 and len(scene.instances) == n_inst + 2
    assert scene.semantic_classes[placed[0].semantic_class] == "truck"
    np.testing.assert_allclose(placed[1].rotations[0], q)
    traj = Trajectory([0.0, 1.0, 2.0], [[0, 20, 0], [5, 20, 0], [10, 20, 0]], [[0, 0, 0, 1]] * 3)
    (mover,) = scene.add_asset(path, traj, object_id=5000, name="mover")
    assert mover.is_moving and mover.object_id == 5000 and mover.name == "mover"
    assert scene.time_range == (0.0, 2.0)
    assert len(scene.prototypes) == 4  # each call adds its own prototype; one call places many instances
    scene.validate()
    geo = scene.device_geometry("cpu")
    assert geo is not None
    with pytest.raises(SceneError, match="poses\\[0\\]"):
        scene.add_asset(path, [((0, 0), (0, 0, 0, 1))])
    with pytest.raises(SceneError, match="no such mesh file"):
        scene.add_asset(tmp_path / "nope.glb", [((0, 0, 0), (0, 0, 0, 1))])


# --------------------------------------------------------------------------------------------------- city
def test_city_tiler_counts(tmp_path):
    block = build_street_scene()
    city = build_city(3, 2, block=block)
    assert city.num_triangles == 6 * block.num_triangles
    assert city.static.num_triangles == 6 * block.static.num_triangles
    assert len(city.instances) == 6 * len(block.instances) and len(city.prototypes) == len(block.prototypes)
    ids = [i.object_id for i in city.instances]
    assert len(set(ids)) == len(ids)
    static_ids = {city.parts[p].object_id for p in np.unique(city.static.tri_part)}
    assert len(static_ids) == 6 * len({block.parts[p].object_id for p in np.unique(block.static.tri_part)})
    assert max(ids) < 6 * CITY_OBJECT_ID_STRIDE and not static_ids & set(ids)
    lo, hi = city.static.points.min(0), city.static.points.max(0)
    blo, bhi = block.static.points.min(0), block.static.points.max(0)
    np.testing.assert_allclose(hi - lo, bhi - blo + [2 * CITY_TILE[0], CITY_TILE[1], 0], atol=1e-3)
    assert city.scene_id == "wsim-city-3x2" and city.ego_trajectory is block.ego_trajectory
    with pytest.raises(ValueError):
        build_city(0, 3)
    assert builtin_main(["--city", "2", "1", "--out", str(tmp_path)]) == 0
    back = wsim.load_scene(tmp_path / "city_2x1.usdc")
    assert back.num_triangles == 2 * block.num_triangles and len(back.instances) == 2 * len(block.instances)
