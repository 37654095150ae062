"""Shard tasks: a plan cut into one task per output shard (the same cut for any
executor), each run by :func:`run_shard_task` through the pipeline
(:mod:`tfckpt.rewrite.streaming`); where tensors go (:class:`ShardPacker`) and which stay
partitioned."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from tfckpt.rewrite.cast import CastCountTable, OverflowPolicy
from tfckpt.rewrite.options import BACKENDS, EXECUTION, Options
from tfckpt.rewrite.pipeline import (
    cancel,
    cancelled,
    uncancel,
)
from tfckpt.rewrite.plans import Plan, PlannedTensor, PlannedTensors, Source
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


def check_backend(backend: str) -> None:
    """Load what ``backend`` needs (TensorFlow, for ``'tf'`` and ``'auto'``) before
    anything is written: a missing one is a CheckpointError then, not in a task."""
    _tf_converter(backend)


class TaskItems(Sequence[TaskItem]):
    """A shard task's items, made one at a time as they are read: most are rows of the
    plan's columns (a whole tensor as it is), the others items kept whole (a slice, a
    transform, a mean, an edit).

    A task run where the plan was made reads the plan's columns; pickled (for an
    executor elsewhere) it carries its own rows of them. An average's rows marked
    ``averaged`` are the mean of every source's value, with ``weights``.
    """

    def __init__(self, tensors: PlannedTensors, tf_threshold: int, weights: tuple = ()):
        self.tensors = tensors
        self.tf_threshold = tf_threshold
        self.weights = weights
        self.rows = array("q")  # >= 0: a row of ``tensors``; < 0: ~k, ``others[k]``
        self.others: list[TaskItem] = []

    def __getstate__(self) -> dict:
        plain = sorted({r for r in self.rows if r >= 0})
        at = {r: k for k, r in enumerate(plain)}
        state = dict(self.__dict__)
        state["tensors"] = self.tensors.take(plain)
        state["rows"] = array("q", [r if r < 0 else at[r] for r in self.rows])
        return state

    def append(self, item: TaskItem) -> None:
        """Add ``item`` as the last one."""
        self.rows.append(~len(self.others))
        self.others.append(item)

    def append_row(self, row: int) -> None:
        """Add row ``row`` of the plan's tensors, written whole as it is."""
        self.rows.append(row)

    def sources(self) -> set[int]:
        """The sources the items read (a mean's: every one it weighs)."""
        t = self.tensors
        out = {t.source[r] for r in self.rows if r >= 0}
        if self.weights and any(t.averaged[r] for r in self.rows if r >= 0):
            out.update(range(len(self.weights)))
        for item in self.others:
            out.add(item.source)
            out.update(range(len(item.weights)))
        return out

    @property
    def bytes_in(self) -> int:
        rows = np.frombuffer(self.rows, dtype=np.int64)
        rows = rows[rows >= 0]
        plain = self.tensors.infos.nbytes.values()[rows]
        if self.weights:  # a mean reads every source
            averaged = np.frombuffer(self.tensors.averaged, dtype=np.uint8)[rows]
            plain = plain * np.where(averaged, len(self.weights), 1)
        return int(plain.sum()) + sum(i.bytes_in for i in self.others)

    def tf_cast(self) -> bool:
        """Whether any item is cast with ``tf.cast``."""
        t, infos, threshold = self.tensors, self.tensors.infos, self.tf_threshold
        if self.weights:  # an average's: cast with numpy
            return any(item.tf_cast for item in self.others)
        return any(item.tf_cast for item in self.others) or any(
            infos.nbytes[r] >= threshold and infos.dtypes[r] != t.new_dtype[r]
            for r in self.rows
            if r >= 0
        )

    def __len__(self) -> int:
        return len(self.rows)

    def __eq__(self, other) -> bool:
        if not isinstance(other, TaskItems):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # compared by its items

    def _item(self, k: int) -> TaskItem:
        r = self.rows[k]
        if r < 0:
            return self.others[~r]
        t, infos = self.tensors, self.tensors.infos
        # nbytes is never None: read as stored, past Ints' slower reading.
        dtype, new_dtype, nbytes = (
            infos.dtypes[r],
            t.new_dtype[r],
            array.__getitem__(infos.nbytes, r),
        )
        if self.weights and t.averaged[r]:  # a mean: every source read, cast with numpy
            w = self.weights
            return TaskItem(
                t.source[r],
                t.name[r],
                t.new_name[r],
                dtype,
                new_dtype,
                infos.shapes[r],
                False,
                None,
                nbytes * len(w),
                t.bytes_out[r],
                weights=w,
            )
        return TaskItem(
            t.source[r],
            t.name[r],
            t.new_name[r],
            dtype,
            new_dtype,
            infos.shapes[r],
            False,
            None,
            nbytes,
            t.bytes_out[r],
            dtype != new_dtype and nbytes >= self.tf_threshold and not self.weights,
        )

    def __getitem__(self, k):
        n = len(self.rows)
        if isinstance(k, slice):
            return [self._item(j) for j in range(*k.indices(n))]
        if not -n <= k < n:
            raise IndexError(k)
        return self._item(k % n)

    def __iter__(self) -> Iterator[TaskItem]:
        return map(self._item, range(len(self.rows)))


