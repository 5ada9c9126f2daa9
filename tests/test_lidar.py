"""wsim.Lidar on analytic scenes and device tables: every expected value is computed independently."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from conftest import add_static, box_mesh, box_room_scene, empty_scene, quad_mesh, uv_sphere

from wsim.kernels import lidar as K
from wsim.scene import Instance, Material, MeshData, Part, Trajectory
from wsim.scene.transforms import quat_from_axis_angle
from wsim.sensors.lidar import Lidar
from wsim.sensors.lidar_config import EmitterState, LidarConfig, LidarConfigError, RayType, ScanType
from wsim.sensors.pointcloud import FLAG_NEW_SCAN, FLAG_VALID
from wsim.sensors.presets import PRESET_USD, at128, pandar128_tables

ROOM_LO, ROOM_HI = np.array([-30.0, -20.0, -5.0]), np.array([40.0, 25.0, 8.0])
STATIC = Trajectory([0.0], [[0, 0, 0]], [[0, 0, 0, 1]])


def room_distance(origin, dirs, lo=ROOM_LO, hi=ROOM_HI):
    with np.errstate(divide="ignore"):
        t = np.where(dirs > 0, (hi - origin) / dirs, (lo - origin) / dirs)
    return t.min(axis=1)


def solid_state(az_deg, el_deg, fire_ns=None, **kw) -> LidarConfig:
    """A solid-state lidar with one emitter state (one emitter per listed angle)."""
    az = np.asarray(az_deg, np.float32)
    n = len(az)
    st = EmitterState(az, np.broadcast_to(np.asarray(el_deg, np.float32), (n,)).copy(),
                      np.zeros(n, np.int64) if fire_ns is None else np.asarray(fire_ns, np.int64),
                      np.arange(1, n + 1, dtype=np.uint32), np.zeros(n, np.float32), np.zeros(n, np.float32),
                      np.zeros(n, np.float32))
    kw.setdefault("elements_coords_type", "CARTESIAN")
    from wsim.sensors.lidar_config import CoordsType

    kw["elements_coords_type"] = CoordsType(kw["elements_coords_type"])
    cfg = LidarConfig(scan_type=ScanType.SOLID_STATE, scan_rate_base_hz=10.0, pattern_firing_rate_hz=10.0,
                      number_of_emitters=n, number_of_channels=n, emitter_states=[st], **kw)
    cfg.validate()
    return cfg


def rotary(n_el=4, ticks=360, **kw) -> LidarConfig:
    el = np.linspace(-10, 10, n_el).astype(np.float32)
    st = EmitterState(np.zeros(n_el, np.float32), el, np.arange(n_el, dtype=np.int64) * 1000,
                      np.arange(1, n_el + 1, dtype=np.uint32), np.zeros(n_el, np.float32),
                      np.zeros(n_el, np.float32), np.zeros(n_el, np.float32))
    from wsim.sensors.lidar_config import CoordsType

    kw["elements_coords_type"] = CoordsType(kw.get("elements_coords_type", "CARTESIAN"))
    cfg = LidarConfig(scan_type=ScanType.ROTARY, scan_rate_base_hz=10.0, pattern_firing_rate_hz=10.0 * ticks,
                      number_of_emitters=n_el, number_of_channels=n_el, emitter_states=[st], **kw)
    cfg.validate()
    return cfg


# --------------------------------------------------------------------------------------------------- presets
def test_pandar128_preset_matches_device_table_and_timing(device):
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    lid = Lidar.preset("PANDAR128", scene=scene, trajectory=STATIC, device=device,
                       elements_coords_type=__import__("wsim").sensors.lidar_config.CoordsType.SPHERICAL)
    assert lid.render(0.0, 0.05).count == 0  # scan not complete yet
    pc = lid.render(0.05, 0.1)
    n = pc.numpy()
    el, az, fire = pandar128_tables()
    assert pc.count == 128 * 1800 and np.all(pc.valid)
    e, tick, state = n["EmitterId"], n["TickId"].astype(np.int64), n["TickState"]
    assert np.array_equal(np.bincount(e, minlength=128), np.full(128, 1800))
    assert np.array_equal(n["ChannelId"], e + 1)
    assert np.array_equal(state, tick % 2)  # two angle states alternate every tick
    # TimeOffsetNs = tick time + fire time of the emitter in the tick's state
    assert np.array_equal(n["TimeOffsetNs"], np.round(tick * 1e9 / 18000).astype(np.int64) + fire[state, e])
    # elevation per channel; delivered azimuth = offset − firing angle (CW)
    np.testing.assert_allclose(n["Coordinates"][1], el[e], atol=1e-4)
    phi = 360.0 * n["TimeOffsetNs"] * 1e-9 / 0.1
    d_az = (n["Coordinates"][0] - (az[e] - phi) + 180.0) % 360.0 - 180.0
    assert np.abs(d_az).max() < 1e-3
    assert pc.value("maxPoints") == pc.count and pc.value("coordsType") == 1
    # first tick carries NEW_SCAN
    assert np.all((n["Flags"][tick == 0] & FLAG_NEW_SCAN) != 0) and np.all((n["Flags"][tick > 0] & FLAG_NEW_SCAN) == 0)


def test_at128_preset_field_of_view():
    cfg = at128()
    assert cfg.number_of_channels == 128 and cfg.number_of_emitters == 128 * 1200
    az = cfg.emitter_states[0].azimuth_deg
    el = cfg.emitter_states[0].elevation_deg
    assert 119.0 < az.max() - az.min() < 126.0 and abs(el.max() - el.min() - 25.4) < 1e-3
    assert cfg.emitter_states[0].fire_time_ns.max() < 100_000_000


def test_preset_usd_files_reference_into_a_stage(tmp_path):
    from pxr import Usd, UsdGeom

    st = Usd.Stage.CreateNew(str(tmp_path / "car.usda"))
    UsdGeom.SetStageUpAxis(st, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(st, 1.0)
    rig = UsdGeom.Xform.Define(st, "/World/Rig")
    rig.AddTranslateOp().Set((5.0, 1.0, 0.0))
    prim = st.DefinePrim("/World/Rig/Lidar")
    prim.GetReferences().AddReference(str(PRESET_USD["PANDAR128"]))
    st.Save()
    lid = Lidar(prim, scene=box_room_scene(ROOM_LO, ROOM_HI))
    assert lid.config.number_of_emitters == 128 and lid.config.ticks_per_scan == 1800
    np.testing.assert_allclose(lid.trajectory.translations[0], [5, 1, 0])


# --------------------------------------------------------------------------------------------------- geometry
@pytest.mark.parametrize("coords", ["CARTESIAN", "SPHERICAL"])
def test_box_room_ranges_are_analytic(device, coords):
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    pos = np.array([1.5, -2.0, 0.7])
    lid = Lidar(config=rotary(n_el=16, ticks=720, elements_coords_type=coords), scene=scene, device=device,
                trajectory=Trajectory([0.0], [pos], [quat_from_axis_angle([0, 0, 1], 0.3)]))
    pc = lid.render(0.0, 0.1)
    assert pc.count == 16 * 720
    xyz = pc.xyz()
    r = np.linalg.norm(xyz, axis=1)
    dirs_world = xyz @ np.array([[np.cos(0.3), -np.sin(0.3), 0], [np.sin(0.3), np.cos(0.3), 0], [0, 0, 1]]).T / r[:,
                                                                                                             None]
    np.testing.assert_allclose(r, room_distance(pos, dirs_world), atol=1e-3)
    if coords == "SPHERICAL":
        c = pc["Coordinates"].numpy()
        np.testing.assert_allclose(c[2], r, rtol=1e-6)


@pytest.mark.parametrize("noisy", [False, True])
def test_spherical_sensor_output_is_the_cartesian_point(device, noisy):
    """SPHERICAL in the uncompensated SENSOR frame (read from the delivered angles and the emitter offsets) and
    CARTESIAN renders of the same firings, emitters offset radially and vertically (by centimetres: the elevation's
    series; by decimetres: its atan2), with and without seeded angle and range noise: the spherical points converted to Cartesian equal the Cartesian ones within float32
    rounding, and the azimuth is what the atan2 of the Cartesian point gives."""
    n = 6
    st = EmitterState(np.linspace(-20, 20, n).astype(np.float32), np.linspace(-15, 12, n).astype(np.float32),
                      np.arange(n, dtype=np.int64) * 1000, np.arange(1, n + 1, dtype=np.uint32),
                      np.array([0.03, 0.05, 0.08, 0.6, -0.4, 0.0], np.float32),
                      np.array([-0.05, 0.04, 0.0, 0.5, 0.02, -0.7], np.float32),
                      np.zeros(n, np.float32))
    from wsim.sensors.lidar_config import CoordsType

    noise = dict(range_accuracy_m=0.02, azimuth_error_std=0.05, elevation_error_std=0.05) if noisy else {}
    out = {}
    for key, coords, kw in (("SPHERICAL", "SPHERICAL", noise), ("CARTESIAN", "CARTESIAN", noise),
                            ("quiet", "SPHERICAL", {})):
        cfg = LidarConfig(scan_type=ScanType.ROTARY, scan_rate_base_hz=10.0, pattern_firing_rate_hz=3600.0,
                          number_of_emitters=n, number_of_channels=n, emitter_states=[st],
                          elements_coords_type=CoordsType(coords), **kw)
        cfg.validate()
        lid = Lidar(config=cfg, scene=box_room_scene(ROOM_LO, ROOM_HI), device=device,
                    trajectory=Trajectory([0.0], [[1.5, -2.0, 0.7]], [quat_from_axis_angle([0, 0, 1], 0.3)]))
        out[key] = lid.render(0.0, 0.1)
    sph, cart = out["SPHERICAL"], out["CARTESIAN"]
    assert sph.count == cart.count == n * 360
    c = cart["Coordinates"].numpy().T.astype(np.float64)
    r = np.linalg.norm(c, axis=1)
    err = np.abs(sph.xyz() - c).max(axis=1)
    assert np.all(err <= 4e-7 * r + 1e-5), (err.max(), (err / r).max())
    a = sph["Coordinates"].numpy()[0].astype(np.float64)
    d = (a - np.degrees(np.arctan2(c[:, 1], c[:, 0])) + 180.0) % 360.0 - 180.0
    assert np.abs(d).max() < 2e-4  # [deg]
    np.testing.assert_allclose(sph["Coordinates"].numpy()[2], r, rtol=2e-6)
    moved = np.abs(out["quiet"]["Coordinates"].numpy() - sph["Coordinates"].numpy()).max(axis=1)
    assert (moved.min() > 0.01) if noisy else (moved.max() == 0.0)  # azimuth and elevation [deg], range [m]


FAR = np.array([10000.0, -10000.0, 100.0])  # 10 km from the origin: float32 world coordinates step by 1 mm there


def _matched(a, b):
    """Entries of two renders matched by (TickId, EmitterId, EchoId)."""
    key = lambda n: (n["TickId"].astype(np.int64) * 4096 + n["EmitterId"]) * 8 + n["EchoId"]  # noqa: E731
    _, ia, ib = np.intersect1d(key(a), key(b), return_indices=True)
    assert len(ia) >= 0.999 * len(key(a))
    pick = lambda n, i: {k: v[:, i] if k == "Coordinates" else v[i] for k, v in n.items() if k != "Counts"}  # noqa
    return pick(a, ia), pick(b, ib)


@pytest.mark.parametrize("kw", [{}, {"output_motion_compensation_state": "COMPENSATED"},
                                {"elements_coords_type": "SPHERICAL"}])
def test_sensor_frame_outputs_do_not_depend_on_the_world_origin(device, kw):
    """The same room and sensor 10 km from the origin: SENSOR-frame coordinates, ranges and velocities as at the
    origin. The point is formed relative to the sensor (never in world coordinates) and the sensor's displacements
    come from its trajectory's key differences, so what is left is the float32 rounding of the range and, for a
    moving sensor, of the ray origin itself (0.5 mm per axis at 10 km, divided by the incidence cosine)."""
    from wsim.sensors import lidar_config as lc

    kw = {k: (lc.CoordsType(v) if k == "elements_coords_type" else lc.MotionCompensation(v)) for k, v in kw.items()}
    pos = np.array([1.5, -2.25, 0.75])  # exact in float32 at 10 km too
    q0, q1 = quat_from_axis_angle([0, 0, 1], 0.3), quat_from_axis_angle([0, 0, 1], 0.5)
    h = 0.5 * float(np.spacing(np.float32(FAR[0])))  # rounding of a world coordinate at 10 km [m]
    for moving in (False, True):
        out = []
        for o, cfg_kw in ((np.zeros(3), {}), (np.zeros(3), kw), (FAR, kw)):
            traj = (Trajectory([0.0, 1.0], [pos + o, pos + o + [12.0, 5.0, 0.0]], [q0, q1]) if moving
                    else Trajectory([0.0], [pos + o], [q0]))
            lid = Lidar(config=rotary(n_el=16, ticks=720), scene=box_room_scene(ROOM_LO + o, ROOM_HI + o),
                        trajectory=traj, device=device).with_config(**cfg_kw)
            out.append(lid.render(0.0, 0.1).numpy())
        ref, _ = _matched(out[0], out[2])
        near, far = _matched(out[1], out[2])
        c0, c1 = near["Coordinates"].astype(np.float64), far["Coordinates"].astype(np.float64)
        # incidence cosine of each ray (sensor frame at the firing, no emitter offsets: the point is along the ray)
        cos = np.abs(np.sum(ref["HitNormal"] * ref["Coordinates"].T, axis=1)) / np.linalg.norm(ref["Coordinates"], axis=0)
        if "elements_coords_type" in kw:
            c0[0], c1[0] = np.unwrap(np.deg2rad(c0[0])), np.unwrap(np.deg2rad(c1[0]))  # azimuth [rad]
            c0[1], c1[1] = np.deg2rad(c0[1]), np.deg2rad(c1[1])
            r = c0[2]
            err = np.linalg.norm((c1 - c0) * np.array([r * np.cos(c0[1]), r, np.ones_like(r)]), axis=0)  # [m]
        else:
            r = np.linalg.norm(c0, axis=0)
            err = np.linalg.norm(c1 - c0, axis=0)
        # static: float32 rounding of the range (was up to 2.2 mm); moving: plus the ray origin's rounding (was
        # up to 3.5 mm whatever the incidence)
        tol = 4.0 * np.spacing(np.float32(r)) + (np.sqrt(2.0) * h / cos if moving else 0.0)
        assert np.all(err <= tol), (moving, err.max(), (err / tol).max())
        # velocities of the static walls relative to the sensor (were off by up to 1.9 m/s for the moving sensor)
        np.testing.assert_allclose(far["Velocity"], near["Velocity"], atol=1e-2 if moving else 1e-6)


def test_moving_sensor_compensation_and_world_frame(device):
    scene = box_room_scene([-100, -100, -10], [50, 100, 10])
    v = 20.0
    traj = Trajectory([0.0, 1.0], [[0, 0, 0], [v, 0, 0]], [[0, 0, 0, 1]] * 2)
    cfg = rotary(n_el=1, ticks=3600)
    out = {}
    for name, kw in {"noncomp": {}, "comp": {"output_motion_compensation_state": "COMPENSATED"},
                     "world": {"output_frame_of_reference": "WORLD"}}.items():
        from wsim.sensors import lidar_config as lc

        changes = {k: (lc.MotionCompensation(v_) if "compensation" in k else lc.FrameOfReference(v_))
                   for k, v_ in kw.items()}
        lid = Lidar(config=cfg, scene=scene, trajectory=traj, device=device).with_config(**changes)
        out[name] = lid.render(0.0, 0.1)
    t = out["noncomp"]["TimeOffsetNs"].numpy() * 1e-9
    x_nc = out["noncomp"].xyz()
    wall = np.abs(np.degrees(np.arctan2(x_nc[:, 1], x_nc[:, 0]))) < 20
    assert wall.sum() > 300
    # NONCOMPENSATED: the wall x=50 appears at 50 − v·t: smeared by v·T = 2 m over the scan
    np.testing.assert_allclose(x_nc[wall, 0], 50.0 - v * t[wall], atol=2e-3)
    assert x_nc[wall, 0].max() - x_nc[wall, 0].min() > 1.9
    # COMPENSATED (reference = scan start, where the sensor is at x=0): every point on x=50
    x_c = out["comp"].xyz()
    np.testing.assert_allclose(x_c[wall, 0], 50.0, atol=2e-3)
    # WORLD: the true wall positions
    x_w = out["world"].xyz()
    np.testing.assert_allclose(x_w[wall, 0], 50.0, atol=2e-3)
    np.testing.assert_allclose(x_w, x_nc + np.column_stack([v * t, 0 * t, 0 * t]), atol=2e-3)
    # static walls seen from a sensor moving at +20 m/s move at −20 m/s relative to it
    np.testing.assert_allclose(out["noncomp"]["Velocity"].numpy(), np.tile([-v, 0, 0], (len(t), 1)), atol=1e-2)
    # end-of-spin reference: the wall at 50 − 2 = 48
    lid = Lidar(config=cfg, scene=scene, trajectory=traj, device=device).with_config(
        output_motion_compensation_state=__import__("wsim").sensors.lidar_config.MotionCompensation.COMPENSATED)
    x_e = lid.render(0.0, 0.1, compensation_reference="end").xyz()
    np.testing.assert_allclose(x_e[wall, 0], 48.0, atol=2e-3)


@pytest.mark.parametrize("frame", ["SENSOR", "COMPENSATED", "WORLD"])
def test_velocity_seen_from_a_turning_sensor(device, frame):
    """A sensor yawing at ω = 0.8 rad/s while moving at 6 m/s: a static wall point at p (sensor axes at the firing)
    moves at −R(t)ᵀV − ω × p relative to it, a car moving at U at R(t)ᵀ(U − V) − ω × p; in WORLD axes R(t)·that,
    COMPENSATED in the axes of the reference pose (the scan start)."""
    from wsim.sensors import lidar_config as lc

    scene = box_room_scene([-60, -60, -10], [60, 60, 10])
    bp, bf = box_mesh([-2, -4, -1], [2, 4, 1])
    scene.parts.append(Part("/World/Car/body", material=1, semantic_class=scene.semantic_class_index("car")))
    scene.prototypes.append(MeshData(bp, bf, len(scene.parts) - 1))
    u = np.array([0.0, 9.0, 0.0])
    scene.instances.append(Instance(0, [0.0, 2.0], [[25, -3, 0], [25, -3, 0] + 2 * u], [[0, 0, 0, 1]] * 2,
                                    object_id=9, name="/World/Car"))
    w, v = 0.8, np.array([6.0, 0.0, 0.0])
    times = np.linspace(0.0, 1.0, 11)  # keys every 0.1 s: slerp at a constant rate
    traj = Trajectory(times, [v * t for t in times], [quat_from_axis_angle([0, 0, 1], w * t) for t in times])
    kw = {}
    if frame == "WORLD":
        kw["output_frame_of_reference"] = lc.FrameOfReference.WORLD
    if frame == "COMPENSATED":
        kw["output_motion_compensation_state"] = lc.MotionCompensation.COMPENSATED
    lid = Lidar(config=solid_state(np.linspace(-40, 40, 41), [0.0], fire_ns=np.arange(41) * 1_000_000, **kw),
                scene=scene, device=device, trajectory=traj)
    out = lid.render(0.2, 0.3).numpy()
    t = 0.2 + out["TimeOffsetNs"] * 1e-9  # firing times (timestampNs: the scan start, 0.2 s)
    yaw = w * t
    c, s_ = np.cos(yaw), np.sin(yaw)
    on_car = out["SemanticId"] == scene.semantic_class_index("car")
    assert on_car.sum() >= 3 and (~on_car).sum() >= 20
    # points in the sensor axes at the firing, from the world points
    xyz = out["Coordinates"].T.astype(np.float64)
    if frame == "WORLD":
        rel = xyz - v * t[:, None]
        p_s = np.stack([c * rel[:, 0] + s_ * rel[:, 1], -s_ * rel[:, 0] + c * rel[:, 1], rel[:, 2]], 1)
    elif frame == "COMPENSATED":  # reference pose at 0.2 s: back to the firing pose
        y0 = w * 0.2
        world = np.stack([np.cos(y0) * xyz[:, 0] - np.sin(y0) * xyz[:, 1],
                          np.sin(y0) * xyz[:, 0] + np.cos(y0) * xyz[:, 1], xyz[:, 2]], 1) + v * 0.2
        rel = world - v * t[:, None]
        p_s = np.stack([c * rel[:, 0] + s_ * rel[:, 1], -s_ * rel[:, 0] + c * rel[:, 1], rel[:, 2]], 1)
    else:
        p_s = xyz
    moving = np.where(on_car[:, None], u, 0.0) - v  # world velocity of the surface relative to the sensor origin
    lin = np.stack([c * moving[:, 0] + s_ * moving[:, 1], -s_ * moving[:, 0] + c * moving[:, 1], moving[:, 2]], 1)
    expect = lin - np.cross([0.0, 0.0, w], p_s)  # sensor axes at the firing
    if frame == "WORLD":
        expect = np.stack([c * expect[:, 0] - s_ * expect[:, 1], s_ * expect[:, 0] + c * expect[:, 1],
                           expect[:, 2]], 1)
    elif frame == "COMPENSATED":
        d = yaw - w * 0.2
        expect = np.stack([np.cos(d) * expect[:, 0] - np.sin(d) * expect[:, 1],
                           np.sin(d) * expect[:, 0] + np.cos(d) * expect[:, 1], expect[:, 2]], 1)
    assert np.abs(expect).max() > 40.0  # the turn dominates at 60 m
    np.testing.assert_allclose(out["Velocity"], expect, atol=2e-2)


def test_velocity_of_moving_car_and_normals_of_known_planes(device):
    scene = box_room_scene([-100, -100, -10], [100, 100, 10])
    bp, bf = box_mesh([-2, -1, -1], [2, 1, 1])
    scene.parts.append(Part("/World/Car/body", material=1, semantic_class=scene.semantic_class_index("car")))
    scene.prototypes.append(MeshData(bp, bf, len(scene.parts) - 1))
    speed = 7.5
    scene.instances.append(Instance(0, [0.0, 2.0], [[20, 3, 0], [20, 3 + 2 * speed, 0]], [[0, 0, 0, 1]] * 2,
                                    object_id=9, name="/World/Car"))
    # sensor yawed by 90° (x forward = world +y): the car ahead-right moves toward +x_sensor
    yaw = quat_from_axis_angle([0, 0, 1], np.pi / 2)
    lid = Lidar(config=solid_state(np.linspace(-89, -60, 30), 0.0), scene=scene, device=device,
                trajectory=Trajectory([0.0], [[0, 0, 0]], [yaw]))
    pc = lid.render(0.0, 0.1)
    n = pc.numpy()
    on_car = n["SemanticId"] == scene.semantic_class_index("car")
    assert on_car.sum() >= 3 and (~on_car).sum() >= 3
    # car velocity world +y = sensor +x
    np.testing.assert_allclose(n["Velocity"][on_car], np.tile([speed, 0, 0], (on_car.sum(), 1)), atol=1e-2)
    np.testing.assert_allclose(n["Velocity"][~on_car], 0.0, atol=1e-3)
    # HitNormal in sensor axes: the car face x=18 (world −x normal) → sensor +y; room wall x=100 → sensor +y too
    # (a grazing ray may hit the car's side y = y_c − 1, world −y → sensor −x)
    nc = n["HitNormal"][on_car]
    front = np.abs(nc - [0, 1, 0]).max(axis=1) < 1e-5
    side = np.abs(nc - [-1, 0, 0]).max(axis=1) < 1e-5
    assert np.all(front | side) and front.sum() > side.sum()
    np.testing.assert_allclose(pc.xyz()[on_car][front, 1], -18.0, atol=1e-3)  # the x=18 face is 18 m to the right
    np.testing.assert_allclose(n["HitNormal"][~on_car], np.tile([0, 1, 0], ((~on_car).sum(), 1)), atol=1e-5)


# --------------------------------------------------------------------------------------------------- echoes
def _edge_scene(gap: float, rho_near=0.1, rho_far=0.9):
    s = empty_scene()
    p, f = quad_mesh([10.0, 2.5, 0], [0, 2.5, 0], [0, 0, 3])  # near box face, x=10, y in [0, 5] (edge at y=0)
    add_static(s, p, f, name="near", reflectance=rho_near)
    p, f = quad_mesh([10.0 + gap, 0, 0], [0, 10, 0], [0, 0, 10])  # far wall
    add_static(s, p, f, name="far", reflectance=rho_far)
    return s


@pytest.mark.parametrize("ray_type", ["GAUSSIAN_BEAM", "UNIFORM_BEAM"])
def test_beam_on_edge_two_echoes_or_one_merged(device, ray_type):
    cfg = solid_state([0.0], 0.0, ray_type=RayType(ray_type), max_returns=2, divergence_hor_deg=2.0,
                      divergence_ver_deg=2.0, min_dist_between_echos_m=0.4)
    far = Lidar(config=cfg, scene=_edge_scene(2.0), trajectory=STATIC, device=device).render(0.0, 0.1).numpy()
    assert far["Counts"][0] == 2
    r = np.linalg.norm(far["Coordinates"], axis=0)
    # strongest first: the bright far wall (ρ 0.9 at 12 m) beats the dark near edge (ρ 0.1 at 10 m)
    assert list(far["EchoId"]) == [0, 1]
    assert abs(r[0] - 12.0) < 0.05 and abs(r[1] - 10.0) < 0.05
    assert far["Intensity"][0] > far["Intensity"][1]
    # with the wall 0.2 m behind the edge the two surfaces merge into one echo between them
    near = Lidar(config=cfg, scene=_edge_scene(0.2), trajectory=STATIC, device=device).render(0.0, 0.1).numpy()
    assert near["Counts"][0] == 1
    rm = np.linalg.norm(near["Coordinates"], axis=0)[0]
    assert 10.02 < rm < 10.2


def test_nearest_is_echo0_when_stronger(device):
    cfg = solid_state([0.0], 0.0, ray_type=RayType.GAUSSIAN_BEAM, max_returns=2, divergence_hor_deg=2.0,
                      divergence_ver_deg=2.0)
    n = Lidar(config=cfg, scene=_edge_scene(2.0, rho_near=0.9, rho_far=0.1), trajectory=STATIC,
              device=device).render(0.0, 0.1).numpy()
    r = np.linalg.norm(n["Coordinates"], axis=0)
    assert n["Counts"][0] == 2 and abs(r[0] - 10.0) < 0.05 and abs(r[1] - 12.0) < 0.05


def test_glass_pane_gives_second_idealized_return(device):
    s = empty_scene()
    p, f = quad_mesh([5.0, 0, 0], [0, 3, 0], [0, 0, 3])
    add_static(s, p, f, name="glass", base="clear_glass", attributes=["visually_transparent"])
    p, f = quad_mesh([10.0, 0, 0], [0, 10, 0], [0, 0, 10])
    add_static(s, p, f, name="wall", base="concrete")
    cfg = solid_state([0.0, 5.0], 0.0, max_returns=3)
    n = Lidar(config=cfg, scene=s, trajectory=STATIC, device=device).render(0.0, 0.1).numpy()
    r = np.linalg.norm(n["Coordinates"], axis=0)
    assert n["Counts"][0] == 4
    np.testing.assert_allclose(r[n["EmitterId"] == 0], [5.0, 10.0], atol=1e-3)
    assert list(n["EchoId"][n["EmitterId"] == 0]) == [0, 1]
    from wsim.scene.materials import encode_material_id

    assert n["MaterialId"][0] == encode_material_id("clear_glass", "none", ["visually_transparent"])
    # an opaque wall ends the ray: no third echo
    cfg1 = solid_state([0.0], 0.0, max_returns=1)
    assert Lidar(config=cfg1, scene=s, trajectory=STATIC).render(0.0, 0.1).count == 1


# --------------------------------------------------------------------------------------------------- intensity
def _plane_scene(d=10.0, rho=0.5):
    s = empty_scene()
    p, f = quad_mesh([d, 0, 0], [0, 100, 0], [0, 0, 100])
    add_static(s, p, f, name="target", reflectance=rho)
    return s


def test_intensity_processing_on_lambertian_plane(device):
    from wsim.sensors.lidar_config import IntensityProcessing as IP

    angles = np.array([0.0, 20.0, 40.0, 60.0])
    rho = 0.5
    res = {}
    for mode in IP:
        cfg = solid_state(angles, 0.0, intensity_processing=mode)
        res[mode] = Lidar(config=cfg, scene=_plane_scene(rho=rho), trajectory=STATIC,
                          device=device).render(0.0, 0.1).numpy()
    cos = np.cos(np.deg2rad(angles))
    r = 10.0 / cos
    np.testing.assert_allclose(res[IP.NORMALIZATION]["Intensity"], rho * cos, rtol=1e-4)
    np.testing.assert_allclose(res[IP.RAW]["Intensity"], rho * cos / r**2, rtol=1e-4)
    np.testing.assert_allclose(res[IP.CORRECTION]["Intensity"], rho, rtol=1e-4)
    # RAW falls as 1/r² with distance at normal incidence
    raw = [Lidar(config=solid_state([0.0], 0.0, intensity_processing=IP.RAW), scene=_plane_scene(d, rho),
                 trajectory=STATIC).render(0.0, 0.1).numpy()["Intensity"][0] for d in (5.0, 10.0, 20.0)]
    np.testing.assert_allclose(np.array(raw) * np.array([25.0, 100.0, 400.0]), rho, rtol=1e-4)


def test_smooth_normals_make_intensity_continuous_on_a_sphere(device):
    """A 24 × 12 UV sphere (faces share vertices) seen by a 57 × 57 fan: with smooth normals (smoothNormals) the
    NORMALIZATION intensity ρ·|cos θ| follows the sphere's own normal about ten times closer than with the faces'
    normals, and neighbouring returns no longer jump at the facets' creases; HitNormal stays the face's normal. The
    room's box (faces sharing corner vertices at 90°) keeps its flat shading: its creases are beyond the angle."""
    c, rho = np.array([10.0, 0.0, 0.0]), 0.5
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    p, f = uv_sphere(c, 3.0)
    add_static(scene, p, f, name="ball", reflectance=rho)
    az, el = np.meshgrid(np.linspace(-14, 14, 57), np.linspace(-14, 14, 57))
    res = {}
    for smooth in (False, True):
        cfg = solid_state(az.ravel(), el.ravel(), smooth_normals=smooth)
        res[smooth] = Lidar(config=cfg, scene=scene, trajectory=STATIC, device=device).render(0.0, 0.1).numpy()
    flat, smooth = res[False], res[True]
    np.testing.assert_array_equal(smooth["Coordinates"], flat["Coordinates"])
    np.testing.assert_array_equal(smooth["HitNormal"], flat["HitNormal"])
    xyz = flat["Coordinates"].T
    ball = np.linalg.norm(xyz - c, axis=1) < 3.01
    assert 1500 < ball.sum() < len(xyz)
    d = xyz / np.linalg.norm(xyz, axis=1, keepdims=True)
    n = (xyz - c) / np.linalg.norm(xyz - c, axis=1, keepdims=True)
    cos = np.abs(np.sum(d * n, axis=1))
    err = {k: np.abs(v["Intensity"][ball] / rho - cos[ball]) for k, v in res.items()}
    rms = {k: float(np.sqrt(np.mean(e ** 2))) for k, e in err.items()}
    assert rms[True] < 0.006 and err[True].max() < 0.025, rms  # measured 0.0045 rms, 0.017 max
    assert rms[False] > 5 * rms[True], rms  # flat: 0.045 rms, 0.13 max
    # neighbouring emitters (0.5° apart) along each row of the fan, both on the ball: the largest step of the
    # intensity beyond the step of ρ·|cos θ| itself (a jump at a crease)
    both = (ball.reshape(57, 57)[:, 1:] & ball.reshape(57, 57)[:, :-1])
    dcos = np.diff(cos.reshape(57, 57), axis=1)
    jump = {k: np.abs(np.diff(v["Intensity"].reshape(57, 57) / rho, axis=1) - dcos)[both].max()
            for k, v in res.items()}
    assert jump[True] < 0.25 * jump[False], jump
    # the walls: flat either way
    np.testing.assert_allclose(smooth["Intensity"][~ball], flat["Intensity"][~ball], rtol=1e-6)


