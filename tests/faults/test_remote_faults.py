"""Object storage when things go wrong: a fault-injecting proxy in front of the S3 server.

The proxy (threaded, on 127.0.0.1) forwards every request to the moto S3 server of
``s3_helpers.py`` and, by rule, answers with a 5xx instead, ignores ``Range`` (the whole
object with 200), corrupts the body, or drops every connection (a server gone). tfckpt in
this process and ``python -m tfckpt`` in child processes talk to the proxy; the checks read
the server directly. Each fault must end in one ``CheckpointError`` naming the object (one
line on stderr from the command line), after a bounded number of tries, and must never
cost the checkpoint already at the destination.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
fsspec = pytest.importorskip("fsspec")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

import cli_helpers as ch  # noqa: E402
import transform_helpers as th  # noqa: E402
from s3_helpers import FaultProxy, on, proxy, s3, s3_server, sharded  # noqa: E402,F401  (fixtures)

import tfckpt  # noqa: E402
from tfckpt.io import paths  # noqa: E402


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """300 small tensors (an index of several blocks), written by TensorFlow's SaveV2."""
    d = tmp_path_factory.mktemp("faults_many")
    values = {f"block_{i:03d}/kernel": np.full(8, i, np.float32) for i in range(300)}
    return SimpleNamespace(prefix=th.save_v2(d / "many", values), values=values)


def tf_values(files: dict[str, bytes], directory: Path, name: str) -> dict[str, np.ndarray]:
    """What TensorFlow reads from a copy of ``files`` (an object listing)."""
    directory.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (directory / rel).write_bytes(data)
    reader = tf.train.load_checkpoint(str(directory / name))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def float16_of(prefix) -> dict[str, bytes]:
    with tfckpt.open(prefix) as ckpt:
        return {
            n: (ckpt[n].astype(np.float16) if ckpt[n].dtype.kind == "f" else ckpt[n]).tobytes()
            for n in ckpt.keys()
        }


# ---------------------------------------------------------------- overwrite, commit


OVERWRITERS = ["convert", "cli", "writer"]


def overwrite(how: str, src: str, dst: str):
    if how == "convert":
        return tfckpt.convert(src, dst, "float16", overwrite=True)
    if how == "cli":
        return ch.run_text("convert", src, dst, "--dtype", "float16", "--overwrite")
    with tfckpt.open(src) as ckpt:  # the streaming writer, tensor by tensor, same shards
        values = {
            n: ckpt[n].astype(np.float16) if ckpt[n].dtype.kind == "f" else ckpt[n]
            for n in ckpt.keys()
        }
        shards = {n: ckpt.info(n).shard for n in ckpt.keys()}
    with tfckpt.BundleWriter(dst, overwrite=True) as w:
        for name in sorted(values):
            w.add(name, values[name], shard=shards[name])


