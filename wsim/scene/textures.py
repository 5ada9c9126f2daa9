"""Texture atlas and per-corner UVs of a scene, for the camera's COLOR shading."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .scene import MeshData, Scene


@dataclass
class TextureTables:
    """Host arrays: ``texels`` (T, 3) linear RGB of every texture back to back; ``material_texture`` (n_materials, 4)
    int32 (texel offset, width, height, enabled); ``static_uv`` (3·M, 2) and ``proto_uv`` (Σ 3·M_p, 2) per-corner
    ``st`` coordinates with ``proto_uv_offset`` (per prototype, in corners)."""

    texels: np.ndarray
    material_texture: np.ndarray
    static_uv: np.ndarray
    proto_uv: np.ndarray
    proto_uv_offset: np.ndarray

    @property
    def any(self) -> bool:
        return bool(self.material_texture[:, 3].any())


def _srgb_to_linear(c: np.ndarray) -> np.ndarray:
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _corner_uvs(mesh: MeshData) -> np.ndarray:
    if mesh.uvs is None or len(mesh.uvs) != mesh.num_triangles:
        return np.zeros((3 * max(mesh.num_triangles, 1), 2), np.float32)
    return np.asarray(mesh.uvs, np.float32).reshape(-1, 2)


def build_texture_tables(scene: Scene) -> TextureTables:
    """Load every material's diffuse texture (Pillow) into one atlas; a texture that cannot be read is reported
    once with a warning naming the file and material, and the material falls back to its base colour."""
    from PIL import Image

    chunks, info, offset = [], np.zeros((len(scene.materials), 4), np.int32), 0
    cache: dict[str, tuple[int, int, int]] = {}
    for k, m in enumerate(scene.materials):
        if not m.texture:
            continue
        if m.texture not in cache:
            try:
                with Image.open(m.texture) as im:
                    rgb = np.asarray(im.convert("RGB"), np.float32) / 255.0
            except (OSError, ValueError) as e:
                warnings.warn(f"{m.texture}: texture of material {m.name} not readable ({e}); using its base colour",
                              stacklevel=2)
                continue
            h, w = rgb.shape[:2]
            chunks.append(_srgb_to_linear(rgb).reshape(-1, 3))
            cache[m.texture] = (offset, w, h)
            offset += w * h
        o, w, h = cache[m.texture]
        info[k] = (o, w, h, 1)
    texels = np.concatenate(chunks) if chunks else np.zeros((1, 3), np.float32)
    protos = [_corner_uvs(p) for p in scene.prototypes]
    offs = np.cumsum([0] + [len(u) for u in protos[:-1]]).astype(np.int32) if protos else np.zeros(1, np.int32)
    return TextureTables(texels.astype(np.float32), info, _corner_uvs(scene.static),
                         np.concatenate(protos) if protos else np.zeros((3, 2), np.float32), offs)
