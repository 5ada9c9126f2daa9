"""Lidar gradients: the tape's gradients equal central finite differences of re-rendered sweeps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import add_static, empty_scene, uv_sphere

from wsim.scene import Trajectory
from wsim.scene.transforms import quat_from_axis_angle
from wsim.sensors.lidar import Lidar
from wsim.sensors.lidar_config import CoordsType, EmitterState, IntensityProcessing, LidarConfig, ScanType
from wsim.torch import LidarInputs, lidar_render

AZ = np.array([-20.0, -5.0, 10.0, 25.0])
EL = np.array([-8.0, 4.0, -2.0, 9.0])


def tilted_plane_scene(rho=0.6):
    """A plane through (12, 0, 0) tilted so that every ray meets it at a different angle, plus a second material."""
    s = empty_scene()
    n = np.array([-1.0, 0.25, 0.15])
    n /= np.linalg.norm(n)
    u = np.cross(n, [0, 0, 1.0])
    u /= np.linalg.norm(u)
    v = np.cross(n, u)
    c = np.array([12.0, 0.0, 0.0])
    p = np.array([c - 20 * u - 20 * v, c + 20 * u - 20 * v, c + 20 * u + 20 * v, c - 20 * u + 20 * v])
    f = np.array([[0, 1, 2], [0, 2, 3]])
    if np.dot(np.cross(p[1] - p[0], p[2] - p[0]), n) < 0:
        f = f[:, ::-1]
    add_static(s, p, f, name="target", reflectance=rho)
    return s


def config(**kw) -> LidarConfig:
    n = len(AZ)
    st = EmitterState(AZ.astype(np.float32), EL.astype(np.float32), np.zeros(n, np.int64),
                      np.arange(1, n + 1, dtype=np.uint32), np.zeros(n, np.float32), np.zeros(n, np.float32),
                      np.zeros(n, np.float32))
    kw.setdefault("elements_coords_type", CoordsType.CARTESIAN)
    cfg = LidarConfig(scan_type=ScanType.SOLID_STATE, scan_rate_base_hz=10.0, pattern_firing_rate_hz=10.0,
                      number_of_emitters=n, number_of_channels=n, emitter_states=[st], partial_outputs=True, **kw)
    cfg.validate()
    return cfg


POS = np.array([0.3, -0.2, 0.5])
QUAT = quat_from_axis_angle([0.2, 0.3, 1.0], 0.15)
W_C = np.random.default_rng(0).normal(size=(3, len(AZ)))
W_I = np.random.default_rng(1).normal(size=len(AZ))


def loss_of(pc) -> float:
    return float(np.sum(W_C * pc["Coordinates"].numpy()) + np.sum(W_I * pc["Intensity"].numpy()))


def render(scene, cfg, pos=POS, quat=QUAT, gain=None, device="cpu"):
    lid = Lidar(config=cfg, scene=scene, trajectory=Trajectory([0.0], [pos], [quat]), device=device)
    if gain is not None:
        lid.set_gain(gain)
    return lid, lid.render(0.0, 0.1, requires_grad=True)


def tape_grads(scene, cfg, device="cpu"):
    lid, pc = render(scene, cfg, device=device)
    assert pc.count == len(AZ)
    pc.tape.backward(grads={pc["Coordinates"]: wp_arr(W_C, pc["Coordinates"].device),
                            pc["Intensity"]: wp_arr(W_I, pc["Intensity"].device)})
    return pc.inputs


def wp_arr(a, device):
    import warp as wp

    return wp.array(np.asarray(a, np.float32), dtype=float, device=device)


def fd(fun, x0, eps):
    g = np.zeros_like(x0, dtype=np.float64)
    for i in np.ndindex(x0.shape):
        xp, xm = x0.copy(), x0.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (fun(xp) - fun(xm)) / (2 * eps)
    return g


def assert_close(g, ref, rel=1e-2):
    g, ref = np.asarray(g, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(g))
    err = np.linalg.norm(g - ref) / max(np.linalg.norm(ref), 1e-9)
    assert err < rel, (g, ref, err)


@pytest.mark.parametrize("coords", [CoordsType.CARTESIAN, CoordsType.SPHERICAL])
def test_pose_gradients_match_finite_differences(device, coords):
    scene = tilted_plane_scene()
    cfg = config(elements_coords_type=coords, output_frame_of_reference=__import__(
        "wsim").sensors.lidar_config.FrameOfReference.WORLD)
    inputs = tape_grads(scene, cfg, device)
    g = inputs["poses"].grad.numpy().reshape(7)
    g_t = fd(lambda x: loss_of(render(scene, cfg, pos=x)[1]), POS.copy(), 1e-3)
    assert_close(g[:3], g_t)
    g_q = fd(lambda x: loss_of(render(scene, cfg, quat=x)[1]), QUAT.copy(), 1e-3)
    assert_close(g[3:], g_q)


def test_smooth_normal_gradients_match_finite_differences(device):
    """Smooth normals (a sphere whose faces share vertices): pose, reflectance and gain gradients of coordinates and
    NORMALIZATION intensity still equal finite differences (the vertex normals are constants of the scene), and the
    differentiable pass reproduces the plain render's intensities."""
    scene = empty_scene()
    p, f = uv_sphere([18.0, 0.0, 0.0], 11.0, 32, 16)
    add_static(scene, p, f, name="ball", reflectance=0.4)
    cfg = config(smooth_normals=True, intensity_processing=IntensityProcessing.NORMALIZATION)
    inputs = tape_grads(scene, cfg, device)
    lid, pc = render(scene, cfg, device=device)
    plain = Lidar(config=cfg, scene=scene, trajectory=Trajectory([0.0], [POS], [QUAT]), device=device).render(0.0, 0.1)
    flat = config(intensity_processing=IntensityProcessing.NORMALIZATION)
    flat_pc = Lidar(config=flat, scene=scene, trajectory=Trajectory([0.0], [POS], [QUAT]), device=device).render(0.0, 0.1)
    np.testing.assert_allclose(pc["Intensity"].numpy(), plain["Intensity"].numpy(), rtol=1e-5)
    assert np.abs(plain["Intensity"].numpy() - flat_pc["Intensity"].numpy()).max() > 1e-3  # smooth ≠ flat here
    g = inputs["poses"].grad.numpy().reshape(7)
    assert_close(g[:3], fd(lambda x: loss_of(render(scene, cfg, pos=x)[1]), POS.copy(), 1e-3))
    # (a step of 1e-3 in the quaternion moves some hits across a facet's edge, where the normal has a kink)
    assert_close(g[3:], fd(lambda x: loss_of(render(scene, cfg, quat=x)[1]), QUAT.copy(), 1e-4))
    assert_close(inputs["gain"].grad.numpy(), fd(lambda x: loss_of(render(scene, cfg, gain=x)[1]), np.ones(len(AZ)),
                                                 1e-3))


