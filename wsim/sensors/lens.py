"""Camera lens models as small typed dataclasses (field names of the sensorsim ``CameraSpec``).

- :class:`FThetaLens`, :class:`OpenCVPinholeLens`, :class:`OpenCVFisheyeLens`: intrinsics at their native resolution.
- :class:`BivariateWindshield`: external (windshield) distortion, applied to the ray before the lens on projection.

Every model validates itself on construction and raises :class:`ValueError` naming the offending field. ``rescaled``
returns the model at another resolution (sensorsim-api.md "Resolution"). ``to_warp`` packs a lens (and windshield) into
the :class:`wsim.kernels.lens.LensParams` struct used by the kernels.

Windshield ``reference_poly`` (public implementations disagree; this is wsim's choice): the field names keep their
meaning whatever the reference is. ``horizontal_poly``/``vertical_poly`` always *distort* (external ray angles →
angles behind the windshield, used when projecting) and ``*_inverse`` always *undistort* (used when unprojecting).
``reference_poly`` says which pair is exact: FORWARD = the distorting pair (unprojection starts at the inverse pair and
refines with Newton on the distorting pair), BACKWARD = the undistorting pair (projection starts at the distorting pair
and refines with Newton on the inverse pair). Project and unproject are thus exact inverses of each other, as for the
f-theta reference polynomial.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any

import numpy as np
import warp as wp

from ..kernels import lens as _k


class PolynomialType(IntEnum):
    """F-theta reference polynomial (sensorsim ``PolynomialType``)."""

    UNKNOWN = 0
    PIXELDIST_TO_ANGLE = 1
    ANGLE_TO_PIXELDIST = 2


class WindshieldReference(IntEnum):
    """Which windshield polynomial pair is exact (sensorsim ``BivariateWindshieldModelParameters.reference_poly``)."""

    FORWARD = 0
    BACKWARD = 1


_TRIANGULAR = {(n + 1) * (n + 2) // 2: n for n in range(7)}  # coefficient count → degree N (N ≤ 6)


def _floats(name: str, values: Any, counts: Sequence[int] | None = None, max_count: int | None = None) -> tuple:
    try:
        vals = tuple(float(v) for v in (values if values is not None else ()))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: expected a list of numbers, got {values!r}") from e
    if counts is not None and len(vals) not in counts:
        raise ValueError(f"{name}: expected {' or '.join(map(str, counts))} coefficients, got {len(vals)}")
    if max_count is not None and len(vals) > max_count:
        raise ValueError(f"{name}: at most {max_count} coefficients, got {len(vals)}")
    if not all(math.isfinite(v) for v in vals):
        raise ValueError(f"{name}: non-finite coefficient in {list(vals)}")
    return vals


def _finite(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: expected a number, got {value!r}") from e
    if not math.isfinite(v):
        raise ValueError(f"{name}: must be finite, got {v}")
    return v


def _resolution(width: Any, height: Any) -> tuple[int, int]:
    for name, v in (("width", width), ("height", height)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise ValueError(f"{name}: expected an integer number of pixels, got {v!r}")
        if v <= 0 or v > 65536:
            raise ValueError(f"{name}: must be in [1, 65536] pixels, got {v}")
    return int(width), int(height)


def _pad(c: Sequence[float], n: int) -> list[float]:
    return list(c) + [0.0] * (n - len(c))


def _poly(c: Sequence[float], x: np.ndarray) -> np.ndarray:
    return np.polynomial.polynomial.polyval(x, np.asarray(c, np.float64)) if len(c) else np.zeros_like(x)


def _fit_inverse(c: Sequence[float], x_max: float, degree: int = 5) -> tuple[float, ...]:
    """Least-squares polynomial (no constant term) of the inverse of y = Σ c_k x^k over x in [0, x_max]."""
    x = np.linspace(0.0, x_max, 2000)
    y = _poly(c, x)
    a = np.stack([y**k for k in range(1, degree + 1)], 1)
    sol = np.linalg.lstsq(a, x, rcond=None)[0]
    return (0.0, *[float(v) for v in sol])


class _Lens:
    """Shared behaviour of the lens dataclasses."""

    width: int
    height: int

    @property
    def resolution(self) -> tuple[int, int]:
        """(width, height) [px]."""
        return self.width, self.height

    @classmethod
    def from_calibration(cls, calibration: Any) -> _Lens:
        """The lens of a :class:`wsim.scene.CameraCalibration` (its ``model`` must match this class, or call
        :func:`lens_from_calibration` to dispatch on it)."""
        lens = lens_from_calibration(calibration)
        if cls is not _Lens and not isinstance(lens, cls):
            raise ValueError(f"model: calibration {calibration.logical_id!r} is {calibration.model!r}, not {cls.__name__}")
        return lens


@dataclass(frozen=True)
class FThetaLens(_Lens):
    """F-theta lens (NuRec ``FthetaCameraParam``).

    Attributes:
        width, height: Native resolution [px].
        principal_point_x, principal_point_y: Principal point [px], **pixel-centre origin** (as NuRec stores it).
        reference_poly: Which polynomial is exact; UNKNOWN picks PIXELDIST_TO_ANGLE when that polynomial is given.
        pixeldist_to_angle_poly: Backward polynomial θ(r) [rad], ascending powers, ≤ 6 coefficients.
        angle_to_pixeldist_poly: Forward polynomial r(θ) [px], ascending powers, ≤ 6 coefficients. The non-reference
            polynomial may be empty: it is then fitted to the inverse of the reference one (it only seeds Newton).
        max_angle: Largest valid angle off the optical axis [rad]; ≤ 0 derives it from the image corners.
        linear_cde: (c, d, e) of A = [[c, d], [e, 1]]; (0, 0, 0) means the default (1, 0, 0).
    """

    width: int
    height: int
    principal_point_x: float
    principal_point_y: float
    pixeldist_to_angle_poly: tuple[float, ...] = ()
    angle_to_pixeldist_poly: tuple[float, ...] = ()
    reference_poly: PolynomialType = PolynomialType.PIXELDIST_TO_ANGLE
    max_angle: float = 0.0
    linear_cde: tuple[float, float, float] = (1.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        w, h = _resolution(self.width, self.height)
        set_ = object.__setattr__
        set_(self, "principal_point_x", _finite("principal_point_x", self.principal_point_x))
        set_(self, "principal_point_y", _finite("principal_point_y", self.principal_point_y))
        bw = _floats("pixeldist_to_angle_poly", self.pixeldist_to_angle_poly, max_count=6)
        fw = _floats("angle_to_pixeldist_poly", self.angle_to_pixeldist_poly, max_count=6)
        set_(self, "pixeldist_to_angle_poly", bw)
        set_(self, "angle_to_pixeldist_poly", fw)
        try:
            ref = PolynomialType(self.reference_poly) if not isinstance(self.reference_poly, str) else \
                PolynomialType[self.reference_poly.upper()]
        except (KeyError, ValueError) as e:
            raise ValueError(f"reference_poly: unknown polynomial type {self.reference_poly!r}") from e
        if ref == PolynomialType.UNKNOWN:
            ref = PolynomialType.PIXELDIST_TO_ANGLE if bw else PolynomialType.ANGLE_TO_PIXELDIST
        set_(self, "reference_poly", ref)
        if ref == PolynomialType.PIXELDIST_TO_ANGLE and not any(bw):
            raise ValueError("pixeldist_to_angle_poly: empty polynomial (it is the reference polynomial)")
        if ref == PolynomialType.ANGLE_TO_PIXELDIST and not any(fw):
            raise ValueError("angle_to_pixeldist_poly: empty polynomial (it is the reference polynomial)")
        set_(self, "max_angle", _finite("max_angle", self.max_angle))
        cde = _floats("linear_cde", self.linear_cde, counts=(0, 3))
        if not cde or not any(cde):
            cde = (1.0, 0.0, 0.0)
        if abs(cde[0] - cde[1] * cde[2]) < 1e-12:
            raise ValueError(f"linear_cde: singular linear term {list(cde)}")
        set_(self, "linear_cde", cde)
        del w, h

    def rescaled(self, width: int, height: int) -> FThetaLens:
        """This lens at another resolution: pp' = (pp + 0.5)·s − 0.5, backward coefficient k ÷ s_y^k, forward × s_y,
        c and d × s_x/s_y, max_angle unchanged."""
        width, height = _resolution(width, height)
        if (width, height) == (self.width, self.height):
            return self
        sx, sy = width / self.width, height / self.height
        c, d, e = self.linear_cde
        return replace(
            self, width=width, height=height,
            principal_point_x=(self.principal_point_x + 0.5) * sx - 0.5,
            principal_point_y=(self.principal_point_y + 0.5) * sy - 0.5,
            pixeldist_to_angle_poly=tuple(k / sy**i for i, k in enumerate(self.pixeldist_to_angle_poly)),
            angle_to_pixeldist_poly=tuple(k * sy for k in self.angle_to_pixeldist_poly),
            linear_cde=(c * sx / sy, d * sx / sy, e),
        )

    def _a(self) -> np.ndarray:
        c, d, e = self.linear_cde
        return np.array([[c, d], [e, 1.0]])

    def _polys(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(backward, forward) with the missing non-reference one fitted."""
        bw, fw = self.pixeldist_to_angle_poly, self.angle_to_pixeldist_poly
        r_max = float(np.hypot(self.width, self.height))
        if self.reference_poly == PolynomialType.PIXELDIST_TO_ANGLE:
            if not any(fw):
                fw = _fit_inverse(bw, r_max)
        elif not any(bw):
            th = np.linspace(0, np.pi, 2000)
            r = _poly(fw, th)
            inc = np.nonzero(np.diff(r) <= 0)[0]
            th_max = th[inc[0]] if len(inc) else np.pi
            bw = _fit_inverse(fw, th_max)
            del r
        return bw, fw

    def effective_max_angle(self) -> float:
        """``max_angle`` if set (> 0), else the largest angle over the four image corners [rad]."""
        if self.max_angle > 0:
            return self.max_angle
        bw, fw = self._polys()
        ainv = np.linalg.inv(self._a())
        pp = np.array([self.principal_point_x + 0.5, self.principal_point_y + 0.5])
        corners = np.array([[0, 0], [self.width, 0], [0, self.height], [self.width, self.height]], float)
        r = np.linalg.norm((corners - pp) @ ainv.T, axis=1)
        if self.reference_poly == PolynomialType.PIXELDIST_TO_ANGLE:
            th = _poly(bw, r)
        else:
            th = _poly(bw, r)
            for _ in range(20):
                th = th - (_poly(fw, th) - r) / _poly(np.polynomial.polynomial.polyder(fw), th)
        # just past the farthest corner, so corner pixels stay valid
        return float(np.max(th)) * (1.0 + 1e-6) + 1e-6

    def to_warp(self, windshield: BivariateWindshield | None = None) -> _k.LensParams:
        """The kernel struct of this lens (and windshield)."""
        p = _base_struct(self.width, self.height, windshield)
        bw, fw = self._polys()
        p.model = _k.MODEL_FTHETA
        p.pp = wp.vec2(self.principal_point_x + 0.5, self.principal_point_y + 0.5)
        p.fw = _k.vec6(*_pad(fw, 6))
        p.bw = _k.vec6(*_pad(bw, 6))
        p.fw_reference = 1 if self.reference_poly == PolynomialType.ANGLE_TO_PIXELDIST else 0
        a = self._a()
        p.lin = wp.mat22(*a.reshape(-1))
        p.lin_inv = wp.mat22(*np.linalg.inv(a).reshape(-1))
        p.max_angle = self.effective_max_angle()
        return p


