"""Leaving TensorFlow: checkpoints to safetensors / npz.

:func:`export` plans with :func:`~tfckpt.plan` (so selection, renaming and casts
work as for every transform), then streams each tensor chunk by chunk through
the cast into the writers of :mod:`tfckpt.tensorfiles`; ``permute`` reorders
axes tile by tile (:mod:`tfckpt.permute`). Files are written under temporary
names and renamed into place at the end (see :class:`_Writing`), the index of a
sharded export last. The way back is :mod:`tfckpt.importing`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.errors import (
    CheckpointError,
    CheckpointWriteError,
)
from tfckpt.format import tensorfiles as tfiles
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, attribute_tensors
from tfckpt.format.tf2names import BOOKKEEPING, OPTIMIZER_EDGES, VALUE_SUFFIX, cut_optimizer_edges
from tfckpt.io.commit import discard
from tfckpt.io.storage import (
    StorageOptions,
    normalize,
    storage_for,
    takes_storage_options,
)
from tfckpt.io.temporaries import TMP_MARK, stale_temporaries, temporary_base
from tfckpt.rewrite.cast import check_overflow
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.permute import Permuter, Permutes
from tfckpt.rewrite.planner import Plan, PlannedTensor, plan
from tfckpt.rewrite.rules import compile_rules, new_name
from tfckpt.rewrite.streaming import ProgressSink, TaskItem, stream_items
from tfckpt.version import __version__


@dataclass
class ExportSummary:
    """What an export or import wrote (or, dry, would write)."""

    out: str
    files: list[str]
    tensors: list[dict]  # name, new_name, dtype, new_dtype, shape, file, permute
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why)
    dropped: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    cast_counts: dict[str, int] = field(default_factory=dict)  # overflows per tensor

    def to_dict(self) -> dict:
        return {
            "out": self.out,
            "files": self.files,
            "tensors": self.tensors,
            "skipped": [{"name": n, "reason": r} for n, r in self.skipped],
            "dropped": self.dropped,
            "bytes_out": self.bytes_out,
            "seconds": self.seconds,
            "overflow": self.cast_counts,
        }


# -- export


@dataclass
class _Out:
    """One planned output tensor of an export."""

    pt: PlannedTensor
    perm: tuple[int, ...] | None

    @property
    def shape(self) -> tuple[int, ...]:
        s = self.pt.info.shape
        return s if self.perm is None else tuple(s[p] for p in self.perm)

    @property
    def entry(self) -> tfiles.Entry:
        return tfiles.Entry(self.pt.new_name, self.pt.new_dtype, self.shape)

    @property
    def item(self) -> TaskItem:
        """What the engine's pipeline streams for this tensor."""
        pt, info = self.pt, self.pt.info
        return TaskItem(
            pt.source,
            pt.name,
            pt.new_name,
            info.dtype,
            pt.new_dtype,
            info.shape,
            bool(info.slices),
            None,
            info.nbytes,
            pt.bytes_out,
            perm=self.perm,
        )


class TensorFileSink:
    """A safetensors or npz file as the sink of the engine's pipeline
    (:func:`~tfckpt.rewrite.streaming.stream_items`): each tensor begun, written in
    pieces, ended, in the order of the file's header."""

    def __init__(self, writer):
        self._w = writer

    def write(self, op: tuple) -> None:
        kind, t = op[0], op[1]
        if kind == "open":
            self._w.begin(t.new_name)
        elif kind == "write":
            self._w.write(op[2])
        elif kind == "close":
            self._w.end()
        elif kind == "batch":
            for item, data in zip(t, op[2]):
                self._w.begin(item.new_name)
                self._w.write(data)
                self._w.end()
        else:  # strings and raw tensors are refused or skipped when an export is planned
            raise AssertionError(kind)


def _format_of(out: str, fmt: str | None) -> str:
    if fmt is None:
        fmt = next((f for f in tfiles.FORMATS if out.endswith("." + f)), None)
        if fmt is None:
            raise CheckpointError(
                "cannot tell the format from the name: end it in .safetensors or .npz, "
                "or give format",
                path=out,
            )
    if fmt not in tfiles.FORMATS:
        raise CheckpointError(f"format must be one of {', '.join(tfiles.FORMATS)}, not {fmt!r}")
    return fmt


