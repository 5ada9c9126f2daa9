"""Texture sampling on the device."""

import warp as wp


@wp.func
def texel(texels: wp.array[wp.vec3], info: wp.vec4i, x: int, y: int) -> wp.vec3:
    w = info[1]
    h = info[2]
    xi = x - (x // w) * w  # repeat
    yi = y - (y // h) * h
    return texels[info[0] + yi * w + xi]


@wp.func
def sample_texture(texels: wp.array[wp.vec3], info: wp.vec4i, uv: wp.vec2) -> wp.vec3:
    """Bilinear, repeating lookup of texture ``info`` = (texel offset, width, height, enabled) at USD ``st``
    coordinates (origin at the image's bottom-left corner); linear RGB."""
    fx = uv[0] * float(info[1]) - 0.5
    fy = (1.0 - uv[1]) * float(info[2]) - 0.5
    x0 = int(wp.floor(fx))
    y0 = int(wp.floor(fy))
    ax = fx - float(x0)
    ay = fy - float(y0)
    a = texel(texels, info, x0, y0)
    b = texel(texels, info, x0 + 1, y0)
    c = texel(texels, info, x0, y0 + 1)
    d = texel(texels, info, x0 + 1, y0 + 1)
    return (a * (1.0 - ax) + b * ax) * (1.0 - ay) + (c * (1.0 - ax) + d * ax) * ay
