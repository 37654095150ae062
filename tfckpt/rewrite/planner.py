"""Planning a transform: from the sources' indexes alone, what each output tensor is.

:func:`plan` decides every output tensor's source, new name, new dtype and bytes,
and what is dropped and why; it reads no tensor data. :func:`tfckpt.execute`
then writes the plan.
"""

from __future__ import annotations

import operator
import os
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import NamedTuple

import numpy as np

from tfckpt.checkpoint.opening import open_checkpoint, open_in
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.errors import PREFER_ARGS, CheckpointError, option
from tfckpt.format import dtypes as _dt
from tfckpt.format.bookkeeping import tf1_bookkeeping, tf2_bookkeeping
from tfckpt.format.bundle import TensorInfo, TensorTable
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, attribute_tensors, renamed_key
from tfckpt.format.tf2names import VARIABLE_VALUE, flat_names
from tfckpt.io import paths
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for
from tfckpt.rewrite import collector
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.pieces import assemble
from tfckpt.rewrite.plans import Plan, PlannedTensor, PlannedTensors, Source
from tfckpt.rewrite.rules import DtypePolicy, NameRules, ShapeRules, check_mapped
from tfckpt.rewrite.savedmodel import check_saved_model, saved_model_output, source_saved_models

SAVE_COUNTER = "save_counter"  # the bookkeeping child every tf.train.Checkpoint.save() adds


def source_flat_names(source: Source) -> dict[str, str]:
    """Each tensor of a TF2 source and its flat name (see :mod:`tfckpt.format.tf2names`); {} for
    a TF1 source. Patterns on source names match these too: Keras 3 keys a trained
    model's weights by the optimizer's lists (``optimizer/_trainable_variables/N``),
    its flat name follows the model (``model/_operations/2/gamma``).
    """
    if source.graph is None:
        return {}
    return flat_names(source.graph, set(source.ckpt.keys()))


TABLE_SUFFIXES = ("-keys", "-values")  # a TF1 lookup table's saveable: NAME-keys, NAME-values


def fixed_dtype_tensors(source: Source) -> set[str]:
    """The tensors of ``source`` that are no variable's value, which TensorFlow restores
    only in the dtype they were saved in (it checks it): in a TF2 source the tensors of
    every attribute not named ``VARIABLE_VALUE`` (lookup tables' ``-keys``/``-values``,
    other saveables); in a TF1 source, which names no attribute, each ``NAME-keys``
    stored beside a ``NAME-values``, and that ``NAME-values``.

    >>> fixed_dtype_tensors(open_sources("train/ckpt-3", None)[0])
    {'table/.ATTRIBUTES/table-keys', 'table/.ATTRIBUTES/table-values'}
    """
    present = set(source.ckpt.keys())
    if source.graph is not None:
        return {
            t
            for node in source.graph.nodes
            for a in node.attributes
            if a.name != VARIABLE_VALUE
            for t in attribute_tensors(a.checkpoint_key, present)
            if t in present
        }
    keys, values = TABLE_SUFFIXES
    out = set()
    for n in present:
        if n.endswith(keys) and n[: -len(keys)] + values in present:
            out |= {n, n[: -len(keys)] + values}
    return out


def bookkeeping_tensors(source: Source) -> set[str]:
    """The tensors of ``source`` that are training bookkeeping (metrics' state, an
    optimizer's step and hyperparameters, save and step counters), which ``cast`` passes
    by unless ``cast_bookkeeping``: by its object graph in a TF2 source, by name in a TF1
    one (see :mod:`tfckpt.format.bookkeeping`).

    >>> sorted(bookkeeping_tensors(open_sources("keras/variables/variables", None)[0]))[:2]
    ['keras_api/metrics/0/count/.ATTRIBUTES/VARIABLE_VALUE', 'keras_api/metrics/0/total/...']
    """
    ckpt = source.ckpt
    if source.graph is None:
        return tf1_bookkeeping(ckpt.keys())
    return tf2_bookkeeping(source.graph, set(ckpt.keys()), lambda t: ckpt.info(t).shape == ())


