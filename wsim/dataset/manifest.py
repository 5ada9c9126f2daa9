"""``manifest.json``: what a dataset folder holds — per shard its inputs hash, its files and sizes, counts and status.

Only the driver writes it (after each shard that finishes or fails), through a temporary file and a rename, so it is
always a complete JSON document. A shard counts as finished when its entry says ``done`` with the inputs hash the
current spec gives it and every file it lists is there with the size recorded; anything else is rendered again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .plan import FORMAT_VERSION, ShardTask
from .writers import atomic_write

MANIFEST = "manifest.json"
MANIFEST_FORMAT = f"wsim-dataset/{FORMAT_VERSION}"


class Manifest:
    def __init__(self, root: Path, data: dict[str, Any] | None = None) -> None:
        self.root = Path(root)
        self.data: dict[str, Any] = data or {"format": MANIFEST_FORMAT, "shards": {}}
        self.data.setdefault("shards", {})

    @property
    def path(self) -> Path:
        return self.root / MANIFEST

    @property
    def shards(self) -> dict[str, dict[str, Any]]:
        return self.data["shards"]

    @classmethod
    def load(cls, root: str | os.PathLike) -> Manifest:
        """The folder's manifest (an empty one if there is none).

        Raises:
            ValueError: The manifest is not wsim's (or not JSON).
        """
        root = Path(root)
        path = root / MANIFEST
        if not path.exists():
            return cls(root)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a readable dataset manifest ({e}); remove it to start over") from None
        if not isinstance(data, dict) or not str(data.get("format", "")).startswith("wsim-dataset/"):
            raise ValueError(f"{path}: not a wsim dataset manifest; choose another --out folder")
        return cls(root, data)

    def is_done(self, task: ShardTask) -> bool:
        e = self.shards.get(task.shard_id)
        if not e or e.get("status") != "done" or e.get("inputs_hash") != task.inputs_hash:
            return False
        outputs = e.get("outputs") or {}
        if set(outputs) != set(task.outputs):
            return False
        for rel, size in outputs.items():
            try:
                if (self.root / rel).stat().st_size != size:
                    return False
            except OSError:
                return False
        return True

    def record(self, task: ShardTask, status: str, *, attempts: int, result: dict[str, Any] | None = None,
               error: str | None = None, retried_after: list[str] | None = None) -> None:
        """One shard's entry: ``error`` the last attempt's (a failed shard), ``retried_after`` the errors of the
        attempts before the last, oldest first (kept so that a retried shard says why it was retried)."""
        e: dict[str, Any] = {
            "status": status, "inputs_hash": task.inputs_hash, "scene": task.scene_name, "variant": task.variant,
            "frames": [task.frames[0][0], task.frames[-1][0]], "attempts": attempts,
        }
        if result is not None:
            e.update(outputs=result["outputs"], points=result["points"], images=result["images"],
                     seconds=round(float(result["seconds"]), 3))
        if error:
            e["error"] = error
        if retried_after:
            e["retried_after"] = list(retried_after)
        self.shards[task.shard_id] = e

    def save(self) -> None:
        self.data["shards"] = dict(sorted(self.shards.items()))
        atomic_write(self.path, (json.dumps(self.data, indent=1) + "\n").encode())


__all__ = ["MANIFEST", "Manifest"]