def test_dark_target_beyond_detection_range_is_dropped(device):
    cfg = solid_state([0.0], 0.0, min_reflectance=0.1, min_reflection_range_m=100.0)
    assert Lidar(config=cfg, scene=_plane_scene(150.0, rho=0.05), trajectory=STATIC,
                 device=device).render(0.0, 0.1).count == 0
    # a bright target at the same distance is detected (0.9/150² > 0.1/100²)
    assert Lidar(config=cfg, scene=_plane_scene(150.0, rho=0.9), trajectory=STATIC).render(0.0, 0.1).count == 1
    cfg.include_invalid_points = True
    pc = Lidar(config=cfg, scene=_plane_scene(150.0, rho=0.05), trajectory=STATIC).render(0.0, 0.1)
    assert pc.count == 1 and not pc.valid[0] and pc.value("compactionType") == 1
    assert pc["EmitterId"].numpy()[0] == 0


def test_a_render_delivers_every_fired_slot_in_firing_order_and_the_valid_ones_alone(device):
    """With includeInvalidPoints a render delivers every echo slot of every fired emitter, firing by firing and echo
    by echo (returns through the glass pane, returns below the detection threshold and blank slots as invalid
    points); without it, exactly the valid ones of those, in the same order, bit for bit. (5 emitters × 363 ticks:
    the kernel's batches of firings straddle ticks and the last one is short.)"""
    ticks, n_el, mr = 363, 5, 3
    cfg = rotary(n_el=n_el, ticks=ticks, max_returns=mr, min_reflectance=0.2, min_reflection_range_m=30.0)
    lid = Lidar(config=cfg, scene=_glass_room(), trajectory=STATIC, device=device)
    every = lid.with_config(include_invalid_points=True).render(0.0, 0.1)
    n = every.numpy()
    assert every.count == ticks * n_el * mr and every.value("compactionType") == 1
    np.testing.assert_array_equal(n["EchoId"], np.tile(np.arange(mr), ticks * n_el))
    np.testing.assert_array_equal(n["EmitterId"], np.repeat(np.tile(np.arange(n_el), ticks), mr))
    assert np.all(np.diff(n["TimeOffsetNs"].astype(np.int64)) >= 0)
    ok = every.valid
    blank = np.all(n["Coordinates"] == 0, axis=0) & (n["Intensity"] == 0)
    assert (ok & (n["EchoId"] == 1)).sum() > 100  # through the glass
    assert (~ok & ~blank).sum() > 100 and (~ok & blank).sum() > 100  # below the threshold; no surface at all
    valid = lid.render(0.0, 0.1)
    assert valid.count == ok.sum() and valid.value("compactionType") == 2
    for k, v in valid.numpy().items():
        if k != "Counts":
            np.testing.assert_array_equal(v, n[k][:, ok] if k == "Coordinates" else n[k][ok], err_msg=k)


