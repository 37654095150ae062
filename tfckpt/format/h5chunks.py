"""What tfckpt decodes of an HDF5 file itself: its signature, and a chunk's filters.

h5py finds everything in a Keras ``.h5`` file (groups, attributes, where a dataset's
bytes are); the values of a chunked dataset, though, are decoded here from each
chunk's stored bytes, so that a chunk never yields more than it declares. HDF5's own
deflate filter grows its output for as long as the stream inflates, whatever the
chunk's declared size: a few kilobytes of a file can claim gigabytes of memory.
Three filters are known (deflate, shuffle, fletcher32: what h5py and Keras write
without plugins); a chunk needing any other is refused, never decoded by HDF5.

>>> decode_chunk(stored, (Filter(SHUFFLE, (4,)), Filter(DEFLATE, (4,))), 0, 4096, verify=True)
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

SIGNATURE = b"\x89HDF\r\n\x1a\n"
# HDF5 looks for the superblock at 0, then at every power of two from 512 (a user block
# of that size comes first).
FIRST_USER_BLOCK = 512

DEFLATE, SHUFFLE, FLETCHER32 = 1, 2, 3
KNOWN = frozenset({DEFLATE, SHUFFLE, FLETCHER32})
# Names of the filters HDF5 and h5py register, for the message refusing them.
FILTER_NAMES = {
    DEFLATE: "deflate",
    SHUFFLE: "shuffle",
    FLETCHER32: "fletcher32",
    4: "szip",
    5: "nbit",
    6: "scaleoffset",
    32000: "lzf",
    32001: "blosc",
    32004: "lz4",
    32008: "bitshuffle",
    32015: "zstd",
}


def superblock_offsets(size: int) -> Iterator[int]:
    """Where an HDF5 file of ``size`` bytes may hold its signature, in the order to look."""
    yield 0
    offset = FIRST_USER_BLOCK
    while offset + len(SIGNATURE) <= size:
        yield offset
        offset *= 2


@dataclass(frozen=True)
class Filter:
    """One filter of a dataset's pipeline: HDF5's filter number and its parameters."""

    code: int
    params: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return FILTER_NAMES.get(self.code, f"filter {self.code}")


def stored_limit(nbytes: int, filters: Sequence[Filter]) -> int:
    """The most bytes a chunk of ``nbytes`` may take once through ``filters``: deflate's
    worst case (a stored stream of incompressible bytes) and fletcher32's checksum."""
    limit = nbytes
    for f in filters:
        if f.code == DEFLATE:
            limit += limit // 1000 + 64
        elif f.code == FLETCHER32:
            limit += 4
    return limit


def decode_chunk(
    stored: bytes, filters: Sequence[Filter], mask: int, nbytes: int, *, verify: bool
) -> np.ndarray:
    """A chunk's ``nbytes`` raw bytes (uint8) from its ``stored`` bytes: the ``filters``
    undone in reverse order, skipping those whose bit is set in ``mask`` (HDF5 leaves
    some chunks unfiltered). Never produces more than ``nbytes``; fletcher32 is
    checked when ``verify``. A ``ValueError`` says what is wrong."""
    data = memoryview(stored)
    for i in reversed(range(len(filters))):
        f = filters[i]
        if mask & (1 << i):
            continue
        if f.code == FLETCHER32:
            data = _unchecksum(data, verify)
        elif f.code == DEFLATE:
            data = memoryview(_inflate(data, nbytes))
        elif f.code == SHUFFLE:
            size = f.params[0] if f.params else 1
            data = _unshuffle(np.frombuffer(data, np.uint8), size).data
        else:
            raise ValueError(f"the {f.name} filter is not one tfckpt decodes")
    if len(data) != nbytes:
        raise ValueError(f"a chunk decodes to {len(data)} bytes, not the {nbytes} it declares")
    return np.frombuffer(data, np.uint8)


def _inflate(data: memoryview, nbytes: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, nbytes + 1)  # one byte more tells a bomb
    except zlib.error as e:
        raise ValueError(f"the chunk's deflate stream is corrupt: {e}") from None
    if len(out) > nbytes:
        raise ValueError(f"the chunk's deflate stream inflates past the {nbytes} bytes it declares")
    if not inflater.eof:
        raise ValueError("the chunk's deflate stream ends early")
    return out


def _unshuffle(data: np.ndarray, size: int) -> np.ndarray:
    """HDF5's shuffle undone: byte k of every element was stored together, k by k; the
    bytes past a whole number of elements stay as they are."""
    count = len(data) // size
    if size <= 1 or count <= 1:
        return data
    out = np.empty_like(data)
    body = count * size
    out[:body] = data[:body].reshape(size, count).T.reshape(-1)
    out[body:] = data[body:]
    return out


def _unchecksum(data: memoryview, verify: bool) -> memoryview:
    if len(data) < 4:
        raise ValueError("the chunk is too short to hold its fletcher32 checksum")
    body, stored = data[:-4], int.from_bytes(data[-4:], "little")
    if verify:
        computed = fletcher32(body)
        # HDF5 before 1.6.5 swapped the bytes of each half; it accepts both, as here.
        swapped = ((computed & 0x00FF00FF) << 8) | ((computed >> 8) & 0x00FF00FF)
        if stored not in (computed, swapped):
            raise ValueError(
                f"fletcher32 checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            )
    return body


_BLOCK = 1 << 20  # words summed at once: products below 2**32, sums below 2**52


def fletcher32(data) -> int:
    """HDF5's Fletcher-32 of ``data`` (``H5_checksum_fletcher32``): big-endian 16-bit words
    (an odd last byte is the high byte of a word), both sums folded modulo 65535 with
    65535 standing for a nonzero multiple of it."""
    raw = np.frombuffer(data, np.uint8)
    if len(raw) % 2:
        raw = np.concatenate([raw, np.zeros(1, np.uint8)])
    words = raw.view(">u2").astype(np.int64)
    n = len(words)
    sum1 = sum2 = 0
    for start in range(0, n, _BLOCK):
        w = words[start : start + _BLOCK]
        weights = (n - start - np.arange(len(w), dtype=np.int64)) % 65535
        sum1 = (sum1 + int(w.sum())) % 65535
        sum2 = (sum2 + int((w * weights).sum())) % 65535
    nonzero = bool(words.any())
    sum1 = sum1 or (65535 if nonzero else 0)
    sum2 = sum2 or (65535 if nonzero else 0)
    return (sum2 << 16) | sum1
