"""Expanding a spec into shards: scene × variant × chunk of consecutive frames.

The driver loads each scene once (host data only, no device geometry) to resolve what the spec leaves to the scene —
the scene's own rig, camera resolutions, the time range — and to check it: a camera id the scene lacks or a frame
outside its time range is a :class:`SpecError` before any work starts. Everything a worker needs is in the
:class:`ShardTask` (plain data, picklable), so serial, local-process and Ray runs execute the same function on the
same inputs.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .spec import DatasetSpec, JitterSpec, MountSpec, SpecError

#: Bumped when the layout or the payloads of a shard change: finished shards of an older format are rendered again.
FORMAT_VERSION = 1
#: Roof mount for a lidar preset the scene's rig does not have (as ``wsim render``) [m].
ROOF_MOUNT = ((1.0, 0.0, 1.9), (0.0, 0.0, 0.0, 1.0))


@dataclass(frozen=True)
class LidarTask:
    id: str
    preset: str
    translation: tuple[float, ...]
    rotation_xyzw: tuple[float, ...]
    config: tuple[tuple[str, Any], ...]  # LidarConfig overrides by field name (rig config, then the variant's)


@dataclass(frozen=True)
class CameraTask:
    id: str
    width: int
    height: int
    products: tuple[str, ...]
    readout_s: float
    translation: tuple[float, ...]  # camera-to-rig (OpenCV camera axes)
    rotation_xyzw: tuple[float, ...]


@dataclass(frozen=True)
class ShardTask:
    """One unit of work: consecutive frames of one scene and variant, rendered by one worker.

    Attributes:
        shard_id: ``<scene>/<variant>/<first>-<last>`` (frame indices, inclusive).
        frames: (global frame index, frame start time [s] on the scene clock) per frame.
        frame_span_s: Lidar interval of a frame [s] (1 / rate): every firing in [t, t + span).
        seq_dir: Output folder of the scene and variant, relative to the dataset root.
        outputs: Relative paths of every file the shard writes.
        inputs_hash: SHA-256 over everything that determines the shard's payloads.
    """

    shard_id: str
    scene_source: str
    scene_name: str
    scene_hash: str
    variant: str
    frames: tuple[tuple[int, float], ...]
    frame_span_s: float
    lidars: tuple[LidarTask, ...]
    cameras: tuple[CameraTask, ...]
    formats: tuple[str, ...]
    mcap_compression: str
    device: str | None
    seq_dir: str
    mcap_path: str
    outputs: tuple[str, ...] = ()
    inputs_hash: str = ""

    @property
    def num_frames(self) -> int:
        return len(self.frames)

    def frame_dir(self, k: int) -> str:
        return f"{self.seq_dir}/frames/{k:06d}"


@dataclass
class Plan:
    spec: DatasetSpec
    shards: list[ShardTask] = field(default_factory=list)
    scenes: dict[str, dict[str, Any]] = field(default_factory=dict)  # scene name → {source, frames, time range}

    @property
    def num_frames(self) -> int:
        return sum(s.num_frames for s in self.shards)


def _file_hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def scene_identity(source: str) -> str:
    """SHA-256 of the scene file's bytes (for the built-in scene: of its shipped file) — the scene's part of a shard's
    inputs hash. References and sublayers of a USD stage are not followed."""
    if source.startswith("builtin"):
        from ..scene import builtin

        name = builtin.NUREC_FILE if source.endswith("nurec") else builtin.USD_FILE
        return f"{source}:{_file_hash(str(builtin.DATA_DIR / name))}"
    return _file_hash(source)


def _safe_name(s: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("._") or "scene"
    return s


def _rig_lidars(scene) -> dict[str, dict]:
    rig = scene.metadata.get("sensor_rig", {}) if isinstance(scene.metadata, dict) else {}
    return dict((rig or {}).get("lidars") or {})


def _jitter(pose: tuple, sensor_id: str, j: JitterSpec | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Mount ``pose`` perturbed for one sensor: translation + N(0, σ_t²) per axis, rotation ∘ exp(N(0, σ_r²) per
    axis); the random draw depends only on the seed and the sensor id."""
    t, q = np.asarray(pose[0], float), np.asarray(pose[1], float)
    if j is None or (j.translation_m == 0 and j.rotation_deg == 0):
        return tuple(float(x) for x in t), tuple(float(x) for x in q)
    from ..scene.transforms import quat_multiply

    rng = np.random.default_rng([j.seed, zlib.crc32(sensor_id.encode())])
    dt = rng.normal(0.0, j.translation_m, 3)
    rv = np.deg2rad(rng.normal(0.0, j.rotation_deg, 3))
    angle = float(np.linalg.norm(rv))
    dq = np.array([0.0, 0.0, 0.0, 1.0]) if angle < 1e-15 else np.concatenate(
        [rv / angle * math.sin(angle / 2), [math.cos(angle / 2)]])
    q2 = quat_multiply(q, dq)
    q2 = q2 / np.linalg.norm(q2)
    return tuple(float(x) for x in t + dt), tuple(float(x) for x in q2)


