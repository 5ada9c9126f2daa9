"""Geometry of USD prims as triangles, for the USD reader (:mod:`wsim.scene.usd_read`): ``UsdGeom.Mesh`` (polygons
fan-triangulated; ``displayColor`` and texture-coordinate primvars; face ``GeomSubset``s) and the gprims
``Cube/Sphere/Cylinder/Capsule/Cone/Plane``, tessellated with :data:`SEGMENTS` segments around their axis."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .scene import SceneError

#: Segments around the axis of tessellated round gprims (Sphere, Cylinder, Capsule, Cone).
SEGMENTS = 24

_GPRIMS = ("Cube", "Sphere", "Cylinder", "Cylinder_1", "Capsule", "Capsule_1", "Cone", "Plane")
_UV_PRIMVARS = ("st", "st0", "UVMap", "uv")


# ----------------------------------------------------------------------------------------------------------------------
# Tessellation of gprims (canonical axis Z, then permuted)
# ----------------------------------------------------------------------------------------------------------------------


def _lathe(rho: np.ndarray, z: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Surface of revolution about Z of a profile (rho, z) from bottom to top; rho == 0 points are poles.

    Triangles wind counter-clockwise seen from outside.
    """
    ang = np.arange(n) * (2 * np.pi / n)
    pts: list[np.ndarray] = []
    rings: list[np.ndarray] = []
    count = 0
    for r, zz in zip(rho, z):
        if r <= 0:
            pts.append(np.array([[0.0, 0.0, zz]]))
            rings.append(np.full(n, count))
            count += 1
        else:
            pts.append(np.stack([r * np.cos(ang), r * np.sin(ang), np.full(n, zz)], -1))
            rings.append(np.arange(count, count + n))
            count += n
    tris = []
    for a, b in zip(rings[:-1], rings[1:]):
        a1, b1 = np.roll(a, -1), np.roll(b, -1)
        tris.append(np.stack([a, a1, b1], -1))
        tris.append(np.stack([a, b1, b], -1))
    t = np.concatenate(tris)
    keep = (t[:, 0] != t[:, 1]) & (t[:, 1] != t[:, 2]) & (t[:, 0] != t[:, 2])
    return np.concatenate(pts), t[keep]


def _axis_permute(p: np.ndarray, axis: str) -> np.ndarray:
    """Rotate canonical Z-axis geometry so its axis is ``axis`` (a cyclic permutation, winding preserved)."""
    axis = str(axis).upper()
    if axis == "X":
        return p[:, [2, 0, 1]]
    if axis == "Y":
        return p[:, [1, 2, 0]]
    return p


