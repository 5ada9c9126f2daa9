"""USD stages ↔ :class:`~wsim.scene.scene.Scene`.

:func:`load_usd` reads ``.usda/.usdc/.usd/.usdz`` stages with usd-core (``pxr``); :func:`save_usd` writes a Scene back
as a stage that :func:`load_usd` reads to an equivalent Scene.

Conventions on the stage (read and written):

- Geometry: every ``UsdGeom.Mesh`` (polygons fan-triangulated, face ``GeomSubset``s become parts) and the gprims
  ``Cube/Sphere/Cylinder/Capsule/Cone/Plane`` (tessellated with :data:`SEGMENTS` segments around their axis).
- Units: ``metersPerUnit`` and ``upAxis`` are applied so the Scene is in metres, Z up (a Y-up stage is rotated by
  +90° about X: (x, y, z) → (x, -z, y)). A stage without authored metadata uses USD's fallbacks.
- Moving objects: a geometry prim whose world transform is time-sampled (any xformOp on it or an ancestor has time
  samples) becomes a prototype mesh plus an :class:`Instance` keyed at the union of those samples
  (seconds = timeCode / timeCodesPerSecond). Native instances (``instanceable``) and ``PointInstancer`` placements
  share one prototype mesh per USD prototype.
- Materials: the bound ``UsdShade.Material`` gives the base colour (``UsdPreviewSurface`` ``inputs:diffuseColor``,
  or the file of a ``UsdUVTexture`` connected to it), the SimReady labels ``omni:simready:nonvisual:base|coating|
  attributes`` (or the older ``inputs:nonvisual:*`` strings), and the overrides ``float wsim:reflectance`` /
  ``float wsim:transmittance``. Unbound meshes use ``primvars:displayColor``.
- Semantics: ``token[] semantics:labels:class`` (first label) or the older ``semantic:<name>:params:semanticType ==
  "class"`` + ``semanticData``, inherited down the tree (nearest ancestor wins).
- Object ids: 1, 2, 3, … per geometry prim / instance placement in stage traversal order; an authored
  ``int wsim:objectId`` on the prim takes precedence (automatic ids skip the authored ones).
- Cameras: ``UsdGeom.Camera`` prims are listed in ``Scene.camera_prims``; a camera carrying
  ``string wsim:camera:calibration`` (JSON ``{"model", "params", "resolution": [w, h], "shutter_type",
  "logical_id", "unique_id"}``) becomes a :class:`CameraCalibration` whose ``camera_to_rig`` is the camera's transform
  relative to its parent prim, converted from USD camera axes (-Z forward, +Y up) to OpenCV axes (x right, y down,
  z forward) by a 180° rotation about X. Lidars: prims with ``omni:sensor:Core:scanType`` or of type ``OmniLidar``.
- Ego trajectory: the prim with ``bool wsim:egoRig = true``; its world transform at its time samples.
- Layer metadata: ``customLayerData["wsim:sceneId"]`` (scene id; the file stem otherwise) and optionally
  ``customLayerData["wsim:timeOriginUs"]`` (a decimal string).
- Files written by :func:`save_usd` use ``timeCodesPerSecond`` = :data:`TIME_CODES_PER_SECOND` (1000: a time code is
  a millisecond).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .materials import Material, decode_material_id
from .scene import CameraCalibration, Instance, MeshData, Part, Scene, SceneError, Trajectory
from .transforms import compose_matrix, decompose_matrix

__all__ = ["load_usd", "save_usd", "SEGMENTS", "TIME_CODES_PER_SECOND"]

#: Segments around the axis of tessellated round gprims (Sphere, Cylinder, Capsule, Cone).
SEGMENTS = 24
#: timeCodesPerSecond of stages written by :func:`save_usd`.
TIME_CODES_PER_SECOND = 1000.0

_GPRIMS = ("Cube", "Sphere", "Cylinder", "Cylinder_1", "Capsule", "Capsule_1", "Cone", "Plane")
_UV_PRIMVARS = ("st", "st0", "UVMap", "uv")
_NONVISUAL_PREFIXES = ("omni:simready:nonvisual:", "inputs:nonvisual:")
# 180° about X: USD camera axes (x right, y up, z backward) <-> OpenCV camera axes (x right, y down, z forward).
_RX180 = np.diag([1.0, -1.0, -1.0, 1.0])


def _pxr():
    try:
        from pxr import Gf, Sdf, Usd, UsdGeom, UsdShade, Vt
    except ImportError as e:  # pragma: no cover - usd-core is a hard dependency
        raise ImportError("wsim.scene.usd needs usd-core (pip install usd-core)") from e
    return Gf, Sdf, Usd, UsdGeom, UsdShade, Vt


# ----------------------------------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------------------------------


def _col(m) -> np.ndarray:
    """pxr row-vector matrix (p' = p·M) → numpy column-vector matrix (p' = M p)."""
    return np.array(m, dtype=np.float64).reshape(4, 4).T


def _transform_points(m: np.ndarray, p: np.ndarray) -> np.ndarray:
    return p @ m[:3, :3].T + m[:3, 3]


def _up_matrix(up_axis: str, meters_per_unit: float) -> np.ndarray:
    """Stage coordinates → wsim coordinates (metres, Z up)."""
    c = np.diag([meters_per_unit] * 3 + [1.0])
    if str(up_axis).upper() == "Y":
        r = np.array([[1, 0, 0, 0], [0, 0, -1, 0], [0, 1, 0, 0], [0, 0, 0, 1]], dtype=np.float64)
        c = r @ c
    return c


def _semantic_label(prim) -> str | None:
    """The prim's own semantic class label, or None."""
    a = prim.GetAttribute("semantics:labels:class")
    if a and a.HasAuthoredValue():
        v = a.Get()
        if isinstance(v, str):
            return v or None
        if v is not None and len(v):
            return str(v[0])
    for name in prim.GetAuthoredPropertyNames():
        if name.startswith("semantic:") and name.endswith(":params:semanticType"):
            if str(prim.GetAttribute(name).Get()).lower() == "class":
                d = prim.GetAttribute(name[: -len("semanticType")] + "semanticData").Get()
                if d:
                    return str(d)
    return None


def _attr_value(prim, name: str):
    a = prim.GetAttribute(name)
    if a and a.HasAuthoredValue():
        return a.Get()
    return None


def _split_labels(v) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [s.strip() for s in re.split(r"[,;\s]+", v) if s.strip()]
    out: list[str] = []
    for x in v:
        out.extend(_split_labels(str(x)))
    return out


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


# ----------------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------------


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


@dataclass
class _Piece:
    """Geometry ready to be concatenated: points in the target frame, global part indices per triangle."""

    points: np.ndarray
    tris: np.ndarray
    tri_part: np.ndarray
    colors: np.ndarray | None
    uvs: np.ndarray | None

    def transformed(self, m: np.ndarray) -> _Piece:
        tris = self.tris if np.linalg.det(m[:3, :3]) >= 0 else self.tris[:, [0, 2, 1]]
        uvs = self.uvs if self.uvs is None or tris is self.tris else self.uvs[:, [0, 2, 1]]
        return _Piece(_transform_points(m, self.points), tris, self.tri_part, self.colors, uvs)


