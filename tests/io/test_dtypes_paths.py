"""DataType numbers and names (``tfckpt.format.dtypes``), checkpoint path resolution (``tfckpt.io.paths``)
and the error classes (``tfckpt.errors``). No TensorFlow here."""

from __future__ import annotations

import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tfckpt
from tfckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    TensorNotFoundError,
    UnsupportedCheckpointError,
)
from tfckpt.format import dtypes
from tfckpt.io import paths

# --- dtypes -----------------------------------------------------------------------

# DataType number -> tf.as_dtype(n).name (FORMAT.md's table), numpy itemsize (None: variable).
TF_DTYPES = {
    1: ("float32", 4),
    2: ("float64", 8),
    3: ("int32", 4),
    4: ("uint8", 1),
    5: ("int16", 2),
    6: ("int8", 1),
    7: ("string", None),
    8: ("complex64", 8),
    9: ("int64", 8),
    10: ("bool", 1),
    11: ("qint8", 1),
    12: ("quint8", 1),
    13: ("qint32", 4),
    14: ("bfloat16", 2),
    15: ("qint16", 2),
    16: ("quint16", 2),
    17: ("uint16", 2),
    18: ("complex128", 16),
    19: ("float16", 2),
    20: ("resource", None),
    21: ("variant", None),
    22: ("uint32", 4),
    23: ("uint64", 8),
    24: ("float8_e5m2", 1),
    25: ("float8_e4m3fn", 1),
    26: ("float8_e4m3fnuz", 1),
    27: ("float8_e4m3b11fnuz", 1),
    28: ("float8_e5m2fnuz", 1),
    29: ("int4", 1),
    30: ("uint4", 1),
    31: ("int2", 1),
    32: ("uint2", 1),
    33: ("float4_e2m1fn", 1),
}


@pytest.mark.parametrize("enum", sorted(TF_DTYPES))
def test_dtype_number_and_name(enum):
    name, itemsize = TF_DTYPES[enum]
    d = dtypes.from_enum(enum)
    assert d.enum == enum
    assert d.name == name
    assert str(d) == name
    assert d.itemsize == itemsize
    assert dtypes.lookup(enum) is d
    assert dtypes.lookup(np.int32(enum)) is d
    assert dtypes.lookup(name) is d
    assert dtypes.lookup(d) is d


def test_all_dtypes_complete():
    assert sorted(d.enum for d in dtypes.all_dtypes()) == list(range(1, 34))
    assert len({d.name for d in dtypes.all_dtypes()}) == 33


@pytest.mark.parametrize("enum", [0, 34, 100, 101, 119, -1, 2**31])
def test_unknown_dtype_number(enum):
    with pytest.raises(UnsupportedCheckpointError, match=str(enum)):
        dtypes.from_enum(enum)
    with pytest.raises(UnsupportedCheckpointError):
        dtypes.lookup(enum)


def test_unknown_dtype_number_names_path_and_tensor():
    with pytest.raises(UnsupportedCheckpointError) as ei:
        dtypes.from_enum(99, path="/x/m.index", tensor="dense/kernel")
    e = ei.value
    assert e.path == "/x/m.index" and e.tensor == "dense/kernel"
    assert "/x/m.index" in str(e) and "dense/kernel" in str(e) and "99" in str(e)


@pytest.mark.parametrize(
    "alias,name",
    [
        ("half", "float16"),
        ("float", "float32"),
        ("double", "float64"),
    ],
)
def test_dtype_aliases(alias, name):
    assert dtypes.lookup(alias).name == name


@pytest.mark.parametrize(
    "spec,name",
    [
        (np.float32, "float32"),
        (np.dtype("float64"), "float64"),
        (np.int8, "int8"),
        (np.uint16, "uint16"),
        (np.uint32, "uint32"),
        (np.uint64, "uint64"),
        (np.int64, "int64"),
        (np.bool_, "bool"),
        (np.complex64, "complex64"),
        (np.complex128, "complex128"),
        (np.float16, "float16"),
        (ml_dtypes.bfloat16, "bfloat16"),
        (ml_dtypes.float8_e4m3fn, "float8_e4m3fn"),
        (ml_dtypes.float8_e5m2, "float8_e5m2"),
        (ml_dtypes.float8_e4m3fnuz, "float8_e4m3fnuz"),
        (ml_dtypes.float8_e4m3b11fnuz, "float8_e4m3b11fnuz"),
        (ml_dtypes.float8_e5m2fnuz, "float8_e5m2fnuz"),
        (ml_dtypes.int4, "int4"),
        (ml_dtypes.uint4, "uint4"),
        (ml_dtypes.int2, "int2"),
        (ml_dtypes.uint2, "uint2"),
        (ml_dtypes.float4_e2m1fn, "float4_e2m1fn"),
        (np.dtype(">f4"), "float32"),
        (np.dtype(">i8"), "int64"),  # big-endian views
        ("<f2", "float16"),
        (object, "string"),
        (np.bytes_, "string"),
        (np.dtype("S5"), "string"),
    ],
)
def test_dtype_from_numpy(spec, name):
    assert dtypes.lookup(spec).name == name


