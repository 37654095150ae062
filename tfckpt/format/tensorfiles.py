"""safetensors and npz files: streaming writers and readers, encode next to decode.

Both writers take a file's whole table of contents up front (names, dtypes,
shapes: what a plan knows) and then the tensors' bytes in order, chunk by
chunk, so no tensor is ever held whole. The ``safetensors`` package has no such
streaming writer (``save_file`` takes every tensor in memory at once), hence
this one; the tests read what it writes with that package. Reading back is done
here too, from the header, with plain reads of byte ranges: the package's numpy
API cannot hand out bfloat16 or float8 tensors, nor a tensor in pieces.

It runs past 600 lines because both formats share one table of contents (:class:`Entry`),
one dtype table and one set of name rules, and each format's writer is kept next to the
reader that must parse exactly what it writes (and refuse what it must not).
"""

from __future__ import annotations

import array
import functools
import json
import lzma
import math
import struct
import zipfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tfckpt.errors import CorruptCheckpointError, UnsupportedCheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format import ziprecords as zips

SAFETENSORS, NPZ = "safetensors", "npz"
FORMATS = (SAFETENSORS, NPZ)

# tfckpt dtype name <-> safetensors dtype code (the formats' spelling).
SAFETENSORS_DTYPES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "int32": "I32",
    "uint32": "U32",
    "int64": "I64",
    "uint64": "U64",
    "float16": "F16",
    "bfloat16": "BF16",
    "float32": "F32",
    "float64": "F64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
_FROM_SAFETENSORS = {v: k for k, v in SAFETENSORS_DTYPES.items()}

# What numpy itself can load from a .npy member (no ml_dtypes extension types).
NPZ_DTYPES = frozenset(
    {
        "bool",
        "uint8",
        "int8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    }
)

# Above this a zip member needs ZIP64 sizes (zipfile refuses to grow past it otherwise).
_ZIP64_LIMIT = (1 << 31) - 1


def supports(fmt: str, dtype: str) -> bool:
    """Whether files of format ``fmt`` can hold tensors of tfckpt dtype ``dtype``."""
    return dtype in (SAFETENSORS_DTYPES if fmt == SAFETENSORS else NPZ_DTYPES)


def unstorable_name(fmt: str, name: str) -> str | None:
    """Why files of format ``fmt`` cannot hold a tensor named ``name`` so that it
    reads back as the same name; None when they can.

    Both formats spell names in UTF-8, which a name holding a byte that was not
    UTF-8 in the checkpoint (read as U+DC80-U+DCFF) has no spelling in. A
    safetensors header keeps ``__metadata__`` for itself. An npz member is a zip
    file name: zip readers cut it at a NUL, and a name climbing out of a directory
    (``..``) or starting at the root would be written outside it when unpacked.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "holds bytes that are not UTF-8, which a file name in the format cannot"
    if fmt == SAFETENSORS:
        return "is the safetensors header's own key" if name == "__metadata__" else None
    if "\0" in name:
        return "holds a NUL, at which zip readers cut member names"
    parts = name.replace("\\", "/").split("/")
    if parts[0] == "" and len(parts) > 1 or (len(parts[0]) > 1 and parts[0][1] == ":"):
        return "starts at the root, which unpacking the zip would write outside its directory"
    if ".." in parts:
        return "has a '..' part, which unpacking the zip would write outside its directory"
    return None


def may_be_unstorable(fmt: str, names: Sequence[str]) -> bool:
    """False when :func:`unstorable_name` finds nothing against any of ``names``: a test
    of all of them at once that may be True where every name is storable (then ask
    :func:`unstorable_name` of each)."""
    joined = "\n".join(names)
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:
        return True
    if fmt == SAFETENSORS:
        return "__metadata__" in joined
    joined = "\n" + joined.replace("\\", "/")
    return any(mark in joined for mark in ("\0", "..", ":", "\n/"))


@dataclass(slots=True)
class Entry:
    """One tensor of a file: name, tfckpt dtype name, shape, bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)


