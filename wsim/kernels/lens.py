"""Camera lens models and rolling-shutter timing on the device (NuRec / AlpaSim camera conventions).

Conventions (docs/spec camera.md):

- Camera axes are OpenCV's: x right, y down, z forward. Image coordinates have (0, 0) at the top-left corner of the
  first pixel; pixel (row i, column j) has its centre at (j + 0.5, i + 0.5).
- ``project`` maps a camera-frame ray (any length) to a pixel (u, v) and a validity flag; ``unproject`` maps a pixel to
  a unit camera-frame ray and a validity flag. Lens models: f-theta, OpenCV pinhole (rational + tangential + thin
  prism), OpenCV fisheye; an optional bivariate windshield distortion is applied to the ray before the lens on
  projection and after it on unprojection.
- The host-side lens dataclasses (:mod:`wsim.sensors.lens`) pack every model into one :class:`LensParams` struct
  (f-theta principal point already shifted by +0.5 to the corner origin; a missing non-reference polynomial already
  fitted; ``max_angle`` already derived where the source left it unset).

Rolling shutter (NCore convention): the relative time of a pixel in [0, 1] is ``floor(v)/(H-1)`` top-to-bottom,
``floor(u)/(W-1)`` left-to-right, ``(H - ceil(v))/(H-1)`` bottom-to-top, ``(W - ceil(u))/(W-1)`` right-to-left, 0 for a
global shutter. The camera-to-world pose at relative time τ is :func:`wsim.kernels.pose.lerp_pose` of the frame's start
and end poses. :func:`project_rolling` solves the rolling-shutter projection of a (possibly moving) world point.
"""

import warp as wp

from .pose import lerp_pose

vec6 = wp.types.vector(length=6, dtype=wp.float32)
vec28 = wp.types.vector(length=28, dtype=wp.float32)

#: Lens model codes of :attr:`LensParams.model`.
MODEL_FTHETA = wp.constant(0)
MODEL_OPENCV_PINHOLE = wp.constant(1)
MODEL_OPENCV_FISHEYE = wp.constant(2)

#: Shutter codes (values of :class:`wsim.sensors.camera.ShutterType` that reach the device).
SHUTTER_GLOBAL = wp.constant(0)
SHUTTER_TOP_TO_BOTTOM = wp.constant(1)
SHUTTER_LEFT_TO_RIGHT = wp.constant(2)
SHUTTER_BOTTOM_TO_TOP = wp.constant(3)
SHUTTER_RIGHT_TO_LEFT = wp.constant(4)

#: Rolling-shutter point projection: stop when the pixel moves less than this [px] or after ``RS_MAX_ITERS``.
RS_TOL_PX = wp.constant(1.0e-3)
RS_MAX_ITERS = wp.constant(10)

#: OpenCV pinhole unprojection (Newton): target re-projection residual [px] and step limit.
PINHOLE_TOL_PX = wp.constant(1.0e-4)
PINHOLE_MAX_ITERS = wp.constant(20)
#: Iterative unprojections (pinhole, fisheye) report a pixel invalid when their solution re-projects farther from it
#: than ``UNPROJECT_OK_PX`` [px] + ``UNPROJECT_OK_REL`` × its distance from the principal point (float32 rounding
#: grows with it): no solution inside the lens's valid range, or no convergence.
UNPROJECT_OK_PX = wp.constant(1.0e-3)
UNPROJECT_OK_REL = wp.constant(1.0e-6)

#: 1-D inversions (f-theta polynomials, fisheye θ(δ)): bracketed Newton, stopped when a step is below this relative
#: size (about two float32 ulps) or after this many steps.
SOLVE_REL_TOL = wp.constant(2.5e-7)
SOLVE_MAX_ITERS = wp.constant(40)
#: Windshield inversion (2-D Newton): stop below this step [rad] or after this many steps.
WS_TOL_RAD = wp.constant(1.0e-7)
WS_MAX_ITERS = wp.constant(12)


