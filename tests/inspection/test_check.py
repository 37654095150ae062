"""``tfckpt check CKPT --against TARGET`` predicts a real restore: for each pair of a
table of matching and mismatching checkpoints and targets, TensorFlow restores and the
check's exit status must say what happened (0 it succeeded, 1 it failed).

Targets: TF1 graphs (``.meta``: a ``Saver.restore``, V2 with resource variables and V1
with reference variables), a TF1 SavedModel (its MetaGraph's Saver), TF2 checkpoints
standing for the program that wrote them (``Checkpoint.read`` then ``assert_consumed``,
``assert_existing_objects_matched`` or ``expect_partial``), a TF2 SavedModel (restored
into what ``tf.saved_model.load`` gives). The checkpoints: TensorFlow's own, and copies
with a tensor missing, one more, another shape or dtype, partitioned otherwise.
"""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import graph_files as gf  # noqa: E402
from cli_helpers import assert_cli_error, in_process  # noqa: E402

import tfckpt  # noqa: E402
import tfckpt.tf  # noqa: E402
from tfckpt.errors import CheckpointError  # noqa: E402

# --- TF1: checkpoints against a graph's Saver ---------------------------------------------

# The partitions TensorFlow's fixed_size_partitioner gives the graph's variables, spelled
# as its Saver spells them: every extent with its length.
EMB_PARTS = [((0, 4), (0, 4)), ((4, 3), (0, 4)), ((7, 3), (0, 4))]
HALF_PARTS = [((0, 3), (0, 2)), ((3, 3), (0, 2))]


def _write(prefix, values: dict, parts: dict) -> str:
    """``values`` as a checkpoint; a name in ``parts`` stored as those slices only."""
    with tfckpt.BundleWriter(prefix) as w:
        for name, value in values.items():
            if name not in parts:
                w.add(name, value)
                continue
            for extents in parts[name]:
                index = tuple(slice(s, None if n is None else s + n) for s, n in extents)
                w.add_slice(name, value.shape, extents, value[index])
    return prefix


def _variants(base: dict) -> dict[str, tuple[dict, dict]]:
    """Name → (values, partitions) of each checkpoint of the table."""
    parts = {"emb": EMB_PARTS, "half": HALF_PARTS}
    f32 = np.float32

    def but(**changes):
        values = {**base, **{k: v for k, v in changes.items() if v is not None}}
        for k, v in changes.items():
            if v is None:
                del values[k]
        return values

    return {
        "extra tensor": (but(other=np.ones(2, f32)), parts),
        "missing step": (but(step=None), parts),
        "w of another shape": (but(**{"dense/w": np.ones((5, 3), f32)}), parts),
        "w in float16": (but(**{"dense/w": base["dense/w"].astype(np.float16)}), parts),
        "step in int32": (but(step=np.int32(3)), parts),
        "emb stored whole": (base, {"half": HALF_PARTS}),
        "emb whole of another shape": (
            but(emb=np.ones((12, 4), f32)),
            {"half": HALF_PARTS},
        ),
        "emb in two other slices": (
            base,
            {"emb": [((0, 5), (0, 4)), ((5, 5), (0, 4))], "half": HALF_PARTS},
        ),
        "emb only partly stored": (base, {"emb": [((0, 5), (0, 4))], "half": HALF_PARTS}),
        "half stored whole": (base, {"emb": EMB_PARTS}),
        "half in other slices": (
            base,
            {"emb": EMB_PARTS, "half": [((0, 2), (0, 2)), ((2, 4), (0, 2))]},
        ),
        # The same parts, a whole axis spelled "-": TensorFlow copies float16 only
        # between slices spelled alike.
        "half with whole-axis extents": (
            base,
            {"emb": EMB_PARTS, "half": [((0, 3), (0, None)), ((3, 3), (0, None))]},
        ),
    }


GRAPHS = {
    "resource-V2": {"resource": True, "version": "V2"},
    "reference-V1": {"resource": False, "version": "V1"},
}