def destination_storage(
    dst, sources: list[Source], storage_options: StorageOptions | None
) -> Storage:
    """The storage of the output ``dst``: made with ``storage_options``, else with those of
    the first source opened with some."""
    if storage_options is None:
        given = (s.ckpt.storage.options for s in sources if s.ckpt.storage.options is not None)
        storage_options = next(given, None)
    store = storage_for(normalize(dst), storage_options)
    store.check_writable(normalize(dst))
    return store


def resolve_destination(
    store: Storage,
    dst,
    sources: list[Source],
    overwrite: bool,
    *,
    instead: str = "write elsewhere",
    writes: bool = True,
) -> str:
    """The output prefix on ``store`` (``dst``, its ``.index`` or a data file of it: see
    :func:`~tfckpt.io.paths.output_prefix`); refuses sources (the message says what to
    do ``instead``) and (without ``overwrite``) existing checkpoints. ``writes=False``: a
    plan only compared with ``dst`` (``verify --against``), which may be a source."""
    dst = normalize(dst)
    if dst.endswith(("/", os.sep)) or store.isdir(dst):
        dst = store.join(store.dir_path(dst), sources[0].ckpt.stem)
    else:
        dst = paths.output_prefix(dst)
    real = store.realpath(dst)
    for s in sources if writes else ():
        if s.ckpt.storage.realpath(s.ckpt.prefix) == real:
            raise CheckpointError(
                f"the destination is a source checkpoint; {instead} (sources are never modified)",
                path=dst,
            )
        if s.ckpt.storage.realpath(s.ckpt.storage.dirname(s.ckpt.prefix)) == store.realpath(
            store.dirname(dst)
        ) and s.ckpt.storage.basename(s.ckpt.prefix) == store.basename(dst):
            raise CheckpointError("the destination would overwrite a source's data files", path=dst)
    if store.isfile(paths.index_filename(dst)) and not overwrite:
        raise CheckpointError(
            f"the destination already exists (use {option('overwrite=True', '--overwrite')})",
            path=paths.index_filename(dst),
        )
    return dst


def open_sources(
    sources, storage_options: StorageOptions | None, *, store: Storage | None = None
) -> list[Source]:
    """The sources of a transform: those given as paths opened on ``store`` (the paths
    are read from a file on it), else with ``storage_options``; a
    :class:`~tfckpt.Checkpoint` given keeps its own storage."""
    if isinstance(sources, (str, os.PathLike, Checkpoint)):
        sources = [sources]
    out = []
    for src in sources:
        if isinstance(src, Checkpoint):
            ckpt = src
        elif store is not None:
            ckpt = open_in(store, src, mmap=False)
        else:
            ckpt = open_checkpoint(src, mmap=False, storage_options=storage_options)
        graph = None
        if OBJECT_GRAPH_KEY in ckpt:
            graph = ObjectGraph.of(ckpt)
        out.append(
            Source(os.fspath(src) if not isinstance(src, Checkpoint) else src.prefix, ckpt, graph)
        )
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


