"""wsim — differentiable lidar and camera simulation for autonomous driving, built on NVIDIA Warp.

Public surface: scenes (:func:`load_scene`, :class:`Scene`), the tracing core (:meth:`Scene.device_geometry`), and
sensors (:class:`Lidar` → :class:`PointCloud`, :class:`Camera` → :class:`CameraFrame`).
"""

from .scene import CameraCalibration, Instance, Material, MeshData, Part, Scene, SceneError, Trajectory
from .scene.loader import load_scene
from .sensors.camera import Camera, CameraFrame, CameraProduct, ShutterType
from .sensors.lens import BivariateWindshield, FThetaLens, OpenCVFisheyeLens, OpenCVPinholeLens
from .sensors.lidar import Lidar
from .sensors.lidar_config import LidarConfig, LidarConfigError
from .sensors.pointcloud import PointCloud

__version__ = "0.1.0"

__all__ = [
    "BivariateWindshield", "Camera", "CameraFrame", "CameraProduct", "FThetaLens", "OpenCVFisheyeLens",
    "OpenCVPinholeLens", "ShutterType",
    "CameraCalibration", "Instance", "Lidar", "LidarConfig", "LidarConfigError", "Material", "MeshData", "Part",
    "PointCloud", "Scene", "SceneError", "Trajectory", "load_scene", "__version__",
]