class _OpenCVIntrinsics:
    """Principal point and focal lengths [px] shared by the OpenCV lens models."""

    def rescaled(self, width: int, height: int):
        """This lens at another resolution (principal point and focal lengths × s per axis)."""
        width, height = _resolution(width, height)
        sx, sy = width / self.width, height / self.height
        return replace(self, width=width, height=height, principal_point_x=self.principal_point_x * sx,
                       principal_point_y=self.principal_point_y * sy, focal_length_x=self.focal_length_x * sx,
                       focal_length_y=self.focal_length_y * sy)


def _check_focal(lens) -> None:
    for name in ("principal_point_x", "principal_point_y", "focal_length_x", "focal_length_y"):
        object.__setattr__(lens, name, _finite(name, getattr(lens, name)))
    for name in ("focal_length_x", "focal_length_y"):
        if getattr(lens, name) <= 0:
            raise ValueError(f"{name}: must be positive, got {getattr(lens, name)}")


@dataclass(frozen=True)
class OpenCVPinholeLens(_OpenCVIntrinsics, _Lens):
    """OpenCV pinhole lens with rational radial, tangential and thin-prism distortion (``OpenCVPinholeCameraParam``).

    Attributes:
        width, height: Native resolution [px].
        principal_point_x, principal_point_y: (cx, cy) [px], corner origin (as OpenCV).
        focal_length_x, focal_length_y: (fx, fy) [px].
        radial_coeffs: (k1..k6); 0, 3 (k1..k3) or 6 values. tangential_coeffs: (p1, p2); 0 or 2.
        thin_prism_coeffs: (s1..s4); 0 or 4.
    """

    width: int
    height: int
    principal_point_x: float
    principal_point_y: float
    focal_length_x: float
    focal_length_y: float
    radial_coeffs: tuple[float, ...] = ()
    tangential_coeffs: tuple[float, ...] = ()
    thin_prism_coeffs: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        _resolution(self.width, self.height)
        set_ = object.__setattr__
        _check_focal(self)
        set_(self, "radial_coeffs", _floats("radial_coeffs", self.radial_coeffs, counts=(0, 3, 6)))
        set_(self, "tangential_coeffs", _floats("tangential_coeffs", self.tangential_coeffs, counts=(0, 2)))
        set_(self, "thin_prism_coeffs", _floats("thin_prism_coeffs", self.thin_prism_coeffs, counts=(0, 4)))

    @property
    def dist_coeffs(self) -> np.ndarray:
        """OpenCV's 12-vector (k1, k2, p1, p2, k3, k4, k5, k6, s1, s2, s3, s4)."""
        k = _pad(self.radial_coeffs, 6)
        p = _pad(self.tangential_coeffs, 2)
        s = _pad(self.thin_prism_coeffs, 4)
        return np.array([k[0], k[1], p[0], p[1], k[2], k[3], k[4], k[5], *s])

    @property
    def camera_matrix(self) -> np.ndarray:
        """3×3 intrinsic matrix K."""
        return np.array([[self.focal_length_x, 0, self.principal_point_x], [0, self.focal_length_y,
                                                                            self.principal_point_y], [0, 0, 1.0]])

    def to_warp(self, windshield: BivariateWindshield | None = None) -> _k.LensParams:
        p = _base_struct(self.width, self.height, windshield)
        p.model = _k.MODEL_OPENCV_PINHOLE
        p.pp = wp.vec2(self.principal_point_x, self.principal_point_y)
        p.focal = wp.vec2(self.focal_length_x, self.focal_length_y)
        p.radial = _k.vec6(*_pad(self.radial_coeffs, 6))
        p.tangential = wp.vec2(*_pad(self.tangential_coeffs, 2))
        p.prism = wp.vec4(*_pad(self.thin_prism_coeffs, 4))
        p.max_angle = math.pi
        return p


