"""Files people take for checkpoints say what they are, and which command handles them, in
``tfckpt dump``, ``tfckpt.open`` and ``tfckpt.keras.load_weights`` alike (one sniffer:
:mod:`tfckpt.format.filekinds`). Each file is written by the library that makes it."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from cli_helpers import assert_cli_error, in_process

import tfckpt
import tfckpt.keras
from tfckpt.format import filekinds


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{path: fragments its error must hold}, each file made by its own library."""
    torch = pytest.importorskip("torch")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    d = tmp_path_factory.mktemp("kinds")
    out: dict[str, tuple[str, ...]] = {}
    safetensors_numpy.save_file({"w": np.zeros(3, np.float32)}, str(d / "model.safetensors"))
    out[str(d / "model.safetensors")] = ("a safetensors file", "tfckpt import")
    index = {"metadata": {}, "weight_map": {"w": "model.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    out[str(d / "model.safetensors.index.json")] = ("sharded safetensors", "tfckpt import")
    for name in ("model.pt", "pytorch_model.bin", "weights.pth"):
        torch.save({"w": torch.zeros(3)}, d / name)
        out[str(d / name)] = ("a PyTorch pickle", "never unpickles", "tfckpt import")
    # PyTorch's legacy (non-zip) format: a plain pickle stream.
    torch.save({"w": torch.zeros(3)}, d / "legacy.pt", _use_new_zipfile_serialization=False)
    out[str(d / "legacy.pt")] = ("a PyTorch pickle", "never unpickles")
    (d / "state.pkl").write_bytes(pickle.dumps({"w": [0.0]}, protocol=4))
    out[str(d / "state.pkl")] = ("a PyTorch pickle", "never unpickles")
    (d / "model.onnx").write_bytes(b"\x08\x07\x12\x07pytorch")
    out[str(d / "model.onnx")] = ("an ONNX model",)
    return out


@pytest.fixture(scope="module")
def tflite(tmp_path_factory):
    """A TensorFlow Lite model written by TensorFlow's converter."""
    tf = pytest.importorskip("tensorflow")
    module = tf.Module()
    module.v = tf.Variable([1.0, 2.0])
    fn = tf.function(lambda x: x * module.v, input_signature=[tf.TensorSpec([2], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [fn.get_concrete_function()], module
    )
    path = tmp_path_factory.mktemp("tflite") / "model.tflite"
    path.write_bytes(converter.convert())
    return str(path)


@pytest.mark.hf
def test_dump_open_and_load_weights_say_what_the_file_is(files):
    for path, fragments in files.items():
        assert_cli_error(in_process("dump", path), path, "not a TensorFlow checkpoint", *fragments)
        for fn in (tfckpt.open, lambda p: tfckpt.keras.load_weights(None, p)):
            with pytest.raises(tfckpt.UnsupportedCheckpointError) as e:
                fn(path)
            assert all(f in str(e.value) for f in fragments), (path, str(e.value))
            assert "no checkpoint found" not in str(e.value)


def test_tflite(tflite):
    assert_cli_error(in_process("dump", tflite), "TensorFlow Lite model")
    with pytest.raises(tfckpt.UnsupportedCheckpointError, match="TensorFlow Lite"):
        tfckpt.open(tflite)


@pytest.mark.hf
def test_nothing_is_unpickled(files, monkeypatch):
    """Recognised by magic bytes alone: an unpickler that fails the test is never called."""

    def refuse(*args, **kwargs):
        raise AssertionError("unpickled")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    for path in files:
        with pytest.raises(tfckpt.UnsupportedCheckpointError):
            tfckpt.open(path)


def test_every_kind_names_what_handles_it():
    for kind in filekinds.KINDS:
        assert kind.what and kind.instead and kind.message().startswith(kind.what)
    # A zip of checkpoints is not taken for one of them: it opens as an archive.
    head = b"PK\x03\x04" + bytes(22) + (10).to_bytes(2, "little") + bytes(2) + b"run/ckpt-1"
    assert filekinds.identify("runs.zip", head) is None


def test_missing_directory_suggests_a_close_one(tmp_path):
    (tmp_path / "train").mkdir()
    assert_cli_error(
        in_process("dump", tmp_path / "trian" / "model.ckpt-7"),
        f"did you mean {tmp_path / 'train'}?",
    )
