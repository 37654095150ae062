"""Streaming reads of a V2 bundle: tensors in chunks, many small ones in runs, strings in pieces.

:class:`StreamingReads` extends :class:`~tfckpt.checkpoint.shards.ShardReads` with
the reads that hold at most about a chunk at once, for tensors larger than memory:
whole tensors and slices chunk by chunk, partitioned tensors band of rows by band
of rows, string tensors as their framing lays them out (lengths, then data) or as
runs of elements; and the opposite case, many small tensors read with one
positioned read per run of neighbours. Checksums are carried from piece to piece
and checked once the bytes they cover are all read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from tfckpt.checkpoint.index import Entry
from tfckpt.checkpoint.shards import ShardReads
from tfckpt.errors import CorruptCheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.framing import decode_varints, lengths_crc
from tfckpt.format.slices import Slice, is_full_slice, num_elements, slice_index
from tfckpt.format.table import crc32c, unmask_crc

DEFAULT_CHUNK_BYTES = 16 << 20
# Bytes between two tensors that a run still reads rather than start another read,
# and how many of them all together.
_RUN_GAP = 4096
_RUN_GAPS = 1 << 20


class StreamingReads(ShardReads):
    """Chunked, banded, batched and string-piece reads (a base of ``Checkpoint``)."""

    def iter_chunks(
        self,
        name: str,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        extents: Slice | None = None,
        *,
        buffers: Callable[[int], np.ndarray] | None = None,
    ) -> Iterator[np.ndarray]:
        """Yield tensor ``name`` as 1-D arrays of consecutive elements in row-major order.

        At most about ``chunk_bytes`` (or one row of the tensor, if larger) are
        held at once for fixed-size dtypes, so a tensor larger than memory can be
        streamed, partitioned ones included: their slices are read band of rows
        by band of rows. Checksums are verified incrementally; a mismatch raises
        once the affected bytes are all read. With ``extents``, streams one
        stored slice of a partitioned tensor. String tensors come as object
        arrays of about ``chunk_bytes`` of elements (or one larger element); a
        partitioned one comes whole.
        ``buffers`` is an internal hook of the transform engine, not public API:
        ``buffers(n)`` returns the uint8 array of ``n`` bytes that the next chunk
        of a whole, fixed-size tensor or slice is read into (a chunk then lives
        only as long as the caller keeps that buffer unused; see
        :class:`tfckpt.rewrite.pipeline.BufferRing`). Other chunks are always fresh arrays.

        >>> total = sum(float(c.sum()) for c in ckpt.iter_chunks("emb", 1 << 20))
        """
        entry = self._index.full_entry(name)
        if extents is not None:
            yield from self._iter_entry(
                self._index.slice_entry(entry, tuple(extents)), chunk_bytes, buffers
            )
        elif not entry.slices:
            yield from self._iter_entry(entry, chunk_bytes, buffers)
        elif entry.dtype.numpy is None or entry.dtype is _dt.STRING or not entry.shape:
            yield self._assemble(entry).reshape(-1)
        elif all(is_full_slice(entry.shape[1:], ext[1:]) for ext in entry.slices):
            # Partitioned by rows only: the slices, in row order, are the tensor.
            self._index.check_whole(entry)
            for ext in sorted(entry.slices, key=lambda ext: ext[0][0]):
                yield from self._iter_entry(
                    self._index.slice_entry(entry, ext), chunk_bytes, buffers
                )
        else:
            yield from self._iter_bands(entry, chunk_bytes)

    def read_together(
        self, names: Sequence[str], *, buffers: Callable[[int], np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """Whole tensors ``names`` as 1-D arrays, read with one positioned read per run.

        For many small tensors: their entries are sorted by place, and those that
        lie back to back (or a few bytes apart) in a shard are read in one go,
        into one buffer (``buffers(n)``, as for :meth:`iter_chunks`), of which the
        arrays are views. Each checksum is verified. Every name must be a whole,
        unpartitioned tensor of a fixed-size dtype with a numpy form.

        >>> a, b = ckpt.read_together(["layer_0/bias", "layer_1/bias"])
        """
        entries = self._index.full_entries(names, keep=False)
        for e in entries:
            if e.slices or e.dtype is _dt.STRING or e.dtype.numpy is None:
                raise ValueError(f"{e.name!r} cannot be read together with others")
        # Runs of entries in place order; a run is one read, gaps within it included.
        runs: list[list] = []  # [reader, start, end, entry indices]
        gaps = 0
        for i in sorted(range(len(entries)), key=lambda i: _place(entries[i])):
            e = entries[i]
            reader = self._check_extent(e)
            start, end = e.proto.offset, e.proto.offset + e.proto.size
            last = runs[-1] if runs else None
            # Overlapping entries (a hostile index) are read apart: a big-endian
            # tensor is swapped in place.
            gap = start - last[2] if last is not None and last[0] is reader else -1
            if last is not None and 0 <= gap <= _RUN_GAP and gaps + gap <= _RUN_GAPS:
                gaps += gap
                last[2] = end
                last[3].append(i)
                continue
            runs.append([reader, start, end, [i]])
        total = sum(end - start for _, start, end, _ in runs)
        buf = np.empty(total, dtype=np.uint8) if buffers is None else buffers(total)
        out: list = [None] * len(entries)
        pos = 0
        for reader, start, end, members in runs:
            region = buf[pos : pos + end - start]
            pos += end - start
            self._pread_into(reader, region.data, start, entries[members[0]])
            for i in members:
                e = entries[i]
                at = e.proto.offset - start
                part = region[at : at + e.proto.size]
                if self.verify:
                    self._check_crc(e, crc32c(part))
                out[i] = self._to_array(part, e.dtype, (e.proto.size // e.dtype.fixed_itemsize,))
        return out

    def _iter_bands(self, entry: Entry, chunk_bytes: int) -> Iterator[np.ndarray]:
        """Stream a partitioned tensor in bands of whole rows (axis 0).

        Within a slice, rows are contiguous bytes, so each band reads one byte
        range per slice crossing it, and each slice's bytes are read in order,
        which lets its checksum be carried from band to band.
        """
        self._index.check_whole(entry)
        shape, dtype = entry.shape, entry.dtype
        parts = []
        for extents in entry.slices:
            part = self._index.slice_entry(entry, extents)
            reader = self._check_extent(part)
            start, length = extents[0]
            rows = (0, shape[0]) if length is None else (start, start + length)
            parts.append((extents, part, reader, rows, [0]))
            if self.verify and part.proto.size == 0:
                self._check_crc(part, 0)
        row_bytes = num_elements(shape[1:]) * dtype.fixed_itemsize
        rows_per_band = max(1, chunk_bytes // max(row_bytes, 1))
        cuts = sorted({0, shape[0]} | {r for p in parts for r in p[3]})
        for lo, hi in zip(cuts, cuts[1:]):
            for r0 in range(lo, hi, rows_per_band):
                r1 = min(hi, r0 + rows_per_band)
                out = np.empty((r1 - r0,) + shape[1:], dtype=dtype.numpy)
                for extents, part, reader, (s0, s1), crc in parts:
                    if not (s0 <= r0 and r1 <= s1):
                        continue
                    part_row = num_elements(part.shape[1:]) * dtype.fixed_itemsize
                    buf = np.empty((r1 - r0) * part_row, dtype=np.uint8)
                    self._pread_into(
                        reader, buf.data, part.proto.offset + (r0 - s0) * part_row, part
                    )
                    if self.verify:
                        crc[0] = crc32c(buf, crc[0])
                        if r1 == s1:
                            self._check_crc(part, crc[0])
                    index = (slice(None),) + slice_index(extents[1:])
                    out[index] = self._to_array(buf, dtype, (r1 - r0,) + part.shape[1:])
                yield out.reshape(-1)

    def _iter_entry(
        self, entry: Entry, chunk_bytes: int, buffers: Callable[[int], np.ndarray] | None = None
    ) -> Iterator[np.ndarray]:
        dtype = entry.dtype
        if dtype is _dt.STRING:
            yield from self._iter_string_elements(entry, chunk_bytes)
            return
        if dtype.numpy is None:
            yield self._decode(entry).reshape(-1)
            return
        reader = self._check_extent(entry)
        itemsize = dtype.fixed_itemsize
        step = max(1, chunk_bytes // itemsize) * itemsize
        offset, remaining = entry.proto.offset, entry.proto.size
        crc = 0
        while remaining:
            n = min(step, remaining)
            buf = np.empty(n, dtype=np.uint8) if buffers is None else buffers(n)
            self._pread_into(reader, buf.data, offset, entry)
            if self.verify:
                crc = crc32c(buf, crc)
            offset += n
            remaining -= n
            yield self._to_array(buf, dtype, (n // itemsize,))
        if self.verify:
            self._check_crc(entry, crc)

    # Bytes between two tensors that a run still reads rather than start another read,

    def iter_string_parts(
        self, name: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, extents: Slice | None = None
    ) -> Iterator[tuple[str, np.ndarray, int]]:
        """Stream a string tensor (or one stored slice of it) as the format lays it out.

        Yields ``("lengths", uint64 array, n)`` until every element's length has
        come, then ``("data", uint8 array, n)``: the elements' bytes, concatenated,
        cut anywhere (an element larger than a chunk spans several). ``n`` is the
        source bytes each piece stands for. About ``chunk_bytes`` at most are held
        at once, whatever the tensor's or its elements' size; the framing and (when
        verifying) both checksums are checked as the bytes pass, a mismatch raising
        once the bytes it covers are read. ``BundleWriter.stream`` of a ``string``
        tensor takes the pieces back.
        """
        entry = self._index.stored_entry(name, extents)
        if entry.dtype is not _dt.STRING:
            raise TypeError(f"{name!r} is a {entry.dtype.name} tensor, not a string tensor")
        return self._iter_string_parts(entry, chunk_bytes)

    def _iter_string_parts(
        self, entry: Entry, chunk_bytes: int
    ) -> Iterator[tuple[str, np.ndarray, int]]:
        n, size = num_elements(entry.shape), entry.proto.size
        if size == 0:
            if n:
                raise self._corrupt(f"string tensor of {n} elements has no bytes", entry.name)
            return
        if n > size:  # every element takes at least one length byte
            raise self._corrupt(f"{n} strings cannot fit in {size} bytes", entry.name)
        reader = self._check_extent(entry)
        shard, endian = self._shard_path(entry), self.header.endianness
        step = max(chunk_bytes, 1 << 12)

        def read(pos: int, count: int) -> np.ndarray:
            buf = np.empty(count, dtype=np.uint8)
            self._pread_into(reader, buf.data, pos, entry)
            return buf

        def malformed(what) -> CorruptCheckpointError:
            return self._corrupt(f"malformed string tensor: {what}", entry.name, shard)

        pos, end = entry.proto.offset, entry.proto.offset + size  # pos: the next byte to read
        pending = np.empty(0, dtype=np.uint8)  # read but not yet used: each byte is read once
        piece = max(step // 16, 64)  # of lengths: decoded, they take 8 bytes each
        crc = total = 0
        left = n
        if not n:
            yield "lengths", np.empty(0, dtype=np.uint64), 4
        while left:
            if len(pending) < piece and pos < end:
                more = read(pos, min(piece - len(pending), end - pos))
                pos += len(more)
                pending = np.concatenate([pending, more]) if len(pending) else more
            try:
                lengths, used = decode_varints(pending, left)
            except ValueError as e:
                raise malformed(e) from None
            if not used:
                raise malformed("truncated varint")
            if int(lengths.max()) > size:
                raise malformed(f"an element of {int(lengths.max())} bytes in {size} bytes")
            total += int(lengths.sum())
            crc = lengths_crc(lengths, endian, crc)
            left -= len(lengths)
            pending = pending[used:]
            yield "lengths", lengths, used + (0 if left else 4)
        if len(pending) < 4 and pos < end:
            more = read(pos, min(4 - len(pending), end - pos))
            pos += len(more)
            pending = np.concatenate([pending, more])
        if len(pending) < 4:
            raise malformed("truncated before the length checksum")
        check, pending = pending[:4], pending[4:]
        if len(pending) + end - pos != total:
            raise malformed(
                f"lengths add up to {total} bytes but {len(pending) + end - pos} follow"
            )
        stored = unmask_crc(int.from_bytes(check.tobytes(), endian))
        if self.verify and stored != crc:
            raise self._corrupt(
                f"string length checksum mismatch: stored {stored:#010x}, computed {crc:#010x}",
                entry.name,
                shard,
            )
        crc = crc32c(check, crc)
        while len(pending) or pos < end:
            if len(pending):
                buf, pending = pending, pending[:0]
            else:
                buf = read(pos, min(step, end - pos))
                pos += len(buf)
            if self.verify:
                crc = crc32c(buf, crc)
            yield "data", buf, len(buf)
        if self.verify:
            self._check_crc(entry, crc)

    def _iter_string_elements(self, entry: Entry, chunk_bytes: int) -> Iterator[np.ndarray]:
        """A string tensor as object arrays of consecutive elements, of about
        ``chunk_bytes`` (or one element, if larger) each. The elements' bounds take
        8 bytes per element; their bytes are read a chunk at a time."""
        bounds = None  # allocated once the framing's size checks have passed
        out: list[bytes] = []
        carry: list[bytes] = []  # the start of an element that continues in the next piece
        held = done = k = known = 0  # bytes in out, data bytes passed, next element, lengths
        for kind, part, _ in self._iter_string_parts(entry, chunk_bytes):
            if bounds is None:
                bounds = np.zeros(num_elements(entry.shape) + 1, dtype=np.int64)
            if kind == "lengths":  # element i is data bytes [bounds[i], bounds[i + 1])
                ends = bounds[known + 1 : known + 1 + len(part)]
                np.cumsum(part, out=ends)
                ends += bounds[known]
                known += len(part)
                continue
            data, start, done = part.tobytes(), done, done + len(part)
            last = int(np.searchsorted(bounds, done, side="right")) - 1  # elements ending here
            for a, b in zip(bounds[k:last].tolist(), bounds[k + 1 : last + 1].tolist()):
                if a < start:
                    carry.append(data[: b - start])
                    out.append(b"".join(carry))
                    carry.clear()
                else:
                    out.append(data[a - start : b - start])
                held += b - a
            k = max(k, last)
            if k < len(bounds) - 1:
                carry.append(data[max(int(bounds[k]) - start, 0) :])
            if held >= chunk_bytes:
                yield _object_array(out)
                out, held = [], 0
        if bounds is None:  # no bytes at all: a tensor of no elements
            bounds = np.zeros(1, dtype=np.int64)
        out += [b""] * (len(bounds) - 1 - k)  # empty elements after the last byte
        if out or len(bounds) == 1:
            yield _object_array(out)


def _place(entry: Entry) -> tuple[int, int]:
    return entry.proto.shard_id, entry.proto.offset


def _object_array(items: list) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
