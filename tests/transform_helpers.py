"""Shared by test_transform_tf.py and test_transform_cli.py: small checkpoints written by real
TensorFlow for the transform engine, and the checks both suites make on the results.

Every writer here takes an existing directory and writes with TensorFlow itself (graph-mode
``Saver``, ``tf.train.Checkpoint`` or ``tf.raw_ops.SaveV2``); tfckpt only ever reads them.
Only imported after ``conftest.py`` has quietened TensorFlow's logging.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import ml_dtypes
import numpy as np
import tensorflow as tf

FLOATS = ("float16", "bfloat16", "float32", "float64")
NP_FLOAT = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}
BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}
F32_TINY = 2.0**-126  # float32's smallest normal: TF's CPU kernels flush anything below it


# ---------------------------------------------------------------- files


def checkpoint_files(prefix) -> list[Path]:
    p = Path(prefix)
    return sorted([*p.parent.glob(p.name + ".data-*-of-*"), *p.parent.glob(p.name + ".index")])


def digests(*roots) -> dict[str, str]:
    """sha256 of every file under the given directories (or of the given files)."""
    out = {}
    for root in map(Path, roots):
        files = sorted(f for f in root.rglob("*") if f.is_file()) if root.is_dir() else [root]
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def listing(directory) -> list[str]:
    """Every file and directory under ``directory``, relative, sorted."""
    d = Path(directory)
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


# ---------------------------------------------------------------- comparing values


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(BITS[a.dtype.itemsize])


def isnan(a: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.isnan(a.astype(np.float64))


def signbit(a: np.ndarray) -> np.ndarray:
    return (bits(a) >> (8 * a.dtype.itemsize - 1)).astype(bool)


def float_mismatches(got: np.ndarray, want: np.ndarray, source: np.ndarray) -> list[str]:
    """Where a cast result ``got`` differs from ``want`` (TF's ``tf.cast`` of ``source``).

    Non-NaN elements must be bit-identical. NaN payloads are not compared (TensorFlow itself
    is inconsistent about them), but a NaN must stay NaN with the source's sign bit.
    """
    assert got.dtype == want.dtype and got.shape == want.shape == source.shape, (
        got.dtype,
        want.dtype,
        got.shape,
        want.shape,
        source.shape,
    )
    g, w, s = got.reshape(-1), want.reshape(-1), source.reshape(-1)
    out = []
    gn, wn, sn = isnan(g), isnan(w), isnan(s)
    for i in np.nonzero(gn != wn)[0][:10]:
        out.append(f"[{i}] {s[i]!r} -> {g[i]!r}, TF gives {w[i]!r}")
    both = ~gn & ~wn
    for i in np.nonzero(both & (bits(g) != bits(w)))[0][:10]:
        out.append(
            f"[{i}] {s[i]!r} -> {g[i]!r} (0x{int(bits(g)[i]):x}), TF gives {w[i]!r} "
            f"(0x{int(bits(w)[i]):x})"
        )
    for i in np.nonzero(gn & sn & (signbit(g) != signbit(s)))[0][:10]:
        out.append(f"[{i}] NaN 0x{int(bits(s)[i]):x} -> 0x{int(bits(g)[i]):x}: sign bit changed")
    return out


def tf_reader_values(prefix) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint as TensorFlow's own reader returns it (no object graph)."""
    reader = tf.train.load_checkpoint(str(prefix))
    out = {}
    for name in reader.get_variable_to_shape_map():
        if name == "_CHECKPOINTABLE_OBJECT_GRAPH":
            continue
        v = reader.get_tensor(name)
        out[name] = np.array(v, dtype=object) if isinstance(v, bytes) else np.asarray(v)
    return out


def tf_dtypes(prefix) -> dict[str, str]:
    return {
        k: v.name
        for k, v in tf.train.load_checkpoint(str(prefix)).get_variable_to_dtype_map().items()
    }


def tf_object_graph(prefix):
    """The TrackableObjectGraph, parsed by TensorFlow's own proto class."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    raw = tf.train.load_checkpoint(str(prefix)).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")
    return trackable_object_graph_pb2.TrackableObjectGraph.FromString(raw)


# ---------------------------------------------------------------- TF1 (graph mode)


def tf1_save(prefix, values: dict[str, np.ndarray], trainable=()) -> str:
    """A graph of one variable per value, saved by a plain ``tf.compat.v1.train.Saver()``."""
    with tf.Graph().as_default():
        for name, value in values.items():
            tf.compat.v1.get_variable(name, initializer=value, trainable=name in trainable)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            out = saver.save(sess, str(prefix), write_meta_graph=False)
    assert out == str(prefix)
    return out


def tf1_restore(prefix, specs: dict[str, tuple]) -> dict[str, np.ndarray]:
    """Build a graph of exactly the variables ``{name: (tf dtype, shape)}`` (zero-initialised),
    restore them with a plain ``Saver()`` (which fails if the checkpoint lacks any of them, or
    holds one with another dtype or shape) and return their values."""
    with tf.Graph().as_default():
        variables = {
            name: tf.compat.v1.get_variable(
                name, shape=shape, dtype=dtype, initializer=tf.compat.v1.zeros_initializer()
            )
            for name, (dtype, shape) in specs.items()
        }
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, str(prefix))
            return {k: np.asarray(v) for k, v in sess.run(variables).items()}


def write_tf1_float32(d: Path) -> tuple[str, dict[str, np.ndarray]]:
    """TF1 float32 model with an int64 global_step."""
    rng = np.random.default_rng(11)
    values = {
        "conv/weights": rng.standard_normal((3, 3, 2, 8)).astype(np.float32),
        "conv/biases": rng.standard_normal(8).astype(np.float32) * np.float32(1e-3),
        "dense/kernel": rng.standard_normal((72, 10)).astype(np.float32) * np.float32(30),
        "dense/bias": np.linspace(-1, 1, 10, dtype=np.float32),
        "global_step": np.array(1234, dtype=np.int64),
    }
    # Ties, a value that rounds to float16's max, a subnormal and a -0.0 in the bias.
    values["dense/bias"][:5] = [1 + 2**-11, 1 + 3 * 2**-11, 65519.0, 3 * 2**-25, -0.0]
    prefix = tf1_save(d / "model.ckpt-1234", values, trainable=[k for k in values if "/" in k])
    return prefix, values


SIMPLE_CONV = {
    "simple-conv1/weights": (3, 3, 3, 16),
    "simple-conv1/biases": (16,),
    "simple-conv1/BatchNorm/beta": (16,),
    "simple-conv1/BatchNorm/moving_mean": (16,),
    "simple-conv1/BatchNorm/moving_variance": (16,),
    "simple-conv1/weights/Adam": (3, 3, 3, 16),
    "simple-conv2/weights": (3, 3, 16, 4),
    "simple-conv2/biases": (4,),
}


def write_tf1_simple_conv(d: Path) -> tuple[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(12)
    values = {k: rng.standard_normal(s).astype(np.float32) for k, s in SIMPLE_CONV.items()}
    values["global_step"] = np.array(9, dtype=np.int64)
    return tf1_save(d / "pretrained.ckpt", values), values


def write_tf1_merge_sources(d: Path) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    """Three TF1 checkpoints: A and B share no names; C shares ``enc/kernel`` with A."""
    rng = np.random.default_rng(13)
    sets = {
        "a": {
            "enc/kernel": rng.standard_normal((4, 3)).astype(np.float32),
            "enc/bias": rng.standard_normal(3).astype(np.float32),
            "global_step": np.array(100, dtype=np.int64),
        },
        "b": {
            "dec/kernel": rng.standard_normal((3, 5)).astype(np.float64),
            "dec/bias": rng.standard_normal(5).astype(np.float16),
        },
        "c": {
            "enc/kernel": rng.standard_normal((4, 3)).astype(np.float32),
            "head/w": np.arange(6, dtype=np.int32).reshape(2, 3),
        },
    }
    out = {}
    for name, values in sets.items():
        (d / name).mkdir()
        out[name] = (tf1_save(d / name / "model.ckpt", values), values)
    return out


def specs_of(values: dict[str, np.ndarray], dtype=None) -> dict[str, tuple]:
    """``tf1_restore`` specs for variables like ``values`` (floats as ``dtype`` if given)."""
    out = {}
    for k, v in values.items():
        dt = tf.as_dtype(v.dtype)
        out[k] = (tf.as_dtype(dtype) if dtype is not None and dt.is_floating else dt, v.shape)
    return out


# ---------------------------------------------------------------- TF2


def write_tf2_pair(d: Path) -> tuple[str, str, np.ndarray, np.ndarray]:
    """``tf.train.Checkpoint(a=va).save(...)`` and ``tf.train.Checkpoint(b=vb).save(...)``."""
    rng = np.random.default_rng(14)
    va = rng.standard_normal((5, 4)).astype(np.float32)
    vb = rng.integers(-9, 9, 7).astype(np.int64)
    pa = tf.train.Checkpoint(a=tf.Variable(va)).save(str(d / "a" / "ckpt"))
    ckpt_b = tf.train.Checkpoint(b=tf.Variable(vb))
    ckpt_b.save(str(d / "b" / "ckpt"))
    pb = ckpt_b.save(str(d / "b" / "ckpt"))  # save_counter 2 here, 1 in the first
    return pa, pb, va, vb


SHARDED_SHAPES = {"big": (600,), "matrix": (30, 20), "w64": (150,)}


def write_tf2_sharded(d: Path) -> tuple[str, dict[str, np.ndarray]]:
    """TF2 ``Checkpoint.save`` with ``MaxShardSizePolicy``: several shards, sliced tensors."""
    rng = np.random.default_rng(15)
    values = {
        "big": rng.standard_normal(600).astype(np.float32),
        "matrix": rng.standard_normal((30, 20)).astype(np.float32),
        "w64": rng.standard_normal(150).astype(np.float64),
        "steps": np.arange(10, dtype=np.int64),
        "small": rng.standard_normal(4).astype(np.float32),
    }
    ckpt = tf.train.Checkpoint(**{k: tf.Variable(v) for k, v in values.items()})
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=1000)
    prefix = ckpt.save(
        str(d / "ckpt"), options=tf.train.CheckpointOptions(experimental_sharding_callback=policy)
    )
    return prefix, values


def keras_like(model, dtype: str):
    """A new, uncompiled model of ``model``'s architecture with every layer in ``dtype``."""
    config = copy.deepcopy(model.get_config())
    for layer in config["layers"]:
        if layer["class_name"] != "InputLayer":
            layer["config"]["dtype"] = dtype
    return type(model).from_config(config)


# ---------------------------------------------------------------- values for casting


def _midpoints(target: str, n: int, rng) -> np.ndarray:
    """Exact midpoints between neighbouring ``target`` values (round-to-even ties), as float64."""
    t = NP_FLOAT[target]
    a = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 14, n))).astype(t)
    a = a[np.isfinite(a.astype(np.float64))]
    step = bits(a) + 1
    b = step.view(t)
    mid = (a.astype(np.float64) + b.astype(np.float64)) / 2
    return mid[np.isfinite(mid)]


