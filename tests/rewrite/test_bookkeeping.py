"""Training bookkeeping keeps its dtype through ``convert --dtype float16`` (issue 37, 5).

Real Keras models (tf.keras 2 with float16 layers or the global policy 'float16', Keras 3
under 'float16'), compiled with a metric and fitted, saved in float32 by
``tf.train.Checkpoint``, ``save_weights`` and as SavedModels (tests/keras_bookkeeping.py);
each is converted by the CLI, and the float16 twin of its model restores the result
(``assert_consumed``, ``tf.saved_model.load``) and saves it back unchanged. The oracle of
each tensor's dtype is what TensorFlow itself writes for the float16 twin: the weights and
slots are ``tf.cast`` of the float32 ones bit for bit, the metrics' state and the
optimizer's step and hyperparameters keep their dtype and their values. A TF1 graph of
float16 variables trained by ``AdamOptimizer`` restores its float32 ``beta1_power``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tf_keras")

import keras_bookkeeping as kb  # noqa: E402  (conftest put tests/ on sys.path)
import transform_helpers as th  # noqa: E402
from cli_helpers import assert_cli_error, in_process, run_role  # noqa: E402

import tfckpt  # noqa: E402

# (case, output name) -> the convert flags besides --dtype float16; the name's first
# part is the format converted.
CONVERSIONS = {(case, fmt): [] for case, (_, _, _, formats) in kb.CASES.items() for fmt in formats}
# A tf.keras 2 model under the global policy 'float16' makes its metrics float16 (with
# float16 layers they stay float32): a rule says so, as the docs tell.
CONVERSIONS[("k2-policy", "sm")] = [
    "--dtype-rule",
    "keras_api/metrics/=float16",
    "--overflow",
    "clip",
]


def kept_line(n: int) -> str:
    """What the summary says of ``n`` float32 tensors kept as bookkeeping."""
    return f"kept {n} bookkeeping tensor{'s' if n != 1 else ''} in float32"


def _prefix(d: Path) -> str:
    return str(d / "ckpt") if (d / "ckpt.index").exists() else str(d / "variables" / "variables")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, dict, dict]:
    """The models written, each converted (exit status and stderr per conversion), and
    restored by the twins (restored.json)."""
    out = tmp_path_factory.mktemp("keras_bookkeeping")
    run_role("keras_bookkeeping.py", "write", out)
    converted = {}
    for (case, name), flags in CONVERSIONS.items():
        src = _prefix(out / case / "f32" / name.split("-")[0])
        dst = out / case / "out" / name / "ckpt"
        rc, _, err = in_process("convert", src, str(dst), "--dtype", "float16", *flags)
        converted[case, name] = (rc, err)
    run_role("keras_bookkeeping.py", "restore", out)
    return out, converted, json.loads((out / "restored.json").read_text())


PAIRS = sorted(CONVERSIONS)


@pytest.mark.parametrize("case,name", PAIRS, ids=[f"{c}-{n}" for c, n in PAIRS])
def test_float16_output_restores_into_the_float16_model(runs, case, name):
    out, converted, restored = runs
    rc, err = converted[case, name]
    assert rc == 0, err
    assert restored[f"{case}/{name}"] == "ok", restored[f"{case}/{name}"]
    fmt = name.split("-")[0]
    source = _prefix(out / case / "f32" / fmt)
    model16 = _prefix(out / case / "f16" / fmt)
    written = str(out / case / "out" / name / "ckpt")
    # Each tensor in the dtype TensorFlow gives it in the float16 model, its value tf.cast
    # of the float32 one (bookkeeping: its own, bit for bit).
    want_dtypes = th.tf_dtypes(model16)
    assert th.tf_dtypes(written) == want_dtypes
    values, got = th.tf_reader_values(source), th.tf_reader_values(written)
    for key, value in values.items():
        want = tf.cast(tf.constant(value), tf.as_dtype(want_dtypes[key])).numpy()
        if np.isinf(want).any() and not np.isinf(value).any():  # only with --overflow clip
            want = np.where(np.isinf(want), np.finfo(want.dtype).max, want).astype(want.dtype)
        assert got[key].tobytes() == want.tobytes(), key
    # The model restored it all and saved it back as it was given.
    back = th.tf_reader_values(str(out / case / "back" / name / "ckpt"))
    assert back.keys() == got.keys()
    for key in got:
        assert back[key].dtype == got[key].dtype and back[key].tobytes() == got[key].tobytes()
    # The summary says what was kept: every float32 tensor but what a rule cast.
    kept = sum(d == "float32" for d in want_dtypes.values())
    assert kept_line(kept) in err, err


def test_the_cases_are_the_issue(runs):
    """What the cases must hold for the test above to mean anything: metric counts beyond
    float16 in a tf.keras 2 SavedModel, float32 counters and hyperparameters beside float16
    weights, and each kind of step."""
    out, _, _ = runs
    sm = th.tf_reader_values(_prefix(out / "k2-layers" / "f32" / "sm"))
    counts = {k: v for k, v in sm.items() if k.startswith("keras_api/metrics/")}
    assert counts and max(float(v) for v in counts.values()) > 65504
    for case, step in (
        ("k2-layers", "optimizer/_iterations"),
        ("k2-policy", "optimizer/iter"),
        ("k3-policy", "optimizer/_iterations"),
    ):
        dtypes = th.tf_dtypes(_prefix(out / case / "f16" / "ckpt"))
        assert dtypes[f"{step}/.ATTRIBUTES/VARIABLE_VALUE"] == "int64"
        assert {"float16", "float32"} <= set(dtypes.values())
    policy = th.tf_dtypes(_prefix(out / "k2-policy" / "f16" / "sm"))
    assert policy["keras_api/metrics/0/count/.ATTRIBUTES/VARIABLE_VALUE"] == "float16"
    assert policy["optimizer/beta_1/.ATTRIBUTES/VARIABLE_VALUE"] == "float32"


def test_cast_bookkeeping_casts_it_too(runs, tmp_path):
    """--cast-bookkeeping is the cast as it was: a metric count beyond float16 is an
    overflow, and a checkpoint's learning rate becomes float16."""
    out, _, _ = runs
    sm = _prefix(out / "k2-layers" / "f32" / "sm")
    result = in_process(
        "convert", sm, f"{tmp_path}/sm/", "--dtype", "float16", "--cast-bookkeeping"
    )
    assert_cli_error(result, "keras_api/metrics/")
    ckpt = _prefix(out / "k2-layers" / "f32" / "ckpt")
    rc, _, err = in_process(
        "convert", ckpt, f"{tmp_path}/ck/", "--dtype", "float16", "--cast-bookkeeping"
    )
    assert rc == 0 and "bookkeeping tensor" not in err, err
    dtypes = th.tf_dtypes(f"{tmp_path}/ck/ckpt")
    assert dtypes["optimizer/_learning_rate/.ATTRIBUTES/VARIABLE_VALUE"] == "float16"
    # Without --dtype there is nothing to cast.
    assert_cli_error(
        in_process("convert", ckpt, f"{tmp_path}/none/", "--cast-bookkeeping"),
        "--cast-bookkeeping casts nothing",
    )


