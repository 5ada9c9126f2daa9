"""Bird's-eye images of point clouds (for quick looks and the demo)."""

from __future__ import annotations

import numpy as np
import warp as wp

from ..kernels.colormap import colorize_turbo_kernel

#: (x_min, x_max, y_min, y_max) [m] of a top-down view.
Bounds = tuple[float, float, float, float]


def topdown_image(xyz: np.ndarray, values: np.ndarray, *, extent_m: float = 60.0, resolution_m: float = 0.1,
                  vmax: float | None = None) -> np.ndarray:
    """Rasterise points (N, 3) [m] seen from above into an RGB image coloured by ``values`` through Turbo.

    The image covers [−extent, extent]² around the origin, x up and y left (the vehicle's view from above); where
    several points fall in one pixel the largest value wins. Empty pixels are black.
    """
    return topdown_raster(xyz, values, (-extent_m, extent_m, -extent_m, extent_m), resolution_m=resolution_m,
                          vmax=vmax, forward="up")


def topdown_raster(xyz: np.ndarray, values: np.ndarray, bounds: Bounds, *, resolution_m: float = 0.1,
                   vmax: float | None = None, forward: str = "up") -> np.ndarray:
    """Rasterise points (N, 3) [m] seen from above over ``bounds`` (x_min, x_max, y_min, y_max) [m].

    ``forward="up"``: x grows upward and y leftward (rows = x, columns = y); ``forward="right"``: x grows to the
    right and y upward (columns = x, rows = y). Both are views from above (z toward the viewer). Pixel (row, column)
    covers [edge, edge + resolution) of its axis from the image's top-left corner. Where several points fall in one
    pixel the largest value wins; values go through Turbo over [0, vmax] (default: the 99th percentile); empty pixels
    are black.

    Returns:
        (H, W, 3) uint8.
    """
    if forward not in ("up", "right"):
        raise ValueError(f"forward: 'up' or 'right', got {forward!r}")
    x0, x1, y0, y1 = (float(b) for b in bounds)
    if not (x1 > x0 and y1 > y0 and resolution_m > 0):
        raise ValueError(f"bounds: need x_min < x_max and y_min < y_max, got {bounds}")
    nx = int(round((x1 - x0) / resolution_m))
    ny = int(round((y1 - y0) / resolution_m))
    xyz = np.asarray(xyz).reshape(-1, 3)
    ix = np.floor((x1 - xyz[:, 0]) / resolution_m).astype(np.int64)  # 0 at x_max
    iy = np.floor((y1 - xyz[:, 1]) / resolution_m).astype(np.int64)  # 0 at y_max
    if forward == "up":
        h, w, row, col = nx, ny, ix, iy
    else:
        h, w, row, col = ny, nx, iy, nx - 1 - ix
    ok = (row >= 0) & (row < h) & (col >= 0) & (col < w)
    values = np.asarray(values, np.float32).reshape(-1)
    vmax = float(vmax if vmax is not None else max(np.percentile(values, 99) if len(values) else 1.0, 1e-6))
    img = np.zeros(h * w, np.float32)
    v = np.clip(values[ok], 1e-6 * vmax, None)  # > 0: hits are never black
    np.maximum.at(img, row[ok] * w + col[ok], v)
    rgb = wp.empty((h * w, 3), dtype=wp.uint8, device="cpu")
    wp.launch(colorize_turbo_kernel, h * w, [wp.array(img, dtype=float, device="cpu"), vmax], [rgb], device="cpu")
    return rgb.numpy().reshape(h, w, 3)


def crop_bounds(xyz: np.ndarray, *, percentiles: tuple[float, float] = (1.0, 99.0), margin_m: float = 3.0,
                include: np.ndarray | None = None, resolution_m: float = 0.1) -> Bounds:
    """Bounds (x_min, x_max, y_min, y_max) [m] of the points' ``percentiles`` extents in x and y, widened by
    ``margin_m`` and so as to contain the points ``include`` (e.g. the sensor position), snapped outward to the pixel
    grid of ``resolution_m``."""
    xyz = np.asarray(xyz, np.float64).reshape(-1, 3)
    if len(xyz):
        lo = np.percentile(xyz[:, :2], percentiles[0], axis=0)
        hi = np.percentile(xyz[:, :2], percentiles[1], axis=0)
    else:
        lo = hi = np.zeros(2)
    if include is not None:
        inc = np.asarray(include, np.float64).reshape(-1, np.asarray(include).shape[-1])[:, :2]
        lo, hi = np.minimum(lo, inc.min(axis=0)), np.maximum(hi, inc.max(axis=0))
    lo = np.floor((lo - margin_m) / resolution_m) * resolution_m
    hi = np.ceil((hi + margin_m) / resolution_m) * resolution_m
    return float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1])


def turbo_colors(values: np.ndarray, vmax: float) -> np.ndarray:
    """(N, 3) uint8 Turbo colours of ``values / vmax`` (values <= 0 are black)."""
    v = np.asarray(values, np.float32).reshape(-1)
    rgb = wp.empty((max(len(v), 1), 3), dtype=wp.uint8, device="cpu")
    if len(v):
        wp.launch(colorize_turbo_kernel, len(v), [wp.array(v, dtype=float, device="cpu"), float(vmax)], [rgb],
                  device="cpu")
    return rgb.numpy()[: len(v)]
