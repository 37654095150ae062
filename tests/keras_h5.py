"""Keras 2 HDF5 files written by tf.keras, loaded into Keras 3 on JAX through tfckpt.

Run as a script, in two roles, each in a process of its own (see
tests/interop/test_keras_h5.py):

- ``write OUT``: tf.keras 2.x builds each model of ``keras_checkpoints.MODELS`` (the
  same builders the TF-format tests use), trains or randomizes it, and saves it with
  ``model.save_weights("w.h5")`` and, where Keras 2 can, ``model.save("m.h5")`` (with
  the optimizer's state), beside its inputs and predictions.
- ``load OUT``: Keras 3 on JAX, in a process where TensorFlow cannot be imported,
  builds the same architectures and loads each file with ``tfckpt.keras.load_weights``;
  it stores the predictions, every weight's bits and the report.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import keras_checkpoints as kc
import numpy as np

FILES = ("w.h5", "m.h5")


def write(out: Path) -> None:
    import tf_keras

    rng = np.random.default_rng(0)
    tf_keras.utils.set_random_seed(1)
    for case, build in kc.MODELS.items():
        model = build(tf_keras)
        xs = kc.inputs(case)
        if case == "seq":  # trained: moving statistics and optimizer state of its own
            model.compile(optimizer="adam", loss="mse")
            model.fit(xs[0], np.ones((len(xs[0]), 2), "float32"), epochs=2, verbose=0)
        else:
            kc._randomize(model, rng)
        d = out / case
        d.mkdir(parents=True)
        model.save_weights(str(d / "w.h5"))
        if case != "sub":  # Keras 2 saves no subclassed model whole in HDF5
            model.save(str(d / "m.h5"))
        pred = np.asarray(model(kc._feed(xs), training=False))
        np.savez(d / "io.npz", pred=pred, **{f"x{i}": x for i, x in enumerate(xs)})


def load(out: Path) -> None:
    sys.meta_path.insert(0, kc._NoTensorFlow())
    os.environ["KERAS_BACKEND"] = "jax"
    import keras

    import tfckpt.keras

    results = out / "results"
    results.mkdir()
    jobs = [
        (f"{case}-{file[0]}", case, file, build)
        for case, build in kc.MODELS.items()
        for file in FILES
        if (out / case / file).exists()
    ]
    # A layer the file lacks, and a layer of another width: errors, nothing assigned.
    jobs.append(("extra-layer", "seq", "w.h5", lambda k: kc.seq_bn(k, extra=True)))
    jobs.append(("wider", "seq", "m.h5", lambda k: kc.seq_bn(k, width=9)))
    for name, case, file, build in jobs:
        path = out / case / file
        model = build(keras)
        before = {w.path: np.array(w.numpy()) for w in model.weights}
        record: dict = {}
        try:
            record["report"] = tfckpt.keras.load_weights(model, str(path)).to_dict()
        except Exception as e:  # recorded for the test to judge
            record["error"] = {"message": str(e), "traceback": traceback.format_exc()}
        io = np.load(out / case / "io.npz")
        xs = [io[f"x{i}"] for i in range(len(io.files) - 1)]
        pred = np.zeros(0)
        if "error" not in record:
            pred = keras.ops.convert_to_numpy(model(kc._feed(xs), training=False))
        bits = {w.path: np.array(w.numpy()) for w in model.weights}
        record["unchanged"] = sorted(p for p in bits if before[p].tobytes() == bits[p].tobytes())
        np.savez(results / f"{name}.npz", __pred__=pred.astype("float32"), **bits)
        (results / f"{name}.json").write_text(json.dumps(record))
    imported = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "tf_keras"))
    (results / "summary.json").write_text(json.dumps({"tensorflow_imported": imported}))


if __name__ == "__main__":
    role, where = sys.argv[1], Path(sys.argv[2])
    {"write": write, "load": load}[role](where)