class _Loader:
    def __init__(self, path: Path, time_range: tuple[float, float] | None):
        self.path = path
        self.file = str(path)
        self.time_window = time_range
        _, _, Usd, UsdGeom, _, _ = _pxr()
        self.Usd, self.UsdGeom = Usd, UsdGeom
        self.stage = self._open()
        self.t0 = Usd.TimeCode.EarliestTime()
        self.mpu = float(UsdGeom.GetStageMetersPerUnit(self.stage))
        self.up = str(UsdGeom.GetStageUpAxis(self.stage))
        self.tcps = float(self.stage.GetTimeCodesPerSecond()) or 24.0
        self.C = _up_matrix(self.up, self.mpu)
        self.S = np.diag([self.mpu] * 3 + [1.0])
        self.S_inv = np.diag([1.0 / self.mpu] * 3 + [1.0])
        self.scene = Scene(static=MeshData(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0)))
        self.scene.source = self.file
        self._xcaches: dict[Any, Any] = {}
        self._materials: dict[str, int] = {}
        self._material_has_color: dict[int, bool] = {}
        self._prototypes: dict[str, int] = {}
        self._local_cache: dict[str, list[_Piece]] = {}
        self.static_pieces: list[_Piece] = []
        self.pending_ids: list[tuple[int | None, Callable[[int], None]]] = []
        self.unsupported: list[tuple[str, str]] = []
        self.all_codes: set[float] = set()
        self.geometry_found = False
        self.ego_prim = None

    # -- stage ---------------------------------------------------------------------------------------------------------
    def _open(self):
        Usd = self.Usd
        if not self.path.exists():
            raise SceneError(f"{self.file}: file not found")
        if not self.path.is_file():
            raise SceneError(f"{self.file}: not a file")
        from pxr import Sdf

        layer = Sdf.Layer.Find(self.file)
        if layer is not None and not layer.dirty:
            # a layer still held elsewhere in the process: pick up changes made to the file since it was opened
            try:
                layer.Reload()
            except Exception:  # noqa: BLE001 - a stale layer is only an optimisation problem
                pass
        try:
            stage = Usd.Stage.Open(self.file, Usd.Stage.LoadAll)
        except Exception as e:  # noqa: BLE001 - pxr raises Tf.ErrorException
            raise SceneError(f"{self.file}: not a readable USD file ({pxr_error_message(e, self.file)})") from e
        if stage is None:
            raise SceneError(f"{self.file}: not a readable USD file")
        return stage

    def xcache(self, code=None):
        key = "t0" if code is None else float(code)
        c = self._xcaches.get(key)
        if c is None:
            c = self.UsdGeom.XformCache(self.t0 if code is None else self.Usd.TimeCode(code))
            self._xcaches[key] = c
        return c

    def world(self, prim, code=None) -> np.ndarray:
        """Stage-space local-to-world matrix (column form, stage units)."""
        return _col(self.xcache(code).GetLocalToWorldTransform(prim))

    def relative(self, prim, root) -> np.ndarray:
        if prim == root:
            return np.eye(4)
        m, _ = self.xcache().ComputeRelativeTransform(prim, root)
        return _col(m)

    def where(self, prim) -> str:
        return f"{self.file}: {prim.GetPath()}"

    def codes_in_window(self, codes: set[float]) -> list[float]:
        c = sorted(codes)
        if self.time_window is None or len(c) < 2:
            return c
        lo, hi = self.time_window[0] * self.tcps, self.time_window[1] * self.tcps
        i0 = max(int(np.searchsorted(c, lo, side="right")) - 1, 0)
        i1 = min(int(np.searchsorted(c, hi, side="left")), len(c) - 1)
        return c[i0 : i1 + 1]

    # -- materials -----------------------------------------------------------------------------------------------------
    def material_of(self, prim) -> int | None:
        """Scene material index of the material bound to ``prim`` (None when nothing is bound)."""
        from pxr import UsdShade

        try:
            mat, _ = UsdShade.MaterialBindingAPI(prim).ComputeBoundMaterial()
        except Exception:  # noqa: BLE001
            mat = None
        if not mat or not mat.GetPrim().IsValid():
            return None
        key = str(mat.GetPath())
        if key not in self._materials:
            m, has_color = self._read_material(mat)
            idx = self.scene.add_material(m)
            self._materials[key] = idx
            self._material_has_color[idx] = has_color
        return self._materials[key]

    def _read_material(self, mat) -> tuple[Material, bool]:
        from pxr import Sdf, UsdShade

        prim = mat.GetPrim()
        path = str(prim.GetPath())
        labels: dict[str, Any] = {}
        for key in ("base", "coating", "attributes"):
            for prefix in _NONVISUAL_PREFIXES:
                v = _attr_value(prim, prefix + key)
                if v is not None:
                    labels[key] = v
                    break
        refl = _attr_value(prim, "wsim:reflectance")
        trans = _attr_value(prim, "wsim:transmittance")
        color, texture, has_color = (0.5, 0.5, 0.5), None, False
        try:
            shader = mat.ComputeSurfaceSource()
            shader = shader[0] if isinstance(shader, tuple) else shader
        except Exception:  # noqa: BLE001
            shader = None
        if shader and shader.GetPrim().IsValid():
            inp = shader.GetInput("diffuseColor")
            if inp:
                for attr in inp.GetValueProducingAttributes():
                    if UsdShade.Output.IsOutput(attr):
                        src = UsdShade.Shader(attr.GetPrim())
                        f = src.GetInput("file")
                        fv = f.Get() if f else None
                        if isinstance(fv, Sdf.AssetPath) and fv.path:
                            texture = fv.resolvedPath or fv.path
                            if not os.path.isabs(texture):
                                texture = str((self.path.parent / texture).resolve())
                            has_color = True
                        break
                    v = attr.Get()
                    if v is not None:
                        color, has_color = tuple(float(x) for x in v), True
                        break
        try:
            m = Material.from_labels(
                path,
                str(labels.get("base") or "none"),
                str(labels.get("coating") or "none"),
                _split_labels(labels.get("attributes")),
                base_color=color,
                reflectance=None if refl is None else float(refl),
                transmittance=None if trans is None else float(trans),
                texture=texture,
            )
        except ValueError as e:
            raise SceneError(f"{self.file}: material {path}: {e}") from e
        return m, has_color

    def display_color_material(self, rgb: tuple[float, float, float]) -> int:
        name = "displayColor({:.4f}, {:.4f}, {:.4f})".format(*rgb)
        if name not in self._materials:
            idx = self.scene.add_material(Material(name, tuple(float(x) for x in rgb)))
            self._materials[name] = idx
            self._material_has_color[idx] = True
        return self._materials[name]

    # -- geometry ------------------------------------------------------------------------------------------------------
    def geometry(self, prim, type_name: str) -> _Geom:
        UsdGeom = self.UsdGeom
        where = self.where(prim)
        t = self.t0
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
            colors, const = self._display_color(prim, len(pts), fvi, counts, face_of_tri, corners)
            uvs = self._uvs(prim, len(pts), len(fvi), nf, tris, corners, face_of_tri)
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
                    raise SceneError(f"{self.file}: {sub.GetPath()}: GeomSubset face index out of range [0, {nf})")
                subsets.append((sub.GetPrim(), idx))
            return _Geom(pts, tris, face_of_tri, colors, const, uvs, subsets, nf)
        pts, tris = _tessellate(prim, type_name, t)
        face_of_tri = np.arange(len(tris))
        corners = np.arange(3 * len(tris)).reshape(-1, 3)
        colors, const = self._display_color(
            prim, len(pts), tris.ravel(), np.full(len(tris), 3), face_of_tri, corners
        )
        return _Geom(pts, tris, face_of_tri, colors, const, None, [], len(tris))

    def _display_color(self, prim, npts, fvi, counts, face_of_tri, corners):
        pv = self.UsdGeom.PrimvarsAPI(prim).GetPrimvar("displayColor")
        if not pv or not pv.HasAuthoredValue():
            return None, None
        v = pv.ComputeFlattened(self.t0)
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

    def _uvs(self, prim, npts, nfv, nf, tris, corners, face_of_tri):
        api = self.UsdGeom.PrimvarsAPI(prim)
        for name in _UV_PRIMVARS:
            pv = api.GetPrimvar(name)
            if not pv or not pv.HasAuthoredValue():
                continue
            v = pv.ComputeFlattened(self.t0)
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

    def piece(self, prim, type_name: str, sem: str | None, object_parts: list[Part] | None) -> _Piece:
        """Geometry of one prim (local frame, stage units) with its parts added to the scene."""
        g = self.geometry(prim, type_name)
        path = str(prim.GetPath())
        mat = self.material_of(prim)
        colors = g.colors
        if mat is None:
            mat = self.display_color_material(g.const_color) if g.const_color is not None else 0
        elif g.const_color is not None and not self._material_has_color.get(mat, False):
            colors = np.broadcast_to(np.asarray(g.const_color), (len(g.points), 3)).copy()
        scene = self.scene
        face_local = np.zeros(g.nfaces, np.int64)
        specs: list[tuple[str, int, str | None]] = [(path, mat, sem)]
        for j, (sub_prim, idx) in enumerate(g.subsets):
            face_local[idx] = j + 1
            sub_mat = self.material_of(sub_prim)
            if sub_mat is None:
                sub_mat = mat
            sub_sem = _semantic_label(sub_prim) or sem
            specs.append((f"{path}.{sub_prim.GetName()}", sub_mat, sub_sem))
        tri_local = face_local[g.face_of_tri] if len(g.face_of_tri) else np.zeros(0, np.int64)
        used = np.unique(tri_local)
        mapping = np.zeros(len(specs), np.int64)
        for u in used:
            name, m, s = specs[int(u)]
            part = Part(name, m, scene.semantic_class_index(s or ""), 0)
            mapping[u] = scene.add_part(part)
            if object_parts is not None:
                object_parts.append(part)
        return _Piece(g.points, g.tris, mapping[tri_local].astype(np.int32), colors, g.uvs)

    # -- traversal -----------------------------------------------------------------------------------------------------
    def run(self) -> Scene:
        stage, Usd, UsdGeom = self.stage, self.Usd, self.UsdGeom
        scene = self.scene
        layer_data = stage.GetRootLayer().customLayerData or {}
        scene.scene_id = str(layer_data.get("wsim:sceneId") or self.path.stem)
        origin = layer_data.get("wsim:timeOriginUs")
        if origin is not None:
            try:
                scene.time_origin_us = int(origin)
            except (TypeError, ValueError):
                pass
        scene.metadata = {"usd": {"metersPerUnit": self.mpu, "upAxis": self.up, "timeCodesPerSecond": self.tcps}}
        self.has_render = False
        for p in stage.Traverse(Usd.TraverseInstanceProxies()):
            a = p.GetAttribute("purpose")
            if a and a.HasAuthoredValue() and a.Get() == "render":
                self.has_render = True
                break
        for child in stage.GetPseudoRoot().GetChildren():
            self._walk(child, None, set(), False)

        if not self.geometry_found:
            raise SceneError(f"{self.file}: empty stage (no renderable geometry under any prim)")
        self._assign_ids()
        self._finish_static()
        self._ego()
        self._time_range()
        if self.unsupported:
            kinds = sorted({t for _, t in self.unsupported})
            for path, t in self.unsupported:
                scene.skipped.append(f"{path}: unsupported prim type {t}")
            warnings.warn(
                f"{self.file}: skipped {len(self.unsupported)} prim(s) of unsupported type(s) {', '.join(kinds)}: "
                + ", ".join(p for p, _ in self.unsupported[:10])
                + (" ..." if len(self.unsupported) > 10 else ""),
                stacklevel=3,
            )
        scene.validate()
        return scene

    def _skip_purpose(self, prim) -> bool:
        a = prim.GetAttribute("purpose")
        if not a or not a.HasAuthoredValue():
            return False
        p = a.Get()
        return p == "guide" or (p == "proxy" and self.has_render)

    def _invisible(self, prim) -> bool:
        a = prim.GetAttribute("visibility")
        return bool(a) and a.HasAuthoredValue() and a.Get(self.t0) == "invisible"

    def _walk(self, prim, sem: str | None, codes: set[float], hidden: bool) -> None:
        UsdGeom = self.UsdGeom
        type_name = str(prim.GetTypeName())
        own = _semantic_label(prim)
        if own:
            sem = own
        if prim.IsA(UsdGeom.Xformable):
            xf = UsdGeom.Xformable(prim)
            own_codes = set(xf.GetTimeSamples()) if xf.TransformMightBeTimeVarying() else set()
            if xf.GetResetXformStack():
                codes = own_codes
            elif own_codes:
                codes = codes | own_codes
        if not hidden and prim.IsA(UsdGeom.Imageable):
            hidden = self._invisible(prim) or self._skip_purpose(prim)

        # sensors and rigs (regardless of visibility)
        if prim.IsA(UsdGeom.Camera):
            self.scene.camera_prims.append(str(prim.GetPath()))
            self._camera(prim)
        if type_name == "OmniLidar" or prim.HasAttribute("omni:sensor:Core:scanType"):
            self.scene.lidar_prims.append(str(prim.GetPath()))
        if self.ego_prim is None and _attr_value(prim, "wsim:egoRig"):
            self.ego_prim = (prim, set(codes))

        if prim.IsInstance():
            if not hidden:
                self._native_instance(prim, sem, codes)
            return
        if prim.IsA(UsdGeom.PointInstancer):
            if not hidden:
                self._point_instancer(prim, sem, codes)
            return
        if type_name == "Mesh" or type_name in _GPRIMS:
            if not hidden:
                self._geometry_item(prim, type_name, sem, codes)
        elif prim.IsA(UsdGeom.Gprim) and not hidden:
            self.unsupported.append((str(prim.GetPath()), type_name))
        for child in prim.GetChildren():
            self._walk(child, sem, codes, hidden)

    def _explicit_id(self, prim) -> int | None:
        v = _attr_value(prim, "wsim:objectId")
        return None if v is None else int(v)

    def _geometry_item(self, prim, type_name: str, sem: str | None, codes: set[float]) -> None:
        self.geometry_found = True
        key_codes = self.codes_in_window(codes)
        if len(key_codes) > 1:
            pc = self.piece(prim, type_name, sem, None)
            proto = self._add_prototype(str(prim.GetPath()), [pc])
            inst = self._instance(prim, proto, key_codes, lambda c: self.world(prim, c), 0)
            self.pending_ids.append((self._explicit_id(prim), lambda i, inst=inst: setattr(inst, "object_id", i)))
            return
        parts: list[Part] = []
        pc = self.piece(prim, type_name, sem, parts)
        m = self.C @ self.world(prim)
        self.static_pieces.append(pc.transformed(m))

        def set_ids(i: int, parts=parts) -> None:
            for p in parts:
                p.object_id = i

        self.pending_ids.append((self._explicit_id(prim), set_ids))

    def _instance(self, prim, proto: int, key_codes: list[float], world_fn, sem_index: int, name: str = "") -> Instance:
        """An Instance of ``proto`` at ``key_codes`` (or one static key) with stage-space world matrices world_fn."""
        codes = key_codes if len(key_codes) > 1 else [None]
        ts, qs, ss = [], [], []
        for c in codes:
            m = self.C @ world_fn(c) @ self.S_inv
            try:
                t, q, s = decompose_matrix(m)
            except ValueError as e:
                raise SceneError(f"{self.where(prim)}: {e}") from e
            ts.append(t)
            qs.append(q)
            ss.append(s)
        times = [0.0] if codes == [None] else [c / self.tcps for c in codes]
        if codes != [None]:
            self.all_codes.update(codes)
        cuboid = _attr_value(prim, "wsim:cuboid")
        inst = Instance(
            proto,
            times,
            np.array(ts),
            np.array(qs),
            np.array(ss),
            0,
            name or str(prim.GetPath()),
            sem_index,
            None if cuboid is None else np.asarray(cuboid, dtype=np.float64) * self.mpu,
        )
        self.scene.instances.append(inst)
        return inst

    def _add_prototype(self, key: str, pieces: list[_Piece]) -> int:
        mesh = self._concat([p.transformed(self.S) for p in pieces], key)
        self.scene.prototypes.append(mesh)
        idx = len(self.scene.prototypes) - 1
        self._prototypes[key] = idx
        return idx

    def _local_pieces(self, root, include_root: bool) -> list[_Piece]:
        """Geometry under ``root`` in root's frame (stage units), instance proxies and nested instancers flattened."""
        key = f"{root.GetPath()}|{include_root}"
        if key in self._local_cache:
            return self._local_cache[key]
        out: list[_Piece] = []
        Usd, UsdGeom = self.Usd, self.UsdGeom
        pred = Usd.TraverseInstanceProxies(Usd.PrimDefaultPredicate)

        def visit(prim, sem: str | None) -> None:
            if prim.IsA(UsdGeom.Imageable) and (self._invisible(prim) or self._skip_purpose(prim)):
                if not (include_root and prim == root):
                    return
            own = _semantic_label(prim)
            if own:
                sem = own
            type_name = str(prim.GetTypeName())
            if prim != root or include_root:
                if prim.IsA(UsdGeom.PointInstancer):
                    base = self.relative(prim, root)
                    for proto_root, mats in self._pi_placements(prim, None):
                        sub = self._local_pieces(proto_root, True)
                        for m in mats:
                            out.extend(p.transformed(base @ m) for p in sub)
                    return
                if type_name == "Mesh" or type_name in _GPRIMS:
                    pc = self.piece(prim, type_name, sem, None)
                    out.append(pc.transformed(self.relative(prim, root)))
                elif prim.IsA(UsdGeom.Gprim):
                    self.unsupported.append((str(prim.GetPath()), type_name))
            for child in prim.GetFilteredChildren(pred):
                visit(child, sem)

        visit(root, None)
        self._local_cache[key] = out
        return out

    def _native_instance(self, prim, sem: str | None, codes: set[float]) -> None:
        proto_prim = prim.GetPrototype()
        key = str(proto_prim.GetPath())
        if key not in self._prototypes:
            pieces = self._local_pieces(prim, False)
            if not pieces or sum(len(p.tris) for p in pieces) == 0:
                return
            self._add_prototype(key, pieces)
        self.geometry_found = True
        proto = self._prototypes[key]
        key_codes = self.codes_in_window(codes)
        inst = self._instance(
            prim, proto, key_codes, lambda c: self.world(prim, c), self.scene.semantic_class_index(sem or "")
        )
        self.pending_ids.append((self._explicit_id(prim), lambda i, inst=inst: setattr(inst, "object_id", i)))

    def _pi_placements(self, prim, codes: list[float] | None):
        """[(prototype root prim, [instance matrices (column form, PI frame, stage units) per code])] per instance.

        With ``codes`` None: one matrix per instance at t0, grouped by prototype root.
        Returns a list of (proto_root, matrices) where matrices is a list over instances (t0) when codes is None, or
        a list over instances of lists over codes.
        """
        UsdGeom, Usd = self.UsdGeom, self.Usd
        pi = UsdGeom.PointInstancer(prim)
        where = self.where(prim)
        targets = pi.GetPrototypesRel().GetTargets()
        stage = prim.GetStage()
        protos = [stage.GetPrimAtPath(t) for t in targets]
        for t, p in zip(targets, protos):
            if not p or not p.IsValid():
                raise SceneError(f"{where}: prototype {t} does not exist")
        idx = pi.GetProtoIndicesAttr().Get(self.t0)
        idx = np.zeros(0, np.int64) if idx is None else np.asarray(idx, dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(protos)):
            raise SceneError(f"{where}: protoIndices out of range [0, {len(protos)})")
        keep = np.ones(len(idx), bool)
        mask = pi.ComputeMaskAtTime(self.t0)
        if mask is not None and len(mask) == len(idx):
            keep &= np.asarray(mask, bool)
        inv = pi.GetInvisibleIdsAttr().Get(self.t0)
        ids = pi.GetIdsAttr().Get(self.t0)
        if inv is not None and len(inv):
            ids_arr = np.arange(len(idx)) if ids is None or len(ids) != len(idx) else np.asarray(ids)
            keep &= ~np.isin(ids_arr, np.asarray(inv))
        eval_codes = [None] if codes is None else codes
        mats = []
        for c in eval_codes:
            tc = self.t0 if c is None else Usd.TimeCode(c)
            arr = pi.ComputeInstanceTransformsAtTime(tc, tc)
            a = np.asarray(arr, dtype=np.float64).reshape(-1, 4, 4).transpose(0, 2, 1)
            if len(a) != len(idx):
                raise SceneError(
                    f"{where}: {len(a)} instance transforms at time code {c} but {len(idx)} protoIndices"
                )
            mats.append(a)
        out = []
        for j in np.nonzero(keep)[0]:
            per = [m[j] for m in mats]
            out.append((protos[int(idx[j])], per[0] if codes is None else per))
        if codes is None:
            grouped: dict[str, tuple[Any, list[np.ndarray]]] = {}
            for p, m in out:
                grouped.setdefault(str(p.GetPath()), (p, []))[1].append(m)
            return list(grouped.values())
        return out

    def _point_instancer(self, prim, sem: str | None, codes: set[float]) -> None:
        pi = self.UsdGeom.PointInstancer(prim)
        own = set(codes)
        for a in (pi.GetPositionsAttr(), pi.GetOrientationsAttr(), pi.GetScalesAttr(), pi.GetProtoIndicesAttr()):
            if a and a.HasAuthoredValue():
                own.update(a.GetTimeSamples())
        key_codes = self.codes_in_window(own)
        moving = len(key_codes) > 1
        try:
            placements = self._pi_placements(prim, key_codes if moving else [None])
        except SceneError:
            if not moving:
                raise
            placements = self._pi_placements(prim, [None])
            self.scene.skipped.append(f"{prim.GetPath()}: instance count changes over time; placed at its first sample")
            moving = False
            key_codes = []
        sem_index = self.scene.semantic_class_index(sem or "")
        for j, (proto_root, mats) in enumerate(placements):
            key = str(proto_root.GetPath())
            if key not in self._prototypes:
                pieces = self._local_pieces(proto_root, True)
                if not pieces or sum(len(p.tris) for p in pieces) == 0:
                    continue
                self._add_prototype(key, pieces)
            self.geometry_found = True
            by_code = dict(zip(key_codes if moving else [None], mats))

            def world_fn(c, by_code=by_code):
                inst_m = by_code[c] if c in by_code else by_code[next(iter(by_code))]
                return self.world(prim, c) @ inst_m

            inst = self._instance(
                prim, self._prototypes[key], key_codes if moving else [], world_fn, sem_index, f"{prim.GetPath()}[{j}]"
            )
            self.pending_ids.append((None, lambda i, inst=inst: setattr(inst, "object_id", i)))

    # -- sensors -------------------------------------------------------------------------------------------------------
    def _camera(self, prim) -> None:
        raw = _attr_value(prim, "wsim:camera:calibration")
        if raw is None:
            return
        where = self.where(prim)
        try:
            d = json.loads(str(raw))
            model = str(d["model"])
            params = dict(d.get("params") or {})
            res = d.get("resolution") or [0, 0]
            resolution = (int(res[0]), int(res[1]))
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise SceneError(f"{where}: invalid wsim:camera:calibration JSON ({e})") from e
        parent = prim.GetParent()
        local = self.relative(prim, parent) if parent and not parent.IsPseudoRoot() else self.world(prim)
        m = self.S @ local @ self.S_inv @ _RX180
        try:
            t, q, _ = decompose_matrix(m)
        except ValueError as e:
            raise SceneError(f"{where}: {e}") from e
        logical = str(d.get("logical_id") or prim.GetName())
        self.scene.cameras[logical] = CameraCalibration(
            logical_id=logical,
            model=model,
            params=params,
            resolution=resolution,
            camera_to_rig=(t, q),
            shutter_type=str(d.get("shutter_type") or "ROLLING_TOP_TO_BOTTOM"),
            unique_id=str(d.get("unique_id") or ""),
        )

    def _ego(self) -> None:
        if self.ego_prim is None:
            return
        prim, codes = self.ego_prim
        key_codes = self.codes_in_window(codes)
        eval_codes = key_codes if len(key_codes) > 1 else [None]
        ts, qs = [], []
        for c in eval_codes:
            m = self.C @ self.world(prim, c) @ self.S_inv
            try:
                t, q, _ = decompose_matrix(m)
            except ValueError as e:
                raise SceneError(f"{self.where(prim)}: ego rig: {e}") from e
            ts.append(t)
            qs.append(q)
        times = [0.0] if eval_codes == [None] else [c / self.tcps for c in eval_codes]
        if eval_codes != [None]:
            self.all_codes.update(eval_codes)
        self.scene.ego_trajectory = Trajectory(np.array(times), np.array(ts), np.array(qs))

    # -- finishing -----------------------------------------------------------------------------------------------------
    def _assign_ids(self) -> None:
        explicit = {i for i, _ in self.pending_ids if i is not None}
        nxt = 1
        for i, setter in self.pending_ids:
            if i is None:
                while nxt in explicit:
                    nxt += 1
                i = nxt
                nxt += 1
            setter(i)

    def _concat(self, pieces: list[_Piece], name: str) -> MeshData:
        if not pieces:
            return MeshData(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0), name=name)
        mats = self.scene.materials
        parts = self.scene.parts
        colors = None
        if any(p.colors is not None for p in pieces):
            cl = []
            base = np.array([mats[part.material].base_color for part in parts], dtype=np.float64).reshape(-1, 3)
            for p in pieces:
                if p.colors is not None:
                    cl.append(p.colors)
                    continue
                c = np.full((len(p.points), 3), 0.5)
                if len(p.tris):
                    c[p.tris.ravel()] = base[np.repeat(p.tri_part, 3)]
                cl.append(c)
            colors = np.concatenate(cl)
        uvs = None
        if any(p.uvs is not None for p in pieces):
            uvs = np.concatenate([p.uvs if p.uvs is not None else np.zeros((len(p.tris), 3, 2)) for p in pieces])
        offs = np.cumsum([0] + [len(p.points) for p in pieces[:-1]])
        return MeshData(
            np.concatenate([p.points for p in pieces]),
            np.concatenate([p.tris + o for p, o in zip(pieces, offs)]).reshape(-1, 3),
            np.concatenate([p.tri_part for p in pieces]),
            colors,
            None if uvs is None else uvs.astype(np.float32),
            name,
        )

    def _finish_static(self) -> None:
        self.scene.static = self._concat(self.static_pieces, "static")

    def _time_range(self) -> None:
        stage = self.stage
        codes = set(self.all_codes)
        if stage.HasAuthoredTimeCodeRange():
            codes.update([stage.GetStartTimeCode(), stage.GetEndTimeCode()])
        if self.time_window is not None:
            self.scene.time_range = (float(self.time_window[0]), float(self.time_window[1]))
        elif codes:
            self.scene.time_range = (min(codes) / self.tcps, max(codes) / self.tcps)


