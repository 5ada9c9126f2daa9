"""Wavefront OBJ (+ MTL) and PLY meshes → :class:`MeshSource`.

OBJ goes through trimesh's vectorised reader: objects (``o``), groups (``g``) and materials (``usemtl``) become one
mesh each (named ``<object>_<group>`` as trimesh names them), polygons are triangulated, ``vt`` coordinates kept, MTL
``Kd`` (linear RGB, exact) → base colour, ``map_Kd`` → texture (used as it is; ``Kd`` does not tint it), ``d`` / ``Tr``
(dissolve) < 1 → transmittance 1 − d. PLY goes through wsim's own PLY reader (:func:`wsim.scene.nurec_format.read_ply_mesh`,
plyfile): one mesh, vertex colours. OBJ and PLY vertex colours are taken as sRGB (the 8-bit convention of the tools
that write them) and made linear. Neither format has units or an up axis: the assembler's defaults are metres, Z up.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .mesh_source import MeshSource, SourceMaterial, SourceMesh, SourceNode, SourcePrimitive, cache_texture, encoded_image
from .nurec_format import read_ply_mesh, srgb_to_linear
from .scene import SceneError

__all__ = ["read_obj", "read_ply"]


def _kd(material) -> tuple[float, float, float]:
    kw = getattr(material, "kwargs", None) or {}
    kd = kw.get("kd")
    if kd is not None:
        try:
            v = [float(x) for x in np.ravel(kd)][:3]
            if len(v) == 3 and all(np.isfinite(v)):
                return tuple(min(max(x, 0.0), 1.0) for x in v)
        except (TypeError, ValueError):
            pass
    diffuse = getattr(material, "diffuse", None)
    if diffuse is None:
        diffuse = getattr(material, "baseColorFactor", None)
    if diffuse is not None and len(diffuse) >= 3:
        d = np.asarray(diffuse, dtype=np.float64)[:3]
        return tuple(float(x) for x in (d / 255.0 if d.max() > 1.0 or np.issubdtype(np.asarray(diffuse).dtype,
                                                                                    np.integer) else d))
    return (0.5, 0.5, 0.5)


def _dissolve(material) -> float | None:
    kw = getattr(material, "kwargs", None) or {}
    for key, invert in (("d", False), ("tr", True)):
        v = kw.get(key)
        if v is None:
            continue
        try:
            x = float(np.ravel(v)[0])
        except (TypeError, ValueError, IndexError):
            continue
        if not np.isfinite(x):
            continue
        d = 1.0 - x if invert else x
        d = min(max(d, 0.0), 1.0)
        return None if d >= 1.0 else 1.0 - d
    return None


def read_obj(path: str | Path) -> MeshSource:
    """Read an OBJ file and the MTL files it names (through trimesh).

    Raises:
        SceneError: unreadable file, or no triangles in it.
    """
    import trimesh

    path = Path(path)
    file = str(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trimesh's numpy warnings on untextured groups are noise here
        try:
            loaded = trimesh.load_scene(file, file_type="obj", process=False, maintain_order=False,
                                        group_material=True, split_objects=True, split_groups=True)
        except Exception as e:  # noqa: BLE001 - trimesh raises many types for bad input
            raise SceneError(f"{file}: not a readable OBJ file ({type(e).__name__}: {e})") from e
    materials: list[SourceMaterial] = []
    by_material: dict[int, int] = {}
    meshes: list[SourceMesh] = []
    nodes: list[SourceNode] = []
    notes: list[str] = []
    for node_name in loaded.graph.nodes_geometry:
        matrix, geom_name = loaded.graph[node_name]
        g = loaded.geometry[geom_name]
        if not hasattr(g, "faces") or len(g.faces) == 0:
            continue
        points = np.asarray(g.vertices, dtype=np.float64)
        tris = np.asarray(g.faces, dtype=np.int64)
        vis = g.visual
        mat_index, uvs, colors = -1, None, None
        material = getattr(vis, "material", None)
        if material is not None:
            key = id(material)
            if key not in by_material:
                name = str(getattr(material, "name", None) or f"material_{len(materials)}")
                texture = None
                image = getattr(material, "image", None)
                if image is None:
                    image = getattr(material, "baseColorTexture", None)
                if image is not None:
                    try:
                        texture = cache_texture(encoded_image(image), ".png")
                    except (OSError, ValueError) as e:
                        notes.append(f"material {name}: texture not stored ({e}); base colour used")
                materials.append(SourceMaterial(name, _kd(material), texture, _dissolve(material)))
                by_material[key] = len(materials) - 1
            mat_index = by_material[key]
            uv = getattr(vis, "uv", None)
            if uv is not None and len(uv) == len(points):
                uvs = np.asarray(uv, dtype=np.float64)[tris].astype(np.float32)  # OBJ vt is already USD st
        vc = None
        if getattr(vis, "kind", None) == "vertex":
            vc = np.asarray(vis.vertex_colors)
        elif hasattr(vis, "vertex_attributes") and "color" in getattr(vis, "vertex_attributes", {}):
            vc = np.asarray(vis.vertex_attributes["color"])
        if vc is not None and len(vc) == len(points) and vc.ndim == 2 and vc.shape[1] >= 3:
            enc = vc[:, :3].astype(np.float64)
            colors = srgb_to_linear(enc / 255.0 if np.issubdtype(vc.dtype, np.integer) else enc).astype(np.float32)
        mname = str(getattr(material, "name", "") or "")
        node = str(node_name)
        if mname and node.endswith("_" + mname) and len(node) > len(mname) + 1:
            node = node[: -len(mname) - 1]
        meshes.append(SourceMesh(str(geom_name), [SourcePrimitive(points, tris, uvs, colors, mat_index)],
                                 key=("obj", len(meshes))))
        nodes.append(SourceNode(node, node, len(meshes) - 1, np.asarray(matrix, dtype=np.float64), object=node))
    if not meshes:
        raise SceneError(f"{file}: the OBJ file holds no triangles")
    return MeshSource(file, "obj", meshes, materials, nodes, "Z", notes)


def read_ply(path: str | Path) -> MeshSource:
    """Read a PLY triangle mesh (binary or ASCII; vertex colours) with wsim's PLY reader.

    Raises:
        SceneError: unreadable file, a header that promises more than the file holds, NaN points, out-of-range
            indices, or no faces (a point cloud).
    """
    path = Path(path)
    file = str(path)
    points, tris, colors = read_ply_mesh(path.read_bytes(), file)
    if len(tris) == 0:
        raise SceneError(f"{file}: the PLY file has no faces (a point cloud is not a mesh)")
    prim = SourcePrimitive(points.astype(np.float64), tris.astype(np.int64), None, colors, 0)
    mesh = SourceMesh(path.stem, [prim], key=("ply", 0))
    return MeshSource(file, "ply", [mesh], [SourceMaterial(path.stem)], [SourceNode(path.stem, path.stem, 0,
                                                                                     np.eye(4))], "Z")
