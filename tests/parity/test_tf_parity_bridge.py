"""The TensorFlow bridge where TensorFlow's own API sets the behaviour.

- ``tfckpt.restore`` taking what ``tf.compat.v1.train.Saver`` and ``tf.train.Checkpoint``
  take: partitions listed under one name, a positional root, ``reshape=True``, TF1 names
  against a TF2 checkpoint (Saver's fallback through the object graph); an
  ``assignment_map`` entry that names nothing is an error, as in ``init_from_checkpoint``.
- ``verify_with_tf`` against ``tf.cast``: the two documented differences (subnormal
  results TensorFlow's CPU kernels flush to zero; NaN sign and payload bits) are reported
  per tensor as information, while a wrong value stays a problem.

TensorFlow writes every checkpoint during the test, and its own restore is the reference.
"""

from __future__ import annotations

import contextlib
import json

import ml_dtypes
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from cli_helpers import in_process  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt import CheckpointError  # noqa: E402

v1 = tf.compat.v1


def var(name, dtype, shape, value=None, parts=None):
    """``get_variable`` (resource) holding ``value`` or zeros, optionally partitioned on axis 0."""

    def init(shape, dtype=None, partition_info=None):
        if value is None:
            return tf.zeros(shape, dtype)
        if partition_info is None:
            return tf.constant(value, dtype=dtype)
        index = tuple(slice(o, o + n) for o, n in zip(partition_info.var_offset, shape))
        return tf.constant(value[index], dtype=dtype)

    kw = {"partitioner": v1.fixed_size_partitioner(parts)} if parts else {}
    return v1.get_variable(
        name, shape=list(shape), dtype=tf.as_dtype(dtype), initializer=init, use_resource=True, **kw
    )


def read(sess, variables: dict) -> dict[str, np.ndarray]:
    return sess.run(
        {
            k: v.as_tensor() if type(v).__name__ == "PartitionedVariable" else v
            for k, v in variables.items()
        }
    )


@contextlib.contextmanager
def session(build):
    with tf.Graph().as_default() as graph:
        variables = build()
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            yield sess, variables


