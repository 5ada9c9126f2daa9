"""The ``wsim`` command: the demo and render subcommands write real, readable outputs."""

from __future__ import annotations

import numpy as np
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
