"""The benchmark harness refuses to time a contender that failed (no real benchmarks run)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def harness(monkeypatch):
    # Contenders import tfckpt from this checkout, whatever the caller's PYTHONPATH.
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    )
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.PREFAULT["bytes"] = 1 << 20  # exercised, but small: these are not timings
    return module


def test_failing_command_raises_with_status_and_stderr(harness):
    command = [
        sys.executable,
        "-c",
        "import sys; sys.stderr.write('x' * 5000 + 'the reason'); sys.exit(3)",
    ]
    with pytest.raises(harness.ContenderFailed) as e:
        harness.measure(command)
    message = str(e.value)
    assert "status 3" in message
    assert message.endswith("the reason")  # the tail of stderr, where the cause is
    assert len(message) < 2500


def test_succeeding_command_is_measured(harness):
    got = harness.measure([sys.executable, "-c", "print('{\"seconds\": 0.25}')"])
    assert got["inner"] == 0.25 and got["wall"] > 0 and got["rss"] > 0


@pytest.mark.parametrize(
    "contender",
    [
        ["tfckpt_convert", "{missing}", "{out}/model", "float16"],
        ["tfckpt_list", "{missing}"],
        ["tfckpt_dump", "{missing}"],
        ["cp_data", "{missing}", "{out}/model"],
        ["tfckpt_export", "{missing}", "{out}/model.safetensors"],
        ["tfckpt_export_modules", "{missing}", "{out}/model.safetensors"],
        ["tfckpt_import", "{missing}.safetensors", "{out}/model"],
    ],
)
def test_contender_whose_work_fails_is_not_timed(harness, tmp_path, contender):
    missing = str(tmp_path / "absent" / "model")
    args = [a.format(missing=missing, out=tmp_path / "out") for a in contender]
    with pytest.raises(harness.ContenderFailed) as e:
        harness.measured(args)
    assert missing in str(e.value)


def test_cases_are_selectable_and_scaled(harness, capsys):
    """--only picks cases by name (several allowed); names carry the scaled sizes, so a
    quick run with small inputs is labelled as such. Listing writes no inputs."""
    args = ["--list", "--only", "GiB", "--only", "small tensors", "--many", "2000"]
    assert harness.main(args + ["--huge-big-mib", "2048", "--out", "/nonexistent"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert "convert float32->float16 (4 GiB)" in listed
    assert "convert float32->bfloat16 (1 GiB)" in listed
    assert "convert 2000 small tensors to float16" in listed
    assert not [c for c in listed if "dump" in c or "cast alone" in c]
    assert harness.main(["--list", "--big-mib", "16", "--medium", "0"]) == 0
    assert "convert float32->float16 (16 MiB)" in capsys.readouterr().out.splitlines()


def test_table_compares_like_with_like(harness):
    """tfckpt's default (fsync) against a durable copy, --no-fsync against plain cp, and
    the scaled cases against their smaller twins."""

    def row(wall):
        return {"wall": wall, "inner": wall, "rss": 2**20}

    one, four = "convert float32->float16 (1 GiB)", "convert float32->float16 (4 GiB)"
    results = {
        one: {
            "tfckpt": row(3.0),
            "cp + fsync": row(2.0),
            "tfckpt --no-fsync": row(1.5),
            "cp": row(1.0),
            "tensorflow": row(10.0),
        },
        four: {"tfckpt": row(12.0), "cp + fsync": row(8.0)},
        "cast alone": {"x": {**row(1.0), "throughput": 4e9}},
    }
    machine = {"cpu": "c", "cores": 2, "memory_gib": 1, "python": "3", "numpy": "2"}
    out = harness.table(
        {"machine": machine, "repeat": 1, "sizes": harness.SIZES, "results": results}
    )
    lines = out.splitlines()
    assert any(
        ln.startswith(f"| {one} | tfckpt | 3.00 s | 0.30× | 1.50× cp + fsync |") for ln in lines
    )
    assert any(
        ln.startswith(f"| {one} | tfckpt --no-fsync | 1.50 s | 0.15× | 1.50× cp |") for ln in lines
    )
    assert any("| cast alone | x |" in ln and "| 4.00 |" in ln for ln in lines)
    assert f"- {four} / {one}, tfckpt: 4.00× the time (linear: 4×)" in lines


@pytest.mark.parametrize(
    "contender,says",
    [
        (["cp_durable", "{missing}", "{out}/model"], "no files of"),
        (["read_data", "{missing}"], "no data files of"),
    ],
)
def test_floor_contender_without_input_is_not_timed(harness, tmp_path, contender, says):
    (tmp_path / "absent").mkdir()
    missing = str(tmp_path / "absent" / "model")
    args = [a.format(missing=missing, out=tmp_path / "out") for a in contender]
    with pytest.raises(harness.ContenderFailed) as e:
        harness.measured(args)
    assert f"{says} {missing}" in str(e.value)


def test_average_memory_script_runs_at_a_small_size(tmp_path):
    """The averaging memory benchmark, at a few MiB: TensorFlow writes its input, tfckpt
    averages the hard-linked copies, and the report sets the peak against the budget."""
    pytest.importorskip("tensorflow")
    import json
    import subprocess

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    args = ["--sources", "3", "--chunk-bytes", "4M", "--big-mib", "16", "--medium", "2"]
    args += ["--medium-mib", "1", "--out", str(tmp_path)]
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "average_memory.py"), *args],
        check=True,
        env=env,
        capture_output=True,
    )
    report = json.loads((tmp_path / "average_memory.json").read_text())
    assert report["sources"] == 3 and report["peak_rss"] > 0


def test_transform_memory_script_runs_at_a_small_size(tmp_path):
    """The value-transform memory benchmark at 16 MiB: TensorFlow writes the input, the
    three contenders must write the same tensors, and the report has every number."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("safetensors")
    import json
    import subprocess

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    args = ["--big-mib", "16", "--chunk-bytes", "2M", "--out", str(tmp_path)]
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "transform_memory.py"), *args],
        check=True,
        env=env,
        capture_output=True,
    )
    report = json.loads((tmp_path / "transform_memory.json").read_text())
    assert set(report["contenders"]) == {
        "tfckpt export",
        "tfckpt convert",
        "TensorFlow reader + numpy + safetensors",
    }
    assert all(r["peak_rss"] > 0 and r["wall"] > 0 for r in report["contenders"].values())