def assert_bits(got, want, what=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (
        what,
        got.dtype,
        got.shape,
        want.dtype,
        want.shape,
    )
    assert got.tobytes() == want.tobytes(), (what, got, want)


@pytest.fixture(scope="module")
def tf1_ckpt(tmp_path_factory):
    """A TF1 Saver checkpoint: ``emb`` partitioned three ways, ``w`` (3, 4), ``b`` (4,)."""
    rng = np.random.default_rng(7)
    values = {
        "emb": rng.standard_normal((10, 4)).astype(np.float32),
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "b": rng.standard_normal(4).astype(np.float32),
    }
    prefix = str(tmp_path_factory.mktemp("tf1") / "model.ckpt")
    with tf.Graph().as_default():
        made = {
            "emb": var("emb", "float32", (10, 4), values["emb"], parts=3),
            "w": var("w", "float32", (3, 4), values["w"]),
            "b": var("b", "float32", (4,), values["b"]),
        }
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            assert_bits(read(sess, made)["emb"], values["emb"])
            v1.train.Saver().save(sess, prefix, write_meta_graph=False)
    return prefix, values


# ---------------------------------------------------------------- restore: partitions in a dict


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_dict_with_list_of_partitions_as_saver(tf1_ckpt, dtype):
    """``{"emb": [part0, part1]}``: Saver's var_list form for a partitioned variable."""
    prefix, values = tf1_ckpt

    def build():
        return {"emb": var("emb", dtype, (10, 4), parts=2), "b": var("b", dtype, (4,))}

    with session(build) as (sess, variables):
        parts = list(variables["emb"])
        assert len(parts) == 2
        report = tfckpt.restore({"emb": parts, "b": variables["b"]}, prefix, session=sess)
        ours = read(sess, variables)
    assert sorted((r.checkpoint_name, r.variable) for r in report.restored) == [
        ("b", "b:0"),
        ("emb", "emb/part_0:0"),
        ("emb", "emb/part_1:0"),
    ]
    assert report.unused == ["w"] and report.missing == []
    if dtype == "float32":
        with session(build) as (sess, variables):
            v1.train.Saver({"emb": list(variables["emb"]), "b": variables["b"]}).restore(
                sess, prefix
            )
            theirs = read(sess, variables)
    else:
        theirs = {k: tf.cast(values[k], dtype).numpy() for k in ("emb", "b")}
    for k in theirs:
        assert_bits(ours[k], theirs[k], k)


# ---------------------------------------------------------------- restore: positional root


class Leaf(tf.Module):
    def __init__(self, dtype, rng=None):
        super().__init__()
        shape = (3, 2)
        self.kernel = tf.Variable(
            np.zeros(shape, dtype) if rng is None else rng.standard_normal(shape).astype(dtype)
        )


class Net(tf.Module):
    def __init__(self, dtype, rng=None):
        super().__init__()
        self.w = tf.Variable(
            np.zeros(5, dtype) if rng is None else rng.standard_normal(5).astype(dtype)
        )
        self.leaf = Leaf(dtype, rng)


def test_positional_root_like_checkpoint_read(tmp_path):
    """``tf.train.Checkpoint(net, step=...)``: the root is ``net``, ``step`` attached to it."""
    src = Net(np.float32, np.random.default_rng(8))
    step = tf.Variable(np.int64(41))
    prefix = tf.train.Checkpoint(src, step=step).write(str(tmp_path / "root"))

    theirs, their_step = Net(np.float32), tf.Variable(np.int64(0))
    tf.train.Checkpoint(theirs, step=their_step).read(prefix).assert_consumed()
    ours, our_step = Net(np.float32), tf.Variable(np.int64(0))
    report = tfckpt.restore(tf.train.Checkpoint(ours, step=our_step), prefix)
    assert report.missing == [] and report.unused == [] and len(report.restored) == 3
    for a, b in [
        (ours.w, theirs.w),
        (ours.leaf.kernel, theirs.leaf.kernel),
        (our_step, their_step),
    ]:
        assert_bits(a.numpy(), b.numpy(), a.name)
    assert int(our_step.numpy()) == 41

    # ... and with a cast, where TensorFlow's read refuses the dtype.
    half = Net(np.float16)
    with pytest.raises(tf.errors.InvalidArgumentError, match="expected dtype"):
        tf.train.Checkpoint(Net(np.float16)).read(prefix).expect_partial()
    report = tfckpt.restore(tf.train.Checkpoint(half), prefix)
    assert report.unused == ["step/.ATTRIBUTES/VARIABLE_VALUE"] and report.missing == []
    assert_bits(half.w.numpy(), tf.cast(src.w, tf.float16).numpy(), "w")
    assert_bits(half.leaf.kernel.numpy(), tf.cast(src.leaf.kernel, tf.float16).numpy(), "kernel")


# ---------------------------------------------------------------- restore: assignment_map errors


@pytest.mark.parametrize(
    "assignment_map,names",
    [
        ({"w": "no_such_var"}, ["no_such_var", "'w'"]),  # no variable of that name
        ({"no_such_tensor": "net/w"}, ["no_such_tensor", "net/w"]),  # no tensor of that name
    ],
)
def test_assignment_map_naming_nothing_is_an_error(tf1_ckpt, assignment_map, names):
    prefix, _ = tf1_ckpt

    def build():
        return {"net/w": var("net/w", "float32", (3, 4)), "net/b": var("net/b", "float32", (4,))}

    with tf.Graph().as_default():  # TensorFlow's own verdict
        build()
        with pytest.raises(ValueError):
            v1.train.init_from_checkpoint(prefix, assignment_map)
    full_map = {"b": "net/b", **assignment_map}
    with session(build) as (sess, variables):
        with pytest.raises(CheckpointError) as e:
            tfckpt.restore(list(variables.values()), prefix, session=sess, assignment_map=full_map)
        after = read(sess, variables)
    assert all(n in str(e.value) for n in names), str(e.value)
    assert prefix in str(e.value)
    assert not after["net/b"].any()  # nothing assigned


# ---------------------------------------------------------------- restore: reshape


@pytest.mark.parametrize("shape", [(4, 3), (12,), (2, 2, 3)])
def test_reshape_like_saver(tf1_ckpt, shape):
    prefix, values = tf1_ckpt

    def build(dtype="float32"):
        return {"w": var("w", dtype, shape)}

    # Without reshape, a shape mismatch is an error (eager: TensorFlow's Saver says so too).
    eager = tf.Variable(np.zeros(shape, np.float32), name="w")
    with pytest.raises(ValueError, match="incompatible tensor with shape"):
        v1.train.Saver([eager]).restore(None, prefix)
    with pytest.raises(CheckpointError, match=r"\[3, 4\].*reshape=True"):
        tfckpt.restore([eager], prefix)
    assert not eager.numpy().any()
    tfckpt.restore([eager], prefix, reshape=True)
    with session(build) as (sess, variables):
        with pytest.raises(CheckpointError, match=r"\[3, 4\].*reshape=True"):
            tfckpt.restore(list(variables.values()), prefix, session=sess)
        v1.train.Saver(list(variables.values()), reshape=True).restore(sess, prefix)
        theirs = read(sess, variables)["w"]
    with session(build) as (sess, variables):
        report = tfckpt.restore(list(variables.values()), prefix, session=sess, reshape=True)
        ours = read(sess, variables)["w"]
    assert_bits(ours, theirs, "w")
    assert_bits(eager.numpy(), theirs, "eager w")
    assert [r.checkpoint_name for r in report.restored] == ["w"]
    want = tf.cast(theirs, tf.float16).numpy()
    with session(lambda: build("float16")) as (sess, variables):
        tfckpt.restore(list(variables.values()), prefix, session=sess, reshape=True)
        assert_bits(read(sess, variables)["w"], want, "float16")


def test_reshape_needs_the_same_number_of_elements(tf1_ckpt):
    prefix, _ = tf1_ckpt
    w = tf.Variable(np.zeros((5, 3), np.float32), name="w")
    with pytest.raises(CheckpointError, match=r"\[3, 4\].*\[5, 3\]"):
        tfckpt.restore([w], prefix, reshape=True)
    assert not w.numpy().any()


def test_partitioned_variable_of_another_full_shape_is_an_error(tf1_ckpt):
    """Slices are taken from the tensor only when its shape is the variable's full shape."""
    prefix, values = tf1_ckpt

    def build():
        return {"emb": var("emb", "float32", (10, 2), parts=2)}

    with session(build) as (sess, variables):
        with pytest.raises(tf.errors.InvalidArgumentError):
            v1.train.Saver(list(variables.values())).restore(sess, prefix)
        with pytest.raises(CheckpointError, match=r"\[10, 4\].*\[10, 2\]"):
            tfckpt.restore(list(variables.values()), prefix, session=sess)


# ------------------------------------------------------------ restore: TF1 names, TF2 checkpoint


@pytest.fixture(scope="module")
def tf2_named(tmp_path_factory):
    """A TF2 object checkpoint of eagerly created variables with TF1-style names."""
    rng = np.random.default_rng(9)
    values = {
        "enc/kernel": rng.standard_normal((3, 4)).astype(np.float32),
        "enc/bias": rng.standard_normal(4).astype(np.float32),
        "step": np.array(17, np.int64),
    }
    module = tf.Module()
    module.enc = tf.Module()
    module.enc.k = tf.Variable(values["enc/kernel"], name="enc/kernel")
    module.enc.b = tf.Variable(values["enc/bias"], name="enc/bias")
    module.step = tf.Variable(values["step"], name="step")
    prefix = tf.train.Checkpoint(model=module).write(
        str(tmp_path_factory.mktemp("tf2_named") / "ckpt")
    )
    with tfckpt.open(prefix) as c:
        assert "enc/kernel" not in c  # keys are object paths, not the names
    return prefix, values


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_tf1_names_against_tf2_checkpoint_like_saver(tf2_named, dtype):
    prefix, values = tf2_named

    def build():
        return {
            "enc/kernel": var("enc/kernel", dtype, (3, 4)),
            "enc/bias": var("enc/bias", dtype, (4,)),
            "step": var("step", "int64", ()),
        }

    with session(build) as (sess, variables):
        report = tfckpt.restore(list(variables.values()), prefix, session=sess)
        ours = read(sess, variables)
    assert sorted(r.checkpoint_name for r in report.restored) == [
        "model/enc/b/.ATTRIBUTES/VARIABLE_VALUE",
        "model/enc/k/.ATTRIBUTES/VARIABLE_VALUE",
        "model/step/.ATTRIBUTES/VARIABLE_VALUE",
    ]
    assert report.missing == []
    if dtype == "float32":  # Saver.restore falls back to the object graph itself
        with session(build) as (sess, variables):
            v1.train.Saver().restore(sess, prefix)
            theirs = read(sess, variables)
    else:
        theirs = {
            k: v if v.dtype == np.int64 else tf.cast(v, dtype).numpy() for k, v in values.items()
        }
    for k in theirs:
        assert_bits(ours[k], theirs[k], k)

    # A name the object graph does not know either stays missing, as Saver refuses it.
    def build_extra():
        return {**build(), "other": var("other", dtype, (2,))}

    with session(build_extra) as (sess, variables):
        with pytest.raises(tf.errors.NotFoundError, match="other"):
            v1.train.Saver().restore(sess, prefix)
        with pytest.raises(CheckpointError, match="no value for 1 variable.*other"):
            tfckpt.restore(list(variables.values()), prefix, session=sess)


# -------------------------------------------------------- verify_with_tf: documented differences


NP = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}


