"""wsim — differentiable lidar and camera simulation for autonomous driving, built on NVIDIA Warp.

Public surface: scenes (:func:`load_scene`, :class:`Scene`) and the tracing core (:meth:`Scene.device_geometry`).
"""

from .scene import CameraCalibration, Instance, Material, MeshData, Part, Scene, SceneError, Trajectory
from .scene.loader import load_scene

__version__ = "0.1.0"

__all__ = [
    "CameraCalibration", "Instance", "Material", "MeshData", "Part", "Scene", "SceneError", "Trajectory",
    "load_scene", "__version__",
]