def _tf2_names(ckpt: Checkpoint, keep_keys: bool) -> tuple[dict[str, str], set[str]]:
    """A TF2 checkpoint's readable names, and the tensors of the optimizer's state.

    A variable's key is its first path from the root, which for a Keras model
    often runs through the optimizer (``optimizer/_trainable_variables/0``).
    Paths are therefore taken with every ``optimizer`` edge cut (Keras models
    hold their optimizer too): what is
    still reachable is the model, named by its own path; what is not is the
    optimizer's state (its own variables and the slots it keeps).
    """
    graph = ObjectGraph.of(ckpt)
    present = set(ckpt.keys())
    cut_optimizer_edges(graph.proto)
    found = graph.full_paths(i for i, node in enumerate(graph.nodes) if node.attributes)
    names: dict[str, str] = {}
    optimizer: set[str] = set()
    for i, node in enumerate(graph.nodes):
        for a in node.attributes:
            tensors = attribute_tensors(a.checkpoint_key, present)
            if i not in found:
                optimizer.update(tensors)
            stem = a.checkpoint_key
            if not keep_keys and i in found:
                stem = found[i] + ("" if a.name == "VARIABLE_VALUE" else "/" + a.name)
            elif not keep_keys and stem.endswith(VALUE_SUFFIX):
                stem = stem[: -len(VALUE_SUFFIX)]
            for t in tensors:
                names[t] = stem + t[len(a.checkpoint_key) :]
    return names, optimizer


def _export_names(sources, options: Options, keep_keys: bool, with_optimizer: bool) -> Options:
    """Options whose renames first make TF2 keys readable, then apply the user's rules
    and exact map to the readable names (one exact map, for the planner), and which
    leave the optimizer's state out unless asked to keep it."""
    srcs = [sources] if isinstance(sources, str) or not isinstance(sources, Sequence) else sources
    rules = compile_rules(options.rename)
    exact = dict(options.rename_exact or {})
    composed: dict[str, str] = {}
    drop = list(options.drop_objects)
    for src in srcs:
        given = isinstance(src, Checkpoint)
        ckpt: Checkpoint = src if isinstance(src, Checkpoint) else open_checkpoint(src, mmap=False)
        try:
            readable: dict[str, str] = {}
            if OBJECT_GRAPH_KEY in ckpt:
                readable, optimizer = _tf2_names(ckpt, keep_keys)
                if optimizer and not with_optimizer:
                    # The planner cuts the optimizer edges and prunes what only they
                    # reach, with its tensors: the same cut as the names above.
                    drop += [e for e in sorted(OPTIMIZER_EDGES) if e not in drop]
            for key in ckpt.keys():
                composed[key] = new_name(readable.get(key, key), exact, rules)
        finally:
            if not given:
                ckpt.close()
    return Options.of(options, rename=None, rename_exact=composed, drop_objects=tuple(drop))


@dataclass
class ExportPlan:
    """What :func:`export` writes: the transform plan, then files of tensors."""

    plan: Plan
    format: str
    out: str
    files: list[tuple[str, list[_Out]]]  # final path, its tensors in order
    index: str | None  # the sharded index's path
    skipped: list[tuple[str, str]]
    protected: frozenset[str] = frozenset()  # the sources' files (real paths)

    def summary(self) -> ExportSummary:
        ruled = self.plan.dtype_rule_counts() is not None
        return ExportSummary(
            self.out,
            [f for f, _ in self.files] + ([self.index] if self.index else []),
            [
                {
                    "name": o.pt.name,
                    "new_name": o.pt.new_name,
                    "dtype": o.pt.info.dtype,
                    "new_dtype": o.pt.new_dtype,
                    "shape": list(o.shape),
                    "permute": list(o.perm) if o.perm else None,
                    "file": storage_for(path).basename(path),
                    **({"dtype_by": o.pt.dtype_by} if ruled else {}),
                }
                for path, outs in self.files
                for o in outs
            ],
            self.skipped,
            dropped=len(self.plan.dropped),
            bytes_out=sum(o.pt.bytes_out for _, outs in self.files for o in outs),
        )


