"""safetensors and npz files: streaming writers and readers, encode next to decode.

Both writers take a file's whole table of contents up front (names, dtypes,
shapes: what a plan knows) and then the tensors' bytes in order, chunk by
chunk, so no tensor is ever held whole. The ``safetensors`` package has no such
streaming writer (``save_file`` takes every tensor in memory at once), hence
this one; the tests read what it writes with that package. Reading back is done
here too, from the header, with plain reads of byte ranges: the package's numpy
API cannot hand out bfloat16 or float8 tensors, nor a tensor in pieces.
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Literal

import numpy as np

from . import dtypes as _dt
from .errors import CorruptCheckpointError, UnsupportedCheckpointError

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

# ZipFile.open's mode for a member being added: the zip itself lives in a file
# that storage opened.
_NEW_MEMBER: Literal["w"] = "w"
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


@dataclass
class Entry:
    """One tensor of a file: name, tfckpt dtype name, shape, bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _dt.lookup(self.dtype).fixed_itemsize


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


def safetensors_header(entries: Sequence[Entry], metadata: Mapping[str, str]) -> bytes:
    """The header of a safetensors file holding ``entries`` in this order.

    Little-endian u64 length, then JSON padded with spaces to a multiple of 8
    (the alignment the reference implementation writes).
    """
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for e in entries:
        header[e.name] = {
            "dtype": SAFETENSORS_DTYPES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": [offset, offset + e.nbytes],
        }
        offset += e.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-(len(text) + 8) % 8)
    return struct.pack("<Q", len(text)) + text


class SafetensorsWriter:
    """Writes one safetensors file to ``file`` (anything with ``write``), streaming.

    The header comes first and says every offset, so tensors must then be written
    in the order given, each exactly as many bytes as its shape says.
    """

    def __init__(self, file, entries: Sequence[Entry], metadata: Mapping[str, str]):
        self._file = file
        self._entries = list(entries)
        self._next = 0
        self._left = 0
        file.write(safetensors_header(self._entries, metadata))

    def begin(self, name: str) -> None:
        if self._left:
            raise ValueError("the previous tensor is incomplete")
        e = self._entries[self._next]
        if e.name != name:
            raise ValueError(f"expected {e.name!r}, got {name!r}")
        self._next += 1
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


def read_safetensors_header(
    head: bytes, size: int, path: str
) -> tuple[int, list[tuple[Entry, int]], dict[str, str]]:
    """Parse a safetensors header: (data start, [(entry, data offset)], metadata).

    ``head`` holds at least the file's first 8 + header-length bytes;
    ``size`` is the file size, against which every offset is checked.
    """
    if len(head) < 8:
        raise CorruptCheckpointError("not a safetensors file: too short", path=path)
    (n,) = struct.unpack("<Q", head[:8])
    if 8 + n > size or 8 + n > len(head):
        raise CorruptCheckpointError("safetensors header runs past the end of the file", path=path)
    try:
        header = json.loads(head[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptCheckpointError(f"bad safetensors header: {e}", path=path) from None
    if not isinstance(header, dict):
        raise CorruptCheckpointError("bad safetensors header: not an object", path=path)
    metadata = header.pop("__metadata__", None) or {}
    start = 8 + n
    out = []
    for name, spec in header.items():
        try:
            dtype = _FROM_SAFETENSORS[spec["dtype"]]
            shape = tuple(int(d) for d in spec["shape"])
            begin, end = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CorruptCheckpointError(
                f"bad or unsupported safetensors entry for {name!r}: {spec!r}", path=path
            ) from None
        entry = Entry(name, dtype, shape)
        if min(shape, default=0) < 0 or end - begin != entry.nbytes or start + end > size:
            raise CorruptCheckpointError(
                f"safetensors entry {name!r}: offsets [{begin}, {end}) do not match its "
                f"shape {list(shape)} or lie past the end of the file",
                path=path,
            )
        out.append((entry, start + begin))
    out.sort(key=lambda x: x[1])
    return start, out, {str(k): str(v) for k, v in metadata.items()}


# -- npz


def _npy_header(e: Entry) -> bytes:
    import io

    d = {
        "descr": np.lib.format.dtype_to_descr(little_dtype(e.dtype)),
        "fortran_order": False,
        "shape": tuple(e.shape),
    }
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, d)
    except ValueError:  # a header over 64 KiB (a very long shape)
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue()


class NpzWriter:
    """Writes one .npz (an uncompressed zip of .npy members, as ``numpy.savez``) to
    ``file``, streaming each member; ZIP64 for members too big for plain zip."""

    def __init__(self, file, entries: Sequence[Entry]):
        self._zip = zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True)
        self._entries = {e.name: e for e in entries}
        self._member: IO[bytes] | None = None

    def begin(self, name: str) -> None:
        e = self._entries[name]
        header = _npy_header(e)
        # A fixed timestamp: the same tensors give the same bytes, on any machine.
        info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
        self._member = self._zip.open(
            info, _NEW_MEMBER, force_zip64=len(header) + e.nbytes > _ZIP64_LIMIT
        )
        self._member.write(header)

    def write(self, chunk: np.ndarray) -> None:
        assert self._member is not None
        self._member.write(_little(chunk).data)

    def end(self) -> None:
        assert self._member is not None
        self._member.close()
        self._member = None

    def close(self) -> None:
        self._zip.close()

    def abandon(self) -> None:
        """Give up after a failure: let go of the file without raising, leaving nothing
        for the zip's finalizer to write (its bytes are the caller's to remove)."""
        member, self._member = self._member, None
        for done in ((member.close,) if member is not None else ()) + (self._zip.close,):
            try:
                done()
            except (OSError, ValueError, RuntimeError):
                pass


