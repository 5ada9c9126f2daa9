"""Packet traversal of the 8-wide BVH (:mod:`wsim.kernels.packet`): every ray of a packet gets exactly the result of
tracing it alone with :func:`wsim.kernels.widebvh.wide_closest` (t, slot, u, v bit for bit), on analytic scenes and
the built-in street block, for beam cones, wide lidar fans, grazing and axis-aligned rays, partial packets and
per-ray ranges."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from conftest import box_mesh, quad_mesh

from wsim.kernels.packet import (PACKET, group_kind, mat64x3, unit_dirs, vec64f, vec64i, wide_packet, wide_packet16,
                                 wide_packet_from)
from wsim.kernels.trace import LIST_COS, PACKET_COS, PRETEST_COS, WHOLE_COS, SceneGeo, tile_indices
from wsim.kernels.widebvh import wide_closest, wide_slot
from wsim.scene import Material, MeshData, Part, Scene
from wsim.scene.geometry import SceneGeometry


@wp.kernel
def _packet_vs_single(geo: SceneGeo, org: wp.array[wp.vec3], dirs: wp.array2d[wp.vec3], t_lo: wp.array2d[float],
                      t_hi: wp.array2d[float], n: wp.array[wp.int32], packet: wp.array2d[wp.vec4],
                      packet16: wp.array2d[wp.vec4], single: wp.array2d[wp.vec4]):
    b = wp.tid()
    d = mat64x3()
    lo = vec64f()
    hi = vec64f()
    for k in range(PACKET):
        v = dirs[b, k]
        d[k, 0] = v[0]
        d[k, 1] = v[1]
        d[k, 2] = v[2]
        lo[k] = t_lo[b, k]
        hi[k] = t_hi[b, k]
    res = wide_packet(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid, org[b], d,
                      lo, hi, n[b])
    r16 = wide_packet16(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid, org[b],
                        d, lo, hi, n[b])
    for k in range(PACKET):
        packet[b, k] = wp.vec4(res[k, 0], res[k, 1], res[k, 2], res[k, 3])
        packet16[b, k] = wp.vec4(r16[k, 0], r16[k, 1], r16[k, 2], r16[k, 3])
        w = wp.vec4(-1.0, -1.0, 0.0, 0.0)
        if k < n[b] and t_hi[b, k] > t_lo[b, k]:
            w = wide_closest(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid,
                             org[b] + dirs[b, k] * t_lo[b, k], dirs[b, k], t_hi[b, k] - t_lo[b, k])
            if w[1] < 0.0:
                w = wp.vec4(-1.0, -1.0, 0.0, 0.0)
        single[b, k] = w


def _compare(geo: SceneGeometry, org, dirs, t_lo, t_hi, n) -> tuple[np.ndarray, np.ndarray]:
    d = "cpu"
    b = len(org)
    pk = wp.zeros((b, PACKET), dtype=wp.vec4, device=d)
    pk16 = wp.zeros((b, PACKET), dtype=wp.vec4, device=d)
    sg = wp.zeros((b, PACKET), dtype=wp.vec4, device=d)
    wp.launch(_packet_vs_single, b, [geo.geo, wp.array(org.astype(np.float32), dtype=wp.vec3, device=d),
                                     wp.array(dirs.astype(np.float32), dtype=wp.vec3, device=d),
                                     wp.array(t_lo.astype(np.float32), dtype=float, device=d),
                                     wp.array(t_hi.astype(np.float32), dtype=float, device=d),
                                     wp.array(n.astype(np.int32), dtype=wp.int32, device=d), pk, pk16, sg], device=d)
    s = sg.numpy()
    for name, a in (("8 lanes", pk), ("16 lanes", pk16)):  # the rays tested 8 or 16 at a time: the same bits
        p = a.numpy()
        p[p[..., 1] < 0] = (-1.0, -1.0, 0.0, 0.0)  # a miss row: only slot −1 is defined
        assert np.array_equal(p.view(np.uint32), s.view(np.uint32)), \
            f"{name}: {int(np.any(p != s, axis=-1).sum())} of {int((s[..., 1] >= 0).sum())} rays differ"
    return p, s


def _cone(axis: np.ndarray, half_angle: float, n: int, rng) -> np.ndarray:
    """n unit directions within ``half_angle`` [rad] of ``axis`` (a beam's sub-rays)."""
    a = axis / np.linalg.norm(axis)
    u = np.cross(a, [0.0, 0.0, 1.0] if abs(a[2]) < 0.9 else [1.0, 0.0, 0.0])
    u /= np.linalg.norm(u)
    v = np.cross(a, u)
    r = half_angle * np.sqrt(rng.uniform(0, 1, n))
    phi = rng.uniform(0, 2 * np.pi, n)
    d = a[None] + np.tan(r)[:, None] * (np.cos(phi)[:, None] * u + np.sin(phi)[:, None] * v)
    d[0] = a
    return d / np.linalg.norm(d, axis=1, keepdims=True)


def _beams(origins: np.ndarray, axes: np.ndarray, half_angle: float, n: int, rng, far: float = 200.0):
    b = len(origins)
    dirs = np.zeros((b, PACKET, 3))
    dirs[..., 0] = 1.0
    for i in range(b):
        dirs[i, :n] = _cone(axes[i], half_angle, n, rng)
    return origins, dirs, np.zeros((b, PACKET)), np.full((b, PACKET), far), np.full(b, n)


def _scene(points, faces) -> SceneGeometry:
    s = Scene(MeshData(points, faces, 0))
    s.materials.append(Material.from_labels("a", "steel", "paint"))
    s.parts.append(Part("p", material=1))
    s.static.tri_part[:] = 1
    g = SceneGeometry(s, "cpu", wide=True)
    assert g.geo.use_wide == 1
    return g


@pytest.fixture(scope="module")
def street():
    import wsim

    scene = wsim.load_scene("builtin")
    g = scene.device_geometry("cpu")
    assert g.geo.use_wide == 1
    return g


@pytest.mark.parametrize("n,half_deg", [(19, 0.3), (7, 0.05), (64, 2.0), (33, 20.0)],
                         ids=["gaussian-beam", "narrow-beam", "wide-64", "fan-33"])
def test_beams_on_the_street_block_equal_single_rays(street, n, half_deg):
    rng = np.random.default_rng(n)
    b = 3000
    org = np.column_stack([rng.uniform(-60, 60, b), rng.uniform(-6, 6, b), rng.uniform(0.5, 2.5, b)])
    ax = rng.normal(size=(b, 3))
    ax[:, 2] = rng.uniform(-0.4, 0.2, b)
    p, s = _compare(street, *_beams(org, ax, np.radians(half_deg), n, rng))
    assert (s[:, :n, 1] >= 0).mean() > 0.5  # most rays hit something: the comparison means something


def test_a_lidar_column_equals_single_rays(street):
    """128 emitters of one column in two packets of 64: one origin, elevations from −25° to +15°."""
    rng = np.random.default_rng(3)
    b = 1000
    org = np.tile([0.0, 0.0, 1.9], (b, 1)) + rng.normal(0, 0.5, (b, 3)) * [20, 1, 0]
    az = rng.uniform(0, 2 * np.pi, b)
    el = np.radians(np.linspace(-25, 15, 128))
    for half in (el[:64], el[64:]):
        dirs = np.stack([np.cos(half)[None] * np.cos(az)[:, None], np.cos(half)[None] * np.sin(az)[:, None],
                         np.broadcast_to(np.sin(half), (b, 64))], axis=-1)
        _compare(street, org, dirs, np.zeros((b, 64)), np.full((b, 64), 200.0), np.full(b, 64))


def test_partial_packets_and_per_ray_ranges(street):
    rng = np.random.default_rng(8)
    b = 2000
    org = np.column_stack([rng.uniform(-40, 40, b), rng.uniform(-5, 5, b), rng.uniform(0.5, 2.0, b)])
    o, dirs, lo, hi, n = _beams(org, rng.normal(size=(b, 3)), np.radians(1.0), PACKET, rng)
    n = rng.integers(0, PACKET + 1, b)
    lo = rng.uniform(0, 5, (b, PACKET)) * (rng.uniform(size=(b, PACKET)) < 0.5)
    hi = lo + rng.uniform(-1, 40, (b, PACKET))  # some empty ranges: inactive rays
    _compare(street, o, dirs, lo, hi, n)


def test_box_room_grazing_and_axis_aligned_rays():
    """Inside a box room: rays along the axes (a zero direction component: that axis bounds nothing), rays grazing
    a wall at 1e-5 rad, and rays aimed at the room's corners and edges (shared-edge hits: the smaller face wins)."""
    p, f = box_mesh(np.array([-4.0, -3.0, -1.5]), np.array([6.0, 2.5, 3.0]), inward=True)
    geo = _scene(p, f)
    rng = np.random.default_rng(4)
    b = 500
    org = rng.uniform([-3.5, -2.5, -1.0], [5.5, 2.0, 2.5], (b, 3))
    dirs = np.zeros((b, PACKET, 3))
    axes = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], float)
    dirs[:, :6] = axes
    g = rng.normal(size=(b, 20, 3))
    g[..., 2] = 1e-5 * rng.choice([-1, 1], (b, 20))  # grazing the floor and ceiling planes
    dirs[:, 6:26] = g / np.linalg.norm(g, axis=-1, keepdims=True)
    corners = np.array([[x, y, z] for x in (-4, 6) for y in (-3, 2.5) for z in (-1.5, 3.0)], float)
    edges = (corners[:, None] + corners[None]).reshape(-1, 3)[::3] / 2.0
    tgt = np.concatenate([corners, edges])[: PACKET - 26]
    t = tgt[None] - org[:, None]
    dirs[:, 26:26 + len(tgt)] = t / np.linalg.norm(t, axis=-1, keepdims=True)
    n = np.full(b, 26 + len(tgt))
    p_, s = _compare(geo, org, dirs, np.zeros((b, PACKET)), np.full((b, PACKET), 100.0), n)
    assert np.all(s[:, :n[0], 1] >= 0)  # a closed room: every ray hits a wall