@collector.paused()
def plan(
    sources,
    dst,
    options: Options | None = None,
    *,
    storage_options: StorageOptions | None = None,
    object_graph: bool = True,
    writes: bool = True,
    **changes,
) -> Plan:
    """Decide every output tensor from the sources' indexes; reads no tensor data.

    ``options`` (see :class:`~tfckpt.Options`), amended by keyword arguments,
    are kept in the plan: :func:`~tfckpt.execute` writes it with them. Paths may be
    fsspec URLs, opened with ``storage_options``; the output's storage (``Plan.storage``:
    made with them, else with those of the first source opened with some) is kept too.
    ``object_graph=False``: the output keeps no TF2 object graph (an export's files).
    ``writes=False``: the plan is only compared with an existing ``dst`` (``verify
    --against``), which may then be a source.

    >>> p = tfckpt.plan("train/", "out/", cast="float16", exclude=["/Adam"])
    >>> p.bytes_out, [t.new_name for t in p.tensors][:3]
    >>> tfckpt.execute(p)
    """
    options = Options.of(options, **changes)
    policy = DtypePolicy.of(options)
    srcs = open_sources(sources, storage_options)
    naming = NameRules.of(options)
    store = destination_storage(dst, srcs, storage_options)
    sm = saved_model_output(sources, srcs, dst, store, options) if writes else None
    if sm is not None:
        dst = sm.variables_prefix(store)
    else:
        dst = resolve_destination(store, dst, srcs, options.overwrite, writes=writes)

    dropped: list[tuple[str, str, str]] = []
    drop_specs = list(options.drop_objects)
    if drop_specs and not any(s.graph for s in srcs):
        raise CheckpointError(
            f"--drop-object needs a TF2 object-based checkpoint (one with {OBJECT_GRAPH_KEY})",
            path=srcs[0].ckpt.prefix,
        )
    winner = _root_object_owners(srcs, options.prefer)
    # Built once per source, before its graph is cut, and only for patterns to match.
    patterned = bool(naming.includes or naming.excludes or policy.labels)
    flats = [source_flat_names(s) if patterned else {} for s in srcs]
    fixed = [fixed_dtype_tensors(s) if policy.target is not None else set() for s in srcs]
    books = [bookkeeping_tensors(s) if policy.passes_bookkeeping else set() for s in srcs]
    matched: set[str] = set()  # the drop specs some source's graph has
    per_source: list[Kept] = []  # the names and new names of each one's kept tensors
    for i, s in enumerate(srcs):
        names = [n for n in s.ckpt.keys() if n != OBJECT_GRAPH_KEY]
        gone = _cut_graph(srcs, i, names, drop_specs, winner, matched, dropped)
        per_source.append(_kept_tensors(s, names, gone, flats[i], naming, dropped))
    for spec in drop_specs:
        if spec not in matched:
            raise CheckpointError(f"no object {spec!r} in the object graph of any source")
    check_mapped(dropped, options)
    chosen = _choose_by_name(srcs, per_source, options.prefer, dropped)
    graph_bytes = _merged_graph(srcs, per_source, chosen) if object_graph else None
    follow_source_layouts(srcs, options)
    planned = _planned_tensors(srcs, chosen, policy, flats, fixed, books)
    p = finished_plan(srcs, dst, planned, dropped, graph_bytes, options, store)
    p.saved_model, p.writes_saved_models = sm, True
    p.from_saved_models = source_saved_models(sources, srcs)
    check_saved_model(p)
    # Each pattern no tensor matched, also among those left out before it was tried.
    flat_of = {s.label: flats[i] for i, s in enumerate(srcs)}
    left = [(n, flat_of[label].get(n)) for label, n, _ in dropped]
    p.unmatched = naming.unmatched(left) + policy.unmatched(left)
    p.check_matched(n for f in flats for n in f.values())
    return p


def _cut_graph(
    srcs: list[Source],
    i: int,
    names: list[str],
    drop_specs: list[str],
    winner: dict[str, int],
    matched: set[str],
    dropped: list[tuple[str, str, str]],
) -> set[str]:
    """Cut from source ``i``'s object graph the objects ``drop_specs`` name (adding those
    it has to ``matched``) and the root objects another source keeps (``winner``); the
    tensors gone with them, each listed in ``dropped``. None for a TF1 source."""
    s = srcs[i]
    if s.graph is None:
        return set()
    present = set(names)
    gone: set[str] = set()

    def tensors_of(keys: Iterable[str]) -> set[str]:
        return {t for k in keys for t in attribute_tensors(k, present)}

    for spec in drop_specs:
        try:
            removed = tensors_of(s.graph.drop_objects([spec]))
        except CheckpointError:
            continue  # this source lacks the object; another may have it
        matched.add(spec)
        gone |= removed
        dropped += [
            (s.label, n, f"object {spec!r} dropped") for n in sorted(removed) if n in s.ckpt
        ]
    for child in s.graph.root_children():
        owner = winner.get(child, i)
        if owner != i:
            removed = tensors_of(s.graph.drop_root_child(child))
            gone |= removed
            dropped += [
                (s.label, n, f"root object {child!r} taken from {srcs[owner].label}")
                for n in sorted(removed)
                if n in s.ckpt
            ]
    missing = s.graph.missing_keys(present)
    if missing:
        raise CheckpointError(
            f"the object graph names tensors the checkpoint lacks: {', '.join(missing[:5])}",
            path=s.ckpt.prefix,
        )
    return gone