class ShardPacker:
    """Which output shard each item goes to: the one given (following a source's
    layout), or, given none, the last one while it stays under ``limit`` bytes (a
    bigger item gets one of its own)."""

    def __init__(
        self, limit: int | None, tensors: PlannedTensors, tf_threshold: int, weights: tuple = ()
    ):
        self.limit = limit
        # What TaskItems read.
        self.tensors, self.tf_threshold, self.weights = tensors, tf_threshold, weights
        self.shards: dict[int, TaskItems] = {}
        self._sizes: dict[int, int] = {}

    def place(self, nbytes: int, shard: int | None) -> int:
        """The shard of an item of ``nbytes``; its bytes are counted there."""
        if shard is None:
            shard = max(len(self.shards) - 1, 0)
            assert self.limit is not None  # no shard given: packing by size
            size = self._sizes.get(shard, 0)
            if self.shards and size and size + nbytes > self.limit:
                shard += 1
        if shard not in self.shards:
            self.shards[shard] = self._items()
        self._sizes[shard] = self._sizes.get(shard, 0) + nbytes
        return shard

    def _items(self) -> TaskItems:
        return TaskItems(self.tensors, self.tf_threshold, self.weights)

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
        items_of += [self._items() for _ in range(len(out_paths) - len(items_of))]  # empty
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
    items: TaskItems
    object_graph: bytes | None
    overflow: OverflowPolicy
    chunk_bytes: int
    backend: str
    durable: bool
    store: Storage = field(repr=False)  # where path is
    source_stores: list[Storage] = field(repr=False)  # where each of the sources is

    @property
    def bytes_in(self) -> int:
        return self.items.bytes_in


@dataclass
class ShardResult:
    shard_id: int
    entries: EntryRows  # pickled as its columns between processes
    counts: CastCountTable
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
    tf_threshold = options.tf_threshold
    tensors, infos = p.tensors, p.tensors.infos
    packer = ShardPacker(p.options.max_shard_bytes, tensors, tf_threshold)
    bases = [s.shard_base for s in p.sources]
    special = {i for i, sl in enumerate(infos.slices) if sl} | set(tensors.extras)
    rows = zip(tensors.source, infos.shards, tensors.bytes_out)
    for i, (source, shard, bytes_out) in enumerate(rows):
        if i in special:
            _pack_planned(p, tensors[i], packer, follow, tf_threshold)
            continue
        # The common case, a whole tensor as it is: a row of the plan.
        at = packer.place(bytes_out, bases[source] + (shard or 0) if follow else None)
        packer.shards[at].append_row(i)
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


def _pack_planned(
    p: Plan, t: PlannedTensor, packer: ShardPacker, follow: bool, tf_threshold: int
) -> None:
    """Pack the items of planned tensor ``t``: a partitioned one (whole, or slice by
    slice), or one made or transformed (see :func:`task_item`)."""
    src = p.sources[t.source]
    info = t.info
    cast = info.dtype != t.new_dtype
    tf_cast = cast and info.nbytes >= tf_threshold

    def item(extents, bytes_in: int, bytes_out: int) -> TaskItem:
        return task_item(t, extents, bytes_in, bytes_out, tf_cast)

    if not info.slices:  # a whole tensor (or one split or concat makes)
        at = src.shard_base + (info.shard or 0)
        packer.add(item(None, info.nbytes, t.bytes_out), at if follow else None)
        return
    parts = src.ckpt.slice_info(t.name)
    if written_sliced(p, t):
        target = _dt.lookup(t.new_dtype)
        for sl in sorted(parts, key=lambda x: (x.shard, x.offset)):
            out = sl.nbytes if not cast else sl.size * target.fixed_itemsize
            at = src.shard_base + (sl.shard or 0)
            packer.add(item(sl.extents, sl.nbytes, out), at if follow else None)
        return
    # A partitioned tensor written whole goes where its first slice was.
    at = src.shard_base + min(x.shard or 0 for x in parts)
    packer.add(item(None, info.nbytes, t.bytes_out), at if follow else None)


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
    info, extras = t.info, t.extras()  # each read once: a plan's row reads its columns
    whole = extents is None
    return TaskItem(
        t.source,
        t.name,
        t.new_name,
        info.dtype,
        t.new_dtype,
        info.shape,
        bool(info.slices),
        extents,
        bytes_in,
        bytes_out,
        tf_cast,
        perm=extras.get("perm") if whole else None,
        weights=weights,
        reshape=extras.get("shape") if whole else None,
        parts=extras.get("parts") if whole else None,
        edit=extras.get("edit"),
    )


