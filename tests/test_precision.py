"""Numerical precision against float64 and OpenCV references: lens inversion at every pixel, projections far from the
world origin, quaternion slerp at every angle."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import warp as wp

from wsim.kernels.pose import quat_slerp_shortest
from wsim.scene.transforms import quat_slerp
from wsim.sensors.camera import Camera
from wsim.sensors.lens import OpenCVFisheyeLens, OpenCVPinholeLens

IDENT = (np.zeros(3), np.array([0.0, 0.0, 0.0, 1.0]))

# ---------------------------------------------------------------------------------------------------------------------
# OpenCV pinhole with all 12 coefficients (rational k1..k6, tangential p1 p2, thin prism s1..s4) at 4K.
# With fx = 1459 px the horizontal field of view is 100° and the distortion factor d reaches 1.18 at the corners
# (valid up to 1.2); with fx = 1313 px the corners are beyond the lens's validity (d up to 1.245).

W4K, H4K = 3840, 2160
K_RATIONAL = (0.0814, 0.29, 0.0993, 0.3038, 0.1543, 0.0191)
P_TANGENTIAL = (1.0e-3, -6.0e-4)
S_PRISM = (2.0e-3, -3.0e-4, 1.0e-3, 2.0e-4)


def _lens_4k(fx: float) -> OpenCVPinholeLens:
    return OpenCVPinholeLens(W4K, H4K, 1921.3, 1078.6, fx, fx * 1.0008, K_RATIONAL, P_TANGENTIAL, S_PRISM)


def _distort64(x: np.ndarray, y: np.ndarray):
    """(x', y', d) of the OpenCV rational + tangential + thin-prism model in float64."""
    k, p, s = K_RATIONAL, P_TANGENTIAL, S_PRISM
    r2 = x * x + y * y
    d = (1 + k[0] * r2 + k[1] * r2**2 + k[2] * r2**3) / (1 + k[3] * r2 + k[4] * r2**2 + k[5] * r2**3)
    dx = 2 * p[0] * x * y + p[1] * (r2 + 2 * x * x) + s[0] * r2 + s[1] * r2**2
    dy = p[0] * (r2 + 2 * y * y) + 2 * p[1] * x * y + s[2] * r2 + s[3] * r2**2
    return x * d + dx, y * d + dy, d


def _all_pixel_centres(w: int, h: int) -> np.ndarray:
    jj, ii = np.meshgrid(np.arange(w, dtype=np.float64), np.arange(h, dtype=np.float64))
    return np.column_stack([jj.ravel() + 0.5, ii.ravel() + 0.5])


def _opencv_rays(lens: OpenCVPinholeLens, px: np.ndarray) -> np.ndarray:
    """Unit rays of pixels by ``cv2.undistortPoints`` iterated to convergence (checked: re-projection < 1e-6 px)."""
    crit = (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 1000, 1e-12)
    xy = cv2.undistortPoints(px.reshape(-1, 1, 2), lens.camera_matrix, lens.dist_coeffs, None, None, None,
                             crit).reshape(-1, 2)
    xd, yd, _ = _distort64(xy[:, 0], xy[:, 1])
    back = np.column_stack([lens.focal_length_x * xd + lens.principal_point_x,
                            lens.focal_length_y * yd + lens.principal_point_y])
    assert np.abs(back - px).max() < 1e-6, "OpenCV's reference did not converge"
    rays = np.column_stack([xy, np.ones(len(xy))])
    return rays / np.linalg.norm(rays, axis=1, keepdims=True)


def _strided_pixels() -> np.ndarray:
    """Every 4th pixel centre in both directions and the whole image border."""
    px = _all_pixel_centres(W4K, H4K).reshape(H4K, W4K, 2)
    border = np.concatenate([px[0], px[-1], px[:, 0], px[:, -1]])
    return np.concatenate([px[::4, ::4].reshape(-1, 2), border])


@pytest.mark.slow
@pytest.mark.parametrize("fx, edge", [(1459.1, False), (1313.2, True)], ids=["fov100", "edge_of_validity"])
def test_pinhole_12_coefficients_4k_round_trip_every_pixel(device, fx, edge):
    lens = _lens_4k(fx)
    cam = Camera(lens, device=device)
    corners = np.array([[1e-3, 1e-3], [W4K - 1e-3, 1e-3], [1e-3, H4K - 1e-3], [W4K - 1e-3, H4K - 1e-3]])
    px = np.concatenate([_all_pixel_centres(W4K, H4K), corners])
    rays, ok = (a.numpy() for a in cam.unproject(px))
    ok = ok.astype(bool)
    if edge:
        assert 0.001 < (~ok).mean() < 0.05 and not ok[-4:].any()  # the corners are beyond the lens's validity
    else:
        assert ok.all(), f"{(~ok).sum()} pixels without a ray"
    uv, _, _, valid = cam.project(rays[ok].astype(np.float64), 0.0, 0.0, IDENT).numpy()
    assert valid.all()
    err = np.linalg.norm(uv - px[ok], axis=1)
    assert err.max() < 1e-3, f"round trip max {err.max():.3g} px, {(err > 1).sum()} pixels > 1 px"


@pytest.mark.parametrize("fx", [1459.1, 1313.2], ids=["fov100", "edge_of_validity"])
def test_pinhole_12_coefficients_4k_unproject_matches_opencv(device, fx):
    lens = _lens_4k(fx)
    cam = Camera(lens, device=device)
    px = _strided_pixels()
    rays, ok = (a.numpy() for a in cam.unproject(px))
    ok = ok.astype(bool)
    ref = _opencv_rays(lens, px)
    # validity as the float64 model has it (0.8 < d < 1.2 at the undistorted point), up to rounding at the boundary
    d = _distort64(ref[:, 0] / ref[:, 2], ref[:, 1] / ref[:, 2])[2]
    sure = np.abs(d - 1.2) > 1e-5
    np.testing.assert_array_equal(ok[sure], ((d > 0.8) & (d < 1.2))[sure])
    assert ok.mean() > 0.95
    got = rays[ok].astype(np.float64)
    ang = np.arctan2(np.linalg.norm(np.cross(got, ref[ok]), axis=1), np.sum(got * ref[ok], axis=1))
    assert ang.max() < 1e-6, f"max {ang.max():.3g} rad"


# Fisheye lenses whose θ(δ) inversion is hard: strong distortion out to 145° off axis, and a lens whose δ(θ) stops
# increasing at 102.6° (max_angle derived there) with the image reaching beyond it.
FISHEYES = {
    "strong": ((-0.2, 0.05, -0.01, 0.001), 520.0),
    "fold": ((-0.12, 0.003, 0.0, 0.0), 560.0),
}


@pytest.mark.parametrize("name", list(FISHEYES))
def test_fisheye_round_trip_every_pixel(device, name):
    k, f = FISHEYES[name]
    lens = OpenCVFisheyeLens(1920, 1080, 961.2, 538.7, f, f * 1.001, k, 0.0)
    cam = Camera(lens, device=device)
    px = _all_pixel_centres(1920, 1080)
    rays, ok = (a.numpy() for a in cam.unproject(px))
    ok = ok.astype(bool)
    # float64: a pixel has a ray iff its normalised radius is below δ(max_angle)
    r = np.linalg.norm((px - [961.2, 538.7]) / [f, f * 1.001], axis=1)
    th = lens.effective_max_angle()
    r_max = th * (1 + k[0] * th**2 + k[1] * th**4 + k[2] * th**6 + k[3] * th**8)
    sure = np.abs(r - r_max) * f > 3e-3
    np.testing.assert_array_equal(ok[sure], (r < r_max)[sure])
    assert ok.mean() > 0.5
    uv, _, _, valid = cam.project(rays[ok].astype(np.float64), 0.0, 0.0, IDENT).numpy()
    assert valid.all()
    err = np.linalg.norm(uv - px[ok], axis=1)
    assert err.max() < 2e-3, f"round trip max {err.max():.3g} px, {(err > 1).sum()} pixels > 1 px"


# ---------------------------------------------------------------------------------------------------------------------
# slerp at every angle


@wp.kernel
def _slerp_kernel(q0: wp.array[wp.quat], q1: wp.array[wp.quat], s: wp.array[float], out: wp.array[wp.quat]):
    i = wp.tid()
    out[i] = quat_slerp_shortest(q0[i], q1[i], s[i])


def _qmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ax, ay, az, aw = np.moveaxis(a, -1, 0)
    bx, by, bz, bw = np.moveaxis(b, -1, 0)
    return np.stack([aw * bx + ax * bw + ay * bz - az * by, aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw, aw * bw - ax * bx - ay * by - az * bz], -1)


def _slerp_reference(q0: np.ndarray, q1: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Float64 shortest-arc slerp through the relative rotation's axis and angle: q0 ⊗ exp(s · log(q0⁻¹ ⊗ q1))."""
    q0 = q0 / np.linalg.norm(q0, axis=-1, keepdims=True)
    q1 = q1 / np.linalg.norm(q1, axis=-1, keepdims=True)
    rel = _qmul(q0 * [-1, -1, -1, 1], q1)
    rel = np.where(rel[:, 3:] < 0, -rel, rel)
    n = np.linalg.norm(rel[:, :3], axis=1, keepdims=True)
    half = np.arctan2(n, rel[:, 3:])
    axis = np.divide(rel[:, :3], n, out=np.zeros_like(rel[:, :3]), where=n > 0)
    step = np.concatenate([axis * np.sin(s[:, None] * half), np.cos(s[:, None] * half)], 1)
    return _qmul(q0, step)


