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


def tf_remap(prefix, name, old, new, init, *, axis=0, shape, n_new=None):
    """What TensorFlow's warm-start ops make of tensor ``name`` (2-D) of ``prefix`` remapped
    from vocabulary file ``old`` to ``new`` (``n_new`` tokens: by default its lines) along
    ``axis``, ``init`` filling new cells."""
    if n_new is None:
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


def _lines(tokens, end: bytes = b"\n", last: bytes | None = None) -> bytes:
    """``tokens`` (str or bytes) one a line, each ended by ``end`` (the last by ``last``)."""
    raw = [t.encode() if isinstance(t, str) else t for t in tokens]
    return b"".join(t + end for t in raw[:-1]) + raw[-1] + (end if last is None else last)


BOM = b"\xef\xbb\xbf"
LF_OLD, LF_NEW = _lines(OLD), _lines(NEW)

# Vocabulary files as editors and scripts write them: (old file, new file).
ACCEPTED = {
    "crlf old": (_lines(OLD, b"\r\n"), LF_NEW),  # the issue's: every row was zeroed
    "crlf new": (LF_OLD, _lines(NEW, b"\r\n")),
    "crlf, no last line end": (_lines(OLD, b"\r\n", b""), _lines(NEW, b"\r\n", b"\r")),
    "a stray \\r after the last line": (LF_OLD, LF_NEW + b"\r"),
    "two \\r: one is the token's": (_lines(OLD, b"\r\r\n"), _lines(NEW, b"\r\n")),
    "bom in old": (BOM + LF_OLD, LF_NEW),
    "bom in both": (BOM + LF_OLD, BOM + _lines(["a", *NEW[1:]])),
    "trailing spaces": (_lines([f"{t} " if t in "ac" else t for t in OLD]), LF_NEW),
    "leading space, tab, blank-looking": (_lines([" a", "b\tc", "c", " ", "e", "f"]), LF_NEW),
    "bytes that are no UTF-8": (_lines([b"\xe9", *OLD[1:]]), _lines([b"\xe9", *NEW[1:]])),
}
REFUSED = {
    "empty line inside": (_lines(["a", "", "c", "d", "e", "f"]), LF_NEW),
    "empty line at the end": (LF_OLD, LF_NEW + b"\n"),
    "empty line at the start": (LF_OLD, b"\n" + LF_NEW),
    "crlf empty line": (_lines(OLD, b"\r\n"), _lines([*NEW[:3], "", *NEW[3:]], b"\r\n")),
    "a line of \\r alone": (LF_OLD, b"\r\n" + LF_NEW),
    "empty file": (LF_OLD, b""),
}


def _tf_mapping(old: str, new: str, n: int) -> list[int]:
    """``GenerateVocabRemapping``'s row mapping for ``n`` new tokens (it raises for a file
    it refuses)."""
    remap, _ = tf.raw_ops.GenerateVocabRemapping(
        new_vocab_file=new, old_vocab_file=old, new_vocab_offset=0, num_new_vocab=n
    )
    return remap.numpy().tolist()