# --------------------------------------------------------------------------------------------------- scans
def _sorted(n):
    order = np.lexsort((n["EchoId"], n["EmitterId"], n["TimeOffsetNs"]))
    return {k: v[order] if k != "Coordinates" else v[:, order] for k, v in n.items() if k != "Counts"}


def test_partial_outputs_slices_add_up_to_the_scan(device):
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    traj = Trajectory([0.0, 1.0], [[0, 0, 0], [3, 1, 0]], [[0, 0, 0, 1]] * 2)
    whole_lidar = Lidar(config=rotary(n_el=4, ticks=100, output_frame_of_reference=__import__(
        "wsim").sensors.lidar_config.FrameOfReference.WORLD), scene=scene, trajectory=traj, device=device)
    counts = [whole_lidar.render(a, a + 0.03).count for a in (0.0, 0.03, 0.06)]
    assert counts == [0, 0, 0]
    whole = whole_lidar.render(0.09, 0.12)
    assert whole.count == 400 and whole.value("timestampNs") == 0
    assert whole_lidar.frame_id == 4
    part_lidar = whole_lidar.with_config(partial_outputs=True)
    slices = [part_lidar.render(a, a + 0.025) for a in (0.0, 0.025, 0.05, 0.075)]
    assert all(s.count > 0 for s in slices) and sum(s.count for s in slices) == 400
    # same points: WORLD coordinates do not depend on the frame's timestamp
    cat = {k: np.concatenate([s.numpy()[k] for s in slices], axis=-1 if k == "Coordinates" else 0)
           for k in ("Coordinates", "EmitterId", "TickId", "EchoId")}
    a = np.lexsort((cat["EmitterId"], cat["TickId"]))
    w = whole.numpy()
    b = np.lexsort((w["EmitterId"], w["TickId"]))
    np.testing.assert_array_equal(cat["TickId"][a], w["TickId"][b])
    np.testing.assert_allclose(cat["Coordinates"][:, a], w["Coordinates"][:, b], atol=1e-5)
    # a slice's offsets are relative to its own start
    assert slices[1].value("timestampNs") == 25_000_000 and slices[1]["TimeOffsetNs"].numpy().min() >= 0


