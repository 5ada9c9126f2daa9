"""Scenes: loading (USD, NuRec USDZ, built-in street block) and device geometry."""

from .materials import Material, decode_material_id, encode_material_id
from .scene import CameraCalibration, Instance, MeshData, Part, Scene, SceneError, Trajectory

# After .scene: importing the geometry module installs Scene.device_geometry's builder (SceneGeometry.of).
from .geometry import Hits, SceneGeometry  # noqa: E402

__all__ = [
    "CameraCalibration", "Hits", "Instance", "Material", "MeshData", "Part", "Scene", "SceneError", "SceneGeometry",
    "Trajectory",
    "decode_material_id", "encode_material_id",
]
