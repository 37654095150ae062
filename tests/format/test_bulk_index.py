"""The bulk paths of reading an index give exactly what the one-by-one paths give.

``decode_entries`` against protobuf on random and mutated ``BundleEntryProto`` bytes;
``decode_names`` against ``decode_name`` on any bytes; ``block_columns`` and
``TableReader`` against the entry-by-entry table reader they replaced (kept below as
the oracle), on valid and damaged blocks and tables; ``Checkpoint.table``,
``dump_json`` and ``dump --json`` against ``info`` and ``json.dumps(dump(...))`` on
checkpoints TensorFlow writes during the run, also after damaging their entries.
"""

from __future__ import annotations

import importlib
import io
import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import bytes_name, run, run_process, tf_keys
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tfckpt
from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.format.bundle import BULK_MAX_RANK, TensorTable, decode_entries, parse_entry
from tfckpt.format.natural import in_natural_order
from tfckpt.format.orderedcode import decode_name, decode_names
from tfckpt.format.table import (
    _U32,
    BLOCK_TRAILER_SIZE,
    FOOTER_SIZE,
    KEY_BYTES_PER_FILE_BYTE,
    BlockBuilder,
    BlockHandle,
    Footer,
    KeyBudgetExceeded,
    TableBuilder,
    TableReader,
    block_columns,
    decode_varint,
    parse_block,
)
from tfckpt.inspection import dump, dump_json

SETTINGS = settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


# --- entries: decode_entries against protobuf --------------------------------------


