"""Annotated figures of sensor outputs, drawn with Pillow: a title line, colour bars with units, class legends,
azimuth/elevation ticks, top-down axes with a scale bar and the sensor's position and heading.

Also the lidar-on-camera overlay: lidar points projected into a rolling-shutter camera image, moved with the object
they hit from their firing time to the pixel's readout time, and occlusion-tested against the camera's own distance
image.

Every figure function returns a :class:`Figure`: the RGB pixels and the layout boxes of its parts (``"title"``,
``"image"``, ``"colorbar"``, ``"legend"``, ...), so callers and tests can find each region.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .topdown import Bounds, crop_bounds, topdown_raster, turbo_colors

#: (left, top, right, bottom) [px] of a figure region; right and bottom are exclusive.
Box = tuple[int, int, int, int]

WHITE = (255, 255, 255)
BLACK = (0, 0, 0)
GREY = (90, 90, 90)
#: Ego marker colour (magenta: not in the Turbo ramp).
MARKER = (255, 0, 255)
TITLE_PX = 16
TEXT_PX = 13
PAD = 8
#: Height [px] of a colour bar's label baseline above the bar.
LABEL_RAISE = TEXT_PX // 2 + 5


@dataclass
class Figure:
    """An annotated picture.

    Attributes:
        image: (H, W, 3) uint8 RGB.
        boxes: Region name → :data:`Box` (e.g. ``"title"``, ``"image"``, ``"colorbar"``, ``"legend"``).
        info: Free-form numbers about what was drawn (e.g. the colour bar's range).
    """

    image: np.ndarray
    boxes: dict[str, Box] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) [px]."""
        return self.image.shape[1], self.image.shape[0]

    def save(self, path: str | Path) -> None:
        Image.fromarray(self.image).save(path)


_FONTS: dict[int, Any] = {}


def font(size: int = TEXT_PX) -> Any:
    """Pillow's built-in font at ``size`` [px] (scalable from Pillow 10.1; the fixed bitmap font before)."""
    if size not in _FONTS:
        try:
            _FONTS[size] = ImageFont.load_default(size=size)
        except TypeError:  # Pillow < 10.1
            _FONTS[size] = ImageFont.load_default()
    return _FONTS[size]


def text_size(s: str, size: int = TEXT_PX) -> tuple[int, int]:
    """(width, height) [px] of one line of text."""
    box = font(size).getbbox(s)
    return int(math.ceil(box[2] - min(box[0], 0))), int(math.ceil(font(size).getbbox("Ag")[3]))


def wrap_text(s: str, max_width: int, size: int = TEXT_PX) -> list[str]:
    """``s`` broken at spaces into lines no wider than ``max_width`` [px] (a longer single word stays whole)."""
    lines: list[str] = []
    for para in s.split("\n"):
        cur = ""
        for word in para.split(" "):
            cand = f"{cur} {word}" if cur else word
            if cur and text_size(cand, size)[0] > max_width:
                lines.append(cur)
                cur = word
            else:
                cur = cand
        lines.append(cur)
    return lines


def nice_ticks(vmin: float, vmax: float, n: int = 5) -> np.ndarray:
    """About ``n`` round tick values (steps 1, 2, 2.5, 5 × 10^k) covering [vmin, vmax]."""
    span = float(vmax - vmin)
    if not span > 0:
        return np.array([vmin])
    raw = span / max(n - 1, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1.0, 2.0, 2.5, 5.0, 10.0) if s * mag >= raw * 0.999)
    first = math.ceil(vmin / step - 1e-9) * step
    return np.array([first + k * step for k in range(int(math.floor((vmax - first) / step + 1e-9)) + 1)])


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """Labels of tick values with the fewest common decimals (up to 3) that write each one exactly."""
    decimals = 0
    for v in ticks:
        while decimals < 3 and abs(round(float(v), decimals) - float(v)) > 1e-9 * max(1.0, abs(float(v))):
            decimals += 1
    return [f"{float(v):.{decimals}f}" for v in ticks]


def nice_ceil(v: float) -> float:
    """``v`` rounded up to two significant digits in steps of 5 (0.496 → 0.5, 63 → 65)."""
    if not v > 0:
        return 1.0
    step = 10.0 ** math.floor(math.log10(v)) / 2.0
    return math.ceil(v / step - 1e-9) * step