@dataclass(frozen=True)
class OpenCVFisheyeLens(_OpenCVIntrinsics, _Lens):
    """OpenCV fisheye (equidistant with θ-polynomial) lens (``OpenCVFisheyeCameraParam``).

    Attributes:
        width, height: Native resolution [px].
        principal_point_x, principal_point_y: (cx, cy) [px], corner origin.
        focal_length_x, focal_length_y: (fx, fy) [px].
        radial_coeffs: (k1..k4); 0 or 4 values.
        max_angle: Largest valid angle off the optical axis [rad]; ≤ 0 derives it from the image corners.
    """

    width: int
    height: int
    principal_point_x: float
    principal_point_y: float
    focal_length_x: float
    focal_length_y: float
    radial_coeffs: tuple[float, ...] = ()
    max_angle: float = 0.0

    def __post_init__(self) -> None:
        _resolution(self.width, self.height)
        set_ = object.__setattr__
        _check_focal(self)
        set_(self, "max_angle", _finite("max_angle", self.max_angle))
        set_(self, "radial_coeffs", _floats("radial_coeffs", self.radial_coeffs, counts=(0, 4)))

    def _delta(self, th: np.ndarray) -> np.ndarray:
        k = _pad(self.radial_coeffs, 4)
        t2 = th * th
        return th * (1 + k[0] * t2 + k[1] * t2**2 + k[2] * t2**3 + k[3] * t2**4)

    def effective_max_angle(self) -> float:
        """``max_angle`` if set (> 0), else the angle of the farthest image corner (capped where δ(θ) stops
        increasing) [rad]."""
        th = np.linspace(0, np.pi, 20001)
        dl = self._delta(th)
        dec = np.nonzero(np.diff(dl) <= 0)[0]
        mono = th[dec[0]] if len(dec) else np.pi
        if self.max_angle > 0:
            return min(self.max_angle, mono)
        corners = np.array([[0, 0], [self.width, 0], [0, self.height], [self.width, self.height]], float)
        q = (corners - [self.principal_point_x, self.principal_point_y]) / [self.focal_length_x, self.focal_length_y]
        r = float(np.linalg.norm(q, axis=1).max())
        sel = th <= mono
        idx = np.searchsorted(dl[sel], r)
        if idx >= sel.sum():
            return float(mono)
        return float(min(mono, th[sel][idx] * (1 + 1e-6) + 1e-6))

    def to_warp(self, windshield: BivariateWindshield | None = None) -> _k.LensParams:
        p = _base_struct(self.width, self.height, windshield)
        p.model = _k.MODEL_OPENCV_FISHEYE
        p.pp = wp.vec2(self.principal_point_x, self.principal_point_y)
        p.focal = wp.vec2(self.focal_length_x, self.focal_length_y)
        p.radial = _k.vec6(*_pad(self.radial_coeffs, 6))
        p.max_angle = self.effective_max_angle()
        return p