def pxr_error_message(e: BaseException, file: str = "") -> str:
    """The first meaningful line of a pxr error (Tf.ErrorException): the innermost error's own text, without the
    "Error in 'pxrInternal_...::Function' at line N in file stage.cpp" prefixes, C++ namespaces or parser rule names,
    and with the file's own path (``file``) shortened to a line and column."""
    text = str(e)
    parts = [m.strip() for m in re.split(r"Error in '[^']*' at line \d+ in file [^\n]*? : '", text)[1:]]
    parts = [(m[:-1] if m.endswith("'") else m).strip() for m in parts]  # each message closes with its quote
    msg = next((m for m in parts if m), text.strip().splitlines()[0] if text.strip() else type(e).__name__)
    msg = re.sub(r"pxrInternal_v\w+?__pxrReserved__::", "", msg)
    msg = re.sub(r" matching \S+ at ", " at ", msg)  # parse error matching Sdf_TextFileFormatParser::Rule at '}'
    if file:
        for f in sorted({file, os.path.abspath(file), os.path.realpath(file)}, key=len, reverse=True):
            msg = re.sub(re.escape(f) + r":(\d+):(\d+): ", r"line \1, column \2: ", msg)
            msg = msg.replace(f"<{f}> is ", "").replace(f"@{f}@", "").replace(f"<{f}>", "the file")
    return " ".join(msg.split()) or type(e).__name__


