"""``tfckpt average`` as a demanding user runs it: ``--last`` of a moved run (its state file
naming paths from elsewhere), of a V1 and of a sharded V1 ``Saver`` run; weights whose sum
overflows; a cast of a partitioned variable; ``--use-ema`` with dtype rules; complex means
beyond complex64's range; pre-sliced tensors whose sources store other slices.

Every checkpoint is written by TensorFlow during the run; values are checked against
TensorFlow's own reader.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import average_checkpoints as ac  # noqa: E402
from cli_helpers import assert_cli_error, in_process  # noqa: E402
from saver_runs import runs, v1_sharded  # noqa: E402,F401  (the Saver runs)

import tfckpt  # noqa: E402


def _moved(runs, tmp_path, windows: bool) -> str:
    """The V2 run copied to tmp_path, its state file naming paths that are not there."""
    d = tmp_path / "run"
    shutil.copytree(runs["root"] / "v2", d)
    state = (d / "checkpoint").read_text()
    gone = "C:\\\\Users\\\\me\\\\train" if windows else "/nonexistent/train"
    (d / "checkpoint").write_text(state.replace(str(runs["root"] / "v2"), gone))
    with pytest.warns(tfckpt.CheckpointPathWarning, match="beside it"):
        assert tfckpt.latest_checkpoint(str(d)) is not None  # found beside it
    assert tf.train.latest_checkpoint(str(d)) is None  # TensorFlow finds nothing
    return str(d)


@pytest.mark.parametrize("windows", [False, True], ids=["posix", "windows"])
def test_average_last_follows_a_state_file_from_elsewhere(runs, tmp_path, windows):
    directory = _moved(runs, tmp_path, windows)
    rc, _, err = in_process("average", "--last", "2", directory, "-o", f"{tmp_path}/avg/")
    assert rc == 0, err
    assert err.startswith("tfckpt: note: ") and "beside it" in err.splitlines()[0]
    got = tf.train.load_checkpoint(str(tmp_path / "avg" / "model.ckpt-3")).get_tensor("v")
    a, b = (runs["values"][p] for p in runs["v2"][-2:])
    want = tf.cast((a.astype(np.float64) + b) / 2, tf.float32).numpy()
    assert got.tobytes() == want.tobytes()


def test_average_last_of_a_v1_run(runs, tmp_path):
    directory = os.path.dirname(runs["v1"][0])
    rc, _, err = in_process("average", "--last", "2", directory, "-o", f"{tmp_path}/avg/")
    assert rc == 0, err
    got = tf.train.load_checkpoint(str(tmp_path / "avg" / "model.ckpt-3")).get_tensor("v")
    # The V1 run computed what the V2 run did, step by step.
    a, b = (runs["values"][p] for p in runs["v2"][-2:])
    want = tf.cast((a.astype(np.float64) + b) / 2, tf.float32).numpy()
    assert got.tobytes() == want.tobytes()


def test_average_weights_whose_sum_overflows(runs, tmp_path):
    a, b = runs["v2"][-2:]
    assert_cli_error(
        in_process("average", a, b, "-o", tmp_path / "o", "--weights", "1e308", "1e308"),
        "finite, non-zero sum",
    )
    assert not os.path.exists(tmp_path / "o.index")


def test_average_cast_of_a_partitioned_variable_warns_as_convert(runs, tmp_path):
    """float16 slices restore only into the same partitions: the summary says so."""
    directory = os.path.dirname(runs["v2"][0])
    rc, _, err = in_process(
        "average", "--last", "2", directory, "-o", f"{tmp_path}/avg/", "--dtype", "float16"
    )
    assert rc == 0, err
    (warning,) = [line for line in err.splitlines() if line.startswith("tfckpt: warning: ")]
    assert "stay partitioned in float16 (emb)" in warning
    with tfckpt.open(str(tmp_path / "avg" / "model.ckpt-3")) as ckpt:
        assert ckpt.info("emb").dtype == "float16" and len(ckpt.info("emb").slices) == 2


def test_average_use_ema_dtype_rules_match_the_variables_names(tmp_path):
    """With --use-ema a variable's value comes from its shadow; a rule naming the
    variable (anchored, as users write them) still decides its dtype."""
    run = ac.write_tf1_run(tmp_path / "run")
    out = tmp_path / "avg"
    flags = ["--use-ema", "--dtype", "float16", "--dtype-rule", "dense/bias$=bfloat16"]
    rc, _, err = in_process("average", "--last", "2", run["dir"], "-o", out, *flags)
    assert rc == 0, err
    assert "dtype rule dense/bias$=bfloat16: 1 tensors" in err
    reader = tf.train.load_checkpoint(str(out))
    assert reader.get_variable_to_dtype_map()["dense/bias"] == tf.bfloat16
    shadows = [
        tf.train.load_checkpoint(p).get_tensor("dense/bias/ExponentialMovingAverage")
        for p in run["prefixes"][-2:]
    ]
    want = tf.cast((shadows[0].astype(np.float64) + shadows[1]) / 2, tf.bfloat16).numpy()
    assert reader.get_tensor("dense/bias").tobytes() == want.tobytes()


def test_average_complex_overflow_follows_the_policy(tmp_path):
    """Extrapolating weights can take a mean beyond complex64's range: as for float32,
    an error naming the tensor (one line, no numpy warning), or clipped part by part."""
    for i, x in enumerate((3e38, -3e38)):
        tf.raw_ops.SaveV2(
            prefix=str(tmp_path / f"m-{i}"),
            tensor_names=["c", "f"],
            shape_and_slices=["", ""],
            tensors=[
                tf.constant([x + 0.5j, 1 + 1j], tf.complex64),
                tf.constant([x, 1.0], tf.float32),
            ],
        )
    srcs = [tmp_path / "m-0", tmp_path / "m-1"]
    line = assert_cli_error(
        in_process("average", *srcs, "-o", tmp_path / "out", "--weights", "-1", "2"),
        "c (1 values)",
    )
    assert "f (1 values)" in line
    rc, _, err = in_process(
        "average", *srcs, "-o", tmp_path / "out", "--weights", "-1", "2", "--overflow", "clip"
    )
    assert rc == 0, err
    reader = tf.train.load_checkpoint(str(tmp_path / "out"))
    top = np.finfo(np.float32).max
    want = np.array([-top + 0.5j, 1 + 1j], np.complex64)
    assert reader.get_tensor("c").tobytes() == want.tobytes()
    assert reader.get_tensor("f").tobytes() == np.array([-top, 1], np.float32).tobytes()


def test_average_copies_the_newest_slices_whatever_the_others_are(tmp_path):
    """A pre-sliced integer tensor is copied from the newest source: older sources that
    store other slices of it are no reason to fail."""
    ids = np.arange(12, dtype=np.int64).reshape(4, 3)
    for i, spec in enumerate(("4 3 0,2:-", "4 3 2,2:-")):
        rows = ids[:2] if i == 0 else ids[2:]
        tf.raw_ops.SaveV2(
            prefix=str(tmp_path / f"m-{i}"),
            tensor_names=["ids", "w"],
            shape_and_slices=[spec, ""],
            tensors=[tf.constant(rows), tf.constant([float(i), 2.0 * i], tf.float32)],
        )
    rc, _, err = in_process("average", tmp_path / "m-0", tmp_path / "m-1", "-o", tmp_path / "out")
    assert rc == 0, err
    got = tf.raw_ops.RestoreV2(
        prefix=str(tmp_path / "out"),
        tensor_names=["ids", "w"],
        shape_and_slices=["4 3 2,2:-", ""],
        dtypes=[tf.int64, tf.float32],
    )
    assert got[0].numpy().tobytes() == ids[2:].tobytes()
    assert got[1].numpy().tolist() == [0.5, 1.0]


def test_sharded_v1_run_listed_and_averaged(v1_sharded, tmp_path):
    directory, saved = v1_sharded
    rows = tfckpt.list_checkpoints(directory)["checkpoints"]
    assert [(r["step"], r["tensors"], r["error"]) for r in rows] == [
        (1, 2, None),
        (2, 2, None),
        (3, 2, None),
    ]
    moved = tmp_path / "moved"
    shutil.copytree(directory, moved)
    state = (moved / "checkpoint").read_text().replace(directory, "/gone/train")
    (moved / "checkpoint").write_text(state)
    for source in (directory, str(moved)):
        out = tmp_path / f"avg-{len(os.listdir(tmp_path))}"
        rc, _, err = in_process("average", "--last", "2", source, "-o", f"{out}/")
        assert rc == 0, err
        assert len(err.splitlines()) == (2 if source == str(moved) else 1), err
        reader = tf.train.load_checkpoint(str(out / "model.ckpt-3"))
        for name in ("a", "b"):
            x, y = (tf.train.load_checkpoint(p).get_tensor(name) for p in saved[-2:])
            want = tf.cast((x.astype(np.float64) + y) / 2, tf.float32).numpy()
            assert reader.get_tensor(name).tobytes() == want.tobytes()
    rc, _, err = in_process("dump", moved)
    assert rc == 0, err
    (note,) = err.splitlines()  # one note, however often the path is resolved
    assert note.startswith("tfckpt: note: ") and "beside it" in note
