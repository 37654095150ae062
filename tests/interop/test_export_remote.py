"""export to object storage when requests fail: a real moto S3 server behind the fault
proxy of ``s3_helpers.py``. After any failed upload the old export is there byte
for byte and nothing new is left; ``safetensors`` reads what is there."""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

import transform_helpers as th  # noqa: E402
from s3_helpers import on, proxy, s3, s3_server  # noqa: E402,F401  (the proxy fixtures)

import tfckpt  # noqa: E402

VALUES = {f"layer_{i}/kernel": np.arange(256, dtype=np.float32) * (i + 1) for i in range(6)}
SHARD = 2 << 10  # float32: 3 shards


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    return th.save_v2(tmp_path_factory.mktemp("export_remote") / "model", VALUES)


def loaded(files: dict[str, bytes]) -> dict[str, np.ndarray]:
    """What a loader reads from an export's objects (the single file, else the index's)."""
    if "model.safetensors" in files:
        return safetensors_numpy.load(files["model.safetensors"])
    weight_map = json.loads(files["model.safetensors.index.json"])["weight_map"]
    got: dict[str, np.ndarray] = {}
    for f in set(weight_map.values()):
        got.update(safetensors_numpy.load(files[f]))
    assert set(got) == set(weight_map)
    return got


def is_values(got: dict[str, np.ndarray], dtype) -> bool:
    return set(got) == set(VALUES) and all(
        got[k].dtype == dtype and got[k].tobytes() == v.astype(dtype).tobytes()
        for k, v in VALUES.items()
    )


@pytest.mark.parametrize(
    "failing, sharded",
    [
        ("model.safetensors.index.json", True),
        ("-00002-of-00004.safetensors", True),
        ("model.safetensors", False),
    ],
    ids=["index", "a-shard", "single-file"],
)
def test_failed_overwrite_keeps_the_old_export(s3, weights, failing, sharded):
    out = f"{s3.url}/hf/model.safetensors"
    shard = SHARD if sharded else None
    tfckpt.export(weights, out, max_shard_bytes=shard)
    before = s3.files("hf")
    assert is_values(loaded(before), np.float32)
    # float16 at half the shard size: 3 shards again, under names no live index uses.
    new = dict(cast="float16", overwrite=True, max_shard_bytes=shard // 2 if shard else None)
    s3.proxy.rules.append(on("PUT", failing, 500))
    with pytest.raises(tfckpt.CheckpointWriteError):
        tfckpt.export(weights, out, **new)
    assert s3.files("hf") == before  # every old object, byte for byte; nothing new left

    s3.proxy.reset()
    s3.proxy.log.clear()
    sm = tfckpt.export(weights, out, **new)
    after = s3.files("hf")
    assert sorted(after) == sorted(f.rsplit("/", 1)[1] for f in sm.files)
    assert is_values(loaded(after), np.float16)
    if sharded:  # the index is written after the new shards, the old ones deleted after it
        log = s3.proxy.log
        puts = [i for i, (m, p, _) in enumerate(log) if m == "PUT" and "-of-00004" in p]
        index = [i for i, (m, p, _) in enumerate(log) if m == "PUT" and p.endswith("index.json")]
        deleted = [i for i, (m, p, _) in enumerate(log) if m == "DELETE" and "-of-00003" in p]
        assert len(index) == 1 and max(puts) < index[0] < min(deleted)


def test_overflow_keeps_the_old_single_file(s3, tmp_path):
    """The single file's upload is the commit: the overflow verdict comes before it."""
    src = tfckpt.save({"w": np.array([1.0, 1e30], np.float32)}, str(tmp_path / "src" / "m"))
    out = f"{s3.url}/hf/model.safetensors"
    tfckpt.export(src, out)
    before = s3.files("hf")
    with pytest.raises(tfckpt.CastOverflowError, match="nothing written"):
        tfckpt.export(src, out, cast="float16", overwrite=True)
    assert s3.files("hf") == before


def test_ctrl_c_mid_export_leaves_nothing_new(s3, weights):
    """SIGINT while the second shard uploads (the first one stored): the old export stays
    byte for byte, the stored shard is deleted again and no temporary object is left."""
    import os
    import signal

    out = f"{s3.url}/hf/model.safetensors"
    tfckpt.export(weights, out, max_shard_bytes=SHARD)
    before = s3.files("hf")
    written = [0]

    def progress(n):
        written[0] += n
        if written[0] > SHARD:  # into the second shard
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        tfckpt.export(weights, out, overwrite=True, max_shard_bytes=SHARD, progress=progress)
    assert s3.files("hf") == before


def test_server_gone_before_the_index_keeps_the_old_export(s3, weights):
    """The connection lost for good when the new index is due: the old index still serves
    the old shards, byte for byte (new shards the run could not delete again are named by
    no index, so no loader reads them)."""
    out = f"{s3.url}/hf/model.safetensors"
    tfckpt.export(weights, out, max_shard_bytes=SHARD)
    before = s3.files("hf")
    s3.proxy.rules.append(on("PUT", "model.safetensors.index.json", "die"))
    with pytest.raises(tfckpt.CheckpointError):
        tfckpt.export(weights, out, cast="float16", overwrite=True, max_shard_bytes=SHARD // 2)
    s3.proxy.reset()
    after = s3.files("hf")
    assert {k: after[k] for k in before} == before
    assert all("-of-00004" in k for k in set(after) - set(before))
    assert is_values(loaded(after), np.float32)
