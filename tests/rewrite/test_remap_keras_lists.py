"""``--remap-rows`` and ``--resize`` of a variable whose optimizer keeps its moments in
lists (Keras 3's ``optimizer/_variables/N``, tf.keras 2's own ``tf_keras.optimizers.Adam``),
not as slot variables: the moments take the variable's rows along. Proven by training:
a model trained one step, edited, restored (``assert_consumed()``) takes the next step a
model given the same state here (rows moved with numpy, assigned to Keras' own
variables) takes."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tfckpt  # noqa: E402

OLD = list("abcdef")
NEW = ["c", "a", "x", "f", "y", "b", "d", "z"]  # e dropped, x y z new
ROWS = np.array([OLD.index(t) if t in OLD else -1 for t in NEW])
LR = 0.1


def _keras(kind: str):
    if kind == "keras 3":
        import keras

        return keras
    return pytest.importorskip("tf_keras")


def _model(K, vocab: int):
    model = K.Sequential(
        [
            K.Input((2,), dtype="int32"),
            K.layers.Embedding(vocab, 4, name="emb"),
            K.layers.Flatten(),
            K.layers.Dense(3, name="out"),
        ]
    )
    rng = np.random.default_rng(vocab)
    for v in model.trainable_variables:
        v.assign(rng.standard_normal(v.shape).astype(np.float32))
    return model


def _step(model, opt, xs) -> None:
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum((model(xs) - 0.5) ** 2)
    variables = model.trainable_variables
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))


def _moments(opt) -> list:
    """The optimizer's lists, each entry the slot of ``model.trainable_variables[i]``
    (both Keras build them in the order of the variables they are given)."""
    return [opt._momentums, opt._velocities]


def got_emb(model) -> np.ndarray:
    return model.get_layer("emb").embeddings.numpy()


def _rows(value: np.ndarray, rows: np.ndarray, new: np.ndarray) -> np.ndarray:
    out = np.empty((len(rows), *value.shape[1:]), value.dtype)
    out[rows >= 0] = value[rows[rows >= 0]]
    out[rows < 0] = new
    return out


@pytest.mark.parametrize("how", ["remap", "resize"])
@pytest.mark.parametrize("kind", ["keras 3", "tf_keras"])
def test_list_moments_take_the_rows_and_training_goes_on_alike(kind, how, tmp_path):
    K = _keras(kind)
    model = _model(K, len(OLD))
    opt = K.optimizers.Adam(LR)
    _step(model, opt, np.array([[0, 2], [5, 4]]))
    src = tf.train.Checkpoint(model=model, optimizer=opt).write(str(tmp_path / "src" / "ckpt"))
    with tfckpt.open(src) as c:
        assert not any(".OPTIMIZER_SLOT" in k for k in c.keys())  # lists, no slot variables

    emb = model.get_layer("emb").embeddings.numpy()
    dst = str(tmp_path / "out" / "ckpt")
    if how == "remap":
        (tmp_path / "old.txt").write_text("\n".join(OLD) + "\n")
        (tmp_path / "new.txt").write_text("\n".join(NEW) + "\n")
        rows, fresh = ROWS, emb.mean(axis=0, dtype=np.float64).astype(np.float32)
        tfckpt.edit(
            src,
            dst,
            remap_rows="embeddings",
            old_vocab=str(tmp_path / "old.txt"),
            new_vocab=str(tmp_path / "new.txt"),
            init="mean",
        )
    else:
        rows, fresh = np.array([0, 1, 2, 3, 4, 5, -1, -1]), np.float32(0)
        tfckpt.edit(src, dst, resize={"embeddings": "8"})

    # Restored from the edited checkpoint: everything consumed.
    restored = _model(K, len(NEW))
    opt_r = K.optimizers.Adam(LR)
    opt_r.build(restored.trainable_variables)
    tf.train.Checkpoint(model=restored, optimizer=opt_r).read(dst).assert_consumed()

    # The same state made here: the trained objects' values, rows moved by numpy.
    made = _model(K, len(NEW))
    opt_m = K.optimizers.Adam(LR)
    opt_m.build(made.trainable_variables)
    for i, (old_v, new_v) in enumerate(zip(model.trainable_variables, made.trainable_variables)):
        is_emb = old_v.shape == emb.shape
        value = old_v.numpy()
        new_v.assign(_rows(value, rows, fresh) if is_emb else value)
        for old_list, new_list in zip(_moments(opt), _moments(opt_m)):
            slot = old_list[i].numpy()
            new_list[i].assign(_rows(slot, rows, np.float32(0)) if is_emb else slot)
    opt_m.iterations.assign(opt.iterations)

    for got, want in zip(restored.trainable_variables, made.trainable_variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    for got_list, want_list in zip(_moments(opt_r), _moments(opt_m)):
        for got, want in zip(got_list, want_list):
            np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert int(opt_r.iterations.numpy()) == 1

    xs = np.array([[0, 7], [2, 6], [3, 1]])  # old rows and new ones
    _step(restored, opt_r, xs)
    _step(made, opt_m, xs)
    for got, want in zip(restored.trainable_variables, made.trainable_variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)
    stepped = got_emb(restored)
    # the comparison means something: the embedding's moments were not all zeros, and
    # moments left where they were (rows not moved) take another step
    assert _moments(opt)[0][0].numpy().any()
    wrong = _model(K, len(NEW))
    opt_w = K.optimizers.Adam(LR)
    opt_w.build(wrong.trainable_variables)
    tf.train.Checkpoint(model=wrong, optimizer=opt_w).read(dst).assert_consumed()
    for lst in _moments(opt_w):
        value = lst[0].numpy()
        lst[0].assign(np.roll(value, 1, axis=0))  # each row's moments on another row
    _step(wrong, opt_w, xs)
    assert not np.allclose(wrong.trainable_variables[0].numpy(), stepped, rtol=1e-4)


def test_a_factored_slot_is_refused(tmp_path):
    """Adafactor keeps row and column factors in lists tied to no variable here: an
    optimizer tensor with as many rows as the variable is refused, not left behind."""
    import keras

    model = _model(keras, len(OLD))
    opt = keras.optimizers.Adafactor(LR)
    _step(model, opt, np.array([[0, 2]]))
    src = tf.train.Checkpoint(model=model, optimizer=opt).write(str(tmp_path / "src" / "ckpt"))
    with pytest.raises(
        tfckpt.CheckpointError, match=r"'optimizer/_variables/2/.*\(shape \[6\]\) is not a slot"
    ):
        tfckpt.edit(src, str(tmp_path / "out"), resize={"embeddings": "8"})


def test_delete_of_a_variable_with_listed_moments_is_refused(tmp_path):
    """Keras 3's lists are positional: a variable deleted would leave its moments (and
    every later variable's) where an optimizer of the smaller model does not look."""
    import keras

    model = _model(keras, len(OLD))
    opt = keras.optimizers.Adam(LR)
    _step(model, opt, np.array([[0, 2]]))
    src = tf.train.Checkpoint(model=model, optimizer=opt).write(str(tmp_path / "src" / "ckpt"))
    with pytest.raises(tfckpt.CheckpointError, match=r"keeps its state in lists .*--as-tf1"):
        tfckpt.edit(src, str(tmp_path / "out"), delete=["_operations/3/bias$"])
    assert not (tmp_path / "out").exists()
    # written without the object graph (which the flat names come from), by its key
    bias = "^optimizer/_trainable_variables/2/"
    tfckpt.edit(src, str(tmp_path / "tf1" / "ckpt"), delete=[bias], as_tf1=True)
    with tfckpt.open(str(tmp_path / "tf1" / "ckpt")) as c:
        assert "optimizer/_trainable_variables/2/.ATTRIBUTES/VARIABLE_VALUE" not in c.keys()