def cast_edge_values(source: str, rng, *, f32_subnormals: bool) -> np.ndarray:
    """Values of ``source`` with sharp edges for casts among float16/bfloat16/float32/float64.

    With ``f32_subnormals=False``: NaNs (both signs, payloads), ±inf, ±0, maxima and their
    neighbours, values overflowing float16 and bfloat16, subnormals of every type whose
    subnormals lie above float32's normal range (float16), exact rounding ties and their
    neighbours, double-rounding traps for float64 -> float32 -> float16/bfloat16, and random
    bit patterns -- but nothing of magnitude below float32's smallest normal except zero.
    With ``f32_subnormals=True``: only nonzero values below float32's smallest normal.
    """
    dt = NP_FLOAT[source]
    ub = BITS[dt.itemsize]
    if f32_subnormals:
        fine = np.array(
            [
                2.0**-127,
                -(2.0**-127),
                2.0**-133,
                2.0**-149,
                -(2.0**-149),
                1e-40,
                -1e-40,
                2.0**-126 * (1 - 2**-20),
                2.0**-150,
                3 * 2.0**-151,
                2.0**-140 + 2.0**-160,
                1e-300,
                -1e-310,
            ]
        )
        extra = rng.uniform(-F32_TINY, F32_TINY, 400)
        vals = np.concatenate([fine, extra]).astype(dt)
        return vals[(vals.astype(np.float64) != 0)]
    vals = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        np.inf,
        -np.inf,
        0.5,
        1 / 3,
        -2 / 3,
        np.pi,
        1e-3,
        65504.0,
        -65504.0,
        65519.0,
        65519.996,
        65520.0,
        -65520.0,
        65536.0,
        70000.0,
        -1e5,
        3.3895313892515355e38,
        3.3961775292304e38,
        3.4028234663852886e38,
        -3.4e38,
        1e39,
        -1e300,
        1e300,
        2.0**-24,
        2.0**-25,
        3 * 2.0**-25,
        2.0**-14,
        2.0**-15,
        6.1e-5,
        2.0**-126,
        -(2.0**-126),
        2.0**-125,
        1 + 2.0**-11,
        1 + 3 * 2.0**-11,
        1 + 2.0**-8,
        1 + 3 * 2.0**-8,
        1 + 2.0**-24,
        1 + 3 * 2.0**-24,
        2049.0,
        2051.0,
        257.0,
        259.0,
        # float64 values just off a narrow tie: rounding once would go the other way.
        1 + 2.0**-11 + 2.0**-40,
        1 + 2.0**-11 - 2.0**-40,
        1 + 2.0**-8 + 2.0**-40,
        -(1 + 2.0**-8 + 2.0**-45),
        2049.0 + 2.0**-30,
    ]
    parts = [np.array(vals)]
    for target in FLOATS:
        mids = _midpoints(target, 200, rng)
        parts += [mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)]
    with np.errstate(over="ignore", invalid="ignore"):
        arr = np.concatenate(parts).astype(dt)
    # Extremes of the type itself, then NaNs with both signs and a payload.
    fi = ml_dtypes.finfo(dt)
    ext = np.array([fi.max, fi.min, fi.tiny, -fi.tiny], dtype=dt)
    if dt.itemsize >= 4:
        ext = ext[np.abs(ext.astype(np.float64)) >= F32_TINY]
    else:
        ext = np.concatenate(
            [ext, np.array([fi.smallest_subnormal, -fi.smallest_subnormal], dtype=dt)]
        )
    nan = int(bits(np.array([np.nan], dtype=dt))[0])
    inf = int(bits(np.array([np.inf], dtype=dt))[0])
    top = 1 << (8 * dt.itemsize - 1)
    nans = (
        np.array([nan, nan | 1, nan | top, nan | top | 5, inf | 1, inf | top | 3], dtype=np.uint64)
        .astype(ub)
        .view(dt)
    )  # quiet, payloads, -NaN, signalling
    rand = rng.integers(0, 1 << min(63, 8 * dt.itemsize), 3000, dtype=np.uint64)
    if dt.itemsize == 8:
        rand |= rng.integers(0, 2, 3000, dtype=np.uint64) << np.uint64(63)
    rand = rand.astype(ub).view(dt)
    arr = np.concatenate([arr, ext, nans, rand])
    with np.errstate(invalid="ignore"):
        mag = np.abs(arr.astype(np.float64))
    if source != "float16":
        arr = arr[~((mag > 0) & (mag < F32_TINY))]
    return arr


def save_v2(prefix, tensors: dict[str, np.ndarray]) -> str:
    """Whole tensors written by TensorFlow's SaveV2 op."""
    names = list(tensors)
    tf.raw_ops.SaveV2(
        prefix=str(prefix),
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(tensors[n]) for n in names],
    )
    return str(prefix)
