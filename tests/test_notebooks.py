"""The calibration notebooks run end to end and reach their accuracy targets.

Each notebook in ``notebooks/`` is executed (a copy, in a temporary directory: the committed files with their outputs
stay untouched) with the ``python3`` kernel, and the ``RESULT {...}`` line its last cell prints is checked against
thresholds within 2× of the results the README states (and no looser than the autodiff issue's targets), so a
regression of the final errors fails the test. Each notebook takes 30–65 s on 2
shared CPU cores; they are marked ``notebooks`` (``./dev.sh test --fast`` deselects them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbclient
import nbformat
import pytest

pytestmark = pytest.mark.notebooks  # minutes: ./dev.sh test --fast skips them

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def run_notebook(name: str, tmp_path: Path) -> dict:
    src = NOTEBOOKS / name
    dst = tmp_path / name
    shutil.copy(src, dst)
    nb = nbformat.read(dst, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    nbformat.write(nb, dst)
    text = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []) if o.get("output_type") == "stream")
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    assert lines, f"{name}: no RESULT line in the last cell's output:\n{text}"
    return json.loads(lines[-1][len("RESULT "):])


def test_lidar_extrinsic_calibration(tmp_path):
    r = run_notebook("lidar_extrinsic_calibration.ipynb", tmp_path)
    # from 5° / 30 cm, range noise σ 3 cm, measured scene ≠ model (vertices displaced, unmodelled poles and car)
    assert r["start_rot_err_deg"] >= 5.0 - 1e-6 and r["start_trans_err_mm"] >= 300.0 - 1e-3
    # README: 0.0023° / 1.2 mm
    assert r["rot_err_deg"] < 0.0046, r
    assert r["trans_err_mm"] < 2.0, r  # the target (2x the README's 1.2 mm would be looser)


def test_lidar_intrinsics_and_intensity(tmp_path):
    r = run_notebook("lidar_intrinsics_and_intensity.ipynb", tmp_path)
    # offsets ±0.1°, reflectance guess ±30 %, range noise σ 3 cm, measured scene ≠ model (vertices displaced σ 1 cm
    # per axis, unmodelled poles and car), Cauchy loss
    assert r["channels"] == 128 and r["materials_observed"] >= 13, r
    assert r["start_el_offset_deg"] >= 0.1 and r["range_noise_m"] >= 0.03 and r["vertex_sigma_m"] >= 0.01, r
    # README: 0.0021° rms (0.0063° max), reflectance 0.85 % rms (2.7 % max); 2x, capped at the targets 0.003° rms
    # and 2 % rms
    assert r["el_err_rms_deg"] < 0.003, r
    assert r["el_err_max_deg"] < 0.0125, r
    assert r["refl_err_rms_pct"] < 1.7, r
    assert r["refl_err_max_pct"] < 5.4, r


def test_camera_lidar_calibration(tmp_path):
    r = run_notebook("camera_lidar_calibration.ipynb", tmp_path)
    # start 5° / 30 cm off, readout 8.3 ms off
    assert r["start_rot_err_deg"] >= 5.0 - 1e-6 and r["start_trans_err_mm"] >= 300.0, r
    assert r["start_readout_err_ms"] >= 8.3, r
    # README: 0.00010° / 1.3 mm / 0.35 ms; 2x, capped at the targets 0.01° / 2 mm / 0.5 ms
    assert r["rot_err_deg"] < 0.00021, r
    assert r["trans_err_mm"] < 2.0, r
    assert r["readout_err_ms"] < 0.5, r