def test_library_plan_labels_bookkeeping(runs, tmp_path):
    """In Python: the plan labels each tensor kept as bookkeeping, the summary counts them
    per dtype, and a keep pattern or a rule still decides before it."""
    out, _, _ = runs
    ckpt = _prefix(out / "k2-policy" / "f32" / "ckpt")
    p = tfckpt.plan(ckpt, f"{tmp_path}/a/", cast="float16")
    by = {t.name: t.dtype_by for t in p.tensors}
    books = {n for n, b in by.items() if b == "bookkeeping"}
    assert books == {
        f"optimizer/{n}/.ATTRIBUTES/VARIABLE_VALUE"
        for n in ("learning_rate", "beta_1", "beta_2", "decay")
    }
    planned = p.to_dict()
    assert planned["bookkeeping_kept"] == {"float32": 4}
    assert {t["name"] for t in planned["tensors"] if t["dtype_by"] == "bookkeeping"} == books
    rc, shown, err = in_process(
        "convert", ckpt, f"{tmp_path}/e/", "--dtype", "float16", "--dry-run"
    )
    assert rc == 0 and "would keep 4 bookkeeping tensors in float32" in shown, (shown, err)
    assert not (tmp_path / "e").exists()
    rule = tfckpt.plan(
        ckpt, f"{tmp_path}/b/", cast="float16", dtype_rules=[("optimizer/decay", "bfloat16")]
    )
    assert {t.name: t.new_dtype for t in rule.tensors}[
        "optimizer/decay/.ATTRIBUTES/VARIABLE_VALUE"
    ] == "bfloat16"
    summary = tfckpt.convert(ckpt, f"{tmp_path}/c/", "float16")
    assert summary.bookkeeping_kept == {"float32": 4}
    assert summary.to_dict()["bookkeeping_kept"] == {"float32": 4}
    every = tfckpt.convert(ckpt, f"{tmp_path}/d/", "float16", cast_bookkeeping=True)
    assert every.bookkeeping_kept == {} and every.cast == summary.cast + 4


