"""A whole table built from sorted keys and their values, array by array, in pieces.

:class:`~tfckpt.format.table.TableBuilder` adds entries one by one, a few microseconds
each: at 200 000 tensors that is most of the time a checkpoint's index takes. Here the
same table (byte for byte: the same blocks, restart points, index block and footer) is
laid out from arrays: every entry's shared key prefix, the blocks' boundaries (a short
loop over blocks, not entries), then every entry's bytes written in a few numpy passes.
The arrays take some 200 bytes an entry, so entries are laid out some thousands at a
time (:func:`table_in_pieces`), each piece giving whole data blocks: a block's
boundaries depend only on the entries from its start on.
The varint and range-copy helpers are shared with :mod:`tfckpt.format.entryrows`.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np

from tfckpt.format.table import (
    BLOCK_SIZE,
    BLOCK_TRAILER_SIZE,
    RESTART_INTERVAL,
    BlockBuilder,
    BlockHandle,
    Footer,
    crc32c,
    mask_crc,
    short_successor,
    shortest_separator,
)

# Range copies are cut in pieces of about this many bytes: their index arrays (8 bytes
# per byte copied) stay small whatever the table's size.
_COPY_PIECE = 1 << 18


def varint_lengths(values: np.ndarray) -> np.ndarray:
    """The bytes the varint of each (non-negative) value takes, as int64."""
    v = values.astype(np.uint64, copy=False)
    n = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        more = v >= np.uint64(1 << (7 * k))
        if not more.any():
            break
        n += more
    return n


def put_varints(
    out: np.ndarray, at: np.ndarray, values: np.ndarray, lengths: np.ndarray | None = None
) -> np.ndarray:
    """Write the varint of each value at ``out[at[i]:]``; their lengths (``lengths``:
    known already)."""
    v = values.astype(np.uint64, copy=False)
    if lengths is None:
        lengths = varint_lengths(v)
    if not len(v):
        return lengths
    if lengths.max() == 1:  # one byte each: the values themselves
        out[at] = v
        return lengths
    all_lengths = lengths
    low = np.uint64(0x7F)
    # Byte k of every varint longer than k; the arrays shrink to those only when some end.
    for k in range(int(lengths.max())):
        if k and not (live := lengths > k).all():
            keep = np.flatnonzero(live)
            v, at, lengths = v[keep], at[keep], lengths[keep]
        more = (lengths > k + 1).astype(np.uint64) << np.uint64(7)
        out[at + k] = ((v >> np.uint64(7 * k)) & low) | more
    return all_lengths


def put_u32(out: np.ndarray, at: np.ndarray, values: np.ndarray) -> None:
    """Write each value as 4 little-endian bytes at ``out[at[i]:]``."""
    v = values.astype(np.uint32, copy=False)
    for k in range(4):
        out[at + k] = (v >> np.uint32(8 * k)) & np.uint32(0xFF)


def copy_ranges(
    dst: np.ndarray, dst_at: np.ndarray, src: np.ndarray, src_at: np.ndarray, lengths: np.ndarray
) -> None:
    """``dst[dst_at[i]:][:lengths[i]] = src[src_at[i]:][:lengths[i]]`` for every i."""
    if not len(lengths):
        return
    ends = np.cumsum(lengths)
    cuts = np.searchsorted(ends, np.arange(_COPY_PIECE, int(ends[-1]), _COPY_PIECE))
    bounds = [0, *np.unique(cuts + 1).tolist(), len(lengths)]
    for lo, hi in zip(bounds, bounds[1:]):
        if lo >= hi:
            continue
        n = lengths[lo:hi]
        total = int(n.sum())
        if not total:
            continue
        # Where each byte comes from: its range's start, plus its place in the range.
        first = np.cumsum(n) - n
        from_ = np.repeat(src_at[lo:hi] - first, n) + np.arange(total, dtype=np.int64)
        dst[from_ + np.repeat(dst_at[lo:hi] - src_at[lo:hi], n)] = src[from_]


def _common_prefixes(kbuf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """How many leading bytes each key shares with the one before it (0 for the first).

    Compared 8 bytes at a time, only while a pair still agrees; ``kbuf`` must hold 8
    bytes past its last key.
    """
    n = len(lengths)
    out = np.zeros(n, dtype=np.int64)
    if n < 2:
        return out
    words = np.lib.stride_tricks.sliding_window_view(kbuf, 8)
    a, b = starts[:-1], starts[1:]
    limit = np.minimum(lengths[:-1], lengths[1:])
    done = np.zeros(n - 1, dtype=np.int64)
    live = np.flatnonzero(limit > 0)
    while live.size:
        at = done[live]
        # Read little-endian, the first differing byte holds the lowest set bit.
        diff = words[a[live] + at].view("<u8")[:, 0] ^ words[b[live] + at].view("<u8")[:, 0]
        lowest = diff & (~diff + np.uint64(1))
        same = np.where(diff == 0, 8, (np.frexp(lowest.astype(np.float64))[1] - 1) // 8)
        done[live] = at + same
        live = live[(same == 8) & (done[live] < limit[live])]
    out[1:] = np.minimum(done, limit)
    return out


def _check_order(kbuf, starts, lengths, shared) -> None:
    """``ValueError`` unless every key is after the one before it."""
    prev_len, cur_len, s = lengths[:-1], lengths[1:], shared[1:]
    inside = s < np.minimum(prev_len, cur_len)
    at = np.where(inside, s, 0)
    greater = kbuf[starts[1:] + at] > kbuf[starts[:-1] + at]
    ok = np.where(inside, greater, (s == prev_len) & (cur_len > prev_len))
    if not ok.all():
        i = int(np.argmin(ok))
        prev = kbuf[starts[i] : starts[i] + lengths[i]].tobytes()
        key = kbuf[starts[i + 1] : starts[i + 1] + lengths[i + 1]].tobytes()
        raise _out_of_order(prev, key)


def _block_starts(part, full, big, block_size: int) -> list[int]:
    """The first entry of each data block, as :class:`TableBuilder` cuts them.

    A block ends after the entry that brings its size estimate (entries, 4 bytes per
    restart point, 4 for their count) to ``block_size``, or before an entry of at
    least twice that. An entry costs ``full`` bytes at a restart point (every 16th of
    its block), ``part`` elsewhere; the estimate grows with each entry, so each block's
    end is found by bisection over running sums.
    """
    n = len(part)
    run = np.concatenate([[0], np.cumsum(part)])  # run[i]: part bytes of entries before i
    # extra[i]: what restart points at i, i-16, i-32... add over ``part``
    d = np.zeros(-(-n // RESTART_INTERVAL) * RESTART_INTERVAL, dtype=np.int64)
    d[:n] = full - part
    extra = np.cumsum(d.reshape(-1, RESTART_INTERVAL), axis=0).ravel()
    bigs = np.flatnonzero(big).tolist()
    starts, s, b = [], 0, 0
    while s < n:
        starts.append(s)
        while b < len(bigs) and bigs[b] <= s:
            b += 1
        last = bigs[b] - 1 if b < len(bigs) else n - 1
        before = extra[s - RESTART_INTERVAL] if s >= RESTART_INTERVAL else 0

        def estimate(e: int, s=s, before=before) -> int:
            r = (e - s) // RESTART_INTERVAL
            return int(run[e + 1] - run[s] + extra[s + RESTART_INTERVAL * r] - before) + 4 * r + 8

        if estimate(last) < block_size:
            s = last + 1
            continue
        lo, hi = s, last  # the first e with estimate(e) >= block_size lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if estimate(mid) >= block_size:
                hi = mid
            else:
                lo = mid + 1
        s = lo + 1
    return starts


def _framed(contents: bytes) -> bytes:
    """A block's contents with its trailer: no compression, masked CRC32C."""
    return contents + b"\0" + mask_crc(crc32c(b"\0", crc32c(contents))).to_bytes(4, "little")


