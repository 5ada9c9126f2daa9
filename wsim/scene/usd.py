"""USD stages ↔ :class:`~wsim.scene.scene.Scene`.

:func:`load_usd` reads ``.usda/.usdc/.usd/.usdz`` stages with usd-core (``pxr``); :func:`save_usd` writes a Scene back
as a stage that :func:`load_usd` reads to an equivalent Scene.

Conventions on the stage (read and written):

- Geometry: every ``UsdGeom.Mesh`` (polygons fan-triangulated, face ``GeomSubset``s become parts) and the gprims
  ``Cube/Sphere/Cylinder/Capsule/Cone/Plane`` (tessellated with :data:`SEGMENTS` segments around their axis).
- Units: ``metersPerUnit`` and ``upAxis`` are applied so the Scene is in metres, Z up (a Y-up stage is rotated by
  +90° about X: (x, y, z) → (x, -z, y)). A stage without authored metadata uses USD's fallbacks.
- Moving objects: a geometry prim whose world transform is time-sampled (any xformOp on it or an ancestor has time
  samples) becomes a prototype mesh plus an :class:`Instance` keyed at the union of those samples
  (seconds = timeCode / timeCodesPerSecond). Native instances (``instanceable``) and ``PointInstancer`` placements
  share one prototype mesh per USD prototype.
- Materials: the bound ``UsdShade.Material`` gives the base colour (``UsdPreviewSurface`` ``inputs:diffuseColor``,
  or the file of a ``UsdUVTexture`` connected to it), the SimReady labels ``omni:simready:nonvisual:base|coating|
  attributes`` (or the older ``inputs:nonvisual:*`` strings), and the overrides ``float wsim:reflectance`` /
  ``float wsim:transmittance``. Unbound meshes use ``primvars:displayColor``.
- Semantics: ``token[] semantics:labels:class`` (first label) or the older ``semantic:<name>:params:semanticType ==
  "class"`` + ``semanticData``, inherited down the tree (nearest ancestor wins).
- Object ids: 1, 2, 3, … per geometry prim / instance placement in stage traversal order; an authored
  ``int wsim:objectId`` on the prim takes precedence (automatic ids skip the authored ones).
- Cameras: ``UsdGeom.Camera`` prims are listed in ``Scene.camera_prims``; a camera carrying
  ``string wsim:camera:calibration`` (JSON ``{"model", "params", "resolution": [w, h], "shutter_type",
  "logical_id", "unique_id"}``) becomes a :class:`CameraCalibration` whose ``camera_to_rig`` is the camera's transform
  relative to its parent prim, converted from USD camera axes (-Z forward, +Y up) to OpenCV axes (x right, y down,
  z forward) by a 180° rotation about X. Lidars: prims with ``omni:sensor:Core:scanType`` or of type ``OmniLidar``.
- Ego trajectory: the prim with ``bool wsim:egoRig = true``; its world transform at its time samples.
- Layer metadata: ``customLayerData["wsim:sceneId"]`` (scene id; the file stem otherwise) and optionally
  ``customLayerData["wsim:timeOriginUs"]`` (a decimal string).
- Files written by :func:`save_usd` use ``timeCodesPerSecond`` = :data:`TIME_CODES_PER_SECOND` (1000: a time code is
  a millisecond).

The code: :mod:`wsim.scene.usd_read` (the reader), :mod:`wsim.scene.usd_write` (the writer),
:mod:`wsim.scene.usd_materials` (materials, both ways), :mod:`wsim.scene.usd_geometry` (meshes and gprims as
triangles) and :mod:`wsim.scene.usd_stage` (what reader and writer share). This module re-exports their public names.
"""

from __future__ import annotations

from .usd_geometry import SEGMENTS
from .usd_read import load_usd
from .usd_stage import TIME_CODES_PER_SECOND, pxr_error_message
from .usd_write import save_usd

__all__ = ["load_usd", "save_usd", "SEGMENTS", "TIME_CODES_PER_SECOND", "pxr_error_message"]