def test_plane_seen_at_grazing_angles_from_far():
    """A 200 m plane seen almost edge-on from 50 m: the smallest (t, face) among near-tied triangles."""
    p, f = quad_mesh([100.0, 0, 0], [0, 200, 0], [200, 0, 0])
    # subdivide the quad into a 40 × 40 grid of triangles
    xs = np.linspace(0, 200, 41)
    gx, gy = np.meshgrid(xs, xs - 100, indexing="ij")
    pts = np.column_stack([gx.ravel(), gy.ravel(), np.zeros(gx.size)])
    i = np.arange(40)[:, None] * 41 + np.arange(40)[None]
    q = np.stack([i, i + 41, i + 42, i + 1], -1).reshape(-1, 4)
    faces = np.concatenate([q[:, [0, 1, 2]], q[:, [0, 2, 3]]])
    geo = _scene(pts, faces)
    rng = np.random.default_rng(2)
    b = 800
    org = np.column_stack([np.full(b, -50.0), rng.uniform(-20, 20, b), rng.uniform(0.05, 2.0, b)])
    ax = np.column_stack([np.ones(b), rng.uniform(-0.2, 0.2, b), -org[:, 2] / rng.uniform(60, 250, b)])
    _, s = _compare(geo, *_beams(org, ax, np.radians(0.2), 19, rng, far=400.0))
    assert (s[:, :19, 1] >= 0).mean() > 0.5