# A table is laid out this many entries at a time (and as many more as its first data block
# needs): each piece's arrays, some 200 bytes an entry, are freed before the next is made.
# A piece of an index of 256 KiB blocks (some 9 000 entries each) holds one or two; a piece
# that holds no whole block is doubled, and pieces stay that long.
PIECE_ENTRIES = 16384

# What a piece of the entries gives, from the i-th entry wanted to the j-th: their keys
# joined (uint8), where each key starts in them and where the last ends (j - i + 1
# offsets), each value's length, and ``write_values(out, at)``, which writes the first
# ``len(at)`` of those values at ``out[at[k]:]``.
Piece = tuple[np.ndarray, np.ndarray, np.ndarray, Callable[[np.ndarray, np.ndarray], None]]


def table_bytes(
    keys: np.ndarray,
    key_offsets: np.ndarray,
    value_lengths: np.ndarray,
    write_values: Callable[[np.ndarray, np.ndarray], None],
    *,
    block_size: int = BLOCK_SIZE,
) -> bytes:
    """The table :class:`~tfckpt.format.table.TableBuilder` writes for the keys
    ``keys[key_offsets[i]:key_offsets[i + 1]]`` (uint8; strictly increasing) and values
    of ``value_lengths`` bytes, which ``write_values(out, at)`` writes at ``out[at[i]:]``
    (uint8 and int64 arrays, ``at`` perhaps shorter than the values: the first ones).
    All entries are laid out at once; see :func:`table_in_pieces` for a piece at a time.

    >>> k, v = np.frombuffer(b"ab", np.uint8), np.frombuffer(b"12", np.uint8)
    >>> def put(out, at): out[at] = v[: len(at)]  # b"a" -> b"1", b"b" -> b"2"
    >>> table_bytes(k, np.arange(3), np.ones(2, np.int64), put)
    """
    n = len(key_offsets) - 1

    def whole(lo: int, hi: int) -> Piece:
        return keys, key_offsets, value_lengths, write_values

    return table_in_pieces(n, whole, block_size=block_size, piece_entries=max(n, 1))


