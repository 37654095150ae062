"""The sorted key/value table a checkpoint's ``.index`` file is made of.

The layout is LevelDB's SSTable as TensorFlow writes it: data blocks of
prefix-compressed entries with restart points, an empty metaindex block, an
index block with one entry per data block, and a 48-byte footer. Every block is
followed by a compression-type byte and a masked CRC32C.

:class:`TableReader` parses a whole table held in memory (index files are
small); :class:`TableBuilder` writes one byte-for-byte as TensorFlow would for
the same entries. Neither knows anything about tensors.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import BinaryIO

import crc32c as _crc32c
import numpy as np

from tfckpt.errors import CorruptCheckpointError, UnsupportedCheckpointError
from tfckpt.format.packed import PackedBytes

MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
BLOCK_TRAILER_SIZE = 5
BLOCK_SIZE = 256 * 1024
RESTART_INTERVAL = 16
# With a restart every 16 entries, keys decode to at most 16 times the bytes of
# their block; twice that leaves room for other writers' layouts.
KEY_BYTES_PER_FILE_BYTE = 32

NO_COMPRESSION = 0
SNAPPY_COMPRESSION = 1

_MASK_DELTA = 0xA282EAD8
_U32 = struct.Struct("<I")


# --- checksums -------------------------------------------------------------


def crc32c(data, value: int = 0) -> int:
    """CRC32C of ``data`` (any buffer), continuing from ``value``."""
    return _crc32c.crc32c(data, value)


def mask_crc(crc: int) -> int:
    """The masked form of a CRC32C that TensorFlow stores on disk."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def unmask_crc(masked: int) -> int:
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def unmask_crcs(masked: np.ndarray) -> np.ndarray:
    """``unmask_crc`` of every element of a uint32 array."""
    rot = masked.astype(np.uint32) - np.uint32(_MASK_DELTA)  # wraps modulo 2**32
    return (rot >> np.uint32(17)) | (rot << np.uint32(15))


# --- varints ---------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Unsigned LEB128, as LevelDB's PutVarint32/64."""
    if value < 0:
        raise ValueError("varint of a negative number")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(buf, pos: int, limit: int, max_bytes: int = 10) -> tuple[int, int]:
    """Decode a varint at ``buf[pos:limit]``; returns (value, next position).

    Raises ``ValueError`` when the varint runs past ``limit`` or is longer than
    ``max_bytes`` (5 for varint32, 10 for varint64).
    """
    result = 0
    shift = 0
    end = min(limit, pos + max_bytes)
    while pos < end:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if max_bytes == 5 and result > 0xFFFFFFFF:
                raise ValueError("varint32 out of range")
            if result > 0xFFFFFFFFFFFFFFFF:
                raise ValueError("varint64 out of range")
            return result, pos
        shift += 7
    raise ValueError("truncated or overlong varint")


# --- block handles and footer ----------------------------------------------


@dataclass(frozen=True)
class BlockHandle:
    """Where a block's contents are: byte offset and size (trailer excluded)."""

    offset: int
    size: int

    def encode(self) -> bytes:
        return encode_varint(self.offset) + encode_varint(self.size)

    @classmethod
    def decode(cls, buf, pos: int, limit: int) -> tuple[BlockHandle, int]:
        offset, pos = decode_varint(buf, pos, limit)
        size, pos = decode_varint(buf, pos, limit)
        return cls(offset, size), pos


@dataclass(frozen=True)
class Footer:
    metaindex: BlockHandle
    index: BlockHandle

    def encode(self) -> bytes:
        handles = self.metaindex.encode() + self.index.encode()
        return handles.ljust(FOOTER_SIZE - 8, b"\0") + struct.pack("<Q", MAGIC)

    @classmethod
    def decode(cls, buf) -> Footer:
        if len(buf) != FOOTER_SIZE:
            raise ValueError("footer must be 48 bytes")
        (magic,) = struct.unpack_from("<Q", buf, FOOTER_SIZE - 8)
        if magic != MAGIC:
            raise ValueError(f"bad magic number {magic:#018x} (not a table)")
        metaindex, pos = BlockHandle.decode(buf, 0, FOOTER_SIZE - 8)
        index, _ = BlockHandle.decode(buf, pos, FOOTER_SIZE - 8)
        return cls(metaindex, index)


