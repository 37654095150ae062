"""The files the documentation's examples run on (tests/docs/test_examples.py).

A page names its setup in a comment, ``<!-- examples: setup=NAME -->``; its examples then
run in a fresh copy of that setup's directory. The setups:

- ``none``: an empty directory (the page makes what it uses, as the Getting started page
  does with TensorFlow);
- ``demo``: ``train/model.ckpt-7``, the demo's float32 TF1-style training checkpoint
  (``python -m tfckpt.demo``'s tensors: two conv layers with batch norm, a dense head,
  Adam slots, ``global_step``), written by tfckpt (byte for byte what SaveV2 writes);
- ``tf``: the demo's files plus checkpoints TensorFlow writes in one process of its own
  (``python tests/docs_setups.py tf DIR``), listed in :func:`write_tf`.

Run as a script it writes the ``tf`` setup into DIR; only that process imports TensorFlow.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SETUPS = ("none", "demo", "tf")


def write_demo(root: Path) -> None:
    """``train/model.ckpt-7`` with its state file, as ``make demo`` writes it."""
    import tfckpt
    from tfckpt.demo import example_tensors

    tfckpt.save(example_tensors(), str(root / "train" / "model.ckpt-7"))
    (root / "train" / "checkpoint").write_text(
        'model_checkpoint_path: "model.ckpt-7"\nall_model_checkpoint_paths: "model.ckpt-7"\n'
    )


def write_tf(root: Path) -> None:
    """Checkpoints written by TensorFlow (and Keras 3 on TensorFlow):

    - ``A/model.ckpt``, ``B/model.ckpt``: TF1 ``Saver`` saves of scopes ``a1``, ``a2`` and
      ``b1``, ``b2`` (each ``w`` [4, 3] and ``b`` [3], float32);
    - ``run/model.ckpt-100``, ``-200``, ``-300``: a TF1 ``Saver(max_to_keep=5)`` run of
      ``dense/kernel`` [8, 4], ``dense/bias`` [4] and ``global_step``, its state file;
    - ``tf1/model.ckpt``: the same variables once more, for graft, with its graph file
      ``tf1/model.ckpt.meta``;
    - ``tf2/template-1``: ``tf.train.Checkpoint(model=Dense)`` of a ``tf.Module`` with a
      ``kernel`` [8, 4] and a ``bias`` [4], freshly initialised (the graft template);
    - ``v1/model.ckpt``: a ``Saver(write_version=V1)`` save of ``conv/weights`` and ``step``;
    - ``keras/ckpt-1``: a Keras 3 model (``Input(8)``, ``Dense(4, name="hidden")``,
      ``Dense(2, name="out")``) trained one step with Adam and saved with
      ``tf.train.Checkpoint(model=model).save``; its predictions on ``ones((1, 8))`` in
      ``keras/expected.npy``; the same model as Keras HDF5 in ``keras/model.h5``.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import numpy as np
    import tensorflow as tf

    v1 = tf.compat.v1
    rng = np.random.default_rng(7)

    def tf1_save(prefix: Path, values: dict, *, steps=(None,), version=None, meta=False) -> None:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        with tf.Graph().as_default():
            variables = {
                name: v1.get_variable(name, initializer=value) for name, value in values.items()
            }
            step = variables.get("global_step")
            saver_kw = {"max_to_keep": 5}
            if version is not None:
                saver_kw["write_version"] = version
            saver = v1.train.Saver(**saver_kw)
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                for n in steps:
                    if n is not None and step is not None:
                        sess.run(step.assign(n))
                        for var in variables.values():
                            if var.dtype.base_dtype == tf.float32:
                                sess.run(var.assign(var * 0.5 + 0.1))
                    saver.save(sess, str(prefix), global_step=n, write_meta_graph=meta)

    def floats(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    tf1_save(
        root / "A" / "model.ckpt",
        {f"a{i}/{n}": floats(*s) for i in (1, 2) for n, s in (("w", (4, 3)), ("b", (3,)))},
    )
    tf1_save(
        root / "B" / "model.ckpt",
        {f"b{i}/{n}": floats(*s) for i in (1, 2) for n, s in (("w", (4, 3)), ("b", (3,)))},
    )
    dense = {"dense/kernel": floats(8, 4), "dense/bias": floats(4)}
    tf1_save(
        root / "run" / "model.ckpt", {**dense, "global_step": np.int64(0)}, steps=(100, 200, 300)
    )
    tf1_save(root / "tf1" / "model.ckpt", dense, meta=True)
    tf1_save(
        root / "v1" / "model.ckpt",
        {"conv/weights": floats(3, 3, 1, 2), "step": np.int64(5)},
        version=tf.compat.v1.train.SaverDef.V1,
    )

    class Dense(tf.Module):
        def __init__(self):
            self.kernel = tf.Variable(tf.zeros([8, 4]))
            self.bias = tf.Variable(tf.zeros([4]))

    tf.train.Checkpoint(model=Dense()).save(str(root / "tf2" / "template"))

    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(4, name="hidden"), keras.layers.Dense(2, name="out")]
    )
    model.compile(optimizer="adam", loss="mse")
    model.fit(floats(16, 8), floats(16, 2), epochs=1, verbose=0)
    tf.train.Checkpoint(model=model).save(str(root / "keras" / "ckpt"))
    np.save(root / "keras" / "expected.npy", model.predict(np.ones((1, 8)), verbose=0))
    model.save(str(root / "keras" / "model.h5"))


if __name__ == "__main__":
    if sys.argv[1:2] != ["tf"] or len(sys.argv) != 3:
        sys.exit("usage: docs_setups.py tf DIR")
    # Saved under relative paths, so the state files name their checkpoints relatively and
    # a copy of the directory is a run of its own.
    os.chdir(sys.argv[2])
    write_tf(Path("."))
