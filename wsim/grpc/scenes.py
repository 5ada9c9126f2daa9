"""The scenes a server can serve: discovery from files, and an LRU cache of loaded scenes (one shared geometry each).

NuRec USDZ artifacts report the ``scene_id`` of their ``metadata.yaml`` (read without loading the scene); USD stages
and glTF/GLB, OBJ, PLY mesh files are loaded once at start-up to learn theirs. When two files carry the same scene id
the NuRec artifact wins (it is what AlpaSim is pointed at), then the first file in sorted order.
"""

from __future__ import annotations

import glob
import logging
import threading
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from ..scene.loader import SCENE_SUFFIXES, load_scene
from ..scene.scene import Scene, SceneError

BUILTIN = "builtin:nurec"
log = logging.getLogger("wsim.grpc")


@dataclass(frozen=True)
class SceneEntry:
    """A scene the server can load: its id, its source (file path or ``builtin:…``) and whether it is NuRec."""

    scene_id: str
    source: str
    nurec: bool


def _nurec_scene_id(path: Path) -> str | None:
    import yaml

    try:
        with zipfile.ZipFile(path) as z:
            if "metadata.yaml" not in z.namelist():
                return None
            meta = yaml.safe_load(z.read("metadata.yaml")) or {}
    except (zipfile.BadZipFile, OSError, yaml.YAMLError):
        return None
    sid = meta.get("scene_id") if isinstance(meta, dict) else None
    return str(sid) if sid else None


def discover(spec: str | None) -> list[SceneEntry]:
    """Scenes named by ``spec``: a directory (searched recursively for USD stages and NuRec USDZ artifacts), a glob
    pattern, a single file, or None / ``"builtin"`` for the built-in street block (NuRec form).

    Files that cannot be read are skipped with one warning each (a broken NuRec artifact is found when its scene is
    first loaded: the request then answers FAILED_PRECONDITION).

    Raises:
        SceneError: Nothing found, or no readable scene among the files.
    """
    if spec in (None, "", "builtin", "builtin:nurec", "builtin:usd"):
        src = BUILTIN if spec in (None, "", "builtin", "builtin:nurec") else "builtin:usd"
        scene = load_scene(src)
        return [SceneEntry(scene.scene_id, src, src == BUILTIN)]
    p = Path(spec)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in SCENE_SUFFIXES)
    elif p.is_file():
        files = [p]
    else:
        files = sorted(Path(f) for f in glob.glob(spec, recursive=True)
                       if Path(f).is_file() and Path(f).suffix.lower() in SCENE_SUFFIXES)
    if not files:
        raise SceneError(f"{spec}: no scene files (USD stages, NuRec USDZ artifacts, glTF/GLB, OBJ, PLY) found")
    entries: dict[str, SceneEntry] = {}
    skipped = []
    for f in files:
        sid = _nurec_scene_id(f) if f.suffix.lower() == ".usdz" else None
        if sid is not None:
            entry = SceneEntry(sid, str(f), True)
        else:
            try:
                entry = SceneEntry(load_scene(f).scene_id, str(f), False)
            except Exception as e:  # noqa: BLE001 - one unreadable file must not stop the others being served
                log.warning("skipping %s: %s", f, e)
                skipped.append(f)
                continue
        old = entries.get(entry.scene_id)
        if old is None or (entry.nurec and not old.nurec):
            entries[entry.scene_id] = entry
    if not entries:
        raise SceneError(f"{spec}: no readable scene ({len(skipped)} file(s) skipped, see the warnings)")
    return sorted(entries.values(), key=lambda e: e.scene_id)


class SceneStore:
    """Loaded scenes, at most ``cache_size`` resident (least recently used evicted), each loaded once.

    Args:
        entries: The scenes that may be served (:func:`discover`).
        cache_size: Scenes kept resident (≥ 1).
        device: Warp device on which geometry is built.
    """

    def __init__(self, entries: list[SceneEntry], cache_size: int = 4, device: str = "cpu") -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size: must be >= 1, got {cache_size}")
        self.entries = {e.scene_id: e for e in entries}
        self.cache_size = int(cache_size)
        self.device = device
        self._loaded: OrderedDict[str, Scene] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}

    @property
    def scene_ids(self) -> list[str]:
        return sorted(self.entries)

    def loaded(self) -> list[str]:
        """Ids of the resident scenes, sorted."""
        with self._lock:
            return sorted(self._loaded)

    def get(self, scene_id: str) -> Scene:
        """The loaded scene (geometry built on the store's device); loads it on first use.

        Raises:
            KeyError: Unknown scene id.
        """
        if scene_id not in self.entries:
            raise KeyError(scene_id)
        with self._lock:
            scene = self._loaded.get(scene_id)
            if scene is not None:
                self._loaded.move_to_end(scene_id)
                return scene
            gate = self._loading.setdefault(scene_id, threading.Lock())
        with gate:  # one loader per scene; others wait for it
            with self._lock:
                scene = self._loaded.get(scene_id)
                if scene is not None:
                    self._loaded.move_to_end(scene_id)
                    return scene
            scene = load_scene(self.entries[scene_id].source)
            scene.device_geometry(self.device)
            with self._lock:
                self._loaded[scene_id] = scene
                self._loaded.move_to_end(scene_id)
                while len(self._loaded) > self.cache_size:
                    self._loaded.popitem(last=False)
        return scene

    def replace(self, scene_id: str, scene: Scene | None) -> None:
        """Install an edited scene for ``scene_id`` (None: drop the resident copy so the file is reloaded)."""
        with self._lock:
            if scene is None:
                self._loaded.pop(scene_id, None)
            else:
                self._loaded[scene_id] = scene
                self._loaded.move_to_end(scene_id)
