"""Writing a :class:`~wsim.scene.scene.Scene` as a USD stage (:func:`save_usd`) that :func:`wsim.scene.usd.load_usd`
reads back to an equivalent Scene (the stage conventions are listed in :mod:`wsim.scene.usd`)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .scene import MeshData, Scene, SceneError
from .transforms import compose_matrix, decompose_matrix
from .usd_materials import write_materials
from .usd_stage import _RX180, TIME_CODES_PER_SECOND, _pxr, _transform_points, _up_matrix

__all__ = ["save_usd"]


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
        self.material_paths = write_materials(self.stage, self.scene, self.unique)

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
