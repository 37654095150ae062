"""Per-name dtype rules (``keep_dtype``, ``dtype_rules``; ``--keep-dtype``, ``--dtype-rule``)
held to TensorFlow: checkpoints TensorFlow writes (a TF1 BERT-named graph, a Keras 3
model with an embedding and a layer normalization) are cast tensor by tensor as the rules
say; TensorFlow reads every result with the dtype each tensor should have and the values
``tf.cast`` gives, and restores it into graphs and models of those mixed dtypes."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import transform_helpers as th  # noqa: E402  (conftest put tests/ on sys.path)
from cli_helpers import in_process  # noqa: E402
from saver_runs import runs  # noqa: E402,F401  (the Saver runs)

import tfckpt  # noqa: E402
from tfckpt import CheckpointError  # noqa: E402

KEEP = "LayerNorm|layer_norm|embeddings"


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A TF1 graph with BERT's variable names (one variable saved as float16), by a Saver."""
    rng = np.random.default_rng(5)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    values = {
        "bert/embeddings/word_embeddings": f32(30, 8),
        "bert/embeddings/LayerNorm/gamma": f32(8),
        "bert/embeddings/LayerNorm/beta": f32(8),
        "bert/encoder/layer_0/attention/self/query/kernel": f32(8, 8),
        "bert/encoder/layer_0/attention/self/query/bias": f32(8),
        "bert/encoder/layer_0/intermediate/dense/kernel": f32(8, 16).astype(np.float16),
        "bert/encoder/layer_0/output/LayerNorm/gamma": f32(8),
        "bert/pooler/dense/kernel": f32(8, 8),
        "cls/predictions/output_bias": f32(30).astype(np.float64),
        "global_step": np.array(77, dtype=np.int64),
    }
    prefix = th.tf1_save(tmp_path_factory.mktemp("bert") / "bert_model.ckpt", values)
    return prefix, values


# What the BERT recipe below must give each tensor: the keep pattern first, then the
# first matching rule (a widening one included), then --dtype; integers untouched.
BERT_RULES = [("pooler/", "bfloat16"), ("intermediate/", "float32"), ("/dense/", "float64")]
BERT_WANT = {
    "bert/embeddings/word_embeddings": ("float32", f"keep {KEEP}"),
    "bert/embeddings/LayerNorm/gamma": ("float32", f"keep {KEEP}"),
    "bert/embeddings/LayerNorm/beta": ("float32", f"keep {KEEP}"),
    "bert/encoder/layer_0/attention/self/query/kernel": ("float16", "cast"),
    "bert/encoder/layer_0/attention/self/query/bias": ("float16", "cast"),
    "bert/encoder/layer_0/intermediate/dense/kernel": ("float32", "rule intermediate/=float32"),
    "bert/encoder/layer_0/output/LayerNorm/gamma": ("float32", f"keep {KEEP}"),
    "bert/pooler/dense/kernel": ("bfloat16", "rule pooler/=bfloat16"),
    "cls/predictions/output_bias": ("float16", "cast"),
    "global_step": ("int64", None),
}


def tf_cast(value: np.ndarray, dtype: str) -> np.ndarray:
    return tf.cast(tf.constant(value), tf.as_dtype(dtype)).numpy()


def check_bert_output(prefix: str, values: dict) -> None:
    """TensorFlow reads each tensor in its planned dtype, equal to tf.cast of the original,
    and a plain Saver restores them into variables of exactly those dtypes."""
    assert th.tf_dtypes(prefix) == {k: d for k, (d, _) in BERT_WANT.items()}
    got = th.tf_reader_values(prefix)
    for name, (dtype, _) in BERT_WANT.items():
        want = tf_cast(values[name], dtype)
        assert got[name].dtype == want.dtype and got[name].tobytes() == want.tobytes(), name
    specs = {k: (tf.as_dtype(BERT_WANT[k][0]), v.shape) for k, v in values.items()}
    restored = th.tf1_restore(prefix, specs)
    for name, value in restored.items():
        assert value.tobytes() == got[name].tobytes(), name


