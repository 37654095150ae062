"""One streaming engine for every rewrite: sources -> select -> rename -> cast -> one output.

:func:`~tfckpt.plan` decides, from the indexes alone, what each output tensor
is; :func:`execute` cuts the plan into one task per output shard, streams the
tensors through in bounded chunks and commits the output atomically.
:func:`transform` does both; :func:`convert`, :func:`rename`, :func:`select` and
:func:`merge` are thin helpers over it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfckpt._proto.tensor_bundle_pb2 import BundleEntryProto
from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.checkpoint.writer import ShardWriter
from tfckpt.errors import (
    CastOverflowError,
    CheckpointError,
    CheckpointWriteError,
    UnsupportedCheckpointError,
)
from tfckpt.format import dtypes as _dt
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY
from tfckpt.format.table import encode_varint
from tfckpt.io import paths
from tfckpt.io.commit import (
    commit_shards,
    merge_entries,
    new_shard_paths,
    write_state_file,
)
from tfckpt.io.storage import (
    StorageOptions,
    current_options,
    kept_options,
    storage_for,
    takes_storage_options,
)
from tfckpt.io.temporaries import remove_stale_temporaries
from tfckpt.rewrite import collector
from tfckpt.rewrite.cast import CastCounts, Caster, OverflowPolicy
from tfckpt.rewrite.mean import ComplexCaster, accumulator, mean_chunks
from tfckpt.rewrite.options import BACKENDS, EXECUTION, Options, RenameRules
from tfckpt.rewrite.permute import permuted_chunks
from tfckpt.rewrite.pipeline import (
    BufferRing,
    WriteBehind,
    cancel,
    cancelled,
    cast_ring,
    prefetch,
    read_ring,
    uncancel,
)
from tfckpt.rewrite.planner import Plan, PlannedTensor, Source, plan


@dataclass
class Summary:
    """What a transform did."""

    dst: str
    kept: int
    dropped: int
    renamed: int
    cast: int
    bytes_in: int
    bytes_out: int
    seconds: float
    cast_counts: dict[str, CastCounts] = field(default_factory=dict)
    # What the user must know although the output is committed (e.g. what TensorFlow
    # cannot restore, a state file not written).
    warnings: list[str] = field(default_factory=list)
    # Tensors per keep_dtype pattern and dtype rule, when the plan has any.
    dtype_rules: dict[str, int] | None = None

    def to_dict(self) -> dict:
        d = {
            k: getattr(self, k)
            for k in (
                "dst",
                "kept",
                "dropped",
                "renamed",
                "cast",
                "bytes_in",
                "bytes_out",
                "seconds",
                "warnings",
            )
        }
        d["overflow"] = {n: c.overflow for n, c in self.cast_counts.items() if c.overflow}
        d["to_zero"] = {n: c.to_zero for n, c in self.cast_counts.items() if c.to_zero}
        d["subnormal"] = {n: c.subnormal for n, c in self.cast_counts.items() if c.subnormal}
        if self.dtype_rules is not None:
            d["dtype_rules"] = self.dtype_rules
        return d


def _tf_converter(backend: str):
    """The ``tf.cast`` converter the backend asks for, or None for numpy."""
    if backend not in BACKENDS:
        raise CheckpointError(f"backend must be one of {', '.join(BACKENDS)}")
    if backend == "numpy":
        return None
    from tfckpt.tf import cast as tf_cast

    if backend == "auto" and not tf_cast.sees_gpu():
        return None
    return tf_cast.converter()


@collector.paused()
@takes_storage_options(kept_options)
def execute(
    p: Plan,
    options: Options | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Summary:
    """Write the planned checkpoint: one task per output shard, then the index.

    Each task reads the byte ranges its tensors need from the sources, streams
    them through the cast and writes its shard; the commit merges the tasks'
    index entries and writes the index last (like TensorFlow's
    MergeV2Checkpoints). ``executor`` runs the tasks: None runs them here, one
    after another (each already keeps both cores busy); anything with
    ``submit(fn, arg)`` returning futures — a ``concurrent.futures`` executor or a
    Dask ``distributed.Client`` — runs them there. The output is byte-identical
    whichever ran it. A failed task fails the run; nothing is committed.

    The execution options (see :class:`~tfckpt.Options`) are the plan's,
    replaced by ``options`` and amended by keyword arguments; what to write is
    the plan's alone. ``progress`` is called with source bytes done. With
    ``overflow='error'``, values beyond the target's range abort the run before
    anything is committed (:class:`~tfckpt.CastOverflowError`, listing every
    affected tensor). ``backend='tf'`` casts tensors of at least
    ``tf_threshold`` bytes with ``tf.cast`` on the best device (a GPU if
    TensorFlow sees one); ``'auto'`` does so only when there is a GPU. The bits
    are the same either way.

    >>> p = tfckpt.plan("train/", "fp16/", cast="float16")
    >>> tfckpt.execute(p, overflow="clip", executor=ThreadPoolExecutor(2))
    """
    start = time.perf_counter()
    options = Options.of(p.options if options is None else options, EXECUTION, **changes)
    tasks = shard_tasks(p, options)
    counts = run_and_commit(p.dst, tasks, options, bool(p.options.overwrite), progress)
    warnings = state_file_warnings(p.dst, p.sources)
    return Summary(
        p.dst,
        kept=len(p.tensors),
        dropped=len(p.dropped),
        renamed=sum(t.renamed for t in p.tensors),
        cast=sum(t.cast for t in p.tensors),
        bytes_in=p.bytes_in,
        bytes_out=p.bytes_out,
        seconds=time.perf_counter() - start,
        cast_counts=counts,
        warnings=restore_warnings(p) + warnings,
        dtype_rules=p.dtype_rule_counts(),
    )


def run_and_commit(
    dst: str,
    tasks: list[ShardTask],
    options: Options,
    overwrite: bool,
    progress: Callable[[int], None] | None = None,
) -> dict[str, CastCounts]:
    """Run the shard tasks of one output (``options.executor`` runs them, else here)
    and commit them as the checkpoint ``dst``, the index last; each tensor's cast
    counts. A failure (an overflow with ``overflow='error'`` too) commits nothing and
    removes the tasks' files and the directories this run made."""
    store = storage_for(dst)
    remove_stale_temporaries(dst)
    remove_stale_temporaries(store.join(store.dirname(dst), paths.STATE_FILENAME))
    try:
        made_dirs = store.makedirs(store.dirname(dst))  # innermost first
    except OSError as e:
        raise CheckpointWriteError(
            f"cannot create directory: {e.strerror or e}", path=dst
        ) from None
    try:
        results = _run_tasks(tasks, options.executor, progress)
        counts = {name: CastCounts(*c) for r in results for name, c in r.counts.items()}
        overflowed = {n: c.overflow for n, c in counts.items() if c.overflow}
        if options.overflow == "error" and overflowed:
            raise CastOverflowError(overflowed, dst)
        entries = merge_entries([r.entries for r in results])
        commit_shards(
            dst, [t.path for t in tasks], entries, durable=options.durable, overwrite=overwrite
        )
    except BaseException:
        for t in tasks:
            try:
                storage_for(t.path).remove(t.path)
            except (OSError, CheckpointError):
                pass
        store.remove_dirs(made_dirs)  # only those still empty
        raise
    return counts