def _varint(value: int, pad: int = 0) -> bytes:
    """A varint as protobuf writes it (negative: ten bytes), with ``pad`` needless bytes."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append(value & 0x7F)
        value >>= 7
        if not value:
            break
        out[-1] |= 0x80
    if pad:
        out[-1] |= 0x80
        out += b"\x80" * (pad - 1) + b"\x00"
    return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _delimited(number: int, payload: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(payload)) + payload


_DTYPES = st.one_of(
    st.integers(0, 34),  # every DataType tfckpt knows, DT_INVALID and one past the last
    st.sampled_from([101, 120, 2**31 - 1, -1, -(2**31)]),  # reference types, extremes
    INT32,
)
_DIM = st.one_of(
    st.integers(0, 300),
    st.just(-1),
    st.sampled_from([2**31, 2**32, 2**62, 2**63 - 1, -(2**63)]),
    INT64,
)
_OFFSET = st.one_of(st.integers(0, 5000), st.sampled_from([2**63 - 1, -1]), INT64)
_SHARD = st.one_of(st.integers(0, 3), st.sampled_from([-1, 2**31 - 1]), INT32)
_EXTENT = st.tuples(st.integers(-2, 10), st.one_of(st.none(), st.integers(-1, 10)))


@st.composite
def _fields(draw):
    """An entry as a BundleEntryProto and as its list of encoded fields, each of which
    may be written with needless varint bytes or as an explicit zero."""
    p = BundleEntryProto()
    # Half of them a whole tensor's entry as TensorFlow writes one: the fast path's
    # own, so that the mutations below are tried on it.
    tame = draw(st.booleans())
    p.dtype = draw(st.integers(1, 23) if tame else _DTYPES)
    unknown_rank = not tame and draw(st.integers(0, 15)) == 0
    dim, names = (st.integers(0, 300), st.just(1)) if tame else (_DIM, st.integers(0, 9))
    dims = draw(st.lists(st.tuples(dim, names), max_size=BULK_MAX_RANK if tame else 12))
    p.shard_id = draw(st.integers(0, 3) if tame else _SHARD)
    p.offset = draw(st.integers(0, 2**40) if tame else _OFFSET)
    p.size = draw(st.integers(0, 2**40) if tame else _OFFSET)
    p.crc32c = draw(st.integers(0, 2**32 - 1))
    if not tame and draw(st.integers(0, 7)) == 0:
        for extents in draw(st.lists(st.lists(_EXTENT, max_size=3), min_size=1, max_size=2)):
            s = p.slices.add()
            for start, length in extents:
                e = s.extent.add()
                e.start = start
                if length is not None:
                    e.length = length
    pad = draw(st.lists(st.sampled_from([0, 0, 0, 0, 1, 2, 5]), min_size=8, max_size=8))
    zeros = draw(st.integers(0, 5)) == 0  # write fields even when zero

    shape = b""
    for size, named in dims:
        d = p.shape.dim.add(size=size, name="n" if named == 0 else "")
        inner = _tag(1, 0) + _varint(size, pad[7]) if size or zeros else b""
        shape += _delimited(2, inner + (_delimited(2, b"n") if d.name else b""))
    if unknown_rank:
        p.shape.unknown_rank = True
        shape += _tag(3, 0) + _varint(1)
    fields = []
    if p.dtype or zeros:
        fields.append(_tag(1, 0) + _varint(p.dtype, pad[0]))
    if shape or zeros:
        fields.append(_delimited(2, shape))
    for number, value, k in ((3, p.shard_id, 1), (4, p.offset, 2), (5, p.size, 3)):
        if value or zeros:
            fields.append(_tag(number, 0) + _varint(value, pad[k]))
    if p.crc32c or zeros:
        fields.append(_tag(6, 5) + struct.pack("<I", p.crc32c))
    fields += [_delimited(7, s.SerializeToString()) for s in p.slices]
    return p, fields


_MUTATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 200), st.integers(0, 255)),
        st.tuples(st.just("truncate"), st.integers(0, 200)),
        st.tuples(st.just("duplicate"), st.integers(0, 10)),
        st.tuples(st.just("swap"), st.integers(0, 10), st.integers(0, 10)),
        st.tuples(st.just("unknown"), st.integers(0, 10), st.sampled_from([7, 8, 15, 16, 1000])),
        st.tuples(st.just("wire"), st.integers(0, 10), st.sampled_from([0, 1, 2, 5])),
        st.tuples(st.just("insert"), st.integers(0, 200), st.binary(min_size=1, max_size=3)),
        # a varint field's value as any unsigned number: past int32, the sign bit set, ...
        st.tuples(
            st.just("value"),
            st.integers(0, 10),
            st.one_of(
                st.sampled_from([2**31, 2**32 - 1, 2**32, 2**35 - 1, 2**63, 2**64 - 1]),
                st.integers(0, 2**64 - 1),
            ),
        ),
    ),
    max_size=3,
)


def _mutated(fields: list[bytes], mutations) -> bytes:
    fields = list(fields)
    for m in mutations:
        if m[0] == "duplicate" and fields:
            fields.append(fields[m[1] % len(fields)])
        elif m[0] == "swap" and fields:
            i, j = m[1] % len(fields), m[2] % len(fields)
            fields[i], fields[j] = fields[j], fields[i]
        elif m[0] == "unknown":
            unknown = _tag(m[2], 0) + _varint(5) if m[2] != 16 else _delimited(m[2], b"xy")
            fields.insert(m[1] % (len(fields) + 1), unknown)
        elif m[0] == "value" and fields:
            i = m[1] % len(fields)
            fields[i] = bytes([fields[i][0] & ~7]) + _varint(m[2])
        elif m[0] == "wire" and fields:
            i = m[1] % len(fields)
            fields[i] = bytes([fields[i][0] & ~7 | m[2]]) + fields[i][1:]
    raw = b"".join(fields)
    for m in mutations:
        if m[0] == "flip" and raw:
            i = m[1] % len(raw)
            raw = raw[:i] + bytes([m[2]]) + raw[i + 1 :]
        elif m[0] == "truncate":
            raw = raw[: m[1] % (len(raw) + 1)]
        elif m[0] == "insert":
            i = m[1] % (len(raw) + 1)
            raw = raw[:i] + m[2] + raw[i:]
    return raw


def _assert_rows_match_protobuf(raws: list[bytes]) -> np.ndarray:
    """Every ``ok`` row of ``decode_entries(raws)`` is what protobuf parses; returns ``ok``."""
    cols = decode_entries(raws)
    assert cols.dims.shape == (len(raws), BULK_MAX_RANK)
    for i, raw in enumerate(raws):
        row = (
            int(cols.dtype[i]),
            int(cols.rank[i]),
            cols.dims[i].tolist(),
            int(cols.shard_id[i]),
            int(cols.offset[i]),
            int(cols.size[i]),
            int(cols.crc32c[i]),
        )
        try:
            p = parse_entry(raw)
        except DecodeError:
            assert not cols.ok[i], (raw, row)
            continue
        if not cols.ok[i]:  # left to protobuf: its values mean nothing
            continue
        assert not p.slices and not p.shape.unknown_rank, raw
        assert all(d.name == "" for d in p.shape.dim), raw
        dims = [d.size for d in p.shape.dim]
        want = (p.dtype, len(dims), dims + [0] * (BULK_MAX_RANK - len(dims)))
        want += (p.shard_id, p.offset, p.size, p.crc32c)
        assert row == want, raw
    return cols.ok


@SETTINGS
@given(st.lists(st.tuples(_fields(), _MUTATIONS), min_size=1, max_size=6))
def test_decode_entries_is_protobuf_on_mutated_entries(cases):
    raws = [_mutated(fields, mutations) for (_, fields), mutations in cases]
    # Together (a varint may run on into the next entry's bytes) and one by one.
    ok = _assert_rows_match_protobuf(raws)
    for i, raw in enumerate(raws):
        assert _assert_rows_match_protobuf([raw])[0] == ok[i]
    # Canonical bytes of each entry: ok exactly when the entry is in the fast subset.
    canonical = [p.SerializeToString(deterministic=True) for (p, _), _ in cases]
    ok = _assert_rows_match_protobuf(canonical)
    for ((p, _), _), got in zip(cases, ok):
        assert got == _in_fast_subset(p), p


def _in_fast_subset(p: BundleEntryProto) -> bool:
    dims = [d.size for d in p.shape.dim]
    return (
        p.dtype >= 0
        and p.shard_id >= 0
        and p.offset >= 0
        and p.size >= 0
        and not p.shape.unknown_rank
        and len(dims) <= BULK_MAX_RANK
        and all(d >= 0 and not d_.name for d, d_ in zip(dims, p.shape.dim))
        and not p.slices
    )


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**31 - 1),
            st.lists(st.integers(0, 2**63 - 1), max_size=BULK_MAX_RANK),
            st.integers(0, 2**31 - 1),
            st.integers(0, 2**63 - 1),
            st.integers(0, 2**63 - 1),
            st.integers(0, 2**32 - 1),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_canonical_whole_tensor_entries_take_the_fast_path(rows):
    raws = []
    for dtype, dims, shard, offset, size, crc in rows:
        p = BundleEntryProto(dtype=dtype, shard_id=shard, offset=offset, size=size, crc32c=crc)
        for d in dims:
            p.shape.dim.add(size=d)
        raws.append(p.SerializeToString())
    assert _assert_rows_match_protobuf(raws).all()


EDGES = [0, 1, 127, 128, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**35 - 1, 2**63 - 1, 2**63, 2**64 - 1]


def test_decode_entries_at_the_edges_of_each_field():
    """Each varint field (and a dimension) holding values at the edges of int32 and
    int64, written in as many bytes as they need and with needless bytes."""
    fields = {
        1: _tag(1, 0) + _varint(1),
        2: _delimited(2, _delimited(2, _tag(1, 0) + _varint(3))),
        3: b"",
        4: _tag(4, 0) + _varint(8),
        5: _tag(5, 0) + _varint(12),
        6: _tag(6, 5) + b"\x01\x02\x03\x04",
    }
    raws = []
    for value in EDGES:
        for pad in (0, 1, 10 - len(_varint(value))):
            for number in (1, 3, 4, 5):
                edged = {**fields, number: _tag(number, 0) + _varint(value, pad)}
                raws.append(b"".join(edged.values()))
            dim = _delimited(2, _delimited(2, _tag(1, 0) + _varint(value, pad)))
            raws.append(b"".join({**fields, 2: dim}.values()))
    ok = _assert_rows_match_protobuf(raws)
    assert ok.sum() > len(raws) // 3  # the fast path is taken for the values it can hold


# --- names: decode_names against decode_name ----------------------------------------

_FRAGMENTS = st.sampled_from(
    [b"\x00", b"\xff", b"\xc3", b"\xa9", b"\xc3\xa9", b"\xe2\x82", b"\xac", b"\xe2\x82\xac"]
    + [b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80", b"\x80", b"\xed\xa0\x80", b"\xed\xb0\x80"]
    + [b"\xc0\x80", b"\xf4\x90\x80\x80", b"\x7f", b"a", b"/", b"\xdc\x80", b"\xf8"]
)
_KEYS = st.lists(
    st.one_of(st.binary(max_size=10), st.lists(_FRAGMENTS, max_size=5).map(b"".join)),
    max_size=8,
)


@SETTINGS
@given(_KEYS)
def test_decode_names_is_decode_name_of_each(keys):
    assert decode_names(keys) == [decode_name(k) for k in keys]
    without_nul = [k.replace(b"\0", b"") for k in keys]  # the joined path, always
    assert decode_names(without_nul) == [decode_name(k) for k in without_nul]


# --- blocks and tables: block_columns and TableReader against the old reader --------
#
# The entry-by-entry reader that block_columns and TableReader's bulk checks
# replaced, as it was: the oracle for entries, errors and which error comes first.


def _old_parse_block(contents: bytes):
    n = len(contents)
    if n < 4:
        raise ValueError("block shorter than its restart count")
    (num_restarts,) = _U32.unpack_from(contents, n - 4)
    if num_restarts > (n - 4) // 4:
        raise ValueError(f"block restart count {num_restarts} exceeds block size {n}")
    limit = n - 4 - 4 * num_restarts
    restarts = struct.unpack_from(f"<{num_restarts}I", contents, limit)
    if limit and not num_restarts:
        raise ValueError("block has entries but no restart points")
    if limit and restarts[0] != 0:
        raise ValueError(f"first restart offset is {restarts[0]}, not 0")
    done = 0  # restart points reached so far
    restart = restarts[0] if restarts else limit
    pos = 0
    key = b""
    while pos < limit:
        at_restart = pos == restart
        if at_restart:
            done += 1
            restart = restarts[done] if done < num_restarts else limit
            if restart <= pos:
                raise ValueError(f"restart offsets not increasing ({pos}, then {restart})")
        elif pos > restart:
            raise ValueError(f"restart offset {restart} points inside an entry")
        shared = contents[pos]
        non_shared = contents[pos + 1] if pos + 1 < limit else 0x80
        value_len = contents[pos + 2] if pos + 2 < limit else 0x80
        if (shared | non_shared | value_len) < 0x80:
            pos += 3
        else:
            shared, pos = decode_varint(contents, pos, limit, 5)
            non_shared, pos = decode_varint(contents, pos, limit, 5)
            value_len, pos = decode_varint(contents, pos, limit, 5)
        if shared > len(key) or (shared and at_restart):
            raise ValueError(
                f"entry shares {shared} bytes of a {len(key)}-byte key"
                + (" at a restart point" if at_restart else "")
            )
        end = pos + non_shared + value_len
        if end > limit:
            raise ValueError("entry runs past the end of its block")
        key = key[:shared] + contents[pos : pos + non_shared]
        pos += non_shared
        yield key, contents[pos:end]
        pos = end
    if done < num_restarts and (limit or restarts != (0,)):
        raise ValueError(
            f"restart offset {restarts[done]} is not the start of an entry (entries end at {limit})"
        )


class _OldTableReader(TableReader):
    def __init__(self, data: bytes, path: str = "<table>"):
        super().__init__(data, path, lazy=True)
        self.old_entries = [e for _, block in self.old_iter_blocks() for e in block]

    def old_iter_blocks(self):
        data = self._data
        if len(data) < FOOTER_SIZE:
            raise self._corrupt(f"file is {len(data)} bytes, shorter than the 48-byte footer")
        try:
            footer = Footer.decode(data[-FOOTER_SIZE:])
        except ValueError as e:
            raise self._corrupt(f"footer: {e}") from None
        index = self._read_block(footer.index, "index block")
        last_key = None
        budget = max(KEY_BYTES_PER_FILE_BYTE * len(data), 1 << 20)
        block_end = 0
        try:
            for sep, handle_bytes in _old_parse_block(index):
                budget -= len(sep)
                if budget < 0:
                    raise self._too_many_key_bytes(len(data))
                handle, _ = BlockHandle.decode(handle_bytes, 0, len(handle_bytes))
                if handle.offset < block_end:
                    raise self._corrupt(
                        f"data block at offset {handle.offset} repeats or overlaps the one "
                        f"before it (which ends at {block_end})"
                    )
                block_end = handle.offset + handle.size + BLOCK_TRAILER_SIZE
                block = self._read_block(handle, "data block")
                entries = []
                for key, value in _old_parse_block(block):
                    budget -= len(key)
                    if budget < 0:
                        raise self._too_many_key_bytes(len(data))
                    if last_key is not None and key <= last_key:
                        raise self._corrupt(
                            f"key {key!r} is not after {last_key!r}: keys unsorted or duplicated"
                        )
                    if key > sep:
                        raise self._corrupt(f"key {key!r} lies beyond its index entry {sep!r}")
                    entries.append((key, value))
                    last_key = key
                yield handle, entries
        except ValueError as e:
            raise self._corrupt(str(e)) from None


def _outcome(fn):
    """What ``fn()`` returns, or its error's type and message."""
    try:
        return fn()
    except Exception as e:  # the oracle's errors and the new code's must be the same
        return type(e), str(e)


