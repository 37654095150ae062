"""The index entries of a checkpoint being written, kept as columns and encoded in bulk.

A writer enters one entry per tensor, and keeps them all until the index is written: as
``BundleEntryProto`` messages that is about 480 bytes a tensor. :class:`EntryRows` keeps
a whole tensor's entry as one row of arrays instead (dtype, an id into the distinct
shapes, shard, offset, size, checksum: 30 bytes) beside its key (in one byte buffer),
and only partitioned tensors' own entries, which list their slices and are few, as
messages. :meth:`EntryRows.table` encodes rows in bulk, some thousands at a time, into
the bytes ``SerializeToString`` gives (fields in number order, zero values left out) and
lays them into the index table with :func:`~tfckpt.format.bulktable.table_in_pieces`.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto
from tfckpt.format.bulktable import (
    PIECE_ENTRIES,
    Piece,
    copy_ranges,
    put_u32,
    put_varints,
    table_in_pieces,
    varint_lengths,
)
from tfckpt.format.orderedcode import decode_name
from tfckpt.format.packed import PackedBytes
from tfckpt.format.table import BLOCK_SIZE, encode_varint, mask_crc

# BundleEntryProto's fields as (number << 3 | wire type); TensorShapeProto.dim and Dim.size
_TAG_DTYPE, _TAG_SHAPE, _TAG_SHARD, _TAG_OFFSET, _TAG_SIZE, _TAG_CRC = (
    0x08,
    0x12,
    0x18,
    0x20,
    0x28,
    0x35,
)
_TAG_DIM, _TAG_DIM_SIZE = 0x12, 0x08
_U64 = (1 << 64) - 1  # a negative int64 is encoded as its two's complement
_MASK_DELTA = 0xA282EAD8
_FEW_SHAPES = 8  # fewer distinct shapes than this are written shape by shape


def _varint(value: int) -> bytes:
    """A protobuf varint: a negative int64 as its two's complement, as protobuf does."""
    return encode_varint(value & _U64)


def shape_field(shape: Sequence[int]) -> bytes:
    """An entry's ``shape`` field (present even for a scalar's), as protobuf encodes it."""
    dims = b"".join(
        bytes((_TAG_DIM,)) + _varint(len(d)) + d
        for d in (bytes((_TAG_DIM_SIZE,)) + _varint(s) if s else b"" for s in shape)
    )
    return bytes((_TAG_SHAPE,)) + _varint(len(dims)) + dims


def _mask_crcs(crc: np.ndarray) -> np.ndarray:
    c = crc.astype(np.uint32, copy=False)
    return ((c >> np.uint32(15)) | (c << np.uint32(17))) + np.uint32(_MASK_DELTA)