def test_instant_lidar_offsets_are_zero(device):
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    lid = Lidar(config=rotary(n_el=4, ticks=100, instant_lidar=True, partial_outputs=True), scene=scene,
                trajectory=STATIC, device=device)
    pc = lid.render(0.02, 0.05)
    assert pc.count == 400 and np.all(pc["TimeOffsetNs"].numpy() == 0)
    assert pc.value("timestampNs") == 20_000_000 and pc.value("frameEndTimeStampNs") == 50_000_000


# --------------------------------------------------------------------------------------------------- ids
def test_material_id_and_stable_object_id(device):
    def render():
        scene = box_room_scene(ROOM_LO, ROOM_HI, base="steel", coating="paint", attributes=["retroreflective"])
        return Lidar(config=rotary(n_el=2, ticks=50), scene=scene, trajectory=STATIC,
                     device=device).render(0.0, 0.1).numpy()

    a, b = render(), render()
    assert np.all(a["MaterialId"] == 4354)
    assert np.array_equal(a["ObjectId"], b["ObjectId"])
    assert np.all(a["ObjectId"][:, :3] != 0) and np.all(a["ObjectId"][:, 3] == 0)
    assert len(np.unique(a["ObjectId"], axis=0)) == 1


def test_renders_are_bit_identical_with_seeded_noise(device):
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    cfg = rotary(n_el=8, ticks=400, ray_type=RayType.GAUSSIAN_BEAM, max_returns=2, range_accuracy_m=0.02,
                 azimuth_error_std=0.05, elevation_error_std=0.05, seed=7)
    a = Lidar(config=cfg, scene=scene, trajectory=STATIC, device=device).render(0.0, 0.1).numpy()
    b = Lidar(config=cfg, scene=scene, trajectory=STATIC, device=device).render(0.0, 0.1).numpy()
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    # the noise is real: ranges scatter around the analytic distance by about σ
    r = np.linalg.norm(a["Coordinates"], axis=0)
    assert 0.01 < np.std(r - np.linalg.norm(Lidar(config=rotary(n_el=8, ticks=400), scene=scene,
                                                   trajectory=STATIC).render(0.0, 0.1).xyz(), axis=1)) < 0.05