def _mean_tasks(p: Plan, options: Options, stores: RunStorage) -> list[ShardTask]:
    """An average's shard tasks: mean items read every source in step (copies only the
    newest), each tensor whole or slice by slice as the plan decided, in the newest
    source's layout unless ``max_shard_bytes`` packs them."""
    keep_layout = p.options.max_shard_bytes is None
    newest = p.sources[-1].ckpt
    n = len(p.sources)
    assert p.weights is not None
    weights = tuple(p.weights)
    tensors = p.tensors
    packer = ShardPacker(p.options.max_shard_bytes, tensors, options.tf_threshold, weights)
    special = {i for i, sl in enumerate(tensors.infos.slices) if sl} | set(tensors.extras)
    for i, (row_shard, bytes_out) in enumerate(zip(tensors.infos.shards, tensors.bytes_out)):
        if i not in special:  # the common case, a whole tensor: a row of the plan
            at = packer.place(bytes_out, (row_shard or 0) if keep_layout else None)
            packer.shards[at].append_row(i)
            continue
        t = tensors[i]
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
                weights=weights if t.averaged else (),
            )
            if t.averaged and not t.sliced:  # partitioned here or in an older source
                item.partitioned = True
            packer.add(item, (piece.shard or 0) if keep_layout else None)
    graph_shard = None
    if p.object_graph is not None:
        graph_at = (newest.info(OBJECT_GRAPH_KEY).shard or 0) if keep_layout else None
        graph_shard = packer.place(graph_bytes(p.object_graph), graph_at)
    prefixes = [s.ckpt.prefix for s in p.sources]
    return packer.tasks(stores, p.dst, prefixes, p.object_graph, graph_shard, options)


def _file_order(info) -> tuple[int, int]:
    return (info.shard or 0, info.offset or 0)


def graph_bytes(object_graph: bytes) -> int:
    """What the object-graph tensor takes in a data shard (its framing included)."""
    return len(object_graph) + len(encode_varint(len(object_graph))) + 4


def run_tasks(
    tasks: list[ShardTask], executor, progress, opened: Mapping[int, Checkpoint] | None = None
) -> list[ShardResult]:
    """Run the tasks on ``executor`` (None: here, one after another, reading the sources
    ``opened`` has open already: see :func:`run_shard_task`); their results, in order."""
    if executor is None:
        return [run_shard_task(t, progress, opened=opened) for t in tasks]
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


def run_shard_task(
    task: ShardTask,
    progress: Callable[[int], None] | None = None,
    *,
    opened: Mapping[int, Checkpoint] | None = None,
) -> ShardResult:
    """Write one shard: its tensors, read from the sources and cast, in plan order.

    What an executor runs; ``progress`` is called with source bytes done. ``opened``:
    sources open already, by number (the plan's, when the tasks run where it was
    made), read instead of opened anew and left open: a second copy of a big index
    would cost as much memory as the first.

    >>> results = [run_shard_task(t) for t in shard_tasks(p)]
    """
    ckpts: dict[int, Checkpoint] = {}
    counts = CastCountTable()

    def tick(nbytes: int) -> None:
        if cancelled(task.path):
            raise CheckpointError("cancelled: the run failed elsewhere", path=task.path)
        if progress:
            progress(nbytes)

    w = ShardWriter.create(task.store, task.path, durable=task.durable)
    try:
        for source in sorted(task.items.sources()):
            if opened is not None and source in opened:
                continue
            ckpts[source] = open_in(task.source_stores[source], task.sources[source], mmap=False)
        tf_convert = _tf_converter(task.backend) if task.items.tf_cast() else None
        stream_items(
            task.items,
            {**(opened or {}), **ckpts},
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
    partitioned = (p.tensors[i] for i, sl in enumerate(p.tensors.infos.slices) if sl)
    sliced = [
        t
        for t in partitioned
        if t.cast and t.new_dtype not in TF_SLICE_COPYABLE and written_sliced(p, t)
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