@dataclass(frozen=True)
class BivariateWindshield:
    """Bivariate windshield distortion (``BivariateWindshieldModelParameters``).

    With n the unit ray, φ = asin(n_x), θ = asin(n_y): the distorted angles are φ' = P_h(φ, θ), θ' = P_v(φ, θ), where
    P(φ, θ) = Σ_j Σ_{i ≤ N−j} c_ij φ^i θ^j, coefficients grouped by power of θ; the count (N+1)(N+2)/2 gives N (≤ 6).
    See the module docstring for ``reference_poly``. The reference pair must be given; the other pair may be empty
    (Newton then starts at the identity).

    Attributes:
        horizontal_poly, vertical_poly: Distorting polynomials (external → behind the windshield).
        horizontal_poly_inverse, vertical_poly_inverse: Undistorting polynomials.
        reference_poly: :class:`WindshieldReference` (FORWARD = the distorting pair is exact).
    """

    horizontal_poly: tuple[float, ...] = ()
    vertical_poly: tuple[float, ...] = ()
    horizontal_poly_inverse: tuple[float, ...] = ()
    vertical_poly_inverse: tuple[float, ...] = ()
    reference_poly: WindshieldReference = WindshieldReference.FORWARD

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        try:
            ref = WindshieldReference[self.reference_poly.upper()] if isinstance(self.reference_poly, str) else \
                WindshieldReference(self.reference_poly)
        except (KeyError, ValueError) as e:
            raise ValueError(f"reference_poly: unknown windshield reference {self.reference_poly!r}") from e
        set_(self, "reference_poly", ref)
        counts = tuple(sorted(_TRIANGULAR))
        for name in ("horizontal_poly", "vertical_poly", "horizontal_poly_inverse", "vertical_poly_inverse"):
            vals = _floats(name, getattr(self, name))
            if vals and len(vals) not in _TRIANGULAR:
                raise ValueError(f"{name}: coefficient count must be (N+1)(N+2)/2 for N ≤ 6 {counts}, got {len(vals)}")
            set_(self, name, vals)
        ref_names = (("horizontal_poly", "vertical_poly") if ref == WindshieldReference.FORWARD
                     else ("horizontal_poly_inverse", "vertical_poly_inverse"))
        for name in ref_names:
            if not getattr(self, name):
                raise ValueError(f"{name}: empty polynomial (it belongs to the reference pair {ref.name})")

    @staticmethod
    def degree(coeffs: Sequence[float]) -> int:
        """N of a coefficient list, -1 when empty."""
        return _TRIANGULAR[len(coeffs)] if coeffs else -1

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> BivariateWindshield:
        """From a dict with the field names (``reference_poly`` as a name or number)."""
        known = {"horizontal_poly", "vertical_poly", "horizontal_poly_inverse", "vertical_poly_inverse",
                 "reference_poly"}
        return cls(**{k: v for k, v in params.items() if k in known})

    def fill(self, p: _k.LensParams) -> None:
        p.ws_enabled = 1
        p.ws_forward_reference = 1 if self.reference_poly == WindshieldReference.FORWARD else 0
        for attr, coeffs in (("ws_h", self.horizontal_poly), ("ws_v", self.vertical_poly),
                             ("ws_h_inv", self.horizontal_poly_inverse), ("ws_v_inv", self.vertical_poly_inverse)):
            setattr(p, attr, _k.vec28(*_pad(coeffs, 28)))
            setattr(p, attr + "_n", self.degree(coeffs))