@pytest.fixture(scope="module")
def tf1_table(tmp_path_factory):
    """Each (graph, checkpoint) pair with what TensorFlow's Saver.restore made of it."""
    root = tmp_path_factory.mktemp("tf1_table")
    rows = []
    for gname, kw in GRAPHS.items():
        files = gf.tf1_graph(root / gname, **kw)
        with tfckpt.open(files["prefix"]) as c:  # TensorFlow cannot read `half` whole
            base = {k: c[k].copy() for k in c.keys()}
        checkpoints = {"as saved": files["prefix"]}
        for vname, (values, parts) in _variants(base).items():
            checkpoints[vname] = _write(str(root / gname / vname.replace(" ", "_")), values, parts)
        # The same graph without its saver_def: restored by the Saver import_meta_graph
        # builds then.
        stripped = gf.strip_saver(files["meta"], str(root / f"{gname}-no-saver-def.meta"))
        for vname, prefix in checkpoints.items():
            for label, meta in ((gname, files["meta"]), (f"{gname} no saver_def", stripped)):
                ok, message = gf.saver_restore(meta, prefix)
                rows.append((label, vname, meta, prefix, ok, message))
    saved = gf.tf1_saved_model(root / "saved_model")
    for gname, vname, _, prefix, _, _ in list(rows):
        if gname == "resource-V2" and vname in ("as saved", "missing step", "w in float16"):
            ok, message = gf.saved_model_restore(saved, prefix)
            rows.append(("tf1-saved-model", vname, saved, prefix, ok, message))
    return rows


def _check(*args) -> tuple[int, dict]:
    rc, out, err = in_process("check", *args, "--json")
    assert rc in (0, 1) and not err, (rc, err)
    data = json.loads(out)
    assert data["ok"] is (rc == 0)
    return rc, data


def test_check_predicts_every_saver_restore(tf1_table):
    wrong = []
    for gname, vname, target, prefix, ok, message in tf1_table:
        rc, data = _check(prefix, "--against", target)
        if (rc == 0) != ok:
            wrong.append((gname, vname, ok, message, data["findings"]))
    assert not wrong, wrong
    outcomes = {(g, v): ok for g, v, *_, ok, _ in tf1_table}
    # The table holds both outcomes of what differs between the kinds of variable.
    assert outcomes["resource-V2", "w of another shape"] is True
    assert outcomes["reference-V1", "w of another shape"] is False
    assert outcomes["resource-V2", "emb in two other slices"] is True
    assert outcomes["resource-V2", "half stored whole"] is False
    for g in GRAPHS:  # the default Saver restores as the graph's own did
        assert {v: ok for (h, v), ok in outcomes.items() if h == g} == {
            v: ok for (h, v), ok in outcomes.items() if h == f"{g} no saver_def"
        }
    assert sum(ok for *_, ok, _ in tf1_table) < len(tf1_table) - 8


def _findings(data: dict, fails: bool = True) -> list[tuple[str, str]]:
    return [(f["kind"], f["tensor"]) for f in data["findings"] if f["fails"] is fails]


def test_the_report_names_what_fails(tf1_table):
    pairs = {(g, v): (target, prefix) for g, v, target, prefix, *_ in tf1_table}
    meta, _ = pairs["resource-V2", "as saved"]
    expected = {
        "missing step": [("missing", "step")],
        "w in float16": [("dtype", "dense/w")],
        "step in int32": [("dtype", "step")],
        "emb whole of another shape": [("shape", "emb")] * 3,
        "emb only partly stored": [("slices", "emb")] * 2,
        "half stored whole": [("slices", "half")] * 2,
        "half in other slices": [("slices", "half")] * 2,
        "half with whole-axis extents": [("slices", "half")] * 2,
    }
    for vname, want in expected.items():
        _, data = _check(pairs["resource-V2", vname][1], "--against", meta)
        assert _findings(data) == want, (vname, data["findings"])
    _, data = _check(pairs["resource-V2", "extra tensor"][1], "--against", meta)
    assert _findings(data, fails=False) == [("unused", "other")]
    _, data = _check(pairs["resource-V2", "w of another shape"][1], "--against", meta)
    assert _findings(data, fails=False) == [("shape", "dense/w")]
    rc, out, err = in_process(
        "check",
        pairs["reference-V1", "w of another shape"][1],
        "--against",
        pairs["reference-V1", "as saved"][0],
    )
    assert rc == 1 and "SHAPE" in out and "[5, 3] in the checkpoint, [4, 3]" in out, out