def test_every_numeric_dtype_maps_back_from_its_numpy():
    for d in dtypes.all_dtypes():
        if d.numpy is not None:
            assert dtypes.lookup(d.numpy) is d, d.name


def test_dtype_kinds_and_swap_units():
    f = dtypes.lookup
    assert f("float16").is_floating and f("bfloat16").is_floating
    assert not f("int32").is_floating
    assert f("complex64").swap_unit == 4 and f("complex128").swap_unit == 8
    assert f("float64").swap_unit == 8 and f("bool").swap_unit == 1
    assert f("string").numpy is None and f("string").itemsize is None
    assert f("qint8").kind == "quantized" and f("qint32").itemsize == 4


@pytest.mark.parametrize("spec", ["nonsense", "float128x", "flaot32"])
def test_dtype_unknown_spec(spec):
    with pytest.raises(ValueError):
        dtypes.lookup(spec)


def test_dtype_names_are_read_in_any_case():
    assert dtypes.lookup("Float32").name == "float32" and dtypes.lookup("BF16").name == "bfloat16"


# --- errors ------------------------------------------------------------------------


def test_error_hierarchy_and_message():
    assert issubclass(CorruptCheckpointError, CheckpointError)
    assert issubclass(UnsupportedCheckpointError, CheckpointError)
    assert issubclass(CheckpointNotFoundError, CheckpointError)
    assert issubclass(TensorNotFoundError, CheckpointNotFoundError)
    assert issubclass(TensorNotFoundError, KeyError)
    assert tfckpt.CorruptCheckpointError is CorruptCheckpointError
    e = CorruptCheckpointError("bad crc", path="/a/b.index", tensor="w")
    assert str(e) == "/a/b.index: tensor 'w': bad crc"
    assert e.detail == "bad crc" and e.path == "/a/b.index" and e.tensor == "w"
    assert str(CheckpointError("plain")) == "plain"
    # KeyError's str() would add quotes; the message stays readable.
    assert str(TensorNotFoundError("no such tensor", tensor="x")) == "tensor 'x': no such tensor"


# --- paths: file names -----------------------------------------------------------------


def test_file_names():
    assert paths.index_filename("d/model.ckpt-7") == "d/model.ckpt-7.index"
    assert paths.data_filename("d/model.ckpt-7", 0, 1) == "d/model.ckpt-7.data-00000-of-00001"
    assert paths.data_filename("p", 12, 100) == "p.data-00012-of-00100"
    assert paths.parse_data_filename("a/b.ckpt-7.data-00002-of-00010") == ("a/b.ckpt-7", 2, 10)
    assert paths.parse_data_filename("p.data-00000-of-100000") == ("p", 0, 100000)
    assert paths.parse_data_filename("p.index") is None
    assert paths.parse_data_filename("p.data-0-of-1") is None
    assert paths.parse_data_filename("p.data-00000-of-00001.tmp") is None


# --- paths: resolution ------------------------------------------------------------------


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def make_ckpt(prefix: Path, shards: int = 1) -> Path:
    touch(Path(f"{prefix}.index"))
    for i in range(shards):
        touch(Path(f"{prefix}.data-{i:05d}-of-{shards:05d}"))
    return prefix


def test_resolve_prefix(tmp_path):
    p = make_ckpt(tmp_path / "train" / "model.ckpt-7")
    assert paths.resolve_prefix(str(p)) == str(p)
    assert paths.resolve_prefix(p) == str(p)  # os.PathLike


def test_resolve_index_path(tmp_path):
    p = make_ckpt(tmp_path / "model.ckpt-7")
    assert paths.resolve_prefix(f"{p}.index") == str(p)


def test_resolve_data_path(tmp_path):
    p = make_ckpt(tmp_path / "model.ckpt-7", shards=3)
    assert paths.resolve_prefix(f"{p}.data-00001-of-00003") == str(p)


def test_resolve_data_path_without_index(tmp_path):
    data = touch(tmp_path / "model.ckpt-7.data-00000-of-00001")
    with pytest.raises(CheckpointNotFoundError):
        paths.resolve_prefix(data)


def test_resolve_dir_with_relative_state_file(tmp_path):
    make_ckpt(tmp_path / "model.ckpt-5")
    p = make_ckpt(tmp_path / "model.ckpt-7")
    (tmp_path / "checkpoint").write_text(
        'model_checkpoint_path: "model.ckpt-7"\n'
        'all_model_checkpoint_paths: "model.ckpt-5"\n'
        'all_model_checkpoint_paths: "model.ckpt-7"\n'
    )
    assert paths.resolve_prefix(tmp_path) == str(p)
    assert paths.latest_checkpoint(str(tmp_path)) == str(p)