def state_file_warnings(dst: str, sources: Sequence[Source]) -> list[str]:
    """Point the ``checkpoint`` state file beside ``dst`` at it, unless a source's
    directory is that directory (its state file is the source's); what the user must
    know when it cannot be written (the checkpoint is committed all the same)."""
    store = storage_for(dst)
    directory = store.dirname(dst) or "."
    for s in sources:
        src_dir = s.ckpt.storage.dirname(s.ckpt.prefix) or "."
        if s.ckpt.storage.realpath(src_dir) == store.realpath(directory):
            return []
    try:
        write_state_file(directory, store.basename(dst))
    except (OSError, CheckpointError) as e:
        # The checkpoint is committed: only the pointer to it is missing.
        detail = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return [f"the checkpoint is complete, but the state file was not written: {detail}"]
    return []


class ShardPacker:
    """Which output shard each item goes to: the one given (following a source's
    layout), or, given none, the last one while it stays under ``limit`` bytes (a
    bigger item gets one of its own)."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.shards: dict[int, list[TaskItem]] = {}
        self._sizes: dict[int, int] = {}

    def place(self, nbytes: int, shard: int | None) -> int:
        """The shard of an item of ``nbytes``; its bytes are counted there."""
        if shard is None:
            shard = max(len(self.shards) - 1, 0)
            assert self.limit is not None  # no shard given: packing by size
            size = self._sizes.get(shard, 0)
            if self.shards and size and size + nbytes > self.limit:
                shard += 1
        self.shards.setdefault(shard, [])
        self._sizes[shard] = self._sizes.get(shard, 0) + nbytes
        return shard

    def add(self, item: TaskItem, shard: int | None) -> None:
        """Place ``item`` (see :meth:`place`) and list it there."""
        self.shards[self.place(item.bytes_out, shard)].append(item)

    def tasks(
        self,
        dst: str,
        sources: list[str],
        object_graph: bytes | None,
        graph_shard: int | None,
        options: Options,
        storage_options: dict | None,
    ) -> list[ShardTask]:
        """One task per shard that holds anything, in shard order (the object graph in
        ``graph_shard``), written where :func:`~tfckpt.io.commit.new_shard_paths` says."""
        if not self.shards:
            self.place(0, 0)
        order = sorted(self.shards)
        graph_at = None if graph_shard is None else order.index(graph_shard)
        items_of = [self.shards[k] for k in order]
        out_paths = new_shard_paths(dst, len(items_of))
        items_of += [[] for _ in range(len(out_paths) - len(items_of))]  # extra shards: empty
        return [
            ShardTask(
                k,
                out_paths[k],
                sources,
                items,
                object_graph if k == graph_at else None,
                options.overflow,
                options.chunk_bytes,
                options.backend,
                options.durable,
                storage_options if current_options() is None else current_options(),
            )
            for k, items in enumerate(items_of)
        ]


@dataclass
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

    @property
    def read_dtype(self) -> str:
        """The dtype of the pieces read: a mean's accumulator, else the source's."""
        if not self.weights:
            return self.dtype
        return accumulator(_dt.lookup(self.dtype)).name

    @property
    def out_shape(self) -> tuple:
        """The shape written: the source's, or permuted."""
        return self.shape if self.perm is None else tuple(self.shape[p] for p in self.perm)