def turbo_ramp(vmax: float) -> Callable[[np.ndarray], np.ndarray]:
    """Value → Turbo colour over [0, vmax] (the colormap of the range, distance and intensity images)."""
    return lambda v: turbo_colors(np.maximum(np.asarray(v, np.float32), 1e-6 * vmax), vmax)


class _Canvas:
    """A white Pillow canvas that records the boxes of what is drawn on it."""

    def __init__(self, width: int, height: int) -> None:
        self.im = Image.new("RGB", (int(width), int(height)), WHITE)
        self.draw = ImageDraw.Draw(self.im)
        self.boxes: dict[str, Box] = {}

    def text(self, xy: tuple[float, float], s: str, *, size: int = TEXT_PX, fill=BLACK, anchor: str = "la") -> None:
        self.draw.text((float(xy[0]), float(xy[1])), s, font=font(size), fill=fill, anchor=anchor)

    def paste(self, arr: np.ndarray, xy: tuple[int, int], name: str | None = None) -> Box:
        h, w = arr.shape[:2]
        self.im.paste(Image.fromarray(np.ascontiguousarray(arr[..., :3])), (int(xy[0]), int(xy[1])))
        box = (int(xy[0]), int(xy[1]), int(xy[0]) + w, int(xy[1]) + h)
        if name:
            self.boxes[name] = box
        return box

    def title(self, s: str, width: int) -> int:
        """Draw the title at the top, wrapped to ``width``; returns its height [px]."""
        lines = wrap_text(s, int(width) - 2 * PAD, TITLE_PX)
        lh = text_size("Ag", TITLE_PX)[1] + 4
        for k, line in enumerate(lines):
            self.text((PAD, PAD + k * lh), line, size=TITLE_PX)
        h = _title_height(s, width)
        self.boxes["title"] = (0, 0, int(width), h)
        return h

    def notes(self, xy: tuple[int, int], lines: Sequence[str], width: int) -> int:
        """Grey note lines from ``xy``, wrapped to ``width``; returns the y below them."""
        x, y = int(xy[0]), int(xy[1])
        for line in _wrapped(lines, width):
            self.text((x, y), line, fill=GREY)
            y += text_size("Ag")[1] + 4
        return y

    def colorbar(self, box: Box, vmax: float, colors: Callable[[np.ndarray], np.ndarray], label: str, name: str,
                 *, ticks: Sequence[float] | None = None, note_top: str = "") -> None:
        """A vertical colour bar filling ``box`` (0 at the bottom, vmax at the top), outlined just outside the box,
        tick labels on its right and ``label`` above it."""
        x0, y0, x1, y1 = box
        h = y1 - y0
        v = (1.0 - (np.arange(h) + 0.5) / h) * vmax
        ramp = np.repeat(colors(v).reshape(h, 1, 3), x1 - x0, axis=1)
        self.paste(ramp, (x0, y0), name)
        self.draw.rectangle((x0 - 1, y0 - 1, x1, y1), outline=GREY)
        self.text((x0, y0 - LABEL_RAISE), label, anchor="ld")  # clear of the top tick label
        tk = nice_ticks(0.0, vmax) if ticks is None else np.asarray(ticks, float)
        if note_top and tk[-1] < vmax * (1 - 1e-9):  # label the top (saturating) end too
            min_gap = (text_size("0")[1] + 2) * vmax / h
            tk = np.append(tk if vmax - tk[-1] >= min_gap else tk[:-1], vmax)
        for t, s in zip(tk, tick_labels(tk)):
            y = y1 - (t / vmax) * h
            self.draw.line((x1, y, x1 + 4, y), fill=BLACK)
            if note_top and abs(t - vmax) < 1e-9 * max(vmax, 1.0):
                s = f"{s}{note_top}"
            self.text((x1 + 6, y), s, anchor="lm")

    def swatch_legend(self, xy: tuple[int, int], entries: Sequence[tuple[str, tuple[int, int, int]]], name: str,
                      *, heading: str = "") -> Box:
        """Colour swatches with labels, one per line; returns the legend's box."""
        x, y = int(xy[0]), int(xy[1])
        lh = text_size("Ag")[1] + 6
        top = y
        w = 0
        if heading:
            self.text((x, y), heading)
            w = text_size(heading)[0]
            y += lh
        for label, col in entries:
            self.draw.rectangle((x, y + 1, x + 13, y + 14), fill=tuple(int(c) for c in col), outline=GREY)
            self.text((x + 20, y + 8), label, anchor="lm")
            w = max(w, 20 + text_size(label)[0])
            y += lh
        box = (x, top, x + w, y)
        self.boxes[name] = box
        return box

    def finish(self, **info: Any) -> Figure:
        return Figure(np.asarray(self.im).copy(), dict(self.boxes), dict(info))


