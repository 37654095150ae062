"""The records of a zip archive of stored members, byte for byte as :mod:`zipfile`
writes them for members with a fixed timestamp (1980-01-01 00:00) on a Unix system:
local headers, data descriptors, central directory records and the end records, each
in its ZIP64 form where its fields need it.

:class:`~tfckpt.format.tensorfiles.NpzWriter` makes them itself, in bulk, rather than
through :class:`zipfile.ZipFile`, whose cost per member (an info object kept, a local
header written, sought back to and written again) is most of an export's time at
200 000 small tensors. The tests compare these bytes with zipfile's.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from tfckpt.format.bulktable import copy_ranges

_LOCAL = struct.Struct("<4s2B4HL2L2H")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_END = struct.Struct("<4s4H2LH")
_END64 = struct.Struct("<4sQ2H2L4Q")
_END64_LOCATOR = struct.Struct("<4sLQL")
_DESCRIPTOR32, _DESCRIPTOR64 = struct.Struct("<LLLL"), struct.Struct("<LLQQ")
_DESCRIPTOR_SIGNATURE = 0x08074B50
CRC_AT = 14  # where in its local header a member's CRC-32 is
_DOS_DATE = 33  # 1980-01-01, the earliest date zip has: the same bytes on any day
_UTF8_NAME, _DESCRIPTOR = 0x800, 0x08
_STORED_VERSION, _ZIP64_VERSION = 20, 45
_UNIX, _MODE = 3, 0o600 << 16  # as zipfile records a member written from bytes
# What plain fields hold (zipfile's ZIP64_LIMIT and ZIP_FILECOUNT_LIMIT): past them the
# central directory and the end record take their ZIP64 forms.
ZIP32_MAX, _COUNT_MAX = (1 << 31) - 1, 0xFFFF


def _name_bytes(name: str) -> tuple[bytes, int]:
    if name.isascii():
        return name.encode("ascii"), 0
    return name.encode("utf-8"), _UTF8_NAME


def local_header(name: str, size: int, crc: int, zip64: bool, descriptor: bool) -> bytes:
    """The local header of a stored member of ``size`` bytes. ``zip64``: in its ZIP64
    form (zipfile's ``force_zip64``); ``descriptor``: CRC-32 and sizes zero, given in a
    data descriptor after the member (zipfile's way on a file it cannot seek)."""
    encoded, flags = _name_bytes(name)
    if descriptor:
        flags |= _DESCRIPTOR
        size = crc = 0
    extra = b""
    version = _STORED_VERSION
    if zip64:
        extra = struct.pack("<HHQQ", 1, 16, size, size)
        size, version = 0xFFFFFFFF, _ZIP64_VERSION
    head = _LOCAL.pack(
        b"PK\x03\x04", version, 0, flags, 0, 0, _DOS_DATE, crc, size, size, len(encoded), len(extra)
    )
    return head + encoded + extra


def data_descriptor(size: int, crc: int, zip64: bool) -> bytes:
    """What follows a member whose local header has ``descriptor``."""
    return (_DESCRIPTOR64 if zip64 else _DESCRIPTOR32).pack(_DESCRIPTOR_SIGNATURE, crc, size, size)


def central_record(
    name: str, size: int, offset: int, crc: int, zip64: bool, descriptor: bool
) -> bytes:
    """A stored member's central directory record (``zip64``, ``descriptor``: as its
    local header was written)."""
    encoded, flags = _name_bytes(name)
    if descriptor:
        flags |= _DESCRIPTOR
    wide = []
    if size > ZIP32_MAX:
        wide += [size, size]
        size = 0xFFFFFFFF
    if offset > ZIP32_MAX:
        wide.append(offset)
        offset = 0xFFFFFFFF
    extra = struct.pack("<HH" + "Q" * len(wide), 1, 8 * len(wide), *wide) if wide else b""
    version = _ZIP64_VERSION if zip64 or wide else _STORED_VERSION
    fields = (version, _UNIX, version, 0, flags, 0, 0, _DOS_DATE, crc, size, size)
    head = _CENTRAL.pack(b"PK\x01\x02", *fields, len(encoded), len(extra), 0, 0, 0, _MODE, offset)
    return head + encoded + extra


# A central directory record without its name, as numpy lays out _CENTRAL's fields.
_CENTRAL_ROW = np.dtype(
    [("signature", "S4"), ("made_by", "u1"), ("system", "u1"), ("needed", "u1"), ("pad", "u1")]
    + [(f, "<u2") for f in ("flags", "method", "time", "date")]
    + [(f, "<u4") for f in ("crc", "compressed", "size")]
    + [(f, "<u2") for f in ("name_length", "extra_length", "comment", "disk", "internal")]
    + [("external", "<u4"), ("offset", "<u4")]
)
assert _CENTRAL_ROW.itemsize == _CENTRAL.size


def central_records(
    names: Sequence[str],
    sizes: np.ndarray,
    offsets: np.ndarray,
    crcs: np.ndarray,
    zip64: np.ndarray,
    descriptor: bool,
) -> bytes:
    """The central directory records of many members, end to end: those of
    :func:`central_record` for each, made together where no field needs a ZIP64 extra."""
    sizes, offsets = np.asarray(sizes, np.uint64), np.asarray(offsets, np.uint64)
    zip64 = np.asarray(zip64, bool)
    n = len(names)
    if n == 0:
        return b""
    if (sizes > ZIP32_MAX).any() or (offsets > ZIP32_MAX).any():
        return b"".join(
            central_record(name, int(s), int(o), int(c), bool(z), descriptor)
            for name, s, o, c, z in zip(names, sizes, offsets, crcs, zip64)
        )
    encoded = [name.encode("utf-8") for name in names]
    lengths = np.fromiter(map(len, encoded), np.int64, n)
    ascii_ = lengths == np.fromiter(map(len, names), np.int64, n)
    rows = np.zeros(n, _CENTRAL_ROW)
    version = np.where(zip64, _ZIP64_VERSION, _STORED_VERSION)
    rows["signature"], rows["made_by"], rows["system"] = b"PK\x01\x02", version, _UNIX
    rows["needed"], rows["date"], rows["external"] = version, _DOS_DATE, _MODE
    rows["flags"] = np.where(ascii_, 0, _UTF8_NAME) | (_DESCRIPTOR if descriptor else 0)
    rows["crc"], rows["compressed"], rows["size"] = crcs, sizes, sizes
    rows["name_length"], rows["offset"] = lengths, offsets
    name_at = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    at = np.arange(n) * _CENTRAL.size + name_at
    out = np.empty(n * _CENTRAL.size + int(lengths.sum()), np.uint8)
    row_bytes = np.full(n, _CENTRAL.size)
    copy_ranges(out, at, rows.view(np.uint8), np.arange(n) * _CENTRAL.size, row_bytes)
    copy_ranges(
        out, at + _CENTRAL.size, np.frombuffer(b"".join(encoded), np.uint8), name_at, lengths
    )
    return out.tobytes()


def end_records(count: int, start: int, size: int) -> bytes:
    """The end of an archive whose central directory of ``count`` records is ``size``
    bytes at ``start``: its ZIP64 forms first where plain fields cannot hold these."""
    out = b""
    if count > _COUNT_MAX or start > ZIP32_MAX or size > ZIP32_MAX:
        out = _END64.pack(b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, size, start)
        out += _END64_LOCATOR.pack(b"PK\x06\x07", 0, start + size, 1)
        count, size, start = min(count, 0xFFFF), min(size, 0xFFFFFFFF), min(start, 0xFFFFFFFF)
    return out + _END.pack(b"PK\x05\x06", 0, 0, count, count, size, start, 0)
