"""Targets and checkpoints for ``tfckpt check --against`` a Keras HDF5 file or a template
with an optimizer's slots, written by tf.keras, and what tf.keras made of each pair.

Run as a script in a process of its own (see tests/inspection/test_check_h5.py):
``write OUT`` builds, saves, restores and records ``OUT/table.json``, rows of
``[table, target, checkpoint, mode, ok, message]``:

- ``h5``: a Sequential model (Dense, BatchNormalization, Dropout, Dense) saved with
  ``save_weights("w.h5")`` and ``save("m.h5")`` is the target; the checkpoints are the
  same architecture and ones with a layer missing, one more, a layer of another width
  or dtype, each saved as ``w.h5``, whole as ``m.h5``, in TF format (``save_weights``: the model is the
  root) and with ``tf.train.Checkpoint(model=...)``. The outcome: a model built as the
  target's writer was runs ``load_weights`` (an ``.h5``; a TF-format checkpoint, then
  the mode's assertion on its status) or ``tf.train.Checkpoint(model=...).read``.
- ``hf``: Hugging Face's TFBertModel as tests/hf_tf2_models.py builds it, its
  ``tf_model.h5`` the target; checkpoints of the same and of another vocabulary size.
- ``slots``: a model trained one step (Adam, and the legacy Adam whose slots are slot
  variables) written with ``tf.train.Checkpoint(model=..., optimizer=...)`` is the
  template; checkpoints with the slots, of a model never compiled (no optimizer at all:
  a compiled tf.keras model tracks its optimizer itself), with an optimizer that made
  no slots yet, and with one slot of another shape (tfckpt edit). The outcome: a
  program trained one step (its slots exist) reads each with the mode's assertion.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MODES = ("existing", "consumed", "partial")
BERT = dict(
    vocab_size=30,
    hidden_size=8,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=16,
    max_position_embeddings=12,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
    hidden_act="gelu",
)


def seq(keras, kind: str = "same"):
    """The target's architecture, or one that differs as ``kind`` says."""
    layers = [keras.Input((4,))]
    dtype = "float16" if kind == "dtype" else None
    layers.append(keras.layers.Dense(5 if kind == "shape" else 3, name="d1", dtype=dtype))
    if kind != "missing":
        layers.append(keras.layers.BatchNormalization(name="bn"))
    layers += [keras.layers.Dropout(0.1, name="drop"), keras.layers.Dense(2, name="out")]
    if kind == "extra":
        layers.append(keras.layers.Dense(2, name="extra"))
    return keras.Sequential(layers, name="seq")


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _assert(status, mode: str) -> None:
    if mode == "existing":
        status.assert_existing_objects_matched()
    elif mode == "consumed":
        status.assert_consumed()
    else:
        status.expect_partial()


def _outcome(build, path: str, how: str, mode: str) -> tuple[bool, str]:
    import tensorflow as tf

    model = build()
    try:
        if how in ("h5", "m5"):
            model.load_weights(path)
        elif how == "tf":
            _assert(model.load_weights(path), mode)
        else:
            _assert(tf.train.Checkpoint(model=model).read(path), mode)
    except Exception as e:  # the outcome is what the test judges
        return False, _error(e)
    return True, ""


def _save_all(model, d: Path, whole: bool = True) -> dict[str, str]:
    import tensorflow as tf

    d.mkdir(parents=True)
    model.save_weights(str(d / "w.h5"))
    model.save_weights(str(d / "tf" / "ckpt"))
    tf.train.Checkpoint(model=model).write(str(d / "obj" / "ckpt"))
    out = {"h5": str(d / "w.h5"), "tf": str(d / "tf" / "ckpt"), "obj": str(d / "obj" / "ckpt")}
    if whole:  # a whole model (model_weights/), which load_weights reads as well
        model.save(str(d / "m.h5"))
        out["m5"] = str(d / "m.h5")
    return out


