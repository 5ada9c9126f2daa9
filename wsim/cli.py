"""The ``wsim`` command: ``wsim demo`` renders the built-in scene; ``wsim info`` describes a scene."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

#: Roof lidar mount in the rig frame (x forward, y left, z up) [m] used by the demo.
ROOF_MOUNT_M = np.array([1.0, 0.0, 1.9])


def _summary(scene) -> list[str]:
    moving = sum(1 for i in scene.instances if i.is_moving)
    return [
        f"scene            {scene.scene_id}  ({scene.source or 'in memory'})",
        f"triangles        {scene.num_triangles:,} (static {scene.static.num_triangles:,}, "
        f"{len(scene.prototypes)} prototypes)",
        f"instances        {len(scene.instances)} ({moving} moving)",
        f"materials        {len(scene.materials)}; semantic classes {len(scene.semantic_classes)}",
        f"cameras          {', '.join(sorted(scene.cameras)) or '-'}",
        f"time range       {scene.time_range[0]:.2f} .. {scene.time_range[1]:.2f} s",
    ]


def _mount(scene, name: str) -> tuple:
    """Sensor-to-rig pose (translation [m], quaternion xyzw) of the scene rig's lidar of type ``name``
    (``metadata["sensor_rig"]["lidars"]``); the roof mount if the scene has none."""
    rig = scene.metadata.get("sensor_rig", {}) if isinstance(scene.metadata, dict) else {}
    for m in (rig.get("lidars") or {}).values():
        if str(m.get("type", "")).upper() == name:
            return tuple(m["translation"]), tuple(m.get("rotation_xyzw", (0.0, 0.0, 0.0, 1.0)))
    return tuple(ROOF_MOUNT_M), (0.0, 0.0, 0.0, 1.0)


def _lidar_overlay(cam, color: np.ndarray, pc, scene, distance: np.ndarray, t0: float, t1: float,
                   vmax: float = 60.0):
    """A WORLD-frame Cartesian lidar PointCloud projected into the camera image (rolling-shutter solve): points on
    moving objects are moved with their object from their firing time to the readout time of the pixel that images
    them, points behind the camera's own surface (``distance``, the frame's DISTANCE image) by more than
    max(0.5 m, 3 %) are dropped, the rest coloured by distance from the camera (Turbo, 0-``vmax`` m).

    Returns:
        (image (H, W, 3) uint8, :class:`wsim.sensors.figures.LidarOnCamera`).
    """
    from wsim.sensors.figures import draw_lidar_points, lidar_point_instances, lidar_point_times, project_lidar

    proj = project_lidar(cam, pc.xyz(), t0, t1, distance=distance, scene=scene,
                         instance=lidar_point_instances(pc, scene), times=lidar_point_times(pc, scene))
    return draw_lidar_points(color, proj, vmax), proj


def demo(args: argparse.Namespace) -> int:
    load_t0 = time.perf_counter()
    scene = _check_demo_time(args)  # loads the scene; --time must lie inside its time range, before any work
    load_s = time.perf_counter() - load_t0
    from PIL import Image
    from tqdm import tqdm

    import wsim
    from wsim.scene.transforms import quat_to_matrix
    from wsim.sensors.panorama import render_panorama
    from wsim.sensors import figures
    from wsim.sensors.lidar_config import CoordsType, FrameOfReference
    from wsim.sensors.topdown import topdown_image

    out = Path(args.out)
    figs = out / "figures"  # the annotated pictures (title, colour bars / legend, axes) of the raw images
    figs.mkdir(parents=True, exist_ok=True)
    fig_s = 0.0
    steps = tqdm(total=6, desc="wsim demo", unit="step", disable=args.quiet)
    steps.update()
    t_render = float(args.time)
    if scene.ego_trajectory is not None:
        tr, q = scene.ego_trajectory.pose_at(t_render)
        position = tr + quat_to_matrix(q) @ ROOF_MOUNT_M
        heading = float(np.arctan2(quat_to_matrix(q)[1, 0], quat_to_matrix(q)[0, 0]))  # ego yaw [rad]
    else:
        position, heading = ROOF_MOUNT_M, 0.0
    t0 = time.perf_counter()
    scene.device_geometry(args.device)
    build_s = time.perf_counter() - t0
    steps.update()
    pano = render_panorama(scene, position, time=t_render, heading_rad=heading, device=args.device)
    png = out / "panorama_range_intensity.png"
    Image.fromarray(pano.to_image()).save(png)
    t0 = time.perf_counter()
    figures.panorama_figure(pano, title=(
        f"360° range and intensity panorama from the roof ({position[0]:.2f}, {position[1]:.2f}, "
        f"{position[2]:.2f}) m, every ray at t = {t_render:.2f} s ({pano.range_m.shape[1]} x "
        f"{pano.range_m.shape[0]} rays, {360 / pano.range_m.shape[1]:.2f}° x "
        f"{abs(pano.elevation_deg[0] - pano.elevation_deg[1]):.2f}°)")).save(figs / png.name)
    fig_s += time.perf_counter() - t0
    steps.update()
    lidar_lines = []
    for name in ("PANDAR128", "AT128"):
        steps.set_postfix_str(name)
        lidar = wsim.Lidar.preset(name, scene=scene, rig=scene.ego_trajectory, mount=_mount(scene, name),
                                  device=args.device)
        t_scan = np.floor(t_render * 10.0 + 1e-9) / 10.0  # the 0.1 s scan that ends at the render time
        t0 = time.perf_counter()
        pc = lidar.render(t_scan - 0.1, t_scan)
        dt = time.perf_counter() - t0
        stem = out / f"lidar_{name.lower()}"
        pc.write_ply(stem.with_suffix(".ply"))
        inten = pc["Intensity"].numpy()
        Image.fromarray(topdown_image(pc.xyz(), inten)).save(stem.with_name(stem.name + "_topdown.png"))
        t0 = time.perf_counter()
        figures.topdown_figure(pc.xyz(), inten, title=(
            f"{name} seen from above: {pc.count:,} returns of the scan {t_scan - 0.1:.1f}-{t_scan:.1f} s, "
            "coloured by intensity"), frame_name=f"{name} sensor frame").save(figs / (stem.name + "_topdown.png"))
        fig_s += time.perf_counter() - t0
        lidar_lines.append(f"{name.lower():<16} {pc.count:,} points in {dt:.2f} s (scan {t_scan - 0.1:.1f}-"
                           f"{t_scan:.1f} s, mean intensity {inten.mean():.3f}) -> {stem.name}.ply, "
                           f"{stem.name}_topdown.png")
        steps.update()
        if name == "PANDAR128":
            world_lidar = lidar.with_config(output_frame_of_reference=FrameOfReference.WORLD,
                                            elements_coords_type=CoordsType.CARTESIAN)
            world_pc = world_lidar.render(t_scan - 0.1, t_scan)  # with ObjectId and TimeOffsetNs per point
    # the front f-theta camera at the moving ego pose: colour, distance, semantics, and the sweep overlaid
    steps.set_postfix_str("camera")
    cam_id = "camera_front_wide_120fov"
    camera_lines = []
    if cam_id in scene.cameras:
        cam = wsim.Camera.from_scene(scene, cam_id, width=args.width, height=args.width * 9 // 16,
                                     device=args.device)
        c0, c1 = t_render, t_render + 0.03  # 30 ms rolling-shutter readout
        t0 = time.perf_counter()
        frame = cam.render(scene, c0, c1, products=("color", "distance", "distance_colorized", "semantics",
                                                    "semantics_colorized"))
        dt = time.perf_counter() - t0
        color, distance = frame.color.numpy(), frame.distance.numpy()
        Image.fromarray(color).save(out / "camera_front_color.png")
        Image.fromarray(frame.distance_colorized.numpy()).save(out / "camera_front_distance.png")
        Image.fromarray(frame.semantics_colorized.numpy()).save(out / "camera_front_semantics.png")
        np.save(out / "camera_front_distance_m.npy", distance)
        t0 = time.perf_counter()
        overlay, proj = _lidar_overlay(cam, color, world_pc, scene, distance, c0, c1)
        overlay_s = time.perf_counter() - t0
        Image.fromarray(overlay).save(out / "camera_front_lidar_overlay.png")
        n_in, n_occ = int(proj.in_image.sum()), int((proj.in_image & proj.occluded).sum())
        n_mov = int((proj.visible & proj.compensated).sum())
        t0 = time.perf_counter()
        when = f"{cam.width}x{cam.height}, rolling shutter {c0:.3f}-{c1:.3f} s"
        figures.camera_figure(color, title=f"{cam_id} colour ({when})").save(figs / "camera_front_color.png")
        figures.camera_figure(frame.distance_colorized.numpy(), colorbar=(frame.vmax, "distance [m]"),
                              title=f"{cam_id} distance from the camera centre ({when})",
                              notes=["black: no hit (sky) or outside the lens's field of view; "
                                     "raw values [m]: camera_front_distance_m.npy"]
                              ).save(figs / "camera_front_distance.png")
        figures.camera_figure(frame.semantics_colorized.numpy(), title=f"{cam_id} semantic classes ({when})",
                              legend=figures.semantic_legend(frame.semantics.numpy(), frame.semantic_classes),
                              legend_heading="class, share of pixels").save(figs / "camera_front_semantics.png")
        figures.camera_figure(overlay, colorbar=(60.0, "distance from camera [m]"), title=(
            f"PANDAR128 scan {t_scan - 0.1:.1f}-{t_scan:.1f} s on {cam_id} ({when})"), notes=[
            f"{n_in - n_occ:,} of the scan's {world_pc.count:,} points drawn where the rolling shutter images "
            f"them; {n_occ:,} more ({n_occ / max(n_in, 1):.1%} of those in the image) dropped as occluded: farther "
            "than the camera's distance image at their pixel by > max(0.5 m, 3 %).",
            f"{n_mov:,} points on moving objects moved with their object from the firing time to the pixel's "
            "readout time."]
        ).save(figs / "camera_front_lidar_overlay.png")
        fig_s += time.perf_counter() - t0
        camera_lines.append(f"{cam_id:<16} {cam.width}x{cam.height} rolling shutter in {dt:.2f} s -> "
                            "camera_front_{color,distance,semantics,lidar_overlay}.png")
        camera_lines.append(f"lidar overlay    {n_in - n_occ:,} pandar128 points drawn, {n_occ:,} "
                            f"({n_occ / max(n_in, 1):.1%} of those in the image) dropped as occluded, {n_mov:,} on "
                            f"moving objects motion-compensated, in {overlay_s:.2f} s")
    steps.update()
    steps.close()
    hit = float((pano.range_m > 0).mean())
    lines = _summary(scene) + [
        f"load / build     {load_s:.2f} s / {build_s:.2f} s",
        f"panorama         {pano.range_m.shape[1]}x{pano.range_m.shape[0]} rays at t={t_render:.2f} s from "
        f"({position[0]:.2f}, {position[1]:.2f}, {position[2]:.2f}) m: {hit:.1%} hit, "
        f"median range {np.median(pano.range_m[pano.range_m > 0]):.1f} m",
        f"trace rate       {pano.rays_per_second / 1e6:.2f} M closest-hit rays/s",
        *lidar_lines,
        *camera_lines,
        f"figures          titles, colour bars with units, class legend, azimuth/elevation ticks, top-down axes, "
        f"scale bar and sensor marker in {fig_s:.2f} s -> figures/<same name>.png",
        f"wrote            {out}/",
    ]
    text = "\n".join(lines)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``wsim render: error: ...`` (no usage block; ``--help`` shows it)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _check_device(name: str | None) -> None:
    """``--device``: a Warp device that exists here (checked before any work starts)."""
    if name is None:
        return
    import warp as wp

    known = ", ".join(str(d) for d in wp.get_devices())
    if name.startswith("cuda") and wp.get_cuda_device_count() == 0:
        # asked before wp.get_device: without a driver, Warp's native library prints its own errors for "cuda"
        raise ValueError(f"--device {name}: no CUDA device (Warp found no NVIDIA GPU and driver; devices here: "
                         f"{known})")
    try:
        wp.get_device(name)
    except (ValueError, RuntimeError):
        raise ValueError(f"--device {name}: no such Warp device (devices here: {known})") from None


def _check_port(host: str, port: int) -> None:
    """``wsim serve --host/--port``: the address can be listened on, checked before the scenes load and warm up. gRPC
    itself would bind with SO_REUSEPORT, which lets a second server share the port of a running one unnoticed."""
    import errno
    import socket

    if port == 0:
        return
    if not 0 < port < 65536:
        raise ValueError(f"--port {port}: not a TCP port (1-65535, or 0 for a free one)")
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: a port left in TIME_WAIT is free
            try:
                s.bind(addr)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise OSError(f"--port {port}: {host}:{port} is already in use (another server?); choose "
                                  "another --port") from None
                if e.errno == errno.EACCES:
                    raise OSError(f"--port {port}: no permission to listen on {host}:{port}") from None
                # anything else (say, no IPv6 here): gRPC binds what it can and reports the rest


def _check_times(scene, *times: tuple[str, float]) -> None:
    """One policy for every sensor of every command: each time a command renders at, given as (what, t [s]), lies in
    the scene's time range (a scene without one, start == end, takes any time); else one error naming the option."""
    lo, hi = scene.time_range
    if hi <= lo:
        return
    for what, t in times:
        if not lo - 1e-9 <= t <= hi + 1e-9:
            raise ValueError(f"{what} is outside the scene's time range [{lo:.2f}, {hi:.2f}] s")