def _tessellate(prim, type_name: str, t) -> tuple[np.ndarray, np.ndarray]:
    """(points, triangles) of a gprim in its local frame (stage units)."""

    def get(name, default):
        a = prim.GetAttribute(name)
        v = a.Get(t) if a else None
        return default if v is None else v

    n = SEGMENTS
    axis = get("axis", "Z")
    if type_name == "Cube":
        h = float(get("size", 2.0)) / 2
        p = np.array([[x, y, z] for z in (-h, h) for y in (-h, h) for x in (-h, h)], dtype=np.float64)
        # vertex i = x bit 0, y bit 1, z bit 2
        quads = [(0, 2, 3, 1), (4, 5, 7, 6), (0, 1, 5, 4), (2, 6, 7, 3), (0, 4, 6, 2), (1, 3, 7, 5)]
        tris = np.array([tri for a, b, c, d in quads for tri in ((a, b, c), (a, c, d))], dtype=np.int64)
        return p, tris
    if type_name == "Sphere":
        r = float(get("radius", 1.0))
        th = np.linspace(-np.pi / 2, np.pi / 2, n // 2 + 1)
        rho = r * np.cos(th)
        rho[0] = rho[-1] = 0.0
        return _lathe(rho, r * np.sin(th), n)
    if type_name in ("Cylinder", "Cylinder_1", "Cone"):
        h = float(get("height", 2.0))
        if type_name == "Cylinder_1":
            rb, rt = float(get("radiusBottom", 1.0)), float(get("radiusTop", 1.0))
        else:
            rb = float(get("radius", 1.0))
            rt = 0.0 if type_name == "Cone" else rb
        rho = [0.0, rb] + ([rt, 0.0] if rt > 0 else [0.0])
        z = [-h / 2, -h / 2] + ([h / 2, h / 2] if rt > 0 else [h / 2])
        p, tris = _lathe(np.array(rho), np.array(z), n)
        return _axis_permute(p, axis), tris
    if type_name in ("Capsule", "Capsule_1"):
        h = float(get("height", 1.0))
        if type_name == "Capsule_1":
            rb, rt = float(get("radiusBottom", 0.5)), float(get("radiusTop", 0.5))
        else:
            rb = rt = float(get("radius", 0.5))
        m = max(n // 4, 2)
        th_b = np.linspace(-np.pi / 2, 0, m + 1)
        th_t = np.linspace(0, np.pi / 2, m + 1)
        rho = np.concatenate([rb * np.cos(th_b), rt * np.cos(th_t)])
        z = np.concatenate([-h / 2 + rb * np.sin(th_b), h / 2 + rt * np.sin(th_t)])
        rho[0] = rho[-1] = 0.0
        p, tris = _lathe(rho, z, n)
        return _axis_permute(p, axis), tris
    if type_name == "Plane":
        w, ln = float(get("width", 2.0)) / 2, float(get("length", 2.0)) / 2
        p = np.array([[-w, -ln, 0], [w, -ln, 0], [w, ln, 0], [-w, ln, 0]], dtype=np.float64)
        tris = np.array([[0, 1, 2], [0, 2, 3]], dtype=np.int64)
        return _axis_permute(p, axis), tris
    raise AssertionError(type_name)


@dataclass
class _Geom:
    """Triangulated geometry of one prim in its local frame (stage units)."""

    points: np.ndarray  # (N, 3) float64
    tris: np.ndarray  # (M, 3) int64 point indices
    face_of_tri: np.ndarray  # (M,) source face per triangle
    colors: np.ndarray | None  # (N, 3) per-point colours
    const_color: tuple[float, float, float] | None  # constant displayColor
    uvs: np.ndarray | None  # (M, 3, 2)
    subsets: list  # [(subset prim, face indices)]
    nfaces: int = 0


def read_geometry(prim, type_name: str, t, file: str) -> _Geom:
    """Triangulated geometry of ``prim`` (a Mesh or one of the gprims) at time code ``t``, in its local frame (stage
    units); errors name ``file`` and the prim."""
    from pxr import UsdGeom

    where = f"{file}: {prim.GetPath()}"
    if type_name == "Mesh":
        mesh = UsdGeom.Mesh(prim)
        pts = mesh.GetPointsAttr().Get(t)
        pts = np.zeros((0, 3)) if pts is None else np.asarray(pts, dtype=np.float64).reshape(-1, 3)
        counts = mesh.GetFaceVertexCountsAttr().Get(t)
        counts = np.zeros(0, np.int64) if counts is None else np.asarray(counts, dtype=np.int64).ravel()
        fvi = mesh.GetFaceVertexIndicesAttr().Get(t)
        fvi = np.zeros(0, np.int64) if fvi is None else np.asarray(fvi, dtype=np.int64).ravel()
        if not np.all(np.isfinite(pts)):
            bad = int(np.argwhere(~np.isfinite(pts).all(axis=1))[0, 0])
            raise SceneError(f"{where}: non-finite (NaN/inf) point at index {bad}")
        if int(counts.sum()) != len(fvi) or np.any(counts < 0):
            raise SceneError(
                f"{where}: faceVertexCounts sum to {int(counts.sum())} but there are {len(fvi)} faceVertexIndices"
            )
        if len(fvi) and (fvi.min() < 0 or fvi.max() >= len(pts)):
            raise SceneError(
                f"{where}: faceVertexIndices out of range [0, {len(pts)}) "
                f"(min {int(fvi.min())}, max {int(fvi.max())})"
            )
        nf = len(counts)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]) if nf else np.zeros(0, np.int64)
        ntri = np.maximum(counts - 2, 0)
        face_of_tri = np.repeat(np.arange(nf), ntri)
        first = np.concatenate([[0], np.cumsum(ntri)[:-1]]) if nf else np.zeros(0, np.int64)
        k = np.arange(len(face_of_tri)) - first[face_of_tri] + 1
        s = starts[face_of_tri]
        corners = np.stack([s, s + k, s + k + 1], -1)
        orient = mesh.GetOrientationAttr().Get()
        if orient == "leftHanded":
            corners = corners[:, [0, 2, 1]]
        tris = fvi[corners]
        colors, const = _display_color(prim, t, len(pts), fvi, counts, face_of_tri, corners)
        uvs = _uvs(prim, t, len(pts), len(fvi), nf, tris, corners, face_of_tri)
        subsets = []
        all_subs = [
            sub for sub in UsdGeom.Subset.GetAllGeomSubsets(UsdGeom.Imageable(prim))
            if sub.GetElementTypeAttr().Get() in (None, "face")
        ]
        if any(sub.GetFamilyNameAttr().Get() == "materialBind" for sub in all_subs):
            all_subs = [sub for sub in all_subs if sub.GetFamilyNameAttr().Get() == "materialBind"]
        for sub in all_subs:
            idx = sub.GetIndicesAttr().Get(t)
            idx = np.zeros(0, np.int64) if idx is None else np.asarray(idx, dtype=np.int64).ravel()
            if len(idx) and (idx.min() < 0 or idx.max() >= nf):
                raise SceneError(f"{file}: {sub.GetPath()}: GeomSubset face index out of range [0, {nf})")
            subsets.append((sub.GetPrim(), idx))
        return _Geom(pts, tris, face_of_tri, colors, const, uvs, subsets, nf)
    pts, tris = _tessellate(prim, type_name, t)
    face_of_tri = np.arange(len(tris))
    corners = np.arange(3 * len(tris)).reshape(-1, 3)
    colors, const = _display_color(
        prim, t, len(pts), tris.ravel(), np.full(len(tris), 3), face_of_tri, corners
    )
    return _Geom(pts, tris, face_of_tri, colors, const, None, [], len(tris))