# --- snappy ----------------------------------------------------------------


def snappy_decompress(data: bytes) -> bytes:
    """Decode a raw Snappy buffer (the format early TensorFlow used for index blocks)."""
    n = len(data)
    length, pos = decode_varint(data, 0, n, max_bytes=5)
    # A literal or copy element expands to at most 64 bytes per input byte, so a
    # declared length beyond that cannot be genuine: refuse before allocating.
    if length > 64 * n:
        raise ValueError(f"snappy length {length} impossible for {n} input bytes")
    out = bytearray()
    while pos < n:
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal
            size = tag >> 2
            if size >= 60:
                extra = size - 59
                if pos + extra > n:
                    raise ValueError("truncated snappy literal length")
                size = int.from_bytes(data[pos : pos + extra], "little")
                pos += extra
            size += 1
            if pos + size > n:
                raise ValueError("snappy literal runs past the input")
            out += data[pos : pos + size]
            pos += size
            continue
        if kind == 1:
            if pos + 1 > n:
                raise ValueError("truncated snappy copy")
            size = 4 + ((tag >> 2) & 7)
            offset = ((tag >> 5) << 8) | data[pos]
            pos += 1
        else:
            width = 2 if kind == 2 else 4
            if pos + width > n:
                raise ValueError("truncated snappy copy")
            size = (tag >> 2) + 1
            offset = int.from_bytes(data[pos : pos + width], "little")
            pos += width
        if offset == 0 or offset > len(out):
            raise ValueError("snappy copy offset out of range")
        if len(out) + size > length:
            raise ValueError("snappy output longer than declared")
        start = len(out) - offset
        if offset >= size:
            out += out[start : start + size]
        else:  # overlapping copy repeats the last `offset` bytes
            chunk = out[start:]
            reps, rest = divmod(size, offset)
            out += chunk * reps + chunk[:rest]
    if len(out) != length:
        raise ValueError(f"snappy output is {len(out)} bytes, declared {length}")
    return bytes(out)


# --- reading ---------------------------------------------------------------


def parse_block(contents: bytes) -> list[tuple[bytes, bytes]]:
    """(key, value) of every entry of one block's contents."""
    return list(zip(*block_columns(contents)))


class KeyBudgetExceeded(ValueError):
    """Keys decode to more bytes than the caller allowed."""


def block_columns(
    contents: bytes,
    key_budget: int | None = None,
    out: tuple[list[bytes], list[bytes]] | None = None,
) -> tuple[list[bytes], list[bytes]]:
    """The keys and the values of every entry of one block's contents, in order.

    With a ``key_budget``, ``KeyBudgetExceeded`` as soon as the keys decoded add up
    to more bytes than that: prefix sharing lets a small block describe huge keys.
    With ``out`` (two lists), entries are appended to those: after an error they
    hold the entries before it, which a reader checks first, as it reads in order.

    The restart points are checked as well: TensorFlow's reader starts at the
    first and binary-searches the others, so a block whose restarts do not each
    mark an entry that shares no key bytes, in order, is one it cannot read.
    """
    n = len(contents)
    if n < 4:
        raise ValueError("block shorter than its restart count")
    (num_restarts,) = _U32.unpack_from(contents, n - 4)
    if num_restarts > (n - 4) // 4:
        raise ValueError(f"block restart count {num_restarts} exceeds block size {n}")
    limit = n - 4 - 4 * num_restarts
    restarts = struct.unpack_from(f"<{num_restarts}I", contents, limit)
    keys, values = ([], []) if out is None else out
    if not limit:
        if restarts not in ((), (0,)):
            raise _not_an_entry(restarts[0], limit)
        return keys, values
    if not num_restarts:
        raise ValueError("block has entries but no restart points")
    if restarts[0] != 0:
        raise ValueError(f"first restart offset is {restarts[0]}, not 0")
    add_key, add_value = keys.append, values.append
    budget = (1 << 63) if key_budget is None else key_budget
    key = b""
    bounds = (*restarts, limit)
    # One run of entries per restart point: it starts sharing nothing and ends
    # exactly where the next one starts.
    for run in range(num_restarts):
        pos, stop = bounds[run], bounds[run + 1]
        if stop <= pos:
            if run + 1 < num_restarts:
                raise ValueError(f"restart offsets not increasing ({pos}, then {stop})")
            raise _not_an_entry(pos, limit)
        first = True
        while pos < stop and pos < limit:
            # Fast path: all three varints fit in one byte each (nearly always).
            shared, non_shared, value_len = contents[pos], contents[pos + 1], contents[pos + 2]
            if (shared | non_shared | value_len) < 0x80 and pos + 3 <= limit:
                pos += 3
            else:
                shared, pos = decode_varint(contents, pos, limit, 5)
                non_shared, pos = decode_varint(contents, pos, limit, 5)
                value_len, pos = decode_varint(contents, pos, limit, 5)
            if shared > len(key) or (shared and first):
                raise ValueError(
                    f"entry shares {shared} bytes of a {len(key)}-byte key"
                    + (" at a restart point" if first else "")
                )
            first = False
            end = pos + non_shared + value_len
            if end > limit:
                raise ValueError("entry runs past the end of its block")
            key = key[:shared] + contents[pos : pos + non_shared]
            budget -= len(key)
            if budget < 0:
                raise KeyBudgetExceeded()
            add_key(key)
            add_value(contents[pos + non_shared : end])
            pos = end
        if pos != stop:
            if pos >= limit:
                raise _not_an_entry(stop, limit)
            raise ValueError(f"restart offset {stop} points inside an entry")
    return keys, values


