"""``wsim.Lidar``: a spinning or solid-state lidar configured like the RTX lidar generic core model.

Steps of a render (each in :mod:`wsim.kernels.lidar`): firing schedule → pose at each firing time → rays/beams →
trace against the scene at that time → echoes → intensity and detection → output frame → compaction.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import threading
import weakref
from typing import Any, Sequence

import numpy as np
import warp as wp

from .. import launch as _launch
from ..kernels import lidar as K
from ..kernels import lidar_diff as KD
from ..scene.scene import Scene, Trajectory
from ..scene.transforms import compose_matrix, decompose_matrix, interpolate_pose
from .lidar_config import (
    CoordsType,
    FrameOfReference,
    IntensityMapping,
    IntensityProcessing,
    LidarConfig,
    MotionCompensation,
    RayType,
    ScanType,
)
from .pointcloud import ALWAYS, CHANNELS, PointCloud, typed_params
from .presets import preset as _preset

Pose = tuple[Sequence[float], Sequence[float]]  # (translation (3,) [m], quaternion (x, y, z, w))

#: Largest |time| accepted by :meth:`Lidar.render` [s]: scene times are relative to the scene's time origin.
MAX_SCENE_TIME_S = 1e7
#: On the CPU the sub-rays of a beam (GAUSSIAN_BEAM, UNIFORM_BEAM) find their first static surfaces in one packet
#: traversal of the 8-wide BVH (:mod:`wsim.kernels.packet`), bit-identical to tracing them one by one; False (or
#: ``WSIM_BEAM_PACKETS=0``) traces them one by one. CUDA always traces them one by one.
BEAM_PACKETS = os.environ.get("WSIM_BEAM_PACKETS", "1") != "0"
#: IDEALIZED first rays on the CPU (static scene on the 8-wide BVH) are traced in groups of neighbouring firings as
#: multi-origin packets (:func:`wsim.kernels.lidar.lidar_first_kernel`): one emitter over consecutive ticks of a
#: spinning head, neighbours in one row of a solid state's grid (:meth:`Lidar._first_group`); the same bits as one by
#: one. ``WSIM_LIDAR_PACKETS=0`` traces every firing alone. CUDA always traces them one by one.
FIRST_PACKETS = os.environ.get("WSIM_LIDAR_PACKETS", "1") != "0"
#: ISO 8855 sensor axes to the application's axes (wsim: the same axes).
MODEL_TO_APP = np.eye(4, dtype=np.float32)


def _pose_matrix(pose: Pose) -> np.ndarray:
    t, q = pose
    return compose_matrix(np.asarray(t, float), np.asarray(q, float))


class Lidar:
    """A lidar sensor.

    Build it from a USD prim carrying ``omni:sensor:Core:*`` attributes (or a RenderProduct whose ``camera``
    relationship names one), or from a preset with :meth:`preset`.

    Args:
        prim: A ``pxr.Usd.Prim``, or a USD file path together with ``prim_path``; None with ``config``.
        prim_path: Prim path inside the file ``prim``.
        config: A :class:`LidarConfig` (instead of a prim).
        scene: Scene to render (default: the prim's stage loaded as a scene).
        trajectory: Sensor-to-world trajectory (default: the prim's world transform samples; identity).
        rig: A rig-to-world trajectory (e.g. ``scene.ego_trajectory``); with ``mount``, the sensor pose is
            rig(t) ∘ mount.
        mount: Sensor-to-rig pose (translation [m], quaternion xyzw).
        channels: Channels to deliver (default all; Counts and Flags always).
        device: Warp device.
    """

    def __init__(
        self,
        prim: Any = None,
        *,
        prim_path: str | None = None,
        config: LidarConfig | None = None,
        scene: Scene | None = None,
        trajectory: Trajectory | None = None,
        rig: Trajectory | None = None,
        mount: Pose | None = None,
        channels: Sequence[str] | None = None,
        device: str | None = None,
    ) -> None:
        self._stage_file = ""
        if config is None:
            if prim is None:
                raise ValueError("Lidar needs a prim or a config")
            from ..scene.prims import read_sensor_prim

            sp = read_sensor_prim(prim, prim_path)
            config = LidarConfig.from_attributes(sp.attributes, name=sp.path)
            if trajectory is None and rig is None:
                trajectory = sp.trajectory
            if channels is None:
                channels = sp.channels
            self._stage_file = sp.stage_file
        self.config = config
        self.scene = scene
        self.device = wp.get_device(device)
        if rig is not None:
            m = _pose_matrix(mount) if mount is not None else np.eye(4)
            keys = [decompose_matrix(compose_matrix(t, q) @ m) for t, q in zip(rig.translations, rig.rotations)]
            trajectory = Trajectory(rig.times, [k[0] for k in keys], [k[1] for k in keys])
        elif trajectory is None and mount is not None:
            trajectory = Trajectory([0.0], [mount[0]], [mount[1]])
        self.trajectory = trajectory or Trajectory([0.0], [[0, 0, 0]], [[0, 0, 0, 1]])
        self.channels = self._check_channels(channels)
        self.frame_id = 0
        self.gain = np.ones(config.number_of_emitters, np.float32)
        self._history: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        self._emitters: dict[str, Any] = {}
        self._tables: dict[int, Any] = {}
        self._scratch_pool: list[_Scratch] = []  # scratch buffers of finished renders, for the next one
        self._pool_lock = threading.Lock()
        self._outputs = _OutputBlocks(self.device)  # memory of delivered channels, back once the user drops them

    @classmethod
    def preset(cls, name: str, *, scene: Scene | None = None, trajectory: Trajectory | None = None,
               rig: Trajectory | None = None, mount: Pose | None = None, channels: Sequence[str] | None = None,
               device: str | None = None, **overrides: Any) -> Lidar:
        """A lidar from a built-in preset ("PANDAR128" or "AT128") with optional config overrides
        (e.g. ``ray_type="GAUSSIAN_BEAM", max_returns=2``); placement arguments as for :class:`Lidar`."""
        return cls(config=_preset(name, **overrides), scene=scene, trajectory=trajectory, rig=rig, mount=mount,
                   channels=channels, device=device)

    @staticmethod
    def _check_channels(channels: Sequence[str] | None) -> list[str]:
        if channels is None:
            return list(CHANNELS) + ["SemanticId"]
        out = list(ALWAYS)
        for c in channels:
            if c not in CHANNELS and c != "SemanticId":
                import warnings

                warnings.warn(f"ignoring unknown lidar channel {c!r}", stacklevel=3)
            elif c not in out:
                out.append(c)
        return out

    # ------------------------------------------------------------------ pose handling
    def _pose_at(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        traj = self._pose_trajectory()
        return interpolate_pose(traj.times, traj.translations, traj.rotations, t)

    def _pose_trajectory(self) -> Trajectory:
        if not self._history:
            return self.trajectory
        ts = sorted(self._history)
        return Trajectory(ts, [self._history[t][0] for t in ts], [self._history[t][1] for t in ts])

    def _record_poses(self, t0: float, t1: float, sensor_poses: Any) -> None:
        if sensor_poses is None:
            return
        if isinstance(sensor_poses, Trajectory):
            for t, tr, q in zip(sensor_poses.times, sensor_poses.translations, sensor_poses.rotations):
                self._history[float(t)] = (np.asarray(tr, float), np.asarray(q, float))
        else:
            start, end = sensor_poses
            for t, (tr, q) in ((t0, start), (t1, end)):
                tr, q = np.asarray(tr, float), np.asarray(q, float)
                if tr.shape != (3,) or q.shape != (4,) or not (np.all(np.isfinite(tr)) and np.all(np.isfinite(q))):
                    raise ValueError("sensor_poses: each pose is (translation (3,), quaternion xyzw (4,)), finite")
                if np.linalg.norm(q) < 1e-9:
                    raise ValueError("sensor_poses: zero quaternion")
                self._history[float(t)] = (tr, q / np.linalg.norm(q))
        keep = max(self._history) - 3.0 * self.config.scan_period_s
        for t in [t for t in self._history if t < keep]:
            del self._history[t]

    # ------------------------------------------------------------------ schedule
    def _scan_ticks_ns(self) -> np.ndarray:
        c = self.config
        n = c.ticks_per_scan
        if c.scan_type is ScanType.SOLID_STATE:
            return np.zeros(1, np.int64)
        return np.round(np.arange(n) * 1e9 / c.pattern_firing_rate_hz).astype(np.int64)

    def _ticks(self, scans: np.ndarray, t0_ns: int, t1_ns: int, window: bool) -> dict[str, np.ndarray]:
        c = self.config
        period = int(round(1e9 / c.scan_rate_base_hz))
        rel = self._scan_ticks_ns()
        nxt = np.append(rel[1:], period)
        n_states = len(c.emitter_states)
        rows = []
        for k in scans:
            start = int(k) * period
            abs_ns = start + rel
            if window:
                sel = (abs_ns + (nxt - rel) > t0_ns) & (abs_ns < t1_ns)
            else:
                sel = np.ones(len(rel), bool)
            j = np.nonzero(sel)[0]
            if c.scan_type is ScanType.SOLID_STATE:
                state = np.full(len(j), (int(k) // c.state_resolution_step) % n_states)
            else:
                state = (j // c.state_resolution_step) % n_states
            rows.append((abs_ns[j], rel[j], (nxt - rel)[j], j, state, np.full(len(j), int(k))))
        if not rows:
            return {}
        cat = [np.concatenate(x) for x in zip(*rows)]
        return dict(abs_ns=cat[0], rel_ns=cat[1], period_ns=cat[2], tick_id=cat[3], state=cat[4], scan=cat[5])

    # ------------------------------------------------------------------ render
    def render(
        self,
        t0: float,
        t1: float,
        *,
        scene: Scene | None = None,
        sensor_poses: tuple[Pose, Pose] | Trajectory | None = None,
        compensation_reference: str = "start",
        channels: Sequence[str] | None = None,
        requires_grad: bool = False,
        _overrides: dict | None = None,
    ) -> PointCloud:
        """Render the application step [t0, t1] (scene seconds).

        Args:
            t0, t1: Step start and end [s] on the scene clock.
            scene: Scene to trace (default: the one given at construction, else the prim's stage).
            sensor_poses: (start pose, end pose) of the sensor at t0 and t1 (sensor-to-world translation [m] and
                quaternion xyzw), or a Trajectory; remembered so that a scan accumulated over several steps uses
                every step's poses. Default: the sensor's trajectory.
            compensation_reference: "start" (timestampNs) or "end" (frame end) for SENSOR + COMPENSATED output.
            channels: Channels to deliver for this frame (default: the lidar's selection).
            requires_grad: Record Coordinates and Intensity on ``PointCloud.tape`` (a ``wp.Tape``): gradients reach
                ``PointCloud.inputs`` — sensor poses, emitter azimuth/elevation [rad], per-emitter gain, material
                reflectance and mesh vertex positions. See README "Differentiable rendering". The poses, angles,
                gain and reflectance in ``inputs`` are this render's own copies (their gradients belong to this
                tape alone); the mesh vertex arrays are the scene's shared device arrays.
            _overrides: Internal (:func:`wsim.torch.lidar_render`): values used for this render only, leaving the
                lidar untouched — ``trajectory`` (a sensor Trajectory), ``azimuth``/``elevation`` [rad] (S·E,),
                ``gain`` (E,), ``reflectance`` (M,) (float32 arrays).

        Returns:
            A :class:`PointCloud`. With partialOutputs false, only a step that completes a scan delivers points
            (the whole scan); other steps deliver Counts = 0.
        """
        if not (np.isfinite(t0) and np.isfinite(t1)) or t1 < t0:
            raise ValueError(f"render: need finite t0 <= t1, got t0={t0}, t1={t1}")
        for name, t in (("t0", t0), ("t1", t1)):
            if abs(t) > MAX_SCENE_TIME_S:
                raise ValueError(f"{name}: {t} s is more than {MAX_SCENE_TIME_S:.0e} s from the scene's time origin "
                                 "(scene times are seconds on the scene clock, not absolute)")
        if compensation_reference not in ("start", "end"):
            raise ValueError("compensation_reference: 'start' or 'end'")
        scene = self._scene(scene)
        self._record_poses(t0, t1, sensor_poses)
        c = self.config
        chans = self._check_channels(channels) if channels is not None else self.channels
        period = int(round(1e9 / c.scan_rate_base_hz))
        t0_ns, t1_ns = int(round(t0 * 1e9)), int(round(t1 * 1e9))
        if int(scene.time_origin_us) * 1000 + t0_ns < 0:
            raise ValueError(f"t0: {t0} s is before the zero of the scene's absolute clock "
                             f"(time_origin_us {scene.time_origin_us}); timestampNs is unsigned: give the scene a later "
                             "time_origin_us")
        self.frame_id += 1
        completes = [k for k in range(t0_ns // period, t1_ns // period + 1)
                     if t0_ns < (k + 1) * period <= t1_ns]
        deliver = True
        if c.instant_lidar:
            scans = np.array([t0_ns // period])
            ticks = self._ticks(scans, 0, 0, False)
            frame = (t0_ns, t1_ns)
            deliver = c.partial_outputs or bool(completes)
        elif c.partial_outputs:
            scans = np.arange((t0_ns - period) // period, t1_ns // period + 1)
            ticks = self._ticks(scans, t0_ns, t1_ns, True)
            frame = (t0_ns, t1_ns)
        else:
            if completes:
                k = completes[-1]
                ticks = self._ticks(np.array([k]), 0, 0, False)
                frame = (k * period, t1_ns)
            else:
                ticks, frame, deliver = {}, (t0_ns, t1_ns), False
        if not deliver:
            ticks = {}
        return self._trace(scene, ticks, frame, chans, compensation_reference, t0_ns, t1_ns, requires_grad,
                           _overrides or {})

    def _scene(self, scene: Scene | None) -> Scene:
        if scene is not None:
            return scene
        if self.scene is None:
            if not self._stage_file:
                raise ValueError("Lidar.render: no scene given (pass scene= to Lidar or render)")
            from ..scene.loader import load_scene

            self.scene = load_scene(self._stage_file)
        return self.scene

    def _emitter_table(self) -> K.EmitterTable:
        key = str(self.device)
        if key not in self._emitters:
            c, d = self.config, self.device
            cat = lambda a, dt: np.concatenate([getattr(s, a) for s in c.emitter_states]).astype(dt)  # noqa: E731
            em = K.EmitterTable()
            em.az = wp.array(np.deg2rad(cat("azimuth_deg", np.float64)).astype(np.float32), dtype=float, device=d,
                             requires_grad=True)
            em.el = wp.array(np.deg2rad(cat("elevation_deg", np.float64)).astype(np.float32), dtype=float, device=d,
                             requires_grad=True)
            em.fire_ns = wp.array(cat("fire_time_ns", np.int32), dtype=wp.int32, device=d)
            em.channel = wp.array(cat("channel_id", np.uint32), dtype=wp.uint32, device=d)
            em.hor = wp.array(cat("hor_offset_m", np.float32), dtype=float, device=d)
            em.vert = wp.array(cat("vert_offset_m", np.float32), dtype=float, device=d)
            em.dcorr = wp.array(cat("distance_correction_m", np.float32), dtype=float, device=d)
            self._emitters[key] = _with_trig(em)
        return self._emitters[key]

    def _scene_tables(self, scene: Scene):
        key = id(scene)
        if key not in self._tables:
            d = self.device
            refl = wp.array([m.reflectance for m in scene.materials], dtype=float, device=d, requires_grad=True)
            trans = wp.array([m.transmittance for m in scene.materials], dtype=float, device=d)
            ohash, pnum = object_id_tables(scene)
            self._tables[key] = (scene, refl, trans, wp.array(ohash, dtype=wp.vec3ui, device=d),
                                 wp.array(pnum, dtype=wp.uint32, device=d))
        return self._tables[key][1:]

    def _params(self) -> K.LidarParams:
        c = self.config
        p = K.LidarParams()
        p.num_emitters = c.number_of_emitters
        p.rotary = int(c.scan_type is ScanType.ROTARY)
        p.ccw = int(c.rotation_direction == "CCW")
        p.scan_rate = 1.0 / c.scan_period_s
        p.start_az_offset = np.deg2rad(c.start_azimuth_offset_deg)
        p.valid_start = np.deg2rad(c.valid_start_azimuth_deg % 360.0) if c.valid_start_azimuth_deg != 360 else 2 * np.pi
        p.valid_end = np.deg2rad(c.valid_end_azimuth_deg if 0 <= c.valid_end_azimuth_deg <= 360
                                 else c.valid_end_azimuth_deg % 360.0)
        p.near, p.far = c.near_range_m, c.far_range_m
        p.range_res = c.range_resolution_m
        p.min_echo_dist = c.min_dist_between_echos_m
        p.max_returns = c.max_returns
        p.ray_type = {RayType.IDEALIZED: 0, RayType.GAUSSIAN_BEAM: 1, RayType.UNIFORM_BEAM: 2}[c.ray_type]
        p.beam_n = c.beam_samples if c.ray_type is not RayType.IDEALIZED else 1
        p.hits_per_subray = max(1, min(c.max_returns + 1, K.MAX_CONTRIB // max(1, p.beam_n)))
        p.div_h, p.div_v = np.deg2rad(c.divergence_hor_deg), np.deg2rad(c.divergence_ver_deg)
        p.processing = {IntensityProcessing.RAW: 0, IntensityProcessing.NORMALIZATION: 1,
                        IntensityProcessing.CORRECTION: 2}[c.intensity_processing]
        p.nonlinear = int(c.intensity_mapping_type is IntensityMapping.NONLINEAR)
        p.scale = c.intensity_scale_percent / 100.0
        p.detect_threshold = c.min_reflectance / c.min_reflection_range_m ** 2
        p.range_noise = c.range_accuracy_m
        p.az_noise, p.el_noise = np.deg2rad(c.azimuth_error_std), np.deg2rad(c.elevation_error_std)
        p.seed = int(c.seed)
        p.instant = int(c.instant_lidar)
        p.frame = {FrameOfReference.SENSOR: 0, FrameOfReference.WORLD: 1,
                   FrameOfReference.CUSTOM: 2}[c.output_frame_of_reference]
        p.compensated = int(c.output_motion_compensation_state is MotionCompensation.COMPENSATED)
        p.spherical = int(c.elements_coords_type is CoordsType.SPHERICAL)
        p.custom = wp.mat44(*np.asarray(c.custom_frame_of_reference_trafo, np.float32).reshape(-1))
        p.keep_invalid = int(c.include_invalid_points)
        p.beam, p.beam_tan = self._beam_table(p)
        return p

    def _beam_table(self, p: K.LidarParams) -> tuple[wp.array, float]:
        """Per sub-ray (tan of its offset angles, normalised weight), computed once per beam shape and device, and
        the tan of the largest sub-ray angle (the beam's cone)."""
        key = ("beam", int(p.beam_n), int(p.ray_type), float(p.div_h), float(p.div_v), str(self.device))
        entry = self._emitters.get(key)
        if entry is None:
            table = wp.empty(max(1, int(p.beam_n)), dtype=wp.vec3, device=self.device)
            wp.launch(K.beam_table_kernel, int(p.beam_n), [p, table], device=self.device)
            b = table.numpy().astype(np.float64)
            entry = self._emitters[key] = (table, float(np.sqrt(b[:, 0] ** 2 + b[:, 1] ** 2).max()))
        return entry

    def _trace(self, scene: Scene, ticks: dict, frame: tuple[int, int], chans: list[str], comp_ref: str,
               t0_ns: int, t1_ns: int, requires_grad: bool = False, overrides: dict | None = None) -> PointCloud:
        # the moving objects' top-level bounds cover the frame's firings (and the pose window around them) while
        # this render traces, whatever other threads render on the same scene meanwhile
        window = contextlib.nullcontext()
        if len(ticks.get("abs_ns", [])):
            t_lo = min(frame[0], int(ticks["abs_ns"].min())) * 1e-9
            t_hi = max(frame[1], int(ticks["abs_ns"].max() + ticks["period_ns"].max())) * 1e-9
            window = scene.device_geometry(self.device).hold_time_window(t_lo - 1e-3, t_hi + 1e-3)
        with window:
            return self._trace_in_window(scene, ticks, frame, chans, comp_ref, t0_ns, t1_ns, requires_grad,
                                         overrides)

    def _trace_in_window(self, scene: Scene, ticks: dict, frame: tuple[int, int], chans: list[str], comp_ref: str,
                         t0_ns: int, t1_ns: int, requires_grad: bool, overrides: dict | None) -> PointCloud:
        c, d = self.config, self.device
        ts_ns, te_ns = frame
        ov = overrides or {}
        traj = ov["trajectory"] if ov.get("trajectory") is not None else self._pose_trajectory()
        start_pose = interpolate_pose(traj.times, traj.translations, traj.rotations, ts_ns * 1e-9)
        end_pose = interpolate_pose(traj.times, traj.translations, traj.rotations, te_ns * 1e-9)
        n_ticks = len(ticks.get("abs_ns", []))
        n_fire = n_ticks * c.number_of_emitters
        n_slots = n_fire * c.max_returns
        scratch = self._take_scratch(n_slots, fresh=requires_grad)
        slots = scratch.slots
        # the fire kernel's batches of firings (CPU: a thread's turn, CUDA: one firing) and their delivered counts
        batch = 1 if wp.get_device(d).is_cuda else K.FIRE_BATCH
        n_batches = -(-n_fire // batch)
        counts = scratch.array("counts", n_batches, wp.int32)
        geo = scene.device_geometry(d)
        refl, trans, ohash, pnum = self._scene_tables(scene)
        em, gain = self._emitter_table(), self._gain_array()
        if requires_grad or set(ov) - {"rays"}:  # this render's own copies of what the tape differentiates
            em, gain, refl = self._render_inputs(em, gain, refl, ov)
        key_poses = np.concatenate([traj.translations, traj.rotations], 1)
        if requires_grad:  # (the tape's own input)
            pose_times = wp.array(traj.times.astype(np.float32), dtype=float, device=d)
            poses = wp.array(key_poses.astype(np.float32), dtype=wp.transform, device=d, requires_grad=True)
        else:
            pose_times = scratch.filled("pose_times", traj.times, float)
            poses = scratch.filled("poses", key_poses, wp.transform)
        ref_time = (ts_ns if comp_ref == "start" else te_ns) * 1e-9
        if c.instant_lidar:
            ref_time = t0_ns * 1e-9
        p = self._params()
        p.window_filter = int(c.partial_outputs and not c.instant_lidar)
        p.want = _wanted(chans, requires_grad)
        p.packet = int(BEAM_PACKETS and p.beam_n > 1 and geo.geo.use_wide != 0 and wp.get_device(d).is_cpu)
        p.smooth = int(c.smooth_normals)
        if c.smooth_normals:
            geo.ensure_vertex_normals()
        tt = K.TickTable()
        if n_fire:
            abs_ns = ticks["abs_ns"].astype(np.int64)
            fire_t = abs_ns * 1e-9 if not c.instant_lidar else np.full(n_ticks, t0_ns * 1e-9)
            tt.time = scratch.filled("time", fire_t, float)
            tt.rel_scan = scratch.filled("rel_scan", ticks["rel_ns"] * 1e-9, float)
            tt.offset_ns = scratch.filled("offset_ns", abs_ns - ts_ns, wp.int64)
            tt.window_lo_ns = scratch.filled("window_lo_ns", t0_ns - abs_ns, wp.int64)
            tt.window_hi_ns = scratch.filled("window_hi_ns", t1_ns - abs_ns, wp.int64)
            tt.period_ns = scratch.filled("period_ns", ticks["period_ns"], wp.int64)
            tt.tick_id = scratch.filled("tick_id", ticks["tick_id"], wp.int32)
            tt.state = scratch.filled("state", ticks["state"], wp.int32)
            tt.scan = scratch.filled("scan", ticks["scan"], wp.int32)
            fire_slot, slot_ns, n_fs = self._fire_slots()
            fposes = scratch.array("fposes", n_ticks * n_fs, K.FiringPose)
            _launch.launch(K.firing_pose_kernel, n_ticks * n_fs, [p, tt, slot_ns, n_fs, pose_times, poses,
                                                                  float(ref_time)], [fposes], device=d)
            if ov.get("rays"):
                rays = self._rays_of(p, em, tt, fire_slot, n_fs, fposes, poses, n_fire)
                self._give_scratch(scratch)  # (the next render's, as after a render)
                return rays
            first = wp.empty(0, dtype=wp.vec4, device=d)
            if FIRST_PACKETS and p.ray_type == K.RAY_IDEALIZED and geo.geo.use_wide != 0 and wp.get_device(d).is_cpu:
                first = scratch.array("first", n_fire, wp.vec4)
                group = self._first_group()
                em_g, slot_g, by_pos = self._first_tables(em, fire_slot)
                _launch.launch(K.lidar_first_kernel, -(-n_fire // group),
                               [geo.geo, p, em_g, tt, slot_g, n_fs, fposes, poses, self._first_order(n_ticks), by_pos,
                                group, n_fire],
                               [first], device=d, min_shard=max(1, _launch.MIN_SHARD // group))
            _launch.launch(K.lidar_fire_kernel, n_batches,
                           [geo.geo, p, em, tt, poses, refl, trans, gain, ohash, pnum, fire_slot, n_fs, fposes,
                            first, n_fire, batch],
                           [slots, counts], device=d, min_shard=max(1, _launch.MIN_SHARD // batch))
        pc, src = self._compact(scratch, counts, batch, chans, p, em, tt, frame, start_pose, end_pose, comp_ref)
        if not requires_grad:  # (a tape keeps reading its render's slots)
            self._give_scratch(scratch)
        if requires_grad:
            n = pc.count
            coords = wp.zeros((3, n), dtype=float, device=d, requires_grad=True)
            inten = wp.zeros(n, dtype=float, device=d, requires_grad=True)
            tape = wp.Tape()
            m = max(n, 1) if p.ray_type != 0 else 1  # per-echo member count and sums: beams only
            count = wp.zeros(m, dtype=wp.int32, device=d)
            sums = [wp.zeros(m, dtype=float, device=d, requires_grad=True) for _ in range(3)]
            mem = None
            if n and p.ray_type != 0:  # beams: every contribution of each delivered echo
                end = wp.zeros(n, dtype=wp.int32, device=d)
                args = [geo.geo, p, em, tt, pose_times, poses, refl, trans, slots, src]
                wp.launch(KD.echo_members_kernel, n, [*args, 0, end, count, _members(0, d)], device=d)
                wp.utils.array_scan(count, end, inclusive=True)
                total = int(end[n - 1:n].numpy()[0])
                mem = _members(total, d)
                wp.launch(KD.echo_members_kernel, n, [*args, 1, end, count, mem], device=d)
            if n:
                with tape:
                    if mem is not None and mem.owner.shape[0]:
                        wp.launch(KD.echo_sums_kernel, mem.owner.shape[0],
                                  [geo.geo, p, em, tt, pose_times, poses, refl, slots, src, mem], sums, device=d)
                    wp.launch(KD.lidar_diff_kernel, n, [geo.geo, p, em, tt, pose_times, poses, float(ref_time),
                                                        refl, gain, slots, src, count, *sums],
                              [coords, inten], device=d)
            pc.channels["Coordinates"] = coords
            pc.channels["Intensity"] = inten
            pc.tape = tape
            pc.inputs = {
                "pose_times": pose_times, "poses": poses, "azimuth": em.az, "elevation": em.el,
                "gain": gain, "reflectance": refl,
                "static_points": geo.static_mesh.points if geo.static_mesh is not None else None,
                "prototype_points": [m.points if m is not None else None for m in geo.prototype_meshes],
            }
        return pc

    def firing_rays(self, t0: float, t1: float) -> dict[str, np.ndarray]:
        """The world rays the render of step [t0, t1] would trace first, one per firing and (beams) sub-ray, in
        firing order (sub-rays of a firing together): ``origin`` (N, 3) [m], ``direction`` (N, 3) unit, ``time``
        (N,) [s, scene clock] and ``fires`` (N,) (0: outside the step or azimuth window, not traced). For comparing
        with other tracers on the very same rays (``benchmarks/lidar.py``); surfaces behind transmissive ones are
        further queries along the same rays."""
        frame_id = self.frame_id
        out = self.render(t0, t1, _overrides={"rays": True})
        self.frame_id = frame_id  # not a delivered frame
        if isinstance(out, PointCloud):  # no scan delivered in this step
            return {"origin": np.zeros((0, 3), np.float32), "direction": np.zeros((0, 3), np.float32),
                    "time": np.zeros(0, np.float32), "fires": np.zeros(0, np.int32)}
        return out

    def _rays_of(self, p: K.LidarParams, em: K.EmitterTable, tt: K.TickTable, fire_slot: wp.array, n_fs: int,
                 fposes: wp.array, poses: wp.array, n_fire: int) -> dict[str, np.ndarray]:
        n, d = n_fire * p.beam_n, self.device
        arrs = [wp.empty(n, dtype=wp.vec3, device=d), wp.empty(n, dtype=wp.vec3, device=d),
                wp.empty(n, dtype=float, device=d), wp.empty(n, dtype=wp.int32, device=d)]
        _launch.launch(K.firing_rays_kernel, n, [p, em, tt, fire_slot, n_fs, fposes, poses], arrs, device=d)
        return dict(zip(("origin", "direction", "time", "fires"), (a.numpy() for a in arrs)))

    def _render_inputs(self, em: K.EmitterTable, gain: wp.array, refl: wp.array, ov: dict):
        """Copies of the emitter table (fresh azimuth/elevation arrays), gain and reflectance for one render, with
        the overridden values: the lidar's own arrays are never written, and a recorded tape keeps the values it
        saw whatever later renders do."""
        d = self.device

        def fresh(arr: wp.array, key: str) -> wp.array:
            if ov.get(key) is None:
                return wp.clone(arr, requires_grad=True)
            v = np.asarray(ov[key], np.float32).reshape(-1)
            if v.shape != (arr.shape[0],) or not np.all(np.isfinite(v)):
                raise ValueError(f"{key}: need {arr.shape[0]} finite values, got {v.shape}")
            return wp.array(v, dtype=float, device=d, requires_grad=True)

        out = K.EmitterTable()
        out.az, out.el = fresh(em.az, "azimuth"), fresh(em.el, "elevation")
        out.fire_ns, out.channel, out.hor, out.vert, out.dcorr = em.fire_ns, em.channel, em.hor, em.vert, em.dcorr
        return _with_trig(out), fresh(gain, "gain"), fresh(refl, "reflectance")

    def _take_scratch(self, n: int, fresh: bool) -> _Scratch:
        """A render's scratch buffers for ``n`` slots: those of an earlier render of the same size when one is free
        (no allocation, no page faults: every buffer is written before it is read), else new ones."""
        if not fresh:
            with self._pool_lock:
                for i, sc in enumerate(self._scratch_pool):
                    if sc.n == n:
                        return self._scratch_pool.pop(i)
        return _Scratch(n, self.device)

    def _give_scratch(self, sc: _Scratch) -> None:
        with self._pool_lock:
            self._scratch_pool = [e for e in self._scratch_pool if e.n != sc.n][-1:] + [sc]  # two sizes at most

    def _fire_slots(self) -> tuple[wp.array, wp.array, int]:
        """Firing-time slots: each emitter-table entry's index among its state's distinct firing delays, the delays
        [ns] per (state, slot) (padded with the state's first), and the slot count per state. The emitters of one
        tick that fire at the same delay share one pose computation (PANDAR128: 16 delays for 128 emitters)."""
        key = ("slots", str(self.device))
        if key not in self._emitters:
            per_state = [np.unique(np.asarray(s.fire_time_ns, np.int64), return_inverse=True)
                         for s in self.config.emitter_states]
            n = max(len(u) for u, _ in per_state)
            slot_ns = np.array([np.pad(u, (0, n - len(u)), mode="edge") for u, _ in per_state], np.int32)
            fire_slot = np.concatenate([inv.reshape(-1) for _, inv in per_state]).astype(np.int32)
            self._emitters[key] = (wp.array(fire_slot, dtype=wp.int32, device=self.device),
                                   wp.array(slot_ns.reshape(-1), dtype=wp.int32, device=self.device), n)
        return self._emitters[key]

    def _first_order(self, n_ticks: int) -> wp.array:
        """The firings of ``n_ticks`` ticks in the order :func:`wsim.kernels.lidar.lidar_first_kernel` groups them
        (:meth:`_first_group` at a time): spinning, each emitter over that many consecutive ticks; solid state, each
        tick's emitters by elevation, then azimuth (state 0's table), so that a group is a run along one row of the
        grid."""
        key = ("first_order", str(self.device), n_ticks)  # (a step holds one of a few tick counts)
        if key in self._emitters:
            return self._emitters[key]
        c, g = self.config, self._first_group()
        ne = c.number_of_emitters
        fire = np.arange(n_ticks * ne, dtype=np.int64).reshape(n_ticks, ne)
        if c.scan_type is ScanType.ROTARY:
            nb = n_ticks // g
            head = fire[:nb * g].reshape(nb, g, ne).transpose(0, 2, 1).reshape(-1)
            order = np.concatenate([head, fire[nb * g:].T.reshape(-1)])
        else:
            order = fire[:, self._solid_row()].reshape(-1)
        self._emitters[key] = wp.array(order.astype(np.int32), dtype=wp.int32, device=self.device)
        return self._emitters[key]

    def _first_group(self) -> int:
        """Firings a group of :func:`wsim.kernels.lidar.lidar_first_kernel` takes: as many neighbours as span
        :data:`~wsim.kernels.lidar.FIRST_SPAN_DEG` — consecutive ticks of a spinning head (360° / ticks per scan
        apart), neighbours in a row of a solid state's grid (the median azimuth step along its rows, state 0)."""
        key = ("first_group",)
        if key not in self._emitters:
            c = self.config
            if c.scan_type is ScanType.ROTARY:
                step = 360.0 / max(1, c.ticks_per_scan)
            else:
                st, row = c.emitter_states[0], self._solid_row()
                az = np.asarray(st.azimuth_deg, np.float64)[row]
                el = np.asarray(st.elevation_deg, np.float64)[row]
                da = np.diff(az)[np.diff(el) == 0]
                da = da[da > 0]
                step = float(np.median(da)) if len(da) else 360.0
            span = np.floor(K.FIRST_SPAN_DEG / step * (1.0 + 1e-4))  # (a float32 step a hair over 0.1°: 48, not 47)
            self._emitters[key] = int(np.clip(span, 2, K.FIRST_GROUP_MAX))
        return self._emitters[key]

    def _solid_row(self) -> np.ndarray:
        """A solid-state lidar's emitters by elevation, then azimuth (state 0's table): a tick's first-surface order."""
        st = self.config.emitter_states[0]
        return np.lexsort((np.asarray(st.azimuth_deg, np.float64), np.asarray(st.elevation_deg, np.float64)))

    def _first_tables(self, em: K.EmitterTable, fire_slot: wp.array) -> tuple[K.EmitterTable, wp.array, int]:
        """The emitter table and firing-time slots :func:`wsim.kernels.lidar.lidar_first_kernel` reads, and whether
        they are in its order (``by_position``): a solid-state lidar's own tables reordered as :meth:`_first_order`
        takes a tick's emitters (a group's entries then lie together, not some hundred entries apart), else the
        render's own (spinning lidars, whose tables are small; a render's overridden emitter angles)."""
        if self.config.scan_type is ScanType.ROTARY or em is not self._emitter_table():
            return em, fire_slot, 0
        key = ("first_tables", str(self.device))
        if key not in self._emitters:
            ne, ns = self.config.number_of_emitters, len(self.config.emitter_states)
            idx = (np.arange(ns)[:, None] * ne + self._solid_row()[None, :]).reshape(-1)
            g = K.EmitterTable()
            for name in ("az", "el", "fire_ns", "channel", "hor", "vert", "dcorr", "trig"):
                a = getattr(em, name)
                setattr(g, name, wp.array(a.numpy()[idx], dtype=a.dtype, device=self.device))
            self._emitters[key] = (g, wp.array(fire_slot.numpy()[idx], dtype=wp.int32, device=self.device))
        g, slots = self._emitters[key]
        return g, slots, 1

    def _gain_array(self) -> wp.array:
        """Per-emitter intensity gain (device array, default 1; differentiable)."""
        key = ("gain", str(self.device))
        if key not in self._emitters:
            self._emitters[key] = wp.array(np.asarray(self.gain, np.float32), dtype=float, device=self.device,
                                           requires_grad=True)
        return self._emitters[key]

    def set_gain(self, gain: np.ndarray) -> None:
        """Set the per-emitter intensity gain (numberOfEmitters,) (multiplies the processed intensity)."""
        g = np.asarray(gain, np.float32).reshape(-1)
        if len(g) != self.config.number_of_emitters or not np.all(np.isfinite(g)):
            raise ValueError(f"gain: need {self.config.number_of_emitters} finite values")
        self.gain = g
        self._gain_array().assign(g)

    def _compact(self, scratch: _Scratch, counts: wp.array, batch: int, chans: list[str], p: K.LidarParams,
                 em: K.EmitterTable, tt: K.TickTable, frame, start_pose, end_pose,
                 comp_ref: str) -> tuple[PointCloud, wp.array]:
        """The fire kernel's delivered returns (``counts`` per batch of ``batch`` firings) as the point cloud, and
        each point's entry in the slot buffers."""
        c, d = self.config, self.device
        n_batches = counts.shape[0]
        ends = scratch.array("ends", n_batches, wp.int32)
        count = 0
        if n_batches:
            wp.utils.array_scan(counts, ends, inclusive=True)
            last = ends if wp.get_device(d).is_cpu else ends[n_batches - 1:n_batches]  # (CPU: a view, no copy)
            count = int(last.numpy()[-1])
        # every row of a wanted channel is written by the compaction; the others are empty
        rows = {k: count if k in chans or k in CORE_CHANNELS or k == "src" else 0 for k in _OUTPUT_LAYOUT}
        out = self._outputs.arrays(rows, reserve=scratch.n)
        src = out.pop("src")
        if count:
            _launch.launch(K.compact_kernel, n_batches,
                           [scratch.slots, p, em, tt, counts, ends, int(p.want), batch],
                           [out[k] for k in _OUTPUT_LAYOUT if k != "src"] + [src], device=d,  # (the kernel's order)
                           min_shard=max(1, _launch.MIN_SHARD // batch))
        out["Counts"] = wp.array(np.array([count], np.int32), dtype=wp.int32, device=d)
        channels = {k: out[k] for k in chans if k in out}
        origin_ns = int(self.scene.time_origin_us * 1000) if self.scene is not None else 0
        ts_ns, te_ns = frame
        params = {
            "frameId": self.frame_id,
            "timestampNs": origin_ns + ts_ns,
            "modality": 1,
            "frameOfReference": {FrameOfReference.SENSOR: 0, FrameOfReference.WORLD: 1,
                                 FrameOfReference.CUSTOM: 2}[c.output_frame_of_reference],
            "coordsType": int(c.elements_coords_type is CoordsType.SPHERICAL),
            "modelToAppTransform": MODEL_TO_APP.copy(),
            "frameStartTimeStampNs": origin_ns + ts_ns,
            "frameEndTimeStampNs": origin_ns + te_ns,
            "frameStartPosM": np.asarray(start_pose[0], np.float32),
            "frameStartOrientation": np.asarray(start_pose[1], np.float32),
            "frameEndPosM": np.asarray(end_pose[0], np.float32),
            "frameEndOrientation": np.asarray(end_pose[1], np.float32),
            "maxPoints": count,
            "motionCompensationState": int(c.output_motion_compensation_state is MotionCompensation.COMPENSATED),
            "compactionType": 1 if c.include_invalid_points else 2,
            "compensationReference": comp_ref,
        }
        return PointCloud(channels, typed_params(params)), src

    def with_config(self, **changes: Any) -> Lidar:
        """A copy of this lidar with config fields changed (same placement, scene, channels and, when the emitter
        count is unchanged, gain); enum fields accept tokens (``output_frame_of_reference="WORLD"``)."""
        cfg = self.config.replace(**changes)
        out = Lidar(config=cfg, scene=self.scene, trajectory=self.trajectory, channels=self.channels,
                    device=str(self.device))
        if cfg.number_of_emitters == self.config.number_of_emitters:
            out.gain = self.gain.copy()
        return out


#: Channels the compaction always fills (the identity channels are cheap, Coordinates and Intensity are what the
#: differentiable pass replaces); the others only when asked for (:func:`_wanted`).
CORE_CHANNELS = ("Flags", "Coordinates", "Intensity", "TimeOffsetNs", "EmitterId", "ChannelId", "TickId", "EchoId",
                 "TickState")

#: Channel → the LidarParams.want bit that computes it.
_WANT_BITS = {"HitNormal": K.WANT_NORMAL, "Velocity": K.WANT_VELOCITY, "ObjectId": K.WANT_OBJECT,
              "MaterialId": K.WANT_MATERIAL, "SemanticId": K.WANT_SEMANTIC}


def _wanted(chans: Sequence[str], requires_grad: bool) -> int:
    """LidarParams.want for a render delivering ``chans``: a channel nobody asked for is neither computed nor
    written (Velocity, for one, costs two more sensor poses per firing and three instance poses per moving hit)."""
    w = 0
    for name, bit in _WANT_BITS.items():
        if name in chans:
            w |= int(bit)
    return w | (int(K.WANT_DIFF) if requires_grad else 0)


def _with_trig(em: K.EmitterTable) -> K.EmitterTable:
    """``em`` with its ``trig`` table made from its angles (the kernels read cosines and sines from it)."""
    em.trig = wp.empty(em.az.shape[0], dtype=wp.vec4, device=em.az.device)
    wp.launch(K.emitter_trig_kernel, em.az.shape[0], [em.az, em.el], [em.trig], device=em.az.device)
    return em


def _members(n: int, d) -> K.Members:
    m = K.Members()
    m.owner, m.subray, m.face, m.inst, m.material = (wp.zeros(n, dtype=wp.int32, device=d) for _ in range(5))
    m.tau = wp.zeros(n, dtype=float, device=d)
    return m


#: The arrays of a delivered point cloud: name → (dtype, shape for n points), in the order
#: :func:`wsim.kernels.lidar.compact_kernel` takes them; "src" is each point's entry in the slot buffers.
_OUTPUT_LAYOUT: dict[str, tuple[Any, Any]] = {
    "Flags": (wp.uint8, lambda n: (n,)), "Coordinates": (float, lambda n: (3, n)), "Intensity": (float, lambda n: (n,)),
    "TimeOffsetNs": (wp.int32, lambda n: (n,)), "EmitterId": (wp.uint32, lambda n: (n,)),
    "ChannelId": (wp.uint32, lambda n: (n,)), "TickId": (wp.uint32, lambda n: (n,)),
    "EchoId": (wp.uint8, lambda n: (n,)), "TickState": (wp.uint8, lambda n: (n,)),
    "MaterialId": (wp.uint32, lambda n: (n,)), "ObjectId": (wp.uint32, lambda n: (n, 4)),
    "HitNormal": (float, lambda n: (n, 3)), "Velocity": (float, lambda n: (n, 3)),
    "SemanticId": (wp.int32, lambda n: (n,)), "src": (wp.int32, lambda n: (n,)),
}

#: Bytes per point of each :data:`_OUTPUT_LAYOUT` array.
_POINT_BYTES = {k: int(np.prod(shape(1))) * wp.types.type_size_in_bytes(dtype) for k, (dtype, shape) in
                _OUTPUT_LAYOUT.items()}


class _OutputBlocks:
    """Memory for the point clouds a lidar delivers: each render's arrays are views into one block, and the block
    serves a later render once every one of them is gone (the user's point cloud and all made from it). A stream of
    sweeps then writes its output into pages already mapped: a fresh allocation of a few MB takes a page fault at
    every first write (about 1,000 a sweep of AT128 or PANDAR128, 5–7 % of the sweep on the CPU)."""

    ALIGN = 64  # bytes, each array's start (as Warp's own allocations)
    KEEP = 2  # free blocks kept

    def __init__(self, device) -> None:
        self.device = device
        self._free: list[wp.array] = []
        self._lock = threading.Lock()
        # blocks whose views are all gone; appended by a finalizer, on whatever thread drops the last view, even
        # inside arrays() (a garbage collection there): no lock, deque.append is atomic
        self._returned: collections.deque[wp.array] = collections.deque()

    def _offsets(self, rows: dict[str, int]) -> tuple[dict[str, int], int]:
        off, at = {}, 0
        for k, n in rows.items():
            off[k] = at
            at += -(-n * _POINT_BYTES[k] // self.ALIGN) * self.ALIGN
        return off, at

    def _take(self, size: int) -> wp.array | None:
        """A free block of at least ``size`` bytes, the last one freed (warmest in the caches), or None."""
        with self._lock:
            while self._returned:
                self._free = self._free[-(self.KEEP - 1):] + [self._returned.popleft()]
            for i in range(len(self._free) - 1, -1, -1):
                if self._free[i].shape[0] >= size:
                    return self._free.pop(i)
        return None

    def arrays(self, rows: dict[str, int], reserve: int) -> dict[str, wp.array]:
        """Uninitialised arrays of ``rows[name]`` points each (:data:`_OUTPUT_LAYOUT`), in a block big enough for
        ``reserve`` points of every non-empty one (so that the next render's block is this one)."""
        off, size = self._offsets(rows)
        out = {k: wp.empty(_OUTPUT_LAYOUT[k][1](0), dtype=_OUTPUT_LAYOUT[k][0], device=self.device)
               for k, n in rows.items() if n == 0}
        if size == 0:
            return out
        block = self._take(size)
        if block is None:
            full = self._offsets({k: max(n, reserve) if n else 0 for k, n in rows.items()})[1]
            block = wp.empty(max(size, full), dtype=wp.uint8, device=self.device)
        holder = _BlockHolder()  # held by every view (through its deleter); gone with the last of them
        weakref.finalize(holder, self._returned.append, block)

        def held(_ptr: int, _size: int, _holder: _BlockHolder = holder) -> None:  # (the block frees nothing)
            pass

        for k, n in rows.items():
            if n:
                dtype, shape = _OUTPUT_LAYOUT[k]
                out[k] = wp.array(ptr=block.ptr + off[k], dtype=dtype, shape=shape(n), device=self.device,
                                  deleter=held)
        return out


class _BlockHolder:
    """What the views of one output block hold in common (:class:`_OutputBlocks`)."""

    __slots__ = ("__weakref__",)


class _Scratch:
    """The buffers of one render that do not outlive it: its slot buffers for ``n`` slots (:func:`_alloc_slots`)
    and named arrays (tick and key-pose tables, firing poses, first surfaces, batch counts and their scan), handed
    on to the next render of the same size so that a stream of sweeps allocates, and page-faults, none of them."""

    def __init__(self, n: int, device) -> None:
        self.n = n
        self.device = device
        self.slots = _alloc_slots(n, device)
        self._arrays: dict[str, wp.array] = {}

    def array(self, name: str, n: int, dtype) -> wp.array:
        """The uninitialised array ``name`` of ``n`` elements of ``dtype`` (the last render's when it matches)."""
        a = self._arrays.get(name)
        if a is None or a.shape[0] != n or a.dtype != dtype:
            a = self._arrays[name] = wp.empty(n, dtype=dtype, device=self.device)
        return a

    def filled(self, name: str, values: np.ndarray, dtype) -> wp.array:
        """The array ``name`` holding ``values`` (one element of ``dtype`` per row, cast as ``wp.array`` casts them):
        on the CPU written in place, a few microseconds where a new array from NumPy costs some twenty."""
        values = np.asarray(values)
        if not wp.get_device(self.device).is_cpu:
            self._arrays[name] = wp.array(values, dtype=dtype, device=self.device)
            return self._arrays[name]
        a = self.array(name, values.shape[0], dtype)
        view = a.numpy()
        view[...] = values.reshape(view.shape)
        return a


def _alloc_slots(n: int, d) -> K.Slots:
    """Slot buffers for ``n`` entries (firings × maxReturns), uninitialised:
    :func:`wsim.kernels.lidar.lidar_fire_kernel` writes every channel the compaction reads of each return it delivers
    (:class:`wsim.kernels.lidar.Slots`)."""
    n = max(n, 1)
    s = K.Slots()
    for name, dtype in (("slot_id", wp.int32), ("flags", wp.uint8), ("coords", wp.vec3), ("intensity", float),
                        ("material_id", wp.uint32), ("object_id", wp.vec4ui), ("normal", wp.vec3),
                        ("velocity", wp.vec3), ("semantic", wp.int32), ("face", wp.int32), ("inst", wp.int32),
                        ("material", wp.int32),
                        ("subray", wp.int32), ("tau", float), ("rep_t", float), ("rep_s", float), ("peak_r", float),
                        ("peak_s", float), ("noise", wp.vec3)):
        setattr(s, name, wp.empty(n, dtype=dtype, device=d))
    return s


def _common_prim_path(paths: list[str]) -> str:
    """The deepest prim path shared by all ``paths`` (a mesh and its GeomSubsets → the mesh)."""
    if len(paths) == 1:
        return paths[0]
    common: list[str] = []
    for comps in zip(*(p.split("/") for p in paths)):
        if any(c != comps[0] for c in comps):
            break
        common.append(comps[0])
    return "/".join(common) or paths[0]


def object_id_tables(scene: Scene) -> tuple[np.ndarray, np.ndarray]:
    """ObjectId tables: (max object id + 1, 3) uint32 — a stable 96-bit hash (BLAKE2b) of each object's prim path —
    and (n_parts,) uint32 — each part's number within its object (GeomSubset order)."""
    names: dict[int, list[str]] = {}
    for p in scene.parts:
        if p.object_id:
            names.setdefault(p.object_id, []).append(p.name)
    for inst in scene.instances:
        names[inst.object_id] = [inst.name]
    size = max([0, *names.keys()]) + 1
    table = np.zeros((size, 3), np.uint32)
    for oid, ns in names.items():
        digest = hashlib.blake2b(_common_prim_path(ns).encode(), digest_size=12).digest()
        table[oid] = np.frombuffer(digest, dtype="<u4")
    part_number = np.zeros(len(scene.parts), np.uint32)
    groups: dict[Any, int] = {}
    for i, p in enumerate(scene.parts):
        key = ("obj", p.object_id) if p.object_id else ("part", i)
        part_number[i] = groups.get(key, 0)
        groups[key] = part_number[i] + 1
    for proto in scene.prototypes:
        for rank, part in enumerate(np.unique(proto.tri_part)):
            part_number[part] = rank
    return table, part_number