def _display_color(prim, t, npts, fvi, counts, face_of_tri, corners):
    from pxr import UsdGeom

    pv = UsdGeom.PrimvarsAPI(prim).GetPrimvar("displayColor")
    if not pv or not pv.HasAuthoredValue():
        return None, None
    v = pv.ComputeFlattened(t)
    if v is None or len(v) == 0:
        return None, None
    v = np.asarray(v, dtype=np.float64).reshape(-1, 3)
    interp = pv.GetInterpolation()
    if interp == "constant" or len(v) == 1:
        return None, tuple(float(x) for x in v[0])
    colors = np.full((npts, 3), 0.5)
    if interp in ("vertex", "varying") and len(v) == npts:
        return v.copy(), None
    if interp == "uniform" and len(v) == len(counts):
        colors[fvi] = np.repeat(v, counts, axis=0)
        return colors, None
    if interp == "faceVarying" and len(v) == len(fvi):
        colors[fvi] = v
        return colors, None
    return None, tuple(float(x) for x in v.mean(axis=0))


def _uvs(prim, t, npts, nfv, nf, tris, corners, face_of_tri):
    from pxr import UsdGeom

    api = UsdGeom.PrimvarsAPI(prim)
    for name in _UV_PRIMVARS:
        pv = api.GetPrimvar(name)
        if not pv or not pv.HasAuthoredValue():
            continue
        v = pv.ComputeFlattened(t)
        if v is None or len(v) == 0:
            continue
        v = np.asarray(v, dtype=np.float32).reshape(-1, 2)
        interp = pv.GetInterpolation()
        if interp == "faceVarying" and len(v) == nfv:
            return v[corners]
        if interp in ("vertex", "varying") and len(v) == npts:
            return v[tris]
        if interp == "uniform" and len(v) == nf:
            return np.repeat(v[face_of_tri][:, None, :], 3, axis=1)
        if interp == "constant":
            return np.broadcast_to(v[0], (len(tris), 3, 2)).copy()
    return None
