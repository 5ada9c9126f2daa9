"""The tracing core on analytic scenes: every expected value is computed by hand."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp
from conftest import box_mesh, quad_mesh

from wsim.kernels.shading import occluded
from wsim.kernels.trace import Hit, SceneGeo, closest_hit, closest_hit_beyond, hit_distance, instances_may_meet
from wsim.kernels.widebvh import wide_closest
from wsim.launch import launch, shard_bounds
from wsim.scene import Instance, Material, MeshData, Part, Scene
from wsim.scene.geometry import SceneGeometry
from wsim.scene.transforms import quat_from_axis_angle, quat_slerp, quat_to_matrix


def _static_scene(points, faces, parts=None, n_parts=1) -> Scene:
    s = Scene(MeshData(points, faces, 0 if parts is None else parts))
    s.materials.append(Material.from_labels("steel_paint_retro", "steel", "paint", ["retroreflective"]))
    for k in range(n_parts):
        s.parts.append(Part(f"part{k}", material=1, semantic_class=s.semantic_class_index(f"class{k}"),
                            object_id=10 + k))
    if parts is None:
        s.static.tri_part[:] = 1
    return s


def _sphere_dirs(n: int, seed: int = 0) -> np.ndarray:
    d = np.random.default_rng(seed).normal(size=(n, 3))
    return d / np.linalg.norm(d, axis=1, keepdims=True)


def test_plane_at_known_distance(device):
    p, f = quad_mesh([5.0, 0, 0], [0, 10, 0], [0, 0, 10])  # plane x = 5 facing -x
    scene = _static_scene(p, f)
    geo = SceneGeometry(scene, device)
    rng = np.random.default_rng(1)
    d = np.column_stack([np.ones(200), rng.uniform(-0.5, 0.5, 200), rng.uniform(-0.5, 0.5, 200)])
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    o = np.zeros((200, 3))
    h = geo.trace(o, d).numpy()
    np.testing.assert_allclose(h["t"], 5.0 / d[:, 0], rtol=1e-5)
    np.testing.assert_allclose(h["point"][:, 0], 5.0, atol=1e-4)
    assert np.all(h["face"] >= 0) and np.all(h["instance"] == -1)
    assert np.all(h["material_id"] == 4354) and np.all(h["object_id"] == 10) and np.all(h["semantic"] == 1)
    np.testing.assert_allclose(np.abs(h["normal"][:, 0]), 1.0, atol=1e-6)
    # rays pointing away miss
    miss = geo.trace(o, -d).numpy()
    assert np.all(miss["face"] == -1)


def test_brief_records_of_a_moving_box_and_a_plane(device):
    """``trace(..., brief=True)``: each ray's t, face, instance and u, v, as the full records have them, on every
    device (one ray at a time on CUDA, ray packets on the CPU): a plane at a known distance, a moving box met at its
    place at each ray's time, and misses."""
    p, f = quad_mesh([5.0, 0, 0], [0, 10, 0], [0, 0, 10])  # plane x = 5 facing -x
    scene = _static_scene(p, f)
    bp, bf = box_mesh([-0.5, -0.5, -0.5], [0.5, 0.5, 0.5])
    scene.prototypes.append(MeshData(bp, bf, 0))
    scene.instances.append(Instance(0, [0.0, 1.0], [[2.0, -3.0, 0.0], [2.0, 3.0, 0.0]], [[0, 0, 0, 1.0]] * 2,
                                    object_id=7))
    geo = SceneGeometry(scene, device)
    rng = np.random.default_rng(4)
    n = 4096
    d = np.column_stack([np.ones(n), rng.uniform(-0.8, 0.8, n), rng.uniform(-0.6, 0.6, n)])
    d[: n // 8, 0] = -1.0  # away from the plane: misses
    o = np.zeros((n, 3))
    times = np.repeat(rng.uniform(0.0, 1.0, n // 16), 16)
    full = geo.trace(o, d, times).numpy()
    brief = geo.trace(o, d, times, brief=True).numpy()
    assert sorted(brief) == ["face", "instance", "t", "u", "v"]
    for k in brief:
        assert np.array_equal(brief[k], full[k]), k
    hit = brief["face"] >= 0
    plane = hit & (brief["instance"] < 0)
    np.testing.assert_allclose(brief["t"][plane], 5.0 / (d[plane, 0] / np.linalg.norm(d[plane], axis=1)), rtol=1e-5)
    assert (brief["instance"] == 0).sum() > 50 and not hit[: n // 8].any()
    # the box at its place at each ray's time: its near face x = 1.5, its sides y = -3 + 6·time ± 0.5
    box = brief["instance"] == 0
    p = brief["t"][box, None] * d[box] / np.linalg.norm(d[box], axis=1, keepdims=True)
    y0 = -3.0 + 6.0 * times[box]
    on_face = np.isclose(p[:, 0], 1.5, atol=1e-4) | np.isclose(np.abs(p[:, 1] - y0), 0.5, atol=1e-4)
    assert on_face.all() and np.isclose(p[:, 0], 1.5, atol=1e-4).sum() > 50
    assert np.all(np.abs(p[:, 1] - y0) <= 0.5 + 1e-4) and np.all(np.abs(p[:, 2]) <= 0.5 + 1e-4)
    with pytest.raises(ValueError, match="brief"):
        geo.trace(o, d, times, max_hits=2, brief=True)


def test_box_room_every_ray_hits_analytic_wall(device):
    lo, hi = np.array([-4.0, -3.0, -1.5]), np.array([6.0, 2.5, 3.0])
    p, f = box_mesh(lo, hi, inward=True)
    geo = SceneGeometry(_static_scene(p, f), device)
    n = 20000
    d = _sphere_dirs(n)
    o = np.tile([0.3, -0.2, 0.4], (n, 1))
    h = geo.trace(o, d).numpy()
    # analytic distance: nearest positive exit through the slabs
    with np.errstate(divide="ignore"):
        tx = np.where(d > 0, (hi - o) / d, (lo - o) / d)
    t_ref = tx.min(axis=1)
    assert np.all(h["face"] >= 0)
    np.testing.assert_allclose(h["t"], t_ref, atol=1e-4)
    # inward-facing room: normals point into the room, against the ray
    assert np.all(np.sum(h["normal"] * d, axis=1) < 0)


def test_sharded_cpu_launch_is_bit_identical():
    p, f = box_mesh([-4, -3, -1.5], [6, 2.5, 3], inward=True)
    geo = SceneGeometry(_static_scene(p, f), "cpu")
    d = _sphere_dirs(50000, seed=3)
    o = np.zeros((50000, 3))
    one = geo.trace(o, d, threads=1).numpy()
    many = geo.trace(o, d, threads=4).numpy()
    for k in ("t", "point", "normal", "face", "u", "v"):
        assert np.array_equal(one[k], many[k]), k


@pytest.mark.parametrize("dim,threads,min_shard", [(450, 2, 2), (2_073_600, 2, 2048), (10, 2, 4), (100_000, 4, 2048),
                                                   (4097, 3, 2048)])
def test_launch_shards_cover_the_work_largest_first(dim, threads, min_shard):
    """Shards tile [0, dim) exactly, never grow, stay at least ``min_shard`` (but the last), and each round of
    ``threads`` shards takes about half of what is left."""
    b = np.array(shard_bounds(dim, threads, min_shard))
    assert b[0] == 0 and b[-1] == dim
    size = np.diff(b)
    assert np.all(size > 0) and np.all(np.diff(size) <= 0)
    assert np.all(size[:-1] >= min_shard)
    first = size[:threads].sum()
    assert first <= dim // 2 + threads * min_shard and (first >= dim // 2 or size[0] == min_shard)
    assert len(size) <= threads * (np.log2(max(dim / min_shard, 1)) + 2)


def test_moving_box_hit_at_interpolated_position(device):
    bp, bf = box_mesh([-0.5, -0.5, -0.5], [0.5, 0.5, 0.5])
    s = Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), 0))
    s.prototypes.append(MeshData(bp, bf, 0, name="box"))
    # box centre moves from y=-2 to y=+2 over t in [0, 1] s, at x = 10, while rotating 90° about z
    q0 = quat_from_axis_angle([0, 0, 1], 0.0)
    q1 = quat_from_axis_angle([0, 0, 1], np.pi / 2)
    s.instances.append(Instance(0, [0.0, 1.0], [[10, -2, 0], [10, 2, 0]], [q0, q1], object_id=7))
    geo = SceneGeometry(s, device)
    times = np.linspace(0.0, 1.0, 11)
    y = -2 + 4 * times
    # rays along +x aimed at the box centre at each ray's own time: the box face (rotated square) is hit at
    # x = 10 - half-extent of the rotated square along x = 10 - 0.5 (|cos θ| + |sin θ|)
    o = np.column_stack([np.zeros(11), y, np.zeros(11)])
    d = np.tile([1.0, 0, 0], (11, 1))
    h = geo.trace(o, d, times).numpy()
    theta = np.pi / 2 * times
    # a ray through the centre of a square rotated by θ hits its face at distance 0.5/cos(θ mod 90° folded)
    th = np.minimum(theta % (np.pi / 2), np.pi / 2 - theta % (np.pi / 2))
    t_ref = 10 - 0.5 / np.cos(th)
    np.testing.assert_allclose(h["t"], t_ref, atol=1e-4)
    assert np.all(h["instance"] == 0) and np.all(h["object_id"] == 7)
    np.testing.assert_allclose(h["time"], times, atol=1e-7)
    # at t = 0.25 s the box is at y = -1: a ray at the t=0 position (y=-2) misses it
    miss = geo.trace([[0, -2, 0]], [[1, 0, 0]], 0.25).numpy()
    assert miss["face"][0] == -1


def test_time_window_refit_keeps_hits(device):
    bp, bf = box_mesh([-0.5, -0.5, -0.5], [0.5, 0.5, 0.5])
    s = Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), 0))
    s.prototypes.append(MeshData(bp, bf, 0))
    ts = np.linspace(0, 10, 101)
    s.instances.append(Instance(0, ts, np.column_stack([10 + 0 * ts, ts - 5, 0 * ts]), np.tile([0, 0, 0, 1.0], (101, 1))))
    geo = SceneGeometry(s, device)
    geo.set_time_window(4.0, 4.2)
    t = np.array([4.0, 4.05, 4.1, 4.2])
    h = geo.trace(np.column_stack([0 * t, t - 5, 0 * t]), np.tile([1.0, 0, 0], (4, 1)), t).numpy()
    np.testing.assert_allclose(h["t"], 9.5, atol=1e-4)


