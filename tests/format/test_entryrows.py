"""Index entries kept as columns and the index table built in bulk give exactly the old bytes.

The oracle is what writers did before: a ``BundleEntryProto`` per tensor,
``SerializeToString`` and :class:`~tfckpt.format.table.TableBuilder`, entry by entry.
:meth:`EntryRows.table` must give the same index bytes for random entry sets (every
dtype, ranks 0 to 8, zero values, offsets up to 2**63-1, rows in and out of order,
partitioned tensors' entries, block sizes small enough for many blocks and entries
bigger than two blocks), laid out in one piece or in many (pieces of a few entries, so
that a piece ends inside a restart interval, inside a block, or holds no whole block),
:func:`table_bytes` and :func:`table_in_pieces` the same table for any sorted keys and
values, :func:`merge_rows` the old merge. TensorFlow reading what writers make with them
is tests/parity/test_tf_write.py and the tests of this module's last section.
"""

from __future__ import annotations

import io
import pickle
import random
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto, DataType
from tfckpt.format.bulktable import copy_ranges, table_bytes, table_in_pieces
from tfckpt.format.entryrows import EntryRows, merge_rows, shape_field
from tfckpt.format.table import TableBuilder, TableReader, mask_crc, unmask_crc

SETTINGS = settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DTYPES = [0, *DataType.values()]  # every DataType number, and 0 (left out when encoded)
U63 = (1 << 63) - 1
BLOCK_SIZES = [1, 16, 64, 300, 4096, 256 * 1024]
# Entries a piece: every entry its own piece; fewer than a restart interval; not a
# multiple of it; the default.
PIECES = [1, 5, 37, 16384]


def _proto(dtype, shape, shard, offset, size, crc) -> BundleEntryProto:
    """The entry as writers built it before (see ``entry_proto``)."""
    e = BundleEntryProto(dtype=dtype, shard_id=shard, offset=offset, size=size)
    e.crc32c = mask_crc(crc)
    e.shape.SetInParent()
    for d in shape:
        e.shape.dim.add().size = d
    return e


def _old_table(values: dict[bytes, bytes], block_size: int = 256 * 1024) -> bytes:
    buf = io.BytesIO()
    table = TableBuilder(buf, block_size=block_size)
    for key in sorted(values):
        table.add(key, values[key])
    table.finish()
    return buf.getvalue()


def _old_index(protos: dict[bytes, BundleEntryProto], header: bytes, block_size: int) -> bytes:
    values = {k: p.SerializeToString() for k, p in protos.items()}
    return _old_table({b"": header, **values}, block_size)


_DIM = st.sampled_from([0, 1, 2, 3, 127, 128, 300, 1 << 20, 1 << 40, U63])
_ENTRY = st.tuples(
    st.sampled_from(DTYPES),
    st.lists(_DIM, max_size=8).map(tuple),
    st.sampled_from([0, 1, 5, 127, 128, 1 << 20]),
    st.one_of(st.sampled_from([0, 1, 127, 128, 1 << 35, U63]), st.integers(0, U63)),
    st.one_of(st.sampled_from([0, 2, 1 << 33]), st.integers(0, U63)),
    st.one_of(st.sampled_from([0, unmask_crc(0), 0xFFFFFFFF]), st.integers(0, 2**32 - 1)),
)
_KEY = st.binary(min_size=1, max_size=20)


def _rows_and_protos(entries, in_order: bool):
    rows, protos = EntryRows(), {}
    items = sorted(entries.items()) if in_order else list(entries.items())
    for key, fields in items:
        assert key not in rows
        rows.add(key, *fields)
        protos[key] = _proto(*fields)
        assert key in rows
    return rows, protos


@SETTINGS
@given(
    st.dictionaries(_KEY, _ENTRY, max_size=60),
    st.booleans(),
    st.sampled_from(BLOCK_SIZES),
    st.binary(max_size=40),
    st.sampled_from(PIECES),
)
def test_rows_give_the_index_protobuf_and_table_builder_give(
    entries, in_order, block_size, header, piece
):
    rows, protos = _rows_and_protos(entries, in_order)
    assert rows.table({b"": header}, block_size=block_size, piece_entries=piece) == _old_index(
        protos, header, block_size
    )
    for key, proto in protos.items():
        assert rows[key].SerializeToString() == proto.SerializeToString()
    assert len(rows) == len(protos) and set(rows) == set(protos)


