"""Lidar configuration: the ``omni:sensor:Core:*`` attributes of a lidar prim, validated, with their defaults.

Attribute names, types and defaults follow the RTX "Lidar generic core model"; see ``LidarConfig`` for the list.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

import numpy as np

PREFIX = "omni:sensor:Core:"
STATE_PREFIX = PREFIX + "emitterState:"
MIN_SCAN_RATE_HZ = 0.466  # TimeOffsetNs is int32 ns: a scan must last < 2^31 ns


class LidarConfigError(ValueError):
    """A lidar attribute is missing, malformed or out of range; the message names the attribute."""


class ScanType(Enum):
    ROTARY = "ROTARY"
    SOLID_STATE = "SOLID_STATE"


class RayType(Enum):
    IDEALIZED = "IDEALIZED"
    GAUSSIAN_BEAM = "GAUSSIAN_BEAM"
    UNIFORM_BEAM = "UNIFORM_BEAM"


class IntensityProcessing(Enum):
    RAW = "RAW"
    NORMALIZATION = "NORMALIZATION"
    CORRECTION = "CORRECTION"


class IntensityMapping(Enum):
    LINEAR = "LINEAR"
    NONLINEAR = "NONLINEAR"


class CoordsType(Enum):
    CARTESIAN = "CARTESIAN"
    SPHERICAL = "SPHERICAL"


class FrameOfReference(Enum):
    SENSOR = "SENSOR"
    WORLD = "WORLD"
    CUSTOM = "CUSTOM"


class MotionCompensation(Enum):
    COMPENSATED = "COMPENSATED"
    NONCOMPENSATED = "NONCOMPENSATED"


@dataclass
class EmitterState:
    """One emitter state (``emitterState:sNNN``): per-emitter arrays, each ``numberOfEmitters`` long.

    Attributes:
        azimuth_deg, elevation_deg: Angle offsets [deg].
        fire_time_ns: Firing delay within a tick [ns].
        channel_id: Detector label per emitter (not an index).
        hor_offset_m, vert_offset_m: Emitter position offsets [m] (horizontal rotates with a rotary head).
        distance_correction_m: Range bias added to every return [m].
    """

    azimuth_deg: np.ndarray
    elevation_deg: np.ndarray
    fire_time_ns: np.ndarray
    channel_id: np.ndarray
    hor_offset_m: np.ndarray
    vert_offset_m: np.ndarray
    distance_correction_m: np.ndarray


_STATE_FIELDS = {
    "azimuthDeg": ("azimuth_deg", np.float32),
    "elevationDeg": ("elevation_deg", np.float32),
    "fireTimeNs": ("fire_time_ns", np.int64),
    "channelId": ("channel_id", np.uint32),
    "horOffsetM": ("hor_offset_m", np.float32),
    "vertOffsetM": ("vert_offset_m", np.float32),
    "distanceCorrectionM": ("distance_correction_m", np.float32),
}


def _attr(name: str, default: Any, kind: type | None = None):
    """A config field bound to the USD attribute ``omni:sensor:Core:<name>``."""
    return field(default=default, metadata={"usd": name, "kind": kind})


@dataclass
class LidarConfig:
    """A lidar's configuration. Field ↔ attribute: ``scan_type`` ↔ ``omni:sensor:Core:scanType`` etc.

    Units are in the field names (Hz, deg, m, ns). See the module docstring and README for semantics.
    """

    scan_type: ScanType = _attr("scanType", ScanType.ROTARY, ScanType)
    scan_rate_base_hz: float = _attr("scanRateBaseHz", 10.0, float)
    pattern_firing_rate_hz: float = _attr("patternFiringRateHz", 0.0, float)
    rotation_direction: str = _attr("rotationDirection", "CW", str)
    number_of_emitters: int = _attr("numberOfEmitters", 0, int)
    number_of_channels: int = _attr("numberOfChannels", 0, int)
    state_resolution_step: int = _attr("stateResolutionStep", 1, int)
    near_range_m: float = _attr("nearRangeM", 0.3, float)
    far_range_m: float = _attr("farRangeM", 300.0, float)
    range_resolution_m: float = _attr("rangeResolutionM", 0.0, float)
    start_azimuth_offset_deg: float = _attr("startAzimuthOffsetDeg", 0.0, float)
    valid_start_azimuth_deg: float = _attr("validStartAzimuthDeg", 0.0, float)
    valid_end_azimuth_deg: float = _attr("validEndAzimuthDeg", 360.0, float)
    max_returns: int = _attr("maxReturns", 1, int)
    min_dist_between_echos_m: float = _attr("minDistBetweenEchosM", 0.4, float)
    ray_type: RayType = _attr("rayType", RayType.IDEALIZED, RayType)
    divergence_hor_deg: float = _attr("divergenceHorDeg", 0.1, float)
    divergence_ver_deg: float = _attr("divergenceVerDeg", 0.1, float)
    beam_samples: int = field(default=19, metadata={"usd_full": "wsim:beamSamples", "kind": int})
    intensity_processing: IntensityProcessing = _attr("intensityProcessing", IntensityProcessing.NORMALIZATION,
                                                      IntensityProcessing)
    intensity_mapping_type: IntensityMapping = _attr("intensityMappingType", IntensityMapping.LINEAR, IntensityMapping)
    intensity_scale_percent: float = _attr("intensityScalePercent", 100.0, float)
    min_reflectance: float = _attr("minReflectance", 0.1, float)
    min_reflection_range_m: float = _attr("minReflectionRangeM", 200.0, float)
    elements_coords_type: CoordsType = _attr("elementsCoordsType", CoordsType.SPHERICAL, CoordsType)
    output_frame_of_reference: FrameOfReference = _attr("outputFrameOfReference", FrameOfReference.SENSOR,
                                                         FrameOfReference)
    custom_frame_of_reference_trafo: np.ndarray = _attr("customFrameOfReferenceTrafo", None, np.ndarray)
    output_motion_compensation_state: MotionCompensation = _attr(
        "outputMotionCompensationState", MotionCompensation.NONCOMPENSATED, MotionCompensation)
    include_invalid_points: bool = _attr("includeInvalidPoints", False, bool)
    partial_outputs: bool = _attr("partialOutputs", False, bool)
    instant_lidar: bool = _attr("instantLidar", False, bool)
    range_accuracy_m: float = _attr("rangeAccuracyM", 0.0, float)
    azimuth_error_std: float = _attr("azimuthErrorStd", 0.0, float)
    elevation_error_std: float = _attr("elevationErrorStd", 0.0, float)
    seed: int = field(default=0, metadata={"usd_full": "wsim:seed", "kind": int})
    #: Incidence angles (signal and intensity) from smooth shading normals — the mesh's angle-weighted vertex normals
    #: interpolated across each face — instead of the faces' own normals, so intensity is continuous across the
    #: creases of a surface whose faces share vertices. HitNormal stays the face's normal.
    smooth_normals: bool = field(default=False, metadata={"usd_full": "wsim:smoothNormals", "kind": bool})
    emitter_states: list[EmitterState] = field(default_factory=list)
    name: str = ""

    def __post_init__(self) -> None:
        if self.custom_frame_of_reference_trafo is None:
            self.custom_frame_of_reference_trafo = np.eye(4)

    # ------------------------------------------------------------------ derived
    @property
    def scan_period_s(self) -> float:
        return 1.0 / self.scan_rate_base_hz

    @property
    def ticks_per_scan(self) -> int:
        """Ticks in one scan: one for solid state; ceil(patternFiringRateHz / scanRateBaseHz) for rotary."""
        if self.scan_type is ScanType.SOLID_STATE:
            return 1
        return int(np.ceil(self.pattern_firing_rate_hz / self.scan_rate_base_hz - 1e-9))

    def replace(self, **changes: Any) -> LidarConfig:
        """A validated copy with fields changed; enum fields accept their tokens (``ray_type="GAUSSIAN_BEAM"``).

        Raises:
            LidarConfigError: An unknown field, a bad token or an invalid combination (names the attribute).
        """
        kinds = {f.name: f.metadata.get("kind") for f in fields(self)}
        values = {}
        for name, value in changes.items():
            if name not in kinds or name in ("emitter_states", "name"):
                raise LidarConfigError(f"unknown lidar setting {name!r}")
            kind = kinds[name]
            values[name] = value if kind is None or isinstance(value, Enum) else _convert(value, kind, name)
        cfg = dataclasses.replace(self, **values)
        cfg.validate()
        return cfg

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_attributes(cls, attrs: dict[str, Any], *, name: str = "") -> LidarConfig:
        """Build from a mapping of full attribute names (``omni:sensor:Core:...``, ``wsim:...``) to values.

        Unknown ``omni:sensor:Core:*`` attributes are reported once with a warning; wrong types, unknown tokens and
        wrong array lengths raise :class:`LidarConfigError` naming the attribute (and ``name``, the prim path).
        """
        where = f"{name}: " if name else ""
        kw: dict[str, Any] = {"name": name}
        known: set[str] = set()
        for f in fields(cls):
            usd = f.metadata.get("usd")
            full = PREFIX + usd if usd else f.metadata.get("usd_full")
            if not full:
                continue
            known.add(full)
            if full not in attrs or attrs[full] is None:
                continue
            kw[f.name] = _convert(attrs[full], f.metadata["kind"], f"{where}{full}")
        states: dict[str, dict[str, Any]] = {}
        for key, value in attrs.items():
            if key.startswith(STATE_PREFIX):
                rest = key[len(STATE_PREFIX):]
                sname, _, fname = rest.partition(":")
                if fname not in _STATE_FIELDS:
                    warnings.warn(f"{where}ignoring unknown lidar attribute {key}", stacklevel=2)
                    continue
                states.setdefault(sname, {})[fname] = value
                known.add(key)
        unknown = sorted(k for k in attrs if k.startswith(PREFIX) and k not in known)
        if unknown:
            warnings.warn(f"{where}ignoring unknown lidar attributes: {', '.join(unknown)}", stacklevel=2)
        cfg = cls(**kw)
        ne = cfg.number_of_emitters
        for sname in sorted(states):
            arrays = {}
            for fname, (attr_name, dtype) in _STATE_FIELDS.items():
                full = f"{STATE_PREFIX}{sname}:{fname}"
                if fname in states[sname]:
                    try:
                        a = np.asarray(states[sname][fname], dtype=np.float64).reshape(-1)
                    except (TypeError, ValueError) as e:
                        raise LidarConfigError(f"{where}{full}: not a numeric array ({e})") from None
                    if len(a) != ne:
                        raise LidarConfigError(f"{where}{full}: has {len(a)} entries, numberOfEmitters is {ne}")
                    if not np.all(np.isfinite(a)):
                        raise LidarConfigError(f"{where}{full}: non-finite values")
                    arrays[attr_name] = a.astype(dtype)
                elif fname == "channelId":
                    arrays[attr_name] = np.arange(1, ne + 1, dtype=np.uint32)
                else:
                    arrays[attr_name] = np.zeros(ne, dtype=dtype)
            cfg.emitter_states.append(EmitterState(**arrays))
        cfg.validate()
        return cfg

    def to_attributes(self) -> dict[str, Any]:
        """The inverse of :meth:`from_attributes` (enums as tokens, states as ``emitterState:sNNN:*`` arrays)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            usd = f.metadata.get("usd")
            full = PREFIX + usd if usd else f.metadata.get("usd_full")
            if not full:
                continue
            v = getattr(self, f.name)
            out[full] = v.value if isinstance(v, Enum) else v
        for k, st in enumerate(self.emitter_states):
            for fname, (attr_name, _) in _STATE_FIELDS.items():
                out[f"{STATE_PREFIX}s{k + 1:03d}:{fname}"] = getattr(st, attr_name)
        return out

    def validate(self) -> None:
        """Check ranges and consistency; raise :class:`LidarConfigError` naming the attribute."""
        w = f"{self.name}: " if self.name else ""

        def bad(attr: str, msg: str) -> LidarConfigError:
            return LidarConfigError(f"{w}{PREFIX}{attr}: {msg}")

        if not np.isfinite(self.scan_rate_base_hz) or self.scan_rate_base_hz < MIN_SCAN_RATE_HZ:
            raise bad("scanRateBaseHz", f"{self.scan_rate_base_hz} is below {MIN_SCAN_RATE_HZ} Hz (TimeOffsetNs is "
                                        "int32 ns)")
        if self.scan_type is ScanType.ROTARY and not self.pattern_firing_rate_hz > 0:
            raise bad("patternFiringRateHz", "must be > 0 for a ROTARY lidar")
        if self.rotation_direction not in ("CW", "CCW"):
            raise bad("rotationDirection", f"unknown token {self.rotation_direction!r} (CW or CCW)")
        if self.number_of_emitters <= 0:
            raise bad("numberOfEmitters", "must be > 0")
        if not self.emitter_states:
            raise bad("emitterState", "no emitter state (emitterState:s001:*) authored")
        if self.state_resolution_step < 1:
            raise bad("stateResolutionStep", "must be >= 1")
        if not 0 <= self.near_range_m < self.far_range_m:
            raise bad("farRangeM", f"range window [{self.near_range_m}, {self.far_range_m}] is empty")
        if self.max_returns < 1:
            raise bad("maxReturns", "must be >= 1")
        if self.max_returns > 8:
            raise bad("maxReturns", "at most 8 returns per firing are supported")
        if self.min_dist_between_echos_m < 0:
            raise bad("minDistBetweenEchosM", "must be >= 0")
        if self.ray_type is not RayType.IDEALIZED and not 1 <= self.beam_samples <= 61:
            raise LidarConfigError(f"{w}wsim:beamSamples: must be in [1, 61], got {self.beam_samples}")
        if self.divergence_hor_deg < 0 or self.divergence_ver_deg < 0:
            raise bad("divergenceHorDeg", "divergence must be >= 0")
        if self.min_reflection_range_m <= 0:
            raise bad("minReflectionRangeM", "must be > 0")
        if self.intensity_scale_percent < 0:
            raise bad("intensityScalePercent", "must be >= 0")
        m = np.asarray(self.custom_frame_of_reference_trafo, dtype=np.float64)
        if m.shape != (4, 4) or not np.all(np.isfinite(m)):
            raise bad("customFrameOfReferenceTrafo", "must be a finite 4x4 matrix")
        for k, st in enumerate(self.emitter_states):
            for attr, (aname, _) in _STATE_FIELDS.items():
                if len(getattr(st, aname)) != self.number_of_emitters:
                    raise LidarConfigError(f"{w}{STATE_PREFIX}s{k + 1:03d}:{attr}: has {len(getattr(st, aname))} "
                                           f"entries, numberOfEmitters is {self.number_of_emitters}")
            if np.any(st.fire_time_ns < 0) or np.any(st.fire_time_ns >= 2**31):
                raise LidarConfigError(f"{w}{STATE_PREFIX}s{k + 1:03d}:fireTimeNs: out of range")