def _old_block(contents: bytes, budget: int | None = None):
    keys, values = [], []
    left = (1 << 63) if budget is None else budget
    for key, value in _old_parse_block(contents):
        left -= len(key)
        if left < 0:
            raise KeyBudgetExceeded()
        keys.append(key)
        values.append(value)
    return keys, values


_ENTRIES = st.lists(
    st.tuples(st.binary(max_size=6), st.binary(max_size=4)),
    max_size=40,
    unique_by=lambda kv: kv[0],
).map(sorted)
_INTERVALS = st.sampled_from([1, 2, 3, 16, 1000])
_BLOCK_DAMAGE = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 255)),
        st.tuples(st.just("truncate"), st.integers(0, 10**6)),
        st.tuples(st.just("restarts"), st.lists(st.integers(0, 300), max_size=6)),
        st.tuples(st.just("swap"), st.integers(0, 100), st.integers(0, 100)),
    ),
    max_size=3,
)


def _damaged_block(entries, interval, damage) -> bytes:
    entries = list(entries)
    for d in damage:
        if d[0] == "swap" and entries:  # unsorted or duplicated keys
            i, j = d[1] % len(entries), d[2] % len(entries)
            entries[i], entries[j] = entries[j], entries[i]
    return _damage_contents(_block(entries, interval), damage)


