"""The ``wsim`` command: the demo and render subcommands write real, readable outputs; every error is one line;
``./dev.sh``'s demo install is wsim alone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import warp as wp
from PIL import Image
from plyfile import PlyData

from wsim.cli import main


def test_demo_writes_every_product(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--quiet", "--width", "192"]) == 0
    text = capsys.readouterr().out
    assert "98,836" in text and "pandar128" in text and "camera_front_wide_120fov" in text
    pano = np.asarray(Image.open(tmp_path / "panorama_range_intensity.png"))
    assert pano.shape == (256, 1800, 3) and pano.std() > 10
    for name in ("pandar128", "at128"):
        ply = PlyData.read(str(tmp_path / f"lidar_{name}.ply"))
        assert ply["vertex"].count > 100_000
        assert np.asarray(Image.open(tmp_path / f"lidar_{name}_topdown.png")).max() > 0
    color = np.asarray(Image.open(tmp_path / "camera_front_color.png"))
    assert color.shape == (108, 192, 3)
    dist = np.load(tmp_path / "camera_front_distance_m.npy")
    assert dist.shape == (108, 192) and 0 < np.median(dist[dist > 0]) < 100
    overlay = np.asarray(Image.open(tmp_path / "camera_front_lidar_overlay.png"))
    assert (overlay != color).any(axis=2).sum() > 100  # lidar points drawn over the image
    assert (tmp_path / "summary.txt").read_text() == text


def test_render_lidar_and_camera(tmp_path, capsys):
    assert main(["render", "--sensor", "PANDAR128", "--t0", "1.0", "--t1", "1.05", "--out",
                 str(tmp_path / "p.ply")]) == 0
    n = PlyData.read(str(tmp_path / "p.ply"))["vertex"].count
    assert 80_000 < n < 128 * 900  # half a spin
    assert main(["render", "--sensor", "camera_front_tele_30fov", "--t0", "1.0", "--width", "160", "--out",
                 str(tmp_path / "c.png")]) == 0
    assert np.asarray(Image.open(tmp_path / "c.png")).shape == (90, 160, 3)
    assert np.load(tmp_path / "c.distance.npy").shape == (90, 160)


def test_bad_scene_and_sensor_are_clear_errors(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing.usda")]) == 2
    assert "missing.usda" in capsys.readouterr().err
    assert main(["render", "--sensor", "radar", "--t0", "0", "--out", str(tmp_path / "x.png")]) == 2
    assert "radar" in capsys.readouterr().err


def test_demo_rejects_bad_width(tmp_path, capsys):
    assert main(["demo", "--width", "0", "--out", str(tmp_path), "--quiet"]) == 2
    assert "width" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------- errors
# Every error of the command is one line on stderr and a non-zero exit status; nothing on stdout.

ROOT = Path(__file__).resolve().parent.parent


def wsim(*args: str, **kw) -> subprocess.CompletedProcess:
    """The command in a fresh interpreter (Warp not yet initialised), as a user runs it."""
    return subprocess.run([sys.executable, "-m", "wsim.cli", *args], capture_output=True, text=True, timeout=120, **kw)


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("wsim") and ": error: " in lines[0], err
    return lines[0]


def test_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = wsim("serve", "--port", str(port), "--no-warm-up")
    assert r.returncode != 0 and r.stdout == ""
    line = one_error_line(r.stderr)
    assert f"127.0.0.1:{port} is already in use" in line and "--port" in line


def test_missing_cuda_device_is_one_line(tmp_path):
    device = "cuda:0" if wp.get_cuda_device_count() == 0 else "cuda:99"
    r = wsim("render", "--sensor", "PANDAR128", "--t0", "1", "--device", device, "--out", str(tmp_path / "p.ply"))
    assert r.returncode != 0 and r.stdout == ""
    assert one_error_line(r.stderr).startswith(f"wsim: error: --device {device}: no ")
    assert not (tmp_path / "p.ply").exists()


@pytest.mark.parametrize("argv, message", [
    (["render", "--sensor", "PANDAR128", "--t0", "-1"], "--t0 -1.000 s is outside the scene's time range [0.00, 12.00] s"),
    (["render", "--sensor", "AT128", "--t0", "11.95"],
     "--t1 12.050 s (default: --t0 + 0.1 s) is outside the scene's time range [0.00, 12.00] s"),
    (["render", "--sensor", "camera_front_wide_120fov", "--t0", "12.5"],
     "--t0 12.500 s is outside the scene's time range [0.00, 12.00] s"),
    (["render", "--sensor", "camera_front_tele_30fov", "--t0", "11", "--t1", "13"],
     "--t1 13.000 s is outside the scene's time range [0.00, 12.00] s"),
    (["demo", "--time", "0.05"], "--time 0.050 s is outside the demo's range [0.10, 11.97] s"),
    (["demo", "--time", "12"], "--time 12.000 s is outside the demo's range [0.10, 11.97] s"),
])
def test_times_outside_the_scene_are_one_line(tmp_path, capfd, argv, message):
    out = tmp_path / ("out" if argv[0] == "demo" else "x.png")
    assert main([*argv, "--out", str(out)]) == 2
    cap = capfd.readouterr()
    assert cap.out == ""
    assert message in one_error_line(cap.err)
    assert not out.exists()  # checked before any work


def test_bad_usd_file_is_one_line_without_pxr_internals(tmp_path, capfd):
    bad = tmp_path / "bad.usda"
    bad.write_text('#usda 1.0\ndef Mesh "m" {\n  point3f[] points = [(0, 0, 0), (1,\n}\n')
    assert main(["info", str(bad)]) == 2
    line = one_error_line(capfd.readouterr().err)
    assert line == f"wsim: error: {bad}: not a readable USD file (line 4, column 1: parse error at '}}' in </m.points>)"
    garbage = tmp_path / "garbage.usdc"
    garbage.write_bytes(bytes(range(256)) * 4)
    assert main(["info", str(garbage)]) == 2
    line = one_error_line(capfd.readouterr().err)
    assert "garbage.usdc: not a readable USD file (" in line
    assert not any(s in line for s in ("pxrInternal", "Error in", ".cpp", "line 1287"))


def test_usage_errors_are_one_line(capfd):
    with pytest.raises(SystemExit) as e:
        main(["render", "--t0", "1"])
    assert e.value.code == 2
    line = one_error_line(capfd.readouterr().err)
    assert line.startswith("wsim render: error: the following arguments are required: --sensor, --out")


def test_broken_pipe_is_silent():
    # the reader is gone before the command writes (`wsim info | head -0`): no message, no traceback
    p = subprocess.Popen([sys.executable, "-m", "wsim.cli", "info"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 1
    assert err == b""


def test_quiet_by_default_verbose_on_request():
    r = wsim("info")
    assert r.returncode == 0 and r.stderr == ""  # no Warp banner, module lines or missing-driver warning
    assert r.stdout.splitlines()[0].startswith("scene            wsim-street-block")
    v = wsim("--verbose", "info")
    assert v.returncode == 0 and f"Warp {wp.config.version} initialized" in v.stdout + v.stderr
    if wp.get_cuda_device_count() == 0 and not _cuda_driver_loadable():
        assert "Could not find or load the NVIDIA CUDA driver" in v.stderr  # what quiet mode hides


def _cuda_driver_loadable() -> bool:
    import ctypes

    for name in ("libcuda.so", "libcuda.so.1", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


# ---------------------------------------------------------------------------------------------------------- install
def test_import_from_the_folder_holding_the_clone(tmp_path):
    # a clone named "wsim" in the working directory is a namespace-package candidate that comes first on sys.path
    (tmp_path / "wsim").symlink_to(ROOT, target_is_directory=True)
    r = subprocess.run([sys.executable, "-c", "import wsim; print(wsim.__file__); wsim.load_scene"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).name == "__init__.py"


@pytest.mark.slow
def test_dev_sh_test_fast_skips_the_notebooks():
    """dev.sh (bash, as the README requires) brings .venv up to date first if pyproject.toml changed, then collects."""
    r = subprocess.run(["bash", str(ROOT / "dev.sh"), "test", "--fast", "--collect-only", "-q"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "dev.sh: fast test suite" in r.stdout
    assert "test_notebooks.py" not in r.stdout and "test_demo_install_has_no_torch" not in r.stdout
    assert "deselected" in r.stdout and "tests/test_cli.py::test_broken_pipe_is_silent" in r.stdout


@pytest.mark.install
def test_demo_install_has_no_torch(tmp_path):
    """``./dev.sh demo``'s install step in a fresh virtual environment: wsim and its own dependencies only (no torch,
    no test tools), and the demo runs there, quietly."""
    venv = tmp_path / "venv"
    env = dict(os.environ, WSIM_VENV=str(venv), PYTHON=getattr(sys, "_base_executable", sys.executable))
    env.pop("VIRTUAL_ENV", None)
    r = subprocess.run(["bash", str(ROOT / "dev.sh"), "install", "demo"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (venv / ".wsim-demo").exists() and not (venv / ".wsim-test").exists()
    py = venv / "bin" / "python"
    for absent in ("torch", "pytest", "opencv-python-headless"):
        assert subprocess.run([py, "-m", "pip", "show", absent], capture_output=True).returncode != 0, absent
    d = subprocess.run([venv / "bin" / "wsim", "demo", "--quiet", "--width", "192", "--out", str(tmp_path / "out")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert d.returncode == 0, d.stderr[-3000:]
    assert d.stderr == ""
    assert "98,836" in d.stdout and (tmp_path / "out" / "camera_front_lidar_overlay.png").exists()