def _mount_pose(m: MountSpec | None, default: tuple) -> tuple:
    return (m.translation, m.rotation_xyzw) if m is not None else default


def _check_lidar_config(where: str, preset: str, overrides: dict, path: str) -> None:
    from ..sensors.lidar_config import LidarConfigError
    from ..sensors.presets import preset as make_preset

    try:
        make_preset(preset, **overrides)
    except (LidarConfigError, ValueError, TypeError) as e:
        for key, value in overrides.items():  # name the setting when one alone is wrong
            try:
                make_preset(preset, **{key: value})
            except (LidarConfigError, ValueError, TypeError) as e1:
                raise SpecError(f"{where}{path}.{key}: {e1}") from None
        raise SpecError(f"{where}{path}: {e}") from None


def _resolve_lidars(spec: DatasetSpec, scene, where: str, scene_field: str) -> list[tuple[str, str, tuple, dict, str]]:
    """(id, preset, mount, rig config overrides, field path) per lidar."""
    rig = _rig_lidars(scene)
    out = []
    if spec.rig.lidars is None:
        for sid, m in rig.items():
            kind = str(m.get("type", "")).upper()
            if kind not in ("PANDAR128", "AT128"):
                raise SpecError(f"{where}rig: the scene rig's lidar {sid!r} ({scene_field}) has type {kind!r}, "
                                "not a preset (PANDAR128, AT128); list the lidars under rig.lidars")
            out.append((_safe_name(sid), kind, (tuple(m["translation"]),
                                                tuple(m.get("rotation_xyzw", (0.0, 0.0, 0.0, 1.0)))), {}, "rig"))
        return out
    for i, ls in enumerate(spec.rig.lidars):
        match = [(sid, m) for sid, m in rig.items() if str(m.get("type", "")).upper() == ls.preset]
        default_id = _safe_name(match[0][0]) if match else ls.preset.lower()
        default_mount = ((tuple(match[0][1]["translation"]),
                          tuple(match[0][1].get("rotation_xyzw", (0.0, 0.0, 0.0, 1.0)))) if match else ROOF_MOUNT)
        out.append((ls.id or default_id, ls.preset, _mount_pose(ls.mount, default_mount), dict(ls.config),
                    f"rig.lidars[{i}]"))
    return out


def native_camera_size(native: tuple[int, int], width: int | None, height: int | None) -> tuple[int, int]:
    """Render size [px]: both given as is; one given, the other keeps the native aspect ratio; none, native."""
    w0, h0 = (int(x) for x in native)
    if width and height:
        return int(width), int(height)
    if width:
        return int(width), max(1, round(width * h0 / w0))
    if height:
        return max(1, round(height * w0 / h0)), int(height)
    return w0, h0