def test_emitter_angle_gradients(device):
    scene = tilted_plane_scene()
    cfg = config()
    inputs = tape_grads(scene, cfg, device)

    def with_angles(az, el):
        c = config()
        c.emitter_states[0].azimuth_deg[:] = az
        c.emitter_states[0].elevation_deg[:] = el
        return loss_of(render(scene, c)[1])

    g_az = fd(lambda x: with_angles(x, EL), AZ.astype(np.float64), 1e-2) * 180 / np.pi  # per radian
    g_el = fd(lambda x: with_angles(AZ, x), EL.astype(np.float64), 1e-2) * 180 / np.pi
    assert_close(inputs["azimuth"].grad.numpy(), g_az)
    assert_close(inputs["elevation"].grad.numpy(), g_el)


@pytest.mark.parametrize("mode", [IntensityProcessing.RAW, IntensityProcessing.NORMALIZATION,
                                  IntensityProcessing.CORRECTION])
def test_reflectance_gain_and_vertex_gradients(device, mode):
    scene = tilted_plane_scene(rho=0.3)
    cfg = config(intensity_processing=mode)
    inputs = tape_grads(scene, cfg, device)
    # reflectance (material 1 is the target) and gain: intensity is linear in both
    g_r = fd(lambda x: loss_of(render(tilted_plane_scene(rho=float(x[0])), cfg)[1]), np.array([0.3]), 1e-3)
    assert_close(inputs["reflectance"].grad.numpy()[1:2], g_r)
    g_g = fd(lambda x: loss_of(render(scene, cfg, gain=x)[1]), np.ones(len(AZ)), 1e-3)
    assert_close(inputs["gain"].grad.numpy(), g_g)
    # mesh vertices: move each vertex of the plane
    base = scene.static.points.copy()

    def with_points(x):
        s = tilted_plane_scene(rho=0.3)
        s.static.points[:] = x.reshape(-1, 3)
        return loss_of(render(s, cfg)[1])

    g_v = fd(with_points, base.astype(np.float64).reshape(-1), 1e-2).reshape(-1, 3)
    assert_close(inputs["static_points"].grad.numpy(), g_v, rel=2e-2)


