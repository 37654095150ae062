"""Keras models, the checkpoints TensorFlow writes of them, and their loading on JAX.

Run as a script, in two roles, each in a process of its own (see tests/interop/test_keras.py):

- ``write OUT``: tf.keras 2.x (the tf-keras package) and Keras 3 on TensorFlow build
  each model, save it (``save_weights`` in TF format, ``tf.train.Checkpoint``), and
  store its inputs and predictions next to the checkpoint; plus a TF1 name-based
  checkpoint with a partitioned variable.
- ``load OUT`` (``load-numpy OUT``): Keras 3 on JAX (on NumPy, a few models), in a process where TensorFlow cannot be imported,
  builds the same architectures, loads every checkpoint with
  ``tfckpt.keras.load_weights``, and stores its predictions, weights and reports.

The same builder functions serve both Keras versions: they take the Keras module.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np


def seq_bn(k, width=8, extra=False):
    layers = [
        k.Input((3,)),
        k.layers.Dense(width, activation="relu", name="d1"),
        k.layers.BatchNormalization(name="bn"),
        k.layers.Dense(2, name="out"),
    ]
    if extra:
        layers.append(k.layers.Dense(2, name="extra"))
    return k.Sequential(layers, name="seq")


def shared(k):
    a, b = k.Input((4,)), k.Input((4,))
    both = k.layers.Dense(5, activation="tanh", name="shared")
    joined = k.layers.Concatenate(name="join")([both(a), both(b)])
    return k.Model([a, b], k.layers.Dense(3, name="head")(joined), name="shared_model")


def cnn(k):
    x = k.Input((8, 8, 2))
    h = k.layers.Conv2D(4, 3, activation="relu", name="conv1")(x)
    h = k.layers.BatchNormalization(name="bn")(h)
    h = k.layers.MaxPooling2D(name="pool")(h)
    h = k.layers.Conv2D(3, 2, padding="same", name="conv2")(h)
    h = k.layers.Flatten(name="flat")(h)
    return k.Model(x, k.layers.Dense(2, name="logits")(h), name="cnn")


def nested(k):
    inner = k.Sequential(
        [
            k.Input((6,)),
            k.layers.Dense(5, activation="relu", name="in1"),
            k.layers.Dense(4, name="in2"),
        ],
        name="inner",
    )
    x = k.Input((3,))
    h = inner(k.layers.Dense(6, name="pre")(x))
    return k.Model(x, k.layers.Dense(2, name="post")(h), name="outer")


def emb_lstm(k):
    x = k.Input((7,), dtype="int32")
    h = k.layers.Embedding(20, 6, name="emb")(x)
    h = k.layers.LSTM(5, name="lstm")(h)
    return k.Model(x, k.layers.Dense(2, name="head")(h), name="emb_lstm")


def subclassed(k):
    """No layer list in the checkpoint: the layers are attributes."""

    class Net(k.Model):
        def __init__(self):
            super().__init__(name="net")
            self.hidden = k.layers.Dense(6, activation="relu", name="hidden")
            self.head = k.layers.Dense(2, name="head")

        def call(self, x):
            return self.head(self.hidden(x))

    model = Net()
    model(np.zeros((1, 3), "float32"))
    return model


def tf1_keras(k):
    """The Keras form of the TF1 graph written by :func:`write_tf1`."""
    return k.Sequential(
        [
            k.Input((3,)),
            k.layers.Dense(8, activation="relu", name="hidden"),
            k.layers.Dense(2, name="out"),
        ],
        name="tf1_model",
    )


MODELS = {
    "seq": seq_bn,
    "shared": shared,
    "cnn": cnn,
    "nested": nested,
    "lstm": emb_lstm,
    "sub": subclassed,
}


def inputs(case: str) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    if case == "shared":
        return [rng.normal(size=(5, 4)).astype("float32") for _ in range(2)]
    if case == "cnn":
        return [rng.normal(size=(5, 8, 8, 2)).astype("float32")]
    if case == "lstm":
        return [rng.integers(0, 20, size=(5, 7)).astype("int32")]
    return [rng.normal(size=(5, 3)).astype("float32")]


# Comparing predictions made by two frameworks (TensorFlow's Eigen/oneDNN kernels against
# XLA or NumPy) from weights already shown equal bit for bit: the same float32 function,
# summed in other orders. Reassociating a sum of n float32 terms moves it by at most
# n·eps·Σ|terms| (Higham, γ_n); each model here sums at most FAN_IN terms a layer (the
# LSTM: 6 inputs + 5 state over 4 gates; the CNN: 3·3·4), over at most DEPTH layers or
# time steps (7 for the LSTM), with activations of the size of the predictions (or 1),
# and the error of one layer carries through the next ones at most scaled by their weights.
FAN_IN = 64
DEPTH = 8
EPS32 = float(np.finfo(np.float32).eps)


def prediction_tolerance(want: np.ndarray) -> float:
    """The absolute tolerance between two float32 evaluations of one model on ``want``'s
    inputs (see above): ~6e-5 at unit scale; wrong weights or wiring differ by ~1e-1."""
    return DEPTH * FAN_IN * EPS32 * max(1.0, float(np.abs(want).max()))


def _feed(xs):
    return xs[0] if len(xs) == 1 else xs


# -- writing (TensorFlow)


def _randomize(model, rng) -> None:
    """Distinct, non-default values for every weight (moving variances positive)."""
    for w in model.weights:
        value = rng.normal(size=tuple(w.shape)).astype("float32") * 0.5
        if "variance" in w.name:
            value = np.abs(value) + 0.5
        w.assign(value)


def _save_case(out: Path, name: str, model, xs, save) -> None:
    d = out / name
    d.mkdir(parents=True)
    save(model, str(d / "ckpt"))
    pred = np.asarray(model(_feed(xs), training=False))
    np.savez(d / "io.npz", pred=pred, **{f"x{i}": x for i, x in enumerate(xs)})


def write(out: Path) -> None:
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras
    import tensorflow as tf
    import tf_keras

    rng = np.random.default_rng(0)

    def k2_save_weights(model, prefix):
        model.save_weights(prefix)  # no .h5 / .keras suffix: the TF format

    def tf_checkpoint(model, prefix):
        tf.train.Checkpoint(model=model).write(prefix)

    for tag, k in (("k2", tf_keras), ("k3", keras)):
        k.utils.set_random_seed(1)
        for case, build in MODELS.items():
            model = build(k)
            xs = inputs(case)
            if case == "seq":  # trained: optimizer slots and moving statistics of its own
                model.compile(optimizer="adam", loss="mse")
                model.fit(xs[0], np.ones((len(xs[0]), 2), "float32"), epochs=2, verbose=0)
            else:
                _randomize(model, rng)
            _save_case(out, f"{case}-{tag}", model, xs, tf_checkpoint)
            if tag == "k2":
                _save_case(out, f"{case}-k2w", model, xs, k2_save_weights)
    write_tf1(out / "tf1")
    write_tf1(out / "tf1-big", big=True)
    tf.train.Checkpoint(v=tf.Variable(np.ones(3, "float32"))).write(str(out / "plain" / "ckpt"))
    load_on_tensorflow(out, keras)


def load_on_tensorflow(out: Path, keras) -> None:
    """Keras 3 on TensorFlow loads what tf.keras 2.x saved, through tfckpt too."""
    import tfckpt.keras

    model = seq_bn(keras)
    report = tfckpt.keras.load_weights(model, str(out / "seq-k2w" / "ckpt"))
    pred = np.asarray(model(inputs("seq")[0], training=False))
    d = out / "results-tf"
    d.mkdir()
    bits = {w.path: np.asarray(w.numpy()).view("u4") for w in model.weights}
    np.savez(d / "seq-k2w.npz", __pred__=pred, **bits)
    (d / "seq-k2w.json").write_text(json.dumps({"report": report.to_dict()}))


def write_tf1(d: Path, big: bool = False) -> None:
    """A name-based checkpoint under ``legacy/``; ``hidden/kernel`` is partitioned.

    With ``big``, ``out/bias`` is beyond float16's range."""
    import tensorflow as tf

    d.mkdir(parents=True)
    xs = inputs("tf1")
    rng = np.random.default_rng(3)
    values = {
        "hidden/kernel": rng.normal(size=(3, 8)),
        "hidden/bias": rng.normal(size=(8,)),
        "out/kernel": rng.normal(size=(8, 2)),
        "out/bias": np.array([1e5, -1e6]) if big else rng.normal(size=(2,)),
    }
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        made = {}
        for name, value in values.items():
            made[name] = tf.compat.v1.get_variable(
                f"legacy/{name}",
                initializer=tf.constant(value.astype("float32")),
                partitioner=(
                    tf.compat.v1.fixed_size_partitioner(2) if name == "hidden/kernel" else None
                ),
            )
        tf.compat.v1.train.get_or_create_global_step()
        hidden = tf.nn.relu(
            tf.matmul(xs[0], tf.concat(list(made["hidden/kernel"]), 0)) + made["hidden/bias"]
        )
        pred = tf.matmul(hidden, made["out/kernel"]) + made["out/bias"]
        sess.run(tf.compat.v1.global_variables_initializer())
        tf.compat.v1.train.Saver().save(sess, str(d / "ckpt"), write_meta_graph=False)
        np.savez(d / "io.npz", pred=sess.run(pred), x0=xs[0])


