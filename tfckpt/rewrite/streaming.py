"""The one pipeline every rewrite streams through: items read ahead (small tensors in
batches, permuted ones in tiles, means of several sources in step), cast here, and
written behind into a sink — a bundle shard (:class:`BundleSink`) or, for export, a
safetensors/npz file. :func:`stream_items` runs it; the engine's shard tasks, export and
import call it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter
from typing import Any

import numpy as np

from tfckpt.checkpoint.writer import ShardWriter
from tfckpt.errors import (
    UnsupportedCheckpointError,
)
from tfckpt.format import dtypes as _dt
from tfckpt.rewrite.cast import CastCounts, CastCountTable, Caster, OverflowPolicy
from tfckpt.rewrite.edits import edit_chunks
from tfckpt.rewrite.mean import ComplexCaster, accumulator, mean_chunks, weighted_mean
from tfckpt.rewrite.permute import Member, assembled_chunks, permuted_chunks
from tfckpt.rewrite.pipeline import (
    BufferRing,
    WriteBehind,
    cast_ring,
    prefetch,
    read_ring,
)


@dataclass(slots=True)  # one per tensor: 200 000 of them in a big plan
class TaskItem:
    """One tensor, or one slice of one, that a shard task writes."""

    source: int
    name: str
    new_name: str
    dtype: str
    new_dtype: str
    shape: tuple
    partitioned: bool  # the source tensor is partitioned
    extents: tuple | None  # which slice (None: the whole tensor)
    bytes_in: int
    bytes_out: int
    tf_cast: bool = False  # cast with tf.cast (a big tensor, tf backend)
    perm: tuple[int, ...] | None = None  # axes of the output (a permuted whole tensor)
    # With weights, the weighted mean of the tensor in sources 0, 1, ... (one weight
    # each, oldest first), summed in float64 or complex128 (see tfckpt.rewrite.mean).
    weights: tuple[float, ...] = ()
    reshape: tuple[int, ...] | None = None  # the shape written, when not the source's
    # Made by split or concat: boxes of source tensors (``shape`` is what they make).
    parts: tuple[Member, ...] | None = None
    # Edited by ``tfckpt edit``: the value produced by tfckpt.rewrite.edits instead.
    edit: Any = None

    @property
    def read_dtype(self) -> str:
        """The dtype of the pieces read: a mean's accumulator, else the source's."""
        return _ACCUMULATORS[self.dtype] if self.weights else self.dtype

    @property
    def out_shape(self) -> tuple:
        """The shape written: the source's, permuted, or as reshaped."""
        if self.reshape is not None:
            return self.reshape
        return self.shape if self.perm is None else tuple(self.shape[p] for p in self.perm)


_ACCUMULATORS = {d.name: accumulator(d).name for d in _dt.all_dtypes()}


