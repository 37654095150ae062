"""Finding checkpoints as a user names them, against directories TensorFlow writes.

A TF1 ``Saver`` (``max_to_keep=3``) and a TF2 ``CheckpointManager`` each save five
checkpoints of a training run; the directories are then moved, so the ``Saver``'s state
file names paths that are gone (``tf.train.latest_checkpoint`` finds nothing). tfckpt
takes the same file names beside the state file, with a note; names a checkpoint
that does not exist with "did you mean"; and ``dump DIR --all`` lists every checkpoint.
Every checkpoint found holds the values the tests compute for its step. TF1 ``Saver`` runs of
V1 files (one file, or sharded) have the latest checkpoint TensorFlow finds.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import warnings

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import transform_helpers as th  # noqa: E402  (conftest put tests/ on sys.path)
from cli_helpers import in_process  # noqa: E402
from saver_runs import runs, v1_sharded  # noqa: E402,F401  (the Saver runs)

import tfckpt  # noqa: E402
from tfckpt import CheckpointNotFoundError, CheckpointPathWarning  # noqa: E402


def value_at(step: int) -> np.ndarray:
    """What the variable holds after ``step`` training steps (the writers add this much)."""
    return np.arange(6, dtype=np.float32) * np.float32(0.5) + np.float32(step)


def checkpoint_bytes(prefix: str) -> int:
    d, name = os.path.split(prefix)
    return sum(
        os.path.getsize(os.path.join(d, f))
        for f in os.listdir(d)
        if f == name + ".index" or f.startswith(name + ".data-")
    )


@pytest.fixture(scope="module")
def tf1_moved(tmp_path_factory):
    """Five TF1 Saver checkpoints (three kept) in A/, then A/ moved to B/."""
    root = tmp_path_factory.mktemp("tf1_moved")
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=value_at(0))
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(v.assign_add(np.ones(6, np.float32)), step.assign_add(1))
        saver = tf.compat.v1.train.Saver(max_to_keep=3)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for i in range(1, 6):
                sess.run(train)
                saver.save(sess, str(root / "A" / "model.ckpt"), global_step=i)
    state = (root / "A" / "checkpoint").read_text()
    assert f'"{root / "A" / "model.ckpt-5"}"' in state  # absolute paths, as Saver writes
    shutil.move(root / "A", root / "B")
    return root / "B"


@pytest.fixture(scope="module")
def tf2_moved(tmp_path_factory):
    """Five TF2 CheckpointManager checkpoints (three kept) in A/, then A/ moved to B/."""
    root = tmp_path_factory.mktemp("tf2_moved")
    v = tf.Variable(value_at(0))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(root / "A"), 3)
    for _ in range(5):
        v.assign_add(tf.ones(6))
        manager.save()
    shutil.move(root / "A", root / "B")
    return root / "B"


def test_tf1_moved_directory_found_beside_state_file(tf1_moved, tmp_path):
    b = str(tf1_moved)
    latest = os.path.join(b, "model.ckpt-5")
    assert tf.train.latest_checkpoint(b) is None  # TensorFlow follows the stale path

    rc, out, err = in_process("dump", b, "--tensor", "v", "--json")
    assert rc == 0, err
    assert json.loads(out)["prefix"] == latest
    assert json.loads(out)["tensors"][0]["values"] == value_at(5).tolist()
    note = err.splitlines()
    assert len(note) == 1 and note[0].startswith("tfckpt: note: "), err
    assert str(tf1_moved.parent / "A" / "model.ckpt-5") in note[0] and latest in note[0]

    with pytest.warns(CheckpointPathWarning, match="beside it"):
        assert tfckpt.latest_checkpoint(b) == latest
    with pytest.warns(CheckpointPathWarning):
        summary = tfckpt.convert(b, f"{tmp_path}/out/", "float16")
    assert summary.dst == str(tmp_path / "out" / "model.ckpt-5")
    restored = th.tf1_restore(summary.dst, {"v": (tf.float16, (6,)), "global_step": (tf.int64, ())})
    assert restored["v"].tobytes() == value_at(5).astype(np.float16).tobytes()
    assert int(restored["global_step"]) == 5


def test_state_file_from_another_machine(tf1_moved, tmp_path):
    """Windows paths in the state file (a directory downloaded from there) work too."""
    d = tmp_path / "dl"
    shutil.copytree(tf1_moved, d)
    state = (
        (d / "checkpoint").read_text().replace(str(tf1_moved.parent / "A") + "/", "C:\\\\run\\\\")
    )
    assert '"C:\\\\run\\\\model.ckpt-5"' in state
    (d / "checkpoint").write_text(state)
    with pytest.warns(CheckpointPathWarning, match=r"C:\\run\\model.ckpt-5"):
        with tfckpt.open(str(d)) as ckpt:
            assert ckpt.prefix == str(d / "model.ckpt-5")
            assert ckpt["v"].tobytes() == value_at(5).tobytes()


@pytest.mark.parametrize("kind", ["tf1", "tf2"])
def test_did_you_mean(kind, tf1_moved, tf2_moved):
    d, base = (tf1_moved, "model.ckpt") if kind == "tf1" else (tf2_moved, "ckpt")
    want = ", ".join(str(d / f"{base}-{i}") for i in (3, 4, 5))
    for asked in (base, f"{base}-7"):
        rc, out, err = in_process("dump", d / asked)
        assert rc == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith("tfckpt: error: ") and f"did you mean {want}?" in err, err
        with pytest.raises(CheckpointNotFoundError, match=f"did you mean {want}"):
            tfckpt.open(str(d / asked))
    # Nothing near: no guess.
    rc, _, err = in_process("dump", d / "zzz")
    assert rc == 2 and "did you mean" not in err


def test_dump_all_tf1(tf1_moved, tmp_path):
    d = tmp_path / "B"
    shutil.copytree(tf1_moved, d)
    # A checkpoint the state file does not know (written by TensorFlow beside the others).
    th.save_v2(d / "best", {"v": value_at(4)})
    rc, out, err = in_process("dump", d, "--all", "--json")
    assert rc == 0, err
    assert err.count("tfckpt: note: ") == 1 and "(and 2 more such paths)" in err, err
    data = json.loads(out)
    assert data["latest"] == str(d / "model.ckpt-5") and data["state_file"] is True
    rows = data["checkpoints"]
    assert [(c["name"], c["step"], c["latest"], c["in_state_file"]) for c in rows] == [
        ("model.ckpt-3", 3, False, True),
        ("model.ckpt-4", 4, False, True),
        ("model.ckpt-5", 5, True, True),
        ("best", None, False, False),
    ]
    for c in rows:
        assert c["bytes"] == checkpoint_bytes(c["prefix"]) and c["error"] is None
        assert c["tensors"] == len(tf.train.list_variables(c["prefix"]))
    for c, step in zip(rows, (3, 4, 5, 4)):
        assert tf.train.load_checkpoint(c["prefix"]).get_tensor("v").tobytes() == (
            value_at(step).tobytes()
        )

    rc, out, err = in_process("dump", d, "--all")
    assert rc == 0, err
    lines = [line.split() for line in out.splitlines()]
    table = lines[lines.index(["NAME", "STEP", "TENSORS", "SIZE", "NOTE"]) :]
    assert [row[:3] for row in table[1:]] == [
        ["model.ckpt-3", "3", "2"],
        ["model.ckpt-4", "4", "2"],
        ["model.ckpt-5", "5", "2"],
        ["best", "-", "1"],
    ]
    assert table[3][-1] == "latest" and " ".join(table[4][-5:]) == "not in the state file"

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointPathWarning)
        assert tfckpt.list_checkpoints(str(d)) == data


def test_dump_all_tf2_manager(tf2_moved):
    rc, out, err = in_process("dump", tf2_moved, "--all", "--json")
    assert rc == 0 and err == "", err  # relative paths: nothing to note
    rows = json.loads(out)["checkpoints"]
    assert [(c["name"], c["step"], c["latest"]) for c in rows] == [
        ("ckpt-3", 3, False),
        ("ckpt-4", 4, False),
        ("ckpt-5", 5, True),
    ]
    for c in rows:
        assert c["bytes"] == checkpoint_bytes(c["prefix"])
        reader = tf.train.load_checkpoint(c["prefix"])
        assert reader.get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE").tobytes() == (
            value_at(c["step"]).tobytes()
        )
        assert c["tensors"] == len(tf.train.list_variables(c["prefix"]))
    # --all is for directories, and lists something or fails.
    rc, _, err = in_process("dump", tf2_moved / "ckpt-5", "--all")
    assert rc == 2 and "not a directory" in err


def test_remote_moved_directory(tf1_moved):
    """memory://: the state file's absolute local paths cannot be looked up there at all;
    the files beside it are found, listed and read."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = f"/friendly{uuid.uuid4().hex[:8]}"
    try:
        for f in os.listdir(tf1_moved):
            fs.pipe(f"{root}/B/{f}", (tf1_moved / f).read_bytes())
        url = f"memory:/{root}/B"
        rc, out, err = in_process("dump", url, "--all", "--json")
        assert rc == 0, err
        assert "tfckpt: note: " in err
        rows = json.loads(out)["checkpoints"]
        assert [(c["prefix"], c["step"]) for c in rows] == [
            (f"{url}/model.ckpt-{i}", i) for i in (3, 4, 5)
        ]
        assert [c["bytes"] for c in rows] == [
            checkpoint_bytes(str(tf1_moved / f"model.ckpt-{i}")) for i in (3, 4, 5)
        ]
        with pytest.warns(CheckpointPathWarning):
            with tfckpt.open(url) as ckpt:
                assert ckpt["v"].tobytes() == value_at(5).tobytes()
        rc, _, err = in_process("dump", f"{url}/model.ckpt")
        assert rc == 2 and f"did you mean {url}/model.ckpt-3" in err, err
    finally:
        fs.rm(root, recursive=True)


