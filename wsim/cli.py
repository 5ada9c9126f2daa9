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


def _lidar_overlay(cam, color: np.ndarray, world: np.ndarray, t0: float, t1: float) -> np.ndarray:
    """World points projected into the camera image (rolling-shutter solve), coloured by depth (Turbo, 0-60 m)."""
    from wsim.sensors.topdown import turbo_colors

    pix, depth, _, valid = cam.project(world, t0, t1).numpy()
    img = color.copy()
    h, w = img.shape[:2]
    u = np.floor(pix[valid, 0]).astype(int)
    v = np.floor(pix[valid, 1]).astype(int)
    ok = (u >= 0) & (u < w) & (v >= 0) & (v < h)
    img[v[ok], u[ok]] = turbo_colors(depth[valid][ok], 60.0)
    return img


def demo(args: argparse.Namespace) -> int:
    import warp as wp
    from PIL import Image
    from tqdm import tqdm

    import wsim
    from wsim.scene.transforms import quat_to_matrix
    from wsim.sensors.panorama import render_panorama
    from wsim.sensors.lidar_config import CoordsType, FrameOfReference
    from wsim.sensors.topdown import topdown_image

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=6, desc="wsim demo", unit="step", disable=args.quiet)
    t0 = time.perf_counter()
    scene = wsim.load_scene(args.scene)
    load_s = time.perf_counter() - t0
    steps.update()
    t_render = float(args.time)
    if scene.ego_trajectory is not None:
        tr, q = scene.ego_trajectory.pose_at(t_render)
        position = tr + quat_to_matrix(q) @ ROOF_MOUNT_M
    else:
        position = ROOF_MOUNT_M
    t0 = time.perf_counter()
    scene.device_geometry(args.device)
    build_s = time.perf_counter() - t0
    steps.update()
    pano = render_panorama(scene, position, time=t_render, device=args.device)
    png = out / "panorama_range_intensity.png"
    Image.fromarray(pano.to_image()).save(png)
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
        lidar_lines.append(f"{name.lower():<16} {pc.count:,} points in {dt:.2f} s (scan {t_scan - 0.1:.1f}-"
                           f"{t_scan:.1f} s, mean intensity {inten.mean():.3f}) -> {stem.name}.ply, "
                           f"{stem.name}_topdown.png")
        steps.update()
        if name == "PANDAR128":
            world_lidar = lidar.with_config(output_frame_of_reference=FrameOfReference.WORLD,
                                            elements_coords_type=CoordsType.CARTESIAN)
            world_points = world_lidar.render(t_scan - 0.1, t_scan).xyz()
    # the front f-theta camera at the moving ego pose: colour, distance, semantics, and the sweep overlaid
    steps.set_postfix_str("camera")
    cam_id = "camera_front_wide_120fov"
    camera_lines = []
    if cam_id in scene.cameras:
        cam = wsim.Camera.from_scene(scene, cam_id, width=args.width, height=args.width * 9 // 16,
                                     device=args.device)
        c0, c1 = t_render, t_render + 0.03  # 30 ms rolling-shutter readout
        t0 = time.perf_counter()
        frame = cam.render(scene, c0, c1, products=("color", "distance", "distance_colorized",
                                                    "semantics_colorized"))
        dt = time.perf_counter() - t0
        color = frame.color.numpy()
        Image.fromarray(color).save(out / "camera_front_color.png")
        Image.fromarray(frame.distance_colorized.numpy()).save(out / "camera_front_distance.png")
        Image.fromarray(frame.semantics_colorized.numpy()).save(out / "camera_front_semantics.png")
        np.save(out / "camera_front_distance_m.npy", frame.distance.numpy())
        overlay = _lidar_overlay(cam, color, world_points, c0, c1)
        Image.fromarray(overlay).save(out / "camera_front_lidar_overlay.png")
        camera_lines.append(f"{cam_id:<16} {cam.width}x{cam.height} rolling shutter in {dt:.2f} s -> "
                            "camera_front_{color,distance,semantics,lidar_overlay}.png")
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
        f"wrote            {out}/",
    ]
    text = "\n".join(lines)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    return 0


def info(args: argparse.Namespace) -> int:
    import wsim

    print("\n".join(_summary(wsim.load_scene(args.scene))))
    return 0


def render(args: argparse.Namespace) -> int:
    """Render one sensor of a scene's rig over [t0, t1] and write the result."""
    from PIL import Image

    import wsim

    scene = wsim.load_scene(args.scene)
    t0 = float(args.t0)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    name = args.sensor
    if name.upper() in ("PANDAR128", "AT128"):
        t1 = float(args.t1) if args.t1 is not None else t0 + 0.1
        lidar = wsim.Lidar.preset(name.upper(), scene=scene, rig=scene.ego_trajectory,
                                  mount=_mount(scene, name.upper()), device=args.device, partial_outputs=True)
        pc = lidar.render(t0, t1)
        pc.write_ply(out)
        print(f"{name.upper()}: {pc.count:,} points fired in [{t0:.3f}, {t1:.3f}) s -> {out}")
        return 0
    if name not in scene.cameras:
        known = ", ".join(["PANDAR128", "AT128", *sorted(scene.cameras)])
        raise wsim.SceneError(f"--sensor: no sensor {name!r} in {scene.scene_id} (known: {known})")
    t1 = float(args.t1) if args.t1 is not None else t0 + 0.03
    w, h = scene.cameras[name].resolution
    size = {"width": args.width, "height": round(args.width * h / w)} if args.width else {}
    cam = wsim.Camera.from_scene(scene, name, device=args.device, **size)
    frame = cam.render(scene, t0, t1, products=("color", "distance"))
    Image.fromarray(frame.color.numpy()).save(out)
    np.save(out.with_suffix(".distance.npy"), frame.distance.numpy())
    print(f"{name}: {cam.width}x{cam.height} over [{t0:.3f}, {t1:.3f}] s -> {out} (+ {out.stem}.distance.npy [m])")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``wsim`` console command."""
    p = argparse.ArgumentParser(prog="wsim", description=__doc__)
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
    sv.add_argument("--scenes", default=None, help="folder or glob of USD stages / NuRec USDZ artifacts (default: the "
                    "built-in scene)")
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
    sv.add_argument("--no-warm-up", action="store_true", help="skip the start-up warm-up renders (the first requests "
                    "then pay for kernel compilation and BVH builds)")
    sv.set_defaults(func=lambda a: __import__("wsim.grpc.server", fromlist=["main"]).main(a))
    args = p.parse_args(argv)
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING  # no start-up banner or module-compile chatter in the output
    try:
        return args.func(args)
    except (ValueError, OSError) as e:  # bad input (SceneError, LidarConfigError, ...): one line, not a traceback
        print(f"wsim: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
