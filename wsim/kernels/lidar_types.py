"""The lidar's device tables and records: constants, the parameter / emitter / tick tables the host fills, the slot
buffers the kernels write, and the records one firing passes between its steps (:mod:`wsim.kernels.lidar`)."""

import warp as wp

from .packet import PACKET, vec64f, vec64i
from .trace import Hit

MAX_CONTRIB = PACKET  # beam contributions per firing (sub-rays × surfaces per sub-ray): 64, a packet's rays
MAX_ECHOES = 8  # echoes per firing (LidarConfig.max_returns <= 8)
vec8f = wp.types.vector(length=MAX_ECHOES, dtype=float)
vec8i = wp.types.vector(length=MAX_ECHOES, dtype=wp.int32)

FLAG_VALID = wp.constant(wp.uint8(0x40))
FLAG_NEW_SCAN = wp.constant(wp.uint8(0x20))
#: Retroreflective gain: the effective reflectance is ρ·(1 + RETRO_GAIN·cos⁴θ) (strong only near normal incidence).
RETRO_GAIN = wp.constant(20.0)

RAY_IDEALIZED = 0
RAY_GAUSSIAN = 1
RAY_UNIFORM = 2

FRAME_SENSOR = 0
FRAME_WORLD = 1
FRAME_CUSTOM = 2

# LidarParams.want: the slot channels a render computes and writes (bits); Coordinates, Intensity, Flags and the
# identity channels are always written
WANT_NORMAL = wp.constant(1)  # HitNormal
WANT_VELOCITY = wp.constant(2)  # Velocity (and the ±1 ms sensor poses it needs)
WANT_OBJECT = wp.constant(4)  # ObjectId
WANT_MATERIAL = wp.constant(8)  # MaterialId
WANT_SEMANTIC = wp.constant(16)  # SemanticId
WANT_DIFF = wp.constant(32)  # what the differentiable pass reads back (surface, sub-ray, signals, noise)


@wp.struct
class LidarParams:
    """Scalar settings of a lidar render (SI units; angles in radians)."""

    num_emitters: wp.int32
    rotary: wp.int32
    ccw: wp.int32
    scan_rate: float  # scans per second [1/s] (the reciprocal of the scan period)
    start_az_offset: float
    valid_start: float
    valid_end: float
    near: float
    far: float
    range_res: float
    min_echo_dist: float
    max_returns: wp.int32
    ray_type: wp.int32
    beam_n: wp.int32
    hits_per_subray: wp.int32
    div_h: float
    div_v: float
    processing: wp.int32  # 0 RAW, 1 NORMALIZATION, 2 CORRECTION
    nonlinear: wp.int32
    scale: float
    detect_threshold: float
    range_noise: float
    az_noise: float
    el_noise: float
    seed: wp.int32
    instant: wp.int32
    window_filter: wp.int32
    frame: wp.int32  # FRAME_SENSOR, FRAME_WORLD, FRAME_CUSTOM
    compensated: wp.int32
    spherical: wp.int32
    want: wp.int32  # WANT_* bits
    custom: wp.mat44  # world → CUSTOM frame (customFrameOfReferenceTrafo)
    keep_invalid: wp.int32  # 1: every echo slot of a fired emitter is delivered (includeInvalidPoints), 0: valid ones
    packet: wp.int32  # 1: a beam's sub-rays traverse the static wide BVH as one packet (CPU)
    beam: wp.array[wp.vec3]  # per sub-ray k: tan of its horizontal and vertical offset angles, weight / Σ weights
    beam_tan: float  # tan of the largest angle between a sub-ray and the beam's centre
    smooth: wp.int32  # 1: incidence angles from the interpolated vertex normals (smooth shading normals)