def _damage_contents(contents: bytes, damage) -> bytes:
    for d in damage:
        if d[0] == "flip" and contents:
            i = d[1] % len(contents)
            contents = contents[:i] + bytes([d[2]]) + contents[i + 1 :]
        elif d[0] == "truncate":
            contents = contents[: d[1] % (len(contents) + 1)]
        elif d[0] == "restarts" and len(contents) >= 4:
            (n,) = _U32.unpack_from(contents, len(contents) - 4)
            limit = max(len(contents) - 4 - 4 * n, 0)
            r = d[1]
            contents = contents[:limit] + struct.pack(f"<{len(r)}I", *r) + _U32.pack(len(r))
    return contents


def _block(entries, interval: int) -> bytes:
    b = BlockBuilder(interval)
    for k, v in entries:
        b.add(k, v)
    return b.finish()


@SETTINGS
@given(_ENTRIES, _INTERVALS, _BLOCK_DAMAGE, st.one_of(st.none(), st.integers(0, 120)))
def test_block_columns_is_the_old_block_parser(entries, interval, damage, budget):
    contents = _damaged_block(entries, interval, damage)
    old = _outcome(lambda: _old_block(contents, budget))
    assert _outcome(lambda: block_columns(contents, budget)) == old
    # After an error, ``out`` holds the entries the old reader yielded before it.
    yielded: list = []
    _outcome(lambda: yielded.extend(_old_parse_block(contents)))
    out: tuple[list[bytes], list[bytes]] = ([], [])
    _outcome(lambda: block_columns(contents, None, out))
    assert list(zip(*out)) == yielded
    if budget is None:
        want = old if isinstance(old[0], type) else list(zip(*old))
        assert _outcome(lambda: parse_block(contents)) == want
    if not damage and budget is None:
        assert old == ([k for k, _ in entries], [v for _, v in entries])


@st.composite
def _tables(draw):
    """A table file of several data blocks, maybe damaged: blocks' contents, their
    order, their keys (unsorted, repeated, beyond their separator)."""
    entries = draw(_ENTRIES)
    interval = draw(_INTERVALS)
    cuts = sorted(draw(st.sets(st.integers(1, max(len(entries), 1)), max_size=4)))
    groups = [entries[a:b] for a, b in zip([0, *cuts], [*cuts, len(entries)])]
    blocks = []
    for group in groups:
        damage = draw(_BLOCK_DAMAGE) if draw(st.integers(0, 2)) == 0 else []
        sep = group[-1][0] if group else b""
        if draw(st.integers(0, 5)) == 0:
            sep = draw(st.binary(max_size=6))
        blocks.append((sep, _damaged_block(group, interval, damage)))
    if len(blocks) > 1 and draw(st.integers(0, 5)) == 0:
        i, j = draw(st.integers(0, len(blocks) - 1)), draw(st.integers(0, len(blocks) - 1))
        blocks[i], blocks[j] = blocks[j], blocks[i]
    return blocks, entries


@SETTINGS
@given(_tables())
# A key repeated from the block before, then an entry cut short: the repeat is first.
@example(([(b"", bytes(7) + b"\x01\0\0\0"), (b"", bytes(8) + b"\x01\0\0\0")], []))
def test_table_reader_is_the_old_reader(case):
    blocks, _ = case
    _assert_table_reader_is_the_old_reader(table(blocks))