def test_a_held_point_cloud_is_never_overwritten_and_a_dropped_one_is_reused(device):
    """Delivered channels live in memory the lidar reuses only once every array of that render is gone."""
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    traj = Trajectory([0.0, 1.0], [[0, 0, 0], [10.0, 0, 0]], [[0, 0, 0, 1]] * 2)
    lid = Lidar(config=rotary(n_el=8, ticks=400), scene=scene, trajectory=traj, device=device)
    first = lid.render(0.0, 0.1)
    kept = {k: v.copy() for k, v in first.numpy().items()}
    xyz = first["Coordinates"].numpy()  # a view: holds the block as the point cloud would
    ptr = first["Coordinates"].ptr
    del first
    for k in range(1, 4):  # later scans elsewhere (the sensor moves): other values
        later = lid.render(k * 0.1, (k + 1) * 0.1)
        assert later["Coordinates"].ptr != ptr
        assert not np.array_equal(later["Coordinates"].numpy(), kept["Coordinates"])
        np.testing.assert_array_equal(xyz, kept["Coordinates"])
    del later, xyz
    again = lid.render(0.0, 0.1)  # the dropped first block serves again, with the first render's values
    assert again["Coordinates"].ptr == ptr
    del lid  # the point cloud outlives its lidar
    for k, v in again.numpy().items():
        np.testing.assert_array_equal(v, kept[k], err_msg=k)


def test_firing_rays_hand_the_render_buffers_on(device):
    """Lidar.firing_rays works in a render's scratch buffers and hands them back: the renders after it reuse the
    slot buffers of the render before (no fresh allocation, page by page, each step a benchmark asks for rays)."""
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    lid = Lidar(config=rotary(n_el=8, ticks=400), scene=scene, trajectory=STATIC, device=device)
    lid.render(0.0, 0.1)
    ptr = lid._scratch_pool[-1].slots.flags.ptr  # noqa: SLF001 - the buffers a later render takes
    for k in range(1, 4):
        assert len(lid.firing_rays(k * 0.1, (k + 1) * 0.1)["time"]) == 3200
        lid.render(k * 0.1, (k + 1) * 0.1)
        assert lid._scratch_pool[-1].slots.flags.ptr == ptr  # noqa: SLF001


def test_firing_rays_are_the_rays_the_render_traces(device):
    """Lidar.firing_rays: one world ray per firing (and sub-ray) in firing order, at the firing's time and pose."""
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    traj = Trajectory([0.0, 1.0], [[0, 0, 0], [15.0, 0, 0]], [[0, 0, 0, 1], [0, 0, 0.2588190, 0.9659258]])
    cfg = rotary(n_el=8, ticks=400, include_invalid_points=True)
    from wsim.sensors.lidar_config import FrameOfReference

    lid = Lidar(config=cfg, scene=scene, trajectory=traj, device=device).with_config(
        output_frame_of_reference=FrameOfReference.WORLD)
    frame_id = lid.frame_id
    rays = lid.firing_rays(0.0, 0.1)
    assert lid.frame_id == frame_id  # not a delivered frame
    n = 8 * 400
    assert rays["origin"].shape == (n, 3) and rays["fires"].sum() == n
    np.testing.assert_allclose(np.linalg.norm(rays["direction"], axis=1), 1.0, atol=1e-6)
    pc = lid.render(0.0, 0.1)
    # the rays end on the render's world points (maxReturns 1, invalid points kept: one row per firing), at the
    # analytic room distance, and the firing times are the TimeOffsetNs of those points
    np.testing.assert_allclose(rays["time"], pc["TimeOffsetNs"].numpy() * 1e-9, atol=1e-7)
    d = rays["direction"].astype(np.float64)
    t = room_distance(rays["origin"].astype(np.float64), np.where(d == 0.0, 1e-30, d))
    end = rays["origin"] + rays["direction"] * t[:, None]
    np.testing.assert_allclose(pc.xyz(), end, atol=2e-3)
    # the sensor moves and turns over the sweep: the rays are not one fan
    assert np.ptp(rays["origin"][:, 0]) > 1.4
    beam = lid.with_config(ray_type=RayType.GAUSSIAN_BEAM, beam_samples=7).firing_rays(0.0, 0.1)
    assert beam["origin"].shape == (7 * n, 3)
    np.testing.assert_array_equal(beam["origin"][::7], rays["origin"])
    np.testing.assert_array_equal(beam["direction"][::7], rays["direction"])  # sub-ray 0 is the centre
    cone = np.degrees(np.arccos(np.clip(np.sum(beam["direction"].reshape(n, 7, 3) * rays["direction"][:, None], -1),
                                        -1, 1)))
    assert 0.0 < cone[:, 1:].min() and cone.max() < max(cfg.divergence_hor_deg, cfg.divergence_ver_deg)


@pytest.mark.parametrize("ray_type", [RayType.IDEALIZED, RayType.GAUSSIAN_BEAM])
def test_a_channel_subset_equals_those_channels_of_the_full_render(device, ray_type):
    """Channels nobody asked for are skipped, and the ones delivered are bit-identical to the full render's."""
    scene = _glass_room()
    traj = Trajectory([0.0, 1.0], [[0, 0, 0], [10.0, 0, 0]], [[0, 0, 0, 1]] * 2)
    cfg = rotary(n_el=8, ticks=400, ray_type=ray_type, max_returns=2, range_accuracy_m=0.01, seed=3,
                 include_invalid_points=True)
    full = Lidar(config=cfg, scene=scene, trajectory=traj, device=device).render(0.0, 0.1).numpy()
    for chans in (["Coordinates", "Intensity"], ["Velocity"], ["HitNormal", "ObjectId", "SemanticId"],
                  ["MaterialId", "Velocity", "EmitterId"]):
        sub = Lidar(config=cfg, scene=scene, trajectory=traj, channels=chans, device=device).render(0.0, 0.1).numpy()
        assert set(sub) == {"Counts", "Flags", *chans}
        for k in sub:
            np.testing.assert_array_equal(sub[k], full[k], err_msg=k)
    assert np.abs(full["Velocity"]).max() > 9.0  # the channels compared are not all zero


def _glass_room():
    """The box room with a clear glass pane across +x (two echoes for the emitters that look through it)."""
    s = box_room_scene(ROOM_LO, ROOM_HI)
    p, f = quad_mesh([10.0, 0, 0], [0, 8, 0], [0, 0, 4])
    add_static(s, p, f, name="glass", base="clear_glass", attributes=["visually_transparent"])
    return s


@pytest.mark.parametrize("ray_type,cars", [("GAUSSIAN_BEAM", 1), ("UNIFORM_BEAM", 1), ("GAUSSIAN_BEAM", 40)])
def test_beam_packets_equal_sub_rays_traced_one_by_one(device, ray_type, cars, monkeypatch, unbaked):
    """On the CPU a beam's sub-rays find their first static surfaces in one packet traversal, and the instances
    they may meet are listed once per beam (up to 32 instances; more: the top-level BVH per sub-ray): every channel
    is bit-identical to tracing them one by one (glass pane: continuing sub-rays; moving cars: instances; the
    room's edges and corners: shared-edge and grazing hits; the parked cars traced as instances, not baked)."""
    import wsim.sensors.lidar as lidar_module

    scene = _glass_room()
    bp, bf = box_mesh([-2, -1, -1], [2, 1, 1])
    scene.parts.append(Part("/World/Car/body", material=1, semantic_class=scene.semantic_class_index("car")))
    scene.prototypes.append(MeshData(bp, bf, len(scene.parts) - 1))
    for k in range(cars):  # the first drives past the sensor, the others are parked around the room
        a = 2 * np.pi * k / cars
        p0 = [6, -4, -1.0] if k == 0 else [18 * np.cos(a), 14 * np.sin(a), -1.0 + 0.3 * (k % 3)]
        p1 = [6, 4, -1.0] if k == 0 else p0
        scene.instances.append(Instance(0, [0.0, 1.0], [p0, p1], [quat_from_axis_angle([0, 0, 1], a)] * 2,
                                        object_id=9 + k, name=f"/World/Car{k}"))
    traj = Trajectory([0.0, 1.0], [[0, 0, 0], [3.0, 0, 0]], [[0, 0, 0, 1]] * 2)
    cfg = rotary(n_el=16, ticks=720, ray_type=RayType(ray_type), max_returns=3, divergence_hor_deg=1.0,
                 divergence_ver_deg=1.0, range_accuracy_m=0.01, seed=5, include_invalid_points=True)

    def render(packets: bool) -> dict:
        monkeypatch.setattr(lidar_module, "BEAM_PACKETS", packets)
        return Lidar(config=cfg, scene=scene, trajectory=traj, device=device).render(0.0, 0.1).numpy()

    one, packed = render(False), render(True)
    assert set(one) == set(packed)
    for k in one:
        np.testing.assert_array_equal(packed[k], one[k], err_msg=k)
    car = one["SemanticId"] == scene.semantic_class_index("car")
    assert car.sum() > 10 and (one["EchoId"] == 1).sum() > 100  # the car and the glass were seen


