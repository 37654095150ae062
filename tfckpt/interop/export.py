"""Leaving TensorFlow: checkpoints to safetensors / npz.

:func:`plan_export` plans with :func:`~tfckpt.plan` (so selection, renaming and casts
work as for every transform), then cuts the tensors into files
(:class:`~tfckpt.interop.export_files.ExportFiles`, the plan's output);
:func:`~tfckpt.execute` streams each tensor chunk by chunk through the cast into the
writers of :mod:`tfckpt.format.tensorfiles`; ``permute`` reorders axes tile by tile
(:mod:`tfckpt.rewrite.permute`). Files are written under temporary names and renamed
into place at the end (:class:`~tfckpt.io.commit.Commit`), the index of a sharded
export last. The way back is :mod:`tfckpt.interop.importing`.
"""

from __future__ import annotations

import math
import os
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.errors import (
    CheckpointError,
    option,
)
from tfckpt.format import dtypes as _dt
from tfckpt.format import tensorfiles as tfiles
from tfckpt.format.bundle import TensorInfo
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, attribute_tensors
from tfckpt.format.tf2names import BOOKKEEPING, OPTIMIZER_EDGES, VALUE_SUFFIX, cut_optimizer_edges
from tfckpt.interop.export_files import ExportFiles, ExportRows, file_names
from tfckpt.io.storage import StorageOptions, normalize
from tfckpt.rewrite.edits import Literal
from tfckpt.rewrite.engine import Summary, execute
from tfckpt.rewrite.options import Options, Permutes
from tfckpt.rewrite.planner import plan
from tfckpt.rewrite.plans import Plan
from tfckpt.rewrite.rules import (
    NAME_MAP,
    RENAME,
    RENAME_EXACT,
    UNMAPPED,
    DtypePolicy,
    NameRules,
    Unmatched,
    compile_rules,
)

RENAMES = (RENAME, RENAME_EXACT, NAME_MAP)  # matched on the readable names, before the plan


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


def tf2_names(ckpt: Checkpoint, keep_keys: bool) -> tuple[dict[str, str], set[str]]:
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
) -> tuple[Options, list[Unmatched], list[str]]:
    """Options whose renames first make TF2 keys readable, then apply the user's rules,
    name maps and exact map to the readable names (one exact map, for the planner), and which
    leave the optimizer's state out unless asked to keep it; the rules' patterns that
    matched no readable name, and those names. Sources given as paths are opened with
    ``storage_options``."""
    srcs = [sources] if isinstance(sources, str) or not isinstance(sources, Sequence) else sources
    naming = NameRules.of(Options(rename=options.rename, rename_exact=options.rename_exact))
    naming = replace(naming, maps=compile_rules(options.name_map, "name_map"))
    composed: dict[str, str] = {}
    seen: list[str] = []  # the readable names
    drop = list(options.drop_objects)
    plain = not (options.rename or options.rename_exact or options.name_map)
    for src in srcs:
        given = isinstance(src, Checkpoint)
        ckpt: Checkpoint = (
            src
            if isinstance(src, Checkpoint)
            else open_checkpoint(src, mmap=False, storage_options=storage_options)
        )
        try:
            if len(srcs) == 1 and plain and OBJECT_GRAPH_KEY not in ckpt:
                # Every name is its own: no map of 200 000 names to themselves.
                return options, [], []
            readable: dict[str, str] = {}
            if OBJECT_GRAPH_KEY in ckpt:
                readable, optimizer = tf2_names(ckpt, keep_keys)
                if optimizer and not with_optimizer:
                    # The planner cuts the optimizer edges and prunes what only they
                    # reach, with its tensors: the same cut as the names above.
                    drop += [e for e in sorted(OPTIMIZER_EDGES) if e not in drop]
            for key in ckpt.keys():
                name = readable.get(key, key)
                if readable:
                    seen.append(name)
                new = naming.map_name(name)
                # One no name_map rule names is left to the planner, which says so.
                if new is not None:
                    composed[key] = new
        finally:
            if not given:
                ckpt.close()
    options = Options.of(options, rename=None, rename_exact=composed, drop_objects=tuple(drop))
    return options, naming.unmatched(), seen


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
    made: Mapping[str, np.ndarray] | None = None,
    **changes,
) -> Plan:
    """Decide an export from the indexes alone (see :func:`export`): the transform's
    :class:`~tfckpt.rewrite.plans.Plan`, whose ``output`` is the files
    (:class:`ExportFiles`) on the storage of the plan (``plan.storage``);
    :func:`~tfckpt.execute` writes it. ``made``: tensors no source stores, by their
    output names, written as given after the sources' (cast as ``cast`` casts a
    variable): a preset's computed tables.

    >>> p = plan_export("bert/bert_model.ckpt", "hf/model.safetensors", cast="float16")
    >>> tfckpt.execute(p).files
    """
    options = Options.of(options, **changes)
    out = normalize(out)
    fmt = _format_of(out, format)
    if fmt == tfiles.NPZ and options.max_shard_bytes is not None:
        raise CheckpointError(
            f"npz output is one file; {option('max_shard_bytes', '--max-shard-bytes')} is for "
            "safetensors"
        )
    if permute:
        options = Options.of(options, permute=[*permute, *options.permute])
    # Sources given as paths are opened here, once, for the names and the plan both.
    given = [sources] if isinstance(sources, (str, os.PathLike, Checkpoint)) else list(sources)
    opened = [
        s
        if isinstance(s, Checkpoint)
        else open_checkpoint(s, mmap=False, storage_options=storage_options)
        for s in given
    ]
    try:
        named, unmatched, seen = _export_names(
            opened, options, keep_keys, with_optimizer, storage_options
        )
        # The planner's destination is a checkpoint prefix; an export's is its file, on
        # the storage the options given make (the sources' own say nothing of it). The
        # renames' patterns are checked on the readable names, not by plan().
        p = plan(
            opened,
            out,
            Options.of(named, max_shard_bytes=None, allow_unmatched=True),
            storage_options=storage_options,
            object_graph=False,
        )
        p.options = Options.of(p.options, allow_unmatched=options.allow_unmatched)
        p.unmatched = [u for u in p.unmatched if u[0] not in RENAMES] + unmatched
        p.check_matched(seen)
        _add_made(p, made or {}, out)
    except BaseException:
        for s, ckpt in zip(given, opened):
            if ckpt is not s:
                ckpt.close()
        raise
    for source, s in zip(p.sources, given):  # each named as it was given
        source.label = s.prefix if isinstance(s, Checkpoint) else os.fspath(s)
    store = p.storage
    outs = array("q")  # the rows of the plan's tensors written
    skipped, left_out = [], []
    keep_bookkeeping = with_bookkeeping or with_optimizer
    supported = {d: tfiles.supports(fmt, d) for d in set(p.tensors.new_dtype)}
    rows = zip(p.tensors.name, p.tensors.new_name, p.tensors.new_dtype)  # read as columns
    check_names = tfiles.may_be_unstorable(fmt, p.tensors.new_name)
    for row, (name, new_name, new_dtype) in enumerate(rows):
        if name in BOOKKEEPING and not keep_bookkeeping:
            left_out.append(
                (
                    new_name,
                    "training bookkeeping, not a weight "
                    "(--with-bookkeeping or with_bookkeeping=True keeps it)",
                )
            )
            continue
        why = tfiles.unstorable_name(fmt, new_name) if check_names else None
        if why is not None:
            raise CheckpointError(
                f"{fmt} cannot hold this tensor's name: it {why}; rename it",
                path=out,
                tensor=new_name,
            )
        if not supported[new_dtype]:
            skipped.append((new_name, f"{new_dtype} tensors cannot be stored in {fmt}"))
            continue
        outs.append(row)
    if skipped and not skip_unsupported:
        listed = ", ".join(f"{n} ({r.split(' ')[0]})" for n, r in skipped)
        raise CheckpointError(
            f"{len(skipped)} tensor(s) cannot be stored in {fmt} (use "
            f"{option('skip_unsupported=True', '--skip-unsupported')} to leave them out): {listed}",
            path=p.sources[0].label,
        )
    groups = _groups(ExportRows(p.tensors, outs), options.max_shard_bytes)
    files, index = file_names(store, out, groups)
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
                raise CheckpointError(
                    f"the output already exists (use {option('overwrite=True', '--overwrite')})",
                    path=path,
                )
    unmapped = [(n, f"{why}: left out") for _, n, why in p.dropped if why == UNMAPPED]
    skipped += left_out + unmapped
    return replace(p, output=ExportFiles(fmt, out, files, index, skipped, protected))


