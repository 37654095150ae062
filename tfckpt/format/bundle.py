"""The tensor bundle format's index: header, entries and what they say, every rule written once.

Header and version, index entries (built, parsed one by one or decoded in bulk, and
checked) and :class:`TensorInfo` / :class:`TensorTable`, what an entry says about a
tensor. Shapes and slices are :mod:`tfckpt.format.slices`; the framing of string and
variant tensors' bytes is :mod:`tfckpt.format.framing`. Readers and writers
(:mod:`tfckpt.checkpoint`) both use it, so encode sits next to decode; tensor names
become keys in :mod:`tfckpt.format.orderedcode`. Nothing here touches a file.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

import numpy as np
from google.protobuf.message import DecodeError

from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto, BundleHeaderProto, TensorSliceProto
from tfckpt.errors import CorruptCheckpointError, UnsupportedCheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.dtypes import Endianness
from tfckpt.format.packed import PackedBytes
from tfckpt.format.slices import Slice, num_elements
from tfckpt.format.table import mask_crc

HEADER_KEY = b""  # the header's key: no tensor name encodes to it
VARIANT = _dt.lookup("variant")
FORMAT_VERSION = 1  # the bundle version TensorFlow writes and reads
_MIN_PRODUCER = 0
MAX_RANK = 254
MAX_SHARDS = 1 << 20  # a header claiming more shards than this is not a real checkpoint
MAX_ELEMENTS = (1 << 63) - 1
NATIVE = _dt.NATIVE_ENDIANNESS  # the byte order of this machine's arrays


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
    endianness: Endianness
    version: Version


@dataclass(frozen=True, slots=True)  # one per tensor: 200 000 in a big index
class TensorInfo:
    """What the index says about one tensor (or one slice of a partitioned tensor).

    ``nbytes`` is the bytes it occupies in data shards (for a partitioned tensor,
    the sum over its slices). ``shard``, ``offset`` and ``crc32c`` (unmasked) are
    None for a partitioned tensor, whose bytes live in its slices.
    ``stored_elements`` is how many of its elements the checkpoint holds: fewer
    than ``size`` for a pre-sliced tensor, whose slices leave parts out on purpose.

    >>> info = tfckpt.open("train/model.ckpt-7").info("dense/kernel")
    >>> info.dtype, info.shape, info.nbytes, info.shard
    ('float32', (784, 10), 31360, 0)
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
        return num_elements(self.shape)

    @classmethod
    def whole(
        cls,
        name: str,
        dtype: str,
        shape: tuple[int, ...],
        nbytes: int,
        shard: int,
        offset: int,
        crc32c: int,
    ) -> TensorInfo:
        """The info of a whole (unpartitioned) tensor, built for an index's every entry.

        A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``;
        setting the slots directly takes a third of the time.
        """
        info = object.__new__(cls)
        s = _SLOT_SETTERS
        s[0](info, name)
        s[1](info, dtype)
        s[2](info, shape)
        s[3](info, nbytes)
        s[4](info, shard)
        s[5](info, offset)
        s[6](info, crc32c)
        s[7](info, ())
        s[8](info, None)
        s[9](info, math.prod(shape))
        return info


# The slots of TensorInfo's fields, in order: set directly, past the frozen check.
_INT_COLUMNS = ("nbytes", "shards", "offsets", "crc32c", "elements", "stored_elements")
_SLOT_SETTERS = [getattr(TensorInfo, f.name).__set__ for f in fields(TensorInfo)]


_NONE = -(1 << 63)  # how Ints stores None: no size, offset or checksum is this


class Ints(array):
    """A column of ints or None, 8 bytes a row (a list would hold an int object of 28
    bytes a row besides): what :class:`TensorTable` keeps sizes, offsets and checksums
    in. Reads like a list; None is stored as the least int64, which no field takes.

    >>> Ints([3, None]), list(Ints([3, None]))
    (Ints([3, None]), [3, None])
    """

    def __new__(cls, values: Iterable[int | None] = ()):
        return super().__new__(cls, "q", [_NONE if v is None else v for v in values])

    @classmethod
    def of_array(cls, values: np.ndarray) -> Ints:
        """The column of an integer array (no None in it)."""
        out = cls()
        out.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())
        return out

    def __reduce__(self):
        return (Ints, (list(self),))

    def values(self) -> np.ndarray:
        """The column as an int64 array (a view: None is the least int64)."""
        return np.frombuffer(self, dtype=np.int64)

    def total(self) -> int:
        """The sum of the ints (None counts as 0)."""
        v = self.values()
        return int(v[v != _NONE].sum())

    def __repr__(self) -> str:
        return f"Ints({list(self)})"

    def __getitem__(self, i):
        v = super().__getitem__(i)
        if isinstance(i, slice):
            return [None if x == _NONE else x for x in v]
        return None if v == _NONE else v

    def __setitem__(self, i, v) -> None:
        super().__setitem__(i, _NONE if v is None else v)

    def append(self, v: int | None) -> None:
        super().append(_NONE if v is None else v)

    def __contains__(self, v) -> bool:
        return super().__contains__(_NONE if v is None else v)

    def __iter__(self):
        if not super().__contains__(_NONE):
            return super().__iter__()
        return (None if x == _NONE else x for x in super().__iter__())

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (list, Ints)) else NotImplemented

    __hash__ = None


