"""Reading a checkpoint: :class:`Checkpoint`, a read-only mapping of tensor names to arrays.

It owns what reading needs beyond the format's rules (:mod:`tfckpt.format`): the
index and its entries as found, the data shards and positioned reads into them,
checksums verified as bytes pass, partitioned tensors reassembled, and streaming
(chunks, string pieces). The module is longer than the others because all of
those are ways of walking the same entries, which keeps each check in one place.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto
from tfckpt.checkpoint.slicing import (
    Region,
    TensorSlice,
    assemble_region,
    region_counts,
    region_index,
)
from tfckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    TensorNotFoundError,
    UnsupportedCheckpointError,
)
from tfckpt.format import dtypes as _dt
from tfckpt.format import orderedcode
from tfckpt.format.bundle import (
    BULK_MAX_RANK,
    HEADER_KEY,
    MAX_HOLES,
    NATIVE,
    VARIANT,
    EntryColumns,
    Slice,
    StringFraming,
    TensorInfo,
    TensorTable,
    VariantFraming,
    check_entry_location,
    check_slice_cover,
    coverage,
    decode_entries,
    decode_header,
    decode_varints,
    describe_holes,
    entry_shape,
    extents_fit,
    format_slice,
    is_full_slice,
    lengths_crc,
    num_elements,
    parse_entry,
    parse_slice_key,
    slice_from_proto,
    slice_index,
    slice_shape,
)
from tfckpt.format.table import TableReader, crc32c, unmask_crc, unmask_crcs
from tfckpt.io import paths
from tfckpt.io.storage import (
    Reader,
    StorageOptions,
    current_options,
    storage_for,
    takes_storage_options,
)

DEFAULT_CHUNK_BYTES = 16 << 20
# Rows of a lazy slice closer than this are read as one range: a gap costs less to read
# than another request (an object store's latency is worth far more than this).
COALESCE_BYTES = 256 << 10
_decode_name = orderedcode.decode_name
_encode_name = orderedcode.encode_name


class _Stored:
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
    def at(cls, shard_id: int, offset: int, size: int, crc32c: int) -> _Stored:
        """The same from the fields' values (``crc32c`` masked, as stored)."""
        stored = cls.__new__(cls)
        stored.shard_id, stored.offset, stored.size, stored.crc32c = shard_id, offset, size, crc32c
        return stored


class _Bulk(NamedTuple):
    """Entries decoded together (see ``Checkpoint._bulk``)."""

    cols: EntryColumns
    fast: np.ndarray  # bool: rows that passed every check of a whole tensor's entry
    enum: np.ndarray  # DataType numbers, 0 where unknown
    elements: np.ndarray
    shapes: list[tuple[int, ...]]  # () for rows not fast