def test_every_field_at_its_edges():
    """One row per dtype, per rank and per edge value of each field, in one table."""
    rng = random.Random(5)
    entries = {}
    edges = [0, 1, 127, 128, 16383, 16384, 2**31 - 1, 2**32, 2**56, U63]
    for i in range(2000):
        dtype = DTYPES[i % len(DTYPES)]
        shape = tuple(rng.choice(edges) for _ in range(i % 9))
        shard = rng.choice([0, 1, 127, 128, 2**20 - 1])
        entries[b"t%05d" % i] = (
            dtype,
            shape,
            shard,
            rng.choice(edges),
            rng.choice(edges),
            rng.choice([0, unmask_crc(0), rng.getrandbits(32)]),
        )
    for in_order in (True, False):
        rows, protos = _rows_and_protos(entries, in_order)
        for block_size, piece in ((64, 16384), (4096, 100), (256 * 1024, 333), (64, 3)):
            assert rows.table(
                {b"": b"h"}, block_size=block_size, piece_entries=piece
            ) == _old_index(protos, b"h", block_size)


@SETTINGS
@given(st.lists(_DIM, max_size=8))
def test_shape_field_is_protobuf(shape):
    e = BundleEntryProto()
    e.shape.SetInParent()
    for d in shape:
        e.shape.dim.add().size = d
    assert shape_field(shape) == e.SerializeToString()


def _partitioned(rng, full_shape) -> BundleEntryProto:
    e = _proto(1, full_shape, 0, 0, 0, 0)
    e.ClearField("crc32c")
    for _ in range(rng.randint(1, 3)):
        s = e.slices.add()
        for d in full_shape:
            x = s.extent.add()
            if rng.random() < 0.5:
                x.start, x.length = 0, d
    return e


@pytest.mark.parametrize("in_order", [True, False])
def test_rows_with_partitioned_entries_and_many_shapes(in_order):
    """Messages among the rows (partitioned tensors' own entries), more distinct shapes
    than are written shape by shape, many blocks."""
    rng = random.Random(7)
    keys = sorted({bytes(rng.choices(b"ab/_\x00\xff", k=rng.randint(1, 14))) for _ in range(3000)})
    entries = {
        k: (1, (rng.randint(0, 40), rng.randint(1, 3)), 0, rng.getrandbits(40), 24, 99)
        for k in keys
    }
    messages = {k: _partitioned(rng, (6, 4)) for k in rng.sample(keys, 40)}
    for k in messages:
        del entries[k]
    rows, protos = _rows_and_protos(entries, in_order)
    rows.protos.update(messages)
    for block_size, piece in ((300, 16384), (300, 7), (4096, 16384), (4096, 50)):
        assert rows.table({b"": b"hdr"}, block_size=block_size, piece_entries=piece) == _old_index(
            {**protos, **messages}, b"hdr", block_size
        )
    assert rows[next(iter(messages))] is messages[next(iter(messages))]


@SETTINGS
@given(
    st.dictionaries(st.binary(max_size=30), st.binary(max_size=700), max_size=80),
    st.sampled_from(BLOCK_SIZES),
    st.sampled_from(PIECES),
)
def test_table_bytes_is_table_builder(values, block_size, piece):
    """Any sorted keys (the empty one too) and values; values of twice a block and more;
    all at once, and a piece at a time."""
    keys = sorted(values)
    kbuf = np.frombuffer(b"".join(keys), np.uint8)
    koff = np.concatenate([[0], np.cumsum([len(k) for k in keys], dtype=np.int64)])
    vals = [values[k] for k in keys]
    vbuf = np.frombuffer(b"".join(vals), np.uint8)
    vlen = np.array([len(v) for v in vals], dtype=np.int64)
    vstart = np.cumsum(vlen) - vlen

    def write(out, at):
        copy_ranges(out, at, vbuf, vstart, vlen[: len(at)])

    got = table_bytes(kbuf, koff, vlen, write, block_size=block_size)
    assert got == _old_table(values, block_size)
    assert TableReader(got).entries == [(k, values[k]) for k in keys]

    def piece_of(lo, hi):
        def write_piece(out, at):
            copy_ranges(out, at, vbuf, vstart[lo:], vlen[lo : lo + len(at)])

        return kbuf, koff[lo : hi + 1], vlen[lo:hi], write_piece

    laid = table_in_pieces(len(keys), piece_of, block_size=block_size, piece_entries=piece)
    assert laid == got


def test_pieces_end_in_every_place_of_a_block():
    """Blocks of many restart intervals; pieces of every length from 1 to past two
    blocks, so that one ends at each place of a restart interval and of a block, or
    holds no whole block and is made longer."""
    rng = random.Random(11)
    entries = {
        b"v/%05d/%s" % (i, b"k" * rng.randint(0, 6)): (19, (rng.randint(1, 9),), 0, i * 8, 8, i)
        for i in range(400)
    }
    rows, protos = _rows_and_protos(entries, True)
    want = _old_index(protos, b"h", 1024)
    per_block = [len(b) for b in _block_entries(want)]
    assert len(per_block) > 10 and max(per_block) > 2 * 16  # blocks of several intervals
    for piece in range(1, 2 * max(per_block) + 3):
        assert rows.table({b"": b"h"}, block_size=1024, piece_entries=piece) == want


