"""The built-in default scene: a procedural street block, made by code here and shipped as files.

:func:`build_street_scene` makes it in memory (deterministic: every random choice comes from one seeded NumPy RNG).
``python -m wsim.scene.builtin [--out DIR]`` writes the shipped files ``wsim/data/street_block.usdc`` (USD stage, via
:func:`wsim.scene.usd.save_usd`) and ``wsim/data/street_block.usdz`` (NuRec-style artifact, via
:func:`wsim.scene.nurec.write_nurec`); :func:`load_builtin_scene` loads them. :func:`build_city` tiles the block into
an N × M city for scaling tests (``python -m wsim.scene.builtin --city N M [--out DIR]`` writes ``city_NxM.usdc``).

Layout (Z up, metres, x along the street, right-hand traffic):

- Road x in [-15, 125], y in [-5.5, 5.5] with a slight camber: two driving lanes (y in [-3.5, 0] eastbound,
  [0, 3.5] westbound) and a parking lane on each side; lane markings (dashed centre line, solid parking-lane lines)
  are thin raised quads of retroreflective road paint.
- Curbs and sidewalks (top at 0.15 m) for |y| in [5.5, 8.5]; a gravel/concrete ground plane behind them.
- Closed-box buildings on both sides from |y| = 10 with varied widths, depths and heights, brick or concrete walls,
  window openings on every facade holding inset clear-glass panes (a lidar sees through them into the interior).
- Street lights (steel poles, arm, emissive lamp), traffic signs (pole + plate with a retroreflective painted aluminum
  face), trees (bark trunk + jittered icosphere crowns of leaf_grass).
- One shared low-poly car prototype (4.5 x 1.9 x 1.5 m, centred on its cuboid centre): painted-steel hull and roof,
  clear-glass cabin, rubber tyres with aluminum rims, lights, seats. Six parked cars (static instances) and two moving
  cars (keys every 0.1 s for 12 s: eastbound at 9 m/s, westbound at 10 m/s).
- Ego trajectory: 12 s at 10 Hz, 8 m/s eastbound in the right lane; rig frame x forward, y left, z up, origin at
  ground level under the rear axle.
- Cameras: ``camera_front_wide_120fov`` (f-theta 1920x1080), ``camera_front_tele_30fov`` (OpenCV pinhole 1920x1080),
  ``camera_rear_fisheye_200fov`` (OpenCV fisheye 1280x800). Lidars (``Scene.metadata["sensor_rig"]``): PANDAR128 on
  the roof at (1.0, 0, 1.9) m and AT128 at the front bumper at (3.6, 0, 0.7) m, rig frame.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import numpy as np

from .materials import Material
from .primitives import _box, _cylinder, _grid, _prism, _quad, _ring_grid, icosphere
from .scene import CameraCalibration, Instance, MeshData, Part, Scene, SceneError, Trajectory
from .transforms import matrix_to_quat, quat_from_axis_angle

__all__ = [
    "SCENE_ID",
    "TIME_ORIGIN_US",
    "DATA_DIR",
    "USD_FILE",
    "NUREC_FILE",
    "SENSOR_RIG",
    "build_street_scene",
    "build_city",
    "write_city_file",
    "CITY_TILE",
    "load_builtin_scene",
    "write_builtin_files",
    "geometry_checksum",
    "main",
]

SCENE_ID = "wsim-street-block"
TIME_ORIGIN_US = 1_700_000_000_000_000
DURATION_S = 12.0
SEED = 20240611
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
USD_FILE = "street_block.usdc"
NUREC_FILE = "street_block.usdz"

ROAD_X = (-15.0, 125.0)
ROAD_HALF_WIDTH = 5.5
LANE_Y = 1.75
SIDEWALK_Y = (5.5, 8.5)
SIDEWALK_TOP = 0.15
BUILDING_Y0 = 10.0
CAR_SIZE = (4.5, 1.9, 1.5)

SENSOR_RIG = {
    "frame": "rig: x forward, y left, z up; origin at ground level under the rear axle",
    "lidars": {
        "lidar_top_360fov": {"type": "PANDAR128", "translation": [1.0, 0.0, 1.9],
                             "rotation_xyzw": [0.0, 0.0, 0.0, 1.0]},
        "lidar_front_at128": {"type": "AT128", "translation": [3.6, 0.0, 0.7], "rotation_xyzw": [0.0, 0.0, 0.0, 1.0]},
    },
    "vehicle": {"length": 4.8, "width": 1.9, "height": 1.55, "rear_axle_to_rear": 1.0, "wheelbase": 2.8},
}

Z = np.array([0.0, 0.0, 1.0])


# ---------------------------------------------------------------------------------------------------------------------
# scene assembly


class _Builder:
    def __init__(self, scene: Scene):
        self.scene = scene
        self.mats: dict[str, int] = {}
        self.parts: dict[str, int] = {}
        self.chunks: dict[str, list[tuple[np.ndarray, np.ndarray, int]]] = {}

    def material(self, key: str, base: str, coating: str = "none", attributes=(), color=(0.5, 0.5, 0.5)) -> None:
        self.mats[key] = self.scene.add_material(
            Material.from_labels(f"/World/Looks/{key}", base, coating, attributes, base_color=color))

    def part(self, name: str, mat: str, cls: str, oid: int) -> int:
        if name not in self.parts:
            self.parts[name] = self.scene.add_part(
                Part(name, self.mats[mat], self.scene.semantic_class_index(cls), oid))
        return self.parts[name]

    def add(self, target: str, geom: tuple[np.ndarray, np.ndarray], part: int) -> None:
        self.chunks.setdefault(target, []).append((np.asarray(geom[0], float), np.asarray(geom[1]), part))

    def mesh(self, target: str) -> MeshData:
        return MeshData.concatenate([MeshData(p, t, np.full(len(t), k)) for p, t, k in self.chunks.get(target, [])],
                                    name=target)


def _materials(b: _Builder) -> None:
    b.material("asphalt", "asphalt", color=(0.045, 0.045, 0.05))
    b.material("road_paint_white", "asphalt", "paint", ["retroreflective"], color=(0.8, 0.8, 0.78))
    b.material("road_paint_yellow", "asphalt", "paint", ["retroreflective"], color=(0.75, 0.5, 0.04))
    b.material("sidewalk_concrete", "concrete", color=(0.38, 0.37, 0.35))
    b.material("curb_concrete", "concrete", color=(0.5, 0.49, 0.47))
    b.material("ground_gravel", "gravel", color=(0.22, 0.2, 0.17))
    b.material("wall_brick_red", "brick", color=(0.33, 0.1, 0.06))
    b.material("wall_brick_brown", "brick", color=(0.25, 0.13, 0.07))
    b.material("wall_concrete_beige", "concrete", color=(0.55, 0.48, 0.36))
    b.material("wall_concrete_grey", "concrete", color=(0.42, 0.42, 0.43))
    b.material("roof_concrete", "concrete", color=(0.15, 0.15, 0.16))
    b.material("floor_concrete", "concrete", color=(0.3, 0.28, 0.26))
    b.material("window_glass", "clear_glass", "none", ["visually_transparent"], color=(0.08, 0.11, 0.14))
    b.material("pole_steel", "steel", "paint", color=(0.12, 0.13, 0.14))
    b.material("lamp", "plastic", "none", ["emissive"], color=(1.0, 0.92, 0.75))
    b.material("sign_face_red", "aluminum", "paint", ["retroreflective"], color=(0.6, 0.03, 0.03))
    b.material("sign_face_blue", "aluminum", "paint", ["retroreflective"], color=(0.02, 0.12, 0.55))
    b.material("sign_back", "aluminum", color=(0.55, 0.55, 0.56))
    b.material("bark", "bark", color=(0.12, 0.08, 0.05))
    b.material("foliage", "leaf_grass", color=(0.06, 0.2, 0.04))
    b.material("car_paint", "steel", "paint", color=(0.45, 0.04, 0.03))
    b.material("car_glass", "clear_glass", "none", ["visually_transparent"], color=(0.05, 0.06, 0.07))
    b.material("tyre", "rubber", color=(0.02, 0.02, 0.02))
    b.material("rim", "aluminum", color=(0.6, 0.6, 0.62))
    b.material("headlight", "plastic", color=(0.9, 0.9, 0.88))
    b.material("taillight", "plastic", color=(0.6, 0.02, 0.02))
    b.material("seat", "fabric", color=(0.05, 0.05, 0.06))


def _road_height(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Road camber: 3 cm higher on the centre line than at the curbs."""
    return 0.03 * (1.0 - (np.clip(np.abs(y), 0, ROAD_HALF_WIDTH) / ROAD_HALF_WIDTH) ** 2)