@wp.struct
class LensParams:
    """One lens (any model) plus optional windshield, at the render resolution.

    Attributes:
        model: ``MODEL_FTHETA``, ``MODEL_OPENCV_PINHOLE`` or ``MODEL_OPENCV_FISHEYE``.
        width: Image width [px]. height: Image height [px].
        pp: Principal point [px], corner origin (f-theta: the stored pixel-centre value + 0.5).
        focal: (fx, fy) [px] (OpenCV models).
        fw: F-theta angle→pixel-distance polynomial (ascending powers, zero-padded) [px/rad^k].
        bw: F-theta pixel-distance→angle polynomial [rad/px^k].
        fw_reference: 1 if ``fw`` is the reference (projection evaluates it, unprojection inverts it by Newton),
            0 if ``bw`` is (projection inverts ``bw`` by Newton starting at ``fw``).
        lin: F-theta linear term A = [[c, d], [e, 1]]. lin_inv: A⁻¹.
        max_angle: Largest valid angle off the optical axis [rad] (f-theta and fisheye).
        radial: (k1..k6) pinhole or (k1..k4, 0, 0) fisheye. tangential: (p1, p2). prism: (s1..s4).
        ws_enabled: 1 if a windshield distortion is applied.
        ws_forward_reference: 1 if the distorting polynomials (``ws_h``, ``ws_v``) are the reference, 0 if the
            undistorting ones (``ws_h_inv``, ``ws_v_inv``) are; the other pair is a starting guess refined by Newton.
        ws_h, ws_v, ws_h_inv, ws_v_inv: Bivariate coefficients grouped by power of θ; ws_*_n: their degrees N
            (-1 for "absent": the Newton solve then starts at the identity).
    """

    model: wp.int32
    width: wp.int32
    height: wp.int32
    pp: wp.vec2
    focal: wp.vec2
    fw: vec6
    bw: vec6
    fw_reference: wp.int32
    lin: wp.mat22
    lin_inv: wp.mat22
    max_angle: float
    radial: vec6
    tangential: wp.vec2
    prism: wp.vec4
    ws_enabled: wp.int32
    ws_forward_reference: wp.int32
    ws_h: vec28
    ws_v: vec28
    ws_h_inv: vec28
    ws_v_inv: vec28
    ws_h_n: wp.int32
    ws_v_n: wp.int32
    ws_h_inv_n: wp.int32
    ws_v_inv_n: wp.int32


# ---------------------------------------------------------------------------------------------------------------------
# polynomials


@wp.func
def poly6(c: vec6, x: float) -> float:
    """Σ c_k x^k (Horner)."""
    r = c[5]
    for k in range(4, -1, -1):
        r = r * x + c[k]
    return r


@wp.func
def poly6_deriv(c: vec6, x: float) -> float:
    """d/dx Σ c_k x^k."""
    r = 5.0 * c[5]
    for k in range(4, 0, -1):
        r = r * x + float(k) * c[k]
    return r


@wp.func
def poly6_solve(c: vec6, y: float, x0: float, lo: float, hi: float) -> float:
    """x in [lo, hi] with Σ c_k x^k = y, for a polynomial increasing on [lo, hi]: Newton from ``x0``, bisecting the
    bracket where a step would leave it; stops when a step is below float32 resolution or after ``SOLVE_MAX_ITERS``.
    A y outside the polynomial's range on the bracket gives the nearer end."""
    a = lo
    b = hi
    x = wp.clamp(x0, lo, hi)
    for _ in range(SOLVE_MAX_ITERS):
        f = poly6(c, x) - y
        if f == 0.0:
            break
        if f > 0.0:
            b = x
        else:
            a = x
        d = poly6_deriv(c, x)
        xn = x - f / wp.where(d > 0.0, d, 1.0)
        if not (d > 0.0 and xn >= a and xn <= b):
            xn = 0.5 * (a + b)
        step = wp.abs(xn - x)
        x = xn
        if step <= SOLVE_REL_TOL * wp.abs(x):
            break
    return x