Lens = FThetaLens | OpenCVPinholeLens | OpenCVFisheyeLens


def _base_struct(width: int, height: int, windshield: BivariateWindshield | None) -> _k.LensParams:
    p = _k.LensParams()
    p.width = int(width)
    p.height = int(height)
    p.focal = wp.vec2(1.0, 1.0)
    p.lin = wp.mat22(1.0, 0.0, 0.0, 1.0)
    p.lin_inv = wp.mat22(1.0, 0.0, 0.0, 1.0)
    p.max_angle = math.pi
    p.ws_enabled = 0
    p.ws_h_n = p.ws_v_n = p.ws_h_inv_n = p.ws_v_inv_n = -1
    if windshield is not None:
        windshield.fill(p)
    return p


_MODEL_ALIASES = {"ftheta": "ftheta", "f_theta": "ftheta", "fthetacameraparam": "ftheta", "ftheta_param": "ftheta",
                  "opencv_pinhole": "opencv_pinhole", "pinhole": "opencv_pinhole",
                  "opencv_pinhole_param": "opencv_pinhole", "opencv_fisheye": "opencv_fisheye",
                  "fisheye": "opencv_fisheye", "opencv_fisheye_param": "opencv_fisheye"}

_WINDSHIELD_KEYS = ("bivariate_windshield_model_param", "external_distortion", "windshield")