def _road(b: _Builder) -> None:
    x0, x1 = ROAD_X
    L = x1 - x0
    road = b.part("/World/Road/asphalt", "asphalt", "road", 1)
    b.add("static", _grid([x0, -ROAD_HALF_WIDTH, 0], [L, 0, 0], [0, 2 * ROAD_HALF_WIDTH, 0], int(L / 0.5),
                          int(2 * ROAD_HALF_WIDTH / 0.5), _road_height), road)
    white = b.part("/World/Road/markings_white", "road_paint_white", "lane_marking", 2)
    yellow = b.part("/World/Road/markings_centre", "road_paint_yellow", "lane_marking", 2)
    lift = 0.006

    def strip(xa: float, xb: float, yc: float, w: float, part: int) -> None:
        n = max(1, int(round((xb - xa) / 1.0)))
        b.add("static", _grid([xa, yc - w / 2, lift], [xb - xa, 0, 0], [0, w, 0], n, 1, _road_height), part)

    x = x0 + 1.0
    while x + 3.0 <= x1:  # dashed centre line: 3 m dash, 6 m gap
        strip(x, x + 3.0, 0.0, 0.15, yellow)
        x += 9.0
    for yc in (-3.5, 3.5):  # solid lines between driving and parking lanes
        strip(x0, x1, yc, 0.12, white)