def test_a_castable_dtype_is_fixed_by_the_convert_the_report_gives(tf1_table, tmp_path):
    pairs = {(g, v): (target, prefix) for g, v, target, prefix, *_ in tf1_table}
    meta, prefix = pairs["resource-V2", "w in float16"]
    rc, data = _check(prefix, "--against", meta)
    assert rc == 1 and data["findings"][0]["castable"] is True
    # Restored by tfckpt, which casts, it would succeed.
    assert _check(prefix, "--against", meta, "--cast")[0] == 0
    command = shlex.split(data["cast_command"])
    assert command[:3] == ["tfckpt", "convert", prefix] and command[3] == "OUT"
    out = str(tmp_path / "fixed")
    rc, _, err = in_process(*command[1:3], out, *command[4:])
    assert rc == 0, err
    assert _check(out, "--against", meta)[0] == 0
    assert gf.saver_restore(meta, out) == (True, "")


def _edited(meta: str, out, edit) -> str:
    from tensorflow.core.protobuf import meta_graph_pb2

    proto = meta_graph_pb2.MetaGraphDef.FromString(open(meta, "rb").read())
    edit(proto)
    out.write_bytes(proto.SerializeToString())
    return str(out)


def _saveable(value, kind: str = "node_list"):
    return lambda p: getattr(p.collection_def["saveable_objects"], kind).value.append(value)


def _variables_twice(index: int):
    def edit(p):
        values = p.collection_def["variables"].bytes_list.value
        values.append(values[index])

    return edit


# Collections of a graph without a saver_def edited as TensorFlow's export could leave
# them, each judged by import_meta_graph's default Saver.
SAVERLESS_EDITS = {
    "as exported": lambda p: None,
    "saveable_objects of no kind": lambda p: p.collection_def["saveable_objects"],
    "saveable_objects lists a resource variable's read": _saveable("local/Read/ReadVariableOp:0"),
    "saveable_objects lists a reference variable's read": _saveable("local/read:0"),
    "saveable_objects lists a local variable's tensor": _saveable("local:0"),
    "saveable_objects lists a global variable again": _saveable("w:0"),
    "saveable_objects lists an operation": _saveable("w"),
    "saveable_objects lists a tensor not in the graph": _saveable("nothing:0"),
    "saveable_objects lists a number": _saveable(3, "int64_list"),
    "saveable_objects lists bytes": _saveable(b"w", "bytes_list"),
    "a variable listed twice": _variables_twice(0),
    "a partition listed twice": _variables_twice(-1),
    "no variables collection": lambda p: p.collection_def.pop("variables"),
}


@pytest.mark.parametrize("resource", [True, False], ids=["resource", "reference"])
def test_without_a_saver_def_check_follows_import_meta_graph(tmp_path, resource):
    """A graph without a saver_def, its collections edited: check succeeds exactly where
    import_meta_graph builds a Saver and it restores the checkpoint; else one error line."""
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        w = v1.get_variable("w", [2, 3], use_resource=resource)
        local = v1.get_variable(
            "local", [2], collections=[v1.GraphKeys.LOCAL_VARIABLES], use_resource=resource
        )
        emb = v1.get_variable(
            "emb", [4, 2], partitioner=v1.fixed_size_partitioner(2), use_resource=resource
        )
        meta = str(tmp_path / "graph.meta")
        v1.train.export_meta_graph(meta)
        with v1.Session() as sess:
            sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            saver = v1.train.Saver(var_list=[w, local, *emb])
            prefix = saver.save(sess, str(tmp_path / "model.ckpt"))
    outcomes = {}
    for what, edit in SAVERLESS_EDITS.items():
        edited = _edited(meta, tmp_path / f"{what.replace(' ', '_')}.meta", edit)
        ok, message = gf.saver_restore(edited, prefix)
        outcomes[what] = ok
        result = in_process("check", prefix, "--against", edited, "--json")
        if ok:
            assert result[0] == 0 and not result[2], (what, result)
        else:
            assert_cli_error(result, edited, "no saver_def")
    # The table holds both outcomes.
    assert outcomes["as exported"] and not outcomes["a variable listed twice"]
    assert outcomes["saveable_objects lists a local variable's tensor"] is not resource
    assert outcomes["saveable_objects lists a resource variable's read"] is resource


def test_errors_are_one_line(tf1_table, tmp_path):
    meta = tf1_table[0][2]
    assert_cli_error(in_process("check", tmp_path / "none", "--against", meta), "none")
    assert_cli_error(in_process("check", tf1_table[0][3], "--against", tmp_path), "not a target")


# --- TF2: checkpoints against the objects of a template ------------------------------------


