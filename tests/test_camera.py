"""Cameras: lens models against OpenCV, exact round trips, analytic renders, rolling shutter, projection, overlays."""

from __future__ import annotations

import io
import json

import cv2
import numpy as np
import pytest
import warp as wp
from conftest import box_mesh, quad_mesh

import wsim.kernels.shading as _kshade
from wsim.scene import CameraCalibration, Instance, Material, MeshData, Part, Scene, Trajectory
from wsim.scene.transforms import matrix_to_quat, quat_from_axis_angle, quat_slerp, quat_to_matrix
from wsim.sensors.camera import (Camera, CameraProduct, Cuboid, ShutterType, composite_ego_mask, draw_boxes,
                                 encode_jpeg, encode_png, encode_rgb_planar, semantic_palette)
from wsim.sensors.lens import (BivariateWindshield, FThetaLens, OpenCVFisheyeLens, OpenCVPinholeLens, PolynomialType,
                               WindshieldReference, lens_from_params)

# OpenCV camera looking along world +x (camera x → world -y, camera y → world -z, camera z → world +x)
R_FWD = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
Q_FWD = matrix_to_quat(R_FWD)
IDENT = (np.zeros(3), np.array([0.0, 0.0, 0.0, 1.0]))
P = CameraProduct


def _pose(t, q=Q_FWD):
    return np.asarray(t, float), np.asarray(q, float)


# ---------------------------------------------------------------------------------------------------------------------
# lenses used by several tests (native 192 x 120)

BW = (0.0, 8.0e-3, 0.0, 1.0e-7)  # θ(r) [rad]
FW = (0.0, 125.0, 0.0, -8.0, 0.0, 1.5)  # r(θ) [px]


def _fit(x, y, degree=5):
    a = np.stack([x**k for k in range(1, degree + 1)], 1)
    return (0.0, *np.linalg.lstsq(a, y, rcond=None)[0])


def _ftheta(reference: PolynomialType) -> FThetaLens:
    r = np.linspace(0, 130, 500)
    if reference == PolynomialType.PIXELDIST_TO_ANGLE:
        bw, fw = BW, _fit(np.polynomial.polynomial.polyval(r, BW), r)  # fw only approximates the inverse
    else:
        th = np.linspace(0, 1.2, 500)
        fw, bw = FW, _fit(np.polynomial.polynomial.polyval(th, FW), th)
    return FThetaLens(192, 120, 95.3, 60.1, tuple(bw), tuple(fw), reference, 0.0, (1.002, 0.003, -0.002))


def _pinhole() -> OpenCVPinholeLens:
    return OpenCVPinholeLens(192, 120, 96.5, 59.0, 110.0, 112.0, (-0.12, 0.03, -0.004, 0.02, -0.005, 0.001),
                             (8e-4, -5e-4), (1e-3, -2e-4, 5e-4, 1e-4))


def _fisheye() -> OpenCVFisheyeLens:
    return OpenCVFisheyeLens(192, 120, 95.0, 61.0, 100.0, 101.0, (0.03, -0.006, 0.001, -0.0002), 0.0)


LENSES = {
    "ftheta_bw": lambda: _ftheta(PolynomialType.PIXELDIST_TO_ANGLE),
    "ftheta_fw": lambda: _ftheta(PolynomialType.ANGLE_TO_PIXELDIST),
    "pinhole": _pinhole,
    "fisheye": _fisheye,
}

WS_H = (0.002, 1.01, 0.01, 0.005, 0.02, 0.003)  # φ' = P_h(φ, θ), N = 2
WS_V = (-0.001, 0.004, 0.01, 0.99, 0.01, 0.02)  # θ' = P_v(φ, θ)


def _bivariate_terms(phi, th, n):
    return np.stack([phi**i * th**j for j in range(n + 1) for i in range(n + 1 - j)], 1)


def _windshield(reference: WindshieldReference) -> BivariateWindshield:
    g = np.linspace(-1.25, 1.25, 51)
    phi, th = (a.ravel() for a in np.meshgrid(g, g))
    keep = np.sin(phi) ** 2 + np.sin(th) ** 2 < 0.995  # directions that exist
    phi, th = phi[keep], th[keep]
    a2 = _bivariate_terms(phi, th, 2)
    ph2, th2 = a2 @ WS_H, a2 @ WS_V
    a3 = _bivariate_terms(ph2, th2, 3)  # degree-3 least-squares inverse (approximate)
    h_fit = tuple(np.linalg.lstsq(a3, phi, rcond=None)[0])
    v_fit = tuple(np.linalg.lstsq(a3, th, rcond=None)[0])
    if reference == WindshieldReference.FORWARD:  # the distorting pair is exact, the inverse pair a fit
        return BivariateWindshield(WS_H, WS_V, h_fit, v_fit, reference)
    # BACKWARD: the undistorting pair is exact (WS_*), the distorting pair is the fit of its inverse
    return BivariateWindshield(h_fit, v_fit, WS_H, WS_V, reference)


# ---------------------------------------------------------------------------------------------------------------------
# lens models


def test_pinhole_matches_opencv(device):
    lens = OpenCVPinholeLens(640, 480, 320.5, 241.0, 500.0, 510.0, (-0.2, 0.05, -0.01, 0.01, 0.002, 0.001),
                             (0.001, -0.0005), (0.001, -0.0002, 0.0005, 0.0001))
    cam = Camera(lens, device=device)
    rng = np.random.default_rng(0)
    n = 2000
    p = np.column_stack([rng.uniform(-0.6, 0.6, n), rng.uniform(-0.45, 0.45, n), np.ones(n)]) * rng.uniform(1, 30, (n, 1))
    uv, depth, _, valid = cam.project(p, 0.0, 0.0, IDENT).numpy()
    ref = cv2.projectPoints(p, np.zeros(3), np.zeros(3), lens.camera_matrix, lens.dist_coeffs)[0].reshape(-1, 2)
    inside = (ref[:, 0] >= 0) & (ref[:, 0] < 640) & (ref[:, 1] >= 0) & (ref[:, 1] < 480)
    assert inside.mean() > 0.9
    np.testing.assert_array_equal(valid, inside)
    assert np.abs(uv - ref)[inside].max() < 1e-3
    np.testing.assert_allclose(depth, p[:, 2], rtol=1e-6)