@wp.func
def bivariate(c: vec28, n: int, phi: float, theta: float) -> wp.vec3:
    """Bivariate polynomial P(φ, θ) = Σ_j Σ_{i ≤ n-j} c_ij φ^i θ^j (grouped by power of θ) and its partial
    derivatives: returns (P, ∂P/∂φ, ∂P/∂θ)."""
    val = float(0.0)
    dphi = float(0.0)
    dth = float(0.0)
    k = int(0)
    thj = float(1.0)  # θ^j
    thj1 = float(0.0)  # j θ^(j-1)
    for j in range(n + 1):
        phi_i = float(1.0)  # φ^i
        phi_i1 = float(0.0)  # i φ^(i-1)
        for i in range(n + 1 - j):
            ck = c[k]
            val += ck * phi_i * thj
            dphi += ck * phi_i1 * thj
            dth += ck * phi_i * thj1
            phi_i1 = float(i + 1) * phi_i
            phi_i = phi_i * phi
            k += 1
        thj1 = float(j + 1) * thj
        thj = thj * theta
    return wp.vec3(val, dphi, dth)


@wp.func
def bivariate_map(ch: vec28, nh: int, cv: vec28, nv: int, phi: float, theta: float) -> wp.vec2:
    """(P_h(φ, θ), P_v(φ, θ)); a degree of -1 means the identity for that component."""
    a = phi
    b = theta
    if nh >= 0:
        a = bivariate(ch, nh, phi, theta)[0]
    if nv >= 0:
        b = bivariate(cv, nv, phi, theta)[0]
    return wp.vec2(a, b)


@wp.func
def bivariate_solve(ch: vec28, nh: int, cv: vec28, nv: int, target: wp.vec2, start: wp.vec2) -> wp.vec2:
    """(φ, θ) with (P_h, P_v)(φ, θ) = target by 2-D Newton from ``start``, until a step is < ``WS_TOL_RAD`` or after
    ``WS_MAX_ITERS`` steps."""
    x = start
    for _ in range(WS_MAX_ITERS):
        h = bivariate(ch, nh, x[0], x[1])
        w = bivariate(cv, nv, x[0], x[1])
        det = h[1] * w[2] - h[2] * w[1]
        if not (wp.abs(det) > 1.0e-12):
            break
        rh = h[0] - target[0]
        rv = w[0] - target[1]
        step = wp.vec2((w[2] * rh - h[2] * rv) / det, (-w[1] * rh + h[1] * rv) / det)
        x = x - step
        if wp.length(step) < WS_TOL_RAD:
            break
    return x


# ---------------------------------------------------------------------------------------------------------------------
# windshield


@wp.func
def windshield_angles_to_ray(a: wp.vec2, zsign: float) -> wp.vec3:
    sx = wp.sin(a[0])
    sy = wp.sin(a[1])
    return wp.vec3(sx, sy, zsign * wp.sqrt(wp.max(0.0, 1.0 - sx * sx - sy * sy)))


@wp.func
def windshield_distort(lens: LensParams, ray: wp.vec3) -> wp.vec3:
    """External ray → ray behind the windshield (the distorting polynomials, or Newton on the undistorting ones)."""
    n = wp.normalize(ray)
    zsign = wp.where(n[2] < 0.0, -1.0, 1.0)
    a = wp.vec2(wp.asin(wp.clamp(n[0], -1.0, 1.0)), wp.asin(wp.clamp(n[1], -1.0, 1.0)))
    b = wp.vec2()
    if lens.ws_forward_reference != 0:
        b = bivariate_map(lens.ws_h, lens.ws_h_n, lens.ws_v, lens.ws_v_n, a[0], a[1])
    else:
        guess = bivariate_map(lens.ws_h, lens.ws_h_n, lens.ws_v, lens.ws_v_n, a[0], a[1])
        b = bivariate_solve(lens.ws_h_inv, lens.ws_h_inv_n, lens.ws_v_inv, lens.ws_v_inv_n, a, guess)
    return windshield_angles_to_ray(b, zsign)


@wp.func
def windshield_undistort(lens: LensParams, ray: wp.vec3) -> wp.vec3:
    """Ray behind the windshield → external ray (inverse of :func:`windshield_distort`)."""
    n = wp.normalize(ray)
    zsign = wp.where(n[2] < 0.0, -1.0, 1.0)
    b = wp.vec2(wp.asin(wp.clamp(n[0], -1.0, 1.0)), wp.asin(wp.clamp(n[1], -1.0, 1.0)))
    a = wp.vec2()
    if lens.ws_forward_reference != 0:
        guess = bivariate_map(lens.ws_h_inv, lens.ws_h_inv_n, lens.ws_v_inv, lens.ws_v_inv_n, b[0], b[1])
        a = bivariate_solve(lens.ws_h, lens.ws_h_n, lens.ws_v, lens.ws_v_n, b, guess)
    else:
        a = bivariate_map(lens.ws_h_inv, lens.ws_h_inv_n, lens.ws_v_inv, lens.ws_v_inv_n, b[0], b[1])
    return windshield_angles_to_ray(a, zsign)


