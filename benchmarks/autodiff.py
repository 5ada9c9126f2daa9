"""Cost of gradients: backward time / forward time and tape memory for a PANDAR128 sweep and a 512×320 camera.

Usage::

    python benchmarks/autodiff.py [--device cpu|cuda] [--out FILE.md]

Forward = ``render(..., requires_grad=True)`` (the non-differentiable surface-picking pass plus the recorded
differentiable pass); backward = ``tape.backward`` seeded on every output. Tape memory = the bytes of the arrays the
differentiable pass reads and writes plus their gradient buffers (Warp allocations, not process RSS). Target: backward
≤ 3× forward. Best of N after a warm-up.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import numpy as np
import warp as wp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import wsim  # noqa: E402
from wsim.cli import _mount  # noqa: E402


def best(fn, n: int) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def nbytes(arrays) -> int:
    total = 0
    for a in arrays:
        if isinstance(a, wp.array):
            total += a.capacity * (2 if a.requires_grad else 1)
    return total


def lidar_row(scene, device: str, n: int) -> dict:
    lid = wsim.Lidar.preset("PANDAR128", scene=scene, rig=scene.ego_trajectory, mount=_mount(scene, "PANDAR128"),
                            device=device)
    lid.render(1.9, 2.0, requires_grad=True)  # compile + warm-up
    state = {}

    def fwd():
        state["pc"] = lid.render(1.9, 2.0, requires_grad=True)
        wp.synchronize_device(device)

    def plain():
        lid.render(1.9, 2.0)
        wp.synchronize_device(device)

    def bwd():
        pc = state["pc"]
        pc.tape.backward(grads={pc["Coordinates"]: wp.ones_like(pc["Coordinates"]),
                                pc["Intensity"]: wp.ones_like(pc["Intensity"])})
        wp.synchronize_device(device)
        pc.tape.zero()

    t_plain = best(plain, n)
    t_f = best(fwd, n)
    t_b = best(bwd, n)
    pc = state["pc"]
    mem = nbytes([pc["Coordinates"], pc["Intensity"], *[v for v in pc.inputs.values() if isinstance(v, wp.array)]])
    return {"case": f"PANDAR128 sweep ({pc.count:,} points)", "plain": t_plain, "fwd": t_f, "bwd": t_b, "mem": mem}


def camera_row(scene, device: str, n: int) -> dict | None:
    cam = wsim.Camera.from_scene(scene, "camera_front_wide_120fov", width=512, height=320, device=device)
    try:
        frame = cam.render(scene, 2.0, 2.03, products=("distance",), requires_grad=True)
    except TypeError:
        return None  # camera gradients not available in this build
    state = {}

    def fwd():
        state["f"] = cam.render(scene, 2.0, 2.03, products=("distance",), requires_grad=True)
        wp.synchronize_device(device)

    def plain():
        cam.render(scene, 2.0, 2.03, products=("distance",))
        wp.synchronize_device(device)

    def bwd():
        f = state["f"]
        f.tape.backward(grads={f.distance: wp.ones_like(f.distance)})
        wp.synchronize_device(device)
        f.tape.zero()

    t_plain = best(plain, n)
    t_f = best(fwd, n)
    t_b = best(bwd, n)
    f = state["f"]
    mem = nbytes([f.distance, *[v for v in f.inputs.values() if isinstance(v, wp.array)]])
    _ = frame
    return {"case": "512×320 f-theta DISTANCE", "plain": t_plain, "fwd": t_f, "bwd": t_b, "mem": mem}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS_autodiff.md"))
    args = ap.parse_args()
    wp.config.log_level = wp.LOG_WARNING
    scene = wsim.load_scene("builtin")
    rows = [lidar_row(scene, args.device, args.runs)]
    cam = camera_row(scene, args.device, args.runs)
    if cam:
        rows.append(cam)
    lines = [
        f"# Autodiff cost ({datetime.date.today()}, {platform.processor() or platform.machine()}, device {args.device})",
        "",
        "| case | render (no grad) [s] | forward with tape [s] | backward [s] | backward / forward | tape memory [MiB] |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['plain']:.3f} | {r['fwd']:.3f} | {r['bwd']:.3f} | "
                     f"{r['bwd'] / r['fwd']:.2f}× (target ≤ 3×) | {r['mem'] / 2**20:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
