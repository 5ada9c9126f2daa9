"""A small Gauss–Newton / Levenberg–Marquardt least-squares solver with autodiff Jacobians and robust losses.

:func:`least_squares` minimises ``C(x) = ½ Σ ρ(r_i(x)²)`` over a parameter vector ``x`` (P,), for a residual
function ``r`` (P,) → (N,) written in torch (it may call the differentiable renders of :mod:`wsim.torch`). Each
iteration linearises the residuals, ``r(x + δ) ≈ r + J δ``, weights them for the robust loss (iteratively reweighted
least squares: ``w_i = ρ'(r_i²)``) and solves the damped normal equations
``(Jᵀ W J + λ D) δ = −Jᵀ W r`` (Marquardt: ``D = diag(Jᵀ W J)``). The step is accepted when the robust cost
decreases; λ follows Nielsen's schedule (the gain ratio of the actual to the predicted decrease).

Jacobians (:class:`JacobianMode`) — all from autodiff, none from finite differences:

- ``FORWARD``: ``torch.func.jacfwd`` (P forward-mode passes, vectorised). For residuals written in plain torch —
  e.g. point-to-plane residuals against a rendered surface whose correspondences are re-selected between steps
  (:mod:`wsim.autodiff.residuals`). The Warp-backed autograd functions of :mod:`wsim.torch` have no forward mode
  (Warp tapes are reverse-only) and do not take part in ``torch.func`` transforms.
- ``ROWS``: one reverse pass for the whole Jacobian, for *row-separable* residuals (residual ``i`` depends only on
  its own data and on ``x``). The residual function is called with one copy of the parameters per row, an (N, P)
  tensor (or (N, k) for the parameters listed in ``columns``), and the gradient of ``Σ r_i`` w.r.t. the copies is
  the Jacobian, row by row. This goes through the Warp bridges whose inputs are per row — e.g.
  :func:`wsim.torch.project_points` (points) — in one tape backward, and gives sparse Jacobians (each row depending
  on a few of many parameters) without forming an N × P matrix.
- ``REVERSE``: one reverse pass per residual (``torch.autograd.functional.jacobian``). Works through every bridge,
  the lidar's included (whose pose, angle and reflectance inputs are shared by every return, so a reverse pass gives
  only the sum over returns): N tape backwards, for small problems.
- A callable ``x → J`` (N, P).

Robust losses (:class:`RobustLoss`, scale ``k`` in the residuals' unit): ``LINEAR`` ρ(s) = s; ``HUBER``
ρ(s) = s for √s ≤ k, 2k√s − k² beyond (weights 1, k/|r|); ``CAUCHY`` ρ(s) = k² log(1 + s/k²) (weights
1 / (1 + r²/k²)). The scale may be a function of the iteration (to shrink it as the fit converges).

Correspondences: ``reselect(x)``, when given, is called at the start and after each accepted step, before the
residuals are linearised: it may re-select the residuals' correspondence set (which returns are matched to which
surface, which points are on smooth surfaces), which then stays fixed while trial steps are evaluated, so the cost
compared between the current point and a trial point is one smooth function.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch

__all__ = ["JacobianMode", "Method", "RobustLoss", "Iteration", "SolveResult", "least_squares", "jacobian",
           "robust_weights", "robust_cost"]


class RobustLoss(Enum):
    """The loss ρ applied to each squared residual."""

    LINEAR = "linear"
    HUBER = "huber"
    CAUCHY = "cauchy"


class JacobianMode(Enum):
    """How the Jacobian of the residuals is computed (module docstring)."""

    FORWARD = "forward"
    ROWS = "rows"
    REVERSE = "reverse"


class Method(Enum):
    """``LEVENBERG_MARQUARDT``: damped steps with Nielsen's damping schedule. ``GAUSS_NEWTON``: undamped steps,
    halved until the cost decreases (at most 10 times)."""

    LEVENBERG_MARQUARDT = "lm"
    GAUSS_NEWTON = "gn"


@dataclass
class Iteration:
    """One iteration of :func:`least_squares`.

    Attributes:
        iteration: Index (0-based).
        x: (P,) float64 parameters after the iteration (the accepted step's end, else unchanged).
        cost: Robust cost ``½ Σ ρ(r²)`` at the linearisation point (before the step), in residual units².
        new_cost: Cost after the accepted step (same correspondence set); ``cost`` if no step was accepted.
        gradient_norm: ‖Jᵀ W r‖∞ at the linearisation point.
        step_norm: ‖δ / x_scale‖∞ of the last step tried.
        damping: λ after the iteration.
        accepted: Whether a step was accepted.
        residuals: Number of residuals N.
        loss_scale: Robust loss scale used.
        seconds: Wall time of the iteration [s] (Jacobian, solves, trial evaluations, re-selection).
    """

    iteration: int
    x: torch.Tensor
    cost: float
    new_cost: float
    gradient_norm: float
    step_norm: float
    damping: float
    accepted: bool
    residuals: int
    loss_scale: float
    seconds: float


@dataclass
class SolveResult:
    """What :func:`least_squares` returns.

    Attributes:
        x: (P,) float64 solution.
        cost: Robust cost at ``x`` (with the last correspondence set).
        converged: Whether a tolerance was met (else the iteration limit stopped it).
        reason: Why it stopped: ``"step"``, ``"gradient"``, ``"cost"``, ``"no decrease"`` or ``"max_iterations"``.
        iterations: Number of iterations run.
        history: One :class:`Iteration` per iteration.
        normal_matrix: (P, P) Jᵀ W J at the last linearisation (its inverse times the residual variance
            approximates the covariance of ``x``).
    """

    x: torch.Tensor
    cost: float
    converged: bool
    reason: str
    iterations: int
    history: list[Iteration] = field(default_factory=list)
    normal_matrix: torch.Tensor | None = None


def robust_weights(r: torch.Tensor, loss: RobustLoss, scale: float) -> torch.Tensor:
    """IRLS weights ``ρ'(r²)`` (N,) of residuals ``r`` (N,) for ``loss`` with scale ``scale`` (residual units)."""
    if loss is RobustLoss.LINEAR:
        return torch.ones_like(r)
    a = r.abs()
    if loss is RobustLoss.HUBER:
        return torch.where(a <= scale, torch.ones_like(r), scale / a.clamp_min(1e-300))
    return 1.0 / (1.0 + (r / scale) ** 2)


def robust_cost(r: torch.Tensor, loss: RobustLoss, scale: float) -> float:
    """``½ Σ ρ(r²)`` (float) of residuals ``r`` (N,)."""
    s = r.double() ** 2
    if loss is RobustLoss.LINEAR:
        rho = s
    elif loss is RobustLoss.HUBER:
        a = s.sqrt()
        rho = torch.where(a <= scale, s, 2.0 * scale * a - scale ** 2)
    else:
        rho = scale ** 2 * torch.log1p(s / scale ** 2)
    return 0.5 * float(rho.sum())


def _rows_input(x: torch.Tensor, n: int | None, columns: torch.Tensor | None) -> torch.Tensor:
    if columns is not None:
        return x[columns]
    return x[None] if n is None else x.expand(n, x.shape[0])


def _evaluate(fun: Callable, x: torch.Tensor, mode: JacobianMode, columns: torch.Tensor | None) -> torch.Tensor:
    """Residuals at ``x`` (no graph), as the function returns them ((N,) or (N, m)), in float64."""
    with torch.no_grad():
        r = fun(_rows_input(x, None, columns) if mode is JacobianMode.ROWS else x)
    return torch.as_tensor(r).detach().double()


def jacobian(fun: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
             mode: JacobianMode | str = JacobianMode.FORWARD, *, columns: torch.Tensor | None = None,
             n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Residuals and their Jacobian at ``x`` by autodiff.

    Args:
        fun: Residual function (see :func:`least_squares` for its contract in each mode).
        x: (P,) float64 parameters.
        mode: A :class:`JacobianMode` (or its value).
        columns: ROWS only: (N, k) int64 indices of the parameters each row depends on (default: all P).
        n: ROWS only, without ``columns``: the number of parameter rows N (evaluated once when not given).

    Returns:
        ``(r (M,) float64, J)``: J is (M, P) float64, or with ``columns`` (M, k):
        ``J[i, a] = ∂r_i/∂x[columns[i, a]]``. M = N, except in ROWS mode with (N, m) residual blocks (m per
        parameter row, one reverse pass each): M = N·m, row-major.
    """
    mode = JacobianMode(mode)
    x = x.detach().double()
    if mode is JacobianMode.FORWARD:
        jac = torch.func.jacfwd(lambda v: fun(v).double().reshape(-1))(x)
        return _evaluate(fun, x, mode, None).reshape(-1), jac.reshape(-1, x.shape[0])
    if mode is JacobianMode.ROWS:
        if columns is None and n is None:
            n = int(_evaluate(fun, x, mode, None).shape[0])
        xr = _rows_input(x, n, columns).clone().requires_grad_(True)
        with torch.enable_grad():
            r = fun(xr).double()
            if r.shape[0] != xr.shape[0] or r.dim() > 2:
                raise ValueError(f"ROWS: the residual function returned {tuple(r.shape)} residuals for "
                                 f"{xr.shape[0]} parameter rows (expected (N,) or (N, m))")
            rm = r.reshape(r.shape[0], -1)
            blocks = []
            for c in range(rm.shape[1]):  # one reverse pass per residual component of a row
                (g,) = torch.autograd.grad(rm[:, c].sum(), xr, retain_graph=c + 1 < rm.shape[1], allow_unused=True)
                blocks.append(torch.zeros_like(xr) if g is None else g)
        return r.detach().reshape(-1), torch.stack(blocks, 1).reshape(-1, xr.shape[1]).detach()
    # REVERSE: one reverse pass per residual (through any autograd function, Warp bridges included)
    with torch.enable_grad():
        xg = x.clone().requires_grad_(True)
        r = fun(xg).double().reshape(-1)
        rows = []
        for i in range(r.shape[0]):
            (gi,) = torch.autograd.grad(r[i], xg, retain_graph=i + 1 < r.shape[0], allow_unused=True)
            rows.append(torch.zeros_like(x) if gi is None else gi)
    return r.detach(), (torch.stack(rows) if rows else torch.zeros((0, x.shape[0]), dtype=x.dtype))


def _normal_equations(J: torch.Tensor, columns: torch.Tensor | None, w: torch.Tensor, r: torch.Tensor,
                      p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``A = Jᵀ W J`` (P, P) and ``g = Jᵀ W r`` (P,) from a dense or a row-sparse Jacobian."""
    if columns is None:
        wj = J * w[:, None]
        return J.T @ wj, wj.T @ r
    k = columns.shape[1]
    a = torch.zeros((p, p), dtype=J.dtype)
    g = torch.zeros(p, dtype=J.dtype)
    wr = w * r
    for i in range(k):
        g.index_add_(0, columns[:, i], J[:, i] * wr)
        wji = w * J[:, i]
        for j in range(k):
            a.index_put_((columns[:, i], columns[:, j]), wji * J[:, j], accumulate=True)
    return a, g


def least_squares(
    fun: Callable[[torch.Tensor], torch.Tensor],
    x0: torch.Tensor,
    *,
    jacobian_mode: JacobianMode | str | Callable[[torch.Tensor], torch.Tensor] = JacobianMode.FORWARD,
    columns: torch.Tensor | Callable[[], torch.Tensor] | None = None,
    loss: RobustLoss | str = RobustLoss.LINEAR,
    loss_scale: float | Callable[[int], float] = 1.0,
    method: Method | str = Method.LEVENBERG_MARQUARDT,
    max_iterations: int = 50,
    step_tolerance: float = 1e-10,
    gradient_tolerance: float = 1e-12,
    cost_tolerance: float = 1e-12,
    x_scale: torch.Tensor | None = None,
    damping: float = 1e-3,
    reselect: Callable[[torch.Tensor], None] | None = None,
    callback: Callable[[Iteration], None] | None = None,
) -> SolveResult:
    """Minimise ``½ Σ ρ(r_i(x)²)`` by Levenberg–Marquardt (or Gauss–Newton) with autodiff Jacobians.

    Args:
        fun: Residual function. FORWARD / REVERSE / callable Jacobian: ``x`` (P,) float64 → (N,) residuals.
            ROWS: parameter rows (R, P) — or (R, k), ``x[columns]`` — → (N,), row ``i`` of the result depending only
            on row ``i`` of the input; it is called with R = 1 (broadcast over the rows) or R = N without
            ``columns``, and with R = N with them. It may return (N, m) (m residuals per row, e.g. a pixel's u and
            v: m reverse passes). The residuals may be float32 or float64, on the CPU.
        x0: (P,) initial parameters (copied to float64).
        jacobian_mode: A :class:`JacobianMode` (or its value), or a callable ``x → J`` (N, P).
        columns: ROWS only: (N, k) int64 parameter indices per row (a sparse Jacobian), or a callable returning
            them for the current correspondence set (called after ``reselect``).
        loss: :class:`RobustLoss` (or its value).
        loss_scale: Robust scale k [residual unit], or a function of the iteration index.
        method: :class:`Method` (or its value).
        max_iterations: Iteration limit (each: one Jacobian, one or more trial evaluations).
        step_tolerance: Stop when ‖δ / x_scale‖∞ falls below it.
        gradient_tolerance: Stop when ‖Jᵀ W r‖∞ falls below it.
        cost_tolerance: Stop when an accepted step decreases the cost by less than this fraction of it.
        x_scale: (P,) typical magnitudes of the parameters for the step tolerance (default 1; the Marquardt scaling
            makes the steps themselves independent of the parameters' units).
        damping: Initial λ (relative to ``diag(Jᵀ W J)``); ignored by GAUSS_NEWTON.
        reselect: Called with ``x`` (P,) at the start and after every accepted step, before the linearisation: it
            may re-select the residuals' correspondences (held fixed while trial steps are evaluated).
        callback: Called with each :class:`Iteration`.

    Returns:
        A :class:`SolveResult` with the solution, the stop reason and the per-iteration history.
    """
    loss = RobustLoss(loss)
    method = Method(method)
    custom_jac = callable(jacobian_mode) and not isinstance(jacobian_mode, JacobianMode)
    mode = JacobianMode.FORWARD if custom_jac else JacobianMode(jacobian_mode)
    x = torch.as_tensor(x0).detach().clone().double().reshape(-1)
    p = x.shape[0]
    xs = torch.ones(p, dtype=torch.float64) if x_scale is None else torch.as_tensor(x_scale, dtype=torch.float64)
    scale_of = loss_scale if callable(loss_scale) else (lambda _it: float(loss_scale))
    cols: torch.Tensor | None = None

    def refresh(xc: torch.Tensor) -> None:
        nonlocal cols
        if reselect is not None:
            reselect(xc.clone())
        if mode is JacobianMode.ROWS and columns is not None:
            cols = torch.as_tensor(columns() if callable(columns) else columns, dtype=torch.int64)
            if cols.dim() == 1:
                cols = cols[:, None]

    def trial(xc: torch.Tensor) -> tuple[torch.Tensor, int]:
        rr = _evaluate(fun, xc, mode, cols)
        return rr.reshape(-1), int(rr.shape[0]) if rr.dim() else 1

    refresh(x)
    n_rows: int | None = None  # ROWS without columns: N, when known for the current correspondence set
    lam, nu = float(damping), 2.0
    history: list[Iteration] = []
    reason, converged = "max_iterations", False
    cost = math.inf
    a = None
    for it in range(max_iterations):
        t_it = time.perf_counter()
        k = float(scale_of(it))
        if custom_jac:
            r = trial(x)[0]
            J = torch.as_tensor(jacobian_mode(x.clone()), dtype=torch.float64)
        else:
            r, J = jacobian(fun, x, mode, columns=cols, n=n_rows)
        if not bool(torch.isfinite(r).all()) or not bool(torch.isfinite(J).all()):
            raise ValueError("least_squares: non-finite residuals or Jacobian at the linearisation point")
        cost = robust_cost(r, loss, k)
        w = robust_weights(r, loss, k)
        jcols = None
        if mode is JacobianMode.ROWS and cols is not None:  # (N, m) residual blocks: m rows per parameter row
            jcols = cols.repeat_interleave(r.shape[0] // cols.shape[0], 0)
        a, g = _normal_equations(J, jcols, w, r, p)
        gnorm = float(g.abs().max()) if p else 0.0
        if gnorm <= gradient_tolerance:
            history.append(Iteration(it, x.clone(), cost, cost, gnorm, 0.0, lam, False, r.shape[0], k,
                                     time.perf_counter() - t_it))
            if callback is not None:
                callback(history[-1])
            reason, converged = "gradient", True
            break
        # parameters no residual depends on (a zero column of J) keep their value
        act = a.diag() > 1e-14 * float(a.diag().max().clamp_min(1e-300))
        aa, ga = a[act][:, act], g[act]
        d = aa.diag()
        accepted, new_cost, snorm = False, cost, 0.0
        stop_step = False
        for attempt in range(30 if method is Method.LEVENBERG_MARQUARDT else 11):
            step = torch.zeros(p, dtype=torch.float64)
            if method is Method.LEVENBERG_MARQUARDT:
                step[act] = -torch.linalg.solve(aa + lam * torch.diag(d), ga)
            else:
                if attempt == 0:
                    full = -torch.linalg.lstsq(aa, ga[:, None]).solution[:, 0]
                step[act] = full * 0.5 ** attempt
            snorm = float((step / xs).abs().max())
            if snorm <= step_tolerance:
                stop_step = True
                break
            x_new = x + step
            r_new, rows_new = trial(x_new)
            c_new = robust_cost(r_new, loss, k) if bool(torch.isfinite(r_new).all()) else math.inf
            predicted = -float(g @ step + 0.5 * step @ (a @ step))
            actual = cost - c_new
            if method is Method.GAUSS_NEWTON:
                if actual > 0:
                    accepted = True
                    break
                continue
            gain = actual / predicted if predicted > 0 else -1.0
            if math.isfinite(c_new) and gain > 0:
                lam *= max(1.0 / 3.0, 1.0 - (2.0 * gain - 1.0) ** 3)
                nu = 2.0
                accepted = True
                break
            lam *= nu
            nu *= 2.0
        if accepted:
            x = x_new
            new_cost = c_new
            n_rows = None if reselect is not None else rows_new
            refresh(x)  # a new correspondence set for the next linearisation
        done = None
        if stop_step:
            done = "step"
        elif not accepted:
            done = "no decrease"
        elif cost - new_cost <= cost_tolerance * cost:
            done = "cost"
        history.append(Iteration(it, x.clone(), cost, new_cost, gnorm, snorm, lam, accepted, r.shape[0], k,
                                 time.perf_counter() - t_it))
        if callback is not None:
            callback(history[-1])
        if done is not None:
            reason, converged = done, done != "no decrease"
            break
    final = trial(x)[0]
    return SolveResult(x=x, cost=robust_cost(final, loss, float(scale_of(len(history)))), converged=converged,
                       reason=reason, iterations=len(history), history=history, normal_matrix=a)
