"""Sources for the tests of ``tfckpt edit`` written by TensorFlow, and restoring the
edited outputs in TensorFlow: a TF1 ``Saver`` run with Adam slots and ``global_step``, a
TF2 ``tf.train.Checkpoint`` of a tf.keras model with its (slot-variable) Adam optimizer."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
import tf_keras as keras

TF1_EMB = (np.arange(24, dtype=np.float32).reshape(6, 4) - 7) / 7


def write_tf1(directory, emb=TF1_EMB) -> str:
    """A TF1 Saver checkpoint after two Adam steps: ``emb`` [V,4], ``dense/kernel`` [4,3],
    ``dense/bias`` [3], their ``/Adam`` and ``/Adam_1`` slots, the beta powers and
    ``global_step``."""
    g = tf.Graph()
    with g.as_default():
        e = tf.compat.v1.get_variable("emb", initializer=emb)
        k = tf.compat.v1.get_variable(
            "dense/kernel", initializer=np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
        )
        b = tf.compat.v1.get_variable("dense/bias", initializer=np.full(3, 0.25, np.float32))
        step = tf.compat.v1.train.get_or_create_global_step()
        ids = [0, 2, len(emb) - 1]
        loss = tf.reduce_sum((tf.matmul(tf.nn.embedding_lookup(e, ids), k) + b) ** 2)
        train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=step)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            s.run(train)
            s.run(train)
            return saver.save(s, os.path.join(str(directory), "model.ckpt"), global_step=step)


def tf_values(prefix: str) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint as TensorFlow's own reader gives it."""
    r = tf.train.load_checkpoint(prefix)
    return {
        n: np.asarray(r.get_tensor(n))
        for n in r.get_variable_to_shape_map()
        if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }


def tf1_restore(prefix: str, expected: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Restore variables of ``expected``'s names, shapes and dtypes with a TF1 Saver;
    their values after the restore."""
    g = tf.Graph()
    with g.as_default():
        var_list = {
            n: tf.compat.v1.get_variable(
                f"v{i}", shape=v.shape, dtype=tf.as_dtype(v.dtype), use_resource=False
            )
            for i, (n, v) in enumerate(sorted(expected.items()))
        }
        saver = tf.compat.v1.train.Saver(var_list=var_list)
        with tf.compat.v1.Session() as s:
            saver.restore(s, prefix)
            return {n: s.run(v) for n, v in var_list.items()}


def keras_model(vocab: int = 6, classes: int = 3):
    model = keras.Sequential(
        [keras.layers.Embedding(vocab, 4, name="emb"), keras.layers.Dense(classes, name="out")]
    )
    model.build((None, 2))
    return model


def write_tf2(directory) -> str:
    """A TF2 checkpoint of a tf.keras model, a variable ``extra`` and the Adam (legacy,
    slot variables) that trained all of them one step."""
    keras.utils.set_random_seed(1)
    model = keras_model()
    opt = keras.optimizers.legacy.Adam(0.1)
    extra = tf.Variable(np.array([1.0, -2.0], np.float32))
    with tf.GradientTape() as t:
        out = model(np.array([[0, 2], [5, 1]]))
        loss = tf.reduce_sum(out**2) + tf.reduce_sum(extra**2)
    vs = [*model.trainable_variables, extra]
    opt.apply_gradients(zip(t.gradient(loss, vs), vs))
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, extra=extra)
    return ckpt.write(os.path.join(str(directory), "ckpt"))


def tf2_restore(prefix: str, vocab: int = 6, classes: int = 3, extra: bool = False):
    """Restore a model (and optimizer with its slots, ``extra`` if asked) from ``prefix``
    with ``assert_consumed()``; the model, the optimizer."""
    model = keras_model(vocab, classes)
    opt = keras.optimizers.legacy.Adam(0.1)
    opt._create_all_weights(model.trainable_variables)
    objects = dict(model=model, optimizer=opt)
    if extra:
        objects["extra"] = tf.Variable(np.zeros(2, np.float32))
    tf.train.Checkpoint(**objects).read(prefix).assert_consumed()
    return model, opt


KERNEL = "model/layer_with_weights-1/kernel/.ATTRIBUTES/VARIABLE_VALUE"
BIAS = "model/layer_with_weights-1/bias/.ATTRIBUTES/VARIABLE_VALUE"
EMB = "model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE"
ITER = "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE"


def slot_key(key: str, slot: str) -> str:
    return key.replace("/.ATTRIBUTES/", f"/.OPTIMIZER_SLOT/optimizer/{slot}/.ATTRIBUTES/")
