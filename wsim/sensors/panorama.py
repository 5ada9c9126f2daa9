"""A 360° range/intensity panorama: an idealised spinning sensor that fires every column at one instant.

Used by ``wsim demo`` and as a quick look at a scene. The physically modelled lidar is :class:`wsim.Lidar`.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass

import numpy as np
import warp as wp

from ..kernels.colormap import colorize_turbo_kernel
from ..scene.scene import Scene


@dataclass
class Panorama:
    """Range [m] and intensity images (H, W) and the trace rate.

    Row 0 is the highest elevation. Azimuth is counter-clockwise seen from above, measured from the heading the
    panorama was rendered with (0 = forward, +90° = left): column 0 looks backward (+180°), the centre column forward,
    and azimuth decreases left to right, so the left half of the image shows the left side.

    Attributes:
        range_m: (H, W) distance [m], 0 where nothing was hit.
        intensity: (H, W) reflectance · |cos θ_inc| in [0, 1], 0 where nothing was hit.
        semantic: (H, W) semantic class index.
        rays_per_second: Closest-hit rays traced per second (trace only).
        azimuth_deg: (W,) azimuth of each column's centre relative to the heading [deg].
        elevation_deg: (H,) elevation of each row [deg].
        heading_deg: World yaw of azimuth 0 [deg] (counter-clockwise from world +x).
        max_range_m: Far limit of the rays [m] (beyond it: no hit).
    """

    range_m: np.ndarray
    intensity: np.ndarray
    semantic: np.ndarray
    rays_per_second: float
    azimuth_deg: np.ndarray | None = None
    elevation_deg: np.ndarray | None = None
    heading_deg: float = 0.0
    max_range_m: float = 0.0

    def to_image(self, max_range_m: float = 80.0) -> np.ndarray:
        """(2H, W, 3) uint8: range through Turbo on top (:meth:`range_image`), intensity as grey below
        (:meth:`intensity_image`)."""
        return np.concatenate([self.range_image(max_range_m), self.intensity_image()], axis=0)

    def range_image(self, max_range_m: float = 80.0) -> np.ndarray:
        """(H, W, 3) uint8 range through Turbo over [0, max_range_m] [m]; no hit is black."""
        h, w = self.range_m.shape
        rgb = wp.empty((h * w, 3), dtype=wp.uint8, device="cpu")
        wp.launch(colorize_turbo_kernel, h * w, [wp.array(self.range_m.reshape(-1), dtype=float, device="cpu"),
                                                 float(max_range_m)], [rgb], device="cpu")
        return rgb.numpy().reshape(h, w, 3)

    def intensity_image(self) -> np.ndarray:
        """(H, W, 3) uint8 intensity as grey (:func:`intensity_grey`)."""
        return np.repeat(intensity_grey(self.intensity)[..., None], 3, axis=-1)


def intensity_grey(intensity: np.ndarray) -> np.ndarray:
    """Grey level (uint8) of intensities in [0, 1]: 255·√intensity (the square root lifts dark surfaces)."""
    return np.clip(np.asarray(intensity, np.float32) ** 0.5 * 255.0, 0, 255).astype(np.uint8)


def render_panorama(
    scene: Scene,
    position: np.ndarray,
    *,
    time: float = 0.0,
    width: int = 1800,
    height: int = 128,
    elevation_deg: tuple[float, float] = (-25.0, 15.0),
    max_range_m: float = 230.0,
    heading_rad: float = 0.0,
    device: str | None = None,
) -> Panorama:
    """Trace a (height × width) panorama from ``position`` [m] (world) at scene time ``time`` [s].

    Args:
        scene: The scene.
        position: Sensor origin (3,) [m].
        time: Scene time [s] at which every ray is traced.
        width: Azimuth columns over 360°; height: elevation rows over ``elevation_deg`` [deg].
        max_range_m: Far limit [m].
        heading_rad: World yaw [rad] (counter-clockwise from world +x) of the centre column, e.g. the vehicle's.
        device: Warp device (default: Warp's default device).
    """
    geo = scene.device_geometry(device)
    az_deg = 180.0 - (np.arange(width) + 0.5) * 360.0 / width
    el_deg = np.linspace(elevation_deg[1], elevation_deg[0], height)
    az = np.deg2rad(az_deg) + float(heading_rad)
    el = np.deg2rad(el_deg)
    ce = np.cos(el)[:, None]
    d = np.stack([ce * np.cos(az)[None], ce * np.sin(az)[None], np.broadcast_to(np.sin(el)[:, None], (height, width))],
                 -1).reshape(-1, 3)
    o = np.broadcast_to(np.asarray(position, np.float32), d.shape)
    with geo.hold_time_window(time, time):
        geo.trace(o[:8], d[:8], time, t_max=max_range_m)  # compile outside the timing
        t0 = _time.perf_counter()
        hits = geo.trace(o, d, time, t_max=max_range_m, grid=(height, width))  # (tiles of neighbours)
        wp.synchronize_device(geo.device)
        dt = _time.perf_counter() - t0
    h = hits.numpy()
    ok = h["face"] >= 0
    refl = np.array([m.reflectance for m in scene.materials], np.float32)
    cos = np.abs(np.sum(h["normal"] * d, axis=1))
    inten = np.where(ok, refl[np.maximum(h["material"], 0)] * cos, 0.0)
    rng = np.where(ok, h["t"], 0.0)
    return Panorama(rng.reshape(height, width).astype(np.float32), inten.reshape(height, width).astype(np.float32),
                    h["semantic"].reshape(height, width), len(d) / dt, az_deg, el_deg,
                    float(np.rad2deg(heading_rad)), float(max_range_m))
