"""The TensorFlow bridge against real TensorFlow.

- ``tfckpt.restore``: TF1 graphs (plain, resource, ref and partitioned variables) and TF2
  objects (Keras 3 models, ``tf.Module``) restored with casting where TensorFlow's own
  restore refuses the dtype; ``assignment_map``; errors that leave every variable untouched.
- The ``tf`` cast backend (``tf.cast``) against the numpy backend, bit for bit, over NaN
  payloads, infinities, -0.0, subnormals, extremes, overflow and rounding ties.
- ``tfckpt.verify_with_tf`` on converted checkpoints, and TensorFlow staying unimported on
  the numpy paths.

Every comparison is bit-exact (``.tobytes()``).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import cli_helpers as ch  # noqa: E402
import tf_checkpoints as tfc  # noqa: E402  (conftest put tests/ on sys.path)
import transform_helpers as th  # noqa: E402

import tfckpt  # noqa: E402
import tfckpt.tf as tfbridge  # noqa: E402
from tfckpt import CheckpointError  # noqa: E402

v1 = tf.compat.v1
OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
NP = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}
F32_TINY = 2.0**-126


# ---------------------------------------------------------------- helpers


def assert_bits(got, want: np.ndarray, what: str = "") -> None:
    """``got`` has ``want``'s dtype, shape and bytes."""
    got = np.asarray(got)
    why = tfc.mismatch(got, np.asarray(want), np.asarray(want).dtype)
    assert why is None, f"{what}: {why}"


def cast_np(value: np.ndarray, dtype: str) -> np.ndarray:
    """What a restore into a ``dtype`` variable must hold: numpy's rounding (= tf.cast for
    these finite/inf/canonical-NaN values), e.g. ``np.float16(original)``."""
    return np.asarray(value).astype(NP[dtype])


def sliced_init(full: np.ndarray):
    """An initializer giving each partition of a partitioned variable its slice of ``full``."""

    def init(shape, dtype=None, partition_info=None):
        if partition_info is None:
            return tf.constant(full, dtype=dtype)
        index = tuple(slice(o, o + n) for o, n in zip(partition_info.var_offset, shape))
        return tf.constant(full[index], dtype=dtype)

    return init


def tf1_var(name, value=None, *, dtype=None, shape=None, parts=None, axis=0, resource=True):
    """``get_variable`` holding ``value`` (or zeros of ``shape``), optionally partitioned."""
    dtype = tf.as_dtype(dtype if dtype is not None else value.dtype)
    shape = list(value.shape if value is not None else shape)
    init = sliced_init(value) if value is not None else v1.zeros_initializer()
    kw = {"partitioner": v1.fixed_size_partitioner(parts, axis=axis)} if parts else {}
    return v1.get_variable(
        name, shape=shape, dtype=dtype, initializer=init, use_resource=resource, **kw
    )


def is_partitioned(var) -> bool:
    return type(var).__name__ == "PartitionedVariable"


def run_values(sess, variables: dict) -> dict[str, np.ndarray]:
    return {
        k: np.asarray(v)
        for k, v in sess.run(
            {k: (v.as_tensor() if is_partitioned(v) else v) for k, v in variables.items()}
        ).items()
    }


def tf1_save(prefix, build) -> dict[str, np.ndarray]:
    """Save the variables ``build()`` makes with a plain ``Saver``; returns their values."""
    with tf.Graph().as_default():
        variables = build()
        saver = v1.train.Saver()
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            values = run_values(sess, variables)
            assert saver.save(sess, str(prefix), write_meta_graph=False) == str(prefix)
    return values


@contextlib.contextmanager
def tf1_session(build):
    """A fresh graph with ``build()``'s variables, initialised, and a session on it."""
    with tf.Graph().as_default() as graph:
        variables = build()
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            yield sess, variables


def names_of(report) -> list[tuple[str, str, str, str]]:
    return sorted((r.checkpoint_name, r.variable, r.dtype, r.new_dtype) for r in report.restored)


def ckpt_keys(path) -> list[str]:
    with tfckpt.open(path) as c:
        return [k for k in c.keys() if k != OBJECT_GRAPH]


# ---------------------------------------------------------------- 1. TF1 graph mode


TF1_EDGES = np.array(
    [
        np.nan,
        -np.nan,
        np.inf,
        -np.inf,
        -0.0,
        0.0,
        65504.0,
        -65504.0,
        65519.0,
        2.0**-24,
        2.0**-25,
        3 * 2.0**-25,
        1e-9,
        1 + 2.0**-11,
        1 + 3 * 2.0**-11,
        2049.0,
        1e-45,
    ],
    dtype=np.float32,
)


@pytest.fixture(scope="module")
def tf1_float32(tmp_path_factory):
    """A float32 TF1 Saver checkpoint: plain, partitioned (3 parts) and int64 (ref) variables."""
    rng = np.random.default_rng(101)
    kernel = (rng.standard_normal((6, 5)) * 4).astype(np.float32)
    kernel.reshape(-1)[: TF1_EDGES.size] = TF1_EDGES
    bias = rng.standard_normal(5).astype(np.float32)
    table = rng.standard_normal((10, 4)).astype(np.float32)
    prefix = tmp_path_factory.mktemp("tf1_float32") / "model.ckpt"

    def build():
        return {
            "enc/kernel": tf1_var("enc/kernel", kernel),
            "enc/bias": tf1_var("enc/bias", bias),
            "emb/table": tf1_var("emb/table", table, parts=3),
            "global_step": tf1_var("global_step", np.array(1234, np.int64), resource=False),
        }

    values = tf1_save(prefix, build)
    assert_bits(values["enc/kernel"], kernel, "saved kernel")
    assert_bits(values["emb/table"], table, "saved table")
    return str(prefix), values


def build_tf1_float16(dtype="float16", table_parts=3):
    return {
        "enc/kernel": tf1_var("enc/kernel", dtype=dtype, shape=(6, 5)),
        "enc/bias": tf1_var("enc/bias", dtype=dtype, shape=(5,)),
        "emb/table": tf1_var("emb/table", dtype=dtype, shape=(10, 4), parts=table_parts),
        # A resource variable: ref variables hit a bug (test_tf1_ref_variables).
        "global_step": tf1_var("global_step", dtype=tf.int64, shape=()),
    }