def test_swept_bounds_hold_the_instances_over_each_window(device):
    """The top-level box of a spinning, growing, moving instance over a time window holds its corners at every
    instant of the window's key segments (densely sampled), and stays within a few centimetres of the tightest box
    of those corners; a one-key instance's box is its box; a window between two keys gives that one segment's box,
    however often the windows change (the key boxes are made once)."""
    bp, bf = box_mesh([-1.0, -0.5, -0.25], [1.0, 0.5, 0.25])
    s = Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), 0))
    s.prototypes.append(MeshData(bp, bf, 0))
    ts = np.linspace(0.0, 4.0, 9)
    rots = np.array([quat_from_axis_angle([0.3, 0.2, 1.0], 0.7 * t) for t in ts])
    s.instances.append(Instance(0, ts, np.column_stack([3 * ts, np.sin(ts), 0.1 * ts]), rots,
                                np.column_stack([1 + 0.2 * ts, 1 + 0.1 * ts, 1 + 0 * ts])))
    s.instances.append(Instance(0, [0.0], [[5.0, 5.0, 0.0]], [quat_from_axis_angle([0, 0, 1], 0.5)], [[2.0, 1.0, 1.0]]))
    geo = SceneGeometry(s, device)
    corners = np.array([[x, y, z] for x in (-1.0, 1.0) for y in (-0.5, 0.5) for z in (-0.25, 0.25)])
    inst = s.instances[0]
    for w in [(0.3, 0.4), (0.6, 2.2), (1.0, 1.0), (3.9, 9.0), None, (0.3, 0.4)]:
        lo, hi = geo._swept_bounds(w)
        i0 = 0 if w is None else max(0, int(np.searchsorted(ts, w[0], side="right")) - 1)
        i1 = len(ts) - 1 if w is None else min(len(ts) - 1, int(np.searchsorted(ts, w[1], side="left")))
        pts = []
        for t in np.linspace(ts[i0], ts[i1], 400):
            k = min(int(np.searchsorted(ts, t, side="right")) - 1, len(ts) - 2)
            f = (t - ts[k]) / (ts[k + 1] - ts[k])
            q = quat_slerp(inst.rotations[k], inst.rotations[k + 1], f)
            sc = (1 - f) * inst.scales[k] + f * inst.scales[k + 1]
            tr = (1 - f) * inst.translations[k] + f * inst.translations[k + 1]
            pts.append((corners * sc) @ quat_to_matrix(q).T + tr)
        pts = np.concatenate(pts)
        assert np.all(lo[0] <= pts.min(0)) and np.all(hi[0] >= pts.max(0)), w
        assert np.all(pts.min(0) - lo[0] < 0.05) and np.all(hi[0] - pts.max(0) < 0.05), w
        q1 = s.instances[1]
        one = (corners * q1.scales[0]) @ quat_to_matrix(q1.rotations[0]).T + q1.translations[0]
        np.testing.assert_allclose(lo[1], one.min(0), atol=2e-3)
        np.testing.assert_allclose(hi[1], one.max(0), atol=2e-3)
        assert np.all(lo[1] <= one.min(0)) and np.all(hi[1] >= one.max(0))


def test_time_windows_of_renders_in_flight_are_kept(device):
    """Two renders on one scene at once (a lidar at t ≈ 1 s, a camera at t ≈ 8 s): while both trace, the top-level
    bounds cover both windows, so neither misses the moving box; alone, a render gets its tight window again."""
    bp, bf = box_mesh([-0.5, -0.5, -0.5], [0.5, 0.5, 0.5])
    s = Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), 0))
    s.prototypes.append(MeshData(bp, bf, 0))
    ts = np.linspace(0, 10, 101)
    s.instances.append(Instance(0, ts, np.column_stack([10 + 0 * ts, ts - 5, 0 * ts]), np.tile([0, 0, 0, 1.0], (101, 1))))
    geo = SceneGeometry(s, device)

    def hit_t(t):  # a ray along +x at the box centre's height at time t
        return geo.trace([[0.0, t - 5.0, 0.0]], [[1.0, 0, 0]], t).numpy()["t"][0]

    with geo.hold_time_window(1.0, 1.1):
        assert hit_t(1.05) == pytest.approx(9.5, abs=1e-4)
        with geo.hold_time_window(8.0, 8.1):  # opened by another thread meanwhile
            assert geo.time_window == (1.0, 8.1)
            assert hit_t(1.05) == pytest.approx(9.5, abs=1e-4)
            assert hit_t(8.05) == pytest.approx(9.5, abs=1e-4)
        assert hit_t(1.05) == pytest.approx(9.5, abs=1e-4)  # the other render finished first
    with geo.hold_time_window(8.0, 8.1):
        assert geo.time_window == (8.0, 8.1)  # tight again
        assert hit_t(8.05) == pytest.approx(9.5, abs=1e-4)
        # a trace bounds the boxes over its own rays' times too (the union with the render's window meanwhile)
        assert geo.trace([[0.0, -3.95, 0.0]], [[1.0, 0, 0]], 1.05).numpy()["t"][0] == pytest.approx(9.5, abs=1e-4)
        assert geo.time_window == (pytest.approx(1.05), 8.1)
        assert hit_t(8.05) == pytest.approx(9.5, abs=1e-4)


