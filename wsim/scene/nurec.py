"""NuRec-style USDZ scene artifacts: :func:`load_nurec` reads one into a :class:`~wsim.scene.scene.Scene`,
:func:`write_nurec` writes a Scene in that form (used to ship the built-in scene).

The artifact is a zip archive (read with :mod:`zipfile`, never extracted into the working directory) holding:

``metadata.yaml``
    ``scene_id`` (required), ``version_string``, ``training_date``, ``dataset_hash``, ``uuid``, ``is_resumable``,
    ``sensors.{camera_ids, lidar_ids}``, ``logger.{name, run_id, run_url}``, ``time_range.{start, end}`` [us] (the
    fields AlpaSim's ``Metadata`` requires). Every other key is kept as is (``write_nurec`` stores the rest of
    ``Scene.metadata`` there, e.g. the built-in scene's ``sensor_rig``).
``rig_trajectories.json``
    ``world_to_nre.matrix`` (4x4), ``camera_calibrations`` {unique_id: {logical_sensor_name, camera_model:
    {type, parameters}, T_sensor_rig}}, ``rig_trajectories`` [{sequence_id, T_rig_world_timestamps_us, T_rig_worlds,
    cameras_frame_timestamps_us, rig_bbox}], ``T_world_base``.
``sequence_tracks.json``
    {sequence_id: {tracks_data: {tracks_id, tracks_label_class, tracks_flags, tracks_timestamps_us, tracks_poses},
    cuboidtracks_data: {cuboids_dims}}}. ``tracks_flags`` entries are lists of flag strings (``["CONTROLLABLE"]``)
    or one ``|``-separated string; the integer 0 of older wsim files reads as no flags.
``mesh.ply``, ``mesh_ground.ply``
    Binary or ASCII PLY: vertex x, y, z (+ optional red, green, blue) and face vertex_indices (polygons are
    fan-triangulated).

Choices made where the public format leaves room (wsim's own conventions):

- **Frames.** ``mesh.ply`` / ``mesh_ground.ply`` are in the scene's local ("nre") frame. ``T_rig_worlds`` and the track
  poses are in the world frame and are mapped into the local frame with ``world_to_nre.matrix`` (identity when absent).
  ``T_world_base`` is kept in ``Scene.metadata["nurec"]`` but not applied.
- **Time.** ``Scene.time_origin_us`` = ``time_range.start``; scene seconds = (us - origin) / 1e6; the scene's
  ``time_range`` is (0, (end - start) / 1e6).
- **Rig.** The ego trajectory comes from the first entry of ``rig_trajectories``; the other entries are kept in
  ``Scene.metadata["nurec"]["other_rig_trajectories"]`` (sequence ids only). ``T_sensor_rig`` maps camera (OpenCV axes)
  to rig. In ``camera_model.parameters``, ``resolution`` [w, h] and ``shutter_type`` become the
  :class:`CameraCalibration` fields of the same meaning; the remaining entries are the calibration's ``params``.
- **Tracks.** A track pose is the local pose of the cuboid centre, (x, y, z, qx, qy, qz, qw). Each track becomes an
  :class:`Instance`; without a stored mesh its prototype is a proxy box of the cuboid size centred on the local origin
  (one prototype per track, painted steel, the track's label lowercased as semantic class). A single-timestamp track
  is a static instance, and so is a track whose poses are all equal. ``tracks_flags`` are kept per track id in
  ``Scene.metadata["nurec"]["tracks_flags"][sequence_id]`` and not interpreted.
- **Colours.** PLY vertex colours are sRGB (uchar, or float in [0, 1]); they are converted to the linear colours of
  :attr:`MeshData.colors`. ``write_nurec`` writes each vertex with the sRGB-encoded base colour of its triangle's
  material (or the mesh's own colours when it has them).
- **Default materials.** Without a sidecar, ``mesh.ply`` gets a generic material (class "unlabeled") and
  ``mesh_ground.ply`` asphalt with class "road".
- **Sidecar ``wsim_materials.json``** (written by ``write_nurec``, optional on load) keeps what the NuRec files
  cannot carry: the material table (all :class:`Material` fields), the semantic class table, the part table, the
  per-triangle part index of each PLY (run-length encoded as a flat ``[value, count, value, count, ...]`` list), the
  prototype meshes (members ``prototypes/<n>.ply`` with their own per-triangle parts), and per-track extras
  (prototype index, object id, semantic class, scales). When present, a track's stored prototype is used instead of
  the proxy box, so the geometry is the same in both forms and instances keep sharing their prototype.
- **USD layer.** When the zip holds a ``*.usda`` / ``*.usdc`` / ``*.usd`` layer, geometry comes from it through
  :func:`wsim.scene.usd.load_usd` (the archive is unpacked into a temporary directory for that); the PLY meshes are
  then ignored. Tracks whose id matches no instance name of the USD scene are added as proxies; ego trajectory and
  cameras still come from ``rig_trajectories.json``.
- **Writing** (what AlpaSim's runtime reads; the README's NuRec section maps each field to its source).
  ``mesh_ground.ply`` holds the static triangles whose part has class "road", "sidewalk" or "ground";
  ``mesh.ply`` the rest. Every instance becomes a track; track id = instance name (made unique). A moving instance
  is flagged ``["CONTROLLABLE"]`` (AlpaSim treats exactly those as dynamic), a static one ``[]`` and written with two
  samples at the start and end of the scene's time range (AlpaSim smooths every track, which needs two samples, and
  drops tracks shorter than 3 s); flags read from a NuRec file are written back as they were. Camera parameters
  use NuRec's ``principal_point`` / ``focal_length`` [x, y] lists (both forms are read). ``training_date`` is the
  scene's own or ``1970-01-01`` (wsim's scenes are not trained), ``is_resumable`` false, ``logger`` fields null,
  ``dataset_hash`` the SHA-256 of every other member. Members are written in a fixed order with fixed zip timestamps and deflate, so the same
  scene always gives byte-identical files.

The code: :mod:`wsim.scene.nurec_read` (the reader), :mod:`wsim.scene.nurec_write` (the writer) and
:mod:`wsim.scene.nurec_format` (PLY meshes, sRGB colours, run-length lists). This module re-exports their public names.
"""

from __future__ import annotations

from .nurec_format import SIDECAR, linear_to_srgb, ply_bytes, read_ply_mesh, rle_decode, rle_encode, srgb_to_linear
from .nurec_read import load_nurec
from .nurec_write import GROUND_CLASSES, NOT_TRAINED_DATE, write_nurec

__all__ = [
    "load_nurec",
    "write_nurec",
    "read_ply_mesh",
    "ply_bytes",
    "srgb_to_linear",
    "linear_to_srgb",
    "rle_encode",
    "rle_decode",
    "GROUND_CLASSES",
    "SIDECAR",
]