class Kept(NamedTuple):
    """A source's tensors kept, in its order, as columns: their names and new names (one
    list where they keep them)."""

    names: list[str]
    new_names: list[str]


class Chosen(NamedTuple):
    """The output tensors as columns: the source of each, its name there, its new name."""

    sources: list[int]
    names: list[str]
    new_names: list[str]


def _kept_tensors(
    s: Source,
    names: list[str],
    gone: set[str],
    flat: dict[str, str],
    naming: NameRules,
    dropped: list[tuple[str, str, str]],
) -> Kept:
    """The tensors of ``s`` the patterns keep, with their new names; in a TF2 source
    only those of attributes kept whole, its graph rekeyed to their new names."""
    if naming.keep_all and not gone:
        return Kept(names, names)  # every one as it is: no pair per tensor
    olds, news = [], []
    for n in names:
        if n in gone:
            continue
        why, new = naming.decide(n, flat.get(n))
        if why is not None:
            dropped.append((s.label, n, why))
            continue
        olds.append(n)
        news.append(new)
    if s.graph is None:
        return Kept(olds, news)
    # An attribute stored as several tensors is kept whole or not at all,
    # and its tensors keep one key plus their suffixes.
    new_of = dict(zip(olds, news))
    dead, rekey = set(), {}
    for key, tensors in s.graph.attribute_tensors(set(names)).items():
        if all(t in new_of for t in tensors):
            new_key = renamed_key(key, tensors, new_of, path=s.label)
            if new_key != key:
                rekey[key] = new_key
            continue
        dead.add(key)
        for t in tensors:
            if new_of.pop(t, None) is not None:
                dropped.append((s.label, t, f"its attribute {key!r} is not kept whole"))
    s.graph.drop_keys(dead)
    s.graph.rekey(rekey)
    kept = [(n, new) for n, new in zip(olds, news) if n in new_of]
    return Kept([n for n, _ in kept], [new for _, new in kept])


def _choose_by_name(
    srcs: list[Source],
    per_source: list[Kept],
    prefer: str | None,
    dropped: list[tuple[str, str, str]],
) -> Chosen:
    """Each output name and the source and name it is written from.

    One name, one tensor: clashes inside a source are errors; across sources they are
    errors unless ``prefer`` says which source wins (the loser listed in ``dropped``).
    """
    if len(per_source) == 1:  # one source: names clash only if renamed alike
        olds, news = per_source[0]
        if news is olds or (len(set(news)) == len(news) and OBJECT_GRAPH_KEY not in news):
            return Chosen([0] * len(olds), olds, news)
    chosen: dict[str, tuple[int, str]] = {}
    for i, kept in enumerate(per_source):
        local: dict[str, str] = {}
        for old, new in zip(*kept):
            if new == OBJECT_GRAPH_KEY:
                raise CheckpointError(f"{old!r} cannot be renamed to {OBJECT_GRAPH_KEY}")
            if new in local:
                raise CheckpointError(
                    f"{local[new]!r} and {old!r} would both be named {new!r}", path=srcs[i].label
                )
            local[new] = old
            if new in chosen:
                j, other = chosen[new]
                if prefer is None:
                    raise CheckpointError(
                        f"{new!r} comes from both {srcs[j].label} ({other!r}) and "
                        f"{srcs[i].label} ({old!r}); choose with "
                        f"{option(PREFER_ARGS, '--prefer first|last')}"
                    )
                if prefer == "first":
                    dropped.append((srcs[i].label, old, f"{new!r} taken from {srcs[j].label}"))
                    continue
                dropped.append((srcs[j].label, other, f"{new!r} taken from {srcs[i].label}"))
            chosen[new] = (i, old)
    return Chosen(
        [i for i, _ in chosen.values()], [old for _, old in chosen.values()], list(chosen)
    )


