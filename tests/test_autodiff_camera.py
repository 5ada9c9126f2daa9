"""Camera gradients: DISTANCE tape and point projection against central finite differences, torch gradcheck, finite
gradients at misses and silhouettes, rolling-shutter readout time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import warp as wp
from conftest import DEVICES, box_mesh, quad_mesh

from wsim.autodiff.camera import (camera_distance, pose_compose, pose_interpolate, project_points, rig_frame_poses,
                                  se3_exp, trajectory_pose)
from wsim.scene import Instance, Material, MeshData, Part, Scene, Trajectory
from wsim.scene.transforms import matrix_to_quat, quat_from_axis_angle, quat_multiply, quat_to_matrix
from wsim.sensors.camera import Camera
from wsim.sensors.lens import FThetaLens, OpenCVPinholeLens, PolynomialType

# OpenCV camera looking along world +x (camera x → world -y, camera y → world -z)
Q_FWD = matrix_to_quat(np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]]))


def _look(yaw_deg: float, pitch_deg: float) -> np.ndarray:
    """Camera-to-world quaternion of a camera looking along +x, turned left by ``yaw`` and down by ``pitch``."""
    qz = quat_from_axis_angle([0, 0, 1], np.radians(yaw_deg))
    qy = quat_from_axis_angle([0, 1, 0], np.radians(pitch_deg))
    return quat_multiply(qz, quat_multiply(qy, Q_FWD))


def _scene(meshes) -> Scene:
    """Static scene from (points, faces) pairs, one part and material each."""
    s = Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), 0))
    pts, faces, parts, off = [], [], [], 0
    for k, (p, f) in enumerate(meshes):
        s.materials.append(Material(f"m{k}"))
        s.parts.append(Part(f"p{k}", material=k + 1, semantic_class=0, object_id=k + 1))
        pts.append(p)
        faces.append(np.asarray(f) + off)
        parts.append(np.full(len(f), k + 1))
        off += len(p)
    s.static = MeshData(np.concatenate(pts), np.concatenate(faces), np.concatenate(parts))
    return s


def _box_scene() -> Scene:
    """A box (12 triangles, faces in coplanar pairs) in front of a wall (2 triangles)."""
    return _scene([box_mesh([5.0, -1.5, -1.5], [7.5, 2.0, 1.0]),
                   quad_mesh([15.0, 0.0, 0.0], [0, 0, 12.0], [0, 15.0, 0])])


def _pinhole(w, h, f):
    return OpenCVPinholeLens(w, h, w / 2, h / 2, f, f)


def _ftheta() -> FThetaLens:
    bw = (0.0, 8.0e-3, 0.0, 1.0e-7)
    r = np.linspace(0, 130, 500)
    th = np.polynomial.polynomial.polyval(r, bw)
    fw = (0.0, *np.linalg.lstsq(np.stack([th**k for k in range(1, 6)], 1), r, rcond=None)[0])
    return FThetaLens(192, 120, 95.3, 60.1, bw, fw, PolynomialType.PIXELDIST_TO_ANGLE, 0.0, (1.002, 0.003, -0.002))


# camera 3 m up, pitched down, turned left: sees the box's front, top and right faces and the wall; rolling shutter
# with motion and an 8° yaw between start and end (the slerp branch of the pose interpolation)
START = np.array([0.0, -3.0, 3.0, *_look(18.0, 20.0)])
END = np.array([0.6, -3.5, 3.1, *_look(26.0, 19.0)])
W, H = 40, 30


def _camera(device, shutter="ROLLING_TOP_TO_BOTTOM", w=W, h=H, f=30.0):
    return Camera(_pinhole(w, h, f), shutter=shutter, device=device)


#: The torch bridge keeps tensors on the camera's device: its tests run on the devices torch can use.
TORCH_DEVICES = [d for d in DEVICES if not wp.get_device(d).is_cuda or torch.cuda.is_available()]


def _poses(a, b, device):
    return wp.array(np.stack([a, b]).astype(np.float32), dtype=wp.transform, device=device, requires_grad=True)


def _render(cam, scene, poses_np, t1=0.05):
    return cam.render(scene, 0.0, t1, ("distance",), _poses(*poses_np, cam.device), requires_grad=True)


def _smooth_pixels(frame, plane_of_face) -> np.ndarray:
    """Hit pixels whose 3×3 neighbourhood sees the same plane (no silhouette, crease or miss nearby)."""
    face = frame.inputs["face"].numpy()
    plane = np.where(face >= 0, plane_of_face(face), -1)
    ok = plane >= 0
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            ok &= np.roll(np.roll(plane, di, 0), dj, 1) == plane
    ok[[0, -1], :] = False
    ok[:, [0, -1]] = False
    return ok


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-12)


def _weights(mask, seed=0):
    rng = np.random.default_rng(seed)
    return (mask * rng.uniform(0.5, 1.5, mask.shape)).astype(np.float32)


def _box_plane(face):
    return np.where(face < 12, face // 2, 6)  # box sides in coplanar pairs, then the wall


# ---------------------------------------------------------------------------------------------------------------------
# Warp tape: DISTANCE


def test_distance_tape_matches_finite_differences_wrt_poses(device):
    scene = _box_scene()
    cam = _camera(device)
    fr = _render(cam, scene, (START, END))
    mask = _smooth_pixels(fr, _box_plane)
    face = fr.inputs["face"].numpy()
    assert mask.sum() > 300 and len(np.unique(_box_plane(face[mask]))) >= 3  # front, top, side, wall
    wgt = _weights(mask)
    fr.tape.backward(grads={fr.distance: wp.array(wgt, dtype=float, device=device)})
    g = fr.inputs["poses"].grad.numpy().astype(np.float64)  # (2, 7): start, end; raw quaternion components
    assert np.all(np.isfinite(g))

    def loss(p):
        return float((cam.render(scene, 0.0, 0.05, ("distance",), _poses(p[0], p[1], device),
                                 requires_grad=True).distance.numpy() * wgt).sum())

    base = np.stack([START, END])
    fd = np.zeros_like(g)
    for k in range(2):
        for j in range(7):
            h = 2e-3 if j < 3 else 5e-4
            a, b = base.copy(), base.copy()
            a[k, j] += h
            b[k, j] -= h
            fd[k, j] = (loss(a) - loss(b)) / (2 * h)
    for k in range(2):
        assert _rel_err(g[k, :3], fd[k, :3]) < 1e-2, (k, g[k, :3], fd[k, :3])  # translation
        assert _rel_err(g[k, 3:], fd[k, 3:]) < 1e-2, (k, g[k, 3:], fd[k, 3:])  # rotation
    # both poses matter under rolling shutter
    assert np.abs(g[0]).max() > 1.0 and np.abs(g[1]).max() > 1.0
    fr.tape.zero()


@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_distance_tape_matches_finite_differences_wrt_vertices(device):
    scene = _box_scene()
    cam = _camera(device)
    fr = _render(cam, scene, (START, END))
    # the same triangle in the whole neighbourhood: moving one vertex breaks a side's coplanarity
    mask = _smooth_pixels(fr, lambda f: f)
    wgt = _weights(mask, 1)
    pts_arr = fr.inputs["static_points"]
    pts_arr.grad.zero_()
    fr.tape.backward(grads={fr.distance: wp.array(wgt, dtype=float, device=device)})
    g = pts_arr.grad.numpy().astype(np.float64).copy()
    pts_arr.grad.zero_()
    fr.tape.zero()
    assert np.all(np.isfinite(g))
    st, en = (torch.tensor(p) for p in (START, END))
    nv = len(scene.static.points)
    wt = torch.tensor(wgt, dtype=torch.float64)

    def loss(off):
        d = camera_distance(cam, scene, 0.0, 0.05, st, en, torch.tensor(off))
        return float((d.double().cpu() * wt).sum())

    fd = np.zeros((nv, 3))
    h = 2e-3
    for v in range(nv):
        for c in range(3):
            a = np.zeros((nv, 3))
            a[v, c] = h
            fd[v, c] = (loss(a) - loss(-a)) / (2 * h)
    moved = np.abs(fd).max(1) > 1e-3  # vertices of faces that are seen
    assert moved.sum() >= 8
    assert _rel_err(g, fd) < 1e-2, (g[moved], fd[moved])
    # the device mesh is back to the scene's vertices after the offset renders
    np.testing.assert_array_equal(pts_arr.numpy(), scene.static.points)


def test_distance_tape_frame_time_through_moving_instance(device):
    """A box moving toward the camera: d DISTANCE / d t1 = τ · (d distance / d time) for pixels on its front face."""
    scene = _scene([quad_mesh([30.0, 0.0, 0.0], [0, 0, 20.0], [0, 30.0, 0])])
    bp, bf = box_mesh([-0.5, -4.0, -3.0], [0.5, 4.0, 3.0])
    scene.parts.append(Part("car", material=1, semantic_class=0, object_id=9))
    scene.prototypes.append(MeshData(bp, bf, len(scene.parts) - 1, name="car"))
    q = [0.0, 0.0, 0.0, 1.0]
    scene.instances.append(Instance(0, [0.0, 1.0], [[10.0, 0, 0], [5.0, 0, 0]], [q, q], object_id=9))
    cam = _camera(device, w=24, h=18, f=16.0)
    pose = np.array([0.0, 0.0, 0.0, *Q_FWD])
    t1 = 0.1
    fr = _render(cam, scene, (pose, pose), t1)
    inst = fr.inputs["instance"].numpy()
    mask = _smooth_pixels(fr, lambda f: np.where(inst >= 0, f // 2, 100))
    mask &= inst >= 0
    assert mask.sum() > 20
    wgt = _weights(mask, 2)
    fr.tape.backward(grads={fr.distance: wp.array(wgt, dtype=float, device=device)})
    g = fr.inputs["frame_times"].grad.numpy().astype(np.float64)
    fr.tape.zero()

    def loss(a, b):
        return float((cam.render(scene, a, b, ("distance",), _poses(pose, pose, device),
                                 requires_grad=True).distance.numpy() * wgt).sum())

    h = 1e-3
    fd = [(loss(h, t1) - loss(-h, t1)) / (2 * h), (loss(0.0, t1 + h) - loss(0.0, t1 - h)) / (2 * h)]
    assert abs(fd[1]) > 1.0
    assert _rel_err(g, fd) < 1e-2, (g, fd)


# ---------------------------------------------------------------------------------------------------------------------
# torch: DISTANCE


@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_camera_distance_se3_gradients_match_finite_differences(device):
    """Torch gradients w.r.t. se(3) tangent steps of the start and end poses (translation and rotation)."""
    scene = _box_scene()
    cam = _camera(device)
    fr = _render(cam, scene, (START, END))
    mask = _smooth_pixels(fr, _box_plane)
    wt = torch.tensor(_weights(mask, 3), dtype=torch.float64)
    base0, base1 = torch.tensor(START), torch.tensor(END)

    def loss(xi):
        d = camera_distance(cam, scene, 0.0, 0.05, se3_exp(xi[:6], base0), se3_exp(xi[6:], base1))
        return (d.double().cpu() * wt).sum()

    xi = torch.zeros(12, dtype=torch.float64, requires_grad=True)
    loss(xi).backward()
    g = xi.grad.numpy()
    fd = np.zeros(12)
    for k in range(12):
        h = 2e-3 if k % 6 < 3 else 5e-4
        e = torch.zeros(12, dtype=torch.float64)
        e[k] = h
        fd[k] = (float(loss(e)) - float(loss(-e))) / (2 * h)
    for sl in (slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 12)):
        assert _rel_err(g[sl], fd[sl]) < 1e-2, (sl, g[sl], fd[sl])


@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_camera_distance_gradcheck(device):
    """8×6 image of a tilted plane (one triangle, no silhouette): float64 gradcheck w.r.t. poses and vertex offsets."""
    tri = (np.array([[9.0, -30.0, -20.0], [12.0, 30.0, -20.0], [10.0, 0.0, 30.0]]), np.array([[0, 1, 2]]))
    scene = _scene([tri])
    cam = _camera(device, w=8, h=6, f=6.0)
    p0 = torch.tensor(START, requires_grad=True)
    p1 = torch.tensor(END, requires_grad=True)
    off = torch.zeros((3, 3), dtype=torch.float64, requires_grad=True)
    assert bool((camera_distance(cam, scene, 0.0, 0.05, p0, p1) > 0).all())

    def f(a, b, o):
        return camera_distance(cam, scene, 0.0, 0.05, a, b, o)

    assert torch.autograd.gradcheck(f, (p0, p1, off), eps=1e-3, atol=2e-2, rtol=1e-2, nondet_tol=1e-5)
    # one pose (static camera), global shutter
    cam_g = _camera(device, shutter="GLOBAL", w=8, h=6, f=6.0)
    assert torch.autograd.gradcheck(lambda a: camera_distance(cam_g, scene, 0.0, 0.0, a), (p0,), eps=1e-3, atol=2e-2,
                                    rtol=1e-2)


@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_gradients_finite_at_misses_and_silhouettes(device):
    """Every pixel seeded (misses, silhouettes, outside the f-theta field of view): finite gradients, zero at misses."""
    scene = _scene([box_mesh([6.0, -1.5, -1.0], [8.0, 1.5, 0.5])])  # no wall: many misses
    lens = _ftheta()
    cam = Camera(lens, width=48, height=30, shutter="ROLLING_LEFT_TO_RIGHT", device=device)
    p0 = torch.tensor(START, requires_grad=True)
    p1 = torch.tensor(END, requires_grad=True)
    off = torch.zeros((8, 3), dtype=torch.float64, requires_grad=True)
    d = camera_distance(cam, scene, 0.0, 0.05, p0, p1, off)
    miss = d == 0
    assert 50 < int(miss.sum()) < d.numel() - 50
    d.sum().backward(retain_graph=True)
    for t in (p0.grad, p1.grad, off.grad):
        assert torch.isfinite(t).all()
    assert p0.grad.abs().max() > 0 and off.grad.abs().max() > 0
    # misses alone: zero gradient (and the graph can be run again)
    g0 = p0.grad.clone()
    p0.grad = None
    (d * miss).sum().backward(retain_graph=True)
    assert float(p0.grad.abs().max()) == 0.0
    p0.grad = None
    d.sum().backward()
    torch.testing.assert_close(p0.grad, g0)
    # the tangent map at zero and pose interpolation of equal poses stay finite
    xi = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    pose_interpolate(se3_exp(xi, p0.detach()), p0.detach(), 0.3).sum().backward()
    assert torch.isfinite(xi.grad).all()


@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_vertex_offsets_validation_and_restore(device):
    scene = _box_scene()
    cam = _camera(device, w=16, h=12, f=12.0)
    st = torch.tensor(START)
    with pytest.raises(ValueError, match="vertex_offsets"):
        camera_distance(cam, scene, 0.0, 0.05, st, None, torch.zeros((3, 3)))
    with pytest.raises(ValueError, match="start_pose"):
        camera_distance(cam, scene, 0.0, 0.05, torch.zeros(6))
    off = torch.zeros((12, 3), dtype=torch.float64)
    off[:8, 0] = -1.0  # the box 1 m closer
    d_off = camera_distance(cam, scene, 0.0, 0.05, st, None, off)
    d = camera_distance(cam, scene, 0.0, 0.05, st)
    assert float((d - d_off).max()) > 0.9
    geo = scene.device_geometry(cam.device)
    np.testing.assert_array_equal(geo.static_mesh.points.numpy(), scene.static.points)


# ---------------------------------------------------------------------------------------------------------------------
# torch: projection


def _points_at_pixel_centres(cam, p0, p1, pix, depth):
    """World points imaged exactly at pixel centres under rolling shutter (so τ is far from a row boundary)."""
    rays = cam.unproject(pix)[0].numpy().astype(np.float64)
    tau = cam.relative_times(pix).numpy().astype(np.float64)
    out = []
    for r, t, z in zip(rays, tau, depth):
        pose = pose_interpolate(torch.tensor(p0), torch.tensor(p1), float(t)).numpy()
        out.append(pose[:3] + quat_to_matrix(pose[3:]) @ (r / r[2] * z))
    return np.array(out)


@pytest.mark.parametrize("lens", ["pinhole", "ftheta"])
@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_project_points_match_finite_differences(device, lens):
    cam = (Camera(_ftheta(), width=96, height=60, shutter="ROLLING_TOP_TO_BOTTOM", device=device) if lens == "ftheta"
           else _camera(device))
    pix = np.array([[5.5, 4.5], [20.5, 12.5], [33.5, 25.5], [11.5, 20.5], [28.5, 7.5]])
    if lens == "ftheta":
        pix = pix * 2.0 + 0.5
    pts_np = _points_at_pixel_centres(cam, START, END, pix, [6.0, 9.0, 12.0, 7.5, 15.0])
    pts = torch.tensor(pts_np, requires_grad=True)
    p0 = torch.tensor(START, requires_grad=True)
    p1 = torch.tensor(END, requires_grad=True)
    px, dep, valid = project_points(cam, pts, 0.0, 0.05, p0, p1)
    assert bool(valid.all())
    np.testing.assert_allclose(px.detach().cpu().numpy(), pix, atol=2e-3)
    rng = np.random.default_rng(4)
    wp_, wd = torch.tensor(rng.normal(size=(5, 2))), torch.tensor(rng.normal(size=5))

    def loss(a, b, c):
        u, z, _ = project_points(cam, a, 0.0, 0.05, b, c)
        return (u.double().cpu() * wp_).sum() + (z.double().cpu() * wd).sum()

    loss(pts, p0, p1).backward()
    for x, g in ((pts, pts.grad), (p0, p0.grad), (p1, p1.grad)):
        flat = x.detach().reshape(-1)
        fd = np.zeros(flat.numel())
        for k in range(flat.numel()):
            h = 1e-3 if x is pts or k % 7 < 3 else 2e-4
            a, b = flat.clone(), flat.clone()
            a[k] += h
            b[k] -= h
            args_a = [a.reshape(x.shape) if y is x else y.detach() for y in (pts, p0, p1)]
            args_b = [b.reshape(x.shape) if y is x else y.detach() for y in (pts, p0, p1)]
            fd[k] = (float(loss(*args_a)) - float(loss(*args_b))) / (2 * h)
        gn = g.reshape(-1).numpy()
        if x is pts:
            assert _rel_err(gn, fd) < 1e-2, (gn, fd)
        else:
            assert _rel_err(gn[:3], fd[:3]) < 1e-2, (gn[:3], fd[:3])  # translation
            assert _rel_err(gn[3:], fd[3:]) < 1e-2, (gn[3:], fd[3:])  # rotation


@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_project_points_gradcheck(device):
    cam = _camera(device, w=32, h=24, f=24.0)
    pix = np.array([[4.5, 3.5], [16.5, 12.5], [27.5, 20.5], [9.5, 18.5], [22.5, 6.5]])
    pts = torch.tensor(_points_at_pixel_centres(cam, START, END, pix, [6.0, 9.0, 12.0, 7.5, 15.0]),
                       requires_grad=True)
    p0 = torch.tensor(START, requires_grad=True)
    p1 = torch.tensor(END, requires_grad=True)

    def f(a, b, c):
        u, z, _ = project_points(cam, a, 0.0, 0.05, b, c)
        return u, z

    assert torch.autograd.gradcheck(f, (pts, p0, p1), eps=1e-3, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_project_points_invalid_points_have_zero_finite_gradients(device):
    cam = _camera(device, w=32, h=24, f=24.0)
    p0 = torch.tensor(START, requires_grad=True)
    behind, off_image, centre = START[:3] - [5.0, 0, 0], START[:3] + [2.0, 40.0, 0.0], START[:3]
    ok = _points_at_pixel_centres(cam, START, START, np.array([[16.5, 12.5]]), [8.0])[0]
    pts = torch.tensor(np.array([behind, off_image, centre, ok]), requires_grad=True)
    px, dep, valid = project_points(cam, pts, 0.0, 0.0, p0)
    assert valid.tolist() == [False, False, False, True]
    (px.sum() + dep.sum()).backward()
    assert torch.isfinite(pts.grad).all() and torch.isfinite(p0.grad).all()
    assert float(pts.grad[:3].abs().max()) == 0.0 and float(pts.grad[3].abs().max()) > 0.0


@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_readout_time_gradient(device):
    """Readout time as a parameter: start/end poses from a moving rig (:func:`rig_frame_poses`), gradients of the
    projected pixels and times w.r.t. the readout time and the mount match finite differences."""
    cam = _camera(device, w=32, h=24, f=24.0)
    rig = Trajectory(np.array([0.0, 1.0]), np.array([[0.0, 0.0, 0.0], [10.0, 3.0, 0.2]]),
                     np.array([quat_from_axis_angle([0, 0, 1], 0.0), quat_from_axis_angle([0, 0, 1], 0.3)]))
    mount = torch.tensor([1.5, 0.2, 1.4, *_look(-6.0, 8.0)], requires_grad=True)
    readout = torch.tensor(0.04, dtype=torch.float64, requires_grad=True)
    t0 = 0.2
    s, e, t1 = rig_frame_poses(rig, t0, readout, mount)
    pix = np.array([[4.5, 3.5], [16.5, 12.5], [27.5, 20.5], [9.5, 18.5]])
    pts = _points_at_pixel_centres(cam, s.detach().numpy(), e.detach().numpy(), pix, [6.0, 9.0, 12.0, 7.5])
    pts_t = torch.tensor(pts)
    wgt = torch.tensor(np.random.default_rng(5).normal(size=(4, 2)))

    def loss(r, m):
        a, b, tt = rig_frame_poses(rig, t0, r, m)
        u, _, valid, times = project_points(cam, pts_t, t0, tt, a, b, return_times=True)
        assert bool(valid.all())
        return (u.double().cpu() * wgt).sum() + 10.0 * times.sum()

    loss(readout, mount).backward()
    h = 1e-4
    r, m = readout.detach(), mount.detach()
    fd_r = (float(loss(r + h, m)) - float(loss(r - h, m))) / (2 * h)
    assert abs(fd_r) > 1.0
    assert _rel_err(readout.grad.numpy(), fd_r) < 1e-2, (readout.grad, fd_r)
    fd_m = []
    for k in range(3):
        e_k = torch.zeros(7, dtype=torch.float64)
        e_k[k] = 1e-3
        fd_m.append((float(loss(readout.detach(), mount.detach() + e_k))
                     - float(loss(readout.detach(), mount.detach() - e_k))) / 2e-3)
    assert _rel_err(mount.grad[:3].numpy(), fd_m) < 1e-2, (mount.grad[:3], fd_m)
    # helpers agree with the host trajectory
    np.testing.assert_allclose(trajectory_pose(rig, 0.5).numpy()[:3], rig.pose_at(0.5)[0], atol=1e-12)
    np.testing.assert_allclose(pose_compose(torch.tensor(START), se3_exp(torch.zeros(6, dtype=torch.float64))).numpy(),
                               START, atol=1e-12)
