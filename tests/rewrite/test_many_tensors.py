"""Checkpoints of very many small tensors: one pipeline per shard task, exact output.

A convert of many small tensors must not pay a thread (or a wait) per tensor: a
shard task runs one reading and one writing thread whatever its tensor count, and
small tensors travel in batches, read together and cast together. Counting
threads is a structural check, not a speed claim. The outputs are checked
against TensorFlow (its restore and ``tf.cast``) and, at 200 000 tensors,
against numpy's bits.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tfckpt
from tfckpt.cli import main
from tfckpt.rewrite import pipeline


@pytest.fixture
def pipeline_threads(monkeypatch):
    """The pipeline threads started while the test runs."""
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(self):
        target = getattr(self, "_target", None)
        if getattr(target, "__module__", None) == pipeline.__name__:
            started.append(self)
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return started


def test_tf2_checkpoint_of_2000_variables_converts_and_restores(tmp_path, pipeline_threads):
    """TensorFlow writes 2 000 small variables (some with values float16 makes subnormal,
    zero or infinite); the converted checkpoint restores into float16 variables with
    ``tf.cast``'s values, counts are per tensor, and the run used two pipeline threads."""
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(7)
    n = 2000
    values = []
    for i in range(n):
        v = (rng.standard_normal(64 + i % 7) * 0.5).astype(np.float32)
        if i % 97 == 0:
            v[:3] = [1e-6, -1e-9, 70000.0]  # subnormal, to zero, overflow
        values.append(v)
    steps = [np.int64(i) for i in range(0, n, 100)]
    src = tf.train.Checkpoint(
        w=[tf.Variable(v) for v in values], steps=[tf.Variable(s) for s in steps]
    )
    prefix = src.write(str(tmp_path / "src" / "ckpt"))

    summary = tfckpt.convert(prefix, tmp_path / "out" / "ckpt", "float16", overflow="inf")
    assert len(pipeline_threads) == 2, pipeline_threads

    dst = tf.train.Checkpoint(
        w=[tf.Variable(tf.zeros(v.shape, tf.float16)) for v in values],
        steps=[tf.Variable(np.int64(-1)) for _ in steps],
    )
    dst.read(str(tmp_path / "out" / "ckpt")).assert_consumed()
    tiny = np.finfo(np.float16).tiny
    for i, (var, v) in enumerate(zip(dst.w, values)):
        want = tf.cast(tf.constant(v), tf.float16).numpy()
        got = var.numpy()
        assert got.view(np.uint16).tolist() == want.view(np.uint16).tolist(), i
        name = f"w/{i}/.ATTRIBUTES/VARIABLE_VALUE"
        counts = summary.cast_counts[name]
        mag = np.abs(want.astype(np.float32))
        assert counts.subnormal == int(np.count_nonzero((mag > 0) & (mag < tiny))), name
        assert counts.to_zero == int(np.count_nonzero((want == 0) & (v != 0))), name
        assert counts.overflow == int(np.count_nonzero(np.isinf(want))), name
        assert counts.elements == v.size
    assert [int(s.numpy()) for s in dst.steps] == [int(s) for s in steps]


def test_200000_small_tensors_convert_bit_exactly(tmp_path, pipeline_threads):
    """200 000 tensors of 256 float32 (TF-free input), converted by the command line:
    every float16 bit as numpy casts it, every checksum right."""
    n, size = 200_000, 256
    rng = np.random.default_rng(3)
    pool = (rng.standard_normal(size * 1024) * 0.01).astype(np.float32)
    names = [f"layer_{i:06d}/kernel" for i in range(n)]
    src = tmp_path / "src" / "model"
    with tfckpt.BundleWriter(src, durable=False) as w:
        for i, name in enumerate(names):
            at = (i % 1021) * size
            w.add(name, pool[at : at + size])
    out = tmp_path / "out" / "model"
    assert main(["convert", str(src), str(out), "--dtype", "float16", "--no-fsync"]) == 0
    assert len(pipeline_threads) == 2, pipeline_threads

    with tfckpt.open(out) as ckpt:
        assert ckpt.keys() == names
        last = ckpt.info(names[-1])
        assert (last.dtype, last.shape, last.offset) == ("float16", (size,), (n - 1) * size * 2)
        (data,) = ckpt.data_files
        got = np.concatenate(ckpt.read_together(names))  # every checksum verified
    want = pool.reshape(-1, size)[np.arange(n) % 1021].reshape(-1).astype(np.float16)
    assert got.view(np.uint16).tobytes() == want.view(np.uint16).tobytes()
    with open(data, "rb") as f:  # in name order, back to back
        assert f.read() == want.tobytes()