def test_start_end_pose_gradients_through_interpolation():
    scene = tilted_plane_scene()
    # a rotary sweep whose firings interpolate between a start and an end pose
    from wsim.sensors.lidar_config import FrameOfReference

    n = 3
    st = EmitterState(np.zeros(n, np.float32), np.array([-3.0, 0.0, 3.0], np.float32), np.zeros(n, np.int64),
                      np.arange(1, n + 1, dtype=np.uint32), np.zeros(n, np.float32), np.zeros(n, np.float32),
                      np.zeros(n, np.float32))
    cfg = LidarConfig(scan_type=ScanType.ROTARY, scan_rate_base_hz=10.0, pattern_firing_rate_hz=360.0,
                      number_of_emitters=n, number_of_channels=n, emitter_states=[st],
                      valid_start_azimuth_deg=330.0, valid_end_azimuth_deg=30.0,
                      elements_coords_type=CoordsType.CARTESIAN, output_frame_of_reference=FrameOfReference.WORLD)
    keys = np.array([[0.0, 0.0, 0.5], [0.8, 0.4, 0.5]])

    def run(k):
        lid = Lidar(config=cfg, scene=scene, trajectory=Trajectory([0.0, 0.1], k, [QUAT, QUAT]))
        return lid.render(0.0, 0.1, requires_grad=True)

    pc = run(keys)
    assert pc.count > 10
    w = np.random.default_rng(3).normal(size=(3, pc.count))
    pc.tape.backward(grads={pc["Coordinates"]: wp_arr(w, "cpu"),
                            pc["Intensity"]: wp_arr(np.zeros(pc.count), "cpu")})
    g = pc.inputs["poses"].grad.numpy().reshape(2, 7)[:, :3]
    ref = fd(lambda x: float(np.sum(w * run(x.reshape(2, 3))["Coordinates"].numpy())), keys.copy().reshape(-1),
             1e-3).reshape(2, 3)
    assert_close(g, ref)
    assert np.abs(g[0]).sum() > 0 and np.abs(g[1]).sum() > 0  # both ends matter


