"""Value transforms (permute, reshape, squeeze) on every rewriting command, against numpy.

Each output is read back by tfckpt and, where TensorFlow is installed, by TensorFlow's
own reader; tensors larger than the chunk budget are permuted tile by tile.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import tfckpt

RNG = np.random.default_rng(7)
SOURCE = {
    "h0/attn/c_attn/w": RNG.standard_normal((1, 24, 72)).astype(np.float32),
    "h0/attn/c_attn/b": RNG.standard_normal((72,)).astype(np.float32),
    "dense/kernel": RNG.standard_normal((300, 500)).astype(np.float32),  # > the budget
    "conv/kernel": RNG.standard_normal((3, 3, 4, 8)).astype(np.float16),
    "qkv": np.arange(2 * 12, dtype=np.int32).reshape(2, 12),
    "mask": RNG.standard_normal((4, 1, 5)) > 0,
    "vocab": np.array([b"a", b"bc"], dtype=object),
    "step": np.array(9, np.int64),
}
CHUNK = 64 << 10  # dense/kernel is 600 KB: many tiles
TRANSFORMS = dict(
    permute=[("dense/kernel$", (1, 0)), ("conv/kernel$", (3, 2, 0, 1))],
    reshape=[("qkv$", (2, 3, -1)), ("conv/kernel$", (8, -1))],
    squeeze=["/w$", "^mask$"],
)


def expected() -> dict[str, np.ndarray]:
    """What the transforms make of SOURCE, by numpy."""
    want = dict(SOURCE)
    want["h0/attn/c_attn/w"] = np.squeeze(SOURCE["h0/attn/c_attn/w"])
    want["dense/kernel"] = SOURCE["dense/kernel"].T
    # permute first, then the reshape of the permuted elements in their new order
    want["conv/kernel"] = np.transpose(SOURCE["conv/kernel"], (3, 2, 0, 1)).reshape(8, -1)
    want["qkv"] = SOURCE["qkv"].reshape(2, 3, -1)
    want["mask"] = np.squeeze(SOURCE["mask"])
    return want


@pytest.fixture()
def source(tmp_path):
    prefix = str(tmp_path / "src" / "model")
    tfckpt.save(SOURCE, prefix)
    return prefix


def read_all(prefix) -> dict[str, np.ndarray]:
    with tfckpt.open(prefix) as ckpt:
        return {n: np.array(ckpt[n]) for n in ckpt.keys()}


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].shape == value.shape, name
        assert got[name].dtype == value.dtype, name
        if value.dtype == object:
            assert list(got[name]) == list(value), name
        else:
            assert np.array_equal(got[name], value), name


@pytest.mark.parametrize("max_shard_bytes", [None, 100_000])
def test_convert_applies_the_value_transforms(source, tmp_path, max_shard_bytes):
    dst = str(tmp_path / "out" / "model")
    tfckpt.select(source, dst, chunk_bytes=CHUNK, max_shard_bytes=max_shard_bytes, **TRANSFORMS)
    assert_same(read_all(dst), expected())


def test_tensorflow_reads_the_transformed_tensors(source, tmp_path):
    tf = pytest.importorskip("tensorflow")
    dst = str(tmp_path / "out" / "model")
    tfckpt.convert(source, dst, "float16", chunk_bytes=CHUNK, **TRANSFORMS)
    reader = tf.train.load_checkpoint(dst)
    want = expected()
    for name, value in want.items():
        got = reader.get_tensor(name)
        if value.dtype == np.float32:
            value = value.astype(np.float16)
        if value.dtype == object:
            assert list(got) == list(value)
            continue
        assert got.shape == value.shape and got.tobytes() == value.tobytes(), name


def test_the_plan_shows_each_new_shape(source, tmp_path):
    p = tfckpt.plan(source, str(tmp_path / "out"), **TRANSFORMS)
    rows = {t["name"]: t for t in p.to_dict()["tensors"]}
    assert rows["dense/kernel"]["new_shape"] == [500, 300]
    assert rows["dense/kernel"]["permute"] == [1, 0]
    assert rows["h0/attn/c_attn/w"]["new_shape"] == [24, 72]
    assert rows["h0/attn/c_attn/w"]["permute"] is None
    assert "new_shape" not in rows["step"]
    assert p.bytes_out == p.bytes_in  # the same elements


def test_export_and_import_apply_them(source, tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    out = str(tmp_path / "hf" / "model.safetensors")
    tfckpt.export(source, out, exclude=["vocab"], chunk_bytes=CHUNK, **TRANSFORMS)
    want = {k: v for k, v in expected().items() if k != "vocab"}
    assert_same(st.load_file(out), want)
    back = str(tmp_path / "back" / "model")
    tfckpt.import_(
        out,
        back,
        permute=[("dense/kernel$", (1, 0))],
        reshape=[("h0/attn/c_attn/w$", (1, 24, 72))],
        chunk_bytes=CHUNK,
    )
    got = read_all(back)
    assert np.array_equal(got["dense/kernel"], SOURCE["dense/kernel"])
    assert np.array_equal(got["h0/attn/c_attn/w"], SOURCE["h0/attn/c_attn/w"])


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(reshape=[("qkv$", (5, 5))]), "does not fit shape [2, 12]"),
        (dict(reshape=[("qkv$", (-1, -1))]), "at most one -1"),
        (dict(permute=[("qkv$", (0, 0))]), "does not fit shape [2, 12]"),
        (dict(reshape=[("vocab", (2, 1))]), "take numeric and bool tensors, not string"),
        (dict(reshape=[("(", (1,))]), "bad reshape pattern"),
    ],
)
def test_a_transform_that_cannot_apply_is_an_error(source, tmp_path, changes, message):
    with pytest.raises(tfckpt.CheckpointError, match=".*" + message.replace("[", r"\[")):
        tfckpt.plan(source, str(tmp_path / "out"), **changes)


def test_average_refuses_them(source, tmp_path):
    with pytest.raises(tfckpt.CheckpointError, match="average does not take squeeze"):
        tfckpt.average([source, source], str(tmp_path / "avg"), squeeze=["/w$"])


def test_the_command_line_takes_them(source, tmp_path):
    dst = str(tmp_path / "cli" / "model")
    args = [
        "convert",
        source,
        dst,
        "--dtype",
        "float16",
        "--permute",
        "dense/kernel$=1,0",
        "--reshape",
        "qkv$=2,3,-1",
        "--squeeze",
        "/w$",
        "--dry-run",
        "--json",
    ]
    run = subprocess.run([sys.executable, "-m", "tfckpt", *args], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    rows = {t["name"]: t for t in json.loads(run.stdout)["tensors"]}
    assert rows["qkv"]["new_shape"] == [2, 3, 4]
    assert rows["h0/attn/c_attn/w"]["new_shape"] == [24, 72]
    run = subprocess.run(
        [sys.executable, "-m", "tfckpt", *args[:-2]], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    got = read_all(dst)
    assert got["dense/kernel"].shape == (500, 300) and got["qkv"].shape == (2, 3, 4)
    bad = subprocess.run(
        [sys.executable, "-m", "tfckpt", "select", source, dst + "x", "--reshape", "qkv$=7"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0
    assert len(bad.stderr.splitlines()) == 1 and "does not fit" in bad.stderr
