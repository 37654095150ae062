"""The index entries of a checkpoint being written, kept as columns and encoded in bulk.

A writer enters one entry per tensor, and keeps them all until the index is written: as
``BundleEntryProto`` messages that is about 480 bytes a tensor. :class:`EntryRows` keeps
a whole tensor's entry as one row of arrays instead (dtype, an id into the distinct
shapes, shard, offset, size, checksum: 30 bytes) beside its key (in one byte buffer),
and only partitioned tensors' own entries, which list their slices and are few, as
messages. :meth:`EntryRows.table` encodes every row at once into the bytes
``SerializeToString`` gives (fields in number order, zero values left out) and lays them
into the index table with :func:`~tfckpt.format.bulktable.table_bytes`.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto
from tfckpt.format.bulktable import copy_ranges, put_u32, put_varints, table_bytes, varint_lengths
from tfckpt.format.orderedcode import decode_name
from tfckpt.format.table import BLOCK_SIZE, mask_crc

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
    value &= _U64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


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


class _Keys(Sequence[bytes]):
    """The keys of the rows, read from their joined bytes (for bisection)."""

    def __init__(self, rows: EntryRows):
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows._ends)

    def __getitem__(self, i):  # ints only
        ends = self._rows._ends
        return bytes(self._rows._keys[ends[i - 1] if i else 0 : ends[i]])


class EntryRows(Mapping[bytes, BundleEntryProto]):
    """The index entries being built: whole tensors' as rows of columns, the others
    (partitioned tensors' own entries, or any given as a message) as messages.

    As a mapping, a key's entry is built as a message when asked for. It pickles as
    its columns' bytes.

    >>> rows = EntryRows(); rows.add(b"w", 1, (2, 3), 0, 0, 24, crc)
    >>> rows.table({b"": header})  # the index table's bytes
    """

    def __init__(self) -> None:
        self._keys = bytearray()  # every row's key, joined
        self._ends = array("Q")  # where each row's key ends in _keys
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
        elif self._ends and key <= self._last:
            self._keyset = set(_Keys(self))
            self._keyset.add(key)
        self._last = key
        self._keys += key
        self._ends.append(len(self._keys))
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
        return len(self._ends) + len(self.protos)

    def __contains__(self, key) -> bool:
        return key in self.protos or self._in_rows(key)

    def _in_rows(self, key: bytes) -> bool:
        if self._keyset is not None:
            return key in self._keyset
        if not self._ends or key > self._last:
            return False
        keys = _Keys(self)
        i = bisect.bisect_left(keys, key)
        return i < len(keys) and keys[i] == key

    def __iter__(self) -> Iterator[bytes]:
        yield from _Keys(self)
        yield from self.protos

    def _row(self, key: bytes) -> int:
        keys = _Keys(self)
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
        self._keyset = set(_Keys(self)) if state["_keyset"] else None

    # -- merging and encoding

    def extend(self, other: EntryRows, shard: int | None = None) -> None:
        """Append ``other``'s rows (their shard set to ``shard``, unless None)."""
        if not other._ends:
            return
        remap = np.array([self._shape_id(s) for s in other.shapes], dtype=np.uint32)
        in_order = other._keyset is None and (
            not self._ends or bytes(other._keys[: other._ends[0]]) > self._last
        )
        if self._keyset is None and not in_order:
            self._keyset = set(_Keys(self))
        if self._keyset is not None:
            self._keyset.update(_Keys(other))
        base = len(self._keys)
        self._keys += other._keys
        self._ends.extend(array("Q", (np.frombuffer(other._ends, np.uint64) + base).tobytes()))
        self._last = other._last
        self.dtype.extend(other.dtype)
        ids = remap[np.frombuffer(other.shape_id, np.uint32)]
        self.shape_id.extend(array("I", ids.tobytes()))
        n = len(other._ends)
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
        if len(self._keyset) != len(self._ends):
            seen: set[bytes] = set()
            return next(k for k in _Keys(self) if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        return next((k for k in self.protos if k in self._keyset), None)

    def _fields(self, rows: np.ndarray | None) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """The varint fields after the shape of ``rows`` (all rows in order: None): tag,
        values and each field's length (0 when left out, as a zero is)."""
        out = []
        for tag, column, kind in (
            (_TAG_SHARD, self.shard, np.uint32),
            (_TAG_OFFSET, self.offset, np.uint64),
            (_TAG_SIZE, self.size, np.uint64),
        ):
            v = np.frombuffer(column, kind)
            v = (v if rows is None else v[rows]).astype(np.uint64)
            out.append((tag, v, np.where(v != 0, 1 + varint_lengths(v), 0)))
        return out

    def _encoder(self, rows: np.ndarray | None):
        """The length of each of ``rows``' serialized entries (all rows in order: None),
        and what writes them: ``write(out, at)`` puts row i's at ``out[at[i]:]``."""

        def column(a: array, kind) -> np.ndarray:
            c = np.frombuffer(a, kind)
            return c if rows is None else c[rows]

        dtype = column(self.dtype, np.uint16).astype(np.uint64)
        dtype_len = np.where(dtype != 0, 1 + varint_lengths(dtype), 0)
        fields = [shape_field(s) for s in self.shapes]
        flen = np.fromiter(map(len, fields), dtype=np.int64, count=len(fields))
        fstart = np.cumsum(flen) - flen
        sid = column(self.shape_id, np.uint32)
        shape_len = flen[sid]
        varints = self._fields(rows)
        crc = _mask_crcs(column(self.crc, np.uint32))
        crc_len = np.where(crc != 0, 5, 0)
        lengths = dtype_len + shape_len + crc_len
        for _, _, n in varints:
            lengths += n

        def write(out: np.ndarray, at: np.ndarray) -> None:
            _put_field(out, at, _TAG_DTYPE, dtype, dtype_len)
            pos = at + dtype_len
            if len(flen) <= _FEW_SHAPES:  # each shape's bytes put byte by byte where it goes
                for shape, field in enumerate(fields):
                    at_shape = pos if len(fields) == 1 else pos[sid == shape]
                    for j, byte in enumerate(field):
                        out[at_shape + j] = byte
            else:
                fbuf = np.frombuffer(b"".join(fields), np.uint8)
                copy_ranges(out, pos, fbuf, fstart[sid], shape_len)
            pos += shape_len
            for tag, v, n in varints:
                _put_field(out, pos, tag, v, n)
                pos += n
            has = crc_len != 0
            out[pos[has]] = _TAG_CRC
            put_u32(out, pos[has] + 1, crc[has])

        return lengths, write

    def table(self, extra: Mapping[bytes, bytes], *, block_size: int = BLOCK_SIZE) -> bytes:
        """The index table of every entry, with ``extra`` entries given as bytes (the
        header): the bytes :class:`~tfckpt.format.table.TableBuilder` writes for them."""
        raw = {k: p.SerializeToString() for k, p in self.protos.items()}
        raw.update(extra)
        extra_keys = sorted(raw)
        raw_values = [raw[k] for k in extra_keys]
        n = len(self._ends)
        order, keys = self._order(extra_keys)  # index >= n: an extra entry
        klen = np.diff(np.frombuffer(self._ends, np.uint64).astype(np.int64), prepend=0)
        klen = np.concatenate([klen, np.fromiter(map(len, extra_keys), np.int64, len(raw))])
        koff = np.concatenate([[0], np.cumsum(klen[order])])
        is_row = order < n
        # Rows in order (they nearly always are) are read from the columns as they are.
        row_lengths, write_rows = self._encoder(None if self._keyset is None else order[is_row])
        vlen = np.empty(len(order), np.int64)
        vlen[is_row] = row_lengths
        vlen[~is_row] = [len(raw_values[i]) for i in (order[~is_row] - n).tolist()]

        def write_values(out: np.ndarray, at: np.ndarray) -> None:
            write_rows(out, at[is_row])
            for a, i in zip(at[~is_row].tolist(), (order[~is_row] - n).tolist()):
                out[a : a + len(raw_values[i])] = np.frombuffer(raw_values[i], np.uint8)

        return table_bytes(keys, koff, vlen, write_values, block_size=block_size)

    def _order(self, extra_keys: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """The rows and ``extra_keys`` (sorted; numbered from the row count on) in key
        order, and their keys so ordered, joined."""
        n = len(self._ends)
        if self._keyset is not None:
            keys = [*_Keys(self), *extra_keys]
            order = sorted(range(len(keys)), key=keys.__getitem__)
            joined = b"".join([keys[i] for i in order])
            return np.array(order, dtype=np.int64), np.frombuffer(joined, np.uint8)
        # Rows in order already: the extras are put in their places among them.
        rows = _Keys(self)
        places = [bisect.bisect_left(rows, k) for k in extra_keys]
        view, done = memoryview(self._keys), 0
        pieces: list[bytes | memoryview] = []
        for place, key in zip(places, extra_keys):
            at = self._ends[place - 1] if place else 0
            pieces += [view[done:at], key]
            done = at
        pieces.append(view[done:])
        joined = b"".join(pieces)
        del view, pieces  # the buffer may grow again once no view of it is left
        merged = np.insert(np.arange(n), places, np.arange(n, n + len(extra_keys)))
        return merged, np.frombuffer(joined, np.uint8)


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
