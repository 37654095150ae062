"""V1 (tensor-slice) checkpoints, saved by TensorFlow's ``SaverDef.V1`` Saver from TF1 graphs.

Each ``build_*_graph`` makes the variables of one graph (every dtype a V1 file holds,
variables on two devices, a model of a few hundred variables); :func:`save_v1` saves one
in a fresh graph and session and returns the path TensorFlow returned and the values it
saved. Only imported after ``conftest.py`` has quietened TensorFlow's logging.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

V1 = tf.compat.v1.train.SaverDef.V1
TWO_CPUS = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
SLIM_VARIABLES = 320


def _var(name, value, **kw):
    return tf.compat.v1.get_variable(name, initializer=value, **kw)


def _parted(name, shape, dtype, parts, axis=0, seed=0):
    if dtype.is_floating:
        init = tf.compat.v1.random_normal_initializer(seed=seed)
    else:
        init = tf.compat.v1.random_uniform_initializer(-1000, 1000, seed=seed)
    return tf.compat.v1.get_variable(
        name,
        shape=shape,
        dtype=dtype,
        initializer=init,
        partitioner=tf.compat.v1.fixed_size_partitioner(parts, axis=axis),
    )


def build_dtypes_graph():
    """Every dtype a V1 file holds, scalars, and partitioned variables."""
    rng = np.random.default_rng(11)
    f16 = np.array([0.0, -0.0, 1.5, np.inf, -np.inf, 65504, 6e-8, np.nan], dtype=np.float16)
    out = {
        "f32": _var("f32", rng.standard_normal((3, 4)).astype(np.float32)),
        "f64": _var("f64", rng.standard_normal(5)),
        "f16": _var("f16", f16),
        "c64": _var("c64", (rng.standard_normal((2, 2)) + 1j).astype(np.complex64)),
        "c128": _var("c128", rng.standard_normal(3) * (1 - 2j)),
        "i8": _var("i8", np.array([-128, 127, 0, -1], dtype=np.int8)),
        "i16": _var("i16", np.array([-32768, 32767, 5], dtype=np.int16)),
        "i32": _var("i32", np.array([-(2**31), 2**31 - 1], dtype=np.int32)),
        "i64": _var("i64", np.array([-(2**63), 2**63 - 1, 7], dtype=np.int64)),
        "u8": _var("u8", np.array([0, 255, 128], dtype=np.uint8)),
        "flags": _var("flags", np.array([True, False, True])),
        "text": _var("text", np.array([b"", b"\x00\xff\xfe", b"hello", "\u00e9".encode()])),
        "scalar/step": _var("scalar/step", np.int64(1234)),
        "scalar/lr": _var("scalar/lr", np.float32(0.125)),
        "scalar/name": _var("scalar/name", np.array(b"")),
        "part/emb": _parted("part/emb", [10, 4], tf.float32, 3, seed=1),
        "part/wide": _parted("part/wide", [5, 7], tf.int64, 2, axis=1, seed=2),
        "part/half": _parted("part/half", [9], tf.float16, 3, seed=3),
    }
    return out


def build_sharded_graph():
    """Variables on two CPU devices, one of them partitioned, for ``sharded=True``."""
    rng = np.random.default_rng(12)
    out = {}
    with tf.device("/cpu:0"):
        out["dev0/w"] = _var("dev0/w", rng.standard_normal((6, 3)).astype(np.float32))
        out["dev0/words"] = _var("dev0/words", np.array([b"a", b"", b"\x80"]))
    with tf.device("/cpu:1"):
        out["dev1/b"] = _var("dev1/b", rng.standard_normal(4).astype(np.float16))
        out["dev1/emb"] = _parted("dev1/emb", [8, 2], tf.float32, 2, seed=4)
    return out


def build_slim_graph():
    """A TF-slim-like model: a few hundred variables, larger than several table blocks."""
    rng = np.random.default_rng(13)
    out = {}
    for i in range(SLIM_VARIABLES // 2):
        scope = f"vgg_16/conv{i // 10}/conv{i // 10}_{i % 10}"
        out[f"{scope}/weights"] = _var(
            f"{scope}/weights", rng.standard_normal((3, 3, 8, 16)).astype(np.float32)
        )
        out[f"{scope}/biases"] = _var(f"{scope}/biases", rng.standard_normal(16).astype(np.float32))
    return out


def save_v1(build, path: str, *, sharded=False, **save):
    """Save the graph ``build()`` makes: (the path TensorFlow returned, name -> value saved)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.Graph().as_default():
        variables = build()
        saver = tf.compat.v1.train.Saver(write_version=V1, sharded=sharded)
        with tf.compat.v1.Session(config=TWO_CPUS) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            names = list(variables)
            values = sess.run([tf.convert_to_tensor(variables[n]) for n in names])
            saved = saver.save(sess, path, **save)
    return saved, dict(zip(names, map(as_array, values)))


def as_array(value) -> np.ndarray:
    """What a session returns, as an array (a string scalar comes as bytes)."""
    return np.array(value, dtype=object) if isinstance(value, bytes) else np.asarray(value)