def test_archive_read_script_runs_at_a_small_size(tmp_path):
    """The archive benchmark at 6 MiB: TensorFlow writes the input, it is packed as a
    tar.gz and a deflated zip, every command runs in the archive and after extracting
    (the conversions checked against the extracted files'), and the report has every
    number and ratio."""
    pytest.importorskip("tensorflow")
    import json
    import subprocess

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    args = ["--big-mib", "4", "--medium", "2", "--medium-mib", "1", "--repeat", "1"]
    args += ["--kinds", "tar.gz", "zip-deflated", "--prefault-mib", "0", "--out", str(tmp_path)]
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "archive_read.py"), *args],
        check=True,
        env=env,
        capture_output=True,
    )
    report = json.loads((tmp_path / "archive_read.json").read_text())
    assert report["checkpoint_mib"] == 6
    assert sorted(report["rows"]) == [
        "tar.gz convert",
        "tar.gz dump",
        "zip-deflated convert",
        "zip-deflated dump",
    ]
    for row in report["rows"].values():
        assert row["in the archive"]["peak_rss"] > 0 and row["ratio"]["wall"] > 0
        assert row["extract, then tfckpt"]["wall"] >= row["extraction alone"]["wall"]


def test_h5_export_memory_script_runs_at_a_small_size(tmp_path):
    """The HDF5 export memory benchmark at a few MiB: TensorFlow writes the input, h5py
    saves it in the Keras layout, the three contenders must write the same tensors, and
    the report has every number."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras")
    pytest.importorskip("h5py")
    pytest.importorskip("safetensors")
    import json
    import subprocess

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    args = ["--big-mib", "8", "--medium", "2", "--medium-mib", "1", "--chunk-bytes", "2M"]
    args += ["--prefault-mib", "0", "--out", str(tmp_path)]
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "h5_export_memory.py"), *args],
        check=True,
        env=env,
        capture_output=True,
    )
    report = json.loads((tmp_path / "h5_export_memory.json").read_text())
    assert set(report["contenders"]) == {
        "tfckpt export",
        "h5py read whole + safetensors",
        "tf.keras load_weights + safetensors",
    }
    assert all(r["peak_rss"] > 0 and r["wall"] > 0 for r in report["contenders"].values())
    assert report["h5_bytes"] > 10 << 20 and report["chunk_bytes"] == 2 << 20


def test_gpu_script_without_a_gpu_says_so_and_exits_0(tmp_path):
    """benchmarks/gpu.py where TensorFlow sees no GPU (hidden from it here, on any machine):
    one line saying so, exit 0, and no input written."""
    import subprocess

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("no GPU: ")
    assert list(tmp_path.iterdir()) == []


def test_gpu_script_compares_every_output_file(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "model.index").write_bytes(b"index")
        (d / "checkpoint").write_text(f"model_checkpoint_path: {d}")  # names its folder
    (a / "model.data-00000-of-00001").write_bytes(b"x" * (1 << 25) + b"1")
    (b / "model.data-00000-of-00001").write_bytes(b"x" * (1 << 25) + b"2")
    assert gpu.same_files(str(a), str(b)) == ["model.data-00000-of-00001"]
    (b / "model.data-00000-of-00001").write_bytes(b"x" * (1 << 25) + b"1")
    assert gpu.same_files(str(a), str(b)) == []
    (a / "extra").write_bytes(b"")
    assert gpu.same_files(str(a), str(b)) == ["extra"]


def test_s3_table_takes_ratios_within_rounds():
    """The S3 benchmark's ratio is the median of each round's own ratio, not a ratio of
    medians; the server's rates come from its in-process figures."""
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location(
        "bench_s3", ROOT / "benchmarks" / "s3_throughput.py"
    )
    s3b = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s3b)

    def rnd(convert, getput):
        return {
            "tfckpt convert": {"wall": convert, "rss": 100 << 20},
            "fsspec get + put": {"wall": getput, "rss": 600 << 20},
            "server alone: GET": {"wall": 1.0, "rss": 1 << 20, "throughput": 2e9},
            "server alone: PUT": {"wall": 1.0, "rss": 1 << 20, "throughput": 1e8},
        }

    rounds = [rnd(10.0, 20.0), rnd(30.0, 30.0), rnd(10.0, 12.0)]
    a = SimpleNamespace(server="/x/s3rver", concurrency=10, repeat=3)
    out = s3b.summary(rounds, 1 << 30, a)
    assert "| tfckpt convert | 10.00 s | 0.107 | 100 MiB |" in out
    assert "get + put's (ratio in each round, median): 1.20×" in out
    assert "GET 2.000 GB/s, PUT 0.100 GB/s" in out


def test_paths_script_runs_at_a_small_size(tmp_path):
    """The export/import benchmark's import case at 2 MiB: TensorFlow writes the input,
    tfckpt exports it once as the import's source, and the table judges every row."""
    pytest.importorskip("tensorflow")
    import json
    import subprocess

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    args = ["--repeat", "1", "--big-mib", "1", "--medium", "1", "--medium-mib", "1"]
    args += ["--only", "import", "--prefault-mib", "1", "--out", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "paths.py"), *args],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    report = json.loads((tmp_path / "paths.json").read_text())
    (case,) = report["results"]
    rows = report["results"][case]
    assert set(rows) == {
        "convert float16",
        "import float16",
        "import float32 (no cast)",
        "cp + fsync",
    }
    assert all(r["wall"] > 0 and r["rss"] > 0 for r in rows.values())
    assert "× convert float16" in proc.stdout
