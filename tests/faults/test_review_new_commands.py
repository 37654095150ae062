"""average, graft, flatten, dtype rules and friendly paths used as a demanding user would:
moved and V1 training runs, odd arguments, directories named as they are typed.

Every checkpoint is written by TensorFlow during the run; values are checked against
TensorFlow's own reader.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import average_checkpoints as ac  # noqa: E402
from cli_helpers import assert_cli_error, in_process, user_env  # noqa: E402

import tfckpt  # noqa: E402

STEPS = 3


def _saver_run(directory, version) -> list[str]:
    """A TF1 Saver saving after each of STEPS steps (absolute paths in its state file)."""
    v1 = tf.compat.v1
    prefixes = []
    directory.mkdir()
    with tf.Graph().as_default():
        v = v1.get_variable("v", initializer=np.arange(6, dtype=np.float32) / 3)
        emb = v1.get_variable(
            "emb",
            [6, 2],
            initializer=v1.ones_initializer(),
            partitioner=v1.fixed_size_partitioner(2),
        )
        step = v1.train.get_or_create_global_step()
        train = tf.group(
            v.assign(v * 1.5 + 0.25), step.assign_add(1), *[p.assign(p * 3) for p in emb]
        )
        saver = v1.train.Saver(max_to_keep=STEPS, write_version=version)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for i in range(1, STEPS + 1):
                sess.run(train)
                prefixes.append(saver.save(sess, str(directory / "model.ckpt"), global_step=i))
    return prefixes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A V2 and a V1 Saver run of the same steps, and the V2 run's values."""
    root = tmp_path_factory.mktemp("review_runs")
    v2 = _saver_run(root / "v2", tf.compat.v1.train.SaverDef.V2)
    v1 = _saver_run(root / "v1", tf.compat.v1.train.SaverDef.V1)
    values = {p: tf.train.load_checkpoint(p).get_tensor("v") for p in v2}
    return {"root": root, "v2": v2, "v1": v1, "values": values}


def _moved(runs, tmp_path, windows: bool) -> str:
    """The V2 run copied to tmp_path, its state file naming paths that are not there."""
    d = tmp_path / "run"
    shutil.copytree(runs["root"] / "v2", d)
    state = (d / "checkpoint").read_text()
    gone = "C:\\\\Users\\\\me\\\\train" if windows else "/nonexistent/train"
    (d / "checkpoint").write_text(state.replace(str(runs["root"] / "v2"), gone))
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


@pytest.mark.parametrize(
    "rules",
    [{"^v$": None}, [("^v$", None)], "^v$=bfloat16", [("^v$", "bfloat16", "x")], ["^v$"]],
    ids=["dict-none", "pair-none", "string", "triple", "bare-regex"],
)
def test_malformed_dtype_rules_are_errors(runs, tmp_path, rules):
    """``{regex: None}`` must not mean float64 (numpy's reading of None), nor a string
    a rule per character."""
    with pytest.raises(tfckpt.CheckpointError, match="dtype rule"):
        tfckpt.convert(runs["v2"][-1], str(tmp_path / "out"), "float16", dtype_rules=rules)
    assert not os.path.exists(tmp_path / "out.index")


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


# Hostile object graphs (hand-built around the attributes of a checkpoint TensorFlow
# wrote): flat names are built only for tensors, and never without bound.


@pytest.fixture(scope="module")
def tf2_base(tmp_path_factory):
    """A TF2 checkpoint TensorFlow wrote: its tensors and its variable's attribute."""
    from tfckpt._proto.trackable_object_graph_pb2 import TrackableObjectGraph
    from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY

    d = tmp_path_factory.mktemp("tf2_base")
    prefix = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])).save(str(d / "ckpt"))
    with tfckpt.open(prefix) as ckpt:
        tensors = {k: ckpt[k] for k in ckpt.keys()}
    graph = TrackableObjectGraph.FromString(tensors[OBJECT_GRAPH_KEY].item())
    (attr,) = [a for n in graph.nodes for a in n.attributes if a.checkpoint_key.startswith("v/")]
    return {"prefix": prefix, "dir": d, "tensors": tensors, "attr": attr}


def _hostile(base, name: str, shape: str, n: int) -> str:
    """``chain``: the variable n objects deep; ``doubling``: the variable the last of n
    slot variables, each the slot of the one before, whose paths double at each."""
    from tfckpt._proto.trackable_object_graph_pb2 import TrackableObjectGraph
    from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY

    g = TrackableObjectGraph()
    for _ in range(n + 2):
        g.nodes.add()
    if shape == "chain":
        for k in range(n + 1):
            ref = g.nodes[k].children.add()
            ref.node_id, ref.local_name = k + 1, "c"
    else:
        ref = g.nodes[0].children.add()
        ref.node_id, ref.local_name = 1, "v"
        for k in range(1, n + 1):
            s = g.nodes[k].slot_variables.add()
            s.original_variable_node_id, s.slot_variable_node_id, s.slot_name = k, k + 1, "m"
    g.nodes[n + 1].attributes.add().CopyFrom(base["attr"])
    raw = np.array(g.SerializeToString(), dtype=object)
    tensors = {
        k: v for k, v in base["tensors"].items() if k.startswith("v/") or k == OBJECT_GRAPH_KEY
    }
    prefix = str(base["dir"] / name)
    tfckpt.save({**tensors, OBJECT_GRAPH_KEY: raw}, prefix, overwrite=True)
    return prefix


