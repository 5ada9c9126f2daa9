"""The dataset spec: a YAML file naming scenes, a sensor rig, frame times, variants and outputs.

Parsing checks every field's type and range without loading a scene; :mod:`wsim.dataset.plan` then checks what needs
the scene (camera ids, the scene's own rig, the time range). Every problem is one :class:`SpecError` naming the field
by its path in the spec (``frames.rate_hz``, ``rig.lidars[1].config.seed``).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

#: Lidar presets a rig may name.
PRESETS = ("PANDAR128", "AT128")
#: Camera products the dataset writes: COLOR as PNG, DISTANCE [m] as float32 .npy (MCAP: foxglove.RawImage 32FC1).
CAMERA_PRODUCTS = ("color", "distance")
FORMATS = ("mcap", "folder")
MCAP_COMPRESSION = ("zstd", "lz4", "none")
BUILTIN_SOURCES = ("builtin", "builtin:usd", "builtin:nurec")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class SpecError(ValueError):
    """A dataset spec that cannot be run; the message names the spec file and the field."""


@dataclass(frozen=True)
class MountSpec:
    """Sensor-to-rig pose: translation [m], quaternion (x, y, z, w). ``None`` fields: the scene rig's mount."""

    translation: tuple[float, float, float]
    rotation_xyzw: tuple[float, float, float, float]


@dataclass(frozen=True)
class LidarSpec:
    """One lidar of the rig.

    Attributes:
        id: Sensor id (topic and file name); default the scene rig's id for the preset, else the preset in lower case.
        preset: "PANDAR128" or "AT128".
        mount: Sensor-to-rig pose, or None for the scene rig's mount of that preset (the roof if it has none).
        config: :class:`wsim.LidarConfig` overrides by field name (``seed``, ``range_accuracy_m``, ...).
    """

    id: str | None
    preset: str
    mount: MountSpec | None = None
    config: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class CameraSpec:
    """One camera of the rig: a logical id of the scene's cameras, rendered at width x height [px] (None: native;
    one of them: the other keeps the aspect ratio), exposed over ``readout_s`` from the frame time."""

    id: str
    width: int | None = None
    height: int | None = None
    products: tuple[str, ...] = CAMERA_PRODUCTS
    readout_s: float = 0.03
    mount: MountSpec | None = None


@dataclass(frozen=True)
class RigSpec:
    """``lidars`` / ``cameras`` None mean the scene's own (``metadata["sensor_rig"]["lidars"]``, ``Scene.cameras``)."""

    lidars: tuple[LidarSpec, ...] | None = None
    cameras: tuple[CameraSpec, ...] | None = None
    camera_width: int | None = None  # for the scene's own cameras: render width (height keeps the aspect)


@dataclass(frozen=True)
class SceneSpec:
    source: str  # "builtin", "builtin:nurec" or an absolute path
    name: str | None = None


@dataclass(frozen=True)
class FramesSpec:
    """Frame k starts at ``start_s + k / rate_hz``; frames whose span lies in [start_s, end_s] (None: the scene's
    time range). Shards hold ``chunk`` consecutive frames."""

    rate_hz: float
    start_s: float | None = None
    end_s: float | None = None
    count: int | None = None
    chunk: int = 50


@dataclass(frozen=True)
class JitterSpec:
    """Mount perturbation of every sensor: normal translation [m] and rotation [deg] (σ per axis), from ``seed``."""

    translation_m: float = 0.0
    rotation_deg: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class VariantSpec:
    name: str
    lidar_config: tuple[tuple[str, Any], ...] = ()
    mount_jitter: JitterSpec | None = None


@dataclass(frozen=True)
class OutputSpec:
    formats: tuple[str, ...] = FORMATS
    mcap_compression: str = "zstd"