def _rotation_angle_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Angle [rad] of the rotation taking unit quaternion b to a (either sign)."""
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    b = np.where(np.sum(a * b, -1, keepdims=True) < 0, -b, b)
    return 2 * np.arctan2(np.linalg.norm(a - b, axis=-1), np.linalg.norm(a + b, axis=-1))


def _slerp_cases(seed: int = 5):
    """Key pairs (float32-representable) turning by 0.001° to 179° (and 0) about random axes, at several fractions."""
    rng = np.random.default_rng(seed)
    angles = np.radians(np.concatenate([[0.0], np.geomspace(1e-3, 179.0, 400)]))
    reps, fracs = 8, np.array([0.0, 1e-3, 0.1, 0.25, 0.37, 0.5, 0.77, 0.999, 1.0])
    ang = np.repeat(angles, reps * len(fracs))
    s = np.tile(fracs, len(angles) * reps)
    q0 = rng.normal(size=(len(ang), 4))
    q0 /= np.linalg.norm(q0, axis=1, keepdims=True)
    axis = rng.normal(size=(len(ang), 3))
    axis /= np.linalg.norm(axis, axis=1, keepdims=True)
    q1 = _qmul(q0, np.concatenate([axis * np.sin(ang / 2)[:, None], np.cos(ang / 2)[:, None]], 1))
    q1 *= np.where(rng.uniform(size=(len(ang), 1)) < 0.5, -1.0, 1.0)  # either sign: the shortest arc is taken
    return q0.astype(np.float32), q1.astype(np.float32), s.astype(np.float32), ang


def test_slerp_device_matches_float64_at_every_angle(device):
    q0, q1, s, ang = _slerp_cases()
    out = wp.empty(len(s), dtype=wp.quat, device=device)
    wp.launch(_slerp_kernel, len(s), [wp.array(q0, dtype=wp.quat, device=device),
                                      wp.array(q1, dtype=wp.quat, device=device),
                                      wp.array(s, dtype=float, device=device)], [out], device=device)
    got = out.numpy().astype(np.float64)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=3e-7)
    ref = _slerp_reference(q0.astype(np.float64), q1.astype(np.float64), s.astype(np.float64))
    err = _rotation_angle_between(got, ref)
    worst = np.argmax(err)
    assert err.max() < 2e-7, f"{err.max():.3g} rad at {np.degrees(ang[worst]):.4g} deg, s = {s[worst]}"


def test_slerp_host_mirror_matches_float64_and_device(device):
    q0, q1, s, _ = _slerp_cases(seed=6)
    q0, q1, s64 = q0.astype(np.float64), q1.astype(np.float64), s.astype(np.float64)
    host = np.array([quat_slerp(a, b, t) for a, b, t in zip(q0, q1, s64)])
    ref = _slerp_reference(q0, q1, s64)
    assert _rotation_angle_between(host, ref).max() < 1e-12
    out = wp.empty(len(s), dtype=wp.quat, device=device)
    wp.launch(_slerp_kernel, len(s), [wp.array(q0, dtype=wp.quat, device=device),
                                      wp.array(q1, dtype=wp.quat, device=device),
                                      wp.array(s, dtype=float, device=device)], [out], device=device)
    assert _rotation_angle_between(out.numpy().astype(np.float64), host).max() < 2e-7


def test_slerp_of_equal_keys_has_the_bits_of_the_general_path(device):
    """Equal keys take a shortcut (no trigonometry); the antipodal key −q (a different quaternion, the same rotation)
    takes the general path with Ω = 0 exactly: both must give the very same bits, at every fraction."""
    rng = np.random.default_rng(11)
    q = rng.normal(size=(500, 4))
    q[:100] *= 10.0 ** rng.uniform(-3, 3, size=(100, 1))  # keys far from unit length too
    q = q.astype(np.float32)
    s = np.concatenate([[0.0, 1.0, 0.5, 1e-7, 1 - 2**-24], rng.uniform(size=495)]).astype(np.float32)

    def run(q1):
        out = wp.empty(len(s), dtype=wp.quat, device=device)
        wp.launch(_slerp_kernel, len(s), [wp.array(q, dtype=wp.quat, device=device),
                                          wp.array(q1, dtype=wp.quat, device=device),
                                          wp.array(s, dtype=float, device=device)], [out], device=device)
        return out.numpy()

    same, antipodal = run(q), run(-q)
    assert np.array_equal(same.view(np.uint32), antipodal.view(np.uint32))
    np.testing.assert_allclose(same, q / np.linalg.norm(q, axis=1, keepdims=True), atol=2e-7)


# ---------------------------------------------------------------------------------------------------------------------
# independence of the world origin

FAR = np.array([8000.0, -6000.0, 37.0])  # 10 km from the origin (exact in float32)
Q_FWD = np.array([-0.5, 0.5, -0.5, 0.5])  # OpenCV camera looking along world +x (x → -y, y → -z)


def _moving_poses(offset: np.ndarray):
    """Start/end camera-to-world poses of a camera moving 0.9 m and turning 2° within a frame, offset in the world."""
    turn = np.array([0.0, 0.0, np.sin(np.radians(1.0)), np.cos(np.radians(1.0))])
    x, y, z, w = turn
    a, b, c, d = Q_FWD
    q1 = np.array([w * a + x * d + y * c - z * b, w * b - x * c + y * d + z * a, w * c + x * b - y * a + z * d,
                   w * d - x * a - y * b - z * c])
    return (offset + [0.0, 0.3, 1.5], Q_FWD), (offset + [0.9, 0.25, 1.52], q1)


@pytest.mark.parametrize("shutter", ["GLOBAL", "ROLLING_TOP_TO_BOTTOM"])
def test_project_far_from_origin_matches_origin(device, shutter):
    lens = OpenCVPinholeLens(1920, 1080, 961.3, 540.2, 1800.0, 1801.0, (-0.1, 0.02, 0.0, 0.0, 0.0, 0.0),
                             (2e-4, -1e-4))
    cam = Camera(lens, shutter=shutter, device=device)
    rng = np.random.default_rng(7)
    n = 4000
    local = np.column_stack([rng.uniform(3.0, 80.0, n), rng.uniform(-20.0, 20.0, n), rng.uniform(-5.0, 8.0, n)])
    local = local + [0.123456789, 0.987654321, 0.5] + rng.uniform(-1e-3, 1e-3, (n, 3))  # not float32-representable
    ref = cam.project(local, 0.0, 0.033, *_moving_poses(np.zeros(3))).numpy()
    far = cam.project(local + FAR, 0.0, 0.033, *_moving_poses(FAR)).numpy()
    assert ref[3].mean() > 0.3
    np.testing.assert_array_equal(far[3], ref[3])
    ok = ref[3]
    err = np.abs(far[0] - ref[0])[ok].max()
    assert err < 1e-3, f"{err:.3g} px"
    np.testing.assert_allclose(far[1][ok], ref[1][ok], rtol=1e-6)
    np.testing.assert_allclose(far[2][ok], ref[2][ok], atol=1e-9)


@pytest.mark.parametrize("offset", [np.zeros(3), FAR])
def test_object_frame_points_project_like_their_world_points(device, offset):
    """Points given in a moving object's frame (point_object / object_poses) land where the same points in world
    coordinates do, near the origin and far from it (the object's pose carries the shift, its points do not)."""
    lens = OpenCVPinholeLens(1920, 1080, 961.3, 540.2, 1800.0, 1801.0)
    cam = Camera(lens, shutter="GLOBAL", device=device)
    rng = np.random.default_rng(3)
    local = np.column_stack([rng.uniform(-2.0, 2.0, 500), rng.uniform(-1.0, 1.0, 500), rng.uniform(0.0, 1.5, 500)])
    car = offset + [30.0, 1.0, 0.0]  # a car 30 m ahead, not rotated, still over the frame
    poses = _moving_poses(offset)
    world = cam.project(local + car, 0.0, 0.033, *poses).numpy()
    obj = cam.project(local, 0.0, 0.033, *poses, point_object=np.zeros(len(local), np.int32),
                      object_poses=[[[*car, 0, 0, 0, 1], [*car, 0, 0, 0, 1]]]).numpy()
    assert world[3].all()
    np.testing.assert_array_equal(obj[3], world[3])
    assert np.abs(obj[0] - world[0]).max() < 1e-3


def _plane_scene(offset: np.ndarray):
    from wsim.scene import Material, MeshData, Part, Scene

    # a tilted wall 20-30 m ahead of the camera and a ground plane, subdivided into a grid of triangles
    g = np.linspace(-1.0, 1.0, 9)
    u, v = np.meshgrid(g, g)
    wall = np.column_stack([25.0 + 5.0 * u.ravel(), 30.0 * u.ravel(), 12.0 * v.ravel() + 4.0])
    ground = np.column_stack([40.0 * u.ravel() + 41.0, 40.0 * v.ravel(), np.zeros(u.size)])
    quads = np.array([[i * 9 + j, i * 9 + j + 1, (i + 1) * 9 + j + 1, (i + 1) * 9 + j] for i in range(8)
                      for j in range(8)])
    tris = np.concatenate([quads[:, [0, 1, 2]], quads[:, [0, 2, 3]]])
    pts = np.concatenate([wall, ground]) + offset
    faces = np.concatenate([tris, tris + len(wall)])
    s = Scene(MeshData(pts, faces, 1), source="plane")
    s.materials.append(Material.from_labels("wall", "calibration_lambertian", "none", ()))
    s.parts.append(Part("/World/Wall", material=1, semantic_class=s.semantic_class_index("wall"), object_id=1))
    return s


@pytest.mark.parametrize("shutter", ["GLOBAL", "ROLLING_TOP_TO_BOTTOM"])
def test_render_distance_far_from_origin_matches_origin(device, shutter):
    lens = OpenCVPinholeLens(320, 200, 160.3, 100.2, 300.0, 300.0)
    cam = Camera(lens, shutter=shutter, device=device)
    ref = cam.render(_plane_scene(np.zeros(3)), 0.0, 0.033, ("distance",), *_moving_poses(np.zeros(3))).distance
    far = cam.render(_plane_scene(FAR), 0.0, 0.033, ("distance",), *_moving_poses(FAR)).distance
    ref, far = ref.numpy(), far.numpy()
    hit = ref > 0
    assert hit.mean() > 0.8
    np.testing.assert_array_equal(far > 0, hit)
    err = np.abs(far - ref)[hit].max()
    assert err < 1e-3, f"{err:.3g} m"
