"""``tfckpt edit --remap-rows`` and ``--resize``: a grown or reordered vocabulary, a
different number of classes, applied to a variable and its optimizer slots alike. Proven
against TensorFlow's own ops on the same inputs (``GenerateVocabRemapping`` and
``LoadAndRemapMatrix``, what ``tf.train.VocabInfo`` warm-starting runs) and by TensorFlow
restoring the output (``Saver.restore``, ``assert_consumed()``)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import tensorflow as tf

import tfckpt
from tests import cli_helpers as ch
from tests.edit_helpers import (
    BIAS,
    EMB,
    KERNEL,
    slot_key,
    tf1_restore,
    tf2_restore,
    tf_values,
    write_tf1,
    write_tf2,
)
from tfckpt.rewrite.editing import Edits, plan_edit


@pytest.fixture(scope="module")
def tf1(tmp_path_factory):
    return write_tf1(tmp_path_factory.mktemp("tf1"))


@pytest.fixture(scope="module")
def tf2(tmp_path_factory):
    return write_tf2(tmp_path_factory.mktemp("tf2"))


def vocab(path, tokens) -> str:
    path.write_text("".join(f"{t}\n" for t in tokens), encoding="utf-8")
    return str(path)


def tf_remap(prefix, name, old, new, init, *, axis=0, shape):
    """What TensorFlow's warm-start ops make of tensor ``name`` (2-D) of ``prefix`` remapped
    from vocabulary file ``old`` to ``new`` along ``axis``, ``init`` filling new cells."""
    n_new = sum(1 for _ in open(new, encoding="utf-8"))
    remap, _ = tf.raw_ops.GenerateVocabRemapping(
        new_vocab_file=new, old_vocab_file=old, new_vocab_offset=0, num_new_vocab=n_new
    )
    rows, cols = shape
    identity = tf.range(rows, dtype=tf.int64)
    return tf.raw_ops.LoadAndRemapMatrix(
        ckpt_path=prefix,
        old_tensor_name=name,
        row_remapping=remap if axis == 0 else identity,
        col_remapping=[] if axis == 0 else remap,
        initializing_values=init,
        num_rows=n_new if axis == 0 else rows,
        num_cols=cols if axis == 0 else n_new,
    ).numpy()


OLD = ["a", "b", "c", "d", "e", "f"]
NEW = ["c", "zz", "a", "f", "yy", "b"]  # d and e dropped, zz and yy new


def test_remap_rows_equals_tensorflow_warm_start(tf1, tmp_path):
    old, new = vocab(tmp_path / "old.txt", OLD), vocab(tmp_path / "new.txt", NEW)
    dst = str(tmp_path / "out" / "model.ckpt")
    args = ["--remap-rows", "^emb$", "--old-vocab", old, "--new-vocab", new]
    rc, _, err = ch.in_process("edit", tf1, dst, *args, "--init", "normal:0.05:3")
    assert rc == 0, err
    src, got = tf_values(tf1), tf_values(dst)
    drawn = np.random.default_rng(3).normal(0.0, 0.05, 2 * 4).astype(np.float32)
    want = tf_remap(tf1, "emb", old, new, drawn, shape=(6, 4))
    assert np.array_equal(got["emb"], want)
    # Independently: rows by token, the new ones drawn in order.
    by_token = dict(zip(OLD, src["emb"]))
    draws = iter(drawn.reshape(2, 4))
    assert np.array_equal(
        got["emb"], np.stack([by_token[t] if t in by_token else next(draws) for t in NEW])
    )
    for slot in ("emb/Adam", "emb/Adam_1"):  # the slots follow, their new rows zero
        assert np.array_equal(got[slot], tf_remap(tf1, slot, old, new, np.zeros(8), shape=(6, 4)))
    expected = dict(src, **{n: got[n] for n in ("emb", "emb/Adam", "emb/Adam_1")})
    restored = tf1_restore(dst, expected)
    assert all(np.array_equal(restored[n], v) for n, v in expected.items())


def test_class_remap_along_the_last_axis(tf1, tmp_path):
    old = vocab(tmp_path / "old.txt", ["cat", "dog", "fox"])
    new = vocab(tmp_path / "new.txt", ["fox", "cat", "owl", "bat"])
    dst = str(tmp_path / "out" / "model.ckpt")
    tfckpt.edit(
        tf1,
        dst,
        remap_rows=[r"^dense/(kernel|bias)$"],
        old_vocab=old,
        new_vocab=new,
        axis=-1,
    )
    src, got = tf_values(tf1), tf_values(dst)
    for name in ("dense/kernel", "dense/kernel/Adam", "dense/kernel/Adam_1"):
        want = tf_remap(tf1, name, old, new, np.zeros(8), axis=1, shape=(4, 3))
        assert np.array_equal(got[name], want), name
    for name in ("dense/bias", "dense/bias/Adam", "dense/bias/Adam_1"):
        b = src[name]
        assert np.array_equal(got[name], np.array([b[2], b[0], 0, 0], np.float32)), name
    assert np.array_equal(got["emb"], src["emb"])


def test_tf2_resize_grows_a_keras_model_and_its_slots(tf2, tmp_path):
    dst = str(tmp_path / "out" / "ckpt")
    tfckpt.edit(tf2, dst, resize={"layer_with_weights-0/embeddings": "8:mean"})
    tfckpt.edit(
        dst,
        str(tmp_path / "classes" / "ckpt"),
        resize={"layer_with_weights-1/(kernel|bias)": 5},
        axis=-1,
    )
    src = tf_values(tf2)
    model, opt = tf2_restore(dst, vocab=8, extra=True)  # assert_consumed
    emb = model.layers[0].embeddings
    got = emb.numpy()
    assert np.array_equal(got[:6], src[EMB])
    mean = src[EMB].astype(np.float64).mean(axis=0).astype(np.float32)
    np.testing.assert_allclose(got[6:], np.stack([mean, mean]), rtol=1e-6)
    for slot in ("m", "v"):
        value = opt.get_slot(emb, slot).numpy()
        assert np.array_equal(value[:6], src[slot_key(EMB, slot)]) and not value[6:].any()
    model, opt = tf2_restore(str(tmp_path / "classes" / "ckpt"), vocab=8, classes=5, extra=True)
    kernel, bias = model.layers[1].kernel.numpy(), model.layers[1].bias.numpy()
    assert np.array_equal(kernel[:, :3], src[KERNEL]) and not kernel[:, 3:].any()
    assert np.array_equal(bias[:3], src[BIAS]) and not bias[3:].any()
    m = opt.get_slot(model.layers[1].kernel, "m").numpy()
    assert np.array_equal(m[:, :3], src[slot_key(KERNEL, "m")]) and not m[:, 3:].any()


def test_remap_of_an_embedding_above_the_chunk_budget_stays_bounded(tmp_path):
    rows, dim = 32768, 64  # 8 MiB, the budget 256 KiB
    table = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    src = str(tmp_path / "src" / "model")
    tf.raw_ops.SaveV2(prefix=src, tensor_names=["emb"], shape_and_slices=[""], tensors=[table])
    tokens = [f"t{i}" for i in range(rows)]
    rng = np.random.default_rng(1)
    kept = [tokens[i] for i in rng.permutation(rows)[: rows - 4000]]
    new_tokens = kept[:10000] + [f"n{i}" for i in range(3000)] + kept[10000:]
    old, new = vocab(tmp_path / "old.txt", tokens), vocab(tmp_path / "new.txt", new_tokens)
    dst = str(tmp_path / "out" / "model")
    edits = Edits(remap_rows=["^emb$"], old_vocab=old, new_vocab=new)
    p = plan_edit(src, dst, edits, chunk_bytes=256 << 10)  # the vocabularies: O(tokens)
    tracemalloc.start()
    try:
        tfckpt.execute(p)  # the rows: in runs, a budget at a time
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        p.close()
    assert peak < table.nbytes / 4, peak
    want = tf_remap(src, "emb", old, new, np.zeros(3000 * dim), shape=(rows, dim))
    assert np.array_equal(tf_values(dst)["emb"], want)


@pytest.mark.parametrize(
    "old_tokens, args, fragments",
    [
        (OLD[:5], ["--remap-rows", "^emb$"], ["5 tokens", "6 rows"]),
        (OLD + ["a"], ["--remap-rows", "^emb$"], ["'a'", "lines 1 and 7"]),
        (OLD, ["--remap-rows", "^nothing$"], ["no variable matches"]),
        (OLD, ["--remap-rows", "^emb$", "--init", "normal:x"], ["normal:STD:SEED"]),
        (OLD, ["--remap-rows", "^global_step$"], ["axis 0", "shape []"]),
        (OLD, ["--resize", "^emb$=many"], ["ROWS"]),
    ],
)
def test_cli_errors_are_one_line(tf1, tmp_path, old_tokens, args, fragments):
    old, new = vocab(tmp_path / "old.txt", old_tokens), vocab(tmp_path / "new.txt", NEW)
    dst = str(tmp_path / "out" / "m")
    result = ch.in_process("edit", tf1, dst, *args, "--old-vocab", old, "--new-vocab", new)
    ch.assert_cli_error(result, *fragments)