def test_fisheye_matches_opencv(device):
    lens = OpenCVFisheyeLens(640, 480, 318.0, 242.0, 180.0, 182.0, (0.05, -0.01, 0.003, -0.0005), 1.5)
    cam = Camera(lens, device=device)
    rng = np.random.default_rng(1)
    n = 2000
    d = rng.normal(size=(n, 3))
    d[:, 2] = np.abs(d[:, 2]) + 0.15  # up to ~80° off axis
    p = d / np.linalg.norm(d, axis=1, keepdims=True) * rng.uniform(1, 30, (n, 1))
    uv, _, _, valid = cam.project(p, 0.0, 0.0, IDENT).numpy()
    k = np.array([[180.0, 0, 318.0], [0, 182.0, 242.0], [0, 0, 1]])
    ref = cv2.fisheye.projectPoints(p.reshape(-1, 1, 3), np.zeros(3), np.zeros(3), k,
                                    np.array([0.05, -0.01, 0.003, -0.0005]))[0].reshape(-1, 2)
    theta = np.arctan2(np.linalg.norm(p[:, :2], axis=1), p[:, 2])
    inside = (ref[:, 0] >= 0) & (ref[:, 0] < 640) & (ref[:, 1] >= 0) & (ref[:, 1] < 480) & (theta < 1.5)
    assert inside.mean() > 0.5
    np.testing.assert_array_equal(valid, inside)
    assert np.abs(uv - ref)[inside].max() < 1e-3


@pytest.mark.parametrize("resolution", [None, (128, 96)], ids=["native", "rescaled"])
@pytest.mark.parametrize("windshield", [None, WindshieldReference.FORWARD, WindshieldReference.BACKWARD],
                         ids=["no_ws", "ws_forward", "ws_backward"])
@pytest.mark.parametrize("model", list(LENSES))
def test_project_unproject_round_trip(device, model, windshield, resolution):
    lens = LENSES[model]()
    ws = None if windshield is None else _windshield(windshield)
    w, h = resolution or (lens.width, lens.height)
    cam = Camera(lens, width=w, height=h, windshield=ws, device=device)
    jj, ii = np.meshgrid(np.arange(w), np.arange(h))
    centres = np.column_stack([jj.ravel() + 0.5, ii.ravel() + 0.5])
    rng = np.random.default_rng(2)
    sub = rng.uniform([0, 0], [w, h], (2000, 2))  # off-centre positions, corners included
    px = np.concatenate([centres, sub, [[0.01, 0.01], [w - 0.01, h - 0.01], [0.01, h - 0.01], [w - 0.01, 0.01]]])
    rays, ok = (a.numpy() for a in cam.unproject(px))
    assert ok.all(), f"{(~ok.astype(bool)).sum()} pixels without a ray"
    np.testing.assert_allclose(np.linalg.norm(rays, axis=1), 1.0, atol=1e-5)
    depth = rng.uniform(0.5, 50.0, (len(px), 1))
    uv, _, _, valid = cam.project(rays * depth, 0.0, 0.0, IDENT).numpy()
    assert valid.all()
    err = np.abs(uv - px).max()
    assert err < 1e-3, err


@pytest.mark.parametrize("model", list(LENSES))
def test_rescaled_lens_scales_pixels(device, model):
    lens = LENSES[model]()
    a = Camera(lens, device=device)
    b = Camera(lens, width=96, height=80, device=device)  # non-uniform scale
    rng = np.random.default_rng(3)
    d = np.column_stack([rng.uniform(-0.5, 0.5, 300), rng.uniform(-0.3, 0.3, 300), np.ones(300)])
    ua, _, _, va = a.project(d, 0, 0, IDENT).numpy()
    ub, _, _, vb = b.project(d, 0, 0, IDENT).numpy()
    m = va & vb
    assert m.mean() > 0.8
    np.testing.assert_allclose(ub[m], ua[m] * [96 / 192, 80 / 120], atol=2e-3)


def test_ftheta_rescale_follows_contract():
    lens = _ftheta(PolynomialType.PIXELDIST_TO_ANGLE).rescaled(96, 80)
    sx, sy = 96 / 192, 80 / 120
    assert lens.principal_point_x == pytest.approx((95.3 + 0.5) * sx - 0.5)
    assert lens.principal_point_y == pytest.approx((60.1 + 0.5) * sy - 0.5)
    assert lens.pixeldist_to_angle_poly[3] == pytest.approx(BW[3] / sy**3)
    assert lens.linear_cde == pytest.approx((1.002 * sx / sy, 0.003 * sx / sy, -0.002))


# ---------------------------------------------------------------------------------------------------------------------
# analytic renders


def _scene_with_parts(static_meshes, classes):
    """Static scene from (points, faces) pairs, mesh k in part k+1 with semantic class classes[k]."""
    pts, faces, tri_part, off = [], [], [], 0
    s = Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), 0))
    for k, ((p, f), cls) in enumerate(zip(static_meshes, classes)):
        s.materials.append(Material(f"m{k}", base_color=(0.2 + 0.3 * k, 0.5, 0.4)))
        s.parts.append(Part(f"p{k}", material=k + 1, semantic_class=s.semantic_class_index(cls), object_id=k + 1))
        pts.append(p)
        faces.append(np.asarray(f) + off)
        tri_part.append(np.full(len(f), k + 1))
        off += len(p)
    s.static = MeshData(np.concatenate(pts), np.concatenate(faces), np.concatenate(tri_part))
    return s


def _plain_pinhole(w, h, f):
    return OpenCVPinholeLens(w, h, w / 2, h / 2, f, f)


def test_distance_of_plane_facing_camera(device):
    # plane x = 7 facing the camera, covering only z < 1 (rows above it see the sky)
    p, f = quad_mesh([7.0, 0.0, -9.0], [0, 0, 10.0], [0, 20.0, 0])
    scene = _scene_with_parts([(p, f)], ["wall"])
    w, h, fl = 64, 48, 40.0
    cam = Camera(_plain_pinhole(w, h, fl), device=device)
    fr = cam.render(scene, 0.0, 0.0, (P.DISTANCE, P.DISTANCE_COLORIZED, P.NORMALS), _pose([0, 0, 0]), vmax=20.0)
    dist = fr.distance.numpy()
    jj, ii = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    x, y = (jj - w / 2) / fl, (ii - h / 2) / fl
    ref = 7.0 * np.sqrt(x * x + y * y + 1.0)
    z_world = -7.0 * y  # world height where the pixel's ray meets x = 7
    hit = z_world < 1.0 - 1e-3
    miss = z_world > 1.0 + 1e-3
    assert hit.sum() > 500 and miss.sum() > 100
    np.testing.assert_allclose(dist[hit], ref[hit], rtol=2e-6)
    assert np.all(dist[miss] == 0.0)  # misses read 0
    col = fr.distance_colorized.numpy()
    assert np.all(col[miss] == 0) and np.all(col[hit].max(axis=1) > 0)
    nrm = fr.normals.numpy()
    np.testing.assert_allclose(nrm[hit], np.tile([-1.0, 0, 0], (hit.sum(), 1)), atol=1e-6)  # facing the camera
    assert np.all(nrm[miss] == 0)


