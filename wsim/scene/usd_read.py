"""Reading USD stages into a :class:`~wsim.scene.scene.Scene` (:func:`load_usd`; the stage conventions are listed in
:mod:`wsim.scene.usd`): traversal with visibility and purpose, meshes and gprims (:mod:`wsim.scene.usd_geometry`),
materials (:mod:`wsim.scene.usd_materials`), semantic labels, object ids, moving objects, native instances and
PointInstancers, camera calibrations, the ego rig and the time range."""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .materials import Material
from .scene import CameraCalibration, Instance, MeshData, Part, Scene, SceneError, Trajectory
from .transforms import decompose_matrix
from .usd_geometry import _GPRIMS, read_geometry
from .usd_materials import read_material
from .usd_stage import _RX180, _attr_value, _col, _pxr, _transform_points, _up_matrix, pxr_error_message

__all__ = ["load_usd"]


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
        if not (math.isfinite(self.mpu) and self.mpu > 0):
            raise SceneError(f"{self.file}: metersPerUnit must be a positive length [m], got {self.mpu}")
        if self.up not in ("Y", "Z"):
            raise SceneError(f"{self.file}: upAxis must be \"Y\" or \"Z\", got {self.up!r}")
        if not (math.isfinite(self.tcps) and self.tcps > 0):
            raise SceneError(f"{self.file}: timeCodesPerSecond must be positive, got {self.tcps}")
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
            m, has_color = read_material(mat, self.file, self.path.parent)
            idx = self.scene.add_material(m)
            self._materials[key] = idx
            self._material_has_color[idx] = has_color
        return self._materials[key]

    def display_color_material(self, rgb: tuple[float, float, float]) -> int:
        name = "displayColor({:.4f}, {:.4f}, {:.4f})".format(*rgb)
        if name not in self._materials:
            idx = self.scene.add_material(Material(name, tuple(float(x) for x in rgb)))
            self._materials[name] = idx
            self._material_has_color[idx] = True
        return self._materials[name]

    # -- geometry ------------------------------------------------------------------------------------------------------
    def piece(self, prim, type_name: str, sem: str | None, object_parts: list[Part] | None) -> _Piece:
        """Geometry of one prim (local frame, stage units) with its parts added to the scene."""
        g = read_geometry(prim, type_name, self.t0, self.file)
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
