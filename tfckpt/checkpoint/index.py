"""The index side of reading a V2 bundle: :class:`BundleIndex`, what the ``.index`` file says.

A :class:`~tfckpt.checkpoint.reader.Checkpoint` holds one. It keeps the index table's
keys and values as read, the header, the tensor names in TensorFlow's order and which
keys are the slices of partitioned tensors. An entry is parsed on first use, checked
(dtype, shape, where its bytes lie, its slices against its shape) and cached as an
:class:`Entry`; :class:`~tfckpt.format.bundle.TensorInfo` and
:class:`~tfckpt.format.bundle.TensorTable` are built from entries, most of them
decoded in bulk. No data shard is opened here: that is
:mod:`tfckpt.checkpoint.shards`.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto
from tfckpt.errors import (
    CorruptCheckpointError,
    TensorNotFoundError,
    UnsupportedCheckpointError,
    did_you_mean,
)
from tfckpt.format import dtypes as _dt
from tfckpt.format import orderedcode
from tfckpt.format.bundle import (
    BULK_MAX_RANK,
    HEADER_KEY,
    EntryColumns,
    Ints,
    TensorInfo,
    TensorTable,
    check_entry_location,
    decode_entries,
    decode_header,
    entry_shape,
    parse_entry,
    slice_from_proto,
)
from tfckpt.format.slices import (
    MAX_HOLES,
    Slice,
    check_slice_cover,
    coverage,
    describe_holes,
    extents_fit,
    format_slice,
    num_elements,
    parse_slice_key,
    slice_shape,
)
from tfckpt.format.table import TableReader, unmask_crc, unmask_crcs

_decode_name = orderedcode.decode_name
_encode_name = orderedcode.encode_name


class Location:
    """Where an entry's bytes are: the fields of its BundleEntryProto that reading uses.

    Kept instead of the parsed message, which costs far more memory per entry.
    """

    __slots__ = ("shard_id", "offset", "size", "crc32c")

    def __init__(self, proto: BundleEntryProto):
        self.shard_id = proto.shard_id
        self.offset = proto.offset
        self.size = proto.size
        self.crc32c = proto.crc32c

    @classmethod
    def at(cls, shard_id: int, offset: int, size: int, crc32c: int) -> Location:
        """The same from the fields' values (``crc32c`` masked, as stored)."""
        stored = cls.__new__(cls)
        stored.shard_id, stored.offset, stored.size, stored.crc32c = shard_id, offset, size, crc32c
        return stored


class BulkEntries(NamedTuple):
    """Entries decoded together (see ``BundleIndex._bulk``)."""

    cols: EntryColumns
    fast: np.ndarray  # bool: rows that passed every check of a whole tensor's entry
    enum: np.ndarray  # DataType numbers, 0 where unknown
    elements: np.ndarray
    shapes: list[tuple[int, ...]]  # () for rows not fast


class Entry:
    """A parsed index entry plus what tfckpt derived and checked from it.

    ``proto`` is the entry's :class:`Location` (named for the message it stands for).
    """

    __slots__ = ("key", "name", "proto", "dtype", "shape", "slices")

    def __init__(
        self,
        key: bytes,
        name: str,
        proto: Location,
        dtype: _dt.DType,
        shape: tuple[int, ...],
        slices: tuple[Slice, ...],
    ):
        self.key = key
        self.name = name
        self.proto = proto
        self.dtype = dtype
        self.shape = shape
        self.slices = slices