def test_torch_bridge_backward_and_gradcheck():
    scene = tilted_plane_scene(rho=0.4)
    lid = Lidar(config=config(), scene=scene, trajectory=Trajectory([0.0], [POS], [QUAT]))
    tr = torch.tensor(POS[None], dtype=torch.float64, requires_grad=True)
    refl = torch.tensor([0.2, 0.4], dtype=torch.float64, requires_grad=True)
    gain = torch.ones(len(AZ), dtype=torch.float64, requires_grad=True)
    coords, inten = lidar_render(lid, 0.0, 0.1, LidarInputs(pose_times=[0.0], translations=tr, reflectance=refl,
                                                            gain=gain))
    assert coords.shape == (3, 4) and inten.shape == (4,) and coords.dtype == torch.float32
    # zero-copy output
    (coords.double().sum() + inten.double().sum()).backward()
    assert tr.grad is not None and refl.grad is not None and gain.grad is not None
    # intensity is linear in the target's reflectance: d(sum I)/dρ = sum I / ρ
    np.testing.assert_allclose(refl.grad[1].item(), inten.sum().item() / 0.4, rtol=1e-4)
    assert refl.grad[0].item() == 0.0
    # moving the sensor along the world x axis (rotated only slightly) shifts WORLD... here SENSOR coords: finite

    def f(t, r):
        c, i = lidar_render(lid, 0.0, 0.1, LidarInputs(pose_times=[0.0], translations=t, reflectance=r))
        return c.double(), i.double()

    assert torch.autograd.gradcheck(f, (tr, refl), eps=1e-3, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("coords", [CoordsType.CARTESIAN, CoordsType.SPHERICAL])
def test_quantised_range_straight_through_gradient(device, coords):
    """Range quantisation (range_resolution_m > 0) has a straight-through gradient: d round(r)/dr := 1.

    Finite differences of a quantised output are steppy (zero, or a jump of one resolution step divided by the
    FD step), so the reference is the central FD of the *unquantised* render: with the straight-through meaning the
    quantised output's gradient is the gradient of the unquantised range, up to the direction's derivative times the
    rounding error (|q(r) − r| / r ≤ 0.5 cm / 12 m ≈ 4e-4 relative here)."""
    from wsim.sensors.lidar_config import FrameOfReference

    scene = tilted_plane_scene()
    frame = FrameOfReference.WORLD if coords is CoordsType.CARTESIAN else FrameOfReference.SENSOR
    kw = dict(elements_coords_type=coords, output_frame_of_reference=frame)
    cfg_q = config(range_resolution_m=0.01, **kw)
    cfg_c = config(**kw)
    lid, pc = render(scene, cfg_q, device=device)
    assert pc.count == len(AZ)
    if coords is CoordsType.SPHERICAL:  # the delivered (sensor-frame) range is a multiple of the resolution
        rng = pc["Coordinates"].numpy()[2]
        np.testing.assert_allclose(rng / 0.01, np.round(rng / 0.01), atol=2e-3)
    pc.tape.backward(grads={pc["Coordinates"]: wp_arr(W_C, pc["Coordinates"].device),
                            pc["Intensity"]: wp_arr(W_I, pc["Intensity"].device)})
    g = pc.inputs["poses"].grad.numpy().reshape(7)
    assert np.abs(g[:3]).sum() > 0.1  # not silently zeroed
    g_t = fd(lambda x: loss_of(render(scene, cfg_c, pos=x)[1]), POS.copy(), 1e-3)
    assert_close(g[:3], g_t)
    g_q = fd(lambda x: loss_of(render(scene, cfg_c, quat=x)[1]), QUAT.copy(), 1e-3)
    assert_close(g[3:], g_q)


# ----------------------------------------------------------------------------------------------- torch bridge
BRIDGE_INPUTS = ("translations", "rotations", "azimuth_deg", "elevation_deg", "gain", "reflectance", "vertex_offsets")


def _bridge_setup():
    scene = tilted_plane_scene(rho=0.4)
    lid = Lidar(config=config(intensity_processing=IntensityProcessing.NORMALIZATION), scene=scene,
                trajectory=Trajectory([0.0], [POS], [QUAT]))
    x0 = {
        "translations": torch.tensor(POS[None], dtype=torch.float64),
        "rotations": torch.tensor(QUAT[None], dtype=torch.float64),
        "azimuth_deg": torch.tensor(AZ, dtype=torch.float64),
        "elevation_deg": torch.tensor(EL, dtype=torch.float64),
        "gain": torch.full((len(AZ),), 0.8, dtype=torch.float64),
        "reflectance": torch.tensor([0.2, 0.4], dtype=torch.float64),
        "vertex_offsets": torch.zeros((len(scene.static.points), 3), dtype=torch.float64),
    }
    return scene, lid, x0


def _bridge_loss(lid, x: dict) -> torch.Tensor:
    coords, inten = lidar_render(lid, 0.0, 0.1, LidarInputs(pose_times=[0.0], **x))
    assert coords.shape == (3, len(AZ))
    return (torch.as_tensor(W_C) * coords.double()).sum() + (torch.as_tensor(W_I) * inten.double()).sum()


EPS = {"translations": 1e-3, "rotations": 1e-3, "azimuth_deg": 1e-2, "elevation_deg": 1e-2, "gain": 1e-3,
       "reflectance": 1e-3, "vertex_offsets": 1e-2}


@pytest.mark.parametrize("name", BRIDGE_INPUTS)
def test_torch_bridge_every_input_matches_finite_differences(name):
    """Each LidarInputs field alone: the bridge's gradient equals central FD of the bridge's own renders (which
    also checks that the perturbed renders leave nothing behind)."""
    _, lid, x0 = _bridge_setup()
    x = {name: x0[name].clone().requires_grad_(True)}
    _bridge_loss(lid, x).backward()
    g = x[name].grad.numpy()
    base = x0[name].numpy()
    ref = fd(lambda v: float(_bridge_loss(lid, {name: torch.as_tensor(v)})), base.copy(), EPS[name])
    assert_close(g, ref, rel=2e-2 if name == "vertex_offsets" else 1e-2)
    assert np.abs(ref).sum() > 0


def _plain(lid):
    pc = lid.render(0.0, 0.1)
    return {k: v.numpy().copy() for k, v in pc.channels.items()}


def _camera_distance_image(scene):
    from wsim.scene.transforms import matrix_to_quat
    from wsim.sensors.camera import Camera
    from wsim.sensors.lens import OpenCVPinholeLens

    q = matrix_to_quat(np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]]))  # looking along +x
    cam = Camera(OpenCVPinholeLens(40, 30, 20.0, 15.0, 30.0, 30.0))
    f = cam.render(scene, 0.0, 0.03, ("distance",), ((0.0, 0.0, 0.5), q))
    return f.distance.numpy().copy()