def _panel_width(label: str, vmax: float) -> int:
    """Width of a right-hand colour-bar panel: the label or the bar with its tick labels."""
    tick_w = max(text_size(s + "+")[0] for s in tick_labels(nice_ticks(0.0, vmax)))
    return max(text_size(label)[0], 16 + 6 + tick_w) + 3 * PAD


def _wrapped(lines: Sequence[str], width: int) -> list[str]:
    return [w for line in lines for w in wrap_text(line, int(width))]


def _lines_height(lines: Sequence[str], width: int) -> int:
    return len(_wrapped(lines, width)) * (text_size("Ag")[1] + 4)


def _title_height(s: str, width: int) -> int:
    n = len(wrap_text(s, int(width) - 2 * PAD, TITLE_PX))
    return n * (text_size("Ag", TITLE_PX)[1] + 4) - 4 + 2 * PAD


# ---------------------------------------------------------------------------------------------------------------------
# panorama


def panorama_figure(pano: Any, *, title: str, max_range_m: float = 80.0) -> Figure:
    """The range (Turbo) and intensity (grey) panoramas with colour bars, elevation labels, and azimuth ticks every
    45° labelled with the direction (0° = forward, +90° = left, ±180° = rear).

    Args:
        pano: A :class:`wsim.sensors.panorama.Panorama`.
        title: The title line.
        max_range_m: Upper end of the range colour bar [m] (farther ranges saturate).

    Returns:
        :class:`Figure` with boxes ``title``, ``range``, ``intensity``, ``colorbar_range``, ``colorbar_intensity``,
        ``azimuth_axis``.
    """
    from .panorama import intensity_grey

    rng, inten = pano.range_image(max_range_m), pano.intensity_image()
    h, w = rng.shape[:2]
    az = pano.azimuth_deg if pano.azimuth_deg is not None else 180.0 - (np.arange(w) + 0.5) * 360.0 / w
    el = pano.elevation_deg if pano.elevation_deg is not None else np.linspace(15.0, -25.0, h)
    left = max(text_size("+15°")[0], text_size("elev.")[0]) + 2 * PAD
    right = max(_panel_width("range [m]", max_range_m), _panel_width("intensity [0-1]", 1.0))
    th = text_size("Ag")[1]
    axis_h = 6 + th + 4
    gap = th + LABEL_RAISE + 4  # room for the colour bar label above each panel
    notes = [f"azimuth [deg] from the vehicle's heading (heading {pano.heading_deg:.1f}° from world +x), "
             "counter-clockwise seen from above: + = left, - = right; elevation [deg] on the left",
             f"black: no hit within {pano.max_range_m or 230.0:.0f} m; grey level = 255·sqrt(intensity)"]
    # elevation ticks: both ends and the multiples of 10° between them that leave room for a label
    lo, hi = float(el.min()), float(el.max())
    px_per_deg = (h - 1) / max(hi - lo, 1e-9)
    inner = [float(e) for e in range(int(math.ceil(lo / 10)) * 10, int(math.floor(hi / 10)) * 10 + 1, 10)
             if min(e - lo, hi - e) * px_per_deg >= th + 2]
    elev_ticks = [hi, *sorted(inner, reverse=True), lo]
    title_h = _title_height(title, left + w + right)
    height = title_h + 2 * (gap + h + axis_h) + 4 + _lines_height(notes, w) + PAD
    cv = _Canvas(left + w + right, height)
    y = cv.title(title, left + w + right)
    for name, arr, label, vmax, colors, note in (
            ("range", rng, "range [m]", max_range_m, turbo_ramp(max_range_m), "+"),
            ("intensity", inten, "intensity [0-1]", 1.0,
             lambda v: np.repeat(intensity_grey(v)[:, None], 3, axis=1), "")):
        y += gap
        cv.paste(arr, (left, y), name)
        cv.draw.rectangle((left - 1, y - 1, left + w, y + h), outline=GREY)
        cv.colorbar((left + w + PAD, y, left + w + PAD + 16, y + h), vmax, colors, label, f"colorbar_{name}",
                    ticks=(0.0, 0.25, 0.5, 1.0) if name == "intensity" else None, note_top=note)
        # elevation labels
        for e in elev_ticks:
            r = float(np.interp(e, el[::-1], np.arange(h)[::-1])) + 0.5
            cv.draw.line((left - 4, y + r, left - 1, y + r), fill=BLACK)
            cv.text((left - 6, y + r), f"{e:+.0f}°" if round(e) else "0°", anchor="rm")
        if name == "range":
            cv.text((left - 6, y - 3), "elev.", anchor="rd")
        # azimuth ticks (columns: azimuth decreases left to right)
        y += h
        axis_top = y
        words = {180: "rear", 90: "left", 0: "forward", -90: "right", -180: "rear"}
        for a in range(180, -181, -45):
            c = float(np.interp(-a, -az, np.arange(w))) + 0.5 if -180 < a < 180 else (0.0 if a == 180 else w)
            cv.draw.line((left + c, y, left + c, y + 5), fill=BLACK)
            s = f"{a:+d}°" if a else "0°"
            if a in words:
                s += f" {words[a]}"
            anchor = "la" if a == 180 else "ra" if a == -180 else "ma"
            cv.text((left + c, y + 6), s, anchor=anchor)
        y += axis_h
        cv.boxes[f"azimuth_axis_{name}"] = (left, axis_top, left + w, y)
    cv.notes((left, y + 4), notes, w)
    cv.boxes["azimuth_axis"] = cv.boxes["azimuth_axis_intensity"]
    return cv.finish(max_range_m=max_range_m)


