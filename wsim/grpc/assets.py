"""Asset editing RPCs of the servicer (wsim's own messages): list the asset files of ``--assets DIR``, insert them into
a scene as new tracks or swap a track's geometry for one, and restore the scene as loaded.

Edits make a new :class:`~wsim.scene.scene.Scene` sharing nothing mutable with the served one, build its geometry and
install it in the store; ``restore_model_parameters`` drops it so the file is loaded again.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..scene.scene import Instance, MeshData, Part, Scene
from . import convert
from .errors import clip, invalid, not_found, precondition
from .geometry import track_index
from .rpc import rpc as _rpc
from .stubs import common_pb2, sensorsim_pb2


class AssetEditing:
    """Mixin of :class:`~wsim.grpc.service.SensorsimServicer`: needs ``assets_dir``, ``store``, ``device`` and
    ``_scene``."""

    def _assets(self) -> dict[str, Path]:
        if not self.assets_dir:
            return {}
        from ..scene.loader import SCENE_SUFFIXES

        return {f.stem: f for f in sorted(Path(self.assets_dir).rglob("*")) if f.suffix.lower() in SCENE_SUFFIXES}

    @_rpc
    def get_external_asset_objects(self, request, context):
        self._scene(request.scene_id)
        out = sensorsim_pb2.ExternalAssetObjectsReturn()
        for aid in sorted(self._assets()):
            mesh, label, _ = self._asset_mesh(aid)
            ext = mesh.points.max(0) - mesh.points.min(0) if len(mesh.points) else np.zeros(3)
            out.assets.add(asset_id=aid, label_class=label,
                           aabb=common_pb2.AABB(size_x=ext[0], size_y=ext[1], size_z=ext[2]))
        return out

    def _asset_mesh(self, asset_id: str) -> tuple[MeshData, str, Scene]:
        """The asset's triangles (static geometry of its stage plus its placed instances), its first semantic label
        and its scene (whose part / material tables the triangles index)."""
        from ..scene.loader import load_scene
        from ..scene.transforms import quat_to_matrix

        path = self._assets().get(asset_id)
        if path is None:
            raise not_found(f"asset_id: unknown asset {clip(asset_id)}")
        a = load_scene(path)
        meshes = [a.static] if a.static.num_triangles else []
        for inst in a.instances:
            p = a.prototypes[inst.prototype]
            pts = p.points @ quat_to_matrix(inst.rotations[0]).T * inst.scales[0] + inst.translations[0]
            meshes.append(MeshData(pts, p.indices, p.tri_part, name=p.name))
        mesh = MeshData.concatenate(meshes, name=asset_id)
        labels = [a.semantic_classes[a.parts[k].semantic_class] for k in np.unique(mesh.tri_part)
                  if a.parts[k].semantic_class]
        return mesh, (labels[0] if labels else ""), a

    @_rpc
    def edit_assets(self, request, context):
        if not self.assets_dir:
            raise precondition("edit_assets: the server has no assets folder (wsim serve --assets DIR)")
        scene = self._scene(request.scene_id)
        ed = dataclasses.replace(scene, prototypes=list(scene.prototypes), instances=list(scene.instances),
                                 parts=list(scene.parts), materials=list(scene.materials),
                                 semantic_classes=list(scene.semantic_classes), _device_cache={})
        tracks = track_index(ed)
        names = []
        next_oid = max([p.object_id for p in ed.parts] + [i.object_id for i in ed.instances] + [0]) + 1
        for i, e in enumerate(request.edits):
            f = f"edits[{i}]"
            mesh, label, a = self._asset_mesh(e.asset_id)
            remap = {}
            for k in np.unique(mesh.tri_part):
                part = a.parts[k]
                mat = ed.add_material(a.materials[part.material])
                sem = ed.semantic_class_index(a.semantic_classes[part.semantic_class])
                remap[int(k)] = ed.add_part(Part(f"/assets/{e.asset_id}{part.name}", mat, sem, next_oid))
            lo, hi = mesh.points.min(0), mesh.points.max(0)
            proto = MeshData(mesh.points - (lo + hi) / 2, mesh.indices,
                             np.vectorize(remap.get)(mesh.tri_part) if len(mesh.tri_part) else mesh.tri_part,
                             name=e.asset_id)
            ed.prototypes.append(proto)
            sem = ed.semantic_class_index(label) if label else 0
            if e.replace_track_id:
                k = tracks.get(e.replace_track_id)
                if k is None:
                    raise not_found(f"{f}.replace_track_id: unknown track {clip(e.replace_track_id)}")
                ed.instances[k] = dataclasses.replace(ed.instances[k], prototype=len(ed.prototypes) - 1,
                                                      cuboid=(hi - lo).astype(float))
                names.append(ed.instances[k].name)
            elif e.new_track_id:
                if e.new_track_id in tracks:
                    raise invalid(f"{f}.new_track_id: track {clip(e.new_track_id)} exists")
                if not e.trajectory.poses:
                    raise invalid(f"{f}.trajectory: empty (a new track needs at least one pose)")
                ts, trs, qs = [], [], []
                for j, p in enumerate(e.trajectory.poses):
                    t, q = convert.pose_from_proto(p.pose, p.HasField("pose"), f"{f}.trajectory.poses[{j}].pose")
                    ts.append((p.timestamp_us - scene.time_origin_us) * 1e-6)
                    trs.append(t)
                    qs.append(q)
                if np.any(np.diff(ts) <= 0):
                    raise invalid(f"{f}.trajectory: timestamps must increase")
                ed.instances.append(Instance(len(ed.prototypes) - 1, ts, trs, qs, object_id=next_oid,
                                             name=e.new_track_id, semantic_class=sem, cuboid=(hi - lo).astype(float)))
                tracks[e.new_track_id] = len(ed.instances) - 1
                names.append(e.new_track_id)
            else:
                raise invalid(f"{f}: set replace_track_id or new_track_id")
            next_oid += 1
        ed.device_geometry(self.device)
        self.store.replace(request.scene_id, ed)
        return sensorsim_pb2.EditAssetsResponse(track_ids=names)

    @_rpc
    def restore_model_parameters(self, request, context):
        self._scene(request.scene_id)
        self.store.replace(request.scene_id, None)
        return common_pb2.Empty()