def _not_an_entry(restart: int, limit: int) -> ValueError:
    return ValueError(
        f"restart offset {restart} is not the start of an entry (entries end at {limit})"
    )


class TableReader:
    """All entries of a table held in memory, in file order: its keys and its values as
    two :class:`~tfckpt.format.packed.PackedBytes` columns.

    ``path`` only names the file in error messages.
    """

    def __init__(self, data: bytes, path: str = "<table>", *, lazy: bool = False):
        self.path = path
        self._data = data
        # lazy: no entries held; walk them with iter_blocks, fetch with block_entries.
        keys, values = PackedBytes(), PackedBytes()
        if not lazy:
            for _, block_keys, block_values in self.iter_block_columns():
                keys.extend(block_keys)
                values.extend(block_values)
        self.keys = keys.frozen()  # sorted, each once
        self.values = values.frozen()

    @property
    def entries(self) -> list[tuple[bytes, bytes]]:
        """(key, value) of every entry, in order."""
        return list(zip(self.keys, self.values))

    def _corrupt(self, what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"corrupt index table: {what}", path=self.path)

    def _too_many_key_bytes(self, size: int) -> CorruptCheckpointError:
        return self._corrupt(
            f"keys decode to more than {KEY_BYTES_PER_FILE_BYTE} times the "
            f"file's {size} bytes (prefix sharing beyond any real index)"
        )

    def _read_block(self, handle: BlockHandle, what: str) -> bytes:
        data = self._data
        end = handle.offset + handle.size + BLOCK_TRAILER_SIZE
        if end > len(data) - FOOTER_SIZE:
            raise self._corrupt(
                f"{what} at offset {handle.offset} of size {handle.size} lies past the "
                f"end of the file ({len(data)} bytes)"
            )
        contents = data[handle.offset : handle.offset + handle.size]
        ctype = data[handle.offset + handle.size]
        (stored,) = _U32.unpack(data[handle.offset + handle.size + 1 : end])
        actual = crc32c(
            data[handle.offset + handle.size : handle.offset + handle.size + 1], crc32c(contents)
        )
        if unmask_crc(stored) != actual:
            raise self._corrupt(
                f"checksum mismatch in {what} at offset {handle.offset} "
                f"(stored {unmask_crc(stored):#010x}, computed {actual:#010x})"
            )
        if ctype == NO_COMPRESSION:
            return contents
        if ctype == SNAPPY_COMPRESSION:
            try:
                return snappy_decompress(contents)
            except ValueError as e:
                raise self._corrupt(f"{what} at offset {handle.offset}: {e}") from None
        raise UnsupportedCheckpointError(
            f"{what} at offset {handle.offset} uses unknown compression type {ctype}",
            path=self.path,
        )

    def block_entries(self, handle: BlockHandle) -> list[tuple[bytes, bytes]]:
        """The entries of one data block that :meth:`iter_blocks` yielded, read again."""
        try:
            return list(parse_block(self._read_block(handle, "data block")))
        except ValueError as e:
            raise self._corrupt(str(e)) from None

    def iter_blocks(self) -> Iterator[tuple[BlockHandle, list[tuple[bytes, bytes]]]]:
        """Each data block's handle and entries, in file order, every check applied."""
        for handle, keys, values in self.iter_block_columns():
            yield handle, list(zip(keys, values))

    def iter_block_columns(self) -> Iterator[tuple[BlockHandle, list[bytes], list[bytes]]]:
        """Each data block's handle, keys and values, in file order, every check applied."""
        data = self._data
        if len(data) < FOOTER_SIZE:
            raise self._corrupt(f"file is {len(data)} bytes, shorter than the 48-byte footer")
        try:
            footer = Footer.decode(data[-FOOTER_SIZE:])
        except ValueError as e:
            raise self._corrupt(f"footer: {e}") from None
        index = self._read_block(footer.index, "index block")
        last_key = None
        # Work and memory stay linear in the file's size: every data block is read
        # once (they follow one another, as written), and prefix-shared keys may
        # not decode to more than a multiple of it.
        budget = max(KEY_BYTES_PER_FILE_BYTE * len(data), 1 << 20)
        block_end = 0
        seps: list[bytes] = []
        handles: list[bytes] = []
        try:
            # An error in the index block comes after the data blocks listed before it.
            try:
                block_columns(index, budget, (seps, handles))
                index_error = None
            except ValueError as e:
                index_error = e
            for sep, handle_bytes in zip(seps, handles):
                budget -= len(sep)
                if budget < 0:
                    raise self._too_many_key_bytes(len(data))
                handle, _ = BlockHandle.decode(handle_bytes, 0, len(handle_bytes))
                if handle.offset < block_end:
                    raise self._corrupt(
                        f"data block at offset {handle.offset} repeats or overlaps the one "
                        f"before it (which ends at {block_end})"
                    )
                block_end = handle.offset + handle.size + BLOCK_TRAILER_SIZE
                block = self._read_block(handle, "data block")
                keys: list[bytes] = []
                values: list[bytes] = []
                try:
                    block_columns(block, budget, (keys, values))
                except ValueError:  # the keys before the error break no rule first
                    self._refuse_keys(keys, last_key, sep, budget)
                    raise
                if keys:
                    budget -= sum(map(len, keys))
                    if (
                        (last_key is not None and keys[0] <= last_key)
                        or not all(map(bytes.__lt__, keys, islice(keys, 1, None)))
                        or keys[-1] > sep
                    ):
                        budget += sum(map(len, keys))
                        self._refuse_keys(keys, last_key, sep, budget)
                        raise AssertionError("no key breaks a rule")
                    last_key = keys[-1]
                yield handle, keys, values
            if index_error is not None:
                raise index_error
        except KeyBudgetExceeded:
            raise self._too_many_key_bytes(len(data)) from None
        except ValueError as e:
            raise self._corrupt(str(e)) from None

    def _refuse_keys(self, keys: list[bytes], last_key: bytes | None, sep: bytes, budget: int):
        """The error for the first of a block's keys that breaks a rule, in key order
        (none when they all keep them)."""
        for key in keys:
            budget -= len(key)
            if budget < 0:
                raise self._too_many_key_bytes(len(self._data))
            if last_key is not None and key <= last_key:
                raise self._corrupt(
                    f"key {key!r} is not after {last_key!r}: keys unsorted or duplicated"
                )
            if key > sep:
                raise self._corrupt(f"key {key!r} lies beyond its index entry {sep!r}")
            last_key = key