@functools.cache
def _itemsize(dtype: str) -> int:
    # Cached: asked once per tensor of a file's 200 000, of a handful of dtypes.
    return _dt.lookup(dtype).fixed_itemsize


def little_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of tfckpt dtype ``dtype`` in little-endian byte order."""
    dt = _dt.lookup(dtype).array_dtype
    return dt if np.little_endian or dt.itemsize == 1 else dt.newbyteorder("<")


def _little(chunk: np.ndarray) -> np.ndarray:
    """The chunk's bytes in little-endian order (both formats store little-endian)."""
    if chunk.dtype.byteorder == ">" or (chunk.dtype.byteorder == "=" and not np.little_endian):
        chunk = chunk.astype(chunk.dtype.newbyteorder("<"))
    return np.ascontiguousarray(chunk).reshape(-1).view(np.uint8)


# -- safetensors


def safetensors_header(entries: Sequence[Entry], metadata: Mapping[str, str]) -> list[bytes]:
    """The header of a safetensors file holding ``entries`` in this order, in pieces
    to write one after another (the first is the length).

    Little-endian u64 length, then JSON padded with spaces to a multiple of 8
    (the alignment the reference implementation writes).
    """
    # The text json.dumps gives the whole header as one dict (compact separators, keys
    # in order), made a tensor at a time (no dict per tensor for 200 000 of them) and
    # joined some thousands at a time: the header is held once, as those pieces.
    pieces = [b"{"]
    parts = ['"__metadata__":' + _compact(dict(metadata))] if metadata else []
    offset = 0
    shapes: dict[tuple[int, ...], str] = {}
    for e in entries:
        shape = shapes.get(e.shape)
        if shape is None:
            shape = shapes[e.shape] = _compact(list(e.shape))
        end = offset + e.nbytes
        parts.append(
            f'{encode_basestring(e.name)}:{{"dtype":"{SAFETENSORS_DTYPES[e.dtype]}",'
            f'"shape":{shape},"data_offsets":[{offset},{end}]}}'
        )
        offset = end
        if len(parts) == _HEADER_PART:
            pieces.append(((len(pieces) > 1) * "," + ",".join(parts)).encode("utf-8"))
            parts = []
    if parts:
        pieces.append(((len(pieces) > 1) * "," + ",".join(parts)).encode("utf-8"))
    size = sum(map(len, pieces)) + 1
    pieces.append(b"}" + b" " * (-(size + 8) % 8))
    return [struct.pack("<Q", size + len(pieces[-1]) - 1), *pieces]


_HEADER_PART = 4096  # tensors' header entries joined at a time


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# A name as json.dumps writes it with ensure_ascii=False (its C encoder, called directly).
encode_basestring = json.encoder.encode_basestring


def _next_entry(writer, name: str) -> Entry:
    """The entry a writer of a table of contents given up front writes next, which must
    be ``name``'s, once the previous tensor is complete (both writers' rule)."""
    if writer._left:
        raise ValueError("the previous tensor is incomplete")
    e = writer._entries[writer._next]
    if e.name != name:
        raise ValueError(f"expected {e.name!r}, got {name!r}")
    writer._next += 1
    return e


class SafetensorsWriter:
    """Writes one safetensors file to ``file`` (anything with ``write``), streaming.

    The header comes first and says every offset, so tensors must then be written
    in the order given, each exactly as many bytes as its shape says.
    """

    def __init__(self, file, entries: Sequence[Entry], metadata: Mapping[str, str]):
        self._file = file
        self._entries = entries
        self._next = 0
        self._left = 0
        for piece in safetensors_header(entries, metadata):
            file.write(piece)

    def begin(self, name: str) -> None:
        e = _next_entry(self, name)
        self._left = e.nbytes

    def write(self, chunk: np.ndarray) -> None:
        data = _little(chunk)
        if len(data) > self._left:
            raise ValueError("more bytes than the tensor holds")
        self._left -= len(data)
        self._file.write(data)

    def end(self) -> None:
        if self._left:
            raise ValueError("the tensor is incomplete")

    def close(self) -> None:
        if self._left or self._next != len(self._entries):
            raise ValueError("not every tensor was written")