def _resolve_cameras(spec: DatasetSpec, scene, where: str, scene_field: str) -> list[tuple[Any, ...]]:
    """(id, width, height, products, readout, camera_to_rig, field path) per camera."""
    specs = spec.rig.cameras
    if specs is None:
        from .spec import CameraSpec

        specs = tuple(CameraSpec(cid, width=spec.rig.camera_width) for cid in sorted(scene.cameras))
        paths = ["rig"] * len(specs)
    else:
        paths = [f"rig.cameras[{i}]" for i in range(len(specs))]
    out = []
    for cs, path in zip(specs, paths):
        if cs.id not in scene.cameras:
            known = ", ".join(sorted(scene.cameras)) or "none"
            raise SpecError(f"{where}{path}.id: {scene_field} has no camera {cs.id!r} (its cameras: {known})")
        cal = scene.cameras[cs.id]
        w, h = native_camera_size(cal.resolution, cs.width, cs.height)
        pose = _mount_pose(cs.mount, (tuple(float(x) for x in cal.camera_to_rig[0]),
                                      tuple(float(x) for x in cal.camera_to_rig[1])))
        out.append((cs.id, w, h, cs.products, cs.readout_s, pose, path))
    return out


def plan_dataset(spec: DatasetSpec, *, scenes: dict[str, Any] | None = None) -> Plan:
    """Expand ``spec`` into shards (scene-major, then variant, then frame chunk).

    Args:
        spec: A parsed spec.
        scenes: Already loaded scenes by source (the rest are loaded here).

    Raises:
        SpecError: A field the scenes contradict (unknown camera, frames outside the time range, bad lidar setting,
            duplicate names or sensor ids).
    """
    from .. import __version__
    from ..scene.loader import load_scene

    where = f"{spec.path}: " if spec.path else ""
    plan = Plan(spec)
    names: dict[str, int] = {}
    hashes: dict[str, str] = {}
    for si, sc in enumerate(spec.scenes):
        scene_field = f"scenes[{si}]"
        try:
            scene = (scenes or {}).get(sc.source) or load_scene(sc.source)
        except (ValueError, OSError) as e:
            raise SpecError(f"{where}{scene_field}.source: {e}") from None
        name = sc.name or _safe_name(scene.scene_id or Path(sc.source).stem)
        if name in names:
            raise SpecError(f"{where}{scene_field}.name: scenes[{names[name]}] is also named {name!r}; give the "
                            "scenes distinct names")
        names[name] = si
        if sc.source not in hashes:
            hashes[sc.source] = scene_identity(sc.source)
        lidars = _resolve_lidars(spec, scene, where, scene_field)
        cameras = _resolve_cameras(spec, scene, where, scene_field)
        if not lidars and not cameras:
            raise SpecError(f"{where}rig: no sensor to render in {scene_field} (the scene's rig is empty)")
        ids: dict[str, str] = {}
        for sid, path in [(x[0], x[-1]) for x in lidars] + [(x[0], x[-1]) for x in cameras]:
            if sid in ids:
                raise SpecError(f"{where}{path}: sensor id {sid!r} is used twice (also by {ids[sid]}); give "
                                "distinct ids")
            ids[sid] = path
        for sid, preset, _mount, cfg, path in lidars:
            _check_lidar_config(where, preset, {"partial_outputs": True, **cfg}, f"{path}.config")
        frames = _frames(spec, scene, lidars, cameras, where)
        plan.scenes[name] = {"source": sc.source, "frames": len(frames), "time_range": list(scene.time_range)}
        chunk = spec.frames.chunk
        for vi, var in enumerate(spec.variants):
            lt = []
            for sid, preset, mount, cfg, path in lidars:
                merged = {"partial_outputs": True, **cfg, **dict(var.lidar_config)}
                if var.lidar_config:
                    _check_lidar_config(where, preset, merged, f"variants[{vi}].lidar_config")
                t, q = _jitter(mount, sid, var.mount_jitter)
                lt.append(LidarTask(sid, preset, t, q, tuple(sorted(merged.items()))))
            ct = []
            for cid, w, h, prods, ro, pose, _path in cameras:
                t, q = _jitter(pose, cid, var.mount_jitter)
                ct.append(CameraTask(cid, w, h, prods, ro, t, q))
            seq_dir = f"{name}/{var.name}"
            for c0 in range(0, len(frames), chunk):
                fr = tuple(frames[c0:c0 + chunk])
                label = f"{fr[0][0]:06d}-{fr[-1][0]:06d}"
                task = ShardTask(
                    shard_id=f"{seq_dir}/{label}", scene_source=sc.source, scene_name=name,
                    scene_hash=hashes[sc.source], variant=var.name, frames=fr, frame_span_s=1.0 / spec.frames.rate_hz,
                    lidars=tuple(lt), cameras=tuple(ct), formats=spec.outputs.formats,
                    mcap_compression=spec.outputs.mcap_compression, device=spec.device, seq_dir=seq_dir,
                    mcap_path=f"{seq_dir}/mcap/{label}.mcap")
                plan.shards.append(_finish(task, __version__))
    return plan


