"""Gradients through wsim's sensors: PyTorch autograd functions over Warp tapes (see :mod:`wsim.torch`), and what
calibrations build on them: a Gauss–Newton / Levenberg–Marquardt solver with autodiff Jacobians and robust losses
(:mod:`.solve`) and point-to-plane residuals against the rendered surface (:mod:`.residuals`)."""

from .residuals import SurfaceMatch, firing_keys, match_surface, material_indices, sensor_points
from .solve import (Iteration, JacobianMode, Method, RobustLoss, SolveResult, jacobian, least_squares, robust_cost,
                    robust_weights)

__all__ = [
    "Iteration", "JacobianMode", "Method", "RobustLoss", "SolveResult", "SurfaceMatch", "firing_keys", "jacobian",
    "least_squares", "match_surface", "material_indices", "robust_cost", "robust_weights", "sensor_points",
]