@dataclass
class ShardTask:
    """Everything one worker needs to write one output shard (picklable)."""

    shard_id: int
    path: str  # a temporary file locally; the final object remotely
    sources: list[str]
    items: list[TaskItem]
    object_graph: bytes | None
    overflow: OverflowPolicy
    chunk_bytes: int
    backend: str
    durable: bool
    storage_options: dict | None = field(default=None, repr=False)  # for sources and path

    @property
    def bytes_in(self) -> int:
        return sum(i.bytes_in for i in self.items)


@dataclass
class ShardResult:
    shard_id: int
    entries: dict[bytes, BundleEntryProto]  # pickled as their bytes between processes
    counts: dict[str, tuple[int, int, int, int]]
    bytes_in: int


def shard_tasks(p: Plan, options: Options | None = None, **changes) -> list[ShardTask]:
    """Cut the plan into one task per output shard (the same cut for any executor).

    By default each tensor keeps its source shard (offset by the shards of the
    sources before it), and only source shards that keep data become output
    shards, in their order (what a header declares creates nothing); with
    ``max_shard_bytes``, tensors are packed in plan order into shards of at most
    that size (a bigger tensor gets one of its own). Execution options as in
    :func:`execute`.

    >>> results = [run_shard_task(t) for t in shard_tasks(p)]
    """
    options = Options.of(p.options if options is None else options, EXECUTION, **changes)
    follow = p.options.max_shard_bytes is None
    packer = ShardPacker(p.options.max_shard_bytes)
    tf_threshold = options.tf_threshold
    for t in p.tensors:
        src = p.sources[t.source]
        info = t.info
        cast = info.dtype != t.new_dtype

        def item(extents, bytes_in: int, bytes_out: int, t=t, cast=cast) -> TaskItem:
            return TaskItem(
                t.source,
                t.name,
                t.new_name,
                t.info.dtype,
                t.new_dtype,
                t.info.shape,
                bool(t.info.slices),
                extents,
                bytes_in,
                bytes_out,
                cast and t.info.nbytes >= tf_threshold,
            )

        if not info.slices:  # the common case, a whole tensor
            at = src.shard_base + (info.shard or 0)
            packer.add(item(None, info.nbytes, t.bytes_out), at if follow else None)
            continue
        parts = src.ckpt.slice_info(t.name)
        if _keep_sliced(src, t):
            target = _dt.lookup(t.new_dtype)
            for sl in sorted(parts, key=lambda x: (x.shard, x.offset)):
                out = sl.nbytes if not cast else sl.size * target.fixed_itemsize
                at = src.shard_base + (sl.shard or 0)
                packer.add(item(sl.extents, sl.nbytes, out), at if follow else None)
            continue
        # A partitioned tensor written whole goes where its first slice was.
        at = src.shard_base + min(x.shard or 0 for x in parts)
        packer.add(item(None, info.nbytes, t.bytes_out), at if follow else None)
    graph_shard = None
    if p.object_graph is not None:
        graph_at = None
        if follow:
            first_tf2 = next(s for s in p.sources if s.graph is not None)
            graph_at = first_tf2.shard_base + (first_tf2.ckpt.info(OBJECT_GRAPH_KEY).shard or 0)
        graph_shard = packer.place(graph_bytes(p.object_graph), graph_at)
    return packer.tasks(
        p.dst,
        [s.ckpt.prefix for s in p.sources],
        p.object_graph,
        graph_shard,
        options,
        p.storage_options,
    )


