"""One streaming engine for every rewrite: sources -> select -> rename -> cast -> one output.

:func:`~tfckpt.plan` decides, from the indexes alone, what each output tensor
is; :func:`execute` cuts the plan into one task per output shard, streams the
tensors through in bounded chunks and commits the output atomically.
:func:`transform` does both; :func:`convert`, :func:`rename`, :func:`select` and
:func:`merge` are thin helpers over it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.errors import (
    CheckpointError,
)
from tfckpt.io import paths
from tfckpt.io.commit import (
    DirectoryCommit,
    bundle_commit,
    commit_shards,
    merge_entries,
    write_state_file,
)
from tfckpt.io.storage import Storage, StorageOptions
from tfckpt.io.temporaries import remove_stale_temporaries
from tfckpt.rewrite import collector
from tfckpt.rewrite.cast import CastCounts, CastCountTable, check_overflow
from tfckpt.rewrite.options import EXECUTION, Options, RenameRules
from tfckpt.rewrite.planner import plan
from tfckpt.rewrite.plans import Plan, Source
from tfckpt.rewrite.savedmodel import saved_model_notes
from tfckpt.rewrite.tasks import (
    RunStorage,
    ShardTask,
    check_backend,
    restore_warnings,
    run_tasks,
    shard_tasks,
)


class Records(Sequence[dict]):
    """``count`` records made on demand: record ``i`` is ``make(i)``, a new dict each time.

    An export's or an import's summary lists one record per tensor; built up front,
    those dicts would cost 200 000 tensors more memory than streaming them does.

    >>> Records(2, lambda i: {"i": i})[1]
    {'i': 1}
    """

    def __init__(self, count: int, make: Callable[[int], dict]):
        self._count, self._make = count, make

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._make(k) for k in range(*i.indices(self._count))]
        if not -self._count <= i < self._count:
            raise IndexError(i)
        return self._make(i % self._count)

    def __iter__(self) -> Iterator[dict]:
        return map(self._make, range(self._count))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))


@dataclass
class Summary:
    """What a rewrite did (or, for a dry export or import, would do).

    Every verb returns one. An export or an import adds the files it writes
    (``files``), a record per tensor (``tensors``: name, new_name, dtype, new_dtype,
    shape, permute, file) and what it left out (``skipped``: (name, why)); its
    ``to_dict()`` is then that of a file export.

    >>> sm = tfckpt.convert("train/", "fp16/", "float16")
    >>> sm.kept, sm.cast, sm.bytes_out, sm.cast_counts["dense/kernel"].overflow
    """

    dst: str
    kept: int
    dropped: int
    renamed: int
    cast: int
    bytes_in: int
    bytes_out: int
    seconds: float
    # Per cast tensor (a CastCountTable, from a run; any mapping given by hand).
    cast_counts: Mapping[str, CastCounts] = field(default_factory=dict)
    # What the user must know although the output is committed (e.g. what TensorFlow
    # cannot restore, a state file not written).
    warnings: list[str] = field(default_factory=list)
    # Tensors per keep_dtype pattern and dtype rule, when the plan has any.
    dtype_rules: dict[str, int] | None = None
    # Per dtype, the training bookkeeping kept in it that the cast would have cast.
    bookkeeping_kept: dict[str, int] = field(default_factory=dict)
    # An export's or an import's: the files, one record per tensor, what was left out.
    files: list[str] | None = None
    tensors: Sequence[dict] | None = None  # a list, or Records made on demand
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # A SavedModel's directory, when one was written around the checkpoint ``dst`` (see
    # tfckpt.rewrite.savedmodel); what was written, and how to use it.
    saved_model: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        if self.files is not None:
            return {
                "out": self.dst,
                "files": self.files,
                "tensors": list(self.tensors or ()),
                "skipped": [{"name": n, "reason": r} for n, r in self.skipped],
                "dropped": self.dropped,
                "bytes_out": self.bytes_out,
                "seconds": self.seconds,
                "overflow": self.counted("overflow"),
                **({"bookkeeping_kept": self.bookkeeping_kept} if self.bookkeeping_kept else {}),
            }
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
        if self.saved_model is not None:
            d["saved_model"] = self.saved_model
        if self.notes:
            d["notes"] = self.notes
        for what in ("overflow", "to_zero", "subnormal"):
            d[what] = self.counted(what)
        if self.dtype_rules is not None:
            d["dtype_rules"] = self.dtype_rules
        if self.bookkeeping_kept:
            d["bookkeeping_kept"] = self.bookkeeping_kept
        return d

    def counted(self, what: str) -> dict[str, int]:
        """Per tensor, the values ``what`` happened to (overflow, to_zero, subnormal)."""
        if isinstance(self.cast_counts, CastCountTable):
            return self.cast_counts.nonzero(what)
        return {n: getattr(c, what) for n, c in self.cast_counts.items() if getattr(c, what)}


@collector.paused()
def execute(
    p: Plan,
    options: Options | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Summary:
    """Write a plan: the planned checkpoint, one task per output shard, then the index
    (an average's plan too: its mean items read every source in step); an export's plan
    writes its files (its ``output``) through the same pipeline.

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
    are the same either way. The output is written where the plan was made for
    (``p.storage``) and the sources read where they were opened; ``storage_options``
    make those of the run's URLs anew with other options.

    >>> p = tfckpt.plan("train/", "fp16/", cast="float16")
    >>> tfckpt.execute(p, overflow="clip", executor=ThreadPoolExecutor(2))
    """
    options = Options.of(p.options if options is None else options, EXECUTION, **changes)
    if options.backend != "numpy" and any(
        map(str.__ne__, p.tensors.infos.dtypes, p.tensors.new_dtype)
    ):
        check_backend(options.backend)  # TensorFlow, before anything is written
    stores = RunStorage.of(p, storage_options)
    if p.output is not None:  # files of another format (an export) write themselves
        return p.output.write(p, stores.out, options, progress)
    start = time.perf_counter()
    # Run here with the plan's storage, the tasks read the sources the plan has open.
    opened = None
    if options.executor is None and storage_options is None:
        opened = {i: s.ckpt for i, s in enumerate(p.sources) if readable_as_opened(s.ckpt)}
    if p.saved_model is not None:
        counts = write_saved_model(p, stores, options, progress, opened)
        warnings = []
    else:
        tasks = shard_tasks(p, options, stores=stores)
        counts = run_and_commit(
            stores.out, p.dst, tasks, options, bool(p.options.overwrite), progress, opened
        )
        warnings = state_file_warnings(stores.out, p.dst, p.sources)
    return Summary(
        p.dst,
        kept=len(p.tensors),
        dropped=len(p.dropped),
        renamed=sum(map(str.__ne__, p.tensors.name, p.tensors.new_name)),
        cast=sum(map(str.__ne__, p.tensors.infos.dtypes, p.tensors.new_dtype)),
        bytes_in=p.bytes_in,
        bytes_out=p.bytes_out,
        seconds=time.perf_counter() - start,
        cast_counts=counts,
        warnings=restore_warnings(p) + p.warnings + warnings,
        dtype_rules=p.dtype_rule_counts(),
        bookkeeping_kept=p.bookkeeping_kept(),
        saved_model=None if p.saved_model is None else p.saved_model.directory,
        notes=saved_model_notes(p),
    )


def write_saved_model(
    p: Plan,
    stores: RunStorage,
    options: Options,
    progress: Callable[[int], None] | None,
    opened: Mapping[int, Checkpoint] | None,
) -> CastCountTable:
    """Write the plan's SavedModel (see :mod:`tfckpt.rewrite.savedmodel`): the whole
    directory under a temporary name, its variables the plan's checkpoint, the source's
    other files copied; then renamed into place (:class:`DirectoryCommit`). A failure
    leaves nothing, and what was at the destination as it was."""
    sm = p.saved_model
    assert sm is not None
    out = stores.out
    commit = DirectoryCommit(out, sm.directory, overwrite=sm.replaces, durable=options.durable)
    try:
        staged = dataclasses.replace(p, dst=sm.variables_prefix(out, commit.stage))
        tasks = shard_tasks(staged, options, stores=stores)
        counts = run_and_commit(out, staged.dst, tasks, options, False, progress, opened)
        sm.copy_into(out, commit.stage)
        commit.publish()
    except BaseException:
        commit.discard()
        raise
    return counts


def run_and_commit(
    store: Storage,
    dst: str,
    tasks: list[ShardTask],
    options: Options,
    overwrite: bool,
    progress: Callable[[int], None] | None = None,
    opened: Mapping[int, Checkpoint] | None = None,
) -> CastCountTable:
    """Run the shard tasks of one output (``options.executor`` runs them, else here,
    reading the sources ``opened`` has open) and commit them as the checkpoint ``dst``
    on ``store``, the index last; each tensor's cast counts. A failure (an overflow
    with ``overflow='error'`` too) commits nothing and removes the tasks' files and the
    directories this run made."""
    remove_stale_temporaries(store, dst)
    remove_stale_temporaries(store, store.join(store.dirname(dst), paths.STATE_FILENAME))
    shard_paths = [t.path for t in tasks]
    commit = bundle_commit(
        store, dst, shard_paths, overwrite=overwrite, durable=options.durable
    )  # the tasks' files and the directories made are its own from now on
    try:
        results = run_tasks(tasks, options.executor, progress, opened)
        counts = (
            results[0].counts.merged([r.counts for r in results[1:]])
            if results
            else CastCountTable()
        )
        check_overflow(counts, options.overflow, dst)
        entries = merge_entries([r.entries for r in results])
        commit_shards(store, dst, shard_paths, entries, commit=commit)
    except BaseException:
        commit.discard()  # unless committed: the tasks' files, the directories made
        raise
    return counts


def readable_as_opened(ckpt) -> bool:
    """Whether a task may read the source ``ckpt`` as it is open: as a task would open it
    (checksums verified, read into memory of its own rather than mapped)."""
    return getattr(ckpt, "verify", False) is True and getattr(ckpt, "mmap", True) is False


def state_file_warnings(store: Storage, dst: str, sources: Sequence[Source]) -> list[str]:
    """Point the ``checkpoint`` state file beside ``dst`` (on ``store``) at it, unless a
    source's directory is that directory (its state file is the source's); what the user
    must know when it cannot be written (the checkpoint is committed all the same)."""
    directory = store.dirname(dst) or "."
    for s in sources:
        src_dir = s.ckpt.storage.dirname(s.ckpt.prefix) or "."
        if s.ckpt.storage.realpath(src_dir) == store.realpath(directory):
            return []
    try:
        write_state_file(store, directory, store.basename(dst))
    except (OSError, CheckpointError) as e:
        # The checkpoint is committed: only the pointer to it is missing.
        detail = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return [f"the checkpoint is complete, but the state file was not written: {detail}"]
    return []


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
    return execute(
        plan(sources, dst, options, storage_options=storage_options, **changes),
        progress=progress,
    )


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
    return transform(src, dst, options, storage_options=storage_options, cast=dtype, **changes)


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
    return transform(src, dst, options, storage_options=storage_options, rename=rules, **changes)


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
    return transform(src, dst, options, storage_options=storage_options, **changes)


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
    return transform(list(sources), dst, options, storage_options=storage_options, **changes)