def _sidewalks(b: _Builder) -> None:
    x0, x1 = ROAD_X
    L = x1 - x0
    for side, sgn in (("north", 1.0), ("south", -1.0)):
        oid = 3 if sgn > 0 else 4
        sw = b.part(f"/World/Sidewalk_{side}/slab", "sidewalk_concrete", "sidewalk", oid)
        curb = b.part(f"/World/Sidewalk_{side}/curb", "curb_concrete", "sidewalk", oid)
        yi, yo = sgn * SIDEWALK_Y[0], sgn * SIDEWALK_Y[1]
        yc = yi + sgn * 0.2
        # curb: 0.2 m wide, top 2 cm above the sidewalk
        b.add("static", _box([(x0 + x1) / 2, (yi + yc) / 2, (SIDEWALK_TOP + 0.02) / 2],
                             [L, 0.2, SIDEWALK_TOP + 0.02]), curb)
        lo, hi = sorted((yc, yo))
        b.add("static", _grid([x0, lo, SIDEWALK_TOP], [L, 0, 0], [0, hi - lo, 0], int(L / 0.5),
                              int(round((hi - lo) / 0.5))), sw)
        for xe in (x0, x1):  # end faces
            b.add("static", _quad([xe, lo, 0], [xe, hi, 0], [xe, hi, SIDEWALK_TOP], [xe, lo, SIDEWALK_TOP],
                                  normal=[np.sign(xe - (x0 + x1) / 2), 0, 0]), sw)
        b.add("static", _quad([x0, yo, 0], [x1, yo, 0], [x1, yo, SIDEWALK_TOP], [x0, yo, SIDEWALK_TOP],
                              normal=[0, sgn, 0]), sw)
        gr = b.part(f"/World/Ground_{side}", "ground_gravel", "ground", 5)
        depth = 40.0 - SIDEWALK_Y[1]
        y_lo = yo if sgn > 0 else -40.0
        b.add("static", _grid([x0, y_lo, 0], [L, 0, 0], [0, depth, 0], int(L / 2), int(depth / 2)), gr)