# ---------------------------------------------------------------------------------------------------------------------
# lens models


@wp.func
def inside_image(lens: LensParams, uv: wp.vec2) -> bool:
    return uv[0] >= 0.0 and uv[1] >= 0.0 and uv[0] < float(lens.width) and uv[1] < float(lens.height)


@wp.func
def ftheta_project(lens: LensParams, p: wp.vec3) -> wp.vec3:
    """(u, v, valid) of a camera-frame point with the f-theta model."""
    rho = wp.sqrt(p[0] * p[0] + p[1] * p[1])
    theta_raw = wp.atan2(rho, p[2])
    theta = wp.min(theta_raw, lens.max_angle)
    delta = poly6(lens.fw, theta)
    if lens.fw_reference == 0:
        delta = poly6_solve(lens.bw, theta, delta, 0.0, 1.0e7)
    # δ/ρ, with its limit fw'(0)/z on the optical axis
    scale = float(0.0)
    if rho > 1.0e-8 * wp.abs(p[2]):
        scale = delta / rho
    elif p[2] > 0.0:
        scale = wp.where(lens.fw_reference == 0, 1.0 / lens.bw[1], lens.fw[1]) / p[2]
    uv = lens.lin * (scale * wp.vec2(p[0], p[1])) + lens.pp
    ok = theta_raw < lens.max_angle and inside_image(lens, uv)
    return wp.vec3(uv[0], uv[1], wp.where(ok, 1.0, 0.0))


@wp.func
def ftheta_unproject(lens: LensParams, uv: wp.vec2) -> wp.vec4:
    """(unit ray, valid) of a pixel with the f-theta model."""
    q = lens.lin_inv * (uv - lens.pp)
    r = wp.length(q)
    if r < 1.0e-6:
        return wp.vec4(0.0, 0.0, 1.0, 1.0)
    theta = float(0.0)
    if lens.fw_reference == 0:
        theta = poly6(lens.bw, r)
    else:
        theta = poly6_solve(lens.fw, r, poly6(lens.bw, r), 0.0, lens.max_angle)
    s = wp.sin(theta) / r
    ok = theta < lens.max_angle and theta >= 0.0
    return wp.vec4(s * q[0], s * q[1], wp.cos(theta), wp.where(ok, 1.0, 0.0))


@wp.struct
class PinholeEval:
    """OpenCV rational + tangential + thin-prism model at an undistorted normalised point x: the distorted point is
    x' = x + ``corr`` (corr = x·(d − 1) + Δ, kept apart from x so it is not rounded at the scale of x), ``jac`` =
    ∂x'/∂x, ``d`` = the radial factor."""

    corr: wp.vec2
    jac: wp.mat22
    d: float


