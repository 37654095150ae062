"""A whole table built at once from sorted keys and their values, array by array.

:class:`~tfckpt.format.table.TableBuilder` adds entries one by one, a few microseconds
each: at 200 000 tensors that is most of the time a checkpoint's index takes. Here the
same table (byte for byte: the same blocks, restart points, index block and footer) is
laid out from arrays: every entry's shared key prefix, the blocks' boundaries (a short
loop over blocks, not entries), then every entry's bytes written in a few numpy passes.
The varint and range-copy helpers are shared with :mod:`tfckpt.format.entryrows`.
"""

from __future__ import annotations

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
        raise ValueError(f"table keys out of order: {key!r} after {prev!r}")


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
    (uint8 and int64 arrays): each value is written where it goes in the table.

    >>> k, v = np.frombuffer(b"ab", np.uint8), np.frombuffer(b"12", np.uint8)
    >>> def put(out, at): out[at] = v  # b"a" -> b"1", b"b" -> b"2"
    >>> table_bytes(k, np.arange(3), np.ones(2, np.int64), put)
    """
    n = len(key_offsets) - 1
    klen = np.diff(key_offsets).astype(np.int64)
    kstart = np.asarray(key_offsets[:-1], dtype=np.int64)
    kbuf = np.concatenate([keys, np.zeros(8, np.uint8)])
    vlen = np.asarray(value_lengths, dtype=np.int64)
    shared = _common_prefixes(kbuf, kstart, klen)
    if n > 1:
        _check_order(kbuf, kstart, klen, shared)
    vl_len = varint_lengths(vlen)
    full = 1 + varint_lengths(klen) + vl_len + klen + vlen
    part = varint_lengths(shared) + varint_lengths(klen - shared) + vl_len + klen - shared + vlen
    big = klen + vlen >= 2 * block_size
    if n:
        big[0] = False  # TableBuilder only looks at entries after the first
    starts = np.array(_block_starts(part, full, big, block_size), dtype=np.int64)
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
    return _finish(out, kbuf, kstart, klen, starts, counts, block_at, contents)


def _finish(out, kbuf, kstart, klen, starts, counts, block_at, contents) -> bytes:
    """The data blocks' checksums, then the metaindex and index blocks and the footer."""

    def key(i: int) -> bytes:
        return kbuf[kstart[i] : kstart[i] + klen[i]].tobytes()

    index = BlockBuilder(1)
    mv = memoryview(out)
    firsts, lasts = starts.tolist(), (starts + counts - 1).tolist()
    for b, (offset, size) in enumerate(zip(block_at.tolist(), contents.tolist())):
        crc = mask_crc(crc32c(mv[offset : offset + size + 1]))  # with the type byte, 0
        mv[offset + size + 1 : offset + size + 5] = crc.to_bytes(4, "little")
        last = key(lasts[b])
        if b + 1 < len(firsts):
            index.add(
                shortest_separator(last, key(firsts[b + 1])), BlockHandle(offset, size).encode()
            )
        else:
            index.add(short_successor(last), BlockHandle(offset, size).encode())
    metaindex = BlockHandle(len(out), 8)
    meta = _framed(BlockBuilder(RESTART_INTERVAL).finish())
    index_contents = index.finish()
    index_handle = BlockHandle(len(out) + len(meta), len(index_contents))
    tail = meta + _framed(index_contents) + Footer(metaindex, index_handle).encode()
    return b"".join([mv, tail])
