"""Procedural primitive meshes for the built-in scene (:mod:`wsim.scene.builtin`): quads, grids, boxes, ring grids,
cylinders, icospheres and prisms, each as (points (N, 3) float64, triangles (M, 3) int64) with outward-facing
counter-clockwise winding."""

from __future__ import annotations

import numpy as np


def _quad(a, b, c, d, normal=None) -> tuple[np.ndarray, np.ndarray]:
    p = np.array([a, b, c, d], dtype=np.float64)
    t = np.array([[0, 1, 2], [0, 2, 3]])
    if normal is not None and np.dot(np.cross(p[1] - p[0], p[2] - p[0]), normal) < 0:
        t = t[:, ::-1]
    return p, t


def _grid(origin, u, v, nu: int, nv: int, height=None) -> tuple[np.ndarray, np.ndarray]:
    """A (nu x nv)-cell grid spanning origin + [0,1]u + [0,1]v; normal u x v; optional z offset function."""
    s = np.linspace(0, 1, nu + 1)
    r = np.linspace(0, 1, nv + 1)
    ss, rr = np.meshgrid(s, r, indexing="ij")
    p = np.asarray(origin, float) + ss[..., None] * np.asarray(u, float) + rr[..., None] * np.asarray(v, float)
    p = p.reshape(-1, 3)
    if height is not None:
        p[:, 2] += height(p[:, 0], p[:, 1])
    i = np.arange(nu)[:, None] * (nv + 1) + np.arange(nv)[None, :]
    i = i.ravel()
    a, b, c, d = i, i + (nv + 1), i + (nv + 2), i + 1
    t = np.concatenate([np.stack([a, b, c], 1), np.stack([a, c, d], 1)])
    return p, t


def _box(center, size, yaw: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    h = np.asarray(size, float) / 2
    p = np.array([[x, y, z] for z in (-1, 1) for y in (-1, 1) for x in (-1, 1)], float) * h
    f = np.array([[0, 2, 1], [1, 2, 3], [4, 5, 6], [5, 7, 6], [0, 1, 4], [1, 5, 4],
                  [2, 6, 3], [3, 6, 7], [0, 4, 2], [2, 4, 6], [1, 3, 5], [3, 7, 5]])
    if yaw:
        c, s = np.cos(yaw), np.sin(yaw)
        p = p @ np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]]).T
    return p + np.asarray(center, float), f


def _ring_grid(rings: np.ndarray, closed_caps=(True, True)) -> tuple[np.ndarray, np.ndarray]:
    """Triangulate stacked rings (R, S, 3) into a tube; optional fan caps at the first/last ring."""
    nr, ns = rings.shape[:2]
    p = rings.reshape(-1, 3)
    tris = []
    for r in range(nr - 1):
        for s in range(ns):
            a, b = r * ns + s, r * ns + (s + 1) % ns
            c, d = a + ns, b + ns
            tris += [[a, b, d], [a, d, c]]
    pts = [p]
    n = len(p)
    if closed_caps[0]:
        pts.append(rings[0].mean(axis=0, keepdims=True))
        tris += [[n, (s + 1) % ns, s] for s in range(ns)]
        n += 1
    if closed_caps[1]:
        pts.append(rings[-1].mean(axis=0, keepdims=True))
        base = (nr - 1) * ns
        tris += [[n, base + s, base + (s + 1) % ns] for s in range(ns)]
    return np.concatenate(pts), np.asarray(tris)


def _cylinder(base, radius: float, height: float, segs: int, rings: int = 1, axis=(0, 0, 1),
              caps=(True, True)) -> tuple[np.ndarray, np.ndarray]:
    axis = np.asarray(axis, float)
    axis /= np.linalg.norm(axis)
    e1 = np.cross(axis, [1, 0, 0] if abs(axis[0]) < 0.9 else [0, 1, 0])
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(axis, e1)
    ang = np.linspace(0, 2 * np.pi, segs, endpoint=False)
    circle = radius * (np.cos(ang)[:, None] * e1 + np.sin(ang)[:, None] * e2)
    hs = np.linspace(0, height, rings + 1)
    ring_pts = np.asarray(base, float) + hs[:, None, None] * axis + circle[None]
    return _ring_grid(ring_pts, caps)


def icosphere(subdiv: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit icosphere with ``20 * 4**subdiv`` triangles (points (N, 3), triangles (M, 3))."""
    t = (1 + 5 ** 0.5) / 2
    p = [[-1, t, 0], [1, t, 0], [-1, -t, 0], [1, -t, 0], [0, -1, t], [0, 1, t], [0, -1, -t], [0, 1, -t],
         [t, 0, -1], [t, 0, 1], [-t, 0, -1], [-t, 0, 1]]
    f = [[0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11], [1, 5, 9], [5, 11, 4], [11, 10, 2], [10, 7, 6],
         [7, 1, 8], [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8], [3, 8, 9], [4, 9, 5], [2, 4, 11], [6, 2, 10],
         [8, 6, 7], [9, 8, 1]]
    pts = [np.array(v, float) / np.linalg.norm(v) for v in p]
    for _ in range(subdiv):
        cache: dict[tuple[int, int], int] = {}

        def mid(a: int, b: int) -> int:
            key = (min(a, b), max(a, b))
            if key not in cache:
                m = pts[a] + pts[b]
                pts.append(m / np.linalg.norm(m))
                cache[key] = len(pts) - 1
            return cache[key]

        nf = []
        for a, b, c in f:
            ab, bc, ca = mid(a, b), mid(b, c), mid(c, a)
            nf += [[a, ab, ca], [b, bc, ab], [c, ca, bc], [ab, bc, ca]]
        f = nf
    return np.array(pts), np.array(f)


def _prism(poly2d: np.ndarray, origin, u, v, n, thickness: float) -> tuple[tuple, tuple]:
    """Extrude a convex CCW polygon (in the (u, v) plane at origin) by ``thickness`` along -n.

    Returns ((front points, front tris), (back+rim points, back+rim tris)); the front faces +n.
    """
    poly2d = np.asarray(poly2d, float)
    o, u, v, n = (np.asarray(x, float) for x in (origin, u, v, n))
    front = o + poly2d[:, :1] * u + poly2d[:, 1:] * v
    back = front - thickness * n
    k = len(poly2d)
    ft = np.array([[0, i, i + 1] for i in range(1, k - 1)])
    if np.dot(np.cross(front[1] - front[0], front[2] - front[0]), n) < 0:
        ft = ft[:, ::-1]
    bt = ft[:, ::-1] + k
    rim = []
    for i in range(k):
        j = (i + 1) % k
        rim += [[i, j, k + j], [i, k + j, k + i]]
    rim = np.array(rim)
    centre = front.mean(axis=0)
    # orient the rim outwards
    a, b, c = front[rim[0, 0]], np.concatenate([front, back])[rim[0, 1]], np.concatenate([front, back])[rim[0, 2]]
    if np.dot(np.cross(b - a, c - a), a - centre) < 0:
        rim = rim[:, ::-1]
    return (front, ft), (np.concatenate([front, back]), np.concatenate([bt, rim]))
