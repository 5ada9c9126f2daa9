"""glTF 2.0 (``.gltf`` JSON with external or data-URI buffers, ``.glb`` binary) → :class:`MeshSource`, read from the
Khronos specification with ``json`` and NumPy.

What is read: the default scene's node tree (``matrix`` or translation/rotation/scale, composed down the tree), meshes
and their primitives (triangles, triangle strips and fans; points and lines are skipped with a note), accessors of every
component type (normalized integers, byte strides, sparse accessors, ``KHR_mesh_quantization``), ``TEXCOORD_n`` for the
base colour texture (with ``KHR_texture_transform``), ``COLOR_0`` (linear), materials (``baseColorFactor``,
``baseColorTexture`` from a file, a data URI or a buffer view, ``EXT_texture_webp``), ``KHR_materials_transmission``
(→ transmittance), ``alphaMode: BLEND`` (transmittance 1 − alpha when there is no transmission),
``KHR_materials_clearcoat`` (→ the SimReady ``clearcoat`` coating). Emission, metal/roughness, normal maps, cameras,
lights, skins (meshes stay in their bind pose) and animations (the file's rest pose is loaded) are ignored.
Files that require an extension wsim cannot decode (Draco, meshopt, Basis textures) are refused with a SceneError.

Why not a library: pygltflib builds a dataclass per JSON object (16 s for 20 000 nodes) and trimesh's glTF reader
drops material indices and ``KHR_materials_*`` extensions and rounds colours to 8 bits; the container itself is small.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np

from .mesh_source import (MeshSource, SourceMaterial, SourceMesh, SourceNode, SourcePrimitive, cache_texture,
                          image_suffix, tinted_texture)
from .scene import SceneError
from .transforms import quat_to_matrix

__all__ = ["read_gltf", "SUPPORTED_EXTENSIONS"]

_COMPONENT = {5120: np.int8, 5121: np.uint8, 5122: np.int16, 5123: np.uint16, 5125: np.uint32, 5126: np.float32}
_NORMALIZE = {5120: 127.0, 5121: 255.0, 5122: 32767.0, 5123: 65535.0}
_WIDTH = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4}
#: Extensions wsim reads or may safely ignore; a file that *requires* any other one is refused.
SUPPORTED_EXTENSIONS = frozenset({
    "KHR_materials_transmission", "KHR_materials_clearcoat", "KHR_texture_transform", "KHR_mesh_quantization",
    "KHR_materials_emissive_strength", "KHR_materials_ior", "KHR_materials_volume", "KHR_materials_specular",
    "KHR_materials_sheen", "KHR_materials_unlit", "KHR_materials_iridescence", "KHR_materials_anisotropy",
    "KHR_materials_dispersion", "KHR_materials_variants", "KHR_lights_punctual", "KHR_texture_webp",
    "EXT_texture_webp",
})
#: Most node visits one file may ask for (a node tree that shares subtrees can multiply them).
MAX_NODE_VISITS = 2_000_000
_TRIANGLES, _STRIP, _FAN = 4, 5, 6


def _finite(values: Any, n: int, where: str, what: str) -> list[float]:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        raise SceneError(f"{where}: {what} must be {n} numbers, got {values!r:.80}") from None
    if len(out) != n or not all(math.isfinite(v) for v in out):
        raise SceneError(f"{where}: {what} must be {n} finite numbers, got {values!r:.80}")
    return out


class _Reader:
    def __init__(self, path: Path):
        self.path = path
        self.file = str(path)
        self.base = path.parent
        self.notes: list[str] = []
        data = path.read_bytes()
        self.bin: bytes | None = None
        if data[:4] == b"glTF":
            self.doc = self._glb(data)
        else:
            try:
                self.doc = json.loads(data.decode("utf-8-sig"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise SceneError(f"{self.file}: not a glTF file (neither GLB nor JSON: {e})") from None
        if not isinstance(self.doc, dict):
            raise SceneError(f"{self.file}: not a glTF file (the JSON is not an object)")
        version = str((self.doc.get("asset") or {}).get("version", ""))
        if not version.startswith("2"):
            raise SceneError(f"{self.file}: glTF version {version or '(none)'!r} is not supported (glTF 2.0 only)")
        required = set(self.doc.get("extensionsRequired") or ())
        missing = sorted(required - SUPPORTED_EXTENSIONS)
        if missing:
            raise SceneError(f"{self.file}: requires glTF extension(s) wsim cannot decode: {', '.join(missing)}")
        self._buffers: dict[int, bytes] = {}
        self._meshes: dict[int, SourceMesh] = {}
        self.materials: list[SourceMaterial] = []
        self._material_uv: list[tuple[int, np.ndarray | None]] = []

    # -- container -----------------------------------------------------------------------------------------------------
    def _glb(self, data: bytes) -> dict:
        if len(data) < 20:
            raise SceneError(f"{self.file}: GLB file is truncated ({len(data)} bytes)")
        _, version, length = struct.unpack_from("<4sII", data, 0)
        if version != 2:
            raise SceneError(f"{self.file}: GLB container version {version} is not supported (glTF 2.0 only)")
        if length > len(data):
            raise SceneError(f"{self.file}: GLB header says {length} bytes but the file holds {len(data)}")
        doc, off = None, 12
        while off + 8 <= length:
            size, kind = struct.unpack_from("<I4s", data, off)
            off += 8
            if off + size > length:
                raise SceneError(f"{self.file}: GLB chunk {kind!r} runs past the end of the file")
            chunk = data[off : off + size]
            if kind == b"JSON" and doc is None:
                try:
                    doc = json.loads(chunk.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as e:
                    raise SceneError(f"{self.file}: GLB JSON chunk is not valid JSON ({e})") from None
            elif kind == b"BIN\x00" and self.bin is None:
                self.bin = chunk
            off += size + (-size % 4)
        if doc is None:
            raise SceneError(f"{self.file}: GLB file has no JSON chunk")
        return doc

    def _item(self, kind: str, index: Any, where: str) -> dict:
        items = self.doc.get(kind) or []
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(items):
            raise SceneError(f"{self.file}: {where}: {kind} index {index!r} out of range [0, {len(items)})")
        item = items[index]
        if not isinstance(item, dict):
            raise SceneError(f"{self.file}: {kind}[{index}] is not an object")
        return item

    def _uri_bytes(self, uri: str, where: str) -> bytes:
        if uri.startswith("data:"):
            head, _, payload = uri.partition(",")
            if not head.endswith(";base64"):
                return urllib.parse.unquote_to_bytes(payload)
            try:
                return base64.b64decode(payload, validate=False)
            except ValueError as e:
                raise SceneError(f"{self.file}: {where}: bad base64 data URI ({e})") from None
        p = self.base / urllib.parse.unquote(uri)
        if not p.is_file():
            raise SceneError(f"{self.file}: {where}: referenced file {uri!r} not found (looked for {p})")
        return p.read_bytes()

    def buffer(self, index: int) -> bytes:
        if index not in self._buffers:
            b = self._item("buffers", index, "bufferView")
            if "uri" in b:
                data = self._uri_bytes(str(b["uri"]), f"buffers[{index}]")
            elif index == 0 and self.bin is not None:
                data = self.bin
            else:
                raise SceneError(f"{self.file}: buffers[{index}] has no uri and the file no GLB binary chunk")
            n = int(b.get("byteLength", len(data)))
            if n > len(data):
                raise SceneError(f"{self.file}: buffers[{index}] declares {n} bytes but holds {len(data)}")
            self._buffers[index] = data
        return self._buffers[index]

    def view(self, index: int, where: str) -> tuple[memoryview, int | None]:
        v = self._item("bufferViews", index, where)
        data = self.buffer(v.get("buffer", -1))
        off, n = int(v.get("byteOffset", 0)), int(v.get("byteLength", -1))
        if off < 0 or n < 0 or off + n > len(data):
            raise SceneError(f"{self.file}: bufferViews[{index}] ({off} + {n} bytes) lies outside its buffer "
                             f"({len(data)} bytes)")
        stride = v.get("byteStride")
        return memoryview(data)[off : off + n], (int(stride) if stride else None)

    def _strided(self, view: memoryview, offset: int, stride: int | None, count: int, dtype, width: int,
                 where: str) -> np.ndarray:
        item = np.dtype(dtype).itemsize * width
        stride = stride or item
        if count == 0:
            return np.zeros((0, width), dtype)
        need = offset + (count - 1) * stride + item
        if offset < 0 or stride < item or need > len(view):
            raise SceneError(f"{self.file}: {where}: {count} elements of {item} bytes (stride {stride}, offset "
                             f"{offset}) do not fit the {len(view)}-byte buffer view")
        if stride == item:
            return np.frombuffer(view, dtype, count * width, offset).reshape(count, width)
        raw = np.frombuffer(view, np.uint8, need - offset, offset)
        rows = np.lib.stride_tricks.as_strided(raw, (count, item), (stride, 1))
        return np.ascontiguousarray(rows).view(dtype).reshape(count, width)

    def accessor(self, index: Any, where: str) -> np.ndarray:
        """Accessor ``index`` as a (count, width) array (float64 if normalized)."""
        where = f"{where}: accessors[{index}]"
        a = self._item("accessors", index, where)
        ct = a.get("componentType")
        if ct not in _COMPONENT:
            raise SceneError(f"{self.file}: {where}: unknown componentType {ct!r}")
        width = _WIDTH.get(a.get("type"))
        if width is None:
            raise SceneError(f"{self.file}: {where}: type {a.get('type')!r} is not a scalar or vector")
        count = a.get("count")
        if not isinstance(count, int) or count < 0:
            raise SceneError(f"{self.file}: {where}: count must be a non-negative integer, got {count!r}")
        dtype = _COMPONENT[ct]
        if "bufferView" in a:
            view, stride = self.view(a["bufferView"], where)
            arr = self._strided(view, int(a.get("byteOffset", 0)), stride, count, dtype, width, where)
        else:  # all zeros (then usually sparse): bounded by the file's size, so a count cannot allocate gigabytes
            limit = 16 * sum(int(b.get("byteLength", 0)) for b in self.doc.get("buffers") or [] if
                             isinstance(b, dict)) + 65536
            if count * width > limit:
                raise SceneError(f"{self.file}: {where}: {count} elements without a bufferView exceed what the "
                                 f"file's buffers can describe")
            arr = np.zeros((count, width), dtype)
        sparse = a.get("sparse")
        if sparse:
            n = int(sparse.get("count", 0))
            si, sv = sparse.get("indices") or {}, sparse.get("values") or {}
            ict = si.get("componentType")
            if ict not in (5121, 5123, 5125):
                raise SceneError(f"{self.file}: {where}: sparse indices componentType {ict!r} is not unsigned")
            iv, _ = self.view(si.get("bufferView", -1), where)
            idx = self._strided(iv, int(si.get("byteOffset", 0)), None, n, _COMPONENT[ict], 1, where).ravel()
            vv, _ = self.view(sv.get("bufferView", -1), where)
            vals = self._strided(vv, int(sv.get("byteOffset", 0)), None, n, dtype, width, where)
            if n and int(idx.max()) >= count:
                raise SceneError(f"{self.file}: {where}: sparse index {int(idx.max())} out of range [0, {count})")
            arr = arr.copy()
            arr[idx.astype(np.int64)] = vals
        if a.get("normalized") and ct in _NORMALIZE:
            arr = np.maximum(arr.astype(np.float64) / _NORMALIZE[ct], -1.0)
        return arr

    # -- materials -----------------------------------------------------------------------------------------------------
    def _image_file(self, tex_index: Any, where: str) -> str | None:
        tex = self._item("textures", tex_index, where)
        ext = tex.get("extensions") or {}
        source = tex.get("source")
        for key in ("EXT_texture_webp", "KHR_texture_webp"):
            if key in ext and isinstance(ext[key], dict) and "source" in ext[key]:
                source = ext[key]["source"]
        if source is None:
            self.notes.append(f"{where}: texture {tex_index} has no image wsim can read; base colour used")
            return None
        img = self._item("images", source, where)
        if "uri" in img and not str(img["uri"]).startswith("data:"):
            p = (self.base / urllib.parse.unquote(str(img["uri"]))).resolve()
            if not p.is_file():
                self.notes.append(f"{where}: texture image {img['uri']!r} not found; base colour used")
                return None
            return str(p)
        if "uri" in img:
            data = self._uri_bytes(str(img["uri"]), f"images[{source}]")
        elif "bufferView" in img:
            view, _ = self.view(img["bufferView"], f"images[{source}]")
            data = bytes(view)
        else:
            self.notes.append(f"{where}: images[{source}] has neither uri nor bufferView; base colour used")
            return None
        return cache_texture(data, image_suffix(data, img.get("mimeType")))

    @staticmethod
    def _uv_transform(info: dict) -> np.ndarray | None:
        t = (info.get("extensions") or {}).get("KHR_texture_transform")
        if not isinstance(t, dict):
            return None
        ox, oy = (float(v) for v in t.get("offset", (0.0, 0.0)))
        r = float(t.get("rotation", 0.0))
        sx, sy = (float(v) for v in t.get("scale", (1.0, 1.0)))
        c, s = math.cos(r), math.sin(r)
        return (np.array([[1, 0, ox], [0, 1, oy], [0, 0, 1]]) @ np.array([[c, s, 0], [-s, c, 0], [0, 0, 1]])
                @ np.diag([sx, sy, 1.0]))

    def read_materials(self) -> None:
        for i, m in enumerate(self.doc.get("materials") or []):
            where = f"materials[{i}]"
            if not isinstance(m, dict):
                raise SceneError(f"{self.file}: {where} is not an object")
            name = str(m.get("name") or f"material_{i}")
            where = f"{where} ({name})"
            pbr = m.get("pbrMetallicRoughness") or {}
            factor = _finite(pbr.get("baseColorFactor", (1.0, 1.0, 1.0, 1.0)), 4, f"{self.file}: {where}",
                             "baseColorFactor")
            rgb = tuple(min(max(v, 0.0), 1.0) for v in factor[:3])
            texture, texcoord, uv_tf = None, 0, None
            info = pbr.get("baseColorTexture")
            if isinstance(info, dict) and "index" in info:
                texture = self._image_file(info["index"], where)
                texcoord = int(info.get("texCoord", 0))
                uv_tf = self._uv_transform(info)
                t_ext = ((info.get("extensions") or {}).get("KHR_texture_transform") or {})
                if "texCoord" in t_ext:
                    texcoord = int(t_ext["texCoord"])
                if texture is not None and any(abs(v - 1.0) > 1e-6 for v in rgb):
                    try:
                        texture = tinted_texture(texture, rgb)
                    except (OSError, ValueError) as e:
                        self.notes.append(f"{where}: texture not readable ({e}); base colour used")
                        texture = None
            ext = m.get("extensions") or {}
            transmittance = None
            if isinstance(ext.get("KHR_materials_transmission"), dict):
                transmittance = float(ext["KHR_materials_transmission"].get("transmissionFactor", 0.0))
            elif m.get("alphaMode") == "BLEND":
                transmittance = 1.0 - min(max(factor[3], 0.0), 1.0)
            coating = None
            cc = ext.get("KHR_materials_clearcoat")
            if isinstance(cc, dict) and float(cc.get("clearcoatFactor", 0.0)) > 0:
                coating = "clearcoat"
            if transmittance is not None and not (0.0 <= transmittance <= 1.0):
                raise SceneError(f"{self.file}: {where}: transmission {transmittance} outside [0, 1]")
            self.materials.append(SourceMaterial(name, rgb, texture, transmittance, coating))
            self._material_uv.append((texcoord if texture else -1, uv_tf))

    # -- meshes --------------------------------------------------------------------------------------------------------
    def mesh(self, index: int) -> SourceMesh:
        if index in self._meshes:
            return self._meshes[index]
        m = self._item("meshes", index, "node")
        name = str(m.get("name") or f"mesh_{index}")
        where = f"meshes[{index}] ({name})"
        prims, key = [], []
        for k, p in enumerate(m.get("primitives") or []):
            pw = f"{where} primitive {k}"
            if not isinstance(p, dict):
                raise SceneError(f"{self.file}: {pw} is not an object")
            mode = p.get("mode", _TRIANGLES)
            if mode not in (_TRIANGLES, _STRIP, _FAN):
                self.notes.append(f"{pw}: mode {mode} (points/lines) skipped")
                continue
            attrs = p.get("attributes") or {}
            if "POSITION" not in attrs:
                raise SceneError(f"{self.file}: {pw}: no POSITION attribute")
            points = self.accessor(attrs["POSITION"], pw).astype(np.float64)
            if points.shape[1] != 3:
                raise SceneError(f"{self.file}: {pw}: POSITION must be VEC3")
            bad = ~np.isfinite(points).all(axis=1)
            if bad.any():
                raise SceneError(f"{self.file}: {pw}: non-finite (NaN/inf) position at index {int(np.argmax(bad))}")
            n = len(points)
            if "indices" in p:
                idx = self.accessor(p["indices"], pw)
                if idx.shape[1] != 1 or not np.issubdtype(idx.dtype, np.integer):
                    raise SceneError(f"{self.file}: {pw}: indices must be unsigned integer scalars")
                idx = idx.ravel().astype(np.int64)
            else:
                idx = np.arange(n, dtype=np.int64)
            if len(idx) and (int(idx.max()) >= n):
                raise SceneError(f"{self.file}: {pw}: vertex index {int(idx.max())} out of range [0, {n})")
            tris = self._triangles(idx, mode)
            mat = p.get("material", -1)
            if mat != -1:
                self._item("materials", mat, pw)
            uvs = colors = None
            texcoord, uv_tf = self._material_uv[mat] if mat != -1 else (-1, None)
            if texcoord >= 0 and f"TEXCOORD_{texcoord}" in attrs:
                uv = self.accessor(attrs[f"TEXCOORD_{texcoord}"], pw).astype(np.float64)
                if uv.shape != (n, 2):
                    raise SceneError(f"{self.file}: {pw}: TEXCOORD_{texcoord} must be VEC2 per vertex")
                if uv_tf is not None:
                    uv = uv @ uv_tf[:2, :2].T + uv_tf[:2, 2]
                st = np.stack([uv[:, 0], 1.0 - uv[:, 1]], axis=1)  # glTF origin top-left → USD st bottom-left
                uvs = st[tris].astype(np.float32)
            if "COLOR_0" in attrs:
                c = self.accessor(attrs["COLOR_0"], pw).astype(np.float64)
                if len(c) != n or c.shape[1] not in (3, 4):
                    raise SceneError(f"{self.file}: {pw}: COLOR_0 must be VEC3/VEC4 per vertex")
                colors = np.clip(c[:, :3], 0.0, 1.0).astype(np.float32)
            prims.append(SourcePrimitive(points, tris, uvs, colors, int(mat)))
            key.append((mode, attrs.get("POSITION"), p.get("indices"), mat, attrs.get(f"TEXCOORD_{texcoord}"),
                        attrs.get("COLOR_0")))
        if m.get("weights") is not None or any("targets" in p for p in m.get("primitives") or [] if
                                                isinstance(p, dict)):
            self.notes.append(f"{where}: morph targets ignored (base shape loaded)")
        out = SourceMesh(name, prims, tuple(key))
        self._meshes[index] = out
        return out

    def _triangles(self, idx: np.ndarray, mode: int) -> np.ndarray:
        if mode == _TRIANGLES:
            return idx[: len(idx) - len(idx) % 3].reshape(-1, 3)
        k = np.arange(max(len(idx) - 2, 0))
        if mode == _STRIP:
            a, b, c = idx[k], idx[k + 1], idx[k + 2]
            odd = (k % 2) == 1
            b, c = np.where(odd, c, b), np.where(odd, b, c)
        else:
            a, b, c = np.full(len(k), idx[0] if len(idx) else 0), idx[k + 1], idx[k + 2]
        t = np.stack([a, b, c], axis=1)
        return t[(t[:, 0] != t[:, 1]) & (t[:, 1] != t[:, 2]) & (t[:, 0] != t[:, 2])]

    # -- nodes ---------------------------------------------------------------------------------------------------------
    def _local(self, node: dict, where: str) -> np.ndarray:
        if "matrix" in node:
            m = np.array(_finite(node["matrix"], 16, f"{self.file}: {where}", "matrix")).reshape(4, 4).T
            return m
        m = np.eye(4)
        if "scale" in node:
            m = np.diag(_finite(node["scale"], 3, f"{self.file}: {where}", "scale") + [1.0])
        if "rotation" in node:
            q = np.array(_finite(node["rotation"], 4, f"{self.file}: {where}", "rotation (x, y, z, w)"))
            nq = np.linalg.norm(q)
            if nq < 1e-9:
                raise SceneError(f"{self.file}: {where}: rotation is a zero quaternion")
            r = np.eye(4)
            r[:3, :3] = quat_to_matrix(q / nq)
            m = r @ m
        if "translation" in node:
            m[:3, 3] += _finite(node["translation"], 3, f"{self.file}: {where}", "translation")
        return m

    def nodes(self) -> list[SourceNode]:
        nodes = self.doc.get("nodes") or []
        scenes = self.doc.get("scenes") or []
        if scenes:
            si = self.doc.get("scene", 0)
            roots = list(self._item("scenes", si, "scene").get("nodes") or [])
        else:
            children = {c for n in nodes if isinstance(n, dict) for c in n.get("children") or []}
            roots = [i for i in range(len(nodes)) if i not in children]
        out: list[SourceNode] = []
        if not nodes and not scenes and self.doc.get("meshes"):
            # meshes without a node tree: each once, untransformed
            for i in range(len(self.doc["meshes"])):
                out.append(SourceNode(f"mesh_{i}", f"mesh_{i}", i, np.eye(4)))
            self.notes.append("no nodes: every mesh placed once at the origin")
            return out
        visits = 0
        names = [str(n.get("name") or f"node_{i}") if isinstance(n, dict) else f"node_{i}"
                 for i, n in enumerate(nodes)]
        stack: list[tuple[int, np.ndarray, tuple[str, ...], frozenset[int]]] = [
            (r, np.eye(4), (), frozenset()) for r in reversed(roots)]
        skinned = False
        while stack:
            i, parent, ancestors, on_path = stack.pop()
            node = self._item("nodes", i, "node tree")
            if i in on_path:
                raise SceneError(f"{self.file}: nodes[{i}] ({names[i]}) is its own ancestor (a cycle)")
            visits += 1
            if visits > MAX_NODE_VISITS:
                raise SceneError(f"{self.file}: node tree expands to more than {MAX_NODE_VISITS:,} nodes")
            world = parent @ self._local(node, f"nodes[{i}] ({names[i]})")
            if "mesh" in node:
                self.mesh(node["mesh"])
                path = "/".join(ancestors + (names[i],))
                out.append(SourceNode(names[i], path, int(node["mesh"]), world, ancestors))
                skinned |= "skin" in node
            for c in reversed(node.get("children") or []):
                stack.append((c, world, ancestors + (names[i],), on_path | {i}))
        if skinned:
            self.notes.append("skins ignored: skinned meshes are loaded in their bind pose")
        if self.doc.get("animations"):
            self.notes.append("animations ignored: the rest pose is loaded")
        return out


def read_gltf(path: str | Path) -> MeshSource:
    """Read a ``.gltf`` or ``.glb`` file (glTF 2.0; Y up, metres by the specification).

    Raises:
        SceneError: Not glTF 2.0, a required extension wsim cannot decode, a missing buffer or referenced file,
            accessors outside their buffers, out-of-range indices, non-finite positions or transforms, a node cycle.
    """
    r = _Reader(Path(path))
    r.read_materials()
    nodes = r.nodes()
    meshes = [r._meshes.get(i) or SourceMesh(f"mesh_{i}", []) for i in range(len(r.doc.get("meshes") or []))]
    return MeshSource(r.file, "gltf", meshes, r.materials, nodes, "Y", r.notes)