def graph_bytes(object_graph: bytes) -> int:
    """What the object-graph tensor takes in a data shard (its framing included)."""
    return len(object_graph) + len(encode_varint(len(object_graph))) + 4


def _run_tasks(tasks: list[ShardTask], executor, progress) -> list[ShardResult]:
    if executor is None:
        return [run_shard_task(t, progress) for t in tasks]
    futures = [executor.submit(run_shard_task, t) for t in tasks]
    results = []
    try:
        for f in futures:
            try:
                results.append(f.result())
            except Exception as e:
                if isinstance(e, CheckpointError):
                    raise
                raise CheckpointError(f"a shard task failed: {type(e).__name__}: {e}") from e
            if progress:
                progress(results[-1].bytes_in)
    except BaseException:
        # Stop what has not started, and wait for what runs to stop before the
        # clean-up, or it would write its shard after the clean-up removed it.
        cancel(t.path for t in tasks)
        try:
            for f in futures:
                f.cancel()
            for f in futures:
                try:
                    f.result()
                except BaseException:
                    pass
        finally:
            uncancel(t.path for t in tasks)
        raise
    return results


@takes_storage_options(kept_options)
def run_shard_task(task: ShardTask, progress: Callable[[int], None] | None = None) -> ShardResult:
    """Write one shard: its tensors, read from the sources and cast, in plan order.

    What an executor runs; ``progress`` is called with source bytes done.

    >>> results = [run_shard_task(t) for t in shard_tasks(p)]
    """
    ckpts: dict[int, Checkpoint] = {}
    counts: dict[str, tuple[int, int, int, int]] = {}

    def tick(nbytes: int) -> None:
        if cancelled(task.path):
            raise CheckpointError("cancelled: the run failed elsewhere", path=task.path)
        if progress:
            progress(nbytes)

    w = ShardWriter.create(task.path, durable=task.durable)
    try:
        needed = {item.source for item in task.items}
        needed.update(k for item in task.items for k in range(len(item.weights)))
        for source in sorted(needed):
            ckpts[source] = open_checkpoint(task.sources[source], mmap=False)
        tf_convert = _tf_converter(task.backend) if any(i.tf_cast for i in task.items) else None
        stream_items(
            task.items,
            ckpts,
            BundleSink(w),
            overflow=task.overflow,
            chunk_bytes=task.chunk_bytes,
            endianness=w.endianness,
            counts=counts,
            tick=tick,
            tf_convert=tf_convert,
        )
        if task.object_graph is not None:
            w.add(OBJECT_GRAPH_KEY, np.array(task.object_graph, dtype=object))
        entries = w.finish()
    except BaseException:
        w.abort()
        raise
    finally:
        for ckpt in ckpts.values():
            ckpt.close()
    return ShardResult(task.shard_id, entries, counts, task.bytes_in)


# Dtypes TensorFlow's reader can reassemble from slices (tensor_bundle's copy list).
TF_SLICE_COPYABLE = frozenset(
    {
        "float32",
        "float64",
        "int32",
        "uint8",
        "int16",
        "int8",
        "complex64",
        "complex128",
        "int64",
        "bool",
        "qint32",
        "quint8",
        "qint8",
        "bfloat16",
    }
)


