"""Mesh files (glTF 2.0 / GLB, OBJ + MTL, PLY) as scenes (:func:`load_mesh_file`, used by ``wsim.load_scene``) and as
instanced assets added to a scene (:func:`add_asset`, :meth:`Scene.add_asset`), with the mapping file that assigns
semantic classes and SimReady materials by name.

Units and axes: glTF is Y up and metres by its specification; OBJ and PLY carry neither, and are read as metres, Z up.
``up_axis`` ("Y" or "Z") and ``meters_per_unit`` override either (arguments first, then the mapping file). Y-up files
are turned Z up as USD stages are (x, y, z) → (x, −z, y), so a glTF asset's front (+Z) faces wsim's −Y.

Instancing: meshes placed by two or more nodes (or meshes holding the same accessors) become one prototype with one
instance per node; a mesh placed once is baked into the static geometry. Every node that places a mesh gets its own
object id (1, 2, ... in node order; an OBJ object/group's materials share one).

Mapping file (YAML or JSON; ``load_scene(path, mapping=...)`` or ``<stem>.wsim.yaml`` / ``<stem>.wsim.json`` beside
the file)::

    semantic_classes:            # glob (case-insensitive) → class; first match wins. Tried on the node's path and
      "*/cars/*": car            # name, then on its ancestors' (nearest first), then on the mesh and material names
      "tree*": vegetation
    materials:                   # glob on material names → SimReady labels (as Material.from_labels) and overrides
      "*glass*": {base: clear_glass, attributes: [visually_transparent]}
      "*paint*": {base: steel, coating: paint, reflectance: 0.5}
      "road*": asphalt           # a bare name is the base label
    up_axis: Y                   # optional file-level overrides
    meters_per_unit: 0.01
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .materials import Material, encode_material_id
from .mesh_source import MeshSource, SourceMaterial
from .scene import Instance, MeshData, Part, Scene, SceneError, Trajectory, _check_trajectory, set_asset_adder
from .transforms import compose_matrix, decompose_matrix
from .usd_stage import _up_matrix

__all__ = ["MESH_SUFFIXES", "AssetMapping", "load_mapping", "read_mesh_source", "load_mesh_file", "add_asset"]

#: File suffixes read by :func:`load_mesh_file`.
MESH_SUFFIXES = frozenset({".gltf", ".glb", ".obj", ".ply"})
#: Suffixes of the mapping file looked for beside a mesh file (``<stem>.wsim.yaml``).
MAPPING_SUFFIXES = (".wsim.yaml", ".wsim.yml", ".wsim.json")
_MATERIAL_KEYS = {"base", "coating", "attributes", "reflectance", "transmittance"}
_TOP_KEYS = {"semantic_classes", "materials", "up_axis", "meters_per_unit"}


def _glob(pattern: str, name: str) -> bool:
    return fnmatch.fnmatchcase(name.lower(), pattern.lower())


@dataclass
class AssetMapping:
    """Rules from a mapping file: semantic classes and material labels by glob on names, and unit overrides."""

    semantic: list[tuple[str, str]] = field(default_factory=list)
    materials: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    up_axis: str | None = None
    meters_per_unit: float | None = None
    source: str = ""

    def semantic_class(self, *names: str) -> str | None:
        """Class of the first name (in order) that some pattern matches; patterns tried in file order."""
        for name in names:
            if not name:
                continue
            for pat, cls in self.semantic:
                if _glob(pat, name):
                    return cls
        return None

    def material_rule(self, name: str) -> dict[str, Any] | None:
        for pat, rule in self.materials:
            if _glob(pat, name):
                return rule
        return None

    @classmethod
    def from_dict(cls, d: Any, where: str) -> AssetMapping:
        """Parse and check a mapping (raises SceneError naming ``where`` and the offending entry)."""
        if d is None:
            d = {}
        if not isinstance(d, Mapping):
            raise SceneError(f"{where}: a mapping file must hold an object/mapping at the top, got {type(d).__name__}")
        unknown = sorted(set(d) - _TOP_KEYS)
        if unknown:
            raise SceneError(f"{where}: unknown key(s) {', '.join(map(str, unknown))} (known: {', '.join(sorted(_TOP_KEYS))})")
        out = cls(source=where)
        sem = d.get("semantic_classes") or {}
        if not isinstance(sem, Mapping):
            raise SceneError(f"{where}: semantic_classes must map glob patterns to class names")
        for pat, name in sem.items():
            if not isinstance(name, str) or not name:
                raise SceneError(f"{where}: semantic_classes[{pat!r}] must be a class name, got {name!r}")
            out.semantic.append((str(pat), name))
        mats = d.get("materials") or {}
        if not isinstance(mats, Mapping):
            raise SceneError(f"{where}: materials must map glob patterns to labels")
        for pat, rule in mats.items():
            if isinstance(rule, str):
                rule = {"base": rule}
            if not isinstance(rule, Mapping):
                raise SceneError(f"{where}: materials[{pat!r}] must be a base name or an object of "
                                 f"{', '.join(sorted(_MATERIAL_KEYS))}")
            bad = sorted(set(rule) - _MATERIAL_KEYS)
            if bad:
                raise SceneError(f"{where}: materials[{pat!r}]: unknown key(s) {', '.join(map(str, bad))} "
                                 f"(known: {', '.join(sorted(_MATERIAL_KEYS))})")
            rule = dict(rule)
            if "attributes" in rule:  # given: replaces what the file implies (transparency); absent: kept
                attrs = rule["attributes"]
                rule["attributes"] = (attrs,) if isinstance(attrs, str) else tuple(str(a) for a in attrs or ())
            try:
                encode_material_id(str(rule.get("base", "none")), str(rule.get("coating", "none")),
                                   rule.get("attributes", ()))
            except ValueError as e:
                raise SceneError(f"{where}: materials[{pat!r}]: {e}") from None
            for key in ("reflectance", "transmittance"):
                if key in rule:
                    v = rule[key]
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
                        raise SceneError(f"{where}: materials[{pat!r}]: {key} must be a number in [0, 1], got {v!r}")
                    rule[key] = float(v)
            out.materials.append((str(pat), rule))
        if d.get("up_axis") is not None:
            out.up_axis = _check_up(d["up_axis"], where)
        if d.get("meters_per_unit") is not None:
            out.meters_per_unit = _check_mpu(d["meters_per_unit"], where)
        return out


def _check_up(v: Any, where: str) -> str:
    s = str(v).strip().upper()
    if s not in ("Y", "Z"):
        raise SceneError(f"{where}: up_axis must be \"Y\" or \"Z\", got {v!r}")
    return s


def _check_mpu(v: Any, where: str) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        f = float("nan")
    if isinstance(v, bool) or not (math.isfinite(f) and f > 0):
        raise SceneError(f"{where}: meters_per_unit must be a positive length [m], got {v!r}")
    return f


def load_mapping(mapping: Any, mesh_path: Path) -> AssetMapping:
    """The mapping for ``mesh_path``: ``mapping`` as a path or dict, else ``<stem>.wsim.yaml`` beside the file, else
    no rules (``mapping=False`` ignores a file beside it)."""
    if mapping is False:
        return AssetMapping()
    if isinstance(mapping, AssetMapping):
        return mapping
    if isinstance(mapping, Mapping):
        return AssetMapping.from_dict(mapping, f"{mesh_path}: mapping")
    if mapping is None:
        for suffix in MAPPING_SUFFIXES:
            p = mesh_path.with_name(mesh_path.name.rsplit(".", 1)[0] + suffix)
            if p.is_file():
                mapping = p
                break
        else:
            return AssetMapping()
    p = Path(os.fspath(mapping))
    if not p.is_file():
        raise SceneError(f"{p}: mapping file not found")
    text = p.read_text(encoding="utf-8-sig")
    try:
        if p.suffix.lower() == ".json":
            d = json.loads(text)
        else:
            import yaml

            d = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - json and yaml errors
        raise SceneError(f"{p}: not a readable mapping file ({type(e).__name__}: {e})") from None
    return AssetMapping.from_dict(d, str(p))


def read_mesh_source(path: Path) -> MeshSource:
    """Read a mesh file by its suffix; every failure is a SceneError naming the file."""
    try:
        return _read_mesh_source(path)
    except SceneError:
        raise
    except MemoryError:
        raise SceneError(f"{path}: too large to load (out of memory)") from None
    except Exception as e:  # noqa: BLE001 - malformed files fail in many ways (struct, KeyError, ...)
        raise SceneError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e


def _read_mesh_source(path: Path) -> MeshSource:
    if not path.exists():
        raise SceneError(f"{path}: no such mesh file")
    if not path.is_file():
        raise SceneError(f"{path}: not a file")
    suffix = path.suffix.lower()
    if suffix in (".gltf", ".glb"):
        from .gltf import read_gltf

        return read_gltf(path)
    if suffix == ".obj":
        from .obj_ply import read_obj

        return read_obj(path)
    if suffix == ".ply":
        from .obj_ply import read_ply

        return read_ply(path)
    raise SceneError(f"{path}: unknown mesh file type {suffix!r} (expected {', '.join(sorted(MESH_SUFFIXES))})")


# ---------------------------------------------------------------------------------------------------------------------
# assembly


@dataclass
class _Piece:
    points: np.ndarray  # (N, 3) float64, wsim frame
    tris: np.ndarray
    tri_part: np.ndarray
    colors: np.ndarray | None
    uvs: np.ndarray | None


def _transform(points: np.ndarray, tris: np.ndarray, uvs: np.ndarray | None, m: np.ndarray):
    p = points @ m[:3, :3].T + m[:3, 3]
    if np.linalg.det(m[:3, :3]) < 0:  # mirrored: keep the triangles' front side
        tris = tris[:, [0, 2, 1]]
        uvs = None if uvs is None else uvs[:, [0, 2, 1]]
    return p, tris, uvs


class _Assembler:
    def __init__(self, src: MeshSource, scene: Scene, mapping: AssetMapping, up: str, mpu: float):
        self.src, self.scene, self.mapping = src, scene, mapping
        self.C = _up_matrix(up, mpu)
        self.C_inv = np.linalg.inv(self.C)
        self.label = Path(src.file).name
        self._materials: dict[int, int] = {}

    def material(self, k: int) -> int:
        """Scene material index of source material ``k`` (-1 → the scene's default material 0)."""
        if k < 0:
            return 0
        if k not in self._materials:
            sm: SourceMaterial = self.src.materials[k]
            rule = self.mapping.material_rule(sm.name) or {}
            attrs = rule.get("attributes")
            if attrs is None:
                attrs = ("visually_transparent",) if (sm.transmittance or 0.0) > 0.0 else ()
            trans = rule.get("transmittance", sm.transmittance)
            try:
                m = Material.from_labels(f"{self.label}:{sm.name}", str(rule.get("base", "none")),
                                         str(rule.get("coating", sm.coating or "none")), attrs,
                                         base_color=sm.base_color, reflectance=rule.get("reflectance"),
                                         transmittance=trans, texture=sm.texture)
            except ValueError as e:
                raise SceneError(f"{self.src.file}: material {sm.name}: {e}") from None
            self._materials[k] = _add_material(self.scene, m)
        return self._materials[k]

    def material_name(self, k: int) -> str:
        return self.src.materials[k].name if k >= 0 else ""

    def node_class(self, node) -> str | None:
        names = [node.path, node.name]
        anc = list(node.ancestors)
        for j in range(len(anc) - 1, -1, -1):
            names += ["/".join(anc[: j + 1]), anc[j]]
        return self.mapping.semantic_class(*names)

    def pieces(self, mesh_index: int, m: np.ndarray, part_name: str, object_id: int,
               node_class: str | None) -> list[_Piece]:
        """The mesh's primitives mapped by ``m`` (file frame → target frame), one new part each."""
        mesh = self.src.meshes[mesh_index]
        out = []
        for k, prim in enumerate(mesh.primitives):
            if len(prim.tris) == 0:
                continue
            cls = node_class or self.mapping.semantic_class(mesh.name, self.material_name(prim.material))
            mat = self.material(prim.material)
            suffix = self.material_name(prim.material) or f"primitive_{k}"
            part = self.scene.add_part(Part(f"{part_name}.{suffix}", mat, self.scene.semantic_class_index(cls or ""),
                                            object_id))
            p, tris, uvs = _transform(prim.points, prim.tris, prim.uvs, m)
            out.append(_Piece(p, tris, np.full(len(tris), part, np.int32), prim.colors, uvs))
        return out

    def concat(self, pieces: list[_Piece], name: str) -> MeshData:
        if not pieces:
            return MeshData(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0), name=name)
        colors = None
        if any(p.colors is not None for p in pieces):
            base = np.array([self.scene.materials[pt.material].base_color for pt in self.scene.parts], np.float64)
            cl = []
            for p in pieces:
                if p.colors is not None:
                    cl.append(np.asarray(p.colors, np.float32))
                    continue
                c = np.full((len(p.points), 3), 0.5, np.float32)
                c[p.tris.ravel()] = base[np.repeat(p.tri_part, 3)]
                cl.append(c)
            colors = np.concatenate(cl)
        uvs = None
        if any(p.uvs is not None for p in pieces):
            uvs = np.concatenate([p.uvs if p.uvs is not None else np.zeros((len(p.tris), 3, 2), np.float32)
                                  for p in pieces]).astype(np.float32)
        offs = np.cumsum([0] + [len(p.points) for p in pieces[:-1]])
        return MeshData(np.concatenate([p.points for p in pieces]),
                        np.concatenate([p.tris + o for p, o in zip(pieces, offs)]),
                        np.concatenate([p.tri_part for p in pieces]), colors, uvs, name)

    def instance_pose(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(t, q, s) of the wsim-frame placement C·m·C⁻¹, or None if it shears (then the node is baked)."""
        w = self.C @ m @ self.C_inv
        try:
            t, q, s = decompose_matrix(w)
        except ValueError:
            return None
        if not np.allclose(compose_matrix(t, q, s), w, atol=1e-9 * max(1.0, float(np.abs(w).max()))):
            return None
        return t, q, s

    def scene_parts(self) -> None:
        """Static geometry, prototypes and instances of the whole file into ``self.scene``."""
        src, scene = self.src, self.scene
        uses: dict[Any, list[int]] = {}
        for j, node in enumerate(src.nodes):
            uses.setdefault(src.meshes[node.mesh].key or ("mesh", node.mesh), []).append(j)
        static: list[_Piece] = []
        protos: dict[Any, int] = {}
        object_ids: dict[Any, int] = {}
        for j, node in enumerate(src.nodes):
            oid = object_ids.setdefault(("node", j) if node.object is None else ("object", node.object),
                                        len(object_ids) + 1)
            cls = self.node_class(node)
            key = src.meshes[node.mesh].key or ("mesh", node.mesh)
            pose = self.instance_pose(node.matrix) if len(uses[key]) > 1 else None
            if pose is None:
                static += self.pieces(node.mesh, self.C @ node.matrix, "/" + node.path, oid, cls)
                continue
            if key not in protos:
                mesh = src.meshes[node.mesh]
                proto = self.concat(self.pieces(node.mesh, self.C, f"/prototypes/{mesh.name}", 0, None), mesh.name)
                if proto.num_triangles == 0:
                    continue
                scene.prototypes.append(proto)
                protos[key] = len(scene.prototypes) - 1
            t, q, s = pose
            scene.instances.append(Instance(protos[key], [0.0], t[None], q[None], s[None], object_id=oid,
                                            name="/" + node.path, semantic_class=scene.semantic_class_index(cls or "")))
        scene.static = self.concat(static, "static")

    def flat(self, name: str) -> MeshData:
        """Every node's geometry in the asset's own frame (metres, Z up) as one mesh."""
        pieces: list[_Piece] = []
        for node in self.src.nodes:
            pieces += self.pieces(node.mesh, self.C @ node.matrix, f"/assets/{name}/{node.path}", 0,
                                  self.node_class(node))
        return self.concat(pieces, name)


def _add_material(scene: Scene, m: Material) -> int:
    """Index of ``m`` in the scene: an equal material of the same name is reused, a different one renamed."""
    base, k = m.name, 1
    while True:
        for i, old in enumerate(scene.materials):
            if old.name == m.name:
                if old == m:
                    return i
                break
        else:
            scene.materials.append(m)
            return len(scene.materials) - 1
        k += 1
        m = Material(f"{base}#{k}", m.base_color, m.material_id, m.reflectance, m.transmittance, m.texture)


def _units(src: MeshSource, mapping: AssetMapping, up_axis: Any, meters_per_unit: Any) -> tuple[str, float]:
    up = _check_up(up_axis, f"{src.file}: up_axis") if up_axis is not None else (mapping.up_axis or
                                                                                 src.default_up_axis)
    mpu = (_check_mpu(meters_per_unit, f"{src.file}: meters_per_unit") if meters_per_unit is not None
           else (mapping.meters_per_unit or 1.0))
    return up, mpu


def _report(src: MeshSource, scene: Scene) -> None:
    if src.notes:
        scene.skipped += [f"{src.file}: {n}" for n in src.notes]
        warnings.warn(f"{src.file}: " + "; ".join(src.notes[:5]) + (" ..." if len(src.notes) > 5 else ""),
                      stacklevel=4)


def load_mesh_file(path: str | os.PathLike, *, mapping: Any = None, up_axis: str | None = None,
                   meters_per_unit: float | None = None) -> Scene:
    """Load a glTF/GLB, OBJ or PLY file as a :class:`Scene` (metres, Z up).

    Args:
        path: The file.
        mapping: Mapping file (path, or its contents as a dict) assigning semantic classes and materials by name;
            default ``<stem>.wsim.yaml`` / ``.wsim.json`` beside the file if there is one; False for none.
        up_axis: "Y" or "Z": the file's up axis (default: the mapping's, else Y for glTF and Z for OBJ/PLY).
        meters_per_unit: Length of the file's unit [m] (default: the mapping's, else 1).

    Raises:
        SceneError: unreadable or malformed file or mapping file; the message names the file.
    """
    p = Path(os.fspath(path))
    src = read_mesh_source(p)
    amap = load_mapping(mapping, p)
    up, mpu = _units(src, amap, up_axis, meters_per_unit)
    scene = Scene(static=MeshData(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0)))
    scene.source = str(p)
    scene.scene_id = p.name.rsplit(".", 1)[0]
    _Assembler(src, scene, amap, up, mpu).scene_parts()
    scene.metadata = {"mesh_file": {"format": src.format, "up_axis": up, "meters_per_unit": mpu,
                                    "mapping": amap.source or None}}
    _report(src, scene)
    scene.validate()
    return scene


def _poses(poses: Any, where: str) -> list[Trajectory]:
    def is_pose(p: Any) -> bool:
        try:
            return len(p) == 2 and np.shape(p[0]) == (3,) and np.shape(p[1]) == (4,)
        except (TypeError, ValueError):  # not a sequence, or a ragged one
            return False

    if isinstance(poses, Trajectory):
        items = [poses]
    elif is_pose(poses):
        items = [poses]
    else:
        try:
            items = list(poses)
        except TypeError:
            raise SceneError(f"{where}: poses must be (translation, quaternion xyzw) pairs or Trajectories") from None
    out = []
    for k, p in enumerate(items):
        if isinstance(p, Trajectory):
            out.append(p)
        elif is_pose(p):
            out.append(Trajectory([0.0], np.asarray(p[0], float)[None], np.asarray(p[1], float)[None]))
        else:
            raise SceneError(f"{where}: poses[{k}] is neither (translation (3,), quaternion xyzw (4,)) nor a "
                             f"Trajectory")
    if not out:
        raise SceneError(f"{where}: no poses given")
    return out


def add_asset(scene: Scene, path: str | os.PathLike, poses: Any, *, semantic_class: str | None = None,
              object_id: int | list[int] | None = None, mapping: Any = None, up_axis: str | None = None,
              meters_per_unit: float | None = None, name: str | None = None) -> list[Instance]:
    """Add a mesh file to ``scene`` as one prototype (the whole file, in its own frame: metres, Z up) and place it.

    Args:
        scene: The scene to extend (its device geometry is rebuilt at the next use).
        path: glTF/GLB, OBJ or PLY file.
        poses: A (translation (3,) [m], quaternion xyzw (4,)) pair, a list of them (static instances), a
            :class:`Trajectory` (one moving instance) or a list of Trajectories.
        semantic_class: Class of every instance (default: the parts' classes from the mapping file).
        object_id: Object id of the first instance (the others count up), or one id per pose; default: the next
            free ids of the scene.
        mapping, up_axis, meters_per_unit: As for :func:`load_mesh_file`.
        name: Instance name prefix (default: the file's stem).

    Returns:
        The new :class:`Instance` objects (already in ``scene.instances``).

    Raises:
        SceneError: unreadable file or mapping, bad poses (the message names the file).
    """
    p = Path(os.fspath(path))
    where = str(p)
    trajs = _poses(poses, where)
    for k, t in enumerate(trajs):
        _check_trajectory(t, f"{where}: poses[{k}]")
    if object_id is None:
        start = max([pt.object_id for pt in scene.parts] + [i.object_id for i in scene.instances] + [0]) + 1
        ids = [start + k for k in range(len(trajs))]
    elif isinstance(object_id, (int, np.integer)) and not isinstance(object_id, bool):
        ids = [int(object_id) + k for k in range(len(trajs))]
    else:
        ids = [int(i) for i in object_id]
        if len(ids) != len(trajs):
            raise SceneError(f"{where}: {len(ids)} object ids for {len(trajs)} poses")
    src = read_mesh_source(p)
    amap = load_mapping(mapping, p)
    up, mpu = _units(src, amap, up_axis, meters_per_unit)
    label = name or p.name.rsplit(".", 1)[0]
    proto = _Assembler(src, scene, amap, up, mpu).flat(label)
    proto.validate(f"{where}: asset")
    if proto.num_triangles == 0:
        raise SceneError(f"{where}: the asset has no triangles")
    scene.prototypes.append(proto)
    pi = len(scene.prototypes) - 1
    sem = scene.semantic_class_index(semantic_class or "")
    out = []
    for k, (t, oid) in enumerate(zip(trajs, ids)):
        inst = Instance(pi, t.times, t.translations, t.rotations, object_id=oid,
                        name=f"{label}_{k}" if len(trajs) > 1 else label, semantic_class=sem)
        scene.instances.append(inst)
        out.append(inst)
        if len(t.times) > 1:
            t0, t1 = scene.time_range
            if t1 <= t0:
                scene.time_range = (float(t.times[0]), float(t.times[-1]))
            else:
                scene.time_range = (min(t0, float(t.times[0])), max(t1, float(t.times[-1])))
    _report(src, scene)
    scene._device_cache.clear()
    return out


set_asset_adder(add_asset)