# The safetensors package's limits and dtypes (its crate's ``MAX_HEADER_SIZE``,
# serde_json's nesting limit, and the bits per element of every dtype it knows, as of
# 0.8): a file is valid here exactly when that package can open it.
SAFETENSORS_HEADER_LIMIT = 100_000_000
_JSON_DEPTH_LIMIT = 127
_SAFETENSORS_BITS = {
    **{code: 8 for code in ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0")},
    **{code: 8 for code in ("F8_E4M3FNUZ", "F8_E5M2FNUZ")},
    **{code: 16 for code in ("I16", "U16", "F16", "BF16")},
    **{code: 32 for code in ("I32", "U32", "F32")},
    **{code: 64 for code in ("I64", "U64", "F64", "C64")},
    **{"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6},
}
_U64 = 1 << 64


class _Pairs(list):
    """A JSON object as its (key, value) pairs in order: duplicates kept, to be judged
    where the package would judge them."""


class _NotJson(ValueError):
    pass


def _no_constant(name: str):
    raise _NotJson(f"{name} is not JSON")


def _json_int(text: str):
    # serde_json reads ``-0`` and integers beyond 64 bits as floats, and refuses a
    # number beyond a float's range.
    if len(text) < 19 and text != "-0":  # within 64 bits either way: the common case
        return int(text)
    if text == "-0" or len(text) > 20 or not -(1 << 63) <= int(text) < _U64:
        return _json_float(text)
    return int(text)


def _json_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NotJson(f"number out of range: {text[:20]}")
    return value


class _Spec(tuple):
    """A header entry recognised as it is parsed: (dtype code, shape, begin, end). Held
    for every tensor until the header is checked, so smaller than its pairs."""


_SPEC_KEYS = frozenset({"dtype", "shape", "data_offsets"})
_SPEC_ORDER = ("dtype", "shape", "data_offsets")
_DTYPE_CODES = {code: code for code in _SAFETENSORS_BITS}


def _json_object(pairs: list):
    """An object as :class:`_Pairs`, or a well-formed tensor entry as a :class:`_Spec`
    (its shape one tuple for every entry of that shape)."""
    if len(pairs) != 3:
        return _Pairs(pairs)
    (k0, dtype), (k1, shape), (k2, offsets) = pairs
    if (k0, k1, k2) != _SPEC_ORDER:  # the order writers use; any other is checked too
        if {k0, k1, k2} != _SPEC_KEYS:
            return _Pairs(pairs)
        fields = dict(pairs)
        dtype, shape, offsets = fields["dtype"], fields["shape"], fields["data_offsets"]
    if (
        type(dtype) is str
        and dtype in _DTYPE_CODES
        and type(shape) is list
        and type(offsets) is list
        and len(offsets) == 2
        and _u64(offsets[0])
        and _u64(offsets[1])
        and all(_u64(d) for d in shape)
    ):
        dims = tuple(shape)
        dims = _SHAPES.setdefault(dims, dims) if len(_SHAPES) < 4096 else dims
        return _Spec((_DTYPE_CODES[dtype], dims, offsets[0], offsets[1]))
    return _Pairs(pairs)


# Shapes met in headers: 200 000 small tensors share a few (a tuple each is 56 bytes).
_SHAPES: dict[tuple[int, ...], tuple[int, ...]] = {}


_DECODER = json.JSONDecoder(
    object_pairs_hook=_json_object,
    parse_constant=_no_constant,
    parse_int=_json_int,
    parse_float=_json_float,
)


def parse_json(data, path: str, what: str):
    """JSON from UTF-8 bytes as serde_json (which safetensors uses) reads it: objects as
    :class:`_Pairs`, no NaN, no lone surrogate, at most 127 levels of nesting."""
    try:
        text = str(data, "utf-8")
    except UnicodeDecodeError as e:
        raise CorruptCheckpointError(f"{what} is not UTF-8: {e.reason}", path=path) from None
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise CorruptCheckpointError(f"{what} nests too deeply", path=path) from None
    except ValueError as e:
        raise CorruptCheckpointError(f"{what} is not valid JSON: {e}", path=path) from None
    del text
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    raise CorruptCheckpointError(
                        f"{what} holds a lone surrogate", path=path
                    ) from None
        elif isinstance(v, _Spec):
            if depth + 1 > _JSON_DEPTH_LIMIT:  # its shape and offsets are arrays in it
                raise CorruptCheckpointError(f"{what} nests too deeply", path=path)
        elif isinstance(v, list):
            if depth > _JSON_DEPTH_LIMIT:
                raise CorruptCheckpointError(f"{what} nests too deeply", path=path)
            if isinstance(v, _Pairs):
                stack.extend((k, depth) for k, _ in v)
                stack.extend((x, depth + 1) for _, x in v)
            else:
                stack.extend((x, depth + 1) for x in v)
    return value


def safetensors_header_size(first: bytes | bytearray, size: int, path: str) -> int:
    """The header length a safetensors file's first 8 bytes give, checked against the
    package's limit and the file's ``size``."""
    if size < 8 or len(first) < 8:
        raise CorruptCheckpointError("not a safetensors file: shorter than 8 bytes", path=path)
    n = int.from_bytes(first[:8], "little")
    if n > SAFETENSORS_HEADER_LIMIT:
        raise CorruptCheckpointError(
            f"safetensors header of {n} bytes is over the limit of {SAFETENSORS_HEADER_LIMIT}",
            path=path,
        )
    if 8 + n > size:
        raise CorruptCheckpointError("safetensors header runs past the end of the file", path=path)
    return n


def _u64(value) -> bool:
    return type(value) is int and 0 <= value < _U64


def _tensor_spec(name: str, spec, path: str) -> tuple[str, Sequence[int], tuple[int, int]]:
    """(dtype code, shape, data offsets) of one header entry, typed as the package types it."""
    if isinstance(spec, _Spec):
        return spec[0], spec[1], (spec[2], spec[3])
    fields: dict = {}
    if isinstance(spec, _Pairs):
        for key, value in spec:
            if key not in _SPEC_KEYS:
                continue  # ignored, as the package ignores fields it does not know
            if key in fields:
                raise CorruptCheckpointError(
                    f"safetensors entry gives {key!r} twice", path=path, tensor=name
                )
            fields[key] = value
    dtype, shape, offsets = (fields.get(k) for k in ("dtype", "shape", "data_offsets"))
    if (
        dtype not in _SAFETENSORS_BITS
        or type(shape) is not list
        or not all(_u64(d) for d in shape)
        or type(offsets) is not list
        or len(offsets) != 2
        or not all(_u64(x) for x in offsets)
    ):
        shown = json.dumps(fields, default=str)[:200] if fields else repr(spec)[:200]
        raise CorruptCheckpointError(f"bad safetensors entry: {shown}", path=path, tensor=name)
    return dtype, shape, (offsets[0], offsets[1])


def _header_fields(header, path: str) -> tuple[dict, dict[str, str]]:
    """The tensors ({name: spec}, the last of a repeated name) and the metadata of a
    parsed header."""
    if not isinstance(header, _Pairs):
        raise CorruptCheckpointError("bad safetensors header: not a JSON object", path=path)
    tensors: dict = {}
    metadata: dict[str, str] | None = None
    seen_metadata = False
    for key, value in header:
        if key != "__metadata__":
            tensors[key] = _tensor_spec(key, value, path)
            continue
        if seen_metadata:
            raise CorruptCheckpointError("safetensors header gives __metadata__ twice", path=path)
        seen_metadata = True
        if value is None:
            continue
        if not isinstance(value, _Pairs) or not all(isinstance(v, str) for _, v in value):
            raise CorruptCheckpointError(
                "safetensors __metadata__ must map names to strings", path=path
            )
        metadata = dict(value)
    return tensors, metadata or {}


def parse_safetensors_header(
    text, n: int, size: int, path: str
) -> tuple[int, list[tuple[Entry, int]], dict[str, str]]:
    """Parse and validate the ``n`` header bytes ``text`` of a safetensors file of
    ``size`` bytes: (data start, [(entry, where its bytes start)] in file order,
    metadata). Refused exactly when the ``safetensors`` package refuses the file:
    tensors must tile the data from its start to the file's end, in offset order,
    each as long as its dtype and shape say."""
    tensors, metadata = _header_fields(parse_json(text, path, "safetensors header"), path)
    ordered = sorted(tensors.items(), key=lambda kv: kv[1][2])
    end = 0
    for name, (code, shape, (begin, stop)) in ordered:
        if begin != end or stop < begin:
            raise CorruptCheckpointError(
                f"safetensors offsets [{begin}, {stop}) leave a gap or "
                f"overlap (the previous tensor ends at {end})",
                path=path,
                tensor=name,
            )
        end = stop
        count = 1
        for d in shape:
            count *= d
        bits = count * _SAFETENSORS_BITS[code]
        if count >= _U64 or bits >= _U64 or bits % 8 or stop - begin != bits // 8:
            raise CorruptCheckpointError(
                f"safetensors offsets [{begin}, {stop}) do not match the tensor's "
                f"shape {list(shape)} of {code}",
                path=path,
                tensor=name,
            )
    start = 8 + n
    if start + end != size:
        raise CorruptCheckpointError(
            f"safetensors data is {size - start} bytes, but its tensors cover {end}",
            path=path,
        )
    out = []
    for name, (code, shape, (begin, _)) in ordered:
        if code not in _FROM_SAFETENSORS:
            raise UnsupportedCheckpointError(
                f"safetensors dtype {code} is not one tfckpt can import",
                path=path,
                tensor=name,
            )
        out.append((Entry(name, _FROM_SAFETENSORS[code], tuple(shape)), start + begin))
    return start, out, metadata


def read_safetensors_header(
    head: bytes, size: int, path: str
) -> tuple[int, list[tuple[Entry, int]], dict[str, str]]:
    """Parse a safetensors header: (data start, [(entry, data offset)], metadata).

    ``head`` holds at least the file's first 8 + header-length bytes;
    ``size`` is the file size, against which every offset is checked.
    """
    n = safetensors_header_size(head, size, path)
    if len(head) < 8 + n:
        raise CorruptCheckpointError("safetensors header runs past the end of the file", path=path)
    return parse_safetensors_header(memoryview(head)[8 : 8 + n], n, size, path)


def safetensors_index_shards(data, path: str) -> list[str]:
    """The shard file names a ``*.safetensors.index.json`` names, in first-use order:
    each a plain file name (they lie beside the index, on its storage)."""
    index = parse_json(data, path, "safetensors index")
    fields = dict(index) if isinstance(index, _Pairs) else None
    weight_map = None if fields is None else fields.get("weight_map")
    if not isinstance(weight_map, _Pairs):
        raise CorruptCheckpointError(
            "bad safetensors index: not an object with a weight_map object", path=path
        )
    metadata = fields.get("metadata") if fields is not None else None
    if metadata is not None and not isinstance(metadata, _Pairs):
        raise CorruptCheckpointError("bad safetensors index: metadata is not an object", path=path)
    shards: dict[str, None] = {}
    for tensor, name in dict(weight_map).items():
        if not plain_file_name(name):
            raise CorruptCheckpointError(
                f"safetensors index maps {tensor!r} to {str(name)[:200]!r}, not a file name "
                "beside the index",
                path=path,
                tensor=tensor,
            )
        shards.setdefault(name, None)
    return list(shards)


def plain_file_name(name) -> bool:
    """Whether ``name`` names a file in the directory it is read against and nowhere
    else: no separator, drive or scheme, not ``.`` or ``..``, no NUL."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\:\0")
    )


# -- npz


# Many small tensors share a dtype and a shape: their headers are made once.
@functools.lru_cache(maxsize=1024)
def _npy_header_of(dtype: str, shape: tuple[int, ...]) -> bytes:
    import io

    d = {
        "descr": np.lib.format.dtype_to_descr(little_dtype(dtype)),
        "fortran_order": False,
        "shape": shape,
    }
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, d)
    except ValueError:  # a header over 64 KiB (a very long shape)
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue()


@functools.lru_cache(maxsize=1024)
def _npy_member(dtype: str, shape: tuple[int, ...]) -> tuple[bytes, int, int]:
    """A member's .npy header, the header's CRC-32 and the bytes of its elements."""
    header = _npy_header_of(dtype, shape)
    return header, zlib.crc32(header), math.prod(shape) * _dt.lookup(dtype).fixed_itemsize


# Members up to this size are gathered whole before they are handed on, so that their
# local header goes out with its CRC-32; bigger ones stream, their CRC-32 written back
# after them (or, on a file that cannot seek, given in a data descriptor).
_GATHERED = 1 << 20


_CENTRAL_PART = 8192  # members whose central directory records are made at a time


class NpzWriter:
    """Writes one .npz (an uncompressed zip of .npy members, as ``numpy.savez``) to
    ``file``, streaming, the tensors in the order of ``entries``; ZIP64 records for
    members too big for plain zip, and where offsets or the member count need them.

    The bytes are those :mod:`zipfile` writes for the same members, made in bulk
    (:mod:`tfckpt.format.ziprecords`); per member only its offset, size and CRC-32 are
    kept until the central directory is written.
    """

    def __init__(self, file, entries: Sequence[Entry], *, names: Sequence[str] | None = None):
        self._file = file
        self._entries = entries
        self._names = names  # the entries' names, where the caller has them as a column
        self._next = 0
        # As zipfile decides: a file that cannot tell or seek gets data descriptors.
        try:
            self._pos = file.tell()
        except (AttributeError, OSError):
            self._pos, self._seekable = 0, False
        else:
            try:
                file.seek(self._pos)
                self._seekable = True
            except (AttributeError, OSError):
                self._seekable = False
        self._out = bytearray()  # bytes not yet handed to the file
        self._offsets = array.array("Q")
        self._sizes = array.array("Q")
        self._crcs = array.array("I")
        self._zip64 = bytearray()  # 1 where a member's local header is in ZIP64 form
        self._left = 0  # bytes of the open member still to come
        self._crc = 0
        self._gathered: int | None = None  # where the open member's header is in _out

    def begin(self, name: str) -> None:
        e = _next_entry(self, name)
        header, self._crc, nbytes = _npy_member(e.dtype, tuple(e.shape))
        size = len(header) + nbytes
        zip64 = size > _ZIP64_LIMIT
        if len(self._out) >= _GATHERED:
            self._flush()
        self._offsets.append(self._pos + len(self._out))
        self._sizes.append(size)
        self._zip64.append(zip64)
        self._left = nbytes
        gathered = self._seekable and size <= _GATHERED
        self._gathered = len(self._out) if gathered else None
        self._out += zips.local_header(name + ".npy", size, 0, zip64, not self._seekable)
        self._out += header

    def write(self, chunk: np.ndarray) -> None:
        data = _little(chunk).data  # a memoryview: bytearray's += must not meet numpy's +
        if len(data) > self._left:
            raise ValueError("more bytes than the tensor holds")
        self._left -= len(data)
        self._crc = zlib.crc32(data, self._crc)
        if self._gathered is not None:
            self._out += data
        elif len(data) >= 65536:  # a big member's piece: handed on as it is
            self._flush()
            self._file.write(data)
            self._pos += len(data)
        else:  # small pieces of a big member, or of any on a file that cannot seek
            self._out += data
            if len(self._out) >= _GATHERED:
                self._flush()

    def end(self) -> None:
        if self._left:
            raise ValueError("the tensor is incomplete")
        crc = self._crc
        self._crcs.append(crc)
        if self._gathered is not None:
            struct.pack_into("<L", self._out, self._gathered + zips.CRC_AT, crc)
        elif self._seekable:  # a big member: its CRC-32 written back
            self._flush()
            self._file.seek(self._offsets[-1] + zips.CRC_AT)
            self._file.write(struct.pack("<L", crc))
            self._file.seek(self._pos)
        else:
            self._out += zips.data_descriptor(self._sizes[-1], crc, bool(self._zip64[-1]))
        self._gathered = None

    def write_whole(self, names: Sequence[str], arrays: Sequence[np.ndarray]) -> None:
        """``begin``, ``write`` and ``end`` of each of several whole tensors, in one call:
        small members (gathered whole, on a file that can seek) without a call each."""
        if not self._seekable or self._left:
            for name, chunk in zip(names, arrays):
                self.begin(name)
                self.write(chunk)
                self.end()
            return
        entries, out, crc32 = self._entries, self._out, zlib.crc32
        offsets, sizes, crcs, zip64s = self._offsets, self._sizes, self._crcs, self._zip64
        local_header = zips.local_header
        for name, chunk in zip(names, arrays):
            e = entries[self._next]
            if e.name != name:
                raise ValueError(f"expected {e.name!r}, got {name!r}")
            header, crc, nbytes = _npy_member(e.dtype, tuple(e.shape))
            data = _little(chunk).data
            size = len(header) + nbytes
            if size > min(_GATHERED, _ZIP64_LIMIT) or len(data) != nbytes:  # the general way
                self.begin(name)
                self.write(chunk)
                self.end()
                out = self._out
                continue
            self._next += 1
            if len(out) >= _GATHERED:
                self._flush()
                out = self._out
            crc = crc32(data, crc)
            offsets.append(self._pos + len(out))
            sizes.append(size)
            zip64s.append(0)
            crcs.append(crc)
            out += local_header(name + ".npy", size, crc, False, False)
            out += header
            out += data

    def close(self) -> None:
        """Write the central directory and the end records (every tensor written)."""
        if self._left or self._next != len(self._entries):
            raise ValueError("not every tensor was written")
        self._flush()
        start = self._pos
        descriptor = not self._seekable
        sizes, offsets = (
            np.frombuffer(self._sizes, np.uint64),
            np.frombuffer(self._offsets, np.uint64),
        )
        crcs, zip64 = np.frombuffer(self._crcs, np.uint32), np.frombuffer(self._zip64, np.uint8)
        for i in range(0, len(self._entries), _CENTRAL_PART):
            part = slice(i, i + _CENTRAL_PART)
            given = self._names
            names = [
                n + ".npy"
                for n in (given[part] if given else (e.name for e in self._entries[part]))
            ]
            records = zips.central_records(
                names, sizes[part], offsets[part], crcs[part], zip64[part], descriptor
            )
            self._out += records
            self._flush()
        self._flush()
        self._out += zips.end_records(len(self._entries), start, self._pos - start)
        self._flush()

    def abandon(self) -> None:
        """Give up after a failure: nothing more is written (the file's bytes are the
        caller's to remove)."""
        self._out = bytearray()
        self._left = 0

    def _flush(self) -> None:
        if self._out:
            self._file.write(self._out)
            self._pos += len(self._out)
            self._out = bytearray()


def _read_npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


# What reading a damaged zip member raises: a bad CRC or stream, a method or an
# encryption zipfile cannot undo, a stream that ends early.
ZIP_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    EOFError,
    NotImplementedError,
    RuntimeError,
    ValueError,
)


def _member_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> tuple[Entry, int, int]:
    """A member's entry, the length of its .npy header (which with the elements must
    account for every byte the zip says the member inflates to) and the header's CRC-32."""
    name = info.filename[: -len(".npy")]
    try:
        with zf.open(info) as f:
            shape, fortran, dt = _read_npy_header(f)
            npy_header = f.tell()
        with zf.open(info) as f:
            header_crc = zlib.crc32(f.read(npy_header))
    except ZIP_ERRORS as e:
        raise CorruptCheckpointError(f"bad .npy member: {e}", path=path, tensor=name) from None
    if fortran or dt.hasobject or dt.name not in NPZ_DTYPES:
        raise CorruptCheckpointError(
            f"npz member: {'Fortran order' if fortran else dt} is not supported",
            path=path,
            tensor=name,
        )
    if dt.byteorder == ">" or (dt.byteorder == "=" and not np.little_endian):
        # Members are read as little-endian elements, by offset or in pieces.
        raise UnsupportedCheckpointError(
            f"npz member is big-endian ({dt.str}); save it little-endian "
            "(array.astype(array.dtype.newbyteorder('<'))) to import it",
            path=path,
            tensor=name,
        )
    if any(d < 0 for d in shape):  # numpy's read_array_header lets them through
        raise CorruptCheckpointError(
            f"npz member: negative dimension in shape {list(shape)[:8]}",
            path=path,
            tensor=name,
        )
    entry = Entry(name, dt.name, tuple(shape))
    # Never inflate more than the header declares: a member's zip size is that, exactly.
    if info.file_size != npy_header + entry.nbytes:
        raise CorruptCheckpointError(
            f"npz member holds {info.file_size} bytes, not the "
            f"{npy_header + entry.nbytes} its header says",
            path=path,
            tensor=name,
        )
    return entry, npy_header, header_crc


@dataclass
class NpzMember:
    """One .npy member of an npz: its tensor, its name in the zip, and for a member
    stored uncompressed where its elements start in the file and the CRC-32 its bytes
    must end at, starting from ``header_crc`` (that of its .npy header)."""

    entry: Entry
    member: str
    start: int | None
    header_crc: int
    crc: int


def npz_members(file, path: str) -> list[NpzMember]:
    """The .npy members of the npz in ``file`` (a seekable binary file), in the zip's order.

    The start is known for members stored uncompressed (as ``numpy.savez``
    writes them): their elements can then be read by offset, in any order. It is
    None for compressed members, which are read from the start. A member's name
    only ever names its tensor, never a path.
    """
    try:
        zf = zipfile.ZipFile(file)
    except ZIP_ERRORS as e:
        raise CorruptCheckpointError(f"not an npz file: {e}", path=path) from None
    out = []
    with zf:
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                continue
            entry, npy_header, header_crc = _member_entry(zf, info, path)
            start = None
            if info.compress_type == zipfile.ZIP_STORED:
                # The local header: 30 bytes, then the name and extra field it gives lengths of.
                file.seek(info.header_offset)
                local = file.read(30)
                if len(local) != 30 or local[:4] != b"PK\x03\x04":
                    raise CorruptCheckpointError(
                        "npz member: bad local zip header",
                        path=path,
                        tensor=entry.name,
                    )
                n, m = struct.unpack("<HH", local[26:30])
                start = info.header_offset + 30 + n + m + npy_header
            out.append(NpzMember(entry, info.filename, start, header_crc, info.CRC))
    return out


def npz_chunks(
    zf: zipfile.ZipFile, member: str, e: Entry, chunk_bytes: int, path: str | None = None
) -> Iterator[np.ndarray]:
    """A member's elements, in pieces of about ``chunk_bytes``, inflated no further
    than its header declares."""
    dt = little_dtype(e.dtype)
    step = max(1, chunk_bytes // dt.itemsize) * dt.itemsize
    try:
        with zf.open(member) as f:
            _read_npy_header(f)
            left = e.nbytes
            while left:
                data = f.read(min(step, left))
                if not data or len(data) % dt.itemsize:
                    raise CorruptCheckpointError(
                        "npz member is truncated", path=path, tensor=e.name
                    )
                left -= len(data)
                yield np.frombuffer(data, dtype=dt)
    except ZIP_ERRORS as err:
        raise CorruptCheckpointError(f"npz member: {err}", path=path, tensor=e.name) from None