def _block_entries(table: bytes) -> list[list[bytes]]:
    """The keys of each data block of ``table``."""
    reader = TableReader(table)
    return [[k for k, _ in block] for _, block in reader.iter_blocks()]


def test_table_bytes_refuses_keys_out_of_order():
    for keys in ([b"b", b"a"], [b"a", b"a"], [b"ab", b"a"]):
        kbuf = np.frombuffer(b"".join(keys), np.uint8)
        koff = np.cumsum([0, *map(len, keys)])
        with pytest.raises(ValueError, match="out of order"):
            table_bytes(kbuf, koff, np.zeros(2, np.int64), lambda out, at: None)
        # the pair in two pieces (each entry a block of its own)
        with pytest.raises(ValueError, match="out of order"):
            table_in_pieces(
                2,
                lambda lo, hi: (kbuf, koff[lo : hi + 1], np.zeros(hi - lo, np.int64), _none),
                block_size=1,
                piece_entries=1,
            )


def _none(out, at):
    pass


def test_index_is_built_in_bounded_memory():
    """Beside the table's own bytes, building the index of 150 000 rows takes a piece's
    arrays (about 4 MB), not arrays of every row (some 30 MB before)."""
    rows = EntryRows()
    for i in range(150_000):
        rows.add(b"scope_%04d/var_%02d" % divmod(i, 100), 19, (256,), 0, i * 512, 512, i)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table = rows.table({b"": b"header"})
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert len(table) > 4_000_000
    assert peak - len(table) < 8_000_000


def test_rows_pickle_small_and_whole():
    rng = random.Random(3)
    for in_order in (True, False):
        entries = {b"w%06d" % rng.getrandbits(30): (1, (3, 4), 0, i, 48, i) for i in range(5000)}
        rows, protos = _rows_and_protos(entries, in_order)
        data = pickle.dumps(rows)
        key_bytes = sum(map(len, entries))
        assert len(data) - key_bytes < 40 * len(entries)
        back = pickle.loads(data)
        assert back.table({b"": b""}) == rows.table({b"": b""})
        key = next(iter(entries))
        assert key in back and b"zz" not in back
        back.add(b"\x00first", 1, (), 0, 0, 0, 0)  # still takes rows, in order or not
        assert (
            b"\x00first" in back
            and back[key].SerializeToString() == protos[key].SerializeToString()
        )


def test_rows_take_little_memory():
    """30 bytes of columns a row beside the key's bytes: the budget is 100."""
    keys = [b"layer_%06d/kernel" % i for i in range(50_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rows = EntryRows()
        for i, key in enumerate(keys):
            rows.add(key, 19, (4, 4), 0, i * 32, 32, i)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert (used - sum(map(len, keys))) / len(keys) < 100


def test_merge_sets_shards_joins_slices_and_refuses_a_tensor_twice():
    a, b = EntryRows(), EntryRows()
    a.add(b"x", 1, (2,), 7, 0, 8, 1)
    b.add(b"y", 1, (2,), 7, 8, 8, 2)
    b.add(b"z", 2, (), 7, 16, 8, 3)
    part_a, part_b = _partitioned(random.Random(1), (6, 4)), _partitioned(random.Random(2), (6, 4))
    a.protos[b"p"], b.protos[b"p"] = part_a, part_b
    merged = merge_rows([a, b])
    assert [merged[k].shard_id for k in (b"x", b"y", b"z", b"p")] == [0, 1, 1, 0]
    assert list(merged[b"p"].slices) == [*part_a.slices, *part_b.slices]
    assert merged.table({b"": b""}) == _old_index(
        {
            b"x": _proto(1, (2,), 0, 0, 8, 1),
            b"y": _proto(1, (2,), 1, 8, 8, 2),
            b"z": _proto(2, (), 1, 16, 8, 3),
            b"p": merged[b"p"],
        },
        b"",
        256 * 1024,
    )
    # messages by key, as before, are merged the same way
    old = merge_rows([{b"x": _proto(1, (2,), 5, 0, 8, 1)}, {b"y": _proto(1, (2,), 5, 0, 8, 1)}])
    assert [old[b"x"].shard_id, old[b"y"].shard_id] == [0, 1]
    c = EntryRows()
    c.add(b"y", 1, (2,), 0, 0, 8, 1)
    with pytest.raises(ValueError, match="'y' written to two shards"):
        merge_rows([b, c])
    d = EntryRows()
    d.add(b"p", 1, (2,), 0, 0, 8, 1)
    with pytest.raises(ValueError, match="'p' written to two shards"):
        merge_rows([a, d])
