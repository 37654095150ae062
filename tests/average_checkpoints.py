"""Training runs written by real TensorFlow, for the tests of ``tfckpt average``.

Each writer trains a small model for a few steps, saving after every step through
TensorFlow's own bookkeeping (a TF1 ``Saver`` with ``max_to_keep``, a TF2
``CheckpointManager``), and returns what a test needs to check an average
independently: the directory, and the values TensorFlow held at each save.

The graphs are rebuilt by :func:`tf1_graph` / :func:`keras_model` so a test can
restore an output into the same model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

TF1_STEPS = 5
TF1_KEEP = 3


def tf1_graph(with_ema: bool = True):
    """The TF1 model, in the current graph: returns (variables by name, train op, ema)."""
    v1 = tf.compat.v1
    init = v1.random_normal_initializer(seed=1)
    with v1.variable_scope("dense"):
        kernel = v1.get_variable("kernel", [6, 5], initializer=init)
        bias = v1.get_variable("bias", [5], initializer=v1.zeros_initializer())
    emb = v1.get_variable(
        "emb", [10, 4], initializer=init, partitioner=v1.fixed_size_partitioner(2)
    )
    half = v1.get_variable("half", [7], dtype=tf.float16, initializer=v1.ones_initializer())
    cplx = v1.get_variable("cplx", initializer=np.array([1 + 2j, -3j, 0.5], np.complex64))
    step = v1.train.get_or_create_global_step()
    tag = v1.get_variable("tag", initializer=b"start", trainable=False)
    rng = np.random.default_rng(7)
    updates = [
        kernel.assign_add(tf.constant(rng.normal(size=(6, 5)).astype(np.float32) / 3)),
        bias.assign_add(tf.fill([5], 0.1)),
        half.assign(half * tf.constant(1.1, tf.float16) + tf.constant(1e-3, tf.float16)),
        cplx.assign(cplx * tf.constant(1.5 - 0.5j, tf.complex64)),
    ]
    for part in emb:
        updates.append(part.assign_add(tf.ones_like(part) * 0.37))
    ema = None
    with tf.control_dependencies(updates):
        new_step = step.assign_add(1)
    train = tag.assign(tf.strings.join([b"step-", tf.strings.as_string(new_step)]))
    if with_ema:
        ema = v1.train.ExponentialMovingAverage(0.5)
        with tf.control_dependencies([train]):
            train = ema.apply([kernel, bias])
    variables = {
        "dense/kernel": kernel,
        "dense/bias": bias,
        "emb": emb,
        "half": half,
        "cplx": cplx,
        "global_step": step,
        "tag": tag,
    }
    return variables, train, ema


def write_tf1_run(directory: Path) -> dict:
    """A TF1 Saver(max_to_keep=3) saving after each of 5 steps; the EMA shadows too.

    Returns ``{"dir", "prefixes" (all saves, oldest first), "values": [per save:
    {name: value}], "ema": [per save: {name: shadow value}]}``.
    """
    v1 = tf.compat.v1
    prefixes, values, shadows = [], [], []
    with tf.Graph().as_default():
        variables, train, ema = tf1_graph()
        saver = v1.train.Saver(max_to_keep=TF1_KEEP)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            for _ in range(TF1_STEPS):
                sess.run(train)
                got = sess.run({n: v for n, v in variables.items() if n != "emb"})
                got["emb"] = np.concatenate(sess.run(list(variables["emb"])))
                values.append(got)
                shadows.append(
                    {n: sess.run(ema.average(variables[n])) for n in ("dense/kernel", "dense/bias")}
                )
                prefixes.append(
                    saver.save(sess, str(directory / "model.ckpt"), global_step=got["global_step"])
                )
    return {"dir": str(directory), "prefixes": prefixes, "values": values, "ema": shadows}


def keras_model(use_ema: bool = True, compile: bool = True):
    """The Keras model and its optimizer (not attached when not ``compile``)."""
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
    )
    opt = keras.optimizers.Adam(0.05, use_ema=use_ema, ema_momentum=0.6)
    if compile:
        model.compile(opt, "mse")
    return model, opt


def write_tf2_run(directory: Path, saves: int = 4, keep: int = 3) -> dict:
    """A Keras 3 model and Adam with an exponential moving average of the weights
    (``use_ema=True``), saved by a ``CheckpointManager(max_to_keep=keep)`` after each of
    ``saves`` epochs.

    Returns ``{"dir", "prefixes", "weights": [per save: model weights],
    "ema": [per save: their moving averages], "iterations": [per save]}``.
    """
    model, opt = keras_model()
    rng = np.random.default_rng(11)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = rng.normal(size=(32, 2)).astype(np.float32)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    manager = tf.train.CheckpointManager(ckpt, str(directory), max_to_keep=keep)
    out: dict = {"dir": str(directory), "prefixes": [], "weights": [], "ema": [], "iterations": []}
    for _ in range(saves):
        for b in range(0, len(x), 8):  # not fit(), which ends by copying the EMA in
            model.train_on_batch(x[b : b + 8], y[b : b + 8])
        out["weights"].append([np.array(w) for w in model.get_weights()])
        out["ema"].append([v.numpy() for v in opt._model_variables_moving_average])
        out["iterations"].append(int(opt.iterations.numpy()))
        out["prefixes"].append(manager.save())
    return out
