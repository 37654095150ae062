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