def _module(kind: str = "same") -> tf.train.Checkpoint:
    m = tf.Module()
    m.dense = tf.Module()
    m.dense.kernel = tf.Variable(np.zeros((4, 3), np.float32))
    m.dense.bias = tf.Variable(np.zeros(3, np.float32))
    m.step = tf.Variable(np.int64(0))
    if kind == "extra":
        m.dense.more = tf.Variable(np.zeros(2, np.float32))
    elif kind == "missing":
        del m.dense.bias
    elif kind == "shape":
        m.dense.kernel = tf.Variable(np.zeros((5, 3), np.float32))
    elif kind == "dtype":
        m.dense.kernel = tf.Variable(np.zeros((4, 3), np.float16))
    elif kind == "int":
        m.step = tf.Variable(np.int32(0))
    return tf.train.Checkpoint(model=m)


KINDS = ("same", "extra", "missing", "shape", "dtype", "int")
MODES = {"consumed": ["--assert-consumed"], "existing": [], "partial": ["--allow-missing"]}


def _tf2_read(prefix: str, mode: str) -> tuple[bool, str]:
    live = _module()
    try:
        status = live.read(prefix)
        if mode == "consumed":
            status.assert_consumed()
        elif mode == "existing":
            status.assert_existing_objects_matched()
        else:
            status.expect_partial()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        return False, str(e).split("\n")[0]
    return True, ""


@pytest.fixture(scope="module")
def tf2_table(tmp_path_factory):
    root = tmp_path_factory.mktemp("tf2_table")
    template = _module().write(str(root / "template" / "ckpt"))
    rows = []
    for kind in KINDS:
        prefix = _module(kind).write(str(root / kind / "ckpt"))
        for mode in MODES:
            rows.append((kind, mode, template, prefix, *_tf2_read(prefix, mode)))
    return rows


def test_check_predicts_every_checkpoint_read(tf2_table):
    wrong = []
    for kind, mode, template, prefix, ok, message in tf2_table:
        rc, data = _check(prefix, "--against", template, *MODES[mode])
        if (rc == 0) != ok:
            wrong.append((kind, mode, ok, message, data["findings"]))
    assert not wrong, wrong
    outcomes = {(k, m): ok for k, m, *_, ok, _ in tf2_table}
    assert outcomes["extra", "consumed"] is False and outcomes["extra", "existing"] is True
    assert outcomes["missing", "existing"] is False and outcomes["missing", "partial"] is True
    assert outcomes["shape", "partial"] is False


def test_template_matching_follows_objects_not_keys(tf2_table, tmp_path):
    """A checkpoint whose keys were renamed (its object graph re-keyed) still matches."""
    template, prefix = tf2_table[0][2], tf2_table[0][3]
    renamed = str(tmp_path / "renamed")
    tfckpt.rename(prefix, renamed, {"model/dense/": "model/dense/x_"})
    with tfckpt.open(renamed) as c:
        assert "model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE" not in c
    assert _check(renamed, "--against", template, "--assert-consumed")[0] == 0
    assert _tf2_read(renamed, "consumed") == (True, "")


@pytest.fixture(scope="module")
def tf2_saved_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("tf2_saved_model")
    module = _module().model
    tf.saved_model.save(module, str(root / "saved"))
    rows = []
    for kind in ("same", "shape", "missing"):
        prefix = tf.train.Checkpoint(_module(kind).model).write(str(root / kind / "ckpt"))
        loaded = tf.saved_model.load(str(root / "saved"))
        try:
            tf.train.Checkpoint(loaded).read(prefix).assert_existing_objects_matched()
            outcome = (True, "")
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            outcome = (False, str(e).split("\n")[0])
        rows.append((kind, str(root / "saved"), prefix, *outcome))
    return rows


def test_check_against_a_tf2_saved_model(tf2_saved_model):
    for kind, saved, prefix, ok, message in tf2_saved_model:
        rc, data = _check(prefix, "--against", saved)
        assert (rc == 0) == ok, (kind, ok, message, data["findings"])
        assert "TF2 SavedModel" in data["target"]
    assert [ok for *_, ok, _ in tf2_saved_model] == [True, False, False]


# --- from Python: live TensorFlow variables --------------------------------------------------