def plan_export(
    sources,
    out,
    options: Options | None = None,
    *,
    format: str | None = None,
    permute: Permutes = (),
    keep_keys: bool = False,
    with_optimizer: bool = False,
    with_bookkeeping: bool = False,
    skip_unsupported: bool = False,
    **changes,
) -> ExportPlan:
    """Decide an export from the indexes alone (see :func:`export`)."""
    options = Options.of(options, **changes)
    out = normalize(out)
    fmt = _format_of(out, format)
    if fmt == tfiles.NPZ and options.max_shard_bytes is not None:
        raise CheckpointError("npz output is one file; max_shard_bytes is for safetensors")
    options = _export_names(sources, options, keep_keys, with_optimizer)
    store = storage_for(out)
    # The planner's destination is a checkpoint prefix; an export's is its file.
    p = plan(sources, out, Options.of(options, max_shard_bytes=None))
    permuter = Permuter(permute)
    outs, skipped, left_out = [], [], []
    for pt in p.tensors:
        if pt.name in BOOKKEEPING and not (with_bookkeeping or with_optimizer):
            left_out.append(
                (pt.new_name, "training bookkeeping, not a weight (with_bookkeeping keeps it)")
            )
            continue
        why = tfiles.unstorable_name(fmt, pt.new_name)
        if why is not None:
            raise CheckpointError(
                f"{fmt} cannot hold this tensor's name: it {why}; rename it",
                path=out,
                tensor=pt.new_name,
            )
        if not tfiles.supports(fmt, pt.new_dtype):
            skipped.append((pt.new_name, f"{pt.new_dtype} tensors cannot be stored in {fmt}"))
            continue
        perm = permuter(pt.new_name, pt.info.shape, path=p.sources[pt.source].label)
        outs.append(_Out(pt, perm))
    if skipped and not skip_unsupported:
        listed = ", ".join(f"{n} ({r.split(' ')[0]})" for n, r in skipped)
        raise CheckpointError(
            f"{len(skipped)} tensor(s) cannot be stored in {fmt} (use skip_unsupported "
            f"to leave them out): {listed}",
            path=p.sources[0].label,
        )
    files, index = _file_names(store, out, _groups(outs, options.max_shard_bytes))
    protected = frozenset(
        s.ckpt.storage.realpath(f)
        for s in p.sources
        for f in list(s.ckpt.data_files) + [s.ckpt.index_path]
    )
    for path in [f for f, _ in files] + ([index] if index else []):
        if store.realpath(path) in protected:
            raise CheckpointError(
                "the output would replace a source's file (sources are never modified)", path=path
            )
    if not options.overwrite:
        # A single file and a sharded index at the same name: loaders prefer one of
        # them, so either there counts as the output.
        for path in [f for f, _ in files] + [out, out + ".index.json"]:
            if store.exists(path):
                raise CheckpointError("the output already exists (use overwrite)", path=path)
    return ExportPlan(p, fmt, out, files, index, skipped + left_out, protected)


def _groups(outs: list[_Out], limit: int | None) -> list[list[_Out]]:
    """The tensors in files of at most ``limit`` bytes each (one file without a limit)."""
    groups: list[list[_Out]] = [[]]
    size = 0
    for o in outs:
        if limit is not None and groups[-1] and size + o.pt.bytes_out > limit:
            groups.append([])
            size = 0
        groups[-1].append(o)
        size += o.pt.bytes_out
    return groups


def shard_pattern(out: str) -> re.Pattern:
    """The names of the shards of a sharded export to ``out`` (a file name or path):
    ``STEM-NNNNN-of-MMMMM.safetensors``, the count in group 2."""
    name = out.replace("\\", "/").rsplit("/", 1)[-1]
    stem = name[: -len(".safetensors")] if name.endswith(".safetensors") else name
    return re.compile(re.escape(stem) + r"-(\d{5,})-of-(\d{5,})\.safetensors")


def _listing(store, directory: str) -> list[str]:
    try:
        return store.listdir(directory or ".")
    except (OSError, CheckpointError):
        return []


def _file_names(store, out: str, groups: list[list[_Out]]):
    """The files of the export and its index (None for one file).

    Shards are named as Hugging Face names them, ``model-00001-of-00003.safetensors``,
    unless files of that count are there already (those of a live export): then the
    count in the names is the least larger one no file there has. So new shards never
    replace the files a live index names, whatever the index says, until the new
    index replaces it.
    """
    if len(groups) == 1:
        return [(out, groups[0])], None
    directory, name = store.dirname(out), store.basename(out)
    rx = shard_pattern(name)
    matches = (rx.fullmatch(n) for n in _listing(store, directory))
    taken = {int(m[2]) for m in matches if m}
    n = len(groups)
    count = n
    while count in taken:
        count += 1
    stem = name[: -len(".safetensors")] if name.endswith(".safetensors") else name
    files = [
        (store.join(directory, f"{stem}-{k + 1:05d}-of-{count:05d}.safetensors"), g)
        for k, g in enumerate(groups)
    ]
    return files, out + ".index.json"