@wp.func
def pinhole_eval(lens: LensParams, x: wp.vec2) -> PinholeEval:
    """x' − x and ∂x'/∂x (analytic) of x' = x·d(r²) + Δ(x), d = (1 + k1r² + k2r⁴ + k3r⁶)/(1 + k4r² + k5r⁴ + k6r⁶),
    Δx = 2p1xy + p2(r² + 2x²) + s1r² + s2r⁴, Δy = p1(r² + 2y²) + 2p2xy + s3r² + s4r⁴."""
    k = lens.radial
    p1 = lens.tangential[0]
    p2 = lens.tangential[1]
    s = lens.prism
    r2 = x[0] * x[0] + x[1] * x[1]
    den = 1.0 + r2 * (k[3] + r2 * (k[4] + r2 * k[5]))
    dm1 = r2 * ((k[0] - k[3]) + r2 * ((k[1] - k[4]) + r2 * (k[2] - k[5]))) / den  # d − 1 = (num − den)/den
    d = 1.0 + dm1
    dnum = k[0] + r2 * (2.0 * k[1] + r2 * 3.0 * k[2])  # ∂num/∂r²
    dden = k[3] + r2 * (2.0 * k[4] + r2 * 3.0 * k[5])
    dd = (dnum - d * dden) / den  # ∂d/∂r²
    xy = x[0] * x[1]
    px = s[0] + s[1] * r2  # prism Δx = r²·(s1 + s2r²)
    py = s[2] + s[3] * r2
    dpx = s[0] + 2.0 * s[1] * r2  # ∂(r²·(s1 + s2r²))/∂r²
    dpy = s[2] + 2.0 * s[3] * r2
    out = PinholeEval()
    out.d = d
    out.corr = wp.vec2(x[0] * dm1 + 2.0 * p1 * xy + p2 * (r2 + 2.0 * x[0] * x[0]) + r2 * px,
                       x[1] * dm1 + p1 * (r2 + 2.0 * x[1] * x[1]) + 2.0 * p2 * xy + r2 * py)
    # ∂r²/∂x_j = 2x_j
    a00 = d + 2.0 * x[0] * x[0] * dd + 2.0 * p1 * x[1] + 6.0 * p2 * x[0] + 2.0 * x[0] * dpx
    a01 = 2.0 * xy * dd + 2.0 * p1 * x[0] + 2.0 * p2 * x[1] + 2.0 * x[1] * dpx
    a10 = 2.0 * xy * dd + 2.0 * p1 * x[0] + 2.0 * p2 * x[1] + 2.0 * x[0] * dpy
    a11 = d + 2.0 * x[1] * x[1] * dd + 6.0 * p1 * x[1] + 2.0 * p2 * x[0] + 2.0 * x[1] * dpy
    out.jac = wp.mat22(a00, a01, a10, a11)
    return out


@wp.func
def pinhole_project(lens: LensParams, p: wp.vec3) -> wp.vec3:
    z = p[2]
    zs = wp.where(wp.abs(z) > 1.0e-12, z, 1.0e-12)
    x = wp.vec2(p[0] / zs, p[1] / zs)
    e = pinhole_eval(lens, x)
    uv = wp.vec2(lens.focal[0] * (x[0] + e.corr[0]) + lens.pp[0], lens.focal[1] * (x[1] + e.corr[1]) + lens.pp[1])
    ok = z > 0.0 and e.d > 0.8 and e.d < 1.2 and inside_image(lens, uv)
    return wp.vec3(uv[0], uv[1], wp.where(ok, 1.0, 0.0))


@wp.func
def pinhole_unproject(lens: LensParams, uv: wp.vec2) -> wp.vec4:
    """Newton on x'(x) = x₀ with the analytic 2×2 Jacobian, from x = x₀: stops when the re-projection residual is
    < ``PINHOLE_TOL_PX``, when a step no longer reduces it (float32 rounding), or after ``PINHOLE_MAX_ITERS`` steps;
    a step that would increase a residual above ``UNPROJECT_OK_PX`` is halved (up to 10 times). Valid iff 0.8 < d < 1.2
    at the solution and it re-projects within ``UNPROJECT_OK_PX`` (+ ``UNPROJECT_OK_REL``) of the pixel."""
    x0 = wp.vec2((uv[0] - lens.pp[0]) / lens.focal[0], (uv[1] - lens.pp[1]) / lens.focal[1])
    fs = wp.max(lens.focal[0], lens.focal[1])  # normalised → pixel units of the residual
    x = x0
    e = pinhole_eval(lens, x)
    r = e.corr  # residual x' − x₀ = (x − x₀) + corr, exact in the first term near the solution
    res = wp.length(r) * fs
    for _ in range(PINHOLE_MAX_ITERS):
        if res < PINHOLE_TOL_PX:
            break
        det = wp.determinant(e.jac)
        if not (wp.abs(det) > 1.0e-12):
            break
        step = wp.vec2(e.jac[1, 1] * r[0] - e.jac[0, 1] * r[1], -e.jac[1, 0] * r[0] + e.jac[0, 0] * r[1]) / det
        xn = x - step
        en = pinhole_eval(lens, xn)
        vn = (xn - x0) + en.corr
        rn = wp.length(vn) * fs
        if not (rn < res) and res > UNPROJECT_OK_PX:  # overshoot far from the solution: backtrack
            for _h in range(10):
                step = 0.5 * step
                xn = x - step
                en = pinhole_eval(lens, xn)
                vn = (xn - x0) + en.corr
                rn = wp.length(vn) * fs
                if rn < res:
                    break
        if not (rn < res):
            break
        x = xn
        e = en
        r = vn
        res = rn
    ray = wp.normalize(wp.vec3(x[0], x[1], 1.0))
    ok = e.d > 0.8 and e.d < 1.2 and res < UNPROJECT_OK_PX + UNPROJECT_OK_REL * wp.length(x0) * fs
    return wp.vec4(ray[0], ray[1], ray[2], wp.where(ok, 1.0, 0.0))


