"""Bird's-eye images of point clouds (for quick looks and the demo)."""

from __future__ import annotations

import numpy as np
import warp as wp

from ..kernels.colormap import colorize_turbo_kernel


def topdown_image(xyz: np.ndarray, values: np.ndarray, *, extent_m: float = 60.0, resolution_m: float = 0.1,
                  vmax: float | None = None) -> np.ndarray:
    """Rasterise points (N, 3) [m] seen from above into an RGB image coloured by ``values`` through Turbo.

    The image covers [−extent, extent]² around the origin, x up and y left (the vehicle's view from above); where
    several points fall in one pixel the largest value wins. Empty pixels are black.
    """
    n = int(round(2 * extent_m / resolution_m))
    row = np.floor((extent_m - xyz[:, 0]) / resolution_m).astype(np.int64)
    col = np.floor((extent_m - xyz[:, 1]) / resolution_m).astype(np.int64)
    ok = (row >= 0) & (row < n) & (col >= 0) & (col < n)
    vmax = float(vmax if vmax is not None else max(np.percentile(values, 99) if len(values) else 1.0, 1e-6))
    img = np.zeros(n * n, np.float32)
    v = np.clip(np.asarray(values, np.float32)[ok], 1e-6 * vmax, None)  # > 0: hits are never black
    np.maximum.at(img, row[ok] * n + col[ok], v)
    rgb = wp.empty((n * n, 3), dtype=wp.uint8, device="cpu")
    wp.launch(colorize_turbo_kernel, n * n, [wp.array(img, dtype=float, device="cpu"), vmax], [rgb], device="cpu")
    return rgb.numpy().reshape(n, n, 3)


def turbo_colors(values: np.ndarray, vmax: float) -> np.ndarray:
    """(N, 3) uint8 Turbo colours of ``values / vmax`` (values <= 0 are black)."""
    v = np.asarray(values, np.float32).reshape(-1)
    rgb = wp.empty((max(len(v), 1), 3), dtype=wp.uint8, device="cpu")
    if len(v):
        wp.launch(colorize_turbo_kernel, len(v), [wp.array(v, dtype=float, device="cpu"), float(vmax)], [rgb],
                  device="cpu")
    return rgb.numpy()[: len(v)]