def test_camera_keeps_the_time_window_of_renders_in_flight(device):
    """A camera frame rendered while another render holds the scene's time window (a lidar at t ≈ 8 s in another
    thread) widens the moving objects' bounds to cover both instead of replacing them."""
    p, f = quad_mesh([7.0, 0.0, -9.0], [0, 0, 10.0], [0, 20.0, 0])
    scene = _scene_with_parts([(p, f)], ["wall"])
    bp, bf = box_mesh([-0.5, -0.5, -0.5], [0.5, 0.5, 0.5])
    scene.prototypes.append(MeshData(bp, bf, 1))
    ts = np.linspace(0, 10, 101)
    scene.instances.append(Instance(0, ts, np.column_stack([4 + 0 * ts, ts - 5, 0 * ts]),
                                    np.tile([0, 0, 0, 1.0], (101, 1))))
    cam = Camera(_plain_pinhole(32, 24, 20.0), device=device)
    geo = scene.device_geometry(device)
    alone = cam.render(scene, 1.0, 1.0, (P.DISTANCE,), _pose([0, 0, 0])).distance.numpy()
    with geo.hold_time_window(8.0, 8.1):
        during = cam.render(scene, 1.0, 1.0, (P.DISTANCE,), _pose([0, 0, 0])).distance.numpy()
        assert geo.time_window == (1.0, 8.1)  # both windows covered while both trace
        h = geo.trace([[0.0, 3.05, 0.0]], [[1.0, 0, 0]], 8.05).numpy()
        assert h["t"][0] == pytest.approx(3.5, abs=1e-4)  # the other render still sees the box at t = 8.05
    np.testing.assert_array_equal(during, alone)


@pytest.mark.parametrize("shutter,cars", [("ROLLING_TOP_TO_BOTTOM", 0), ("GLOBAL", 0), ("ROLLING_LEFT_TO_RIGHT", 0),
                                          ("ROLLING_RIGHT_TO_LEFT", 0), ("ROLLING_TOP_TO_BOTTOM", 40),
                                          ("GLOBAL", 40)])