@dataclass
class TensorTable:
    """The :class:`TensorInfo` of many tensors as columns: lists of one length, a row each.

    What a listing of every tensor reads, without an object per tensor;
    ``info(i)`` is row ``i`` as a :class:`TensorInfo`.
    """

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    nbytes: Ints  # the int columns are Ints (any list given is made one)
    shards: Ints
    offsets: Ints
    crc32c: Ints
    slices: list[tuple[Slice, ...]]
    elements: Ints
    stored_elements: Ints

    def __post_init__(self):
        for name in _INT_COLUMNS:
            column = getattr(self, name)
            if not isinstance(column, Ints):
                setattr(self, name, Ints(column))

    def __len__(self) -> int:
        return len(self.names)

    def info(self, i: int) -> TensorInfo:
        """Row ``i`` as a :class:`TensorInfo`."""
        get = array.__getitem__  # the stored ints, None as _NONE (Ints' own reading is slower)
        shard, offset, crc = get(self.shards, i), get(self.offsets, i), get(self.crc32c, i)
        if (
            shard != _NONE
            and offset != _NONE
            and crc != _NONE
            and not self.slices[i]
            and get(self.stored_elements, i) == get(self.elements, i) != _NONE
        ):
            return TensorInfo.whole(
                self.names[i],
                self.dtypes[i],
                self.shapes[i],
                get(self.nbytes, i),
                shard,
                offset,
                crc,
            )
        return TensorInfo(
            self.names[i],
            self.dtypes[i],
            self.shapes[i],
            self.nbytes[i],
            self.shards[i],
            self.offsets[i],
            self.crc32c[i],
            self.slices[i],
            stored_elements=self.stored_elements[i],
        )

    def infos(self) -> dict[str, TensorInfo]:
        """Every row as a :class:`TensorInfo`, by name."""
        whole = TensorInfo.whole
        return {
            name: (
                whole(name, dtype, shape, nbytes, shard, offset, crc)
                if not slices and shard is not None and crc is not None
                else self.info(i)
            )
            for i, (name, dtype, shape, nbytes, shard, offset, crc, slices) in enumerate(
                zip(
                    self.names,
                    self.dtypes,
                    self.shapes,
                    self.nbytes,
                    self.shards,
                    self.offsets,
                    self.crc32c,
                    self.slices,
                )
            )
        }

    def set(self, i: int, info: TensorInfo) -> None:
        """Make row ``i`` describe ``info`` (the inverse of :meth:`info`)."""
        if self.stored_elements is self.elements:  # shared while every tensor is whole
            self.stored_elements = Ints.of_array(self.elements.values())
        self.names[i], self.dtypes[i], self.shapes[i] = info.name, info.dtype, info.shape
        self.nbytes[i], self.shards[i], self.offsets[i] = info.nbytes, info.shard, info.offset
        self.crc32c[i], self.slices[i], self.elements[i] = info.crc32c, info.slices, info.size
        self.stored_elements[i] = info.stored_elements

    def append(self, info: TensorInfo) -> None:
        """Add ``info`` as the last row."""
        if self.stored_elements is self.elements:
            self.stored_elements = Ints.of_array(self.elements.values())
        for column in fields(self):
            getattr(self, column.name).append(None)
        self.set(len(self.names) - 1, info)

    def take(self, rows: Sequence[int]) -> TensorTable:
        """A table of these ``rows``, in this order."""
        out = TensorTable.empty()
        for f in fields(self):
            column = getattr(self, f.name)
            if isinstance(column, Ints):  # taken as stored: None stays what it is
                at = np.asarray(rows, dtype=np.intp)
                setattr(out, f.name, Ints.of_array(np.frombuffer(column, np.int64)[at]))
            else:
                setattr(out, f.name, [column[i] for i in rows])
        return out

    def part(self, start: int, stop: int) -> TensorTable:
        """Rows ``start`` to ``stop`` (as a list slice takes them), as a table."""
        out = TensorTable.empty()
        for f in fields(self):
            column = getattr(self, f.name)
            if isinstance(column, Ints):  # taken as stored: None stays what it is
                setattr(out, f.name, Ints.of_array(column.values()[start:stop]))
            else:
                setattr(out, f.name, column[start:stop])
        return out

    @classmethod
    def of_columns(cls, columns: Iterable[list]) -> TensorTable:
        """A table of these columns, in the order of its fields (lists of ints made Ints)."""
        return cls(*columns)  # type: ignore[arg-type]  # __post_init__ makes them Ints

    @classmethod
    def empty(cls) -> TensorTable:
        """A table of no rows, to :meth:`append` to."""
        return cls([], [], [], Ints(), Ints(), Ints(), Ints(), [], Ints(), Ints())

    @classmethod
    def of(cls, infos: Sequence[TensorInfo]) -> TensorTable:
        return cls(
            [i.name for i in infos],
            [i.dtype for i in infos],
            [i.shape for i in infos],
            Ints(i.nbytes for i in infos),
            Ints(i.shard for i in infos),
            Ints(i.offset for i in infos),
            Ints(i.crc32c for i in infos),
            [i.slices for i in infos],
            Ints(i.size for i in infos),
            Ints(i.stored_elements for i in infos),
        )