def test_torch_bridge_is_stateless_and_interleaves():
    """Two differentiable renders with different inputs, backward of the first after the second render: the
    gradients equal those of the same renders run one after the other, and plain lidar renders and camera DISTANCE
    images of the scene afterwards are bit-identical to those before."""
    scene, lid, x0 = _bridge_setup()
    before, dist_before = _plain(lid), _camera_distance_image(scene)
    assert (dist_before > 0).mean() > 0.5

    def inputs(k):
        rng = np.random.default_rng(10 + k)
        x = {n: (x0[n] + torch.as_tensor(rng.normal(scale=s, size=x0[n].shape))).requires_grad_(True)
             for n, s in (("translations", 0.05), ("azimuth_deg", 0.5), ("elevation_deg", 0.5), ("gain", 0.1),
                          ("reflectance", 0.05), ("vertex_offsets", 0.2))}
        x["rotations"] = x0["rotations"].clone().requires_grad_(True)
        return x

    def grads(x):
        return {n: v.grad.clone() for n, v in x.items()}

    # one after the other
    xa, xb = inputs(0), inputs(1)
    _bridge_loss(lid, xa).backward()
    _bridge_loss(lid, xb).backward()
    ref_a, ref_b = grads(xa), grads(xb)
    # interleaved: render a, render b, backward a, backward b (and b's backward before a's)
    for order in ((0, 1), (1, 0)):
        xs = [inputs(0), inputs(1)]
        losses = [_bridge_loss(lid, xs[0]), _bridge_loss(lid, xs[1])]
        for k in order:
            losses[k].backward()
        for got, ref in ((grads(xs[0]), ref_a), (grads(xs[1]), ref_b)):
            for n in ref:
                torch.testing.assert_close(got[n], ref[n], rtol=1e-6, atol=1e-9, msg=n)
    assert not torch.allclose(ref_a["elevation_deg"], ref_b["elevation_deg"])  # the two renders do differ
    after = _plain(lid)
    assert before.keys() == after.keys()
    for k in before:
        assert before[k].tobytes() == after[k].tobytes(), k
    assert _camera_distance_image(scene).tobytes() == dist_before.tobytes()


# ------------------------------------------------------------------------------------------------ beam echoes
def pane_and_plane_scene():
    """The tilted plane behind a tilted, partly transmissive pane: every sub-ray of every beam meets the pane and
    then the plane, far from any edge (two echoes per firing, no contribution appearing or vanishing under small
    perturbations)."""
    s = tilted_plane_scene(rho=0.6)
    n = np.array([-1.0, -0.3, 0.2])
    n /= np.linalg.norm(n)
    u = np.cross(n, [0, 0, 1.0])
    u /= np.linalg.norm(u)
    v = np.cross(n, u)
    c = np.array([6.0, 0.0, 0.5])
    p = np.array([c - 9 * u - 9 * v, c + 9 * u - 9 * v, c + 9 * u + 9 * v, c - 9 * u + 9 * v])
    add_static(s, p, np.array([[0, 1, 2], [0, 2, 3]]), name="pane", reflectance=0.3, transmittance=0.6)
    return s