@pytest.mark.parametrize("how", OVERWRITERS)
def test_overwrite_whose_index_upload_fails_keeps_the_old_checkpoint(s3, sharded, tmp_path, how):
    dst = f"{s3.url}/out/sharded.ckpt"
    tfckpt.transform(sharded.prefix, dst)  # the old checkpoint: a float32 copy, 2 shards
    before = s3.files("out")
    assert sorted(before) == [
        "checkpoint",
        "sharded.ckpt.data-00000-of-00002",
        "sharded.ckpt.data-00001-of-00002",
        "sharded.ckpt.index",
    ]
    s3.proxy.log.clear()
    s3.proxy.rules.append(on("PUT", "sharded.ckpt.index", 500))
    if how == "cli":
        proc = overwrite(how, sharded.prefix, dst)
    else:
        with pytest.raises(Exception) as e:  # the kind is checked below
            overwrite(how, sharded.prefix, dst)
    assert s3.files("out") == before  # every old object, byte for byte; nothing new left
    if how == "cli":
        ch.assert_cli_error(proc, "sharded.ckpt.index")
    else:
        assert isinstance(e.value, tfckpt.CheckpointWriteError)
        assert e.value.path == f"{dst}.index"
    assert len(s3.proxy.requests("PUT", "sharded.ckpt.index")) == 2  # one retry, then gave up

    # Without the fault: the new data under another shard count, then the index, then the
    # old data deleted; TensorFlow reads it (the extra shard is empty).
    s3.proxy.reset()
    overwrite("convert" if how == "cli" else how, sharded.prefix, dst)
    after = s3.files("out")
    assert sorted(after) == [
        "checkpoint",
        "sharded.ckpt.data-00000-of-00003",
        "sharded.ckpt.data-00001-of-00003",
        "sharded.ckpt.data-00002-of-00003",
        "sharded.ckpt.index",
    ]
    assert after["sharded.ckpt.data-00002-of-00003"] == b""
    log = s3.proxy.log
    old_deleted = [i for i, (m, p, _) in enumerate(log) if m == "DELETE" and "-of-00002" in p]
    index_at = [
        i for i, (m, p, _) in enumerate(log) if m == "PUT" and p.endswith("sharded.ckpt.index")
    ]
    assert len(old_deleted) == 2 and len(index_at) == 1 and index_at[0] < min(old_deleted)
    got = tf_values(after, tmp_path / "got", "sharded.ckpt")
    assert {n: v.tobytes() for n, v in got.items()} == float16_of(sharded.prefix)