def _merged_graph(srcs: list[Source], per_source: list[Kept], chosen: Chosen) -> bytes | None:
    """The output's object graph: the sources' graphs, less the attributes of tensors
    another source won, merged; None without TF2 sources."""
    graphs = [(i, s.graph) for i, s in enumerate(srcs) if s.graph is not None]
    if not graphs:
        return None
    # With one source, every tensor is its own.
    owner = dict(zip(chosen.new_names, chosen.sources)) if len(srcs) > 1 else {}
    for i, g in graphs:
        mine = set(per_source[i].new_names)
        lost = {new for new in mine if owner.get(new, i) != i}
        if lost:
            g.drop_keys({k for k, ts in g.attribute_tensors(mine).items() if lost.intersection(ts)})
    merged = (
        graphs[0][1]
        if len(graphs) == 1
        else ObjectGraph.merge([g for _, g in graphs], [srcs[i].label for i, _ in graphs])
    )
    return merged.serialize()


def follow_source_layouts(srcs: list[Source], options: Options) -> None:
    """Without ``max_shard_bytes`` the output keeps the sources' shards, laid over one
    another: output shard ``i`` holds shard ``i`` of every source (see
    :attr:`Source.shard_base`), so a merge of small single-shard checkpoints writes one
    data file, not one per source, and one source keeps its layout exactly."""
    if options.max_shard_bytes is None:
        for s in srcs:
            s.shard_base = 0


def _planned_tensors(
    srcs: list[Source],
    chosen: Chosen,
    policy: DtypePolicy,
    flats: list[dict[str, str]],
    fixed: list[set[str]],
    books: list[set[str]],
) -> PlannedTensors:
    """The chosen tensors with their infos, and the dtype ``policy`` writes each in
    (``fixed``: per source, the tensors ``cast`` passes by; ``books``: its training
    bookkeeping), as columns."""
    out = PlannedTensors()
    out.source, out.name, out.new_name = chosen
    if out.new_name is out.name:  # columns of their own: a row's new name may change
        out.new_name = list(out.name)
    out.averaged = bytearray(len(out.name))
    if len(srcs) == 1:
        out.infos = srcs[0].ckpt.table(out.name)
    else:
        wanted: list[list[str]] = [[] for _ in srcs]  # per source, its tensors' old names
        for i, old in zip(chosen.sources, chosen.names):
            wanted[i].append(old)
        tables = [srcs[i].ckpt.table(olds) for i, olds in enumerate(wanted)]
        # the sources' rows, interleaved as chosen
        at = [0] * len(srcs)
        rows = []
        for i in out.source:
            rows.append((i, at[i]))
            at[i] += 1
        columns = ([getattr(t, f.name) for t in tables] for f in fields(TensorTable))
        out.infos = TensorTable.of_columns([values[i][r] for i, r in rows] for values in columns)
    infos = out.infos
    # Without patterns, a dtype decides alone: once per dtype, not once per tensor.
    patterned = bool(policy.keep or policy.rules)
    by_dtype: dict[str, tuple[_dt.DType, str | None] | None] = {
        dtype: None if patterned else policy.decide("", _dt.lookup(dtype))
        for dtype in set(infos.dtypes)
    }
    new_dtypes, dtype_by = [], []
    for i, old, dtype in zip(out.source, out.name, infos.dtypes):
        decided = by_dtype[dtype]
        if decided is None or old in fixed[i] or old in books[i]:
            decided = policy.decide(
                old,
                _dt.lookup(dtype),
                flats[i].get(old),
                variable=old not in fixed[i],
                bookkeeping=old in books[i],
            )
        new_dtypes.append(decided[0])
        dtype_by.append(decided[1])
    out.new_dtype = [d.name for d in new_dtypes]
    out.dtype_by = dtype_by
    out.bytes_out = bytes_out_column(infos, new_dtypes)
    return out


