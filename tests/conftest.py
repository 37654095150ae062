"""Shared fixtures: checkpoints written by real TensorFlow, built once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Before anything imports TensorFlow: keep its C++ logging out of the test output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

# The shared helpers (tf_checkpoints.py, cli_helpers.py, s3_helpers.py, ...) sit next to this
# file, the tests in one folder per layer; a test takes what it shares with others from a
# helper, never from another test module. Make the helpers importable under any
# --import-mode, their asserts rewritten as the tests' are (failures show the values).
_TESTS = Path(__file__).resolve().parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))
pytest.register_assert_rewrite(*sorted(p.stem for p in _TESTS.glob("*.py") if p.stem != "conftest"))


@pytest.fixture(scope="session")
def tf_checkpoints(tmp_path_factory):
    """``tf_checkpoints(name)`` -> TFCheckpoint, written by TensorFlow on first use, then shared.

    Tests must treat these files as read-only: copy them before changing anything.
    """
    pytest.importorskip("tensorflow")
    import tf_checkpoints as writers

    built: dict[str, object] = {}

    def get(name: str):
        if name not in built:
            built[name] = writers.WRITERS[name](tmp_path_factory.mktemp(name))
        return built[name]

    return get


# `make test-core` (TFCKPT_TEST_CORE=1) installs everything but what the markers name. A
# test there that skips for want of a module fails, unless a marker of its says it needs
# that module: a test that forgot its marker must not pass unseen as a skip.
_MARKED = {
    "torch": "hf",
    "transformers": "hf",
    "safetensors.torch": "hf",
    "jax": "jax",
    "selenium": "browser",
}


def _unmarked_skip(report, marked) -> str | None:
    """Under `make test-core`, why a skip for want of a module is a failure (None: it is
    not one): the module is one test-core installs, or the test does not carry the marker
    for it (``marked(marker)``)."""
    if os.environ.get("TFCKPT_TEST_CORE") != "1" or not report.skipped:
        return None
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
    reason = reason.removeprefix("Skipped: ")
    if not reason.startswith("could not import '"):
        return None
    module = reason.split("'")[1]
    marker = _MARKED.get(module)
    if marker is not None and marked(marker):
        return None
    return f"{report.nodeid}: skipped for want of {module!r}, which `make test-core` " + (
        "installs" if marker is None else f"leaves out: mark the test `{marker}`"
    )


def _fail(report, why: str | None) -> None:
    if why is not None:
        report.outcome = "failed"
        report.longrepr = why


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    _fail(report, _unmarked_skip(report, lambda m: item.get_closest_marker(m) is not None))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A test module skipped whole by a module-level ``importorskip``: it marks itself with
    a module-level ``pytestmark`` (read from its source: the module never finished running)."""
    report = (yield).get_result()
    path = getattr(collector, "path", None)
    if isinstance(collector, pytest.Module) and path is not None:
        source = Path(path).read_text(encoding="utf-8")
        _fail(report, _unmarked_skip(report, lambda m: f"pytestmark = pytest.mark.{m}" in source))