# --- writing ---------------------------------------------------------------


class BlockBuilder:
    """One block of a table being built: entries with their keys' shared prefixes cut,
    a restart point every ``restart_interval`` entries, then the restart array.

    >>> b = BlockBuilder(16); b.add(b"a", b"1"); data = b.finish()
    """

    def __init__(self, restart_interval: int):
        self.restart_interval = restart_interval
        self.reset()

    def reset(self) -> None:
        self.buffer = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last_key = b""
        self.empty = True

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.counter < self.restart_interval:
            last = self.last_key
            limit = min(len(last), len(key))
            # The first differing byte is the highest set byte of the XOR of both
            # prefixes read as big-endian numbers: one C-level pass, not a loop in Python.
            diff = int.from_bytes(last[:limit], "big") ^ int.from_bytes(key[:limit], "big")
            shared = limit - (diff.bit_length() + 7) // 8
        else:
            self.restarts.append(len(self.buffer))
            self.counter = 0
        buf = self.buffer
        non_shared, value_len = len(key) - shared, len(value)
        if (shared | non_shared | value_len) < 0x80:  # nearly always: one byte each
            buf += bytes((shared, non_shared, value_len))
        else:
            buf += encode_varint(shared)
            buf += encode_varint(non_shared)
            buf += encode_varint(value_len)
        buf += key[shared:]
        buf += value
        self.last_key = key
        self.counter += 1
        self.empty = False

    def size_estimate(self) -> int:
        return len(self.buffer) + 4 * len(self.restarts) + 4

    def finish(self) -> bytes:
        tail = b"".join(_U32.pack(r) for r in self.restarts) + _U32.pack(len(self.restarts))
        return bytes(self.buffer) + tail


