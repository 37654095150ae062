"""Patterns on TF2 sources match flat names (model paths) as well as keys, held to
TensorFlow; and graft takes ``save_counter`` as merge does.

TensorFlow keys each tensor by the first path to its object, and a Keras 3 model saved
with its optimizer (``tf.train.Checkpoint(model=..., optimizer=...)``) has its weights
keyed by the optimizer's lists (``optimizer/_trainable_variables/N``). Its object graph
names no layers: the model path (``model/_operations/2/gamma``) is what a pattern can
name. TensorFlow writes every checkpoint here during the test, reads the results and
restores them into models of the dtypes the patterns planned.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import transform_helpers as th  # noqa: E402  (conftest put tests/ on sys.path)
from cli_helpers import assert_cli_error, in_process  # noqa: E402

VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
# The functional model's operations: 0 is its input, then the layers in order.
LN = "^model/_operations/2/"
HEAD = "^model/_operations/3/"
LAYERS = ("emb", "ln", "head")
# The optimizer's learning rate: training bookkeeping, which a cast leaves float32 (as
# TensorFlow keeps it in a float16 model).
LEARNING_RATE = "optimizer/_learning_rate" + VALUE


def build(emb="float32", ln="float32", head="float32"):
    x = keras.Input((5,), dtype="int32")
    h = keras.layers.Embedding(11, 4, name="emb", dtype=emb)(x)
    h = keras.layers.LayerNormalization(name="ln", dtype=ln)(h)
    return keras.Model(x, keras.layers.Dense(3, name="head", dtype=head)(h))


def weights_of(model) -> dict[str, list[np.ndarray]]:
    return {n: [w.numpy() for w in model.get_layer(n).weights] for n in LAYERS}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A Keras 3 model and Adam, saved with ``tf.train.Checkpoint(model=, optimizer=)``
    after one training step (``ckpt-1``) and after a second (``ckpt-2``); each save's
    weights per layer."""
    keras.utils.set_random_seed(7)
    model = build()
    opt = keras.optimizers.Adam(0.01)
    model.compile(optimizer=opt, loss="mse")
    x = np.arange(10, dtype=np.int32).reshape(2, 5) % 11
    y = np.linspace(-1, 1, 30, dtype=np.float32).reshape(2, 5, 3)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    prefix = str(tmp_path_factory.mktemp("keras3") / "ckpt")
    saves = []
    for _ in range(2):
        model.train_on_batch(x, y)
        saves.append((ckpt.save(prefix), weights_of(model)))
    return saves


def keys_of(prefix: str, weights: list[np.ndarray]) -> set[str]:
    """The keys TensorFlow stores these layer weights under, found by their values."""
    values = th.tf_reader_values(prefix)
    keys = {
        k
        for k, v in values.items()
        for w in weights
        if v.dtype == w.dtype and v.shape == w.shape and np.array_equal(v, w)
    }
    assert len(keys) == len(weights), keys
    return keys


def same(got: np.ndarray, want) -> bool:
    want = np.asarray(want)
    return got.dtype == want.dtype and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("keep", [LN, "/(gamma|beta)$"])
def test_keep_and_rules_match_the_model_path(trained, tmp_path, keep):
    """The layer normalization stays float32, the head goes to bfloat16 by a rule, the rest
    (the optimizer's slots included, not its learning rate) to float16; TF reads each dtype
    and the values tf.cast gives, and restores the model into layers of those dtypes."""
    (prefix, weights), _ = trained
    rc, _, err = in_process(
        "convert",
        prefix,
        f"{tmp_path}/out/",
        "--dtype",
        "float16",
        "--keep-dtype",
        keep,
        "--dtype-rule",
        f"{HEAD}=bfloat16",
    )
    assert rc == 0, err
    assert f"  dtype keep {keep}: 2 tensors" in err.splitlines(), err
    assert f"  dtype rule {HEAD}=bfloat16: 2 tensors" in err.splitlines(), err
    out = str(tmp_path / "out" / "ckpt-1")
    kept, ruled = keys_of(prefix, weights["ln"]), keys_of(prefix, weights["head"])
    assert all(k.startswith("optimizer/_trainable_variables/") for k in kept | ruled)
    source, got, dtypes = th.tf_reader_values(prefix), th.tf_reader_values(out), th.tf_dtypes(out)
    for k, v in source.items():
        if k in kept or v.dtype.kind != "f" or k == LEARNING_RATE:
            want = v.dtype.name
        else:
            want = "bfloat16" if k in ruled else "float16"
        assert dtypes[k] == want, k
        assert same(got[k], tf.cast(v, want).numpy()), k

    model = build(emb="float16", head="bfloat16")
    tf.train.Checkpoint(model=model).restore(out).assert_existing_objects_matched()
    for name, ws in weights_of(model).items():
        for w, orig in zip(ws, weights[name]):
            assert same(w, tf.cast(orig, w.dtype).numpy()), name


