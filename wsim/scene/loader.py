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
    try:
        return _load_file(Path(source))
    except SceneError:
        raise
    except MemoryError:
        raise SceneError(f"{source}: too large to load (out of memory)") from None
    except RecursionError:
        raise SceneError(f"{source}: nested too deeply to load") from None
    except Exception as e:  # noqa: BLE001 - every loader failure is a SceneError naming the file
        raise SceneError(f"{source}: cannot be loaded ({type(e).__name__}: {e})") from e


def _load_file(path: Path) -> Scene:
    if not path.exists():
        raise SceneError(f"{path}: no such scene file")
    if path.is_dir():
        raise SceneError(f"{path}: is a directory, not a scene file")
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
    except (zipfile.BadZipFile, OSError):
        return False
