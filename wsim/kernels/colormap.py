"""Colormaps on the device."""

import warp as wp


@wp.func
def turbo(x: float) -> wp.vec3:
    """Google's Turbo colormap (polynomial fit), x in [0, 1] (clamped) → linear-display RGB in [0, 1]."""
    x = wp.clamp(x, 0.0, 1.0)
    x2 = x * x
    x3 = x2 * x
    x4 = x2 * x2
    x5 = x4 * x
    r = 0.13572138 + 4.61539260 * x - 42.66032258 * x2 + 132.13108234 * x3 - 152.94239396 * x4 + 59.28637943 * x5
    g = 0.09140261 + 2.19418839 * x + 4.84296658 * x2 - 14.18503333 * x3 + 4.27729857 * x4 + 2.82956604 * x5
    b = 0.10667330 + 12.64194608 * x - 60.58204836 * x2 + 110.36276771 * x3 - 89.90310912 * x4 + 27.34824973 * x5
    return wp.vec3(wp.clamp(r, 0.0, 1.0), wp.clamp(g, 0.0, 1.0), wp.clamp(b, 0.0, 1.0))


@wp.kernel
def colorize_turbo_kernel(values: wp.array[float], vmax: float, out: wp.array2d[wp.uint8]):
    """RGB8 of ``values / vmax`` through Turbo; values <= 0 (no hit) become black."""
    i = wp.tid()
    v = values[i]
    if v <= 0.0:
        out[i, 0] = wp.uint8(0)
        out[i, 1] = wp.uint8(0)
        out[i, 2] = wp.uint8(0)
        return
    c = turbo(v / vmax)
    out[i, 0] = wp.uint8(int(c[0] * 255.0 + 0.5))
    out[i, 1] = wp.uint8(int(c[1] * 255.0 + 0.5))
    out[i, 2] = wp.uint8(int(c[2] * 255.0 + 0.5))