@wp.func
def fisheye_delta(k: vec6, theta: float) -> float:
    t2 = theta * theta
    return theta * (1.0 + t2 * (k[0] + t2 * (k[1] + t2 * (k[2] + t2 * k[3]))))


@wp.func
def fisheye_delta_deriv(k: vec6, theta: float) -> float:
    t2 = theta * theta
    return 1.0 + t2 * (3.0 * k[0] + t2 * (5.0 * k[1] + t2 * (7.0 * k[2] + t2 * 9.0 * k[3])))


@wp.func
def fisheye_project(lens: LensParams, p: wp.vec3) -> wp.vec3:
    rho = wp.sqrt(p[0] * p[0] + p[1] * p[1])
    theta_raw = wp.atan2(rho, p[2])
    theta = wp.min(theta_raw, lens.max_angle)
    scale = float(0.0)
    if rho > 1.0e-8 * wp.abs(p[2]):
        scale = fisheye_delta(lens.radial, theta) / rho
    elif p[2] > 0.0:
        scale = 1.0 / p[2]
    uv = wp.vec2(lens.focal[0] * scale * p[0] + lens.pp[0], lens.focal[1] * scale * p[1] + lens.pp[1])
    ok = theta_raw < lens.max_angle and inside_image(lens, uv)
    return wp.vec3(uv[0], uv[1], wp.where(ok, 1.0, 0.0))


@wp.func
def fisheye_unproject(lens: LensParams, uv: wp.vec2) -> wp.vec4:
    """θ with δ(θ) = r by Newton bracketed in [0, max_angle] (δ increases there: ``max_angle`` is capped where it
    stops increasing), bisecting where a step would leave the bracket; stops when a step is below float32 resolution
    or after ``SOLVE_MAX_ITERS``. Valid iff θ < max_angle and δ(θ) re-projects within ``UNPROJECT_OK_PX``
    (+ ``UNPROJECT_OK_REL``) of the pixel (pixels beyond δ(max_angle) have no ray)."""
    q = wp.vec2((uv[0] - lens.pp[0]) / lens.focal[0], (uv[1] - lens.pp[1]) / lens.focal[1])
    r = wp.length(q)
    if r < 1.0e-9:
        return wp.vec4(0.0, 0.0, 1.0, 1.0)
    a = float(0.0)
    b = lens.max_angle
    theta = wp.min(r, lens.max_angle)
    for _ in range(SOLVE_MAX_ITERS):
        f = fisheye_delta(lens.radial, theta) - r
        if f == 0.0:
            break
        if f > 0.0:
            b = theta
        else:
            a = theta
        dd = fisheye_delta_deriv(lens.radial, theta)
        tn = theta - f / wp.where(dd > 0.0, dd, 1.0)
        if not (dd > 0.0 and tn >= a and tn <= b):
            tn = 0.5 * (a + b)
        step = wp.abs(tn - theta)
        theta = tn
        if step <= SOLVE_REL_TOL * theta:
            break
    s = wp.sin(theta) / r
    fs = wp.max(lens.focal[0], lens.focal[1])
    res = wp.abs(fisheye_delta(lens.radial, theta) - r) * fs
    ok = theta >= 0.0 and theta < lens.max_angle and res < UNPROJECT_OK_PX + UNPROJECT_OK_REL * r * fs
    return wp.vec4(s * q[0], s * q[1], wp.cos(theta), wp.where(ok, 1.0, 0.0))