def test_bert_library_keep_and_rules(bert, tmp_path):
    prefix, values = bert
    summary = tfckpt.convert(
        prefix, f"{tmp_path}/out/", "float16", keep_dtype=[KEEP], dtype_rules=BERT_RULES
    )
    check_bert_output(summary.dst, values)
    assert summary.dtype_rules == {
        f"keep {KEEP}": 4,
        "rule pooler/=bfloat16": 1,
        "rule intermediate/=float32": 1,
        "rule /dense/=float64": 0,  # the earlier rules took every tensor it matches
    }
    assert summary.cast == 5  # query kernel and bias, intermediate (widened), pooler, cls
    # An Options carries the same, and a mapping gives the rules in its order.
    opts = tfckpt.Options(cast="float16", keep_dtype=KEEP, dtype_rules=dict(BERT_RULES))
    p = tfckpt.plan(prefix, f"{tmp_path}/again/", opts)
    assert {t.name: (t.new_dtype, t.dtype_by) for t in p.tensors} == BERT_WANT
    # Patterns see source names, as include/exclude do, whatever the rename makes of them.
    p = tfckpt.plan(
        prefix, f"{tmp_path}/renamed/", opts, rename={"bert/": "net/"}, keep_dtype=["^bert/emb"]
    )
    assert {t.new_name: t.new_dtype for t in p.tensors}["net/embeddings/word_embeddings"] == (
        "float32"
    )
    # The control: the dtypes really differ from the source's.
    specs = {k: (tf.as_dtype(BERT_WANT[k][0]), v.shape) for k, v in values.items()}
    with pytest.raises(tf.errors.OpError, match="dtype"):
        th.tf1_restore(prefix, specs)