@SETTINGS
@given(_tables(), _BLOCK_DAMAGE)
def test_table_reader_with_a_damaged_index_block(case, damage):
    blocks, _ = case
    data = table(blocks)
    footer = Footer.decode(data[-FOOTER_SIZE:])
    at, size = footer.index.offset, footer.index.size
    contents = _damage_contents(data[at : at + size], damage)
    from fuzz_helpers import with_trailer

    index = Footer(footer.metaindex, BlockHandle(at, len(contents))).encode()
    _assert_table_reader_is_the_old_reader(data[:at] + with_trailer(contents) + index)


def _assert_table_reader_is_the_old_reader(data: bytes) -> None:
    old = _outcome(lambda: _OldTableReader(data, "t.index").old_entries)
    new = _outcome(lambda: TableReader(data, "t.index"))
    if isinstance(new, TableReader):
        new = new.entries
        assert [
            e for _, b in TableReader(data, "t.index", lazy=True).iter_blocks() for e in b
        ] == new
    assert new == old


def table(*args, **kwargs) -> bytes:
    """A table file of the given data blocks (see ``fuzz_helpers.table``)."""
    from fuzz_helpers import table

    return table(*args, **kwargs)


def _cut_entry(contents: bytes, i: int) -> bytes:
    """The block with entry ``i`` running past the block's end."""
    from fuzz_helpers import entry_starts

    raw = bytearray(contents)
    raw[entry_starts(contents)[i] + 2] = 0x7F  # its value's length: one byte here
    return bytes(raw)


def test_which_error_of_a_table_comes_first():
    """With several faults, the one the old reader met first, in file order."""
    good = [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
    unsorted = [(b"b", b"1"), (b"a", b"2"), (b"c", b"3")]
    cases = {
        "unsorted, then an entry cut": [(b"z", _cut_entry(_block(unsorted, 16), 2))],
        "beyond its separator, then an entry cut": [(b"a", _cut_entry(_block(good, 16), 2))],
        "repeated across blocks, then a bad restart": [
            (b"c", _block(good, 16)),
            (b"d", _block([(b"c", b""), (b"d", b"")], 16)[:-8] + struct.pack("<2I", 7, 2)),
        ],
    }
    # Keys decoding to more bytes than the budget (a multiple of the file's size) ...
    chain = [(i + 1, b"k", b"") for i in range(3000)]
    from fuzz_helpers import raw_block

    cases["too many key bytes"] = [(b"z", raw_block([(0, b"a", b""), *chain], [0]))]
    # ... after a key out of order: the key comes first.
    cases["unsorted, then too many key bytes"] = [
        (b"z", raw_block([(0, b"b", b""), (0, b"a", b""), *chain], [0]))
    ]
    for what, blocks in cases.items():
        data = table(blocks)
        assert isinstance(_outcome(lambda: TableReader(data)), tuple), what  # noqa: B023
        _assert_table_reader_is_the_old_reader(data)
    # Faults in the index block come after the data blocks listed before them.
    blocks = [(b"b", _block(unsorted[:2], 16)), (b"c", _block(good[2:], 16))]
    for index_items in (
        [(0, b"b", 0), (9, b"c", 1)],  # shares more than the key before it
        [(0, b"b", 0), (0, b"c", 1), (0, b"d", 1)],  # a block listed twice
    ):
        data = table(blocks, index_items=index_items)
        _assert_table_reader_is_the_old_reader(data)
        assert "unsorted" in _outcome(lambda: TableReader(data))[1]  # noqa: B023
    # ... and stop the reading when those blocks are good.
    blocks = [(b"b", _block(good[:2], 16)), (b"c", _block(good[2:], 16))]
    data = table(blocks, index_items=[(0, b"b", 0), (9, b"c", 1)])
    _assert_table_reader_is_the_old_reader(data)
    assert "entry shares 9 bytes" in _outcome(lambda: TableReader(data))[1]


# --- checkpoints TensorFlow writes: table, dump_json and dump --json ----------------

ODD_NAMES = [
    "naïve/ключ/名前",
    'quo"te/"x"',
    "back\\slash/\\n",
    "ctl\x01\x1f/tab\tnl\n",
    "del\x7f/x",
    "emoji/😀",
    "plain",
    "scope/a",
    "scope/b/c",
    "zz/9",
]
# not UTF-8; a NUL first, as every slice key has (the key is still a name)
BYTES_NAMES = [b"bad\xff/utf8", b"cut\xe2\x82/x", b"sur\xed\xa0\x80", b"\x00lead/nul"]


def scope_of(name: str) -> str:
    """The old code's top-level scope of a tensor (``model`` of ``model/dense/kernel``)."""
    return name.split("/", 1)[0] if "/" in name else name


def _old_dump(ckpt, filter=None) -> dict:
    """``dump`` as it was built before, one ``info`` at a time: the oracle (its names in
    the order dump lists them, natural where they come sorted)."""
    names = ckpt.keys()
    if filter is not None:
        names = [n for n in names if re.search(filter, n)]
    names = in_natural_order(names)
    tensors, scopes = [], {}
    for name in names:
        info = ckpt.info(name)
        tensors.append(
            {
                "name": name,
                "dtype": info.dtype,
                "shape": list(info.shape),
                "bytes": info.nbytes,
                "shard": info.shard,
                "offset": info.offset,
                "crc32c": info.crc32c,
                "slices": [[list(e) for e in s] for s in info.slices] if info.slices else [],
                "elements": info.size,
                "stored_elements": info.stored_elements,
            }
        )
        acc = scopes.setdefault(scope_of(name), [0, 0])
        acc[0] += info.nbytes
        acc[1] += 1
    h = ckpt.header
    v1 = {"format": ckpt.format} if ckpt.format != Checkpoint.format else {}
    return {
        "prefix": ckpt.prefix,
        **v1,
        "num_shards": h.num_shards,
        "endianness": h.endianness,
        "version": {
            "producer": h.version.producer,
            "min_consumer": h.version.min_consumer,
            "bad_consumers": list(h.version.bad_consumers),
        },
        "tensor_count": len(tensors),
        "total_bytes": sum(t["bytes"] for t in tensors),
        "tensors": tensors,
        "scopes": [
            {"scope": s, "bytes": b, "tensors": n}
            for s, (b, n) in sorted(scopes.items(), key=lambda kv: (-kv[1][0], kv[0]))
        ],
    }


def tf_module():
    return pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def tf():
    return tf_module()


@pytest.fixture(scope="module")
def odd_checkpoint(tf, tmp_path_factory):
    """SaveV2 of odd and non-UTF-8 names, rank 0 to 9, every dtype, strings, a variant."""
    import tf_checkpoints as writers

    prefix = str(tmp_path_factory.mktemp("bulk-odd") / "odd")
    rng = np.random.default_rng(21)
    names: list[bytes] = []
    tensors = []
    for i, name in enumerate(ODD_NAMES):
        names.append(name.encode())
        tensors.append(tf.constant(rng.standard_normal(i + 1).astype(np.float32)))
    for i, name in enumerate(BYTES_NAMES):
        names.append(name)
        tensors.append(tf.constant(np.arange(i + 2, dtype=np.int16)))
    for rank in range(10):  # past BULK_MAX_RANK: those rows take info's path
        shape = [2 if d % 3 == 0 else 1 for d in range(rank)]
        names.append(f"rank/{rank}".encode())
        tensors.append(tf.constant(rng.standard_normal(shape).astype(np.float64)))
    names += [b"rank/empty", b"rank/zero_dim"]
    tensors += [tf.constant(np.zeros((0,), np.int32)), tf.constant(np.zeros((3, 0, 2), np.int8))]
    for key, value in writers.numpy_values().items():
        names.append(f"dtype/{key}".encode())
        tensors.append(writers.to_tf_tensor(value))
    names += [b"text/scalar", b"text/matrix"]
    tensors += [tf.constant(b"one"), tf.constant([[b"a", b""], [b"\xff", b"long" * 50]])]
    rows = np.array([[1.5, -2.0], [3.25, 4.0]], dtype=np.float32)
    names.append(b"variant/list")
    tensors.append(
        tf.raw_ops.TensorListFromTensor(tensor=tf.constant(rows), element_shape=tf.constant([2]))
    )
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=tf.constant(names),
        shape_and_slices=[""] * len(names),
        tensors=tensors,
    )
    return prefix


