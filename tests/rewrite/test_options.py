"""One options object for every transform: an ``Options`` and keyword arguments write the same
bytes, execution options can change between plan and execute, plan options cannot, and an
overflow is a ``CastOverflowError`` with its counts. Checked on checkpoints TensorFlow writes."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import transform_helpers as th  # noqa: E402

import tfckpt  # noqa: E402
from tfckpt.rewrite.pipeline import READ_RING, BufferRing, WriteBehind, prefetch  # noqa: E402


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = tmp_path_factory.mktemp("options_src")
    values = {
        "big": np.array([1e6, -7e4, 1.5, 0.0], np.float32),
        "w": np.linspace(-3, 3, 4096, dtype=np.float32).reshape(64, 64),
        "step": np.array(9, np.int64),
    }
    return th.tf1_save(str(d / "model"), values), values


def test_options_object_and_keywords_write_the_same_bytes(source, tmp_path):
    prefix, values = source
    opts = tfckpt.Options(exclude=["^step$"], overflow="clip", max_shard_bytes=4096)
    a = tfckpt.convert(prefix, tmp_path / "a" / "m", "float16", opts)
    b = tfckpt.convert(
        prefix,
        tmp_path / "b" / "m",
        "float16",
        exclude=["^step$"],
        overflow="clip",
        max_shard_bytes=4096,
    )
    c = tfckpt.transform(prefix, tmp_path / "c" / "m", opts, cast="float16", durable=False)
    digests = [sorted(th.digests(tmp_path / x).values()) for x in "abc"]
    assert digests[0] == digests[1] == digests[2]
    assert (a.kept, a.cast, b.cast_counts["big"].overflow, c.dropped) == (2, 2, 2, 1)
    got = th.tf_reader_values(a.dst)
    assert set(got) == {"big", "w"}
    assert got["big"].tolist() == [65504.0, -65504.0, 1.5, 0.0]  # clipped, as asked
    assert th.bits(got["w"]).tolist() == th.bits(values["w"].astype(np.float16)).tolist()


def test_execution_options_change_at_execute_plan_options_do_not(source, tmp_path):
    prefix, _ = source
    p = tfckpt.plan(prefix, tmp_path / "out" / "m", cast="bfloat16")
    assert p.options.cast == "bfloat16" and p.options.overflow == "error"
    with pytest.raises(TypeError, match="cast"):
        tfckpt.execute(p, cast="float16")
    summary = tfckpt.execute(p, overflow="inf", chunk_bytes=1 << 16)
    assert tfckpt.Options.fields("plan")[:2] == ("include", "exclude")
    assert th.tf_dtypes(summary.dst) == {"big": "bfloat16", "w": "bfloat16", "step": "int64"}


def test_overflow_is_a_cast_overflow_error_with_counts(source, tmp_path):
    prefix, _ = source
    dst = tmp_path / "out" / "m"
    with pytest.raises(tfckpt.CastOverflowError) as e:
        tfckpt.convert(prefix, dst, "float16")
    assert isinstance(e.value, tfckpt.CheckpointError)
    assert e.value.counts == {"big": 2} and "big (2 values)" in str(e.value)
    assert not (tmp_path / "out").exists()  # nothing written, not even the directory


@pytest.mark.parametrize("bad", [{"overflow": "wrap"}, {"backend": "gpu"}, {"prefer": "both"}])
def test_enumerations_are_checked_once_when_built(bad):
    with pytest.raises(tfckpt.CheckpointError, match=next(iter(bad))):
        tfckpt.Options(**bad)


def test_a_ring_sized_from_the_queue_depths_survives_the_pipeline(source, tmp_path):
    """Chunks read into READ_RING buffers, read ahead and written behind, arrive intact:
    no buffer is reused while a stage still holds it."""
    prefix, values = source
    with tfckpt.open(prefix) as ckpt:
        with tfckpt.BundleWriter(tmp_path / "copy") as w:
            with w.stream("w", "float32", (64, 64)) as stream, WriteBehind(stream) as writer:
                for chunk in prefetch(ckpt.iter_chunks("w", 256, buffers=BufferRing(READ_RING))):
                    writer.write(chunk)
    assert th.tf_reader_values(tmp_path / "copy")["w"].tobytes() == values["w"].tobytes()
