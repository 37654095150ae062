"""Reordering a tensor's axes, and assembling one from boxes of others, in bounded memory.

:func:`tiles` streams a permuted tensor (``--permute REGEX=AXES``) as consecutive pieces
of the result, reading the source in long runs whatever the shape (which permutation
applies to a tensor is :class:`~tfckpt.rewrite.rules.ShapeRules`'). A tensor made by
``--split`` or ``--concat`` (:mod:`tfckpt.rewrite.pieces`) is a list of
:class:`Member` s, each a box of a source tensor and where it lands; the same tiles
fill the result from them. The engine's pipeline reads permuted tensors through
:func:`permuted_chunks`, assembled ones through :func:`assembled_chunks`.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.format import dtypes as _dt
from tfckpt.rewrite.pipeline import BufferRing

# A read call counts as costing as much as reading this many bytes (a range request
# on an object store, a syscall and numpy's overhead locally): a tile's box is widened
# to read whole axes when that lowers calls * READ_CALL_BYTES + bytes read.
READ_CALL_BYTES = 64 * 1024

Box = tuple[tuple[int, int], ...]  # per axis: [lo, hi)
# A stored part of a tensor: its box in the whole tensor, and read(start, count) of
# its own row-major elements.
Part = tuple[Box, Callable[[int, int], np.ndarray]]


class Member(NamedTuple):
    """One piece of an assembled tensor: the box ``box`` of source tensor ``name``,
    landing with its first element at ``at`` in the assembled tensor. ``verify``: the
    run checks the source tensor's checksum while reading this piece (one piece of
    each source tensor does)."""

    name: str
    box: Box
    at: tuple[int, ...]
    verify: bool = True


# What the tiles fill an assembled tensor from: per member, its box in its source, where
# it lands, the source's shape and the source's stored parts.
_Placed = tuple[Box, tuple[int, ...], tuple[int, ...], Sequence[Part]]


def tiles(
    read: Callable[[int, int], np.ndarray] | None,
    shape: tuple[int, ...],
    perm: tuple[int, ...],
    itemsize: int,
    chunk_bytes: int,
    *,
    parts: Sequence[Part] | None = None,
) -> Iterator[np.ndarray]:
    """The tensor ``read(start, count)`` gives (row-major elements) with axes
    permuted, as consecutive flat pieces of the result in its row-major order.

    Each piece is a tile: at most ``chunk_bytes / 2`` of the result's consecutive
    elements (whole rows of its trailing axes where they fit, else part of one row),
    filled from the box of the source it covers, read in runs of at most
    ``chunk_bytes / 2``: a tile and one run are all that is held. A box's runs can be
    short (a transpose reads one per source row); the box is then widened to whole
    axes where that lowers ``read calls * READ_CALL_BYTES + bytes read``. That is the
    trade-off: what a tile reads beyond its need (read again for the next tiles) is at
    most ``READ_CALL_BYTES`` per read call it saves; ``(N, 3)`` by ``(1, 0)`` reads
    whole source rows, each three times, half the budget a call. Axes that stay
    adjacent and in order are merged first. ``parts`` (a partitioned tensor's stored
    slices), if given, are read instead of ``read``.
    """
    half = max(1, (chunk_bytes // 2) // max(itemsize, 1))
    if int(np.prod(shape, dtype=np.int64)) == 0:
        return
    if parts is None:
        assert read is not None
        shape, perm = collapse_axes(shape, perm)
        if list(perm) == sorted(perm):  # nothing moves: the source in order
            total = int(np.prod(shape, dtype=np.int64))
            for start in range(0, total, half):
                yield read(start, min(half, total - start))
            return
        parts = [(tuple((0, n) for n in shape), read)]
    whole = tuple((0, n) for n in shape)
    yield from _tiles_of([(whole, (0,) * len(shape), shape, parts)], shape, perm, itemsize, half)


def _tiles_of(
    placed: Sequence[_Placed],
    shape: tuple[int, ...],
    perm: tuple[int, ...],
    itemsize: int,
    half: int,
) -> Iterator[np.ndarray]:
    """The tensor of ``shape`` the ``placed`` boxes make up, axes permuted by ``perm``,
    in tiles of at most ``half`` elements (see :func:`tiles`)."""
    dtype = placed[0][3][0][1](0, 0).dtype
    out_shape = tuple(shape[p] for p in perm)
    inverse = tuple(int(i) for i in np.argsort(perm))
    for block in _result_blocks(out_shape, half):
        need = tuple(block[inverse[s]] for s in range(len(shape)))
        buf = np.empty(tuple(hi - lo for lo, hi in block), dtype=dtype)
        view = buf.transpose(inverse)
        for box, at, src_shape, parts in placed:
            met = [
                (max(n0, a), min(n1, a + b1 - b0)) for (n0, n1), a, (b0, b1) in zip(need, at, box)
            ]
            if any(lo >= hi for lo, hi in met):
                continue
            src_need = tuple(
                (lo - a + b0, hi - a + b0) for (lo, hi), a, (b0, _) in zip(met, at, box)
            )
            wide = _widest_cheap(src_need, src_shape, half, itemsize)
            into = view[tuple(slice(lo - n0, hi - n0) for (lo, hi), (n0, _) in zip(met, need))]
            _fill(into, src_need, wide, parts, half)
        yield buf.reshape(-1)


def collapse_axes(
    shape: tuple[int, ...], perm: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The same permutation with axes of size 1 dropped and source axes that stay
    adjacent and in order merged: ``(A, B, C)`` by ``(1, 2, 0)`` is ``(A, B*C)`` by
    ``(1, 0)``."""
    kept = [a for a in range(len(shape)) if shape[a] != 1]
    rank = {a: i for i, a in enumerate(kept)}
    order = [rank[a] for a in perm if shape[a] != 1]
    groups: list[list[int]] = []
    for a in order:
        if groups and a == groups[-1][-1] + 1:
            groups[-1].append(a)
        else:
            groups.append([a])
    by_source = sorted(range(len(groups)), key=lambda g: groups[g][0])
    new_shape = tuple(
        int(np.prod([shape[kept[a]] for a in groups[g]], dtype=np.int64)) for g in by_source
    )
    position = {g: i for i, g in enumerate(by_source)}
    return new_shape, tuple(position[g] for g in range(len(groups)))


