"""PyTorch bridge: differentiable lidar and camera renders (requires ``wsim[torch]``).

Lidar: :func:`lidar_render` with :class:`LidarInputs`, :func:`point_cloud_of`. Cameras: :func:`camera_distance`, :func:`project_points`.
Poses: :func:`se3_exp`, :func:`pose_compose`, :func:`pose_interpolate`, :func:`trajectory_pose`,
:func:`rig_frame_poses`. Outputs share memory with Warp arrays (DLPack, no copy on the same device).
"""

from .autodiff.camera import (
    camera_distance,
    pose_compose,
    pose_interpolate,
    project_points,
    rig_frame_poses,
    se3_exp,
    trajectory_pose,
)
from .autodiff.lidar import LidarInputs, lidar_render, point_cloud_of

__all__ = [
    "LidarInputs", "camera_distance", "lidar_render", "point_cloud_of", "pose_compose", "pose_interpolate", "project_points",
    "rig_frame_poses", "se3_exp", "trajectory_pose",
]