@takes_storage_options()
def export(
    sources,
    out,
    options: Options | None = None,
    *,
    storage_options: StorageOptions | None = None,
    format: str | None = None,
    permute: Permutes = (),
    keep_keys: bool = False,
    with_optimizer: bool = False,
    with_bookkeeping: bool = False,
    skip_unsupported: bool = False,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    **changes,
) -> ExportSummary:
    """Write a checkpoint's tensors to safetensors or npz, streaming, in bounded memory.

    ``out`` ends in ``.safetensors`` or ``.npz`` (or ``format`` says which). Every
    transform option applies (``include``, ``exclude``, ``drop_objects``,
    ``rename``/``rename_exact`` — on the readable names —, ``cast`` with
    ``overflow``, ``chunk_bytes``, ``overwrite``). TF2 keys lose their
    ``/.ATTRIBUTES/VARIABLE_VALUE`` unless ``keep_keys``; the object graph is never
    written and the optimizer's state only with ``with_optimizer``. Partitioned
    tensors are written whole. ``permute``: ``[(regex, axes)]``, the first whose
    regex matches a new name reorders that tensor's axes (``('kernel$', (1, 0))``),
    tile by tile when it exceeds the chunk budget. ``progress(n)`` is called as
    each ``n`` bytes are written (``bytes_out`` in all). Tensors the format cannot
    hold are an error listing them, or with ``skip_unsupported`` left out (listed
    in ``skipped``), as is training bookkeeping (``save_counter``, ``global_step``)
    unless ``with_bookkeeping`` (or ``with_optimizer``). Names a format cannot hold
    are an error naming the tensor. With ``max_shard_bytes`` (safetensors), files
    ``model-00001-of-0000N.safetensors`` and ``model.safetensors.index.json``
    beside ``out`` as Hugging Face writes them (under another count in the names
    when files of that count are there: see :func:`_file_names`). The commit is
    the index's (or the single file's) rename, after the shards'; ``overwrite``
    then removes the old export's files (see :func:`_replaced_files`); without it
    an export committed meanwhile is an error, never replaced.

    >>> tfckpt.export("bert/bert_model.ckpt", "hf/model.safetensors", rename_exact=m,
    ...               permute=[("dense/kernel$", (1, 0))], max_shard_bytes=2 << 30)
    """
    start = time.perf_counter()
    options = Options.of(options, **changes)
    ep = plan_export(
        sources,
        out,
        options,
        format=format,
        permute=permute,
        keep_keys=keep_keys,
        with_optimizer=with_optimizer,
        with_bookkeeping=with_bookkeeping,
        skip_unsupported=skip_unsupported,
    )
    summary = ep.summary()
    if dry_run:
        return summary
    store = storage_for(ep.out)
    label = ep.plan.sources[0].ckpt.prefix
    metadata = {
        "format": "pt" if ep.format == tfiles.SAFETENSORS else "np",
        "source": store.basename(label),
        "source_format": "tensorflow checkpoint (tensor bundle v2)",
        "producer": f"tfckpt {__version__}",
    }
    ckpts = {i: s.ckpt for i, s in enumerate(ep.plan.sources)}
    w = _Writing(store, ep, options, ckpts, metadata, progress)
    try:
        replaced = _replaced_files(store, ep) if options.overwrite else []
        w.write_all()
        check_overflow(w.overflow, options.overflow, ep.out)
        w.commit()
    except OSError as e:
        w.discard()
        raise CheckpointWriteError(f"cannot write: {e.strerror or e}", path=ep.out) from None
    except BaseException:
        w.discard()
        raise
    finally:
        given = sources if isinstance(sources, (list, tuple)) else [sources]
        for s in ep.plan.sources:
            if not any(s.ckpt is g for g in given):
                s.ckpt.close()
    w.finish(replaced)
    if options.durable:
        store.fsync_dir(store.dirname(ep.out) or ".")
    summary.seconds = time.perf_counter() - start
    summary.cast_counts = w.overflow
    return summary