@wp.struct
class EmitterTable:
    """Per-state emitter arrays, flattened [state · num_emitters + emitter]; angles [rad], offsets [m]."""

    az: wp.array[float]
    el: wp.array[float]
    fire_ns: wp.array[wp.int32]
    channel: wp.array[wp.uint32]
    hor: wp.array[float]
    vert: wp.array[float]
    dcorr: wp.array[float]
    trig: wp.array[wp.vec4]  # (cos az, sin az, cos el, sin el) of each entry (:func:`~wsim.kernels.lidar.emitter_trig_kernel`)


@wp.struct
class TickTable:
    """The ticks of one render: time on the scene clock [s], offset from timestampNs [ns], ids."""

    time: wp.array[float]
    rel_scan: wp.array[float]  # tick time − its scan's start [s]
    offset_ns: wp.array[wp.int64]  # tick time − timestampNs [ns]
    window_lo_ns: wp.array[wp.int64]  # step window relative to the tick [ns]: fire if lo <= key < hi
    window_hi_ns: wp.array[wp.int64]
    period_ns: wp.array[wp.int64]  # tick period [ns] (key = min(fire time, period − 1))
    tick_id: wp.array[wp.int32]
    state: wp.array[wp.int32]
    scan: wp.array[wp.int32]


@wp.struct
class Slots:
    """The returns a render delivers, before compaction, packed by batch of firings: a batch of
    :func:`~wsim.kernels.lidar.lidar_fire_kernel` (firings ``b · batch`` on) writes its delivered returns in firing
    and echo order from entry ``b · batch · max_returns`` on, and their count. Entry q is return
    ``slot % max_returns`` of firing ``slot // max_returns`` (``slot = slot_id[q]``; its identity channels are the
    compaction's, from the firing)."""

    slot_id: wp.array[wp.int32]
    flags: wp.array[wp.uint8]
    coords: wp.array[wp.vec3]
    intensity: wp.array[float]
    material_id: wp.array[wp.uint32]
    object_id: wp.array[wp.vec4ui]
    normal: wp.array[wp.vec3]
    velocity: wp.array[wp.vec3]
    semantic: wp.array[wp.int32]
    # what the differentiable pass needs to recompute a return from its surface
    face: wp.array[wp.int32]
    inst: wp.array[wp.int32]
    material: wp.array[wp.int32]
    subray: wp.array[wp.int32]
    tau: wp.array[float]  # sub-ray weight × transmittance before the surface
    rep_t: wp.array[float]  # representative surface distance [m] (forward value)
    rep_s: wp.array[float]  # representative contribution signal (forward value)
    peak_r: wp.array[float]  # echo range before corrections [m]
    peak_s: wp.array[float]  # echo signal
    noise: wp.array[wp.vec3]  # range [m], azimuth [rad], elevation [rad] noise drawn for this return



@wp.struct
class Firing:
    """One emitter fired in one tick: what the schedule step decides."""

    index: wp.int32  # firing index: tick row · num_emitters + emitter
    tick: wp.int32  # row in the TickTable
    emitter: wp.int32
    state: wp.int32  # emitter state of the tick
    table: wp.int32  # index into the EmitterTable: state · num_emitters + emitter
    fire_ns: wp.int64  # firing delay within the tick [ns]
    time: float  # firing time on the scene clock [s] (the render's first tick for an instant lidar)
    offset_ns: wp.int64  # TimeOffsetNs: firing time − timestampNs [ns]
    az: float  # delivered azimuth [rad], in (−π, π]
    phase: float  # delivered azimuth less the emitter's table azimuth [rad]
    el: float  # elevation [rad]
    fires: wp.int32  # 1 inside the step window and the azimuth window


@wp.struct
class FiringRay:
    """The sensor pose at a firing and the emitter's ray, in the world and in the sensor frame."""

    sensor: wp.transform  # sensor-to-world pose at the firing time
    key: wp.int32  # trajectory key of the firing time's segment
    offset: wp.vec3  # sensor displacement from that key to the firing [m]
    origin: wp.vec3  # emitter position, world [m]
    dir: wp.vec3  # unit direction, world
    origin_s: wp.vec3  # emitter position, sensor frame [m]
    dir_s: wp.vec3  # unit direction, sensor frame
    cos_el: float  # cosine of the elevation: the direction's horizontal length in the sensor frame