class EntryRows(Mapping[bytes, BundleEntryProto]):
    """The index entries being built: whole tensors' as rows of columns, the others
    (partitioned tensors' own entries, or any given as a message) as messages.

    As a mapping, a key's entry is built as a message when asked for. It pickles as
    its columns' bytes.

    >>> rows = EntryRows(); rows.add(b"w", 1, (2, 3), 0, 0, 24, crc)
    >>> rows.table({b"": header})  # the index table's bytes
    """

    def __init__(self) -> None:
        self._keys = PackedBytes()  # every row's key
        self.dtype = array("H")  # DataType numbers
        self.shape_id = array("I")  # into shapes
        self.shard = array("I")
        self.offset = array("Q")
        self.size = array("Q")
        self.crc = array("I")  # unmasked
        self.shapes: list[tuple[int, ...]] = []
        self._shape_ids: dict[tuple[int, ...], int] = {}
        self.protos: dict[bytes, BundleEntryProto] = {}
        # Rows come in key order nearly always: then a new key is told from the known
        # ones by comparing it with the last. The set is made once one comes out of order.
        self._last = b""
        self._keyset: set[bytes] | None = None
        self._lookup: dict[bytes, int] | None = None  # row by key, of rows out of order

    # -- adding

    def add(
        self,
        key: bytes,
        dtype: int,
        shape: tuple[int, ...],
        shard: int,
        offset: int,
        size: int,
        crc: int,
    ) -> None:
        """Enter a whole tensor's entry (``crc`` unmasked); the caller checked ``key`` is new."""
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_id(shape)
        if self._keyset is not None:
            self._keyset.add(key)
        elif self._keys.ends and key <= self._last:
            self._keyset = set(self._keys)
            self._keyset.add(key)
        self._last = key
        self._keys.append(key)
        self.dtype.append(dtype)
        self.shape_id.append(sid)
        self.shard.append(shard)
        self.offset.append(offset)
        self.size.append(size)
        self.crc.append(crc)

    @classmethod
    def of(cls, entries: Mapping[bytes, BundleEntryProto]) -> EntryRows:
        """Entries given as messages (kept as such), as rows; rows as they are."""
        if isinstance(entries, EntryRows):
            return entries
        rows = cls()
        rows.protos = dict(entries)
        return rows

    # -- the mapping

    def __len__(self) -> int:
        return len(self._keys.ends) + len(self.protos)

    def __contains__(self, key) -> bool:
        return key in self.protos or self._in_rows(key)

    def _in_rows(self, key: bytes) -> bool:
        if self._keyset is not None:
            return key in self._keyset
        if not self._keys.ends or key > self._last:
            return False
        keys = self._keys
        i = bisect.bisect_left(keys, key)
        return i < len(keys) and keys[i] == key

    def __iter__(self) -> Iterator[bytes]:
        yield from self._keys
        yield from self.protos

    def _row(self, key: bytes) -> int:
        keys = self._keys
        if self._keyset is None:
            i = bisect.bisect_left(keys, key)
            if i < len(keys) and keys[i] == key:
                return i
        elif key in self._keyset:
            if self._lookup is None or len(self._lookup) != len(keys):  # made when asked
                self._lookup = {k: i for i, k in enumerate(keys)}
            return self._lookup[key]
        raise KeyError(key)

    def __getitem__(self, key: bytes) -> BundleEntryProto:
        proto = self.protos.get(key)
        if proto is not None:
            return proto
        i = self._row(key)
        e = BundleEntryProto()
        e.dtype = self.dtype[i]  # type: ignore[assignment]  # a DataType number
        e.shape.SetInParent()
        for d in self.shapes[self.shape_id[i]]:
            e.shape.dim.add().size = d
        e.shard_id, e.offset, e.size = self.shard[i], self.offset[i], self.size[i]
        e.crc32c = mask_crc(self.crc[i])
        return e

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_shape_ids"]  # the index of shapes, and the set of keys, are made again
        state["_lookup"] = None
        state["_keyset"] = self._keyset is not None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._shape_ids = {s: i for i, s in enumerate(self.shapes)}
        self._keyset = set(self._keys) if state["_keyset"] else None

    # -- merging and encoding

    def extend(self, other: EntryRows, shard: int | None = None) -> None:
        """Append ``other``'s rows (their shard set to ``shard``, unless None)."""
        if not other._keys.ends:
            return
        remap = np.array([self._shape_id(s) for s in other.shapes], dtype=np.uint32)
        in_order = other._keyset is None and (not self._keys.ends or other._keys[0] > self._last)
        if self._keyset is None and not in_order:
            self._keyset = set(self._keys)
        if self._keyset is not None:
            self._keyset.update(other._keys)
        self._keys.extend(other._keys)
        self._last = other._last
        self.dtype.extend(other.dtype)
        ids = remap[np.frombuffer(other.shape_id, np.uint32)]
        self.shape_id.extend(array("I", ids.tobytes()))
        n = len(other._keys.ends)
        self.shard.extend(other.shard if shard is None else array("I", [shard]) * n)
        self.offset.extend(other.offset)
        self.size.extend(other.size)
        self.crc.extend(other.crc)

    def _shape_id(self, shape: tuple[int, ...]) -> int:
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = len(self.shapes)
            self.shapes.append(tuple(map(int, shape)))  # numpy's ints too, as Python's
        return sid

    def duplicate(self) -> bytes | None:
        """A key that two rows have, or a row and a message; None when all differ."""
        if self._keyset is None:  # rows in order: each key differs from the one before
            return next((k for k in self.protos if self._in_rows(k)), None)
        if len(self._keyset) != len(self._keys.ends):
            seen: set[bytes] = set()
            return next(k for k in self._keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        return next((k for k in self.protos if k in self._keyset), None)

    def _fields(self, rows: slice | np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """The varint fields after the shape of ``rows``: tag, values and each field's
        length (0 when left out, as a zero is)."""
        out = []
        for tag, column, kind in (
            (_TAG_SHARD, self.shard, np.uint32),
            (_TAG_OFFSET, self.offset, np.uint64),
            (_TAG_SIZE, self.size, np.uint64),
        ):
            v = np.frombuffer(column, kind)[rows].astype(np.uint64)
            out.append((tag, v, np.where(v != 0, 1 + varint_lengths(v), 0)))
        return out

    def _encoder(self, rows: slice | np.ndarray, shapes: _ShapeFields):
        """The length of each of ``rows``' serialized entries, and what writes the first
        of them: ``write(out, at)`` puts the i-th's at ``out[at[i]:]``."""
        dtype = np.frombuffer(self.dtype, np.uint16)[rows].astype(np.uint64)
        dtype_len = np.where(dtype != 0, 1 + varint_lengths(dtype), 0)
        sid = np.frombuffer(self.shape_id, np.uint32)[rows]
        shape_len = shapes.lengths[sid]
        varints = self._fields(rows)
        crc = _mask_crcs(np.frombuffer(self.crc, np.uint32)[rows])
        crc_len = np.where(crc != 0, 5, 0)
        lengths = dtype_len + shape_len + crc_len
        for _, _, n in varints:
            lengths += n

        def write(out: np.ndarray, at: np.ndarray) -> None:
            m = len(at)
            _put_field(out, at, _TAG_DTYPE, dtype[:m], dtype_len[:m])
            pos = at + dtype_len[:m]
            shapes.put(out, pos, sid[:m], shape_len[:m])
            pos += shape_len[:m]
            for tag, v, n in varints:
                _put_field(out, pos, tag, v[:m], n[:m])
                pos += n[:m]
            has = crc_len[:m] != 0
            out[pos[has]] = _TAG_CRC
            put_u32(out, pos[has] + 1, crc[:m][has])

        return lengths, write

    def table(
        self,
        extra: Mapping[bytes, bytes],
        *,
        block_size: int = BLOCK_SIZE,
        piece_entries: int = PIECE_ENTRIES,
    ) -> bytes:
        """The index table of every entry, with ``extra`` entries given as bytes (the
        header): the bytes :class:`~tfckpt.format.table.TableBuilder` writes for them.

        Encoded a piece of entries at a time (see
        :func:`~tfckpt.format.bulktable.table_in_pieces`): the memory it takes beside
        the table's bytes does not grow with the entry count (but for the order of rows
        not added in key order, 8 bytes a row, and the sort that finds it).
        """
        raw = {k: p.SerializeToString() for k, p in self.protos.items()}
        raw.update(extra)
        extra_keys = sorted(raw)
        pieces = _Pieces(self, extra_keys, [raw[k] for k in extra_keys])
        return table_in_pieces(
            len(pieces), pieces.piece, block_size=block_size, piece_entries=piece_entries
        )

    def _sorted(self, extra_keys: list[bytes]) -> np.ndarray:
        """The rows and ``extra_keys`` (sorted; numbered from the row count on) in key
        order, when the rows were not added in key order."""
        keys = [*self._keys, *extra_keys]
        return np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)


class _ShapeFields:
    """Each distinct shape's ``shape`` field, and what puts them where rows' go."""

    def __init__(self, shapes: list[tuple[int, ...]]):
        self.fields = [shape_field(s) for s in shapes]
        self.lengths = np.fromiter(map(len, self.fields), dtype=np.int64, count=len(shapes))
        self.starts = np.cumsum(self.lengths) - self.lengths
        self.joined = np.frombuffer(b"".join(self.fields), np.uint8)

    def put(self, out: np.ndarray, at: np.ndarray, sid: np.ndarray, lengths: np.ndarray) -> None:
        """Write shape ``sid[i]``'s field at ``out[at[i]:]`` (``lengths``: theirs)."""
        if len(self.fields) <= _FEW_SHAPES:  # each shape's bytes put byte by byte where it goes
            for shape, field in enumerate(self.fields):
                at_shape = at if len(self.fields) == 1 else at[sid == shape]
                for j, byte in enumerate(field):
                    out[at_shape + j] = byte
        else:
            copy_ranges(out, at, self.joined, self.starts[sid], lengths)


class _Pieces:
    """An index's entries, the rows' and the ``extra`` ones (sorted keys and their
    values), in key order: piece by piece, as :func:`table_in_pieces` asks for them."""

    def __init__(self, rows: EntryRows, extra_keys: list[bytes], extra_values: list[bytes]):
        self.rows, self.n = rows, len(rows._keys.ends)
        self.extra_keys, self.extra_values = extra_keys, extra_values
        self.shapes = _ShapeFields(rows.shapes)
        self.ends = np.frombuffer(rows._keys.ends, np.int64)
        # Rows in key order (they nearly always are) are read from the columns as they
        # are, the extras in their places among them; else in the order sorted.
        self.order = None if rows._keyset is None else rows._sorted(extra_keys)
        places = [bisect.bisect_left(rows._keys, k) for k in extra_keys]
        self.extra_at = np.array(places, dtype=np.int64) + np.arange(len(places))

    def __len__(self) -> int:
        return self.n + len(self.extra_keys)

    def _indices(self, lo: int, hi: int) -> np.ndarray:
        """Entries lo to hi in key order, as row numbers (from the row count on: extras)."""
        if self.order is not None:
            return self.order[lo:hi]
        at = np.arange(lo, hi, dtype=np.int64)
        before = np.searchsorted(self.extra_at, at)  # extras before each
        extra = before < len(self.extra_at)
        extra[extra] = self.extra_at[before[extra]] == at[extra]
        return np.where(extra, self.n + before, at - before)

    def piece(self, lo: int, hi: int) -> Piece:
        """Entries lo to hi in key order: see :data:`~tfckpt.format.bulktable.Piece`."""
        order = self._indices(lo, hi)
        is_row = order < self.n
        rows: slice | np.ndarray = order[is_row]
        if self.order is None and is_row.any():  # rows in order: read as they lie
            first = int(order[is_row][0])
            rows = slice(first, first + int(is_row.sum()))
        row_lengths, write_rows = self.rows._encoder(rows, self.shapes)
        extras = (order[~is_row] - self.n).tolist()
        values = [self.extra_values[i] for i in extras]
        vlen = np.empty(len(order), np.int64)
        vlen[is_row] = row_lengths
        vlen[~is_row] = [len(v) for v in values]

        def write_values(out: np.ndarray, at: np.ndarray) -> None:
            mine = is_row[: len(at)]
            write_rows(out, at[mine])
            for a, value in zip(at[~mine].tolist(), values):
                out[a : a + len(value)] = np.frombuffer(value, np.uint8)

        keys, key_offsets = self._keys(order, is_row, extras)
        return keys, key_offsets, vlen, write_values

    def _keys(self, order: np.ndarray, is_row: np.ndarray, extras: list[int]):
        """The keys of entries ``order``, joined, and where each starts and the last ends."""
        ends = self.ends
        buf = np.frombuffer(self.rows._keys.data, np.uint8)
        if is_row.all() and self.order is None:  # rows in order: their keys as they lie
            first, last = int(order[0]), int(order[-1])
            start = int(ends[first - 1]) if first else 0
            offsets = np.concatenate([[start], ends[first : last + 1].astype(np.int64)]) - start
            return buf[start : int(ends[last])], offsets
        row = order[is_row]
        starts = np.where(row > 0, ends[np.maximum(row - 1, 0)].astype(np.int64), 0)
        lengths = np.empty(len(order), np.int64)
        lengths[is_row] = ends[row].astype(np.int64) - starts
        lengths[~is_row] = [len(self.extra_keys[i]) for i in extras]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        keys = np.empty(int(offsets[-1]), np.uint8)
        copy_ranges(keys, offsets[:-1][is_row], buf, starts, lengths[is_row])
        for at, i in zip(offsets[:-1][~is_row].tolist(), extras):
            keys[at : at + len(self.extra_keys[i])] = np.frombuffer(self.extra_keys[i], np.uint8)
        return keys, offsets


def _put_field(out: np.ndarray, at: np.ndarray, tag: int, values: np.ndarray, lengths) -> None:
    """Write a varint field (its tag, its value) at ``out[at[i]:]`` where ``lengths[i]``
    (the field's, tag included) is not 0."""
    has = lengths != 0
    if has.all():
        out[at] = tag
        put_varints(out, at + 1, values, lengths - 1)
    elif has.any():
        out[at[has]] = tag
        put_varints(out, at[has] + 1, values[has], lengths[has] - 1)


def merge_rows(shards: Sequence[Mapping[bytes, BundleEntryProto]]) -> EntryRows:
    """The index entries of shards written separately: shard ids set, slices joined.

    ``shards[k]`` are shard ``k``'s entries (:class:`EntryRows`, or messages by key).
    One shard's rows, already of shard 0 and with no message among them, are returned
    as they are (not copied).
    """
    if len(shards) == 1 and isinstance(shards[0], EntryRows) and not shards[0].protos:
        only = shards[0]
        if not np.frombuffer(only.shard, np.uint32).any():
            return only
    merged = EntryRows()
    for shard_id, entries in enumerate(shards):
        rows = EntryRows.of(entries)
        merged.extend(rows, shard_id)
        for key, entry in rows.protos.items():
            if entry.slices:  # a partitioned tensor's own entry: holds no bytes
                known = merged.protos.get(key)
                if known is None:
                    known = merged.protos[key] = BundleEntryProto()
                    known.CopyFrom(entry)
                    del known.slices[:]
                    # Holds no bytes, yet records the shard it was first written to, as
                    # TensorFlow's merge of bundles shifts every entry's shard id.
                    known.shard_id = shard_id
                elif not known.slices:
                    raise _twice(key)
                known.slices.extend(entry.slices)
                continue
            if key in merged.protos:
                raise _twice(key)
            entry.shard_id = shard_id
            merged.protos[key] = entry
    twice = merged.duplicate() if len(shards) > 1 else None
    if twice is not None:
        raise _twice(twice)
    return merged


def _twice(key: bytes) -> ValueError:
    return ValueError(f"tensor {decode_name(key)!r} written to two shards")