# --- header ----------------------------------------------------------------


def encode_header(num_shards: int, endianness: Endianness) -> bytes:
    """The header entry's value: shard count, byte order, and the version written."""
    header = BundleHeaderProto()
    header.num_shards = num_shards
    header.endianness = BundleHeaderProto.BIG if endianness == "big" else BundleHeaderProto.LITTLE
    header.version.producer = FORMAT_VERSION
    return header.SerializeToString()


def decode_header(raw: bytes | None, path: str) -> Header:
    """The header entry's value parsed, refused unless this reader may read the bundle."""
    if raw is None:
        raise CorruptCheckpointError("index has no header entry (empty key)", path=path)
    try:
        h = BundleHeaderProto.FromString(raw)
    except DecodeError:
        raise CorruptCheckpointError("header entry is not a BundleHeaderProto", path=path) from None
    v = h.version
    if (
        v.producer < _MIN_PRODUCER
        or v.min_consumer > FORMAT_VERSION
        or FORMAT_VERSION in v.bad_consumers
    ):
        raise UnsupportedCheckpointError(
            f"bundle format version producer={v.producer} min_consumer={v.min_consumer} "
            f"bad_consumers={list(v.bad_consumers)} cannot be read by a version "
            f"{FORMAT_VERSION} reader",
            path=path,
        )
    if h.endianness not in (0, 1):
        raise CorruptCheckpointError(f"unknown endianness {h.endianness} in header", path=path)
    if not 1 <= h.num_shards <= MAX_SHARDS:
        raise CorruptCheckpointError(f"header declares {h.num_shards} data shards", path=path)
    return Header(
        h.num_shards,
        "big" if h.endianness == 1 else "little",
        Version(v.producer, v.min_consumer, tuple(v.bad_consumers)),
    )


# --- entries ---------------------------------------------------------------


def entry_proto(
    dtype: _dt.DType,
    shape: Sequence[int],
    shard_id: int = 0,
    offset: int = 0,
    size: int = 0,
    crc: int | None = None,
) -> BundleEntryProto:
    """The index entry of a tensor (``crc`` unmasked; None for a partitioned tensor's own)."""
    key = (dtype.enum, tuple(shape))
    template = _ENTRY_TEMPLATES.get(key)
    if template is None:
        template = BundleEntryProto()
        template.dtype = dtype.enum  # type: ignore[assignment]  # a DataType number
        template.shape.SetInParent()
        for d in shape:
            template.shape.dim.add().size = d
        if len(_ENTRY_TEMPLATES) < _MAX_ENTRY_TEMPLATES:
            _ENTRY_TEMPLATES[key] = template
    # Copying a whole message costs half of filling in its dtype and shape anew.
    e = BundleEntryProto()
    e.CopyFrom(template)
    if crc is not None:
        e.shard_id = shard_id
        e.offset = offset
        e.size = size
        e.crc32c = mask_crc(crc)
    return e


# Entries of one dtype and shape, of which checkpoints of many tensors hold many.
_ENTRY_TEMPLATES: dict[tuple[int, tuple[int, ...]], BundleEntryProto] = {}
_MAX_ENTRY_TEMPLATES = 4096


