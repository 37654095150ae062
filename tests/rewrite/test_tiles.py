"""Permuting in tiles: exact values, read calls that are long runs, bounded memory.

Sources are checkpoints TensorFlow writes (``tf.raw_ops.SaveV2``), read with the
real :meth:`tfckpt.Checkpoint.read_elements`, wrapped only to count its calls.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
from cli_helpers import in_process
from hypothesis import given, settings
from hypothesis import strategies as st

import tfckpt
from tfckpt.rewrite.permute import collapse_axes, tiles

permute_mod = importlib.import_module("tfckpt.rewrite.permute")  # where every permute tiles

tf = pytest.importorskip("tensorflow")
safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _saved(tmp_path, shape, dtype=np.float32) -> tuple[str, np.ndarray]:
    value = np.arange(int(np.prod(shape))).astype(dtype).reshape(shape)  # exact in float32
    prefix = str(tmp_path / "ckpt")
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=["t"], shape_and_slices=[""], tensors=[tf.constant(value)]
    )
    return prefix, value


class Counted:
    """A read callable, counting its calls and the largest count asked for."""

    def __init__(self, read):
        self.read, self.calls, self.largest = read, 0, 0

    def __call__(self, *args) -> np.ndarray:  # (..., start, count)
        self.calls += 1
        self.largest = max(self.largest, args[-1])
        return self.read(*args)


def _permuted(tmp_path, shape, perm, chunk_bytes):
    prefix, value = _saved(tmp_path, shape)
    ckpt = tfckpt.open(prefix)
    read = Counted(lambda start, count: ckpt.read_elements("t", start, count))
    pieces = list(tiles(read, shape, perm, 4, chunk_bytes))
    got = np.concatenate(pieces)
    assert got.dtype == value.dtype
    assert np.array_equal(got, np.transpose(value, perm).reshape(-1))
    half = chunk_bytes // 2 // 4
    assert max(p.size for p in pieces) <= half and read.largest <= half
    return read.calls, half


def test_transpose_of_few_columns_reads_runs_of_many_rows(tmp_path):
    # A result row (one source column) is 800 KB, over half the 64 KiB budget: a tile
    # is part of a row, read as whole source rows (re-reading each 3 times) rather
    # than one call per element (600000 calls before).
    n = 200_000
    calls, half = _permuted(tmp_path, (n, 3), (1, 0), 64 * 1024)
    tiles_per_row = math.ceil(n / half)
    # per tile: its half rows x 3 columns in runs of (half // 3) rows; one call for the dtype
    assert calls <= 3 * tiles_per_row * math.ceil(half / (half // 3)) + 1
    assert calls <= 9 * n / half + 3 * tiles_per_row + 1  # bytes read / run, a short run a tile


def test_transpose_of_few_rows_reads_three_runs_a_tile(tmp_path):
    n = 200_000
    calls, half = _permuted(tmp_path, (3, n), (1, 0), 64 * 1024)
    assert calls <= 3 * math.ceil(n / (half // 3)) + 1


@pytest.mark.parametrize(
    "shape, perm, bound",
    [
        # result rows of 3200 elements, 2 to a tile: the whole source, read again per tile
        # in runs of 4 of its rows of 2000 (instead of 64000 runs of 2)
        ((64, 50, 40), (2, 1, 0), 20 * math.ceil(64 / 4) + 1),
        # (A, B, C) by (1, 2, 0) is a transpose of (A, B*C)
        ((300, 20, 10), (1, 2, 0), 200 * 3 * 2 + 1),
        ((6, 7, 8, 90), (3, 1, 0, 2), 1500),
    ],
)
def test_nd_permutes_read_long_runs(tmp_path, shape, perm, bound):
    calls, _ = _permuted(tmp_path, shape, perm, 64 * 1024)
    assert calls <= bound
    assert calls * 4 < np.prod(shape)  # far from a call per element


def test_small_budget_is_kept_and_calls_stay_fewer_than_elements(tmp_path):
    shape = (64, 50, 40)
    calls, _ = _permuted(tmp_path, shape, (2, 1, 0), 4096)
    assert calls * 6 < np.prod(shape)


def test_collapse_axes():
    assert collapse_axes((4, 5, 6), (1, 2, 0)) == ((4, 30), (1, 0))
    assert collapse_axes((4, 1, 5, 6), (2, 3, 1, 0)) == ((4, 30), (1, 0))
    assert collapse_axes((2, 3, 4, 5), (3, 1, 2, 0)) == ((2, 12, 5), (2, 1, 0))
    assert collapse_axes((2, 3), (0, 1)) == ((6,), (0,))


@st.composite
def cases(draw):
    k = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=k, max_size=k)))
    perm = tuple(draw(st.permutations(range(k))))
    dtype = draw(st.sampled_from([np.int8, np.float32, np.float64]))
    chunk = draw(st.integers(1, 600))
    axis = draw(st.integers(0, k - 1))
    cuts = sorted(set(draw(st.lists(st.integers(0, shape[axis]), max_size=3))))
    return shape, perm, np.dtype(dtype), chunk, axis, cuts


@settings(max_examples=300, deadline=None)
@given(cases())
def test_tiles_match_numpy_in_bounded_memory(case):
    shape, perm, dtype, chunk, axis, cuts = case
    value = np.arange(int(np.prod(shape))).astype(dtype).reshape(shape)
    want = np.transpose(value, perm).reshape(-1)
    half = max(1, chunk // 2 // dtype.itemsize)
    flat = value.reshape(-1)
    whole = Counted(lambda s, c: flat[s : s + c].copy())
    # The same tensor as stored parts split along ``axis`` (a partitioned variable).
    edges = [0, *[c for c in cuts if 0 < c < shape[axis]], shape[axis]]
    parts, counters = [], []
    for lo, hi in zip(edges, edges[1:]):
        piece = np.ascontiguousarray(np.take(value, range(lo, hi), axis=axis)).reshape(-1)
        read = Counted(lambda s, c, piece=piece: piece[s : s + c].copy())
        counters.append(read)
        box = tuple((lo, hi) if a == axis else (0, n) for a, n in enumerate(shape))
        parts.append((box, read))
    for got_pieces in (
        list(tiles(whole, shape, perm, dtype.itemsize, chunk)),
        list(tiles(None, shape, perm, dtype.itemsize, chunk, parts=parts)),
    ):
        got = np.concatenate(got_pieces) if got_pieces else np.empty(0, dtype)
        assert got.dtype == dtype and np.array_equal(got, want)
        assert all(p.size <= half for p in got_pieces)  # what is held: a tile ...
    assert all(r.largest <= half for r in [whole, *counters])  # ... and one read


def test_cli_export_and_import_permute_rows_over_half_the_budget(tmp_path, monkeypatch):
    n = 3000  # result rows of 12000 bytes, chunk budget 4 KiB
    prefix, value = _saved(tmp_path, (n, 3))
    real = tfckpt.Checkpoint.read_elements
    calls = Counted(lambda self, name, start, count: real(self, name, start, count))
    monkeypatch.setattr(tfckpt.Checkpoint, "read_elements", lambda self, *a: calls(self, *a))
    out = tmp_path / "t.safetensors"
    rc, _, err = in_process("export", prefix, out, "--chunk-bytes", "4K", "--permute", "^t$=1,0")
    assert rc == 0, err
    assert np.array_equal(safetensors_numpy.load_file(str(out))["t"], value.T)
    assert 0 < calls.calls <= 3 * math.ceil(n / 512) * 4 + 1  # was 3 * n

    made = []

    def counting_tiles(read, *args, **kwargs):
        made.append(Counted(read))
        return tiles(made[-1], *args, **kwargs)

    monkeypatch.setattr(permute_mod, "tiles", counting_tiles)
    rc, _, err = in_process(
        "import", out, tmp_path / "back" / "m", "--chunk-bytes", "4K", "--permute", "^t$=1,0"
    )
    assert rc == 0, err
    back = tfckpt.open(str(tmp_path / "back" / "m"))["t"]
    assert np.array_equal(back, value)
    # (3, n) back to (n, 3): result rows of 12 bytes, 170 to a tile, 3 runs each
    assert len(made) == 1 and made[0].calls <= 3 * math.ceil(n / 170) + 4
