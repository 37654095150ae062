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


def end_records(count: int, start: int, size: int) -> bytes:
    """The end of an archive whose central directory of ``count`` records is ``size``
    bytes at ``start``: its ZIP64 forms first where plain fields cannot hold these."""
    out = b""
    if count > _COUNT_MAX or start > ZIP32_MAX or size > ZIP32_MAX:
        out = _END64.pack(b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, size, start)
        out += _END64_LOCATOR.pack(b"PK\x06\x07", 0, start + size, 1)
        count, size, start = min(count, 0xFFFF), min(size, 0xFFFFFFFF), min(start, 0xFFFFFFFF)
    return out + _END.pack(b"PK\x05\x06", 0, 0, count, count, size, start, 0)