class BundleIndex:
    """The index of a bundle: header, names and entries, parsed and checked on demand.

    ``data`` is the whole ``.index`` file at ``index_path``; ``prefix`` names the
    checkpoint in errors about tensors it does not hold.
    """

    def __init__(self, data: bytes, index_path: str, prefix: str):
        self.index_path = index_path
        self.prefix = prefix
        self._parsed: dict[bytes, Entry] = {}
        table = TableReader(data, self.index_path)
        keys, values = table.keys, table.values  # sorted, each once (the table checks)
        # The header's empty key sorts first, then every key that starts with a NUL
        # byte (slice keys among them), then the other tensor names.
        first = 1 if keys and keys[0] == HEADER_KEY else 0
        self.header = decode_header(values[0] if first else None, self.index_path)
        keys, values = keys[first:], values[first:]
        del table
        self._table_columns = keys, values  # every entry but the header's
        self.slice_keys = self._listed_slice_keys(keys[: bisect_left(keys, b"\x01")])
        if self.slice_keys:
            listed = self.slice_keys
            rows = [i for i, k in enumerate(keys) if k not in listed]
            self._keys, self._values = keys.take(rows).frozen(), values.take(rows).frozen()
        else:
            self._keys, self._values = keys, values
        self.names = orderedcode.decode_names(self._keys)

    def raw(self, key: bytes) -> bytes | None:
        """The entry of ``key`` as stored (None for the header's or one not there):
        found by bisection in the table's sorted keys (a dict of them would cost 50
        bytes a tensor more)."""
        keys, values = self._table_columns
        i = bisect_left(keys, key)
        return values[i] if i < len(keys) and keys[i] == key else None

    def _listed_slice_keys(self, candidates: Sequence[bytes]) -> set[bytes]:
        """The keys of the slices that their tensors' entries list.

        Those are the only keys TensorFlow leaves out when it lists a checkpoint:
        any other key, even one that starts with a NUL byte as every slice key
        does, is a tensor name.
        """
        listed: dict[bytes, set] = {}  # full tensor key -> the extents its entry lists
        out = set()
        for key in candidates:
            decoded = parse_slice_key(key) if key[:1] == b"\0" else None
            if decoded is None:
                continue
            full = _encode_name(decoded[0])
            if full == HEADER_KEY:
                continue
            extents = listed.get(full)
            if extents is None:
                try:
                    proto = parse_entry(self.raw(full) or b"")
                except DecodeError:  # reported when that entry is read
                    proto = BundleEntryProto()
                extents = listed[full] = {slice_from_proto(x) for x in proto.slices}
            if decoded[1] in extents:
                out.add(key)
        return out

    def contains(self, name) -> bool:
        """Whether ``name`` is a tensor of the checkpoint (a slice's key is not)."""
        if not isinstance(name, str):
            return False
        # Listed names sort as their keys do (nearly always: see _listed_rows), and a
        # bisection of them is quicker than one of the packed keys.
        if self._listed_rows([name]) is not None:
            return True
        key = _encode_name(name)
        return bool(key) and key not in self.slice_keys and self.raw(key) is not None

    # -- entries

    def _corrupt(self, what: str, tensor: str | None):
        return CorruptCheckpointError(what, path=self.index_path, tensor=tensor)

    def _entry(self, key: bytes, name: str | None = None) -> Entry:
        cached = self._parsed.get(key)
        if cached is not None:
            return cached
        name = name if name is not None else _decode_name(key)
        raw = self.raw(key)
        if raw is None or key == HEADER_KEY:
            raise TensorNotFoundError(
                "no such tensor in the checkpoint" + did_you_mean(name, self.names),
                path=self.prefix,
                tensor=name,
            )
        try:
            proto = parse_entry(raw)
        except DecodeError:
            raise self._corrupt("index entry is not a BundleEntryProto", name) from None
        dtype = _dt.from_enum(proto.dtype, path=self.index_path, tensor=name)
        stored = Location(proto)
        try:
            shape = entry_shape(proto)
            listed = proto.slices
            if listed:
                slices = tuple(slice_from_proto(s) for s in listed)
                for extents in slices:
                    self._check_slice(extents, shape)
            else:
                slices = ()
                check_entry_location(stored, dtype, shape, self.header.num_shards)
        except ValueError as e:
            raise self._corrupt(str(e), name) from None
        entry = Entry(key, name, stored, dtype, shape, slices)
        self._parsed[key] = entry
        return entry

    @staticmethod
    def _check_slice(extents: Slice, shape: tuple[int, ...]) -> None:
        if len(extents) != len(shape):
            raise ValueError(f"slice of rank {len(extents)} for a tensor of rank {len(shape)}")
        if not extents_fit(extents, shape):
            raise ValueError(f"slice {format_slice(extents)} lies outside shape {list(shape)}")

    def full_entry(self, name: str) -> Entry:
        """The entry of tensor ``name``, checked; an error when it holds no such tensor."""
        if not isinstance(name, str):
            raise TypeError(f"tensor names are str, not {type(name).__name__}")
        key = _encode_name(name)
        if key in self.slice_keys or key == HEADER_KEY:
            raise TensorNotFoundError(
                "no such tensor in the checkpoint" + did_you_mean(name, self.names),
                path=self.prefix,
                tensor=name,
            )
        return self._entry(key, name)

    def slice_entry(self, full: Entry, extents: Slice) -> Entry:
        """The entry of one slice that partitioned tensor ``full`` lists, checked against it."""
        key = orderedcode.encode_slice_key(full.name, extents)
        if self.raw(key) is None:
            raise self._corrupt(
                f"slice {format_slice(extents)} is listed but has no entry of its own", full.name
            )
        entry = self._entry(key, f"{full.name}[{format_slice(extents)}]")
        if entry.slices:
            raise self._corrupt("a slice entry has slices of its own", entry.name)
        if entry.dtype is not full.dtype:
            raise self._corrupt(
                f"slice has dtype {entry.dtype.name}, tensor has {full.dtype.name}", entry.name
            )
        if entry.shape != slice_shape(full.shape, extents):
            raise self._corrupt(
                f"slice shape {list(entry.shape)} does not match its extents "
                f"{format_slice(extents)}",
                entry.name,
            )
        return entry

    def stored_entry(self, name: str, extents: Slice | None) -> Entry:
        """The entry holding bytes: the tensor's own, or with ``extents`` one of its slices."""
        entry = self.full_entry(name)
        if extents is not None:
            return self.slice_entry(entry, tuple(extents))
        if entry.slices:
            raise UnsupportedCheckpointError(
                "partitioned tensor has no bytes of its own; read its slices",
                path=self.prefix,
                tensor=name,
            )
        return entry

    def full_entries(self, names: Sequence[str], *, keep: bool = True) -> list[Entry]:
        """``full_entry`` of each name; those not parsed yet are decoded together.

        ``keep=False``: the entries decoded here are not kept for later lookups (a
        stream of batches, each read once, would otherwise hold an entry per tensor).
        """
        keys = [_encode_name(n) if isinstance(n, str) else b"" for n in names]
        parsed, slice_keys = self._parsed, self.slice_keys
        fresh: dict[bytes, Entry] = parsed if keep else {}
        todo = [i for i, k in enumerate(keys) if k not in parsed]
        if len(todo) > 1:
            rows = self._listed_rows([names[i] for i in todo])
            bulk = self._bulk([keys[i] for i in todo], rows)
            dtypes = _dt.bulk_dtypes()
            cols = bulk.cols
            for j, i, enum, shard, offset, size, crc in zip(
                np.flatnonzero(bulk.fast).tolist(),
                np.array(todo)[bulk.fast].tolist(),
                bulk.enum[bulk.fast].tolist(),
                cols.shard_id[bulk.fast].tolist(),
                cols.offset[bulk.fast].tolist(),
                cols.size[bulk.fast].tolist(),
                cols.crc32c[bulk.fast].tolist(),
            ):
                stored = Location.at(shard, offset, size, crc)
                key = keys[i]
                fresh[key] = Entry(key, names[i], stored, dtypes[enum], bulk.shapes[j], ())
        out = []
        for n, k in zip(names, keys):
            entry = None if k in slice_keys else parsed.get(k) or fresh.get(k)
            out.append(entry if entry is not None else self.full_entry(n))
        return out

    def _bulk(self, keys: Sequence[bytes], rows: list[int] | None = None) -> BulkEntries:
        """The entries of ``keys`` decoded together, and which pass, as whole tensors'
        entries, every check ``_entry`` makes (rows that fail any are for ``_entry``).
        ``rows``: where ``keys`` are among the listed tensors' (then they are theirs)."""
        listed = keys is self._keys or rows is not None
        raws: Sequence[bytes]
        if keys is self._keys:
            raws = self._values
        elif rows is not None:
            raws = self._values.take(rows)
        else:
            raws = [self.raw(k) or b"" for k in keys]
        cols = decode_entries(raws)
        itemsize, known = _dt.bulk_itemsizes()
        enum = np.where(cols.dtype < len(known), cols.dtype, 0)
        fast = cols.ok & known[enum] & (cols.shard_id < self.header.num_shards)
        in_rank = np.arange(BULK_MAX_RANK) < cols.rank[:, None]
        # Element counts exactly in int64 wherever their float estimate is far from
        # overflowing; other rows take the path of _entry.
        dims = np.where(in_rank, cols.dims, 1)
        fast &= np.prod(dims, axis=1, dtype=np.float64) < 2.0**62
        elements = np.prod(dims, axis=1, dtype=np.int64)
        fixed = itemsize[enum]
        fast &= (fixed == 0) | (cols.size == elements * fixed)
        if not listed:  # names given: only those of whole tensors listed
            slice_keys, raw = self.slice_keys, self.raw
            fast &= np.fromiter(
                (bool(k) and k not in slice_keys and raw(k) is not None for k in keys),
                bool,
                len(keys),
            )
        shapes = np.empty(len(keys), dtype=object)
        shapes.fill(())
        for r in range(1, BULK_MAX_RANK + 1):
            ranked = np.flatnonzero(fast & (cols.rank == r))
            if len(ranked):
                # One tuple per distinct shape, shared by the rows that have it.
                dims = np.ascontiguousarray(cols.dims[ranked, :r])
                distinct, which = np.unique(
                    dims.view(np.dtype((np.void, 8 * r))).ravel(), return_inverse=True
                )
                tuples = np.fromiter(
                    map(tuple, distinct.view(np.int64).reshape(-1, r).tolist()),
                    dtype=object,
                    count=len(distinct),
                )
                shapes[ranked] = tuples[which]
        return BulkEntries(cols, fast, enum, elements, shapes.tolist())

    def _listed_rows(self, names: Sequence[str]) -> list[int] | None:
        """Where ``names`` are in :attr:`names` (listed in key order, which for names is
        the order of their code points), when every one is there; else None."""
        listed, n = self.names, len(self.names)
        rows = [bisect_left(listed, name) if isinstance(name, str) else n for name in names]
        if all(r < n and listed[r] == name for r, name in zip(rows, names)):
            return rows
        return None

    # -- partitioned tensors' slices

    def check_disjoint(self, entry: Entry) -> None:
        """Refuse a partitioned tensor whose slices overlap."""
        if entry.slices:
            check_slice_cover(
                entry.slices, entry.shape, lambda what: self._corrupt(what, entry.name)
            )

    def check_whole(self, entry: Entry) -> None:
        """Before the whole of a partitioned tensor is read: its slices tile it exactly."""
        self.check_disjoint(entry)
        stored, holes = coverage(entry.slices, entry.shape)
        total = num_elements(entry.shape)
        if stored != total:
            raise UnsupportedCheckpointError(
                f"only {stored} of its {total} elements are stored (slices "
                f"{' '.join(format_slice(s) for s in entry.slices[:MAX_HOLES])}"
                f"{' ...' if len(entry.slices) > MAX_HOLES else ''}); "
                f"{describe_holes(holes, total - stored)}: read the stored slices with "
                "read_slice()",
                path=self.prefix,
                tensor=entry.name,
            )

    def orphan_slice_keys(self) -> list[bytes]:
        """See :meth:`tfckpt.checkpoint.reader.Checkpoint.orphan_slice_keys`."""
        out = []
        for key in self._table_columns[0]:
            if key[:1] != b"\0" or key in self.slice_keys:
                continue
            decoded = parse_slice_key(key)
            if decoded is None:
                continue
            if self._partitioned_entry(_encode_name(decoded[0])):
                out.append(key)
        return out

    def _partitioned_entry(self, key: bytes) -> bool:
        try:
            return key != HEADER_KEY and bool(parse_entry(self.raw(key) or b"").slices)
        except DecodeError:
            return False

    # -- what the index says, as TensorInfo

    def info(self, entry: Entry) -> TensorInfo:
        """Dtype, shape, size and location of a tensor's (or a slice's) entry."""
        p = entry.proto
        if entry.slices:
            nbytes = sum(self.slice_entry(entry, s).proto.size for s in entry.slices)
            return TensorInfo(
                entry.name,
                entry.dtype.name,
                entry.shape,
                nbytes,
                None,
                None,
                None,
                entry.slices,
                stored_elements=coverage(entry.slices, entry.shape)[0],
            )
        return TensorInfo.whole(
            entry.name,
            entry.dtype.name,
            entry.shape,
            p.size,
            p.shard_id,
            p.offset,
            unmask_crc(p.crc32c),
        )

    def slice_info(self, name: str) -> list[TensorInfo]:
        """See :meth:`tfckpt.checkpoint.reader.Checkpoint.slice_info`."""
        entry = self.full_entry(name)
        self.check_disjoint(entry)
        return [
            dataclasses.replace(self.info(self.slice_entry(entry, s)), extents=s)
            for s in entry.slices
        ]

    def table(self, names: Sequence[str] | None = None) -> TensorTable:
        """See :meth:`tfckpt.checkpoint.reader.Checkpoint.table`."""
        rows = None
        keys: Sequence[bytes]
        if names is None:
            names, keys = self.names, self._keys
        else:
            names = list(names)
            # Listed tensors (a plan of a whole checkpoint): read where they are
            # listed, without the index's dict of keys.
            rows = None if names == self.names else self._listed_rows(names)
            if names == self.names or rows == list(range(len(self._keys))):
                names, keys, rows = self.names, self._keys, None
            elif rows is not None:
                keys = self._keys.take(rows)
            else:
                keys = [_encode_name(n) if isinstance(n, str) else b"" for n in names]
        bulk = self._bulk(keys, rows)
        cols = bulk.cols
        elements = Ints.of_array(bulk.elements)
        out = TensorTable(
            list(names),
            np.array(_dt.bulk_names(), dtype=object)[bulk.enum].tolist(),
            bulk.shapes,
            Ints.of_array(cols.size),
            Ints.of_array(cols.shard_id),
            Ints.of_array(cols.offset),
            Ints.of_array(unmask_crcs(cols.crc32c)),
            [()] * len(names),
            elements,
            elements,  # the same column: stored elements differ only for slices (see set)
        )
        for i in np.flatnonzero(~bulk.fast).tolist():
            out.set(i, self.info(self.full_entry(names[i])))
        return out
