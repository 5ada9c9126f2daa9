"""What a mesh-file reader (:mod:`wsim.scene.gltf`, :mod:`wsim.scene.obj_ply`) hands to the assembler
(:mod:`wsim.scene.mesh_files`): meshes in the file's own units and axes, the nodes that place them, the file's
materials, and the texture cache that gives embedded images a file path (``Material.texture`` is a path)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .nurec_format import linear_to_srgb, srgb_to_linear


@dataclass
class SourcePrimitive:
    """Triangles with one material, in the mesh's frame and the file's units and axes.

    Attributes:
        points: (N, 3) float64 vertex positions.
        tris: (M, 3) int64 vertex indices, counter-clockwise seen from the front.
        uvs: Optional (M, 3, 2) float32 face-varying texture coordinates, USD ``st`` convention (origin at the
            image's bottom-left corner).
        colors: Optional (N, 3) float32 linear vertex colours in [0, 1].
        material: Index into :attr:`MeshSource.materials`, or -1 for none (the scene's default material).
    """

    points: np.ndarray
    tris: np.ndarray
    uvs: np.ndarray | None = None
    colors: np.ndarray | None = None
    material: int = -1


@dataclass
class SourceMesh:
    """A mesh of the file. ``key`` is equal for meshes that hold the same data (one prototype serves both)."""

    name: str
    primitives: list[SourcePrimitive]
    key: Any = None


@dataclass
class SourceMaterial:
    """A material as the file describes it; the mapping file adds SimReady labels and reflectance.

    Attributes:
        name: Material name in the file (``material_<i>`` if it has none).
        base_color: Linear RGB in [0, 1].
        texture: Path of the diffuse (base colour) texture image, or None.
        transmittance: Fraction of a lidar beam passed through, when the file says (glTF transmission, alpha blend,
            MTL dissolve); None otherwise.
        coating: SimReady coating the file implies (glTF clearcoat → ``"clearcoat"``), or None.
    """

    name: str
    base_color: tuple[float, float, float] = (0.5, 0.5, 0.5)
    texture: str | None = None
    transmittance: float | None = None
    coating: str | None = None


@dataclass
class SourceNode:
    """A placement of a mesh: ``matrix`` (4x4, column vectors, file units and axes) maps the mesh to the file's world.

    ``path`` is the node's name path from the root (``"city/block_3/car"``), ``ancestors`` the names above it
    (root first). Nodes with equal ``object`` keys are one object (one object id); None: the node alone."""

    name: str
    path: str
    mesh: int
    matrix: np.ndarray
    ancestors: tuple[str, ...] = ()
    object: Any = None


@dataclass
class MeshSource:
    """Everything a reader found in one file."""

    file: str
    format: str
    meshes: list[SourceMesh]
    materials: list[SourceMaterial]
    nodes: list[SourceNode]
    default_up_axis: str = "Z"
    notes: list[str] = field(default_factory=list)


def cache_dir() -> Path:
    """wsim's cache folder: ``$WSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/wsim``, else ``~/.cache/wsim``."""
    env = os.environ.get("WSIM_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "wsim"


def cache_texture(data: bytes, suffix: str) -> str:
    """Store image bytes under their SHA-256 in ``<cache>/textures`` (once) and return the file's path; falls back
    to the temporary folder when the cache cannot be written."""
    name = hashlib.sha256(data).hexdigest()[:32] + suffix
    for base in (cache_dir(), Path(tempfile.gettempdir()) / "wsim-cache"):
        folder = base / "textures"
        path = folder / name
        try:
            if path.is_file() and path.stat().st_size == len(data):
                return str(path)
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{name}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, path)
            return str(path)
        except OSError:
            continue
    raise OSError("no writable cache folder for embedded textures (set WSIM_CACHE_DIR)")


def image_suffix(data: bytes, mime: str | None = None) -> str:
    """File suffix of encoded image bytes (by their magic number, else by the MIME type)."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return ".png"
    if data[:3] == b"\xff\xd8\xff":
        return ".jpg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    return {"image/png": ".png", "image/jpeg": ".jpg", "image/webp": ".webp"}.get((mime or "").lower(), ".img")


def tinted_texture(path: str, factor: tuple[float, float, float]) -> str:
    """A cached PNG of the image at ``path`` multiplied by a linear RGB ``factor`` (glTF: base colour = factor ×
    texture; wsim's camera samples the texture alone). Raises OSError/ValueError for an unreadable image."""
    import io

    from PIL import Image

    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB"), np.float64) / 255.0
    lin = srgb_to_linear(rgb) * np.asarray(factor, np.float64)[None, None, :]
    out = np.clip(np.round(linear_to_srgb(np.clip(lin, 0.0, 1.0)) * 255.0), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(out, "RGB").save(buf, format="PNG")
    return cache_texture(buf.getvalue(), ".png")


def encoded_image(image: Any) -> bytes:
    """PNG bytes of a PIL image."""
    import io

    buf = io.BytesIO()
    image.convert("RGBA" if image.mode in ("RGBA", "LA", "P") else "RGB").save(buf, format="PNG")
    return buf.getvalue()
