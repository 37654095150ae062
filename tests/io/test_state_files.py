"""The ``checkpoint`` state file when it does not name a usable checkpoint, against TensorFlow.

TensorFlow's ``CheckpointManager`` writes the checkpoints and the state file; then the
state file is made to name a checkpoint whose files are gone, or to name nothing.
``tf.train.latest_checkpoint`` / ``get_checkpoint_state`` / ``load_checkpoint`` say what
each means; tfckpt agrees, and never falls back to another ``.index`` in the directory.
(A state file that does not parse is an error in tfckpt, where TensorFlow logs it and
finds no checkpoint: ``test_dtypes_paths.py``.)
"""

from __future__ import annotations

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tfckpt  # noqa: E402
from tfckpt import CheckpointNotFoundError, CorruptCheckpointError  # noqa: E402


def managed(directory, saves: int) -> list[str]:
    """``saves`` checkpoints by a CheckpointManager in ``directory``; their prefixes."""
    v = tf.Variable(np.arange(4, dtype=np.float32))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(directory), max_to_keep=5)
    prefixes = []
    for _ in range(saves):
        v.assign_add(tf.ones(4))
        prefixes.append(manager.save())
    return prefixes


def remove_checkpoint(prefix: str) -> None:
    d, name = os.path.split(prefix)
    for f in os.listdir(d):
        if f == name + ".index" or f.startswith(name + ".data-"):
            os.remove(os.path.join(d, f))


@pytest.mark.parametrize("saves", [1, 2])
def test_state_file_naming_removed_checkpoint(tmp_path, saves):
    """The latest checkpoint's files are gone (another may remain): no checkpoint, not another."""
    prefixes = managed(tmp_path, saves)
    remove_checkpoint(prefixes[-1])
    left = sorted(f for f in os.listdir(tmp_path) if f.endswith(".index"))
    assert len(left) == saves - 1

    assert tf.train.latest_checkpoint(str(tmp_path)) is None
    assert tfckpt.latest_checkpoint(str(tmp_path)) is None
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert state.model_checkpoint_path == prefixes[-1]  # the state file itself is fine
    with pytest.raises(ValueError):
        tf.train.load_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointNotFoundError) as e:
        tfckpt.open(str(tmp_path))
    assert e.value.path == str(tmp_path / "checkpoint")
    assert prefixes[-1] + ".index" in str(e.value) and str(tmp_path / "checkpoint") in str(e.value)


@pytest.mark.parametrize("content", [b"", b"\n", b'all_model_checkpoint_paths: "ckpt-1"\n'])
def test_state_file_naming_nothing(tmp_path, content):
    """An empty state file: TensorFlow raises; tfckpt too, without taking the lone .index."""
    managed(tmp_path, 1)
    (tmp_path / "checkpoint").write_bytes(content)
    with pytest.raises(ValueError, match="Invalid checkpoint state"):
        tf.train.get_checkpoint_state(str(tmp_path))
    with pytest.raises(ValueError, match="Invalid checkpoint state"):
        tf.train.latest_checkpoint(str(tmp_path))
    for call in (tfckpt.latest_checkpoint, tfckpt.open):
        with pytest.raises(CorruptCheckpointError, match="names no checkpoint") as e:
            call(str(tmp_path))
        assert e.value.path == str(tmp_path / "checkpoint")
