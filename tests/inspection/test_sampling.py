"""The reports' samples (tfckpt/inspection/sampling.py): at most the bound, the same on every
run, spread over the whole tensor, the same picked from any chunking of a stream as read by
itself from a checkpoint TensorFlow wrote (pre-sliced tensors included)."""

from __future__ import annotations

import numpy as np
import pytest

import tfckpt
from tfckpt.inspection.reading import stored_chunks
from tfckpt.inspection.sampling import SAMPLE_BLOCKS, SAMPLE_VALUES, Sample


@pytest.mark.parametrize("n", [SAMPLE_VALUES + 1, 3 * SAMPLE_VALUES + 7, 10**7, 10**12])
def test_runs_are_bounded_spread_and_fixed(n):
    s = Sample(n)
    runs = s.runs()
    assert not s.whole and s.values == len(runs) * s.block <= SAMPLE_VALUES
    assert len(runs) == SAMPLE_BLOCKS and s.values == SAMPLE_VALUES
    # One run in each of the equal strata: in order, apart, inside the tensor.
    for k, (start, count) in enumerate(runs):
        assert count == s.block
        assert n * k // SAMPLE_BLOCKS <= start
        assert start + count <= n * (k + 1) // SAMPLE_BLOCKS
    assert runs == Sample(n).runs()  # the positions depend on the size alone
    assert Sample(n, 100, blocks=8).values == 96  # bound // blocks per run


@pytest.mark.parametrize("n", [0, 1, 1000, SAMPLE_VALUES])
def test_a_tensor_within_the_bound_is_taken_whole(n):
    s = Sample(n)
    x = np.arange(n, dtype=np.float32)
    assert s.whole and s.values == n
    assert np.array_equal(s.pick(x, 0), x)


def test_pick_is_the_same_however_the_stream_is_cut():
    x = np.random.default_rng(3).standard_normal(10_007)
    s = Sample(x.size, 640, blocks=16)
    want = np.concatenate([x[a : a + c] for a, c in s.runs()])
    assert want.size == 640
    for step in (1, 7, 40, 41, 1000, x.size):
        parts, pos = [], 0
        for a in range(0, x.size, step):
            chunk = x[a : a + step]
            parts.append(s.pick(chunk, pos))
            pos += chunk.size
        assert np.array_equal(np.concatenate(parts), want), step


@pytest.fixture(scope="module")
def presliced(tmp_path_factory) -> str:
    """TensorFlow's SaveV2 storing only some slices of two tensors (rows, then blocks)."""
    tf = pytest.importorskip("tensorflow")
    prefix = str(tmp_path_factory.mktemp("presliced") / "model.ckpt")
    emb = np.arange(40, dtype=np.float32).reshape(10, 4) * 0.5 + 1
    grid = np.arange(24, dtype=np.float64).reshape(4, 6) - 7.25
    parts = [
        ("emb", "10 4 0,4:-", emb[0:4]),
        ("emb", "10 4 7,3:-", emb[7:10]),  # rows 4..6 not stored
        ("grid", "4 6 0,2:0,3", grid[0:2, 0:3]),
        ("grid", "4 6 2,2:3,3", grid[2:4, 3:6]),  # two of four blocks
    ]
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=[n for n, _, _ in parts],
        shape_and_slices=[s for _, s, _ in parts],
        tensors=[tf.constant(v) for _, _, v in parts],
    )
    return prefix


@pytest.mark.parametrize("case", ["savev2_slices", "tf1_partitioned", "all_dtypes", "presliced"])
def test_read_is_what_the_stream_holds_there(tf_checkpoints, presliced, case):
    """Positioned reads of the runs (of a tensor saved in slices, across them; of one
    stored in part, across its stored slices) give the values that stats' stream gives
    at the same positions."""
    path = presliced if case == "presliced" else tf_checkpoints(case).path
    with tfckpt.open(path) as ckpt:
        checked = 0
        for name in ckpt.keys():
            info = ckpt.info(name)
            if info.dtype in ("string", "variant", "resource") or not info.size:
                continue
            chunks = list(stored_chunks(ckpt, name))
            whole = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
            for bound, blocks in ((1, 1), (3, 3), (8, 4), (12, 3), (whole.size, 4)):
                s = Sample(whole.size, bound, blocks=blocks)
                runs = list(s.read(ckpt, name, chunk_bytes=64))
                got = np.concatenate(runs) if runs else whole[:0]
                want = s.pick(whole, 0)
                assert got.size == want.size == min(s.values, whole.size), (name, bound)
                assert got.tobytes() == want.tobytes(), (name, bound)
            checked += 1
        assert checked >= 2
        if case == "presliced":
            assert all(ckpt.info(n).partial for n in ("emb", "grid"))
