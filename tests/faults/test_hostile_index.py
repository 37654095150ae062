"""Hostile indexes and checkpoint files: what blocks, what amplifies, what TensorFlow refuses.

Every case starts from a checkpoint TensorFlow wrote during the run and damages or
rebuilds it: a named pipe or a directory in place of a file, a header declaring more
shards than there is data, data blocks referenced twice or nested in one another,
keys that share ever longer prefixes, restart points inside entries. tfckpt must end
promptly in a ``CheckpointError`` naming the file (or a correct read), create no more
output shards than the data needs, and call a table broken exactly when TensorFlow's
reader cannot open it.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from cli_helpers import assert_cli_error, run_text  # noqa: E402
from fuzz_helpers import U32 as _U32  # noqa: E402  (a restart point or count)
from fuzz_helpers import (  # noqa: E402  (tables built block by block)
    block,
    copy_prefix,
    data_blocks,
    entry_starts,
    raw_block,
    table,
    with_restarts,
    with_trailer,
)

import tfckpt  # noqa: E402
from tfckpt import inspection as tfinspect  # noqa: E402
from tfckpt._proto.tensor_bundle_pb2 import BundleHeaderProto  # noqa: E402
from tfckpt.format.table import BlockHandle, TableReader  # noqa: E402
from tfckpt.rewrite.tasks import shard_tasks  # noqa: E402

N_TENSORS = 20  # more than one restart interval: the data block has two restart points


def tf_refuses(prefix: str) -> bool:
    """Whether TensorFlow's reader fails to open the checkpoint or read one of its tensors."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except (tf.errors.OpError, ValueError):
        return True
    return False


# --- checkpoints written by TensorFlow ---------------------------------------------


@pytest.fixture(scope="module")
def tf_bundle(tmp_path_factory) -> str:
    """20 float32 tensors and a string tensor in one shard; one data block of the index."""
    prefix = str(tmp_path_factory.mktemp("hostile") / "tf" / "model")
    names = [f"layer/v{i:02d}" for i in range(N_TENSORS)] + ["words"]
    tensors = [tf.constant(np.arange(3, dtype=np.float32) + i) for i in range(N_TENSORS)]
    tensors.append(tf.constant(np.array([b"alpha", b"", b"gamma"], dtype=object)))
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
    return prefix


@pytest.fixture(scope="module")
def tf_sharded(tf_checkpoints) -> str:
    return tf_checkpoints("tf1_sharded").prefix


# --- 1. named pipes and directories in place of files -------------------------------

