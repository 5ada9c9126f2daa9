"""PyTorch bridge: differentiable lidar and camera renders (requires ``wsim[torch]``).

Lidar: :func:`lidar_render` with :class:`LidarInputs`. Cameras: :func:`camera_distance`, :func:`project_points`,
:func:`se3_exp`. Outputs share memory with Warp arrays (DLPack, no copy on the same device).
"""

from .autodiff.lidar import LidarInputs, lidar_render

__all__ = ["LidarInputs", "lidar_render"]

try:  # camera functions
    from .autodiff.camera import camera_distance, project_points, se3_exp  # noqa: F401

    __all__ += ["camera_distance", "project_points", "se3_exp"]
except ImportError:  # pragma: no cover - camera bridge not available
    pass