@wp.func
def project(lens: LensParams, p: wp.vec3) -> wp.vec3:
    """Camera-frame point or ray ``p`` → (u, v, valid) with valid 1.0/0.0 (windshield first, then the lens)."""
    q = p
    if lens.ws_enabled != 0:
        q = windshield_distort(lens, p) * wp.length(p)
    if lens.model == MODEL_FTHETA:
        return ftheta_project(lens, q)
    if lens.model == MODEL_OPENCV_PINHOLE:
        return pinhole_project(lens, q)
    return fisheye_project(lens, q)


@wp.func
def unproject(lens: LensParams, uv: wp.vec2) -> wp.vec4:
    """Pixel (u, v) [px] → (unit camera-frame ray x, y, z, valid 1.0/0.0) (the lens, then the windshield)."""
    r = wp.vec4()
    if lens.model == MODEL_FTHETA:
        r = ftheta_unproject(lens, uv)
    elif lens.model == MODEL_OPENCV_PINHOLE:
        r = pinhole_unproject(lens, uv)
    else:
        r = fisheye_unproject(lens, uv)
    if lens.ws_enabled != 0:
        d = windshield_undistort(lens, wp.vec3(r[0], r[1], r[2]))
        return wp.vec4(d[0], d[1], d[2], r[3])
    return r


# ---------------------------------------------------------------------------------------------------------------------
# rolling shutter


@wp.func
def relative_time(shutter: int, width: int, height: int, uv: wp.vec2) -> float:
    """Relative exposure time in [0, 1] of the pixel containing (u, v) (NCore convention; clamped)."""
    tau = float(0.0)
    if shutter == SHUTTER_TOP_TO_BOTTOM:
        tau = wp.floor(uv[1]) / float(wp.max(height - 1, 1))
    elif shutter == SHUTTER_LEFT_TO_RIGHT:
        tau = wp.floor(uv[0]) / float(wp.max(width - 1, 1))
    elif shutter == SHUTTER_BOTTOM_TO_TOP:
        tau = (float(height) - wp.ceil(uv[1])) / float(wp.max(height - 1, 1))
    elif shutter == SHUTTER_RIGHT_TO_LEFT:
        tau = (float(width) - wp.ceil(uv[0])) / float(wp.max(width - 1, 1))
    return wp.clamp(tau, 0.0, 1.0)


@wp.func
def project_world(lens: LensParams, cam_to_world: wp.transform, p_world: wp.vec3) -> wp.vec4:
    """(u, v, valid, depth z [m]) of a world point seen from a camera-to-world pose.

    The camera-frame point is R⁻¹·(p − t): the camera translation is subtracted before rotating, so the result keeps
    the precision of the (small) camera-relative offset wherever the world origin is."""
    pc = wp.quat_rotate_inv(wp.transform_get_rotation(cam_to_world), p_world - wp.transform_get_translation(cam_to_world))
    r = project(lens, pc)
    return wp.vec4(r[0], r[1], r[2], pc[2])


@wp.func
def point_at(local: wp.vec3, obj0: wp.transform, obj1: wp.transform, tau: float) -> wp.vec3:
    """A point fixed in an object's frame, in the world at relative time τ (object pose lerp/slerp)."""
    return wp.transform_point(lerp_pose(obj0, obj1, tau), local)


@wp.func
def solve_rolling_tau(
    lens: LensParams, shutter: int, cam0: wp.transform, cam1: wp.transform, local: wp.vec3, obj0: wp.transform,
    obj1: wp.transform,
) -> wp.vec2:
    """Relative time τ at which a (possibly moving) point is imaged, and 1/0 whether the start- or end-pose
    projection is valid. Iterates τ = rel_time(pixel(τ)) from the start pose (the end pose if only that one is valid)
    until the pixel moves < ``RS_TOL_PX`` or ``RS_MAX_ITERS`` iterations."""
    r0 = project_world(lens, cam0, point_at(local, obj0, obj1, 0.0))
    if shutter == SHUTTER_GLOBAL:
        return wp.vec2(0.0, r0[2])
    r1 = project_world(lens, cam1, point_at(local, obj0, obj1, 1.0))
    any_valid = wp.where(r0[2] > 0.0 or r1[2] > 0.0, 1.0, 0.0)
    uv = wp.vec2(r0[0], r0[1])
    tau = float(0.0)
    if r0[2] <= 0.0 and r1[2] > 0.0:
        uv = wp.vec2(r1[0], r1[1])
        tau = 1.0
    for _ in range(RS_MAX_ITERS):
        tau_new = relative_time(shutter, lens.width, lens.height, uv)
        r = project_world(lens, lerp_pose(cam0, cam1, tau_new), point_at(local, obj0, obj1, tau_new))
        uv_new = wp.vec2(r[0], r[1])
        moved = wp.length(uv_new - uv)
        uv = uv_new
        tau = tau_new
        if moved < RS_TOL_PX:
            break
    return wp.vec2(tau, any_valid)