# The index is encoded and laid into its table in bulk (tfckpt.format.entryrows,
# tfckpt.format.bulktable), every varint of it written by put_varints: Ctrl-C at the
# second call, while the index is being built.
INTERRUPT_IN_INDEX = """
import os, signal, sys
import tfckpt.format.bulktable
put = tfckpt.format.bulktable.put_varints
count = [0]
def interrupted_put(*args, **kwargs):
    count[0] += 1
    if count[0] == int(os.environ["INTERRUPT_AT"]):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the index is being written
    return put(*args, **kwargs)
tfckpt.format.bulktable.put_varints = interrupted_put
from tfckpt.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "overwrite"])
def test_interrupt_while_writing_the_index_publishes_nothing(s3, many, existing):
    dst = f"{s3.url}/out/many"
    if existing:
        tfckpt.transform(many.prefix, dst)
    before = s3.files("out")
    s3.proxy.log.clear()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            INTERRUPT_IN_INDEX,
            "convert",
            many.prefix,
            dst,
            "--dtype",
            "float16",
            "--overwrite",
        ],
        env=dict(os.environ, INTERRUPT_AT="2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 130, proc.stderr
    assert s3.files("out") == before  # no index, no half index, no new data objects
    assert not s3.proxy.requests("PUT", "many.index")


# ---------------------------------------------------------------- faults while reading


def test_server_ignoring_range(s3, sharded):
    src = s3.put(sharded.prefix, "src")
    s3.proxy.rules.append(lambda m, p, h: "ignore_range" if m == "GET" and "Range" in h else None)
    with tfckpt.open(src) as ckpt:  # the index is read whole: no Range needed
        shard = paths.data_filename(src, ckpt.info("dev0/w").shard, 2)
        with pytest.raises(tfckpt.CheckpointError, match="instead of") as e:
            ckpt["dev0/w"]
    assert e.value.path == shard
    # One tensor of a shard: a run of small tensors spanning a whole object is read whole.
    proc = ch.run_text(
        "convert", src, f"{s3.url}/out/", "--dtype", "float16", "--include", "^dev0/w$"
    )
    ch.assert_cli_error(proc, "sharded.ckpt.data-0000", "instead of")
    assert s3.files("out") == {}


def test_corrupted_bodies(s3, sharded):
    src = s3.put(sharded.prefix, "src")
    s3.proxy.rules.append(on("GET", ".index", "corrupt"))
    with pytest.raises(tfckpt.CheckpointError, match="Checksum") as e:
        tfckpt.open(src)
    assert e.value.path == paths.index_filename(src)
    # A range of a data object has no checksum from the server: the tensor's own CRC32C.
    s3.proxy.reset()
    s3.proxy.rules.append(on("GET", ".data-00000-of-00002", "corrupt"))
    with tfckpt.open(src) as ckpt:
        name = next(n for n in ckpt.keys() if ckpt.info(n).shard == 0 and ckpt.info(n).nbytes)
        with pytest.raises(tfckpt.CorruptCheckpointError, match="checksum|crc"):
            ckpt[name]


def test_server_errors_are_retried_a_bounded_number_of_times(s3, sharded, monkeypatch):
    src = s3.put(sharded.prefix, "src")
    data0 = ".data-00000-of-00002"
    s3.proxy.rules.append(on("GET", data0, 503))
    with tfckpt.open(src) as ckpt:
        name = next(n for n in ckpt.keys() if ckpt.info(n).shard == 0)
        with pytest.raises(tfckpt.CheckpointError, match="503|injected") as e:
            ckpt[name]
    assert e.value.path == paths.data_filename(src, 0, 2)
    assert len(s3.proxy.requests("GET", data0)) == 2  # TFCKPT_REMOTE_RETRIES=1
    # A passing fault: retried, and the run completes.
    for retries, failures in (("1", 1), ("0", 0)):
        monkeypatch.setenv("TFCKPT_REMOTE_RETRIES", retries)
        s3.proxy.reset()
        s3.proxy.rules.append(on("GET", data0, 503, times=failures))
        with tfckpt.open(src) as ckpt, tfckpt.open(sharded.prefix) as orig:
            assert ckpt[name].tobytes() == orig[name].tobytes()
        assert s3.proxy.requests("GET", data0) == [503] * failures + [None]
    monkeypatch.setenv("TFCKPT_REMOTE_RETRIES", "many")
    with pytest.raises(tfckpt.CheckpointError, match="TFCKPT_REMOTE_RETRIES"):
        tfckpt.open(src)


def test_server_dying_mid_run(s3, sharded, s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv("TFCKPT_REMOTE_RETRIES", "0")  # retries are the test above
    src = s3.put(sharded.prefix, "src")
    dst = f"{s3.url}/out/"
    # Gone when the second data object is written: reads, writes and the clean-up all fail.
    die = lambda m, p, h: "die" if m == "PUT" and ".data-00001-of-" in p else None  # noqa
    s3.proxy.rules.append(die)
    ch.assert_cli_error(ch.run_text("convert", src, dst, "--dtype", "float16"), s3.url)
    s3.proxy.reset()
    s3.proxy.rules.append(die)
    with pytest.raises(tfckpt.CheckpointError, match=s3.url):
        tfckpt.convert(src, dst, "float16")
    s3.proxy.reset()
    # No index; the first data object of each run, which the dead server kept.
    assert sorted(s3.files("out")) == [
        "sharded.ckpt.data-00000-of-00002",
        "sharded.ckpt.data-00000-of-00003",
    ]
    # Back again: the next run completes (under names no leftover has), and deletes the
    # leftovers after its commit.
    tfckpt.convert(src, dst, "float16")
    files = s3.files("out")
    assert sorted(files) == ["checkpoint"] + [
        f"sharded.ckpt.data-0000{i}-of-00004" for i in range(4)
    ] + ["sharded.ckpt.index"]
    got = tf_values(files, tmp_path / "got", "sharded.ckpt")
    assert {n: v.tobytes() for n, v in got.items()} == float16_of(sharded.prefix)
    # A server that is not there at all: connections refused.
    gone = FaultProxy(s3_server.endpoint)
    gone.stop()
    monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", gone.url)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": gone.url})
    s3_server.s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(tfckpt.CheckpointError, match="sharded.ckpt"):
        tfckpt.open(src)