def load_usd(path: str | os.PathLike, *, time_range: tuple[float, float] | None = None) -> Scene:
    """Load a USD stage (``.usda/.usdc/.usd/.usdz``) as a :class:`Scene` in metres, Z up.

    Args:
        path: Stage file.
        time_range: Optional (start, end) window [s]: moving objects keep only the key samples inside it (plus the
            nearest sample on either side, so interpolation at the window ends is exact), and it becomes
            ``Scene.time_range``. Default: every sample; the time range spans all samples and the stage's
            start/end time codes.

    Raises:
        SceneError: missing or non-USD file, malformed mesh (NaN points, out-of-range indices, inconsistent
            faceVertexCounts), unknown non-visual material labels, or a stage without geometry. The message names the
            file and the prim.
    """
    return _Loader(Path(os.fspath(path)), time_range).run()


# ----------------------------------------------------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------------------------------------------------


class _Writer:
    def __init__(self, scene: Scene, up_axis: str, meters_per_unit: float):
        Gf, Sdf, Usd, UsdGeom, UsdShade, Vt = _pxr()
        self.Gf, self.Sdf, self.Usd, self.UsdGeom, self.UsdShade, self.Vt = Gf, Sdf, Usd, UsdGeom, UsdShade, Vt
        self.scene = scene
        self.up = up_axis.upper()
        if self.up not in ("Y", "Z"):
            raise ValueError(f"up_axis must be 'Y' or 'Z', not {up_axis!r}")
        self.mpu = float(meters_per_unit)
        if not self.mpu > 0:
            raise ValueError("meters_per_unit must be positive")
        self.C_inv = np.linalg.inv(_up_matrix(self.up, self.mpu))
        self.S = np.diag([self.mpu] * 3 + [1.0])
        self.stage = Usd.Stage.CreateInMemory()
        self.tcps = TIME_CODES_PER_SECOND
        self._names: set[str] = set()
        self.material_paths: dict[int, Any] = {}

    def unique(self, parent: str, name: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", name) or "prim"
        if base[0].isdigit():
            base = "_" + base
        path, k = f"{parent}/{base}", 1
        while path in self._names:
            path, k = f"{parent}/{base}_{k}", k + 1
        self._names.add(path)
        return path

    def run(self) -> Any:
        stage, UsdGeom, Sdf = self.stage, self.UsdGeom, self.Sdf
        scene = self.scene
        UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.y if self.up == "Y" else UsdGeom.Tokens.z)
        UsdGeom.SetStageMetersPerUnit(stage, self.mpu)
        stage.SetTimeCodesPerSecond(self.tcps)
        stage.SetFramesPerSecond(30.0)
        world = UsdGeom.Xform.Define(stage, "/World")
        stage.SetDefaultPrim(world.GetPrim())
        data = {"wsim:sceneId": scene.scene_id or "scene"}
        if scene.time_origin_us:
            data["wsim:timeOriginUs"] = str(int(scene.time_origin_us))
        stage.GetRootLayer().customLayerData = data

        codes: list[float] = []
        self._materials()
        self._static()
        proto_paths = self._prototypes()
        codes += self._instances(proto_paths)
        codes += self._rig()
        t0, t1 = scene.time_range
        if t1 > t0 or codes:
            lo = min([t0 * self.tcps] + codes) if t1 > t0 else min(codes)
            hi = max([t1 * self.tcps] + codes) if t1 > t0 else max(codes)
            stage.SetStartTimeCode(lo)
            stage.SetEndTimeCode(hi)
        return stage

    # -- materials -----------------------------------------------------------------------------------------------------
    def _materials(self) -> None:
        UsdShade, Sdf, stage = self.UsdShade, self.Sdf, self.stage
        used = {p.material for p in self.scene.parts}
        for i, m in enumerate(self.scene.materials):
            if i == 0 or i not in used:
                continue
            path = self.unique("/World/Looks", m.name.rsplit("/", 1)[-1] or f"material_{i}")
            mat = UsdShade.Material.Define(stage, path)
            sh = UsdShade.Shader.Define(stage, path + "/PreviewSurface")
            sh.CreateIdAttr("UsdPreviewSurface")
            diffuse = sh.CreateInput("diffuseColor", Sdf.ValueTypeNames.Color3f)
            diffuse.Set(self.Gf.Vec3f(*[float(x) for x in m.base_color]))
            sh.CreateInput("roughness", Sdf.ValueTypeNames.Float).Set(0.5)
            mat.CreateSurfaceOutput().ConnectToSource(sh.ConnectableAPI(), "surface")
            if m.texture:
                tex = UsdShade.Shader.Define(stage, path + "/DiffuseTexture")
                tex.CreateIdAttr("UsdUVTexture")
                tex.CreateInput("file", Sdf.ValueTypeNames.Asset).Set(Sdf.AssetPath(str(m.texture)))
                reader = UsdShade.Shader.Define(stage, path + "/STReader")
                reader.CreateIdAttr("UsdPrimvarReader_float2")
                reader.CreateInput("varname", Sdf.ValueTypeNames.String).Set("st")
                st_out = reader.CreateOutput("result", Sdf.ValueTypeNames.Float2)
                tex.CreateInput("st", Sdf.ValueTypeNames.Float2).ConnectToSource(st_out)
                rgb = tex.CreateOutput("rgb", Sdf.ValueTypeNames.Float3)
                diffuse.ConnectToSource(rgb)
            prim = mat.GetPrim()
            base, coating, attrs = decode_material_id(int(m.material_id))
            prim.CreateAttribute("omni:simready:nonvisual:base", Sdf.ValueTypeNames.Token, custom=True).Set(base)
            prim.CreateAttribute("omni:simready:nonvisual:coating", Sdf.ValueTypeNames.Token, custom=True).Set(coating)
            prim.CreateAttribute("omni:simready:nonvisual:attributes", Sdf.ValueTypeNames.TokenArray, custom=True).Set(
                list(attrs)
            )
            default = Material.from_labels(m.name, base, coating, attrs)
            if abs(default.reflectance - m.reflectance) > 1e-9:
                prim.CreateAttribute("wsim:reflectance", Sdf.ValueTypeNames.Float, custom=True).Set(m.reflectance)
            if abs(default.transmittance - m.transmittance) > 1e-9:
                prim.CreateAttribute("wsim:transmittance", Sdf.ValueTypeNames.Float, custom=True).Set(m.transmittance)
            self.material_paths[i] = mat

    def _bind(self, prim, material: int) -> None:
        mat = self.material_paths.get(material)
        if mat is not None:
            self.UsdShade.MaterialBindingAPI.Apply(prim).Bind(mat)

    def _label(self, prim, semantic_class: int) -> None:
        if semantic_class > 0:
            name = self.scene.semantic_classes[semantic_class]
            prim.CreateAttribute("semantics:labels:class", self.Sdf.ValueTypeNames.TokenArray, custom=True).Set([name])

    # -- meshes --------------------------------------------------------------------------------------------------------
    def _mesh(self, path: str, mesh: MeshData, tri_sel: np.ndarray, to_stage: np.ndarray):
        """Write the triangles ``tri_sel`` of ``mesh`` as a Mesh prim (points mapped by ``to_stage``)."""
        UsdGeom, Vt, Sdf = self.UsdGeom, self.Vt, self.Sdf
        scene = self.scene
        tris = mesh.indices[tri_sel]
        used, inv = np.unique(tris.ravel(), return_inverse=True)
        pts = _transform_points(to_stage, mesh.points[used].astype(np.float64)).astype(np.float32)
        idx = inv.reshape(-1, 3).astype(np.int32)
        if np.linalg.det(to_stage[:3, :3]) < 0:
            idx = idx[:, [0, 2, 1]]
        m = UsdGeom.Mesh.Define(self.stage, path)
        m.CreatePointsAttr(Vt.Vec3fArray.FromNumpy(np.ascontiguousarray(pts)))
        m.CreateFaceVertexCountsAttr(Vt.IntArray.FromNumpy(np.full(len(idx), 3, np.int32)))
        m.CreateFaceVertexIndicesAttr(Vt.IntArray.FromNumpy(np.ascontiguousarray(idx.ravel())))
        m.CreateSubdivisionSchemeAttr(UsdGeom.Tokens.none)
        if len(pts):
            m.CreateExtentAttr(Vt.Vec3fArray.FromNumpy(np.stack([pts.min(0), pts.max(0)]).astype(np.float32)))
        if mesh.colors is not None:
            pv = m.CreateDisplayColorPrimvar(UsdGeom.Tokens.vertex)
            pv.Set(Vt.Vec3fArray.FromNumpy(np.ascontiguousarray(mesh.colors[used], dtype=np.float32)))
        if mesh.uvs is not None:
            uv = np.ascontiguousarray(mesh.uvs[tri_sel].reshape(-1, 2), dtype=np.float32)
            if np.linalg.det(to_stage[:3, :3]) < 0:
                uv = np.ascontiguousarray(mesh.uvs[tri_sel][:, [0, 2, 1]].reshape(-1, 2), dtype=np.float32)
            pv = UsdGeom.PrimvarsAPI(m).CreatePrimvar("st", Sdf.ValueTypeNames.TexCoord2fArray, UsdGeom.Tokens.faceVarying)
            pv.Set(Vt.Vec2fArray.FromNumpy(uv))
        parts = mesh.tri_part[tri_sel]
        keys = np.array(
            [(scene.parts[int(p)].material, scene.parts[int(p)].semantic_class) for p in range(len(scene.parts))],
            dtype=np.int64,
        ).reshape(-1, 2)
        combo = keys[parts]
        uniq, which = np.unique(combo, axis=0, return_inverse=True)
        which = which.ravel()
        prim = m.GetPrim()
        if len(uniq) <= 1:
            if len(uniq):
                self._bind(prim, int(uniq[0, 0]))
                self._label(prim, int(uniq[0, 1]))
            return m
        bind_api = self.UsdShade.MaterialBindingAPI.Apply(prim)
        for k, (mat, sem) in enumerate(uniq):
            faces = np.nonzero(which == k)[0].astype(np.int32)
            sub = bind_api.CreateMaterialBindSubset(f"part_{k}", Vt.IntArray.FromNumpy(faces), UsdGeom.Tokens.face)
            self._bind(sub.GetPrim(), int(mat))
            self._label(sub.GetPrim(), int(sem))
        return m

    def _static(self) -> None:
        scene = self.scene
        st = scene.static
        if st.num_triangles == 0:
            return
        self.UsdGeom.Scope.Define(self.stage, "/World/Static")
        oids = np.array([p.object_id for p in scene.parts], dtype=np.int64)[st.tri_part]
        order = np.argsort(oids, kind="stable")
        uniq, starts = np.unique(oids[order], return_index=True)
        bounds = list(starts) + [len(order)]
        for k, oid in enumerate(uniq):
            sel = np.sort(order[bounds[k] : bounds[k + 1]])
            m = self._mesh(self.unique("/World/Static", f"object_{int(oid)}"), st, sel, self.C_inv)
            m.GetPrim().CreateAttribute("wsim:objectId", self.Sdf.ValueTypeNames.Int, custom=True).Set(int(oid))

    def _prototypes(self) -> dict[int, str]:
        scene, stage = self.scene, self.stage
        used = sorted({i.prototype for i in scene.instances})
        if not used:
            return {}
        stage.CreateClassPrim("/World/Prototypes")
        out: dict[int, str] = {}
        to_stage = np.diag([1.0 / self.mpu] * 3 + [1.0])
        for i in used:
            proto = scene.prototypes[i]
            path = self.unique("/World/Prototypes", f"proto_{i}")
            self.UsdGeom.Xform.Define(stage, path)
            if proto.num_triangles:
                self._mesh(path + "/mesh", proto, np.arange(proto.num_triangles), to_stage)
            out[i] = path
        return out

    def _xform_ops(self, xf, ts, qs, ss, codes, quat_double: bool) -> None:
        """Author translate/orient(/scale) ops; time-sampled at ``codes`` when there is more than one key."""
        Gf, UsdGeom = self.Gf, self.UsdGeom
        prec = UsdGeom.XformOp.PrecisionDouble if quat_double else UsdGeom.XformOp.PrecisionFloat
        quat = Gf.Quatd if quat_double else Gf.Quatf
        vec = Gf.Vec3d if quat_double else Gf.Vec3f
        top = xf.AddTranslateOp(UsdGeom.XformOp.PrecisionDouble)
        rop = xf.AddOrientOp(prec)
        sop = xf.AddScaleOp(UsdGeom.XformOp.PrecisionFloat) if ss is not None else None
        keyed = len(codes) > 1
        for k in range(len(ts)):
            tc = self.Usd.TimeCode(codes[k]) if keyed else self.Usd.TimeCode.Default()
            top.Set(Gf.Vec3d(*[float(x) for x in ts[k]]), tc)
            x, y, z, w = (float(v) for v in qs[k])
            rop.Set(quat(w, vec(x, y, z)), tc)
            if sop is not None:
                sop.Set(Gf.Vec3f(*[float(v) for v in ss[k]]), tc)
            if not keyed:
                break

    def _to_stage_pose(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """wsim object-to-world (metres, Z up) → stage local-to-world with stage-unit geometry."""
        return decompose_matrix(self.C_inv @ m @ self.S)

    def _instances(self, proto_paths: dict[int, str]) -> list[float]:
        scene, stage, Sdf = self.scene, self.stage, self.Sdf
        if not scene.instances:
            return []
        self.UsdGeom.Scope.Define(stage, "/World/Instances")
        all_codes: list[float] = []
        for k, inst in enumerate(scene.instances):
            name = inst.name.rsplit("/", 1)[-1] if inst.name else f"instance_{k}"
            path = self.unique("/World/Instances", name)
            xf = self.UsdGeom.Xform.Define(stage, path)
            prim = xf.GetPrim()
            prim.GetReferences().AddInternalReference(proto_paths[inst.prototype])
            prim.SetInstanceable(True)
            ts, qs, ss = [], [], []
            for j in range(len(inst.times)):
                t, q, s = self._to_stage_pose(compose_matrix(inst.translations[j], inst.rotations[j], inst.scales[j]))
                ts.append(t)
                qs.append(q)
                ss.append(s)
            codes = [float(t) * self.tcps for t in inst.times]
            self._xform_ops(xf, ts, qs, ss, codes, quat_double=False)
            if len(codes) > 1:
                all_codes += codes
            prim.CreateAttribute("wsim:objectId", Sdf.ValueTypeNames.Int, custom=True).Set(int(inst.object_id))
            self._label(prim, int(inst.semantic_class))
            if inst.cuboid is not None:
                c = np.asarray(inst.cuboid, dtype=np.float64) / self.mpu
                prim.CreateAttribute("wsim:cuboid", Sdf.ValueTypeNames.Float3, custom=True).Set(
                    self.Gf.Vec3f(*[float(x) for x in c])
                )
        return all_codes

    def _rig(self) -> list[float]:
        scene, stage, Sdf = self.scene, self.stage, self.Sdf
        traj = scene.ego_trajectory
        if traj is None and not scene.cameras:
            return []
        path = "/World/EgoRig" if traj is not None else "/World/Rig"
        self._names.add(path)
        xf = self.UsdGeom.Xform.Define(stage, path)
        codes: list[float] = []
        if traj is not None:
            xf.GetPrim().CreateAttribute("wsim:egoRig", Sdf.ValueTypeNames.Bool, custom=True).Set(True)
            ts, qs = [], []
            for j in range(len(traj.times)):
                t, q, _ = self._to_stage_pose(compose_matrix(traj.translations[j], traj.rotations[j]))
                ts.append(t)
                qs.append(q)
            codes = [float(t) * self.tcps for t in traj.times]
            self._xform_ops(xf, ts, qs, None, codes, quat_double=True)
            if len(codes) <= 1:
                codes = []
        s_inv = np.diag([1.0 / self.mpu] * 3 + [1.0])
        for logical, cam in scene.cameras.items():
            cpath = self.unique(path, logical or cam.logical_id or "camera")
            c = self.UsdGeom.Camera.Define(stage, cpath)
            t, q = cam.camera_to_rig
            m = s_inv @ compose_matrix(np.asarray(t, float), np.asarray(q, float)) @ _RX180 @ self.S
            tt, qq, _ = decompose_matrix(m)
            self._xform_ops(c, [tt], [qq], None, [0.0], quat_double=True)
            c.CreateClippingRangeAttr(self.Gf.Vec2f(0.1 / self.mpu, 1000.0 / self.mpu))
            payload = {
                "logical_id": cam.logical_id or logical,
                "model": cam.model,
                "params": cam.params,
                "resolution": [int(cam.resolution[0]), int(cam.resolution[1])],
                "shutter_type": cam.shutter_type,
                "unique_id": cam.unique_id,
            }
            c.GetPrim().CreateAttribute("wsim:camera:calibration", Sdf.ValueTypeNames.String, custom=True).Set(
                json.dumps(payload, default=_json_default)
            )
        return codes


def _json_default(o):
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"cannot store {type(o).__name__} in wsim:camera:calibration")


