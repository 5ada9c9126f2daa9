"""Scenes: loading (USD, NuRec USDZ, built-in street block) and device geometry."""

from .materials import Material, decode_material_id, encode_material_id
from .scene import CameraCalibration, Instance, MeshData, Part, Scene, SceneError, Trajectory

__all__ = [
    "CameraCalibration", "Instance", "Material", "MeshData", "Part", "Scene", "SceneError", "Trajectory",
    "decode_material_id", "encode_material_id",
]
