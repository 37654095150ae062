"""Broken and hostile checkpoints: every case ends in a CheckpointError or a correct read.

Base checkpoints are written by TensorFlow during the run; each case mutates a
copy with a seeded random generator (bit flips, random bytes, truncation at
random points and at every block boundary) or a targeted structural change
(sizes, offsets, shapes, shard counts, key order, string framing, slices,
object graphs). Every case must finish within a time bound, raise nothing but
``tfckpt.CheckpointError`` subclasses, and allocate no more than the files'
size allows. ``TFCKPT_FUZZ_CASES`` sets the number of random cases (default 5000).
"""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest
from fuzz_helpers import check_case, prefix_files  # the harness: time limit and allocation bound

import tfckpt
from tfckpt import inspection as tfinspect
from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto, BundleHeaderProto
from tfckpt._proto.trackable_object_graph_pb2 import TrackableObjectGraph
from tfckpt.format.table import (
    BLOCK_TRAILER_SIZE,
    FOOTER_SIZE,
    TableBuilder,
    TableReader,
    shortest_separator,
)

RANDOM_CASES = int(os.environ.get("TFCKPT_FUZZ_CASES", "5000"))


# --- base checkpoints, written by TensorFlow -----------------------------------


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    tf = pytest.importorskip("tensorflow")

    root = tmp_path_factory.mktemp("fuzz-bases")
    rng = np.random.default_rng(0)
    out = {}
    # Name-based: several dtypes, strings, a partitioned tensor.
    prefix = str(root / "plain" / "model")
    names = [
        "a/f32",
        "a/f16",
        "b/i64",
        "c/str",
        "c/scalar_str",
        "d/bool",
        "e/bf16",
        "emb",
        "emb",
        "z/empty",
    ]
    slices = ["", "", "", "", "", "", "", "6 4 0,3:-", "6 4 3,3:-", ""]
    tensors = [
        tf.constant(rng.standard_normal((3, 5)).astype(np.float32)),
        tf.constant(rng.standard_normal(7).astype(np.float16)),
        tf.constant(np.arange(9, dtype=np.int64)),
        tf.constant(np.array([b"alpha", b"", b"\xff\x00" * 40], dtype=object)),
        tf.constant(b"scalar"),
        tf.constant(np.array([True, False, True])),
        tf.constant(rng.standard_normal(4), dtype=tf.bfloat16),
        tf.constant(np.ones((3, 4), np.float32)),
        tf.constant(np.zeros((3, 4), np.float32)),
        tf.constant(np.zeros((0, 3), np.float32)),
    ]
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=slices, tensors=tensors)
    out["plain"] = prefix

    # Object-based: a module tree with a shared variable (two paths to one node).
    class Net(tf.Module):
        def __init__(self):
            self.dense = tf.Module()
            self.dense.kernel = tf.Variable(rng.standard_normal((4, 2)).astype(np.float32))
            self.dense.bias = tf.Variable(np.zeros(2, np.float32))
            self.alias = self.dense.kernel

    net = Net()
    out["tf2"] = tf.train.Checkpoint(net=net, step=tf.Variable(3)).write(str(root / "tf2" / "ckpt"))

    # Two shards (a sharded TF1 save).
    os.makedirs(root / "sharded")
    with tf.Graph().as_default():
        with tf.device("/cpu:0"):
            v0 = tf.compat.v1.get_variable("s0", initializer=np.arange(6, dtype=np.float32))
        with tf.device("/cpu:1"):
            v1 = tf.compat.v1.get_variable("s1", initializer=np.arange(5, dtype=np.int32))
        saver = tf.compat.v1.train.Saver([v0, v1], sharded=True)
        config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
        with tf.compat.v1.Session(config=config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            out["sharded"] = saver.save(
                sess, str(root / "sharded" / "model"), write_meta_graph=False
            )

    # The plain checkpoint's index rebuilt with 512-byte blocks: many block boundaries.
    table = TableReader(open(out["plain"] + ".index", "rb").read())
    multi = str(root / "multi" / "model")
    os.makedirs(os.path.dirname(multi))
    shutil.copy(out["plain"] + ".data-00000-of-00001", multi + ".data-00000-of-00001")
    with open(multi + ".index", "wb") as f:
        tb = TableBuilder(f, block_size=512)
        for k, v in table.entries:
            tb.add(k, v)
        tb.finish()
    out["multi"] = multi
    return out


def _copy(prefix: str, dest_dir) -> str:
    os.makedirs(dest_dir, exist_ok=True)
    for f in prefix_files(prefix):
        shutil.copy(f, dest_dir)
    return os.path.join(dest_dir, os.path.basename(prefix))


# --- random mutations ----------------------------------------------------------


def _mutate(rng: random.Random, prefix: str) -> str:
    files = prefix_files(prefix)
    path = rng.choice(files)
    data = bytearray(open(path, "rb").read())
    kind = rng.choice(["flip", "flip", "bytes", "truncate", "zero-run", "extend"])
    if not data:
        kind = "extend"
    if kind == "flip":
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
    elif kind == "bytes":
        pos = rng.randrange(len(data))
        n = rng.randint(1, 16)
        data[pos : pos + n] = bytes(rng.randrange(256) for _ in range(n))
    elif kind == "truncate":
        del data[rng.randrange(len(data)) :]
    elif kind == "zero-run":
        pos = rng.randrange(len(data))
        data[pos : pos + rng.randint(1, 64)] = b"\0" * len(data[pos : pos + 64])
    else:
        data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
    open(path, "wb").write(bytes(data))
    return f"{kind} in {os.path.basename(path)}"


def test_random_mutations(bases, tmp_path):
    rng = random.Random(1234)
    outcomes = {"ok": 0, "error": 0}
    names = sorted(bases)
    for case in range(RANDOM_CASES):
        base = bases[names[case % len(names)]]
        work = tmp_path / f"c{case % 4}"
        shutil.rmtree(work, ignore_errors=True)
        prefix = _copy(base, work)
        what = _mutate(rng, prefix)
        if rng.random() < 0.3:
            what += "; " + _mutate(rng, prefix)
        outcomes[check_case(prefix, f"case {case} ({names[case % len(names)]}): {what}")] += 1
    # Most mutations must be caught; some (e.g. in footer padding) are harmless.
    assert outcomes["error"] > RANDOM_CASES // 4, outcomes


@pytest.mark.parametrize("base", ["multi", "plain", "tf2", "sharded"])
def test_truncation_at_every_block_boundary(bases, tmp_path, base):
    """Cut the index at each block's start, inside each trailer and inside the footer."""
    index = bases[base] + ".index"
    data = open(index, "rb").read()
    cuts = {
        0,
        1,
        len(data) - 1,
        len(data) - FOOTER_SIZE,
        len(data) - FOOTER_SIZE // 2,
        len(data) - 8,
    }
    table = TableReader(data)
    del table
    # Block boundaries: walk the index block's handles.
    from tfckpt.format.table import BlockHandle, Footer, parse_block

    footer = Footer.decode(data[-FOOTER_SIZE:])
    blocks = [footer.index, footer.metaindex]
    for _, handle in parse_block(
        data[footer.index.offset : footer.index.offset + footer.index.size]
    ):
        blocks.append(BlockHandle.decode(handle, 0, len(handle))[0])
    for h in blocks:
        end = h.offset + h.size
        cuts |= {h.offset, h.offset + 1, end, end + 1, end + BLOCK_TRAILER_SIZE - 1}
    for cut in sorted(c for c in cuts if 0 <= c < len(data)):
        work = tmp_path / f"cut{cut}"
        prefix = _copy(bases[base], work)
        open(prefix + ".index", "wb").write(data[:cut])
        assert check_case(prefix, f"{base} index cut at {cut}") == "error"


# --- targeted structural damage ---------------------------------------------------


class _AnyOrderBuilder(TableBuilder):
    """A table writer that accepts keys out of order (to build broken indexes)."""

    def add(self, key: bytes, value: bytes) -> None:
        if self._pending is not None:
            self._index.add(
                shortest_separator(self._last_key, key) if key > self._last_key else self._last_key,
                self._pending.encode(),
            )
            self._pending = None
        self._last_key = key
        self._data.add(key, value)
        if self._data.size_estimate() >= self._block_size:
            self._flush()


def _rewrite_index(prefix: str, entries: list[tuple[bytes, bytes]], any_order=False) -> None:
    with open(prefix + ".index", "wb") as f:
        tb = (_AnyOrderBuilder if any_order else TableBuilder)(f)
        for k, v in entries:
            tb.add(k, v)
        tb.finish()


def _entries(prefix: str) -> list[tuple[bytes, bytes]]:
    return list(TableReader(open(prefix + ".index", "rb").read()).entries)


def _edit_entry(prefix: str, key: bytes, edit) -> None:
    entries = _entries(prefix)
    out = []
    for k, v in entries:
        if k == key:
            e = BundleEntryProto.FromString(v)
            edit(e)
            v = e.SerializeToString()
        out.append((k, v))
    _rewrite_index(prefix, out)


def _edit_header(prefix: str, edit) -> None:
    entries = _entries(prefix)
    h = BundleHeaderProto.FromString(entries[0][1])
    edit(h)
    entries[0] = (b"", h.SerializeToString())
    _rewrite_index(prefix, entries)


def _set_dims(e, dims):
    del e.shape.dim[:]
    for d in dims:
        e.shape.dim.add().size = d


def _string_entry_overrun(prefix):
    e = BundleEntryProto.FromString(dict(_entries(prefix))[b"c/str"])
    path = prefix + ".data-00000-of-00001"
    data = bytearray(open(path, "rb").read())
    data[e.offset : e.offset + 4] = b"\xff\xff\xff\x0f"  # first length: 2**32 - 1 + ...
    open(path, "wb").write(bytes(data))


def _slices_overlap(e):
    e.slices[1].extent[0].start = 2


def _slices_hole(e):
    e.slices[1].extent[0].start = 3
    e.slices[1].extent[0].length = 2


def _object_graph(prefix, edit):
    """Rewrite the object graph tensor (with a correct CRC), changed by ``edit``."""
    with tfckpt.open(prefix) as ckpt:
        tensors = {k: ckpt[k] for k in ckpt.keys()}
    g = TrackableObjectGraph.FromString(tensors["_CHECKPOINTABLE_OBJECT_GRAPH"].item())
    edit(g)
    tensors["_CHECKPOINTABLE_OBJECT_GRAPH"] = np.array(g.SerializeToString(), dtype=object)
    tfckpt.save(tensors, prefix, overwrite=True)


def _dangling(g):
    g.nodes[0].children[0].node_id = 999


def _cycle(g):
    ref = g.nodes[1].children.add()
    ref.node_id = 0
    ref.local_name = "back_to_root"


def _dangling_slot(g):
    s = g.nodes[1].slot_variables.add()
    s.original_variable_node_id = 1
    s.slot_variable_node_id = -5
    s.slot_name = "m"


def _missing_key(g):
    for node in g.nodes:
        for a in node.attributes:
            a.checkpoint_key = "no/such/tensor"
            return


def _garbage_graph(prefix):
    _object_graph_bytes(prefix, b"\xff\xff\xff\xff garbage")


def _object_graph_bytes(prefix, raw):
    with tfckpt.open(prefix) as ckpt:
        tensors = {k: ckpt[k] for k in ckpt.keys()}
    tensors["_CHECKPOINTABLE_OBJECT_GRAPH"] = np.array(raw, dtype=object)
    tfckpt.save(tensors, prefix, overwrite=True)


STRUCTURAL = {
    "size disagrees with shape": (
        "plain",
        lambda p: _edit_entry(p, b"a/f32", lambda e: setattr(e, "size", 12)),
    ),
    "offset past end of shard": (
        "plain",
        lambda p: _edit_entry(p, b"b/i64", lambda e: setattr(e, "offset", 1 << 40)),
    ),
    "negative offset": (
        "plain",
        lambda p: _edit_entry(p, b"b/i64", lambda e: setattr(e, "offset", -8)),
    ),
    "negative dimension": (
        "plain",
        lambda p: _edit_entry(p, b"a/f32", lambda e: _set_dims(e, [-3, 5])),
    ),
    "2**62 elements": (
        "plain",
        lambda p: _edit_entry(
            p, b"a/f32", lambda e: (_set_dims(e, [1 << 31, 1 << 31]), setattr(e, "size", 1 << 62))
        ),
    ),
    "2**62 strings": (
        "plain",
        lambda p: _edit_entry(p, b"c/str", lambda e: _set_dims(e, [1 << 31, 1 << 31])),
    ),
    "huge partitioned shape": (
        "plain",
        lambda p: _edit_entry(p, b"emb", lambda e: _set_dims(e, [1 << 40, 4])),
    ),
    "rank 300": ("plain", lambda p: _edit_entry(p, b"b/i64", lambda e: _set_dims(e, [1] * 300))),
    "unknown rank": (
        "plain",
        lambda p: _edit_entry(p, b"b/i64", lambda e: setattr(e.shape, "unknown_rank", True)),
    ),
    "unknown dtype": (
        "plain",
        lambda p: _edit_entry(p, b"b/i64", lambda e: setattr(e, "dtype", 99)),
    ),
    "dtype of another size": (
        "plain",
        lambda p: _edit_entry(p, b"b/i64", lambda e: setattr(e, "dtype", 1)),
    ),
    "shard id out of range": (
        "plain",
        lambda p: _edit_entry(p, b"b/i64", lambda e: setattr(e, "shard_id", 7)),
    ),
    "num_shards 0": ("plain", lambda p: _edit_header(p, lambda h: setattr(h, "num_shards", 0))),
    "num_shards 10**9": (
        "plain",
        lambda p: _edit_header(p, lambda h: setattr(h, "num_shards", 10**9)),
    ),
    "newer format version": (
        "plain",
        lambda p: _edit_header(p, lambda h: setattr(h.version, "min_consumer", 5)),
    ),
    "garbage header": (
        "plain",
        lambda p: _rewrite_index(p, [(b"", b"\xff\xff\xff")] + _entries(p)[1:]),
    ),
    "no header": ("plain", lambda p: _rewrite_index(p, _entries(p)[1:])),
    "garbage entry": (
        "plain",
        lambda p: _rewrite_index(
            p, [(k, b"\xff\xfe" if k == b"a/f32" else v) for k, v in _entries(p)]
        ),
    ),
    "unsorted keys": (
        "plain",
        lambda p: _rewrite_index(
            p, _entries(p)[:1] + list(reversed(_entries(p)[1:])), any_order=True
        ),
    ),
    "duplicate keys": (
        "plain",
        lambda p: _rewrite_index(p, _entries(p)[:3] + _entries(p)[2:], any_order=True),
    ),
    "missing shard file": ("sharded", lambda p: os.unlink(p + ".data-00001-of-00002")),
    "shard file truncated": (
        "sharded",
        lambda p: open(p + ".data-00000-of-00002", "r+b").truncate(3),
    ),
    "string lengths overrun": ("plain", _string_entry_overrun),
    "overlapping slices": ("plain", lambda p: _edit_entry(p, b"emb", _slices_overlap)),
    "slices with a hole": ("plain", lambda p: _edit_entry(p, b"emb", _slices_hole)),
    "slice outside the tensor": (
        "plain",
        lambda p: _edit_entry(p, b"emb", lambda e: setattr(e.slices[0].extent[1], "length", 9)),
    ),
    "slice entry missing": (
        "plain",
        lambda p: _rewrite_index(p, [kv for kv in _entries(p) if not kv[0].startswith(b"\0")]),
    ),
    "object graph dangling node id": ("tf2", lambda p: _object_graph(p, _dangling)),
    "object graph cycle": ("tf2", lambda p: _object_graph(p, _cycle)),
    "object graph dangling slot": ("tf2", lambda p: _object_graph(p, _dangling_slot)),
    "object graph names a missing key": ("tf2", lambda p: _object_graph(p, _missing_key)),
    "object graph garbage": ("tf2", _garbage_graph),
    "empty index file": ("plain", lambda p: open(p + ".index", "wb").close()),
    "index is a directory": ("plain", lambda p: (os.unlink(p + ".index"), os.mkdir(p + ".index"))),
}
HARMLESS = {"object graph cycle"}  # TensorFlow writes graphs with back edges too


@pytest.mark.parametrize("what", sorted(STRUCTURAL))
def test_structural_damage(bases, tmp_path, what):
    base, damage = STRUCTURAL[what]
    prefix = _copy(bases[base], tmp_path / "w")
    damage(prefix)
    outcome = check_case(prefix, what)
    if what not in HARMLESS:
        assert outcome == "error" or tfinspect.verify(prefix)["problems"], (
            f"{what}: neither reading nor verify noticed"
        )


def test_messages_name_file_and_tensor(bases, tmp_path):
    prefix = _copy(bases["plain"], tmp_path / "w")
    _edit_entry(prefix, b"b/i64", lambda e: setattr(e, "offset", 1 << 40))
    with tfckpt.open(prefix) as ckpt, pytest.raises(tfckpt.CorruptCheckpointError) as err:
        ckpt["b/i64"]
    assert "b/i64" in str(err.value) and ".data-00000-of-00001" in str(err.value)
    prefix = _copy(bases["plain"], tmp_path / "w2")
    data = bytearray(open(prefix + ".index", "rb").read())
    data[10] ^= 0x10
    open(prefix + ".index", "wb").write(bytes(data))
    with pytest.raises(tfckpt.CorruptCheckpointError) as err:
        tfckpt.open(prefix)
    assert prefix + ".index" in str(err.value)


def test_harmless_mutation_reads_correctly(bases, tmp_path):
    """Footer padding is not covered by any checksum and changes nothing."""
    prefix = _copy(bases["plain"], tmp_path / "w")
    with tfckpt.open(prefix) as ckpt:
        before = {k: ckpt[k] for k in ckpt.keys()}
    data = bytearray(open(prefix + ".index", "rb").read())
    data[-9] = 0x5A  # last byte of the padding before the magic number
    open(prefix + ".index", "wb").write(bytes(data))
    with tfckpt.open(prefix) as ckpt:
        for k, v in before.items():
            got = ckpt[k]
            assert got.dtype == v.dtype and (
                got.tolist() == v.tolist() if v.dtype == object else got.tobytes() == v.tobytes()
            )


def test_cli_turns_every_error_into_one_line(bases, tmp_path):
    from cli_helpers import assert_cli_error, run_text

    prefix = _copy(bases["plain"], tmp_path / "w")
    _edit_entry(prefix, b"a/f32", lambda e: setattr(e, "size", 12))
    for args in (
        ["dump", prefix, "--tensor", "a/f32"],
        ["stats", prefix],
        ["convert", prefix, str(tmp_path / "out/"), "--dtype", "float16"],
    ):
        assert_cli_error(run_text(*args), "a/f32")
    assert not os.path.exists(tmp_path / "out" / "model.index")