def test_flatten_graft_export_of_a_deep_chain_stay_small(tf2_base, tmp_path):
    import tracemalloc

    prefix = _hostile(tf2_base, "chain", "chain", 10_000)
    tracemalloc.start()
    try:
        tfckpt.flatten(prefix, str(tmp_path / "flat"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # the 10 000 paths above it would be 100 MB
    with tfckpt.open(str(tmp_path / "flat")) as ckpt:
        (name,) = ckpt.keys()
        assert name == "/".join(["c"] * 10_001)
    tfckpt.graft(prefix, [str(tmp_path / "flat")], str(tmp_path / "back"))
    with tfckpt.open(str(tmp_path / "back")) as ckpt:
        assert ckpt["v/.ATTRIBUTES/VARIABLE_VALUE"].tolist() == [1.0, 2.0]
    safetensors = pytest.importorskip("safetensors.numpy")
    tracemalloc.start()
    try:
        tfckpt.export(prefix, str(tmp_path / "model.safetensors"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    (name,) = safetensors.load_file(str(tmp_path / "model.safetensors"))
    assert name == "/".join(["c"] * 10_001)


def test_flatten_graft_export_of_doubling_slot_paths_are_errors(tf2_base, tmp_path):
    prefix = _hostile(tf2_base, "doubling", "doubling", 60)
    assert_cli_error(in_process("flatten", prefix, tmp_path / "flat"), prefix, "too long")
    assert_cli_error(
        in_process("graft", prefix, tf2_base["prefix"], "-o", tmp_path / "g", "--allow-missing"),
        prefix,
        "too long",
    )
    assert_cli_error(in_process("export", prefix, tmp_path / "m.safetensors"), prefix, "too long")
    assert os.listdir(tmp_path) == []


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


@pytest.fixture(scope="module")
def v1_sharded(tmp_path_factory):
    """A TF1 Saver(V1, sharded=True) over two CPU devices: its state file names each
    save by the pattern of its files (model.ckpt-3-?????-of-00002)."""
    v1 = tf.compat.v1
    d = tmp_path_factory.mktemp("v1_sharded")
    saved = []
    with tf.Graph().as_default():
        with tf.device("/cpu:0"):
            a = v1.get_variable("a", initializer=np.arange(3, dtype=np.float32))
        with tf.device("/cpu:1"):
            b = v1.get_variable("b", initializer=np.ones(2, np.float32))
        train = tf.group(a.assign(a * 2 + 1), b.assign(b * 3))
        saver = v1.train.Saver(write_version=v1.train.SaverDef.V1, sharded=True, max_to_keep=3)
        config = v1.ConfigProto(device_count={"CPU": 2})
        with v1.Session(config=config) as sess:
            sess.run(v1.global_variables_initializer())
            for i in range(1, 4):
                sess.run(train)
                saved.append(saver.save(sess, str(d / "model.ckpt"), global_step=i))
    assert saved[-1].endswith("model.ckpt-3-?????-of-00002")
    return str(d), saved


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


# Killed (SIGKILL) as it commits: at the rename of its temporary index into place.
KILLED_AT_COMMIT = """
import os, signal, sys
def kill_at_index(fn):
    def call(src, dst, *a, **k):
        if ".tfckpt-tmp-" in os.fspath(src) and os.fspath(src).endswith(".index"):
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(src, dst, *a, **k)
    return call
os.link, os.replace, os.rename = map(kill_at_index, (os.link, os.replace, os.rename))
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_run_killed_at_its_commit_leaves_nothing_a_reader_takes(runs, tmp_path):
    from tfckpt.io.temporaries import TMP_MARK

    out = tmp_path / "out"
    argv = ["convert", runs["v2"][-1], str(out / "model"), "--dtype", "float16"]
    proc = subprocess.run([sys.executable, "-c", KILLED_AT_COMMIT, *argv], env=user_env())
    assert proc.returncode == -9
    left = [f for f in os.listdir(out) if TMP_MARK in f and f.endswith(".index")]
    assert left, os.listdir(out)
    with pytest.raises(tfckpt.CheckpointNotFoundError):
        tfckpt.open(str(out))
    assert tfckpt.list_checkpoints(str(out))["checkpoints"] == []
    rc, _, err = in_process("dump", out / "model")
    assert rc == 2 and TMP_MARK not in err, err
    # Beside a checkpoint, that checkpoint is the directory's only one.
    for f in os.listdir(os.path.dirname(runs["v2"][-1])):
        if f.startswith("model.ckpt-3.") and not f.endswith(".meta"):
            shutil.copy(os.path.join(os.path.dirname(runs["v2"][-1]), f), out / f)
    with tfckpt.open(str(out)) as ckpt:
        assert ckpt.prefix == str(out / "model.ckpt-3")
    rows = tfckpt.list_checkpoints(str(out))["checkpoints"]
    assert [r["name"] for r in rows] == ["model.ckpt-3"]


def test_latest_checkpoint_of_v1_runs_is_tensorflows(runs, v1_sharded):
    """A V1 save has no .index: its file, or the pattern of its shards, is the latest."""
    for directory in (os.path.dirname(runs["v1"][0]), v1_sharded[0]):
        want = tf.train.latest_checkpoint(directory)
        assert want is not None
        assert tfckpt.latest_checkpoint(directory) == want