@pytest.mark.parametrize("case", ACCEPTED)
def test_vocabulary_files_are_read_as_tensorflow_reads_them(tf1, tmp_path, case):
    """Line ends, a byte-order mark, spaces, bytes: the rows tfckpt writes are those
    TensorFlow's remapping ops give on the same files, and TensorFlow's line count is
    tfckpt's (it takes n tokens and refuses n + 1)."""
    (tmp_path / "old.txt").write_bytes(ACCEPTED[case][0])
    (tmp_path / "new.txt").write_bytes(ACCEPTED[case][1])
    old, new = str(tmp_path / "old.txt"), str(tmp_path / "new.txt")
    dst = str(tmp_path / "out" / "model.ckpt")
    args = ["--remap-rows", "^emb$", "--old-vocab", old, "--new-vocab", new]
    none_kept = case.startswith("two")  # no token of one file is in the other
    more = ["--allow-no-overlap"] if none_kept else []
    rc, _, err = ch.in_process("edit", tf1, dst, *args, *more)
    assert rc == 0, err
    got = tf_values(dst)["emb"]
    n = got.shape[0]
    mapping = _tf_mapping(old, new, n)
    with pytest.raises(tf.errors.InvalidArgumentError, match="larger than last new vocab"):
        _tf_mapping(old, new, n + 1)
    src = tf_values(tf1)["emb"]
    assert np.array_equal(got, np.stack([src[i] if i >= 0 else np.zeros(4) for i in mapping]))
    assert np.array_equal(
        got, tf_remap(tf1, "emb", old, new, np.zeros(4 * mapping.count(-1)), shape=(6, 4), n_new=n)
    )
    kept = sum(i >= 0 for i in mapping)
    assert f"remap: {kept} of {n} rows from the old vocabulary" in err
    assert ("byte-order mark" in err) == ("bom" in case)
    if case.startswith("crlf"):
        assert mapping == [OLD.index(t) if t in OLD else -1 for t in NEW]


@pytest.mark.parametrize("case", REFUSED)
def test_vocabulary_files_tensorflow_refuses_are_refused(tf1, tmp_path, case):
    (tmp_path / "old.txt").write_bytes(REFUSED[case][0])
    (tmp_path / "new.txt").write_bytes(REFUSED[case][1])
    old, new = str(tmp_path / "old.txt"), str(tmp_path / "new.txt")
    for n in (5, 6, 7):
        with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError)):
            _tf_mapping(old, new, n)
    dst = tmp_path / "out" / "model.ckpt"
    args = ["--remap-rows", "^emb$", "--old-vocab", old, "--new-vocab", new]
    line = ch.assert_cli_error(ch.in_process("edit", tf1, dst, *args))
    assert ("is empty" in line) and ("line" in line or "empty file" in case), line
    assert not dst.parent.exists()


def test_remap_says_how_many_rows_it_keeps_and_refuses_none(tf1, tmp_path):
    old = vocab(tmp_path / "old.txt", OLD)
    none = vocab(tmp_path / "none.txt", ["x", "y", "z", "w", "v", "u"])
    few = vocab(tmp_path / "few.txt", ["x", "y", "b", "w", "v", "u"])
    half = vocab(tmp_path / "half.txt", ["x", "a", "b", "w", "c", "u"])
    dst = tmp_path / "out" / "model.ckpt"

    def edit(new, *more):
        args = ["--remap-rows", "^emb$", "--old-vocab", old, "--new-vocab", new, *more]
        return ch.in_process("edit", tf1, dst, *args, "--overwrite")

    line = ch.assert_cli_error(edit(none), "no token of the new vocabulary", "--allow-no-overlap")
    assert "'x'" in line and "'a'" in line
    assert not dst.parent.exists()
    with pytest.raises(tfckpt.CheckpointError, match="allow_no_overlap=True"):
        tfckpt.edit(tf1, str(dst), remap_rows="^emb$", old_vocab=old, new_vocab=none)
    rc, _, err = edit(none, "--allow-no-overlap")
    assert rc == 0 and "remap: 0 of 6 rows from the old vocabulary, 6 new" in err, err
    assert "warning: remap: only 0 of the 6 tokens" in err
    assert not tf_values(str(dst))["emb"].any()
    rc, _, err = edit(few)
    assert rc == 0 and "remap: 1 of 6 rows" in err and "warning: remap: only 1 of the 6" in err
    rc, _, err = edit(half, "--dry-run")  # said before anything is written, too
    assert rc == 0 and "remap: 3 of 6 rows" in err and "warning" not in err, err
    summary = tfckpt.edit(
        tf1, str(tmp_path / "py" / "m"), remap_rows="^emb$", old_vocab=old, new_vocab=few
    )
    assert any("only 1 of the 6 tokens" in w for w in summary.warnings)
