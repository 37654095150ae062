"""Shard tasks: a plan cut into one task per output shard (the same cut for any
executor), each run by :func:`run_shard_task` through the pipeline
(:mod:`tfckpt.rewrite.streaming`); where tensors go (:class:`ShardPacker`) and which stay
partitioned."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tfckpt.checkpoint.opening import open_in
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.checkpoint.writer import ShardWriter
from tfckpt.errors import (
    CheckpointError,
)
from tfckpt.format import dtypes as _dt
from tfckpt.format.entryrows import EntryRows
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY
from tfckpt.format.slices import TF_SLICE_COPYABLE
from tfckpt.format.table import encode_varint
from tfckpt.io.commit import (
    new_shard_paths,
)
from tfckpt.io.storage import Storage, StorageOptions, storage_for
from tfckpt.rewrite.cast import OverflowPolicy
from tfckpt.rewrite.options import BACKENDS, EXECUTION, Options
from tfckpt.rewrite.pipeline import (
    cancel,
    cancelled,
    uncancel,
)
from tfckpt.rewrite.plans import Plan, PlannedTensor, Source
from tfckpt.rewrite.streaming import BundleSink, TaskItem, stream_items


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
        stores: RunStorage,
        dst: str,
        sources: list[str],
        object_graph: bytes | None,
        graph_shard: int | None,
        options: Options,
    ) -> list[ShardTask]:
        """One task per shard that holds anything, in shard order (the object graph in
        ``graph_shard``), written where :func:`~tfckpt.io.commit.new_shard_paths` says;
        ``sources`` (prefixes) are read from ``stores.sources``, ``dst`` is on
        ``stores.out``."""
        if not self.shards:
            self.place(0, 0)
        order = sorted(self.shards)
        graph_at = None if graph_shard is None else order.index(graph_shard)
        items_of = [self.shards[k] for k in order]
        out_paths = new_shard_paths(stores.out, dst, len(items_of))
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
                stores.out,
                list(stores.sources),
            )
            for k, items in enumerate(items_of)
        ]


class RunStorage(NamedTuple):
    """Where a run writes its output, and where it reads each of its sources."""

    out: Storage
    sources: Sequence[Storage]

    @classmethod
    def of(cls, p, storage_options: StorageOptions | None = None) -> RunStorage:
        """Those a plan (a :class:`~tfckpt.Plan` or an average's) was made with; with
        ``storage_options`` (given to the run), storages of the same paths made with those."""
        if storage_options is None:
            return cls(p.storage, [s.ckpt.storage for s in p.sources])
        return cls(
            storage_for(p.dst, storage_options),
            [storage_for(s.ckpt.prefix, storage_options) for s in p.sources],
        )


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
    store: Storage = field(repr=False)  # where path is
    source_stores: list[Storage] = field(repr=False)  # where each of the sources is

    @property
    def bytes_in(self) -> int:
        return sum(i.bytes_in for i in self.items)


@dataclass
class ShardResult:
    shard_id: int
    entries: EntryRows  # pickled as its columns between processes
    counts: dict[str, tuple[int, int, int, int]]
    bytes_in: int


def shard_tasks(
    p: Plan, options: Options | None = None, *, stores: RunStorage | None = None, **changes
) -> list[ShardTask]:
    """Cut the plan into one task per output shard (the same cut for any executor).

    By default each tensor keeps its source shard (offset by the shards of the
    sources before it), and only source shards that keep data become output
    shards, in their order (what a header declares creates nothing); with
    ``max_shard_bytes``, tensors are packed in plan order into shards of at most
    that size (a bigger tensor gets one of its own). Execution options as in
    :func:`execute`. The tasks write and read where the plan was made for, or ``stores``.

    >>> results = [run_shard_task(t) for t in shard_tasks(p)]
    """
    options = Options.of(p.options if options is None else options, EXECUTION, **changes)
    stores = stores if stores is not None else RunStorage.of(p)
    if p.weights is not None:
        return _mean_tasks(p, options, stores)
    follow = p.options.max_shard_bytes is None
    packer = ShardPacker(p.options.max_shard_bytes)
    tf_threshold = options.tf_threshold
    for t in p.tensors:
        src = p.sources[t.source]
        info = t.info
        cast = info.dtype != t.new_dtype
        tf_cast = cast and info.nbytes >= tf_threshold

        def item(extents, bytes_in: int, bytes_out: int, t=t, tf_cast=tf_cast) -> TaskItem:
            return task_item(t, extents, bytes_in, bytes_out, tf_cast)

        if not info.slices:  # the common case, a whole tensor (or one split or concat makes)
            at = src.shard_base + (info.shard or 0)
            packer.add(item(None, info.nbytes, t.bytes_out), at if follow else None)
            continue
        parts = src.ckpt.slice_info(t.name)
        if written_sliced(p, t):
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
        stores,
        p.dst,
        [s.ckpt.prefix for s in p.sources],
        p.object_graph,
        graph_shard,
        options,
    )


def task_item(
    t: PlannedTensor,
    extents,
    bytes_in: int,
    bytes_out: int,
    tf_cast: bool = False,
    weights: tuple[float, ...] = (),
) -> TaskItem:
    """What the pipeline streams for the planned tensor ``t`` (the slice ``extents`` of
    it, or None: all of it, with its value transforms); ``weights``: the mean of every
    source's value."""
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
        tf_cast,
        perm=t.perm if extents is None else None,
        weights=weights,
        reshape=t.shape if extents is None else None,
        parts=t.parts if extents is None else None,
        edit=t.edit,
    )