def test_trace_bounds_moving_instances_over_its_rays_times(device):
    """A trace refits the top-level boxes to its rays' times: a window set before (or none: all key times) neither
    hides a moving box from rays outside it nor leaves the box as long as its whole path; every hit is the same as
    under the window the rays need."""
    bp, bf = box_mesh([-0.5, -0.5, -0.5], [0.5, 0.5, 0.5])
    s = Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), 0))
    s.prototypes.append(MeshData(bp, bf, 0))
    ts = np.linspace(0, 10, 101)
    s.instances.append(Instance(0, ts, np.column_stack([10 + 0 * ts, ts - 5, 0 * ts]), np.tile([0, 0, 0, 1.0], (101, 1))))
    geo = SceneGeometry(s, device)
    geo.set_time_window(8.0, 8.1)
    t = np.array([1.0, 1.05, 2.5])
    h = geo.trace(np.column_stack([0 * t, t - 5.0, 0 * t]), np.tile([1.0, 0, 0], (3, 1)), t).numpy()
    np.testing.assert_allclose(h["t"], 9.5, atol=1e-4)  # outside the window set before: found
    assert geo.time_window == (1.0, 2.5)
    lo, hi = geo.geo.inst_lo.numpy(), geo.geo.inst_hi.numpy()
    assert lo[0, 1] == pytest.approx(-4.5, abs=5e-3) and hi[0, 1] == pytest.approx(-2.0, abs=5e-3)  # not -5 .. 5
    geo.trace([[0.0, 0.0, 0.0]], [[1.0, 0, 0]], 5.0)  # one instant: the box there
    np.testing.assert_allclose(geo.geo.inst_hi.numpy()[0, 1] - geo.geo.inst_lo.numpy()[0, 1], 1.0, atol=5e-3)
    # at 5.0 s the box spans y in [-0.5, 0.5]: a ray at y = 0.7 misses it, one at 0.4 hits
    h = geo.trace([[0.0, 0.7, 0.0], [0.0, 0.4, 0.0]], [[1.0, 0, 0], [1.0, 0, 0]], 5.0).numpy()
    assert h["face"][0] == -1 and h["t"][1] == pytest.approx(9.5, abs=1e-4)
    # times that are not finite bound nothing: all key times
    geo.trace([[0.0, 0.0, 0.0]], [[1.0, 0, 0]], np.array([np.nan], np.float32))
    assert geo.time_window == (5.0, 5.0)


def test_two_instances_share_one_blas(device):
    bp, bf = box_mesh([-1, -1, -1], [1, 1, 1])
    s = Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), 0))
    s.parts.append(Part("car_body", semantic_class=s.semantic_class_index("car")))
    s.prototypes.append(MeshData(bp, bf, 1, name="car"))
    ident = [0, 0, 0, 1.0]
    s.instances.append(Instance(0, [0.0], [[10, 0, 0]], [ident], object_id=1))
    s.instances.append(Instance(0, [0.0], [[-20, 0, 0]], [ident], scales=[[2, 2, 2]], object_id=2))
    geo = SceneGeometry(s, device)
    assert len(geo.prototype_meshes) == 1  # one BLAS for both
    h = geo.trace([[0, 0, 0], [0, 0, 0]], [[1, 0, 0], [-1, 0, 0]]).numpy()
    np.testing.assert_allclose(h["t"], [9.0, 18.0], atol=1e-4)
    assert list(h["object_id"]) == [1, 2] and list(h["instance"]) == [0, 1]
    assert list(h["semantic"]) == [1, 1]
    np.testing.assert_allclose(h["normal"], [[-1, 0, 0], [1, 0, 0]], atol=1e-5)


def test_continuing_queries_return_stack_in_order_and_shared_edge_once(device):
    # five parallel planes x = 2, 4, 6, 8, 10; each a 2-triangle quad whose diagonal lies in the plane y = z
    pts, faces = [], []
    for k, x in enumerate([2.0, 4.0, 6.0, 8.0, 10.0]):
        p, f = quad_mesh([x, 0, 0], [0, 3, 0], [0, 0, 3])
        pts.append(p)
        faces.append(f + 4 * k)
    scene = _static_scene(np.concatenate(pts), np.concatenate(faces))
    geo = SceneGeometry(scene, device)
    # ray 0 through the shared diagonal (y = z exactly): each plane must be reported once
    o = np.array([[0, 0.5, 0.5], [0, 1.0, -0.7], [0, -0.4, 0.4]])
    d = np.tile([1.0, 0, 0], (3, 1))
    h = geo.trace(o, d, max_hits=8).numpy()
    assert list(h["count"]) == [5, 5, 5]
    np.testing.assert_allclose(h["t"][:, :5], np.tile([2, 4, 6, 8, 10.0], (3, 1)), atol=1e-4)
    assert np.all(h["face"][:, 5:] == -1)
    # the same stack with a ray that starts between planes
    h2 = geo.trace([[5.0, 0.5, 0.5]], [[1.0, 0, 0]], max_hits=8).numpy()
    assert h2["count"][0] == 3
    np.testing.assert_allclose(h2["t"][0, :3], [1, 3, 5], atol=1e-4)


def test_ray_count_mismatch_is_an_error():
    p, f = quad_mesh([5.0, 0, 0], [0, 1, 0], [0, 0, 1])
    geo = SceneGeometry(_static_scene(p, f), "cpu")
    with pytest.raises(ValueError, match="directions"):
        geo.trace(np.zeros((3, 3)), np.ones((2, 3)))


def test_trace_reads_rays_of_any_layout_alike(device):
    """float32 rays are read in place on the CPU, others converted: read-only, float64, Fortran-ordered, strided and
    (H, W, 3) rays give the very hits of the plain ones, and tracing leaves the caller's arrays as they were."""
    p, f = quad_mesh([5.0, 0, 0], [0, 10, 0], [0, 0, 10])  # plane x = 5 facing -x
    geo = SceneGeometry(_static_scene(p, f), device)
    rng = np.random.default_rng(3)
    d = np.column_stack([np.ones(40), rng.uniform(-0.5, 0.5, (40, 2))]).astype(np.float32)
    o = rng.uniform(-1, 1, (40, 3)).astype(np.float32)
    keep_o, keep_d = o.copy(), d.copy()
    ref = geo.trace(o, d).numpy()
    np.testing.assert_allclose(ref["t"], (5.0 - o[:, 0]) * np.linalg.norm(d, axis=1) / d[:, 0], rtol=1e-5)
    ro, rd = o.copy(), d.copy()
    ro.flags.writeable = rd.flags.writeable = False
    wide = np.zeros((40, 6), np.float32)
    wide[:, ::2] = d
    cases = [(ro, rd), (o.astype(np.float64), d.astype(np.float64)), (np.asfortranarray(o), np.asfortranarray(d)),
             (o, wide[:, ::2]), (o.reshape(4, 10, 3), d.reshape(4, 10, 3))]
    for co, cd in cases:
        got = geo.trace(co, cd).numpy()
        for k in ref:
            assert np.array_equal(np.ascontiguousarray(got[k]).view(np.uint8),
                                  np.ascontiguousarray(ref[k]).view(np.uint8)), k
    assert np.array_equal(o, keep_o) and np.array_equal(d, keep_d)


def test_trace_times_of_one_instant_are_each_traces_own(device):
    """One time for all rays is kept in an array trace reuses: each answer carries its own call's time, also while
    an earlier answer is held, and per-ray times (NumPy float32 read in place, float64, lists) are each ray's."""
    p, f = quad_mesh([5.0, 0, 0], [0, 10, 0], [0, 0, 10])
    geo = SceneGeometry(_static_scene(p, f), device)
    n = 50
    o, d = np.zeros((n, 3)), np.tile([1.0, 0.0, 0.0], (n, 1))
    a = geo.trace(o, d, 1.5)
    b = geo.trace(o, d, 2.5)
    c = geo.trace(o, d, 2.5)
    del c
    e = geo.trace(o, d, 0.25)
    assert set(a.numpy()["time"]) == {1.5} and set(b.numpy()["time"]) == {2.5} and set(e.numpy()["time"]) == {0.25}
    per_ray = np.linspace(0.0, 1.0, n)
    for t in (per_ray.astype(np.float32), per_ray, list(per_ray)):
        np.testing.assert_array_equal(geo.trace(o, d, t).numpy()["time"], per_ray.astype(np.float32))
    with pytest.raises(ValueError):
        geo.trace(o, d, np.zeros(n + 1))