class _Entry:
    """A parsed index entry plus what tfckpt derived and checked from it."""

    __slots__ = ("key", "name", "proto", "dtype", "shape", "slices")

    def __init__(
        self,
        key: bytes,
        name: str,
        proto: _Stored,
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


_decode_name = orderedcode.decode_name
_encode_name = orderedcode.encode_name


class Checkpoint(collections.abc.Mapping):
    """A checkpoint opened for reading; see :func:`tfckpt.open`.

    Acts as a read-only mapping from tensor name to numpy array. Only the index
    is read when opening; tensor bytes are read on demand with positioned reads.
    With ``mmap`` (the default), whole fixed-size tensors of a local checkpoint
    are read-only views of the mapped file instead: zero-copy, but such an array
    dies with SIGBUS when touched after the file was truncated. Everything else
    (chunks, strings, raw bytes) is always read into memory of its own.

    ``get``, ``items`` and ``values`` come with the mapping (each value read on
    demand); two checkpoints are equal only when they are the same object.

    >>> with Checkpoint("train/model.ckpt-7") as ckpt:
    ...     sizes = {name: info.nbytes for name in ckpt for info in [ckpt.info(name)]}
    """

    __eq__ = object.__eq__  # not the mapping's: comparing would read every tensor
    __hash__ = object.__hash__

    format = "bundle v2"

    @takes_storage_options()
    def __init__(
        self,
        path,
        *,
        verify: bool = True,
        mmap: bool = True,
        storage_options: StorageOptions | None = None,
        resolved: str | None = None,
    ):
        # ``resolved``: the prefix :func:`~tfckpt.checkpoint.opening.open_checkpoint` found
        # for ``path`` already; on object stores each look is a request.
        self.storage_options = current_options()
        self.prefix = resolved or paths.resolve_prefix(path)
        self.verify = verify
        self.mmap = mmap
        self.index_path = paths.index_filename(self.prefix)
        self.storage = storage_for(self.prefix)
        self._readers: dict[int, Reader] = {}
        self._parsed: dict[bytes, _Entry] = {}
        try:
            data = self.storage.read_bytes(self.index_path)
        except OSError as e:
            raise CheckpointNotFoundError(
                f"cannot read index: {e.strerror or e}", path=self.index_path
            ) from None
        table = TableReader(data, self.index_path)
        keys, values = table.keys, table.values  # sorted, each once (the table checks)
        self._table_columns = keys, values
        # The header's empty key sorts first, then every key that starts with a NUL
        # byte (slice keys among them), then the other tensor names.
        first = 1 if keys and keys[0] == HEADER_KEY else 0
        self.header = decode_header(values[0] if first else None, self.index_path)
        self._slice_keys = self._listed_slice_keys(keys[first : bisect_left(keys, b"\x01")])
        if self._slice_keys:
            listed = self._slice_keys
            self._keys = [k for k in keys[first:] if k not in listed]
            self._values = [self._raw[k] for k in self._keys]
        else:
            self._keys, self._values = keys[first:], values[first:]
        self._names = orderedcode.decode_names(self._keys)

    # -- header and entries

    @functools.cached_property
    def _raw(self) -> dict[bytes, bytes]:
        """Every entry of the index by key (built on first use: a listing needs none)."""
        return dict(zip(*self._table_columns))

    def _listed_slice_keys(self, candidates: list[bytes]) -> set[bytes]:
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
                    proto = parse_entry(self._raw.get(full, b""))
                except DecodeError:  # reported when that entry is read
                    proto = BundleEntryProto()
                extents = listed[full] = {slice_from_proto(x) for x in proto.slices}
            if decoded[1] in extents:
                out.add(key)
        return out

    def _corrupt(self, what: str, tensor: str | None, path: str | None = None):
        return CorruptCheckpointError(what, path=path or self.index_path, tensor=tensor)

    def _entry(self, key: bytes, name: str | None = None) -> _Entry:
        cached = self._parsed.get(key)
        if cached is not None:
            return cached
        name = name if name is not None else _decode_name(key)
        raw = self._raw.get(key)
        if raw is None or key == HEADER_KEY:
            raise TensorNotFoundError(
                "no such tensor in the checkpoint", path=self.prefix, tensor=name
            )
        try:
            proto = parse_entry(raw)
        except DecodeError:
            raise self._corrupt("index entry is not a BundleEntryProto", name) from None
        dtype = _dt.from_enum(proto.dtype, path=self.index_path, tensor=name)
        stored = _Stored(proto)
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
        entry = _Entry(key, name, stored, dtype, shape, slices)
        self._parsed[key] = entry
        return entry

    @staticmethod
    def _check_slice(extents: Slice, shape: tuple[int, ...]) -> None:
        if len(extents) != len(shape):
            raise ValueError(f"slice of rank {len(extents)} for a tensor of rank {len(shape)}")
        if not extents_fit(extents, shape):
            raise ValueError(f"slice {format_slice(extents)} lies outside shape {list(shape)}")

    def _full_entry(self, name: str) -> _Entry:
        if not isinstance(name, str):
            raise TypeError(f"tensor names are str, not {type(name).__name__}")
        key = _encode_name(name)
        if key in self._slice_keys or key == HEADER_KEY:
            raise TensorNotFoundError(
                "no such tensor in the checkpoint", path=self.prefix, tensor=name
            )
        return self._entry(key, name)

    def _slice_entry(self, full: _Entry, extents: Slice) -> _Entry:
        key = orderedcode.encode_slice_key(full.name, extents)
        if key not in self._raw:
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

    # -- mapping interface

    def keys(self) -> list[str]:  # type: ignore[override]  # a list, as TensorFlow lists
        """Full tensor names, sorted as ``tf.train.list_variables`` lists them."""
        return list(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name) -> bool:
        if not isinstance(name, str):
            return False
        key = _encode_name(name)
        return bool(key) and key not in self._slice_keys and key in self._raw

    def __getitem__(self, name: str) -> np.ndarray:
        return self.read(name)

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<tfckpt.Checkpoint {self.prefix!r}: {len(self)} tensors>"

    def close(self) -> None:
        readers, self._readers = self._readers, {}
        for reader in readers.values():
            reader.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- metadata

    def info(self, name: str) -> TensorInfo:
        """Dtype, shape, size and location of tensor ``name``."""
        entry = self._full_entry(name)
        return self._info(entry)

    def _info(self, entry: _Entry) -> TensorInfo:
        p = entry.proto
        if entry.slices:
            nbytes = sum(self._slice_entry(entry, s).proto.size for s in entry.slices)
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

    def table(self, names: Sequence[str] | None = None) -> TensorTable:
        """:meth:`info` of every tensor (or of ``names``), as columns: one pass in bulk.

        Entries in the common encoding of a whole tensor are decoded and checked all
        at once; the others (partitioned tensors, unusual or broken entries) one by
        one, as :meth:`info` does, with the same errors.
        """
        if names is None:
            names, keys = self._names, self._keys
        else:
            names = list(names)
            keys = [_encode_name(n) if isinstance(n, str) else b"" for n in names]
        bulk = self._bulk(keys)
        elements = bulk.elements.tolist()
        cols = bulk.cols
        out = TensorTable(
            list(names),
            np.array(_dt.bulk_names(), dtype=object)[bulk.enum].tolist(),
            bulk.shapes,
            cols.size.tolist(),
            cols.shard_id.tolist(),
            cols.offset.tolist(),
            unmask_crcs(cols.crc32c).tolist(),
            [()] * len(names),
            elements,
            list(elements),
        )
        for i in np.flatnonzero(~bulk.fast).tolist():
            out.set(i, self._info(self._full_entry(names[i])))
        return out

    def _full_entries(self, names: Sequence[str]) -> list[_Entry]:
        """``_full_entry`` of each name; those not parsed yet are decoded together."""
        keys = [_encode_name(n) if isinstance(n, str) else b"" for n in names]
        parsed, slice_keys = self._parsed, self._slice_keys
        todo = [i for i, k in enumerate(keys) if k not in parsed]
        if len(todo) > 1:
            bulk = self._bulk([keys[i] for i in todo])
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
                stored = _Stored.at(shard, offset, size, crc)
                key = keys[i]
                parsed[key] = _Entry(key, names[i], stored, dtypes[enum], bulk.shapes[j], ())
        return [
            self._full_entry(n) if k in slice_keys or k not in parsed else parsed[k]
            for n, k in zip(names, keys)
        ]

    def _bulk(self, keys: list[bytes]) -> _Bulk:
        """The entries of ``keys`` decoded together, and which pass, as whole tensors'
        entries, every check ``_entry`` makes (rows that fail any are for ``_entry``)."""
        raws = self._values if keys is self._keys else [self._raw.get(k, b"") for k in keys]
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
        if keys is not self._keys:  # names given: only those of whole tensors listed
            slice_keys, raw = self._slice_keys, self._raw
            fast &= np.fromiter(
                (bool(k) and k not in slice_keys and k in raw for k in keys), bool, len(keys)
            )
        shapes = np.empty(len(keys), dtype=object)
        shapes.fill(())
        for r in range(1, BULK_MAX_RANK + 1):
            rows = np.flatnonzero(fast & (cols.rank == r))
            if len(rows):
                # One tuple per distinct shape, shared by the rows that have it.
                dims = np.ascontiguousarray(cols.dims[rows, :r])
                distinct, which = np.unique(
                    dims.view(np.dtype((np.void, 8 * r))).ravel(), return_inverse=True
                )
                tuples = np.fromiter(
                    map(tuple, distinct.view(np.int64).reshape(-1, r).tolist()),
                    dtype=object,
                    count=len(distinct),
                )
                shapes[rows] = tuples[which]
        return _Bulk(cols, fast, enum, elements, shapes.tolist())

    def slice_info(self, name: str) -> list[TensorInfo]:
        """One :class:`TensorInfo` per stored slice of a partitioned tensor (else empty).

        Slices may leave parts of the tensor out (a pre-sliced tensor), but
        overlapping slices are corrupt.
        """
        entry = self._full_entry(name)
        self._check_disjoint(entry)
        return [
            dataclasses.replace(self._info(self._slice_entry(entry, s)), extents=s)
            for s in entry.slices
        ]

    def orphan_slice_keys(self) -> list[bytes]:
        """Slice entries that no partitioned tensor lists (left by a broken writer).

        TensorFlow lists them as tensors (and so does :meth:`keys`). A key counts
        as an orphan when it is exactly a slice key of a partitioned tensor of this
        checkpoint; any other name, even one shaped like the slice key of a tensor
        the checkpoint does not hold, is a name TensorFlow saves and reads as such.
        """
        out = []
        for key in self._raw:
            if key[:1] != b"\0" or key in self._slice_keys:
                continue
            decoded = parse_slice_key(key)
            if decoded is None:
                continue
            if self._partitioned_entry(_encode_name(decoded[0])):
                out.append(key)
        return out

    def _partitioned_entry(self, key: bytes) -> bool:
        try:
            return key != HEADER_KEY and bool(parse_entry(self._raw.get(key, b"")).slices)
        except DecodeError:
            return False

    @property
    def tf_path(self) -> str:
        """The path TensorFlow's readers (``tf.train.load_checkpoint``, ``RestoreV2``) open
        this checkpoint by: a bundle's prefix."""
        return self.prefix

    @property
    def data_files(self) -> list[str]:
        n = self.header.num_shards
        return [paths.data_filename(self.prefix, i, n) for i in range(n)]

    def check_shard_files(self, shard_ids) -> None:
        """Refuse when a data shard of ``shard_ids`` is missing or not a regular file.

        One directory listing, whatever the count, so a header's shard count costs
        nothing: only the shards that entries use are looked for.
        """
        store = self.storage
        n = self.header.num_shards
        try:
            present = set(store.listdir(store.dirname(self.prefix) or "."))
        except OSError:
            present = set()
        for i in sorted(shard_ids):
            path = paths.data_filename(self.prefix, i, n)
            if store.basename(path) not in present:
                raise CheckpointNotFoundError("data shard is missing", path=path)
            if store.irregular(path):
                raise CorruptCheckpointError("data shard is not a regular file", path=path)

    # -- raw access to shards

    def _shard(self, shard_id: int, tensor: str):
        reader = self._readers.get(shard_id)
        if reader is None:
            path = paths.data_filename(self.prefix, shard_id, self.header.num_shards)
            try:
                reader = self.storage.open_reader(path)
            except OSError as e:
                raise CheckpointNotFoundError(
                    f"cannot open data shard: {e.strerror or e}", path=path, tensor=tensor
                ) from None
            except CheckpointError as e:
                raise type(e)(e.detail, path=path, tensor=tensor) from None
            self._readers[shard_id] = reader
        return reader

    def _shard_path(self, entry: _Entry) -> str:
        return paths.data_filename(self.prefix, entry.proto.shard_id, self.header.num_shards)

    def _check_extent(self, entry: _Entry):
        reader = self._shard(entry.proto.shard_id, entry.name)
        end = entry.proto.offset + entry.proto.size
        if end > reader.size:
            raise self._corrupt(
                f"bytes [{entry.proto.offset}, {end}) lie past the end of the shard "
                f"({reader.size} bytes); the file is truncated",
                entry.name,
                self._shard_path(entry),
            )
        return reader

    def _pread_into(self, reader, buf: memoryview, offset: int, entry: _Entry) -> None:
        done = 0
        total = len(buf)
        while done < total:
            try:
                n = reader.readinto(buf[done:], offset + done)
            except OSError as e:
                raise CorruptCheckpointError(
                    f"read failed: {e.strerror or e}",
                    path=self._shard_path(entry),
                    tensor=entry.name,
                ) from None
            if n == 0:
                raise self._corrupt("unexpected end of file", entry.name, self._shard_path(entry))
            done += n

    def _read_entry_bytes(self, entry: _Entry, *, view: bool = False) -> np.ndarray:
        """The entry's bytes as a uint8 array, checksum verified when asked to.

        With ``view`` (and ``mmap``), from a local file this is a read-only view of
        the mapped file: zero-copy.
        """
        reader = self._check_extent(entry)
        buf = None
        if view and self.mmap and entry.proto.size and hasattr(reader, "view"):
            buf = reader.view(entry.proto.offset, entry.proto.size)
        if buf is None:
            buf = np.empty(entry.proto.size, dtype=np.uint8)
            self._pread_into(reader, buf.data, entry.proto.offset, entry)
        if self.verify and entry.dtype is not _dt.STRING and entry.dtype is not VARIANT:
            self._check_crc(entry, crc32c(buf))
        return buf

    def _check_crc(self, entry: _Entry, actual: int) -> None:
        stored = unmask_crc(entry.proto.crc32c)
        if stored != actual:
            raise self._corrupt(
                f"checksum mismatch: stored {stored:#010x}, computed "
                f"{actual:#010x} over {entry.proto.size} bytes at offset "
                f"{entry.proto.offset}",
                entry.name,
                self._shard_path(entry),
            )

    # -- values

    def read(self, name: str) -> np.ndarray:
        """The value of tensor ``name`` as TensorFlow's reader returns it."""
        entry = self._full_entry(name)
        if entry.slices:
            return self._assemble(entry)
        return self._decode(entry)

    def _stored_entry(self, name: str, extents: Slice | None) -> _Entry:
        """The entry holding bytes: the tensor's own, or with ``extents`` one of its slices."""
        entry = self._full_entry(name)
        if extents is not None:
            return self._slice_entry(entry, tuple(extents))
        if entry.slices:
            raise UnsupportedCheckpointError(
                "partitioned tensor has no bytes of its own; read its slices",
                path=self.prefix,
                tensor=name,
            )
        return entry

    def read_bytes(self, name: str, extents: Slice | None = None) -> bytes:
        """The on-disk bytes of tensor ``name`` (or of one of its slices), checksum verified."""
        entry = self._stored_entry(name, extents)
        data = self._read_entry_bytes(entry).tobytes()
        if entry.dtype is _dt.STRING:
            self._check_string_bytes(entry, data)
        elif entry.dtype is VARIANT:
            self._check_variant_bytes(entry, data)
        return data

    def variant_elements(self, name: str, extents: Slice | None = None) -> list[bytes]:
        """The serialized ``VariantTensorDataProto`` of each element of a variant tensor."""
        entry = self._full_entry(name)
        if entry.dtype is not VARIANT:
            raise UnsupportedCheckpointError(
                f"a {entry.dtype.name} tensor, not a variant", path=self.prefix, tensor=name
            )
        data = self.read_bytes(name, extents)
        shape = entry.shape if extents is None else slice_shape(entry.shape, tuple(extents))
        framing = VariantFraming(data, num_elements(shape), self.header.endianness)
        if not framing.elements:  # no bytes at all: default (empty) elements
            return [b""] * num_elements(shape)
        return [data[pos : pos + n] for pos, n in framing.elements]

    def read_elements(
        self, name: str, start: int, count: int, extents: Slice | None = None
    ) -> np.ndarray:
        """Elements ``[start, start + count)`` (row-major) of a whole, fixed-size tensor,
        or with ``extents`` of one stored slice of a partitioned one.

        For reading a tensor in tiles; no checksum covers a part of a tensor, so
        callers verify it once with :meth:`iter_chunks`.
        """
        entry = self._stored_entry(name, extents)
        itemsize = entry.dtype.fixed_itemsize
        if start < 0 or count < 0 or (start + count) * itemsize > entry.proto.size:
            raise ValueError(f"elements [{start}, {start + count}) lie outside {name!r}")
        reader = self._check_extent(entry)
        buf = np.empty(count * itemsize, dtype=np.uint8)
        self._pread_into(reader, buf.data, entry.proto.offset + start * itemsize, entry)
        return self._to_array(buf, entry.dtype, (count,))

    def read_slice(self, name: str, extents: Slice) -> np.ndarray:
        """The value of one stored slice of a partitioned tensor."""
        return self._decode(self._slice_entry(self._full_entry(name), tuple(extents)))

    def get_slice(self, name: str) -> TensorSlice:
        """Tensor ``name`` as a :class:`~tfckpt.slicing.TensorSlice`: ``shape`` and
        ``dtype`` without reading; indexing it reads only the bytes that cover the
        request (not checksummed unless the request is the whole tensor).

        >>> ckpt.get_slice("emb")[0:10, ::2]
        """
        return TensorSlice(self, name)

    def read_region(self, name: str, region: Region) -> np.ndarray:
        """A region of tensor ``name`` (see :mod:`tfckpt.slicing`): of a partitioned
        tensor, only the slices it meets are read."""
        entry = self._full_entry(name)
        if not entry.slices:
            return self._read_entry_region(entry, region)
        self._check_disjoint(entry)
        return assemble_region(
            entry.shape,
            entry.dtype,
            entry.slices,
            region,
            lambda extents, local: self._read_entry_region(
                self._slice_entry(entry, extents), local
            ),
            path=self.prefix,
            tensor=name,
        )

    def _read_entry_region(self, entry: _Entry, region: Region) -> np.ndarray:
        """A region of one stored entry. Each run of rows (axis 0) is one byte range,
        from the region's first element in the run's first row to its last one in the
        last row; rows whose spans lie further apart than :data:`COALESCE_BYTES` are
        runs of their own, and a run holds at most about a chunk."""
        dtype, shape, counts = entry.dtype, entry.shape, region_counts(region)
        if dtype is _dt.STRING or not shape:
            return self._decode(entry)[region_index(region)]
        if dtype.numpy is None:
            return self._decode(entry)  # raises: no numpy form
        out = np.empty(counts, dtype=dtype.numpy)
        if not out.size:
            return out
        reader = self._check_extent(entry)
        itemsize, row = dtype.fixed_itemsize, num_elements(shape[1:])
        inner = region_index(region[1:])
        # The region's first and last element within a row, as flat offsets in the row.
        first = last = 0
        if inner:
            first = int(np.ravel_multi_index([s for s, _, _ in region[1:]], shape[1:]))
            ends = [s + (c - 1) * st for s, c, st in region[1:]]
            last = int(np.ravel_multi_index(ends, shape[1:]))
        start, count, step = region[0]
        # Between two rows' spans lies a gap: read through it when it is small, but
        # never hold more than a chunk of rows at once.
        gap = (step * row - (last - first + 1)) * itemsize
        per_run = (
            1 if gap > COALESCE_BYTES else max(1, DEFAULT_CHUNK_BYTES // (step * row * itemsize))
        )
        for k0 in range(0, count, per_run):
            k1 = min(count, k0 + per_run)
            r0, r1 = start + k0 * step, start + (k1 - 1) * step + 1
            base = r0 * row * itemsize
            lo, hi = (r0 * row + first) * itemsize, ((r1 - 1) * row + last + 1) * itemsize
            buf = np.empty((r1 - r0) * row * itemsize, dtype=np.uint8)
            at = entry.proto.offset + lo
            self._pread_into(reader, buf.data[lo - base : hi - base], at, entry)
            rows = self._to_array(buf, dtype, (r1 - r0,) + shape[1:])
            out[k0:k1] = rows[(slice(None, None, step),) + inner]
        return out

    def _decode(self, entry: _Entry) -> np.ndarray:
        dtype = entry.dtype
        if dtype is _dt.STRING:
            return self._decode_strings(entry)
        if dtype.numpy is None:
            raise UnsupportedCheckpointError(
                f"{dtype.name} tensors have no numpy form; use read_bytes()",
                path=self.prefix,
                tensor=entry.name,
            )
        buf = self._read_entry_bytes(entry, view=True)
        return self._to_array(buf, dtype, entry.shape)

    def _to_array(self, buf: np.ndarray, dtype: _dt.DType, shape: tuple[int, ...]) -> np.ndarray:
        if self.header.endianness != NATIVE and dtype.swap_unit > 1:
            if not buf.flags.writeable:
                buf = buf.copy()
            buf.view(np.dtype(f"u{dtype.swap_unit}")).byteswap(inplace=True)
        return buf.view(dtype.array_dtype).reshape(shape)

    def _decode_strings(self, entry: _Entry) -> np.ndarray:
        n = num_elements(entry.shape)
        if entry.proto.size == 0:
            if n:
                raise self._corrupt(f"string tensor of {n} elements has no bytes", entry.name)
            return np.empty(entry.shape, dtype=object)
        if n > entry.proto.size:  # checked before reading: one length byte per element
            raise self._corrupt(f"{n} strings cannot fit in {entry.proto.size} bytes", entry.name)
        buf = self._read_entry_bytes(entry).tobytes()
        framing = self._check_string_bytes(entry, buf)
        out = np.empty(n, dtype=object)
        pos = framing.data_offset
        for i, length in enumerate(framing.lengths):
            out[i] = buf[pos : pos + length]
            pos += length
        return out.reshape(entry.shape)

    def _check_string_bytes(self, entry: _Entry, buf: bytes) -> StringFraming:
        """Parse a string tensor's framing, checking its checksums when verifying."""
        n = num_elements(entry.shape)
        shard = self._shard_path(entry)
        try:
            framing = StringFraming(buf, n, self.header.endianness)
        except ValueError as e:
            raise self._corrupt(f"malformed string tensor: {e}", entry.name, shard) from None
        if self.verify:
            if framing.stored_lengths_crc != framing.lengths_crc:
                raise self._corrupt(
                    f"string length checksum mismatch: stored {framing.stored_lengths_crc:#010x}"
                    f", computed {framing.lengths_crc:#010x}",
                    entry.name,
                    shard,
                )
            self._check_crc(entry, framing.crc)
        return framing

    def _check_disjoint(self, entry: _Entry) -> None:
        if entry.slices:
            check_slice_cover(
                entry.slices, entry.shape, lambda what: self._corrupt(what, entry.name)
            )

    def _check_whole(self, entry: _Entry) -> None:
        """Before the whole of a partitioned tensor is read: its slices tile it exactly."""
        self._check_disjoint(entry)
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

    def _check_variant_bytes(self, entry: _Entry, buf: bytes) -> VariantFraming:
        """Parse a variant tensor's framing, checking its checksums when verifying."""
        shard = self._shard_path(entry)
        try:
            framing = VariantFraming(buf, num_elements(entry.shape), self.header.endianness)
        except ValueError as e:
            raise self._corrupt(f"malformed variant tensor: {e}", entry.name, shard) from None
        if self.verify:
            if framing.bad_element is not None:
                i, stored, computed = framing.bad_element
                raise self._corrupt(
                    f"checksum mismatch after variant element {i}: stored "
                    f"{stored:#010x}, computed {computed:#010x}",
                    entry.name,
                    shard,
                )
            self._check_crc(entry, framing.crc)
        return framing

    def iter_string_parts(
        self, name: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, extents: Slice | None = None
    ) -> Iterator[tuple[str, np.ndarray, int]]:
        """Stream a string tensor (or one stored slice of it) as the format lays it out.

        Yields ``("lengths", uint64 array, n)`` until every element's length has
        come, then ``("data", uint8 array, n)``: the elements' bytes, concatenated,
        cut anywhere (an element larger than a chunk spans several). ``n`` is the
        source bytes each piece stands for. About ``chunk_bytes`` at most are held
        at once, whatever the tensor's or its elements' size; the framing and (when
        verifying) both checksums are checked as the bytes pass, a mismatch raising
        once the bytes it covers are read. ``BundleWriter.stream`` of a ``string``
        tensor takes the pieces back.
        """
        entry = self._stored_entry(name, extents)
        if entry.dtype is not _dt.STRING:
            raise TypeError(f"{name!r} is a {entry.dtype.name} tensor, not a string tensor")
        return self._iter_string_parts(entry, chunk_bytes)

    def _iter_string_parts(
        self, entry: _Entry, chunk_bytes: int
    ) -> Iterator[tuple[str, np.ndarray, int]]:
        n, size = num_elements(entry.shape), entry.proto.size
        if size == 0:
            if n:
                raise self._corrupt(f"string tensor of {n} elements has no bytes", entry.name)
            return
        if n > size:  # every element takes at least one length byte
            raise self._corrupt(f"{n} strings cannot fit in {size} bytes", entry.name)
        reader = self._check_extent(entry)
        shard, endian = self._shard_path(entry), self.header.endianness
        step = max(chunk_bytes, 1 << 12)

        def read(pos: int, count: int) -> np.ndarray:
            buf = np.empty(count, dtype=np.uint8)
            self._pread_into(reader, buf.data, pos, entry)
            return buf

        def malformed(what) -> CorruptCheckpointError:
            return self._corrupt(f"malformed string tensor: {what}", entry.name, shard)

        pos, end = entry.proto.offset, entry.proto.offset + size  # pos: the next byte to read
        pending = np.empty(0, dtype=np.uint8)  # read but not yet used: each byte is read once
        piece = max(step // 16, 64)  # of lengths: decoded, they take 8 bytes each
        crc = total = 0
        left = n
        if not n:
            yield "lengths", np.empty(0, dtype=np.uint64), 4
        while left:
            if len(pending) < piece and pos < end:
                more = read(pos, min(piece - len(pending), end - pos))
                pos += len(more)
                pending = np.concatenate([pending, more]) if len(pending) else more
            try:
                lengths, used = decode_varints(pending, left)
            except ValueError as e:
                raise malformed(e) from None
            if not used:
                raise malformed("truncated varint")
            if int(lengths.max()) > size:
                raise malformed(f"an element of {int(lengths.max())} bytes in {size} bytes")
            total += int(lengths.sum())
            crc = lengths_crc(lengths, endian, crc)
            left -= len(lengths)
            pending = pending[used:]
            yield "lengths", lengths, used + (0 if left else 4)
        if len(pending) < 4 and pos < end:
            more = read(pos, min(4 - len(pending), end - pos))
            pos += len(more)
            pending = np.concatenate([pending, more])
        if len(pending) < 4:
            raise malformed("truncated before the length checksum")
        check, pending = pending[:4], pending[4:]
        if len(pending) + end - pos != total:
            raise malformed(
                f"lengths add up to {total} bytes but {len(pending) + end - pos} follow"
            )
        stored = unmask_crc(int.from_bytes(check.tobytes(), endian))
        if self.verify and stored != crc:
            raise self._corrupt(
                f"string length checksum mismatch: stored {stored:#010x}, computed {crc:#010x}",
                entry.name,
                shard,
            )
        crc = crc32c(check, crc)
        while len(pending) or pos < end:
            if len(pending):
                buf, pending = pending, pending[:0]
            else:
                buf = read(pos, min(step, end - pos))
                pos += len(buf)
            if self.verify:
                crc = crc32c(buf, crc)
            yield "data", buf, len(buf)
        if self.verify:
            self._check_crc(entry, crc)

    def _iter_string_elements(self, entry: _Entry, chunk_bytes: int) -> Iterator[np.ndarray]:
        """A string tensor as object arrays of consecutive elements, of about
        ``chunk_bytes`` (or one element, if larger) each. The elements' bounds take
        8 bytes per element; their bytes are read a chunk at a time."""
        bounds = None  # allocated once the framing's size checks have passed
        out: list[bytes] = []
        carry: list[bytes] = []  # the start of an element that continues in the next piece
        held = done = k = known = 0  # bytes in out, data bytes passed, next element, lengths
        for kind, part, _ in self._iter_string_parts(entry, chunk_bytes):
            if bounds is None:
                bounds = np.zeros(num_elements(entry.shape) + 1, dtype=np.int64)
            if kind == "lengths":  # element i is data bytes [bounds[i], bounds[i + 1])
                ends = bounds[known + 1 : known + 1 + len(part)]
                np.cumsum(part, out=ends)
                ends += bounds[known]
                known += len(part)
                continue
            data, start, done = part.tobytes(), done, done + len(part)
            last = int(np.searchsorted(bounds, done, side="right")) - 1  # elements ending here
            for a, b in zip(bounds[k:last].tolist(), bounds[k + 1 : last + 1].tolist()):
                if a < start:
                    carry.append(data[: b - start])
                    out.append(b"".join(carry))
                    carry.clear()
                else:
                    out.append(data[a - start : b - start])
                held += b - a
            k = max(k, last)
            if k < len(bounds) - 1:
                carry.append(data[max(int(bounds[k]) - start, 0) :])
            if held >= chunk_bytes:
                yield _object_array(out)
                out, held = [], 0
        if bounds is None:  # no bytes at all: a tensor of no elements
            bounds = np.zeros(1, dtype=np.int64)
        out += [b""] * (len(bounds) - 1 - k)  # empty elements after the last byte
        if out or len(bounds) == 1:
            yield _object_array(out)

    def _assemble(self, entry: _Entry) -> np.ndarray:
        self._check_whole(entry)
        parts = [self._slice_entry(entry, s) for s in entry.slices]
        for part in parts:
            # Every slice's bytes must exist before the full tensor is allocated.
            self._check_extent(part)
        if entry.dtype is _dt.STRING:
            out = np.empty(entry.shape, dtype=object)
        elif entry.dtype.numpy is None:
            raise UnsupportedCheckpointError(
                f"{entry.dtype.name} tensors have no numpy form",
                path=self.prefix,
                tensor=entry.name,
            )
        else:
            out = np.empty(entry.shape, dtype=entry.dtype.numpy)
        for extents, part in zip(entry.slices, parts):
            out[slice_index(extents)] = self._decode(part)
        return out

    def iter_chunks(
        self,
        name: str,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        extents: Slice | None = None,
        *,
        buffers: Callable[[int], np.ndarray] | None = None,
    ) -> Iterator[np.ndarray]:
        """Yield tensor ``name`` as 1-D arrays of consecutive elements in row-major order.

        At most about ``chunk_bytes`` (or one row of the tensor, if larger) are
        held at once for fixed-size dtypes, so a tensor larger than memory can be
        streamed, partitioned ones included: their slices are read band of rows
        by band of rows. Checksums are verified incrementally; a mismatch raises
        once the affected bytes are all read. With ``extents``, streams one
        stored slice of a partitioned tensor. String tensors come as object
        arrays of about ``chunk_bytes`` of elements (or one larger element); a
        partitioned one comes whole.
        ``buffers`` is an internal hook of the transform engine, not public API:
        ``buffers(n)`` returns the uint8 array of ``n`` bytes that the next chunk
        of a whole, fixed-size tensor or slice is read into (a chunk then lives
        only as long as the caller keeps that buffer unused; see
        :class:`tfckpt.pipeline.BufferRing`). Other chunks are always fresh arrays.

        >>> total = sum(float(c.sum()) for c in ckpt.iter_chunks("emb", 1 << 20))
        """
        entry = self._full_entry(name)
        if extents is not None:
            yield from self._iter_entry(
                self._slice_entry(entry, tuple(extents)), chunk_bytes, buffers
            )
        elif not entry.slices:
            yield from self._iter_entry(entry, chunk_bytes, buffers)
        elif entry.dtype.numpy is None or entry.dtype is _dt.STRING or not entry.shape:
            yield self._assemble(entry).reshape(-1)
        elif all(is_full_slice(entry.shape[1:], ext[1:]) for ext in entry.slices):
            # Partitioned by rows only: the slices, in row order, are the tensor.
            self._check_whole(entry)
            for ext in sorted(entry.slices, key=lambda ext: ext[0][0]):
                yield from self._iter_entry(self._slice_entry(entry, ext), chunk_bytes, buffers)
        else:
            yield from self._iter_bands(entry, chunk_bytes)

    def read_together(
        self, names: Sequence[str], *, buffers: Callable[[int], np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """Whole tensors ``names`` as 1-D arrays, read with one positioned read per run.

        For many small tensors: their entries are sorted by place, and those that
        lie back to back (or a few bytes apart) in a shard are read in one go,
        into one buffer (``buffers(n)``, as for :meth:`iter_chunks`), of which the
        arrays are views. Each checksum is verified. Every name must be a whole,
        unpartitioned tensor of a fixed-size dtype with a numpy form.

        >>> a, b = ckpt.read_together(["layer_0/bias", "layer_1/bias"])
        """
        entries = self._full_entries(names)
        for e in entries:
            if e.slices or e.dtype is _dt.STRING or e.dtype.numpy is None:
                raise ValueError(f"{e.name!r} cannot be read together with others")
        # Runs of entries in place order; a run is one read, gaps within it included.
        runs: list[list] = []  # [reader, start, end, entry indices]
        gaps = 0
        for i in sorted(range(len(entries)), key=lambda i: _place(entries[i])):
            e = entries[i]
            reader = self._check_extent(e)
            start, end = e.proto.offset, e.proto.offset + e.proto.size
            last = runs[-1] if runs else None
            # Overlapping entries (a hostile index) are read apart: a big-endian
            # tensor is swapped in place.
            gap = start - last[2] if last is not None and last[0] is reader else -1
            if last is not None and 0 <= gap <= _RUN_GAP and gaps + gap <= _RUN_GAPS:
                gaps += gap
                last[2] = end
                last[3].append(i)
                continue
            runs.append([reader, start, end, [i]])
        total = sum(end - start for _, start, end, _ in runs)
        buf = np.empty(total, dtype=np.uint8) if buffers is None else buffers(total)
        out: list = [None] * len(entries)
        pos = 0
        for reader, start, end, members in runs:
            region = buf[pos : pos + end - start]
            pos += end - start
            self._pread_into(reader, region.data, start, entries[members[0]])
            for i in members:
                e = entries[i]
                at = e.proto.offset - start
                part = region[at : at + e.proto.size]
                if self.verify:
                    self._check_crc(e, crc32c(part))
                out[i] = self._to_array(part, e.dtype, (e.proto.size // e.dtype.fixed_itemsize,))
        return out

    def _iter_bands(self, entry: _Entry, chunk_bytes: int) -> Iterator[np.ndarray]:
        """Stream a partitioned tensor in bands of whole rows (axis 0).

        Within a slice, rows are contiguous bytes, so each band reads one byte
        range per slice crossing it, and each slice's bytes are read in order,
        which lets its checksum be carried from band to band.
        """
        self._check_whole(entry)
        shape, dtype = entry.shape, entry.dtype
        parts = []
        for extents in entry.slices:
            part = self._slice_entry(entry, extents)
            reader = self._check_extent(part)
            start, length = extents[0]
            rows = (0, shape[0]) if length is None else (start, start + length)
            parts.append((extents, part, reader, rows, [0]))
            if self.verify and part.proto.size == 0:
                self._check_crc(part, 0)
        row_bytes = num_elements(shape[1:]) * dtype.fixed_itemsize
        rows_per_band = max(1, chunk_bytes // max(row_bytes, 1))
        cuts = sorted({0, shape[0]} | {r for p in parts for r in p[3]})
        for lo, hi in zip(cuts, cuts[1:]):
            for r0 in range(lo, hi, rows_per_band):
                r1 = min(hi, r0 + rows_per_band)
                out = np.empty((r1 - r0,) + shape[1:], dtype=dtype.numpy)
                for extents, part, reader, (s0, s1), crc in parts:
                    if not (s0 <= r0 and r1 <= s1):
                        continue
                    part_row = num_elements(part.shape[1:]) * dtype.fixed_itemsize
                    buf = np.empty((r1 - r0) * part_row, dtype=np.uint8)
                    self._pread_into(
                        reader, buf.data, part.proto.offset + (r0 - s0) * part_row, part
                    )
                    if self.verify:
                        crc[0] = crc32c(buf, crc[0])
                        if r1 == s1:
                            self._check_crc(part, crc[0])
                    index = (slice(None),) + slice_index(extents[1:])
                    out[index] = self._to_array(buf, dtype, (r1 - r0,) + part.shape[1:])
                yield out.reshape(-1)

    def _iter_entry(
        self, entry: _Entry, chunk_bytes: int, buffers: Callable[[int], np.ndarray] | None = None
    ) -> Iterator[np.ndarray]:
        dtype = entry.dtype
        if dtype is _dt.STRING:
            yield from self._iter_string_elements(entry, chunk_bytes)
            return
        if dtype.numpy is None:
            yield self._decode(entry).reshape(-1)
            return
        reader = self._check_extent(entry)
        itemsize = dtype.fixed_itemsize
        step = max(1, chunk_bytes // itemsize) * itemsize
        offset, remaining = entry.proto.offset, entry.proto.size
        crc = 0
        while remaining:
            n = min(step, remaining)
            buf = np.empty(n, dtype=np.uint8) if buffers is None else buffers(n)
            self._pread_into(reader, buf.data, offset, entry)
            if self.verify:
                crc = crc32c(buf, crc)
            offset += n
            remaining -= n
            yield self._to_array(buf, dtype, (n // itemsize,))
        if self.verify:
            self._check_crc(entry, crc)


# Bytes between two tensors that a run still reads rather than start another read,
# and how many of them all together.
_RUN_GAP = 4096
_RUN_GAPS = 1 << 20


def _place(entry: _Entry) -> tuple[int, int]:
    return entry.proto.shard_id, entry.proto.offset


def _object_array(items: list) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