def table_in_pieces(
    count: int,
    piece: Callable[[int, int], Piece],
    *,
    block_size: int = BLOCK_SIZE,
    piece_entries: int = PIECE_ENTRIES,
) -> bytes:
    """The table :class:`~tfckpt.format.table.TableBuilder` writes for ``count`` entries
    (their keys strictly increasing), laid out a piece at a time: ``piece(i, j)`` gives
    entries i to j (see :data:`Piece`), about ``piece_entries`` of them.

    Each piece's whole data blocks are laid out and kept as bytes; the entries of its
    last block, which may go on past the piece, start the next piece. So the memory
    beyond the table's own bytes is a piece's, whatever ``count``.
    """
    # The data blocks, piece by piece, go into one buffer that grows in place (mostly)
    # and whose bytes become the table's without a copy (see ``BytesIO.getvalue``).
    table = io.BytesIO()
    index = BlockBuilder(1)
    offset = 0
    waiting: tuple[bytes, bytes] | None = None  # a block's last key and handle, until
    # the first key of the next block gives the separator its index entry needs
    lo, size = 0, piece_entries
    while lo < count:
        hi = min(count, lo + size)
        laid = _lay_out(*piece(lo, hi), block_size, last=hi == count)
        if laid is None:  # not one whole block yet: a longer piece
            size *= 2
            continue
        out, done, firsts, lasts, block_ends = laid
        del laid
        if waiting is not None:
            if not firsts[0] > waiting[0]:
                raise _out_of_order(waiting[0], firsts[0])
            index.add(shortest_separator(waiting[0], firsts[0]), waiting[1])
        mv = memoryview(out)
        for b, end in enumerate(block_ends):
            start = block_ends[b - 1] + BLOCK_TRAILER_SIZE if b else 0
            crc = mask_crc(crc32c(mv[start : end + 1]))  # with the type byte, 0
            mv[end + 1 : end + 5] = crc.to_bytes(4, "little")
            handle = BlockHandle(offset + start, end - start).encode()
            if b + 1 < len(block_ends):
                index.add(shortest_separator(lasts[b], firsts[b + 1]), handle)
            else:
                waiting = lasts[b], handle
        del mv
        table.write(out)
        offset += len(out)
        del out  # before the next piece's are made
        lo += done
    if waiting is not None:
        index.add(short_successor(waiting[0]), waiting[1])
    metaindex = BlockHandle(offset, 8)
    meta = _framed(BlockBuilder(RESTART_INTERVAL).finish())
    index_contents = index.finish()
    index_handle = BlockHandle(offset + len(meta), len(index_contents))
    tail = meta + _framed(index_contents) + Footer(metaindex, index_handle).encode()
    table.write(tail)
    return table.getvalue()


