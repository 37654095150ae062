"""Tensor bundle V2: the index of ``BundleEntryProto``s and the data shards it points into.

:class:`Checkpoint` reads a bundle (header, entries, fixed-size and string
tensors, partitioned tensors reassembled from their slices, big-endian bundles
swapped); :class:`BundleWriter` writes one that TensorFlow reads bit-for-bit.
This is the only module that knows how tensor bytes are laid out in a shard.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import math
import os
import secrets
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
from google.protobuf.message import DecodeError

from . import dtypes as _dt
from . import orderedcode, paths
from .storage import normalize, storage_for
from ._proto.tensor_bundle_pb2 import BundleEntryProto, BundleHeaderProto, TensorSliceProto
from .errors import (CheckpointError, CheckpointNotFoundError, CheckpointWriteError,
                     CorruptCheckpointError, TensorNotFoundError, UnsupportedCheckpointError)
from .table import TableBuilder, TableReader, crc32c, decode_varint, encode_varint, mask_crc, \
    unmask_crc

HEADER_KEY = b""
_VARIANT = _dt.lookup("variant")
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
FORMAT_VERSION = 1  # the bundle version TensorFlow writes and reads
_MIN_PRODUCER = 0
DEFAULT_CHUNK_BYTES = 16 << 20
_MAX_RANK = 254
MAX_SHARDS = 1 << 20  # a header claiming more shards than this is not a real checkpoint
_MAX_ELEMENTS = (1 << 63) - 1

Extent = tuple[int, "int | None"]
Slice = tuple[Extent, ...]


@dataclass(frozen=True)
class Version:
    """Format version of a bundle (TensorFlow's ``VersionDef``)."""

    producer: int
    min_consumer: int
    bad_consumers: tuple[int, ...] = ()


@dataclass(frozen=True)
class Header:
    """The bundle header: shard count, byte order of the data, format version."""

    num_shards: int
    endianness: str  # 'little' or 'big'
    version: Version


@dataclass(frozen=True)
class TensorInfo:
    """What the index says about one tensor (or one slice of a partitioned tensor).

    ``nbytes`` is the bytes it occupies in data shards (for a partitioned tensor,
    the sum over its slices). ``shard``, ``offset`` and ``crc32c`` (unmasked) are
    None for a partitioned tensor, whose bytes live in its slices.
    ``stored_elements`` is how many of its elements the checkpoint holds: fewer
    than ``size`` for a pre-sliced tensor, whose slices leave parts out on purpose.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    shard: int | None
    offset: int | None
    crc32c: int | None
    slices: tuple[Slice, ...] = ()
    extents: Slice | None = None  # set when this describes one slice of a partitioned tensor
    stored_elements: int | None = None

    @property
    def partitioned(self) -> bool:
        return bool(self.slices)

    @property
    def partial(self) -> bool:
        """Only some of the tensor is stored (TensorFlow restores just those slices)."""
        return self.stored_elements is not None and self.stored_elements < self.size

    @property
    def size(self) -> int:
        """Number of elements."""
        return _num_elements(self.shape)


def _num_elements(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _slice_shape(full_shape: Sequence[int], extents: Slice) -> tuple[int, ...]:
    return tuple(d if length is None else length for d, (_, length) in zip(full_shape, extents))


def _slice_index(extents: Slice) -> tuple[slice, ...]:
    return tuple(slice(None) if length is None else slice(start, start + length)
                 for start, length in extents)


def _slice_from_proto(proto: TensorSliceProto) -> Slice:
    return tuple((e.start, e.length if e.HasField("length") else None) for e in proto.extent)


def _is_full_slice(full_shape: Sequence[int], extents: Slice) -> bool:
    return all(length is None or (start == 0 and length == d)
               for d, (start, length) in zip(full_shape, extents))


class _Entry:
    """A parsed index entry plus what tfckpt derived and checked from it."""

    __slots__ = ("key", "name", "proto", "dtype", "shape", "slices")

    def __init__(self, key: bytes, name: str, proto: BundleEntryProto, dtype: _dt.DType,
                 shape: tuple[int, ...], slices: tuple[Slice, ...]):
        self.key = key
        self.name = name
        self.proto = proto
        self.dtype = dtype
        self.shape = shape
        self.slices = slices


_decode_name = orderedcode.decode_name
_encode_name = orderedcode.encode_name


# --- reading ---------------------------------------------------------------

class Checkpoint:
    """A checkpoint opened for reading; see :func:`tfckpt.open`.

    Acts as a read-only mapping from tensor name to numpy array. Only the index
    is read when opening; tensor bytes are read on demand with positioned reads.
    With ``mmap`` (the default), whole fixed-size tensors of a local checkpoint
    are read-only views of the mapped file instead: zero-copy, but such an array
    dies with SIGBUS when touched after the file was truncated. Everything else
    (chunks, strings, raw bytes) is always read into memory of its own.
    """

    def __init__(self, path, *, verify: bool = True, mmap: bool = True):
        self.prefix = paths.resolve_prefix(path)
        self.verify = verify
        self.mmap = mmap
        self.index_path = paths.index_filename(self.prefix)
        self.storage = storage_for(self.prefix)
        self._readers: dict[int, object] = {}
        self._parsed: dict[bytes, _Entry] = {}
        try:
            data = self.storage.read_bytes(self.index_path)
        except OSError as e:
            raise CheckpointNotFoundError(f"cannot read index: {e.strerror or e}",
                                          path=self.index_path) from None
        table = TableReader(data, self.index_path)
        self._raw: dict[bytes, bytes] = dict(table.entries)
        if len(self._raw) != len(table.entries):
            raise CorruptCheckpointError("duplicate keys in index", path=self.index_path)
        self.header = self._read_header()
        self._slice_keys = self._listed_slice_keys()
        self._names = [_decode_name(k) for k, _ in table.entries
                       if k and k not in self._slice_keys]

    # -- header and entries

    def _read_header(self) -> Header:
        raw = self._raw.get(HEADER_KEY)
        if raw is None:
            raise CorruptCheckpointError("index has no header entry (empty key)",
                                         path=self.index_path)
        try:
            h = BundleHeaderProto.FromString(raw)
        except DecodeError:
            raise CorruptCheckpointError("header entry is not a BundleHeaderProto",
                                         path=self.index_path) from None
        v = h.version
        if v.producer < _MIN_PRODUCER or v.min_consumer > FORMAT_VERSION \
                or FORMAT_VERSION in v.bad_consumers:
            raise UnsupportedCheckpointError(
                f"bundle format version producer={v.producer} min_consumer={v.min_consumer} "
                f"bad_consumers={list(v.bad_consumers)} cannot be read by a version "
                f"{FORMAT_VERSION} reader", path=self.index_path)
        if h.endianness not in (0, 1):
            raise CorruptCheckpointError(f"unknown endianness {h.endianness} in header",
                                         path=self.index_path)
        if not 1 <= h.num_shards <= MAX_SHARDS:
            raise CorruptCheckpointError(f"header declares {h.num_shards} data shards",
                                         path=self.index_path)
        return Header(h.num_shards, "big" if h.endianness == 1 else "little",
                      Version(v.producer, v.min_consumer, tuple(v.bad_consumers)))

    def _listed_slice_keys(self) -> set[bytes]:
        """The keys of the slices that their tensors' entries list.

        Those are the only keys TensorFlow leaves out when it lists a checkpoint:
        any other key, even one that starts with a NUL byte as every slice key
        does, is a tensor name.
        """
        listed: dict[bytes, set] = {}  # full tensor key -> the extents its entry lists
        out = set()
        for key in self._raw:
            decoded = _decode_slice_key(key) if key[:1] == b"\0" else None
            if decoded is None:
                continue
            full = _encode_name(decoded[0])
            if full == HEADER_KEY:
                continue
            extents = listed.get(full)
            if extents is None:
                try:
                    proto = BundleEntryProto.FromString(self._raw.get(full, b""))
                except DecodeError:  # reported when that entry is read
                    proto = BundleEntryProto()
                extents = listed[full] = {_slice_from_proto(x) for x in proto.slices}
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
            raise TensorNotFoundError("no such tensor in the checkpoint", path=self.prefix,
                                      tensor=name)
        try:
            proto = BundleEntryProto.FromString(raw)
        except DecodeError:
            raise self._corrupt("index entry is not a BundleEntryProto", name) from None
        dtype = _dt.from_enum(proto.dtype, path=self.index_path, tensor=name)
        shape = self._check_shape(proto, name)
        slices = tuple(_slice_from_proto(s) for s in proto.slices)
        for extents in slices:
            self._check_slice(extents, shape, name)
        if not slices and (proto.shard_id < 0 or proto.shard_id >= self.header.num_shards):
            raise self._corrupt(f"shard id {proto.shard_id} outside the "
                                f"{self.header.num_shards} shards of the checkpoint", name)
        if not slices and (proto.offset < 0 or proto.size < 0):
            raise self._corrupt(f"negative offset {proto.offset} or size {proto.size}", name)
        if not slices and dtype.itemsize is not None \
                and proto.size != _num_elements(shape) * dtype.itemsize:
            raise self._corrupt(
                f"entry size {proto.size} bytes does not match shape {list(shape)} of "
                f"{dtype.name} ({_num_elements(shape) * dtype.itemsize} bytes)", name)
        entry = _Entry(key, name, proto, dtype, shape, slices)
        self._parsed[key] = entry
        return entry

    def _check_shape(self, proto: BundleEntryProto, name: str) -> tuple[int, ...]:
        if proto.shape.unknown_rank:
            raise self._corrupt("stored shape has unknown rank", name)
        shape = tuple([d.size for d in proto.shape.dim])
        if len(shape) > _MAX_RANK:
            raise self._corrupt(f"rank {len(shape)} exceeds {_MAX_RANK}", name)
        if shape and min(shape) < 0:
            raise self._corrupt(f"negative dimension in shape {list(shape)}", name)
        if _num_elements(shape) > _MAX_ELEMENTS:
            raise self._corrupt(f"shape {list(shape)} has more than 2**63-1 elements", name)
        return shape

    def _check_slice(self, extents: Slice, shape: tuple[int, ...], name: str) -> None:
        if len(extents) != len(shape):
            raise self._corrupt(f"slice of rank {len(extents)} for a tensor of rank "
                                f"{len(shape)}", name)
        for (start, length), dim in zip(extents, shape):
            if start < 0 or (length is not None and (length < 0 or start + length > dim)) \
                    or (length is None and start != 0):
                raise self._corrupt(f"slice {_format_slice(extents)} lies outside shape "
                                    f"{list(shape)}", name)

    def _full_entry(self, name: str) -> _Entry:
        if not isinstance(name, str):
            raise TypeError(f"tensor names are str, not {type(name).__name__}")
        key = _encode_name(name)
        if key in self._slice_keys or key == HEADER_KEY:
            raise TensorNotFoundError("no such tensor in the checkpoint", path=self.prefix,
                                      tensor=name)
        return self._entry(key, name)

    def _slice_entry(self, full: _Entry, extents: Slice) -> _Entry:
        key = orderedcode.encode_slice_key(full.name, extents)
        if key not in self._raw:
            raise self._corrupt(f"slice {_format_slice(extents)} is listed but has no "
                                "entry of its own", full.name)
        entry = self._entry(key, f"{full.name}[{_format_slice(extents)}]")
        if entry.slices:
            raise self._corrupt("a slice entry has slices of its own", entry.name)
        if entry.dtype is not full.dtype:
            raise self._corrupt(f"slice has dtype {entry.dtype.name}, tensor has "
                                f"{full.dtype.name}", entry.name)
        if entry.shape != _slice_shape(full.shape, extents):
            raise self._corrupt(f"slice shape {list(entry.shape)} does not match its extents "
                                f"{_format_slice(extents)}", entry.name)
        return entry

    # -- mapping interface

    def keys(self) -> list[str]:
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

    def __enter__(self) -> "Checkpoint":
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
            return TensorInfo(entry.name, entry.dtype.name, entry.shape, nbytes, None, None,
                              None, entry.slices,
                              stored_elements=_coverage(entry.slices, entry.shape)[0])
        return TensorInfo(entry.name, entry.dtype.name, entry.shape, p.size, p.shard_id,
                          p.offset, unmask_crc(p.crc32c), (),
                          stored_elements=_num_elements(entry.shape))

    def slice_info(self, name: str) -> list[TensorInfo]:
        """One :class:`TensorInfo` per stored slice of a partitioned tensor (else empty).

        Slices may leave parts of the tensor out (a pre-sliced tensor), but
        overlapping slices are corrupt.
        """
        entry = self._full_entry(name)
        self._check_disjoint(entry)
        return [dataclasses.replace(self._info(self._slice_entry(entry, s)), extents=s)
                for s in entry.slices]

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
            decoded = _decode_slice_key(key)
            if decoded is None:
                continue
            if self._partitioned_entry(_encode_name(decoded[0])):
                out.append(key)
        return out

    def _partitioned_entry(self, key: bytes) -> bool:
        try:
            return key != HEADER_KEY and bool(BundleEntryProto.FromString(
                self._raw.get(key, b"")).slices)
        except DecodeError:
            return False

    def entry_proto(self, name: str) -> BundleEntryProto:
        """A copy of the raw ``BundleEntryProto`` of tensor ``name``."""
        proto = BundleEntryProto()
        proto.CopyFrom(self._full_entry(name).proto)
        return proto

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
            if store.local and not os.path.isfile(path):
                raise CorruptCheckpointError("data shard is not a regular file", path=path)

    # -- raw access to shards

    def _shard(self, shard_id: int, tensor: str):
        reader = self._readers.get(shard_id)
        if reader is None:
            path = paths.data_filename(self.prefix, shard_id, self.header.num_shards)
            try:
                reader = self.storage.open_reader(path)
            except OSError as e:
                raise CheckpointNotFoundError(f"cannot open data shard: {e.strerror or e}",
                                              path=path, tensor=tensor) from None
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
                f"({reader.size} bytes); the file is truncated", entry.name,
                self._shard_path(entry))
        return reader

    def _pread_into(self, reader, buf: memoryview, offset: int, entry: _Entry) -> None:
        done = 0
        total = len(buf)
        while done < total:
            try:
                n = reader.readinto(buf[done:], offset + done)
            except OSError as e:
                raise CorruptCheckpointError(f"read failed: {e.strerror or e}",
                                             path=self._shard_path(entry),
                                             tensor=entry.name) from None
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
            self._pread_into(reader, memoryview(buf), entry.proto.offset, entry)
        if self.verify and entry.dtype is not _dt.STRING and entry.dtype is not _VARIANT:
            self._check_crc(entry, crc32c(buf))
        return buf

    def _check_crc(self, entry: _Entry, actual: int) -> None:
        stored = unmask_crc(entry.proto.crc32c)
        if stored != actual:
            raise self._corrupt(f"checksum mismatch: stored {stored:#010x}, computed "
                                f"{actual:#010x} over {entry.proto.size} bytes at offset "
                                f"{entry.proto.offset}", entry.name, self._shard_path(entry))

    # -- values

    def read(self, name: str) -> np.ndarray:
        """The value of tensor ``name`` as TensorFlow's reader returns it."""
        entry = self._full_entry(name)
        if entry.slices:
            return self._assemble(entry)
        return self._decode(entry)

    def read_bytes(self, name: str, extents: Slice | None = None) -> bytes:
        """The on-disk bytes of tensor ``name`` (or of one of its slices), checksum verified."""
        entry = self._full_entry(name)
        if extents is not None:
            entry = self._slice_entry(entry, tuple(extents))
        elif entry.slices:
            raise UnsupportedCheckpointError(
                "partitioned tensor has no bytes of its own; read its slices", path=self.prefix,
                tensor=name)
        data = self._read_entry_bytes(entry).tobytes()
        if entry.dtype is _dt.STRING:
            self._check_string_bytes(entry, data)
        elif entry.dtype is _VARIANT:
            self._check_variant_bytes(entry, data)
        return data

    def variant_elements(self, name: str, extents: Slice | None = None) -> list[bytes]:
        """The serialized ``VariantTensorDataProto`` of each element of a variant tensor."""
        entry = self._full_entry(name)
        if entry.dtype is not _VARIANT:
            raise UnsupportedCheckpointError(f"a {entry.dtype.name} tensor, not a variant",
                                             path=self.prefix, tensor=name)
        data = self.read_bytes(name, extents)
        shape = entry.shape if extents is None else _slice_shape(entry.shape, tuple(extents))
        framing = VariantFraming(data, _num_elements(shape), self.header.endianness)
        if not framing.elements:  # no bytes at all: default (empty) elements
            return [b""] * _num_elements(shape)
        return [data[pos:pos + n] for pos, n in framing.elements]

    def read_slice(self, name: str, extents: Slice) -> np.ndarray:
        """The value of one stored slice of a partitioned tensor."""
        return self._decode(self._slice_entry(self._full_entry(name), tuple(extents)))

    def _decode(self, entry: _Entry) -> np.ndarray:
        dtype = entry.dtype
        if dtype is _dt.STRING:
            return self._decode_strings(entry)
        if dtype.numpy is None:
            raise UnsupportedCheckpointError(
                f"{dtype.name} tensors have no numpy form; use read_bytes()",
                path=self.prefix, tensor=entry.name)
        buf = self._read_entry_bytes(entry, view=True)
        return self._to_array(buf, dtype, entry.shape)

    def _to_array(self, buf: np.ndarray, dtype: _dt.DType, shape: tuple[int, ...]) -> np.ndarray:
        if self.header.endianness != _NATIVE and dtype.swap_unit > 1:
            if not buf.flags.writeable:
                buf = buf.copy()
            buf.view(np.dtype(f"u{dtype.swap_unit}")).byteswap(inplace=True)
        return buf.view(dtype.numpy).reshape(shape)

    def _decode_strings(self, entry: _Entry) -> np.ndarray:
        n = _num_elements(entry.shape)
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
            out[i] = buf[pos:pos + length]
            pos += length
        return out.reshape(entry.shape)

    def _check_string_bytes(self, entry: _Entry, buf: bytes) -> "StringFraming":
        """Parse a string tensor's framing, checking its checksums when verifying."""
        n = _num_elements(entry.shape)
        shard = self._shard_path(entry)
        try:
            framing = StringFraming(buf, n, self.header.endianness)
        except ValueError as e:
            raise self._corrupt(f"malformed string tensor: {e}", entry.name, shard) from None
        if self.verify:
            if framing.stored_lengths_crc != framing.lengths_crc:
                raise self._corrupt(
                    f"string length checksum mismatch: stored {framing.stored_lengths_crc:#010x}"
                    f", computed {framing.lengths_crc:#010x}", entry.name, shard)
            self._check_crc(entry, framing.crc)
        return framing

    def _check_disjoint(self, entry: _Entry) -> None:
        if entry.slices:
            _check_slice_cover(entry.slices, entry.shape,
                               lambda what: self._corrupt(what, entry.name))

    def _check_whole(self, entry: _Entry) -> None:
        """Before the whole of a partitioned tensor is read: its slices tile it exactly."""
        self._check_disjoint(entry)
        stored, holes = _coverage(entry.slices, entry.shape)
        total = _num_elements(entry.shape)
        if stored != total:
            raise UnsupportedCheckpointError(
                f"only {stored} of its {total} elements are stored (slices "
                f"{' '.join(_format_slice(s) for s in entry.slices[:_MAX_HOLES])}"
                f"{' ...' if len(entry.slices) > _MAX_HOLES else ''}); "
                f"{_describe_holes(holes, total - stored)}: read the stored slices with "
                "read_slice()", path=self.prefix, tensor=entry.name)

    def _check_variant_bytes(self, entry: _Entry, buf: bytes) -> "VariantFraming":
        """Parse a variant tensor's framing, checking its checksums when verifying."""
        shard = self._shard_path(entry)
        try:
            framing = VariantFraming(buf, _num_elements(entry.shape), self.header.endianness)
        except ValueError as e:
            raise self._corrupt(f"malformed variant tensor: {e}", entry.name, shard) from None
        if self.verify:
            if framing.bad_element is not None:
                i, stored, computed = framing.bad_element
                raise self._corrupt(f"checksum mismatch after variant element {i}: stored "
                                    f"{stored:#010x}, computed {computed:#010x}", entry.name,
                                    shard)
            self._check_crc(entry, framing.crc)
        return framing

    def iter_string_parts(self, name: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                          extents: Slice | None = None) -> Iterator[tuple[str, np.ndarray, int]]:
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
        entry = self._full_entry(name)
        if extents is not None:
            entry = self._slice_entry(entry, tuple(extents))
        elif entry.slices:
            raise UnsupportedCheckpointError(
                "partitioned tensor has no bytes of its own; read its slices", path=self.prefix,
                tensor=name)
        if entry.dtype is not _dt.STRING:
            raise TypeError(f"{name!r} is a {entry.dtype.name} tensor, not a string tensor")
        return self._iter_string_parts(entry, chunk_bytes)

    def _iter_string_parts(self, entry: _Entry, chunk_bytes: int
                           ) -> Iterator[tuple[str, np.ndarray, int]]:
        n, size = _num_elements(entry.shape), entry.proto.size
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
            self._pread_into(reader, memoryview(buf), pos, entry)
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
                lengths, used = _decode_varints(pending, left)
            except ValueError as e:
                raise malformed(e) from None
            if not used:
                raise malformed("truncated varint")
            if int(lengths.max()) > size:
                raise malformed(f"an element of {int(lengths.max())} bytes in {size} bytes")
            total += int(lengths.sum())
            crc = _lengths_crc(lengths, endian, crc)
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
            raise malformed(f"lengths add up to {total} bytes but {len(pending) + end - pos} "
                            "follow")
        stored = unmask_crc(int.from_bytes(check.tobytes(), endian))
        if self.verify and stored != crc:
            raise self._corrupt(f"string length checksum mismatch: stored {stored:#010x}, "
                                f"computed {crc:#010x}", entry.name, shard)
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
                bounds = np.zeros(_num_elements(entry.shape) + 1, dtype=np.int64)
            if kind == "lengths":  # element i is data bytes [bounds[i], bounds[i + 1])
                ends = bounds[known + 1:known + 1 + len(part)]
                np.cumsum(part, out=ends)
                ends += bounds[known]
                known += len(part)
                continue
            data, start, done = part.tobytes(), done, done + len(part)
            last = int(np.searchsorted(bounds, done, side="right")) - 1  # elements ending here
            for a, b in zip(bounds[k:last].tolist(), bounds[k + 1:last + 1].tolist()):
                if a < start:
                    carry.append(data[:b - start])
                    out.append(b"".join(carry))
                    carry.clear()
                else:
                    out.append(data[a - start:b - start])
                held += b - a
            k = max(k, last)
            if k < len(bounds) - 1:
                carry.append(data[max(int(bounds[k]) - start, 0):])
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
                f"{entry.dtype.name} tensors have no numpy form", path=self.prefix,
                tensor=entry.name)
        else:
            out = np.empty(entry.shape, dtype=entry.dtype.numpy)
        for extents, part in zip(entry.slices, parts):
            out[_slice_index(extents)] = self._decode(part)
        return out

    def iter_chunks(self, name: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                    extents: Slice | None = None, *,
                    buffers: Callable[[int], np.ndarray] | None = None
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
        With ``buffers``, a chunk of a fixed-size dtype is read into
        ``buffers(nbytes)`` (a uint8 array of that size) instead of fresh memory,
        e.g. a ring of reused buffers for streaming consumers; it stays valid as
        long as that buffer is not reused.

        >>> total = sum(float(c.sum()) for c in ckpt.iter_chunks("emb", 1 << 20))
        """
        entry = self._full_entry(name)
        if extents is not None:
            yield from self._iter_entry(self._slice_entry(entry, tuple(extents)), chunk_bytes,
                                        buffers)
        elif not entry.slices:
            yield from self._iter_entry(entry, chunk_bytes, buffers)
        elif entry.dtype.numpy is None or entry.dtype is _dt.STRING or not entry.shape:
            yield self._assemble(entry).reshape(-1)
        elif all(_is_full_slice(entry.shape[1:], ext[1:]) for ext in entry.slices):
            # Partitioned by rows only: the slices, in row order, are the tensor.
            self._check_whole(entry)
            for ext in sorted(entry.slices, key=lambda ext: ext[0][0]):
                yield from self._iter_entry(self._slice_entry(entry, ext), chunk_bytes, buffers)
        else:
            yield from self._iter_bands(entry, chunk_bytes)

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
        row_bytes = _num_elements(shape[1:]) * dtype.itemsize
        rows_per_band = max(1, chunk_bytes // max(row_bytes, 1))
        cuts = sorted({0, shape[0]} | {r for p in parts for r in p[3]})
        for lo, hi in zip(cuts, cuts[1:]):
            for r0 in range(lo, hi, rows_per_band):
                r1 = min(hi, r0 + rows_per_band)
                out = np.empty((r1 - r0,) + shape[1:], dtype=dtype.numpy)
                for extents, part, reader, (s0, s1), crc in parts:
                    if not (s0 <= r0 and r1 <= s1):
                        continue
                    part_row = _num_elements(part.shape[1:]) * dtype.itemsize
                    buf = np.empty((r1 - r0) * part_row, dtype=np.uint8)
                    self._pread_into(reader, memoryview(buf), part.proto.offset + (r0 - s0) * part_row,
                                     part)
                    if self.verify:
                        crc[0] = crc32c(buf, crc[0])
                        if r1 == s1:
                            self._check_crc(part, crc[0])
                    index = (slice(None),) + _slice_index(extents[1:])
                    out[index] = self._to_array(buf, dtype, (r1 - r0,) + part.shape[1:])
                yield out.reshape(-1)

    def _iter_entry(self, entry: _Entry, chunk_bytes: int,
                    buffers: Callable[[int], np.ndarray] | None = None
                    ) -> Iterator[np.ndarray]:
        dtype = entry.dtype
        if dtype is _dt.STRING:
            yield from self._iter_string_elements(entry, chunk_bytes)
            return
        if dtype.numpy is None:
            yield self._decode(entry).reshape(-1)
            return
        reader = self._check_extent(entry)
        itemsize = dtype.itemsize
        step = max(1, chunk_bytes // itemsize) * itemsize
        offset, remaining = entry.proto.offset, entry.proto.size
        crc = 0
        while remaining:
            n = min(step, remaining)
            buf = np.empty(n, dtype=np.uint8) if buffers is None else buffers(n)
            self._pread_into(reader, memoryview(buf), offset, entry)
            if self.verify:
                crc = crc32c(buf, crc)
            offset += n
            remaining -= n
            yield self._to_array(buf, dtype, (n // itemsize,))
        if self.verify:
            self._check_crc(entry, crc)


_NATIVE = "little" if np.little_endian else "big"


def _format_slice(extents: Slice) -> str:
    return ",".join("-" if length is None else f"{start}:{start + length}"
                    for start, length in extents)


format_slice = _format_slice  # "0:4,-": rows 0 to 4, every column


def _slice_bounds(slices: Sequence[Slice], shape: tuple[int, ...]):
    starts = np.array([[s for s, _ in ext] for ext in slices], dtype=np.int64)
    ends = np.array([[d if n is None else s + n for (s, n), d in zip(ext, shape)]
                     for ext in slices], dtype=np.int64)
    return starts.reshape(len(slices), len(shape)), ends.reshape(len(slices), len(shape))


def _check_slice_cover(slices: Sequence[Slice], shape: tuple[int, ...], error) -> None:
    """Raise ``error(what)`` if the slices overlap: no element may be stored twice.

    Slices that leave parts out are legal: TensorFlow writes them for pre-sliced
    tensors and restores just those parts (see :func:`_coverage`).
    """
    if not shape:
        if len(slices) != 1:
            raise error(f"a scalar has {len(slices)} slices")
        return
    starts, ends = _slice_bounds(slices, shape)
    for i in range(len(slices) - 1):
        overlap = np.all((starts[i] < ends[i + 1:]) & (starts[i + 1:] < ends[i]), axis=1)
        if overlap.any():
            j = i + 1 + int(np.argmax(overlap))
            raise error(f"slices {_format_slice(slices[i])} and {_format_slice(slices[j])} "
                        "overlap")


_MAX_COVER_CELLS = 1 << 16  # grid cells examined to name the parts slices leave out
_MAX_HOLES = 4


def _coverage(slices: Sequence[Slice], shape: tuple[int, ...]) -> tuple[int, list[Slice]]:
    """The elements the slices store and (up to a few) blocks they leave out.

    The slices' edges cut every axis into intervals; each cell of that grid is
    either stored or missing, so the missing blocks are found without touching
    an element. On grids too large to walk, the count is the slices' total size
    (exact unless they overlap, which is corrupt anyway) and no block is named.
    """
    total = _num_elements(shape)
    if not shape:
        return (total if slices else 0), []
    starts, ends = _slice_bounds(slices, shape)
    volumes = sum(_num_elements([b - a for a, b in zip(s, e)])
                  for s, e in zip(starts.tolist(), ends.tolist()))
    if volumes == total:
        return total, []
    cuts = [np.unique(np.concatenate([[0, d], starts[:, a], ends[:, a]]))
            for a, d in enumerate(shape)]
    if math.prod(len(c) - 1 for c in cuts) > _MAX_COVER_CELLS:
        return min(volumes, total), []
    stored = np.zeros([len(c) - 1 for c in cuts], dtype=bool)
    for s, e in zip(starts, ends):
        stored[tuple(slice(int(np.searchsorted(c, a)), int(np.searchsorted(c, b)))
                     for c, a, b in zip(cuts, s, e))] = True
    holes = []
    for cell in np.argwhere(~stored)[:_MAX_HOLES + 1]:
        holes.append(tuple((0, None) if c[i] == 0 and c[i + 1] == d else
                           (int(c[i]), int(c[i + 1] - c[i]))
                           for c, i, d in zip(cuts, cell.tolist(), shape)))
    widths = [np.diff(c).tolist() for c in cuts]
    covered = sum(math.prod(w[i] for w, i in zip(widths, cell))
                  for cell in np.argwhere(stored).tolist())
    return covered, holes


def _describe_holes(holes: list[Slice], missing: int) -> str:
    if not holes:
        return f"{missing} elements are missing"
    listed = ", ".join(f"[{_format_slice(h)}]" for h in holes[:_MAX_HOLES])
    more = " and more" if len(holes) > _MAX_HOLES else ""
    return f"missing {missing} elements: {listed}{more}"


# --- writing ---------------------------------------------------------------

def _shape_tuple(shape) -> tuple[int, ...]:
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {list(shape)}")
    return shape


def _as_string_array(value) -> np.ndarray:
    arr = np.asarray(value, dtype=object)
    flat = arr.reshape(-1)
    for i, v in enumerate(flat):
        if isinstance(v, str):
            flat[i] = v.encode("utf-8")
        elif isinstance(v, (bytes, bytearray, memoryview, np.bytes_)):
            flat[i] = bytes(v)
        else:
            raise TypeError(f"string tensor element {i} is {type(v).__name__}, not bytes")
    return arr


def _encode_strings(values: np.ndarray, endian: str) -> tuple[bytes, int]:
    """The on-disk bytes of a string tensor and their (unmasked) CRC32C."""
    flat = values.reshape(-1)
    lengths = bytearray()
    crc = 0
    for v in flat:
        n = len(v)
        lengths += encode_varint(n)
        crc = crc32c(n.to_bytes(4 if n <= 0xFFFFFFFF else 8, endian), crc)
    check = mask_crc(crc).to_bytes(4, endian)
    crc = crc32c(check, crc)
    body = b"".join(flat)
    return bytes(lengths) + check + body, crc32c(body, crc)


class StringFraming:
    """The parsed framing of a string tensor's bytes: lengths, then their checksum, then data.

    ``crc`` is the entry checksum (unmasked) computed the way the format defines
    it: over each length as uint32 (uint64 when larger), the 4 stored checksum
    bytes, then the element bytes. ``ValueError`` when the bytes are malformed.
    """

    def __init__(self, buf: bytes, count: int, endian: str):
        size = len(buf)
        if count > size:  # every element takes at least one length byte
            raise ValueError(f"{count} strings cannot fit in {size} bytes")
        pos = 0
        lengths = []
        crc = 0
        for _ in range(count):
            length, pos = decode_varint(buf, pos, size)
            lengths.append(length)
            crc = crc32c(length.to_bytes(4 if length <= 0xFFFFFFFF else 8, endian), crc)
        if pos + 4 > size:
            raise ValueError("truncated before the length checksum")
        raw_check = buf[pos:pos + 4]
        self.lengths_crc = crc
        self.stored_lengths_crc = unmask_crc(int.from_bytes(raw_check, endian))
        pos += 4
        if pos + sum(lengths) != size:
            raise ValueError(f"lengths add up to {sum(lengths)} bytes but {size - pos} follow")
        self.lengths = lengths
        self.data_offset = pos
        self.crc = crc32c(memoryview(buf)[pos:], crc32c(raw_check, crc))


class VariantFraming:
    """The parsed framing of a variant tensor's bytes.

    Per element: a varint64 length, that many bytes (a serialized
    ``VariantTensorDataProto``), then the masked CRC32C of everything checksummed
    so far. The running checksum covers each length as a uint64 (not its varint
    bytes), the element bytes, then the 4 stored checksum bytes; its final value
    is the entry's ``crc``. ``elements`` holds (offset, length) per element and
    ``bad_element`` the first (index, stored, computed) whose checksum is wrong.
    No bytes at all is accepted as TensorFlow accepts it (default elements).
    ``ValueError`` when the bytes are malformed.
    """

    def __init__(self, buf: bytes, count: int, endian: str):
        size = len(buf)
        self.elements: list[tuple[int, int]] = []
        self.bad_element: tuple[int, int, int] | None = None
        self.crc = 0
        if size == 0:
            return
        if count * 5 > size:  # a length byte and a checksum at least, per element
            raise ValueError(f"{count} variant elements cannot fit in {size} bytes")
        view = memoryview(buf)
        pos = crc = 0
        for i in range(count):
            length, pos = decode_varint(buf, pos, size)
            if pos + length + 4 > size:
                raise ValueError(f"element {i} of {length} bytes runs past the {size} bytes "
                                 "of the entry")
            crc = crc32c(view[pos:pos + length], crc32c(length.to_bytes(8, endian), crc))
            self.elements.append((pos, length))
            pos += length
            raw_check = view[pos:pos + 4]
            stored = unmask_crc(int.from_bytes(raw_check, endian))
            if stored != crc and self.bad_element is None:
                self.bad_element = (i, stored, crc)
            crc = crc32c(raw_check, crc)
            pos += 4
        if pos != size:
            raise ValueError(f"{size - pos} bytes follow the last of {count} elements")
        self.crc = crc


def _decode_slice_key(key: bytes) -> tuple[str, Slice] | None:
    """(name, extents) if ``key`` is exactly how TensorFlow encodes that slice's key."""
    try:
        name, extents = orderedcode.decode_slice_key(key)
        canonical = orderedcode.encode_slice_key(name, extents) == key
    except ValueError:
        return None
    return (name, extents) if canonical else None

def _object_array(items: list) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _decode_varints(buf: np.ndarray, count: int) -> tuple[np.ndarray, int]:
    """The first (up to) ``count`` whole varint64s in ``buf``: their values and bytes used.

    Vectorized ``decode_varint``; ``ValueError`` for one longer than 10 bytes or
    beyond 64 bits. A varint cut off at the end of ``buf`` is left for the next read.
    """
    ends = np.flatnonzero(buf < 0x80)[:count]
    if not len(ends):
        if len(buf) >= 10:
            raise ValueError("overlong varint")
        return np.empty(0, dtype=np.uint64), 0
    used = int(ends[-1]) + 1
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    sizes = ends - starts + 1
    if sizes.max() > 10:
        raise ValueError("overlong varint")
    within = np.arange(used) - np.repeat(starts, sizes)  # each byte's place in its varint
    bits = buf[:used] & 0x7F
    if (bits[within == 9] > 1).any():
        raise ValueError("varint64 out of range")
    values = np.add.reduceat(bits.astype(np.uint64) << (7 * within).astype(np.uint64), starts)
    return values, used


def _encode_varints(values: np.ndarray) -> np.ndarray:
    """``encode_varint`` of every value, concatenated (vectorized)."""
    sizes = np.ones(len(values), dtype=np.int64)
    for k in range(1, 10):
        sizes += values >= np.uint64(1 << (7 * k))
    starts = np.cumsum(sizes) - sizes
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    for k in range(10):
        at = np.flatnonzero(sizes > k)
        if not len(at):
            break
        low = ((values[at] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        out[starts[at] + k] = low | ((sizes[at] > k + 1).astype(np.uint8) << 7)
    return out


def _lengths_crc(lengths: np.ndarray, endian: str, crc: int) -> int:
    """Carry a string tensor's CRC32C over its lengths: each as uint32 (uint64 when larger)."""
    if not len(lengths) or int(lengths.max()) <= 0xFFFFFFFF:
        return crc32c(lengths.astype(np.dtype("u4").newbyteorder(
            "<" if endian == "little" else ">")), crc)
    for length in lengths.tolist():
        crc = crc32c(length.to_bytes(4 if length <= 0xFFFFFFFF else 8, endian), crc)
    return crc


def _load_sync_file_range():
    """Linux's sync_file_range, to start writing dirty pages out early; None elsewhere."""
    try:
        import ctypes
        import ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        return fn
    except (OSError, AttributeError):
        return None


_SYNC_FILE_RANGE = _load_sync_file_range() if os.name == "posix" else None
_SYNC_FILE_RANGE_WRITE = 2
_WRITEBACK_STEP = 32 << 20


class _Shard:
    __slots__ = ("path", "file", "size", "flushed", "local")

    def __init__(self, path: str, exclusive: bool = True):
        store = storage_for(path)
        self.path = path
        self.local = store.local
        # A shard task may run twice (a cluster recomputing a result lost with its
        # worker): its file, unique to the run, is then rewritten from the start.
        mode = "xb" if exclusive else "wb"
        self.file = open(path, mode, buffering=1 << 20) if store.local else \
            store.open_writer(path)
        self.size = 0
        self.flushed = 0  # bytes handed to the disk so far

    def sync(self, durable: bool) -> None:
        if self.file is None:  # written and closed elsewhere (commit_shards)
            return
        self.file.flush()
        if durable and self.local:
            os.fsync(self.file.fileno())
        self.file.close()

    def start_writeback(self) -> None:
        """Let the disk work while we compute, so the final fsync has little left to wait for."""
        if not self.local or _SYNC_FILE_RANGE is None or \
                self.size - self.flushed < _WRITEBACK_STEP:
            return
        self.file.flush()
        _SYNC_FILE_RANGE(self.file.fileno(), self.flushed, self.size - self.flushed,
                         _SYNC_FILE_RANGE_WRITE)
        self.flushed = self.size


class BundleWriter:
    """Writes a checkpoint under ``prefix``, streaming, committed atomically.

    Tensors are written to temporary data files as they are added; on
    :meth:`finish` (or leaving the ``with`` block cleanly) the data files are
    renamed into place and the index is written last, so no reader ever sees a
    partial checkpoint. On an exception everything written is removed.

    With ``durable`` (the default) every file is fsync'ed before the index is
    renamed into place, so the checkpoint also survives a power cut; without it,
    a killed process still never leaves a partial checkpoint, but the operating
    system's crash may.

    Tensors go to the current shard, and a new shard is started when
    ``max_shard_bytes`` would be exceeded; passing ``shard=`` places a tensor in a
    given shard instead (to keep a source checkpoint's layout).

    >>> with BundleWriter("out/model") as w:
    ...     w.add("dense/kernel", np.ones((3, 4), np.float16))
    """

    def __init__(self, prefix, *, max_shard_bytes: int | None = None, overwrite: bool = False,
                 endianness: str = "little", durable: bool = True):
        if max_shard_bytes is not None and max_shard_bytes <= 0:
            raise ValueError("max_shard_bytes must be positive")
        self._setup(normalize(prefix), endianness, durable)
        self.max_shard_bytes = max_shard_bytes
        self.overwrite = overwrite
        if self._store.local:
            remove_stale_temporaries(self.prefix)
        index = paths.index_filename(self.prefix)
        if self._store.isfile(index) and not overwrite:
            raise CheckpointWriteError("a checkpoint already exists here (pass overwrite=True "
                                       "to replace it)", path=index)
        parent = os.path.dirname(self.prefix) if self._store.local else ""
        try:
            missing = parent
            while missing and not os.path.isdir(missing):
                self._created_dirs.append(missing)
                missing = os.path.dirname(missing)
            if parent:
                os.makedirs(parent, exist_ok=True)
            self._shard(0)
        except OSError as e:
            self.abort()
            raise CheckpointWriteError(f"cannot create data file: {e.strerror}",
                                       path=self._tmp_base) from None

    # -- shards

    def _shard(self, shard_id: int) -> _Shard:
        while len(self._shards) <= shard_id:
            self._shards.append(_Shard(f"{self._tmp_base}.data-{len(self._shards)}"))
        return self._shards[shard_id]

    def reserve_shards(self, count: int) -> None:
        """Make the output have at least ``count`` shards, even if some stay empty."""
        try:
            if count > 0:
                self._shard(count - 1)
        except OSError as e:
            raise CheckpointWriteError(f"cannot create data file: {e.strerror}",
                                       path=self._tmp_base) from None

    def _begin(self, nbytes: int, shard: int | None) -> int:
        """The shard that the next ``nbytes`` go to."""
        if shard is not None:
            if shard < 0:
                raise ValueError(f"negative shard id {shard}")
            try:
                self._shard(shard)
            except OSError as e:
                raise CheckpointWriteError(f"cannot create data file: {e.strerror}",
                                           path=self._tmp_base) from None
            return shard
        current = self._shards[self._current]
        if self.max_shard_bytes is not None and current.size > 0 \
                and current.size + nbytes > self.max_shard_bytes:
            self._current = len(self._shards)
            return self._begin(nbytes, self._current)
        return self._current

    def _setup(self, prefix: str, endianness: str, durable: bool) -> None:
        """The state every writer starts from (full checkpoint, one shard, or a commit)."""
        if endianness not in ("little", "big"):
            raise ValueError("endianness must be 'little' or 'big'")
        self.prefix = prefix
        self._store = storage_for(prefix)
        self.durable = durable
        self.endianness = endianness
        self.max_shard_bytes = None
        self.overwrite = True
        self._entries: dict[bytes, BundleEntryProto] = {}
        self._slices_of: dict[bytes, tuple[_dt.DType, tuple[int, ...]]] = {}
        self._tmp_base = f"{prefix}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        self._shards: list[_Shard] = []
        self._created_dirs: list[str] = []
        self._current = 0
        self._streaming = False
        self._done = False

    @classmethod
    def for_shard(cls, path: str, *, endianness: str = "little",
                  durable: bool = True) -> "BundleWriter":
        """A writer of one data shard at ``path`` (local file or URL), without an index.

        Used by tasks that each write one shard of a checkpoint; :meth:`finish_shard`
        returns the index entries, which :func:`commit_shards` merges into the index.
        """
        w = cls.__new__(cls)
        w._setup(path, endianness, durable)
        w._tmp_base = path
        try:
            if w._store.local and os.path.dirname(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
            w._shards.append(_Shard(path, exclusive=False))
        except OSError as e:
            raise CheckpointWriteError(f"cannot create data file: {e.strerror or e}",
                                       path=path) from None
        return w

    def finish_shard(self) -> dict[bytes, BundleEntryProto]:
        """Close the one shard of a :meth:`for_shard` writer; its index entries."""
        if self._streaming:
            self.abort()
            raise ValueError("a tensor stream was not closed")
        try:
            self._shards[0].sync(self.durable)
        except OSError as e:
            self.abort()
            raise CheckpointWriteError(f"write failed: {e.strerror or e}",
                                       path=self.prefix) from None
        self._done = True
        return self._entries

    def _write(self, shard_id: int, data) -> None:
        shard = self._shards[shard_id]
        try:
            shard.file.write(data)
            shard.size += len(memoryview(data).cast("B"))
            if self.durable:
                shard.start_writeback()
        except OSError as e:
            raise CheckpointWriteError(f"write failed: {e.strerror}", path=shard.path) from None

    # -- adding tensors

    def _check_open(self, key: bytes, name: str) -> None:
        if self._done:
            raise ValueError("the writer is finished")
        if self._streaming:
            raise ValueError("another tensor is being streamed")
        if not _encode_name(name):
            raise ValueError("invalid tensor name '': the empty key is the bundle header")
        if key in self._entries:
            raise ValueError(f"duplicate tensor name {name!r}")

    def _record(self, key: bytes, dtype: _dt.DType, shape: tuple[int, ...], shard_id: int,
                offset: int, size: int, crc: int) -> None:
        e = BundleEntryProto()
        e.dtype = dtype.enum
        e.shape.SetInParent()
        for d in shape:
            e.shape.dim.add().size = d
        e.shard_id = shard_id
        e.offset = offset
        e.size = size
        e.crc32c = mask_crc(crc)
        self._entries[key] = e

    def _add_bytes(self, key: bytes, dtype: _dt.DType, shape: tuple[int, ...], data,
                   crc: int, shard: int | None) -> None:
        size = len(data)
        shard_id = self._begin(size, shard)
        offset = self._shards[shard_id].size
        self._write(shard_id, data)
        self._record(key, dtype, shape, shard_id, offset, size, crc)

    def add(self, name: str, value, dtype=None, *, shard: int | None = None) -> None:
        """Add a whole tensor. ``dtype`` (a TensorFlow name) overrides the inferred one."""
        key = _encode_name(name)
        self._check_open(key, name)
        self._add(key, value, dtype, shard)

    def _add(self, key: bytes, value, dtype, shard: int | None) -> None:
        dt = _infer_dtype(value, dtype)
        if dt is _dt.STRING:
            arr = _as_string_array(value)
            data, crc = _encode_strings(arr, self.endianness)
            self._add_bytes(key, dt, arr.shape, data, crc, shard)
            return
        if dt.numpy is None:
            raise ValueError(f"{dt.name} tensors can only be added as raw bytes (add_raw)")
        arr = np.asarray(value, dtype=dt.numpy)
        with self._stream(key, dt, arr.shape, shard) as s:
            s.write(arr)

    def add_raw(self, name: str, dtype, shape, data, *, extents: Slice | None = None,
                full_shape=None, shard: int | None = None) -> None:
        """Add a tensor (or a slice, with ``extents`` and ``full_shape``) from its on-disk bytes.

        The bytes are written as they are and must already be in this writer's
        byte order; this is how dtypes without a numpy form (variant, resource)
        are carried through.
        """
        dt = _dt.lookup(dtype)
        shape = _shape_tuple(shape)
        data = memoryview(data).cast("B")
        if dt.itemsize is not None and len(data) != _num_elements(shape) * dt.itemsize:
            raise ValueError(f"{len(data)} bytes do not hold {list(shape)} of {dt.name}")
        if extents is not None:
            extents = tuple(extents)
            key = self._slice_key(name, dt, full_shape, extents, shape)
        else:
            key = _encode_name(name)
        self._check_open(key, name)
        if dt is _dt.STRING:
            crc = StringFraming(data.tobytes(), _num_elements(shape), self.endianness).crc
        elif dt is _VARIANT:
            framing = VariantFraming(data.tobytes(), _num_elements(shape), self.endianness)
            if framing.bad_element is not None:
                raise ValueError(f"variant element {framing.bad_element[0]} of {name!r} has a "
                                 "wrong checksum")
            crc = framing.crc
        else:
            crc = crc32c(data)
        self._add_bytes(key, dt, shape, data, crc, shard)
        if extents is not None:
            self._register_slice(name, dt, full_shape, extents)

    def add_slice(self, name: str, full_shape, extents: Sequence[Extent], value,
                  dtype=None, *, shard: int | None = None) -> None:
        """Add one slice of a partitioned tensor.

        ``extents`` has one ``(start, length)`` per axis; a length of None takes
        the whole axis. The slices of a tensor must not overlap; they may leave parts
        of it out (a pre-sliced tensor, which TensorFlow restores slice by slice).
        """
        full_shape = _shape_tuple(full_shape)
        extents = tuple((int(s), None if n is None else int(n)) for s, n in extents)
        dt = _infer_dtype(value, dtype)
        if _is_full_slice(full_shape, extents):
            return self.add(name, value, dt.name, shard=shard)
        slice_shape = _slice_shape(full_shape, extents)
        arr = _as_string_array(value) if dt is _dt.STRING else np.asarray(value, dtype=dt.numpy)
        if arr.shape != slice_shape:
            raise ValueError(f"slice {_format_slice(extents)} of {list(full_shape)} has shape "
                             f"{list(slice_shape)}, value has {list(arr.shape)}")
        key = self._slice_key(name, dt, full_shape, extents, slice_shape)
        self._check_open(key, name)
        self._add(key, arr, dt, shard)
        self._register_slice(name, dt, full_shape, extents)

    def stream_slice(self, name: str, dtype, full_shape, extents: Sequence[Extent], *,
                     shard: int | None = None) -> "_TensorStream":
        """Like :meth:`stream`, for one slice of a partitioned tensor."""
        dt = _dt.lookup(dtype)
        full_shape = _shape_tuple(full_shape)
        extents = tuple((int(s), None if n is None else int(n)) for s, n in extents)
        slice_shape = _slice_shape(full_shape, extents)
        key = self._slice_key(name, dt, full_shape, extents, slice_shape)
        self._check_open(key, name)
        if dt.numpy is None and dt is not _dt.STRING:
            raise ValueError(f"{dt.name} tensors cannot be streamed")
        stream = self._stream(key, dt, slice_shape, shard)
        stream.on_close = lambda: self._register_slice(name, dt, full_shape, extents)
        return stream

    def _slice_key(self, name: str, dt: _dt.DType, full_shape, extents: Slice,
                   slice_shape) -> bytes:
        full_shape = _shape_tuple(full_shape)
        if len(extents) != len(full_shape):
            raise ValueError(f"{len(extents)} extents for a tensor of rank {len(full_shape)}")
        for (start, length), d in zip(extents, full_shape):
            if start < 0 or (length is None and start != 0) \
                    or (length is not None and (length < 0 or start + length > d)):
                raise ValueError(f"slice {_format_slice(extents)} lies outside {list(full_shape)}")
        if tuple(slice_shape) != _slice_shape(full_shape, extents):
            raise ValueError(f"slice {_format_slice(extents)} has shape "
                             f"{list(_slice_shape(full_shape, extents))}, not {list(slice_shape)}")
        full_key = _encode_name(name)
        if full_key in self._entries and full_key not in self._slices_of:
            raise ValueError(f"duplicate tensor name {name!r}")
        known = self._slices_of.get(full_key)
        if known is not None and known != (dt, full_shape):
            raise ValueError(f"slices of {name!r} disagree: {known[0].name} {list(known[1])} vs "
                             f"{dt.name} {list(full_shape)}")
        return orderedcode.encode_slice_key(name, extents)

    def _register_slice(self, name: str, dt: _dt.DType, full_shape, extents: Slice) -> None:
        """Record a written slice on its full tensor's entry."""
        full_shape = _shape_tuple(full_shape)
        full_key = _encode_name(name)
        full = self._entries.get(full_key)
        if full is None:
            full = BundleEntryProto()
            full.dtype = dt.enum
            full.shape.SetInParent()
            for d in full_shape:
                full.shape.dim.add().size = d
            self._entries[full_key] = full
            self._slices_of[full_key] = (dt, full_shape)
        proto = full.slices.add()
        for start, length in extents:
            e = proto.extent.add()
            if length is not None:
                e.start = start
                e.length = length

    def stream(self, name: str, dtype, shape, *, shard: int | None = None) -> "_TensorStream":
        """Add a tensor chunk by chunk: ``with w.stream(...) as s: s.write(chunk)``.

        A ``string`` tensor is streamed as its format lays it out instead: every
        element's length (``s.write_lengths``), then the elements' bytes, cut
        anywhere (``s.write_data``), as :meth:`Checkpoint.iter_string_parts` yields them.
        """
        key = _encode_name(name)
        self._check_open(key, name)
        dt = _dt.lookup(dtype)
        if dt.numpy is None and dt is not _dt.STRING:
            raise ValueError(f"{dt.name} tensors cannot be streamed")
        return self._stream(key, dt, _shape_tuple(shape), shard)

    def _stream(self, key: bytes, dt: _dt.DType, shape: tuple[int, ...],
                shard: int | None) -> "_TensorStream":
        if dt is _dt.STRING:  # its size is known only at the end
            shard_id = self._begin(0, shard)
            self._streaming = True
            return _StringStream(self, key, shape, shard_id)
        size = _num_elements(shape) * dt.itemsize
        shard_id = self._begin(size, shard)
        self._streaming = True
        return _TensorStream(self, key, dt, shape, size, shard_id)

    # -- commit

    def __enter__(self) -> "BundleWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()

    def _close_files(self) -> None:
        for shard in self._shards:
            try:
                if hasattr(shard.file, "discard"):
                    shard.file.discard()  # an upload: closing it would store a part
                elif shard.file is not None:
                    shard.file.close()
            except (OSError, CheckpointError):
                pass

    def abort(self) -> None:
        """Discard everything written; nothing is left at the destination."""
        self._done = True
        self._close_files()
        for path in [s.path for s in self._shards] + [f"{self._tmp_base}.index"]:
            try:
                storage_for(path).remove(path)
            except (FileNotFoundError, OSError, CheckpointError):
                pass
        for directory in self._created_dirs:  # innermost first; only if still empty
            try:
                os.rmdir(directory)
            except OSError:
                break

    def finish(self) -> str:
        """Write the index and move everything into place; returns the prefix."""
        if self._done:
            raise ValueError("the writer is finished")
        if self._streaming:
            self.abort()
            raise ValueError("a tensor stream was not closed")
        try:
            return self._commit()
        except BaseException:
            self.abort()
            raise

    def _commit(self) -> str:
        for full_key, (dt, shape) in self._slices_of.items():
            slices = tuple(_slice_from_proto(s) for s in self._entries[full_key].slices)
            _check_slice_cover(slices, shape, lambda what: ValueError(
                f"partitioned tensor {_decode_name(full_key)!r}: {what}"))
        index = paths.index_filename(self.prefix)
        if not self._store.local:
            return self._commit_remote(index)
        old_shards = data_files(self.prefix)
        # Leftovers of killed runs, with no index, may be replaced by an overwriting
        # run; a run that may not replace anything links its files in, and a link
        # fails on any name already taken, so it picks names no file has.
        avoid = old_shards if os.path.exists(index) or not self.overwrite else []
        num_shards = free_shard_count(avoid, len(self._shards))
        self.reserve_shards(num_shards)
        index_tmp = f"{self._tmp_base}.index"
        try:
            for shard in self._shards:
                shard.sync(self.durable)
            write_index(index_tmp, self._entries, num_shards, self.endianness, self.durable)
        except OSError as e:
            raise CheckpointWriteError(f"write failed: {e.strerror}", path=self.prefix) from None
        finals = [paths.data_filename(self.prefix, i, num_shards) for i in range(num_shards)]
        placed: list[str] = []
        try:
            for shard, final in zip(self._shards, finals):
                self._place(shard.path, final, placed)
            self._place(index_tmp, index, placed)  # the commit: one atomic rename or link
        except BaseException as e:
            for path in placed:  # ours: a name taken meanwhile was never replaced
                try:
                    os.unlink(path)
                except OSError:
                    pass
            if isinstance(e, FileExistsError):
                raise CheckpointWriteError("another run wrote a checkpoint here meanwhile "
                                           "(pass overwrite to replace it)",
                                           path=e.filename or index) from None
            if isinstance(e, OSError):
                raise CheckpointWriteError(f"cannot move the checkpoint into place: "
                                           f"{e.strerror}", path=self.prefix) from None
            raise
        self._done = True
        if self.durable:
            _fsync_dir(os.path.dirname(self.prefix) or ".")
        remove_replaced_data(old_shards, finals)
        return self.prefix

    def _place(self, src: str, dst: str, placed: list[str]) -> None:
        """Rename ``src`` to ``dst``; without ``overwrite``, only if ``dst`` does not exist.

        A link fails on an existing name, where a rename would replace it: two runs
        writing to one destination cannot both succeed, and the loser's files are
        its own to remove.
        """
        if self.overwrite:
            os.replace(src, dst)
            return
        try:
            os.link(src, dst)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            if os.path.lexists(dst):  # no hard links here: check, then rename
                raise FileExistsError(errno.EEXIST, "exists", dst) from None
            os.replace(src, dst)
            placed.append(dst)
            return
        placed.append(dst)
        os.unlink(src)

    def _commit_remote(self, index: str) -> str:
        """On an object store: move the shards to names no committed index uses, publish
        the index in one request, then delete the data objects of the replaced one."""
        old_shards = data_files(self.prefix)
        num_shards = free_shard_count(old_shards, len(self._shards))
        self.reserve_shards(num_shards)
        finals = [paths.data_filename(self.prefix, i, num_shards) for i in range(num_shards)]
        try:
            for shard in self._shards:
                shard.sync(self.durable)
            for shard, final in zip(self._shards, finals):
                self._store.move(shard.path, final)
                shard.path = final  # from here on, abort removes it under this name
            write_index(index, self._entries, num_shards, self.endianness, self.durable)
        except OSError as e:
            raise CheckpointWriteError(f"write failed: {e.strerror or e}",
                                       path=self.prefix) from None
        self._done = True
        remove_replaced_data(old_shards, finals)
        return self.prefix


def write_index(path: str, entries: Mapping[bytes, BundleEntryProto], num_shards: int,
                endianness: str, durable: bool) -> None:
    """Write the index table: the header, then every entry in key order."""
    header = BundleHeaderProto()
    header.num_shards = num_shards
    header.endianness = 1 if endianness == "big" else 0
    header.version.producer = FORMAT_VERSION
    # Built whole in memory first (an index is small): then an interrupted run has
    # nothing to store, and an object store gets it in one request or not at all.
    buf = io.BytesIO()
    table = TableBuilder(buf)
    table.add(HEADER_KEY, header.SerializeToString())
    for key in sorted(entries):
        table.add(key, entries[key].SerializeToString())
    table.finish()
    store = storage_for(path)
    if not store.local:
        store.write_bytes(path, buf.getbuffer())
        return
    with open(path, "xb") as f:
        f.write(buf.getbuffer())
        f.flush()
        if durable:
            os.fsync(f.fileno())


def merge_entries(shards: Sequence[Mapping[bytes, BundleEntryProto]]) -> dict:
    """The index entries of shards written separately: shard ids set, slices joined.

    ``shards[k]`` are the entries :meth:`BundleWriter.finish_shard` returned for
    shard ``k``; a partitioned tensor's slices may be spread over several.
    """
    merged: dict[bytes, BundleEntryProto] = {}
    for shard_id, entries in enumerate(shards):
        for key, entry in entries.items():
            if entry.slices:  # a partitioned tensor's own entry: holds no bytes
                known = merged.get(key)
                if known is None:
                    known = merged[key] = BundleEntryProto()
                    known.CopyFrom(entry)
                    del known.slices[:]
                known.slices.extend(entry.slices)
                continue
            if key in merged:
                raise ValueError(f"tensor {_decode_name(key)!r} written to two shards")
            e = BundleEntryProto()
            e.CopyFrom(entry)
            e.shard_id = shard_id
            merged[key] = e
    return merged


def commit_shards(prefix: str, shard_paths: Sequence[str], entries: dict, *,
                  endianness: str = "little", durable: bool = True,
                  overwrite: bool = True) -> str:
    """Make shards written separately one checkpoint at ``prefix``: the index goes last.

    Locally, ``shard_paths`` are temporary files renamed into place before the index
    (with the same care for an overwritten checkpoint as :class:`BundleWriter`;
    without ``overwrite``, a checkpoint another run committed meanwhile is an error,
    never replaced); on an object store they already carry their final names (see
    :func:`free_shard_count`), writing the index is the commit, and the data
    objects of the checkpoint it replaced are deleted after it.
    """
    for key, entry in entries.items():
        if entry.slices:
            shape = tuple(d.size for d in entry.shape.dim)
            _check_slice_cover(tuple(_slice_from_proto(x) for x in entry.slices), shape,
                               lambda what: ValueError(
                                   f"partitioned tensor {_decode_name(key)!r}: {what}"))
    store = storage_for(prefix)
    num_shards = len(shard_paths)
    if not store.local:
        finals = [paths.data_filename(prefix, i, num_shards) for i in range(num_shards)]
        if list(shard_paths) != finals:
            raise ValueError("remote shards must be written under their final names")
        old_shards = data_files(prefix)
        write_index(paths.index_filename(prefix), entries, num_shards, endianness, durable)
        remove_replaced_data(old_shards, finals)
        return prefix
    w = BundleWriter.__new__(BundleWriter)
    w._setup(prefix, endianness, durable)
    w.overwrite = overwrite
    w._entries = entries
    if shard_paths:  # extra (empty) shards go beside the ones written
        w._tmp_base = shard_paths[0].rsplit(".data-", 1)[0]
    for path in shard_paths:
        shard = _Shard.__new__(_Shard)  # written and closed by its task already
        shard.path, shard.file, shard.size, shard.flushed, shard.local = path, None, 0, 0, True
        w._shards.append(shard)
    try:
        return w._commit()
    except BaseException:
        w.abort()
        raise


class _TensorStream:
    """Receives one fixed-size tensor's elements in row-major order."""

    def __init__(self, writer: BundleWriter, key: bytes, dtype: _dt.DType,
                 shape: tuple[int, ...], size: int, shard_id: int):
        self._w = writer
        self._key = key
        self.dtype = dtype
        self.shape = shape
        self._size = size
        self._shard_id = shard_id
        self._offset = writer._shards[shard_id].size
        self._written = 0
        self._crc = 0
        self._swap = writer.endianness != _NATIVE and dtype.swap_unit > 1
        self.on_close = None

    def write(self, chunk) -> None:
        arr = np.asarray(chunk)
        if arr.dtype != self.dtype.numpy:
            raise ValueError(f"chunk of {arr.dtype} written to a {self.dtype.name} tensor")
        data = np.ascontiguousarray(arr.reshape(-1)).view(np.uint8)
        if self._swap:
            data = data.view(np.dtype(f"u{self.dtype.swap_unit}")).byteswap().view(np.uint8)
        if self._written + data.nbytes > self._size:
            raise ValueError(f"more than the {self._size} bytes of shape {list(self.shape)} "
                             f"{self.dtype.name} written")
        self._w._write(self._shard_id, data)
        self._crc = crc32c(data, self._crc)
        self._written += data.nbytes

    def close(self) -> None:
        self._w._streaming = False
        if self._written != self._size:
            raise ValueError(f"{self._written} bytes written to a tensor of "
                             f"{self._size} bytes")
        self._w._record(self._key, self.dtype, self.shape, self._shard_id, self._offset,
                        self._size, self._crc)
        if self.on_close is not None:
            self.on_close()

    def __enter__(self) -> "_TensorStream":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._w._streaming = False
            self._w.abort()


class _StringStream(_TensorStream):
    """Receives one string tensor: every element's length, then the elements' bytes.

    Writes the framing and computes the checksums exactly as :func:`_encode_strings`.
    """

    def __init__(self, writer: BundleWriter, key: bytes, shape: tuple[int, ...],
                 shard_id: int):
        super().__init__(writer, key, _dt.STRING, shape, 0, shard_id)
        self._count = _num_elements(shape)
        self._lengths = 0   # lengths received
        self._expected = 0  # element bytes they add up to
        self._framed = False  # the lengths' checksum is written

    def write_lengths(self, lengths) -> None:
        arr = np.asarray(lengths)
        if arr.ndim != 1 or arr.dtype.kind not in "ui" or (arr.dtype.kind == "i" and len(arr)
                                                           and int(arr.min()) < 0):
            raise ValueError("lengths must be a 1-D array of non-negative integers")
        if self._framed or self._lengths + len(arr) > self._count:
            raise ValueError(f"more than the {self._count} lengths of shape {list(self.shape)}")
        arr = arr.astype(np.uint64, copy=False)
        self._put(_encode_varints(arr))
        self._crc = _lengths_crc(arr, self._w.endianness, self._crc)
        self._lengths += len(arr)
        self._expected += int(arr.sum())
        if self._lengths == self._count:
            self._end_lengths()

    def _end_lengths(self) -> None:
        check = mask_crc(self._crc).to_bytes(4, self._w.endianness)
        self._put(check)
        self._crc = crc32c(check, self._crc)
        self._framed = True

    def write_data(self, data) -> None:
        data = memoryview(data).cast("B")
        if not self._framed:
            if self._lengths != self._count:
                raise ValueError(f"element bytes after {self._lengths} of {self._count} lengths")
            self._end_lengths()
        if self._written + len(data) > self._expected:
            raise ValueError(f"more than the {self._expected} bytes the lengths add up to")
        self._put(data)
        self._crc = crc32c(data, self._crc)
        self._written += len(data)

    def write(self, chunk) -> None:
        raise ValueError("string tensors are streamed with write_lengths and write_data")

    def _put(self, data) -> None:
        self._w._write(self._shard_id, data)

    def close(self) -> None:
        self._w._streaming = False
        if not self._framed and self._lengths == self._count:
            self._end_lengths()
        if self._lengths != self._count or self._written != self._expected:
            raise ValueError(f"{self._lengths} of {self._count} lengths and {self._written} of "
                             f"{self._expected} element bytes written")
        size = self._w._shards[self._shard_id].size - self._offset
        self._w._record(self._key, self.dtype, self.shape, self._shard_id, self._offset, size,
                        self._crc)
        if self.on_close is not None:
            self.on_close()


def _infer_dtype(value, dtype) -> _dt.DType:
    if dtype is not None:
        return _dt.lookup(dtype)
    if isinstance(value, (bytes, str)):
        return _dt.STRING
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    if arr.dtype == object:
        return _dt.STRING
    return _dt.lookup(arr.dtype)


TMP_MARK = ".tfckpt-tmp-"


def remove_stale_temporaries(prefix: str) -> None:
    """Delete what a killed writer left at ``prefix`` (temporaries of processes now gone)."""
    directory = os.path.dirname(prefix) or "."
    start = os.path.basename(prefix) + TMP_MARK
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not name.startswith(start):
            continue
        pid = name[len(start):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _process_alive(int(pid)):
            continue
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def data_files(prefix: str) -> list[str]:
    """Every data file (or object) of ``prefix`` there is, whatever its shard count."""
    store = storage_for(prefix)
    directory = store.dirname(prefix) or "."
    base = store.basename(prefix)
    try:
        names = store.listdir(directory)
    except (OSError, CheckpointError):
        return []
    out = []
    for n in names:
        parsed = paths.parse_data_filename(n)
        if parsed and parsed[0] == base:
            out.append(store.join(store.dirname(prefix), n) if store.dirname(prefix) else n)
    return out


def free_shard_count(existing: Sequence[str], count: int) -> int:
    """The least shard count from ``count`` on that no file in ``existing`` was written for.

    Data file names follow from the prefix, the shard id and the shard count, so
    new data under another count can never replace a committed checkpoint's data
    before the new index replaces its own; the extra shards stay empty (TensorFlow
    reads such checkpoints as any other).
    """
    taken = {paths.parse_data_filename(f)[2] for f in existing}
    while count in taken:
        count += 1
    return count


def _file_name(path: str) -> str:
    return path.replace(os.sep, "/").rsplit("/", 1)[-1]


def remove_replaced_data(old: Sequence[str], keep: Sequence[str]) -> None:
    """After a commit: delete the data files the replaced checkpoint used (best effort)."""
    kept = {_file_name(k) for k in keep}
    for stale in old:
        if _file_name(stale) in kept:
            continue
        try:
            storage_for(stale).remove(stale)
        except (OSError, CheckpointError):
            pass


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save(tensors: Mapping[str, object], prefix, *, max_shard_bytes: int | None = None,
         overwrite: bool = False, endianness: str = "little", durable: bool = True) -> str:
    """Write ``{name: array}`` as a checkpoint that TensorFlow reads bit-for-bit.

    Arrays of numeric dtypes keep their dtype; object arrays of ``bytes`` (or
    ``bytes``/``str`` values) become string tensors. Tensors are written in
    name order, so the same input always gives the same bytes.

    >>> tfckpt.save({"w": np.zeros((2, 3), np.float16)}, "out/model")
    'out/model'
    """
    with BundleWriter(prefix, max_shard_bytes=max_shard_bytes, overwrite=overwrite,
                      endianness=endianness, durable=durable) as w:
        for name in sorted(tensors, key=_encode_name):
            w.add(name, tensors[name])
    return w.prefix