def _indexed_shards(store, index: str, out: str) -> list[str]:
    """The shards of an export to ``out`` that the index file ``index`` names: names of
    the shard pattern (:func:`shard_pattern`), in the directory of ``out``; none when
    ``index`` is not a well-formed index."""
    try:
        names = set(json.loads(store.read_bytes(index))["weight_map"].values())
    except (OSError, CheckpointError, ValueError, KeyError, TypeError, AttributeError):
        return []
    rx = shard_pattern(out)
    directory = store.dirname(out)
    return [
        store.join(directory, n)
        for n in sorted(names, key=str)
        if isinstance(n, str) and rx.fullmatch(n)
    ]


def _remove_killed_runs(store, ep: ExportPlan) -> None:
    """Delete what exports to this name killed part-way left (locally): their temporaries,
    and the shards an index temporary of theirs names (moved into place before a commit
    that never came) that the live index does not name."""
    stale = stale_temporaries(store.dirname(ep.out), _owned_names(ep.out))
    if not stale:
        return
    index = ep.out + ".index.json"
    live = set(_indexed_shards(store, index, ep.out))
    mine = {f for f, _ in ep.files}
    orphans = []
    for path in stale:
        if store.basename(path).startswith(store.basename(index) + TMP_MARK):
            orphans += [f for f in _indexed_shards(store, path, ep.out) if f not in live | mine]
    for path in orphans + stale:
        if store.realpath(path) in ep.protected:
            continue
        try:
            store.remove(path)
        except OSError:
            pass


def _owned_names(out: str) -> Callable[[str], bool]:
    """Whether a file name (in the export's directory) is one an export to ``out`` writes."""
    name = out.replace("\\", "/").rsplit("/", 1)[-1]
    rx = shard_pattern(name)
    return lambda n: n in (name, name + ".index.json") or rx.fullmatch(n) is not None


