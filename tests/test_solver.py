"""The least-squares solver (:mod:`wsim.autodiff.solve`): analytic problems with known minima, robust fits with
outliers, every Jacobian mode, and lidar poses recovered from renders (range residuals through the lidar tape;
point-to-plane residuals against the rendered surface with correspondences re-selected between steps)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import box_room_scene

from wsim.autodiff import poses as P
from wsim.autodiff.solve import JacobianMode, Method, RobustLoss, jacobian, least_squares, robust_cost, robust_weights

F64 = torch.float64


def T(x) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# NIST StRD "Misra1a" (lower difficulty): y = b1 (1 - exp(-b2 x)), certified values to 10 digits
MISRA_X = T([77.6, 114.9, 141.1, 190.8, 239.9, 289.0, 332.8, 378.4, 434.8, 477.3, 536.8, 593.1, 689.1,
                        760.0])
MISRA_Y = T([10.07, 14.73, 17.94, 23.93, 29.61, 35.18, 40.02, 44.82, 50.76, 55.05, 61.01, 66.40, 75.47,
                        81.78])
MISRA_B = (2.3894212918e02, 5.5015643181e-04)
MISRA_RSS = 1.2455138894e-01


def misra(b: torch.Tensor) -> torch.Tensor:
    """Residuals of Misra1a; ``b`` (2,) or parameter rows (R, 2)."""
    if b.dim() == 2:
        return b[:, 0] * (1 - torch.exp(-b[:, 1] * MISRA_X)) - MISRA_Y
    return b[0] * (1 - torch.exp(-b[1] * MISRA_X)) - MISRA_Y


@pytest.mark.parametrize("mode", ["forward", "rows", "reverse"])
def test_misra1a_reaches_the_certified_minimum(mode):
    # NIST start 1 (b1 = 500, b2 = 1e-4); b2 is scaled to order one so that the step tolerance means one thing
    fun = (lambda x: misra(torch.stack([x[..., 0], x[..., 1] * 1e-4], -1)))
    res = least_squares(fun, T([500.0, 1.0]), jacobian_mode=mode, max_iterations=200,
                        step_tolerance=1e-12, gradient_tolerance=1e-14)
    assert res.converged, res.reason
    b1, b2 = res.x[0].item(), res.x[1].item() * 1e-4
    assert b1 == pytest.approx(MISRA_B[0], rel=1e-7) and b2 == pytest.approx(MISRA_B[1], rel=1e-7)
    assert 2 * res.cost == pytest.approx(MISRA_RSS, rel=1e-8)
    costs = [h.new_cost for h in res.history]
    assert all(b <= a for a, b in zip(costs, costs[1:]))  # accepted steps only decrease the cost
    assert res.history[-1].x.tolist() == res.x.tolist()


def rosenbrock(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([10 * (x[1] - x[0] ** 2), 1 - x[0]])


@pytest.mark.parametrize("method", [Method.LEVENBERG_MARQUARDT, Method.GAUSS_NEWTON])
def test_rosenbrock_minimum(method):
    res = least_squares(rosenbrock, T([-1.2, 1.0]), method=method, max_iterations=100)
    assert res.converged
    torch.testing.assert_close(res.x, T([1.0, 1.0]), atol=1e-9, rtol=0)
    assert res.cost < 1e-20


def test_jacobian_modes_agree_with_the_analytic_jacobian():
    b = T([240.0, 5.5e-4])
    e = torch.exp(-b[1] * MISRA_X)
    ref = torch.stack([1 - e, b[0] * MISRA_X * e], 1)
    for mode in JacobianMode:
        r, J = jacobian(misra, b, mode)
        torch.testing.assert_close(r, misra(b))
        torch.testing.assert_close(J, ref, rtol=1e-12, atol=0)


def test_robust_losses():
    r = T([0.0, 0.5, -2.0, 10.0])
    torch.testing.assert_close(robust_weights(r, RobustLoss.HUBER, 1.0), T([1.0, 1.0, 0.5, 0.1]))
    torch.testing.assert_close(robust_weights(r, RobustLoss.CAUCHY, 1.0), 1 / (1 + r ** 2))
    assert robust_cost(r, RobustLoss.LINEAR, 1.0) == pytest.approx(0.5 * (0.25 + 4 + 100))
    assert robust_cost(r, RobustLoss.HUBER, 1.0) == pytest.approx(0.5 * (0.25 + 3 + 19))
    assert robust_cost(r, RobustLoss.CAUCHY, 1.0) == pytest.approx(0.5 * float(torch.log1p(r ** 2).sum()))
    # the IRLS weight is dρ/ds (ρ(s) = 2 × the cost of one residual r = √s): central differences of the cost
    s, h = T([0.3, 4.0, 25.0]), 1e-6
    for loss in (RobustLoss.HUBER, RobustLoss.CAUCHY):
        num = T([(robust_cost(torch.sqrt(v + h).reshape(1), loss, 1.5)
                  - robust_cost(torch.sqrt(v - h).reshape(1), loss, 1.5)) / h for v in s])
        torch.testing.assert_close(robust_weights(torch.sqrt(s), loss, 1.5), num, rtol=1e-5, atol=0)


def test_robust_fit_with_outliers():
    """A decaying exponential with 25 % one-sided gross outliers: least squares is pulled off, Huber and Cauchy
    recover the parameters within the noise."""
    g = torch.Generator().manual_seed(0)
    t = torch.linspace(0, 4, 200, dtype=F64)
    truth = T([2.0, 0.7, 0.3])  # amplitude, rate [1/s], offset

    def model(x):
        return x[..., 0:1] * torch.exp(-x[..., 1:2] * t) + x[..., 2:3]

    y = model(truth) + 0.01 * torch.randn(200, generator=g, dtype=F64)
    out = torch.rand(200, generator=g) < 0.25
    y[out] += 0.5 + 2.0 * torch.rand(int(out.sum()), generator=g, dtype=F64)

    def fun(x):
        return (model(x) - y).reshape(-1)

    x0 = T([1.0, 1.5, 0.0])
    plain = least_squares(fun, x0)
    assert (plain.x - truth).abs().max() > 0.2
    for loss, k in ((RobustLoss.HUBER, 0.02), (RobustLoss.CAUCHY, 0.03)):
        # start from the least-squares fit; the scale shrinks from 1 to k over the first iterations
        res = least_squares(fun, plain.x, loss=loss, loss_scale=lambda i, k=k: max(k, 0.5 ** i), max_iterations=80)
        assert res.converged, (loss, res.reason)
        err = (res.x - truth).abs().max().item()
        assert err < (0.03 if loss is RobustLoss.CAUCHY else 0.06), (loss, res.x)


def test_rows_mode_with_sparse_columns_equals_dense():
    """Many independent exponentials (each row depending on one of 30 rates): ROWS with columns (a sparse Jacobian,
    one reverse pass) gives the dense FORWARD solution."""
    g = torch.Generator().manual_seed(1)
    rates = 0.2 + torch.rand(30, generator=g, dtype=F64)
    group = torch.arange(30).repeat_interleave(12)
    t = torch.linspace(0.1, 3.0, 12, dtype=F64).repeat(30)
    y = torch.exp(-rates[group] * t) + 1e-3 * torch.randn(len(t), generator=g, dtype=F64)
    dense = least_squares(lambda x: torch.exp(-x[group] * t) - y, torch.full((30,), 1.0, dtype=F64))
    sparse = least_squares(lambda xr: torch.exp(-xr[:, 0] * t) - y, torch.full((30,), 1.0, dtype=F64),
                           jacobian_mode="rows", columns=group[:, None])
    assert dense.converged and sparse.converged
    torch.testing.assert_close(sparse.x, dense.x, atol=1e-9, rtol=0)
    assert (sparse.x - rates).abs().max() < 0.01


def test_unobserved_parameters_keep_their_value_and_callbacks_run():
    seen = []
    res = least_squares(lambda x: torch.stack([x[0] - 3.0, 2 * (x[0] - 3.0)]) + 0 * x[1], T([0.0, 5.0]),
                        callback=seen.append)
    assert res.converged and res.x[1].item() == 5.0 and res.x[0].item() == pytest.approx(3.0)
    assert len(seen) == res.iterations and seen[0].residuals == 2


def test_rows_mode_with_residual_blocks():
    """(N, 2) residual blocks per parameter row (two reverse passes): a 2-D similarity fit."""
    pts = torch.randn(40, 2, generator=torch.Generator().manual_seed(2), dtype=F64)
    th, s, tx, ty = 0.4, 1.3, 0.5, -0.2
    R = T([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    obs = s * pts @ R.T + T([tx, ty])

    def fun(x):  # x (R, 4) rows
        c, sn = torch.cos(x[:, 0:1]), torch.sin(x[:, 0:1])
        u = x[:, 1:2] * (c * pts[:, 0:1] - sn * pts[:, 1:2]) + x[:, 2:3]
        v = x[:, 1:2] * (sn * pts[:, 0:1] + c * pts[:, 1:2]) + x[:, 3:4]
        return torch.cat([u, v], 1) - obs

    res = least_squares(fun, T([0.0, 1.0, 0.0, 0.0]), jacobian_mode="rows")
    assert res.converged and res.history[0].residuals == 80
    torch.testing.assert_close(res.x, T([th, s, tx, ty]), atol=1e-10, rtol=0)


# ------------------------------------------------------------------------------------------ lidar poses from renders
def _rotary(n_emitters: int, ticks: int, **kw):
    from wsim.sensors.lidar_config import CoordsType, EmitterState, LidarConfig, ScanType

    el = np.linspace(-35.0, 35.0, n_emitters).astype(np.float32)
    z = np.zeros(n_emitters, np.float32)
    st = EmitterState(z.copy(), el, np.zeros(n_emitters, np.int64), np.arange(1, n_emitters + 1, dtype=np.uint32),
                      z.copy(), z.copy(), z.copy())
    kw.setdefault("elements_coords_type", CoordsType.CARTESIAN)
    cfg = LidarConfig(scan_type=ScanType.ROTARY, scan_rate_base_hz=10.0, pattern_firing_rate_hz=10.0 * ticks,
                      number_of_emitters=n_emitters, number_of_channels=n_emitters, emitter_states=[st], **kw)
    cfg.validate()
    return cfg


POSE_T = T([0.4, -0.3, 0.2])
POSE_Q = T(list(P.so3_exp(T([0.05, -0.1, 0.6])).numpy()))
XI_TRUE = T([0.12, -0.08, 0.05, *np.deg2rad([2.0, -1.5, 3.0])])  # the hidden offset (m, rad)


def _room():
    return box_room_scene([-6.0, -4.0, -2.0], [7.0, 5.0, 3.5])


def test_lidar_pose_from_range_residuals_through_the_tape():
    """A lidar's pose in a box room from range residuals (model range − measured range of the same firing), with
    the Jacobian from the lidar tape (REVERSE: one reverse pass through the Warp bridge per residual)."""
    from wsim.autodiff.residuals import firing_keys
    from wsim.scene import Trajectory
    from wsim.sensors.lidar import Lidar
    from wsim.sensors.lidar_config import CoordsType
    from wsim.torch import LidarInputs, lidar_render, point_cloud_of

    scene = _room()
    cfg = _rotary(6, 24, elements_coords_type=CoordsType.SPHERICAL)
    t_true, q_true = P.retract(POSE_T, POSE_Q, XI_TRUE)
    measured = Lidar(config=cfg, scene=scene, trajectory=Trajectory([0.0], [t_true.numpy()], [q_true.numpy()]))
    pc = measured.render(0.0, 0.1)
    meas = dict(zip(firing_keys(pc, measured).tolist(), pc["Coordinates"].numpy()[2].astype(np.float64)))
    model = Lidar(config=cfg, scene=scene)

    def fun(xi):
        with torch.enable_grad():  # point_cloud_of needs the render's graph (trial evaluations run without grad)
            if not xi.requires_grad:
                xi = xi.detach().requires_grad_(True)
            t, q = P.retract(POSE_T, POSE_Q, xi)
            coords, _ = lidar_render(model, 0.0, 0.1, LidarInputs(pose_times=[0.0], translations=t[None],
                                                                  rotations=q[None]))
            k = firing_keys(point_cloud_of(coords), model)
            assert len(k) == len(meas)  # a closed room: every firing returns in every render
            target = torch.as_tensor([meas[int(i)] for i in k], dtype=F64)
            return coords[2].double() - target

    res = least_squares(fun, torch.zeros(6, dtype=F64), jacobian_mode="reverse", max_iterations=20,
                        step_tolerance=1e-7)
    assert res.history[0].residuals == 6 * 24
    t_est, q_est = P.retract(POSE_T, POSE_Q, res.x)
    rot, tr = P.pose_errors(t_est, q_est, t_true, q_true)
    assert rot < 1e-3 and tr < 1e-4, (rot, tr, res.reason)  # float32 ranges: ~1e-6 m


@pytest.mark.parametrize("hard", [False, True])
def test_lidar_pose_from_point_to_plane_residuals(hard):
    """A lidar's pose in a box room from point-to-plane residuals against the rendered model surface, the
    correspondences re-selected between steps (``reselect``) and the Jacobian by forward mode (plain torch). From a
    start 5° / 30 cm off; ``hard``: range noise σ = 3 cm and an unmodelled box (clutter) in the measured room,
    with a Cauchy loss."""
    from wsim.autodiff.residuals import firing_keys, match_surface, sensor_points
    from wsim.scene import Trajectory
    from wsim.sensors.lidar import Lidar
    from wsim.sensors.lidar_config import FrameOfReference
    from conftest import add_static, box_mesh

    real = _room()
    if hard:
        add_static(real, *box_mesh([2.0, 1.0, -2.0], [3.5, 3.0, 0.5]), name="crate")
    t_true, q_true = P.retract(POSE_T, POSE_Q, XI_TRUE)
    measured = Lidar(config=_rotary(16, 360, range_accuracy_m=0.03 if hard else 0.0), scene=real,
                     trajectory=Trajectory([0.0], [t_true.numpy()], [q_true.numpy()]))
    pc = measured.render(0.0, 0.1)
    keys, p_s = firing_keys(pc, measured), sensor_points(pc, measured)
    rng = np.random.default_rng(4)
    axis, direction = rng.normal(size=3), rng.normal(size=3)
    xi0 = T([*(0.3 * direction / np.linalg.norm(direction)), *(np.deg2rad(5.0) * axis / np.linalg.norm(axis))])
    t0, q0 = P.retract(t_true, q_true, xi0)  # the start guess
    model_cfg = _rotary(16, 360, output_frame_of_reference=FrameOfReference.WORLD)
    state = {}

    def reselect(x):
        t, q = P.retract(t0, q0, x)
        model = Lidar(config=model_cfg, scene=_room(), trajectory=Trajectory([0.0], [t.numpy()], [q.numpy()]),
                      channels=["Coordinates", "TickId", "EmitterId", "HitNormal"])
        state["match"] = match_surface(keys, model.render(0.0, 0.1), model)

    def fun(x):
        m = state["match"]
        t, q = P.retract(t0, q0, x)
        return m.residuals(t + P.quat_rotate(q, p_s[m.index]))

    res = least_squares(fun, torch.zeros(6, dtype=F64), reselect=reselect, loss="cauchy" if hard else "linear",
                        loss_scale=lambda i: max(0.1, 2.0 * 0.5 ** i), max_iterations=40, step_tolerance=1e-8)
    assert res.converged, res.reason
    t_est, q_est = P.retract(t0, q0, res.x)
    rot, tr = P.pose_errors(t_est, q_est, t_true, q_true)
    rot0, tr0 = P.pose_errors(t0, q0, t_true, q_true)
    assert rot0 == pytest.approx(5.0) and tr0 == pytest.approx(0.3)
    if hard:
        assert rot < 0.03 and tr < 0.003, (rot, tr)  # measured: 0.012° / 1.0 mm
    else:
        assert rot < 1e-3 and tr < 2e-5, (rot, tr)
