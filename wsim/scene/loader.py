"""One entry point for every scene source."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from .scene import Scene, SceneError

USD_SUFFIXES = {".usd", ".usda", ".usdc", ".usdz"}


def load_scene(source: str | os.PathLike = "builtin") -> Scene:
    """Load a scene.

    Args:
        source: ``"builtin"`` (the shipped street block, USD form), ``"builtin:nurec"`` (its NuRec USDZ form), a USD
            file (.usd/.usda/.usdc/.usdz) or a NuRec-style USDZ scene artifact (a zip holding ``metadata.yaml``).

    Raises:
        SceneError: Missing or malformed file; the message names the file (and the prim or member).
    """
    if str(source) in ("builtin", "builtin:usd", "builtin:nurec"):
        from .builtin import load_builtin_scene

        return load_builtin_scene("nurec" if str(source).endswith("nurec") else "usd")
    path = Path(source)
    if not path.exists():
        raise SceneError(f"{path}: no such scene file")
    if path.suffix.lower() == ".usdz" and _is_nurec(path):
        from .nurec import load_nurec

        return load_nurec(path)
    if path.suffix.lower() in USD_SUFFIXES:
        from .usd import load_usd

        return load_usd(path)
    raise SceneError(f"{path}: unknown scene file type {path.suffix!r} (expected .usd/.usda/.usdc/.usdz)")


def _is_nurec(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return "metadata.yaml" in z.namelist()
    except zipfile.BadZipFile:
        return False