def test_row_packets_equal_pixel_by_pixel(shutter, cars, monkeypatch, unbaked):
    """On the CPU, runs of pixels exposed at the same instant — of a row (global and top/bottom rolling shutters),
    of a column (left/right ones) — are traced as one packet, and the instances their cone may meet are listed once
    per run: every product is bit-identical to rendering pixel by pixel (the built-in street block: its textures,
    moving cars and shadows; a width and a height that are no multiple of the run length; 40 more parked cars, more
    than a run lists, take the top-level BVH per pixel; all traced as instances, none baked into the static tree)."""
    import dataclasses

    import wsim
    import wsim.sensors.camera_render as camera_render
    from wsim.kernels.trace import MAX_LISTED

    scene = wsim.load_scene("builtin")
    for k in range(cars):
        src = scene.instances[k % len(scene.instances)]
        shift = np.array([6.0 + 4.5 * (k // 2), 3.5 if k % 2 else -3.5, 0.0])
        scene.instances.append(dataclasses.replace(src, times=src.times[:1], translations=src.translations[:1] + shift,
                                                   rotations=src.rotations[:1],
                                                   scales=None if src.scales is None else src.scales[:1],
                                                   object_id=10_000 + k))
    assert (len(scene.instances) > MAX_LISTED) == (cars > 0)
    cam = Camera.from_scene(scene, "camera_front_wide_120fov", width=200, height=75, device="cpu")
    cam.shutter = ShutterType[shutter]
    prods = (P.COLOR, P.DISTANCE, P.SEMANTICS, P.NORMALS)
    t0 = float(scene.time_range[0]) + 2.0

    def render(packets: bool) -> dict:
        monkeypatch.setattr(camera_render, "ROW_PACKETS", packets)
        fr = cam.render(scene, t0, t0 + 0.03, prods)
        return {p: fr[p].numpy() for p in prods}

    one, rows = render(False), render(True)
    for p in prods:
        np.testing.assert_array_equal(rows[p], one[p], err_msg=p.name)
    assert (one[P.DISTANCE] > 0).mean() > 0.5 and len(np.unique(one[P.SEMANTICS])) >= 4
    monkeypatch.setattr(camera_render, "ROW_PACKETS", True)
    color_only = cam.render(scene, t0, t0 + 0.03, (P.COLOR,)).color.numpy()
    np.testing.assert_array_equal(color_only, one[P.COLOR])  # one trace serves both: the colour is the same alone


@pytest.mark.parametrize("sun_elevation", [40.0, 12.0])
def test_row_packet_static_shadows_equal_pixel_by_pixel(sun_elevation, monkeypatch):
    """A run's shadow rays go through the static mesh as packets of neighbouring pixels (any-hit, where their
    origins lie within a few metres): a box, a thin pole and a slanted wall on the ground cast the same shadows, bit
    for bit, as pixel by pixel — under a high sun and a low one whose rays graze the ground and the occluders' edges —
    and the shadowed ground is darker than the sunlit ground."""
    import wsim.sensors.camera_render as camera_render
    from wsim.sensors.camera import SunSky

    ground = quad_mesh([-10, -20, 0], [60, 0, 0], [0, 40, 0])
    box = box_mesh([12.0, -3.0, 0.0], [14.0, 1.0, 2.5])
    pole = box_mesh([9.0, 3.0, 0.0], [9.15, 3.15, 4.0])
    wall = quad_mesh([18.0, -8.0, 0.0], [2.0, 10.0, 0.0], [1.0, 0.0, 3.0])
    scene = _scene_with_parts([ground, box, pole, wall], ["road", "building", "pole", "wall"])
    cam = Camera(_plain_pinhole(160, 96, 70.0), device="cpu")
    down = matrix_to_quat(np.array([[0.0, -1.0, 0.0], [-0.6, 0.0, -0.8], [0.8, 0.0, -0.6]]).T)
    pose = _pose([0.0, 0.0, 9.0], down)

    def render(packets: bool, shadows: bool = True) -> dict:
        monkeypatch.setattr(camera_render, "ROW_PACKETS", packets)
        light = SunSky(sun_elevation_deg=sun_elevation, sun_azimuth_deg=20.0, shadows=shadows)
        return cam.render(scene, 0.0, 0.0, (P.COLOR, P.SEMANTICS), pose, lighting=light).numpy()

    one, rows = render(False), render(True)
    np.testing.assert_array_equal(rows["color"], one["color"])
    lit = render(True, shadows=False)["color"]
    road = one["semantics"] == scene.semantic_class_index("road")
    darker = road & (one["color"].astype(int).sum(-1) < lit.astype(int).sum(-1))
    assert road.mean() > 0.3 and darker.sum() > 100


@pytest.mark.parametrize("moving", [False, True])
def test_row_packet_shadows_of_instances_equal_pixel_by_pixel(moving, monkeypatch):
    """The shadow rays of a row run meet the instances through one list per run: a car above the ground (still, or
    driving under a rolling shutter) casts the same shadow, bit for bit, as pixel by pixel through the top-level BVH,
    and the shadowed ground is darker than the sunlit ground."""
    import wsim.sensors.camera_render as camera_render
    from wsim.sensors.camera import SunSky

    ground = quad_mesh([-10, -20, 0], [60, 0, 0], [0, 40, 0])
    scene = _scene_with_parts([ground], ["road"])
    bp, bf = box_mesh([-1.0, -2.0, -0.5], [1.0, 2.0, 0.5])
    scene.parts.append(Part("car_body", material=1, semantic_class=scene.semantic_class_index("car")))
    scene.prototypes.append(MeshData(bp, bf, len(scene.parts) - 1, name="car"))
    ident = [0, 0, 0, 1.0]
    for k in range(6):
        start = [8.0 + 3.5 * k, -6.0 + 2.5 * k, 2.5]
        keys = [[start[0], start[1], 2.5], [start[0] + (4.0 if moving else 0.0), start[1], 2.5]]
        scene.instances.append(Instance(0, [0.0, 1.0], keys, [ident, ident], object_id=10 + k))
    cam = Camera(_plain_pinhole(150, 90, 60.0), device="cpu")
    if moving:
        cam.shutter = ShutterType.ROLLING_TOP_TO_BOTTOM
    down = matrix_to_quat(np.array([[0.0, -1.0, 0.0], [-0.6, 0.0, -0.8], [0.8, 0.0, -0.6]]).T)
    pose = _pose([0.0, 0.0, 9.0], down)
    light = SunSky(sun_elevation_deg=70.0, sun_azimuth_deg=160.0)

    def render(packets: bool) -> np.ndarray:
        monkeypatch.setattr(camera_render, "ROW_PACKETS", packets)
        return cam.render(scene, 0.2, 0.5, (P.COLOR, P.SEMANTICS), pose, lighting=light).numpy()

    one, rows = render(False), render(True)
    np.testing.assert_array_equal(rows["color"], one["color"])
    monkeypatch.setattr(camera_render, "ROW_PACKETS", False)
    lit = cam.render(scene, 0.2, 0.5, (P.COLOR,), pose, lighting=SunSky(sun_elevation_deg=70.0, sun_azimuth_deg=160.0,
                                                                        shadows=False)).numpy()["color"]
    road = one["semantics"] == scene.semantic_class_index("road")
    darker = road & (one["color"].astype(int).sum(-1) < lit.astype(int).sum(-1))
    assert road.mean() > 0.3 and (one["semantics"] == scene.semantic_class_index("car")).sum() > 50
    assert darker.sum() > 100  # the cars' shadows fall on the visible road


def test_semantics_of_two_objects(device):
    car = box_mesh([9.0, 1.0, -1.0], [11.0, 3.0, 1.0])  # world y > 0: left half of the image
    ped = box_mesh([9.5, -2.5, -1.0], [10.5, -1.5, 1.0])  # right half
    scene = _scene_with_parts([car, ped], ["car", "pedestrian"])
    w, h, fl = 80, 40, 40.0
    cam = Camera(_plain_pinhole(w, h, fl), device=device)
    fr = cam.render(scene, 0.0, 0.0, (P.SEMANTICS, P.SEMANTICS_COLORIZED), _pose([0, 0, 0]))
    sem = fr.semantics.numpy()
    ci, pi = scene.semantic_classes.index("car"), scene.semantic_classes.index("pedestrian")
    jj, ii = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    # camera x = -world y: the car's front face (x = 9) spans y ∈ [1, 3] → u ∈ [cx - 3/9 f, cx - 1/9 f]
    u_car = (jj > w / 2 - 3 / 9 * fl + 0.01) & (jj < w / 2 - 1 / 9 * fl - 0.01) & (np.abs(ii - h / 2) < 1 / 9 * fl - 0.01)
    u_ped = (jj > w / 2 + 1.5 / 9.5 * fl + 0.01) & (jj < w / 2 + 2.5 / 9.5 * fl - 0.01) & (
        np.abs(ii - h / 2) < 1 / 9.5 * fl - 0.01)
    assert u_car.sum() > 20 and u_ped.sum() > 20
    assert np.all(sem[u_car] == ci) and np.all(sem[u_ped] == pi)
    assert set(np.unique(sem)) == {0, ci, pi}
    assert np.all(sem[:, int(w / 2)] == 0) and np.all(sem[0] == 0)
    pal = semantic_palette(scene.semantic_classes)
    np.testing.assert_array_equal(fr.semantics_colorized.numpy(), pal[sem])
    table = {e.class_name: (e.class_index, e.color) for e in fr.semantic_classes}
    assert table["car"] == (ci, (0, 0, 142)) and table["unlabeled"] == (0, (0, 0, 0))


def _moving_scene():
    ground, wall = quad_mesh([20, 0, -1.5], [30, 0, 0], [0, 30, 0]), quad_mesh([25, 0, 5], [0, 0, 8], [0, 30, 0])
    s = _scene_with_parts([ground, wall], ["road", "building"])
    bp, bf = box_mesh([-1, -0.8, -0.7], [1, 0.8, 0.7])
    s.parts.append(Part("car", material=1, semantic_class=s.semantic_class_index("car"), object_id=99))
    s.prototypes.append(MeshData(bp, bf, len(s.parts) - 1, name="car"))
    q0, q1 = quat_from_axis_angle([0, 0, 1], 0.0), quat_from_axis_angle([0, 0, 1], 0.4)
    s.instances.append(Instance(0, [0.0, 0.1], [[12, -3, -0.8], [12, 3, -0.8]], [q0, q1], object_id=99,
                                name="track0", semantic_class=s.semantic_class_index("car"),
                                cuboid=np.array([2.0, 1.6, 1.4])))
    return s


def test_renders_are_bit_identical(device):
    scene = _moving_scene()
    cam = Camera(_ftheta(PolynomialType.PIXELDIST_TO_ANGLE), shutter="ROLLING_TOP_TO_BOTTOM",
                 windshield=_windshield(WindshieldReference.FORWARD), device=device)
    args = (scene, 0.0, 0.05, (P.COLOR, P.DISTANCE, P.SEMANTICS), _pose([0, 0.2, 0]), _pose([1.0, 0.0, 0.1]))
    a = cam.render(*args, supersample=2).numpy()
    b = cam.render(*args, supersample=2).numpy()
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    assert a["color"].shape == (120, 192, 3) and a["color"].dtype == np.uint8
    assert len(np.unique(a["color"].reshape(-1, 3), axis=0)) > 50  # shaded, not flat
    car = scene.semantic_classes.index("car")
    assert (a["semantics"] == car).sum() > 30


@wp.kernel
def _srgb_both_kernel(x: wp.array[float], table: wp.array[float], direct: wp.array[wp.uint8],
                      tabled: wp.array[wp.uint8]):
    i = wp.tid()
    direct[i] = _kshade.srgb_u8(x[i])
    tabled[i] = _kshade.srgb_of(table, x[i])


def test_srgb_thresholds_give_the_encoding_byte_for_byte(device):
    """Colour pixels are sRGB-encoded through 256 thresholds made with the encoding itself: the same byte as the
    power-law formula for every value, at and around each threshold (±8 floats), over [0, 1] densely and outside
    it; and the byte changes exactly at the thresholds, as sRGB's do."""
    from wsim.sensors.camera_render import srgb_table

    table = srgb_table(device)
    t = table.numpy()
    assert t[0] == 0.0 and np.all(np.diff(t) > 0) and t[255] <= 1.0
    lin = (np.arange(256) / 255.0 + 0.5 / 255.0)  # the byte boundaries of sRGB, decoded to linear
    ref = np.where(lin <= 0.04045, lin / 12.92, ((lin + 0.055) / 1.055) ** 2.4)[:-1]
    np.testing.assert_allclose(t[1:], ref, rtol=1e-5, atol=1e-7)
    bits = t.view(np.int32)[1:, None] + np.arange(-8, 9)[None]
    x = np.concatenate([bits.reshape(-1).view(np.float32), np.linspace(0.0, 1.0, 1 << 20, dtype=np.float32),
                        np.float32([-1.0, -0.0, 1.0, 1.5, 1e30, 1e-40])])
    xs = wp.array(x, dtype=float, device=device)
    direct = wp.empty(len(x), dtype=wp.uint8, device=device)
    tabled = wp.empty(len(x), dtype=wp.uint8, device=device)
    wp.launch(_srgb_both_kernel, len(x), [xs, table], [direct, tabled], device=device)
    np.testing.assert_array_equal(tabled.numpy(), direct.numpy())


def test_shadow_darkens_ground(device):
    ground = quad_mesh([10, 0, 0], [20, 0, 0], [0, 20, 0])
    blocker = quad_mesh([10, 0, 3.0], [2, 0, 0], [0, 2, 0])  # a roof 3 m above the ground, sun straight above
    scene = _scene_with_parts([ground, blocker], ["road", "building"])
    from wsim.sensors.camera import SunSky

    cam = Camera(_plain_pinhole(32, 32, 16.0), device=device)
    down = matrix_to_quat(np.array([[0.0, -1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, -1.0]]))  # looking down -z
    light = SunSky(sun_elevation_deg=90.0)
    pose = _pose([12.0, 0.0, 1.5], down)  # sees the ground beside and under the roof, not the roof
    lit = cam.render(scene, 0, 0, (P.COLOR, P.SEMANTICS), pose, lighting=light).numpy()
    nos = cam.render(scene, 0, 0, (P.COLOR,), pose, lighting=SunSky(sun_elevation_deg=90.0, shadows=False)).numpy()
    jj, ii = np.meshgrid(np.arange(32) + 0.5, np.arange(32) + 0.5)
    x_world = 12.0 - (ii - 16) / 16.0 * 1.5  # camera y → world -x
    shadow = (x_world < 12.0 - 0.05) & (lit["semantics"] > 0)
    sunny = (x_world > 12.0 + 0.05) & (lit["semantics"] > 0)
    assert shadow.sum() > 50 and sunny.sum() > 50
    g = lit["color"].astype(int).sum(axis=2)
    assert g[shadow].max() < g[sunny].min()
    np.testing.assert_array_equal(nos["color"][shadow], nos["color"][sunny][: shadow.sum()])


# ---------------------------------------------------------------------------------------------------------------------
# rolling shutter


def _pole_scene(half_width):
    return _scene_with_parts([quad_mesh([10.0, 0.0, 0.0], [0, 0, 40.0], [0, half_width, 0])], ["pole"])


@pytest.mark.parametrize("shutter", ["GLOBAL", "ROLLING_TOP_TO_BOTTOM", "ROLLING_BOTTOM_TO_TOP",
                                     "ROLLING_LEFT_TO_RIGHT", "ROLLING_RIGHT_TO_LEFT", "UNKNOWN"])
def test_rolling_shutter_pole(device, shutter):
    """A camera sliding sideways past a vertical pole (D = 10 m): every pixel is covered exactly when its centre lies
    between the pole edges projected from the camera position at that pixel's readout time."""
    w = h = 96
    fl, d, half, travel = 96.0, 10.0, 1.0, 4.0  # camera moves 4 m to its right (world -y) during the frame
    cam = Camera(_plain_pinhole(w, h, fl), shutter=shutter, device=device)
    y0, y1 = travel / 2, -travel / 2
    fr = cam.render(_pole_scene(half), 0.0, 0.03, (P.SEMANTICS,), _pose([0, y0, 0]), _pose([0, y1, 0]))
    mask = fr.semantics.numpy() > 0
    jj, ii = np.meshgrid(np.arange(w), np.arange(h))
    tau = {"ROLLING_TOP_TO_BOTTOM": ii / (h - 1), "ROLLING_BOTTOM_TO_TOP": (h - 1 - ii) / (h - 1),
           "ROLLING_LEFT_TO_RIGHT": jj / (w - 1), "ROLLING_RIGHT_TO_LEFT": (w - 1 - jj) / (w - 1)}.get(shutter, 0 * ii)
    y_cam = y0 + (y1 - y0) * tau
    u_left = w / 2 + fl * (y_cam - half) / d  # camera x = y_cam - y_world
    u_right = w / 2 + fl * (y_cam + half) / d
    uc = jj + 0.5
    ref = (uc > u_left) & (uc < u_right)
    ambiguous = (np.abs(uc - u_left) < 1e-3) | (np.abs(uc - u_right) < 1e-3)
    np.testing.assert_array_equal(mask[~ambiguous], ref[~ambiguous])
    centre = np.array([(np.nonzero(r)[0] + 0.5).mean() for r in mask])
    slope = np.polyfit(np.arange(h), centre, 1)[0]
    width = mask.sum(axis=1).mean()
    shift = fl * travel / d  # image motion over the whole frame [px]
    static_width = fl * 2 * half / d
    if shutter == "ROLLING_TOP_TO_BOTTOM":
        assert slope == pytest.approx(-shift / (h - 1), rel=0.03)
    elif shutter == "ROLLING_BOTTOM_TO_TOP":
        assert slope == pytest.approx(shift / (h - 1), rel=0.03)  # mirrored
    else:
        assert abs(slope) < 1e-9  # straight
    if shutter == "ROLLING_LEFT_TO_RIGHT":  # scan runs with the image motion's opposite: compressed
        assert width == pytest.approx(static_width / (1 + shift / (w - 1)), abs=1.0)
    elif shutter == "ROLLING_RIGHT_TO_LEFT":  # stretched
        assert width == pytest.approx(static_width / (1 - shift / (w - 1)), abs=1.0)
    else:
        assert width == pytest.approx(static_width, abs=1.0)


def _host_pose(p0, p1, tau):
    return (1 - tau) * p0[0] + tau * p1[0], quat_slerp(p0[1], p1[1], tau)


@pytest.mark.parametrize("shutter", ["ROLLING_TOP_TO_BOTTOM", "ROLLING_RIGHT_TO_LEFT"])
def test_project_rendered_points_back_to_their_pixels(device, shutter):
    scene = _moving_scene()
    cam = Camera(_ftheta(PolynomialType.PIXELDIST_TO_ANGLE), width=96, height=60, shutter=shutter,
                 windshield=_windshield(WindshieldReference.FORWARD), device=device)
    yaw = quat_from_axis_angle([0, 0, 1], 0.05)
    p0 = _pose([0, 0.3, 0.2])
    p1 = (np.array([0.8, -0.2, 0.25]), _quat_mul(yaw, Q_FWD))
    t0, t1 = 0.02, 0.06
    dist = cam.render(scene, t0, t1, (P.DISTANCE,), p0, p1).distance.numpy()
    jj, ii = np.meshgrid(np.arange(96) + 0.5, np.arange(60) + 0.5)
    px = np.column_stack([jj.ravel(), ii.ravel()])
    hit = dist.ravel() > 0
    assert hit.mean() > 0.5
    rays = cam.unproject(px)[0].numpy()
    tau = cam.relative_times(px).numpy()
    pts = []
    for k in np.nonzero(hit)[0]:
        t, q = _host_pose(p0, p1, tau[k])
        pts.append(t + quat_to_matrix(q) @ rays[k] * dist.ravel()[k])
    uv, depth, times, valid = cam.project(np.array(pts), t0, t1, p0, p1).numpy()
    assert valid.all()
    err = np.abs(uv - px[hit]).max()
    assert err < 0.05, err
    np.testing.assert_allclose(times, t0 + tau[hit] * (t1 - t0), atol=1e-7)
    assert np.all(depth > 0)


def _quat_mul(a, b):
    from wsim.scene.transforms import quat_multiply

    return quat_multiply(a, b)


def test_project_is_differentiable_wrt_poses(device):
    cam = Camera(_plain_pinhole(64, 48, 50.0), shutter="ROLLING_TOP_TO_BOTTOM", device=device)
    poses = wp.array(np.array([[0, 0, 0, *Q_FWD], [0, -0.5, 0, *Q_FWD]], np.float32), dtype=wp.transform,
                     device=device, requires_grad=True)
    pts = np.array([[10.0, 0.5, 0.3], [8.0, -1.0, -0.5]])
    tape = wp.Tape()
    with tape:
        proj = cam.project(pts, 0.0, 0.1, poses)
    tape.backward(grads={proj.pixels: wp.array([[1.0, 0.0], [1.0, 0.0]], dtype=wp.vec2, device=device)})
    g = poses.grad.numpy()
    tau = proj.times.numpy() / 0.1
    # u = cx + f·(y_cam - y_world)/x_world, y_cam = (1-τ) y0 + τ y1: ∂u/∂y0 = f (1-τ)/x, ∂u/∂y1 = f τ/x
    np.testing.assert_allclose(g[0, 1], np.sum(50.0 * (1 - tau) / pts[:, 0]), rtol=1e-4)
    np.testing.assert_allclose(g[1, 1], np.sum(50.0 * tau / pts[:, 0]), rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------------
# overlays, encoders, constructors, errors


def test_draw_boxes_outlines_moving_object(device):
    scene = _moving_scene()
    cam = Camera(_plain_pinhole(96, 64, 60.0), shutter="ROLLING_TOP_TO_BOTTOM", device=device)
    t0, t1 = 0.03, 0.07
    pose = _pose([0, 0, 0])
    fr = cam.render(scene, t0, t1, (P.SEMANTICS, P.COLOR), pose)
    car = fr.semantics.numpy() == scene.semantic_classes.index("car")
    assert car.sum() > 50
    from wsim.sensors.camera import cuboids_from_scene

    boxes = cuboids_from_scene(scene, t0, t1)
    assert len(boxes) == 1 and boxes[0].label == "track0"
    img = draw_boxes(fr.color, cam, boxes, t0, t1, pose, color=(255, 0, 255))
    drawn = np.all(img == [255, 0, 255], axis=2)
    dil = cv2.dilate(car.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    assert drawn.sum() > 40
    assert np.all(dil[drawn])  # every wireframe pixel lies on (or next to) the car as rendered at its time
    edge = car & ~cv2.erode(car.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    near = cv2.dilate(drawn.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    assert near[edge].mean() > 0.95  # the silhouette is outlined
    assert isinstance(Cuboid(np.ones(3), IDENT), Cuboid)


def test_composite_ego_mask_and_encoders():
    img = np.full((4, 6, 3), 100, np.uint8)
    img[0, 0] = (10, 20, 30)
    mask = np.zeros((2, 3, 4), np.uint8)
    mask[..., :3] = (200, 0, 0)
    mask[1, :, 3] = 255  # bottom half opaque after the 2x upscale
    out = composite_ego_mask(img, mask)
    assert out.shape == img.shape
    np.testing.assert_array_equal(out[0, 0], (10, 20, 30))
    np.testing.assert_array_equal(out[3, 2], (200, 0, 0))
    from PIL import Image

    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(encode_png(out)))), out)
    jpg = Image.open(io.BytesIO(encode_jpeg(out, 95)))
    assert jpg.format == "JPEG" and jpg.size == (6, 4)
    planar = np.frombuffer(encode_rgb_planar(out), np.uint8).reshape(3, 4, 6)
    np.testing.assert_array_equal(planar.transpose(1, 2, 0), out)


def test_from_calibration_composes_ego_and_camera_to_rig(device):
    cal = CameraCalibration("camera_front_wide_120fov", "ftheta",
                            {"principal_point_x": 95.3, "principal_point_y": 60.1,
                             "reference_poly": "PIXELDIST_TO_ANGLE", "pixeldist_to_angle_poly": list(BW),
                             "angle_to_pixeldist_poly": [], "max_angle": 0.0,
                             "linear_cde": {"linear_c": 0, "linear_d": 0, "linear_e": 0}},
                            (192, 120), (np.array([1.0, 0.0, 1.5]), Q_FWD), "ROLLING_TOP_TO_BOTTOM")
    ego = Trajectory([0.0, 1.0], [[10, 0, 0], [20, 0, 0]], [quat_from_axis_angle([0, 0, 1], np.pi / 2)] * 2)
    cam = Camera.from_calibration(cal, ego, width=96, height=60, device=device)
    assert cam.shutter == ShutterType.ROLLING_TOP_TO_BOTTOM and (cam.width, cam.height) == (96, 60)
    a, b = cam.frame_poses(0.25, 0.5)
    np.testing.assert_allclose(a[0], [12.5, 1.0, 1.5], atol=1e-9)  # rig yawed 90°: rig +x → world +y
    np.testing.assert_allclose(b[0], [15.0, 1.0, 1.5], atol=1e-9)
    np.testing.assert_allclose(quat_to_matrix(a[1]) @ [0, 0, 1], [0, 1, 0], atol=1e-9)  # looks along world +y
    # a point 5 m ahead of the camera at the frame start projects to the principal point (rows read at τ≈0.5)
    uv, depth, _, valid = cam.project([[12.5, 6.0, 1.5]], 0.25, 0.25).numpy()
    assert valid[0] and depth[0] == pytest.approx(5.0, rel=1e-6)
    np.testing.assert_allclose(uv[0], [(95.3 + 0.5) / 2, (60.1 + 0.5) / 2], atol=1e-3)
    assert ShutterType.parse("UNKNOWN").device_code == 0 == ShutterType.parse("GLOBAL").device_code


def _camera_stage(tmp_path):
    """A stage with a rig moving 10 m along x over 1 s, a plain USD pinhole and a fisheye described by JSON."""
    calib = {"model": "opencv_fisheye", "resolution": [320, 200], "shutter_type": "ROLLING_LEFT_TO_RIGHT",
             "logical_id": "cam_fish", "params": {"principal_point_x": 160, "principal_point_y": 100,
                                                  "focal_length_x": 90, "focal_length_y": 90,
                                                  "radial_coeffs": [0.01, 0, 0, 0], "max_angle": 1.4}}
    usda = f"""#usda 1.0
(
    upAxis = "Z"
    metersPerUnit = 1
    timeCodesPerSecond = 10
)
def Xform "rig"
{{
    double3 xformOp:translate.timeSamples = {{ 0: (1, 2, 3), 10: (11, 2, 3) }}
    uniform token[] xformOpOrder = ["xformOp:translate"]
    def Camera "pin"
    {{
        float focalLength = 20
        float horizontalAperture = 20
        float verticalAperture = 10
        int2 wsim:camera:resolution = (400, 200)
    }}
    def Camera "fish"
    {{
        string wsim:camera:calibration = '{json.dumps(calib)}'
    }}
}}
"""
    path = tmp_path / "cams.usda"
    path.write_text(usda)
    return path


def test_from_usd_prim(tmp_path, device):
    path = _camera_stage(tmp_path)
    pin = Camera.from_usd_prim(path, "/rig/pin", device=device)
    assert isinstance(pin.lens, OpenCVPinholeLens) and (pin.width, pin.height) == (400, 200)
    assert pin.lens.focal_length_x == pytest.approx(400.0) and pin.lens.focal_length_y == pytest.approx(400.0)
    a, b = pin.frame_poses(0.0, 1.0)
    np.testing.assert_allclose(a[0], [1, 2, 3], atol=1e-6)
    np.testing.assert_allclose(b[0], [11, 2, 3], atol=1e-6)
    # USD cameras look down their -z: 5 m below the camera along world -z is the image centre
    uv, depth, _, valid = pin.project([[1, 2, -2]], 0.0, 0.0).numpy()
    assert valid[0] and depth[0] == pytest.approx(5.0)
    np.testing.assert_allclose(uv[0], [200, 100], atol=1e-3)
    fish = Camera.from_usd_prim(path, "/rig/fish", device=device)
    assert isinstance(fish.lens, OpenCVFisheyeLens) and fish.shutter == ShutterType.ROLLING_LEFT_TO_RIGHT
    assert fish.logical_id == "cam_fish" and fish.lens.max_angle == pytest.approx(1.4)
    with pytest.raises(ValueError, match="/rig.*not a Camera"):
        Camera.from_usd_prim(path, "/rig")
    with pytest.raises(ValueError, match="cams.usda:/rig/bad: wsim:camera:calibration: focal_length_y"):
        bad = path.read_text().replace('def Camera "fish"', 'def Camera "bad"\n    {\n        string wsim:camera:'
                                       'calibration = \'{"model": "opencv_pinhole", "resolution": [8, 8], "params": '
                                       '{"principal_point_x": 4, "principal_point_y": 4, "focal_length_x": 5}}\'\n'
                                       '    }\n    def Camera "fish"')
        (tmp_path / "cams.usda").write_text(bad)
        Camera.from_usd_prim(path, "/rig/bad")


def test_usd_camera_prims_are_read_in_the_scene_package(tmp_path):
    """pxr stays in wsim.scene: wsim.scene.usd_sensors reads a Camera prim into plain values (a CameraCalibration and
    a Trajectory), the camera is built from those."""
    import re
    from pathlib import Path

    import wsim.sensors
    from wsim.scene.usd_sensors import CameraPrim, read_camera_prim

    for f in Path(wsim.sensors.__file__).parent.glob("*.py"):
        assert not re.search(r"^\s*(from|import)\s+pxr\b", f.read_text(), re.M), f"{f.name} imports pxr"
    path = _camera_stage(tmp_path)
    pin = read_camera_prim(path, "/rig/pin")
    assert isinstance(pin, CameraPrim) and isinstance(pin.calibration, CameraCalibration)
    c = pin.calibration
    assert (c.model, c.resolution, c.shutter_type, c.logical_id) == ("opencv_pinhole", (400, 200), "GLOBAL", "pin")
    assert c.params == pytest.approx({"principal_point_x": 200.0, "principal_point_y": 100.0, "focal_length_x": 400.0,
                                      "focal_length_y": 400.0})
    assert isinstance(pin.trajectory, Trajectory)
    np.testing.assert_allclose(pin.trajectory.times, [0.0, 1.0])
    np.testing.assert_allclose(pin.trajectory.translations, [[1, 2, 3], [11, 2, 3]], atol=1e-9)
    fish = read_camera_prim(path, "/rig/fish").calibration
    assert (fish.model, fish.resolution, fish.logical_id) == ("opencv_fisheye", (320, 200), "cam_fish")
    assert fish.shutter_type == "ROLLING_LEFT_TO_RIGHT" and fish.params["max_angle"] == 1.4
    with pytest.raises(ValueError, match="stage_path"):
        read_camera_prim(tmp_path / "missing.usda", "/rig/pin")


@pytest.mark.parametrize("make, field", [
    (lambda: FThetaLens(0, 120, 95.0, 60.0, BW), "width"),
    (lambda: FThetaLens(192, 120, 95.0, 60.0, ()), "pixeldist_to_angle_poly"),
    (lambda: FThetaLens(192, 120, 95.0, 60.0, BW, (0.0,) * 7), "angle_to_pixeldist_poly"),
    (lambda: FThetaLens(192, 120, 95.0, float("nan"), BW), "principal_point_y"),
    (lambda: FThetaLens(192, 120, 95.0, 60.0, (), FW, "ANGLE_TO_PIXELDIST", linear_cde=(1.0, 0.0)), "linear_cde"),
    (lambda: OpenCVPinholeLens(192, 120, 96, 60, 100, 100, (0.1,) * 5), "radial_coeffs"),
    (lambda: OpenCVPinholeLens(192, 120, 96, 60, 100, 100, (), (0.1,) * 3), "tangential_coeffs"),
    (lambda: OpenCVPinholeLens(192, 120, 96, 60, 100, 100, (), (), (0.1, float("inf"), 0, 0)), "thin_prism_coeffs"),
    (lambda: OpenCVFisheyeLens(192, 120, 96, 60, float("nan"), 100), "focal_length_x"),
    (lambda: OpenCVFisheyeLens(192, 0, 96, 60, 100, 100), "height"),
    (lambda: BivariateWindshield((1.0, 0.0, 0.0, 0.0), WS_V), "horizontal_poly"),
    (lambda: BivariateWindshield((), (), WS_H, WS_V, "FORWARD"), "horizontal_poly"),
    (lambda: BivariateWindshield(WS_H, WS_V, WS_H, (), "BACKWARD"), "vertical_poly_inverse"),
    (lambda: lens_from_params("ftheta", {"principal_point_x": 1.0}, (192, 120)), "principal_point_y"),
    (lambda: lens_from_params("orthographic", {}, (192, 120)), "model"),
    (lambda: ShutterType.parse("SIDEWAYS"), "shutter_type"),
    (lambda: Camera(_pinhole(), device="cpu").project([[0, 0, 1.0]], 1.0, 0.5, IDENT), "t1"),
    (lambda: Camera(_pinhole(), device="cpu").project([[0, 0, 1.0]], 0.0, 0.0, (np.zeros(3), [0, 0, 0, np.nan])),
     "start_pose"),
    (lambda: Camera(_pinhole(), device="cpu").project([[0, 0, 1.0]], 0.0, 0.0), "start_pose"),
    (lambda: Camera(_pinhole(), width=0, device="cpu"), "width"),
])
def test_malformed_specs_name_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


DOWN = matrix_to_quat(np.array([[0.0, -1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, -1.0]]))  # camera looking down −z


def test_texture_and_vertex_colours(device, tmp_path):
    from PIL import Image

    from wsim.sensors.camera import SunSky

    # a 2×1 texture, red | blue, on a 4 m quad whose s coordinate runs along world +y
    Image.fromarray(np.array([[[255, 0, 0], [0, 0, 255]]], np.uint8)).save(tmp_path / "rb.png")
    p, f = quad_mesh([0.0, 0.0, 0.0], [2.0, 0, 0], [0, 2.0, 0])
    st = np.stack([(p[:, 1] + 2) / 4, (p[:, 0] + 2) / 4], 1)
    scene = _scene_with_parts([(p, f)], ["road"])
    scene.materials[1].texture = str(tmp_path / "rb.png")
    scene.static.uvs = st[f].astype(np.float32)
    cam = Camera(_plain_pinhole(32, 32, 16.0), device=device)
    light = SunSky(sun_elevation_deg=90.0, shadows=False)
    img = cam.render(scene, 0, 0, (P.COLOR,), _pose([0.0, 0.0, 3.0], DOWN), lighting=light).color.numpy().astype(int)
    # column j sees world y = −(j + 0.5 − 16)/16 · 3: columns 8–12 see s ≈ 0.63–0.87 (blue), 19–23 s ≈ 0.13–0.37 (red)
    blue, red = img[8:24, 8:13], img[8:24, 19:24]
    assert np.all(blue[..., 2] > blue[..., 0] + 60) and np.all(red[..., 0] > red[..., 2] + 60)
    # vertex colours (no texture): each corner of a triangle shows its own colour
    tri = (np.array([[-2.0, -2.0, 0], [2.0, -2.0, 0], [-2.0, 2.0, 0]]), np.array([[0, 1, 2]]))
    scene2 = _scene_with_parts([tri], ["road"])
    scene2.static.colors = np.eye(3, dtype=np.float32)  # vertex 0 red, 1 green, 2 blue
    img2 = cam.render(scene2, 0, 0, (P.COLOR,), _pose([0.0, 0.0, 3.0], DOWN), lighting=light).color.numpy()
    # world (x, y) → pixel (row, col) = (16 − x·16/3, 16 − y·16/3)
    for (x, y), ch in (((-1.6, -1.6), 0), ((1.2, -1.6), 1), ((-1.6, 1.2), 2)):
        r, c = int(16 - x * 16 / 3), int(16 - y * 16 / 3)
        assert int(np.argmax(img2[r, c])) == ch, (x, y, img2[r, c])