@pytest.fixture(scope="module")
def saver_checkpoint(tf, tmp_path_factory):
    """TF1 Saver, sharded over two devices, of variables under odd names (one partitioned)."""
    prefix = str(tmp_path_factory.mktemp("bulk-saver") / "model.ckpt")
    with tf.Graph().as_default():
        var_list = {}
        with tf.device("/cpu:0"):
            for i, name in enumerate(ODD_NAMES):
                var_list[name] = tf.compat.v1.get_variable(
                    f"v{i}", initializer=np.full((i % 3 + 1, 2), i, np.float32)
                )
            var_list["step"] = tf.compat.v1.get_variable("step", initializer=np.int64(5))
        with tf.device("/cpu:1"):
            var_list["words"] = tf.compat.v1.get_variable("words", initializer=[b"x", b"yz"])
            parted = tf.compat.v1.get_variable(
                "parted",
                shape=[10, 3],
                initializer=tf.compat.v1.random_normal_initializer(seed=1),
                partitioner=tf.compat.v1.fixed_size_partitioner(3),
            )
            var_list["part/itioned\x7f"] = parted
        saver = tf.compat.v1.train.Saver(var_list, sharded=True)
        config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
        with tf.compat.v1.Session(config=config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, prefix, write_meta_graph=False)
    return prefix


@pytest.fixture(scope="module")
def v1_checkpoint(tf, tmp_path_factory):
    from v1_checkpoints import build_dtypes_graph, save_v1

    saved, _ = save_v1(build_dtypes_graph, str(tmp_path_factory.mktemp("bulk-v1") / "v1"))
    return saved


def _assert_bulk_is_one_by_one(prefix: str, filters=()) -> None:
    with tfckpt.open(prefix) as ckpt:  # the table first: nothing cached by info yet
        names = ckpt.keys()
        table = ckpt.table()
        some = [*names[::3], *names[:2]]  # repeated, out of order
        some_table = ckpt.table(some)
    with tfckpt.open(prefix) as ckpt:
        if ckpt.format == Checkpoint.format:
            # TensorFlow lists whole tensors by name, partitioned ones by their slices' keys
            whole = {bytes_name(n) for n, s in zip(names, table.slices) if not s}
            cut = {k for k in whole if b"\n" in k}  # its listing's lines cannot show these
            pieces = {k.split(b"\n")[0] for k in cut} | ({b""} if cut else set())
            assert set(tf_keys(prefix)) - pieces == (whole - cut) | ckpt._slice_keys
            try:
                shapes = tf_module().train.load_checkpoint(prefix).get_variable_to_shape_map()
            except UnicodeDecodeError:  # a name that is not UTF-8: checked by keys above
                shapes = None
            if shapes is not None:
                assert sorted(names) == sorted(shapes)
                assert [list(s) for s in table.shapes] == [shapes[n] for n in names]
        assert names == sorted(names, key=bytes_name)
        assert table.names == names
        assert table == TensorTable.of([ckpt.info(n) for n in names])
        for i, name in enumerate(names):
            assert table.info(i) == ckpt.info(name), name
        assert some_table == TensorTable.of([ckpt.info(n) for n in some])
        for f in (None, *filters):
            data = dump(ckpt, filter=f)
            assert data == _old_dump(ckpt, filter=f), f
            assert dump_json(ckpt, filter=f) == json.dumps(data), f