def _keep_sliced(src: Source, t: PlannedTensor) -> bool:
    """Whether a partitioned tensor stays partitioned in the output.

    TF1 partitioned variables read back exactly their own slices, which works for
    every dtype. TF2 variables saved in slices (MaxShardSizePolicy) are read back
    whole, which TensorFlow can only reassemble for some dtypes: float16 slices,
    for one, it cannot restore. Such tensors are written whole instead, as are
    those the plan marks ``restored_whole`` (a TF1 slice grafted into a TF2 checkpoint).
    """
    whole = src.graph is not None or t.restored_whole
    return not whole or t.new_dtype in TF_SLICE_COPYABLE or t.info.partial


def restore_warnings(p: Plan) -> list[str]:
    """What of the output TensorFlow can restore only in part, and why.

    A partitioned tensor cast to a dtype TensorFlow cannot copy between slices
    (float16, float8) stays in its source's slices: TensorFlow then restores each
    slice into a variable partitioned the same way (as the source's partitioned
    variables are), but cannot read the tensor whole or repartition it. A whole
    tensor would be worse: no slice of it could be restored.
    """
    sliced = [
        t
        for t in p.tensors
        if t.info.slices
        and t.cast
        and t.new_dtype not in TF_SLICE_COPYABLE
        and _keep_sliced(p.sources[t.source], t)
    ]
    if not sliced:
        return []
    names = ", ".join(t.new_name for t in sliced[:5]) + (", ..." if len(sliced) > 5 else "")
    dtypes = "/".join(sorted({t.new_dtype for t in sliced}))
    return [
        f"{len(sliced)} partitioned tensor(s) stay partitioned in {dtypes} ({names}): "
        f"TensorFlow restores {dtypes} slices only into variables partitioned exactly "
        "as in the source; it cannot assemble them, so reading them whole or into other "
        "partitions fails"
    ]


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
    counts: dict[str, tuple[int, int, int, int]],
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
                _add_counts(counts, item.new_name, _snapshot(caster.counts), before)
            writer.write(("write", item, payload))
        elif kind == "batch":
            writer.write(("batch", item, _cast_batch(item, payload, caster_for, out, counts)))
        else:
            if kind == "open" and caster_for(item) is not None:
                counts.setdefault(item.new_name, (0, 0, 0, 0))
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


def _add_counts(counts: dict, name: str, after: tuple, before: tuple) -> None:
    old = counts.get(name, (0, 0, 0, 0))
    counts[name] = tuple(o + a - b for o, a, b in zip(old, after, before))


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
    casters = [caster_for(item) for item in items]
    out.reserve(sum(item.bytes_out for item, c in zip(items, casters) if c is not None))
    result: list = []
    i = 0
    while i < len(items):
        caster = casters[i]
        j = i + 1
        while j < len(items) and casters[j] is caster:
            j += 1
        group = arrays[i:j]
        if caster is None:
            result += group
            i = j
            continue
        src = group[0] if len(group) == 1 else np.concatenate(group)
        before = _snapshot(caster.counts)
        cast = caster(src)
        sizes = [a.size for a in group]
        if _snapshot(caster.counts)[:3] == before[:3]:
            for item, size in zip(items[i:j], sizes):
                counts[item.new_name] = (0, 0, 0, size)
        else:
            rows = caster.count_segments(src, cast, sizes).tolist()
            for item, (over, to_zero, subnormal), size in zip(items[i:j], rows, sizes):
                counts[item.new_name] = (over, to_zero, subnormal, size)
        pos = 0
        for size in sizes:
            result.append(cast[pos : pos + size])
            pos += size
        i = j
    return result


def _batchable(item: TaskItem, read_bytes: int) -> bool:
    dtype = _dt.lookup(item.dtype)
    return (
        item.extents is None
        and not item.partitioned
        and not item.tf_cast  # big by the backend's choice: on the device chunk by chunk
        and item.perm is None
        and not item.weights
        and dtype is not _dt.STRING
        and dtype.numpy is not None
        and item.bytes_in <= read_bytes // 2
    )