@wp.func
def shift_pose(pose: wp.transform, origin: wp.vec3) -> wp.transform:
    """The pose with ``origin`` subtracted from its translation (into a frame whose origin is at ``origin``)."""
    return wp.transform(wp.transform_get_translation(pose) - origin, wp.transform_get_rotation(pose))


@wp.kernel
def project_points_kernel(
    lens: LensParams,
    shutter: int,
    cam_poses: wp.array[wp.transform],
    t0: float,
    t1: float,
    points: wp.array[wp.vec3],
    points_origin: wp.vec3,
    point_object: wp.array[wp.int32],
    object_poses: wp.array2d[wp.transform],
    objects_origin: wp.vec3,
    offset: int,
    pixels: wp.array[wp.vec2],
    depths: wp.array[float],
    times: wp.array[float],
    valid: wp.array[wp.int32],
):
    """Rolling-shutter projection of points. ``points[i]`` is in world coordinates if ``point_object[i] < 0``, else in
    the frame of object k = ``point_object[i]`` whose pose at the frame start/end is ``object_poses[k, 0/1]``.
    Outputs: pixel (u, v) [px], camera-frame depth z [m], time [s], validity.

    Frames: ``cam_poses`` are given in a working frame near the camera (its origin at world position o, chosen by the
    host so that the numbers stay small); world points are ``points[i] − points_origin`` and object translations
    ``object_poses[k, j].t − objects_origin`` in that frame (the host passes 0 for inputs it already shifted in float64,
    o for Warp arrays in world coordinates).

    The solve for τ is not differentiated (τ is piecewise constant); the outputs are one projection at τ, so gradients
    reach the camera and object poses and the points."""
    i = wp.tid() + offset
    cam0 = cam_poses[0]
    cam1 = cam_poses[1]
    obj0 = wp.transform(-points_origin, wp.quat_identity())
    obj1 = obj0
    k = point_object[i]
    if k >= 0:
        obj0 = shift_pose(object_poses[k, 0], objects_origin)
        obj1 = shift_pose(object_poses[k, 1], objects_origin)
    sol = solve_rolling_tau(lens, shutter, cam0, cam1, points[i], obj0, obj1)
    tau = sol[0]
    r = project_world(lens, lerp_pose(cam0, cam1, tau), point_at(points[i], obj0, obj1, tau))
    pixels[i] = wp.vec2(r[0], r[1])
    depths[i] = r[3]
    times[i] = t0 + tau * (t1 - t0)
    ok = int(0)
    if r[2] > 0.0 and sol[1] > 0.0:
        ok = 1
    valid[i] = ok


@wp.kernel
def unproject_kernel(lens: LensParams, pixels: wp.array[wp.vec2], offset: int, rays: wp.array[wp.vec3],
                     valid: wp.array[wp.int32]):
    """Camera-frame unit rays of pixels (u, v) [px]."""
    i = wp.tid() + offset
    r = unproject(lens, pixels[i])
    rays[i] = wp.vec3(r[0], r[1], r[2])
    valid[i] = wp.where(r[3] > 0.0, 1, 0)


@wp.kernel
def relative_time_kernel(shutter: int, width: int, height: int, pixels: wp.array[wp.vec2], offset: int,
                         tau: wp.array[float]):
    i = wp.tid() + offset
    tau[i] = relative_time(shutter, width, height, pixels[i])
