"""tfckpt.keras.load_weights: checkpoints written by tf.keras 2.x, Keras 3 on TensorFlow and
TF1, loaded by Keras 3 on JAX in a process where TensorFlow cannot be imported.

The writing and the loading each run once, in a process of their own
(tests/keras_checkpoints.py); the tests here judge what the loader recorded against
TensorFlow's own reading of the same files (``tf.train.load_variable``, ``tf.cast``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras_checkpoints as kc
import numpy as np
import pytest
from cli_helpers import run_role

import tfckpt

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tf_keras")
pytest.importorskip("jax")
pytestmark = pytest.mark.jax

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]  # the shared helpers

# JAX and TensorFlow run different CPU kernels (XLA vs Eigen/oneDNN): the same float32
# weights can give predictions that differ by accumulation order; they are compared at
# kc.prediction_tolerance, derived from the models' sums. The weights themselves are
# compared bit for bit.

CASES = [f"{case}-{tag}" for case in kc.MODELS for tag in ("k2", "k2w", "k3")]


def _run(role: str, out: Path, **env) -> None:
    run_role("keras_checkpoints.py", role, out, **env)


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("keras")
    _run("write", d)
    _run("load", d, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    _run("load-numpy", d, KERAS_BACKEND="numpy")
    return d


def _result(out: Path, name: str, results="results") -> tuple[dict, dict[str, np.ndarray]]:
    record = json.loads((out / results / f"{name}.json").read_text())
    with np.load(out / results / f"{name}.npz") as z:
        arrays = {k: z[k] for k in z.files}
    return record, arrays


def _loaded(record: dict) -> dict:
    assert "error" not in record, record["error"]["traceback"]
    return record["report"]


def _tf_value(out: Path, source: str, tensor: str, dtype: str | None = None) -> np.ndarray:
    value = tf.train.load_variable(str(out / source / "ckpt"), tensor)
    if dtype is not None:
        value = tf.cast(value, dtype).numpy()
    return value.view(f"u{value.dtype.itemsize}")


def test_loader_never_imports_tensorflow(out):
    summary = json.loads((out / "results" / "summary.json").read_text())
    assert summary == {"backend": "jax", "tensorflow_imported": []}


@pytest.mark.parametrize("name", CASES)
def test_predictions_and_weights_equal_the_original(out, name):
    record, arrays = _result(out, name)
    report = _loaded(record)
    assert sorted(report["loaded"]) == sorted(record["dtypes"])
    assert report["missing"] == [] and report["mismatched"] == {} and report["cast"] == {}
    for path, tensor in report["loaded"].items():
        np.testing.assert_array_equal(arrays[path], _tf_value(out, name, tensor), err_msg=path)
    want = np.load(out / name / "io.npz")["pred"]
    np.testing.assert_allclose(arrays["__pred__"], want, rtol=0, atol=kc.prediction_tolerance(want))


@pytest.mark.parametrize("name", kc.NUMPY_JOBS)
def test_numpy_backend(out, name):
    summary = json.loads((out / "results-numpy" / "summary.json").read_text())
    assert summary == {"backend": "numpy", "tensorflow_imported": []}
    record, arrays = _result(out, name, "results-numpy")
    report = _loaded(record)
    assert sorted(report["loaded"]) == sorted(record["dtypes"])
    for path, tensor in report["loaded"].items():
        np.testing.assert_array_equal(arrays[path], _tf_value(out, name, tensor), err_msg=path)
    want = np.load(out / name / "io.npz")["pred"]
    np.testing.assert_allclose(arrays["__pred__"], want, rtol=0, atol=kc.prediction_tolerance(want))


def test_optimizer_state_is_reported_unused(out):
    for name in ("seq-k2w", "seq-k2", "seq-k3"):
        unused = _loaded(_result(out, name)[0])["unused"]
        assert any("optimizer/" in t for t in unused), (name, unused)
        assert not any("/d1/" in t or "layer_with_weights-0/" in t for t in unused), unused


def test_shared_layer_loads_once(out):
    report = _loaded(_result(out, "shared-k2w")[0])
    assert list(report["loaded"].items()) == [
        ("shared/kernel", "layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"),
        ("shared/bias", "layer_with_weights-0/bias/.ATTRIBUTES/VARIABLE_VALUE"),
        ("head/kernel", "layer_with_weights-1/kernel/.ATTRIBUTES/VARIABLE_VALUE"),
        ("head/bias", "layer_with_weights-1/bias/.ATTRIBUTES/VARIABLE_VALUE"),
    ]


def test_tf1_checkpoint_through_assignment_map_with_a_partitioned_variable(out):
    record, arrays = _result(out, "tf1")
    report = _loaded(record)
    assert sorted(report["loaded"].values()) == [
        "legacy/hidden/bias",
        "legacy/hidden/kernel",
        "legacy/out/bias",
        "legacy/out/kernel",
    ]
    assert report["unused"] == ["global_step"]
    with tfckpt.open(str(out / "tf1" / "ckpt")) as ckpt:
        assert ckpt.info("legacy/hidden/kernel").partitioned
    for path, tensor in report["loaded"].items():
        np.testing.assert_array_equal(arrays[path], _tf_value(out, "tf1", tensor), err_msg=path)
    want = np.load(out / "tf1" / "io.npz")["pred"]
    np.testing.assert_allclose(arrays["__pred__"], want, rtol=0, atol=kc.prediction_tolerance(want))


@pytest.mark.parametrize("policy", ["float16", "bfloat16"])
def test_16_bit_model_gets_float32_weights_cast_as_tf_cast(out, policy):
    record, arrays = _result(out, policy)
    report = _loaded(record)
    assert set(record["dtypes"].values()) == {policy}
    assert len(report["loaded"]) == 8
    for path, tensor in report["loaded"].items():
        assert report["cast"][path] == {"from": "float32", "to": policy}
        np.testing.assert_array_equal(
            arrays[path], _tf_value(out, "seq-k2w", tensor, policy), err_msg=path
        )


def test_mixed_float16_keeps_float32_variables_bit_exact(out):
    record, arrays = _result(out, "mixed_float16")
    report = _loaded(record)
    assert set(record["dtypes"].values()) == {"float32"} and report["cast"] == {}
    for path, tensor in report["loaded"].items():
        np.testing.assert_array_equal(arrays[path], _tf_value(out, "seq-k2w", tensor))


def test_missing_layer_is_a_clean_error_and_nothing_is_assigned(out):
    record, _ = _result(out, "missing")
    error = record["error"]
    assert error["type"] == "KerasWeightsError"
    assert "seq-k2w/ckpt" in error["message"]
    assert "no tensor for seq/extra/kernel" in error["message"]
    assert "'extra'" in error["message"]
    assert sorted(record["unchanged"]) == sorted(record["dtypes"])


def test_missing_layer_allowed(out):
    record, arrays = _result(out, "missing-allowed")
    report = _loaded(record)
    assert report["missing"] == ["seq/extra/kernel", "seq/extra/bias"]
    assert len(report["loaded"]) == 8
    assert sorted(record["unchanged"]) == ["seq/extra/bias", "seq/extra/kernel"]
    for path, tensor in report["loaded"].items():
        np.testing.assert_array_equal(arrays[path], _tf_value(out, "seq-k2w", tensor))


def test_shape_mismatch_is_a_clean_error_naming_both_shapes(out):
    record, _ = _result(out, "mismatch")
    error = record["error"]
    assert error["type"] == "KerasWeightsError"
    assert "seq-k3/ckpt" in error["message"]
    assert "seq/d1/kernel" in error["message"]
    assert "has shape [3, 8], the variable [3, 9]" in error["message"]
    assert sorted(record["unchanged"]) == sorted(record["dtypes"])


def test_shape_mismatch_skipped(out):
    record, arrays = _result(out, "mismatch-skipped")
    report = _loaded(record)
    assert report["mismatched"]["seq/d1/kernel"]["checkpoint_shape"] == [3, 8]
    assert report["mismatched"]["seq/d1/kernel"]["variable_shape"] == [3, 9]
    assert list(report["loaded"]) == ["seq/out/bias"]
    assert "seq/out/bias" not in record["unchanged"]
    assert "seq/d1/kernel" in record["unchanged"]


def test_import_tfckpt_keras_imports_neither_keras_nor_tensorflow():
    code = (
        "import sys, tfckpt, tfckpt.keras; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('keras', 'tensorflow')); "
        "assert not bad, bad"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_overflow_is_an_error_and_nothing_is_assigned(out):
    record, _ = _result(out, "overflow")
    error = record["error"]
    assert error["type"] == "CastOverflowError"
    assert (
        "tf1-big/ckpt" in error["message"] and "tf1_model/out/bias (2 values)" in error["message"]
    )
    assert sorted(record["unchanged"]) == sorted(record["dtypes"])


def test_overflow_clip(out):
    record, arrays = _result(out, "overflow-clip")
    report = _loaded(record)
    bias = arrays["tf1_model/out/bias"].view("float16")
    np.testing.assert_array_equal(bias, np.array([65504, -65504], "float16"))
    kernel = report["loaded"]["tf1_model/out/kernel"]
    np.testing.assert_array_equal(
        arrays["tf1_model/out/kernel"], _tf_value(out, "tf1-big", kernel, "float16")
    )


def test_checkpoint_without_a_keras_model_is_a_clean_error(out):
    record = _result(out, "no-model")[0]
    error = record["error"]
    assert error["type"] == "KerasWeightsError"
    assert "plain/ckpt" in error["message"] and "no tensor for seq/d1/kernel" in error["message"]
    assert "assignment_map" in error["message"]
    assert sorted(record["unchanged"]) == sorted(record["dtypes"])


def test_keras_3_on_tensorflow_loads_tf_keras_weights(out):
    record = json.loads((out / "results-tf" / "seq-k2w.json").read_text())
    with np.load(out / "results-tf" / "seq-k2w.npz") as z:
        arrays = {k: z[k] for k in z.files}
    report = record["report"]
    assert len(report["loaded"]) == 8 and report["missing"] == []
    for path, tensor in report["loaded"].items():
        np.testing.assert_array_equal(arrays[path], _tf_value(out, "seq-k2w", tensor))
    want = np.load(out / "seq-k2w" / "io.npz")["pred"]
    np.testing.assert_allclose(arrays["__pred__"], want, rtol=0, atol=kc.prediction_tolerance(want))


def test_tf2_checkpoint_by_name_through_assignment_map(out):
    record, arrays = _result(out, "by-name")
    report = _loaded(record)
    assert report["loaded"]["seq/out/kernel"] == (
        "layer_with_weights-2/kernel/.ATTRIBUTES/VARIABLE_VALUE"
    )
    assert sorted(report["loaded"]) == sorted(record["dtypes"])
    for path, tensor in report["loaded"].items():
        np.testing.assert_array_equal(arrays[path], _tf_value(out, "seq-k2w", tensor))


def test_two_tensors_mapped_to_one_variable_is_an_error(out):
    record = _result(out, "by-name-clash")[0]
    error = record["error"]
    assert error["type"] == "CheckpointError"
    assert "both 'layer_with_weights-0/bias/.ATTRIBUTES/VARIABLE_VALUE' and " in error["message"]
    assert "map to the variable 'seq/d1/bias'" in error["message"]
    assert "seq-k2w/ckpt" in error["message"]
    assert sorted(record["unchanged"]) == sorted(record["dtypes"])


def test_tf1_checkpoint_without_assignment_map_names_what_is_missing(out):
    record = _result(out, "tf1-no-map")[0]
    error = record["error"]
    assert error["type"] == "KerasWeightsError"
    assert "tf1/ckpt" in error["message"]
    assert (
        "no tensor for tf1_model/hidden/kernel (no tensor's name (no assignment_map given)"
        in (error["message"])
    )
    assert sorted(record["unchanged"]) == sorted(record["dtypes"])


_COUNT_VISITS = r"""
import json, sys
import keras
import numpy as np
import tfckpt.keras
from tfckpt.format.objectgraph import ObjectGraph

