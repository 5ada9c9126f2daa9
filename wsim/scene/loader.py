"""One entry point for every scene source."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

# Imported here (not lazily) so that Scene.add_asset is installed whenever wsim is imported.
from .mesh_files import MESH_SUFFIXES, load_mesh_file
from .scene import Scene, SceneError

USD_SUFFIXES = {".usd", ".usda", ".usdc", ".usdz"}
#: Every file suffix :func:`load_scene` reads: USD stages and NuRec artifacts, glTF/GLB, OBJ and PLY meshes.
SCENE_SUFFIXES = USD_SUFFIXES | set(MESH_SUFFIXES)


def load_scene(source: str | os.PathLike = "builtin", *, mapping: Any = None, up_axis: str | None = None,
               meters_per_unit: float | None = None) -> Scene:
    """Load a scene.

    Args:
        source: ``"builtin"`` (the shipped street block, USD form), ``"builtin:nurec"`` (its NuRec USDZ form), a USD
            file (.usd/.usda/.usdc/.usdz), a NuRec-style USDZ scene artifact (a zip holding ``metadata.yaml``), or a
            mesh file: glTF 2.0 (.gltf/.glb), OBJ (+ MTL) or PLY (see :func:`wsim.scene.mesh_files.load_mesh_file`).
        mapping: Mesh files only: mapping file (path or dict) of semantic classes and materials by name; default
            ``<stem>.wsim.yaml`` beside the file.
        up_axis: Mesh files only: "Y" or "Z" (default: Y for glTF, Z for OBJ/PLY).
        meters_per_unit: Mesh files only: the file's unit [m] (default 1).

    Raises:
        SceneError: Missing or malformed file; the message names the file (and the prim or member).
    """
    mesh_options = {"mapping": mapping, "up_axis": up_axis, "meters_per_unit": meters_per_unit}
    if str(source) in ("builtin", "builtin:usd", "builtin:nurec"):
        _no_mesh_options(str(source), mesh_options)
        from .builtin import load_builtin_scene

        return load_builtin_scene("nurec" if str(source).endswith("nurec") else "usd")
    try:
        return _load_file(Path(source), mesh_options)
    except SceneError:
        raise
    except MemoryError:
        raise SceneError(f"{source}: too large to load (out of memory)") from None
    except RecursionError:
        raise SceneError(f"{source}: nested too deeply to load") from None
    except Exception as e:  # noqa: BLE001 - every loader failure is a SceneError naming the file
        raise SceneError(f"{source}: cannot be loaded ({type(e).__name__}: {e})") from e


def _no_mesh_options(source: str, options: dict[str, Any]) -> None:
    given = [k for k, v in options.items() if v is not None]
    if given:
        raise SceneError(f"{source}: {', '.join(given)} apply to glTF, OBJ and PLY files only")


def _load_file(path: Path, mesh_options: dict[str, Any]) -> Scene:
    if not path.exists():
        raise SceneError(f"{path}: no such scene file")
    if path.is_dir():
        raise SceneError(f"{path}: is a directory, not a scene file")
    suffix = path.suffix.lower()
    if suffix in MESH_SUFFIXES:
        return load_mesh_file(path, **mesh_options)
    _no_mesh_options(str(path), mesh_options)
    if suffix == ".usdz" and _is_nurec(path):
        from .nurec import load_nurec

        return load_nurec(path)
    if suffix in USD_SUFFIXES:
        from .usd import load_usd

        return load_usd(path)
    raise SceneError(f"{path}: unknown scene file type {path.suffix!r} "
                     f"(expected {'/'.join(sorted(SCENE_SUFFIXES))})")


def _is_nurec(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return "metadata.yaml" in z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