@pytest.mark.parametrize("form", ["list", "global_variables", "dict"])
def test_tf1_float32_checkpoint_into_float16_graph(tf1_float32, form):
    prefix, original = tf1_float32
    with tf1_session(build_tf1_float16) as (sess, variables):
        assert is_partitioned(variables["emb/table"])
        # TensorFlow's own Saver refuses the dtype change.
        saver = v1.train.Saver()
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match="expected dtype half does not equal original dtype float",
        ):
            saver.restore(sess, prefix)
        before = run_values(sess, variables)
        assert all(not v.any() for v in before.values())

        if form == "list":
            target = list(variables.values())
        elif form == "global_variables":
            target = v1.global_variables()  # the partitions one by one
            assert len(target) == 6
        else:
            # {checkpoint name: variable}; the partitions share one name, so they follow in a list.
            target = {
                "enc/kernel": variables["enc/kernel"],
                "enc/bias": variables["enc/bias"],
                "global_step": variables["global_step"],
            }
        report = tfckpt.restore(target, prefix, session=sess)
        if form == "dict":
            tfckpt.restore(list(variables["emb/table"]), prefix, session=sess)
        after = run_values(sess, variables)

    for name in ["enc/kernel", "enc/bias", "emb/table"]:
        assert after[name].dtype == np.float16
        assert_bits(after[name], cast_np(original[name], "float16"), name)
        # ... which is also exactly what tf.cast gives.
        assert_bits(after[name], tf.cast(original[name], tf.float16).numpy(), name + " vs tf.cast")
    assert_bits(after["global_step"], np.array(1234, np.int64), "global_step")
    k = after["enc/kernel"].reshape(-1)
    assert k[6] == 65504 and k[8] == 65504 and k[10] == 0 and k[11] == 2.0**-23
    assert k[13] == 1.0 and k[14] == 1 + 2.0**-9 and k[15] == 2048

    expected = [
        ("enc/bias", "enc/bias:0", "float32", "float16"),
        ("enc/kernel", "enc/kernel:0", "float32", "float16"),
        ("global_step", "global_step:0", "int64", "int64"),
    ]
    if form != "dict":
        expected += [("emb/table", f"emb/table/part_{i}:0", "float32", "float16") for i in range(3)]
    assert names_of(report) == sorted(expected)
    assert [r.cast for r in report.restored if r.checkpoint_name == "global_step"] == [False]
    assert all(r.cast for r in report.restored if r.checkpoint_name != "global_step")
    assert report.missing == []
    assert report.unused == ([] if form != "dict" else ["emb/table"])


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_tf1_ref_variables(tf1_float32, dtype):
    """Classic TF1 ref variables, same dtype (int64 step) and cast (float32 -> float16)."""
    prefix, original = tf1_float32

    def build():
        return {
            "enc/kernel": tf1_var("enc/kernel", dtype=dtype, shape=(6, 5), resource=False),
            "global_step": tf1_var("global_step", dtype=tf.int64, shape=(), resource=False),
        }

    with tf1_session(build) as (sess, variables):
        assert type(variables["global_step"]).__name__ == "RefVariable"
        report = tfckpt.restore(list(variables.values()), prefix, session=sess)
        after = run_values(sess, variables)
    assert_bits(after["enc/kernel"], cast_np(original["enc/kernel"], dtype), "enc/kernel")
    assert_bits(after["global_step"], np.array(1234, np.int64), "global_step")
    assert names_of(report) == [
        ("enc/kernel", "enc/kernel:0", "float32", dtype),
        ("global_step", "global_step:0", "int64", "int64"),
    ]


def test_tf1_dict_with_partitioned_variable(tf1_float32):
    prefix, original = tf1_float32
    with tf1_session(build_tf1_float16) as (sess, variables):
        report = tfckpt.restore(
            {"emb/table": variables["emb/table"], "enc/bias": variables["enc/bias"]},
            prefix,
            session=sess,
        )
        after = run_values(sess, variables)
    assert ("emb/table", "float32", "float16") in [
        (r.checkpoint_name, r.dtype, r.new_dtype) for r in report.restored
    ]
    assert_bits(after["enc/bias"], cast_np(original["enc/bias"], "float16"), "enc/bias")
    assert_bits(after["emb/table"], cast_np(original["emb/table"], "float16"), "emb/table")


@pytest.fixture(scope="module")
def tf1_partitioned32(tmp_path_factory):
    """Partitioned three ways and plain, float32, for restoring into other partitionings."""
    rng = np.random.default_rng(102)
    emb = rng.standard_normal((10, 4)).astype(np.float32)
    vec = rng.standard_normal(12).astype(np.float32)
    wide = rng.standard_normal((5, 7)).astype(np.float32)
    prefix = tmp_path_factory.mktemp("tf1_partitioned32") / "parts.ckpt"
    values = tf1_save(
        prefix,
        lambda: {
            "emb": tf1_var("emb", emb, parts=3),  # 4 + 3 + 3 rows
            "vec": tf1_var("vec", vec),  # whole
            "wide": tf1_var("wide", wide, parts=2, axis=1),
        },
    )
    return str(prefix), values


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_tf1_repartitioned_restore_matches_tf_saver(tf1_partitioned32, dtype):
    """Other partitionings than the checkpoint's: TF's Saver (float32) is the reference."""
    prefix, original = tf1_partitioned32

    def build():
        return {
            "emb": tf1_var("emb", dtype=dtype, shape=(10, 4), parts=2),
            "vec": tf1_var("vec", dtype=dtype, shape=(12,), parts=3),
            "wide": tf1_var("wide", dtype=dtype, shape=(5, 7)),
        }

    with tf1_session(build) as (sess, variables):
        report = tfckpt.restore(list(variables.values()), prefix, session=sess)
        ours = run_values(sess, variables)
    if dtype == "float32":
        with tf1_session(build) as (sess, variables):
            v1.train.Saver().restore(sess, prefix)
            theirs = run_values(sess, variables)
    else:
        theirs = {k: cast_np(v, dtype) for k, v in original.items()}
    for k in original:
        assert_bits(ours[k], theirs[k], k)
    assert len(report.restored) == 2 + 3 + 1
    assert report.missing == [] and report.unused == []


# ---------------------------------------------------------------- 2. TF2 objects


def keras_model(dtype: str, dense_units: int = 4):
    """The architecture of ``tf_checkpoints.make_keras_model``, with every layer in ``dtype``."""
    return keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.Conv2D(3, 3, name="conv", dtype=dtype),
            keras.layers.BatchNormalization(name="bn", dtype=dtype),
            keras.layers.Flatten(dtype=dtype),
            keras.layers.Dense(dense_units, name="dense", dtype=dtype),
        ]
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_tf2_keras_model_with_adam_into_other_dtype(tf_checkpoints, dtype):
    case = tf_checkpoints("keras_manager")  # tf.train.Checkpoint(model=m, optimizer=Adam), trained
    original = case.extra["weights"]
    if dtype != "float32":
        with pytest.raises(tf.errors.InvalidArgumentError, match="expected dtype"):
            tf.train.Checkpoint(model=keras_model(dtype)).restore(case.prefix)

    model = keras_model(dtype)
    assert [v.dtype for v in model.weights] == [dtype] * len(original)
    report = tfckpt.restore(tf.train.Checkpoint(model=model), case.path)  # a directory: its latest
    for v, w in zip(model.weights, original):
        assert_bits(v.numpy(), cast_np(w, dtype), v.path)

    assert sorted(r.variable for r in report.restored) == sorted(v.path for v in model.weights)
    assert all(r.dtype == "float32" and r.new_dtype == dtype for r in report.restored)
    assert all(r.cast == (dtype != "float32") for r in report.restored)
    assert report.missing == []
    used = {r.checkpoint_name for r in report.restored}
    keys = ckpt_keys(case.prefix)
    assert sorted(report.unused) == sorted(set(keys) - used)
    assert all(k.startswith(("optimizer/", "save_counter/")) for k in report.unused), report.unused
    adam_slots = [k for k in report.unused if k.startswith("optimizer/_variables/")]
    assert len(adam_slots) == 2 * len(model.trainable_weights)  # m and v of every weight
    assert "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE" in report.unused

    if dtype == "float32":  # no cast: the same as TensorFlow's own restore
        theirs = keras_model("float32")
        tf.train.Checkpoint(model=theirs).restore(case.prefix).expect_partial()
        for a, b in zip(model.weights, theirs.weights):
            assert_bits(a.numpy(), b.numpy(), a.path)
    else:  # the float16/bfloat16 model runs
        x = np.random.default_rng(0).random((2, 6, 6, 2)).astype(NP[dtype])
        assert model(x, training=False).shape == (2, 4)