def test_did_you_mean_lists_the_newest_steps(tf1_moved, tmp_path):
    d = tmp_path / "B"
    shutil.copytree(tf1_moved, d)
    for step in (10, 11, 12):
        th.save_v2(d / f"model.ckpt-{step}", {"v": value_at(step)})
    want = ", ".join(str(d / f"model.ckpt-{i}") for i in (4, 5, 10, 11, 12))
    rc, _, err = in_process("dump", d / "model.ckpt")
    assert rc == 2 and f"did you mean {want} (the last 5 of 6)?" in err, err


# The runs of a TF1 Saver (V2, V1 and sharded V1 files): named relatively, missing a
# data file, and the latest checkpoint as TensorFlow finds it.


def test_dump_all_of_a_saver_run_named_relatively(runs, monkeypatch):
    """A Saver's state file names absolute paths; DIR typed relative lists each once."""
    monkeypatch.chdir(runs["root"])
    rc, out, err = in_process("dump", "v2", "--all", "--json")
    assert rc == 0, err
    rows = json.loads(out)["checkpoints"]
    assert [(r["name"], r["in_state_file"], r["latest"]) for r in rows] == [
        ("model.ckpt-1", True, False),
        ("model.ckpt-2", True, False),
        ("model.ckpt-3", True, True),
    ]
    rc, out, err = in_process("dump", "v2", "--all")
    assert rc == 0, err
    assert "not in the state file" not in out


def test_dump_all_names_a_missing_data_file(runs, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(runs["root"] / "v2", d)
    (d / "model.ckpt-2.data-00000-of-00001").unlink()
    rows = tfckpt.list_checkpoints(str(d))["checkpoints"]
    (broken,) = [r for r in rows if r["error"]]
    assert broken["name"] == "model.ckpt-2"
    assert "model.ckpt-2.data-00000-of-00001" in broken["error"]


def test_latest_checkpoint_of_v1_runs_is_tensorflows(runs, v1_sharded):
    """A V1 save has no .index: its file, or the pattern of its shards, is the latest."""
    for directory in (os.path.dirname(runs["v1"][0]), v1_sharded[0]):
        want = tf.train.latest_checkpoint(directory)
        assert want is not None
        assert tfckpt.latest_checkpoint(directory) == want