def test_bert_cli_dry_run_and_summary(bert, tmp_path):
    prefix, values = bert
    flags = ["--dtype", "float16", "--keep-dtype", "LayerNorm|layer_norm", "--keep-dtype"]
    flags += ["embeddings"] + [f for pat, d in BERT_RULES for f in ("--dtype-rule", f"{pat}={d}")]
    want = dict(BERT_WANT)
    for name, (dtype, by) in want.items():
        if by == f"keep {KEEP}":
            first = "LayerNorm|layer_norm" if "LayerNorm" in name else "embeddings"
            want[name] = (dtype, f"keep {first}")

    rc, out, err = in_process("convert", prefix, f"{tmp_path}/out/", *flags, "--dry-run", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert {t["name"]: (t["new_dtype"], t["dtype_by"]) for t in data["tensors"]} == want
    assert data["dtype_rules"] == {
        "keep LayerNorm|layer_norm": 3,
        "keep embeddings": 1,
        "rule pooler/=bfloat16": 1,
        "rule intermediate/=float32": 1,
        "rule /dense/=float64": 0,
    }
    assert not (tmp_path / "out").exists()

    rc, out, err = in_process("convert", prefix, f"{tmp_path}/out/", *flags, "--dry-run")
    assert rc == 0, err
    lines = out.splitlines()
    assert "DTYPE BY" in lines[0]
    row = next(line for line in lines if "pooler/dense/kernel" in line)
    assert "float32->bfloat16" in row and row.rstrip().endswith("rule pooler/=bfloat16")
    row = next(line for line in lines if "global_step" in line)
    assert row.rstrip().endswith("-")
    assert "dtype keep LayerNorm|layer_norm: 3 tensors" in lines
    assert "dtype rule /dense/=float64: 0 tensors" in lines

    rc, out, err = in_process("convert", prefix, f"{tmp_path}/out/", *flags)
    assert rc == 0, err
    assert "  dtype rule intermediate/=float32: 1 tensors" in err.splitlines()
    assert "  dtype keep embeddings: 1 tensors" in err.splitlines()
    check_bert_output(str(tmp_path / "out" / "bert_model.ckpt"), values)


def test_rules_without_dtype_and_regex_with_equals(bert, tmp_path):
    """Rules alone cast (no --dtype); a rule's regex may hold '=' (split at the last)."""
    prefix, values = bert
    rc, _, err = in_process(
        "select",
        prefix,
        f"{tmp_path}/out/",
        "--dtype-rule",
        "query/[^=]*kernel=bfloat16",
        "--dtype-rule",
        "global_step=float16",  # integers are never cast, whatever matches them
        "--include",
        "query|global_step",
    )
    assert rc == 0, err
    out = str(tmp_path / "out" / "bert_model.ckpt")
    kernel = "bert/encoder/layer_0/attention/self/query/kernel"
    bias = "bert/encoder/layer_0/attention/self/query/bias"
    assert th.tf_dtypes(out) == {kernel: "bfloat16", bias: "float32", "global_step": "int64"}
    got = th.tf_reader_values(out)
    assert got[kernel].tobytes() == tf_cast(values[kernel], "bfloat16").tobytes()
    assert got[bias].tobytes() == values[bias].tobytes()


@pytest.mark.parametrize(
    "flags, kwargs, message",
    [
        (
            ["--dtype-rule", "x(=float16"],
            {"dtype_rules": [("x(", "float16")]},
            "bad dtype rule 'x(=float16'",
        ),
        (
            ["--dtype-rule", "kernel=int8"],
            {"dtype_rules": {"kernel": "int8"}},
            "dtype rule 'kernel=int8': cannot cast to 'int8'",
        ),
        (
            ["--dtype-rule", "kernel=float17"],
            {"dtype_rules": {"kernel": "float17"}},
            "dtype rule 'kernel=float17': cannot cast to",
        ),
        (["--dtype-rule", "kernel"], None, "--dtype-rule takes REGEX=DTYPE, not 'kernel'"),
        (
            ["--dtype", "float16", "--keep-dtype", "a[b"],
            {"cast": "float16", "keep_dtype": ["a[b"]},
            "bad keep_dtype pattern 'a[b'",
        ),
        (
            ["--keep-dtype", "LayerNorm"],
            {"keep_dtype": "LayerNorm"},
            # The command line names its flags, Python its arguments.
            ("--keep-dtype keeps nothing: no --dtype", "keep_dtype keeps nothing: no cast"),
        ),
    ],
)
def test_bad_rules_are_one_line_errors(bert, tmp_path, flags, kwargs, message):
    prefix, _ = bert
    cli_message, message = message if isinstance(message, tuple) else (message, message)
    rc, out, err = in_process("convert", prefix, f"{tmp_path}/out/", *flags)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tfckpt: error: ") and cli_message in err, err
    assert not (tmp_path / "out").exists()
    if kwargs is not None:
        with pytest.raises(CheckpointError, match=re.escape(message)):
            tfckpt.plan(prefix, f"{tmp_path}/out/", **kwargs)


@pytest.fixture(scope="module")
def keras_bert(tmp_path_factory):
    """A small Keras 3 model (embedding, layer normalization, two dense layers), saved by
    ``tf.train.Checkpoint``; its weights in order."""
    import keras

    keras.utils.set_random_seed(3)
    model = bert_like(keras, "float32")
    model(np.arange(10, dtype=np.int32).reshape(2, 5) % 11)
    prefix = tf.train.Checkpoint(model=model).save(str(tmp_path_factory.mktemp("kb") / "ckpt"))
    return prefix, [w.numpy() for w in model.weights]


def bert_like(keras, dense_dtype: str):
    inp = keras.Input((5,), dtype="int32")
    x = keras.layers.Embedding(11, 8, name="embeddings")(inp)
    x = keras.layers.LayerNormalization(name="layer_norm")(x)
    x = keras.layers.Dense(8, name="dense", dtype=dense_dtype)(x)
    out = keras.layers.Dense(3, name="classifier", dtype=dense_dtype)(x)
    return keras.Model(inp, out)


def test_keras_mixed_model_restores(keras_bert, tmp_path):
    """Keras 3 keys name attributes, not layers: keep the embedding table and the layer
    normalization's gamma and beta in float32; the dense layers go to float16. TF2
    restores the result into a model whose dense layers are float16 and the rest float32."""
    import keras

    prefix, weights = keras_bert
    rc, _, err = in_process(
        "convert",
        prefix,
        f"{tmp_path}/out/",
        "--dtype",
        "float16",
        "--keep-dtype",
        "embeddings|gamma|beta",
    )
    assert rc == 0, err
    assert "  dtype keep embeddings|gamma|beta: 3 tensors" in err.splitlines()
    out = str(tmp_path / "out" / "ckpt-1")
    dtypes = th.tf_dtypes(out)
    assert sorted(d for k, d in dtypes.items() if k != "_CHECKPOINTABLE_OBJECT_GRAPH") == sorted(
        ["float32"] * 3 + ["float16"] * 4 + ["int64"]  # and save_counter
    )

    model = bert_like(keras, "float16")
    assert [w.dtype for w in model.weights] == ["float32"] * 3 + ["float16"] * 4
    tf.train.Checkpoint(model=model).restore(out).assert_existing_objects_matched()
    for w, orig in zip(model.weights, weights):
        want = tf_cast(orig, w.dtype)
        assert w.numpy().dtype == want.dtype and w.numpy().tobytes() == want.tobytes(), w.path
    with pytest.raises(tf.errors.OpError, match="dtype"):
        tf.train.Checkpoint(model=bert_like(keras, "float16")).restore(prefix)


def test_export_and_import_follow_the_rules(bert, tmp_path):
    """export plans like every rewrite; import_ decides each tensor the same way."""
    from safetensors.numpy import load_file

    prefix, values = bert
    out = tmp_path / "model.safetensors"
    rc, text, err = in_process(
        "export",
        prefix,
        out,
        "--dtype",
        "float16",
        "--keep-dtype",
        KEEP,
        "--dry-run",
        "--json",
        "--with-bookkeeping",  # global_step is one of the rules' cases
    )
    assert rc == 0, err
    planned = {t["name"]: (t["new_dtype"], t["dtype_by"]) for t in json.loads(text)["tensors"]}
    assert planned == BERT_WANT | {  # without the rules: --dtype, or already float16
        "bert/pooler/dense/kernel": ("float16", "cast"),
        "bert/encoder/layer_0/intermediate/dense/kernel": ("float16", None),
    }
    tfckpt.export(
        prefix,
        out,
        cast="float16",
        keep_dtype=[KEEP],
        dtype_rules=BERT_RULES,
        with_bookkeeping=True,
    )
    loaded = load_file(str(out))
    for name, (dtype, _) in BERT_WANT.items():
        want = tf_cast(values[name], dtype)
        assert loaded[name].dtype == want.dtype and loaded[name].tobytes() == want.tobytes()

    tfckpt.import_(out, tmp_path / "back" / "model", dtype_rules=[("LayerNorm", "float16")])
    back = th.tf_reader_values(tmp_path / "back" / "model")
    for name in BERT_WANT:
        want = loaded[name] if "LayerNorm" not in name else tf_cast(loaded[name], "float16")
        assert back[name].dtype == want.dtype and back[name].tobytes() == want.tobytes(), name


# Malformed rules, given to the library on a checkpoint of a TF1 Saver run.


@pytest.mark.parametrize(
    "rules",
    [{"^v$": None}, [("^v$", None)], "^v$=bfloat16", [("^v$", "bfloat16", "x")], ["^v$"]],
    ids=["dict-none", "pair-none", "string", "triple", "bare-regex"],
)
def test_malformed_dtype_rules_are_errors(runs, tmp_path, rules):
    """``{regex: None}`` must not mean float64 (numpy's reading of None), nor a string
    a rule per character."""
    with pytest.raises(tfckpt.CheckpointError, match="dtype rule"):
        tfckpt.convert(runs["v2"][-1], str(tmp_path / "out"), "float16", dtype_rules=rules)
    assert not os.path.exists(tmp_path / "out.index")