def test_trace_answers_held_by_the_caller_are_never_overwritten(device):
    """trace reuses an answer's arrays on the CPU once nothing holds them, and only then: a kept Hits, a NumPy
    view of its fields or a torch tensor of its records keeps its answer."""
    torch = pytest.importorskip("torch")
    p, f = quad_mesh([5.0, 0, 0], [0, 10, 0], [0, 0, 10])  # plane x = 5 facing -x
    geo = SceneGeometry(_static_scene(p, f), device)
    n = 300
    d = np.column_stack([np.ones(n), np.linspace(-0.5, 0.5, n), np.zeros(n)])
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    o = np.zeros((n, 3))
    far = o - [[3.0, 0.0, 0.0]]  # the same rays from 3 m further back: t grows by 3 / d_x
    t_near = 5.0 / d[:, 0]

    kept = geo.trace(o, d)
    other = geo.trace(far, d)  # (kept is held: a new array)
    assert kept.records.ptr != other.records.ptr
    np.testing.assert_allclose(kept.numpy()["t"], t_near, rtol=1e-5)
    np.testing.assert_allclose(other.numpy()["t"], t_near + 3.0 / d[:, 0], rtol=1e-5)

    t_view = geo.trace(o, d).numpy()["t"]  # the Hits dropped, a view of its field kept
    view_of = geo.trace(far, d)
    np.testing.assert_allclose(t_view, t_near, rtol=1e-5)
    masks = [geo.trace(o, d, max_hits=2)]  # the multi-hit records and counts as well
    geo.trace(far, d, max_hits=2)
    assert list(masks[0].numpy()["count"]) == [1] * n
    np.testing.assert_allclose(masks[0].numpy()["t"][:, 0], t_near, rtol=1e-5)
    del view_of, masks

    if device == "cpu":
        h = geo.trace(o, d)
        tensor = torch.from_numpy(h.numpy()["t"])  # a tensor sharing the answer's memory
        ptr = h.records.ptr
        del h
        again = geo.trace(far, d)
        assert again.records.ptr != ptr  # the tensor holds the first answer
        np.testing.assert_allclose(tensor.numpy(), t_near, rtol=1e-5)
        del tensor
        ptr = again.records.ptr
        del again
        reused = geo.trace(o, d)  # nothing holds it now: the same memory, the new answer
        assert reused.records.ptr == ptr
        np.testing.assert_allclose(reused.numpy()["t"], t_near, rtol=1e-5)


def test_geometry_view_with_other_instance_keys_shares_meshes(device):
    bp, bf = box_mesh([-0.5, -0.5, -0.5], [0.5, 0.5, 0.5])
    s = Scene(MeshData(np.zeros((0, 3)), np.zeros((0, 3)), 0))
    s.prototypes.append(MeshData(bp, bf, 0))
    ident = [0, 0, 0, 1.0]
    s.instances.append(Instance(0, [0.0], [[10, 0, 0]], [ident]))
    base = SceneGeometry(s, device)
    moved = Instance(0, [0.0, 1.0], [[20, 0, 0], [30, 0, 0]], [ident, ident])
    view = base.with_instances(s, [moved], (0.0, 1.0))
    assert view.prototype_meshes[0] is base.prototype_meshes[0]  # no BLAS rebuild
    h_view = view.trace([[0, 0, 0]], [[1, 0, 0]], 0.5).numpy()
    h_base = base.trace([[0, 0, 0]], [[1, 0, 0]], 0.5).numpy()
    np.testing.assert_allclose([h_view["t"][0], h_base["t"][0]], [24.5, 9.5], atol=1e-4)  # base unchanged
    with pytest.raises(ValueError, match="instances"):
        base.with_instances(s, [], None)


def _random_scene(seed=0, n_boxes=60):
    rng = np.random.default_rng(seed)
    pts, faces = [], []
    for k in range(n_boxes):
        c = rng.uniform(-20, 20, 3)
        p, f = box_mesh(c - rng.uniform(0.2, 3, 3), c + rng.uniform(0.2, 3, 3))
        pts.append(p)
        faces.append(f + 8 * k)
    room_p, room_f = box_mesh([-40, -40, -40], [40, 40, 40], inward=True)
    pts.append(room_p)
    faces.append(room_f + 8 * n_boxes)
    return _static_scene(np.concatenate(pts), np.concatenate(faces))


def test_wide_bvh_matches_mesh_query_ray():
    scene = _random_scene()
    wide = SceneGeometry(scene, "cpu", wide=True)
    ref = SceneGeometry(scene, "cpu", wide=False)
    assert wide.geo.use_wide == 1 and ref.geo.use_wide == 0
    d = _sphere_dirs(20000, seed=5)
    o = np.random.default_rng(6).uniform(-10, 10, (20000, 3))
    a, b = wide.trace(o, d).numpy(), ref.trace(o, d).numpy()
    same = a["face"] == b["face"]
    assert same.mean() > 0.999 and np.all(a["face"] >= 0)
    np.testing.assert_allclose(a["t"], b["t"], atol=1e-4)
    np.testing.assert_allclose(a["u"][same], b["u"][same], atol=1e-4)
    np.testing.assert_allclose(a["v"][same], b["v"][same], atol=1e-4)
    np.testing.assert_allclose(a["normal"][same], b["normal"][same], atol=1e-5)
    # continuing queries agree too
    a2, b2 = wide.trace(o[:2000], d[:2000], max_hits=4).numpy(), ref.trace(o[:2000], d[:2000], max_hits=4).numpy()
    assert np.array_equal(a2["count"], b2["count"])
    np.testing.assert_allclose(a2["t"], b2["t"], atol=1e-4)



def test_wide_bvh_leaves_of_five_to_eight_triangles_match_leaves_of_two():
    """Binary leaves of up to 8 triangles become wide leaves that the traversal tests in two groups of 4 SIMD lanes:
    every ray's (t, face, u, v) and normal equal those of the default tree (leaves of at most 3, one group) bit for bit
    (the same float operations per triangle; equal distances go to the smaller face either way)."""
    from wsim.scene.widebvh import _Plan

    scene = _random_scene(seed=3, n_boxes=400)
    big = SceneGeometry(scene, "cpu", leaf_size=8)
    plan = _Plan(big.static_mesh)
    assert big.geo.use_wide == 1 and plan.max_leaf_count > 4
    ref = SceneGeometry(scene, "cpu")
    d = _sphere_dirs(20000, seed=8)
    o = np.random.default_rng(9).uniform(-30, 30, (20000, 3))
    a, b = big.trace(o, d).numpy(), ref.trace(o, d).numpy()
    assert np.all(a["face"] >= 0)
    for k in ("t", "face", "u", "v", "normal"):
        assert np.array_equal(a[k], b[k]), k

def test_native_wide_build_is_the_reference_collapse():
    """The native build of the 8-wide BVH gives the very tree of the reference collapse (NumPy/Python over the
    exported binary BVH): same boxes, child references and triangle order, hence bit-identical hits."""
    from wsim.scene.widebvh import build_wide_bvh, collapse, export_bvh

    for scene in (_random_scene(), _static_scene(*quad_mesh([5.0, 0, 0], [0, 10, 0], [0, 0, 10]))):
        geo = SceneGeometry(scene, "cpu", wide=True)
        mesh = geo.static_mesh
        w = build_wide_bvh(mesh)
        b = export_bvh(mesh)
        ref = collapse(b)
        assert np.array_equal(w["boxes"].numpy().reshape(ref["boxes"].shape), ref["boxes"])
        assert np.array_equal(w["child"].numpy().reshape(ref["child"].shape), ref["child"])
        assert np.array_equal(w["fid"].numpy(), b["prim"].astype(np.int32))
        f = scene.static.indices[b["prim"]]
        for k, key in enumerate(("v0", "e1", "e2")):
            assert np.array_equal(w[key].numpy(), scene.static.points[f[:, k]].astype(np.float32))


def _instanced_scene() -> Scene:
    """Random static boxes plus two prototypes (a subdivided box, a cluster of boxes), each instanced still with
    rotation and non-uniform scale, and moving (translation, rotation and scale keys)."""
    s = _random_scene(seed=3, n_boxes=20)
    bp, bf = _subdivided_box([-1.0, -0.7, -0.5], [1.0, 0.7, 0.5], 6)
    cl = _random_scene(seed=4, n_boxes=12).static
    keep = cl.indices.max(1) < 12 * 8  # the boxes, not the room
    s.prototypes.append(MeshData(bp, bf, 1, name="box"))
    s.prototypes.append(MeshData(cl.points[:96] * 0.1, cl.indices[keep], 1, name="cluster"))
    rng = np.random.default_rng(8)
    for k in range(24):
        proto = k % 2
        if k < 12:
            q = quat_from_axis_angle(rng.normal(size=3), rng.uniform(0, np.pi))
            s.instances.append(Instance(proto, [0.0], [rng.uniform(-25, 25, 3)], [q],
                                        scales=[rng.uniform(0.5, 2.5, 3)], object_id=100 + k))
        else:
            ts = [0.0, 0.4, 1.0]
            qs = [quat_from_axis_angle(rng.normal(size=3), rng.uniform(0, np.pi)) for _ in ts]
            s.instances.append(Instance(proto, ts, rng.uniform(-25, 25, (3, 3)), qs,
                                        scales=rng.uniform(0.5, 2.5, (3, 3)), object_id=100 + k))
    return s