def test_tf_variables_checked_and_restore_lists_every_problem(tmp_path):
    prefix = tfckpt.save(
        {"a": np.ones((2, 3), np.float32), "b": np.ones(4, np.float32), "c": np.int64(2)},
        str(tmp_path / "ckpt"),
    )
    a = tf.Variable(np.zeros((3, 2), np.float32), name="a")  # another shape
    b = tf.Variable(np.zeros(4, np.float16), name="b")  # castable
    d = tf.Variable(np.zeros(1, np.float32), name="d")  # missing
    theirs = tfckpt.tf.check([a, b, d], prefix, restorer="tensorflow")
    assert sorted(_findings(theirs.to_dict())) == [
        ("dtype", "b"),
        ("missing", None),
        ("shape", "a"),
    ]
    ours = tfckpt.tf.check([a, b, d], prefix)
    assert sorted(_findings(ours.to_dict())) == [("missing", None), ("shape", "a")]
    assert _findings(ours.to_dict(), fails=False) == [("dtype", "b"), ("unused", "c")]
    # TensorFlow's Saver fails on the first problem; tfckpt.restore names them all, first.
    with pytest.raises((ValueError, tf.errors.OpError)):
        tf.compat.v1.train.Saver([a, b, d]).restore(None, prefix)
    with pytest.raises(CheckpointError) as e:
        tfckpt.restore([a, b, d], prefix)
    message = str(e.value)
    assert "no value for 1 variable(s): d:0" in message and "[2, 3] in the checkpoint" in message
    assert not a.numpy().any() and not b.numpy().any()
    report = tfckpt.restore([b], prefix)
    assert b.numpy().tolist() == [1, 1, 1, 1] and report.unused == ["a", "c"]


# --- from Python: a Keras 3 model, on JAX, without TensorFlow ---------------------------------

_KERAS = r"""
import json, sys
import numpy as np
import keras, tfckpt, tfckpt.keras
model = keras.Sequential(
    [keras.Input((3,)), keras.layers.Dense(4, name="d1"), keras.layers.Dense(2, name="out")],
    name="seq",
)
paths = [w.path for w in model.weights]
prefix = tfckpt.save(
    {
        paths[0]: np.ones((3, 5), np.float32),  # another shape
        paths[1]: np.ones(4, np.float64),  # castable
        paths[2]: np.ones((4, 2), np.int64),  # no cast reaches float32
        "extra": np.ones(1, np.float32),
    },
    sys.argv[1],
)
result = tfckpt.keras.check(model, prefix)
try:
    tfckpt.keras.load_weights(model, prefix)
    error = None
except tfckpt.errors.KerasWeightsError as e:
    error = str(e)
print(json.dumps({
    "paths": paths,
    "check": result.to_dict(),
    "error": error,
    "tensorflow": sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow"),
}))
"""


@pytest.mark.jax
def test_keras_model_checked_as_load_weights_loads(tmp_path):
    import subprocess
    import sys

    from cli_helpers import user_env

    done = subprocess.run(
        [sys.executable, "-c", _KERAS, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        env=user_env(KERAS_BACKEND="jax"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout.splitlines()[-1])
    paths = data["paths"]
    failing = [(f["kind"], f["variable"]) for f in data["check"]["findings"] if f["fails"]]
    assert sorted(failing) == sorted(
        [("shape", paths[0]), ("dtype", paths[2]), ("missing", paths[3])]
    )
    info = [(f["kind"], f["tensor"]) for f in data["check"]["findings"] if not f["fails"]]
    assert info == [("dtype", paths[1]), ("unused", "extra")]
    # load_weights names all three at once, and assigns nothing.
    error = data["error"]
    assert f"no tensor for {paths[3]}" in error and "has shape [3, 5], the variable [3, 4]" in error
    assert f"cannot restore int64 into float32 variable {paths[2]!r}" in error
    assert data["tensorflow"] == []


def test_a_tf1_checkpoint_as_template(tf1_table):
    """A TF1 checkpoint stands for a Saver of its variables: its names, dtypes, shapes and
    partitions."""
    pairs = {(g, v): prefix for g, v, _, prefix, *_ in tf1_table}
    template = pairs["resource-V2", "as saved"]
    assert _check(template, "--against", template)[0] == 0
    _, data = _check(pairs["resource-V2", "w in float16"], "--against", template)
    assert _findings(data) == [("dtype", "dense/w")]
    _, data = _check(pairs["resource-V2", "half with whole-axis extents"], "--against", template)
    assert _findings(data) == [("slices", "half")] * 2
    assert "TF1 names" in data["target"]