def _mean_tasks(p: Plan, options: Options, stores: RunStorage) -> list[ShardTask]:
    """An average's shard tasks: mean items read every source in step (copies only the
    newest), each tensor whole or slice by slice as the plan decided, in the newest
    source's layout unless ``max_shard_bytes`` packs them."""
    keep_layout = p.options.max_shard_bytes is None
    newest = p.sources[-1].ckpt
    n = len(p.sources)
    assert p.weights is not None
    packer = ShardPacker(p.options.max_shard_bytes)
    for t in p.tensors:
        out = _dt.lookup(t.new_dtype)
        pieces = sorted(newest.slice_info(t.name), key=_file_order) if t.sliced else [t.info]
        for piece in pieces:
            nbytes = piece.nbytes
            if t.new_dtype != t.info.dtype:
                nbytes = piece.size * out.fixed_itemsize
            item = task_item(
                t,
                piece.extents if t.sliced else None,
                piece.nbytes * (n if t.averaged else 1),
                t.bytes_out if not t.sliced else nbytes,
                weights=tuple(p.weights) if t.averaged else (),
            )
            packer.add(item, (piece.shard or 0) if keep_layout else None)
    graph_shard = None
    if p.object_graph is not None:
        at = (newest.info(OBJECT_GRAPH_KEY).shard or 0) if keep_layout else None
        graph_shard = packer.place(graph_bytes(p.object_graph), at)
    prefixes = [s.ckpt.prefix for s in p.sources]
    return packer.tasks(stores, p.dst, prefixes, p.object_graph, graph_shard, options)


def _file_order(info) -> tuple[int, int]:
    return (info.shard or 0, info.offset or 0)


def graph_bytes(object_graph: bytes) -> int:
    """What the object-graph tensor takes in a data shard (its framing included)."""
    return len(object_graph) + len(encode_varint(len(object_graph))) + 4


def run_tasks(tasks: list[ShardTask], executor, progress) -> list[ShardResult]:
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

    w = ShardWriter.create(task.store, task.path, durable=task.durable)
    try:
        needed = {item.source for item in task.items}
        needed.update(k for item in task.items for k in range(len(item.weights)))
        for source in sorted(needed):
            ckpts[source] = open_in(task.source_stores[source], task.sources[source], mmap=False)
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


def written_sliced(p: Plan, t: PlannedTensor) -> bool:
    """Whether the planned tensor ``t`` is written slice by slice: as its plan decided
    (an average), else when it is partitioned and stays so (:func:`_keep_sliced`)."""
    if t.sliced is not None:
        return t.sliced
    if t.perm is not None or t.shape is not None or t.parts is not None or t.edit is not None:
        return False  # transformed or edited: written whole
    return bool(t.info.slices) and _keep_sliced(p.sources[t.source], t)


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
        and written_sliced(p, t)
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