def _assert_cli_dump_json(prefix: str, filters=()) -> None:
    with tfckpt.open(prefix) as ckpt:
        for f in (None, *filters):
            proc = run("dump", prefix, "--json", *(() if f is None else ("--filter", f)))
            assert proc.returncode == 0, proc.stderr
            data = dump(ckpt, filter=f)
            assert json.loads(proc.stdout) == data
            want = json.dumps(data).replace("\x7f", "\\u007f") + "\n"
            assert proc.stdout == want.encode()


@pytest.mark.parametrize(
    "name",
    [
        "tf1_saver",
        "tf1_sharded",
        "tf1_partitioned",
        "savev2_slices",
        "all_dtypes",
        "keras_manager",
        "max_shard_policy",
    ],
)
def test_written_by_tensorflow(tf_checkpoints, name):
    case = tf_checkpoints(name)
    _assert_bulk_is_one_by_one(case.prefix, filters=("^[a-m]", "nothing matches this"))
    _assert_cli_dump_json(case.prefix, filters=("/",))


def test_odd_names_ranks_dtypes_and_variants(odd_checkpoint):
    filters = ("^(rank|text)/", "[^\\x00-\\x7e]", "\\x7f", "\\udcff")
    _assert_bulk_is_one_by_one(odd_checkpoint, filters)
    _assert_cli_dump_json(odd_checkpoint, filters[:2])


def test_tf1_saver_odd_names_sharded_partitioned(saver_checkpoint):
    _assert_bulk_is_one_by_one(saver_checkpoint, ("^part", "/"))
    _assert_cli_dump_json(saver_checkpoint, ("^part",))


def test_v1_checkpoint(v1_checkpoint):
    _assert_bulk_is_one_by_one(v1_checkpoint, ("part",))
    _assert_cli_dump_json(v1_checkpoint)


def test_command_line_process(odd_checkpoint):
    """``python -m tfckpt dump --json`` in its own process, writing to a pipe."""
    proc = run_process("dump", odd_checkpoint, "--json")
    assert proc.returncode == 0, proc.stderr
    with tfckpt.open(odd_checkpoint) as ckpt:
        data = dump(ckpt)
    assert json.loads(proc.stdout) == data
    assert proc.stdout == (json.dumps(data).replace("\x7f", "\\u007f") + "\n").encode()


# --- damaged entries and bad names: the same error as info ---------------------------


@pytest.fixture(scope="module")
def plain_checkpoint(tf, tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("bulk-plain") / "plain")
    names = ["a/matrix", "b/vector", "c/scalar", "d/text", "e/rank9"]
    tensors = [
        tf.constant(np.arange(120, dtype=np.float32).reshape(3, 40)),
        tf.constant(np.arange(5, dtype=np.int64)),
        tf.constant(2.5, dtype=tf.float64),
        tf.constant([b"x", b"yz"]),
        tf.constant(np.ones([1] * 9, np.float32)),
    ]
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
    return prefix


def _set(field, value):
    def damage(p):
        setattr(p, field, value)

    return damage


def _set_dim(i, size, name=""):
    def damage(p):
        p.shape.dim[i].size = size
        p.shape.dim[i].name = name

    return damage


def _set_dims(sizes):
    def damage(p):
        del p.shape.dim[:]
        for s in sizes:
            p.shape.dim.add(size=s)

    return damage


def _unknown_rank(p):
    p.shape.unknown_rank = True


def _huge_empty(p):
    _set_dims([2**32, 2**32])(p)  # 2**64 elements: 0 in int64 arithmetic
    p.size = 0


def _grow_size(p):
    p.size += 4


DAMAGES = {
    "negative dim": ("a/matrix", _set_dim(0, -3)),
    "negative dim of a vector": ("b/vector", _set_dim(0, -1)),
    "negative dim at rank 9": ("e/rank9", _set_dim(8, -2)),
    "size not the shape's": ("a/matrix", _grow_size),
    "shard out of range": ("b/vector", _set("shard_id", 3)),
    "shard negative": ("b/vector", _set("shard_id", -1)),
    "unknown dtype": ("c/scalar", _set("dtype", 99)),
    "negative dtype": ("a/matrix", _set("dtype", -5)),
    "invalid dtype": ("a/matrix", _set("dtype", 0)),
    "huge dims": ("a/matrix", _set_dims([2**40, 2**40])),
    "huge dims of strings": ("d/text", _set_dims([2**40, 2**40])),
    "huge dims, elements wrap to 0": ("a/matrix", _huge_empty),
    "rank 255": ("c/scalar", _set_dims([1] * 255)),
    "negative offset": ("b/vector", _set("offset", -1)),
    "negative size": ("d/text", _set("size", -7)),
    "unknown rank": ("d/text", _unknown_rank),
    "named dim": ("a/matrix", _set_dim(1, 40, "columns")),
    "string of any size": ("d/text", _set("size", 10**12)),
}
# entries that are not broken, only unusual: info's values, no error
UNUSUAL = {"named dim", "string of any size", "padded varint", "unknown field", "repeated field"}


