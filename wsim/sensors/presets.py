"""Built-in lidar presets (Hesai PANDAR128 and AT128) from the device tables in ``wsim/data/devices``.

``python -m wsim.sensors.presets`` regenerates the shipped USD files ``wsim/data/lidar/<NAME>.usda`` (an OmniLidar
prim per device) that a stage can reference.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from .lidar_config import EmitterState, LidarConfig, ScanType

DATA = Path(__file__).resolve().parent.parent / "data"
DEVICES = DATA / "devices"
PRESET_USD = {"PANDAR128": DATA / "lidar" / "PANDAR128.usda", "AT128": DATA / "lidar" / "AT128.usdc"}

#: AT128 mirror scan: columns per frame and their angular span in the device convention [deg].
AT128_COLUMNS = 1200
AT128_DEVICE_AZIMUTH_DEG = (30.0, 150.0)


def _read(name: str) -> list[list[str]]:
    with open(DEVICES / name, newline="") as f:
        return list(csv.reader(f))


def pandar128_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(elevation [deg], azimuth offset [deg], standard-mode fire times [ns] of angle states 0 and 1, (2, 128))."""
    rows = _read("pandar128_angles.csv")[1:]
    el = np.array([float(r[1]) for r in rows], np.float32)
    az = np.array([float(r[2]) for r in rows], np.float32)
    ft = _read("pandar128_firetimes.csv")
    modes, states = ft[1], ft[2]
    # far column (distance >= threshold) of operation mode 2 (standard), angle states 0 and 1
    cols = [next(i for i in range(1, len(modes)) if modes[i] == "2" and states[i] == str(s) and
                 ft[0][i].startswith("distance>=")) for s in (0, 1)]
    fire = np.array([[int(r[c]) for r in ft[3:]] for c in cols], np.int64)
    return el, az, fire


def pandar128(**overrides) -> LidarConfig:
    """Hesai Pandar128E3X, standard mode: 10 Hz, 18 kHz ticks (1800 per scan), two alternating angle states."""
    el, az, fire = pandar128_tables()
    n = len(el)
    states = [
        EmitterState(az.copy(), el.copy(), fire[s], np.arange(1, n + 1, dtype=np.uint32), np.zeros(n, np.float32),
                     np.zeros(n, np.float32), np.zeros(n, np.float32))
        for s in range(2)
    ]
    cfg = LidarConfig(scan_type=ScanType.ROTARY, scan_rate_base_hz=10.0, pattern_firing_rate_hz=18000.0,
                      rotation_direction="CW", number_of_emitters=n, number_of_channels=n, state_resolution_step=1,
                      near_range_m=0.3, far_range_m=230.0, divergence_hor_deg=0.1, divergence_ver_deg=0.1,
                      emitter_states=states, name="PANDAR128")
    return _apply(cfg, overrides)


def at128(**overrides) -> LidarConfig:
    """Hesai AT128: solid state, 120° × 25.4°, 1200 columns × 128 channels per frame, 10 frames/s, 1–180 m.

    The mirror sweep is modelled as one emitter state of 1200 × 128 emitters (emitter = column · 128 + channel);
    column c fires at c · 100 ms / 1200 plus the channel's fire time. Device azimuth a (30°..150°, plus the channel's
    offset) maps to the sensor azimuth 90° − a (counter-clockwise from +X forward), so the sweep runs left to right.
    """
    rows = _read("at128_angles.csv")[1:]
    el = np.array([float(r[1]) for r in rows], np.float32)
    az = np.array([float(r[2]) for r in rows], np.float32)
    ft = np.array([int(r[1]) for r in _read("at128_firetimes.csv")[1:]], np.int64)
    nch = len(el)
    a0, a1 = AT128_DEVICE_AZIMUTH_DEG
    col_az = a0 + (np.arange(AT128_COLUMNS) + 0.5) * (a1 - a0) / AT128_COLUMNS
    period_ns = 1e9 / 10.0
    col_t = np.round(np.arange(AT128_COLUMNS) * period_ns / AT128_COLUMNS).astype(np.int64)
    azimuth = (90.0 - (col_az[:, None] + az[None, :])).reshape(-1).astype(np.float32)
    elevation = np.broadcast_to(el[None, :], (AT128_COLUMNS, nch)).reshape(-1).astype(np.float32)
    fire = (col_t[:, None] + ft[None, :]).reshape(-1)
    channel = np.broadcast_to(np.arange(1, nch + 1, dtype=np.uint32)[None, :], (AT128_COLUMNS, nch)).reshape(-1)
    n = len(azimuth)
    z = np.zeros(n, np.float32)
    st = EmitterState(azimuth, elevation, fire, channel.copy(), z, z.copy(), z.copy())
    cfg = LidarConfig(scan_type=ScanType.SOLID_STATE, scan_rate_base_hz=10.0, pattern_firing_rate_hz=10.0,
                      number_of_emitters=n, number_of_channels=nch, near_range_m=1.0, far_range_m=180.0,
                      min_reflection_range_m=180.0, divergence_hor_deg=0.1, divergence_ver_deg=0.1,
                      emitter_states=[st], name="AT128")
    return _apply(cfg, overrides)


PRESETS = {"PANDAR128": pandar128, "AT128": at128}


def preset(name: str, **overrides) -> LidarConfig:
    """A preset's configuration with field overrides (e.g. ``ray_type=RayType.GAUSSIAN_BEAM, max_returns=2``)."""
    key = name.upper()
    if key not in PRESETS:
        raise ValueError(f"unknown lidar preset {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[key](**overrides)


def _apply(cfg: LidarConfig, overrides: dict) -> LidarConfig:
    return cfg.replace(**overrides) if overrides else cfg


def write_preset_files() -> list[Path]:
    """Write the preset USD files into ``wsim/data/lidar``."""
    from ..scene.prims import write_lidar_usd

    out = []
    for name, path in PRESET_USD.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_lidar_usd(path, f"/{name}", preset(name).to_attributes())
        out.append(path)
    return out


if __name__ == "__main__":
    for p in write_preset_files():
        print(p)