def _trace_ray_by_ray(geo: SceneGeometry, o, d, times, t_min: float, t_max: float) -> dict:
    """``geo.trace`` through the one-ray-a-thread kernel (the reference of its packet path)."""
    from wsim.kernels import trace as _trace

    dev = "cpu"
    arr = lambda x, dt=wp.vec3: wp.array(np.ascontiguousarray(x, np.float32), dtype=dt, device=dev)  # noqa: E731
    n = len(o)
    hits = wp.empty(n, dtype=_trace.Hit, device=dev)
    wp.launch(_trace.trace_closest_kernel, n, [geo.geo, arr(o), arr(d), arr(times, float), t_min, t_max, 0], [hits],
              device=dev)
    return hits.numpy()


@pytest.mark.parametrize("t_min,t_max", [(0.0, 1.0e6), (2.5, 60.0)], ids=["full", "range"])
def test_trace_packets_equal_ray_by_ray_traces(t_min, t_max):
    """``SceneGeometry.trace`` takes rays 16 at a time and traverses a group that shares its origin as a packet
    (a narrow one past its reach too, and at one instant with the instances it may meet listed once and traversed
    as packets): the hits equal tracing ray by ray, bit for bit, on the built-in scene with its moving cars — lidar
    columns, camera pixel rows, narrow runs aimed at the cars and at the horizon (far surfaces, the open sky), rays
    grazing the road, groups whose origins differ in one ray or only in the sign of a zero, and a count that is no
    multiple of 16."""
    import wsim

    scene = wsim.load_scene("builtin")
    geo = SceneGeometry(scene, "cpu")
    rng = np.random.default_rng(5)
    o, d = [], []
    for _ in range(300):  # lidar columns: 128 elevations from one origin
        org = np.array([rng.uniform(-60, 60), rng.uniform(-4, 4), 1.9])
        az, el = rng.uniform(0, 2 * np.pi), np.radians(np.linspace(-25, 15, 128))
        o.append(np.tile(org, (128, 1)))
        d.append(np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1))
    for _ in range(200):  # camera rows: 64 neighbouring pixels
        org = np.array([rng.uniform(-60, 60), rng.uniform(-4, 4), rng.uniform(1.0, 2.0)])
        f = np.array([np.cos(a := rng.uniform(0, 2 * np.pi)), np.sin(a), rng.uniform(-0.3, 0.1)])
        r = np.cross(f, [0.0, 0.0, 1.0])
        v = rng.uniform(-0.3, 0.3)
        u = np.linspace(-0.5, 0.5, 64)
        o.append(np.tile(org, (64, 1)))
        d.append(f[None] + u[:, None] * r[None] + v * np.array([0.0, 0.0, 1.0]))
    t_mid = 0.5 * sum(scene.time_range)
    for k in range(120):  # narrow camera runs aimed at the cars (their instances listed once per packet)
        inst = scene.instances[k % len(scene.instances)]
        c = np.array([np.interp(t_mid, inst.times, inst.translations[:, a]) for a in range(3)]) + [0.0, 0.0, 0.8]
        a = rng.uniform(0, 2 * np.pi)
        org = c + rng.uniform(4.0, 25.0) * np.array([np.cos(a), np.sin(a), 0.0]) + [0.0, 0.0, rng.uniform(0.2, 1.5)]
        f = (c - org) / np.linalg.norm(c - org)
        r = np.cross(f, [0.0, 0.0, 1.0])
        u = np.linspace(-0.012, 0.012, 64)
        o.append(np.tile(org, (64, 1)))
        d.append(f[None] + u[:, None] * r[None] + rng.uniform(-0.02, 0.02) * np.array([0.0, 0.0, 1.0]))
    for _ in range(60):  # narrow runs toward the horizon: far surfaces and the open sky, past the packets' reach
        org = np.array([rng.uniform(-60, 60), rng.uniform(-4, 4), 1.5])
        a = rng.uniform(0, 2 * np.pi)
        f = np.array([np.cos(a), np.sin(a), rng.uniform(-0.02, 0.08)])
        r = np.cross(f, [0.0, 0.0, 1.0])
        o.append(np.tile(org, (64, 1)))
        d.append(f[None] + np.linspace(-0.012, 0.012, 64)[:, None] * r[None])
    org = np.array([0.0, -0.0, 0.3])  # grazing the road, and zeros of either sign
    o.append(np.tile(org, (64, 1)))
    o[-1][np.arange(64) % 16 == 7, 1] = 0.0
    d.append(np.column_stack([rng.normal(size=64), rng.normal(size=64), -rng.uniform(0, 0.01, 64)]))
    o = np.concatenate(o)
    d = np.concatenate(d)
    mixed = rng.random(len(o)) < 0.01  # one ray of a group from elsewhere
    o[mixed] += rng.normal(0, 1.0, (mixed.sum(), 3))
    o, d = o[:-5], d[:-5]
    times = np.repeat(rng.uniform(*scene.time_range, len(o) // 16 + 1), 16)[: len(o)]
    a = geo.trace(o, d, times, t_min=t_min, t_max=t_max).numpy()
    b = _trace_ray_by_ray(geo, o, d, times, t_min, t_max)
    hit = b["face"] >= 0
    assert hit.mean() > 0.5 and (b["instance"] >= 0).sum() > 500  # the cars are in it
    runs = slice(300 * 128 + 200 * 64, 300 * 128 + 200 * 64 + 120 * 64)
    assert (b["instance"][runs] >= 0).mean() > 0.1  # and the narrow runs see them
    far = slice(runs.stop, runs.stop + 60 * 64)
    beyond = ((b["face"][far] >= 0) & (b["t"][far] > 50.0)).mean()
    assert (b["face"][far] < 0).mean() > 0.2 and (beyond > 0.05 or t_max < 100.0)  # the sky, and far surfaces
    for k in a:
        assert np.array_equal(np.ascontiguousarray(a[k]).view(np.uint8), np.ascontiguousarray(b[k]).view(np.uint8)), k
    _assert_brief_is_the_records(geo.trace(o, d, times, t_min=t_min, t_max=t_max, brief=True).numpy(), b)


def _assert_brief_is_the_records(brief: dict, full: dict) -> None:
    """Brief records (``trace(..., brief=True)``) are the full records' t, face, instance, u and v, bit for bit."""
    assert sorted(brief) == ["face", "instance", "t", "u", "v"]
    for k in brief:
        assert np.array_equal(np.ascontiguousarray(brief[k]).view(np.uint8),
                              np.ascontiguousarray(full[k]).view(np.uint8)), k


def _grid_rays(org, forward, rows: int, cols: int, h_fov: float, v_fov: float) -> np.ndarray:
    """(rows, cols, 3) directions of a level pinhole grid around ``forward`` (z up)."""
    f = np.asarray(forward, float) / np.linalg.norm(forward)
    r = np.cross(f, [0.0, 0.0, 1.0])
    r /= np.linalg.norm(r)
    up = np.cross(r, f)
    u = np.tan(np.radians(h_fov) / 2) * np.linspace(-1, 1, cols)
    v = np.tan(np.radians(v_fov) / 2) * np.linspace(1, -1, rows)
    return f + u[None, :, None] * r + v[:, None, None] * up


@pytest.mark.parametrize("t_min,t_max", [(0.0, 1.0e6), (2.5, 60.0)], ids=["full", "range"])
def test_trace_grid_tiles_equal_ray_by_ray_traces(t_min, t_max):
    """Rays given as a grid (``grid=`` or (H, W, 3) arrays) are traced in tiles of neighbours from two rows: the
    hits equal tracing ray by ray, bit for bit, on the built-in scene with its moving cars — camera images aimed at
    the cars (tiles that list their instances) and at the horizon, a lidar's azimuths × elevations, grids whose
    sizes are no multiple of the tile's, a row from another origin, rows at other times, rays grazing the road."""
    import wsim

    scene = wsim.load_scene("builtin")
    geo = SceneGeometry(scene, "cpu")
    rng = np.random.default_rng(9)
    t_mid = 0.5 * sum(scene.time_range)
    grids = []  # (origins (H, W, 3), directions (H, W, 3), times (H, W))
    for k in range(6):  # cameras aimed at the cars, one time for the image
        inst = scene.instances[k % len(scene.instances)]
        c = np.array([np.interp(t_mid, inst.times, inst.translations[:, a]) for a in range(3)]) + [0.0, 0.0, 0.8]
        a = rng.uniform(0, 2 * np.pi)
        org = c + rng.uniform(5.0, 20.0) * np.array([np.cos(a), np.sin(a), 0.0]) + [0.0, 0.0, rng.uniform(0.2, 1.0)]
        d = _grid_rays(org, c - org, 37, 70, 40.0, 22.0)
        grids.append((np.broadcast_to(org, d.shape), d, np.full(d.shape[:2], t_mid)))
    for _ in range(3):  # toward the horizon, each row at its own time (a rolling shutter)
        org = np.array([rng.uniform(-60, 60), rng.uniform(-4, 4), 1.5])
        a = rng.uniform(0, 2 * np.pi)
        d = _grid_rays(org, [np.cos(a), np.sin(a), 0.02], 23, 45, 50.0, 8.0)
        grids.append((np.broadcast_to(org, d.shape), d, np.repeat(np.linspace(*scene.time_range, 23)[:, None], 45, 1)))
    org = np.array([rng.uniform(-30, 30), rng.uniform(-3, 3), 1.9])  # a lidar: azimuths x elevations
    az, el = np.radians(np.arange(0, 360, 0.8)), np.radians(np.linspace(-25, 15, 40))
    d = np.stack([np.cos(el)[None] * np.cos(az)[:, None], np.cos(el)[None] * np.sin(az)[:, None],
                  np.broadcast_to(np.sin(el)[None], (len(az), len(el)))], -1)
    grids.append((np.broadcast_to(org, d.shape), d, np.full(d.shape[:2], t_mid)))
    org = np.array([0.0, -0.0, 0.3])  # grazing the road; a row from elsewhere, zeros of either sign
    d = _grid_rays(org, [1.0, 0.2, -0.004], 9, 33, 30.0, 0.5)
    o = np.array(np.broadcast_to(org, d.shape))
    o[4] += [0.0, 0.5, 0.0]
    o[6, :, 1] = 0.0
    grids.append((o, d, np.full(d.shape[:2], t_mid)))
    n_car = 6 * 37 * 70
    for g, (o, d, tt) in enumerate(grids):
        a = geo.trace(o, d, tt.reshape(-1), t_min=t_min, t_max=t_max).numpy()  # (H, W, 3): a grid
        b = _trace_ray_by_ray(geo, o.reshape(-1, 3), d.reshape(-1, 3), tt.reshape(-1), t_min, t_max)
        for k in a:
            assert np.array_equal(np.ascontiguousarray(a[k]).view(np.uint8),
                                  np.ascontiguousarray(b[k]).view(np.uint8)), (g, k)
        _assert_brief_is_the_records(geo.trace(o, d, tt.reshape(-1), t_min=t_min, t_max=t_max, brief=True).numpy(), b)
        grids[g] = b
    cars = np.concatenate([b["instance"] for b in grids[:6]])
    assert len(cars) == n_car and (cars >= 0).mean() > 0.05  # the tiles aimed at the cars see them
    assert np.mean(grids[-2]["face"] >= 0) > 0.5


def test_camera_tiles_within_a_degree_pretest_their_own_cone_and_miss_no_car():
    """Tiles whose rays all lie within PRETEST_COS (1°) of their first (a fine camera grid: 16 × 4 pixels of 0.03°)
    pre-test the moving car's box with a cone of 1°, not LIST_COS's 3°: a grid on a car driving down a road, from 25
    m behind — tiles across its silhouette whose first ray passes its box while others hit the car — traces bit for
    bit as ray by ray; so does a coarser grid, whose tiles of 2° keep LIST_COS's cone."""
    from wsim.scene import Instance

    p, f = quad_mesh([-50.0, -20.0, 0.0], [150.0, 0.0, 0.0], [0.0, 40.0, 0.0])  # the road
    scene = Scene(MeshData(p, f, 0))
    bp, bf = box_mesh([-2.0, -1.0, 0.0], [2.0, 1.0, 1.5])
    scene.parts.append(Part("/World/Car/body", material=0, semantic_class=scene.semantic_class_index("car")))
    scene.prototypes.append(MeshData(bp, bf, len(scene.parts) - 1))
    keys = np.linspace(0.0, 1.0, 101)  # 10 cm a key: its box over a key's motion is about the car's
    scene.instances.append(Instance(0, keys, np.column_stack([20.0 + 10.0 * keys, 0 * keys, 0 * keys]),
                                    [[0.0, 0.0, 0.0, 1.0]] * len(keys), object_id=7, name="/World/Car"))
    geo = SceneGeometry(scene, "cpu")
    t = 0.5
    with geo.hold_time_window(t, t):  # the box the pre-test meets
        lo, hi = geo.geo.inst_lo.numpy()[0].astype(float), geo.geo.inst_hi.numpy()[0].astype(float)
    assert geo.geo.num_instances == 1
    org = np.array([-2.0, 0.0, 1.75])
    for rows, cols, tight in ((128, 256, True), (32, 64, False)):  # pixels of 0.03°, and of 0.125° (tiles of 2°)
        d = _grid_rays(org, [1.0, 0.0, -0.04], rows, cols, 8.0, 4.0)
        o = np.broadcast_to(org, d.shape)
        tt = np.full(rows * cols, t)
        r = _trace_ray_by_ray(geo, o.reshape(-1, 3), d.reshape(-1, 3), tt, 0.0, 1.0e6)
        _assert_brief_is_the_records(geo.trace(o, d, tt, brief=True).numpy(), r)
        u = d / np.linalg.norm(d, axis=-1, keepdims=True)
        car = r["instance"].reshape(rows, cols) == 0
        edge_tiles = 0
        for y in range(0, rows, 4):
            for x in range(0, cols, 16):
                tile = u[y:y + 4, x:x + 16].reshape(-1, 3)
                # the grid's 4 × 16 tiles lie within PRETEST_COS (or not, but within LIST_COS: LIST_SPREAD's cone)
                assert (np.min(tile @ tile[0]) > PRETEST_COS) == tight and np.min(tile @ tile[0]) > LIST_COS
                with np.errstate(divide="ignore"):
                    s0, s1 = (lo - org) / tile[0], (hi - org) / tile[0]
                first_in_box = np.max(np.minimum(s0, s1)) <= np.min(np.maximum(s0, s1))
                edge_tiles += bool(car[y:y + 4, x:x + 16].any() and not first_in_box)
        assert car.mean() > 0.2 and edge_tiles >= (10 if tight else 3), (rows, car.mean(), edge_tiles)


@pytest.mark.parametrize("bake", [False, True], ids=["instances", "baked"])
def test_instances_first_tiles_keep_static_ties_bit_for_bit(bake, monkeypatch):
    """Camera tiles at one instant whose cone lists instances trace them first and then the static tree only up to
    their surfaces, that distance included: a static wall with two coincident panels (instances) in its plane, and
    a third panel before it, seen head-on and at 4° — every ray on the coincident panels ties, and the wall wins, as
    ray by ray (then the first panel where only panels meet); every field bit for bit, brief records too. Baked
    (parked panels copied into the static tree), the same answers."""
    from wsim.scene import Instance
    from wsim.scene import geometry as wgeo

    if not bake:
        monkeypatch.setattr(wgeo, "BAKE_MAX_TRIANGLES", 0)
    p, f = quad_mesh([20.0, 0.0, 0.0], [0.0, 0.0, 8.0], [0.0, 8.0, 0.0])  # the wall, x = 20
    scene = Scene(MeshData(p, f, 1))
    scene.materials.append(Material.from_labels("steel_paint_retro", "steel", "paint", ["retroreflective"]))
    scene.parts.append(Part("wall", material=1, semantic_class=scene.semantic_class_index("wall")))
    qp, qf = quad_mesh([1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0])
    scene.prototypes.append(MeshData(qp, qf, 0, name="panel"))
    for k, (x, z) in enumerate(((19.0, 0.0), (19.0, 0.0), (12.0, 0.9))):
        scene.instances.append(Instance(0, [0.0], [[x, 0.0, z]], [[0.0, 0.0, 0.0, 1.0]], object_id=100 + k))
    geo = SceneGeometry(scene, "cpu")
    assert geo.geo.num_instances == (0 if bake else 3) and len(geo.baked) == (3 if bake else 0)
    rows, cols = 61, 125
    d = _grid_rays(np.zeros(3), [1.0, 0.0, 0.0], rows, cols, 8.0, 4.0)  # tiles of 1° x 0.25°: narrow packets
    o = np.zeros_like(d)
    tt = np.zeros(rows * cols)
    g = geo.trace(o, d, tt).numpy()
    r = _trace_ray_by_ray(geo, o.reshape(-1, 3), d.reshape(-1, 3), tt, 0.0, 1.0e6)
    for k in g:
        assert np.array_equal(np.ascontiguousarray(g[k]).view(np.uint8),
                              np.ascontiguousarray(r[k]).view(np.uint8)), k
    _assert_brief_is_the_records(geo.trace(o, d, tt, brief=True).numpy(), r)
    u = d.reshape(-1, 3) / d.reshape(-1, 3)[:, :1]  # the ray's point at x = 1
    tie = (np.abs(u[:, 1]) * 20.0 < 0.99) & (np.abs(u[:, 2]) * 20.0 < 0.99) & (np.abs(u[:, 2] * 13.0 - 0.9) > 1.01)
    assert tie.sum() > 1000 and np.all(r["face"][tie] >= 0) and np.all(r["instance"][tie] == -1)  # the wall won
    front = (np.abs(u[:, 1]) * 13.0 < 0.99) & (np.abs(u[:, 2] * 13.0 - 0.9) < 0.99)
    assert front.sum() > 100 and np.all(r["instance"][front] == 2)  # the panel before the wall


def test_listed_instance_box_tests_keep_the_nan_rules(unbaked):
    """A camera grid aimed at a parked car from a point on the planes of its box's side and top faces, with
    directions whose y or z component is exactly 0 (1/0 = inf, and 0 x inf = NaN slab distances): the listed
    instance's box tests, 16 rays at a time, and its one-origin packets give every ray the record of tracing it
    alone, bit for bit, and the car is seen (traced as an instance, not baked into the static tree)."""
    import wsim

    scene = wsim.load_scene("builtin")
    geo = SceneGeometry(scene, "cpu")
    t_mid = 0.5 * sum(scene.time_range)
    k = next(i for i, inst in enumerate(geo.instances) if len(inst.times) == 1)  # a parked car
    one = lambda x: np.asarray([x], np.float32)  # noqa: E731
    geo.trace(one([0.0, 0.0, 0.0]), one([1.0, 0.0, 0.0]), one(t_mid))  # the instances' boxes at t_mid
    lo, hi = geo.geo.inst_lo.numpy()[k], geo.geo.inst_hi.numpy()[k]
    c = 0.5 * (lo + hi)
    u = np.arange(-17, 18) * 0.03  # exact zeros at the centre column and row
    v = np.arange(10, -11, -1) * 0.03
    d = np.stack(np.broadcast_arrays(1.0, u[None, :], v[:, None]), -1).astype(np.float32)
    org = np.array([c[0] - 8.0, lo[1], hi[2]], np.float32)  # on the planes of two of the box's faces
    o = np.broadcast_to(org, d.shape)
    tt = np.full(d.shape[0] * d.shape[1], t_mid)
    assert np.any(d[..., 1] == 0.0) and np.any(d[..., 2] == 0.0)
    a = geo.trace(o, d, tt).numpy()
    b = _trace_ray_by_ray(geo, o.reshape(-1, 3), d.reshape(-1, 3), tt, 0.0, 1.0e6)
    for f in a:
        assert np.array_equal(np.ascontiguousarray(a[f]).view(np.uint8), np.ascontiguousarray(b[f]).view(np.uint8)), f
    _assert_brief_is_the_records(geo.trace(o, d, tt, brief=True).numpy(), b)
    assert np.sum(b["instance"] == k) > 20, np.sum(b["instance"] == k)


@wp.kernel
def _tiles_of(rows: int, cols: int, tr: int, tc: int, idx: wp.array2d[wp.int32], count: wp.array[wp.int32]):
    t = wp.tid()
    ix, m = tile_indices(t, rows, cols, tr, tc)
    count[t] = m
    for k in range(64):
        idx[t, k] = ix[k]


@pytest.mark.parametrize("rows,cols,tr,tc", [(1080, 1920, 4, 16), (7, 13, 4, 16), (13, 7, 16, 4), (1, 5, 4, 16),
                                             (64, 1, 8, 8), (3600, 128, 16, 4)])
def test_tile_indices_cover_the_grid_tile_by_tile(rows, cols, tr, tc):
    """Every ray of a grid in exactly one tile, each tile's rays row by row as NumPy slices them (padding 0)."""
    per_row = -(-cols // tc)
    n_tiles = -(-rows // tr) * per_row + 2  # and two tiles past the grid: empty
    idx = wp.zeros((n_tiles, 64), dtype=wp.int32, device="cpu")
    count = wp.zeros(n_tiles, dtype=wp.int32, device="cpu")
    wp.launch(_tiles_of, n_tiles, [rows, cols, tr, tc, idx, count], device="cpu")
    idx, count = idx.numpy(), count.numpy()
    grid = np.arange(rows * cols).reshape(rows, cols)
    for t in range(n_tiles):
        r0, c0 = (t // per_row) * tr, (t % per_row) * tc
        want = grid[r0:r0 + tr, c0:c0 + tc].reshape(-1)
        assert count[t] == len(want), t
        assert np.array_equal(idx[t, :len(want)], want), t
        assert not idx[t, len(want):].any(), t
    assert np.array_equal(np.sort(np.concatenate([idx[t, :count[t]] for t in range(n_tiles)])), grid.reshape(-1))


def test_trace_grid_is_checked_and_changes_no_hit():
    """``grid`` must hold the rays (the error names it); a tile's long side lies along the grid's finer axis; flat
    rays with ``grid`` give the very answer of the same rays as (H, W, 3) arrays and of the flat rays without it."""
    import wsim

    geo = SceneGeometry(wsim.load_scene("builtin"), "cpu")
    org = np.array([0.0, 0.0, 1.5])
    d = _grid_rays(org, [1.0, 0.3, -0.05], 21, 35, 60.0, 30.0)
    o = np.broadcast_to(org, d.shape)
    with pytest.raises(ValueError, match="grid"):
        geo.trace(o.reshape(-1, 3), d.reshape(-1, 3), grid=(20, 35))
    with pytest.raises(ValueError, match="grid"):
        geo.trace(o.reshape(-1, 3), d.reshape(-1, 3), grid=(0, 735))
    from wsim.scene.geometry import _tile

    wide = _grid_rays(org, [1.0, 0.0, 0.0], 30, 40, 60.0, 10.0)  # columns 1.5° apart, rows 0.34°: 16 rows
    tall = _grid_rays(org, [1.0, 0.0, 0.0], 30, 40, 20.0, 60.0)  # columns 0.5° apart, rows 2.3°: 16 columns
    as_wp = lambda x: wp.array(np.ascontiguousarray(x.reshape(-1, 3), np.float32), dtype=wp.vec3)  # noqa: E731
    assert _tile(as_wp(wide), 30, 40) == (16, 4) and _tile(as_wp(tall), 30, 40) == (4, 16)
    assert _tile(as_wp(d), 1, 735) == (1, 64) and _tile(as_wp(d), 735, 1) == (64, 1)
    shaped = geo.trace(o, d).numpy()
    given = geo.trace(o.reshape(-1, 3), d.reshape(-1, 3), grid=(21, 35)).numpy()
    flat = geo.trace(o.reshape(-1, 3), d.reshape(-1, 3)).numpy()
    assert np.mean(flat["face"] >= 0) > 0.5
    for k in flat:
        assert np.array_equal(np.ascontiguousarray(shaped[k]).view(np.uint8), np.ascontiguousarray(flat[k]).view(np.uint8))
        assert np.array_equal(np.ascontiguousarray(given[k]).view(np.uint8), np.ascontiguousarray(flat[k]).view(np.uint8))


@wp.kernel
def _group_setup(origins: wp.array[wp.vec3], directions: wp.array[wp.vec3], times: wp.array[float],
                 idx_in: wp.array2d[wp.int32], m_in: wp.array[wp.int32], dirs_out: wp.array2d[wp.vec3],
                 ref_out: wp.array2d[wp.vec3], kind_out: wp.array[wp.int32], ref_kind: wp.array[wp.int32]):
    """The group set-up natives beside Warp's own expressions of the same rules (``wp.normalize``, ``wp.dot``)."""
    b = wp.tid()
    m = m_in[b]
    idx = vec64i()
    for k in range(PACKET):
        idx[k] = idx_in[b, k]
    dirs = unit_dirs(directions, idx, m)
    kind_out[b] = group_kind(origins, times, dirs, idx, m, PACKET_COS, LIST_COS, WHOLE_COS, PRETEST_COS)
    s = idx[0]
    d0 = wp.normalize(directions[s])
    o = origins[s]
    shared = m > 1
    narrow = bool(True)
    whole = bool(True)
    tight = bool(True)
    same_time = bool(True)
    for k in range(PACKET):
        dirs_out[b, k] = wp.vec3(dirs[k, 0], dirs[k, 1], dirs[k, 2])
        if k < m:
            i = idx[k]
            d = wp.normalize(directions[i])
            ref_out[b, k] = d
            c = wp.dot(d, d0)
            if c < LIST_COS:
                narrow = False
            if c < WHOLE_COS:
                whole = False
            if c < PRETEST_COS:
                tight = False
            p = origins[i]
            if wide_slot(p[0]) != wide_slot(o[0]) or wide_slot(p[1]) != wide_slot(o[1]):
                shared = False
            if wide_slot(p[2]) != wide_slot(o[2]) or c < PACKET_COS:
                shared = False
            if d[0] * d0[0] <= 0.0 or d[1] * d0[1] <= 0.0 or d[2] * d0[2] <= 0.0:
                shared = False
            if wide_slot(times[i]) != wide_slot(times[s]):
                same_time = False
    kind = int(0)
    if shared:
        kind += 1
    if narrow:
        kind += 2
    if whole:
        kind += 4
    if same_time:
        kind += 8
    if tight:
        kind += 16
    ref_kind[b] = kind


def test_group_setup_natives_equal_warp_expressions():
    """unit_dirs rounds each row as wp.normalize does (scaled, tiny, zero and NaN directions, partial chunks), and
    group_kind tells the same packet, narrow, whole, pre-test cone and same-time flags as the rules written in Warp."""
    rng = np.random.default_rng(3)
    n = 4096
    axis = np.array([0.3, -0.8, 0.5])
    spread = rng.choice([0.001, 0.03, 0.1, 0.6], size=(n, 1))
    d = axis + rng.normal(size=(n, 3)) * spread
    d *= rng.choice([1.0, 1e-3, 7.5, 1e4], size=(n, 1))  # lengths far from 1
    d[::97] = 0.0  # no length: zero rows
    d[5::211] = np.nan
    d[7::53, 0] = 1e-30  # tiny components
    o = np.tile([1.0, 2.0, 3.0], (n, 1))
    o[::61] = [1.0, 2.0, 3.0000002]
    t = np.full(n, 0.25)
    t[::73] = 0.2500001
    o[11::151] = [0.0, 2.0, 3.0]
    o[12::151] = [-0.0, 2.0, 3.0]  # the same value, other bits: not one origin
    groups = 300
    ms = rng.integers(1, PACKET + 1, size=groups)
    ms[:4] = [1, 16, 17, 64]
    idx = np.zeros((groups, PACKET), np.int32)
    for g in range(groups):
        start = rng.integers(0, n - PACKET)
        idx[g, :ms[g]] = start + (np.arange(ms[g]) if g % 3 else rng.permutation(PACKET)[:ms[g]])
    dev = "cpu"
    arrs = [wp.array(o.astype(np.float32), dtype=wp.vec3, device=dev),
            wp.array(d.astype(np.float32), dtype=wp.vec3, device=dev),
            wp.array(t.astype(np.float32), dtype=float, device=dev),
            wp.array(idx, dtype=wp.int32, device=dev), wp.array(ms.astype(np.int32), dtype=wp.int32, device=dev)]
    dirs = wp.zeros((groups, PACKET), dtype=wp.vec3, device=dev)
    ref = wp.zeros((groups, PACKET), dtype=wp.vec3, device=dev)
    kind = wp.zeros(groups, dtype=wp.int32, device=dev)
    ref_kind = wp.zeros(groups, dtype=wp.int32, device=dev)
    wp.launch(_group_setup, groups, arrs, [dirs, ref, kind, ref_kind], device=dev)
    got, want = dirs.numpy().view(np.uint32), ref.numpy().view(np.uint32)
    for g in range(groups):
        assert np.array_equal(got[g, :ms[g]], want[g, :ms[g]]), f"group {g}: unit directions differ"
        assert not got[g, ms[g]:].any(), f"group {g}: rows beyond m not zero"
    k, rk = kind.numpy(), ref_kind.numpy()
    assert np.array_equal(k, rk), np.nonzero(k != rk)
    # every flag is seen both set and clear, so the comparison covers each rule
    for bit in (1, 2, 4, 8, 16):
        assert (k & bit).any() and (~k & bit).any(), bit


@wp.kernel
def _from_vs_single(geo: SceneGeo, orgs: wp.array2d[wp.vec3], dirs: wp.array2d[wp.vec3], far: float, n: int,
                    packet: wp.array2d[wp.vec4], single: wp.array2d[wp.vec4]):
    b = wp.tid()
    o = mat64x3()
    d = mat64x3()
    lo = vec64f()
    hi = vec64f()
    for k in range(n):
        for a in range(3):
            o[k, a] = orgs[b, k][a]
            d[k, a] = dirs[b, k][a]
        hi[k] = far
    res = wide_packet_from(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid, o, d,
                           lo, hi, n)
    for k in range(n):
        packet[b, k] = wp.vec4(res[k, 0], res[k, 1], res[k, 2], res[k, 3])
        w = wide_closest(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid,
                         orgs[b, k], dirs[b, k], far)
        if w[1] < 0.0:
            w = wp.vec4(-1.0, -1.0, 0.0, 0.0)
        single[b, k] = w


def test_multi_origin_packets_with_a_nan_start_point_equal_single_rays(street):
    """One emitter over 16 ticks of a moving sensor (origins centimetres apart, directions a tenth of a degree): each
    ray's answer is its own, also where one of the 16 start points is NaN (that ray drops out of the packet's bounds
    and meets nothing, the others keep their surfaces)."""
    rng = np.random.default_rng(11)
    b, n = 1500, 16
    base = np.column_stack([rng.uniform(-60, 60, b), rng.uniform(-6, 6, b), rng.uniform(0.5, 2.5, b)])
    orgs = base[:, None, :] + np.arange(n)[None, :, None] * np.array([0.02, 0.001, 0.0])
    ax = rng.normal(size=(b, 3))
    ax[:, 2] = rng.uniform(-0.4, 0.1, b)
    ax /= np.linalg.norm(ax, axis=1, keepdims=True)
    dirs = np.stack([_cone(ax[i], np.radians(0.1), n, rng) for i in range(b)])
    orgs[::3, 12] = np.nan  # every third packet has one NaN start point (in either half of a vector's lanes)
    orgs[1::3, 3, 2] = np.nan
    d = "cpu"
    pk = wp.zeros((b, PACKET), dtype=wp.vec4, device=d)
    sg = wp.zeros((b, PACKET), dtype=wp.vec4, device=d)
    wp.launch(_from_vs_single, b, [street.geo, wp.array(orgs.astype(np.float32), dtype=wp.vec3, device=d),
                                   wp.array(dirs.astype(np.float32), dtype=wp.vec3, device=d), 200.0, n, pk, sg],
              device=d)
    p, s = pk.numpy()[:, :n], sg.numpy()[:, :n]
    p[p[..., 1] < 0] = (-1.0, -1.0, 0.0, 0.0)
    assert np.array_equal(p.view(np.uint32), s.view(np.uint32)), int(np.any(p != s, axis=-1).sum())
    assert (s[2::3, :, 1] >= 0).mean() > 0.5 and (s[::3, [0, 4, 11, 15], 1] >= 0).mean() > 0.5
    assert not (s[::3, 12, 1] >= 0).any()  # the NaN ray itself meets nothing