# -- loading (Keras 3 on JAX, without TensorFlow)


class _NoTensorFlow:
    """Makes ``import tensorflow`` (and tf_keras) fail, as where it is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tf_keras", "tensorboard"):
            raise ImportError(f"{name} is not importable in this process")
        return None


def _jobs():
    """``(result name, checkpoint dir, builder, load_weights kwargs, dtype policy)``."""
    for case, build in MODELS.items():
        for tag in ("k2", "k2w", "k3"):
            yield f"{case}-{tag}", f"{case}-{tag}", build, {}, None
    yield "tf1", "tf1", tf1_keras, {"assignment_map": {"legacy/": ""}}, None
    tf1_map = {"assignment_map": {"legacy/": ""}}
    yield "overflow", "tf1-big", tf1_keras, tf1_map, "float16"
    yield "overflow-clip", "tf1-big", tf1_keras, {**tf1_map, "overflow": "clip"}, "float16"
    yield "no-model", "plain", seq_bn, {}, None
    yield "tf1-no-map", "tf1", tf1_keras, {}, None
    by_layer = {"layer_with_weights-0/": "d1/", "layer_with_weights-1/": "bn/"}
    yield "by-name", "seq-k2w", seq_bn, {"assignment_map": {**by_layer, "l.*-2/": "out/"}}, None
    yield "by-name-clash", "seq-k2w", seq_bn, {"assignment_map": {r"l\w+-\d/": "d1/"}}, None
    for policy in ("float16", "bfloat16", "mixed_float16"):
        yield policy, "seq-k2w", seq_bn, {}, policy
    yield "missing", "seq-k2w", lambda k: seq_bn(k, extra=True), {}, None
    yield (
        "missing-allowed",
        "seq-k2w",
        lambda k: seq_bn(k, extra=True),
        {"allow_missing": True},
        None,
    )
    yield "mismatch", "seq-k3", lambda k: seq_bn(k, width=9), {}, None
    yield "mismatch-skipped", "seq-k3", lambda k: seq_bn(k, width=9), {"skip_mismatch": True}, None


NUMPY_JOBS = ("seq-k2w", "nested-k2", "lstm-k3")  # a few, on Keras's NumPy backend too


def load(out: Path, backend: str = "jax") -> None:
    sys.meta_path.insert(0, _NoTensorFlow())
    os.environ["KERAS_BACKEND"] = backend
    import keras

    import tfckpt.keras

    results = out / ("results" if backend == "jax" else f"results-{backend}")
    results.mkdir()
    for name, source, build, kwargs, policy in _jobs():
        if backend != "jax" and name not in NUMPY_JOBS:
            continue
        keras.config.set_dtype_policy(policy or "float32")
        model = build(keras)
        keras.config.set_dtype_policy("float32")
        before = {w.path: np.array(w.numpy()) for w in model.weights}
        record: dict = {"dtypes": {w.path: str(w.dtype) for w in model.weights}}
        try:
            report = tfckpt.keras.load_weights(model, str(out / source / "ckpt"), **kwargs)
            record["report"] = report.to_dict()
        except Exception as e:  # recorded for the test to judge
            record["error"] = {
                "type": type(e).__name__,
                "message": str(e),
                "traceback": traceback.format_exc(),
            }
        after = {w.path: np.array(w.numpy()) for w in model.weights}
        record["unchanged"] = sorted(p for p in after if after[p].tobytes() == before[p].tobytes())
        pred = np.zeros(0)
        if name == source:  # a checkpoint's own model: its predictions are compared
            io = np.load(out / source / "io.npz")
            xs = [io[f"x{i}"] for i in range(len(io.files) - 1)]
            pred = keras.ops.convert_to_numpy(model(_feed(xs), training=False))
        bits = {p: a.view(f"u{a.dtype.itemsize}") for p, a in after.items()}  # bfloat16 too
        np.savez(results / f"{name}.npz", __pred__=pred.astype("float32"), **bits)
        (results / f"{name}.json").write_text(json.dumps(record))
    summary = {
        "backend": keras.backend.backend(),
        "tensorflow_imported": sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow"),
    }
    (results / "summary.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    role, where = sys.argv[1], Path(sys.argv[2])
    {"write": write, "load": load, "load-numpy": lambda d: load(d, "numpy")}[role](where)