def _read_npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


def npz_members(file, path: str) -> list[tuple[Entry, str, int | None]]:
    """The .npy members of the npz in ``file`` (a seekable binary file):
    (entry, member name, where its elements start in the file), in the zip's order.

    The start is known for members stored uncompressed (as ``numpy.savez``
    writes them): their elements can then be read by offset, in any order. It is
    None for compressed members, which are read from the start.
    """
    try:
        zf = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, OSError) as e:
        raise CorruptCheckpointError(f"not an npz file: {e}", path=path) from None
    out = []
    with zf:
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                continue
            name = info.filename[: -len(".npy")]
            with zf.open(info) as f:
                try:
                    shape, fortran, dt = _read_npy_header(f)
                except ValueError as e:
                    raise CorruptCheckpointError(
                        f"bad .npy member {info.filename!r}: {e}", path=path
                    ) from None
                npy_header = f.tell()
            if fortran or dt.hasobject or dt.name not in NPZ_DTYPES:
                raise CorruptCheckpointError(
                    f"npz member {name!r}: {'Fortran order' if fortran else dt} is not supported",
                    path=path,
                )
            if dt.byteorder == ">" or (dt.byteorder == "=" and not np.little_endian):
                # Members are read as little-endian elements, by offset or in pieces.
                raise UnsupportedCheckpointError(
                    f"npz member {name!r} is big-endian ({dt.str}); save it little-endian "
                    "(array.astype(array.dtype.newbyteorder('<'))) to import it",
                    path=path,
                )
            entry = Entry(name, dt.name, tuple(shape))
            start = None
            if info.compress_type == zipfile.ZIP_STORED:
                if info.file_size != npy_header + entry.nbytes:
                    raise CorruptCheckpointError(
                        f"npz member {name!r} holds {info.file_size} bytes, not the "
                        f"{npy_header + entry.nbytes} its header says",
                        path=path,
                    )
                # The local header: 30 bytes, then the name and extra field it gives lengths of.
                file.seek(info.header_offset)
                local = file.read(30)
                if len(local) != 30 or local[:4] != b"PK\x03\x04":
                    raise CorruptCheckpointError(
                        f"npz member {name!r}: bad local zip header", path=path
                    )
                n, m = struct.unpack("<HH", local[26:30])
                start = info.header_offset + 30 + n + m + npy_header
            out.append((entry, info.filename, start))
    return out


def npz_chunks(
    zf: zipfile.ZipFile, member: str, e: Entry, chunk_bytes: int
) -> Iterator[np.ndarray]:
    """A member's elements, in pieces of about ``chunk_bytes``."""
    dt = little_dtype(e.dtype)
    step = max(1, chunk_bytes // dt.itemsize) * dt.itemsize
    with zf.open(member) as f:
        _read_npy_header(f)
        left = e.nbytes
        while left:
            data = f.read(min(step, left))
            if not data or len(data) % dt.itemsize:
                raise CorruptCheckpointError(f"npz member {e.name!r} is truncated")
            left -= len(data)
            yield np.frombuffer(data, dtype=dt)