def _rays_at_instances(scene: Scene, n: int, seed: int, extent: float = 30.0, spread: float = 1.5):
    """n rays from uniform points in [-extent, extent]³ aimed at the instances' key positions (a normal scatter of
    ``spread`` metres), unit directions, and times over the keys' range and beyond: (o, d, times, rng)."""
    rng = np.random.default_rng(seed)
    o = rng.uniform(-extent, extent, (n, 3))
    targets = np.concatenate([i.translations for i in scene.instances])
    d = targets[rng.integers(0, len(targets), n)] + rng.normal(0, spread, (n, 3)) - o
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    return o, d, rng.uniform(-0.1, 1.1, n), rng


def test_wide_bvh_instances_match_mesh_query_ray(unbaked):
    """Instanced prototypes (still and moving, rotated, non-uniformly scaled) traced through their 8-wide BVHs
    give mesh_query_ray's hits: same instance, face, t within 1e-5 relative. (Parked ones traced as instances too;
    baked into the static tree: test_parked_instances_are_baked_into_the_static_tree_with_their_own_hits.)"""
    scene = _instanced_scene()
    wide = SceneGeometry(scene, "cpu", wide=True)
    ref = SceneGeometry(scene, "cpu", wide=False)
    assert np.all(wide.geo.inst_wide_root.numpy() >= 0) and np.all(ref.geo.inst_wide_root.numpy() == -1)
    n = 60000
    o, d, times, _ = _rays_at_instances(scene, n, 9)
    a, b = wide.trace(o, d, times).numpy(), ref.trace(o, d, times).numpy()
    on_inst = b["instance"] >= 0
    assert on_inst.mean() > 0.08 and (b["instance"][on_inst] >= 12).mean() > 0.2  # moving ones are hit too
    assert np.array_equal(a["instance"], b["instance"])
    assert (a["face"] == b["face"]).mean() > 0.999
    np.testing.assert_allclose(a["t"], b["t"], rtol=1e-5)
    same = (a["face"] == b["face"]) & on_inst
    np.testing.assert_allclose(a["normal"][same], b["normal"][same], atol=1e-5)
    np.testing.assert_allclose(a["u"][same], b["u"][same], atol=1e-4)
    assert np.array_equal(a["object_id"], b["object_id"]) and np.array_equal(a["part"], b["part"])
    # continuing queries through the instances agree too
    a2, b2 = (g.trace(o[:4000], d[:4000], times[:4000], max_hits=4).numpy() for g in (wide, ref))
    assert np.array_equal(a2["count"], b2["count"]) and np.array_equal(a2["instance"], b2["instance"])
    np.testing.assert_allclose(a2["t"], b2["t"], rtol=1e-5)
    # a view with other keys shares the pool
    view = wide.with_instances(scene, scene.instances)
    assert view.geo.proto_wide_boxes is wide.geo.proto_wide_boxes


@wp.kernel
def _cull_vs_tlas_kernel(geo: SceneGeo, o: wp.array[wp.vec3], d: wp.array[wp.vec3], t_max: wp.array[float],
                         found: wp.array[wp.int32], may: wp.array[wp.int32]):
    i = wp.tid()
    bq = wp.bvh_query_ray(geo.tlas, o[i], d[i])
    idx = int(0)
    k = int(0)
    while wp.bvh_query_next(bq, idx, t_max[i]):
        k += 1
    found[i] = k
    may[i] = wp.where(instances_may_meet(geo, o[i], d[i], t_max[i]), 1, 0)


@pytest.mark.parametrize("n_inst", [24, 300])
def test_instance_cull_tree_passes_every_ray_the_top_level_query_serves(n_inst, unbaked):
    """The 8-wide tree over the instances' boxes (CPU) lets a ray skip the top-level query only when that query
    would find nothing before t_max: random rays, rays aimed at box corners and along box faces, axis-parallel
    rays and origins on the boxes' planes, still and moving instances; most rays that meet no box are told so. A
    trace with the tree equals one without it, bit for bit."""
    scene = _instanced_scene()
    rng = np.random.default_rng(21)
    while len(scene.instances) < n_inst:
        k = len(scene.instances)
        q = quat_from_axis_angle(rng.normal(size=3), rng.uniform(0, np.pi))
        scene.instances.append(Instance(k % 2, [0.0], [rng.uniform(-60, 60, 3)], [q],
                                        scales=[rng.uniform(0.2, 1.5, 3)], object_id=100 + k))
    geo = SceneGeometry(scene, "cpu")
    geo.set_time_window(0.0, 1.0)
    assert geo.geo.use_inst_cull == 1
    lo, hi = geo.geo.inst_lo.numpy().astype(np.float64), geo.geo.inst_hi.numpy().astype(np.float64)
    n = 30000
    o = rng.uniform(-70, 70, (n, 3))
    pick = rng.integers(0, len(lo), n)
    corner = np.where(rng.random((n, 3)) < 0.5, lo[pick], hi[pick])
    d = rng.normal(size=(n, 3))
    aim = rng.random(n) < 0.5
    d[aim] = corner[aim] - o[aim]  # grazing a box at its corner
    face = rng.random(n) < 0.2  # origins on a box's plane, running inside it
    ax = rng.integers(0, 3, n)
    o[face, ax[face]] = corner[face, ax[face]]
    d[face, ax[face]] = 0.0
    par = rng.random(n) < 0.1  # axis-parallel
    d[par] = np.eye(3)[rng.integers(0, 3, par.sum())] * rng.choice([-1.0, 1.0], (par.sum(), 1))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    t_max = np.where(rng.random(n) < 0.5, 1e6, rng.uniform(0.0, 80.0, n))
    arr = lambda x, dt=wp.vec3: wp.array(np.ascontiguousarray(x, np.float32), dtype=dt, device="cpu")  # noqa: E731
    found, may = wp.zeros(n, dtype=wp.int32, device="cpu"), wp.zeros(n, dtype=wp.int32, device="cpu")
    wp.launch(_cull_vs_tlas_kernel, n, [geo.geo, arr(o), arr(d), arr(t_max, float), found, may], device="cpu")
    found, may = found.numpy() > 0, may.numpy() == 1
    assert found.mean() > 0.2
    assert not np.any(found & ~may), int((found & ~may).sum())
    assert (~may[~found]).mean() > 0.5
    times = rng.uniform(0.0, 1.0, n)
    m = n // 2  # and rays from inside the room aimed at its instances
    o[m:] = rng.uniform(-25, 25, (n - m, 3))
    d[m:] = 0.5 * (lo + hi)[rng.integers(0, 24, n - m)] + rng.normal(0, 1.0, (n - m, 3)) - o[m:]
    a = geo.trace(o, d, times).numpy()
    geo.geo.use_inst_cull = 0
    b = geo.trace(o, d, times).numpy()
    assert (b["instance"] >= 0).mean() > 0.1
    assert all(np.array_equal(np.ascontiguousarray(a[k]).view(np.uint8), np.ascontiguousarray(b[k]).view(np.uint8)) for k in a)


@wp.kernel
def _occluded_kernel(geo: SceneGeo, o: wp.array[wp.vec3], d: wp.array[wp.vec3], t_max: wp.array[float],
                     times: wp.array[float], out: wp.array[wp.int32]):
    i = wp.tid()
    out[i] = wp.where(occluded(geo, o[i], d[i], t_max[i], times[i]), 1, 0)


def test_shadow_rays_through_instances_match_their_closest_hits():
    """Shadow (any-hit) rays against instanced prototypes (still and moving, rotated, scaled): through the
    prototypes' 8-wide BVHs (CPU) and through mesh_query_ray_anyhit, a ray is occluded exactly when its closest hit
    lies before t_max (rays ending 1 mm short of or beyond a hit)."""
    scene = _instanced_scene()
    n = 40000
    o, d, times, rng = _rays_at_instances(scene, n, 12)
    for wide in (True, False):
        geo = SceneGeometry(scene, "cpu", wide=wide)
        h = geo.trace(o, d, times).numpy()
        hit = h["face"] >= 0
        assert hit.mean() > 0.08
        t_max = np.where(hit, np.where(rng.random(n) < 0.5, h["t"] - 1e-3, h["t"] + 1e-3), 1e4)
        arr = lambda x, dt=wp.vec3: wp.array(np.ascontiguousarray(x, np.float32), dtype=dt, device="cpu")  # noqa: E731
        out = wp.zeros(n, dtype=wp.int32, device="cpu")
        wp.launch(_occluded_kernel, n, [geo.geo, arr(o), arr(d), arr(t_max, float), arr(times, float), out],
                  device="cpu")
        occ = out.numpy() == 1
        expect = hit & (t_max > h["t"])
        assert np.array_equal(occ, expect), (wide, int((occ != expect).sum()))


