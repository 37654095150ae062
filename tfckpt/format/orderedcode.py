"""Index keys: tensor names, and the OrderedCode keys of partitioned-tensor slices.

A whole tensor is stored under its name's bytes. A slice of tensor ``name`` is stored
under the key ``num(0) str(name) num(rank) [signed(start) signed(length or -1)] * rank``.
Such keys begin with a zero byte, so they sort before every plain tensor name.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfckpt.format.packed import PackedBytes

# Header bits of the first two bytes of a signed number of each encoded length.
_SIGNED_HEADER = [
    (0x00, 0x00),
    (0x80, 0x00),
    (0xC0, 0x00),
    (0xE0, 0x00),
    (0xF0, 0x00),
    (0xF8, 0x00),
    (0xFC, 0x00),
    (0xFE, 0x00),
    (0xFF, 0x00),
    (0xFF, 0x80),
    (0xFF, 0xC0),
]


def encode_num_increasing(value: int) -> bytes:
    """Unsigned number: a length byte, then the big-endian bytes without leading zeros."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"{value} is not a uint64")
    body = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return bytes([len(body)]) + body


def encode_signed_num_increasing(value: int) -> bytes:
    """Signed number: its length in unary in the leading bits, then two's complement."""
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"{value} is not an int64")
    magnitude = ~value if value < 0 else value
    # n bytes hold 7n - 1 bits of magnitude: one bit per byte of length, one of sign.
    length = 1
    while magnitude.bit_length() > 7 * length - 1:
        length += 1
    raw = bytearray(value.to_bytes(length, "big", signed=True))
    first, second = _SIGNED_HEADER[length]
    raw[0] ^= first
    if length > 1:
        raw[1] ^= second
    return bytes(raw)


def encode_string(value: bytes) -> bytes:
    """Bytes with 0x00 and 0xff escaped, then the terminator 00 01."""
    out = bytearray()
    for b in value:
        if b == 0x00:
            out += b"\x00\xff"
        elif b == 0xFF:
            out += b"\xff\x00"
        else:
            out.append(b)
    return bytes(out) + b"\x00\x01"


def decode_num_increasing(buf: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(buf):
        raise ValueError("truncated number")
    n = buf[pos]
    if n > 8 or pos + 1 + n > len(buf):
        raise ValueError("bad or truncated number")
    return int.from_bytes(buf[pos + 1 : pos + 1 + n], "big"), pos + 1 + n


def decode_signed_num_increasing(buf: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(buf):
        raise ValueError("truncated signed number")
    flip = 0xFF if buf[pos] < 0x80 else 0x00  # negative numbers have inverted headers
    # The length is the number of leading one bits of the (sign-normalised) header.
    head = ((buf[pos] ^ flip) << 8) | ((buf[pos + 1] ^ flip) if pos + 1 < len(buf) else 0)
    length = 0
    while length < 16 and head & (0x8000 >> length):
        length += 1
    if not 1 <= length <= 10:
        raise ValueError("bad signed number header")
    if pos + length > len(buf):
        raise ValueError("truncated signed number")
    raw = bytearray(buf[pos : pos + length])
    first, second = _SIGNED_HEADER[length]
    raw[0] ^= first
    if length > 1:
        raw[1] ^= second
    value = int.from_bytes(raw, "big", signed=True)
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError("signed number beyond int64")
    return value, pos + length


def decode_string(buf: bytes, pos: int) -> tuple[bytes, int]:
    out = bytearray()
    n = len(buf)
    while pos < n:
        b = buf[pos]
        if b == 0x00:
            if pos + 1 >= n:
                break
            nxt = buf[pos + 1]
            if nxt == 0x01:
                return bytes(out), pos + 2
            if nxt != 0xFF:
                raise ValueError("bad escape in string")
            out.append(0x00)
            pos += 2
        elif b == 0xFF:
            if pos + 1 >= n or buf[pos + 1] != 0x00:
                raise ValueError("bad escape in string")
            out.append(0xFF)
            pos += 2
        else:
            out.append(b)
            pos += 1
    raise ValueError("unterminated string")


def encode_name(name: str) -> bytes:
    """The bytes of a tensor name, inverse of :func:`decode_name`."""
    return name.encode("utf-8", errors="surrogateescape")


def decode_name(key: bytes) -> str:
    """A tensor name as ``str``.

    TensorFlow takes any bytes as a name; bytes that are not UTF-8 become the lone
    surrogates U+DC80..U+DCFF (Python's ``surrogateescape``), so every name round-trips.
    """
    return key.decode("utf-8", errors="surrogateescape")


def decode_names(keys: Sequence[bytes]) -> list[str]:
    """``decode_name`` of every key, decoded together."""
    if isinstance(keys, PackedBytes) and len(keys):
        # The buffer with a NUL put where each key after the first starts.
        starts, _ = keys.bounds()
        packed = np.frombuffer(keys.joined(), dtype=np.uint8)
        joined = np.insert(packed, starts[1:] - starts[0], 0).tobytes()
    else:
        joined = b"\0".join(keys)
    # Joined by a byte no key holds, keys decode as they do one by one: the byte
    # is a character of its own and ends any broken sequence before it.
    if joined.count(b"\0") != max(len(keys) - 1, 0):
        return [decode_name(k) for k in keys]
    return joined.decode("utf-8", errors="surrogateescape").split("\0") if keys else []


Extent = tuple[int, "int | None"]


def encode_slice_key(name: str, extents: Sequence[Extent]) -> bytes:
    """The index key of one slice; each extent is (start, length), length None = whole axis."""
    parts = [
        encode_num_increasing(0),
        encode_string(encode_name(name)),
        encode_num_increasing(len(extents)),
    ]
    for start, length in extents:
        parts.append(encode_signed_num_increasing(start))
        parts.append(encode_signed_num_increasing(-1 if length is None else length))
    return b"".join(parts)


def decode_slice_key(key: bytes) -> tuple[str, tuple[Extent, ...]]:
    """Inverse of :func:`encode_slice_key`; ``ValueError`` when ``key`` is not one."""
    zero, pos = decode_num_increasing(key, 0)
    if zero != 0:
        raise ValueError("not a slice key")
    name, pos = decode_string(key, pos)
    rank, pos = decode_num_increasing(key, pos)
    if rank > len(key):
        raise ValueError("slice rank exceeds key length")
    extents = []
    for _ in range(rank):
        start, pos = decode_signed_num_increasing(key, pos)
        length, pos = decode_signed_num_increasing(key, pos)
        extents.append((start, None if length == -1 else length))
    if pos != len(key):
        raise ValueError("trailing bytes after slice key")
    return decode_name(name), tuple(extents)
