"""Keras models compiled with a metric and fitted, saved in float32 as TensorFlow saves
them, and their float16 twins, which restore what tfckpt made of the float32 files.

Run as a script, each role in a process of its own (see tests/rewrite/test_bookkeeping.py):

- ``write OUT``: per case of :data:`CASES`, a float32 model fitted two steps on
  :data:`SAMPLES` samples (its metrics count them all: more than float16 holds), saved in
  each of the case's formats under ``OUT/CASE/f32/FORMAT``; then its float16 twin (the same
  layers, compiled and fitted one step on a few samples), saved alike under
  ``OUT/CASE/f16/FORMAT``: what TensorFlow writes for a float16 model of that kind.
- ``restore OUT``: per case and each ``OUT/CASE/out/NAME`` (a conversion the test made of
  ``f32/FORMAT``, NAME being FORMAT or FORMAT-SOMETHING), a new twin restores it as that
  format is restored (``Checkpoint.read(...).assert_consumed()``, ``load_weights(...)
  .assert_consumed()``, ``tf.saved_model.load`` of the twin's SavedModel with these
  variables) and is saved back, the same way, under ``OUT/CASE/back/NAME``;
  ``OUT/restored.json`` says, per ``CASE/NAME``, "ok" or the error.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

SAMPLES = 70_000  # > 65504, float16's largest finite value
# case -> (Keras, how its float16 twin is made, optimizer, formats)
CASES = {
    # tf.keras 2 (the tf-keras package), float16 layers, its current Adam.
    "k2-layers": ("tf_keras", "layers", "adam", ("ckpt", "weights", "sm")),
    # tf.keras 2 under the global policy 'float16', a legacy Adam (iter, beta_1, decay...).
    "k2-policy": ("tf_keras", "policy", "legacy-adam", ("ckpt", "weights", "sm")),
    # Keras 3 (tf.keras of this TensorFlow) under the global policy 'float16'.
    "k3-policy": ("keras", "policy", "adam", ("ckpt", "sm")),
}


def _keras(which: str):
    if which == "tf_keras":
        import tf_keras

        return tf_keras
    import tensorflow as tf

    k = tf.keras  # Keras 3 here: TensorFlow's own tf.keras
    assert k.__version__.startswith("3."), k.__version__
    return k


def _set_policy(k, dtype: str) -> None:
    if hasattr(k, "config") and hasattr(k.config, "set_dtype_policy"):  # Keras 3
        k.config.set_dtype_policy(dtype)
    else:
        k.mixed_precision.set_global_policy(dtype)


def _optimizer(k, which: str):
    if which == "legacy-adam":
        return k.optimizers.legacy.Adam(learning_rate=0.01)
    return k.optimizers.Adam(learning_rate=0.01)


def build(case: str, dtype: str):
    """The case's model in ``dtype``, compiled with a metric, not yet fitted."""
    which, how, opt, _ = CASES[case]
    k = _keras(which)
    _set_policy(k, dtype if how == "policy" else "float32")
    layer_dtype = dtype if how == "layers" else None
    model = k.Sequential(
        [
            k.Input((3,)),
            k.layers.Dense(4, activation="relu", name="d1", dtype=layer_dtype),
            k.layers.Dense(2, name="out", dtype=layer_dtype),
        ]
    )
    model.compile(optimizer=_optimizer(k, opt), loss="mse", metrics=["mae"])
    return model


def data(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 3)).astype("float32")
    return x, (x @ np.float32([[1, -1], [0.5, 2], [-2, 0.25]])).astype("float32")


def save(case: str, model, fmt: str, d: Path) -> None:
    import tensorflow as tf

    if fmt == "ckpt":
        tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(d / "ckpt"))
    elif fmt == "weights":
        model.save_weights(str(d / "ckpt"))  # no .h5 suffix: the TF format
    elif CASES[case][0] == "tf_keras":
        model.save(str(d), save_format="tf")
    else:
        tf.saved_model.save(model, str(d))


def twin(case: str):
    """The case's float16 model, fitted a step: its optimizer's variables exist."""
    model = build(case, "float16")
    x, y = data(8)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    return model


def write(out: Path) -> None:
    import tensorflow as tf

    tf.keras.utils.set_random_seed(1)
    x, y = data(SAMPLES)
    for case, (_, _, _, formats) in CASES.items():
        model = build(case, "float32")
        model.fit(x, y, batch_size=SAMPLES // 2, epochs=1, verbose=0)
        for fmt in formats:
            save(case, model, fmt, out / case / "f32" / fmt)
        model16 = twin(case)
        for fmt in formats:
            save(case, model16, fmt, out / case / "f16" / fmt)


def restore_one(case: str, name: str, out: Path) -> None:
    import tensorflow as tf

    fmt = name.split("-")[0]
    given = out / case / "out" / name / "ckpt"
    back = out / case / "back" / name
    if fmt == "sm":
        # The twin's SavedModel, its variables replaced by the conversion.
        sm = out / case / "sm-restored" / name
        shutil.copytree(out / case / "f16" / "sm", sm)
        shutil.rmtree(sm / "variables")
        (sm / "variables").mkdir()
        for f in given.parent.iterdir():
            shutil.copy(f, sm / "variables" / f.name.replace("ckpt", "variables", 1))
        loaded = tf.saved_model.load(str(sm))
        tf.train.Checkpoint(root=loaded).write(str(back / "ckpt"))
        return
    model = twin(case)
    if fmt == "ckpt":
        ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        ckpt.read(str(given)).assert_consumed()
        ckpt.write(str(back / "ckpt"))
    else:
        model.load_weights(str(given)).assert_consumed()
        model.save_weights(str(back / "ckpt"))


def restore(out: Path) -> None:
    results = {}
    for case in CASES:
        for d in sorted((out / case / "out").iterdir()):
            try:
                restore_one(case, d.name, out)
                results[f"{case}/{d.name}"] = "ok"
            except Exception as e:  # recorded for the test to show
                results[f"{case}/{d.name}"] = f"{type(e).__name__}: {e}"[:2000]
    (out / "restored.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    role, where = sys.argv[1], Path(sys.argv[2])
    {"write": write, "restore": restore}[role](where)