def save_v2(prefix: str, **tensors) -> None:
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=list(tensors),
        shape_and_slices=[""] * len(tensors),
        tensors=[tf.constant(v) for v in tensors.values()],
    )


def ieee(x: np.ndarray, dst: str) -> np.ndarray:
    """IEEE round-to-nearest-even (float64 to a 16-bit type through float32, as TensorFlow)."""
    if x.dtype == np.float64 and NP[dst].itemsize < 4:
        x = x.astype(np.float32)
    return x.astype(NP[dst])


def with_subnormals(src: str) -> np.ndarray:
    """Normal values and values whose result lies below float32's normal range, both signs."""
    rng = np.random.default_rng(10)
    tiny = np.ldexp(rng.random(24) + 0.5, rng.integers(-140, -127, 24)) * rng.choice([-1, 1], 24)
    x = np.concatenate([rng.standard_normal(40), tiny, [0.0, -0.0, 1e-30]])
    return rng.permutation(x).astype(NP[src])


def bits(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(f"u{a.dtype.itemsize}")


@pytest.mark.parametrize(
    "src,dst",
    [
        ("float32", "float64"),
        ("float64", "float32"),
        ("float64", "bfloat16"),
        ("bfloat16", "float64"),
    ],
)
def test_verify_reports_subnormals_tf_flushes(tmp_path, src, dst):
    x = with_subnormals(src)
    theirs = tf.cast(tf.constant(x), dst).numpy()
    flushed = int(np.count_nonzero((theirs.astype(np.float64) == 0) & (ieee(x, dst) != 0)))
    assert flushed > 0  # TensorFlow's CPU cast does flush these
    source = str(tmp_path / "src")
    save_v2(source, x=x)
    out = str(tmp_path / "out" / "m")
    tfckpt.convert(source, out, dst)
    with tfckpt.open(out) as c:
        assert_bits(c["x"], ieee(x, dst), "tfckpt keeps the IEEE result")

    result = tfckpt.verify_with_tf(out, reference=source)
    assert result["mismatches"] == [] and result["cast_checked"] == 1
    assert result["cast_differences"] == [
        {
            "tensor": "x",
            "cast": f"{src} -> {dst}",
            "subnormals_tf_flushes": flushed,
            "nans_other_bits": 0,
        }
    ]
    rc, stdout, stderr = in_process("verify", out, "--tf", "--reference", source)
    assert rc == 0, stderr
    assert (
        f"note: x ({src} -> {dst}): {flushed} subnormal results tf.cast flushes to zero" in stdout
    )
    rc, stdout, _ = in_process("verify", out, "--tf", "--reference", source, "--json")
    assert rc == 0
    assert json.loads(stdout)["tf"]["cast_differences"] == result["cast_differences"]


def nan_values(src: str) -> np.ndarray:
    """40 -NaNs, 40 NaNs, NaNs with payloads (float32), and ordinary values."""
    x = np.concatenate([np.full(40, -np.nan), np.full(40, np.nan), np.linspace(-3, 3, 9)])
    x = x.astype(NP[src])
    x[40:80] = np.abs(x[40:80])
    x[:40] = -np.abs(x[:40])
    if src == "float32":
        payload = np.array(
            [0x7F800001, 0xFF800001, 0x7FA00000, 0xFFA00000, 0x7FFFFFFF], np.uint32
        ).view(np.float32)
        x = np.concatenate([x, np.resize(payload, 40)])
    return x


@pytest.mark.parametrize(
    "src,dst",
    [
        ("float32", "bfloat16"),
        ("float32", "float16"),
        ("float64", "bfloat16"),
        ("float32", "float64"),
    ],
)
def test_verify_reports_nans_of_other_bits(tmp_path, src, dst):
    """tfckpt's NaN: the target's quiet NaN with the source's sign; tf.cast's varies."""
    x = nan_values(src)
    nan = np.isnan(x)
    canonical = bits(np.array([np.nan], NP[dst]))[0]
    sign = np.array(1, bits(canonical).dtype) << (8 * NP[dst].itemsize - 1)
    ours_nan = np.where(np.signbit(x[nan]), canonical | sign, canonical)
    theirs = tf.cast(tf.constant(x), dst).numpy()
    assert np.isnan(theirs.astype(np.float64))[nan].all()
    other = int(np.count_nonzero(bits(theirs)[nan] != ours_nan))
    if (src, dst) == ("float32", "bfloat16"):
        # tf.cast's vectorised float32 -> bfloat16 loses the sign of some -NaNs.
        assert np.count_nonzero(~np.signbit(theirs[:40].astype(np.float32))) > 0
    source = str(tmp_path / "src")
    save_v2(source, x=x)
    out = str(tmp_path / "out" / "m")
    tfckpt.convert(source, out, dst)
    with tfckpt.open(out) as c:
        assert (bits(c["x"])[nan] == ours_nan).all()
        assert_bits(c["x"][~nan], theirs[~nan], "the other values are tf.cast's")
    result = tfckpt.verify_with_tf(out, reference=source)
    assert result["mismatches"] == []
    assert result["cast_differences"] == (
        [
            {
                "tensor": "x",
                "cast": f"{src} -> {dst}",
                "subnormals_tf_flushes": 0,
                "nans_other_bits": other,
            }
        ]
        if other
        else []
    )
    # float32 payloads reach float16 and float64 in tf.cast; float64 -> bfloat16 agrees.
    assert (other > 0) == ((src, dst) != ("float64", "bfloat16"))


@pytest.mark.parametrize("damage", ["subnormal", "nan_sign"])
def test_verify_still_catches_wrong_values_among_documented_ones(tmp_path, damage):
    """A value that is neither tf.cast's nor tfckpt's documented one is a mismatch."""
    x = np.concatenate([with_subnormals("float32"), np.full(3, -np.nan, np.float32)])
    source = str(tmp_path / "src")
    save_v2(source, x=x)
    good = ieee(x, "float64")
    good[np.isnan(x)] = -np.nan
    bad = good.copy()
    if damage == "subnormal":  # TensorFlow gives 0 here, tfckpt the IEEE value: neither
        i = int(np.flatnonzero((np.abs(x) < 2.0**-126) & (x != 0))[0])
        bad[i] = np.nextafter(bad[i], np.inf)
    else:  # tf.cast keeps the sign of float32 -> float64 NaNs, so does tfckpt
        bad[-1] = np.abs(bad[-1])
    tfckpt.save({"x": bad}, str(tmp_path / "bad"))
    result = tfckpt.verify_with_tf(str(tmp_path / "bad"), reference=source)
    assert len(result["mismatches"]) == 1 and "x" in result["mismatches"][0]
    rc, _, stderr = in_process("verify", str(tmp_path / "bad"), "--tf", "--reference", source)
    assert rc == 1 and "differs from tf.cast" in stderr