def _facade(b: _Builder, origin, n, length: float, height: float, floors: int, wall: int, glass: int) -> None:
    """A wall with window openings (bays x floors) and inset glass panes with reveals."""
    o, n = np.asarray(origin, float), np.asarray(n, float)
    u = np.cross(Z, n)
    nb = max(1, int(length // 3.2))
    bay = length / nb
    fh = height / floors
    ww, wh, sill, inset = min(1.6, bay - 0.9), min(1.6, fh - 1.2), 0.9, 0.15
    xs = [0.0]
    for i in range(nb):
        c = (i + 0.5) * bay
        xs += [c - ww / 2, c + ww / 2]
    xs.append(length)
    zs = [0.0]
    for f in range(floors):
        zs += [f * fh + sill, f * fh + sill + wh]
    zs.append(height)
    pts, tris, gl = [], [], []
    for i in range(len(xs) - 1):
        for j in range(len(zs) - 1):
            a = o + xs[i] * u + zs[j] * Z
            bb = o + xs[i + 1] * u + zs[j] * Z
            c = o + xs[i + 1] * u + zs[j + 1] * Z
            d = o + xs[i] * u + zs[j + 1] * Z
            if i % 2 == 1 and j % 2 == 1:  # window opening
                gl.append(_quad(a - inset * n, bb - inset * n, c - inset * n, d - inset * n, normal=n))
                centre = (a + c) / 2 - inset * n / 2
                for e0, e1 in ((a, bb), (bb, c), (c, d), (d, a)):
                    mid = (e0 + e1) / 2 - inset * n / 2
                    q = _quad(e0, e1, e1 - inset * n, e0 - inset * n, normal=centre - mid)
                    pts.append(q)
            else:
                pts.append(_quad(a, bb, c, d, normal=n))
    b.add("static", _merge(pts), wall)
    b.add("static", _merge(gl), glass)


def _merge(geoms: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    off, P, T = 0, [], []
    for p, t in geoms:
        P.append(p)
        T.append(np.asarray(t) + off)
        off += len(p)
    return np.concatenate(P), np.concatenate(T)


def _buildings(b: _Builder, rng: np.random.Generator) -> None:
    walls = ["wall_brick_red", "wall_brick_brown", "wall_concrete_beige", "wall_concrete_grey"]
    k = 0
    for sgn in (1.0, -1.0):
        x = ROAD_X[0] + rng.uniform(0.0, 3.0)
        while True:
            w = float(rng.uniform(12.0, 22.0))
            if x + w > ROAD_X[1]:
                break
            d = float(rng.uniform(10.0, 16.0))
            floors = int(rng.integers(3, 8))
            h = floors * 3.2 + float(rng.uniform(0.3, 1.2))
            wall_mat = walls[int(rng.integers(len(walls)))]
            oid = 100 + k
            name = f"/World/Buildings/building_{k:02d}"
            wall = b.part(f"{name}/walls", wall_mat, "building", oid)
            glass = b.part(f"{name}/windows", "window_glass", "building", oid)
            roof = b.part(f"{name}/roof", "roof_concrete", "building", oid)
            y_near = sgn * BUILDING_Y0
            y_far = sgn * (BUILDING_Y0 + d)
            ylo, yhi = sorted((y_near, y_far))
            corners = {  # facade origin (left end seen from outside) and outward normal
                "south": ([x, ylo, 0], [0, -1, 0], w), "north": ([x + w, yhi, 0], [0, 1, 0], w),
                "east": ([x + w, ylo, 0], [1, 0, 0], d), "west": ([x, yhi, 0], [-1, 0, 0], d),
            }
            for origin, nrm, length in corners.values():
                _facade(b, origin, nrm, length, h, floors, wall, glass)
            b.add("static", _quad([x, ylo, h], [x + w, ylo, h], [x + w, yhi, h], [x, yhi, h], normal=Z), roof)
            b.add("static", _quad([x, ylo, 0.02], [x + w, ylo, 0.02], [x + w, yhi, 0.02], [x, yhi, 0.02], normal=Z),
                  b.part(f"{name}/floor", "floor_concrete", "building", oid))
            x += w + float(rng.uniform(2.0, 6.0))
            k += 1


def _street_furniture(b: _Builder, rng: np.random.Generator) -> None:
    k = 0
    for sgn in (1.0, -1.0):  # street lights, every 25 m, staggered per side
        for x in np.arange(ROAD_X[0] + 8.0 + (12.5 if sgn < 0 else 0.0), ROAD_X[1] - 2.0, 25.0):
            oid = 200 + k
            name = f"/World/StreetLights/light_{k:02d}"
            pole = b.part(f"{name}/pole", "pole_steel", "pole", oid)
            y = sgn * 6.0
            b.add("static", _cylinder([x, y, SIDEWALK_TOP], 0.1, 7.5, 16, 10), pole)
            b.add("static", _box([x, y - sgn * 0.9, SIDEWALK_TOP + 7.4], [0.12, 1.8, 0.1]), pole)
            b.add("static", _box([x, y - sgn * 1.7, SIDEWALK_TOP + 7.25], [0.5, 0.3, 0.15]),
                  b.part(f"{name}/lamp", "lamp", "pole", oid))
            k += 1
    signs = [(20.0, -1.0, "red", "octagon"), (55.0, -1.0, "blue", "square"), (35.0, 1.0, "blue", "circle"),
             (90.0, 1.0, "red", "circle"), (105.0, -1.0, "red", "octagon")]
    for i, (x, sgn, colour, shape) in enumerate(signs):
        oid = 300 + i
        name = f"/World/Signs/sign_{i:02d}"
        y = sgn * 5.9
        b.add("static", _cylinder([x, y, SIDEWALK_TOP], 0.04, 2.7, 12, 4),
              b.part(f"{name}/pole", "pole_steel", "pole", oid))
        if shape == "octagon":
            a = np.pi / 8 + np.arange(8) * np.pi / 4
            poly = 0.38 * np.stack([np.cos(a), np.sin(a)], 1) / np.cos(np.pi / 8)
        elif shape == "circle":
            a = np.arange(24) * 2 * np.pi / 24
            poly = 0.35 * np.stack([np.cos(a), np.sin(a)], 1)
        else:
            poly = np.array([[-0.3, -0.3], [0.3, -0.3], [0.3, 0.3], [-0.3, 0.3]])
        # south-side signs face oncoming eastbound traffic (normal -x), north-side ones westbound traffic (+x)
        n = np.array([-1.0 if sgn < 0 else 1.0, 0.0, 0.0])
        u = np.cross(Z, n)
        centre = np.array([x, y, SIDEWALK_TOP + 2.45]) + n * 0.06
        front, back = _prism(poly, centre, u, Z, n, 0.03)
        b.add("static", front, b.part(f"{name}/face", f"sign_face_{colour}", "traffic_sign", oid))
        b.add("static", back, b.part(f"{name}/back", "sign_back", "traffic_sign", oid))
    sph_p, sph_t = icosphere(3)
    k = 0
    for sgn in (1.0, -1.0):
        for x in np.arange(ROAD_X[0] + 14.0 + (6.0 if sgn < 0 else 0.0), ROAD_X[1] - 4.0, 18.0):
            oid = 400 + k
            name = f"/World/Trees/tree_{k:02d}"
            y = sgn * 7.4 + float(rng.uniform(-0.2, 0.2))
            x = float(x + rng.uniform(-1.5, 1.5))
            trunk_h = float(rng.uniform(2.6, 3.4))
            b.add("static", _cylinder([x, y, SIDEWALK_TOP], 0.16, trunk_h + 0.8, 12, 6),
                  b.part(f"{name}/trunk", "bark", "vegetation", oid))
            crown = b.part(f"{name}/crown", "foliage", "vegetation", oid)
            for j in range(2):
                r = float(rng.uniform(1.3, 1.9))
                c = np.array([x + rng.uniform(-0.5, 0.5), y + rng.uniform(-0.4, 0.4),
                              SIDEWALK_TOP + trunk_h + r * 0.7 + j * 0.9])
                jitter = 1.0 + 0.12 * rng.uniform(-1.0, 1.0, size=(len(sph_p), 1))
                b.add("static", (c + r * sph_p * jitter * np.array([1.0, 1.0, 0.85]), sph_t), crown)
            k += 1


def _car(b: _Builder) -> MeshData:
    """The shared car prototype (local frame: x forward, y left, z up, origin at the cuboid centre)."""
    body = b.part("/World/Prototypes/car/body", "car_paint", "car", 0)
    glass = b.part("/World/Prototypes/car/windows", "car_glass", "car", 0)
    tyre = b.part("/World/Prototypes/car/tyres", "tyre", "car", 0)
    rim = b.part("/World/Prototypes/car/rims", "rim", "car", 0)
    head = b.part("/World/Prototypes/car/headlights", "headlight", "car", 0)
    tail = b.part("/World/Prototypes/car/taillights", "taillight", "car", 0)
    seat = b.part("/World/Prototypes/car/seats", "seat", "car", 0)
    t = "car"
    hw = CAR_SIZE[1] / 2
    # lower hull: side profile extruded across the width; side faces get a chamfer by insetting the top edge
    prof = np.array([[-2.12, 0.26], [2.12, 0.26], [2.25, 0.42], [2.24, 0.72], [2.05, 0.88], [0.95, 0.98],
                     [-1.9, 1.0], [-2.2, 0.9], [-2.25, 0.45]])
    rings = []
    for y, shrink in ((-hw + 0.06, 0.04), (-hw, 0.0), (hw, 0.0), (hw - 0.06, 0.04)):
        c = prof.mean(axis=0)
        pp = c + (prof - c) * (1 - shrink)
        rings.append(np.stack([pp[:, 0], np.full(len(pp), y), pp[:, 1]], 1))
    b.add(t, _ring_grid(np.array(rings)[:, ::-1]), body)  # reversed ring order: outward winding
    # cabin: a frustum; roof painted, the four sloped sides glass; thin pillars in paint
    lo = np.array([[-1.75, -0.86], [0.95, -0.86], [0.95, 0.86], [-1.75, 0.86]])
    hi = np.array([[-1.35, -0.7], [-0.05, -0.7], [-0.05, 0.7], [-1.35, 0.7]])
    zl, zh = 0.97, 1.5
    L = np.column_stack([lo, np.full(4, zl)])
    H = np.column_stack([hi, np.full(4, zh)])
    b.add(t, _quad(H[0], H[1], H[2], H[3], normal=Z), body)
    for i in range(4):
        j = (i + 1) % 4
        out = np.append((L[i, :2] + L[j, :2]) / 2, 0)
        b.add(t, _quad(L[i], L[j], H[j], H[i], normal=out), glass)
    for i in range(4):  # pillars at the four cabin corners
        mid = (L[i] + H[i]) / 2
        d = H[i] - L[i]
        p, f = _box([0, 0, 0], [0.08, 0.08, float(np.linalg.norm(d)) - 0.1])
        # align box z with the pillar direction
        zax = d / np.linalg.norm(d)
        xax = np.cross([0, 1, 0], zax)
        xax /= np.linalg.norm(xax)
        yax = np.cross(zax, xax)
        p = p @ np.stack([xax, yax, zax], 0) + mid
        b.add(t, (p, f), body)
    for x in (-1.4, 1.4):  # wheels: tyre tube + rim discs (axis along y)
        for sgn in (-1.0, 1.0):
            base = [x, sgn * (hw - 0.26), 0.34]
            p, f = _cylinder(base, 0.34, 0.25, 32, 2, axis=(0, sgn, 0), caps=(False, False))
            b.add(t, (p, f), tyre)
            pr, fr = _cylinder(np.asarray(base) + [0, sgn * 0.25, 0], 0.24, 0.0, 24, 1, axis=(0, sgn, 0),
                               caps=(False, True))
            b.add(t, (pr, fr), rim)
            ann = []  # tyre sidewall annulus between rim and tread
            ang = np.linspace(0, 2 * np.pi, 32, endpoint=False)
            for r in (0.24, 0.34):
                ann.append(np.stack([x + r * np.cos(ang), np.full(32, base[1] + sgn * 0.25),
                                     0.34 + r * np.sin(ang)], 1))
            pa, fa = _ring_grid(np.array(ann), (False, False))
            if np.dot(np.cross(pa[fa[0, 1]] - pa[fa[0, 0]], pa[fa[0, 2]] - pa[fa[0, 0]]), [0, sgn, 0]) < 0:
                fa = fa[:, ::-1]
            b.add(t, (pa, fa), tyre)
    for sgn in (-1.0, 1.0):
        b.add(t, _box([2.2, sgn * 0.68, 0.68], [0.1, 0.34, 0.12]), head)
        b.add(t, _box([-2.22, sgn * 0.7, 0.78], [0.08, 0.3, 0.1]), tail)
        b.add(t, _box([0.75, sgn * (hw + 0.06), 1.02], [0.12, 0.12, 0.1]), body)  # mirrors
        b.add(t, _box([-0.2, sgn * 0.42, 1.2], [0.5, 0.5, 0.45]), seat)
        b.add(t, _box([-1.15, sgn * 0.42, 1.15], [0.5, 0.5, 0.35]), seat)
    m = b.mesh(t)
    m.points -= np.array([0.0, 0.0, CAR_SIZE[2] / 2], dtype=np.float32)
    m.name = "/World/Prototypes/car"
    return m


def _yaw_quat(yaw: float) -> np.ndarray:
    return quat_from_axis_angle([0, 0, 1], yaw)


def _cars(scene: Scene, proto: int, car_class: int) -> None:
    zc = CAR_SIZE[2] / 2
    cub = np.array(CAR_SIZE)
    parked = [(8.0, -4.5, 0.0), (24.0, -4.5, 0.0), (61.0, -4.5, 0.0), (16.0, 4.5, np.pi), (47.0, 4.5, np.pi),
              (83.0, 4.5, np.pi)]
    for i, (x, y, yaw) in enumerate(parked):
        scene.instances.append(Instance(proto, [0.0], [[x, y, zc]], [_yaw_quat(yaw)], object_id=1000 + i,
                                        name=f"parked_car_{i}", semantic_class=car_class, cuboid=cub.copy()))
    times = np.round(np.arange(0, int(round(DURATION_S * 10)) + 1) * 0.1, 6)
    moving = [("moving_car_eastbound", 12.0, -LANE_Y, 9.0, 0.0), ("moving_car_westbound", 115.0, LANE_Y, -10.0, np.pi)]
    for i, (name, x0, y, v, yaw) in enumerate(moving):
        tr = np.stack([x0 + v * times, np.full_like(times, y), np.full_like(times, zc)], 1)
        rot = np.repeat(_yaw_quat(yaw)[None], len(times), 0)
        scene.instances.append(Instance(proto, times, tr, rot, object_id=1100 + i, name=name,
                                        semantic_class=car_class, cuboid=cub.copy()))


def _ftheta_params() -> dict:
    """NVIDIA-style f-theta: backward polynomial pixel distance → angle with 960 px ↔ 60 degrees."""
    c1, c2, c4 = 1.0e-3, 4.0e-8, -1.5e-14
    c3 = (np.pi / 3 - c1 * 960 - c2 * 960**2 - c4 * 960**4) / 960**3
    bw = [0.0, c1, c2, float(c3), c4, 0.0]
    max_angle = 1.1
    r = np.linspace(0, 1150.0, 400)
    th = np.polyval(bw[::-1], r)
    V = np.stack([th**k for k in range(1, 6)], 1)  # inverse with no constant term: r = sum_k a_k theta^k
    a, *_ = np.linalg.lstsq(V, r, rcond=None)
    fw = [0.0] + [float(x) for x in a]
    return {
        "principal_point_x": 958.7, "principal_point_y": 541.3, "reference_poly": "PIXELDIST_TO_ANGLE",
        "pixeldist_to_angle_poly": [float(x) for x in bw], "angle_to_pixeldist_poly": fw, "max_angle": max_angle,
        "linear_cde": [1.0, 0.0, 0.0],
    }


def _rot_cols(cx, cy, cz) -> np.ndarray:
    return matrix_to_quat(np.stack([cx, cy, cz], 1).astype(float))


def _cameras() -> dict[str, CameraCalibration]:
    fwd = _rot_cols([0, -1, 0], [0, 0, -1], [1, 0, 0])  # camera x → rig -y, y → -z, z → +x
    back = _rot_cols([0, 1, 0], [0, 0, -1], [-1, 0, 0])  # looking backwards
    f_tele = 960.0 / np.tan(np.radians(15.0))
    cams = [
        CameraCalibration("camera_front_wide_120fov", "ftheta", _ftheta_params(), (1920, 1080),
                          (np.array([1.7, 0.0, 1.5]), fwd), "ROLLING_TOP_TO_BOTTOM", "camera_front_wide_120fov@wsim"),
        CameraCalibration("camera_front_tele_30fov", "opencv_pinhole", {
            "principal_point_x": 961.2, "principal_point_y": 538.9, "focal_length_x": float(f_tele),
            "focal_length_y": float(f_tele), "radial_coeffs": [-0.11, 0.045, 0.0, 0.0, 0.0, 0.0],
            "tangential_coeffs": [1.2e-4, -2.1e-4], "thin_prism_coeffs": [0.0, 0.0, 0.0, 0.0]}, (1920, 1080),
            (np.array([1.75, 0.0, 1.45]), fwd), "ROLLING_TOP_TO_BOTTOM", "camera_front_tele_30fov@wsim"),
        CameraCalibration("camera_rear_fisheye_200fov", "opencv_fisheye", {
            "principal_point_x": 639.4, "principal_point_y": 401.2, "focal_length_x": 330.0, "focal_length_y": 330.0,
            "radial_coeffs": [0.052, -0.011, 0.0021, -0.0003], "max_angle": float(np.radians(100.0))}, (1280, 800),
            (np.array([-1.05, 0.0, 0.95]), back), "GLOBAL", "camera_rear_fisheye_200fov@wsim"),
    ]
    return {c.logical_id: c for c in cams}


def build_street_scene() -> Scene:
    """Make the built-in street block in memory (deterministic)."""
    rng = np.random.default_rng(SEED)
    scene = Scene(static=MeshData(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0)))
    b = _Builder(scene)
    _materials(b)
    _road(b)
    _sidewalks(b)
    _buildings(b, rng)
    _street_furniture(b, rng)
    scene.static = b.mesh("static")
    scene.static.name = "/World/Static"
    scene.prototypes = [_car(b)]
    _cars(scene, 0, scene.semantic_class_index("car"))
    times = np.round(np.arange(0, int(round(DURATION_S * 10)) + 1) * 0.1, 6)
    ego_t = np.stack([0.0 + 8.0 * times, np.full_like(times, -LANE_Y), np.zeros_like(times)], 1)
    scene.ego_trajectory = Trajectory(times, ego_t, np.repeat(np.array([[0.0, 0.0, 0.0, 1.0]]), len(times), 0))
    scene.cameras = _cameras()
    scene.scene_id = SCENE_ID
    scene.time_range = (0.0, DURATION_S)
    scene.time_origin_us = TIME_ORIGIN_US
    scene.metadata = {"sensor_rig": _copy(SENSOR_RIG), "generator": "wsim.scene.builtin", "seed": SEED}
    scene.validate()
    return scene


def _copy(d):
    import copy

    return copy.deepcopy(d)


def geometry_checksum(scene: Scene) -> str:
    """A SHA-256 over the scene's geometry, independent of triangle/vertex order (positions rounded to 1 mm).

    Covers every static triangle and every prototype triangle placed by each instance at its first key.
    """
    from .transforms import quat_to_matrix

    def tri_keys(points: np.ndarray, idx: np.ndarray) -> np.ndarray:
        if len(idx) == 0:
            return np.zeros((0, 9), dtype=np.int64)
        t = np.round(points[idx].astype(np.float64) * 1000.0).astype(np.int64)  # (M, 3, 3)
        # canonical vertex order within a triangle: rotate so the smallest vertex comes first (keeps winding)
        flat = t.reshape(len(t), 3, 3)
        keyv = flat[:, :, 0] * 1_000_003 ** 2 + flat[:, :, 1] * 1_000_003 + flat[:, :, 2]
        s = np.argmin(keyv, axis=1)
        order = (s[:, None] + np.arange(3)[None]) % 3
        canon = np.take_along_axis(flat, order[:, :, None], axis=1).reshape(len(t), 9)
        return canon

    parts = [tri_keys(scene.static.points, scene.static.indices)]
    for inst in scene.instances:
        pr = scene.prototypes[inst.prototype]
        m = quat_to_matrix(inst.rotations[0]) * inst.scales[0][None, :]
        pts = pr.points.astype(np.float64) @ m.T + inst.translations[0]
        parts.append(tri_keys(pts, pr.indices))
    allk = np.concatenate(parts)
    allk = allk[np.lexsort(allk.T[::-1])]
    return hashlib.sha256(np.ascontiguousarray(allk).tobytes()).hexdigest()


#: City tiles: blocks are repeated every CITY_TILE [m] in x (along the street) and y; the road, sidewalks and
#: ground planes of neighbouring blocks meet edge to edge.
CITY_TILE = (ROAD_X[1] - ROAD_X[0], 80.0)
#: Object ids of tile k are the block's ids + k * CITY_OBJECT_ID_STRIDE (the block's ids stay below it).
CITY_OBJECT_ID_STRIDE = 10_000
#: Most tiles :func:`build_city` makes (20 M triangles are about 200).
MAX_CITY_TILES = 1024


def build_city(n: int, m: int, *, block: Scene | None = None) -> Scene:
    """An ``n`` × ``m`` city: the street block (static geometry and its parked and moving cars) tiled ``n`` times
    along x and ``m`` times along y, for scaling tests without downloads (98,836 triangles a tile: 10 × 10 ≈ 9.9 M).

    The static meshes of all tiles form one static mesh; the cars stay instances of the one car prototype. Tile
    (i, j) is shifted by (i·140, j·80) m; its parts and instances are named ``/World/Tiles/tile_<i>_<j>/...`` and its
    object ids are the block's + k·:data:`CITY_OBJECT_ID_STRIDE` (k = j·n + i, so tile (0, 0) keeps the block's ids).
    The ego trajectory, cameras, time range and sensor rig are the block's (in tile (0, 0)).

    Args:
        n, m: Tiles along x and y (n·m <= :data:`MAX_CITY_TILES`).
        block: The block to tile (default :func:`build_street_scene`).
    """
    for v in (n, m):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"build_city: tile counts must be positive integers, got {n!r} x {m!r}")
    n, m = int(n), int(m)
    if n * m > MAX_CITY_TILES:
        raise ValueError(f"build_city: {n} x {m} = {n * m} tiles; at most {MAX_CITY_TILES}")
    block = block or build_street_scene()
    st = block.static
    tiles = [(i, j) for j in range(m) for i in range(n)]
    offsets = np.array([[i * CITY_TILE[0], j * CITY_TILE[1], 0.0] for i, j in tiles])
    scene = Scene(static=st, materials=list(block.materials), semantic_classes=list(block.semantic_classes))
    scene.parts = list(block.parts)
    static_parts = np.unique(st.tri_part)
    own = {int(p) for p in static_parts}
    # parts used only by instances (the car) are shared by every tile; static ones are copied per tile
    part_maps = []
    for k, (i, j) in enumerate(tiles):
        remap = np.arange(len(block.parts), dtype=np.int32)
        for p in sorted(own):
            old = block.parts[p]
            tail = old.name[len("/World"):] if old.name.startswith("/World") else "/" + old.name.lstrip("/")
            part = Part(f"/World/Tiles/tile_{i}_{j}{tail}", old.material, old.semantic_class,
                        old.object_id + k * CITY_OBJECT_ID_STRIDE if old.object_id else 0)
            if k == 0:
                scene.parts[p] = part
            else:
                remap[p] = scene.add_part(part)
        part_maps.append(remap)
    nv, T = len(st.points), len(tiles)
    # float32/int32 from the start (MeshData's dtypes): the tile offsets are exact in float32, so adding them there
    # rounds as adding in float64 and converting would, without the copies
    points = (st.points[None] + offsets.astype(np.float32)[:, None, :]).reshape(-1, 3)
    indices = (st.indices[None] + (np.arange(T, dtype=np.int32) * np.int32(nv))[:, None, None]).reshape(-1, 3)
    tri_part = np.concatenate([pm[st.tri_part] for pm in part_maps])
    colors = None if st.colors is None else np.tile(st.colors, (T, 1))
    uvs = None if st.uvs is None else np.tile(st.uvs, (T, 1, 1))
    scene.static = MeshData(points, indices, tri_part, colors, uvs, st.name or "/World/Static")
    scene.prototypes = list(block.prototypes)
    for k, (i, j) in enumerate(tiles):
        for inst in block.instances:
            scene.instances.append(Instance(
                inst.prototype, inst.times.copy(), inst.translations + offsets[k], inst.rotations.copy(),
                inst.scales.copy(), inst.object_id + k * CITY_OBJECT_ID_STRIDE if inst.object_id else 0,
                f"/World/Tiles/tile_{i}_{j}/{inst.name.rsplit('/', 1)[-1]}", inst.semantic_class,
                None if inst.cuboid is None else inst.cuboid.copy()))
    scene.ego_trajectory = block.ego_trajectory
    scene.cameras = dict(block.cameras)
    scene.scene_id = f"wsim-city-{n}x{m}"
    scene.time_range = block.time_range
    scene.time_origin_us = block.time_origin_us
    scene.metadata = _copy(block.metadata)
    scene.metadata.update({"generator": "wsim.scene.builtin.build_city", "city_tiles": [n, m],
                           "city_tile_size_m": list(CITY_TILE)})
    scene.validate()
    return scene


def write_city_file(n: int, m: int, out_dir: str | Path = ".", *, scene: Scene | None = None) -> Path:
    """Write :func:`build_city` ``(n, m)`` (or ``scene``, a city already built) as the USD stage
    ``city_<n>x<m>.usdc`` in ``out_dir``; returns its path."""
    from .usd import save_usd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"city_{n}x{m}.usdc"
    save_usd(scene if scene is not None else build_city(n, m), path)
    return path


def write_builtin_files(out_dir: str | Path = DATA_DIR, scene: Scene | None = None) -> tuple[Path, Path]:
    """Write ``street_block.usdc`` and ``street_block.usdz`` into ``out_dir``; returns their paths."""
    from .nurec import write_nurec
    from .usd import save_usd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scene = scene or build_street_scene()
    usd_path, nurec_path = out / USD_FILE, out / NUREC_FILE
    save_usd(scene, usd_path)
    write_nurec(scene, nurec_path, version_string="wsim-1", sequence_id=SCENE_ID)
    return usd_path, nurec_path


def load_builtin_scene(form: str = "usd") -> Scene:
    """Load the shipped built-in scene: ``form`` "usd" (street_block.usdc) or "nurec" (street_block.usdz).

    The built-in scene's scene id, time origin and sensor rig are filled in when the file form does not carry them.
    """
    if form == "usd":
        from .usd import load_usd

        path = DATA_DIR / USD_FILE
        if not path.exists():
            raise SceneError(f"{path}: built-in scene file missing; run `python -m wsim.scene.builtin`")
        scene = load_usd(path)
    elif form == "nurec":
        from .nurec import load_nurec

        path = DATA_DIR / NUREC_FILE
        if not path.exists():
            raise SceneError(f"{path}: built-in scene file missing; run `python -m wsim.scene.builtin`")
        scene = load_nurec(path)
    else:
        raise ValueError(f"unknown built-in scene form {form!r}: use 'usd' or 'nurec'")
    scene.scene_id = SCENE_ID
    if not scene.time_origin_us:
        scene.time_origin_us = TIME_ORIGIN_US
    if scene.time_range[1] <= scene.time_range[0]:
        scene.time_range = (0.0, DURATION_S)
    scene.metadata.setdefault("sensor_rig", _copy(SENSOR_RIG))
    return scene


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wsim.scene.builtin", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None,
                    help="output directory (default: the package's data folder; with --city the current folder)")
    ap.add_argument("--city", nargs=2, type=int, metavar=("N", "M"),
                    help=f"write an N x M tiling of the block as city_NxM.usdc instead (N*M <= {MAX_CITY_TILES})")
    args = ap.parse_args(argv)
    if args.city:
        n, m = args.city
        if n < 1 or m < 1 or n * m > MAX_CITY_TILES:
            ap.error(f"--city: N and M must be positive with N*M <= {MAX_CITY_TILES}")
        city = build_city(n, m)
        path = write_city_file(n, m, args.out or ".", scene=city)
        print(f"{city.scene_id}: {city.num_triangles:,} triangles ({city.static.num_triangles:,} static, "
              f"{len(city.instances)} instances)")
        print(f"  wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
        return 0
    args.out = args.out or str(DATA_DIR)
    scene = build_street_scene()
    paths = write_builtin_files(args.out, scene)
    print(f"{scene.scene_id}: {scene.static.num_triangles} static + "
          f"{scene.num_triangles - scene.static.num_triangles} instanced triangles "
          f"({len(scene.instances)} instances)")
    for p in paths:
        print(f"  wrote {p} ({p.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