def _cut_offset(raw: bytes) -> bytes:
    """The entry up to its offset's last byte: a string's, whose size says nothing."""
    p = parse_entry(raw)
    assert p.offset >= 128, p
    p.size = p.crc32c = 0
    return p.SerializeToString()[:-1]


RAW_DAMAGES = {
    "not a proto": ("a/matrix", lambda raw: b"\x08"),
    "truncated": ("b/vector", lambda raw: raw[:-1]),
    "cut in a varint": ("d/text", lambda raw: _cut_offset(raw)),
    "unknown field": ("c/scalar", lambda raw: raw + b"\x78\x05"),
    "repeated field": ("b/vector", lambda raw: raw + b"\x18\x00"),
    "padded varint": ("a/matrix", lambda raw: b"\x08\x81\x00" + raw[2:]),
}


def _damaged_copy(prefix: str, dest: Path, name: str, change) -> str:
    """A copy of the checkpoint with ``name``'s index entry changed by ``change``."""
    from fuzz_helpers import copy_prefix

    out = copy_prefix(prefix, dest)
    index = Path(out + ".index")
    entries = TableReader(index.read_bytes()).entries
    buf = io.BytesIO()
    builder = TableBuilder(buf)
    for key, value in entries:
        builder.add(key, change(value) if key == name.encode() else value)
    builder.finish()
    index.write_bytes(buf.getvalue())
    return out


def _as_infos(result):
    if isinstance(result, TensorTable):
        return [result.info(i) for i in range(len(result))]
    return result


def _assert_same_errors(prefix: str, names: list) -> None:
    """table and dump_json say what info says: the same infos or the same error."""
    with tfckpt.open(prefix) as ckpt:
        everything = ckpt.keys()
    for wanted in (everything, names, [everything[0], *names]):
        with tfckpt.open(prefix) as ckpt:
            want = _outcome(lambda: [ckpt.info(n) for n in wanted])  # noqa: B023
        with tfckpt.open(prefix) as ckpt:
            got = _as_infos(_outcome(lambda: ckpt.table(wanted)))  # noqa: B023
        assert got == want, wanted
    with tfckpt.open(prefix) as ckpt:
        want = _outcome(lambda: [ckpt.info(n) for n in everything])
    with tfckpt.open(prefix) as ckpt:
        assert _as_infos(_outcome(ckpt.table)) == want
    with tfckpt.open(prefix) as ckpt:
        old = _outcome(lambda: json.dumps(_old_dump(ckpt)))
    with tfckpt.open(prefix) as ckpt:
        assert _outcome(lambda: dump_json(ckpt)) == old
    with tfckpt.open(prefix) as ckpt:
        assert _outcome(lambda: json.dumps(dump(ckpt))) == old


@pytest.mark.parametrize("what", [*DAMAGES, *RAW_DAMAGES])
def test_damaged_entry_same_error_as_info(plain_checkpoint, tmp_path, what):
    if what in DAMAGES:
        name, damage = DAMAGES[what]

        def change(raw):
            p = parse_entry(raw)
            damage(p)
            return p.SerializeToString()

    else:
        name, change = RAW_DAMAGES[what]
    prefix = _damaged_copy(plain_checkpoint, tmp_path / "c", name, change)
    broken = what not in UNUSUAL
    with tfckpt.open(prefix) as ckpt:
        outcome = _outcome(lambda: ckpt.info(name))
    if broken:
        assert isinstance(outcome, tuple) and issubclass(outcome[0], tfckpt.CheckpointError)
        assert name in outcome[1] and prefix in outcome[1], outcome
    else:
        assert not isinstance(outcome, tuple), outcome
    _assert_same_errors(prefix, [name])
    proc = run("dump", prefix, "--json")
    if broken:
        assert proc.returncode == 2 and proc.stdout == b""
        assert proc.stderr.decode() == f"tfckpt: error: {outcome[1]}\n"
    else:
        assert proc.returncode == 0


@pytest.mark.parametrize(
    "bad",
    [["missing"], [5], [b"plain"], [None], [""], ["plain", "missing"], ["plain", 1.5]],
)
def test_bad_names_same_error_as_info(odd_checkpoint, bad):
    _assert_same_errors(odd_checkpoint, bad)
    with tfckpt.open(odd_checkpoint) as ckpt:
        assert isinstance(_outcome(lambda: ckpt.table(bad)), tuple)


def test_slice_keys_are_no_names(tf_checkpoints):
    prefix = tf_checkpoints("savev2_slices").prefix
    with tfckpt.open(prefix) as ckpt:
        slice_names = sorted(decode_name(k) for k in ckpt._slice_keys)
    assert slice_names
    for name in slice_names[:3]:
        _assert_same_errors(prefix, [name])


@pytest.mark.parametrize("name", ["tf1_partitioned", "all_dtypes", "tf1_sharded"])
def test_dump_json_in_parts_of_a_few_records(tf_checkpoints, monkeypatch, name):
    """The records come some thousands at a time: cut after every two (whole and
    partitioned tensors in one part or apart), the text is still json.dumps(dump(...))."""
    module = importlib.import_module("tfckpt.inspection.dump")
    monkeypatch.setattr(module, "_RECORDS_AT_ONCE", 2)
    with tfckpt.open(tf_checkpoints(name).prefix) as ckpt:
        assert len(ckpt.keys()) >= 4
        parts = list(module.dump_json_parts(ckpt))
        blocks = (len(ckpt.keys()) + 1) // 2  # a part every two records, ", " between
        assert len(parts) == 4 + 2 * blocks - 1
        assert "".join(parts) == json.dumps(dump(ckpt))
