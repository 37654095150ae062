"""One streaming engine for every rewrite: sources -> select -> rename -> cast -> one output.

:func:`plan` decides, from the indexes alone, what each output tensor is (its
source, new name, new dtype, bytes); :func:`execute` streams the tensors through
in bounded chunks and commits the output atomically. :func:`transform` does
both; :func:`convert`, :func:`rename`, :func:`select` and :func:`merge` are thin
helpers over it.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from . import dtypes as _dt
from . import paths
from ._proto.tensor_bundle_pb2 import BundleEntryProto
from .commit import (commit_shards, data_files, free_shard_count, merge_entries,
                     remove_stale_temporaries, temporary_base, write_state_file)
from .format import TensorInfo
from .reader import REUSE_RING, Checkpoint, _BufferRing
from .writer import ShardWriter
from .cast import CAST_TARGETS, OVERFLOW_POLICIES, Caster, CastCounts, should_cast
from .storage import normalize, storage_for
from .table import encode_varint
from .errors import CheckpointError, CheckpointWriteError, UnsupportedCheckpointError
from .objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, attribute_tensors, renamed_key

SAVE_COUNTER = "save_counter"  # the bookkeeping child every tf.train.Checkpoint.save() adds
PREFER = (None, "first", "last")


@dataclass
class Source:
    """One input checkpoint of a transform."""

    label: str
    ckpt: Checkpoint
    graph: ObjectGraph | None
    shard_base: int = 0  # where its shards start in the output, when following its layout


@dataclass
class PlannedTensor:
    """One output tensor: where it comes from and what it becomes."""

    source: int
    name: str
    new_name: str
    info: TensorInfo
    new_dtype: str
    bytes_out: int

    @property
    def renamed(self) -> bool:
        return self.name != self.new_name

    @property
    def cast(self) -> bool:
        return self.info.dtype != self.new_dtype


@dataclass
class Plan:
    """What a transform will write; ``to_dict()`` is what ``--dry-run --json`` prints."""

    sources: list[Source]
    dst: str
    tensors: list[PlannedTensor]
    dropped: list[tuple[str, str, str]]  # (source label, name, reason)
    object_graph: bytes | None
    options: dict

    @property
    def bytes_in(self) -> int:
        return sum(t.info.nbytes for t in self.tensors)

    @property
    def bytes_out(self) -> int:
        return sum(t.bytes_out for t in self.tensors)

    def to_dict(self) -> dict:
        return {
            "dst": self.dst,
            "sources": [s.label for s in self.sources],
            "tensors": [{"source": self.sources[t.source].label, "name": t.name,
                         "new_name": t.new_name, "dtype": t.info.dtype,
                         "new_dtype": t.new_dtype, "shape": list(t.info.shape),
                         "bytes_in": t.info.nbytes, "bytes_out": t.bytes_out}
                        for t in self.tensors],
            "dropped": [{"source": s, "name": n, "reason": r} for s, n, r in self.dropped],
            "object_graph": self.object_graph is not None,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }


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

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("dst", "kept", "dropped", "renamed", "cast",
                                           "bytes_in", "bytes_out", "seconds", "warnings")}
        d["overflow"] = {n: c.overflow for n, c in self.cast_counts.items() if c.overflow}
        d["to_zero"] = {n: c.to_zero for n, c in self.cast_counts.items() if c.to_zero}
        d["subnormal"] = {n: c.subnormal for n, c in self.cast_counts.items() if c.subnormal}
        return d


class OverflowError_(CheckpointError):
    """Values would overflow the target dtype and the policy is ``'error'``."""

    def __init__(self, counts: dict[str, int], dst: str):
        self.counts = counts
        listed = ", ".join(f"{n} ({c} values)" for n, c in sorted(counts.items()))
        super().__init__(f"values beyond the target dtype's range in {len(counts)} tensor(s), "
                         f"nothing written (use overflow='clip' or 'inf'): {listed}", path=dst)


# --- planning ----------------------------------------------------------------

RenameRules = Sequence[tuple[str, str]] | Mapping[str, str]


def _compile_rules(rename: RenameRules | None) -> list[tuple[re.Pattern, str]]:
    if rename is None:
        return []
    items = rename.items() if isinstance(rename, Mapping) else rename
    out = []
    for pattern, repl in items:
        try:
            out.append((re.compile(pattern), repl))
        except re.error as e:
            raise CheckpointError(f"bad rename pattern {pattern!r}: {e}") from None
    return out


def _new_name(name: str, exact: Mapping[str, str], rules: list[tuple[re.Pattern, str]]) -> str:
    if name in exact:
        return exact[name]
    for rx, repl in rules:
        m = rx.match(name)
        if m:
            try:
                return m.expand(repl) + name[m.end():]
            except (re.error, IndexError) as e:
                raise CheckpointError(f"rename {rx.pattern!r} -> {repl!r} on {name!r}: {e}") \
                    from None
    return name


def _patterns(values: Iterable[str] | str | None) -> list[re.Pattern]:
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    try:
        return [re.compile(v) for v in values]
    except re.error as e:
        raise CheckpointError(f"bad regular expression: {e}") from None


def resolve_destination(dst, sources: list[Source], overwrite: bool) -> str:
    """The output prefix; refuses sources and (without ``overwrite``) existing checkpoints."""
    dst = normalize(dst)
    store = storage_for(dst)
    if dst.endswith(("/", os.sep)) or store.isdir(dst):
        dst = store.join(store.dir_path(dst),
                         sources[0].ckpt.storage.basename(sources[0].ckpt.prefix))
    real = store.realpath(dst)
    for s in sources:
        if s.ckpt.storage.realpath(s.ckpt.prefix) == real:
            raise CheckpointError("the destination is a source checkpoint; write elsewhere "
                                  "(sources are never modified)", path=dst)
        if s.ckpt.storage.realpath(s.ckpt.storage.dirname(s.ckpt.prefix)) == \
                store.realpath(store.dirname(dst)) and \
                s.ckpt.storage.basename(s.ckpt.prefix) == store.basename(dst):
            raise CheckpointError("the destination would overwrite a source's data files",
                                  path=dst)
    if store.isfile(paths.index_filename(dst)) and not overwrite:
        raise CheckpointError("the destination already exists (use overwrite)",
                              path=paths.index_filename(dst))
    return dst


def open_sources(sources) -> list[Source]:
    if isinstance(sources, (str, os.PathLike, Checkpoint)):
        sources = [sources]
    out = []
    for src in sources:
        ckpt = src if isinstance(src, Checkpoint) else Checkpoint(src, mmap=False)
        graph = None
        if OBJECT_GRAPH_KEY in ckpt:
            graph = ObjectGraph.parse(ckpt[OBJECT_GRAPH_KEY].item(), path=ckpt.prefix)
        out.append(Source(os.fspath(src) if not isinstance(src, Checkpoint) else src.prefix,
                          ckpt, graph))
    if not out:
        raise CheckpointError("no source checkpoint given")
    return out


def _root_object_owners(srcs: list[Source], prefer: str | None) -> dict[str, int]:
    """For root objects of several TF2 sources: which source keeps each.

    ``save_counter`` (bookkeeping every ``Checkpoint.save`` adds) comes from the
    first source; other clashes follow ``prefer``, and without it are left for
    the merge to report.
    """
    having: dict[str, list[int]] = {}
    for i, s in enumerate(srcs):
        if s.graph is not None:
            for child in s.graph.root_children():
                having.setdefault(child, []).append(i)
    owners = {}
    for child, where in having.items():
        if len(where) < 2:
            continue
        if child == SAVE_COUNTER or prefer == "first":
            owners[child] = where[0]
        elif prefer == "last":
            owners[child] = where[-1]
    return owners


def plan(sources, dst, *, include=None, exclude=None, drop_objects: Sequence[str] = (),
         rename: RenameRules | None = None, rename_exact: Mapping[str, str] | None = None,
         cast: str | None = None, cast_from: Iterable[str] | None = None,
         prefer: str | None = None, max_shard_bytes: int | None = None,
         overwrite: bool = False) -> Plan:
    """Decide every output tensor from the sources' indexes; reads no tensor data.

    See :func:`transform` for the options.
    """
    srcs = open_sources(sources)
    if prefer not in PREFER:
        raise CheckpointError(f"prefer must be 'first' or 'last', not {prefer!r}")
    target = None
    if cast is not None:
        target = _dt.lookup(cast)
        if target.name not in CAST_TARGETS:
            raise CheckpointError(f"cannot cast to {cast!r}; targets: {', '.join(CAST_TARGETS)}")
    from_set = None
    if cast_from is not None:
        from_set = frozenset(_dt.lookup(d).name for d in cast_from)
    includes, excludes = _patterns(include), _patterns(exclude)
    rules = _compile_rules(rename)
    exact = dict(rename_exact or {})
    dst = resolve_destination(dst, srcs, overwrite)

    dropped: list[tuple[str, str, str]] = []
    graphs: list[tuple[int, ObjectGraph]] = []
    per_source: list[list[tuple[str, str]]] = []  # (old, new) per kept tensor
    drop_specs = list(drop_objects)
    if drop_specs and not any(s.graph for s in srcs):
        raise CheckpointError("--drop-object needs a TF2 object-based checkpoint (one with "
                              f"{OBJECT_GRAPH_KEY})", path=srcs[0].ckpt.prefix)
    matched_specs: set[str] = set()
    winner = _root_object_owners(srcs, prefer)
    for i, s in enumerate(srcs):
        names = [n for n in s.ckpt.keys() if n != OBJECT_GRAPH_KEY]
        present = set(names)
        gone: set[str] = set()

        def tensors_of(keys: Iterable[str]) -> set[str]:
            return {t for k in keys for t in attribute_tensors(k, present)}

        if s.graph is not None:
            for spec in drop_specs:
                try:
                    removed = tensors_of(s.graph.drop_objects([spec]))
                except CheckpointError:
                    continue  # this source lacks the object; another may have it
                matched_specs.add(spec)
                gone |= removed
                dropped += [(s.label, n, f"object {spec!r} dropped") for n in sorted(removed)
                            if n in s.ckpt]
            for child in s.graph.root_children():
                owner = winner.get(child, i)
                if owner != i:
                    removed = tensors_of(s.graph.drop_root_child(child))
                    gone |= removed
                    dropped += [(s.label, n, f"root object {child!r} taken from "
                                 f"{srcs[owner].label}") for n in sorted(removed) if n in s.ckpt]
            missing = s.graph.missing_keys(present)
            if missing:
                raise CheckpointError(f"the object graph names tensors the checkpoint lacks: "
                                      f"{', '.join(missing[:5])}", path=s.ckpt.prefix)
        kept = []
        for n in names:
            if n in gone:
                continue
            if includes and not any(rx.search(n) for rx in includes):
                dropped.append((s.label, n, "not included"))
                continue
            if any(rx.search(n) for rx in excludes):
                dropped.append((s.label, n, "excluded"))
                continue
            kept.append((n, _new_name(n, exact, rules)))
        if s.graph is not None:
            # An attribute stored as several tensors is kept whole or not at all,
            # and its tensors keep one key plus their suffixes.
            new_of = dict(kept)
            dead, rekey = set(), {}
            for key, tensors in s.graph.attribute_tensors(present).items():
                if all(t in new_of for t in tensors):
                    new_key = renamed_key(key, tensors, new_of, path=s.label)
                    if new_key != key:
                        rekey[key] = new_key
                    continue
                dead.add(key)
                for t in tensors:
                    if new_of.pop(t, None) is not None:
                        dropped.append((s.label, t, f"its attribute {key!r} is not kept whole"))
            kept = [(n, new) for n, new in kept if n in new_of]
            s.graph.drop_keys(dead)
            s.graph.rekey(rekey)
            graphs.append((i, s.graph))
        per_source.append(kept)
    for spec in drop_specs:
        if spec not in matched_specs:
            raise CheckpointError(f"no object {spec!r} in the object graph of any source")

    # One name, one tensor: clashes inside a source are errors; across sources
    # they are errors unless the user said which source wins.
    chosen: dict[str, tuple[int, str]] = {}
    for i, kept in enumerate(per_source):
        local: dict[str, str] = {}
        for old, new in kept:
            if new == OBJECT_GRAPH_KEY:
                raise CheckpointError(f"{old!r} cannot be renamed to {OBJECT_GRAPH_KEY}")
            if new in local:
                raise CheckpointError(f"{local[new]!r} and {old!r} would both be named {new!r}",
                                      path=srcs[i].label)
            local[new] = old
            if new in chosen:
                j, other = chosen[new]
                if prefer is None:
                    raise CheckpointError(
                        f"{new!r} comes from both {srcs[j].label} ({other!r}) and "
                        f"{srcs[i].label} ({old!r}); choose with prefer='first' or 'last'")
                if prefer == "first":
                    dropped.append((srcs[i].label, old, f"{new!r} taken from {srcs[j].label}"))
                    continue
                dropped.append((srcs[j].label, other, f"{new!r} taken from {srcs[i].label}"))
            chosen[new] = (i, old)

    # Graphs lose the attributes of tensors another source won, then merge.
    graph_bytes = None
    if graphs:
        for i, g in graphs:
            mine = {new for _, new in per_source[i]}
            lost = {new for new in mine if chosen[new][0] != i}
            if lost:
                g.drop_keys({k for k, ts in g.attribute_tensors(mine).items()
                             if lost.intersection(ts)})
        merged = graphs[0][1] if len(graphs) == 1 else ObjectGraph.merge(
            [g for _, g in graphs], [srcs[i].label for i, _ in graphs])
        graph_bytes = merged.serialize()

    if max_shard_bytes is None:
        base = 0
        for s in srcs:
            s.shard_base = base
            base += s.ckpt.header.num_shards

    tensors = []
    for new, (i, old) in chosen.items():
        info = srcs[i].ckpt.info(old)
        dtype = _dt.lookup(info.dtype)
        new_dtype = target if should_cast(dtype, target, from_set) else dtype
        out_bytes = info.nbytes if new_dtype is dtype else \
            info.stored_elements * new_dtype.itemsize
        tensors.append(PlannedTensor(i, old, new, info, new_dtype.name, out_bytes))
    # Every shard the output needs must be there before anything is written.
    needed: dict[int, set[int]] = {}
    for t in tensors:
        needed.setdefault(t.source, set()).update(
            [t.info.shard] if not t.info.slices else
            (x.shard for x in srcs[t.source].ckpt.slice_info(t.name)))
    for i, shard_ids in needed.items():
        srcs[i].ckpt.check_shard_files(shard_ids)
    # Read each source in file order: by source, shard, offset.
    tensors.sort(key=lambda t: (t.source, t.info.shard if t.info.shard is not None else -1,
                                t.info.offset or 0, t.new_name))
    options = {"max_shard_bytes": max_shard_bytes, "overwrite": overwrite,
               "cast": None if target is None else target.name}
    return Plan(srcs, dst, tensors, dropped, graph_bytes, options)


# --- execution -----------------------------------------------------------------

BACKENDS = ("numpy", "tf", "auto")
DEFAULT_TF_THRESHOLD = 64 << 20


def _tf_converter(backend: str):
    """The ``tf.cast`` converter the backend asks for, or None for numpy."""
    if backend not in BACKENDS:
        raise CheckpointError(f"backend must be one of {', '.join(BACKENDS)}")
    if backend == "numpy":
        return None
    from .tf import cast as tf_cast
    if backend == "auto" and not tf_cast.sees_gpu():
        return None
    return tf_cast.converter()


MEMORY_BUDGET = 64 << 20


def execute(p: Plan, *, overflow: str = "error", chunk_bytes: int = MEMORY_BUDGET,
            progress: Callable[[int], None] | None = None, backend: str = "numpy",
            tf_threshold: int = DEFAULT_TF_THRESHOLD, durable: bool = True,
            executor=None) -> Summary:
    """Write the planned checkpoint: one task per output shard, then the index.

    Each task reads the byte ranges its tensors need from the sources, streams
    them through the cast and writes its shard; the commit merges the tasks'
    index entries and writes the index last (like TensorFlow's
    MergeV2Checkpoints). ``executor`` runs the tasks: None runs them here, one
    after another (each already keeps both cores busy); anything with
    ``submit(fn, arg)`` returning futures — a ``concurrent.futures`` executor or a
    Dask ``distributed.Client`` — runs them there. The output is byte-identical
    whichever ran it. A failed task fails the run; nothing is committed.

    ``chunk_bytes`` is the memory budget for tensor data in flight per task.
    ``progress`` is called with source bytes done. With ``overflow='error'``,
    values beyond the target's range abort the run before anything is committed,
    listing every affected tensor. ``backend='tf'`` casts tensors of at least
    ``tf_threshold`` bytes with ``tf.cast`` on the best device (a GPU if
    TensorFlow sees one); ``'auto'`` does so only when there is a GPU. The bits are
    the same either way. ``durable=False`` skips the fsyncs (see
    :class:`~tfckpt.BundleWriter`).
    """
    start = time.perf_counter()
    if overflow not in OVERFLOW_POLICIES:
        raise CheckpointError(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}")
    if backend not in BACKENDS:
        raise CheckpointError(f"backend must be one of {', '.join(BACKENDS)}")
    store = storage_for(p.dst)
    remove_stale_temporaries(p.dst)
    remove_stale_temporaries(store.join(store.dirname(p.dst), paths.STATE_FILENAME))
    tasks = shard_tasks(p, overflow=overflow, chunk_bytes=chunk_bytes, backend=backend,
                        tf_threshold=tf_threshold, durable=durable)
    try:
        made_dirs = store.makedirs(store.dirname(p.dst))  # innermost first
    except OSError as e:
        raise CheckpointWriteError(f"cannot create directory: {e.strerror or e}",
                                   path=p.dst) from None
    try:
        results = _run_tasks(tasks, executor, progress)
        counts = {name: CastCounts(*c) for r in results for name, c in r.counts.items()}
        overflowed = {n: c.overflow for n, c in counts.items() if c.overflow}
        if overflow == "error" and overflowed:
            raise OverflowError_(overflowed, p.dst)
        entries = merge_entries([{k: BundleEntryProto.FromString(v)
                                  for k, v in r.entries.items()} for r in results])
        commit_shards(p.dst, [t.path for t in tasks], entries, durable=durable,
                      overwrite=bool(p.options.get("overwrite")))
    except BaseException:
        for t in tasks:
            try:
                storage_for(t.path).remove(t.path)
            except (OSError, CheckpointError):
                pass
        store.remove_dirs(made_dirs)  # only those still empty
        raise
    warnings = []
    try:
        _write_state_file(p)
    except (OSError, CheckpointError) as e:
        # The checkpoint is committed: only the pointer to it is missing.
        detail = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        warnings.append(f"the checkpoint is complete, but the state file was not written: "
                        f"{detail}")
    return Summary(p.dst, kept=len(p.tensors), dropped=len(p.dropped),
                   renamed=sum(t.renamed for t in p.tensors),
                   cast=sum(t.cast for t in p.tensors), bytes_in=p.bytes_in,
                   bytes_out=p.bytes_out, seconds=time.perf_counter() - start,
                   cast_counts=counts, warnings=_restore_warnings(p) + warnings)


@dataclass
class TaskItem:
    """One tensor, or one slice of one, that a shard task writes."""

    source: int
    name: str
    new_name: str
    dtype: str
    new_dtype: str
    shape: tuple
    partitioned: bool          # the source tensor is partitioned
    extents: tuple | None      # which slice (None: the whole tensor)
    bytes_in: int
    bytes_out: int
    tf_cast: bool = False      # cast with tf.cast (a big tensor, tf backend)


@dataclass
class ShardTask:
    """Everything one worker needs to write one output shard (picklable)."""

    shard_id: int
    path: str                  # a temporary file locally; the final object remotely
    sources: list[str]
    items: list[TaskItem]
    object_graph: bytes | None
    overflow: str
    chunk_bytes: int
    backend: str
    durable: bool

    @property
    def bytes_in(self) -> int:
        return sum(i.bytes_in for i in self.items)


@dataclass
class ShardResult:
    shard_id: int
    entries: dict[bytes, bytes]            # key -> serialized BundleEntryProto
    counts: dict[str, tuple[int, int, int, int]]
    bytes_in: int


def shard_tasks(p: Plan, *, overflow: str = "error", chunk_bytes: int = MEMORY_BUDGET,
                backend: str = "numpy", tf_threshold: int = DEFAULT_TF_THRESHOLD,
                durable: bool = True) -> list[ShardTask]:
    """Cut the plan into one task per output shard (the same cut for any executor).

    By default each tensor keeps its source shard (offset by the shards of the
    sources before it), and only source shards that keep data become output
    shards, in their order (what a header declares creates nothing); with
    ``max_shard_bytes``, tensors are packed in plan order into shards of at most
    that size (a bigger tensor gets one of its own).
    """
    follow = p.options["max_shard_bytes"] is None
    limit = p.options["max_shard_bytes"]
    shards: dict[int, list[TaskItem]] = {}
    sizes: dict[int, int] = {}

    def place(item_bytes: int, shard: int | None) -> int:
        if shard is None:
            shard = max(len(shards) - 1, 0)
            if shards and sizes[shard] and sizes[shard] + item_bytes > limit:
                shard += 1
        shards.setdefault(shard, [])
        sizes[shard] = sizes.get(shard, 0) + item_bytes
        return shard

    for t in p.tensors:
        src = p.sources[t.source]
        target = _dt.lookup(t.new_dtype)
        big = t.cast and t.info.nbytes >= tf_threshold
        parts = src.ckpt.slice_info(t.name) if t.info.slices else []
        if parts and _keep_sliced(src, t):
            for sl in sorted(parts, key=lambda x: (x.shard, x.offset)):
                out = sl.nbytes if not t.cast else sl.size * target.itemsize
                k = place(out, src.shard_base + sl.shard if follow else None)
                shards[k].append(TaskItem(t.source, t.name, t.new_name, t.info.dtype,
                                          t.new_dtype, t.info.shape, True, sl.extents,
                                          sl.nbytes, out, big))
            continue
        # A partitioned tensor written whole goes where its first slice was.
        first = min(x.shard for x in parts) if parts else t.info.shard
        k = place(t.bytes_out, src.shard_base + first if follow else None)
        shards[k].append(TaskItem(t.source, t.name, t.new_name, t.info.dtype, t.new_dtype,
                                  t.info.shape, bool(parts), None, t.info.nbytes, t.bytes_out,
                                  big))
    graph_shard = None
    if p.object_graph is not None:
        size = len(p.object_graph) + len(encode_varint(len(p.object_graph))) + 4
        if follow:
            first_tf2 = next(s for s in p.sources if s.graph is not None)
            graph_shard = place(size, first_tf2.shard_base +
                                (first_tf2.ckpt.info(OBJECT_GRAPH_KEY).shard or 0))
        else:
            graph_shard = place(size, None)
    if not shards:
        place(0, 0)
    order = sorted(shards)
    graph_shard = None if graph_shard is None else order.index(graph_shard)
    items_of = [shards[k] for k in order]
    store = storage_for(p.dst)
    if store.atomic_rename:
        base = temporary_base(p.dst)
        out_paths = [f"{base}.data-{k}" for k in range(len(items_of))]
    else:
        # Written under their final names, which no committed index may use: a shard
        # count unlike any already there (extra shards stay empty).
        count = free_shard_count(data_files(p.dst), len(items_of))
        items_of += [[] for _ in range(count - len(items_of))]
        out_paths = [paths.data_filename(p.dst, k, count) for k in range(count)]
    return [ShardTask(k, out_paths[k], [s.ckpt.prefix for s in p.sources], items,
                      p.object_graph if k == graph_shard else None, overflow, chunk_bytes,
                      backend, durable)
            for k, items in enumerate(items_of)]


# Shard tasks (by path) whose run has failed: tasks running in this process's threads
# stop at their next chunk. Tasks in other processes do not see it and run to the end.
_CANCELLED: set[str] = set()


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
        _CANCELLED.update(t.path for t in tasks)
        try:
            for f in futures:
                f.cancel()
            for f in futures:
                try:
                    f.result()
                except BaseException:
                    pass
        finally:
            _CANCELLED.difference_update(t.path for t in tasks)
        raise
    return results


def run_shard_task(task: ShardTask, progress: Callable[[int], None] | None = None
                   ) -> ShardResult:
    """Write one shard: its tensors, read from the sources and cast, in plan order."""
    ckpts: dict[int, Checkpoint] = {}
    counts: dict[str, tuple[int, int, int, int]] = {}

    def tick(nbytes: int) -> None:
        if task.path in _CANCELLED:
            raise CheckpointError("cancelled: the run failed elsewhere", path=task.path)
        if progress:
            progress(nbytes)

    w = ShardWriter.create(task.path, durable=task.durable)
    try:
        tf_convert = _tf_converter(task.backend) if any(i.tf_cast for i in task.items) \
            else None
        for item in task.items:
            if item.source not in ckpts:
                ckpts[item.source] = Checkpoint(task.sources[item.source], mmap=False)
            caster = None
            if item.dtype != item.new_dtype:
                caster = Caster(_dt.lookup(item.dtype), _dt.lookup(item.new_dtype),
                                task.overflow, convert=tf_convert if item.tf_cast else None,
                                reuse_output=True)
            _copy(ckpts[item.source], w, item, caster, tick, task.chunk_bytes)
            if caster is not None:
                c = caster.counts
                old = counts.get(item.new_name, (0, 0, 0, 0))
                counts[item.new_name] = (old[0] + c.overflow, old[1] + c.to_zero,
                                         old[2] + c.subnormal, old[3] + c.elements)
        if task.object_graph is not None:
            w.add(OBJECT_GRAPH_KEY, np.array(task.object_graph, dtype=object))
        entries = w.finish()
    except BaseException:
        w.abort()
        raise
    finally:
        for ckpt in ckpts.values():
            ckpt.close()
    return ShardResult(task.shard_id, {k: v.SerializeToString() for k, v in entries.items()},
                       counts, task.bytes_in)


# Dtypes TensorFlow's reader can reassemble from slices (tensor_bundle's copy list).
TF_SLICE_COPYABLE = frozenset({"float32", "float64", "int32", "uint8", "int16", "int8",
                               "complex64", "complex128", "int64", "bool", "qint32", "quint8",
                               "qint8", "bfloat16"})


def _keep_sliced(src: Source, t: PlannedTensor) -> bool:
    """Whether a partitioned tensor stays partitioned in the output.

    TF1 partitioned variables read back exactly their own slices, which works for
    every dtype. TF2 variables saved in slices (MaxShardSizePolicy) are read back
    whole, which TensorFlow can only reassemble for some dtypes: float16 slices,
    for one, it cannot restore. Such tensors are written whole instead.
    """
    return src.graph is None or t.new_dtype in TF_SLICE_COPYABLE or t.info.partial


def _restore_warnings(p: Plan) -> list[str]:
    """What of the output TensorFlow can restore only in part, and why.

    A partitioned tensor cast to a dtype TensorFlow cannot copy between slices
    (float16, float8) stays in its source's slices: TensorFlow then restores each
    slice into a variable partitioned the same way (as the source's partitioned
    variables are), but cannot read the tensor whole or repartition it. A whole
    tensor would be worse: no slice of it could be restored.
    """
    sliced = [t for t in p.tensors if t.info.slices and t.cast
              and t.new_dtype not in TF_SLICE_COPYABLE and _keep_sliced(p.sources[t.source], t)]
    if not sliced:
        return []
    names = ", ".join(t.new_name for t in sliced[:5]) + (", ..." if len(sliced) > 5 else "")
    dtypes = "/".join(sorted({t.new_dtype for t in sliced}))
    return [f"{len(sliced)} partitioned tensor(s) stay partitioned in {dtypes} ({names}): "
            f"TensorFlow restores {dtypes} slices only into variables partitioned exactly "
            "as in the source; it cannot assemble them, so reading them whole or into other "
            "partitions fails"]


def _copy(ckpt: Checkpoint, w: ShardWriter, t: TaskItem, caster, progress,
          chunk_bytes: int) -> None:
    dtype = _dt.lookup(t.dtype)
    extents = t.extents
    read_bytes = max(chunk_bytes // 8, 1 << 16)
    if dtype is _dt.STRING:
        if t.partitioned and extents is None:  # a partitioned tensor made whole
            w.add(t.new_name, ckpt[t.name], dtype.name)
            if progress:
                progress(t.bytes_in)
            return
        # Lengths, then element bytes, in bounded pieces; the writer frames them anew
        # (in its own byte order), which gives the bytes TensorFlow writes.
        stream = w.stream_slice(t.new_name, dtype.name, t.shape, extents) if extents else \
            w.stream(t.new_name, dtype.name, t.shape)
        with stream:
            for kind, part, nbytes in ckpt.iter_string_parts(t.name, read_bytes, extents):
                if kind == "lengths":
                    stream.write_lengths(part)
                else:
                    stream.write_data(part)
                if progress:
                    progress(nbytes)
        return
    if dtype.numpy is None:
        if ckpt.header.endianness != w.endianness:
            raise UnsupportedCheckpointError(
                f"{dtype.name} tensors of a {ckpt.header.endianness}-endian checkpoint cannot "
                "be rewritten", path=ckpt.prefix, tensor=t.name)
        data = ckpt.read_bytes(t.name, extents)
        shape = t.shape if not extents else \
            tuple(d if n is None else n for d, (_, n) in zip(t.shape, extents))
        w.add_raw(t.new_name, dtype.name, shape, data, extents=extents,
                  full_shape=t.shape if extents else None)
        if progress:
            progress(len(data))
        return
    if extents:
        stream = w.stream_slice(t.new_name, t.new_dtype, t.shape, extents)
    else:
        stream = w.stream(t.new_name, t.new_dtype, t.shape)
    # Three stages overlap: reading (and checking the source's CRC) one chunk ahead
    # in a thread, casting here (itself split over the cores), writing (and the
    # output's CRC) one chunk behind in another thread. numpy, crc32c and file I/O
    # release the GIL, so both cores stay busy. Chunk buffers are rings sized for
    # the chunks in flight; the budget covers them all.
    with stream, _WriteBehind(stream) as writer:
        chunks = ckpt.iter_chunks(t.name, read_bytes, extents=extents,
                                  buffers=_BufferRing(REUSE_RING).take)
        for chunk in _prefetch(chunks):
            writer.write(caster(chunk) if caster is not None else chunk)
            if progress:
                progress(chunk.nbytes)


# How often a pipeline thread looks again at a hand-over. A Ctrl-C raised in the main
# thread in the middle of a queue operation can swallow the wake-up of the thread on
# the other side (Python's locks are not safe against such asynchronous exceptions),
# so no hand-over waits without a timeout.
_POLL = 0.05


class _WriteBehind:
    """Writes to a tensor stream from a thread, one item behind the producer.

    Leaving the block with an exception drops what is still queued: the tensor
    is abandoned, so only the write under way is waited for.
    """

    def __init__(self, stream):
        self._stream = stream
        self._items: queue.Queue = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._cancelled = False
        self._closing = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                item = self._items.get(timeout=_POLL)
            except queue.Empty:
                if self._closing:  # set after the last item was queued: all written
                    return
                continue
            if self._error is None and not self._cancelled:
                try:
                    self._stream.write(item)
                except BaseException as e:  # raised in the producer's thread
                    self._error = e

    def write(self, data) -> None:
        if self._error is not None:
            raise self._error
        while True:
            try:
                self._items.put(data, timeout=_POLL)
                return
            except queue.Full:
                continue

    def __enter__(self) -> "_WriteBehind":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._cancelled = True
        self._closing = True
        self._thread.join()
        if self._error is not None and exc_type is None:
            raise self._error


def _prefetch(iterator: Iterator):
    """Run ``iterator`` one item ahead in a background thread.

    The thread ends with the consumer: once it stops taking items (an exception,
    Ctrl-C, the generator closed), no hand-over blocks for good, so the clean-up's
    join returns after at most the item being read.
    """
    items: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    done = object()

    def offer(item) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for item in iterator:
                if not offer((item, None)):
                    return
            offer((done, None))
        except BaseException as e:  # handed to the consumer, raised there
            offer((done, e))

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    try:
        while True:
            try:
                item, error = items.get(timeout=_POLL)
            except queue.Empty:
                continue
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        worker.join()


def _write_state_file(p: Plan) -> None:
    """Point the output directory's ``checkpoint`` file at the result.

    Left alone when the directory holds a source checkpoint, whose state file
    is the source's.
    """
    store = storage_for(p.dst)
    directory = store.dirname(p.dst) or "."
    for s in p.sources:
        src_dir = s.ckpt.storage.dirname(s.ckpt.prefix) or "."
        if s.ckpt.storage.realpath(src_dir) == store.realpath(directory):
            return
    write_state_file(directory, store.basename(p.dst))


def transform(sources, dst, *, include=None, exclude=None, drop_objects: Sequence[str] = (),
              rename: RenameRules | None = None, rename_exact: Mapping[str, str] | None = None,
              cast: str | None = None, cast_from: Iterable[str] | None = None,
              overflow: str = "error", prefer: str | None = None,
              max_shard_bytes: int | None = None, overwrite: bool = False,
              chunk_bytes: int = MEMORY_BUDGET,
              progress: Callable[[int], None] | None = None, backend: str = "numpy",
              tf_threshold: int = DEFAULT_TF_THRESHOLD, durable: bool = True,
              executor=None) -> Summary:
    """Select, rename and cast the tensors of one or more checkpoints into a new one.

    - ``include`` / ``exclude``: regexes (``re.search`` on source names); include
      first, then exclude.
    - ``drop_objects``: TF2 objects to cut from the object graph: a bare name cuts
      every edge with that local name, ``a/b/c`` exactly that path; nodes left
      unreachable go with their tensors.
    - ``rename``: ordered ``{regex: replacement}`` (or pairs), matched at the start
      of the name; the first match applies. ``rename_exact``: ``{old: new}``, tried
      first. TF2 object graphs are re-keyed to match.
    - ``cast``: target dtype for floating-point tensors (``cast_from`` narrows
      which source dtypes); ``overflow``: ``'error'``, ``'clip'`` or ``'inf'``.
    - ``prefer``: which source wins a name present in several (default: error).
    - ``max_shard_bytes``: re-shard; by default the sources' shard layout is kept.
    - ``backend``: ``'numpy'`` (default), ``'tf'`` or ``'auto'``: see :func:`execute`.
    - ``executor``: where the shard tasks run (a ``concurrent.futures`` executor, a
      Dask ``Client``); ``sources`` and ``dst`` may be fsspec URLs: see :func:`execute`.

    >>> tfckpt.transform("ckpt/model", "out/", cast="float16", exclude=["/Adam"])
    """
    p = plan(sources, dst, include=include, exclude=exclude, drop_objects=drop_objects,
             rename=rename, rename_exact=rename_exact, cast=cast, cast_from=cast_from,
             prefer=prefer, max_shard_bytes=max_shard_bytes, overwrite=overwrite)
    return execute(p, overflow=overflow, chunk_bytes=chunk_bytes, progress=progress,
                   backend=backend, tf_threshold=tf_threshold, durable=durable,
                   executor=executor)


def convert(src, dst, dtype: str, **options) -> Summary:
    """Cast every floating-point tensor to ``dtype`` (see :func:`transform`).

    >>> tfckpt.convert("train/model.ckpt-7", "fp16/", "float16")
    """
    return transform(src, dst, cast=dtype, **options)


def rename(src, dst, rules: RenameRules, **options) -> Summary:
    """Rename tensors by ordered ``{regex: replacement}`` rules (see :func:`transform`).

    >>> tfckpt.rename("pre/model", "new/model", {"simple-conv1/": "complex-conv1/"})
    """
    return transform(src, dst, rename=rules, **options)


def select(src, dst, *, include=None, exclude=None, drop_objects: Sequence[str] = (),
           **options) -> Summary:
    """Keep only some tensors or objects (see :func:`transform`).

    >>> tfckpt.select("trained/ckpt-3", "shipped/", drop_objects=["optimizer"])
    """
    return transform(src, dst, include=include, exclude=exclude, drop_objects=drop_objects,
                     **options)


def merge(sources: Sequence, dst, *, prefer: str | None = None, **options) -> Summary:
    """Combine several checkpoints into one (see :func:`transform`).

    >>> tfckpt.merge(["a/ckpt-1", "b/ckpt-1"], "c/ckpt")
    """
    return transform(list(sources), dst, prefer=prefer, **options)