class _Writing:
    """One export's files being written and committed; what to remove if it fails.

    Locally every file is written under a temporary name beside its final one; the
    commit renames them into place, shards first (under names no file has, see
    :func:`_file_names`; linked, so a name taken meanwhile is an error), the index
    (or the single file) last: replacing with ``overwrite``, else linked too, so an
    export another run committed meanwhile is refused, never replaced. On an object
    store, where an upload appears whole or not at all, files are uploaded under
    their final names; the single file's upload, or the index's after the shards,
    is the commit.
    """

    def __init__(self, store, ep: ExportPlan, options: Options, ckpts, metadata, progress):
        self.store, self.ep, self.options = store, ep, options
        self.ckpts, self.metadata, self.progress = ckpts, metadata, progress
        self.renames = store.atomic_rename
        self.overflow: dict[str, int] = {}
        self.fresh: list[str] = []  # this run's files, none of them live yet
        self.temps: dict[str, str] = {}  # final -> temporary (locally)
        self.made: list[str] = []
        self.commit_check: Callable[[], bool] | None = None  # did the commit happen?
        self.retired: str | None = None  # a copy of the replaced index, see _retire_index

    def write_all(self) -> None:
        store, ep = self.store, self.ep
        directory = store.dirname(ep.out)
        _remove_killed_runs(store, ep)
        self.made = store.makedirs(directory)
        for path, outs in ep.files:
            if self.renames:
                where = self.temps[path] = temporary_base(path)
                self.fresh.append(where)
            else:
                where = path
                if ep.index is not None:  # a shard under a name no index uses yet
                    self.fresh.append(where)
            self._write_file(where, outs)
        if ep.index is not None and self.renames:
            tmp = self.temps[ep.index] = temporary_base(ep.index)
            self.fresh.append(tmp)
            store.write_new(tmp, self._index_bytes(), durable=self.options.durable)

    def _index_bytes(self) -> bytes:
        ep, store = self.ep, self.store
        index = {
            "metadata": {
                "total_size": sum(o.pt.bytes_out for _, outs in ep.files for o in outs),
                **self.metadata,
            },
            "weight_map": {
                o.pt.new_name: store.basename(path) for path, outs in ep.files for o in outs
            },
        }
        return json.dumps(index, indent=2).encode()

    def _write_file(self, where: str, outs: list[_Out]) -> None:
        store, options = self.store, self.options
        f = store.open_writer(where)
        w: tfiles.SafetensorsWriter | tfiles.NpzWriter | None = None
        try:
            if self.ep.format == tfiles.SAFETENSORS:
                w = tfiles.SafetensorsWriter(f, [o.entry for o in outs], self.metadata)
            else:
                w = tfiles.NpzWriter(f, [o.entry for o in outs])
            # Through the engine's pipeline: read ahead, cast, write behind, small
            # tensors in batches, permuted ones in tiles.
            counts: dict[str, tuple[int, int, int, int]] = {}
            stream_items(
                [o.item for o in outs],
                self.ckpts,
                ProgressSink(TensorFileSink(w), self.progress),
                overflow=options.overflow,
                chunk_bytes=options.chunk_bytes,
                endianness="little",  # unused: raw (no numpy) tensors are never exported
                counts=counts,
            )
            self.overflow.update({n: c[0] for n, c in counts.items() if c[0]})
            w.close()
            f.flush()
            if options.durable:
                store.fsync(f)
        except BaseException:
            if isinstance(w, tfiles.NpzWriter):
                w.abandon()
            if hasattr(f, "discard"):
                f.discard()  # an upload: store nothing
            else:
                try:
                    f.close()
                except OSError:
                    pass
            raise
        f.close()

    def commit(self) -> None:
        store, ep, overwrite = self.store, self.ep, self.options.overwrite
        if not self.renames:
            if ep.index is not None:
                data = self._index_bytes()
                self.commit_check = lambda: _holds(store, ep.index, data)
                store.write_bytes(ep.index, data)  # one request: the commit
            self.fresh = []
            return
        try:
            if ep.index is not None:
                for final, _ in ep.files:
                    tmp = self.temps[final]
                    self.fresh.append(final)  # before the move: never unlisted
                    try:
                        store.rename_noreplace(tmp, final)
                    except FileExistsError:
                        self.fresh.remove(final)  # another run's
                        raise
                    self.fresh.remove(tmp)
            self._retire_index()
            final = ep.index or ep.out
            tmp = self.temps[final]
            self.commit_check = lambda: not store.exists(tmp)
            if overwrite:
                store.replace(tmp, final)
            else:
                store.rename_noreplace(tmp, final)
        except FileExistsError as e:
            raise CheckpointWriteError(
                "another run wrote an export here meanwhile (pass overwrite to replace it)",
                path=e.filename or ep.out,
            ) from None
        self.fresh = []

    def _retire_index(self) -> None:
        """Keep a copy of the index being replaced under a temporary name of this run until
        the files it names are removed: a later run removes them if this one is killed
        in between (see :func:`_remove_killed_runs`)."""
        index = self.ep.out + ".index.json"
        if not self.options.overwrite or not self.store.isfile(index):
            return
        retired = temporary_base(index)
        self.fresh.append(retired)
        self.store.write_new(retired, self.store.read_bytes(index))
        self.retired = retired

    def finish(self, replaced: list[str]) -> None:
        """After the commit: remove the replaced export's files, then the retired index."""
        interrupted = None
        for stale in replaced + ([self.retired] if self.retired else []):
            for _ in range(2):  # an interrupt: this one again, and the rest (quick)
                try:
                    self.store.remove(stale)
                except (OSError, CheckpointError):
                    pass
                except KeyboardInterrupt as e:
                    interrupted = e
                    continue
                break
        if interrupted is not None:
            raise interrupted

    def discard(self) -> None:
        """After a failure: remove this run's files, unless its commit happened."""
        check = self.commit_check
        try:
            committed = check is not None and check()
        except BaseException:
            committed = True  # unknown: keep what may be live
        if not committed:
            discard(self.fresh)
        self.fresh = []
        self.store.remove_dirs(self.made)


def _holds(store, path: str, data: bytes) -> bool:
    try:
        return store.read_bytes(path) == data
    except (OSError, CheckpointError):
        return True  # cannot tell: it may


def _replaced_files(store, ep: ExportPlan) -> list[str]:
    """The files of the export at ``ep.out`` this one replaces and does not rewrite, to
    remove after the commit: the single file, the index and the shards it names.

    Only files an export writes: the single file and the index by their names; a
    shard only when a well-formed index at ``out`` names it, with the name of a
    shard of ``out`` (``STEM-NNNNN-of-NNNNN.safetensors``) in the same directory.
    Never a source's file, nor one this export writes.
    """
    index = ep.out + ".index.json"
    old = [ep.out] if ep.index is not None else [index]  # the index is replaced itself
    old += _indexed_shards(store, index, ep.out)
    mine = {f for f, _ in ep.files} | ({ep.index} if ep.index else set())
    return [
        f
        for f in old
        if f not in mine and store.isfile(f) and store.realpath(f) not in ep.protected
    ]
