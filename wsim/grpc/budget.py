"""The request budget of the sensorsim server: how much work one request may ask for, checked before any work.

A few hundred bytes of request can name gigapixels of images or minutes of lidar frames; without a budget the server
would render them and only then find the answer too large. :class:`RequestBudget` bounds each request up front and
answers RESOURCE_EXHAUSTED naming the field and the limit. ``wsim serve --max-image-pixels / --max-request-pixels /
--max-images / --max-lidar-sweeps`` set it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import exhausted

#: Seconds of one lidar sweep at 10 Hz (the presets' rate) used when a request's rate is not yet known.
_SWEEP_S = 0.1


@dataclass(frozen=True)
class RequestBudget:
    """Limits on the work one request may ask for.

    Attributes:
        max_image_pixels: Pixels of one image (width × height) [px]; default 3840 × 2160 (4K UHD).
        max_request_pixels: Pixels of all images of one request (batches and aggregates; products count once each)
            [px]; default 12 full-HD images.
        max_images: Images (items × products) of one request.
        max_lidar_sweeps: Lidar sweeps (frame length × scan rate, rounded up) of one request, summed over its lidar
            frames.
    """

    max_image_pixels: int = 3840 * 2160
    max_request_pixels: int = 12 * 1920 * 1080
    max_images: int = 32
    max_lidar_sweeps: int = 8

    def __post_init__(self) -> None:
        for name in ("max_image_pixels", "max_request_pixels", "max_images", "max_lidar_sweeps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")

    def image(self, field: str, width: int, height: int) -> int:
        """Check one image of ``width`` × ``height`` [px]; returns its pixel count."""
        px = int(width) * int(height)
        if px > self.max_image_pixels:
            raise exhausted(f"{field}resolution_w, {field}resolution_h: {width}x{height} = {px:,} pixels exceed the "
                            f"server's limit of {self.max_image_pixels:,} pixels per image (--max-image-pixels)")
        return px

    def images(self, field: str, images: list[tuple[int, int, int]]) -> None:
        """Check a request's images, given as (width, height, products) each, before rendering any of them."""
        count = sum(p for _, _, p in images)
        if count > self.max_images:
            raise exhausted(f"{field}: {count} images exceed the server's limit of {self.max_images} per request "
                            "(--max-images)")
        total = sum(int(w) * int(h) * p for w, h, p in images)
        if total > self.max_request_pixels:
            raise exhausted(f"{field}: {total:,} pixels in all exceed the server's limit of "
                            f"{self.max_request_pixels:,} pixels per request (--max-request-pixels)")

    def lidar(self, field: str, frames: list[tuple[int, int, float]]) -> None:
        """Check a request's lidar frames, given as (frame_start_us, frame_end_us, scan rate [Hz]) each."""
        sweeps = 0
        for start, end, rate in frames:
            length_s = max(int(end) - int(start), 0) * 1e-6
            sweeps += max(1, math.ceil(length_s * (rate or 1.0 / _SWEEP_S) - 1e-9))
        if sweeps > self.max_lidar_sweeps:
            raise exhausted(f"{field}frame_start_us, {field}frame_end_us: {sweeps} lidar sweeps exceed the server's "
                            f"limit of {self.max_lidar_sweeps} per request (--max-lidar-sweeps)")


def camera_products(req: Any) -> int:
    """Images one camera request renders (RGB requests: 1; camera requests: their products, COLOR by default)."""
    products = getattr(req, "render_products", None)
    return max(len(products), 1) if products is not None else 1