COMMANDS = [
    ("verify",),
    ("stats",),
    ("dump", "--tensor", "layer/v03"),
    ("convert", "{out}", "--dtype", "float16"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("which", ["data", "index"])
def test_named_pipe_in_place_of_a_file(tf_bundle, tmp_path, which, command):
    """Opening a FIFO would wait for a writer forever: every command refuses it at once."""
    prefix = copy_prefix(tf_bundle, tmp_path / "c")
    victim = prefix + (".data-00000-of-00001" if which == "data" else ".index")
    os.unlink(victim)
    os.mkfifo(victim)
    out = tmp_path / "out" / "model"
    proc = run_text(command[0], prefix, *(a.format(out=out) for a in command[1:]))
    if command[0] == "verify" and which == "data":
        # verify lists problems: the shard, then every tensor it should hold.
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 + N_TENSORS + 1 and all(ln.startswith(victim) for ln in lines)
        assert all("not a regular file" in ln for ln in lines), lines
    elif command[0] == "verify":
        assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
            f"{victim}: not a regular file (a named pipe)"
        ], proc.stderr
    else:
        assert_cli_error(proc, victim, "not a regular file")
    assert not out.parent.exists()


def test_data_shard_that_is_a_directory(tf_bundle, tmp_path):
    prefix = copy_prefix(tf_bundle, tmp_path / "c")
    shard = prefix + ".data-00000-of-00001"
    os.unlink(shard)
    os.mkdir(shard)
    with tfckpt.open(prefix) as ckpt:
        assert len(ckpt) == N_TENSORS + 1  # the index alone still lists everything
        with pytest.raises(tfckpt.CorruptCheckpointError) as err:
            ckpt["layer/v03"]
    assert str(err.value) == f"{shard}: tensor 'layer/v03': not a regular file (a directory)"
    assert_cli_error(run_text("dump", prefix, "--tensor", "layer/v03"), shard, "directory")
    report = tfinspect.verify(prefix)
    assert f"{shard}: data shard is not a regular file" in report["problems"]


# --- 2. shard counts: what the header says against the data there is -----------------


def _with_header(prefix: str, num_shards: int) -> None:
    entries = TableReader(Path(prefix + ".index").read_bytes()).entries
    header = BundleHeaderProto.FromString(entries[0][1])
    header.num_shards = num_shards
    entries[0] = (b"", header.SerializeToString())
    Path(prefix + ".index").write_bytes(table([(b"\xff", block(entries))]))


@pytest.mark.parametrize("num_shards", [3, 1 << 20])
def test_header_declaring_more_shards_than_the_data(tf_bundle, tmp_path, num_shards):
    """Only the shard that holds data is read and written; the others cost nothing."""
    prefix = copy_prefix(tf_bundle, tmp_path / "c")
    _with_header(prefix, num_shards)
    os.rename(prefix + ".data-00000-of-00001", f"{prefix}.data-00000-of-{num_shards:05d}")
    assert os.path.getsize(prefix + ".index") < 1200
    # TensorFlow opens shards lazily: this checkpoint reads.
    assert not tf_refuses(prefix)
    problems = tfinspect.verify(prefix)["problems"]  # a few lines, not one per shard
    assert 2 <= len(problems) <= 6 and all("missing" in p for p in problems), problems
    p = tfckpt.plan(prefix, tmp_path / "out" / "model", cast="float16")
    assert len(shard_tasks(p)) == 1
    summary = tfckpt.transform(prefix, tmp_path / "out" / "model", cast="float16")
    assert sorted(os.listdir(tmp_path / "out")) == [
        "checkpoint",
        "model.data-00000-of-00001",
        "model.index",
    ]
    reader = tf.train.load_checkpoint(summary.dst)
    assert reader.get_tensor("layer/v07").tolist() == [7, 8, 9]
    assert reader.get_tensor("words").tolist() == [b"alpha", b"", b"gamma"]


def test_select_writes_only_shards_that_keep_data(tf_sharded, tmp_path):
    with tfckpt.open(tf_sharded) as src:
        assert src.header.num_shards == 2
        in_shard_1 = [n for n in src.keys() if src.info(n).shard == 1]
    assert in_shard_1
    summary = tfckpt.select(
        tf_sharded, tmp_path / "out" / "model", include=[f"^{n}$" for n in in_shard_1]
    )
    with tfckpt.open(summary.dst) as out:
        assert out.header.num_shards == 1 and out.keys() == sorted(in_shard_1)
    assert sorted(os.listdir(tmp_path / "out")) == [
        "checkpoint",
        "model.data-00000-of-00001",
        "model.index",
    ]
    reader = tf.train.load_checkpoint(summary.dst)
    with tfckpt.open(tf_sharded) as src:
        for n in in_shard_1:
            assert reader.get_tensor(n).tobytes() == src[n].tobytes()


def test_missing_source_shard_stops_the_plan(tf_sharded, tmp_path):
    prefix = copy_prefix(tf_sharded, tmp_path / "c")
    missing = prefix + ".data-00001-of-00002"
    os.unlink(missing)
    with pytest.raises(tfckpt.CheckpointNotFoundError, match="data shard is missing") as err:
        tfckpt.plan(prefix, tmp_path / "out" / "model", cast="float16")
    assert err.value.path == missing
    proc = run_text("convert", prefix, tmp_path / "out" / "model", "--dtype", "float16")
    assert_cli_error(proc, missing)
    assert not (tmp_path / "out").exists()


# --- 3. amplification: blocks read twice, keys that grow --------------------------------


def test_data_block_referenced_twice_or_nested(tf_bundle):
    entries = TableReader(Path(tf_bundle + ".index").read_bytes()).entries
    empty = block([])
    # An empty block referenced twice: no key order to break, so only the reference says it.
    twice = table(
        [(b"", block(entries[:1])), (b"\xfe", empty)], [(b"", 0), (b"\xfe", 1), (b"\xff", 1)]
    )
    with pytest.raises(tfckpt.CorruptCheckpointError, match="repeats or overlaps") as err:
        TableReader(twice, "twice.index")
    assert err.value.path == "twice.index"
    # A block nested inside the value of another: both parse, in key order, from one
    # stretch of bytes.
    inner = with_trailer(block([(b"zz", b"inner")]))
    outer = block(entries[:1] + [(b"y", b"--" + inner)])
    start = len(outer) - 4 - 4 * 1 - len(inner)  # the inner block's place in the outer one
    nested = table([(b"y", outer)], [(b"y", 0), (b"zz", BlockHandle(start, len(inner) - 5))])
    with pytest.raises(tfckpt.CorruptCheckpointError, match="repeats or overlaps"):
        TableReader(nested, "nested.index")


def _chain(n: int) -> bytes:
    """A table whose keys each repeat the whole key before them plus one byte."""
    items = [(0, b"", b"")] + [(i, b"k", b"") for i in range(n)]
    return table([(b"k" * (n + 1), raw_block(items, [0]))])


def test_keys_sharing_ever_longer_prefixes(tf_bundle, tmp_path):
    """Decoded key bytes stay within a multiple of the file: memory linear in its size."""
    data = _chain(10_000)  # 40 KB of file, 50 MB of keys
    tracemalloc.start()
    try:
        with pytest.raises(tfckpt.CorruptCheckpointError, match="keys decode to more than"):
            TableReader(data, "chain.index")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(data) + (16 << 20)
    # TensorFlow's long, prefix-sharing names stay far inside the bound.
    prefix = str(tmp_path / "long" / "model")
    names = [f"{'scope/' * 600}{i:04d}" for i in range(64)]
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(float(i)) for i in range(len(names))],
    )
    size = os.path.getsize(prefix + ".index")
    decoded = sum(len(k) for k, _ in TableReader(Path(prefix + ".index").read_bytes()).entries)
    assert decoded > 8 * size  # sharing that real checkpoints do have
    with tfckpt.open(prefix) as ckpt:
        assert ckpt.keys() == sorted(tf.train.load_checkpoint(prefix).get_variable_to_shape_map())


