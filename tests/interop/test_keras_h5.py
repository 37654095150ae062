"""tfckpt.keras.load_weights of Keras 2 HDF5 files: tf.keras writes them (``save_weights``
to ``.h5`` and whole models with ``save``), Keras 3 on JAX loads them in a process where
TensorFlow cannot be imported (tests/keras_h5.py). Every weight equals, bit for bit,
what h5py reads from the file's dataset; predictions equal tf.keras's."""

from __future__ import annotations

import json
from pathlib import Path

import keras_checkpoints as kc
import numpy as np
import pytest
from cli_helpers import run_role

import tfckpt

pytestmark = pytest.mark.jax

pytest.importorskip("tf_keras")
pytest.importorskip("jax")
h5py = pytest.importorskip("h5py")

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
CASES = ["seq", "shared", "cnn", "nested", "lstm", "sub"]


def _run(role: str, out: Path, **env) -> None:
    run_role("keras_h5.py", role, out, **env)


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("keras_h5")
    _run("write", d)
    _run("load", d, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    return d


def _result(out: Path, name: str) -> tuple[dict, dict[str, np.ndarray]]:
    record = json.loads((out / "results" / f"{name}.json").read_text())
    with np.load(out / "results" / f"{name}.npz") as z:
        return record, {k: z[k] for k in z.files}


def test_the_loader_never_imports_tensorflow(out):
    summary = json.loads((out / "results" / "summary.json").read_text())
    assert summary == {"tensorflow_imported": []}


@pytest.mark.parametrize(
    "name", [f"{c}-{f}" for c in CASES for f in "wm" if not (c == "sub" and f == "m")]
)
def test_weights_are_the_files_and_predictions_equal_keras_2s(out, name):
    case, kind = name.split("-")
    path = out / case / f"{kind}.h5"
    record, arrays = _result(out, name)
    assert "error" not in record, record["error"]["traceback"]
    report = record["report"]
    assert report["missing"] == [] and report["mismatched"] == {} and report["unused"] == []
    assert sorted(report["loaded"]) == sorted(k for k in arrays if k != "__pred__")
    with tfckpt.open(path) as ckpt, h5py.File(path, "r") as f:
        for var, tensor in report["loaded"].items():
            want = f[ckpt.dataset_path(tensor)][()]
            got = arrays[var]
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), var
    want = np.load(out / case / "io.npz")["pred"]
    np.testing.assert_allclose(arrays["__pred__"], want, rtol=0, atol=kc.prediction_tolerance(want))


def test_a_whole_model_file_keeps_its_optimizer_apart(out):
    path = out / "seq" / "m.h5"
    with tfckpt.open(path) as model, tfckpt.open(f"{path}/optimizer_weights") as opt:
        assert not any("Adam" in n or "iteration" in n for n in model.keys())
        assert "iteration" in opt.keys() and any(n.startswith("Adam/m/") for n in opt.keys())
        with h5py.File(path, "r") as f:
            for name in opt.keys():
                assert opt[name].tobytes() == f[opt.dataset_path(name)][()].tobytes(), name


def test_a_layer_the_file_lacks_is_named_and_nothing_is_assigned(out):
    record, arrays = _result(out, "extra-layer")
    message = record["error"]["message"]
    assert "no tensor for seq/extra/kernel" in message and "lists 3 such layers" in message
    assert sorted(record["unchanged"]) == sorted(k for k in arrays if k != "__pred__")


def test_a_shape_that_differs_names_both_shapes_and_nothing_is_assigned(out):
    record, arrays = _result(out, "wider")
    message = record["error"]["message"]
    assert "'d1/kernel' has shape [3, 8], the variable [3, 9]" in message
    assert sorted(record["unchanged"]) == sorted(k for k in arrays if k != "__pred__")