@dataclass(frozen=True)
class DatasetSpec:
    """A parsed spec (see README "Datasets")."""

    scenes: tuple[SceneSpec, ...]
    rig: RigSpec
    frames: FramesSpec
    variants: tuple[VariantSpec, ...] = (VariantSpec("default"),)
    outputs: OutputSpec = OutputSpec()
    name: str = "dataset"
    device: str | None = None
    path: str = ""  # the spec file ("" for a spec given as a mapping)


# ---------------------------------------------------------------------------------------------------------------------
# parsing helpers: each takes the field path for its error message


class _P:
    def __init__(self, where: str) -> None:
        self.where = where

    def err(self, path: str, msg: str) -> SpecError:
        return SpecError(f"{self.where}{path}: {msg}")

    def mapping(self, v: Any, path: str, keys: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
        if not isinstance(v, dict):
            raise self.err(path, f"must be a mapping, got {_show(v)}")
        for k in v:
            if not isinstance(k, str) or k not in keys:
                raise self.err(f"{path}.{k}" if path else str(k),
                               f"unknown field (known: {', '.join(keys)})")
        for k in required:
            if k not in v:
                raise self.err(f"{path}.{k}" if path else k, "missing (required)")
        return v

    def seq(self, v: Any, path: str, *, nonempty: bool = True) -> list:
        if not isinstance(v, list):
            raise self.err(path, f"must be a list, got {_show(v)}")
        if nonempty and not v:
            raise self.err(path, "must not be empty")
        return v

    def number(self, v: Any, path: str, *, positive: bool = False, nonneg: bool = False) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise self.err(path, f"must be a finite number, got {_show(v)}")
        v = float(v)
        if positive and v <= 0:
            raise self.err(path, f"must be > 0, got {_num(v)}")
        if nonneg and v < 0:
            raise self.err(path, f"must be >= 0, got {_num(v)}")
        return v

    def integer(self, v: Any, path: str, *, lo: int | None = None, hi: int | None = None) -> int:
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
            raise self.err(path, f"must be an integer, got {_show(v)}")
        v = int(v)
        if lo is not None and v < lo:
            raise self.err(path, f"must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise self.err(path, f"must be <= {hi}, got {v}")
        return v

    def name(self, v: Any, path: str) -> str:
        if not isinstance(v, str) or not _NAME.match(v):
            raise self.err(path, f"must be a name of letters, digits, '_', '-' and '.', got {_show(v)}")
        return v

    def vector(self, v: Any, path: str, n: int) -> tuple[float, ...]:
        if not isinstance(v, list) or len(v) != n:
            raise self.err(path, f"must be a list of {n} numbers, got {_show(v)}")
        return tuple(self.number(x, f"{path}[{i}]") for i, x in enumerate(v))


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _num(v: float) -> str:
    return f"{v:g}"


def parse_mount(p: _P, v: Any, path: str) -> MountSpec | None:
    if v is None or v == "scene":
        return None
    m = p.mapping(v, path, ("translation", "rotation_xyzw", "rotation_rpy_deg"), ("translation",))
    if "rotation_xyzw" in m and "rotation_rpy_deg" in m:
        raise p.err(f"{path}.rotation_rpy_deg", "give rotation_xyzw or rotation_rpy_deg, not both")
    t = p.vector(m["translation"], f"{path}.translation", 3)
    if "rotation_rpy_deg" in m:
        r, pi, y = (math.radians(a) for a in p.vector(m["rotation_rpy_deg"], f"{path}.rotation_rpy_deg", 3))
        cr, sr, cp, sp, cy, sy = (math.cos(r / 2), math.sin(r / 2), math.cos(pi / 2), math.sin(pi / 2),
                                  math.cos(y / 2), math.sin(y / 2))
        q = (sr * cp * cy - cr * sp * sy, cr * sp * cy + sr * cp * sy, cr * cp * sy - sr * sp * cy,
             cr * cp * cy + sr * sp * sy)
    else:
        q = p.vector(m.get("rotation_xyzw", [0, 0, 0, 1]), f"{path}.rotation_xyzw", 4)
        n = math.sqrt(sum(x * x for x in q))
        if n < 1e-9:
            raise p.err(f"{path}.rotation_xyzw", "zero quaternion")
        q = tuple(x / n for x in q)
    return MountSpec(t, q)


def lidar_config_fields() -> dict[str, str]:
    """Accepted lidar config keys → :class:`wsim.LidarConfig` field name: field names (``range_accuracy_m``), USD
    attribute names (``rangeAccuracyM``, ``omni:sensor:Core:rangeAccuracyM``) and ``wsim:seed`` / ``seed``."""
    from ..sensors.lidar_config import PREFIX, LidarConfig

    out: dict[str, str] = {}
    for f in fields(LidarConfig):
        if f.name in ("emitter_states", "name", "custom_frame_of_reference_trafo"):
            continue
        out[f.name] = f.name
        if f.metadata.get("usd"):
            out[f.metadata["usd"]] = f.name
            out[PREFIX + f.metadata["usd"]] = f.name
        if f.metadata.get("usd_full"):
            out[f.metadata["usd_full"]] = f.name
    return out


def parse_lidar_config(p: _P, v: Any, path: str) -> tuple[tuple[str, Any], ...]:
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise p.err(path, f"must be a mapping of lidar settings, got {_show(v)}")
    known = lidar_config_fields()
    out: dict[str, Any] = {}
    for k, x in v.items():
        if k not in known:
            raise p.err(f"{path}.{k}", "unknown lidar setting (use wsim.LidarConfig field names such as seed, "
                        "range_accuracy_m, valid_end_azimuth_deg, or their USD attribute names)")
        if not isinstance(x, (bool, int, float, str)):
            raise p.err(f"{path}.{k}", f"must be a number, boolean or token, got {_show(x)}")
        out[known[k]] = x
    return tuple(sorted(out.items()))


def parse_lidar(p: _P, v: Any, path: str) -> LidarSpec:
    if isinstance(v, str):
        v = {"preset": v}
    m = p.mapping(v, path, ("id", "preset", "mount", "config"), ("preset",))
    preset = m["preset"]
    if not isinstance(preset, str) or preset.upper() not in PRESETS:
        raise p.err(f"{path}.preset", f"unknown lidar preset {_show(preset)} (known: {', '.join(PRESETS)})")
    sid = p.name(m["id"], f"{path}.id") if m.get("id") is not None else None
    return LidarSpec(sid, preset.upper(), parse_mount(p, m.get("mount"), f"{path}.mount"),
                     parse_lidar_config(p, m.get("config"), f"{path}.config"))


def parse_products(p: _P, v: Any, path: str) -> tuple[str, ...]:
    items = p.seq(v, path)
    out = []
    for i, x in enumerate(items):
        if not isinstance(x, str) or x.lower() not in CAMERA_PRODUCTS:
            raise p.err(f"{path}[{i}]", f"unknown camera product {_show(x)} (known: {', '.join(CAMERA_PRODUCTS)})")
        if x.lower() not in out:
            out.append(x.lower())
    return tuple(out)


def parse_camera(p: _P, v: Any, path: str) -> CameraSpec:
    if isinstance(v, str):
        v = {"id": v}
    m = p.mapping(v, path, ("id", "width", "height", "products", "readout_s", "mount"), ("id",))
    if not isinstance(m["id"], str) or not m["id"]:
        raise p.err(f"{path}.id", f"must be a camera logical id of the scene, got {_show(m['id'])}")
    w = p.integer(m["width"], f"{path}.width", lo=1, hi=16384) if m.get("width") is not None else None
    h = p.integer(m["height"], f"{path}.height", lo=1, hi=16384) if m.get("height") is not None else None
    prods = parse_products(p, m["products"], f"{path}.products") if "products" in m else CAMERA_PRODUCTS
    ro = p.number(m.get("readout_s", 0.03), f"{path}.readout_s", nonneg=True)
    return CameraSpec(m["id"], w, h, prods, ro, parse_mount(p, m.get("mount"), f"{path}.mount"))


def parse_rig(p: _P, v: Any) -> RigSpec:
    if v == "scene":
        return RigSpec()
    m = p.mapping(v, "rig", ("lidars", "cameras", "camera_width"))
    if not m.get("lidars") and not m.get("cameras") and m.get("lidars") != "scene" and m.get("cameras") != "scene":
        raise p.err("rig", "names no sensor: give lidars and/or cameras (or rig: scene for the scene's own rig)")
    lidars = cameras = ()
    if m.get("lidars") == "scene":
        lidars = None
    elif "lidars" in m and m["lidars"] is not None:
        lidars = tuple(parse_lidar(p, x, f"rig.lidars[{i}]") for i, x in enumerate(p.seq(m["lidars"], "rig.lidars",
                                                                                           nonempty=False)))
    if m.get("cameras") == "scene":
        cameras = None
    elif "cameras" in m and m["cameras"] is not None:
        cameras = tuple(parse_camera(p, x, f"rig.cameras[{i}]")
                        for i, x in enumerate(p.seq(m["cameras"], "rig.cameras", nonempty=False)))
    cw = p.integer(m["camera_width"], "rig.camera_width", lo=1, hi=16384) if m.get("camera_width") is not None \
        else None
    return RigSpec(lidars, cameras, cw)


def parse_frames(p: _P, v: Any) -> FramesSpec:
    m = p.mapping(v, "frames", ("rate_hz", "start_s", "end_s", "count", "chunk"), ("rate_hz",))
    rate = p.number(m["rate_hz"], "frames.rate_hz", positive=True)
    start = p.number(m["start_s"], "frames.start_s") if m.get("start_s") is not None else None
    end = p.number(m["end_s"], "frames.end_s") if m.get("end_s") is not None else None
    count = p.integer(m["count"], "frames.count", lo=1) if m.get("count") is not None else None
    if count is not None and end is not None:
        raise p.err("frames.count", "give end_s or count, not both")
    if start is not None and end is not None and end <= start:
        raise p.err("frames.end_s", f"must be after frames.start_s ({_num(start)} s), got {_num(end)} s")
    chunk = p.integer(m.get("chunk", 50), "frames.chunk", lo=1)
    return FramesSpec(rate, start, end, count, chunk)


def parse_variants(p: _P, v: Any) -> tuple[VariantSpec, ...]:
    if v is None:
        return (VariantSpec("default"),)
    out = []
    for i, x in enumerate(p.seq(v, "variants")):
        path = f"variants[{i}]"
        m = p.mapping(x, path, ("name", "lidar_config", "mount_jitter"), ("name",))
        name = p.name(m["name"], f"{path}.name")
        if any(o.name == name for o in out):
            raise p.err(f"{path}.name", f"duplicate variant name {name!r}")
        jitter = None
        if m.get("mount_jitter") is not None:
            j = p.mapping(m["mount_jitter"], f"{path}.mount_jitter", ("translation_m", "rotation_deg", "seed"))
            jp = f"{path}.mount_jitter"
            jitter = JitterSpec(p.number(j.get("translation_m", 0.0), f"{jp}.translation_m", nonneg=True),
                                p.number(j.get("rotation_deg", 0.0), f"{jp}.rotation_deg", nonneg=True),
                                p.integer(j.get("seed", 0), f"{jp}.seed", lo=0))
        out.append(VariantSpec(name, parse_lidar_config(p, m.get("lidar_config"), f"{path}.lidar_config"), jitter))
    return tuple(out)


def parse_outputs(p: _P, v: Any) -> OutputSpec:
    if v is None:
        return OutputSpec()
    m = p.mapping(v, "outputs", ("formats", "mcap_compression"))
    formats = FORMATS
    if "formats" in m:
        items = p.seq(m["formats"], "outputs.formats")
        for i, x in enumerate(items):
            if x not in FORMATS:
                raise p.err(f"outputs.formats[{i}]", f"unknown format {_show(x)} (known: {', '.join(FORMATS)})")
        formats = tuple(f for f in FORMATS if f in items)
    comp = m.get("mcap_compression", "zstd")
    if comp not in MCAP_COMPRESSION:
        raise p.err("outputs.mcap_compression", f"unknown compression {_show(comp)} (known: "
                    f"{', '.join(MCAP_COMPRESSION)})")
    return OutputSpec(formats, comp)


def parse_scenes(p: _P, v: Any, base: Path) -> tuple[SceneSpec, ...]:
    out = []
    for i, x in enumerate(p.seq(v, "scenes")):
        path = f"scenes[{i}]"
        if isinstance(x, str):
            x = {"source": x}
        m = p.mapping(x, path, ("source", "name"), ("source",))
        src = m["source"]
        if not isinstance(src, str) or not src:
            raise p.err(f"{path}.source", f"must be 'builtin', 'builtin:nurec' or a scene file path, got {_show(src)}")
        if src not in BUILTIN_SOURCES:
            f = Path(os.path.expanduser(src))
            f = f if f.is_absolute() else base / f
            if not f.is_file():
                raise p.err(f"{path}.source", f"no such scene file {str(f)!r}")
            src = str(f.resolve())
        name = p.name(m["name"], f"{path}.name") if m.get("name") is not None else None
        out.append(SceneSpec(src, name))
    return tuple(out)


TOP_LEVEL = ("name", "scenes", "rig", "frames", "variants", "outputs", "device")


def parse_spec(doc: Any, *, path: str | os.PathLike = "", base: str | os.PathLike | None = None) -> DatasetSpec:
    """Parse a spec mapping (the loaded YAML). Relative scene paths are relative to ``base`` (default: the spec
    file's folder, else the working directory).

    Raises:
        SpecError: The first problem found, naming the field.
    """
    where = f"{path}: " if path else ""
    p = _P(where)
    if doc is None:
        raise SpecError(f"{where}empty spec (needs scenes, rig and frames)")
    m = p.mapping(doc, "", TOP_LEVEL, ("scenes", "rig", "frames"))
    base = Path(base) if base is not None else (Path(path).resolve().parent if path else Path.cwd())
    name = p.name(m["name"], "name") if m.get("name") is not None else "dataset"
    device = m.get("device")
    if device is not None and (not isinstance(device, str) or not device):
        raise p.err("device", f"must be a Warp device name such as cpu or cuda:0, got {_show(device)}")
    return DatasetSpec(scenes=parse_scenes(p, m["scenes"], base), rig=parse_rig(p, m["rig"]),
                       frames=parse_frames(p, m["frames"]), variants=parse_variants(p, m.get("variants")),
                       outputs=parse_outputs(p, m.get("outputs")), name=name, device=device,
                       path=str(path))


def load_spec(path: str | os.PathLike) -> DatasetSpec:
    """Read and parse a YAML spec file.

    Raises:
        SpecError: Unreadable file, malformed YAML or a bad field.
    """
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SpecError(f"{path}: cannot read the spec ({e.strerror or e})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise SpecError(f"{path}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    return parse_spec(doc, path=path)


def spec_to_dict(spec: DatasetSpec) -> dict[str, Any]:
    """A JSON-able form of the parsed spec (recorded in the manifest)."""
    import dataclasses

    def conv(x: Any) -> Any:
        if dataclasses.is_dataclass(x):
            return {f.name: conv(getattr(x, f.name)) for f in dataclasses.fields(x)}
        if isinstance(x, tuple):
            return [conv(y) for y in x]
        return x

    d = conv(spec)
    d.pop("path", None)
    return d


__all__ = ["CameraSpec", "DatasetSpec", "FramesSpec", "JitterSpec", "LidarSpec", "MountSpec", "OutputSpec",
           "RigSpec", "SceneSpec", "SpecError", "VariantSpec", "load_spec", "parse_spec", "spec_to_dict"]
