"""The buffer rings of the transform pipeline: sized in one place, and never reused early.

A ring buffer is refilled only when no stage still holds it: a ring one buffer
short of what its stages hold must fail the run (a RuntimeError, nothing
committed) rather than write bytes overwritten by a later chunk. The writer is
slowed down, so that every stage holds a buffer when the reader asks for the next.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import tfckpt
from tfckpt.checkpoint.writer import ShardWriter
from tfckpt.rewrite import pipeline

CHUNK = 1 << 19  # --chunk-bytes: reads of 64 KiB
ROWS = 1024  # float32 rows of 256 elements: 16 reads per tensor


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Written by TensorFlow: multi-chunk float32 and int32 tensors, and small ones."""
    tf = pytest.importorskip("tensorflow")
    prefix = str(tmp_path_factory.mktemp("rings") / "src" / "model")
    os.makedirs(os.path.dirname(prefix))
    rng = np.random.default_rng(5)
    values = {
        "big/a": rng.standard_normal((ROWS, 256)).astype(np.float32),
        "big/b": rng.integers(-(2**31), 2**31 - 1, (ROWS, 256), dtype=np.int32),
        "big/c": rng.standard_normal((ROWS, 256)).astype(np.float32),
    }
    for i in range(50):
        values[f"small/{i:02d}"] = rng.standard_normal(100 + i).astype(np.float32)
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=list(values),
        shape_and_slices=[""] * len(values),
        tensors=[tf.constant(v) for v in values.values()],
    )
    return prefix, values


@pytest.fixture
def pipeline_threads(monkeypatch):
    """The pipeline threads started while the test runs."""
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(self):
        if getattr(getattr(self, "_target", None), "__module__", None) == pipeline.__name__:
            started.append(self)
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return started


@pytest.fixture
def slow_writer(monkeypatch):
    real = ShardWriter._write

    def write(self, data):
        time.sleep(0.01)
        return real(self, data)

    monkeypatch.setattr(ShardWriter, "_write", write)


def test_a_ring_refuses_a_buffer_still_in_use():
    ring = pipeline.BufferRing(2)
    first = ring(16)[:8].view(np.float32)  # a view keeps its buffer in use
    second = ring(16)
    with pytest.raises(RuntimeError, match="still in use"):
        ring(16)
    del first
    assert len(ring(32)) == 32  # free again (and grown)
    del second


def test_a_ring_makes_buffers_only_as_stages_hold_them():
    """A buffer no view holds is handed out again: stages that keep fewer chunks alive
    than the ring's count leave the rest of it unmade (its memory never taken)."""
    ring = pipeline.BufferRing(5)
    for _ in range(10):
        chunk = ring(1 << 10)
        chunk[:] = 1
        del chunk
    assert len(ring._buffers) == 1
    held = [ring(1 << 10) for _ in range(3)]
    assert len(ring._buffers) == 3
    assert len({h.__array_interface__["data"][0] for h in held}) == 3  # never shared
    del held[0]
    again = ring(10)  # the buffer let go of, not a new one
    assert len(ring._buffers) == 3 and len(again) == 10
    del held, again
    ring(1 << 20)  # a free one grows; none is added
    assert sorted(map(len, ring._buffers)) == [1 << 10, 1 << 10, 1 << 20]


def test_ring_sizes_come_from_the_queue_depths():
    assert pipeline.READ_RING == 1 + (1 + pipeline.PREFETCH_DEPTH) + (
        pipeline.WRITE_BEHIND_DEPTH + 1
    )
    assert pipeline.CAST_RING == 1 + pipeline.WRITE_BEHIND_DEPTH + 1
    assert pipeline.read_ring().count == pipeline.READ_RING
    assert pipeline.cast_ring().count == pipeline.CAST_RING


@pytest.mark.parametrize("cast", [None, "float16", "bfloat16"])
def test_slow_writer_and_many_chunks_give_tensorflows_values(
    source, tmp_path, slow_writer, pipeline_threads, cast
):
    """One reading and one writing thread for the whole task, every byte as TensorFlow's."""
    tf = pytest.importorskip("tensorflow")
    prefix, values = source
    dst = tmp_path / "out" / "model"
    tfckpt.transform(prefix, dst, cast=cast, chunk_bytes=CHUNK, durable=False)
    assert len(pipeline_threads) == 2
    reader = tf.train.load_checkpoint(str(dst))
    for name, v in values.items():
        want = v if cast is None or v.dtype != np.float32 else tf.cast(v, cast).numpy()
        got = reader.get_tensor(name)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


@pytest.mark.parametrize(
    ("ring", "cast"), [("READ_RING", None), ("READ_RING", "float16"), ("CAST_RING", "float16")]
)
def test_a_ring_one_buffer_short_fails_the_run(
    source, tmp_path, slow_writer, monkeypatch, ring, cast
):
    prefix, _ = source
    if ring == "READ_RING" and cast is not None:
        # Cast chunks free their read buffer at the consumer: two fewer stages hold it.
        monkeypatch.setattr(pipeline, "READ_RING", pipeline.READ_RING - 3)
    else:
        monkeypatch.setattr(pipeline, ring, getattr(pipeline, ring) - 1)
    dst = tmp_path / "out" / "model"
    with pytest.raises(RuntimeError, match="still in use"):
        tfckpt.transform(prefix, dst, cast=cast, chunk_bytes=CHUNK, durable=False)
    assert not os.path.exists(f"{dst}.index")