@wp.kernel
def _beyond_kernel(geo: SceneGeo, o: wp.array[wp.vec3], d: wp.array[wp.vec3], times: wp.array[float], reach: float,
                   t_max: float, valid: wp.array[wp.int32], ref: wp.array[Hit], out: wp.array[Hit]):
    i = wp.tid()
    w = wide_closest(geo.wide_boxes, geo.wide_child, geo.wide_v0, geo.wide_e1, geo.wide_e2, geo.wide_fid, o[i], d[i],
                     reach)
    valid[i] = wp.where(w[1] < 0.0, 1, 0)  # the premise: no static surface within the reach
    ref[i] = closest_hit(geo, o[i], d[i], 0.0, t_max, times[i])
    if w[1] < 0.0:
        out[i] = closest_hit_beyond(geo, o[i], d[i], t_max, reach, times[i])


def _tie_scene() -> Scene:
    """A static wall at x = 20 and two coincident instances of a 2 m square panel lying in the wall's plane (|y|,
    |z| < 1), a third one 7 m before it higher up: ties between static and instance surfaces, and between
    instances."""
    p, f = quad_mesh([20.0, 0.0, 0.0], [0.0, 0.0, 8.0], [0.0, 8.0, 0.0])
    s = _static_scene(p, f)
    qp, qf = quad_mesh([1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0])
    s.prototypes.append(MeshData(qp, qf, 1, name="panel"))
    for k, (x, z) in enumerate(((19.0, 0.0), (19.0, 0.0), (12.0, 2.5))):
        s.instances.append(Instance(0, [0.0], [[x, 0.0, z]], [[0.0, 0.0, 0.0, 1.0]], object_id=100 + k))
    return s


@pytest.mark.parametrize("case", ["instanced", "ties"])
def test_closest_hit_beyond_the_static_reach_equals_closest_hit(case, unbaked):
    """A ray whose static surfaces all lie beyond a reach (a lidar packet met none within it) looks for the
    instances first (:func:`closest_hit_beyond`): every Hit field equals :func:`closest_hit`'s bit for bit —
    instance hits inside and beyond the reach, static hits before and behind instances, still and moving
    instances, and exact ties (a static wall and two coincident instances' faces in one plane: the static surface
    wins, then the first instance; the wall at exactly the reach: the static traversal past the reach finds it)."""
    if case == "instanced":
        scene = _instanced_scene()
        n = 60000
        o, d, times, _ = _rays_at_instances(scene, n, 5, extent=28.0, spread=2.0)
        reaches = (1.0, 4.0, 12.0)
    else:
        scene = _tie_scene()
        n = 40000
        rng = np.random.default_rng(6)
        o = np.zeros((n, 3)) + [0.0, 0.0, 0.0]
        o[:, 1:] = rng.integers(-4, 5, (n, 2)) * 0.25
        d = np.concatenate([np.full((n, 1), 20.0), rng.uniform(-1.5, 1.5, (n, 2))], axis=1)
        d[: n // 4, 1:] = 0.0  # axis-parallel rays: the same bits on the wall and on the boxes' far faces
        times = np.zeros(n)
        reaches = (5.0, 18.5, 20.0)  # (20: the wall at the reach itself, on the axis-parallel rays)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    geo = SceneGeometry(scene, "cpu")
    assert geo.geo.use_wide != 0
    arr = lambda x, dt=wp.vec3: wp.array(np.ascontiguousarray(x, np.float32), dtype=dt, device="cpu")  # noqa: E731
    kinds = set()
    for reach in reaches:
        valid = wp.zeros(n, dtype=wp.int32, device="cpu")
        ref = wp.zeros(n, dtype=Hit, device="cpu")
        out = wp.zeros(n, dtype=Hit, device="cpu")
        wp.launch(_beyond_kernel, n, [geo.geo, arr(o), arr(d), arr(times, float), reach, 1.0e3], [valid, ref, out],
                  device="cpu")
        v = valid.numpy() == 1
        assert v.mean() > 0.2, reach
        a, b = ref.numpy()[v], out.numpy()[v]
        for field in a.dtype.names:
            assert a[field].tobytes() == b[field].tobytes(), (reach, field)
        inst, hit, t = a["instance"], a["face"] >= 0, a["t"]
        kinds |= {"instance inside" if x else "instance beyond" for x in t[hit & (inst >= 0)] < reach}
        kinds |= {"static"} if (hit & (inst < 0)).any() else set()
        if case == "ties":
            ov, dv = o[v], d[v]
            tie = (dv[:, 1] == 0) & (dv[:, 2] == 0) & (np.abs(ov[:, 1]) < 1) & (np.abs(ov[:, 2]) < 1)
            assert tie.sum() > 100 and np.all(hit[tie] & (inst[tie] < 0))  # the wall's surface won the tie
            assert set(np.unique(inst[inst >= 0])) <= {0, 2}  # of two coincident instances, the first
    assert kinds == {"instance inside", "instance beyond", "static"}


@wp.kernel
def _t_vs_plane_distance_kernel(geo: SceneGeo, o: wp.array[wp.vec3], d: wp.array[wp.vec3], t: wp.array[float],
                                plane: wp.array[float], inst: wp.array[wp.int32]):
    i = wp.tid()
    h = closest_hit(geo, o[i], d[i], 0.0, 1.0e4, 0.0)
    t[i] = h.t
    inst[i] = wp.where(h.face >= 0, h.instance, -2)
    plane[i] = 0.0
    if h.face >= 0:
        plane[i] = hit_distance(geo, h, o[i], d[i])


def test_wide_bvh_first_hit_distance_is_the_plane_distance_from_the_vertices():
    """A first hit on the static mesh through the 8-wide BVH carries, bit for bit, the distance ``hit_distance``
    recomputes from the face's vertices (the lidar's IDEALIZED range takes it instead of recomputing): the built-in
    street block, rays in every direction from 1.7 m above its ground."""
    from wsim.scene.builtin import load_builtin_scene

    scene = load_builtin_scene()
    geo = SceneGeometry(scene, "cpu")
    assert geo.geo.use_wide == 1
    n = 200_000
    rng = np.random.default_rng(21)
    lo, hi = scene.static.points.min(0), scene.static.points.max(0)
    o = rng.uniform(lo, hi, (n, 3)) * [1.0, 1.0, 0.0] + [0.0, 0.0, 1.7]
    o[: n // 2] += rng.normal(0, 0.01, (n // 2, 3))
    d = _sphere_dirs(n, seed=22)
    arr = lambda x: wp.array(np.ascontiguousarray(x, np.float32), dtype=wp.vec3, device="cpu")  # noqa: E731
    t, plane = wp.zeros(n, dtype=float, device="cpu"), wp.zeros(n, dtype=float, device="cpu")
    inst = wp.zeros(n, dtype=wp.int32, device="cpu")
    wp.launch(_t_vs_plane_distance_kernel, n, [geo.geo, arr(o), arr(d), t, plane, inst], device="cpu")
    static = inst.numpy() == -1
    assert static.mean() > 0.5
    assert np.array_equal(t.numpy()[static].view(np.uint32), plane.numpy()[static].view(np.uint32))


def test_refit_static_updates_the_wide_bvh():
    p, f = quad_mesh([5.0, 0, 0], [0, 10, 0], [0, 0, 10])
    scene = _static_scene(p, f)
    geo = SceneGeometry(scene, "cpu")
    assert geo.trace([[0, 0, 0]], [[1, 0, 0]]).numpy()["t"][0] == pytest.approx(5.0, abs=1e-5)
    pts = geo.static_mesh.points.numpy()
    pts[:, 0] = 7.5
    geo.static_mesh.points.assign(pts)
    geo.refit_static()
    assert geo.trace([[0, 0, 0]], [[1, 0, 0]]).numpy()["t"][0] == pytest.approx(7.5, abs=1e-5)


def test_refit_static_with_a_baked_parked_instance_moves_the_static_surface_alone():
    """A parked instance baked into the static wide BVH: after the static mesh's points are edited and refit, the
    rebuilt tree holds the edited static surface and the instance where it was."""
    p, f = quad_mesh([5.0, 0, 0], [0, 10, 0], [0, 0, 10])
    scene = _static_scene(p, f)
    bp, bf = box_mesh([-0.5, -0.5, -0.5], [0.5, 0.5, 0.5])
    scene.prototypes.append(MeshData(bp, bf, 1))
    scene.instances.append(Instance(0, [0.0], [[3.0, 2.0, 0.0]], [[0.0, 0.0, 0.0, 1.0]], object_id=7))
    geo = SceneGeometry(scene, "cpu")
    assert geo.baked == [0]
    o, d = [[0, 0, 0], [0, 2, 0]], [[1, 0, 0], [1, 0, 0]]
    h = geo.trace(o, d).numpy()
    np.testing.assert_allclose(h["t"], [5.0, 2.5], atol=1e-5)
    pts = geo.static_mesh.points.numpy()
    pts[:, 0] = 7.5
    geo.static_mesh.points.assign(pts)
    geo.refit_static()
    h = geo.trace(o, d).numpy()
    np.testing.assert_allclose(h["t"], [7.5, 2.5], atol=1e-5)
    assert list(h["instance"]) == [-1, 0]


# ---------------------------------------------------------------------------------------------------------------------
# watertightness: rays aimed exactly at shared edges and vertices of closed meshes never pass through


@wp.kernel
def _edge_ray_kernel(geo: SceneGeo, ta: wp.array[wp.vec3], tb: wp.array[wp.vec3], olo: wp.array[wp.vec3],
                     ohi: wp.array[wp.vec3], in_plane: wp.array[wp.vec3i], seed: int, offset: int,
                     leak: wp.array[wp.uint8]):
    """Ray i aims from a random point of its target's interior box at a random point of target edge (a, b) (a = b:
    a vertex); one ray in four starts in an axis plane through the target (one direction component exactly 0) where
    ``in_plane`` allows it. A leak: no hit, or a hit farther than the target."""
    i = wp.tid() + offset
    j = i % ta.shape[0]
    st = wp.rand_init(seed, i)
    a = ta[j]
    p = a + wp.randf(st, 0.01, 0.99) * (tb[j] - a)
    lo = olo[j]
    hi = ohi[j]
    o = wp.vec3(lo[0] + wp.randf(st) * (hi[0] - lo[0]), lo[1] + wp.randf(st) * (hi[1] - lo[1]),
                lo[2] + wp.randf(st) * (hi[2] - lo[2]))
    if i % 4 == 3:
        k = int(wp.randi(st, 0, 3))
        if in_plane[j][k] != 0 and p[k] > lo[k] and p[k] < hi[k]:
            o[k] = p[k]
    v = p - o
    dist = wp.length(v)
    h = closest_hit(geo, o, v / dist, 0.0, 1.0e5, 0.0)
    bad = wp.uint8(0)
    if h.face < 0 or h.t > dist * (1.0 + 1.0e-5) + 1.0e-4:
        bad = wp.uint8(1)
    leak[i] = bad


def _crossing_targets(points: np.ndarray, faces: np.ndarray):
    """Targets a ray from inside must cross: edges shared by exactly two triangles (same float32 coordinates) where
    the surface is flat or convex, and vertices all of whose edges are such. Returns the edge ends (a, b; a = b for
    vertices), a triangle of each, and per target the axes k for which a ray in the plane x_k = const may be used
    (not when both triangles lie in that plane)."""
    uniq, inv = np.unique(np.asarray(points, np.float32), axis=0, return_inverse=True)
    f = inv.reshape(-1)[np.asarray(faces)]
    pts = uniq.astype(np.float64)
    nrm = np.cross(pts[f[:, 1]] - pts[f[:, 0]], pts[f[:, 2]] - pts[f[:, 0]])
    nrm /= np.linalg.norm(nrm, axis=1, keepdims=True)
    e = np.sort(np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]]), axis=1)
    opp = np.concatenate([f[:, 2], f[:, 0], f[:, 1]])
    tri = np.tile(np.arange(len(f)), 3)
    order = np.lexsort((e[:, 1], e[:, 0]))
    e, opp, tri = e[order], opp[order], tri[order]
    key, first, count = np.unique(e, axis=0, return_index=True, return_counts=True)
    two = count == 2
    i1, i2 = first[two], first[two] + 1
    ahead1 = np.einsum("ij,ij->i", nrm[tri[i1]], pts[opp[i2]] - pts[e[i1, 0]])
    ahead2 = np.einsum("ij,ij->i", nrm[tri[i2]], pts[opp[i1]] - pts[e[i1, 0]])
    ok = (ahead1 < 1e-6) & (ahead2 < 1e-6)  # neither triangle in front of the other's plane
    edges = key[two][ok]
    bad_vertex = np.zeros(len(uniq), bool)
    bad_vertex[key[~two].ravel()] = True
    bad_vertex[key[two][~ok].ravel()] = True
    used = np.zeros(len(uniq), bool)
    used[f.ravel()] = True
    verts = np.nonzero(used & ~bad_vertex)[0]
    vtri = np.zeros(len(uniq), int)
    for k in range(3):
        vtri[f[:, k]] = np.arange(len(f))
    both_axis = (np.abs(nrm[tri[i1]][ok]) > 1 - 1e-9) & (np.abs(nrm[tri[i2]][ok]) > 1 - 1e-9)
    in_plane = np.concatenate([~both_axis, np.zeros((len(verts), 3), bool)]).astype(np.int32)
    a = np.concatenate([uniq[edges[:, 0]], uniq[verts]])
    b = np.concatenate([uniq[edges[:, 1]], uniq[verts]])
    return a, b, np.concatenate([tri[i1][ok], vtri[verts]]), in_plane