def _lay_out(keys, key_offsets, value_lengths, write_values, block_size: int, last: bool):
    """A piece's whole data blocks, framed but for their checksums, as bytes; how many
    entries they hold; each block's first and last key; where each block's contents end.
    None when the piece, not the table's last, does not hold a whole block."""
    klen = np.diff(key_offsets).astype(np.int64)
    kstart = np.asarray(key_offsets[:-1], dtype=np.int64)
    kbuf = np.concatenate([keys, np.zeros(8, np.uint8)])
    vlen = np.asarray(value_lengths, dtype=np.int64)
    shared = _common_prefixes(kbuf, kstart, klen)
    if len(klen) > 1:
        _check_order(kbuf, kstart, klen, shared)
    vl_len = varint_lengths(vlen)
    full = 1 + varint_lengths(klen) + vl_len + klen + vlen
    part = varint_lengths(shared) + varint_lengths(klen - shared) + vl_len + klen - shared + vlen
    block_starts = _block_starts(part, full, klen + vlen >= 2 * block_size, block_size)
    n = len(klen)
    if not last:  # the last block may go on past the piece: it starts the next one
        if len(block_starts) < 2:
            return None
        n = block_starts.pop()
        klen, kstart, vlen, shared, full, part = (
            a[:n] for a in (klen, kstart, vlen, shared, full, part)
        )
    starts = np.array(block_starts, dtype=np.int64)
    counts = np.diff(np.append(starts, n))
    block = np.repeat(np.arange(len(starts)), counts)
    k = np.arange(n) - starts[block]  # place in its block
    restart = k % RESTART_INTERVAL == 0
    shared = np.where(restart, 0, shared)
    rec = np.where(restart, full, part)
    rec_before = np.cumsum(rec) - rec
    rec_bytes = np.add.reduceat(rec, starts) if n else rec
    n_restarts = -(-counts // RESTART_INTERVAL)
    contents = rec_bytes + 4 * n_restarts + 4
    physical = contents + BLOCK_TRAILER_SIZE
    block_at = np.cumsum(physical) - physical
    # Each entry's place: its block's, plus the entries before it in the block.
    at = block_at[block] + rec_before - rec_before[starts][block]
    out = np.zeros(int(physical.sum()), dtype=np.uint8)
    at1 = at + put_varints(out, at, shared)
    at2 = at1 + put_varints(out, at1, klen - shared)
    at3 = at2 + put_varints(out, at2, vlen)
    copy_ranges(out, at3, kbuf, kstart + shared, klen - shared)
    write_values(out, at3 + klen - shared)
    ends = block_at + rec_bytes  # where each block's restart array begins
    rb = block[restart]
    put_u32(out, ends[rb] + 4 * (k[restart] // RESTART_INTERVAL), at[restart] - block_at[rb])
    put_u32(out, ends + 4 * n_restarts, n_restarts)

    def key(i: int) -> bytes:
        return kbuf[kstart[i] : kstart[i] + klen[i]].tobytes()

    firsts = [key(i) for i in block_starts]
    lasts = [key(i) for i in (starts + counts - 1).tolist()]
    return out, n, firsts, lasts, (block_at + contents).tolist()


def _out_of_order(prev: bytes, key: bytes) -> ValueError:
    return ValueError(f"table keys out of order: {key!r} after {prev!r}")
