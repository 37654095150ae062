"""Random reads of a compressed stream without decompressing it to disk or to memory.

A gzip file, a deflated zip member, a bzip2 or an xz file has no random access: byte
N of the output comes from decompressing everything before it. :class:`Stream` serves
reads at any offset anyway, in bounded memory:

- **gzip and deflate** keep *restart points* (the zran technique): while a stream is
  decompressed, a copy of the decompressor (about 40 KiB: its 32 KiB window and state)
  is kept every ``span`` output bytes. A read starts from the last restart point
  before it (or goes on from where the previous read ended, when that is closer), so
  it costs at most ``span`` bytes of decompression more than its own. At most
  :data:`MAX_POINTS` points are kept: when there would be more, every other one is
  dropped and the span doubles (a 256 MiB stream keeps points every 4 MiB, 10 GiB
  every 256 MiB; at most about 6.5 MiB of copies either way).
- **bzip2 and xz** decompressors cannot be copied: a read goes on from where the last
  one ended, and a read *before* it decompresses again from the stream's start.
  Reading in stream order costs one pass; every step backwards, one more pass up to
  that offset.

Memory is bounded whatever the data: compressed input is read :data:`IN_BLOCK` bytes
at a time and fed :data:`FEED` at a time, and no call produces more than
:data:`OUT_STEP` bytes, so a bomb (a tiny stream that expands a thousandfold) costs
time, never more memory. A stream with a declared size (a zip member's) that would
produce more, or ends before it, is refused, as is one whose checksum (the gzip
trailer, checked by zlib; a zip member's CRC-32, when read through in order) does not
match.
"""

from __future__ import annotations

import bisect
import threading
import zlib
from collections.abc import Callable
from typing import Any

from tfckpt.errors import CorruptCheckpointError
from tfckpt.io.storage import Reader

GZIP, DEFLATE, BZIP2, XZ = "gzip", "deflate", "bzip2", "xz"
NAMES = {GZIP: "gzip", DEFLATE: "deflate", BZIP2: "bzip2", XZ: "xz"}
IN_BLOCK = 1 << 20  # compressed bytes read from the file at a time
FEED = 64 << 10  # compressed bytes handed to the decompressor per call
OUT_STEP = 1 << 20  # most decompressed bytes one call may produce
FIRST_SPAN = 1 << 20  # output bytes between restart points, doubled as points are thinned
MAX_POINTS = 64
# What starts each codec's next stream, where a file concatenates several (pigz, pbzip2,
# xz of several streams); zero bytes between them are padding.
_MAGIC = {GZIP: b"\x1f\x8b", BZIP2: b"BZh", XZ: b"\xfd7zXZ\x00"}


def _decompressor(codec: str):
    if codec == GZIP:
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if codec == DEFLATE:
        return zlib.decompressobj(-zlib.MAX_WBITS)
    if codec == BZIP2:
        import bz2

        return bz2.BZ2Decompressor()
    import lzma

    return lzma.LZMADecompressor()


def _errors() -> tuple[type[BaseException], ...]:
    import lzma

    # bz2 raises OSError for bad data; lzma its own LZMAError; zlib zlib.error.
    return (zlib.error, lzma.LZMAError, OSError, EOFError, ValueError)


class _Point:
    """Where a decompression can start again: the output offset, the input offset of the
    next byte to feed, and a copy of the decompressor there (None: a fresh one)."""

    __slots__ = ("out", "inp", "state")

    def __init__(self, out: int, inp: int, state: Any):
        self.out, self.inp, self.state = out, inp, state


class Stream:
    """The decompressed bytes of ``[start, end)`` of a file: reads at any offset.

    ``open_file`` opens the file (a :class:`~tfckpt.io.storage.Reader`) for each cursor;
    ``size``, when known, is what the stream must decompress to exactly, and ``crc``
    its CRC-32 (a zip member's). ``path`` names it in messages. Thread-safe: each
    :meth:`cursor` reads on its own, sharing the restart points.
    """

    def __init__(
        self,
        open_file: Callable[[], Reader],
        start: int,
        end: int,
        codec: str,
        path: str,
        *,
        size: int | None = None,
        crc: int | None = None,
    ):
        self.open_file = open_file
        self.start, self.end = start, end
        self.codec = codec
        self.path = path
        self.size = size
        self.crc = crc
        self.copyable = codec in (GZIP, DEFLATE)
        self._lock = threading.Lock()
        self._points = [_Point(0, 0, None)]
        self._outs = [0]
        self.span = FIRST_SPAN

    def cursor(self) -> Cursor:
        return Cursor(self)

    def point_before(self, offset: int) -> _Point:
        with self._lock:
            return self._points[bisect.bisect_right(self._outs, offset) - 1]

    def offer(self, out: int, inp: int, decompressor) -> None:
        """Keep a restart point at ``out`` if it is a span past the last one."""
        if not self.copyable:
            return
        with self._lock:
            if out < self._outs[-1] + self.span:
                return
            self._points.append(_Point(out, inp, decompressor.copy()))
            self._outs.append(out)
            if len(self._points) > MAX_POINTS:
                self._points = self._points[::2]
                self._outs = [p.out for p in self._points]
                self.span *= 2

    def corrupt(self, what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"{NAMES[self.codec]} data: {what}", path=self.path)


