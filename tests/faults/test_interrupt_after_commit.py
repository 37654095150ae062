"""An interrupt that lands right after the commit's last rename (the index's, or an
export's single file's) keeps the committed output whole.

The rename has happened when the interrupt arrives, between the system call's return and
the next line: the run must know the commit happened (the new output is live) and so
remove none of its files. Each case replaces an output with another of a different
layout (shard count, sharded or single file), so that a clean-up removing files by
name would break the new output.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import tfckpt
from tfckpt.io.storage import Storage

VALUES = {f"layer_{i}/kernel": np.linspace(-1, 1, 2048, dtype=np.float32) + i for i in range(4)}


def interrupt_after_renaming_to(monkeypatch, suffix: str) -> list[str]:
    """Make every local rename onto a name ending in ``suffix`` raise KeyboardInterrupt
    once it has happened; the names it did so for."""
    hit: list[str] = []
    for method in ("replace", "rename_noreplace"):
        real = getattr(Storage, method)

        def patched(self, src, dst, real=real):
            real(self, src, dst)
            if str(dst).endswith(suffix) and not hit:
                hit.append(str(dst))
                raise KeyboardInterrupt

        monkeypatch.setattr(Storage, method, patched)
    return hit


def read_all(prefix) -> dict[str, np.ndarray]:
    with tfckpt.open(prefix) as ckpt:
        return {n: np.array(ckpt[n]) for n in ckpt.keys()}


@pytest.mark.parametrize("first_shards, then_shards", [(None, 4096), (4096, None), (None, None)])
@pytest.mark.parametrize("overwrite", [True, False])
def test_convert_interrupted_right_after_its_index_rename(
    tmp_path, monkeypatch, first_shards, then_shards, overwrite
):
    src = str(tmp_path / "src" / "model")
    tfckpt.save(VALUES, src)
    dst = str(tmp_path / "out" / "model")
    if overwrite:
        tfckpt.convert(src, dst, "bfloat16", max_shard_bytes=first_shards)
    hit = interrupt_after_renaming_to(monkeypatch, ".index")
    with pytest.raises(KeyboardInterrupt):
        tfckpt.convert(src, dst, "float16", max_shard_bytes=then_shards, overwrite=overwrite)
    assert hit == [dst + ".index"]
    monkeypatch.undo()
    got = read_all(dst)  # the new checkpoint, whole
    assert sorted(got) == sorted(VALUES)
    for name, value in VALUES.items():
        assert got[name].dtype == np.float16
        assert got[name].tobytes() == value.astype(np.float16).tobytes()


@pytest.mark.parametrize("first_shards, then_shards", [(None, 9000), (9000, None), (9000, 20000)])
def test_export_interrupted_right_after_its_commit(
    tmp_path, monkeypatch, first_shards, then_shards
):
    src = str(tmp_path / "src" / "model")
    tfckpt.save(VALUES, src)
    out = str(tmp_path / "hf" / "model.safetensors")
    tfckpt.export(src, out, max_shard_bytes=first_shards, cast="float16")
    last = ".index.json" if then_shards else "model.safetensors"
    hit = interrupt_after_renaming_to(monkeypatch, last)
    with pytest.raises(KeyboardInterrupt):
        tfckpt.export(src, out, max_shard_bytes=then_shards, overwrite=True)
    assert hit
    monkeypatch.undo()
    safetensors = pytest.importorskip("safetensors.numpy")
    if then_shards:
        index = json.loads(open(out + ".index.json").read())
        files = sorted(set(index["weight_map"].values()))
        got = {}
        for f in files:
            got.update(safetensors.load_file(str(tmp_path / "hf" / f)))
    else:
        got = safetensors.load_file(out)
    assert sorted(got) == sorted(VALUES)
    for name, value in VALUES.items():
        assert got[name].dtype == np.float32 and got[name].tobytes() == value.tobytes()