def lens_from_params(model: str, params: Mapping[str, Any], resolution: Sequence[int]) -> Lens:
    """A lens from a model name (``ftheta``, ``opencv_pinhole``, ``opencv_fisheye``), a parameter dict with the
    CameraSpec field names, and the native (width, height).

    ``linear_cde`` may be a (c, d, e) list or a dict ``{linear_c, linear_d, linear_e}``; ``reference_poly`` a name or
    number. Unknown keys are ignored (e.g. the windshield entry; see :func:`windshield_from_params`).

    Raises:
        ValueError: Unknown model, or a malformed field (the message names it).
    """
    key = _MODEL_ALIASES.get(str(model).lower())
    if key is None:
        raise ValueError(f"model: unknown camera model {model!r} (ftheta, opencv_pinhole, opencv_fisheye)")
    try:
        w, h = (int(resolution[0]), int(resolution[1]))
    except (TypeError, ValueError, IndexError) as e:
        raise ValueError(f"resolution: expected (width, height), got {resolution!r}") from e
    p = dict(params)

    def need(name: str) -> Any:
        if name not in p:
            raise ValueError(f"{name}: missing")
        return p[name]

    if key == "ftheta":
        cde = p.get("linear_cde", (1.0, 0.0, 0.0))
        if isinstance(cde, Mapping):
            cde = (cde.get("linear_c", 0.0), cde.get("linear_d", 0.0), cde.get("linear_e", 0.0))
        return FThetaLens(w, h, need("principal_point_x"), need("principal_point_y"),
                          tuple(p.get("pixeldist_to_angle_poly", ()) or ()),
                          tuple(p.get("angle_to_pixeldist_poly", ()) or ()),
                          p.get("reference_poly", PolynomialType.PIXELDIST_TO_ANGLE),
                          float(p.get("max_angle", 0.0) or 0.0), tuple(cde or ()))
    if key == "opencv_pinhole":
        return OpenCVPinholeLens(w, h, need("principal_point_x"), need("principal_point_y"), need("focal_length_x"),
                                 need("focal_length_y"), tuple(p.get("radial_coeffs", ()) or ()),
                                 tuple(p.get("tangential_coeffs", ()) or ()),
                                 tuple(p.get("thin_prism_coeffs", ()) or ()))
    return OpenCVFisheyeLens(w, h, need("principal_point_x"), need("principal_point_y"), need("focal_length_x"),
                             need("focal_length_y"), tuple(p.get("radial_coeffs", ()) or ()),
                             float(p.get("max_angle", 0.0) or 0.0))


def windshield_from_params(params: Mapping[str, Any]) -> BivariateWindshield | None:
    """The windshield entry of a calibration's params (``bivariate_windshield_model_param``, ``external_distortion``
    or ``windshield``), or None."""
    for k in _WINDSHIELD_KEYS:
        if params.get(k):
            return BivariateWindshield.from_params(params[k])
    return None


def lens_from_calibration(calibration: Any) -> Lens:
    """The lens of a :class:`wsim.scene.CameraCalibration` at its native resolution."""
    return lens_from_params(calibration.model, calibration.params, calibration.resolution)


__all__ = [
    "BivariateWindshield", "FThetaLens", "Lens", "OpenCVFisheyeLens", "OpenCVPinholeLens", "PolynomialType",
    "WindshieldReference", "lens_from_calibration", "lens_from_params", "windshield_from_params",
]