def _check_demo_time(args: argparse.Namespace):
    """``wsim demo --time T``: the demo renders the 0.1 s lidar scan that ends at the last 0.1 s step <= T and a 30 ms
    camera readout from T; both must lie in the scene's time range. Returns the loaded scene."""
    import math

    import wsim

    scene = wsim.load_scene(args.scene)
    lo, hi = scene.time_range
    t = float(args.time)
    t_scan = math.floor(t * 10.0 + 1e-9) / 10.0
    if hi > lo and not (t_scan - 0.1 >= lo - 1e-9 and t + 0.03 <= hi + 1e-9):
        first = math.ceil(lo * 10.0 - 1e-9) / 10.0 + 0.1
        raise ValueError(f"--time {t:.3f} s is outside the demo's range [{first:.2f}, {hi - 0.03:.2f}] s (the scene's "
                         f"time range [{lo:.2f}, {hi:.2f}] s less the 0.1 s lidar scan before --time and the 30 ms "
                         "camera readout after it)")
    return scene


def info(args: argparse.Namespace) -> int:
    import wsim

    print("\n".join(_summary(wsim.load_scene(args.scene))))
    return 0


def render(args: argparse.Namespace) -> int:
    """Render one sensor of a scene's rig over [t0, t1] and write the result."""
    from PIL import Image

    import wsim

    scene = wsim.load_scene(args.scene)
    name = args.sensor
    lidar = name.upper() in ("PANDAR128", "AT128")
    if not lidar and name not in scene.cameras:
        known = ", ".join(["PANDAR128", "AT128", *sorted(scene.cameras)])
        raise wsim.SceneError(f"--sensor: no sensor {name!r} in {scene.scene_id} (known: {known})")
    t0 = float(args.t0)
    span = 0.1 if lidar else 0.03
    t1 = float(args.t1) if args.t1 is not None else t0 + span
    t1_what = f"--t1 {t1:.3f} s" if args.t1 is not None else f"--t1 {t1:.3f} s (default: --t0 + {span} s)"
    _check_times(scene, (f"--t0 {t0:.3f} s", t0), (t1_what, t1))
    if t1 < t0:
        raise ValueError(f"--t1 {t1:.3f} s is before --t0 {t0:.3f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if lidar:
        lidar = wsim.Lidar.preset(name.upper(), scene=scene, rig=scene.ego_trajectory,
                                  mount=_mount(scene, name.upper()), device=args.device, partial_outputs=True)
        pc = lidar.render(t0, t1)
        pc.write_ply(out)
        print(f"{name.upper()}: {pc.count:,} points fired in [{t0:.3f}, {t1:.3f}) s -> {out}")
        return 0
    w, h = scene.cameras[name].resolution
    size = {"width": args.width, "height": round(args.width * h / w)} if args.width else {}
    cam = wsim.Camera.from_scene(scene, name, device=args.device, **size)
    frame = cam.render(scene, t0, t1, products=("color", "distance"))
    Image.fromarray(frame.color.numpy()).save(out)
    np.save(out.with_suffix(".distance.npy"), frame.distance.numpy())
    print(f"{name}: {cam.width}x{cam.height} over [{t0:.3f}, {t1:.3f}] s -> {out} (+ {out.stem}.distance.npy [m])")
    return 0


def dataset(args: argparse.Namespace) -> int:
    """``wsim dataset SPEC --out DIR``: render a dataset spec (README "Datasets"); 1 if any shard failed."""
    from wsim.dataset import plan_dataset, print_summary, run_dataset
    from wsim.dataset.spec import load_spec

    spec = load_spec(args.spec)
    if args.device is not None:
        import dataclasses

        spec = dataclasses.replace(spec, device=args.device)
    plan = plan_dataset(spec)
    if args.dry_run:
        for name, sc in plan.scenes.items():
            print(f"scene            {name}: {sc['frames']} frames ({sc['source']})")
        print(f"plan             {len(plan.shards)} shards x up to {spec.frames.chunk} frames, {plan.num_frames} frames "
              f"({len(spec.variants)} variant{'s' * (len(spec.variants) > 1)}) -> {args.out}")
        return 0
    summary = run_dataset(spec, args.out, workers=args.workers, threads=args.threads, ray=args.ray,
                          retries=args.retries, progress=not args.quiet, verbose=args.verbose, plan=plan)
    print_summary(summary)
    if summary.failures:
        print(f"wsim: error: {len(summary.failures)} of {summary.shards} shards failed (first: "
              f"{summary.failures[0][0]}: {summary.failures[0][1]}); run the same command again to retry them",
              file=sys.stderr)
        return 1
    return 0


def _one_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    return "; ".join(lines) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``wsim`` console command. Errors are one line on stderr and a non-zero exit status."""
    p = _Parser(prog="wsim", description=__doc__)
    p.add_argument("--verbose", action="store_true", help="show Warp's start-up banner, module-load lines and CUDA "
                   "driver messages (hidden by default)")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="render the built-in street scene and print a summary")
    d.add_argument("--scene", default="builtin", help="scene file or 'builtin' / 'builtin:nurec' (default builtin)")
    d.add_argument("--out", default="out", help="output folder (default ./out)")
    d.add_argument("--time", default=2.0, type=float, help="scene time of the render [s] (default 2.0)")
    d.add_argument("--device", default=None, help="Warp device, e.g. cpu or cuda:0 (default: Warp's default)")
    d.add_argument("--width", default=960, type=int, help="camera image width [px] (default 960, 16:9)")
    d.add_argument("--quiet", action="store_true", help="no progress bar")
    d.set_defaults(func=demo)
    i = sub.add_parser("info", help="describe a scene")
    i.add_argument("scene", nargs="?", default="builtin")
    i.set_defaults(func=info)
    r = sub.add_parser("render", help="render one rig sensor (a lidar preset or a camera logical id) to a file")
    r.add_argument("--scene", default="builtin", help="scene file or 'builtin' (default)")
    r.add_argument("--sensor", required=True, help="PANDAR128, AT128 or a camera logical id of the scene")
    r.add_argument("--t0", type=float, required=True, help="start time [s] on the scene clock")
    r.add_argument("--t1", type=float, default=None, help="end time [s] (default t0 + 0.1 lidar, + 0.03 camera)")
    r.add_argument("--width", type=int, default=None, help="camera width [px] (height keeps the aspect ratio)")
    r.add_argument("--device", default=None, help="Warp device")
    r.add_argument("--out", required=True, help="output .ply (lidar) or .png (camera)")
    r.set_defaults(func=render)
    sv = sub.add_parser("serve", help="run the sensorsim gRPC server (a renderer for AlpaSim)")
    sv.add_argument("--scenes", default=None, help="folder or glob of scene files: USD stages, NuRec USDZ artifacts, "
                    "glTF/GLB, OBJ, PLY (default: the built-in scene)")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sv.add_argument("--port", default=6001, type=int, help="port (default 6001)")
    sv.add_argument("--device", default=None, help="Warp device, e.g. cpu or cuda:0 (default: Warp's default)")
    sv.add_argument("--cache-size", default=4, type=int, help="scenes kept resident, LRU (default 4)")
    sv.add_argument("--max-workers", default=4, type=int, help="requests served concurrently (default 4)")
    sv.add_argument("--ego-masks", default=None, help="folder of ego masks <rig_config_id>/<camera_logical_id>.png")
    sv.add_argument("--assets", default=None, help="folder of asset stages for edit_assets")
    sv.add_argument("--api-version", default=None, help="grpc_api_version reported by get_version, MAJOR.MINOR.PATCH")
    sv.add_argument("--unknown-tracks", choices=("error", "ignore"), default="error",
                    help="dynamic_objects naming a track the scene lacks: NOT_FOUND (error, default) or a warning "
                    "once per id and a render without it (ignore)")
    from wsim.grpc.budget import RequestBudget  # noqa: PLC0415 - defaults shown in --help

    lim = RequestBudget()
    sv.add_argument("--max-image-pixels", type=int, default=lim.max_image_pixels,
                    help=f"pixels of one image, width x height (default {lim.max_image_pixels:,})")
    sv.add_argument("--max-request-pixels", type=int, default=lim.max_request_pixels,
                    help=f"pixels of all images of one batch or aggregated request (default {lim.max_request_pixels:,})")
    sv.add_argument("--max-images", type=int, default=lim.max_images,
                    help=f"images of one request (default {lim.max_images})")
    sv.add_argument("--max-lidar-sweeps", type=int, default=lim.max_lidar_sweeps,
                    help=f"lidar sweeps of one request (default {lim.max_lidar_sweeps})")
    sv.add_argument("--shutdown-grace", type=float, default=30.0,
                    help="seconds in-flight requests get on shut_down or the first SIGTERM/SIGINT; a second signal "
                    "stops at once (default 30)")
    sv.add_argument("--allow-remote-shutdown", action="store_true",
                    help="accept the shut_down RPC from other machines (clients on this machine always may)")
    sv.add_argument("--no-warm-up", action="store_true", help="skip the start-up warm-up renders (the first requests "
                    "then pay for kernel compilation and BVH builds)")
    sv.set_defaults(func=lambda a: __import__("wsim.grpc.server", fromlist=["main"]).main(a))
    ds = sub.add_parser("dataset", help="render a dataset spec (scenes x rig x frames x variants) on local worker "
                        "processes or a Ray cluster, resumable, as MCAP and a folder of PLY/PNG/JSON")
    ds.add_argument("spec", help="dataset spec (YAML; README \"Datasets\")")
    ds.add_argument("--out", required=True, help="dataset folder; rerunning into it renders only unfinished shards")
    ds.add_argument("--workers", type=int, default=None, help="local worker processes (default: one per core, at most "
                    "one per shard; 0: render in this process)")
    ds.add_argument("--threads", type=int, default=None, help="CPU threads per worker or Ray task (default: cores / "
                    "workers)")
    ds.add_argument("--ray", default=None, metavar="ADDRESS|auto", help="run the shards as Ray tasks: auto starts a "
                    "local Ray instance, else a cluster address (ray://host:10001, host:6379); needs wsim[ray]")
    ds.add_argument("--retries", type=int, default=2, help="further attempts of a failed shard (default 2)")
    ds.add_argument("--device", default=None, help="Warp device (default: the spec's device, else Warp's default)")
    ds.add_argument("--dry-run", action="store_true", help="check the spec and print the plan; render nothing")
    ds.add_argument("--quiet", action="store_true", help="no progress bar")
    ds.set_defaults(func=dataset)
    args = p.parse_args(argv)
    try:
        from wsim.launch import init_warp

        init_warp(args.verbose)
        _check_device(args.device if "device" in args else None)
        if args.command == "serve":
            _check_port(args.host, args.port)
        rc = args.func(args)
        sys.stdout.flush()  # here, so that a closed pipe is noticed in the try
        return rc
    except BrokenPipeError:  # `wsim info | head -1`: the reader left; no message (Python's docs, "Note on SIGPIPE")
        import os

        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit-time flush has nowhere to fail
        except (OSError, ValueError):
            pass
        return 1
    except (ValueError, OSError) as e:  # bad input (SceneError, LidarConfigError, ...): one line, not a traceback
        print(f"wsim: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("wsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