def _count_leaks(scene: Scene, interior, n_rays: int, seed: int = 11) -> tuple[int, int]:
    """Leaks of ``n_rays`` rays (one launch) aimed at the crossing targets of the static mesh; ``interior(tri)`` gives
    the (lo, hi) box the ray of a target on triangle ``tri`` starts in."""
    geo = SceneGeometry(scene, "cpu")
    assert geo.geo.use_wide == 1
    a, b, tri, in_plane = _crossing_targets(scene.static.points, scene.static.indices)
    lo, hi = interior(tri)
    vec = lambda x: wp.array(np.ascontiguousarray(x, np.float32), dtype=wp.vec3, device="cpu")  # noqa: E731
    leak = wp.zeros(n_rays, dtype=wp.uint8, device="cpu")
    launch(_edge_ray_kernel, n_rays, [geo.geo, vec(a), vec(b), vec(lo), vec(hi),
                                      wp.array(in_plane, dtype=wp.vec3i, device="cpu"), seed], [leak], device="cpu")
    return int(leak.numpy().astype(np.int64).sum()), len(a)


def _subdivided_box(lo, hi, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Closed box from ``lo`` to ``hi``, each face an n × n grid of quads (two triangles), outward normals."""
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    g = np.linspace(0.0, 1.0, n + 1)
    uu, vv = np.meshgrid(g, g, indexing="ij")
    grid = np.arange((n + 1) ** 2).reshape(n + 1, n + 1)
    quad = np.stack([grid[:-1, :-1], grid[1:, :-1], grid[1:, 1:], grid[:-1, 1:]], -1).reshape(-1, 4)
    pts, faces = [], []
    for ax in range(3):
        u, v = (ax + 1) % 3, (ax + 2) % 3
        for side in (lo, hi):
            p = np.zeros((n + 1, n + 1, 3))
            p[..., ax] = side[ax]
            p[..., u] = lo[u] + uu * (hi[u] - lo[u])
            p[..., v] = lo[v] + vv * (hi[v] - lo[v])
            t = np.concatenate([quad[:, [0, 1, 2]], quad[:, [0, 2, 3]]]) + len(pts) * (n + 1) ** 2
            faces.append(t[:, ::-1] if side is lo else t)
            pts.append(p.reshape(-1, 3))
    return np.concatenate(pts), np.concatenate(faces)


@pytest.mark.parametrize("offset", [(0.0, 0.0, 0.0), (8000.0, -6000.0, 37.0)], ids=["origin", "10km"])
def test_wide_bvh_is_watertight_on_a_subdivided_box(offset):
    """CPU only: the 8-wide traversal (watertight triangle test, conservative box test); CUDA keeps Warp's
    mesh_query_ray."""
    lo, hi = np.array([-3.3, -2.1, -1.7]) + offset, np.array([4.1, 2.9, 2.3]) + offset
    p, f = _subdivided_box(lo, hi, 12)
    leaks, n_targets = _count_leaks(_static_scene(p, f), lambda tri: (np.tile(lo + 0.3, (len(tri), 1)),
                                                                      np.tile(hi - 0.3, (len(tri), 1))), 3_000_000)
    assert n_targets > 3000
    assert leaks == 0, f"{leaks} of 3M rays passed through"


def test_wide_bvh_is_watertight_on_the_builtin_buildings():
    """Rays from inside each building of the built-in street block at its walls', windows' and roof's shared edges
    and vertices (CPU, the 8-wide traversal)."""
    from wsim.scene.builtin import load_builtin_scene

    scene = load_builtin_scene()
    st = scene.static
    building = [p.object_id if scene.semantic_classes[p.semantic_class] == "building" else -1 for p in scene.parts]
    tri_building = np.asarray(building)[st.tri_part]
    sel = np.nonzero(tri_building >= 0)[0]
    ids, tri_b = np.unique(tri_building[sel], return_inverse=True)
    assert len(ids) >= 10
    corners = st.points[st.indices[sel]]  # (T, 3, 3)
    lo = np.array([corners[tri_b == k].reshape(-1, 3).min(0) for k in range(len(ids))]) + 0.5
    hi = np.array([corners[tri_b == k].reshape(-1, 3).max(0) for k in range(len(ids))]) - 0.5
    sub = Scene(MeshData(st.points, st.indices[sel], st.tri_part[sel]), source="buildings")
    sub.materials, sub.parts, sub.semantic_classes = scene.materials, scene.parts, scene.semantic_classes
    leaks, n_targets = _count_leaks(sub, lambda tri: (lo[tri_b[tri]], hi[tri_b[tri]]), 5_000_000)
    assert n_targets > 20000
    assert leaks == 0, f"{leaks} of 5M rays passed through"


@pytest.mark.slow
def test_wide_bvh_serves_meshes_beyond_2_to_the_24_triangles():
    """A 2049 × 4097 grid of 16.8 M triangles (more than a float holds exactly as a face index): the 8-wide BVH still
    serves it, and rays aimed at the last triangles get their exact face indices and distances."""
    nx, ny = 2049, 4097  # vertices: 2 · 2048 · 4096 = 2^24 triangles, plus one strip more
    nx += 1
    xs = np.arange(nx, dtype=np.float32) * 0.01
    ys = np.arange(ny, dtype=np.float32) * 0.01
    pts = np.zeros((nx * ny, 3), np.float32)
    pts[:, 0] = np.repeat(xs, ny)
    pts[:, 1] = np.tile(ys, nx)
    i = (np.arange(nx - 1)[:, None] * ny + np.arange(ny - 1)[None]).reshape(-1).astype(np.int32)
    faces = np.empty((2 * len(i), 3), np.int32)
    faces[0::2] = np.stack([i, i + ny, i + ny + 1], 1)
    faces[1::2] = np.stack([i, i + ny + 1, i + 1], 1)
    del i
    assert len(faces) > 1 << 24
    geo = SceneGeometry(_static_scene(pts, faces), "cpu")
    assert geo.geo.use_wide == 1
    # rays straight down onto the centres of the last few cells, from 5 m
    cells = np.arange(len(faces) // 2 - 6, len(faces) // 2)
    cx, cy = cells // (ny - 1), cells % (ny - 1)
    # the lower triangle of a cell (vertices i, i + ny, i + ny + 1) holds the point a third of the way in
    o = np.column_stack([(cx + 2 / 3) * 0.01, (cy + 1 / 3) * 0.01, np.full(len(cells), 5.0)])
    h = geo.trace(o, np.tile([0.0, 0.0, -1.0], (len(cells), 1))).numpy()
    np.testing.assert_array_equal(h["face"], 2 * cells)
    np.testing.assert_allclose(h["t"], 5.0, atol=1e-5)


def test_parked_instances_are_baked_into_the_static_tree_with_their_own_hits(monkeypatch):
    """Parked instances (one transform, positive scales; CPU) are traced as world copies of their triangles in the
    static 8-wide BVH: every ray gets the instance, face, part and object that tracing them in their own frame gives
    (t, u, v, normal within float rounding), ray by ray, in camera tiles (bit for bit the ray-by-ray answer) and in
    brief records; moving instances stay instances; a view that moves a baked instance traces it where the view puts
    it (the static tree without the baked ones)."""
    from wsim.scene import geometry as wgeo

    scene = _instanced_scene()
    parked = [k for k, i in enumerate(scene.instances) if not i.is_moving]
    baked = SceneGeometry(scene, "cpu")
    monkeypatch.setattr(wgeo, "BAKE_MAX_TRIANGLES", 0)
    ref = SceneGeometry(scene, "cpu")
    assert baked.baked == parked and ref.baked == []
    assert baked.geo.num_instances == len(scene.instances) - len(parked) and ref.geo.num_instances == len(scene.instances)
    n = 60000
    o, d, times, _ = _rays_at_instances(scene, n, 9)
    a, b = baked.trace(o, d, times).numpy(), ref.trace(o, d, times).numpy()
    on_parked = np.isin(b["instance"], parked)
    assert on_parked.mean() > 0.05 and (b["instance"] >= 12).mean() > 0.02
    assert (a["instance"] == b["instance"]).mean() > 0.9995 and (a["face"] == b["face"]).mean() > 0.999
    same = (a["face"] == b["face"]) & (a["instance"] == b["instance"])
    # (a world copy's vertices, some 30 m out, are rounded once more: µm, more at grazing angles)
    np.testing.assert_allclose(a["t"][same], b["t"][same], rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(a["point"][same], b["point"][same], atol=1e-4)
    # (barycentrics: that over the triangle's size, 1-2 cm on the subdivided box)
    np.testing.assert_allclose(a["u"][same], b["u"][same], atol=2e-3)
    np.testing.assert_allclose(a["v"][same], b["v"][same], atol=2e-3)
    np.testing.assert_allclose(a["normal"][same], b["normal"][same], atol=1e-4)
    for k in ("object_id", "part", "semantic"):
        assert np.array_equal(a[k][same], b[k][same])
    brief = baked.trace(o, d, times, brief=True).numpy()
    for k in ("t", "face", "instance", "u", "v"):
        assert np.array_equal(brief[k], a[k] if k != "t" else np.where(a["face"] >= 0, a["t"], 0.0)), k
    # camera tiles at one instant from one point, toward the parked ones: the ray-by-ray answers bit for bit
    k0 = max(parked, key=lambda k: int((a["instance"] == k).sum()))
    c = scene.instances[k0].translations[0]
    rows, cols = 40, 64
    yy, xx = np.meshgrid(np.linspace(-0.25, 0.25, rows), np.linspace(-0.4, 0.4, cols), indexing="ij")
    dirs = np.stack([xx, np.ones_like(xx), yy], -1).reshape(-1, 3)
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    org = np.broadcast_to(c - [0.0, 6.0, 0.0], dirs.shape)
    g = baked.trace(org, dirs, 0.3, grid=(rows, cols), brief=True).numpy()
    r1 = baked.trace(org, dirs, 0.3, brief=True).numpy()
    assert (r1["instance"] == k0).mean() > 0.2
    for k in r1:
        assert np.array_equal(np.ascontiguousarray(g[k]).view(np.uint8), np.ascontiguousarray(r1[k]).view(np.uint8)), k
    # a view moving a baked instance 200 m up (above the room): the rays that met it meet it there, raised alike,
    # and no longer where it was; a view keeping it keeps it baked
    was = scene.instances[k0]
    moved = Instance(was.prototype, [0.0], was.translations + [0.0, 0.0, 200.0], was.rotations, scales=was.scales,
                     object_id=was.object_id)
    view = baked.with_instances(scene, [moved if k == k0 else i for k, i in enumerate(scene.instances)])
    kept = baked.with_instances(scene, scene.instances)
    assert view.baked == [] and view.geo.num_instances == len(scene.instances) and kept.baked == parked
    on = a["instance"] == k0
    assert on.sum() > 500
    up = view.trace(o[on] + [0.0, 0.0, 200.0], d[on], times[on]).numpy()
    there = view.trace(o[on], d[on], times[on]).numpy()
    assert (up["instance"] == k0).mean() > 0.999 and not np.any(there["instance"] == k0)
    np.testing.assert_allclose(up["t"][up["instance"] == k0], a["t"][on][up["instance"] == k0], rtol=1e-4, atol=1e-4)
    assert np.array_equal(kept.trace(o, d, times).numpy()["face"], a["face"])