def _room_with_cars(cars: int):
    """The glass room with a car driving past the sensor and ``cars - 1`` parked around the room."""
    scene = _glass_room()
    bp, bf = box_mesh([-2, -1, -1], [2, 1, 1])
    scene.parts.append(Part("/World/Car/body", material=1, semantic_class=scene.semantic_class_index("car")))
    scene.prototypes.append(MeshData(bp, bf, len(scene.parts) - 1))
    for k in range(cars):
        a = 2 * np.pi * k / cars
        p0 = [6, -4, -1.0] if k == 0 else [18 * np.cos(a), 14 * np.sin(a), -1.0 + 0.3 * (k % 3)]
        p1 = [6, 4, -1.0] if k == 0 else p0
        scene.instances.append(Instance(0, [0.0, 1.0], [p0, p1], [quat_from_axis_angle([0, 0, 1], a)] * 2,
                                        object_id=9 + k, name=f"/World/Car{k}"))
    return scene


@pytest.mark.parametrize("sensor", ["rotary", "solid", "PANDAR128", "AT128"])
def test_idealized_first_packets_equal_firings_traced_one_by_one(device, sensor, monkeypatch):
    """On the CPU an IDEALIZED lidar's first rays are traced in groups of neighbouring firings as multi-origin
    packets (one emitter over consecutive ticks of a moving, spinning head; neighbours along a row of a solid state's
    grid): every channel is bit-identical to tracing each firing alone (glass pane: second echoes; moving and parked
    cars: instances; the room's edges and corners: shared-edge and grazing hits; the presets' real angle, offset and
    timing tables; a tick count that is no multiple of the group)."""
    import wsim.sensors.lidar as lidar_module

    scene = _room_with_cars(6)
    traj = Trajectory([0.0, 1.0], [[0, 0, 0], [3.0, 0.5, 0]], [quat_from_axis_angle([0, 0, 1], a) for a in (0.0, 0.3)])
    if sensor == "rotary":
        cfg = rotary(n_el=16, ticks=725, max_returns=2, include_invalid_points=True)
    elif sensor == "solid":
        az, el = np.meshgrid(np.linspace(-40, 40, 161), np.linspace(-12, 12, 25))
        cfg = solid_state(az.reshape(-1), el.reshape(-1), max_returns=2, elements_coords_type="SPHERICAL")
    else:
        cfg = Lidar.preset(sensor).config
        cfg.max_returns = 2

    def render(packets: bool) -> dict:
        monkeypatch.setattr(lidar_module, "FIRST_PACKETS", packets)
        return Lidar(config=cfg, scene=scene, trajectory=traj, device=device).render(0.05, 0.15).numpy()

    one, packed = render(False), render(True)
    assert set(one) == set(packed)
    for k in one:
        np.testing.assert_array_equal(packed[k], one[k], err_msg=k)
    assert (one["SemanticId"] == scene.semantic_class_index("car")).sum() > 10  # the cars were seen
    assert (one["EchoId"] == 1).sum() > 10  # and through the glass