def add_slice(proto: BundleEntryProto, extents: Slice) -> None:
    """List one slice on a partitioned tensor's entry (a whole axis has no start or length)."""
    s = proto.slices.add()
    for start, length in extents:
        e = s.extent.add()
        if length is not None:
            e.start = start
            e.length = length


def slice_from_proto(proto: TensorSliceProto) -> Slice:
    """The extents a ``TensorSliceProto`` lists (the inverse of :func:`add_slice`)."""
    return tuple((e.start, e.length if e.HasField("length") else None) for e in proto.extent)


def parse_entry(raw: bytes) -> BundleEntryProto:
    """``DecodeError`` when ``raw`` is not an entry."""
    return BundleEntryProto.FromString(raw)


# --- entries in bulk ---------------------------------------------------------
#
# An index of many entries is decoded column by column: each step below reads one
# field of every entry at once. Only the encoding a whole tensor's entry has in
# practice is taken (fields in order, each at most once, no slices, no unknown
# field, no dimension name, rank up to BULK_MAX_RANK, values that need no sign or
# truncation rules); any other entry is left to ``parse_entry``, entry by entry.

BULK_MAX_RANK = 8
_TAG_DTYPE, _TAG_SHAPE, _TAG_SHARD, _TAG_OFFSET, _TAG_SIZE, _TAG_CRC = (
    0x08,  # field 1, varint
    0x12,  # field 2, length-delimited
    0x18,  # field 3, varint
    0x20,  # field 4, varint
    0x28,  # field 5, varint
    0x35,  # field 6, fixed32
)
_TAG_DIM, _TAG_DIM_SIZE = 0x12, 0x08  # TensorShapeProto.dim (field 2), Dim.size (field 1)


@dataclass(frozen=True)
class EntryColumns:
    """Index entries decoded together, one array per field, a row per entry.

    Rows where ``ok`` is False were not decoded (see ``decode_entries``): their values
    mean nothing. ``crc32c`` is as stored (masked); ``dims`` is padded with zeros past
    ``rank``.
    """

    ok: np.ndarray  # bool
    dtype: np.ndarray  # int64
    rank: np.ndarray  # int64
    dims: np.ndarray  # int64, (rows, BULK_MAX_RANK)
    shard_id: np.ndarray  # int64
    offset: np.ndarray  # int64
    size: np.ndarray  # int64
    crc32c: np.ndarray  # uint32