def h5_table(keras, out: Path) -> list:
    rows = []
    x = np.ones((2, 4), np.float32)
    base = seq(keras)
    base(x)
    (out / "target").mkdir(parents=True)
    targets = [str(out / "target" / "w.h5"), str(out / "target" / "m.h5")]
    base.save_weights(targets[0])
    base.save(targets[1])
    for kind in ("same", "missing", "extra", "shape", "dtype"):
        model = seq(keras, kind)
        model(x)
        for how, path in _save_all(model, out / kind).items():
            for mode in MODES if how in ("tf", "obj") else ("default",):
                ok, message = _outcome(lambda: _built(keras, x), path, how, mode)
                rows += [["h5", t, f"{kind}-{how}", path, mode, ok, message] for t in targets]
    return rows


def _built(keras, x):
    model = seq(keras)
    model(x)
    return model


def hf_table(keras, out: Path) -> list:
    import hf_tf2_models as hf
    import tensorflow as tf

    ids = tf.constant([[2, 5, 7, 1]])
    inputs = {"input_ids": ids, "token_type_ids": tf.zeros_like(ids), "attention_mask": ids > 0}

    def build(**changes):
        model = hf.TFBertModel({**BERT, **changes})
        model(inputs)
        return model

    target = out / "hf-target"
    target.mkdir(parents=True)
    build().save_weights(str(target / "tf_model.h5"))
    rows = []
    for kind, changes in (("same", {}), ("shape", {"vocab_size": 31})):
        for how, path in _save_all(build(**changes), out / f"hf-{kind}", whole=False).items():
            for mode in ("existing",) if how != "h5" else ("default",):
                ok, message = _outcome(build, path, how, mode)
                rows.append(
                    ["hf", str(target / "tf_model.h5"), f"{kind}-{how}", path, mode, ok, message]
                )
    return rows


def slots_table(keras, out: Path) -> list:
    import tensorflow as tf

    import tfckpt

    x, y = np.ones((2, 4), np.float32), np.ones((2, 2), np.float32)

    def trained(optimizer):
        model = seq(keras)
        model.compile(optimizer(), "mse")
        model.fit(x, y, epochs=1, batch_size=2, verbose=0)
        return model

    rows = []
    for name, optimizer in (
        ("adam", keras.optimizers.Adam),
        ("legacy-adam", keras.optimizers.legacy.Adam),
    ):
        d = out / name
        model = trained(optimizer)
        template = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
            str(d / "template" / "ckpt")
        )
        other = trained(optimizer)
        checkpoints = {
            "with-slots": tf.train.Checkpoint(model=other, optimizer=other.optimizer).write(
                str(d / "with-slots" / "ckpt")
            ),
        }
        plain = seq(keras)  # never compiled: no optimizer below the model either
        plain(x)
        checkpoints["no-optimizer"] = tf.train.Checkpoint(model=plain).write(
            str(d / "no-opt" / "ckpt")
        )
        fresh = seq(keras)
        fresh.compile(optimizer(), "mse")
        fresh(x)
        checkpoints["no-slots"] = tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).write(
            str(d / "no-slots" / "ckpt")
        )
        with tfckpt.open(checkpoints["with-slots"]) as c:
            # The slot of d1's kernel: Adam's first moment, shaped as the kernel [4, 3].
            slot = next(
                k
                for k in c.keys()
                if ("OPTIMIZER_SLOT" in k or "/_variables/" in k)
                and tuple(c.info(k).shape) == (4, 3)
            )
            wrong = str(d / "slot-shape" / "ckpt")
            with tfckpt.BundleWriter(wrong) as w:  # the same, that slot with 5 rows
                for k in c.keys():
                    w.add(k, np.zeros((5, 3), np.float32) if k == slot else c[k])
        checkpoints["slot-shape"] = wrong
        for kind, path in checkpoints.items():
            for mode in MODES:
                live = trained(optimizer)
                try:
                    _assert(
                        tf.train.Checkpoint(model=live, optimizer=live.optimizer).read(path), mode
                    )
                    ok, message = True, ""
                except Exception as e:  # the outcome is what the test judges
                    ok, message = False, _error(e)
                rows.append(["slots", template, f"{name}-{kind}", path, mode, ok, message])
    return rows


def write(out: Path) -> None:
    import tf_keras as keras

    keras.utils.set_random_seed(1)
    rows = (
        h5_table(keras, out / "h5")
        + hf_table(keras, out / "hf")
        + slots_table(keras, out / "slots")
    )
    (out / "table.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    role, where = sys.argv[1], Path(sys.argv[2])
    assert role == "write", role
    write(where)
