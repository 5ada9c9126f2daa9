"""``wsim dataset``: specs, shards, the manifest, local workers and Ray, MCAP and the folder layout.

One small spec throughout: the built-in scene, a PANDAR128 limited to a 30° azimuth window and the front f-theta
camera at 96 x 54, 10 frames at 10 Hz.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from wsim.dataset import SpecError, parse_spec, plan_dataset, run_dataset
from wsim.dataset.render import CRASH_ENV

LIDAR = "lidar_top_360fov"  # the built-in rig's id of its PANDAR128
CAMERA = "camera_front_wide_120fov"


def spec_doc(chunk: int = 5, **changes) -> dict:
    doc = {
        "name": "tiny",
        "scenes": ["builtin"],
        "rig": {"lidars": [{"preset": "PANDAR128", "config": {"valid_end_azimuth_deg": 30}}],
                "cameras": [{"id": CAMERA, "width": 96, "height": 54}]},
        "frames": {"rate_hz": 10, "start_s": 1.0, "end_s": 2.0, "chunk": chunk},
    }
    doc.update(changes)
    return doc


@pytest.fixture(scope="module")
def builtin():
    import wsim

    return wsim.load_scene("builtin")


def digest(root: Path, under: str = "") -> dict[str, str]:
    """SHA-256 of every dataset file (not the manifest), by path relative to ``root``."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".")
            and p.name != "manifest.json" and str(p.relative_to(root)).startswith(under)}


def manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


@pytest.fixture(scope="module")
def serial(tmp_path_factory, builtin):
    """The spec rendered in this process (the reference of every comparison)."""
    root = tmp_path_factory.mktemp("serial")
    spec = parse_spec(spec_doc())
    s = run_dataset(spec, root, workers=0, progress=False, plan=plan_dataset(spec, scenes={"builtin": builtin}))
    assert s.ok and s.rendered == 2 and s.frames == 10 and s.images == 20 and s.points > 0
    return root


@pytest.mark.slow
def test_serial_two_workers_and_ray_give_identical_bytes(serial, tmp_path):
    ref = digest(serial)
    seq = "wsim-street-block/default"
    assert f"{seq}/mcap/000000-000004.mcap" in ref and f"{seq}/frames/000009/{LIDAR}.ply" in ref
    assert len(ref) == 2 + 1 + 10 * 4  # 2 MCAP files, rig.json, 10 × (PLY, PNG, distance .npy, frame.json)
    local = tmp_path / "local"
    s = run_dataset(parse_spec(spec_doc()), local, workers=2, progress=False)
    assert s.ok and s.rendered == 2 and "2 local workers x 1 thread" in s.backend
    assert digest(local) == ref
    import ray  # in the test extras: a missing ray is a failure, not a skip
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        on_ray = tmp_path / "ray"
        s = run_dataset(parse_spec(spec_doc()), on_ray, ray="auto", progress=False)  # the running instance
        assert s.ok and s.rendered == 2 and s.backend.startswith("Ray (2 CPUs")
    finally:
        ray.shutdown()
    assert digest(on_ray) == ref
    for root in (local, on_ray):
        shards = manifest(root)["shards"]
        assert sorted(shards) == [f"{seq}/000000-000004", f"{seq}/000005-000009"]
        assert all(e["status"] == "done" and e["attempts"] == 1 for e in shards.values()), (root.name, shards)


def _decoder(schema):
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    for fd in descriptor_pb2.FileDescriptorSet.FromString(schema.data).file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(schema.name))