def decode_entries(values: Sequence[bytes]) -> EntryColumns:
    """Decode many serialized ``BundleEntryProto``s at once, as ``parse_entry`` would.

    A row is ``ok`` only when its bytes are in the common encoding described above;
    its fields are then exactly what ``parse_entry`` gives. Other rows (partitioned
    tensors, unusual or broken encodings) are for ``parse_entry``, which also says
    what is wrong with a broken one.

    It runs past 80 lines because every field is decoded in one pass over state the
    fields share (the joined bytes, each row's position and whether it is still in the
    common encoding), which the nested helpers advance in place; apart, each piece
    would have to hand all of it back and forth.
    """
    n = len(values)
    if isinstance(values, PackedBytes):
        pos, ends = values.bounds()
        pos, ends = pos - values.base, ends - values.base
        joined = values.joined()
    else:
        lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
        ends = np.cumsum(lengths)
        pos = ends - lengths
        joined = b"".join(values)
    # Reads run at most 10 bytes past any position inside the data: the zeros keep
    # them in bounds, and a row that reads past its own end is rejected.
    buf = np.frombuffer(joined + bytes(16), dtype=np.uint8)
    ok = np.ones(n, dtype=bool)

    def varint(at: np.ndarray, max_bytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Value, length and whether it fits in ``max_bytes``, of the varint at each ``at``."""
        value = np.zeros(n, dtype=np.uint64)
        used = np.zeros(n, dtype=np.int64)
        more = np.ones(n, dtype=bool)
        for k in range(max_bytes):
            b = buf[at + k]
            value |= np.where(more, b & 0x7F, 0).astype(np.uint64) << np.uint64(7 * k)
            used += more
            more &= b >= 0x80
            if not more.any():
                break
        return value, used, ~more

    def field(tag: int, max_bytes: int) -> np.ndarray:
        """An optional varint field with ``tag`` at ``pos``: its value (0 when absent)."""
        nonlocal pos
        here = ok & (pos < ends) & (buf[pos] == tag)
        if not here.any():
            return np.zeros(n, dtype=np.int64)
        value, used, fits = varint(pos + 1, max_bytes)
        ok[here & ~fits] = False
        # A varint that runs past its entry's end read the next entry's bytes.
        ok[here & (pos + 1 + used > ends)] = False
        pos = np.where(here, np.minimum(pos + 1 + used, ends), pos)
        return np.where(here, value, 0).astype(np.int64)

    # Enum and int32 fields: below 2**31 (negative ones take ten bytes); int64 fields:
    # below 2**63 (nine bytes at most), so no value needs a sign rule here.
    dtype = field(_TAG_DTYPE, 5)
    ok &= dtype < (1 << 31)

    rank = np.zeros(n, dtype=np.int64)
    dims = np.zeros((n, BULK_MAX_RANK), dtype=np.int64)
    here = ok & (pos < ends) & (buf[pos] == _TAG_SHAPE)
    if here.any():
        length, used, fits = varint(pos + 1, 5)
        ok &= ~here | fits
        shape_end = np.where(here, pos + 1 + used + length.astype(np.int64), pos)
        ok &= shape_end <= ends
        pos = np.where(here & ok, pos + 1 + used, pos)
        for r in range(BULK_MAX_RANK + 1):
            inside = ok & here & (pos < shape_end)
            if not inside.any():
                break
            if r == BULK_MAX_RANK:
                ok &= ~inside
                break
            # A dimension: tag, a one-byte length, then nothing (size 0) or its size.
            dim_len = buf[pos + 1].astype(np.int64)
            ok &= ~inside | ((buf[pos] == _TAG_DIM) & (dim_len < 0x80))
            sized = inside & ok & (dim_len > 0)
            ok &= ~sized | (buf[pos + 2] == _TAG_DIM_SIZE)
            value, used, fits = varint(pos + 3, 9)
            ok &= ~sized | (fits & (used + 1 == dim_len))
            dims[:, r] = np.where(sized & ok, value, 0).astype(np.int64)
            rank += inside
            pos = np.where(inside & ok, pos + 2 + dim_len, pos)
        ok &= ~here | (pos == shape_end)
        pos = np.where(here & ok, shape_end, pos)

    shard_id = field(_TAG_SHARD, 5)
    ok &= shard_id < (1 << 31)
    offset = field(_TAG_OFFSET, 9)
    size = field(_TAG_SIZE, 9)

    crc = np.zeros(n, dtype=np.uint32)
    here = ok & (pos < ends) & (buf[pos] == _TAG_CRC)
    if here.any():
        at = pos + 1
        word = (
            buf[at].astype(np.uint32)
            | buf[at + 1].astype(np.uint32) << 8
            | buf[at + 2].astype(np.uint32) << 16
            | buf[at + 3].astype(np.uint32) << 24
        )
        crc = np.where(here, word, 0).astype(np.uint32)
        pos = np.where(here, pos + 5, pos)
    ok &= pos == ends  # anything left: slices, another field, a repeat, or too short

    return EntryColumns(ok, dtype, rank, dims, shard_id, offset, size, crc)


def entry_shape(proto: BundleEntryProto) -> tuple[int, ...]:
    """The stored shape; ``ValueError`` saying why when no tensor can have it."""
    stored = proto.shape
    if stored.unknown_rank:
        raise ValueError("stored shape has unknown rank")
    dims = stored.dim
    # a vector's is the common shape: one look instead of a loop
    shape = (dims[0].size,) if len(dims) == 1 else tuple([d.size for d in dims])
    if len(shape) > MAX_RANK:
        raise ValueError(f"rank {len(shape)} exceeds {MAX_RANK}")
    if len(shape) > 1:  # of a scalar or a vector, the size checks below say it all
        if min(shape) < 0:
            raise ValueError(f"negative dimension in shape {list(shape)}")
        if math.prod(shape) > MAX_ELEMENTS:
            raise ValueError(f"shape {list(shape)} has more than 2**63-1 elements")
    elif shape and shape[0] < 0:
        raise ValueError(f"negative dimension in shape {list(shape)}")
    return shape


def check_entry_location(proto, dtype: _dt.DType, shape: tuple[int, ...], num_shards: int) -> None:
    """``ValueError`` unless a whole tensor's entry points at bytes that can hold it.

    ``proto`` is the entry or anything with its ``shard_id``, ``offset`` and ``size``.
    """
    shard_id, offset, size, itemsize = proto.shard_id, proto.offset, proto.size, dtype.itemsize
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard id {shard_id} outside the {num_shards} shards of the checkpoint")
    if offset < 0 or size < 0:
        raise ValueError(f"negative offset {offset} or size {size}")
    if itemsize is not None and size != math.prod(shape) * itemsize:
        raise ValueError(
            f"entry size {size} bytes does not match shape {list(shape)} of "
            f"{dtype.name} ({num_elements(shape) * itemsize} bytes)"
        )