def _convert(value: Any, kind: Any, name: str) -> Any:
    try:
        if isinstance(kind, type) and issubclass(kind, Enum):
            token = str(value)
            try:
                return kind(token)
            except ValueError:
                raise LidarConfigError(
                    f"{name}: unknown token {token!r} (expected one of {', '.join(m.value for m in kind)})"
                ) from None
        if kind is bool:
            if isinstance(value, (bool, np.bool_, int)):
                return bool(value)
            raise TypeError(f"expected a bool, got {type(value).__name__}")
        if kind is int:
            if isinstance(value, (float, np.floating)) and not float(value).is_integer():
                raise TypeError(f"expected an integer, got {value}")
            if isinstance(value, (str, bytes)) or np.ndim(value) != 0:
                raise TypeError(f"expected an integer, got {type(value).__name__}")
            return int(value)
        if kind is float:
            if isinstance(value, (str, bytes)) or np.ndim(value) != 0:
                raise TypeError(f"expected a number, got {type(value).__name__}")
            v = float(value)
            if not np.isfinite(v):
                raise TypeError("non-finite value")
            return v
        if kind is str:
            return str(value)
        if kind is np.ndarray:
            return np.asarray(value, dtype=np.float64)
    except LidarConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise LidarConfigError(f"{name}: {e}") from None
    return value
