"""Leaving TensorFlow: checkpoints to safetensors / npz.

:func:`export` plans with :func:`~tfckpt.plan` (so selection, renaming and casts
work as for every transform), then streams each tensor chunk by chunk through
the cast into the writers of :mod:`tfckpt.tensorfiles`; ``permute`` reorders
axes tile by tile (:mod:`tfckpt.permute`). Files are written under temporary
names and renamed into place at the end (see
:class:`~tfckpt.interop.export_files.ExportWriting` and :class:`~tfckpt.io.commit.Commit`),
the index of a sharded export last. The way back is :mod:`tfckpt.importing`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.errors import (
    CheckpointError,
    CheckpointWriteError,
)
from tfckpt.format import tensorfiles as tfiles
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, attribute_tensors
from tfckpt.format.tf2names import BOOKKEEPING, OPTIMIZER_EDGES, VALUE_SUFFIX, cut_optimizer_edges
from tfckpt.interop.export_files import ExportWriting, file_names, replaced_files
from tfckpt.io.storage import Storage, StorageOptions, normalize
from tfckpt.rewrite.cast import CastCounts, check_overflow
from tfckpt.rewrite.engine import Summary, execute
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.permute import Permuter, Permutes
from tfckpt.rewrite.planner import Plan, PlannedTensor, plan
from tfckpt.rewrite.rules import compile_rules, new_name
from tfckpt.rewrite.streaming import TaskItem
from tfckpt.rewrite.tasks import task_item
from tfckpt.version import __version__

# -- export


@dataclass
class ExportTensor:
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
        pt = self.pt
        return task_item(pt, None, pt.info.nbytes, pt.bytes_out, perm=self.perm)


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


def _export_names(
    sources,
    options: Options,
    keep_keys: bool,
    with_optimizer: bool,
    storage_options: StorageOptions | None,
) -> Options:
    """Options whose renames first make TF2 keys readable, then apply the user's rules
    and exact map to the readable names (one exact map, for the planner), and which
    leave the optimizer's state out unless asked to keep it. Sources given as paths are
    opened with ``storage_options``."""
    srcs = [sources] if isinstance(sources, str) or not isinstance(sources, Sequence) else sources
    rules = compile_rules(options.rename)
    exact = dict(options.rename_exact or {})
    composed: dict[str, str] = {}
    drop = list(options.drop_objects)
    for src in srcs:
        given = isinstance(src, Checkpoint)
        ckpt: Checkpoint = (
            src
            if isinstance(src, Checkpoint)
            else open_checkpoint(src, mmap=False, storage_options=storage_options)
        )
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
class ExportFiles:
    """The output of an export's :class:`~tfckpt.rewrite.planner.Plan` (its ``output``):
    the files its tensors go to, instead of a checkpoint; :func:`~tfckpt.execute`
    writes them through :meth:`write`.

    >>> p = plan_export("bert/bert_model.ckpt", "hf/model.safetensors")
    >>> [path for path, _ in p.output.files], p.output.format
    """

    format: str
    out: str
    files: list[tuple[str, list[ExportTensor]]]  # final path, its tensors in order
    index: str | None  # the sharded index's path
    skipped: list[tuple[str, str]]
    protected: frozenset[str] = frozenset()  # the sources' files (real paths)

    def summary(self, p: Plan) -> Summary:
        """What the export of ``p`` writes, before it is written (seconds and counts zero)."""
        ruled = p.dtype_rule_counts() is not None
        outs = [o for _, outs in self.files for o in outs]
        return Summary(
            self.out,
            kept=len(outs),
            dropped=len(p.dropped),
            renamed=sum(o.pt.renamed for o in outs),
            cast=sum(o.pt.cast for o in outs),
            bytes_in=sum(o.pt.info.nbytes for o in outs),
            bytes_out=sum(o.pt.bytes_out for o in outs),
            seconds=0.0,
            files=[f for f, _ in self.files] + ([self.index] if self.index else []),
            tensors=[
                {
                    "name": o.pt.name,
                    "new_name": o.pt.new_name,
                    "dtype": o.pt.info.dtype,
                    "new_dtype": o.pt.new_dtype,
                    "shape": list(o.shape),
                    "permute": list(o.perm) if o.perm else None,
                    "file": p.storage.basename(path),
                    **({"dtype_by": o.pt.dtype_by} if ruled else {}),
                }
                for path, outs in self.files
                for o in outs
            ],
            skipped=self.skipped,
        )

    def write(self, p: Plan, store: Storage, options: Options, progress=None) -> Summary:
        """Write and commit these files on ``store`` from the sources of ``p`` (what
        :func:`~tfckpt.execute` does for an export's plan); the files they replace are
        removed after the commit, this run's files after a failure."""
        start = time.perf_counter()
        summary = self.summary(p)
        summary.cast_counts = _write_files(p, self, store, options, progress)
        summary.seconds = time.perf_counter() - start
        return summary


def plan_export(
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
    **changes,
) -> Plan:
    """Decide an export from the indexes alone (see :func:`export`): the transform's
    :class:`~tfckpt.rewrite.planner.Plan`, whose ``output`` is the files
    (:class:`ExportFiles`) on the storage of the plan (``plan.storage``);
    :func:`~tfckpt.execute` writes it.

    >>> p = plan_export("bert/bert_model.ckpt", "hf/model.safetensors", cast="float16")
    >>> tfckpt.execute(p).files
    """
    options = Options.of(options, **changes)
    out = normalize(out)
    fmt = _format_of(out, format)
    if fmt == tfiles.NPZ and options.max_shard_bytes is not None:
        raise CheckpointError("npz output is one file; max_shard_bytes is for safetensors")
    options = _export_names(sources, options, keep_keys, with_optimizer, storage_options)
    # The planner's destination is a checkpoint prefix; an export's is its file.
    p = plan(
        sources, out, Options.of(options, max_shard_bytes=None), storage_options=storage_options
    )
    store = p.storage
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
        outs.append(ExportTensor(pt, perm))
    if skipped and not skip_unsupported:
        listed = ", ".join(f"{n} ({r.split(' ')[0]})" for n, r in skipped)
        raise CheckpointError(
            f"{len(skipped)} tensor(s) cannot be stored in {fmt} (use skip_unsupported "
            f"to leave them out): {listed}",
            path=p.sources[0].label,
        )
    files, index = file_names(store, out, _groups(outs, options.max_shard_bytes))
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
    return replace(p, output=ExportFiles(fmt, out, files, index, skipped + left_out, protected))


def _groups(outs: list[ExportTensor], limit: int | None) -> list[list[ExportTensor]]:
    """The tensors in files of at most ``limit`` bytes each (one file without a limit)."""
    groups: list[list[ExportTensor]] = [[]]
    size = 0
    for o in outs:
        if limit is not None and groups[-1] and size + o.pt.bytes_out > limit:
            groups.append([])
            size = 0
        groups[-1].append(o)
        size += o.pt.bytes_out
    return groups


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
) -> Summary:
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
    when files of that count are there: see
    :func:`~tfckpt.interop.export_files.file_names`). The commit is the index's (or
    the single file's) rename, after the shards'; ``overwrite`` then removes the old
    export's files (see :func:`~tfckpt.interop.export_files.replaced_files`); without
    it an export committed meanwhile is an error, never replaced.

    >>> tfckpt.export("bert/bert_model.ckpt", "hf/model.safetensors", rename_exact=m,
    ...               permute=[("dense/kernel$", (1, 0))], max_shard_bytes=2 << 30)
    """
    start = time.perf_counter()
    p = plan_export(
        sources,
        out,
        options,
        storage_options=storage_options,
        format=format,
        permute=permute,
        keep_keys=keep_keys,
        with_optimizer=with_optimizer,
        with_bookkeeping=with_bookkeeping,
        skip_unsupported=skip_unsupported,
        **changes,
    )
    try:
        if dry_run:
            return p.output.summary(p)
        summary = execute(p, progress=progress)
    finally:
        given = sources if isinstance(sources, (list, tuple)) else [sources]
        for s in p.sources:
            if not any(s.ckpt is g for g in given):
                s.ckpt.close()
    summary.seconds = time.perf_counter() - start
    return summary


def _write_files(
    p: Plan, ep: ExportFiles, store: Storage, options: Options, progress
) -> dict[str, CastCounts]:
    """Write and commit the files of the export ``p`` on ``store``, then remove the files
    they replace; on a failure, this run's files. What the casts did, per tensor."""
    label = p.sources[0].ckpt.prefix
    metadata = {
        "format": "pt" if ep.format == tfiles.SAFETENSORS else "np",
        "source": store.basename(label),
        "source_format": "tensorflow checkpoint (tensor bundle v2)",
        "producer": f"tfckpt {__version__}",
    }
    ckpts = {i: s.ckpt for i, s in enumerate(p.sources)}
    w = ExportWriting(store, ep, options, ckpts, metadata, progress)
    try:
        replaced = replaced_files(store, ep) if options.overwrite else []
        w.write_all()
        check_overflow(w.counts, options.overflow, ep.out)
        w.publish()
    except OSError as e:
        w.commit.discard()
        raise CheckpointWriteError(f"cannot write: {e.strerror or e}", path=ep.out) from None
    except BaseException:
        w.commit.discard()
        raise
    w.commit.remove_replaced(replaced)
    return w.counts