@wp.struct
class Contributions:
    """Beam contributions of one firing sorted by range: range [m], signal, code (sub-ray · hits_per_subray +
    depth of the surface along its sub-ray), sub-ray weight × transmittance before the surface."""

    m: wp.int32
    r: vec64f
    s: vec64f
    code: vec64i
    tau: vec64f
    # each surface's record by code (not by range order): face, instance (−1: static), barycentrics, unit normal;
    # with its range it rebuilds the surface's Hit (trace.hit_record) without a second query
    face: vec64i
    inst: vec64i
    u: vec64f
    v: vec64f
    nx: vec64f
    ny: vec64f
    nz: vec64f


@wp.struct
class Peaks:
    """Contributions merged into peaks (in range order)."""

    n: wp.int32
    sum_sr: vec64f  # Σ s·r
    sum_s: vec64f  # Σ s
    count: vec64f  # members
    sum_r: vec64f  # Σ r (unweighted, for zero-signal peaks)
    best_s: vec64f  # strongest member's signal
    best_code: vec64i  # strongest member's code
    best_tau: vec64f  # strongest member's weight·τ
    best_r: vec64f  # strongest member's range [m] (the distance of its surface along its sub-ray)


@wp.struct
class Echoes:
    """Echoes of one firing in EchoId order: range [m], signal, code and weight·τ of the representative surface
    (see :class:`Contributions`)."""

    n: wp.int32
    r: vec8f
    s: vec8f
    code: vec8i
    tau: vec8f
    rep_r: vec8f  # the representative surface's distance along its (sub-)ray [m]


@wp.struct
class EchoSurfaces:
    """A beam's echoes' representative surfaces, in EchoId order, as :class:`Contributions` records them: face,
    instance (−1: static), barycentrics, unit normal (with :class:`Echoes` ``rep_r``, their Hit records)."""

    face: vec8i
    inst: vec8i
    u: vec8f
    v: vec8f
    nx: vec8f
    ny: vec8f
    nz: vec8f


@wp.struct
class OutputFrame:
    """Poses the output step needs for one firing."""

    sensor: wp.transform  # sensor pose at the firing time
    ref: wp.transform  # sensor pose at the compensation reference time
    shift_ref: wp.vec3  # sensor displacement T(ref) − T(firing) [m] (COMPENSATED)
    # Velocity (only when wanted): a surface point q [m] (world axes, from the sensor at the firing) moving at v_w
    # [m/s] moves at vel_q·q + vel_c + vel_w·v_w [m/s] relative to the sensor, in the output frame's axes
    vel_q: wp.mat33
    vel_c: wp.vec3
    vel_w: wp.mat33


@wp.struct
class FiringPose:
    """The firing pose and output-frame poses shared by every firing of one tick at one firing time (computed once
    per tick and distinct firing delay by :func:`wsim.kernels.lidar.firing_pose_kernel`)."""

    key: wp.int32  # trajectory key of the firing time's segment
    offset: wp.vec3  # sensor displacement from that key to the firing [m]
    frame: OutputFrame  # sensor pose at the firing and the output step's poses
    phase: float  # delivered azimuth less the emitter's table azimuth [rad] (:func:`~wsim.kernels.lidar.firing_phase`)
    fires: wp.int32  # 1: inside the step window and the azimuth window
    phase_cs: wp.vec2  # (cos, sin) of the phase


@wp.struct
class Members:
    """Every contribution of the delivered beam echoes (differentiable pass), grouped by return in range order:
    the return it belongs to, its sub-ray, its surface (face, instance, material) and its sub-ray weight × the
    transmittance before the surface."""

    owner: wp.array[wp.int32]  # delivered return (row of the point cloud)
    subray: wp.array[wp.int32]
    face: wp.array[wp.int32]
    inst: wp.array[wp.int32]
    material: wp.array[wp.int32]
    tau: wp.array[float]
