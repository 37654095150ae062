"""The framing of string and variant tensors' bytes, encoded and parsed, with checksums.

A string tensor is its elements' lengths as varints, a checksum of them, then the
elements' bytes; a variant tensor is, per element, a length, a serialized
``VariantTensorDataProto`` and a running checksum. Whole buffers are parsed by
:class:`StringFraming` and :class:`VariantFraming`; the vectorized varint helpers and
:func:`lengths_crc` serve readers and writers that stream a string tensor in pieces.
Nothing here touches a file.
"""

from __future__ import annotations

import numpy as np

from tfckpt.format.dtypes import Endianness
from tfckpt.format.table import crc32c, decode_varint, encode_varint, mask_crc, unmask_crc


def as_string_array(value) -> np.ndarray:
    """``value`` as an object array of bytes (str encoded as UTF-8); ``TypeError`` otherwise."""
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


def encode_strings(values: np.ndarray, endian: Endianness) -> tuple[bytes, int]:
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


def string_tensor_nbytes(values: np.ndarray) -> int:
    """The size of :func:`encode_strings`' bytes, without encoding."""
    lengths = [len(v) for v in values.reshape(-1)]
    return sum(len(encode_varint(n)) for n in lengths) + 4 + sum(lengths)


class StringFraming:
    """The parsed framing of a string tensor's bytes: lengths, then their checksum, then data.

    ``crc`` is the entry checksum (unmasked) computed the way the format defines
    it: over each length as uint32 (uint64 when larger), the 4 stored checksum
    bytes, then the element bytes. ``ValueError`` when the bytes are malformed.
    """

    def __init__(self, buf: bytes, count: int, endian: Endianness):
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
        raw_check = buf[pos : pos + 4]
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

    def __init__(self, buf: bytes, count: int, endian: Endianness):
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
                raise ValueError(
                    f"element {i} of {length} bytes runs past the {size} bytes of the entry"
                )
            crc = crc32c(view[pos : pos + length], crc32c(length.to_bytes(8, endian), crc))
            self.elements.append((pos, length))
            pos += length
            raw_check = view[pos : pos + 4]
            stored = unmask_crc(int.from_bytes(raw_check, endian))
            if stored != crc and self.bad_element is None:
                self.bad_element = (i, stored, crc)
            crc = crc32c(raw_check, crc)
            pos += 4
        if pos != size:
            raise ValueError(f"{size - pos} bytes follow the last of {count} elements")
        self.crc = crc


def decode_varints(buf: np.ndarray, count: int) -> tuple[np.ndarray, int]:
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


def encode_varints(values: np.ndarray) -> np.ndarray:
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


def lengths_crc(lengths: np.ndarray, endian: Endianness, crc: int) -> int:
    """Carry a string tensor's CRC32C over its lengths: each as uint32 (uint64 when larger)."""
    if not len(lengths) or int(lengths.max()) <= 0xFFFFFFFF:
        return crc32c(
            lengths.astype(np.dtype("u4").newbyteorder("<" if endian == "little" else ">")), crc
        )
    for length in lengths.tolist():
        crc = crc32c(length.to_bytes(4 if length <= 0xFFFFFFFF else 8, endian), crc)
    return crc