def test_include_and_exclude_match_the_model_path(trained, tmp_path):
    """``--include '^model/'`` keeps the model's weights, keyed by the optimizer, and
    leaves its state; TF restores the model from the result. ``--exclude`` by model path."""
    (prefix, weights), _ = trained
    rc, _, err = in_process("select", prefix, f"{tmp_path}/model/", "--include", "^model/")
    assert rc == 0, err
    out = str(tmp_path / "model" / "ckpt-1")
    model_keys = set().union(*(keys_of(prefix, weights[n]) for n in LAYERS))
    assert set(th.tf_reader_values(out)) == model_keys
    model = build()
    tf.train.Checkpoint(model=model).restore(out).assert_existing_objects_matched()
    for name, ws in weights_of(model).items():
        for w, orig in zip(ws, weights[name]):
            assert same(w, orig), name

    rc, _, err = in_process(
        "select",
        prefix,
        f"{tmp_path}/no_emb/",
        "--include",
        "^model/",
        "--exclude",
        "^model/_operations/1/",
    )
    assert rc == 0, err
    left = set(th.tf_reader_values(str(tmp_path / "no_emb" / "ckpt-1")))
    assert left == model_keys - keys_of(prefix, weights["emb"])


def test_average_keeps_by_the_model_path(trained, tmp_path):
    (p1, w1), (p2, w2) = trained
    rc, _, err = in_process(
        "average", p1, p2, "-o", f"{tmp_path}/avg", "--dtype", "float16", "--keep-dtype", LN
    )
    assert rc == 0, err
    out = str(tmp_path / "avg")
    kept = keys_of(p2, w2["ln"])
    dtypes = th.tf_dtypes(out)
    for k, v in th.tf_reader_values(p2).items():
        keeps = k in kept or v.dtype.kind != "f" or k == LEARNING_RATE
        want = v.dtype.name if keeps else "float16"
        assert dtypes[k] == want, k
    model = build(emb="float16", head="float16")
    tf.train.Checkpoint(model=model).restore(out).assert_existing_objects_matched()
    for w, a, b in zip(model.get_layer("ln").weights, w1["ln"], w2["ln"]):
        assert w.dtype == "float32"
        np.testing.assert_allclose(w.numpy(), (a + b) / 2, rtol=1e-6)


def test_graft_includes_tf2_source_tensors_by_model_path(trained, tmp_path):
    """Into the first save, the layer normalization of the second, chosen by its path."""
    (p1, w1), (p2, w2) = trained
    rc, _, err = in_process(
        "graft", p1, p2, "-o", f"{tmp_path}/g", "--include", LN, "--allow-missing"
    )
    assert rc == 0, err
    model = build()
    tf.train.Checkpoint(model=model).restore(f"{tmp_path}/g").assert_existing_objects_matched()
    got = weights_of(model)
    for name in LAYERS:
        want = w2[name] if name == "ln" else w1[name]
        assert all(same(g, w) for g, w in zip(got[name], want)), name


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A template ``Checkpoint(a=, b=)`` and the saves of ``Checkpoint(a=)`` (save_counter 1)
    and ``Checkpoint(b=)`` (save_counter 2)."""
    d = tmp_path_factory.mktemp("pair")
    pa, pb, va, vb = th.write_tf2_pair(d)
    template = tf.train.Checkpoint(
        a=tf.Variable(np.zeros_like(va)), b=tf.Variable(np.zeros_like(vb))
    )
    return template.save(str(d / "template" / "ckpt")), pa, pb, va, vb


def restore_pair(prefix, va, vb) -> int:
    ckpt = tf.train.Checkpoint(a=tf.Variable(np.zeros_like(va)), b=tf.Variable(np.zeros_like(vb)))
    ckpt.restore(prefix).assert_consumed()
    assert same(ckpt.a.numpy(), va) and same(ckpt.b.numpy(), vb)
    return int(ckpt.save_counter.numpy())


def test_graft_takes_save_counter_from_the_first_source(pair, tmp_path):
    template, pa, pb, va, vb = pair
    for sources, counter in (((pa, pb), 1), ((pb, pa), 2)):
        dst = f"{tmp_path}/{counter}/ckpt"
        rc, out, err = in_process("graft", template, *sources, "-o", dst, "--dry-run", "--json")
        assert rc == 0, err
        assert {(d["source"], d["name"]) for d in json.loads(out)["dropped"]} == {
            (sources[1], "save_counter" + VALUE)
        }
        rc, _, err = in_process("graft", template, *sources, "-o", dst)
        assert rc == 0, err
        assert restore_pair(dst, va, vb) == counter


def test_prefer_is_named_as_the_cli_option(pair, tmp_path):
    template, pa, _, _, _ = pair
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in th.checkpoint_files(pa):
        shutil.copy(f, copy)
    other = str(copy / "ckpt-1")
    result = in_process("graft", template, pa, other, "-o", f"{tmp_path}/g", "--allow-missing")
    assert_cli_error(result, "comes from both", "--prefer first|last")
    result = in_process("merge", pa, other, "-o", f"{tmp_path}/m")
    assert_cli_error(result, "comes from both", "--prefer first|last")