def bytes_out_column(infos: TensorTable, new_dtypes: Sequence[_dt.DType]) -> array:
    """What each tensor of ``infos`` takes written in its ``new_dtypes`` (see
    :func:`cast_bytes`), as a column."""
    return array(  # from a generator: no list of an int object per tensor
        "q",
        (
            nbytes if new.name == dtype else (n if stored is None else stored) * new.fixed_itemsize
            for new, dtype, nbytes, n, stored in zip(
                new_dtypes, infos.dtypes, infos.nbytes, infos.elements, infos.stored_elements
            )
        ),
    )


def shape_transforms(
    srcs: list[Source], planned: Sequence[PlannedTensor], rules: ShapeRules
) -> None:
    """Decide each planned tensor's value transforms (its ``perm`` and ``shape``) by
    ``rules``, on its new name; an error for a tensor they cannot apply to."""
    if not rules:
        return
    for pt in planned:
        label = srcs[pt.source].label
        pt.perm, pt.shape = rules.decide(pt.new_name, pt.info.shape, path=label)
        if (pt.perm or pt.shape is not None) and _dt.lookup(pt.info.dtype).numpy is None:
            raise CheckpointError(
                f"value transforms take numeric and bool tensors, not {pt.info.dtype}",
                path=label,
                tensor=pt.name,
            )


def cast_bytes(info: TensorInfo, new_dtype: _dt.DType) -> int:
    """What the tensor ``info`` takes cast to ``new_dtype`` (the elements it stores)."""
    stored = info.size if info.stored_elements is None else info.stored_elements
    return stored * new_dtype.fixed_itemsize


def finished_plan(
    srcs: list[Source],
    dst: str,
    planned: Sequence[PlannedTensor],
    dropped: list,
    graph_bytes: bytes | None,
    options: Options,
    store: Storage,
) -> Plan:
    """The plan of ``planned`` tensors (written to ``dst`` on ``store``), once every shard
    file they need is known to exist, with its value transforms (``options``: split and
    concat, then permute, reshape, squeeze) decided and its tensors in reading order."""
    tensors = PlannedTensors.of(assemble(srcs, planned, options, graph_bytes is not None))
    shape_transforms(srcs, tensors, ShapeRules.of(options))
    # Every shard the output needs must be there before anything is written.
    needed: dict[int, set[int]] = {i: set() for i in set(tensors.source)}
    infos = tensors.infos
    # The (source, shard) pairs of whole rows, found as columns (no tuple per tensor).
    whole = np.fromiter(map(operator.not_, infos.slices), dtype=bool, count=len(infos))
    whole[list(tensors.extras)] = False
    shards = np.maximum(infos.shards.values(), 0)  # None (the least int64) as shard 0
    pairs = np.unique(
        np.stack([np.asarray(tensors.source, dtype=np.int64), shards])[:, whole], axis=1
    )
    for source, shard in pairs.T.tolist():
        needed[source].add(shard)
    for i, pt in enumerate(tensors):
        if not infos.slices[i] and i not in tensors.extras:
            continue
        ckpt = srcs[pt.source].ckpt
        for name in [pt.name] if pt.parts is None else {m.name for m in pt.parts}:
            info = pt.info if pt.parts is None else ckpt.info(name)
            if info.slices:
                needed[pt.source].update(x.shard or 0 for x in ckpt.slice_info(name))
            else:
                needed[pt.source].add(info.shard or 0)
    for i, shard_ids in needed.items():
        srcs[i].ckpt.check_shard_files(shard_ids)
    # Read each source in file order: by source, shard, offset.
    tensors = tensors.in_file_order()
    return Plan(srcs, dst, tensors, dropped, graph_bytes, options, store)