@pytest.mark.parametrize("sensor", ["rotary", "solid"])
def test_first_surface_groups_span_their_angle_and_split_at_axis_planes_and_row_ends(sensor, monkeypatch):
    """A first-surface group is as many neighbouring firings as span FIRST_SPAN_DEG (a solid state's grid of 0.5°
    steps: 9 a row; a spinning head of 0.5° ticks: 9 ticks), and a group whose rays cross an axis plane (straight
    ahead, the horizon) or the end of a row is traced as one packet per run of coherent rays: only runs of a single
    ray are left to the firing kernel (FIRST_UNKNOWN). Before, a group was 16 firings whatever their spacing (here 8°:
    none was traced as a packet, every firing was left to the firing kernel) and one across an axis plane or a row's
    end was left whole."""
    import wsim.launch as launch_module

    if sensor == "solid":  # (no ray exactly along an axis plane: such a ray is coherent with none)
        az, el = np.meshgrid(np.linspace(-40, 40, 161) + 0.25, np.linspace(-12, 12, 25) + 0.25)
        cfg = solid_state(az.reshape(-1), el.reshape(-1))
    else:
        cfg = rotary(n_el=16, ticks=720)
        cfg.emitter_states[0].elevation_deg += 0.25
    lid = Lidar(config=cfg, scene=_room_with_cars(3), trajectory=STATIC, device="cpu")
    assert lid._first_group() == int(K.FIRST_SPAN_DEG // 0.5) == 9
    seen = {}
    real = launch_module.launch

    def recording(kernel, dim, inputs, outputs, **kw):  # the real launch; keeps the first-surface answers
        real(kernel, dim, inputs, outputs, **kw)
        if kernel is K.lidar_first_kernel:
            seen["first"] = outputs[0].numpy().copy()

    monkeypatch.setattr(launch_module, "launch", recording)
    n = lid.render(0.0, 0.1).count
    slot = seen["first"][:, 1]
    assert n == len(slot)  # the room is closed: every firing returns
    unknown = (slot == K.FIRST_UNKNOWN).mean()
    assert unknown < 0.01, unknown
    assert ((slot >= 0) | (slot == K.FIRST_BEYOND)).mean() > 0.99


def test_noise_is_keyed_by_firing_whatever_the_slicing_or_threads(device, monkeypatch):
    """Noise is drawn per (seed, scan, tick, emitter, echo): partialOutputs slices, the whole scan and any thread
    count deliver bit-identical returns, noise included."""
    traj = Trajectory([0.0, 1.0], [[0, 0, 0], [3, 1, 0]], [quat_from_axis_angle([0, 0, 1], a) for a in (0.0, 0.2)])
    cfg = rotary(n_el=4, ticks=1800, max_returns=2, range_accuracy_m=0.05, azimuth_error_std=0.1,
                 elevation_error_std=0.1, seed=11)
    lid = Lidar(config=cfg, scene=_glass_room(), trajectory=traj, device=device)

    def frames(lidar, steps, threads=None):
        if threads is not None:
            monkeypatch.setenv("WSIM_NUM_THREADS", str(threads))
        out = [lidar.render(a, b) for a, b in steps]
        monkeypatch.delenv("WSIM_NUM_THREADS", raising=False)
        return out

    def joined(pcs):
        parts = [pc.numpy() for pc in pcs if pc.count]
        cat = {k: np.concatenate([p[k] for p in parts], axis=-1 if k == "Coordinates" else 0)
               for k in parts[0] if k != "Counts"}
        # absolute firing times: each frame's offsets are relative to its own start
        cat["TimeOffsetNs"] = np.concatenate([p["TimeOffsetNs"].astype(np.int64) + pc.value("timestampNs")
                                              for p, pc in zip(parts, [q for q in pcs if q.count])])
        order = np.lexsort((cat["EchoId"], cat["EmitterId"], cat["TickId"]))
        return {k: v[..., order] if k == "Coordinates" else v[order] for k, v in cat.items()}

    whole = joined(frames(lid, [(0.05, 0.1)], threads=1))
    assert len(whole["EchoId"]) > 4 * 1800 and (whole["EchoId"] == 1).sum() > 100  # glass: second echoes
    whole2 = joined(frames(lid.with_config(), [(0.05, 0.1)], threads=2))
    slices = joined(frames(lid.with_config(partial_outputs=True),
                           [(0.0, 0.013), (0.013, 0.05), (0.05, 0.0871), (0.0871, 0.1)], threads=2))
    for other in (whole2, slices):
        assert set(other) == set(whole)
        for k in whole:
            assert whole[k].tobytes() == other[k].tobytes(), (k, other is slices)


def test_consecutive_scans_draw_independent_noise(device):
    """Two consecutive scans' range noise is uncorrelated at every lag (the noise is not a shifted copy)."""
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    sigma = 0.02
    kw = dict(scene=scene, trajectory=STATIC, device=device, elements_coords_type="SPHERICAL")
    noisy = Lidar.preset("PANDAR128", range_accuracy_m=sigma, seed=5, **kw)
    exact = Lidar.preset("PANDAR128", **kw).render(0.0, 0.1).numpy()["Coordinates"][2]
    noise = []
    for t0 in (0.0, 0.1):
        n = noisy.render(t0, t0 + 0.1).numpy()
        assert n["Counts"][0] == 128 * 1800 and np.array_equal(n["TickId"], np.repeat(np.arange(1800), 128))
        noise.append(n["Coordinates"][2].astype(np.float64) - exact)
    a, b = ((x - x.mean()) / x.std() for x in noise)
    assert abs(np.std(noise[0]) - sigma) < 1e-3 and abs(np.std(noise[1]) - sigma) < 1e-3
    # circular cross-correlation at every lag (for independent noise its largest value is about 0.011 here)
    xc = np.fft.irfft(np.fft.rfft(a) * np.conj(np.fft.rfft(b)), n=len(a)) / len(a)
    assert abs(xc[0]) < 0.02 and np.abs(xc).max() < 0.02, (xc[0], np.abs(xc).max(), int(np.abs(xc).argmax()))


# --------------------------------------------------------------------------------------------------- USD prims
def _lidar_stage(path, **attrs):
    from pxr import Sdf, Usd, UsdGeom

    st = Usd.Stage.CreateNew(str(path))
    UsdGeom.SetStageUpAxis(st, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(st, 1.0)
    st.SetTimeCodesPerSecond(10)
    xf = UsdGeom.Xform.Define(st, "/World/Lidar")
    op = xf.AddTranslateOp()
    op.Set((0.0, 0.0, 0.0), 0)
    op.Set((2.0, 0.0, 0.0), 10)
    prim = xf.GetPrim()
    base = {
        "omni:sensor:Core:scanType": ("SOLID_STATE", Sdf.ValueTypeNames.Token),
        "omni:sensor:Core:scanRateBaseHz": (10.0, Sdf.ValueTypeNames.Float),
        "omni:sensor:Core:numberOfEmitters": (3, Sdf.ValueTypeNames.UInt),
        "omni:sensor:Core:numberOfChannels": (3, Sdf.ValueTypeNames.UInt),
        "omni:sensor:Core:elementsCoordsType": ("CARTESIAN", Sdf.ValueTypeNames.Token),
        "omni:sensor:Core:emitterState:s001:azimuthDeg": ([0.0, 10.0, -10.0], Sdf.ValueTypeNames.FloatArray),
        "omni:sensor:Core:emitterState:s001:elevationDeg": ([0.0, 0.0, 0.0], Sdf.ValueTypeNames.FloatArray),
        "omni:sensor:Core:emitterState:s001:fireTimeNs": ([0, 1000, 2000], Sdf.ValueTypeNames.IntArray),
    }
    base.update(attrs)
    for k, (v, t) in base.items():
        prim.CreateAttribute(k, t).Set(v)
    rp = st.DefinePrim("/Render/Products/LidarProduct", "RenderProduct")
    rp.CreateRelationship("camera").SetTargets(["/World/Lidar"])
    rp.CreateRelationship("orderedVars").SetTargets(["/Render/Vars/PointCloud"])
    var = st.DefinePrim("/Render/Vars/PointCloud", "RenderVar")
    var.CreateAttribute("sourceName", Sdf.ValueTypeNames.String).Set("PointCloud")
    var.CreateAttribute("channels", Sdf.ValueTypeNames.TokenArray).Set(["Coordinates", "Intensity", "Counts"])
    st.Save()
    return st


def test_lidar_from_prim_and_render_product(tmp_path):
    st = _lidar_stage(tmp_path / "lidar.usda")
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    lid = Lidar(st.GetPrimAtPath("/World/Lidar"), scene=scene)
    assert lid.config.scan_type is ScanType.SOLID_STATE and lid.config.number_of_emitters == 3
    pc = lid.render(0.0, 0.1)
    assert pc.count == 3 and "MaterialId" in pc.channels
    # the prim moves from x=0 (t=0) to x=2 (t=1 s): ranges to the wall x=40 shrink with the firing time
    np.testing.assert_allclose(pc.xyz()[0, 0], 40.0, atol=1e-3)
    prod = Lidar(str(tmp_path / "lidar.usda"), prim_path="/Render/Products/LidarProduct", scene=scene)
    pc2 = prod.render(0.0, 0.1)
    assert set(pc2.channels) == {"Counts", "Flags", "Coordinates", "Intensity"}
    np.testing.assert_allclose(pc2["Coordinates"].numpy(), pc["Coordinates"].numpy())


def test_smooth_normals_from_a_usd_prim_and_through_the_attributes(tmp_path):
    """``wsim:smoothNormals`` on a lidar prim written to a .usda file and read back switches smooth normals on, and
    LidarConfig.to_attributes / from_attributes carry it."""
    from pxr import Sdf

    st = _lidar_stage(tmp_path / "lidar.usda", **{"wsim:smoothNormals": (True, Sdf.ValueTypeNames.Bool)})
    st.GetRootLayer().Save()
    lid = Lidar(str(tmp_path / "lidar.usda"), prim_path="/World/Lidar")
    assert lid.config.smooth_normals is True
    assert Lidar(_lidar_stage(tmp_path / "plain.usda").GetPrimAtPath("/World/Lidar")).config.smooth_normals is False
    attrs = lid.config.to_attributes()
    assert attrs["wsim:smoothNormals"] is True
    assert LidarConfig.from_attributes(attrs).smooth_normals is True


@pytest.mark.parametrize(
    "attr, value, match",
    [
        ("omni:sensor:Core:emitterState:s001:azimuthDeg", [0.0, 1.0], "azimuthDeg: has 2 entries"),
        ("omni:sensor:Core:scanType", "HELICAL", "scanType: unknown token 'HELICAL'"),
        ("omni:sensor:Core:scanRateBaseHz", 0.3, "scanRateBaseHz"),
        ("omni:sensor:Core:rayType", "LASER", "rayType"),
        ("omni:sensor:Core:maxReturns", 0, "maxReturns"),
    ],
)
def test_bad_attributes_name_the_attribute(tmp_path, attr, value, match):
    from pxr import Sdf

    types = {list: Sdf.ValueTypeNames.FloatArray, str: Sdf.ValueTypeNames.Token, float: Sdf.ValueTypeNames.Float,
             int: Sdf.ValueTypeNames.UInt}
    st = _lidar_stage(tmp_path / "bad.usda", **{attr: (value, types[type(value)])})
    with pytest.raises(LidarConfigError, match=match) as e:
        Lidar(st.GetPrimAtPath("/World/Lidar"), scene=box_room_scene(ROOM_LO, ROOM_HI))
    assert "/World/Lidar" in str(e.value)


def test_unknown_attribute_warns_once(tmp_path):
    from pxr import Sdf

    st = _lidar_stage(tmp_path / "w.usda", **{"omni:sensor:Core:fooBar": (1.0, Sdf.ValueTypeNames.Float)})
    with pytest.warns(UserWarning, match="fooBar"):
        Lidar(st.GetPrimAtPath("/World/Lidar"), scene=box_room_scene(ROOM_LO, ROOM_HI))


# --------------------------------------------------------------------------------------------------- output
def test_point_cloud_writers_and_torch(tmp_path):
    import torch
    from plyfile import PlyData

    scene = box_room_scene(ROOM_LO, ROOM_HI)
    pc = Lidar(config=rotary(n_el=4, ticks=100), scene=scene, trajectory=STATIC).render(0.0, 0.1)
    pc.write_ply(tmp_path / "p.ply")
    ply = PlyData.read(str(tmp_path / "p.ply"))
    assert ply["vertex"].count == pc.count
    np.testing.assert_allclose(ply["vertex"]["x"], pc.xyz()[:, 0], rtol=1e-6)
    las = pc.to_las_array()
    assert las.shape == (400,) and np.all(las["return_number"] == 1) and np.all(las["number_of_returns"] == 1)
    t = pc.torch()
    assert isinstance(t["Intensity"], torch.Tensor) and t["Coordinates"].shape == (3, 400)
    # zero-copy: the tensor shares the Warp array's memory
    assert t["Intensity"].data_ptr() == pc["Intensity"].ptr
    assert pc.value("modality") == 1 and (pc["Flags"].numpy() & FLAG_VALID).all()


def test_params_are_typed_as_the_output_contract(device):
    """Every param is a NumPy array of the contract's dtype and shape (the ten scalars uint64/uint32/uint16 of shape
    [1]); ``value`` gives the scalars as ints."""
    from wsim.sensors.pointcloud import PARAMS

    scene = box_room_scene(ROOM_LO, ROOM_HI)
    scene.time_origin_us = 1_700_000_000_000_000  # a real epoch: timestamps beyond int32 and float64's ns precision
    lid = Lidar(config=rotary(n_el=2, ticks=50, include_invalid_points=True), scene=scene, trajectory=STATIC,
                device=device)
    lid.render(0.0, 0.04)
    pc = lid.render(0.04, 0.1)
    assert set(PARAMS) <= set(pc.params)
    for name, (dtype, shape) in PARAMS.items():
        v = pc.params[name]
        assert isinstance(v, np.ndarray) and v.dtype == np.dtype(dtype) and v.shape == shape, (name, v)
    scalars = [k for k, (_, shape) in PARAMS.items() if shape == (1,)]
    assert len(scalars) == 10
    start = 1_700_000_000_000_000_000
    assert pc.params["timestampNs"][0] == np.uint64(start) and pc.value("timestampNs") == start
    assert pc.value("frameEndTimeStampNs") == start + 100_000_000 and pc.value("frameId") == 2
    assert (pc.value("maxPoints"), pc.value("compactionType"), pc.value("coordsType")) == (pc.count, 1, 0)
    assert all(type(pc.value(k)) is int for k in scalars)
    # firing times stay exact in ns when added as ints
    t = pc.value("timestampNs") + pc["TimeOffsetNs"].numpy().astype(np.int64)
    assert t.dtype == np.int64 and t.min() == start


def test_azimuth_window_direction_and_custom_frame(device):
    from wsim.sensors.lidar_config import FrameOfReference

    scene = box_room_scene(ROOM_LO, ROOM_HI)
    base = rotary(n_el=1, ticks=360, valid_start_azimuth_deg=0.0, valid_end_azimuth_deg=90.0)
    cw = Lidar(config=base, scene=scene, trajectory=STATIC, device=device).render(0.0, 0.1)
    az = np.degrees(np.arctan2(cw.xyz()[:, 1], cw.xyz()[:, 0]))
    # firing angle in [0°, 90°] clockwise from +X → delivered azimuths in [−90°, 0°]
    assert 88 <= cw.count <= 92 and np.all((az <= 1e-3) & (az >= -90.0 - 1e-3))
    ccw = Lidar(config=base, scene=scene, trajectory=STATIC, device=device).with_config(
        rotation_direction="CCW").render(0.0, 0.1)
    az = np.degrees(np.arctan2(ccw.xyz()[:, 1], ccw.xyz()[:, 0]))
    assert np.all((az >= -1e-3) & (az <= 90.0 + 1e-3))
    # CUSTOM frame: world → custom = translation by (1, 2, 3)
    trafo = np.eye(4)
    trafo[:3, 3] = [1, 2, 3]
    pos = np.array([2.0, -1.0, 0.5])
    traj = Trajectory([0.0], [pos], [[0, 0, 0, 1]])
    world = Lidar(config=base, scene=scene, trajectory=traj).with_config(
        output_frame_of_reference=FrameOfReference.WORLD).render(0.0, 0.1).xyz()
    custom = Lidar(config=base, scene=scene, trajectory=traj).with_config(
        output_frame_of_reference=FrameOfReference.CUSTOM, custom_frame_of_reference_trafo=trafo).render(0.0, 0.1)
    np.testing.assert_allclose(custom.xyz(), world + [1, 2, 3], atol=1e-4)
    assert custom.value("frameOfReference") == 2


def test_emitter_offsets_distance_correction_and_quantization(device):
    scene = box_room_scene(ROOM_LO, ROOM_HI)
    cfg = solid_state([0.0, 90.0], 0.0, range_resolution_m=0.25)
    cfg.emitter_states[0].vert_offset_m[:] = [0.5, 0.0]
    cfg.emitter_states[0].hor_offset_m[:] = [0.0, 0.2]
    cfg.emitter_states[0].distance_correction_m[:] = [0.1, 0.0]
    pc = Lidar(config=cfg, scene=scene, trajectory=STATIC, device=device).render(0.0, 0.1)
    xyz = pc.xyz()
    # emitter 0 at z = 0.5 fires along +x: wall at 40 m, +0.1 m bias, quantised to 0.25 m → 40.0; the point keeps
    # the emitter's displacement
    np.testing.assert_allclose(xyz[0], [40.0, 0.0, 0.5], atol=1e-4)
    # emitter 1 fires along +y from 0.2 m out along its own azimuth: wall at y = 25 → range 24.8 → 24.75 quantised
    np.testing.assert_allclose(xyz[1], [0.0, 0.2 + 24.75, 0.0], atol=1e-4)


def test_config_overrides_accept_tokens_and_name_bad_ones():
    lid = Lidar.preset("PANDAR128", scene=box_room_scene(ROOM_LO, ROOM_HI), trajectory=STATIC,
                       output_frame_of_reference="WORLD", elements_coords_type="CARTESIAN", ray_type="UNIFORM_BEAM")
    from wsim.sensors.lidar_config import CoordsType, FrameOfReference

    assert lid.config.output_frame_of_reference is FrameOfReference.WORLD
    assert lid.config.elements_coords_type is CoordsType.CARTESIAN and lid.config.ray_type is RayType.UNIFORM_BEAM
    assert lid.with_config(max_returns=2).config.max_returns == 2
    with pytest.raises(LidarConfigError, match="output_frame_of_reference: unknown token 'MOON'"):
        lid.with_config(output_frame_of_reference="MOON")
    with pytest.raises(LidarConfigError, match="unknown lidar setting 'colour'"):
        Lidar.preset("AT128", colour="red")
    with pytest.raises(LidarConfigError, match="scanRateBaseHz"):
        lid.with_config(scan_rate_base_hz=0.1)


def test_frames_before_the_scene_origin_fire_with_the_pose_held():
    """One policy with the camera: outside the recorded trajectory the pose is held at the nearest key and every
    firing is delivered (a frame before t = 0 used to be empty, one across it half a sweep)."""
    import wsim

    scene = wsim.load_scene("builtin")
    lid = Lidar.preset("PANDAR128", scene=scene, rig=scene.ego_trajectory, mount=((1.0, 0, 1.9), (0, 0, 0, 1)),
                       partial_outputs=True)
    at0 = lid.render(0.0, 0.1)
    before = lid.render(-1.0, -0.9)  # the rig held at its first key
    earlier = lid.render(-2.0, -1.9)  # the same phase of the spin a second earlier: the same points
    assert abs(before.count - at0.count) < 0.02 * at0.count and at0.count > 100_000
    assert earlier.count == before.count
    np.testing.assert_array_equal(earlier["Coordinates"].numpy(), before["Coordinates"].numpy())
    assert earlier.value("timestampNs") == before.value("timestampNs") - 1_000_000_000
    across = lid.render(-0.05, 0.05)
    assert abs(across.count - at0.count) < 0.02 * at0.count
    with pytest.raises(ValueError, match="t0"):
        lid.render(1e8, 1e8 + 0.1)
    scene.time_origin_us = 0
    with pytest.raises(ValueError, match="before the zero"):
        lid.render(-1.0, -0.9)


@wp.kernel
def _atan2_kernel(y: wp.array[float], x: wp.array[float], out: wp.array[float]):
    i = wp.tid()
    out[i] = K.fast_atan2(y[i], x[i])


def test_fast_atan2_within_three_ulp_of_atan2_with_its_gradient(device):
    """The spherical output's atan2 (a polynomial, not libm) against float64 arctan2 of the same float32 inputs:
    within 3 ulp of the result (2.6e-7 rad) over 1 M points of every octant and radii 1e-3…1e3 m, exact on the axes
    and the diagonals' signs, 0 at (0, 0); its gradient (∂/∂y, ∂/∂x) equals (x, −y)/(x² + y²) within 1e-5."""
    rng = np.random.default_rng(5)
    n = 1_000_000
    ang = rng.uniform(-np.pi, np.pi, n)
    rad = 10.0 ** rng.uniform(-3.0, 3.0, n)
    x = (rad * np.cos(ang)).astype(np.float32)
    y = (rad * np.sin(ang)).astype(np.float32)
    t8 = np.float32(np.tan(np.pi / 8))  # the reduction's boundary, both sides
    edge_x = np.array([1, 0, -1, 0, 1, -1, 1, -1, 1, 1, 1, -1, 0, 0], np.float32)
    edge_y = np.array([0, 1, 0, -1, 1, 1, -1, -1, t8, np.nextafter(t8, 1), np.nextafter(t8, 0), -t8, 0, 0],
                      np.float32)
    edge_x[-1] = -0.0
    x, y = np.concatenate([x, edge_x]), np.concatenate([y, edge_y])
    ya = wp.array(y, dtype=float, device=device, requires_grad=True)
    xa = wp.array(x, dtype=float, device=device, requires_grad=True)
    out = wp.zeros(len(x), dtype=float, device=device, requires_grad=True)
    tape = wp.Tape()
    with tape:
        wp.launch(_atan2_kernel, len(x), [ya, xa], [out], device=device)
    got = out.numpy().astype(np.float64)
    ref = np.arctan2(y.astype(np.float64), x.astype(np.float64))
    ref[-1] = 0.0  # (0, −0): 0 here (libm: π)
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    ulp[np.abs(ref) == 0] = np.finfo(np.float32).tiny
    err = np.abs(got - ref) / ulp
    assert err.max() <= 3.0, (err.max(), x[err.argmax()], y[err.argmax()])
    # the axes and diagonals correctly rounded
    np.testing.assert_array_equal(got[n:n + 8], np.arctan2(edge_y[:8].astype(np.float64),
                                                           edge_x[:8].astype(np.float64)).astype(np.float32))
    assert got[-2] == 0.0 and got[-1] == 0.0
    tape.backward(grads={out: wp.ones(len(x), dtype=float, device=device)})
    r2 = x.astype(np.float64) ** 2 + y.astype(np.float64) ** 2
    ok = r2 > 0
    np.testing.assert_allclose(ya.grad.numpy()[ok], x[ok] / r2[ok], rtol=1e-5)
    np.testing.assert_allclose(xa.grad.numpy()[ok], -y[ok] / r2[ok], rtol=1e-5)


def test_typed_params_types_every_param_and_names_the_one_that_does_not_fit():
    """PointCloud params are NumPy arrays of the contract's dtype and shape; a value that does not fit (a negative
    or too large integer, a fraction for an integer, the wrong count) raises naming the param."""
    from wsim.sensors.pointcloud import typed_params

    out = typed_params({"frameId": 3, "maxPoints": 2**32 - 1, "frameStartPosM": [1.0, 2.0, 3.0],
                        "modelToAppTransform": np.eye(4), "compensationReference": "start"})
    assert out["frameId"].dtype == np.uint64 and out["frameId"].shape == (1,) and out["frameId"][0] == 3
    assert out["maxPoints"].dtype == np.uint32 and out["maxPoints"][0] == 2**32 - 1
    assert out["frameStartPosM"].dtype == np.float32 and out["frameStartPosM"].tolist() == [1.0, 2.0, 3.0]
    assert out["modelToAppTransform"].shape == (4, 4) and out["compensationReference"] == "start"
    for name, bad in (("timestampNs", -1), ("frameId", 1.5), ("frameStartPosM", [1.0, 2.0]), ("maxPoints", 2**32),
                      ("modality", np.array([1, 2])), ("frameOfReference", 70000)):
        with pytest.raises(ValueError, match=f"param {name}:"):
            typed_params({name: bad})