def _frames(spec: DatasetSpec, scene, lidars: list, cameras: list, where: str) -> list[tuple[int, float]]:
    fs = spec.frames
    lo, hi = (float(x) for x in scene.time_range)
    bounded = hi > lo
    span = max([1.0 / fs.rate_hz if lidars else 0.0] + [c[4] for c in cameras])
    start = fs.start_s if fs.start_s is not None else (lo if bounded else 0.0)
    if fs.count is not None:
        n = fs.count
        what = "frames.count"
    else:
        end = fs.end_s if fs.end_s is not None else (hi if bounded else None)
        if end is None:
            raise SpecError(f"{where}frames: the scene has no time range; give frames.end_s or frames.count")
        # frames whose span [t, t + span] ends by `end`
        n = int(math.floor((end - start - span) * fs.rate_hz + 1e-6)) + 1 if end - start >= span - 1e-9 else 0
        what = "frames.end_s" if fs.end_s is not None else "frames.start_s"
    if n < 1:
        raise SpecError(f"{where}{what}: no frame fits between {start:g} s and the end of the frames "
                        f"(a frame lasts {span:g} s)")
    frames = [(k, start + k / fs.rate_hz) for k in range(n)]
    if bounded:
        if start < lo - 1e-9:
            raise SpecError(f"{where}frames.start_s: {start:g} s is before the scene's time range "
                            f"[{lo:g}, {hi:g}] s")
        last = frames[-1][1] + span
        if last > hi + 1e-9:
            raise SpecError(f"{where}{what}: the last frame ends at {last:g} s, after the scene's time range "
                            f"[{lo:g}, {hi:g}] s")
    return frames


def _expected_outputs(task: ShardTask) -> tuple[str, ...]:
    out = []
    if "folder" in task.formats:
        out.append(f"{task.seq_dir}/rig.json")
        for k, _t in task.frames:
            d = task.frame_dir(k)
            out += [f"{d}/{lt.id}.ply" for lt in task.lidars]
            for ct in task.cameras:
                if "color" in ct.products:
                    out.append(f"{d}/{ct.id}.png")
                if "distance" in ct.products:
                    out.append(f"{d}/{ct.id}.distance.npy")
            out.append(f"{d}/frame.json")
    if "mcap" in task.formats:
        out.append(task.mcap_path)
    return tuple(out)


def _finish(task: ShardTask, version: str) -> ShardTask:
    from dataclasses import replace

    task = replace(task, outputs=_expected_outputs(task))
    d = asdict(task)
    d.pop("inputs_hash")
    d.pop("scene_source")  # the scene's bytes count (scene_hash), not where the file lies
    d["format_version"] = FORMAT_VERSION
    d["wsim_version"] = version
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str).encode()
    return replace(task, inputs_hash=hashlib.sha256(blob).hexdigest())


__all__ = ["CameraTask", "FORMAT_VERSION", "LidarTask", "Plan", "ShardTask", "plan_dataset", "scene_identity"]
