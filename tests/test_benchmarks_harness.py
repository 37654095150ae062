"""The benchmark harness refuses to time a contender that failed (no real benchmarks run)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def harness(monkeypatch):
    # Contenders import tfckpt from this checkout, whatever the caller's PYTHONPATH.
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    )
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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
    ],
)
def test_contender_whose_work_fails_is_not_timed(harness, tmp_path, contender):
    missing = str(tmp_path / "absent" / "model")
    args = [a.format(missing=missing, out=tmp_path / "out") for a in contender]
    with pytest.raises(harness.ContenderFailed) as e:
        harness.measured(args)
    assert missing in str(e.value)