@pytest.mark.parametrize("ray_type", ["GAUSSIAN_BEAM", "UNIFORM_BEAM"])
def test_beam_echo_gradients_through_every_contribution(device, ray_type):
    """GAUSSIAN/UNIFORM beams with 2 returns: each echo's range is the signal-weighted mean of its sub-rays' ranges
    and its signal their sum; the tape differentiates both through every contribution (not only the strongest), and
    matches central FD for poses, emitter angles, reflectance and gain on smooth returns."""
    from wsim.sensors.lidar_config import FrameOfReference, RayType

    scene = pane_and_plane_scene()
    cfg = config(ray_type=RayType[ray_type], max_returns=2, beam_samples=19, divergence_hor_deg=3.0,
                 divergence_ver_deg=2.0, intensity_processing=IntensityProcessing.NORMALIZATION,
                 output_frame_of_reference=FrameOfReference.WORLD)
    lid, pc = render(scene, cfg, device=device)
    assert pc.count == 2 * len(AZ)
    wc = np.random.default_rng(5).normal(size=(3, pc.count))
    wi = np.random.default_rng(6).normal(size=pc.count) * 10.0

    def loss(p):
        assert p.count == 2 * len(AZ)
        return float(np.sum(wc * p["Coordinates"].numpy()) + np.sum(wi * p["Intensity"].numpy()))

    pc.tape.backward(grads={pc["Coordinates"]: wp_arr(wc, device), pc["Intensity"]: wp_arr(wi, device)})
    g = pc.inputs["poses"].grad.numpy().reshape(7)
    assert_close(g[:3], fd(lambda x: loss(render(scene, cfg, pos=x, device=device)[1]), POS.copy(), 1e-3))
    assert_close(g[3:], fd(lambda x: loss(render(scene, cfg, quat=x, device=device)[1]), QUAT.copy(), 1e-3))

    def with_angles(az, el):
        c = config(ray_type=RayType[ray_type], max_returns=2, beam_samples=19, divergence_hor_deg=3.0,
                   divergence_ver_deg=2.0, intensity_processing=IntensityProcessing.NORMALIZATION,
                   output_frame_of_reference=FrameOfReference.WORLD)
        c.emitter_states[0].azimuth_deg[:] = az
        c.emitter_states[0].elevation_deg[:] = el
        return loss(render(scene, c, device=device)[1])

    g_el = fd(lambda x: with_angles(AZ, x), EL.astype(np.float64), 1e-2) * 180 / np.pi
    assert_close(pc.inputs["elevation"].grad.numpy(), g_el)
    g_az = fd(lambda x: with_angles(x, EL), AZ.astype(np.float64), 1e-2) * 180 / np.pi
    assert_close(pc.inputs["azimuth"].grad.numpy(), g_az)
    g_g = fd(lambda x: loss(render(scene, cfg, gain=x, device=device)[1]), np.ones(len(AZ)), 1e-3)
    assert_close(pc.inputs["gain"].grad.numpy(), g_g)

    def with_refl(x):
        s = pane_and_plane_scene()
        s.materials[1].reflectance, s.materials[2].reflectance = float(x[0]), float(x[1])
        return loss(render(s, cfg, device=device)[1])

    g_r = fd(with_refl, np.array([scene.materials[1].reflectance, scene.materials[2].reflectance]), 1e-3)
    assert_close(pc.inputs["reflectance"].grad.numpy()[1:3], g_r)


# ----------------------------------------------------------------------------------- AT128 and motion compensation
def _bridge_fd_check(loss, x0: dict, eps: dict, rng, *, n_pick: int = 4, rel: float = 1e-2) -> dict:
    """The torch bridge's gradient of ``loss`` (a function of a dict of float64 tensors) for every input of ``x0``
    against central FD of the same loss. Small inputs: every component. Large ones (AT128's 153 600-entry emitter
    tables): the directional derivative along a random direction (all components at once), plus ``n_pick``
    single components among those that matter. Returns the measured relative errors."""
    x = {k: v.clone().requires_grad_(True) for k, v in x0.items()}
    loss(x).backward()
    errs = {}
    for name, v0 in x0.items():
        g = x[name].grad.numpy()
        base = v0.numpy()

        def f(v, name=name):
            return float(loss({**x0, name: torch.as_tensor(v)}))

        if base.size <= 16:
            ref = fd(f, base.copy(), eps[name])
            assert np.abs(ref).sum() > 0, name
            assert_close(g, ref, rel)
            errs[name] = float(np.linalg.norm(g - ref) / np.linalg.norm(ref))
            continue
        nz = np.flatnonzero(g)
        assert 0 < nz.size < base.size, name  # the emitters that fired in the window, and only those
        d = rng.normal(size=base.shape)
        dd = (f(base + eps[name] * d) - f(base - eps[name] * d)) / (2 * eps[name])
        assert abs(dd) > 0, name
        assert_close(np.sum(g * d), dd, rel)
        errs[name + " (directional)"] = abs(float(np.sum(g * d)) - dd) / abs(dd)
        pick = rng.choice(nz, n_pick, replace=False)
        flat = base.reshape(-1)
        ref = np.array([(f(np.where(np.arange(flat.size) == i, flat + eps[name], flat).reshape(base.shape))
                         - f(np.where(np.arange(flat.size) == i, flat - eps[name], flat).reshape(base.shape)))
                        / (2 * eps[name]) for i in pick])
        assert np.all(ref != 0), name
        assert_close(g.reshape(-1)[pick], ref, rel)
        errs[name + f" ({n_pick} entries)"] = float(np.linalg.norm(g.reshape(-1)[pick] - ref) / np.linalg.norm(ref))
    return errs