def test_tf2_keras_model_and_adam_slots_into_float16(tf_checkpoints):
    """The optimizer restored too: its float16 slots from the float32 ones, iterations as int64."""
    case = tf_checkpoints("keras_manager")
    model = keras_model("float16")
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(model.trainable_variables)
    report = tfckpt.restore(tf.train.Checkpoint(model=model, optimizer=optimizer), case.prefix)
    assert report.missing == []
    assert report.unused == ["save_counter/.ATTRIBUTES/VARIABLE_VALUE"]
    for v, w in zip(optimizer.variables, case.extra["optimizer_variables"]):
        want = w if v.dtype in ("int64", "float32") else cast_np(w, v.dtype)
        assert_bits(v.numpy(), want, v.path)
    assert int(optimizer.iterations.numpy()) == 4  # two epochs of two batches
    for v, w in zip(model.weights, case.extra["weights"]):
        assert_bits(v.numpy(), cast_np(w, "float16"), v.path)


class Leaf(tf.Module):
    def __init__(self, dtype, rng=None):
        super().__init__()
        self.kernel = tf.Variable(values((3, 2), dtype, rng))
        self.bias = tf.Variable(values((2,), dtype, rng))


class Net(tf.Module):
    def __init__(self, dtype, rng=None, extra=False):
        super().__init__()
        self.w = tf.Variable(values((4, 3), dtype, rng))
        self.leaves = [Leaf(dtype, rng), Leaf(dtype, rng)]
        self.table = {
            "scale": tf.Variable(values((), dtype, rng)),
            "step": tf.Variable(np.int64(77 if rng is not None else 0)),
        }
        if extra:
            self.more = tf.Variable(np.ones(3, NP[dtype]))


def values(shape, dtype, rng):
    if rng is None:
        return np.zeros(shape, NP[dtype])
    return (rng.standard_normal(shape) * 3).astype(NP[dtype])


def module_variables(net: Net) -> list:
    return [
        net.w,
        net.leaves[0].kernel,
        net.leaves[0].bias,
        net.leaves[1].kernel,
        net.leaves[1].bias,
        net.table["scale"],
        net.table["step"],
    ]


