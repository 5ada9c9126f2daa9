"""Annotated figures and the lidar-on-camera overlay: layouts, colour bars that hold the colormap, legends, top-down
crops and markers, the occlusion test against the camera's distance image and motion compensation of moving objects."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import box_mesh, box_room_scene, quad_mesh

from wsim.scene import Instance, Material, MeshData, Part, Scene
from wsim.scene.transforms import matrix_to_quat
from wsim.sensors import figures as F
from wsim.sensors.camera import Camera, CameraProduct, semantic_palette
from wsim.sensors.lens import OpenCVPinholeLens
from wsim.sensors.lidar import Lidar
from wsim.sensors.panorama import intensity_grey, render_panorama
from wsim.sensors.topdown import crop_bounds, topdown_image, topdown_raster, turbo_colors

# OpenCV camera at the origin looking along world +x (camera x → world -y, camera y → world -z)
Q_FWD = matrix_to_quat(np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]]))
CAM_POSE = (np.zeros(3), Q_FWD)
LUT = turbo_colors(np.linspace(1e-4, 1.0, 1001), 1.0).astype(np.int64)


def _inside(outer, inner) -> bool:
    return outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]


def _region(fig: F.Figure, name: str) -> np.ndarray:
    x0, y0, x1, y1 = fig.boxes[name]
    return fig.image[y0:y1, x0:x1]


def _assert_turbo_bar(fig: F.Figure, name: str = "colorbar") -> None:
    """The bar holds Turbo from its top (vmax) to its bottom (0): each row is one colour, the nearest Turbo index of
    the rows falls monotonically and spans the whole map."""
    bar = _region(fig, name).astype(np.int64)
    assert bar.shape[0] >= 40 and bar.shape[1] >= 8
    assert np.all(bar == bar[:, :1])  # rows are uniform
    col = bar[:, 0]
    d = ((col[:, None, :] - LUT[None]) ** 2).sum(-1)
    idx = d.argmin(1)
    assert d.min(1).max() <= 3  # every row is a Turbo colour
    assert np.all(np.diff(idx) <= 0), idx  # vmax at the top, 0 at the bottom
    assert idx[0] > 980 and idx[-1] < 20


def _plain_pinhole(w, h, f):
    return OpenCVPinholeLens(w, h, w / 2, h / 2, f, f)


def _scene(static, classes):
    """Static scene from (points, faces) pairs, mesh k in part k+1 with semantic class classes[k]."""
    s = Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), 0))
    pts, faces, parts, off = [], [], [], 0
    for k, ((p, f), cls) in enumerate(zip(static, classes)):
        s.materials.append(Material(f"m{k}", base_color=(0.3, 0.5, 0.4)))
        s.parts.append(Part(f"/World/p{k}", material=k + 1, semantic_class=s.semantic_class_index(cls),
                            object_id=k + 1))
        pts.append(p)
        faces.append(np.asarray(f) + off)
        parts.append(np.full(len(f), k + 1))
        off += len(p)
    s.static = MeshData(np.concatenate(pts), np.concatenate(faces), np.concatenate(parts))
    return s


# ---------------------------------------------------------------------------------------------------------------------
# figures


def test_helpers():
    assert list(F.nice_ticks(0, 80)) == [0, 20, 40, 60, 80]
    assert list(F.nice_ticks(-19.2, 17.0, 7)) == [-10, 0, 10]
    assert F.tick_labels([0, 0.25, 0.5, 1]) == ["0.00", "0.25", "0.50", "1.00"]
    assert F.tick_labels([-10, 0, 10]) == ["-10", "0", "10"]
    assert F.nice_ceil(0.496) == pytest.approx(0.5) and F.nice_ceil(63.0) == pytest.approx(65.0)
    lines = F.wrap_text("a few words that will not fit on one short line", 80)
    assert len(lines) > 2 and all(F.text_size(s)[0] <= 80 for s in lines if " " in s)


def test_panorama_figure(device):
    scene = box_room_scene([-10.0, -4.0, -3.0], [30.0, 6.0, 5.0])
    pano = render_panorama(scene, np.zeros(3), width=360, height=41, elevation_deg=(-20.0, 20.0),
                           heading_rad=np.pi / 2, device=device)
    # the centre column looks along the heading (+y: the wall 6 m away), column 0 backward (-y: 4 m)
    assert pano.azimuth_deg[180] == pytest.approx(-0.5) and pano.heading_deg == pytest.approx(90.0)
    assert pano.range_m[20, 180] == pytest.approx(6.0 / np.cos(np.deg2rad(0.5)), rel=1e-4)
    assert pano.range_m[20, 0] == pytest.approx(4.0 / np.cos(np.deg2rad(0.5)), rel=1e-4)
    fig = F.panorama_figure(pano, title="panorama", max_range_m=40.0)
    for name in ("title", "range", "intensity", "colorbar_range", "colorbar_intensity", "azimuth_axis"):
        assert name in fig.boxes and _inside((0, 0, *fig.size), fig.boxes[name])
    np.testing.assert_array_equal(_region(fig, "range"), pano.range_image(40.0))
    np.testing.assert_array_equal(_region(fig, "intensity"), pano.intensity_image())
    assert fig.boxes["range"][2] - fig.boxes["range"][0] == 360
    assert fig.size[0] > 360 + 60 and fig.size[1] > 2 * 41 + 60
    _assert_turbo_bar(fig, "colorbar_range")
    grey = _region(fig, "colorbar_intensity")[:, 0].astype(int)
    assert np.all(grey == grey[:, :1]) and np.all(np.diff(grey[:, 0]) <= 0)  # white (1) at the top, black (0) below
    h = grey.shape[0]
    np.testing.assert_array_equal(grey[:, 0], intensity_grey(1.0 - (np.arange(h) + 0.5) / h))  # the image's √ grey


def test_topdown_raster_and_crop():
    rng = np.random.default_rng(3)
    pts = np.column_stack([rng.uniform(-20, 40, 5000), rng.uniform(-8, 6, 5000), np.zeros(5000)])
    pts[:20] = [300.0, -200.0, 0.0]  # far outliers (0.4 %) do not widen the view
    vals = rng.uniform(0.0, 1.0, 5000)
    b = crop_bounds(pts, margin_m=2.0, include=np.array([[0.0, 0.0]]))
    assert -23.0 < b[0] < -21.0 and 41.0 < b[1] < 43.0 and -11.0 < b[2] < -9.5 and 7.5 < b[3] < 9.0
    right = topdown_raster(pts, vals, b, resolution_m=0.5, forward="right")
    up = topdown_raster(pts, vals, b, resolution_m=0.5, forward="up")
    assert right.shape[:2] == (round((b[3] - b[2]) / 0.5), round((b[1] - b[0]) / 0.5))
    np.testing.assert_array_equal(up, np.rot90(right, 1))  # the same view, turned a quarter
    # the square view of topdown_image is topdown_raster over ±extent with x up
    np.testing.assert_array_equal(topdown_image(pts, vals, extent_m=30.0, resolution_m=0.5),
                                  topdown_raster(pts, vals, (-30, 30, -30, 30), resolution_m=0.5, forward="up"))
    one = topdown_raster(np.array([[10.25, 2.25, 0.0]]), np.array([1.0]), (0, 20, -5, 5), resolution_m=0.5,
                         forward="right")
    r, c = np.argwhere(one.any(axis=2))[0]
    assert (r, c) == (int((5 - 2.25) / 0.5), int(10.25 / 0.5))  # column = x from x_min, row = y from y_max


@pytest.mark.parametrize("forward", ["right", "up"])
def test_topdown_figure(forward):
    rng = np.random.default_rng(0)
    pts = np.column_stack([rng.uniform(-10, 50, 20000), rng.uniform(-7, 9, 20000), np.zeros(20000)])
    vals = rng.uniform(0.0, 0.8, 20000)
    sensor, heading = (5.0, 1.0), 0.0
    fig = F.topdown_figure(pts, vals, title="top-down", sensor_xy=sensor, heading_rad=heading, forward=forward,
                           resolution_m=0.1, scale_bar_m=10.0)
    x0, x1, y0, y1 = fig.info["bounds"]
    assert x0 < -10 < 50 < x1 and y0 < -7 < 9 < y1 and x1 - x0 < 70 and y1 - y0 < 26  # cropped to the data
    ix0, iy0, ix1, iy1 = fig.boxes["image"]
    nx, ny = round((x1 - x0) / 0.1), round((y1 - y0) / 0.1)
    assert (ix1 - ix0, iy1 - iy0) == ((nx, ny) if forward == "right" else (ny, nx))
    for name in ("title", "colorbar", "legend", "scale_bar", "ego_marker"):
        assert name in fig.boxes and _inside((0, 0, *fig.size), fig.boxes[name])
    assert _inside(fig.boxes["image"], fig.boxes["scale_bar"])
    assert fig.info["vmax"] == pytest.approx(0.8) and fig.info["scale_bar_m"] == 10.0
    _assert_turbo_bar(fig)
    # the scale bar's white line is 10 m long
    sb = _region(fig, "scale_bar")
    white_rows = np.all(sb == 255, axis=2).sum(axis=1)
    assert abs(white_rows.max() - 10.0 / 0.1) <= 2
    # the ego marker sits at the sensor and points along the heading (x: right or up)
    mx0, my0, mx1, my1 = fig.boxes["ego_marker"]
    cx, cy = (mx0 + mx1) / 2, (my0 + my1) / 2
    px = ((sensor[0] - x0) / 0.1, (y1 - sensor[1]) / 0.1) if forward == "right" else \
        ((y1 - sensor[1]) / 0.1, (x1 - sensor[0]) / 0.1)
    assert abs(cx - (ix0 + px[0])) <= 1.5 and abs(cy - (iy0 + px[1])) <= 1.5
    mag = np.argwhere(np.all(_region(fig, "ego_marker") == F.MARKER, axis=2))
    assert len(mag) > 60
    dy, dx = mag.mean(0) - [(my1 - my0) / 2, (mx1 - mx0) / 2]
    if forward == "right":
        assert dx > 4 and abs(dy) < 2
    else:
        assert dy < -4 and abs(dx) < 2


def test_camera_figures_colorbar_and_legend(device):
    car = box_mesh([9.0, 1.0, -1.0], [11.0, 3.0, 1.0])
    ped = box_mesh([9.5, -2.5, -1.0], [10.5, -1.5, 1.0])
    scene = _scene([car, ped], ["car", "pedestrian"])
    cam = Camera(_plain_pinhole(160, 90, 80.0), device=device)
    fr = cam.render(scene, 0.0, 0.0, ("semantics", "semantics_colorized", "distance_colorized"), CAM_POSE,
                    vmax=20.0)
    sem = fr.semantics.numpy()
    legend = F.semantic_legend(sem, fr.semantic_classes)
    pal = semantic_palette(scene.semantic_classes)
    names = [s.split("  ")[0] for s, _ in legend]
    assert names[0].startswith("unlabeled") and set(names[1:]) == {"car", "pedestrian"}  # present classes only
    for s, col in legend:
        k = scene.semantic_classes.index(s.split("  ")[0].split(" ")[0])
        assert col == tuple(pal[k]) and s.endswith(f"{100 * np.mean(sem == k):.1f} %")
    fig = F.camera_figure(fr.semantics_colorized.numpy(), title="semantics", legend=legend)
    np.testing.assert_array_equal(_region(fig, "image"), fr.semantics_colorized.numpy())
    box = _region(fig, "legend")
    for _, col in legend[1:]:
        assert np.all(box == col, axis=2).sum() >= 100  # a 12x12 swatch of the class colour
    assert "colorbar" not in fig.boxes
    dfig = F.camera_figure(fr.distance_colorized.numpy(), title="distance", colorbar=(20.0, "distance [m]"),
                           notes=["black: no hit"])
    assert dfig.boxes["image"][2] - dfig.boxes["image"][0] == 160 and dfig.info["vmax"] == 20.0
    _assert_turbo_bar(dfig)
    assert dfig.size[0] >= 160 + 40 and dfig.size[1] > 90 + 30


# ---------------------------------------------------------------------------------------------------------------------
# lidar on camera


def test_overlay_occlusion(device):
    # a 2 m x 2 m wall at x = 10 in front of a plane at x = 20; the camera at the origin looks along +x
    wall = quad_mesh([10.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0])
    far = quad_mesh([20.0, 0.0, 0.0], [0.0, 30.0, 0.0], [0.0, 0.0, 30.0])
    scene = _scene([wall, far], ["wall", "building"])
    w, h, f = 200, 150, 100.0
    cam = Camera(_plain_pinhole(w, h, f), device=device)
    dist = cam.render(scene, 0.0, 0.0, ("distance",), CAM_POSE).distance.numpy()
    g = np.linspace(-5.5, 5.5, 45)
    yy, zz = (a.ravel() for a in np.meshgrid(g, g))
    behind = np.column_stack([np.full(yy.size, 20.0), yy, zz])  # on the far plane
    front = np.column_stack([np.full(81, 10.0), *(a.ravel() for a in np.meshgrid(*[np.linspace(-0.9, 0.9, 9)] * 2))])
    pts = np.concatenate([behind, front])
    proj = F.project_lidar(cam, pts, 0.0, 0.0, distance=dist, start_pose=CAM_POSE)
    assert proj.in_image.all()
    np.testing.assert_allclose(proj.distance, np.linalg.norm(pts, axis=1), rtol=1e-5)  # ray distance, not z
    # a far-plane point is hidden iff its camera ray crosses the wall: |y|, |z| < 2 at x = 20
    hidden = (np.abs(yy) < 2.0) & (np.abs(zz) < 2.0)
    occ = proj.occluded[: len(behind)]
    assert hidden.sum() > 100 and (~hidden).sum() > 1000
    sel = (np.abs(np.abs(yy) - 2.0) > 0.15) & (np.abs(np.abs(zz) - 2.0) > 0.15)  # a pixel away from the edges
    np.testing.assert_array_equal(occ[sel], hidden[sel])
    assert not proj.occluded[len(behind):].any()  # the wall's own points stay
    # off-axis far-plane points (z-depth 20, ray distance up to 23) compare like with like and stay
    assert not occ[~hidden & sel].any()
    # within the tolerance a point stays: 0.4 m behind the wall's surface at 10 m is kept, 0.6 m is dropped
    near = F.project_lidar(cam, np.array([[10.4, 0.05, 0.05], [10.6, 0.05, 0.05]]), 0.0, 0.0, distance=dist,
                           start_pose=CAM_POSE)
    assert list(near.occluded) == [False, True]
    # only the visible points are drawn
    base = np.zeros((h, w, 3), np.uint8)
    img = F.draw_lidar_points(base, proj, 30.0)
    drawn = img.any(axis=2)
    uv = np.floor(proj.pixels).astype(int)
    assert drawn[uv[proj.visible, 1], uv[proj.visible, 0]].all()
    only_hidden = proj.occluded.copy()
    only_hidden[proj.visible] = False
    hid_px = {(v, u) for u, v in uv[only_hidden]} - {(v, u) for u, v in uv[proj.visible]}
    assert hid_px and not any(drawn[v, u] for v, u in hid_px)


def _moving_box_scene():
    """Ground-free scene: a far wall (x = 30) and a 2 x 2 x 1.6 m box moving along +y at 20 m/s through x = 12."""
    wall = quad_mesh([30.0, 0.0, 0.0], [0.0, 40.0, 0.0], [0.0, 0.0, 10.0])
    s = _scene([wall], ["building"])
    bp, bf = box_mesh([-1.0, -1.0, -0.8], [1.0, 1.0, 0.8])
    s.parts.append(Part("/World/car/body", material=1, semantic_class=s.semantic_class_index("car")))
    s.prototypes.append(MeshData(bp, bf, len(s.parts) - 1, name="car"))
    q = [0.0, 0.0, 0.0, 1.0]
    s.instances.append(Instance(0, [0.0, 0.4], [[12.0, -4.0, 0.0], [12.0, 4.0, 0.0]], [q, q], object_id=77,
                                name="/World/car", semantic_class=s.semantic_class_index("car")))
    return s


def test_overlay_motion_compensation(device):
    scene = _moving_box_scene()
    car = scene.semantic_classes.index("car")
    lidar = Lidar.preset("PANDAR128", scene=scene, mount=((0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 1.0)), device=device,
                         output_frame_of_reference="WORLD", elements_coords_type="CARTESIAN")
    pc = lidar.render(0.0, 0.1)  # the scan fired over [0, 0.1) s; the box moves 2 m meanwhile
    inst = F.lidar_point_instances(pc, scene)
    times = F.lidar_point_times(pc, scene)
    on_box = inst == 0
    assert on_box.sum() > 200
    np.testing.assert_array_equal(on_box, pc["SemanticId"].numpy()[: pc.count] == car)  # ObjectId → the instance
    assert 0.0 <= times.min() and times.max() < 0.1
    # the camera reads out 0.2-0.23 s (rolling shutter): the box has moved 2-4.6 m since the points were fired
    cam = Camera(_plain_pinhole(160, 120, 90.0), shutter="ROLLING_TOP_TO_BOTTOM", device=device)
    c0, c1 = 0.2, 0.23
    fr = cam.render(scene, c0, c1, (CameraProduct.DISTANCE, CameraProduct.SEMANTICS), CAM_POSE)
    sem, dist = fr.semantics.numpy(), fr.distance.numpy()
    xyz = pc.xyz()
    moved = F.project_lidar(cam, xyz, c0, c1, distance=dist, scene=scene, instance=inst, times=times,
                            start_pose=CAM_POSE)
    still = F.project_lidar(cam, xyz, c0, c1, distance=dist, start_pose=CAM_POSE)
    assert np.array_equal(moved.compensated, on_box) and not still.compensated.any()

    def on_car(p, m):
        uv = np.floor(p.pixels[m]).astype(int)
        return sem[uv[:, 1], uv[:, 0]] == car

    # the box's points in its own frame (it only translates: centre (12, -4 + 20 t, 0))
    local = xyz - np.column_stack([np.full(len(xyz), 12.0), -4.0 + 20.0 * times, np.zeros(len(xyz))])
    front = on_box & (np.abs(local[:, 0] + 1.0) < 0.05) & moved.in_image  # the face toward the sensors
    side = on_box & (np.abs(local[:, 1] - 1.0) < 0.05) & moved.in_image  # the +y face: seen while the box was at
    assert front.sum() > 150 and side.sum() > 20  # y < 0, turned away from the camera once it has passed y = 0
    assert moved.visible[front].mean() > 0.97
    hit = on_car(moved, front)
    assert hit.mean() > 0.97  # a point on the moving box lands on the box in the image
    uv = np.floor(moved.pixels[front][hit]).astype(int)  # ... where the camera sees the box at the point's distance
    np.testing.assert_allclose(moved.distance[front][hit], dist[uv[:, 1], uv[:, 0]], atol=0.1)
    deep = side & (local[:, 0] > -0.2)  # > 0.8 m behind the front face along the camera ray: beyond the tolerance
    assert deep.sum() > 10 and moved.occluded[deep].mean() > 0.95  # the face the camera cannot see is dropped
    s = on_box & still.in_image
    assert on_car(still, s).mean() < 0.2  # without compensation they fall where the box was
    # static points are untouched by the compensation
    np.testing.assert_array_equal(moved.pixels[~on_box], still.pixels[~on_box])
    # the readout time of each point is its pixel row's
    tau = cam.relative_times(moved.pixels[front]).numpy()
    np.testing.assert_allclose(moved.times[front], c0 + tau * (c1 - c0), atol=1e-6)