AT128_WINDOW = (0.049, 0.051)  # 2 ms of the 100 ms mirror sweep: 24 columns × 128 channels around azimuth 0


@pytest.mark.parametrize("coords", [CoordsType.SPHERICAL, CoordsType.CARTESIAN])
def test_at128_preset_gradients_match_finite_differences(device, coords):
    """The AT128 preset (solid state, 1200 × 128 emitters, SENSOR frame) through the torch bridge, the sensor moving
    across the rendered 2 ms of the sweep: gradients w.r.t. both trajectory keys, the emitter azimuth/elevation
    tables, the gain, the reflectance and the plane's vertices equal central FD of the bridge's renders, and the
    bridge's outputs equal a plain render's."""
    scene = tilted_plane_scene(rho=0.4)
    t0, t1 = AT128_WINDOW
    q1 = quat_from_axis_angle([0.1, -0.2, 1.0], 0.16)
    traj = Trajectory([t0, t1], [POS, POS + [0.05, 0.02, -0.01]], [QUAT, q1])
    lid = Lidar.preset("AT128", scene=scene, trajectory=traj, partial_outputs=True, elements_coords_type=coords,
                       device=device)
    plain = lid.render(t0, t1)
    n = plain.count
    assert n == 24 * 128
    e = lid.config.number_of_emitters
    st = lid.config.emitter_states[0]
    x0 = {
        "translations": torch.tensor(traj.translations, dtype=torch.float64),
        "rotations": torch.tensor(traj.rotations, dtype=torch.float64),
        "azimuth_deg": torch.tensor(st.azimuth_deg, dtype=torch.float64),
        "elevation_deg": torch.tensor(st.elevation_deg, dtype=torch.float64),
        "gain": torch.full((e,), 0.8, dtype=torch.float64),
        "reflectance": torch.tensor([0.2, 0.4], dtype=torch.float64),
        "vertex_offsets": torch.zeros((len(scene.static.points), 3), dtype=torch.float64),
    }
    rng = np.random.default_rng(17)
    wc = torch.as_tensor(rng.normal(size=(3, n)))
    wi = torch.as_tensor(rng.normal(size=n) * 30.0)

    def render(x):
        return lidar_render(lid, t0, t1, LidarInputs(pose_times=traj.times, **x))

    c, _ = render({})
    c = c.detach().cpu().numpy()
    assert c.tobytes() == plain["Coordinates"].numpy().tobytes()  # the bridge renders what a plain render does

    def loss(x):
        coords, inten = render(x)
        assert coords.shape == (3, n)
        return (wc * coords.cpu().double()).sum() + (wi * inten.cpu().double()).sum()

    # translation step 1 cm: ranges to the plane are linear in the sensor position (float32 FD noise ∝ 1/step)
    eps = {"translations": 1e-2, "rotations": 1e-3, "azimuth_deg": 1e-2, "elevation_deg": 1e-2, "gain": 1e-3,
           "reflectance": 1e-3, "vertex_offsets": 1e-2}
    errs = _bridge_fd_check(loss, x0, eps, rng)
    assert len(errs) == 10


def _sweep_config(**kw) -> LidarConfig:
    """A rotary sweep (360 ticks of 1°, 4 emitters firing 0–0.2 ms = 0–0.72° into their tick): its azimuth window
    330.9°…29.9° (boundaries clear of every firing's spin angle) takes the ticks 331°…29°, the first and the last
    8 ms of the 100 ms scan, while the sensor moves along a three-key trajectory."""
    n = 4
    st = EmitterState(np.array([0.3, -0.4, 0.6, -0.2], np.float32), np.array([-6.0, -1.0, 3.0, 7.0], np.float32),
                      np.array([0, 60_000, 120_000, 200_000], np.int64), np.arange(1, n + 1, dtype=np.uint32),
                      np.array([0.02, -0.03, 0.01, 0.0], np.float32), np.array([0.0, 0.01, -0.02, 0.03], np.float32),
                      np.zeros(n, np.float32))
    cfg = LidarConfig(scan_type=ScanType.ROTARY, scan_rate_base_hz=10.0, pattern_firing_rate_hz=3600.0,
                      number_of_emitters=n, number_of_channels=n, emitter_states=[st],
                      valid_start_azimuth_deg=330.9, valid_end_azimuth_deg=29.9, **kw)
    cfg.validate()
    return cfg