def test_resolve_dir_with_absolute_state_file(tmp_path):
    p = make_ckpt(tmp_path / "elsewhere" / "model.ckpt-9")
    d = tmp_path / "run"
    d.mkdir()
    (d / "checkpoint").write_text(f'model_checkpoint_path: "{p}"\n')
    assert paths.resolve_prefix(d) == str(p)
    assert paths.latest_checkpoint(str(d)) == str(p)


def test_state_file_wins_over_single_index(tmp_path):
    make_ckpt(tmp_path / "other")
    p = make_ckpt(tmp_path / "sub" / "model.ckpt-3")
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "sub/model.ckpt-3"')
    assert paths.resolve_prefix(tmp_path) == str(p)


def test_resolve_saved_model_dir(tmp_path):
    touch(tmp_path / "saved_model.pb")
    make_ckpt(tmp_path / "variables" / "variables")
    assert paths.resolve_prefix(tmp_path) == str(tmp_path / "variables" / "variables")


def test_resolve_variables_dir_of_saved_model(tmp_path):
    make_ckpt(tmp_path / "variables" / "variables")
    assert paths.resolve_prefix(tmp_path / "variables") == str(tmp_path / "variables" / "variables")


def test_resolve_dir_with_single_index(tmp_path):
    p = make_ckpt(tmp_path / "weights.ckpt")
    touch(tmp_path / "notes.txt")
    assert paths.resolve_prefix(tmp_path) == str(p)


def test_missing_path(tmp_path):
    missing = tmp_path / "nope" / "model.ckpt-7"
    with pytest.raises(CheckpointNotFoundError) as ei:
        paths.resolve_prefix(missing)
    msg = str(ei.value)
    assert f"{missing}.index" in msg  # says what was looked for
    assert ei.value.path == str(missing)


def test_missing_index_path(tmp_path):
    missing = tmp_path / "model.ckpt-7.index"
    with pytest.raises(CheckpointNotFoundError) as ei:
        paths.resolve_prefix(missing)
    assert str(missing) in str(ei.value)


def test_empty_dir(tmp_path):
    with pytest.raises(CheckpointNotFoundError) as ei:
        paths.resolve_prefix(tmp_path)
    msg = str(ei.value)
    assert str(tmp_path) in msg
    assert "checkpoint" in msg and "variables/variables.index" in msg and ".index" in msg


def test_dir_with_two_indexes_is_ambiguous(tmp_path):
    make_ckpt(tmp_path / "a")
    make_ckpt(tmp_path / "b")
    with pytest.raises(CheckpointNotFoundError, match="found 2 .index files: a.index, b.index"):
        paths.resolve_prefix(tmp_path)


def test_state_file_naming_missing_checkpoint(tmp_path):
    make_ckpt(tmp_path / "model.ckpt-5")  # exists, but is not the one named
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-7"\n')
    with pytest.raises(CheckpointNotFoundError) as ei:
        paths.resolve_prefix(tmp_path)
    msg = str(ei.value)
    assert "model.ckpt-7" in msg and str(tmp_path / "model.ckpt-7.index") in msg
    assert ei.value.path == str(tmp_path / "checkpoint")


@pytest.mark.parametrize(
    "content",
    [
        b"this is not a text proto\n",
        b'model_checkpoint_path: "unterminated\n',
        b"unknown_field: 3\n",
        b"model_checkpoint_path: 7\n",
        b"\xff\xfe\x00garbage",
    ],
)
def test_garbage_state_file(tmp_path, content):
    make_ckpt(tmp_path / "model.ckpt-7")
    (tmp_path / "checkpoint").write_bytes(content)
    with pytest.raises(CorruptCheckpointError) as ei:
        paths.resolve_prefix(tmp_path)
    assert ei.value.path == str(tmp_path / "checkpoint")
    assert str(tmp_path / "checkpoint") in str(ei.value)


def test_state_file_without_latest_is_an_error(tmp_path):
    # An empty state file names nothing (TensorFlow raises); the single .index is not taken.
    make_ckpt(tmp_path / "model.ckpt-7")
    (tmp_path / "checkpoint").write_text("")
    with pytest.raises(CorruptCheckpointError, match="names no checkpoint"):
        paths.latest_checkpoint(str(tmp_path))
    with pytest.raises(CorruptCheckpointError, match="names no checkpoint"):
        paths.resolve_prefix(tmp_path)


def test_latest_checkpoint_without_state_file(tmp_path):
    make_ckpt(tmp_path / "model.ckpt-7")
    assert paths.latest_checkpoint(str(tmp_path)) is None
    assert tfckpt.latest_checkpoint is paths.latest_checkpoint


def test_relative_prefix(tmp_path, monkeypatch):
    make_ckpt(tmp_path / "train" / "model.ckpt-7")
    monkeypatch.chdir(tmp_path)
    assert paths.resolve_prefix("train/model.ckpt-7") == "train/model.ckpt-7"
    assert paths.resolve_prefix("train/model.ckpt-7.index") == "train/model.ckpt-7"
    (tmp_path / "train" / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-7"')
    assert paths.resolve_prefix("train") == os.path.join("train", "model.ckpt-7")