def _add_made(p: Plan, made: Mapping[str, np.ndarray], out: str) -> None:
    """``made``'s tensors as rows of ``p``'s tensors, each its own value (a literal the
    engine streams as it streams an edit's)."""
    policy = DtypePolicy.of(p.options)
    taken = set(p.tensors.new_name) if made else set()
    for name, value in made.items():
        if name in taken:
            raise CheckpointError("a source tensor already has this name", path=out, tensor=name)
        arr = np.asarray(value, order="C")  # a scalar stays one (ascontiguousarray: [1])
        dtype = _dt.lookup(arr.dtype)
        shape = tuple(int(n) for n in arr.shape)
        new_dtype, by = policy.decide(name, dtype)
        info = TensorInfo(name, dtype.name, shape, arr.nbytes, 0, 0, None)
        bytes_out = math.prod(shape) * new_dtype.fixed_itemsize
        p.tensors.add(
            0, name, name, info, new_dtype.name, bytes_out, dtype_by=by, edit=Literal(arr.tobytes())
        )


def _groups(outs: ExportRows, limit: int | None) -> list[ExportRows]:
    """The tensors in files of at most ``limit`` bytes each (one file without a limit)."""
    if limit is None:
        return [outs]
    groups, first, size = [], 0, 0
    sizes = outs.tensors.bytes_out
    for i, row in enumerate(outs.rows):
        if i > first and size + sizes[row] > limit:
            groups.append(outs[first:i])
            first, size = i, 0
        size += sizes[row]
    return [*groups, outs[first:]]


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
    on_total: Callable[[int], None] | None = None,
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
    each ``n`` bytes are written (``bytes_out`` in all), ``on_total(bytes_out)`` once
    before the first. Tensors the format cannot
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
        if on_total is not None:
            on_total(p.output.summary(p).bytes_out)
        summary = execute(p, progress=progress)
    finally:
        close_opened(p, sources)
    summary.seconds = time.perf_counter() - start
    return summary


def close_opened(p: Plan, sources) -> None:
    """Close the sources of ``p`` that it opened: not the checkpoints ``sources`` gave."""
    given = sources if isinstance(sources, (list, tuple)) else [sources]
    for s in p.sources:
        if not any(s.ckpt is g for g in given):
            s.ckpt.close()