SWEEP_TIMES = np.array([0.0, 0.05, 0.1])
SWEEP_POS = np.array([[0.0, 0.0, 0.5], [0.8, 0.3, 0.55], [1.7, 0.5, 0.45]])
SWEEP_QUAT = np.array([quat_from_axis_angle([0.1, 0.2, 1.0], a) for a in (0.0, 0.06, 0.16)])


@pytest.mark.parametrize("comp,ref,coords", [
    ("COMPENSATED", "start", CoordsType.CARTESIAN),
    ("COMPENSATED", "end", CoordsType.SPHERICAL),
    ("NONCOMPENSATED", "start", CoordsType.CARTESIAN),
])
def test_sensor_frame_motion_compensation_gradients(device, comp, ref, coords):
    """SENSOR output frame with the sensor moving (1.8 m, 9°) along a three-key trajectory during the sweep,
    motion-compensated to the frame start or end (or not): the torch bridge's gradients w.r.t. every key's
    translation and rotation, the emitter angles, gain and reflectance equal central FD; the compensation is
    really applied (the points differ from the uncompensated ones by decimetres) and every key matters."""
    from wsim.sensors.lidar_config import FrameOfReference, MotionCompensation

    scene = tilted_plane_scene(rho=0.4)
    traj = Trajectory(SWEEP_TIMES, SWEEP_POS, SWEEP_QUAT)
    cfg = _sweep_config(output_frame_of_reference=FrameOfReference.SENSOR,
                        output_motion_compensation_state=MotionCompensation[comp], elements_coords_type=coords)
    lid = Lidar(config=cfg, scene=scene, trajectory=traj, device=device)
    plain = lid.render(0.0, 0.1, compensation_reference=ref)
    n = plain.count
    assert n == 4 * 59
    assert plain.params["motionCompensationState"] == int(comp == "COMPENSATED")
    other = Lidar(config=cfg.replace(output_motion_compensation_state=MotionCompensation[
        "NONCOMPENSATED" if comp == "COMPENSATED" else "COMPENSATED"]), scene=scene, trajectory=traj, device=device)
    moved = np.abs(other.render(0.0, 0.1, compensation_reference=ref)["Coordinates"].numpy()
                   - plain["Coordinates"].numpy()).max()
    assert moved > 0.2
    rng = np.random.default_rng(23)
    wc = torch.as_tensor(rng.normal(size=(3, n)))
    wi = torch.as_tensor(rng.normal(size=n) * 30.0)

    def render(x):
        return lidar_render(lid, 0.0, 0.1, LidarInputs(pose_times=SWEEP_TIMES, **x), compensation_reference=ref)

    c, _ = render({})
    assert c.detach().cpu().numpy().tobytes() == plain["Coordinates"].numpy().tobytes()

    def loss(x):
        coords_, inten = render(x)
        assert coords_.shape == (3, n)
        return (wc * coords_.cpu().double()).sum() + (wi * inten.cpu().double()).sum()

    x0 = {
        "translations": torch.tensor(SWEEP_POS, dtype=torch.float64),
        "rotations": torch.tensor(SWEEP_QUAT, dtype=torch.float64),
        "azimuth_deg": torch.tensor(cfg.emitter_states[0].azimuth_deg, dtype=torch.float64),
        "elevation_deg": torch.tensor(cfg.emitter_states[0].elevation_deg, dtype=torch.float64),
        "gain": torch.full((4,), 0.8, dtype=torch.float64),
        "reflectance": torch.tensor([0.2, 0.4], dtype=torch.float64),
    }
    eps = {"translations": 1e-2, "rotations": 1e-3, "azimuth_deg": 1e-2, "elevation_deg": 1e-2, "gain": 1e-3,
           "reflectance": 1e-3}
    x = {k: v.clone().requires_grad_(True) for k, v in x0.items()}
    loss(x).backward()
    for k in range(3):  # every key of the trajectory moves some points
        assert x["translations"].grad[k].abs().sum() > 0.1 and x["rotations"].grad[k].abs().sum() > 0.1, k
    errs = _bridge_fd_check(loss, x0, eps, rng)
    assert len(errs) == 6