def _tf1_adam(dtype, prefix: str, save: bool, steps: int = 2) -> dict[str, np.ndarray]:
    """A TF1 graph of ``dtype`` variables trained by ``AdamOptimizer`` with a global step:
    trained ``steps`` and saved to ``prefix``, or restored from it; its variables' values."""
    with tf.Graph().as_default():
        x = tf.constant(np.linspace(-1, 1, 12).reshape(4, 3), dtype)
        w = tf.compat.v1.get_variable(
            "dense/kernel", (3, 2), dtype, tf.compat.v1.ones_initializer()
        )
        b = tf.compat.v1.get_variable("dense/bias", (2,), dtype, tf.compat.v1.zeros_initializer())
        loss = tf.reduce_sum(tf.square(tf.matmul(x, w) + b - 1))
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, global_step=step)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            if save:
                sess.run(tf.compat.v1.global_variables_initializer())
                for _ in range(steps):
                    sess.run(train)
                saver.save(sess, prefix, write_meta_graph=False)
            else:
                saver.restore(sess, prefix)
            return {v.op.name: np.asarray(sess.run(v)) for v in tf.compat.v1.global_variables()}


def test_tf1_adam_powers_keep_float32(tmp_path):
    """TF1's AdamOptimizer keeps beta1_power and beta2_power float32 in a float16 graph
    (it casts them where it uses them): converted (or exported to npz and imported), the
    powers and the step keep their dtype and values, the rest is tf.cast, and the float16
    graph restores it."""
    src = str(tmp_path / "f32" / "model.ckpt")
    values = _tf1_adam(tf.float32, src, save=True)
    f16 = _tf1_adam(tf.float16, str(tmp_path / "f16" / "model.ckpt"), save=True)
    assert f16["beta1_power"].dtype == np.float32 and f16["dense/kernel"].dtype == np.float16
    # convert; and import of its float32 npz export (a name-based output, found by name).
    npz = f"{tmp_path}/model.npz"
    assert in_process("export", src, npz, "--with-bookkeeping")[0] == 0
    runs = [
        ("convert", src, f"{tmp_path}/out/", f"{tmp_path}/out/model.ckpt"),
        ("import", npz, f"{tmp_path}/imported/model.ckpt", f"{tmp_path}/imported/model.ckpt"),
    ]
    for command, given, dst, prefix in runs:
        rc, _, err = in_process(command, given, dst, "--dtype", "float16")
        assert rc == 0, err
        restored = _tf1_adam(tf.float16, prefix, save=False)
        assert kept_line(2) in err, err
        assert restored.keys() == values.keys()
        for name, value in values.items():
            want = tf.cast(value, f16[name].dtype).numpy()  # the powers and the step: their own
            got = restored[name]
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (command, name)
        assert int(restored["global_step"]) == 2