class Cursor:
    """One position in a :class:`Stream`, moved by reads; :meth:`readinto` reads at any
    offset (thread-safe, one read at a time)."""

    def __init__(self, stream: Stream):
        self.stream = stream
        self._file: Reader | None = None
        self._lock = threading.Lock()
        self._restart(stream.point_before(0))

    # -- where the decompression is

    def _restart(self, point: _Point) -> None:
        s = self.stream
        self._d = point.state.copy() if point.state is not None else _decompressor(s.codec)
        self.out = point.out  # output offset of the next byte produced
        self._block = bytearray()  # compressed bytes read, from file offset _block_at
        self._block_at = s.start + point.inp
        self._pos = 0  # how much of _block the decompressor has taken
        self._done = False  # the last stream ended: nothing follows
        # The CRC-32 of everything produced, while this cursor has produced all of it.
        self._crc = 0 if point.out == 0 and s.crc is not None else None

    @property
    def _fed(self) -> int:
        """File offset of the next compressed byte to feed."""
        return self._block_at + self._pos

    def _read(self, at: int, n: int) -> bytearray:
        if self._file is None:
            self._file = self.stream.open_file()
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self._file.readinto(view[got:], at + got)
            if k == 0:
                break
            got += k
        view.release()
        del buf[got:]
        return buf

    def _fill(self) -> bool:
        """Read the next block of compressed input; False at the stream's end."""
        s = self.stream
        at = self._fed
        n = min(IN_BLOCK, s.end - at)
        if n <= 0:
            return False
        block = self._read(at, n)
        if len(block) < n:
            raise s.corrupt(f"the file ends at byte {at + len(block)}, before the stream's end")
        self._block, self._block_at, self._pos = block, at, 0
        return True

    def _seek_input(self, at: int) -> None:
        if self._block_at <= at <= self._block_at + len(self._block):
            self._pos = at - self._block_at
        else:
            self._block, self._block_at, self._pos = bytearray(), at, 0

    def _next_stream(self) -> None:
        """After a stream's end: another one follows (pigz, pbzip2 and xz may write
        several), or zero padding, or nothing."""
        s = self.stream
        if s.codec == DEFLATE:
            self._done = True
            return
        while True:
            if self._pos >= len(self._block) and not self._fill():
                self._done = True
                return
            rest = self._block[self._pos :]
            self._pos += len(rest) - len(rest.lstrip(b"\x00"))
            if self._pos < len(self._block):
                break
        magic = _MAGIC[s.codec]
        if self._read(self._fed, len(magic)) != magic:
            raise s.corrupt(f"garbage after the end of the stream, at byte {self._fed}")
        self._d = _decompressor(s.codec)

    def _produce(self, most: int) -> bytes:
        """The next at most ``most`` bytes of output; b"" at the end of the stream."""
        s = self.stream
        errors = _errors()
        while not self._done:
            d = self._d
            if d.eof:
                self._next_stream()
                continue
            # zlib takes input on every call (what it leaves is its unconsumed_tail);
            # bz2 and lzma keep what they were given and say when they need more.
            hungry = s.copyable or d.needs_input
            if hungry and self._pos >= len(self._block):
                self._fill()
            piece = memoryview(self._block)[self._pos : self._pos + FEED] if hungry else b""
            try:
                out = d.decompress(piece, most)
            except errors as e:
                raise s.corrupt(f"{e} (near byte {self._fed} of the file)") from None
            self._pos += len(piece)
            if d.eof:
                self._seek_input(self._fed - len(d.unused_data))
            elif s.copyable:
                self._pos -= len(d.unconsumed_tail)
            if out:
                return self._emit(out, d)
            if hungry and not piece and not d.eof:
                raise s.corrupt("the stream is truncated (it ends before its end marker)")
        return b""

    def _emit(self, out: bytes, d) -> bytes:
        s = self.stream
        self.out += len(out)
        if s.size is not None and self.out > s.size:
            raise s.corrupt(f"it decompresses to more than the {s.size} bytes declared")
        if self._crc is not None:
            self._crc = zlib.crc32(out, self._crc)
            if self.out == s.size and self._crc != s.crc:
                raise s.corrupt(
                    f"CRC-32 mismatch: stored {s.crc:#010x}, computed {self._crc:#010x}"
                )
        if s.copyable and not d.eof:
            s.offer(self.out, self._fed - s.start, d)
        return out

    # -- reads

    def _move_to(self, offset: int) -> bool:
        point = self.stream.point_before(offset)
        if offset < self.out or point.out > self.out:
            self._restart(point)
        while self.out < offset:
            if not self._produce(min(OUT_STEP, offset - self.out)):
                return False
        return True

    def readinto(self, buf: memoryview, offset: int) -> int:
        """Decompressed bytes from ``offset`` into ``buf``: fewer only at the stream's end
        (a declared size not reached there is an error)."""
        with self._lock:
            done = 0
            if self._move_to(offset):
                while done < len(buf):
                    out = self._produce(min(OUT_STEP, len(buf) - done))
                    if not out:
                        break
                    buf[done : done + len(out)] = out
                    done += len(out)
            size = self.stream.size
            if done < len(buf) and size is not None and self.out < size:
                raise self.stream.corrupt(
                    f"it decompresses to {self.out} bytes, fewer than the {size} declared"
                )
            return done

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes from the current position (fewer at the end)."""
        buf = bytearray(n)
        k = self.readinto(memoryview(buf), self.out)
        return bytes(buf[:k])

    def skip_to(self, offset: int) -> bool:
        """Decompress and drop the bytes up to ``offset``; False if the stream ends first."""
        with self._lock:
            return self._move_to(offset)

    def drain(self) -> int:
        """Decompress to the stream's end (checking its end marker and checksum); the
        stream's size."""
        with self._lock:
            while self._produce(OUT_STEP):
                pass
            return self.out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