def shortest_separator(start: bytes, limit: bytes) -> bytes:
    """A short key k with start <= k < limit (TensorFlow's choice, for identical files)."""
    n = min(len(start), len(limit))
    i = 0
    while i < n and start[i] == limit[i]:
        i += 1
    if i < n:
        b = start[i]
        if b < 0xFF and b + 1 < limit[i]:
            return start[:i] + bytes([b + 1])
    return start


def short_successor(key: bytes) -> bytes:
    """A short key k >= ``key`` (TensorFlow's choice for a table's last index key)."""
    for i, b in enumerate(key):
        if b != 0xFF:
            return key[:i] + bytes([b + 1])
    return key


class TableBuilder:
    """Writes sorted entries to a binary file object as TensorFlow's table writer does.

    Keys must be added in strictly increasing bytewise order. Call
    :meth:`finish` once; the caller owns and closes the file.
    """

    def __init__(
        self, file: BinaryIO, *, block_size: int = BLOCK_SIZE, compression: int = NO_COMPRESSION
    ):
        if compression != NO_COMPRESSION:
            raise ValueError("tfckpt writes uncompressed tables only")
        self._file = file
        self._block_size = block_size
        self._offset = 0
        self._data = BlockBuilder(RESTART_INTERVAL)
        self._index = BlockBuilder(1)
        self._last_key: bytes | None = None
        self._pending: BlockHandle | None = None
        self._closed = False

    def add(self, key: bytes, value: bytes) -> None:
        if self._last_key is not None:
            if key <= self._last_key:
                raise ValueError(f"table keys out of order: {key!r} after {self._last_key!r}")
            if len(key) + len(value) >= 2 * self._block_size:
                self._flush()
        if self._pending is not None:
            assert self._last_key is not None  # a pending block holds at least one key
            self._index.add(shortest_separator(self._last_key, key), self._pending.encode())
            self._pending = None
        self._last_key = key
        self._data.add(key, value)
        if self._data.size_estimate() >= self._block_size:
            self._flush()

    def _flush(self) -> None:
        if self._data.empty:
            return
        self._pending = self._write_block(self._data)

    def _write_block(self, block: BlockBuilder) -> BlockHandle:
        contents = block.finish()
        block.reset()
        handle = BlockHandle(self._offset, len(contents))
        trailer = bytes([NO_COMPRESSION])
        crc = mask_crc(crc32c(trailer, crc32c(contents)))
        self._file.write(contents)
        self._file.write(trailer + _U32.pack(crc))
        self._offset += len(contents) + BLOCK_TRAILER_SIZE
        return handle

    def finish(self) -> int:
        """Write the remaining blocks and the footer; returns the table's size."""
        if self._closed:
            raise ValueError("table already finished")
        self._closed = True
        self._flush()
        metaindex = self._write_block(BlockBuilder(RESTART_INTERVAL))
        if self._pending is not None:
            assert self._last_key is not None
            self._index.add(short_successor(self._last_key), self._pending.encode())
            self._pending = None
        index = self._write_block(self._index)
        self._file.write(Footer(metaindex, index).encode())
        self._offset += FOOTER_SIZE
        return self._offset
