"""The module layers: the reader is a read-only mapping, shard writers commit through
``commit``, and only ``storage`` touches the file system."""

from __future__ import annotations

import collections.abc
import re
from pathlib import Path

import numpy as np
import pytest

import tfckpt
from tfckpt.checkpoint.writer import ShardWriter
from tfckpt.io.commit import commit_shards, merge_entries
from tfckpt.io.storage import LOCAL
from tfckpt.rewrite.pipeline import READ_RING, BufferRing

PACKAGE = Path(tfckpt.__file__).parent


@pytest.fixture
def saved(tmp_path):
    tensors = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([b"x", b"yz"], dtype=object),
        "c": np.int64(7),
    }
    return tfckpt.save(tensors, str(tmp_path / "m")), tensors


def test_checkpoint_is_a_read_only_mapping(saved):
    prefix, tensors = saved
    with tfckpt.open(prefix) as ckpt:
        assert isinstance(ckpt, collections.abc.Mapping)
        assert not isinstance(ckpt, collections.abc.MutableMapping)
        assert ckpt.get("missing") is None and ckpt.get("missing", 3) == 3
        np.testing.assert_array_equal(ckpt.get("a"), tensors["a"])
        assert [k for k, _ in ckpt.items()] == ckpt.keys() == ["a", "b", "c"]
        assert [v.tolist() for v in ckpt.values()] == [tensors[k].tolist() for k in "abc"]
        assert ckpt == ckpt and ckpt != tfckpt.open(prefix) and hash(ckpt)
        assert not hasattr(ckpt, "entry_proto")


def test_iter_chunks_buffer_hook(saved):
    prefix, tensors = saved
    with tfckpt.open(prefix) as ckpt:
        with pytest.raises(TypeError):
            ckpt.iter_chunks("a", 8, reuse=True)
        ring = BufferRing(READ_RING)
        chunks = [c.copy() for c in ckpt.iter_chunks("a", 8, buffers=ring)]
        assert np.concatenate(chunks).tolist() == tensors["a"].reshape(-1).tolist()


def test_shard_writers_committed_together_equal_save(saved, tmp_path):
    prefix, tensors = saved
    out = str(tmp_path / "out" / "m")
    parts = [["a", "b"], ["c"]]
    entries = []
    shard_paths = [str(tmp_path / "out" / f"part{k}") for k in range(len(parts))]
    for path, names in zip(shard_paths, parts):
        w = ShardWriter.create(LOCAL, path)
        for name in names:
            w.add(name, tensors[name])
        entries.append(w.finish())
    commit_shards(LOCAL, out, shard_paths, merge_entries(entries))
    with tfckpt.open(out) as ckpt:
        assert ckpt.header.num_shards == 2
        for name in tensors:
            assert ckpt[name].tolist() == np.asarray(tensors[name]).tolist()
    assert (
        Path(out + ".data-00000-of-00002").read_bytes()
        == Path(prefix + ".data-00000-of-00001").read_bytes()[
            : Path(out + ".data-00000-of-00002").stat().st_size
        ]
    )


# Only storage.py asks where a path lives or calls the file system's write operations.
FILE_OPERATIONS = re.compile(
    r"\.local\b|os\.(replace|link|makedirs|rmdir|listdir|fsync|unlink"
    r"|remove)\b|open\([^)]*['\"][wxa]b?['\"]"
)


@pytest.mark.parametrize(
    "module",
    sorted(
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if p.name != "storage.py" and "_proto" not in p.parts
    ),
)
def test_only_storage_touches_files(module):
    text = (PACKAGE / module).read_text()
    assert not FILE_OPERATIONS.findall(text), module