def _read_bytes(chunk_bytes: int) -> int:
    """How many bytes one read takes: the budget covers every buffer of the rings."""
    return max(chunk_bytes // 8, 1 << 16)


def stream_items(
    items: Sequence[TaskItem],
    ckpts: Mapping[int, Any],
    sink,
    *,
    overflow: OverflowPolicy,
    chunk_bytes: int,
    endianness: str,
    counts: CastCountTable,
    tick: Callable[[int], None] | None = None,
    tf_convert=None,
) -> None:
    """Every item through one pipeline: read ahead, cast here, write behind into ``sink``.

    One reading thread and one writing thread serve all the items (see
    :mod:`tfckpt.rewrite.pipeline`), so a tensor costs no thread of its own; small
    tensors travel in batches, read together and cast together. ``ckpts`` maps each
    item's ``source`` to a :class:`~tfckpt.checkpoint.reader.Checkpoint`, or to what
    reads like one (``info``, ``iter_chunks``, ``read_together``, ``read_elements``,
    ``[name]``: an import's safetensors and npz files). ``sink.write(op)``
    takes the hand-overs in order, on the writing thread: ``open``/``write``/``close``
    a tensor streamed in pieces, ``batch`` several whole ones, and for a bundle
    ``lengths``/``data`` of a string tensor, ``add`` and ``raw`` (see
    :class:`BundleSink`; a safetensors or npz file is another sink). ``counts``
    gets each cast tensor's (overflow, to zero, subnormal, elements); ``tick`` is
    called with source bytes done, on this thread.
    """
    out = _CastOutput(cast_ring())
    casters: dict[tuple[str, str, bool], Caster | ComplexCaster] = {}

    def caster_for(item: TaskItem) -> Caster | ComplexCaster | None:
        read = item.read_dtype
        if read == item.new_dtype:
            return None
        key = (read, item.new_dtype, item.tf_cast)
        caster = casters.get(key)
        if caster is None and read == "complex128":  # a mean rounded to complex64
            caster = casters[key] = ComplexCaster(overflow)
        elif caster is None:
            caster = casters[key] = Caster(
                _dt.lookup(read),
                _dt.lookup(item.new_dtype),
                overflow,
                convert=tf_convert if item.tf_cast else None,
                buffers=out,
                bits=True,
            )
        return caster

    def handle(event: tuple) -> None:
        kind, item, payload, nbytes = event
        if kind == "chunk":
            caster = caster_for(item)
            if caster is not None:
                out.reserve(payload.size * caster.target.fixed_itemsize)
                before = _snapshot(caster.counts)
                payload = caster(payload)
                after = _snapshot(caster.counts)
                counts.add(item.new_name, tuple(a - b for a, b in zip(after, before)))
            writer.write(("write", item, payload))
        elif kind == "batch":
            writer.write(("batch", item, _cast_batch(item, payload, caster_for, out, counts)))
        else:
            if kind == "open" and caster_for(item) is not None:
                counts.add(item.new_name, (0, 0, 0, 0))
            writer.write(event)
        if nbytes is not None and tick is not None:
            tick(nbytes)

    reads = _reads(items, ckpts, chunk_bytes, endianness)
    with WriteBehind(sink) as writer, contextlib.closing(prefetch(reads)) as events:
        for event in events:
            # In a function of its own, so that nothing here keeps a buffer past its turn.
            handle(event)


def _snapshot(c: CastCounts) -> tuple[int, int, int, int]:
    return c.overflow, c.to_zero, c.subnormal, c.elements


class _CastOutput:
    """Where cast results go: consecutive pieces of one buffer of the cast ring.

    Each hand-over to the writer (a chunk, a batch) reserves one buffer, so the
    cast ring's size holds whatever a batch mixes.
    """

    def __init__(self, ring: BufferRing):
        self._ring = ring
        self._buf = ring(0)
        self._pos = 0

    def reserve(self, nbytes: int) -> None:
        self._buf = self._ring(nbytes)
        self._pos = 0

    def __call__(self, nbytes: int) -> np.ndarray:
        piece = self._buf[self._pos : self._pos + nbytes]
        if len(piece) != nbytes:
            raise RuntimeError("a cast result is larger than the space reserved for it")
        self._pos += nbytes
        return piece


def _cast_batch(items: list[TaskItem], arrays: list, caster_for, out: _CastOutput, counts) -> list:
    """Cast a batch of small tensors, each run of one cast in one call.

    Batched tensors are whole ones, so each name comes once: its counts are set.
    """
    # Runs of one (dtype read, target dtype) decide their caster (one lookup a run, not
    # a tensor); a mean's pieces are read in its accumulator's dtype.
    runs = []
    i = 0
    for (dtype, new_dtype), same in groupby(items, key=_dtypes):
        n = sum(1 for _ in same)
        runs.append((i, i + n, caster_for(items[i]) if dtype != new_dtype else None))
        i += n
    out.reserve(sum(sum(t.bytes_out for t in items[a:b]) for a, b, c in runs if c is not None))
    result: list = []
    for i, j, caster in runs:
        group = arrays[i:j]
        if caster is None:
            result += group
            continue
        src = group[0] if len(group) == 1 else np.concatenate(group)
        before = _snapshot(caster.counts)
        cast = caster(src)
        sizes = [a.size for a in group]
        table = np.zeros((len(sizes), 4), dtype=np.int64)
        table[:, 3] = sizes
        if _snapshot(caster.counts)[:3] != before[:3]:
            table[:, :3] = caster.count_segments(src, cast, sizes)
        counts.extend([item.new_name for item in items[i:j]], table)
        ends = np.cumsum(sizes).tolist()
        result += map(cast.__getitem__, map(slice, [0] + ends[:-1], ends))
    return result


_dtypes = attrgetter("read_dtype", "new_dtype")


# Small tensors are read together up to this many bytes (or a read's, if less): larger
# batches save no time (200 000 tensors of 1 KiB convert as fast with 2 MiB as with 8)
# and only grow the ring's buffers.
BATCH_BYTES = 2 << 20


def _batch_bytes(item: TaskItem, read_bytes: int) -> int:
    """How many source bytes a batch of ``item``'s kind reads: :data:`BATCH_BYTES` (or
    ``read_bytes``), or, for means, a quarter of ``read_bytes``: their batch holds
    besides what is read its concatenation and the float64 sum and term, about four
    times as much (float32 sources), and the reading thread that sums them spends
    about a millisecond a batch (a quarter of 2 MiB takes a quarter more time)."""
    return read_bytes // 4 if item.weights else min(read_bytes, BATCH_BYTES)


def _batch_of(item: TaskItem, read_bytes: int) -> tuple | None:
    """Which batch a small tensor can be read in: with the small tensors of its source
    that follow it, or, a mean, with the means that follow it (each source read
    together); None when it is read on its own."""
    if not (
        item.bytes_in <= _batch_bytes(item, read_bytes) // 2
        and item.extents is None
        and not item.partitioned
        and not item.tf_cast  # big by the backend's choice: on the device chunk by chunk
        and item.perm is None
        and item.parts is None
        and item.edit is None
        and item.dtype in _BATCHED_DTYPES
    ):
        return None
    if not item.weights:
        return (item.source,)
    return ("mean", item.weights) if item.dtype in _MEAN_BATCHED_DTYPES else None


# The dtypes read together: fixed-size ones with a numpy form (a spec: its numpy form
# is not made here, which for some would import ml-dtypes).
_BATCHED_DTYPES = frozenset(
    d.name for d in _dt.all_dtypes() if d is not _dt.STRING and d.spec is not None
)
# Means read together: real floating-point ones, whose sums are element by element
# (a complex mean is rounded part by part: see ComplexCaster).
_MEAN_BATCHED_DTYPES = frozenset(n for n in _BATCHED_DTYPES if _dt.lookup(n).kind == "float")


def _reads(items: Sequence[TaskItem], ckpts: Mapping[int, Any], chunk_bytes: int, endianness: str):
    """What the reading thread hands on: ``(kind, item, payload, source bytes)``.

    Small tensors that follow each other come as one ``batch`` (up to
    ``read_bytes``), read together; others as ``open``, their pieces, ``close``.
    Every buffer comes from one ring, whose size pipeline derives.
    """
    read_bytes = _read_bytes(chunk_bytes)
    ring = read_ring()
    mean_rings: dict[int, BufferRing] = {}  # a buffer per source, for batches of means
    batch: list[TaskItem] = []
    size = 0
    kind: tuple | None = None
    for item in items:
        joins = _batch_of(item, read_bytes)
        if batch and (joins != kind or size + item.bytes_in > _batch_bytes(item, read_bytes)):
            yield _read_batch(batch, size, ckpts, ring, mean_rings)
            batch, size = [], 0
        kind = joins
        if joins is not None:
            batch.append(item)
            size += item.bytes_in
        else:
            yield from _item_reads(ckpts, item, chunk_bytes, ring, endianness)
    if batch:
        yield _read_batch(batch, size, ckpts, ring, mean_rings)


def _read_batch(
    batch: list[TaskItem],
    size: int,
    ckpts: Mapping[int, Any],
    ring: BufferRing,
    mean_rings: dict[int, BufferRing],
) -> tuple:
    """The ``batch`` hand-over of small tensors read together (see :func:`_batch_of`)."""
    first = batch[0]
    if not first.weights:
        names = [i.name for i in batch]
        return ("batch", batch, ckpts[first.source].read_together(names, buffers=ring), size)
    n = len(first.weights)
    mean_ring = mean_rings.get(n) or mean_rings.setdefault(n, BufferRing(n))
    return ("batch", batch, _batch_means(batch, ckpts, mean_ring), size)


def _batch_means(
    batch: list[TaskItem], ckpts: Mapping[int, Any], ring: BufferRing
) -> list[np.ndarray]:
    """The weighted means of a batch of small whole tensors, in their accumulator's
    dtype: each source's values read together (into ``ring``, a buffer per source),
    then each run of one dtype summed in one go, element by element as a tensor's own
    pieces are (see :func:`~tfckpt.rewrite.mean.weighted_mean`). The source buffers
    are free again when this returns."""
    weights = batch[0].weights
    names = [i.name for i in batch]
    reads = [ckpts[k].read_together(names, buffers=ring) for k in range(len(weights))]
    out: list[np.ndarray] = []
    start = 0
    for dtype, run in groupby(batch, key=attrgetter("dtype")):
        end = start + sum(1 for _ in run)
        parts = [r[start] if end - start == 1 else np.concatenate(r[start:end]) for r in reads]
        acc = weighted_mean(parts, weights, accumulator(_dt.lookup(dtype)))
        sizes = [a.size for a in reads[0][start:end]]
        ends = np.cumsum(sizes).tolist()
        out += map(acc.__getitem__, map(slice, [0] + ends[:-1], ends))
        start = end
    return out


def _item_reads(
    ckpts: Mapping[int, Any], t: TaskItem, chunk_bytes: int, ring: BufferRing, endianness
):
    ckpt = ckpts[t.source]
    dtype = _dt.lookup(t.dtype)
    extents = t.extents
    read_bytes = _read_bytes(chunk_bytes)
    if t.edit is not None:
        yield ("open", t, None, None)
        for chunk in edit_chunks(ckpt, t, read_bytes):
            yield ("chunk", t, chunk, chunk.nbytes)
        yield ("close", t, None, None)
        return
    if t.weights:
        yield ("open", t, None, None)
        sources = [ckpts[k] for k in range(len(t.weights))]
        out = _dt.lookup(t.new_dtype)
        for acc, nbytes in mean_chunks(sources, t.name, extents, t.weights, out, chunk_bytes):
            yield ("chunk", t, acc, nbytes)
        yield ("close", t, None, None)
        return
    if t.parts is not None:
        yield ("open", t, None, None)
        for chunk in assembled_chunks(ckpt, t.parts, t.shape, t.perm, chunk_bytes, read_bytes):
            yield ("chunk", t, chunk, chunk.nbytes)
        yield ("close", t, None, None)
        return
    if t.perm is not None:
        yield ("open", t, None, None)
        for chunk in permuted_chunks(ckpt, t.name, t.perm, chunk_bytes, read_bytes):
            yield ("chunk", t, chunk, chunk.nbytes)
        yield ("close", t, None, None)
        return
    if dtype is _dt.STRING:
        if t.partitioned and extents is None:  # a partitioned tensor made whole
            yield ("add", t, ckpt[t.name], t.bytes_in)
            return
        # Lengths, then element bytes, in bounded pieces; the writer frames them anew
        # (in its own byte order), which gives the bytes TensorFlow writes.
        yield ("open", t, None, None)
        for kind, part, nbytes in ckpt.iter_string_parts(t.name, read_bytes, extents):
            yield (kind, t, part, nbytes)
        yield ("close", t, None, None)
        return
    if dtype.numpy is None:
        if ckpt.header.endianness != endianness:
            raise UnsupportedCheckpointError(
                f"{dtype.name} tensors of a {ckpt.header.endianness}-endian checkpoint cannot "
                "be rewritten",
                path=ckpt.prefix,
                tensor=t.name,
            )
        data = ckpt.read_bytes(t.name, extents)
        yield ("raw", t, data, len(data))
        return
    yield ("open", t, None, None)
    for chunk in ckpt.iter_chunks(t.name, read_bytes, extents=extents, buffers=ring):
        yield ("chunk", t, chunk, chunk.nbytes)
    yield ("close", t, None, None)


class BundleSink:
    """A shard of a V2 bundle as the sink of :func:`stream_items`: applies the
    hand-overs to a :class:`~tfckpt.checkpoint.writer.ShardWriter`, in order."""

    def __init__(self, w: ShardWriter):
        self._w = w
        self._stream: Any = None  # the open stream: a tensor's, or a string tensor's

    def write(self, op: tuple) -> None:
        kind, t = op[0], op[1]
        w = self._w
        if kind == "write":
            self._stream.write(op[2])
        elif kind == "batch":
            w.add_arrays(
                [(i.new_name, i.new_dtype, i.out_shape, data) for i, data in zip(t, op[2])]
            )
        elif kind == "open":
            if t.extents:
                self._stream = w.stream_slice(t.new_name, t.new_dtype, t.shape, t.extents)
            else:
                self._stream = w.stream(t.new_name, t.new_dtype, t.out_shape)
        elif kind == "close":
            stream, self._stream = self._stream, None
            stream.close()
        elif kind == "lengths":
            self._stream.write_lengths(op[2])
        elif kind == "data":
            self._stream.write_data(op[2])
        elif kind == "add":
            w.add(t.new_name, op[2], t.dtype)
        elif kind == "raw":
            extents = t.extents
            shape = (
                t.shape
                if not extents
                else tuple(d if n is None else n for d, (_, n) in zip(t.shape, extents))
            )
            w.add_raw(
                t.new_name,
                t.dtype,
                shape,
                op[2],
                extents=extents,
                full_shape=t.shape if extents else None,
            )
        else:
            raise AssertionError(kind)


class ProgressSink:
    """Passes the hand-overs of :func:`stream_items` on to ``sink`` and reports the
    bytes of each tensor piece written to ``progress`` (on the writing thread)."""

    def __init__(self, sink, progress: Callable[[int], None] | None):
        self._sink = sink
        self._progress = progress

    def write(self, op: tuple) -> None:
        self._sink.write(op)
        if self._progress is None:
            return
        if op[0] == "write":
            self._progress(op[2].nbytes)
        elif op[0] == "batch":
            self._progress(sum(a.nbytes for a in op[2]))