# --- 4. restart points: what TensorFlow can open -------------------------------------


def _restart_variant(index: bytes, kind: str) -> bytes:
    ((sep, contents),) = data_blocks(index)
    starts = entry_starts(contents)
    if kind == "inside an entry":
        return table([(sep, with_restarts(contents, [0, starts[16] + 1]))])
    if kind == "at an entry that shares bytes":
        return table([(sep, with_restarts(contents, [0, starts[15]]))])
    if kind == "none":
        return table([(sep, with_restarts(contents, []))])
    if kind == "missing one (interval 1)":  # still every restart an entry start: fine
        entries = TableReader(index).entries
        contents = block(entries, 1)
        return table(
            [
                (
                    sep,
                    with_restarts(
                        contents, entry_starts(contents)[:5] + entry_starts(contents)[6:]
                    ),
                )
            ]
        )
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["inside an entry", "at an entry that shares bytes", "none"])
def test_restart_points_tensorflow_cannot_use(tf_bundle, tmp_path, kind):
    prefix = copy_prefix(tf_bundle, tmp_path / "c")
    index = prefix + ".index"
    Path(index).write_bytes(_restart_variant(Path(index).read_bytes(), kind))
    assert tf_refuses(prefix)
    with pytest.raises(tfckpt.CorruptCheckpointError) as err:
        tfckpt.open(prefix)
    assert err.value.path == index and "restart" in str(err.value)
    proc = run_text("verify", prefix)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [str(err.value)]
    from tfckpt.tf import verify_with_tf

    with pytest.raises(tfckpt.CorruptCheckpointError):  # no TensorFlow error escapes
        verify_with_tf(prefix)


def test_restart_points_tensorflow_can_use(tf_bundle, tmp_path):
    """Restarts at other intervals than TensorFlow's 16 are valid: both readers agree."""
    prefix = copy_prefix(tf_bundle, tmp_path / "c")
    index = Path(prefix + ".index")
    original = index.read_bytes()
    with tfckpt.open(prefix) as ckpt:
        want = {k: ckpt[k] for k in ckpt.keys()}
    entries = TableReader(original).entries
    ((sep, contents),) = data_blocks(original)
    # The crafting helpers give back TensorFlow's file byte for byte.
    assert _U32.unpack_from(contents, len(contents) - 4)[0] == 2  # two restart points
    assert table([(sep, contents)]) == table([(sep, block(entries))]) == original
    variants = {f"interval {i}": table([(sep, block(entries, i))]) for i in (1, 3, 1000)}
    variants["missing one"] = _restart_variant(original, "missing one (interval 1)")
    for what, data in variants.items():
        index.write_bytes(data)
        assert not tf_refuses(prefix), what
        with tfckpt.open(prefix) as ckpt:
            assert {k: ckpt[k].tolist() for k in ckpt.keys()} == {
                k: v.tolist() for k, v in want.items()
            }, what
        assert tfinspect.verify(prefix)["problems"] == [], what
    # What TensorFlow refuses, tfckpt refuses too (the other direction).
    index.write_bytes(_restart_variant(original, "inside an entry"))
    with pytest.raises(tfckpt.CorruptCheckpointError):
        tfckpt.open(prefix)


def test_verify_tf_reports_a_checkpoint_tensorflow_cannot_open(tf_bundle, tmp_path):
    """A directory named like the prefix: TensorFlow's loader looks in it and gives up."""
    prefix = copy_prefix(tf_bundle, tmp_path / "c")
    os.mkdir(prefix)
    from tfckpt.tf import verify_with_tf

    report = verify_with_tf(prefix)
    assert len(report["mismatches"]) == 1
    assert report["mismatches"][0].startswith(f"{prefix}: TensorFlow cannot open it: ")
    proc = run_text("verify", prefix, "--tf", timeout=180)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{prefix}: TensorFlow cannot open it" in proc.stderr
