"""Cost of gradients: backward time / forward time and tape memory for a PANDAR128 sweep and a 512×320 camera.

Usage::

    python benchmarks/autodiff.py [--device cpu|cuda] [--out FILE.md]

Forward = ``render(..., requires_grad=True)`` (the non-differentiable surface-picking pass plus the recorded
differentiable pass); differentiable pass = the tape's recorded launches alone, replayed; backward =
``tape.backward`` seeded on every output. Tape memory = the bytes of every Warp array the tape holds — each array
argument of every recorded launch, including those inside structs (slots, tick and emitter tables, ...), plus the
mesh vertex arrays the kernels reach through mesh ids — and of each one's gradient (adjoint) buffer, counted once
(Warp allocations, not process RSS; the BVHs belong to the scene and are not counted). Target: backward ≤ 3× forward.
Best of N after a warm-up.
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


def tape_bytes(tape: wp.Tape, extra=()) -> int:
    """Bytes of every array a tape holds (launch arguments, recursively through structs, and ``extra``) plus their
    gradient buffers, each array counted once."""
    seen: dict[int, wp.array] = {}

    def visit(x) -> None:
        if isinstance(x, wp.array):
            seen.setdefault(id(x), x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y)
        elif hasattr(x, "_cls") and hasattr(x._cls, "vars"):  # a wp.struct instance
            for k in x._cls.vars:
                visit(getattr(x, k))

    for launch in tape.launches:
        if isinstance(launch, list):
            visit(launch[3])
            visit(launch[4])
    visit(list(extra))
    grads = {id(a.grad): a.grad for a in seen.values() if a.grad is not None}
    return sum(a.capacity for a in seen.values()) + sum(g.capacity for g in grads.values() if id(g) not in seen)


def replay(tape: wp.Tape) -> None:
    """Run a tape's recorded launches again (the differentiable pass alone)."""
    for launch in tape.launches:
        if isinstance(launch, list):
            kernel, dim, _max_blocks, inputs, outputs, device = launch[:6]
            wp.launch(kernel, dim, inputs=inputs, outputs=outputs, device=device)


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
    mem = tape_bytes(pc.tape, [pc.inputs["static_points"], *pc.inputs["prototype_points"]])
    timing = lid.render(1.9, 2.0, requires_grad=True)  # replayed (its outputs are not used again)
    t_d = best(lambda: (replay(timing.tape), wp.synchronize_device(device)), n)
    return {"case": f"PANDAR128 sweep ({pc.count:,} points)", "plain": t_plain, "fwd": t_f, "bwd": t_b, "diff": t_d,
            "mem": mem}


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
    mesh = [v for k, v in f.inputs.items() if k in ("static_points", "prototype_points")]
    mem = tape_bytes(f.tape, mesh)
    timing = cam.render(scene, 2.0, 2.03, products=("distance",), requires_grad=True)
    t_d = best(lambda: (replay(timing.tape), wp.synchronize_device(device)), n)
    _ = frame
    return {"case": "512×320 f-theta DISTANCE", "plain": t_plain, "fwd": t_f, "bwd": t_b, "diff": t_d, "mem": mem}


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
        "| case | render (no grad) [s] | forward with tape [s] | differentiable pass alone [s] | backward [s] | "
        "backward / forward | backward / differentiable pass | tape memory [MiB] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['plain']:.3f} | {r['fwd']:.3f} | {r['diff']:.3f} | {r['bwd']:.3f} | "
                     f"{r['bwd'] / r['fwd']:.2f}× (target ≤ 3×) | {r['bwd'] / r['diff']:.1f}× | "
                     f"{r['mem'] / 2**20:.1f} |")
    lines += ["", "Tape memory: every array the tape holds (recorded launch arguments, through structs, and the mesh "
              "vertices) plus its gradient buffer."]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