@pytest.fixture(scope="module")
def module_ckpt(tmp_path_factory):
    net = Net("float32", np.random.default_rng(103))
    prefix = tf.train.Checkpoint(net=net).write(str(tmp_path_factory.mktemp("module") / "net"))
    return prefix, [v.numpy() for v in module_variables(net)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_tf2_module_into_other_dtype(module_ckpt, dtype):
    prefix, original = module_ckpt
    with pytest.raises(tf.errors.InvalidArgumentError, match="expected dtype"):
        tf.train.Checkpoint(net=Net(dtype)).restore(prefix)
    net = Net(dtype)
    report = tfckpt.restore(tf.train.Checkpoint(net=net), prefix)
    for var, want in zip(module_variables(net), original):
        expected = want if want.dtype == np.int64 else cast_np(want, dtype)
        assert_bits(var.numpy(), expected, var.name)
    assert len(report.restored) == 7
    assert sum(r.cast for r in report.restored) == 6
    assert report.missing == [] and report.unused == []


def test_tf2_saved_model_variables_into_module_root(tf_checkpoints):
    """The module itself as the root (a SavedModel's variables), strings and scalars too."""
    case = tf_checkpoints("saved_model")
    want = tfc._Module()  # the same seed: the values that were saved
    target = tfc._Module()
    for v in [target.w, target.b, target.tables["scale"]]:
        v.assign(tf.zeros_like(v))
    target.tables["names"].assign([b"", b"", b""])
    report = tfckpt.restore(target, case.path)
    for a, b in [
        (target.w, want.w),
        (target.b, want.b),
        (target.tables["scale"], want.tables["scale"]),
    ]:
        assert_bits(a.numpy(), b.numpy(), a.name)
    assert target.tables["names"].numpy().tolist() == [b"alpha", b"", b"\xff\xfe"]
    assert len(report.restored) == 4 and report.missing == []


# ---------------------------------------------------------------- 3. assignment_map, eager


@pytest.fixture(scope="module")
def ab_checkpoints(tmp_path_factory):
    rng = np.random.default_rng(104)
    d = tmp_path_factory.mktemp("ab")
    a = {
        "a1/w": rng.standard_normal((3, 4)).astype(np.float32),
        "a1/b": rng.standard_normal(4).astype(np.float32),
        "a2/w": rng.standard_normal(2).astype(np.float32),
    }
    b = {
        "b1/w": rng.standard_normal((4, 2)).astype(np.float64),
        "b1/b": rng.standard_normal(2).astype(np.float32),
        "b1/step": np.array(5, np.int64),
    }
    pa = d / "a" / "model.ckpt"
    pb = d / "b" / "model.ckpt"
    tf1_save(pa, lambda: {k: tf1_var(k, v) for k, v in a.items()})
    tf1_save(pb, lambda: {k: tf1_var(k, v) for k, v in b.items()})
    return str(pa), a, str(pb), b


def build_net(dtypes):
    out = {
        "net/a1/w": tf1_var("net/a1/w", dtype=dtypes[0], shape=(3, 4)),
        "net/a1/b": tf1_var("net/a1/b", dtype=dtypes[1], shape=(4,)),
        "net/b1/w": tf1_var("net/b1/w", dtype=dtypes[2], shape=(4, 2)),
        "net/b1/b": tf1_var("net/b1/b", dtype=dtypes[3], shape=(2,)),
        "net/b1/step": tf1_var("net/b1/step", dtype=tf.int64, shape=()),
    }
    out["other/v"] = v1.get_variable("other/v", initializer=np.ones(3, np.float32))
    return out


def test_two_checkpoints_into_one_graph_under_new_names(ab_checkpoints):
    pa, a, pb, b = ab_checkpoints
    dtypes = ["float16", "float32", "float32", "bfloat16"]
    with tf1_session(lambda: build_net(dtypes)) as (sess, variables):
        everything = list(variables.values())
        ra = tfckpt.restore(everything, pa, session=sess, assignment_map={"a1/": "net/a1/"})
        mid = run_values(sess, variables)
        rb = tfckpt.restore(everything, pb, session=sess, assignment_map={"b1/": "net/b1/"})
        ours = run_values(sess, variables)
    assert names_of(ra) == [
        ("a1/b", "net/a1/b:0", "float32", "float32"),
        ("a1/w", "net/a1/w:0", "float32", "float16"),
    ]
    assert ra.unused == ["a2/w"] and ra.missing == []
    assert names_of(rb) == [
        ("b1/b", "net/b1/b:0", "float32", "bfloat16"),
        ("b1/step", "net/b1/step:0", "int64", "int64"),
        ("b1/w", "net/b1/w:0", "float64", "float32"),
    ]
    assert rb.unused == [] and rb.missing == []
    assert not mid["net/b1/w"].any()  # the first restore touched only a1
    assert_bits(ours["net/a1/w"], cast_np(a["a1/w"], "float16"), "net/a1/w")
    assert_bits(ours["net/a1/b"], a["a1/b"], "net/a1/b")
    assert_bits(ours["net/b1/w"], cast_np(b["b1/w"], "float32"), "net/b1/w")
    assert_bits(ours["net/b1/b"], cast_np(b["b1/b"], "bfloat16"), "net/b1/b")
    assert_bits(ours["net/b1/step"], b["b1/step"], "net/b1/step")
    assert_bits(ours["other/v"], np.ones(3, np.float32), "other/v")

    # Same dtypes as the checkpoints: identical to tf.compat.v1.train.init_from_checkpoint.
    same = ["float32", "float32", "float64", "float32"]
    with tf1_session(lambda: build_net(same)) as (sess, variables):
        tfckpt.restore(
            list(variables.values()), pa, session=sess, assignment_map={"a1/": "net/a1/"}
        )
        tfckpt.restore(
            list(variables.values()), pb, session=sess, assignment_map={"b1/": "net/b1/"}
        )
        ours = run_values(sess, variables)
    with tf.Graph().as_default() as g:
        variables = build_net(same)
        v1.train.init_from_checkpoint(pa, {"a1/": "net/a1/"})
        v1.train.init_from_checkpoint(pb, {"b1/": "net/b1/"})
        with v1.Session(graph=g) as sess:
            sess.run(v1.global_variables_initializer())
            theirs = run_values(sess, variables)
    for k in theirs:
        assert_bits(ours[k], theirs[k], k)


@pytest.mark.parametrize(
    "which,assignment_map",
    [
        ("a", {"/": "net/"}),  # the whole checkpoint under a new scope
        ("a", {"a1/": "x/"}),
        ("a", {"a1/w": "net/a1/w", "a2/": "net/a2/"}),  # exact and scope together
        ("parts", {"emb": "net/emb", "/": "net/"}),  # a partitioned variable, by exact name
    ],
)
def test_assignment_map_agrees_with_init_from_checkpoint(
    ab_checkpoints, tf1_partitioned32, which, assignment_map
):
    """Same dtypes, so TensorFlow's own init_from_checkpoint can say what the map means."""
    prefix = ab_checkpoints[0] if which == "a" else tf1_partitioned32[0]

    def build():
        if which == "parts":
            return {
                "net/emb": tf1_var("net/emb", dtype="float32", shape=(10, 4), parts=2),
                "net/vec": tf1_var("net/vec", dtype="float32", shape=(12,)),
                "net/wide": tf1_var("net/wide", dtype="float32", shape=(5, 7), parts=3, axis=1),
            }
        return {
            n: tf1_var(n, dtype="float32", shape=s)
            for n, s in [
                ("net/a1/w", (3, 4)),
                ("net/a1/b", (4,)),
                ("net/a2/w", (2,)),
                ("x/w", (3, 4)),
                ("x/b", (4,)),
            ]
        }

    with tf1_session(build) as (sess, variables):
        zeros = run_values(sess, variables)
        report = tfckpt.restore(
            list(variables.values()), prefix, session=sess, assignment_map=assignment_map
        )
        ours = run_values(sess, variables)
    with tf.Graph().as_default() as g:
        variables = build()
        v1.train.init_from_checkpoint(prefix, assignment_map)
        with v1.Session(graph=g) as sess:
            sess.run(v1.global_variables_initializer())
            theirs = run_values(sess, variables)
    for k in theirs:
        assert_bits(ours[k], theirs[k], k)
    changed = sorted(k for k in ours if ours[k].tobytes() != zeros[k].tobytes())
    assert changed == sorted({r.variable.split("/part_")[0].split(":")[0] for r in report.restored})
    assert report.missing == []


def test_exact_name_assignment_map(ab_checkpoints):
    pa, a, _, _ = ab_checkpoints

    def build():
        return {
            "net/a1/w": tf1_var("net/a1/w", dtype="float16", shape=(3, 4)),
            "net/a1/b": tf1_var("net/a1/b", dtype="float16", shape=(4,)),
            "renamed": tf1_var("renamed", dtype="float16", shape=(2,)),
        }

    with tf1_session(build) as (sess, variables):
        report = tfckpt.restore(
            list(variables.values()),
            pa,
            session=sess,
            assignment_map={"a1/w": "net/a1/w", "a2/w": "renamed"},
        )
        ours = run_values(sess, variables)
    assert names_of(report) == [
        ("a1/w", "net/a1/w:0", "float32", "float16"),
        ("a2/w", "renamed:0", "float32", "float16"),
    ]
    assert report.unused == ["a1/b"] and report.missing == []
    assert_bits(ours["net/a1/w"], cast_np(a["a1/w"], "float16"), "net/a1/w")
    assert_bits(ours["renamed"], cast_np(a["a2/w"], "float16"), "renamed")
    assert not ours["net/a1/b"].any()  # not covered by the map: untouched


def test_eager_name_based_restore(ab_checkpoints):
    pa, a, pb, b = ab_checkpoints
    assert tf.executing_eagerly()
    w = tf.Variable(np.zeros((3, 4), np.float16), name="net/a1/w")
    bias = tf.Variable(np.zeros(4, ml_dtypes.bfloat16), name="net/a1/b")
    report = tfckpt.restore([w, bias], pa, assignment_map={"a1/": "net/a1/"})
    assert names_of(report) == [
        ("a1/b", "net/a1/b:0", "float32", "bfloat16"),
        ("a1/w", "net/a1/w:0", "float32", "float16"),
    ]
    assert_bits(w.numpy(), cast_np(a["a1/w"], "float16"), "w")
    assert_bits(bias.numpy(), cast_np(a["a1/b"], "bfloat16"), "b")

    plain = tf.Variable(np.zeros(2, np.float64), name="a2/w")  # by its own name, no map
    step = tf.Variable(np.int64(0))
    report = tfckpt.restore([plain], pa)
    assert names_of(report) == [("a2/w", "a2/w:0", "float32", "float64")]
    assert_bits(plain.numpy(), a["a2/w"].astype(np.float64), "a2/w")
    tfckpt.restore({"b1/step": step, "b1/w": (w2 := tf.Variable(np.zeros((4, 2), np.float16)))}, pb)
    assert int(step.numpy()) == 5
    assert_bits(w2.numpy(), tf.cast(b["b1/w"], tf.float16).numpy(), "b1/w")


# ---------------------------------------------------------------- 4. errors


def test_shape_mismatch_names_both_shapes_and_changes_nothing(ab_checkpoints):
    pa, _, _, _ = ab_checkpoints

    def build():  # a1/b first, so a restore in list order would already have touched it
        return {
            "a1/b": tf1_var("a1/b", dtype="float16", shape=(4,)),
            "a1/w": tf1_var("a1/w", dtype="float16", shape=(4, 3)),
        }

    with tf1_session(build) as (sess, variables):
        with pytest.raises(CheckpointError) as e:
            tfckpt.restore(list(variables.values()), pa, session=sess)
        after = run_values(sess, variables)
    msg = str(e.value)
    assert "[3, 4]" in msg and "[4, 3]" in msg and "a1/w" in msg, msg
    assert not after["a1/b"].any() and not after["a1/w"].any()

    # Eager too.
    b = tf.Variable(np.zeros(4, np.float16), name="a1/b")
    w = tf.Variable(np.zeros((12,), np.float16), name="a1/w")
    with pytest.raises(CheckpointError, match=r"\[3, 4\].*\[12\]"):
        tfckpt.restore([b, w], pa)
    assert not b.numpy().any()


def test_shape_mismatch_in_keras_model_changes_nothing(tf_checkpoints):
    case = tf_checkpoints("keras_manager")
    model = keras_model("float16", dense_units=5)
    before = [v.numpy().copy() for v in model.weights]
    with pytest.raises(CheckpointError) as e:
        tfckpt.restore(tf.train.Checkpoint(model=model), case.prefix)
    assert "[48, 4]" in str(e.value) and "[48, 5]" in str(e.value), str(e.value)
    for v, b in zip(model.weights, before):
        assert_bits(v.numpy(), b, v.path)


def test_missing_variable(ab_checkpoints):
    pa, a, _, _ = ab_checkpoints

    def build():
        return {
            "a1/w": tf1_var("a1/w", dtype="float16", shape=(3, 4)),
            "a1/b": tf1_var("a1/b", dtype="float16", shape=(4,)),
            "extra/v": v1.get_variable("extra/v", initializer=np.ones(2, np.float16)),
        }

    with tf1_session(build) as (sess, variables):
        with pytest.raises(CheckpointError, match="extra/v") as e:
            tfckpt.restore(list(variables.values()), pa, session=sess)
        assert "allow_missing" in str(e.value)
        unchanged = run_values(sess, variables)
        report = tfckpt.restore(list(variables.values()), pa, session=sess, allow_missing=True)
        after = run_values(sess, variables)
    assert not unchanged["a1/w"].any() and not unchanged["a1/b"].any()
    assert report.missing == ["extra/v:0"]
    assert names_of(report) == [
        ("a1/b", "a1/b:0", "float32", "float16"),
        ("a1/w", "a1/w:0", "float32", "float16"),
    ]
    assert report.unused == ["a2/w"]
    assert_bits(after["a1/w"], cast_np(a["a1/w"], "float16"), "a1/w")
    assert_bits(after["extra/v"], np.ones(2, np.float16), "extra/v")


def test_missing_variable_object_based(module_ckpt):
    prefix, original = module_ckpt
    net = Net("float16", extra=True)
    with pytest.raises(CheckpointError, match="no value for 1 variable"):
        tfckpt.restore(tf.train.Checkpoint(net=net), prefix)
    assert not any(v.numpy().any() for v in module_variables(net))
    report = tfckpt.restore(tf.train.Checkpoint(net=net), prefix, allow_missing=True)
    assert report.missing == [net.more.name]
    assert len(report.restored) == 7
    assert_bits(net.w.numpy(), cast_np(original[0], "float16"), "w")
    assert_bits(net.more.numpy(), np.ones(3, np.float16), "more")


def test_name_based_and_object_based_requirements(ab_checkpoints, module_ckpt):
    pa, _, _, _ = ab_checkpoints
    tf2_prefix, original = module_ckpt
    # An object-based target needs a TF2 checkpoint (an object graph); a TF1 one is refused.
    with pytest.raises(CheckpointError, match="TF2 checkpoint"):
        tfckpt.restore(tf.train.Checkpoint(net=Net("float16")), pa)
    # assignment_map is for name-based targets only.
    net = Net("float16")
    with pytest.raises(CheckpointError, match="assignment_map"):
        tfckpt.restore(tf.train.Checkpoint(net=net), tf2_prefix, assignment_map={"net/": "x/"})
    assert not net.w.numpy().any()
    # Name-based into a TF2 checkpoint: variable names are not its keys ...
    w = tf.Variable(np.zeros((4, 3), np.float16), name="net/w")
    with pytest.raises(CheckpointError, match="no value for 1 variable"):
        tfckpt.restore([w], tf2_prefix)
    # ... but its keys, given explicitly, are.
    report = tfckpt.restore({"net/w/.ATTRIBUTES/VARIABLE_VALUE": w}, tf2_prefix)
    assert_bits(w.numpy(), cast_np(original[0], "float16"), "w")
    assert len(report.unused) == 6  # the other variables of the module (and no object graph)
    # Graph-mode variables without a session.
    with tf.Graph().as_default():
        v = tf1_var("a1/b", dtype="float16", shape=(4,))
        with pytest.raises(CheckpointError, match="session"):
            tfckpt.restore([v], pa)


@pytest.fixture(scope="module")
def overflow_ckpt(tmp_path_factory):
    values = {
        "small": np.array([1.0, 2.0], np.float32),
        "big": np.array([1e5, -1e5, 1.5, 70000.0, 65519.0, np.inf], np.float32),
        "count": np.array(2**40, np.int64),
    }
    prefix = tmp_path_factory.mktemp("overflow") / "o.ckpt"
    tf1_save(prefix, lambda: {k: tf1_var(k, v) for k, v in values.items()})
    return str(prefix), values


OVERFLOWED = {
    "clip": [65504.0, -65504.0, 1.5, 65504.0, 65504.0, np.inf],
    "inf": [np.inf, -np.inf, 1.5, np.inf, 65504.0, np.inf],
}


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_overflow_policy(overflow_ckpt, mode):
    """float32 1e5 into float16: an error by default (nothing assigned), else clip or inf."""
    prefix, _ = overflow_ckpt
    with contextlib.ExitStack() as stack:
        if mode == "graph":
            graph = stack.enter_context(tf.Graph().as_default())
            sess = stack.enter_context(v1.Session(graph=graph))
            small = tf1_var("small", dtype="float16", shape=(2,))
            big = tf1_var("big", dtype="float16", shape=(6,))
            sess.run(v1.global_variables_initializer())
            read = sess.run
        else:
            sess = None
            small = tf.Variable(np.zeros(2, np.float16), name="small")
            big = tf.Variable(np.zeros(6, np.float16), name="big")
            read = lambda v: v.numpy()  # noqa: E731

        with pytest.raises(CheckpointError, match="beyond the range of float16") as e:
            tfckpt.restore([small, big], prefix, session=sess)
        assert e.value.tensor == "big"
        assert not read(small).any() and not read(big).any()
        for policy, want in OVERFLOWED.items():
            tfckpt.restore([small, big], prefix, session=sess, overflow=policy)
            assert_bits(read(big), np.array(want, np.float16), policy)
            assert_bits(read(small), np.array([1, 2], np.float16), policy)


def test_integer_and_kind_mismatches(overflow_ckpt):
    prefix, _ = overflow_ckpt
    fits = tf.Variable(np.int64(0), name="count")
    tfckpt.restore([fits], prefix)
    assert int(fits.numpy()) == 2**40
    narrow = tf.Variable(np.int32(0), name="count")
    small = tf.Variable(np.zeros(2, np.float16), name="small")
    with pytest.raises(CheckpointError, match="do not fit int32"):
        tfckpt.restore([small, narrow], prefix)
    assert not small.numpy().any()
    as_int = tf.Variable(np.zeros(2, np.int64), name="small")
    with pytest.raises(CheckpointError, match="cannot restore float32 into int64"):
        tfckpt.restore([as_int], prefix)


# ---------------------------------------------------------------- 5. the tf.cast backend


def _bits(dtype, *words) -> np.ndarray:
    dt = np.dtype(dtype)
    return np.array(words, dtype=f"u{dt.itemsize}").view(dt)


def special_values(src: str) -> np.ndarray:
    """NaNs (several payloads, both signs), ±inf, ±0, subnormals, extremes, overflow and ties."""
    dt = NP[src]
    if src == "float32":
        return np.concatenate(
            [
                _bits(
                    dt,
                    0x7FC00000,
                    0x7FC00001,
                    0x7F800001,
                    0x7FBFFFFF,
                    0x7FFFFFFF,
                    0x7FD2B4C1,
                    0xFFC00000,
                    0xFF800001,
                    0xFFFFFFFF,
                    0xFFA5A5A5,  # NaNs
                    0x00000001,
                    0x80000001,
                    0x007FFFFF,
                    0x807FFFFF,
                    0x00400000,  # subnormals
                    0x00800000,
                    0x7F7FFFFF,
                    0xFF7FFFFF,  # tiny, ±max
                    0x7F7F7FFF,
                    0x7F7F8000,
                    0x7F7F8001,
                    0xFF7F8000,  # around bfloat16's max
                    0x3F808000,
                    0x3F818000,
                    0xBF808000,
                    0x3F808001,
                ),  # bfloat16 ties
                np.array(
                    [
                        0.0,
                        -0.0,
                        np.inf,
                        -np.inf,
                        65504,
                        -65504,
                        65519.996,
                        65520,
                        -65520,
                        65536,
                        1e5,
                        -1e5,
                        1e38,
                        2.0**-24,
                        -(2.0**-24),
                        2.0**-25,
                        -(2.0**-25),
                        3 * 2.0**-25,
                        2.0**-26,
                        2.0**-14,
                        2.0**-14 - 2.0**-25,
                        1e-10,
                        1 + 2.0**-11,
                        1 + 3 * 2.0**-11,
                        -(1 + 2.0**-11),
                        2049,
                        2051,
                        4097,
                        0.1,
                        1 / 3,
                        np.pi,
                    ],
                    dtype=dt,
                ),
            ]
        )
    if src == "float64":
        return np.concatenate(
            [
                _bits(
                    dt,
                    0x7FF8000000000000,
                    0x7FF8000000000001,
                    0x7FF0000000000001,
                    0x7FF4000000000000,
                    0x7FFFFFFFE0000000,
                    0xFFF8000000000000,
                    0xFFF0000000000001,
                    0xFFFFFFFFFFFFFFFF,  # NaNs
                    0x0000000000000001,
                    0x800FFFFFFFFFFFFF,  # float64 subnormals
                    0x7FEFFFFFFFFFFFFF,
                    0xFFEFFFFFFFFFFFFF,
                ),  # ±max
                np.array(
                    [
                        0.0,
                        -0.0,
                        np.inf,
                        -np.inf,
                        1e-40,
                        -1e-42,
                        2.0**-149,
                        2.0**-150,
                        1.1754942e-38,
                        3.4028234663852886e38,
                        3.4028235677973366e38,
                        3.5e38,
                        1e300,
                        -1e300,
                        65504,
                        65519.99,
                        65519.999999999,
                        65520,
                        1e5,
                        1 + 2.0**-11 + 2.0**-40,
                        -(1 + 2.0**-11 + 2.0**-40),  # double rounding
                        1 + 2.0**-8 + 2.0**-30,
                        1 + 2.0**-24,
                        1 + 2.0**-24 + 2.0**-60,
                        2.0**-25 + 2.0**-50,
                        2.0**-24,
                        3 * 2.0**-25,
                        0.1,
                        1 / 3,
                        np.pi,
                    ],
                    dtype=dt,
                ),
            ]
        )
    if src == "float16":
        return _bits(
            dt,
            0x7E00,
            0x7C01,
            0x7D55,
            0x7FFF,
            0xFE00,
            0xFC01,
            0xFFFF,
            0x0001,
            0x8001,
            0x03FF,
            0x0200,
            0x0400,
            0x7BFF,
            0xFBFF,
            0x7C00,
            0xFC00,
            0x0000,
            0x8000,
            0x3C01,
            0x3555,
            0x3C04,
            0x3C0C,
            0x3C02,
            0xBC04,
        )
    return _bits(
        dt,
        0x7FC0,
        0x7F81,
        0x7FA0,
        0x7FFF,
        0xFFC0,
        0xFF81,
        0x0001,
        0x8001,
        0x007F,
        0x0080,
        0x7F7F,
        0xFF7F,
        0x7F80,
        0xFF80,
        0x0000,
        0x8000,
        0x477F,
        0x4780,
        0xC780,
        0x3300,
        0x3340,
        0x3F81,
    )


SOURCES = ["float16", "bfloat16", "float32", "float64"]


def without_float32_subnormals(x: np.ndarray) -> np.ndarray:
    """``x`` without the values that are (or round to) float32 subnormals."""
    with np.errstate(invalid="ignore"):
        mag = np.abs(x.astype(np.float64))
    return x[~((mag > 0) & (mag < F32_TINY))]


@pytest.fixture(scope="module")
def cast_sources(tmp_path_factory):
    """One TF-written checkpoint per source dtype (and one without float32-range subnormals):
    the special values, random bit patterns and random normals, plus an int tensor."""
    rng = np.random.default_rng(105)
    d = tmp_path_factory.mktemp("cast_sources")
    out = {}
    for src in SOURCES:
        dt = NP[src]
        full = {
            "special": special_values(src),
            "random_bits": tfc.random_floats(dt, (48, 64), rng),
            "random_normal": (rng.standard_normal(3000) * 100).astype(dt),
            "ints": np.arange(10, dtype=np.int32),
        }
        for variant, vals in [
            ("full", full),
            (
                "no_subnormals",
                {
                    k: without_float32_subnormals(v.reshape(-1)) if v.dtype == dt else v
                    for k, v in full.items()
                },
            ),
        ]:
            prefix = str(d / f"{src}_{variant}")
            tf.raw_ops.SaveV2(
                prefix=prefix,
                tensor_names=list(vals),
                shape_and_slices=[""] * len(vals),
                tensors=[tf.constant(v) for v in vals.values()],
            )
            with tfckpt.open(prefix) as c:  # NaN payloads survived TensorFlow's writer
                for k, v in vals.items():
                    assert_bits(c[k], v, f"{prefix}:{k}")
            out[src, variant] = (prefix, vals)
    return out


def summary_counts(s) -> dict:
    d = s.to_dict()
    return {
        k: d[k]
        for k in ("kept", "cast", "bytes_in", "bytes_out", "overflow", "to_zero", "subnormal")
    }


def assert_same_checkpoints(a: str, b: str, source: dict) -> None:
    """Same tensors, bit for bit (first differences shown with their source values)."""
    with tfckpt.open(a) as ca, tfckpt.open(b) as cb:
        assert ca.keys() == cb.keys()
        bad = {}
        for k in ca.keys():
            x, y = ca[k], cb[k]
            if x.dtype != y.dtype or x.shape != y.shape:
                bad[k] = f"{x.dtype}{x.shape} vs {y.dtype}{y.shape}"
            elif x.tobytes() != y.tobytes():
                u = f"u{x.dtype.itemsize}"
                idx = np.nonzero(x.reshape(-1).view(u) != y.reshape(-1).view(u))[0]
                s = source[k].reshape(-1)
                bad[k] = f"{idx.size} elements, e.g. " + "; ".join(
                    f"{s[i]!r} -> numpy 0x{int(x.reshape(-1).view(u)[i]):x}, "
                    f"tf 0x{int(y.reshape(-1).view(u)[i]):x}"
                    for i in idx[:4]
                )
        assert not bad, tfc.report(bad, "tensors differ between the numpy and tf backends")
    for fa, fb in zip(th.checkpoint_files(a), th.checkpoint_files(b)):
        assert fa.read_bytes() == fb.read_bytes(), (fa, fb)


def convert_both(src_prefix, dst, tmp_path, overflow):
    out_np, out_tf = str(tmp_path / "np" / "out"), str(tmp_path / "tf" / "out")
    s_np = tfckpt.convert(src_prefix, out_np, dst, backend="numpy", overflow=overflow)
    s_tf = tfckpt.convert(src_prefix, out_tf, dst, backend="tf", tf_threshold=0, overflow=overflow)
    return out_np, out_tf, s_np, s_tf


PAIRS = [
    ("float32", "float16"),
    ("float32", "bfloat16"),
    ("float64", "float16"),
    ("float64", "bfloat16"),
    ("float32", "float64"),
    ("float64", "float32"),
    ("float16", "bfloat16"),
    ("bfloat16", "float16"),
    ("float16", "float32"),
    ("float16", "float64"),
    ("bfloat16", "float32"),
    ("bfloat16", "float64"),
]
# tf.cast on TensorFlow's CPU threads flushes float32 subnormals (inputs and results) to ±0;
# numpy (and tfckpt's numpy backend) keeps them. These pairs meet such values.
FTZ_PAIRS = {("float32", "float64"), ("float64", "float32"), ("bfloat16", "float64")}


@pytest.mark.parametrize("overflow", ["inf", "clip"])
@pytest.mark.parametrize("src,dst", [(s, d) for s, d in PAIRS])
def test_tf_backend_bitwise_equals_numpy(cast_sources, tmp_path, src, dst, overflow):
    prefix, vals = cast_sources[src, "full"]
    out_np, out_tf, s_np, s_tf = convert_both(prefix, dst, tmp_path, overflow)
    assert s_np.cast == 3
    assert_same_checkpoints(out_np, out_tf, vals)
    assert summary_counts(s_np) == summary_counts(s_tf)


@pytest.mark.parametrize("overflow", ["inf", "clip"])
@pytest.mark.parametrize("src,dst", sorted(FTZ_PAIRS))
def test_tf_backend_equals_numpy_away_from_float32_subnormals(
    cast_sources, tmp_path, src, dst, overflow
):
    """The pairs above that meet TF's flush-to-zero agree on everything else."""
    prefix, vals = cast_sources[src, "no_subnormals"]
    out_np, out_tf, s_np, s_tf = convert_both(prefix, dst, tmp_path, overflow)
    assert_same_checkpoints(out_np, out_tf, vals)
    assert summary_counts(s_np) == summary_counts(s_tf)


def test_tf_backend_special_values_are_right(cast_sources, tmp_path):
    """Not only equal to numpy: canonical NaNs with their sign, clipping, ties to even."""
    prefix, vals = cast_sources["float32", "full"]
    _, out_tf, _, _ = convert_both(prefix, "float16", tmp_path, "clip")
    with tfckpt.open(out_tf) as c:
        got = c["special"]
    src = vals["special"]
    nan = np.isnan(src)
    assert np.isnan(got[nan]).all()
    assert (got[nan].view(np.uint16) == np.where(np.signbit(src[nan]), 0xFE00, 0x7E00)).all()
    i = {float(v): n for n, v in enumerate(src) if not np.isnan(v)}
    assert got[i[1e5]] == 65504 and got[i[-1e5]] == -65504 and got[i[65520.0]] == 65504
    assert got[i[65519.99609375]] == 65504 and got[i[float(np.float32(1e38))]] == 65504
    assert np.isposinf(got[i[np.inf]]) and np.isneginf(got[i[-np.inf]])
    assert got[i[-0.0]].view(np.uint16) == 0x8000
    assert got[i[2.0**-25]] == 0 and got[i[3 * 2.0**-25]] == 2.0**-23
    assert got[i[1 + 2.0**-11]] == 1 and got[i[1 + 3 * 2.0**-11]] == 1 + 2.0**-9
    assert got[i[2049.0]] == 2048 and got[i[2051.0]] == 2052


@pytest.mark.parametrize("src,dst", [("float32", "float16"), ("float64", "bfloat16")])
def test_tf_backend_overflow_error_same_as_numpy(cast_sources, tmp_path, src, dst):
    prefix, _ = cast_sources[src, "full"]
    errors = []
    for backend in ["numpy", "tf"]:
        with pytest.raises(CheckpointError, match="nothing written") as e:
            tfckpt.convert(
                prefix, str(tmp_path / backend / "out"), dst, backend=backend, tf_threshold=0
            )
        errors.append((e.value.detail, e.value.counts))
        assert not list((tmp_path / backend).glob("out*"))
    assert errors[0] == errors[1]


def test_tf_threshold_chooses_the_tensors(cast_sources, tmp_path, monkeypatch):
    """Only tensors of at least ``tf_threshold`` bytes go through tf.cast; the device is the CPU."""
    assert tfbridge.best_device() == "/CPU:0"
    assert tfbridge.converter().device == "/CPU:0"
    real = tfbridge.cast.converter
    seen = []

    def spy(device=None):
        convert = real(device)

        def wrapped(chunk, target):
            seen.append((chunk.size, np.dtype(target).name))
            return convert(chunk, target)

        return wrapped

    monkeypatch.setattr(tfbridge.cast, "converter", spy)
    prefix, vals = cast_sources["float32", "full"]
    threshold = vals["random_normal"].nbytes  # 12000 bytes: random_bits (12288) too, special not
    tfckpt.convert(
        prefix,
        str(tmp_path / "tf" / "out"),
        "float16",
        backend="tf",
        tf_threshold=threshold,
        overflow="inf",
    )
    assert sorted(seen) == sorted(
        [(vals["random_bits"].size, "float16"), (vals["random_normal"].size, "float16")]
    )
    tfckpt.convert(prefix, str(tmp_path / "np" / "out"), "float16", overflow="inf")
    assert_same_checkpoints(str(tmp_path / "np" / "out"), str(tmp_path / "tf" / "out"), vals)


def test_auto_backend_without_gpu_is_numpy(cast_sources, tmp_path, monkeypatch):
    assert tfbridge.sees_gpu() is False

    def no(device=None):
        raise AssertionError("the tf backend was used without a GPU")

    monkeypatch.setattr(tfbridge.cast, "converter", no)
    prefix, vals = cast_sources["float32", "full"]
    tfckpt.convert(
        prefix, str(tmp_path / "auto" / "out"), "float64", backend="auto", tf_threshold=0
    )
    tfckpt.convert(prefix, str(tmp_path / "np" / "out"), "float64", backend="numpy")
    assert_same_checkpoints(str(tmp_path / "np" / "out"), str(tmp_path / "auto" / "out"), vals)


def test_cli_backends(cast_sources, tmp_path):
    prefix, vals = cast_sources["float32", "full"]
    api = str(tmp_path / "api" / "out")
    tfckpt.convert(prefix, api, "float16", backend="numpy", overflow="clip")
    cli_tf, cli_auto = str(tmp_path / "cli_tf" / "out"), str(tmp_path / "cli_auto" / "out")
    for backend, out in [("tf", cli_tf), ("auto", cli_auto)]:
        proc = ch.run_text(
            "convert",
            prefix,
            out,
            "--dtype",
            "float16",
            "--backend",
            backend,
            "--tf-threshold",
            "1",
            "--overflow",
            "clip",
        )
        assert proc.returncode == 0, proc.stderr
        assert_same_checkpoints(api, out, vals)
    # auto on this GPU-less machine is the numpy backend: float32 -> float64 keeps subnormals
    # there, which tf.cast on the CPU would flush.
    proc = ch.run_text(
        "convert",
        prefix,
        str(tmp_path / "auto64" / "out"),
        "--dtype",
        "float64",
        "--backend",
        "auto",
        "--tf-threshold",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    tfckpt.convert(prefix, str(tmp_path / "np64" / "out"), "float64")
    assert_same_checkpoints(str(tmp_path / "np64" / "out"), str(tmp_path / "auto64" / "out"), vals)


def test_cli_tf_threshold_zero(cast_sources, tmp_path):
    prefix, vals = cast_sources["float32", "full"]
    out = str(tmp_path / "cli" / "out")
    proc = ch.run_text(
        "convert",
        prefix,
        out,
        "--dtype",
        "float16",
        "--backend",
        "tf",
        "--tf-threshold",
        "0",
        "--overflow",
        "inf",
    )
    assert proc.returncode == 0, proc.stderr
    tfckpt.convert(prefix, str(tmp_path / "api" / "out"), "float16", overflow="inf")
    assert_same_checkpoints(str(tmp_path / "api" / "out"), out, vals)


# ---------------------------------------------------------------- 6. verify_with_tf


@pytest.mark.parametrize(
    "name,dtype,backend",
    [
        ("tf1_saver", "float16", "numpy"),
        ("tf1_saver", "float16", "tf"),
        ("tf1_saver", "float64", "tf"),
        ("keras_manager", "float16", "numpy"),
        ("keras_manager", "bfloat16", "tf"),
        ("keras_manager", "float64", "numpy"),
        ("tf1_partitioned", "bfloat16", "numpy"),
        ("tf1_partitioned", "float64", "tf"),
        ("tf1_sharded", "float64", "numpy"),
        ("tf1_sharded", "float16", "tf"),
        ("max_shard_policy", "bfloat16", "numpy"),
        ("saved_model", "float16", "numpy"),
        ("tf1_saver", "float64", "numpy"),
        ("tf1_saver", "bfloat16", "numpy"),
        ("tf1_partitioned", "float16", "numpy"),
    ],
)
def test_verify_with_tf_after_convert(tf_checkpoints, tmp_path, name, dtype, backend):
    case = tf_checkpoints(name)
    out = str(tmp_path / "out" / "model")
    summary = tfckpt.convert(
        case.prefix, out, dtype, overflow="inf", backend=backend, tf_threshold=0
    )
    assert summary.cast > 0
    result = tfckpt.verify_with_tf(out, reference=case.prefix)
    assert result["mismatches"] == [], result["mismatches"]
    assert result["cast_checked"] == summary.cast > 0
    assert result["tensors"] == len(ckpt_keys(out)) + (OBJECT_GRAPH in tfckpt.open(out))


def test_verify_with_tf_negative_nan_to_bfloat16(tmp_path):
    """The smallest case: eight float32 -NaNs, written by TF, converted to bfloat16."""
    src = str(tmp_path / "src")
    tf.raw_ops.SaveV2(
        prefix=src,
        tensor_names=["x"],
        shape_and_slices=[""],
        tensors=[tf.constant(np.full(8, -np.nan, np.float32))],
    )
    out = str(tmp_path / "out" / "m")
    tfckpt.convert(src, out, "bfloat16")
    with tfckpt.open(out) as c:
        assert (c["x"].view(np.uint16) == 0xFFC0).all()  # sign kept, as numpy keeps it
    result = tfckpt.verify_with_tf(out, reference=src)
    assert result["mismatches"] == [], result["mismatches"]


def test_tf_saver_restores_converted_partitioned_float16(tf_checkpoints, tmp_path):
    """What verify_with_tf cannot read (sliced float16), TensorFlow's Saver restores exactly."""
    case = tf_checkpoints("tf1_partitioned")
    with tfckpt.open(case.prefix) as c:
        original = {k: c[k] for k in c.keys()}
    out = str(tmp_path / "out" / "model")
    tfckpt.convert(case.prefix, out, "float16")

    def build():
        return {
            "vec": tf1_var("vec", dtype="float16", shape=(12,), parts=3),
            "emb/table": tf1_var("emb/table", dtype="float16", shape=(10, 4), parts=3),
            "wide": tf1_var("wide", dtype=tf.int64, shape=(5, 7), parts=2, axis=1),
            "plain": tf1_var("plain", dtype=tf.int32, shape=(6,)),
        }

    with tf1_session(build) as (sess, variables):
        v1.train.Saver().restore(sess, out)
        theirs = run_values(sess, variables)
    for k, v in theirs.items():
        want = original[k] if original[k].dtype.kind == "i" else cast_np(original[k], "float16")
        assert_bits(v, want, k)


def test_verify_with_tf_catches_a_wrong_cast(tf_checkpoints, tmp_path):
    """The judge is not blind: a tensor rounded the wrong way is reported."""
    case = tf_checkpoints("tf1_sharded")
    with tfckpt.open(case.prefix) as c:
        values = {k: c[k] for k in c.keys()}
    bad = dict(values)
    w = values["dev0/w"].astype(np.float16)
    w.reshape(-1)[0] = np.nextafter(w.reshape(-1)[0], np.float16(np.inf))  # one ulp off
    bad["dev0/w"] = w
    tfckpt.save(bad, str(tmp_path / "bad"))
    result = tfckpt.verify_with_tf(str(tmp_path / "bad"), reference=case.prefix)
    assert result["cast_checked"] == 1
    assert len(result["mismatches"]) == 1 and "dev0/w" in result["mismatches"][0]


# ---------------------------------------------------------------- 7. no TensorFlow on the numpy path


def test_numpy_path_does_not_import_tensorflow(tf_checkpoints, tmp_path):
    case = tf_checkpoints("tf1_saver")
    code = (
        "import sys\n"
        "def loaded():\n"
        "    return sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'keras', 'tf_keras', 'tensorflow_core'))\n"
        "import tfckpt\n"
        "assert loaded() == [], ('import', loaded())\n"
        "s = tfckpt.convert(sys.argv[1], sys.argv[2], 'float16', backend='numpy', overflow='inf')\n"
        "assert s.cast > 0, s\n"
        "with tfckpt.open(sys.argv[2]) as c:\n"
        "    assert c.info('encoder/layer_0/kernel').dtype == 'float16'\n"
        "assert loaded() == [], ('convert', loaded())\n"
        "import tfckpt.tf\n"
        "assert loaded() == [], ('import tfckpt.tf', loaded())\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, case.prefix, str(tmp_path / "out" / "m")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
