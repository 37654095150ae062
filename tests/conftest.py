"""Shared fixtures: checkpoints written by real TensorFlow, built once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Before anything imports TensorFlow: keep its C++ logging out of the test output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

# tf_checkpoints.py sits next to this file; make it importable under any --import-mode.
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


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
