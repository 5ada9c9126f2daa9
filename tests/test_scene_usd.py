"""USD stage loading and saving (wsim.scene.usd), on files written with pxr directly."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from pxr import Gf, Sdf, Usd, UsdGeom, UsdShade, Vt  # noqa: E402

from wsim.scene.materials import Material, encode_material_id  # noqa: E402
from wsim.scene.scene import CameraCalibration, Instance, MeshData, Part, Scene, SceneError, Trajectory  # noqa: E402
from wsim.scene.transforms import quat_to_matrix  # noqa: E402
from wsim.scene.usd import TIME_CODES_PER_SECOND, load_usd, save_usd  # noqa: E402


# ----------------------------------------------------------------------------------------------------------------------
# helpers that author stages with pxr directly
# ----------------------------------------------------------------------------------------------------------------------


def new_stage(path, up="Z", mpu=1.0, tcps=None):
    stage = Usd.Stage.CreateNew(str(path))
    UsdGeom.SetStageUpAxis(stage, up)
    UsdGeom.SetStageMetersPerUnit(stage, mpu)
    if tcps is not None:
        stage.SetTimeCodesPerSecond(tcps)
    world = UsdGeom.Xform.Define(stage, "/World")
    stage.SetDefaultPrim(world.GetPrim())
    return stage


def add_mesh(stage, path, points, counts, indices):
    m = UsdGeom.Mesh.Define(stage, path)
    m.CreatePointsAttr([Gf.Vec3f(*map(float, p)) for p in points])
    m.CreateFaceVertexCountsAttr(list(map(int, counts)))
    m.CreateFaceVertexIndicesAttr(list(map(int, indices)))
    return m


def add_triangle(stage, path, z=0.0):
    return add_mesh(stage, path, [(0, 0, z), (1, 0, z), (0, 1, z)], [3], [0, 1, 2])


def add_material(stage, path, color=(0.8, 0.1, 0.1), base=None, coating=None, attributes=None, reflectance=None):
    mat = UsdShade.Material.Define(stage, path)
    sh = UsdShade.Shader.Define(stage, path + "/Surface")
    sh.CreateIdAttr("UsdPreviewSurface")
    sh.CreateInput("diffuseColor", Sdf.ValueTypeNames.Color3f).Set(Gf.Vec3f(*color))
    mat.CreateSurfaceOutput().ConnectToSource(sh.ConnectableAPI(), "surface")
    prim = mat.GetPrim()
    if base is not None:
        prim.CreateAttribute("omni:simready:nonvisual:base", Sdf.ValueTypeNames.Token).Set(base)
    if coating is not None:
        prim.CreateAttribute("omni:simready:nonvisual:coating", Sdf.ValueTypeNames.Token).Set(coating)
    if attributes is not None:
        prim.CreateAttribute("omni:simready:nonvisual:attributes", Sdf.ValueTypeNames.TokenArray).Set(attributes)
    if reflectance is not None:
        prim.CreateAttribute("wsim:reflectance", Sdf.ValueTypeNames.Float).Set(reflectance)
    return mat


def bind(prim, mat):
    UsdShade.MaterialBindingAPI.Apply(prim).Bind(mat)


def label(prim, name):
    prim.CreateAttribute("semantics:labels:class", Sdf.ValueTypeNames.TokenArray).Set([name])


def part_of_triangles(scene, mesh):
    return [scene.parts[int(p)] for p in mesh.tri_part]


def material_of_part(scene, part):
    return scene.materials[part.material]


# ----------------------------------------------------------------------------------------------------------------------
# units, axes, geometry
# ----------------------------------------------------------------------------------------------------------------------


def test_centimetre_stage_is_loaded_in_metres(tmp_path):
    f = tmp_path / "cm.usda"
    st = new_stage(f, mpu=0.01)
    add_mesh(st, "/World/M", [(0, 0, 0), (250, 0, 0), (0, 100, 50)], [3], [0, 1, 2])
    st.Save()
    sc = load_usd(f)
    np.testing.assert_allclose(sc.static.points, [[0, 0, 0], [2.5, 0, 0], [0, 1.0, 0.5]], atol=1e-6)
    assert sc.static.num_triangles == 1
    assert sc.scene_id == "cm"
    assert sc.source == str(f)


def test_y_up_stage_is_rotated_to_z_up(tmp_path):
    f = tmp_path / "yup.usda"
    st = new_stage(f, up="Y")
    x = UsdGeom.Xform.Define(st, "/World/X")
    x.AddTranslateOp().Set(Gf.Vec3d(0, 5, 0))  # 5 units up in a Y-up stage
    add_mesh(st, "/World/X/M", [(0, 0, 0), (1, 0, 0), (0, 0, 1)], [3], [0, 1, 2])
    st.Save()
    sc = load_usd(f)
    # (x, y, z) -> (x, -z, y)
    np.testing.assert_allclose(sc.static.points, [[0, 0, 5], [1, 0, 5], [0, -1, 5]], atol=1e-6)


def test_quads_and_geom_subset_become_two_parts(tmp_path):
    f = tmp_path / "subset.usda"
    st = new_stage(f)
    pts = [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0), (0, 1, 0), (1, 1, 0), (2, 1, 0), (3, 1, 0), (1.5, 2, 0)]
    # two quads, one quad, one pentagon: faces 0, 1, 2 are quads, face 3 a pentagon
    counts = [4, 4, 4, 5]
    idx = [0, 1, 5, 4, 1, 2, 6, 5, 2, 3, 7, 6, 4, 5, 6, 7, 8]
    m = add_mesh(st, "/World/Body", pts, counts, idx)
    red = add_material(st, "/World/Looks/Red", color=(1, 0, 0), base="steel")
    glass = add_material(st, "/World/Looks/Glass", color=(0.1, 0.2, 0.3), base="clear_glass")
    bind(m.GetPrim(), red)
    sub = UsdShade.MaterialBindingAPI.Apply(m.GetPrim()).CreateMaterialBindSubset("windows", Vt.IntArray([2, 3]))
    bind(sub.GetPrim(), glass)
    st.Save()
    sc = load_usd(f)
    assert sc.static.num_triangles == 2 + 2 + 2 + 3
    parts = part_of_triangles(sc, sc.static)
    names = [p.name for p in parts]
    assert names.count("/World/Body") == 4
    assert names.count("/World/Body.windows") == 5
    mats = {p.name: material_of_part(sc, p) for p in parts}
    assert mats["/World/Body"].material_id == encode_material_id("steel") == 2
    assert mats["/World/Body"].base_color == (1.0, 0.0, 0.0)
    assert mats["/World/Body.windows"].material_id == 19
    assert mats["/World/Body.windows"].transmittance == pytest.approx(0.9)
    np.testing.assert_allclose(mats["/World/Body.windows"].base_color, (0.1, 0.2, 0.3), atol=1e-6)
    # the fan triangulation uses the original vertices only
    assert sc.static.points.shape == (9, 3)
    # both parts belong to the same object
    assert {p.object_id for p in parts} == {1}


def test_cube_gprim_size_two(tmp_path):
    f = tmp_path / "cube.usda"
    st = new_stage(f)
    UsdGeom.Cube.Define(st, "/World/Cube").CreateSizeAttr(2.0)
    st.Save()
    sc = load_usd(f)
    assert sc.static.num_triangles == 12
    np.testing.assert_allclose(sc.static.points.min(0), [-1, -1, -1])
    np.testing.assert_allclose(sc.static.points.max(0), [1, 1, 1])
    # outward winding: positive signed volume of 8 m^3
    p, t = sc.static.points.astype(float), sc.static.indices
    vol = np.einsum("ij,ij->i", p[t[:, 0]], np.cross(p[t[:, 1]], p[t[:, 2]])).sum() / 6
    assert vol == pytest.approx(8.0)


def test_other_gprims_honour_radius_height_axis(tmp_path):
    f = tmp_path / "gprims.usda"
    st = new_stage(f)
    cyl = UsdGeom.Cylinder.Define(st, "/World/Cyl")
    cyl.CreateRadiusAttr(0.5)
    cyl.CreateHeightAttr(4.0)
    cyl.CreateAxisAttr("X")
    st.Save()
    sc = load_usd(f)
    np.testing.assert_allclose(sc.static.points.min(0), [-2, -0.5, -0.5], atol=1e-6)
    np.testing.assert_allclose(sc.static.points.max(0), [2, 0.5, 0.5], atol=1e-6)
    assert sc.static.num_triangles == 4 * 24  # two caps (24 each) and a side of 24 quads


# ----------------------------------------------------------------------------------------------------------------------
# materials and semantics
# ----------------------------------------------------------------------------------------------------------------------


def test_material_labels_to_material_id(tmp_path):
    f = tmp_path / "mats.usda"
    st = new_stage(f)
    specs = {
        "Sign": dict(base="steel", coating="paint", attributes=["retroreflective"]),
        "Road": dict(base="asphalt", reflectance=0.123),
        "Target": dict(base="calibration_lambertion"),
    }
    for i, (name, kw) in enumerate(specs.items()):
        mat = add_material(st, f"/World/Looks/{name}", **kw)
        m = add_triangle(st, f"/World/{name}", z=float(i))
        bind(m.GetPrim(), mat)
    # older string form on the Material prim
    old = UsdShade.Material.Define(st, "/World/Looks/Old")
    old.GetPrim().CreateAttribute("inputs:nonvisual:base", Sdf.ValueTypeNames.String).Set("Aluminum")
    old.GetPrim().CreateAttribute("inputs:nonvisual:coating", Sdf.ValueTypeNames.String).Set("paint")
    old.GetPrim().CreateAttribute("inputs:nonvisual:attributes", Sdf.ValueTypeNames.String).Set("emissive")
    bind(add_triangle(st, "/World/OldMesh", z=5.0).GetPrim(), old)
    st.Save()
    sc = load_usd(f)
    by_name = {m.name: m for m in sc.materials}
    assert by_name["/World/Looks/Sign"].material_id == 4354
    assert by_name["/World/Looks/Sign"].reflectance == pytest.approx(0.5)  # painted: follows the paint
    assert by_name["/World/Looks/Road"].material_id == 24
    assert by_name["/World/Looks/Road"].reflectance == pytest.approx(0.123)
    assert by_name["/World/Looks/Target"].material_id == 47
    assert by_name["/World/Looks/Old"].material_id == 2305
    np.testing.assert_allclose(by_name["/World/Looks/Sign"].base_color, (0.8, 0.1, 0.1), atol=1e-6)
    # one scene material per USD material prim
    assert len(sc.materials) == 1 + 4


def test_old_attribute_string_list_and_string_array(tmp_path):
    f = tmp_path / "attrs.usda"
    st = new_stage(f)
    a = UsdShade.Material.Define(st, "/World/Looks/A")
    a.GetPrim().CreateAttribute("inputs:nonvisual:base", Sdf.ValueTypeNames.String).Set("plastic")
    a.GetPrim().CreateAttribute("inputs:nonvisual:attributes", Sdf.ValueTypeNames.String).Set(
        "retroreflective, single_sided"
    )
    b = UsdShade.Material.Define(st, "/World/Looks/B")
    b.GetPrim().CreateAttribute("inputs:nonvisual:base", Sdf.ValueTypeNames.String).Set("rubber")
    b.GetPrim().CreateAttribute("inputs:nonvisual:attributes", Sdf.ValueTypeNames.StringArray).Set(
        ["emissive", "visually_transparent"]
    )
    bind(add_triangle(st, "/World/MA").GetPrim(), a)
    bind(add_triangle(st, "/World/MB", z=1).GetPrim(), b)
    st.Save()
    sc = load_usd(f)
    by_name = {m.name: m for m in sc.materials}
    assert by_name["/World/Looks/A"].material_id == 11 | ((2 | 4) << 11)
    assert by_name["/World/Looks/B"].material_id == 28 | ((1 | 8) << 11)
    assert by_name["/World/Looks/B"].transmittance == pytest.approx(0.9)


def test_unknown_material_label_names_the_material_prim(tmp_path):
    f = tmp_path / "badmat.usda"
    st = new_stage(f)
    mat = add_material(st, "/World/Looks/Unobtainium", base="unobtainium")
    bind(add_triangle(st, "/World/M").GetPrim(), mat)
    st.Save()
    with pytest.raises(SceneError, match="/World/Looks/Unobtainium"):
        load_usd(f)


def test_texture_and_display_color(tmp_path):
    f = tmp_path / "tex.usda"
    st = new_stage(f)
    mat = UsdShade.Material.Define(st, "/World/Looks/Tex")
    sh = UsdShade.Shader.Define(st, "/World/Looks/Tex/Surface")
    sh.CreateIdAttr("UsdPreviewSurface")
    tex = UsdShade.Shader.Define(st, "/World/Looks/Tex/Image")
    tex.CreateIdAttr("UsdUVTexture")
    tex.CreateInput("file", Sdf.ValueTypeNames.Asset).Set(Sdf.AssetPath("brick.png"))
    sh.CreateInput("diffuseColor", Sdf.ValueTypeNames.Color3f).ConnectToSource(
        tex.CreateOutput("rgb", Sdf.ValueTypeNames.Float3)
    )
    mat.CreateSurfaceOutput().ConnectToSource(sh.ConnectableAPI(), "surface")
    m = add_triangle(st, "/World/Wall")
    UsdGeom.PrimvarsAPI(m).CreatePrimvar("st", Sdf.ValueTypeNames.TexCoord2fArray, UsdGeom.Tokens.faceVarying).Set(
        Vt.Vec2fArray([(0, 0), (1, 0), (0, 1)])
    )
    bind(m.GetPrim(), mat)
    g = add_triangle(st, "/World/Green", z=1.0)
    g.CreateDisplayColorAttr([Gf.Vec3f(0, 1, 0)])
    st.Save()
    sc = load_usd(f)
    tex_mat = next(m for m in sc.materials if m.name == "/World/Looks/Tex")
    assert tex_mat.texture == str(tmp_path / "brick.png")
    assert tex_mat.base_color == (0.5, 0.5, 0.5)
    parts = part_of_triangles(sc, sc.static)
    green = material_of_part(sc, next(p for p in parts if p.name == "/World/Green"))
    assert green.base_color == (0.0, 1.0, 0.0)
    assert sc.static.uvs is not None
    wall_tri = next(i for i, p in enumerate(parts) if p.name == "/World/Wall")
    np.testing.assert_allclose(sc.static.uvs[wall_tri], [[0, 0], [1, 0], [0, 1]])


def test_semantics_inherited_nearest_ancestor_wins(tmp_path):
    f = tmp_path / "sem.usda"
    st = new_stage(f)
    car = UsdGeom.Xform.Define(st, "/World/Car")
    label(car.GetPrim(), "car")
    UsdGeom.Xform.Define(st, "/World/Car/Body")
    add_triangle(st, "/World/Car/Body/Shell")
    wheel = add_triangle(st, "/World/Car/Body/Wheel", z=1)
    label(wheel.GetPrim(), "wheel")
    # older form on an unrelated branch
    ped = UsdGeom.Xform.Define(st, "/World/Ped")
    ped.GetPrim().CreateAttribute("semantic:Semantics:params:semanticType", Sdf.ValueTypeNames.String).Set("class")
    ped.GetPrim().CreateAttribute("semantic:Semantics:params:semanticData", Sdf.ValueTypeNames.String).Set(
        "pedestrian"
    )
    add_triangle(st, "/World/Ped/Mesh", z=2)
    add_triangle(st, "/World/Ground", z=3)
    st.Save()
    sc = load_usd(f)
    cls = {p.name: sc.semantic_classes[p.semantic_class] for p in part_of_triangles(sc, sc.static)}
    assert cls == {
        "/World/Car/Body/Shell": "car",
        "/World/Car/Body/Wheel": "wheel",
        "/World/Ped/Mesh": "pedestrian",
        "/World/Ground": "unlabeled",
    }
    # object ids follow traversal order
    oid = {p.name: p.object_id for p in part_of_triangles(sc, sc.static)}
    assert oid == {"/World/Car/Body/Shell": 1, "/World/Car/Body/Wheel": 2, "/World/Ped/Mesh": 3, "/World/Ground": 4}
    assert load_usd(f).parts[1].object_id == sc.parts[1].object_id


# ----------------------------------------------------------------------------------------------------------------------
# motion and instancing
# ----------------------------------------------------------------------------------------------------------------------


def test_time_sampled_xform_becomes_moving_instance(tmp_path):
    f = tmp_path / "moving.usda"
    st = new_stage(f, mpu=0.01, tcps=10.0)
    car = UsdGeom.Xform.Define(st, "/World/Car")
    label(car.GetPrim(), "car")
    op = car.AddTranslateOp()
    op.Set(Gf.Vec3d(0, 0, 0), 0.0)
    op.Set(Gf.Vec3d(1000, 0, 0), 10.0)  # 10 m in 1 s
    op.Set(Gf.Vec3d(1000, 2000, 0), 30.0)
    rot = car.AddRotateZOp()
    rot.Set(0.0, 0.0)
    rot.Set(90.0, 30.0)
    UsdGeom.Cube.Define(st, "/World/Car/Box").CreateSizeAttr(200.0)  # 2 m
    add_triangle(st, "/World/Ground")
    st.Save()
    sc = load_usd(f)
    assert len(sc.instances) == 1 and len(sc.prototypes) == 1
    inst = sc.instances[0]
    np.testing.assert_allclose(inst.times, [0.0, 1.0, 3.0])
    np.testing.assert_allclose(inst.translations, [[0, 0, 0], [10, 0, 0], [10, 20, 0]], atol=1e-6)
    np.testing.assert_allclose(inst.scales, np.ones((3, 3)), atol=1e-6)
    # 90° about Z at the last key
    np.testing.assert_allclose(quat_to_matrix(inst.rotations[2]) @ [1, 0, 0], [0, 1, 0], atol=1e-6)
    # interpolated pose half way between keys 1 and 2
    tr, q = Trajectory(inst.times, inst.translations, inst.rotations).pose_at(2.0)
    np.testing.assert_allclose(tr, [10, 10, 0], atol=1e-6)
    # USD interpolates rotateZ to 30° at the key t = 1 s; half way to 90° is 60°
    np.testing.assert_allclose(quat_to_matrix(inst.rotations[1]) @ [1, 0, 0], [np.sqrt(0.75), 0.5, 0], atol=1e-6)
    np.testing.assert_allclose(quat_to_matrix(q) @ [1, 0, 0], [0.5, np.sqrt(0.75), 0], atol=1e-6)
    # prototype in local metres
    np.testing.assert_allclose(sc.prototypes[0].points.min(0), [-1, -1, -1], atol=1e-6)
    assert sc.prototypes[0].num_triangles == 12
    assert inst.object_id == 1
    assert sc.semantic_classes[sc.parts[int(sc.prototypes[0].tri_part[0])].semantic_class] == "car"
    assert sc.static.num_triangles == 1
    assert sc.time_range == pytest.approx((0.0, 3.0))
    # a time window keeps the samples inside plus one either side
    sc2 = load_usd(f, time_range=(1.5, 2.0))
    np.testing.assert_allclose(sc2.instances[0].times, [1.0, 3.0])
    assert sc2.time_range == (1.5, 2.0)


def test_native_instances_share_one_prototype(tmp_path):
    f = tmp_path / "native.usda"
    st = new_stage(f)
    st.CreateClassPrim("/World/Protos")
    UsdGeom.Xform.Define(st, "/World/Protos/Tree")
    trunk = UsdGeom.Cylinder.Define(st, "/World/Protos/Tree/Trunk")
    trunk.CreateRadiusAttr(0.2)
    leaves = UsdGeom.Sphere.Define(st, "/World/Protos/Tree/Leaves")
    leaves.AddTranslateOp().Set(Gf.Vec3d(0, 0, 3))
    bark = add_material(st, "/World/Looks/Bark", base="bark")
    bind(trunk.GetPrim(), bark)
    for i, x in enumerate((5.0, 10.0, 15.0)):
        t = UsdGeom.Xform.Define(st, f"/World/Tree_{i}")
        t.AddTranslateOp().Set(Gf.Vec3d(x, 0, 0))
        t.GetPrim().GetReferences().AddInternalReference("/World/Protos/Tree")
        t.GetPrim().SetInstanceable(True)
        label(t.GetPrim(), "vegetation")
    add_triangle(st, "/World/Ground")
    st.Save()
    sc = load_usd(f)
    assert len(sc.prototypes) == 1
    assert len(sc.instances) == 3
    assert {i.prototype for i in sc.instances} == {0}
    np.testing.assert_allclose([i.translations[0] for i in sc.instances], [[5, 0, 0], [10, 0, 0], [15, 0, 0]])
    assert [i.object_id for i in sc.instances] == [1, 2, 3]
    assert sc.parts[int(sc.static.tri_part[0])].object_id == 4
    assert {sc.semantic_classes[i.semantic_class] for i in sc.instances} == {"vegetation"}
    proto = sc.prototypes[0]
    assert proto.points[:, 2].max() == pytest.approx(4.0)  # sphere of radius 1 lifted by 3
    mats = {sc.materials[sc.parts[int(p)].material].material_id for p in proto.tri_part}
    assert mats == {0, 30}
    assert sc.num_triangles == 1 + 3 * proto.num_triangles


def test_point_instancer_shares_prototypes(tmp_path):
    f = tmp_path / "pi.usda"
    st = new_stage(f)
    pi = UsdGeom.PointInstancer.Define(st, "/World/Cones")
    UsdGeom.Scope.Define(st, "/World/Cones/Protos")
    a = UsdGeom.Cube.Define(st, "/World/Cones/Protos/Box")
    b = UsdGeom.Cone.Define(st, "/World/Cones/Protos/Cone")
    pi.CreatePrototypesRel().SetTargets([a.GetPath(), b.GetPath()])
    pi.CreateProtoIndicesAttr([0, 1, 0, 1])
    pi.CreatePositionsAttr([(0, 0, 0), (2, 0, 0), (4, 0, 0), (6, 0, 0)])
    half = np.sqrt(0.5)
    pi.CreateOrientationsAttr([Gf.Quath(1, 0, 0, 0), Gf.Quath(half, 0, 0, half)] * 2)  # w first: 90° about Z
    pi.CreateScalesAttr([(1, 1, 1), (1, 1, 1), (2, 2, 2), (1, 1, 1)])
    st.Save()
    sc = load_usd(f)
    assert len(sc.prototypes) == 2
    assert len(sc.instances) == 4
    assert [i.prototype for i in sc.instances] == [0, 1, 0, 1]
    np.testing.assert_allclose([i.translations[0][0] for i in sc.instances], [0, 2, 4, 6])
    np.testing.assert_allclose(sc.instances[2].scales[0], [2, 2, 2], atol=1e-6)
    np.testing.assert_allclose(quat_to_matrix(sc.instances[1].rotations[0]) @ [1, 0, 0], [0, 1, 0], atol=2e-3)
    assert sc.prototypes[0].num_triangles == 12
    # prototypes under the instancer are not drawn on their own
    assert sc.static.num_triangles == 0
    assert [i.object_id for i in sc.instances] == [1, 2, 3, 4]


def test_purpose_and_visibility(tmp_path):
    f = tmp_path / "purpose.usda"
    st = new_stage(f)
    add_triangle(st, "/World/Render").CreatePurposeAttr("render")
    add_triangle(st, "/World/Proxy").CreatePurposeAttr("proxy")
    add_triangle(st, "/World/Guide").CreatePurposeAttr("guide")
    hidden = UsdGeom.Xform.Define(st, "/World/Hidden")
    hidden.CreateVisibilityAttr("invisible")
    add_triangle(st, "/World/Hidden/Child")
    add_triangle(st, "/World/Plain")
    st.Save()
    sc = load_usd(f)
    assert sorted(p.name for p in part_of_triangles(sc, sc.static)) == ["/World/Plain", "/World/Render"]


def test_proxy_kept_without_render_purpose(tmp_path):
    f = tmp_path / "proxy.usda"
    st = new_stage(f)
    add_triangle(st, "/World/Proxy").CreatePurposeAttr("proxy")
    st.Save()
    sc = load_usd(f)
    assert [p.name for p in part_of_triangles(sc, sc.static)] == ["/World/Proxy"]


def test_unsupported_prims_are_reported_once(tmp_path):
    f = tmp_path / "curves.usda"
    st = new_stage(f)
    add_triangle(st, "/World/M")
    c = UsdGeom.BasisCurves.Define(st, "/World/Hair")
    c.CreatePointsAttr([(0, 0, 0), (0, 0, 1), (0, 1, 1), (1, 1, 1)])
    c.CreateCurveVertexCountsAttr([4])
    UsdGeom.Points.Define(st, "/World/Dust").CreatePointsAttr([(0, 0, 0)])
    st.Save()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        sc = load_usd(f)
    msgs = [str(x.message) for x in w if "unsupported" in str(x.message)]
    assert len(msgs) == 1 and "/World/Hair" in msgs[0] and "Points" in msgs[0]
    assert sc.skipped == ["/World/Hair: unsupported prim type BasisCurves", "/World/Dust: unsupported prim type Points"]
    assert sc.static.num_triangles == 1


# ----------------------------------------------------------------------------------------------------------------------
# sensors, rig, metadata
# ----------------------------------------------------------------------------------------------------------------------


def test_cameras_lidars_ego_rig_and_metadata(tmp_path):
    f = tmp_path / "rig.usda"
    st = new_stage(f, tcps=100.0)
    st.GetRootLayer().customLayerData = {"wsim:sceneId": "clipgt-1234"}
    st.SetStartTimeCode(0)
    st.SetEndTimeCode(1000)
    add_triangle(st, "/World/Ground")
    rig = UsdGeom.Xform.Define(st, "/World/Ego")
    rig.GetPrim().CreateAttribute("wsim:egoRig", Sdf.ValueTypeNames.Bool).Set(True)
    op = rig.AddTranslateOp()
    op.Set(Gf.Vec3d(0, 0, 0), 0)
    op.Set(Gf.Vec3d(20, 0, 0), 200)
    cam = UsdGeom.Camera.Define(st, "/World/Ego/FrontCam")
    cam.AddTranslateOp().Set(Gf.Vec3d(1.5, 0, 1.2))
    # USD camera looking down +X (forward of the rig) with +Z up: rotate -Z onto +X
    cam.AddRotateXYZOp().Set(Gf.Vec3f(90, 0, -90))
    calib = {
        "model": "ftheta",
        "params": {"principal_point_x": 960.0, "principal_point_y": 540.0, "pixeldist_to_angle_poly": [0, 0.001]},
        "resolution": [1920, 1080],
        "shutter_type": "GLOBAL",
        "logical_id": "camera_front_wide_120fov",
    }
    cam.GetPrim().CreateAttribute("wsim:camera:calibration", Sdf.ValueTypeNames.String).Set(json.dumps(calib))
    UsdGeom.Camera.Define(st, "/World/Ego/Plain")
    st.DefinePrim("/World/Ego/Lidar", "OmniLidar")
    other = UsdGeom.Xform.Define(st, "/World/Ego/Lidar2").GetPrim()
    other.CreateAttribute("omni:sensor:Core:scanType", Sdf.ValueTypeNames.Token).Set("rotary")
    st.Save()
    sc = load_usd(f)
    assert sc.scene_id == "clipgt-1234"
    assert sc.camera_prims == ["/World/Ego/FrontCam", "/World/Ego/Plain"]
    assert sc.lidar_prims == ["/World/Ego/Lidar", "/World/Ego/Lidar2"]
    assert list(sc.cameras) == ["camera_front_wide_120fov"]
    c = sc.cameras["camera_front_wide_120fov"]
    assert c.model == "ftheta" and c.resolution == (1920, 1080) and c.shutter_type == "GLOBAL"
    assert c.params["pixeldist_to_angle_poly"] == [0, 0.001]
    t, q = c.camera_to_rig
    np.testing.assert_allclose(t, [1.5, 0, 1.2], atol=1e-6)
    r = quat_to_matrix(q)  # OpenCV axes: z forward = rig +X, y down = rig -Z, x right = rig -Y
    np.testing.assert_allclose(r @ [0, 0, 1], [1, 0, 0], atol=1e-6)
    np.testing.assert_allclose(r @ [0, 1, 0], [0, 0, -1], atol=1e-6)
    np.testing.assert_allclose(r @ [1, 0, 0], [0, -1, 0], atol=1e-6)
    ego = sc.ego_trajectory
    np.testing.assert_allclose(ego.times, [0.0, 2.0])
    np.testing.assert_allclose(ego.pose_at(1.0)[0], [10, 0, 0])
    assert sc.time_range == (0.0, 10.0)  # stage start/end time codes


# ----------------------------------------------------------------------------------------------------------------------
# save_usd round trip
# ----------------------------------------------------------------------------------------------------------------------


def _box(lo, hi):
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    p = np.array([[x, y, z] for z in (lo[2], hi[2]) for y in (lo[1], hi[1]) for x in (lo[0], hi[0])])
    f = np.array([[0, 2, 1], [1, 2, 3], [4, 5, 6], [5, 7, 6], [0, 1, 4], [1, 5, 4],
                  [2, 6, 3], [3, 6, 7], [0, 4, 2], [2, 4, 6], [1, 3, 5], [3, 7, 5]])
    return p, f


def _make_scene() -> Scene:
    mats = [
        Material("default"),
        Material.from_labels("asphalt", "asphalt", base_color=(0.2, 0.2, 0.2)),
        Material.from_labels("sign", "steel", "paint", ["retroreflective"], base_color=(1, 1, 0)),
        Material.from_labels("glass", "clear_glass", base_color=(0.6, 0.7, 0.8), reflectance=0.07),
        Material.from_labels("carpaint", "steel", "paint", base_color=(0.8, 0, 0)),
    ]
    sc = Scene(static=MeshData(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0)), materials=mats)
    road = sc.add_part(Part("road", 1, sc.semantic_class_index("road"), 7))
    sign = sc.add_part(Part("sign", 2, sc.semantic_class_index("sign"), 9))
    pane = sc.add_part(Part("pane", 3, sc.semantic_class_index("building"), 9))
    ground_p = np.array([[-50, -50, 0], [50, -50, 0], [50, 50, 0], [-50, 50, 0]], float)
    ground_f = np.array([[0, 1, 2], [0, 2, 3]])
    sp, sf = _box([10, 0, 0], [10.1, 1, 2])
    points = np.concatenate([ground_p, sp])
    indices = np.concatenate([ground_f, sf + 4])
    tri_part = np.array([road] * 2 + [sign] * 10 + [pane] * 2)
    colors = np.concatenate([np.full((4, 3), 0.25), np.full((8, 3), 0.75)])
    sc.static = MeshData(points, indices, tri_part, colors=colors, name="static")
    body = sc.add_part(Part("body", 4, sc.semantic_class_index("car"), 0))
    glass = sc.add_part(Part("window", 3, sc.semantic_class_index("car"), 0))
    cp, cf = _box([-2, -1, 0], [2, 1, 1.5])
    sc.prototypes.append(MeshData(cp, cf, np.array([body] * 10 + [glass] * 2), name="car"))
    t = np.linspace(0.0, 12.0, 7)
    yaw = np.linspace(0, np.pi / 2, 7)
    q = np.stack([np.zeros(7), np.zeros(7), np.sin(yaw / 2), np.cos(yaw / 2)], -1)
    sc.instances.append(
        Instance(0, t, np.stack([t * 2, np.zeros(7), np.zeros(7)], -1), q, None, 42, "car_a",
                 sc.semantic_class_index("vehicle"), np.array([4.0, 2.0, 1.5]))
    )
    sc.instances.append(Instance(0, [0.0], [[5, 5, 0]], [[0, 0, 0, 1]], [[1, 1, 2]], 43, "car_b"))
    sc.ego_trajectory = Trajectory(t, np.stack([t * 10, t, np.zeros(7)], -1), q)
    sc.cameras["camera_front_wide_120fov"] = CameraCalibration(
        "camera_front_wide_120fov",
        "ftheta",
        {"principal_point_x": 960.5, "principal_point_y": 540.5, "pixeldist_to_angle_poly": np.array([0.0, 1e-3, 2e-8])},
        (1920, 1080),
        (np.array([1.7, 0.0, 1.4]), np.array([-0.5, 0.5, -0.5, 0.5])),
        "ROLLING_TOP_TO_BOTTOM",
        "front_wide@123",
    )
    sc.scene_id = "roundtrip-scene"
    sc.time_range = (0.0, 12.0)
    return sc


def _tri_signature(sc: Scene, mesh: MeshData):
    """Per-triangle (sorted-ish centroid, material id, reflectance, semantic class name) rows, order independent."""
    c = mesh.points[mesh.indices].mean(axis=1).round(4)
    parts = [sc.parts[int(p)] for p in mesh.tri_part]
    rows = [
        (tuple(c[i]), sc.materials[p.material].material_id, round(sc.materials[p.material].reflectance, 5),
         sc.semantic_classes[p.semantic_class], p.object_id)
        for i, p in enumerate(parts)
    ]
    return sorted(rows)


@pytest.mark.parametrize("suffix,up,mpu", [(".usda", "Z", 1.0), (".usdc", "Y", 0.01), (".usdz", "Z", 1.0)])
def test_save_load_round_trip(tmp_path, suffix, up, mpu):
    sc = _make_scene()
    f = tmp_path / f"rt{suffix}"
    save_usd(sc, f, up_axis=up, meters_per_unit=mpu)
    back = load_usd(f)
    assert back.scene_id == "roundtrip-scene"
    assert back.static.num_triangles == 14
    assert back.num_triangles == sc.num_triangles == 14 + 2 * 12
    np.testing.assert_allclose(
        sorted(map(tuple, back.static.points.round(4))), sorted(map(tuple, sc.static.points.round(4))), atol=2e-4
    )
    assert _tri_signature(back, back.static) == _tri_signature(sc, sc.static)
    assert len(back.prototypes) == 1
    assert _tri_signature(back, back.prototypes[0]) == _tri_signature(sc, sc.prototypes[0])
    # vertex colours survive
    assert back.static.colors is not None
    assert sorted(back.static.colors[:, 0].round(3)) == sorted(sc.static.colors[:, 0].round(3))
    # materials (by labels) and their lidar parameters
    ours = {(m.material_id, round(m.reflectance, 5), round(m.transmittance, 5), tuple(np.round(m.base_color, 5)))
            for m in sc.materials[1:]}
    theirs = {(m.material_id, round(m.reflectance, 5), round(m.transmittance, 5), tuple(np.round(m.base_color, 5)))
              for m in back.materials[1:]}
    assert theirs == ours
    # instances
    a, b = back.instances
    ref = sc.instances[0]
    np.testing.assert_allclose(a.times, ref.times, atol=1e-9)
    np.testing.assert_allclose(a.translations, ref.translations, atol=1e-4)
    np.testing.assert_allclose(np.abs((a.rotations * ref.rotations).sum(1)), 1.0, atol=1e-6)
    np.testing.assert_allclose(a.scales, 1.0, atol=1e-6)
    assert a.object_id == 42 and b.object_id == 43
    assert back.semantic_classes[a.semantic_class] == "vehicle" and b.semantic_class == 0
    np.testing.assert_allclose(a.cuboid, [4, 2, 1.5], atol=1e-5)
    np.testing.assert_allclose(b.translations[0], [5, 5, 0], atol=1e-5)
    np.testing.assert_allclose(b.scales[0], [1, 1, 2], atol=1e-6)
    assert not b.is_moving
    # ego trajectory and cameras
    np.testing.assert_allclose(back.ego_trajectory.times, sc.ego_trajectory.times, atol=1e-9)
    np.testing.assert_allclose(back.ego_trajectory.translations, sc.ego_trajectory.translations, atol=1e-4)
    np.testing.assert_allclose(
        np.abs((back.ego_trajectory.rotations * sc.ego_trajectory.rotations).sum(1)), 1.0, atol=1e-9
    )
    cam = back.cameras["camera_front_wide_120fov"]
    ref_cam = sc.cameras["camera_front_wide_120fov"]
    assert (cam.model, cam.resolution, cam.shutter_type, cam.unique_id) == (
        "ftheta", (1920, 1080), "ROLLING_TOP_TO_BOTTOM", "front_wide@123")
    assert cam.params == {"principal_point_x": 960.5, "principal_point_y": 540.5,
                          "pixeldist_to_angle_poly": [0.0, 1e-3, 2e-8]}
    np.testing.assert_allclose(cam.camera_to_rig[0], ref_cam.camera_to_rig[0], atol=1e-6)
    assert abs(np.dot(cam.camera_to_rig[1], ref_cam.camera_to_rig[1])) == pytest.approx(1.0, abs=1e-9)
    assert back.time_range == pytest.approx((0.0, 12.0))
    assert len(back.camera_prims) == 1


def test_saved_stage_uses_documented_conventions(tmp_path):
    sc = _make_scene()
    f = tmp_path / "conv.usda"
    save_usd(sc, f)
    st = Usd.Stage.Open(str(f))
    assert st.GetTimeCodesPerSecond() == TIME_CODES_PER_SECOND == 1000.0
    assert UsdGeom.GetStageUpAxis(st) == "Z" and UsdGeom.GetStageMetersPerUnit(st) == 1.0
    assert st.GetRootLayer().customLayerData["wsim:sceneId"] == "roundtrip-scene"
    rig = st.GetPrimAtPath("/World/EgoRig")
    assert rig.GetAttribute("wsim:egoRig").Get() is True
    assert len(UsdGeom.Xformable(rig).GetTimeSamples()) == 7
    inst = [p for p in st.Traverse() if p.IsInstance()]
    assert len(inst) == 2 and inst[0].GetPrototype() == inst[1].GetPrototype()
    mats = [p for p in st.Traverse() if p.IsA(UsdShade.Material)]
    sign = next(p for p in mats if p.GetName() == "sign")
    assert sign.GetAttribute("omni:simready:nonvisual:base").Get() == "steel"
    assert list(sign.GetAttribute("omni:simready:nonvisual:attributes").Get()) == ["retroreflective"]
    glass = next(p for p in mats if p.GetName() == "glass")
    assert glass.GetAttribute("wsim:reflectance").Get() == pytest.approx(0.07)
    cam = st.GetPrimAtPath("/World/EgoRig/camera_front_wide_120fov")
    assert json.loads(cam.GetAttribute("wsim:camera:calibration").Get())["logical_id"] == "camera_front_wide_120fov"


def test_large_mesh_round_trip(tmp_path):
    n = 317  # 2 * 316^2 ≈ 200k triangles
    g = np.stack(np.meshgrid(np.arange(n), np.arange(n), indexing="ij"), -1).reshape(-1, 2)
    pts = np.concatenate([g * 0.1, np.zeros((len(g), 1))], 1)
    i = np.arange(n - 1)
    a = (i[:, None] * n + i[None, :]).ravel()
    quads = np.stack([a, a + n, a + n + 1, a + 1], -1)
    f = tmp_path / "big.usdc"
    st = new_stage(f)
    m = UsdGeom.Mesh.Define(st, "/World/Terrain")
    m.CreatePointsAttr(Vt.Vec3fArray.FromNumpy(pts.astype(np.float32)))
    m.CreateFaceVertexCountsAttr(Vt.IntArray.FromNumpy(np.full(len(quads), 4, np.int32)))
    m.CreateFaceVertexIndicesAttr(Vt.IntArray.FromNumpy(quads.ravel().astype(np.int32)))
    st.Save()
    sc = load_usd(f)
    assert sc.static.num_triangles == 2 * (n - 1) ** 2
    save_usd(sc, tmp_path / "big_out.usdc")
    back = load_usd(tmp_path / "big_out.usdc")
    assert back.static.num_triangles == sc.static.num_triangles
    np.testing.assert_allclose(back.static.points.max(0), [31.6, 31.6, 0.0], atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(SceneError, match="nothere.usda"):
        load_usd(tmp_path / "nothere.usda")


def test_garbage_usda(tmp_path):
    f = tmp_path / "garbage.usda"
    f.write_text("this is not a USD file { at all\n")
    with pytest.raises(SceneError, match="garbage.usda"):
        load_usd(f)


def test_nan_points(tmp_path):
    f = tmp_path / "nan.usda"
    st = new_stage(f)
    add_mesh(st, "/World/Broken", [(0, 0, 0), (np.nan, 0, 0), (0, 1, 0)], [3], [0, 1, 2])
    st.Save()
    with pytest.raises(SceneError, match="/World/Broken") as e:
        load_usd(f)
    assert "nan.usda" in str(e.value)


def test_out_of_range_indices(tmp_path):
    f = tmp_path / "oob.usda"
    st = new_stage(f)
    add_mesh(st, "/World/Bad", [(0, 0, 0), (1, 0, 0), (0, 1, 0)], [3], [0, 1, 7])
    st.Save()
    with pytest.raises(SceneError, match="/World/Bad.*out of range"):
        load_usd(f)


def test_face_counts_not_matching_indices(tmp_path):
    f = tmp_path / "counts.usda"
    st = new_stage(f)
    add_mesh(st, "/World/Bad", [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)], [4], [0, 1, 2])
    st.Save()
    with pytest.raises(SceneError, match="/World/Bad.*faceVertexCounts"):
        load_usd(f)


def test_empty_stage(tmp_path):
    f = tmp_path / "empty.usda"
    st = new_stage(f)
    UsdGeom.Xform.Define(st, "/World/Nothing")
    UsdGeom.Camera.Define(st, "/World/Cam")
    st.Save()
    with pytest.raises(SceneError, match="empty.usda.*empty stage"):
        load_usd(f)
