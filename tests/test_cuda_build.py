"""Every kernel module compiles for CUDA (NVRTC to PTX) on any machine, GPU or not: the CPU-only native paths (the
packet traversals, the vector record writers) keep a CUDA branch of their own. (On a GPU machine every device test
also runs the kernels there.)"""

import subprocess
import sys

import pytest

# Compiles, in a fresh interpreter, the kernel modules of wsim whose index modulo argv[2] is argv[1] (two processes
# share the work: the tracing and lidar modules take minutes each) and prints each module's PTX file.
_SCRIPT = """
import importlib, pkgutil, sys
import warp as wp
wp.config.quiet = True
import wsim
names = []
for m in sorted(pkgutil.walk_packages(wsim.__path__, "wsim."), key=lambda m: m.name):
    if m.name.startswith("wsim.grpc.stubs") or m.name.endswith("__main__"):
        continue
    mod = importlib.import_module(m.name)
    if any(isinstance(v, wp.Kernel) and v.module.name == m.name for v in vars(mod).values()):
        names.append(m.name)
print("modules", len(names), flush=True)
part, parts, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for k, name in enumerate(names):
    if k % parts == part:
        paths = wp.compile_aot_module(importlib.import_module(name), arch=75, use_ptx=True, module_dir=out)
        print("ptx", name, *[p.stat().st_size for p in paths], flush=True)
"""


@pytest.mark.slow
def test_every_kernel_module_compiles_for_cuda(tmp_path):
    parts = 2
    procs = [subprocess.Popen([sys.executable, "-c", _SCRIPT, str(k), str(parts), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in range(parts)]
    outs = [p.communicate(timeout=1500)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    lines = [line.split() for out in outs for line in out.splitlines()]
    n = {int(w[1]) for w in lines if w[:1] == ["modules"]}
    built = {w[1]: [int(s) for s in w[2:]] for w in lines if w[:1] == ["ptx"]}
    assert n == {len(built)} and len(built) >= 7, outs  # every module with kernels, each in one process
    assert {"wsim.kernels.trace", "wsim.kernels.lidar", "wsim.kernels.shading"} <= set(built)
    assert all(sizes and min(sizes) > 0 for sizes in built.values())
