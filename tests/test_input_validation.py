"""Bad input to the command line and the library: a one-line error naming what is wrong
(the file, the tensor, the flag), never a traceback, nothing left at the destination.

Checkpoints are written by TensorFlow; safetensors files by the ``safetensors`` package.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import transform_helpers as th  # noqa: E402  (conftest put tests/ on sys.path)
from cli_helpers import assert_cli_error, in_process, run_text  # noqa: E402

import tfckpt  # noqa: E402


@pytest.fixture(scope="module")
def tf1(tmp_path_factory):
    d = tmp_path_factory.mktemp("validation_tf1")
    return th.save_v2(
        d / "model",
        {
            "dense/kernel": np.arange(6, dtype=np.float32).reshape(2, 3),
            "dense/bias": np.ones(3, np.float32),
            "names": np.array([b"a", b"b"]),
        },
    )


@pytest.fixture(scope="module")
def tf2(tmp_path_factory):
    """A TF2 object-based checkpoint (for flatten)."""
    v = tf.Variable(np.arange(4, dtype=np.float32))
    root = tf.train.Checkpoint(layer=tf.train.Checkpoint(kernel=v))
    return root.write(str(tmp_path_factory.mktemp("validation_tf2") / "ckpt"))


def nothing_in(directory) -> None:
    assert not directory.exists() or list(directory.iterdir()) == [], list(directory.iterdir())


# ---------------------------------------------------------------- --map-file


def test_deeply_nested_map_file_is_one_line_naming_it(tf1, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    out = tmp_path / "out"
    assert_cli_error(
        run_text("rename", tf1, out / "m", "--map-file", deep), str(deep), "nested too deeply"
    )
    nothing_in(out)


@pytest.mark.parametrize(
    "content, fragments",
    [
        ('["dense/bias", "b"]', ["--map-file", "JSON object", "not an array"]),
        ('"dense/bias"', ["--map-file", "JSON object", "not a string"]),
        ('{"dense/bias": 3}', ["--map-file", "'dense/bias'", "string, not a number"]),
        ('{"dense/bias": {"a": "b"}}', ["--map-file", "'dense/bias'", "not an object"]),
        ('{"dense/bias": null}', ["--map-file", "'dense/bias'", "not null"]),
    ],
)
def test_map_file_of_the_wrong_json_types(tf1, tmp_path, content, fragments):
    f = tmp_path / "map.json"
    f.write_text(content)
    assert_cli_error(
        in_process("rename", tf1, tmp_path / "out" / "m", "--map-file", f), str(f), *fragments
    )
    nothing_in(tmp_path / "out")


# ---------------------------------------------------------------- empty names


def test_rename_to_an_empty_name_is_refused_naming_the_tensor(tf1, tmp_path):
    out = tmp_path / "out"
    assert_cli_error(
        in_process("rename", tf1, out / "m", "--map", "dense/bias="),
        "tensor 'dense/bias'",
        "empty name",
    )
    f = tmp_path / "map.json"
    f.write_text(json.dumps({"dense/kernel": ""}))
    assert_cli_error(
        in_process("rename", tf1, out / "m", "--map-file", f), "tensor 'dense/kernel'", "empty name"
    )
    nothing_in(out)
    with pytest.raises(tfckpt.CheckpointError, match="empty name") as e:
        tfckpt.rename(tf1, out / "m", {"na(m)es": ""})
    assert e.value.tensor == "names"
    nothing_in(out)


def test_flatten_to_an_empty_name_is_refused_naming_the_tensor(tf2, tmp_path):
    out = tmp_path / "out"
    line = assert_cli_error(
        in_process("flatten", tf2, out / "m", "--map", "layer/kernel="), "empty name"
    )
    assert "tensor 'layer/kernel'" in line, line
    nothing_in(out)


def test_import_to_an_empty_name_is_refused_naming_the_tensor(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    src = tmp_path / "in.safetensors"
    safetensors_numpy.save_file(
        {"w": np.arange(4, dtype=np.float32), "b": np.zeros(2, np.float32)}, str(src)
    )
    out = tmp_path / "out"
    assert_cli_error(
        in_process("import", src, out / "m", "--map", "w="), "tensor 'w'", "empty name"
    )
    nothing_in(out)


# ---------------------------------------------------------------- numeric options


@pytest.mark.parametrize(
    "option, value",
    [
        ("chunk_bytes", 0),
        ("chunk_bytes", -1),
        ("chunk_bytes", 1.5),
        ("chunk_bytes", None),
        ("max_shard_bytes", 0),
        ("max_shard_bytes", -100),
        ("max_shard_bytes", True),
        ("tf_threshold", -1),
        ("tf_threshold", "64M"),
    ],
)
def test_numeric_options_out_of_range_are_refused_naming_them(tf1, tmp_path, option, value):
    with pytest.raises(tfckpt.CheckpointError, match=rf"^{option} must be a whole number"):
        tfckpt.Options(**{option: value})
    out = tmp_path / "out"
    with pytest.raises(tfckpt.CheckpointError, match=rf"^{option} must be"):
        tfckpt.convert(tf1, out / "m", "float16", **{option: value})
    nothing_in(out)


def test_numeric_options_in_range_are_taken():
    opts = tfckpt.Options(chunk_bytes=1, max_shard_bytes=np.int64(1), tf_threshold=0)
    assert (opts.chunk_bytes, opts.max_shard_bytes, opts.tf_threshold) == (1, 1, 0)


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--executor", "threads:0"], "--executor threads:0"),
        (["--executor", "processes:-2"], "--executor processes:-2"),
    ],
)
def test_executor_worker_count_below_one(tf1, tmp_path, flags, fragment):
    out = tmp_path / "out"
    assert_cli_error(in_process("convert", tf1, out / "m", *flags), fragment, "at least 1")
    nothing_in(out)


def test_size_too_large_for_a_float_is_not_a_size(tf1, tmp_path):
    rc, out, err = in_process("convert", tf1, tmp_path / "m", "--chunk-bytes", "9" * 400)
    assert rc == 2 and "Traceback" not in err and "--chunk-bytes: not a size" in err, err