def save_usd(scene: Scene, path: str | os.PathLike, *, up_axis: str = "Z", meters_per_unit: float = 1.0) -> None:
    """Write ``scene`` as a USD stage that :func:`load_usd` reads back to an equivalent Scene.

    Layout: ``/World/Looks`` (UsdPreviewSurface materials with SimReady labels and ``wsim:reflectance`` /
    ``wsim:transmittance`` where they differ from the defaults), ``/World/Static/object_<id>`` (one Mesh per object id,
    a ``materialBind`` GeomSubset per distinct material/semantic class, ``int wsim:objectId``),
    ``/World/Prototypes`` (a ``class`` prim holding each instanced prototype once), ``/World/Instances/*``
    (instanceable Xforms referencing a prototype, translate/orient/scale ops time-sampled at the instance's key times,
    ``int wsim:objectId``, optional ``float3 wsim:cuboid``), and ``/World/EgoRig`` (``bool wsim:egoRig = true``,
    time-sampled ego trajectory) with one Camera per calibration carrying ``string wsim:camera:calibration`` JSON
    (``/World/Rig`` without ``wsim:egoRig`` when the scene has cameras but no ego trajectory).
    Time codes are milliseconds (``timeCodesPerSecond`` = :data:`TIME_CODES_PER_SECOND`).

    Args:
        scene: The scene.
        path: Output file; ``.usda``, ``.usdc``, ``.usd`` or ``.usdz``.
        up_axis: ``"Z"`` or ``"Y"`` for the written stage.
        meters_per_unit: Stage unit in metres (geometry is divided by it).
    """
    path = Path(os.fspath(path))
    stage = _Writer(scene, up_axis, meters_per_unit).run()
    path.parent.mkdir(parents=True, exist_ok=True)
    layer = stage.GetRootLayer()
    if path.suffix.lower() == ".usdz":
        from pxr import UsdUtils

        with tempfile.TemporaryDirectory() as tmp:
            inner = os.path.join(tmp, path.stem + ".usdc")
            if not layer.Export(inner):
                raise SceneError(f"{path}: could not write the stage")
            if path.exists():
                path.unlink()
            if not UsdUtils.CreateNewUsdzPackage(inner, str(path)):
                raise SceneError(f"{path}: could not write the USDZ package")
    else:
        if not layer.Export(str(path)):
            raise SceneError(f"{path}: could not write the stage")
    from pxr import Sdf

    existing = Sdf.Layer.Find(str(path))
    if existing is not None:
        existing.Reload()