def _result_blocks(out_shape: tuple[int, ...], half: int) -> Iterator[Box]:
    """Boxes of the result, in its row-major order, each a run of at most ``half``
    elements: one index of the axes before ``t``, a range of axis ``t``, all of the
    axes after it, ``t`` the first axis whose trailing axes fit."""
    t = 0
    while int(np.prod(out_shape[t + 1 :], dtype=np.int64)) > half:
        t += 1
    inner = int(np.prod(out_shape[t + 1 :], dtype=np.int64))
    step = max(1, half // inner)
    tail = tuple((0, n) for n in out_shape[t + 1 :])
    for index in itertools.product(*(range(n) for n in out_shape[:t])):
        head = tuple((i, i + 1) for i in index)
        for j0 in range(0, out_shape[t], step):
            yield head + ((j0, min(j0 + step, out_shape[t])),) + tail


def _cut(box: Box, shape: tuple[int, ...], limit: int) -> tuple[int, int, int]:
    """Where :func:`_pieces` cuts ``box``: the axis ``q`` stepped through (the axes after
    it whole in each piece), the elements those whole axes hold, and the step along ``q``."""
    k = len(shape)
    f = k
    while f > 0 and box[f - 1] == (0, shape[f - 1]):
        f -= 1
    q = max(f - 1, 0)
    while q < k - 1 and int(np.prod(shape[q + 1 :], dtype=np.int64)) > limit:
        q += 1
    inner = int(np.prod(shape[q + 1 :], dtype=np.int64))
    return q, inner, max(1, limit // inner)


def _pieces(box: Box, shape: tuple[int, ...], limit: int) -> Iterator[tuple[Box, int, int]]:
    """``box`` of the row-major array of ``shape`` as contiguous pieces of at most
    ``limit`` elements (or one element): (piece's box, first element, count)."""
    q, inner, step = _cut(box, shape, limit)
    strides = [int(np.prod(shape[s + 1 :], dtype=np.int64)) for s in range(len(shape))]
    tail = tuple((0, n) for n in shape[q + 1 :])
    lo, hi = box[q]
    for index in itertools.product(*(range(a, b) for a, b in box[:q])):
        base = sum(i * s for i, s in zip(index, strides))
        head = tuple((i, i + 1) for i in index)
        for j0 in range(lo, hi, step):
            j1 = min(j0 + step, hi)
            yield head + ((j0, j1),) + tail, base + j0 * strides[q], (j1 - j0) * inner


def _piece_count(box: Box, shape: tuple[int, ...], limit: int) -> int:
    """How many pieces :func:`_pieces` cuts ``box`` into, without cutting it."""
    q, _, step = _cut(box, shape, limit)
    outer = int(np.prod([b - a for a, b in box[:q]], dtype=np.int64))
    return outer * -(-(box[q][1] - box[q][0]) // step)


def _widest_cheap(need: Box, shape: tuple[int, ...], limit: int, itemsize: int) -> Box:
    """``need``, or ``need`` with its last non-whole axes made whole, whichever is
    cheapest to read at ``READ_CALL_BYTES`` a call."""
    call = READ_CALL_BYTES // max(itemsize, 1)

    def cost(box: Box) -> int:
        size = int(np.prod([b - a for a, b in box], dtype=np.int64))
        return _piece_count(box, shape, limit) * call + size

    best, best_cost = need, cost(need)
    box = list(need)
    for s in reversed(range(len(shape))):
        if box[s] != (0, shape[s]):
            box[s] = (0, shape[s])
            c = cost(tuple(box))
            if c < best_cost:
                best, best_cost = tuple(box), c
    return best


def _fill(out: np.ndarray, need: Box, wide: Box, parts: Sequence[Part], limit: int) -> None:
    """``out`` (``need``'s shape, source axis order, maybe a strided view) from the
    pieces of ``wide`` in each part, one read of at most ``limit`` elements a piece."""
    for bounds, read in parts:
        sub = tuple(
            (max(w0, b0) - b0, min(w1, b1) - b0) for (w0, w1), (b0, b1) in zip(wide, bounds)
        )
        if any(lo >= hi for lo, hi in sub):
            continue
        part_shape = tuple(b1 - b0 for b0, b1 in bounds)
        for piece, start, count in _pieces(sub, part_shape, limit):
            met = [
                (max(p0 + b0, n0), min(p1 + b0, n1))
                for (p0, p1), (b0, _), (n0, n1) in zip(piece, bounds, need)
            ]
            if any(lo >= hi for lo, hi in met):
                continue  # widened past what this tile needs
            got = read(start, count).reshape(tuple(p1 - p0 for p0, p1 in piece))
            out[tuple(slice(lo - n0, hi - n0) for (lo, hi), (n0, _) in zip(met, need))] = got[
                tuple(
                    slice(lo - p0 - b0, hi - p0 - b0)
                    for (lo, hi), (p0, _), (b0, _) in zip(met, piece, bounds)
                )
            ]


def partitioned_parts(ckpt: Checkpoint, name: str, info) -> list[Part]:
    """The stored slices of partitioned tensor ``name`` as :data:`Part` s for
    :func:`tiles`."""
    parts: list[Part] = []
    for extents in info.slices:
        bounds = tuple(
            (0, n) if ln is None else (s, s + ln) for (s, ln), n in zip(extents, info.shape)
        )
        parts.append((bounds, functools.partial(_read_slice_elements, ckpt, name, extents)))
    return parts


def _read_slice_elements(ckpt: Checkpoint, name: str, extents, start: int, count: int):
    return ckpt.read_elements(name, start, count, extents)


def permuted_chunks(
    ckpt: Checkpoint,
    name: str,
    perm: tuple[int, ...],
    chunk_bytes: int,
    read_bytes: int,
) -> Iterator[np.ndarray]:
    """The elements of tensor ``name`` transposed by ``perm``, in row-major pieces.

    A tensor of at most half the chunk budget is read whole and transposed; a bigger
    one is checked against its checksum first (read in pieces of ``read_bytes``), then
    read in tiles of the budget (:func:`tiles`), partitions too.
    """
    info = ckpt.info(name)
    if info.nbytes <= chunk_bytes // 2:
        yield np.ascontiguousarray(ckpt[name].transpose(perm)).reshape(-1)
        return
    # The checksums first, in buffers of this pass's own: none of them goes on down the
    # pipeline, whose ring may still hold the previous tensors' chunks in flight.
    for _ in ckpt.iter_chunks(name, read_bytes, buffers=BufferRing(3)):
        pass
    itemsize = _dt.lookup(info.dtype).fixed_itemsize
    yield from tiles(
        lambda start, count: ckpt.read_elements(name, start, count),
        info.shape,
        perm,
        itemsize,
        chunk_bytes,
        parts=partitioned_parts(ckpt, name, info) if info.slices else None,
    )


def assembled_chunks(
    ckpt: Checkpoint,
    members: Sequence[Member],
    shape: tuple[int, ...],
    perm: tuple[int, ...] | None,
    chunk_bytes: int,
    read_bytes: int,
) -> Iterator[np.ndarray]:
    """The tensor of ``shape`` the ``members`` make up (boxes of tensors of ``ckpt``),
    with axes permuted by ``perm`` (None: in order), in row-major pieces.

    Sources of at most half the chunk budget together are read whole (which checks
    their checksums) and cut with numpy; bigger ones are checked by the members that
    say ``verify`` (read in pieces of ``read_bytes``), then read in tiles of the
    budget (:func:`tiles`), partitions too.
    """
    if not members or int(np.prod(shape, dtype=np.int64)) == 0:
        return
    order = perm if perm is not None else tuple(range(len(shape)))
    infos = {m.name: ckpt.info(m.name) for m in members}
    if sum(i.nbytes for i in infos.values()) <= chunk_bytes // 2:
        wholes = {name: ckpt[name] for name in infos}
        out = np.empty(shape, dtype=wholes[members[0].name].dtype)
        for m in members:
            got = wholes[m.name][tuple(slice(lo, hi) for lo, hi in m.box)]
            out[tuple(slice(a, a + n) for a, n in zip(m.at, got.shape))] = got
        yield np.ascontiguousarray(out.transpose(order)).reshape(-1)
        return
    for m in members:
        if m.verify:  # in buffers of this pass's own (see permuted_chunks)
            for _ in ckpt.iter_chunks(m.name, read_bytes, buffers=BufferRing(3)):
                pass
    placed: list[_Placed] = []
    for m in members:
        info = infos[m.name]
        parts = (
            partitioned_parts(ckpt, m.name, info)
            if info.slices
            else [
                (tuple((0, n) for n in info.shape), functools.partial(ckpt.read_elements, m.name))
            ]
        )
        placed.append((m.box, m.at, info.shape, parts))
    itemsize = _dt.lookup(infos[members[0].name].dtype).fixed_itemsize
    half = max(1, (chunk_bytes // 2) // max(itemsize, 1))
    yield from _tiles_of(placed, shape, order, itemsize, half)