# ---------------------------------------------------------------------------------------------------------------------
# top-down views


def _scale_length(span_m: float) -> float:
    """A round scale-bar length [m] of about a fifth of ``span_m``."""
    target = span_m / 5.0
    for s in (1, 2, 5, 10, 20, 25, 50, 100, 200, 500):
        if s >= target * 0.7:
            return float(s)
    return 1000.0


def topdown_figure(xyz: np.ndarray, values: np.ndarray, *, title: str, value_label: str = "intensity [0-1]",
                   vmax: float | None = None, resolution_m: float = 0.1, bounds: Bounds | None = None,
                   sensor_xy: Sequence[float] = (0.0, 0.0), heading_rad: float = 0.0, forward: str = "right",
                   frame_name: str = "sensor frame", scale_bar_m: float | None = None,
                   notes: Sequence[str] = ()) -> Figure:
    """Points seen from above, cropped to the data, with metre ticks on both axes, a scale bar, the sensor's position
    and heading (a magenta arrow) and a colour bar.

    Args:
        xyz: (N, 3) points [m] (x forward, y left in the sensor frame; or any frame with ``sensor_xy``/``heading``).
        values: (N,) colour values (Turbo over [0, vmax]; the largest value in a pixel wins).
        title: Title line.
        value_label: Colour bar label with its unit.
        vmax: Colour bar top (default: the 99th percentile of ``values``).
        resolution_m: Pixel size [m].
        bounds: (x_min, x_max, y_min, y_max) [m]; default :func:`wsim.sensors.topdown.crop_bounds` (1st-99th
            percentile extents + 3 m, including the sensor).
        sensor_xy: Sensor position (x, y) [m] in the points' frame; heading_rad: its heading (yaw) [rad].
        forward: ``"right"`` (x to the right, y up) or ``"up"`` (x up, y to the left).
        frame_name: Name of the points' frame for the axis labels.
        scale_bar_m: Scale bar length [m] (default: a round fifth of the view's width).
        notes: Extra lines under the plot.

    Returns:
        :class:`Figure` with boxes ``title``, ``image``, ``colorbar``, ``legend``, ``scale_bar``, ``ego_marker``;
        ``info`` has ``bounds``, ``vmax``, ``resolution_m``, ``scale_bar_m`` and ``forward``.
    """
    values = np.asarray(values, np.float32).reshape(-1)
    if vmax is None:
        vmax = nice_ceil(float(np.percentile(values, 99)) if len(values) else 1.0)
    sxy = np.asarray(sensor_xy, float).reshape(2)
    if bounds is None:
        bounds = crop_bounds(xyz, include=sxy[None], resolution_m=resolution_m)
    x0, x1, y0, y1 = bounds
    raster = topdown_raster(xyz, values, bounds, resolution_m=resolution_m, vmax=vmax, forward=forward)
    ph, pw = raster.shape[:2]

    def to_px(x: float, y: float) -> tuple[float, float]:
        """Canvas offset (column, row) [px] within the plot of world (x, y) [m]."""
        if forward == "right":
            return (x - x0) / resolution_m, (y1 - y) / resolution_m
        return (y1 - y) / resolution_m, (x1 - x) / resolution_m

    horiz, vert = (("x", x0, x1), ("y", y0, y1)) if forward == "right" else (("y", y0, y1), ("x", x0, x1))
    names = {"x": "x forward [m]", "y": "y left [m]"}
    th = text_size("Ag")[1]
    vt = nice_ticks(vert[1], vert[2], max(4, ph // 50))
    ht = nice_ticks(horiz[1], horiz[2], max(4, pw // 80))
    left = max([text_size(t)[0] for t in tick_labels(vt)] + [text_size(names[vert[0]])[0] // 2]) + 12 + PAD
    legend_lines = [f"{frame_name}, {resolution_m * 100:.0f} cm pixels", "black: no return"]
    right = max(_panel_width(value_label, vmax), 24 + max(text_size(s)[0] for s in
                                                            ["sensor + heading", *legend_lines]) + 2 * PAD)
    notes = list(notes)
    width = left + pw + right
    title_h = _title_height(title, width)
    top = title_h + th + 10
    legend_h = 3 * (th + 6) + 12
    bar_h = max(60, min(ph - legend_h - PAD, 300))
    axes_bottom = top + ph + 8 + th + 6 + th + 8
    height = max(axes_bottom, top + th // 2 + LABEL_RAISE + bar_h + 14 + legend_h) + _lines_height(
        notes, width - left) + PAD
    cv = _Canvas(width, height)
    cv.title(title, width)
    cv.paste(raster, (left, top), "image")
    cv.draw.rectangle((left - 1, top - 1, left + pw, top + ph), outline=GREY)
    # ticks: vertical axis (left), horizontal axis (bottom)
    for t, s in zip(vt, tick_labels(vt)):
        row = to_px(0.0, t)[1] if vert[0] == "y" else to_px(t, 0.0)[1]
        cv.draw.line((left - 5, top + row, left - 1, top + row), fill=BLACK)
        cv.text((left - 7, top + row), s, anchor="rm")
    for t, s in zip(ht, tick_labels(ht)):
        col = to_px(t, 0.0)[0] if horiz[0] == "x" else to_px(0.0, t)[0]
        cv.draw.line((left + col, top + ph, left + col, top + ph + 4), fill=BLACK)
        cv.text((left + col, top + ph + 6), s, anchor="ma")
    cv.text((left, top - 4), names[vert[0]] + " (up)", anchor="ld")
    cv.text((left + pw, top + ph + 8 + th), names[horiz[0]] + (" (right)" if horiz[0] == "x" else
                                                               ", growing to the left"), anchor="ra")
    # scale bar (bottom-left inside the plot, on a dark plate)
    sb = float(scale_bar_m or _scale_length((horiz[2] - horiz[1])))
    sb_px = sb / resolution_m
    bx, by = left + 10, top + ph - 12
    label = f"{sb:g} m"
    lw, _ = text_size(label)
    plate = (bx - 5, by - th - 10, bx + max(sb_px, lw) + 5, by + 6)
    cv.draw.rectangle(plate, fill=(30, 30, 30))
    cv.draw.line((bx, by, bx + sb_px, by), fill=WHITE, width=3)
    cv.draw.line((bx, by - 5, bx, by + 3), fill=WHITE)
    cv.draw.line((bx + sb_px, by - 5, bx + sb_px, by + 3), fill=WHITE)
    cv.text((bx + sb_px / 2, by - 6), label, fill=WHITE, anchor="md")
    cv.boxes["scale_bar"] = tuple(int(round(v)) for v in plate)
    # ego marker: sensor position and heading
    c, r = to_px(*sxy)
    hd = np.array([math.cos(heading_rad), math.sin(heading_rad)])
    c2, r2 = to_px(*(sxy + hd))
    d = np.array([c2 - c, r2 - r])
    d /= np.linalg.norm(d)
    n = np.array([-d[1], d[0]])
    cx, cy = left + c, top + r
    tip = np.array([cx, cy]) + 16 * d
    tri = [tuple(tip + 9 * d), tuple(tip - 4 * d + 7 * n), tuple(tip - 4 * d - 7 * n)]
    cv.draw.line((cx, cy, *(tip - 2 * d)), fill=WHITE, width=5)
    cv.draw.line((cx, cy, *(tip - 2 * d)), fill=MARKER, width=3)
    cv.draw.polygon(tri, fill=MARKER, outline=WHITE)
    cv.draw.ellipse((cx - 5, cy - 5, cx + 5, cy + 5), fill=MARKER, outline=WHITE)
    cv.boxes["ego_marker"] = (int(cx - 26), int(cy - 26), int(cx + 27), int(cy + 27))
    # colour bar and legend (right)
    rx = left + pw + PAD + 4
    bar_top = top + th // 2 + LABEL_RAISE
    cv.colorbar((rx, bar_top, rx + 16, bar_top + bar_h), vmax, turbo_ramp(vmax), value_label, "colorbar",
                note_top="+")
    ly = bar_top + bar_h + 14
    cv.draw.ellipse((rx + 2, ly + 3, rx + 12, ly + 13), fill=MARKER, outline=BLACK)
    cv.text((rx + 24, ly + 8), "sensor + heading", anchor="lm")
    yy = ly + th + 6
    for s in legend_lines:
        cv.text((rx, yy), s, fill=GREY)
        yy += th + 6
    cv.boxes["legend"] = (rx, ly, width - PAD, yy)
    cv.notes((left, max(axes_bottom, yy)), notes, width - left)
    return cv.finish(bounds=tuple(bounds), vmax=vmax, resolution_m=resolution_m, scale_bar_m=sb, forward=forward)


# ---------------------------------------------------------------------------------------------------------------------
# camera images


def camera_figure(image: np.ndarray, *, title: str, colorbar: tuple[float, str] | None = None,
                  legend: Sequence[tuple[str, tuple[int, int, int]]] | None = None, legend_heading: str = "",
                  notes: Sequence[str] = ()) -> Figure:
    """A camera image with a title, and a Turbo colour bar ``(vmax, label)`` and/or a swatch legend on the right.

    Returns:
        :class:`Figure` with boxes ``title``, ``image`` and, when asked, ``colorbar`` and ``legend``.
    """
    img = np.asarray(image)[..., :3]
    h, w = img.shape[:2]
    th = text_size("Ag")[1]
    notes = list(notes)
    right = 0
    need_h = 0
    if colorbar is not None:
        right = max(right, _panel_width(colorbar[1], colorbar[0]))
        need_h += 150
    if legend:
        lw = max([text_size(legend_heading)[0]] + [20 + text_size(s)[0] for s, _ in legend])
        right = max(right, lw + 2 * PAD)
        need_h += (len(legend) + 1) * (th + 6) + PAD
    width = max(PAD + w + (PAD + right if right else PAD), 400)
    title_h = _title_height(title, width)
    top = title_h + (th + LABEL_RAISE if colorbar is not None else 0)
    body_h = max(h, need_h)
    height = top + body_h + 6 + _lines_height(notes, width - 2 * PAD) + PAD
    cv = _Canvas(width, height)
    cv.title(title, width)
    cv.paste(img, (PAD, top), "image")
    rx = PAD + w + PAD + 4
    y = top
    if colorbar is not None:
        vmax, label = colorbar
        bar_h = max(80, (h if not legend else h // 2) - 4)
        cv.colorbar((rx, y, rx + 16, y + bar_h), vmax, turbo_ramp(vmax), label, "colorbar", note_top="+")
        y += bar_h + 16
    if legend:
        cv.swatch_legend((rx, y), legend, "legend", heading=legend_heading)
    cv.notes((PAD, top + body_h + 6), notes, width - 2 * PAD)
    return cv.finish(**({"vmax": colorbar[0]} if colorbar is not None else {}))


def semantic_legend(semantics: np.ndarray, classes: Sequence[Any], *, min_share: float = 0.0
                    ) -> list[tuple[str, tuple[int, int, int]]]:
    """Legend entries ``("name  12.3 %", colour)`` of the classes present in a SEMANTICS image, largest first.

    Args:
        semantics: (H, W) class indices.
        classes: :class:`wsim.sensors.camera.SemanticClassEntry` table (``CameraFrame.semantic_classes``).
        min_share: Leave out classes covering less than this fraction of the pixels.
    """
    sem = np.asarray(semantics).reshape(-1)
    idx, cnt = np.unique(sem, return_counts=True)
    table = {int(e.class_index): e for e in classes}
    out = []
    for i, c in sorted(zip(idx.tolist(), cnt.tolist()), key=lambda a: -a[1]):
        share = c / max(len(sem), 1)
        if share < min_share:
            continue
        e = table.get(int(i))
        name = e.class_name if e is not None else f"class {i}"
        if int(i) == 0:
            name = f"{name} (sky, outside the lens)"
        out.append((f"{name}  {100 * share:.1f} %", tuple(e.color) if e is not None else (0, 0, 0)))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# lidar on camera


@dataclass
class LidarOnCamera:
    """Lidar points projected into a camera frame (see :func:`project_lidar`).

    Attributes:
        pixels: (N, 2) (u, v) [px], corner origin. distance: (N,) distance from the camera centre [m] at the time of
            the pixel that images the point (the quantity of the DISTANCE product). times: (N,) that time [s].
        in_image: (N,) the point projects inside the image and the lens's field of view.
        occluded: (N,) the camera's surface at the point's pixel is nearer than the point by more than the tolerance.
        compensated: (N,) the point was moved with the moving object it hit.
    """

    pixels: np.ndarray
    distance: np.ndarray
    times: np.ndarray
    in_image: np.ndarray
    occluded: np.ndarray
    compensated: np.ndarray

    @property
    def visible(self) -> np.ndarray:
        """(N,) in the image and not occluded."""
        return self.in_image & ~self.occluded


def lidar_point_times(pc: Any, scene: Any = None) -> np.ndarray:
    """(N,) firing time of each point on the scene clock [s]: (timestampNs + TimeOffsetNs − time origin) · 1e-9."""
    origin_ns = int(round(scene.time_origin_us * 1000)) if scene is not None else 0
    off = pc["TimeOffsetNs"].numpy()[: pc.count].astype(np.int64)
    return (pc.value("timestampNs", 0) - origin_ns + off).astype(np.float64) * 1e-9


def lidar_point_instances(pc: Any, scene: Any) -> np.ndarray:
    """(N,) index into ``scene.instances`` of the instance each point hit (from the ObjectId channel), −1 for static
    geometry."""
    from .lidar import object_id_tables

    words = pc["ObjectId"].numpy()[: pc.count]
    table, _ = object_id_tables(scene)
    out = np.full(len(words), -1, np.int64)
    for k, inst in enumerate(scene.instances):
        h = table[inst.object_id]
        out[(words[:, 0] == h[0]) & (words[:, 1] == h[1]) & (words[:, 2] == h[2])] = k
    return out


def project_lidar(cam: Any, xyz_world: np.ndarray, t0: float, t1: float, *, distance: np.ndarray | None = None,
                  scene: Any = None, instance: np.ndarray | None = None, times: np.ndarray | None = None,
                  start_pose: Any = None, end_pose: Any = None, tol_m: float = 0.5, tol_rel: float = 0.03
                  ) -> LidarOnCamera:
    """Project world lidar points into a rolling-shutter camera frame [t0, t1], moving points on moving objects with
    their object and testing them against the camera's distance image.

    Motion compensation: a point that hit a moving instance (``instance[i] = k`` with ``scene.instances[k]``
    moving) is taken into that instance's frame with the instance's pose at the point's firing time ``times[i]``, and
    :meth:`Camera.project` places it with the object's pose at the time of the pixel that images it (``point_object``
    / ``object_poses``). Scale is taken as constant over the frame.

    Occlusion: DISTANCE is the distance from the camera centre (not the z depth), so the point's distance is
    ``depth / ray_z`` with ``ray_z`` the z of the unit camera ray through its pixel. A point is occluded when the
    distance image at its pixel is a hit (> 0) and nearer than the point by more than ``max(tol_m, tol_rel · D)``.
    Points at pixels where the camera sees nothing (0) are kept.

    Args:
        cam: A :class:`wsim.Camera`.
        xyz_world: (N, 3) world points [m] (a WORLD-frame, Cartesian lidar output).
        t0, t1: The camera frame's start and end [s].
        distance: (H, W) DISTANCE image of the same frame [m]; None skips the occlusion test.
        scene: The scene (needed with ``instance``).
        instance: (N,) index into ``scene.instances`` per point (−1: static), e.g. :func:`lidar_point_instances`.
        times: (N,) firing times [s] on the scene clock, e.g. :func:`lidar_point_times` (needed with ``instance``).
        start_pose, end_pose: Camera poses as for :meth:`Camera.project`.
        tol_m, tol_rel: Occlusion tolerance: absolute [m] and relative to the image's distance.
    """
    from ..scene.transforms import interpolate_pose, quat_to_matrix

    pts = np.asarray(xyz_world, np.float64).reshape(-1, 3).copy()
    n = len(pts)
    obj = np.full(n, -1, np.int32)
    object_poses = None
    if instance is not None and scene is not None and n:
        instance = np.asarray(instance).reshape(-1)
        if times is None:
            raise ValueError("times: needed to move points with their objects")
        times = np.asarray(times, np.float64).reshape(-1)
        poses = []
        for k in np.unique(instance[instance >= 0]):
            inst = scene.instances[int(k)]
            if not inst.is_moving:
                continue
            sel = np.nonzero(instance == k)[0]
            ut, inv = np.unique(times[sel], return_inverse=True)
            for j, t in enumerate(ut):
                tr, q = interpolate_pose(inst.times, inst.translations, inst.rotations, float(t))
                m = sel[inv == j]
                pts[m] = (pts[m] - tr) @ quat_to_matrix(q)  # R^T (p - t), rows
            obj[sel] = len(poses)
            poses.append([np.concatenate(interpolate_pose(inst.times, inst.translations, inst.rotations, tt))
                          for tt in (t0, t1)])
        if poses:
            object_poses = np.asarray(poses, np.float32)
    kw = {"point_object": obj, "object_poses": object_poses} if object_poses is not None else {}
    pix, depth, ptimes, valid = cam.project(pts.astype(np.float32), t0, t1, start_pose, end_pose, **kw).numpy()
    h, w = cam.height, cam.width
    u = np.floor(pix[:, 0]).astype(np.int64)
    v = np.floor(pix[:, 1]).astype(np.int64)
    inside = valid & (u >= 0) & (u < w) & (v >= 0) & (v < h)
    dist = np.zeros(n, np.float64)
    if inside.any():
        rays, _ = cam.unproject(pix[inside])
        rz = rays.numpy()[:, 2].astype(np.float64)
        dist[inside] = np.where(np.abs(rz) > 1e-6, depth[inside] / np.where(np.abs(rz) > 1e-6, rz, 1.0), 0.0)
    occluded = np.zeros(n, bool)
    if distance is not None:
        dimg = np.asarray(distance, np.float64)
        if dimg.shape != (h, w):
            raise ValueError(f"distance: expected a ({h}, {w}) image, got {dimg.shape}")
        ii = np.nonzero(inside)[0]
        d = dimg[v[ii], u[ii]]
        occluded[ii] = (d > 0) & (dist[ii] > 0) & (dist[ii] > d + np.maximum(tol_m, tol_rel * d))
    return LidarOnCamera(pix, dist.astype(np.float32), ptimes, inside, occluded, obj >= 0)


def draw_lidar_points(image: np.ndarray, proj: LidarOnCamera, vmax: float = 60.0, *, radius: int = 0) -> np.ndarray:
    """The visible points of ``proj`` drawn over ``image``, coloured by distance from the camera through Turbo over
    [0, vmax] [m], far points first so the nearest point of a pixel shows. Returns a new (H, W, 3) uint8 image."""
    img = np.asarray(image)[..., :3].copy()
    h, w = img.shape[:2]
    idx = np.nonzero(proj.visible)[0]
    idx = idx[np.argsort(-proj.distance[idx], kind="stable")]
    u = np.floor(proj.pixels[idx, 0]).astype(np.int64)
    v = np.floor(proj.pixels[idx, 1]).astype(np.int64)
    col = turbo_colors(np.maximum(proj.distance[idx], 1e-6 * vmax), vmax)
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            uu, vv = u + dx, v + dy
            ok = (uu >= 0) & (uu < w) & (vv >= 0) & (vv < h)
            img[vv[ok], uu[ok]] = col[ok]
    return img


__all__ = [
    "Box", "Figure", "LidarOnCamera", "camera_figure", "crop_bounds", "draw_lidar_points", "font",
    "lidar_point_instances", "lidar_point_times", "nice_ceil", "nice_ticks", "panorama_figure", "project_lidar",
    "semantic_legend", "tick_labels", "topdown_figure", "turbo_ramp", "wrap_text",
]