class CountingNodes:  # the parsed graph's real nodes, each look-up counted
    def __init__(self, nodes):
        self.nodes, self.count = nodes, 0
    def __len__(self):
        return len(self.nodes)
    def __getitem__(self, i):
        self.count += 1
        return self.nodes[i]

made = []
real = ObjectGraph.nodes.fget
ObjectGraph.nodes = property(lambda self: made.append(CountingNodes(real(self))) or made[-1])
prefix, layers = sys.argv[1], int(sys.argv[2])
model = keras.Sequential([keras.Input((2,))] + [keras.layers.Dense(2) for _ in range(layers)])
report = tfckpt.keras.load_weights(model, prefix)
values = {v.path: np.asarray(v).tolist() for v in model.weights}
print(json.dumps({"visits": sum(m.count for m in made), "loaded": report.loaded,
                  "unused": report.unused, "values": values}))
"""


def _shared_chain_checkpoint(d: Path, layers: int, chain: int) -> str:
    """A tf.keras-style layer list whose layers all hold one long shared chain of
    objects, a variable at its end (a tied table, say)."""
    head = node = tf.Module()
    for _ in range(chain - 1):
        node.next = tf.Module()
        node = node.next
    node.table = tf.Variable(np.arange(3, dtype=np.float32))
    model = tf.Module()
    for k in range(layers):
        layer = tf.Module()
        layer.kernel = tf.Variable(np.full((2, 2), k, dtype=np.float32))
        layer.bias = tf.Variable(np.full((2,), -k, dtype=np.float32))
        layer.shared = head
        setattr(model, f"layer_with_weights-{k}", layer)
    return tf.train.Checkpoint(model=model).write(str(d / "ckpt"))


def test_layers_sharing_a_long_chain_load_in_one_walk(tmp_path):
    layers = 30
    visits = {}
    for chain in (500, 1500):
        prefix = _shared_chain_checkpoint(tmp_path / str(chain), layers, chain)
        done = subprocess.run(
            [sys.executable, "-c", _COUNT_VISITS, prefix, str(layers)],
            env=dict(
                os.environ,
                PYTHONPATH=str(ROOT),
                KERAS_BACKEND="jax",
                JAX_PLATFORMS="cpu",
            ),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        assert len(got["loaded"]) == 2 * layers
        kernels = [v for p, v in got["values"].items() if p.endswith("kernel")]
        biases = [v for p, v in got["values"].items() if p.endswith("bias")]
        assert kernels == [np.full((2, 2), k).tolist() for k in range(layers)]
        assert biases == [np.full((2,), -k).tolist() for k in range(layers)]
        assert [u for u in got["unused"] if "table" in u]  # below every layer, taken by none
        visits[chain] = got["visits"]
    nodes = {c: c + 2 + 3 * layers for c in visits}  # chain, root, model, layers' 3 each
    for chain, n in visits.items():
        assert n <= 4 * nodes[chain] + 10 * layers, visits  # was layers x chain
    # a thousand more chain objects: a few thousand more look-ups, not layers thousand
    assert visits[1500] - visits[500] <= 4 * 1000, visits