def test_mcap_reads_back_with_foxglove_schemas(serial):
    from mcap.reader import make_reader

    seq = serial / "wsim-street-block/default"
    path = seq / "mcap/000005-000009.mcap"
    frames = [json.loads((seq / f"frames/{k:06d}/frame.json").read_text()) for k in range(5, 10)]
    with open(path, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        schemas = {c.topic: summary.schemas[c.schema_id].name for c in summary.channels.values()}
        assert schemas == {
            "/tf": "foxglove.FrameTransform",
            f"/lidar/{LIDAR}/points": "foxglove.PointCloud",
            f"/camera/{CAMERA}/calibration": "foxglove.CameraCalibration",
            f"/camera/{CAMERA}/image": "foxglove.CompressedImage",
            f"/camera/{CAMERA}/distance": "foxglove.RawImage",
        }
        counts, times, decoders, clouds, tf = Counter(), [], {}, [], []
        for schema, channel, msg in reader.iter_messages():
            counts[channel.topic] += 1
            times.append(msg.log_time)
            dec = decoders.setdefault(schema.name, _decoder(schema))
            m = dec.FromString(msg.data)
            if schema.name == "foxglove.PointCloud":
                clouds.append(m)
            elif schema.name == "foxglove.FrameTransform":
                tf.append((m.parent_frame_id, m.child_frame_id))
            elif schema.name == "foxglove.CompressedImage":
                assert m.format == "png" and m.data[:8] == b"\x89PNG\r\n\x1a\n"
            elif schema.name == "foxglove.CameraCalibration":
                assert (m.width, m.height, m.distortion_model, len(m.K), len(m.P)) == (96, 54, "kannala_brandt", 9,
                                                                                        12)
        meta = {m.name: m.metadata for m in reader.iter_metadata()}
    # per frame: world → rig; once per shard: rig → each sensor
    assert counts == {"/tf": 5 + 2, f"/lidar/{LIDAR}/points": 5, f"/camera/{CAMERA}/calibration": 5,
                      f"/camera/{CAMERA}/image": 5, f"/camera/{CAMERA}/distance": 5}
    assert sorted(set(tf)) == [("rig", CAMERA), ("rig", LIDAR), ("world", "rig")]
    assert times == sorted(times) and times[0] == frames[0]["timestamp_ns"] and times[-1] == frames[-1]["timestamp_ns"]
    for m, fr in zip(clouds, frames):
        n = fr["lidars"][LIDAR]["points"]
        names = [f.name for f in m.fields]
        assert names == fr["lidars"][LIDAR]["columns"] and names[:3] == ["x", "y", "z"]
        assert {"intensity", "time_offset_ns", "object_id_3", "velocity_z", "semantic_id"} <= set(names)
        assert n > 1000 and len(m.data) == n * m.point_stride and m.frame_id == LIDAR
        # the same bytes as the frame's PLY
        from plyfile import PlyData

        ply = PlyData.read(str(seq / f"frames/{fr['frame']:06d}/{LIDAR}.ply"))["vertex"].data
        assert ply.tobytes() == m.data
    assert meta["wsim"]["shard"] == "wsim-street-block/default/000005-000009"


def test_folder_layout(serial):
    from PIL import Image

    seq = serial / "wsim-street-block/default"
    rig = json.loads((seq / "rig.json").read_text())
    assert rig["lidars"][LIDAR]["preset"] == "PANDAR128" and rig["lidars"][LIDAR]["sensor_to_rig"]["translation"] == \
        [1.0, 0.0, 1.9]
    assert rig["cameras"][CAMERA]["foxglove_calibration"]["fit_max_px"] < 0.5  # f-theta fitted by Kannala-Brandt
    fr = json.loads((seq / "frames/000003/frame.json").read_text())
    assert fr["frame"] == 3 and abs(fr["time_s"] - 1.3) < 1e-12
    assert fr["lidars"][LIDAR]["params"]["frameId"] == 3 and fr["lidars"][LIDAR]["interval_s"] == [fr["time_s"],
                                                                                                    fr["time_s"] + 0.1]
    with Image.open(seq / f"frames/000003/{CAMERA}.png") as im:
        assert im.size == (96, 54)
    dist = np.load(seq / f"frames/000003/{CAMERA}.distance.npy")
    assert dist.shape == (54, 96) and dist.dtype == np.float32 and dist.max() > 1.0
    assert not list(serial.rglob(".*.partial"))


def test_files_written_at_once_by_several_writers(tmp_path):
    """Shards of one sequence write its rig.json at the same time (different workers): every write succeeds and the
    file is whole (each writer had its own temporary file; a shared one failed a shard now and then, which then
    succeeded on its retry)."""
    import threading

    from wsim.dataset.writers import atomic_write

    path = tmp_path / "seq" / "rig.json"
    data = [bytes([65 + k]) * 200_000 for k in range(4)]
    errors: list[BaseException] = []

    def write(k: int) -> None:
        try:
            for _ in range(100):
                atomic_write(path, data[k])
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert path.read_bytes() in data and not list(path.parent.glob(".*.partial"))


def test_killed_worker_then_rerun_renders_only_the_missing_shard(serial, tmp_path, monkeypatch):
    root = tmp_path / "crash"
    spec = parse_spec(spec_doc(chunk=2))  # 5 shards of 2 frames, one worker: the crash lands in the second shard
    monkeypatch.setenv(CRASH_ENV, f"3:{tmp_path / 'crashed'}")  # the first worker exits hard after its 3rd frame
    s = run_dataset(spec, root, workers=1, retries=0, progress=False)
    seq = "wsim-street-block/default"
    assert [sid for sid, _ in s.failures] == [f"{seq}/000002-000003"] and "exit code 86" in s.failures[0][1]
    assert s.rendered == 4 and (tmp_path / "crashed").exists()
    shards = manifest(root)["shards"]
    assert shards[f"{seq}/000002-000003"]["status"] == "failed"
    assert not (root / seq / "mcap/000002-000003.mcap").exists()  # only its partial file, which does not count
    assert (root / seq / "mcap/.000002-000003.mcap.partial").exists()
    done = {p: (root / p).stat().st_mtime_ns for sid, e in shards.items() if e["status"] == "done"
            for p in e["outputs"] if not p.endswith("rig.json")}
    monkeypatch.delenv(CRASH_ENV)
    s = run_dataset(spec, root, workers=1, progress=False)
    assert s.ok and s.rendered == 1 and s.skipped == 4 and s.frames == 2
    assert {p: (root / p).stat().st_mtime_ns for p in done} == done  # finished shards were not touched
    assert all(e["status"] == "done" for e in manifest(root)["shards"].values())
    assert digest(root, f"{seq}/frames") == digest(serial, f"{seq}/frames")
    assert not list(root.rglob(".*.partial"))
    s = run_dataset(spec, root, workers=1, progress=False)  # nothing left
    assert s.ok and s.rendered == 0 and s.skipped == 5


def test_crashed_shard_is_retried(tmp_path, monkeypatch):
    root = tmp_path / "retry"
    monkeypatch.setenv(CRASH_ENV, f"1:{tmp_path / 'crashed'}")
    doc = spec_doc(chunk=5)
    doc["frames"] = {"rate_hz": 10, "start_s": 1.0, "count": 2, "chunk": 1}
    s = run_dataset(parse_spec(doc), root, workers=1, retries=1, progress=False)
    assert s.ok and s.rendered == 2 and s.retried == 1
    entries = sorted(manifest(root)["shards"].values(), key=lambda e: e["attempts"])
    assert [e["attempts"] for e in entries] == [1, 2]
    assert "retried_after" not in entries[0]  # a retried shard says why it was retried
    assert len(entries[1]["retried_after"]) == 1 and "exit code 86" in entries[1]["retried_after"][0]


def test_variants_change_only_what_they_name(tmp_path, builtin):
    doc = spec_doc(chunk=1)
    doc["frames"] = {"rate_hz": 10, "start_s": 1.0, "count": 1}
    doc["rig"] = {"lidars": doc["rig"]["lidars"]}
    doc["variants"] = [{"name": "clean"},
                       {"name": "noisy", "lidar_config": {"range_accuracy_m": 0.05, "wsim:seed": 7}},
                       {"name": "moved", "mount_jitter": {"translation_m": 0.02, "rotation_deg": 0.5, "seed": 3}}]
    spec = parse_spec(doc)
    plan = plan_dataset(spec, scenes={"builtin": builtin})
    by = {t.variant: t for t in plan.shards}
    assert dict(by["noisy"].lidars[0].config)["seed"] == 7 and by["moved"].lidars[0].translation != (1.0, 0.0, 1.9)
    assert len({t.inputs_hash for t in plan.shards}) == 3
    assert plan_dataset(spec, scenes={"builtin": builtin}).shards[2].lidars == by["moved"].lidars  # deterministic
    s = run_dataset(spec, tmp_path, workers=0, progress=False, plan=plan)
    assert s.ok and s.rendered == 3
    ply = {v: (tmp_path / f"wsim-street-block/{v}/frames/000000/{LIDAR}.ply").read_bytes() for v in by}
    assert len(set(ply.values())) == 3


@pytest.mark.parametrize("change, field", [
    ({"scenes": []}, "scenes: must not be empty"),
    ({"scenes": ["nowhere.usd"]}, "scenes[0].source: no such scene file"),
    ({"frames": {"rate_hz": "ten"}}, "frames.rate_hz: must be a finite number"),
    ({"frames": {"rate_hz": 10, "start_s": 11.5, "end_s": 13.0}}, "frames.end_s: the last frame ends at 13 s"),
    ({"frames": {"rate_hz": 10, "chunk": 0}}, "frames.chunk: must be >= 1"),
    ({"frame": {"rate_hz": 10}}, "frame: unknown field"),
    ({"rig": {"cameras": [{"id": "camera_nope"}]}}, "rig.cameras[0].id: scenes[0] has no camera 'camera_nope'"),
    ({"rig": {"lidars": [{"preset": "VLP16"}]}}, "rig.lidars[0].preset: unknown lidar preset"),
    ({"rig": {"lidars": [{"preset": "AT128", "config": {"max_returns": 20}}]}},
     "rig.lidars[0].config.max_returns: AT128: omni:sensor:Core:maxReturns"),
    ({"rig": {"lidars": [{"preset": "AT128", "config": {"spin": 1}}]}}, "rig.lidars[0].config.spin: unknown lidar"),
    ({"rig": {"lidars": [{"preset": "AT128", "mount": {"translation": [0, 0]}}]}},
     "rig.lidars[0].mount.translation: must be a list of 3 numbers"),
    ({"rig": {"lidars": ["AT128", "AT128"]}}, "rig.lidars[1]: sensor id 'lidar_front_at128' is used twice"),
    ({"variants": [{"name": "a"}, {"name": "a"}]}, "variants[1].name: duplicate variant name"),
    ({"variants": [{"name": "a", "lidar_config": {"max_returns": 0}}]}, "variants[0].lidar_config.max_returns"),
    ({"outputs": {"formats": ["hdf5"]}}, "outputs.formats[0]: unknown format"),
])
def test_bad_specs_name_the_field(builtin, tmp_path, change, field):
    doc = spec_doc()
    doc.update(change)
    if "frame" in change:
        del doc["frames"]
    with pytest.raises(SpecError) as e:
        plan_dataset(parse_spec(doc, path="spec.yaml", base=tmp_path), scenes={"builtin": builtin})
    assert str(e.value).startswith(f"spec.yaml: {field}"), str(e.value)
    assert "\n" not in str(e.value)


def test_cli_dataset_errors_are_one_line_and_dry_run_plans(tmp_path, capfd):
    import yaml

    from wsim.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("scenes: [builtin]\nrig: scene\nframes: {rate_hz: 0}\n")
    assert main(["dataset", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capfd.readouterr().err
    assert err == f"wsim: error: {bad}: frames.rate_hz: must be > 0, got 0\n"
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(spec_doc(chunk=3)))
    assert main(["dataset", str(good), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    out = capfd.readouterr().out
    assert "4 shards x up to 3 frames, 10 frames" in out and not (tmp_path / "out").exists()