def _reads(items: Sequence[TaskItem], ckpts: Mapping[int, Any], chunk_bytes: int, endianness: str):
    """What the reading thread hands on: ``(kind, item, payload, source bytes)``.

    Small tensors that follow each other come as one ``batch`` (up to
    ``read_bytes``), read together; others as ``open``, their pieces, ``close``.
    Every buffer comes from one ring, whose size pipeline derives.
    """
    read_bytes = _read_bytes(chunk_bytes)
    ring = read_ring()
    batch: list[TaskItem] = []
    size = 0
    for item in items:
        small = _batchable(item, read_bytes)
        if batch and (
            not small or item.source != batch[0].source or size + item.bytes_in > read_bytes
        ):
            names = [i.name for i in batch]
            yield ("batch", batch, ckpts[batch[0].source].read_together(names, buffers=ring), size)
            batch, size = [], 0
        if small:
            batch.append(item)
            size += item.bytes_in
        else:
            yield from _item_reads(ckpts, item, chunk_bytes, ring, endianness)
    if batch:
        names = [i.name for i in batch]
        yield ("batch", batch, ckpts[batch[0].source].read_together(names, buffers=ring), size)


def _item_reads(
    ckpts: Mapping[int, Any], t: TaskItem, chunk_bytes: int, ring: BufferRing, endianness
):
    ckpt = ckpts[t.source]
    dtype = _dt.lookup(t.dtype)
    extents = t.extents
    read_bytes = _read_bytes(chunk_bytes)
    if t.weights:
        yield ("open", t, None, None)
        sources = [ckpts[k] for k in range(len(t.weights))]
        out = _dt.lookup(t.new_dtype)
        for acc, nbytes in mean_chunks(sources, t.name, extents, t.weights, out, chunk_bytes):
            yield ("chunk", t, acc, nbytes)
        yield ("close", t, None, None)
        return
    if t.perm is not None:
        yield ("open", t, None, None)
        for chunk in permuted_chunks(ckpt, t.name, t.perm, chunk_bytes, read_bytes, ring):
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
            w.add_arrays([(i.new_name, i.new_dtype, i.shape, data) for i, data in zip(t, op[2])])
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


@takes_storage_options()
def transform(
    sources,
    dst,
    options: Options | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Summary:
    """Select, rename and cast the tensors of one or more checkpoints into a new one.

    :func:`~tfckpt.plan`, then :func:`execute`. ``options`` is an
    :class:`~tfckpt.Options` (every option and its default is described there);
    keyword arguments build or amend it. ``sources`` and ``dst`` may be fsspec
    URLs, opened with ``storage_options`` (endpoint, credentials, ``anon=True``...);
    ``progress`` is called with source bytes done.

    >>> tfckpt.transform("ckpt/model", "out/", cast="float16", exclude=["/Adam"])
    >>> tfckpt.transform(["a/ckpt", "b/ckpt"], "c/", tfckpt.Options(prefer="last"))
    """
    return execute(plan(sources, dst, options, **changes), progress=progress)


@takes_storage_options()
def convert(
    src,
    dst,
    dtype: str,
    options: Options | None = None,
    *,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Summary:
    """Cast every floating-point tensor to ``dtype`` (see :func:`transform`).

    >>> tfckpt.convert("train/model.ckpt-7", "fp16/", "float16")
    >>> tfckpt.convert("train/model.ckpt-7", "bf16/", "bfloat16", overflow="clip")
    """
    return transform(src, dst, options, cast=dtype, **changes)


@takes_storage_options()
def rename(
    src,
    dst,
    rules: RenameRules,
    options: Options | None = None,
    *,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Summary:
    """Rename tensors by ordered ``{regex: replacement}`` rules (see :func:`transform`).

    >>> tfckpt.rename("pre/model", "new/model", {"simple-conv1/": "complex-conv1/"})
    """
    return transform(src, dst, options, rename=rules, **changes)


@takes_storage_options()
def select(
    src,
    dst,
    options: Options | None = None,
    *,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Summary:
    """Keep only some tensors or objects: ``include``, ``exclude``, ``drop_objects``
    (see :func:`transform`).

    >>> tfckpt.select("trained/ckpt-3", "shipped/", drop_objects=["optimizer"])
    """
    return transform(src, dst, options, **changes)


@takes_storage_options()
def merge(
    sources: Sequence,
    dst,
    options: Options | None = None,
    *,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Summary:
    """Combine several checkpoints into one; ``prefer`` picks the winner of a shared
    name (see :func:`transform`).

    >>> tfckpt.merge(["a/ckpt-1", "b/ckpt-1"], "c/ckpt", prefer="first")
    """
    return transform(list(sources), dst, options, **changes)
