"""Averaging checkpoints of one training run: the element-wise (weighted) mean.

Every floating-point (and complex) tensor is the weighted mean of its values in
all sources, ``(w_1 x_1 + ... + w_n x_n) / (w_1 + ... + w_n)`` summed in that
order in float64 (complex128), chunk by chunk across the sources, then rounded
to the tensor's own dtype (or the cast target) as ``tf.cast`` rounds
(:mod:`tfckpt.rewrite.mean`, in the engine's pipeline). Every other tensor (integers such as
``global_step``, bool, strings, resource/variant) and the keys and values of
lookup tables (:func:`~tfckpt.rewrite.planner.fixed_dtype_tensors`: a table's values are
in its keys' order, which differs between saves) is copied from the newest
source: the last one given. Memory is set by the chunk budget, whatever the
tensor sizes and however many sources.

TF2 sources keep the newest source's object graph, cut by ``drop_objects`` in the
same pass. ``use_ema`` writes each exponential moving average in place of its
variable and drops the averages: in TF1 names, ``v/ExponentialMovingAverage``
(what ``tf.train.ExponentialMovingAverage`` names the shadow of ``v``); in a TF2
object graph, the list ``_model_variables_moving_average`` of a Keras optimizer
(``use_ema=True``), whose N-th element shadows the N-th of its
``_trainable_variables``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence

from tfckpt.errors import CheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import TensorInfo, TensorTable
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, attribute_tensors
from tfckpt.format.slices import TF_SLICE_COPYABLE
from tfckpt.io import paths
from tfckpt.io.storage import Storage, StorageOptions, normalize, storage_for
from tfckpt.rewrite.engine import Summary, execute
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.planner import (
    bookkeeping_tensors,
    bytes_out_column,
    destination_storage,
    fixed_dtype_tensors,
    open_sources,
    resolve_destination,
    source_flat_names,
)
from tfckpt.rewrite.plans import Plan, PlannedTensors, Source
from tfckpt.rewrite.rules import DtypePolicy
from tfckpt.rewrite.savedmodel import source_saved_models

EMA_SUFFIX = "/ExponentialMovingAverage"  # TF1: the shadow of variable v is v + EMA_SUFFIX
KERAS_EMA_LIST = "_model_variables_moving_average"  # TF2: a Keras optimizer's shadows
KERAS_VARIABLE_LIST = "_trainable_variables"  # ... and the variables they shadow, in order

# Options of a transform that averaging does not take (it keeps every name and source).
_UNSUPPORTED = (
    "include",
    "exclude",
    "rename",
    "rename_exact",
    "prefer",
    "executor",
    "permute",
    "reshape",
    "squeeze",
    "split",
    "concat",
)


def last_checkpoints(
    directory, n: int, *, storage_options: StorageOptions | None = None
) -> list[str]:
    """The ``n`` newest checkpoints the state file of ``directory`` lists, oldest first.

    In the order of its ``all_model_checkpoint_paths`` (TensorFlow's ``Saver`` and
    ``CheckpointManager`` list them oldest first), ending with the latest; only
    checkpoints that exist count (a bundle's ``.index``, a V1 file). Paths that are
    gone (a moved directory, another machine's) are found beside the state file, as
    :func:`tfckpt.latest_checkpoint` finds them.

    >>> from tfckpt.rewrite.average import last_checkpoints
    >>> last_checkpoints("train", 3)
    ['train/model.ckpt-800', 'train/model.ckpt-900', 'train/model.ckpt-1000']
    """
    directory = str(directory)
    return newest_checkpoints(storage_for(directory, storage_options), directory, n)


def newest_checkpoints(store: Storage, directory: str, n: int) -> list[str]:
    """:func:`last_checkpoints` of ``directory`` on ``store``."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise CheckpointError(
            f"the number of checkpoints to average must be a whole number > 0, not {n!r}"
        )
    state_path = store.join(directory, paths.STATE_FILENAME)
    # Paths from another machine or a moved directory are found beside the state file.
    listed = paths.state_file_checkpoints(store, directory)
    if listed is None:
        raise CheckpointError(
            "no checkpoint state file to take the newest checkpoints from", path=state_path
        )
    prefixes, latest = listed
    found = [p for p in prefixes if p != latest] + [latest]
    found = [p for p in found if paths.checkpoint_exists(store, p)]
    if len(found) < n:
        raise CheckpointError(
            f"asked for the {n} newest checkpoints, but the state file lists "
            f"{len(found)} that exist",
            path=state_path,
        )
    return found[-n:]


def _weights(weights: Sequence[float] | None, count: int) -> list[float]:
    if weights is None:
        return [1.0] * count
    weights = check_weights(weights)
    if len(weights) != count:
        raise CheckpointError(f"{len(weights)} weights for {count} source checkpoints")
    return weights


def check_weights(weights: Iterable, what: str = "weights") -> list[float]:
    """``weights`` as floats, refused unless numbers, finite, with a finite, non-zero sum
    (``what`` names them in the error, e.g. ``--weights``).

    >>> check_weights(["1", 3])
    [1.0, 3.0]
    """
    out = []
    for w in weights:
        try:
            out.append(float(w))
        except (TypeError, ValueError):
            raise CheckpointError(f"{what} must be numbers, not {w!r}") from None
    try:
        total = math.fsum(out) if all(math.isfinite(w) for w in out) else math.nan
    except OverflowError:  # finite weights whose sum is not
        total = math.inf
    if not math.isfinite(total) or total == 0:
        raise CheckpointError(f"{what} must be finite numbers with a finite, non-zero sum")
    return out


def _check_agree(srcs: list[Source], tables: set[str]) -> set[str]:
    """Every source has the newest's tensors, of the same dtypes and shapes (the tensors
    of lookup tables and other saveables, copied from the newest, of the same dtypes:
    a table grows as it learns keys); the tensors partitioned in an older source.

    The sources' tables are compared as columns; only sources that differ are looked
    at name by name, for the error.
    """
    newest = srcs[-1]
    names = [n for n in newest.ckpt.keys() if n != OBJECT_GRAPH_KEY]
    mine = newest.ckpt.table(names)
    partitioned: set[str] = set()
    for s in srcs[:-1]:
        theirs = [n for n in s.ckpt.keys() if n != OBJECT_GRAPH_KEY]
        table = s.ckpt.table(theirs)
        agree = theirs == names and table.dtypes == mine.dtypes
        if not agree or any(
            a != b and n not in tables for n, a, b in zip(names, table.shapes, mine.shapes)
        ):
            _differences(s, newest, table, theirs, tables)
        partitioned.update(n for n, sl in zip(theirs, table.slices) if sl)
    return partitioned


def _differences(
    s: Source, newest: Source, table: TensorTable, theirs: list[str], tables: set[str]
) -> None:
    """The error for the first tensor, in name order, that ``s`` and the newest source
    do not agree on (none when only the shapes of ``tables`` differ)."""
    mine = {n: newest.ckpt.info(n) for n in newest.ckpt.keys() if n != OBJECT_GRAPH_KEY}
    infos = {n: table.info(k) for k, n in enumerate(theirs)}
    for name in sorted(set(mine) | set(infos)):
        if name not in mine or name not in infos:
            has, lacks = (s, newest) if name not in mine else (newest, s)
            raise CheckpointError(
                f"the sources differ: {has.label} has tensor {name!r}, {lacks.label} not",
                path=lacks.ckpt.prefix,
                tensor=name,
            )
        a, b = infos[name], mine[name]
        if a.dtype != b.dtype or (a.shape != b.shape and name not in tables):
            raise CheckpointError(
                f"the sources differ: {a.dtype} {list(a.shape)} in {s.label}, "
                f"{b.dtype} {list(b.shape)} in {newest.label}",
                path=s.ckpt.prefix,
                tensor=name,
            )


def _variable_key(graph: ObjectGraph, node_id: int) -> str | None:
    for a in graph.nodes[node_id].attributes:
        if a.name == "VARIABLE_VALUE":
            return a.checkpoint_key
    return None


def _keras_ema_pairs(graph: ObjectGraph) -> tuple[dict[str, str], set[int]]:
    """``{variable key: shadow key}`` of Keras optimizers' EMAs, and the shadows' nodes."""
    pairs: dict[str, str] = {}
    shadows: set[int] = set()
    nodes = graph.nodes
    for node in nodes:
        lists = {c.local_name: c.node_id for c in node.children}
        if KERAS_EMA_LIST not in lists or KERAS_VARIABLE_LIST not in lists:
            continue
        variables = {c.local_name: c.node_id for c in nodes[lists[KERAS_VARIABLE_LIST]].children}
        for c in nodes[lists[KERAS_EMA_LIST]].children:
            if c.local_name not in variables:
                continue
            var_key = _variable_key(graph, variables[c.local_name])
            shadow_key = _variable_key(graph, c.node_id)
            if var_key is not None and shadow_key is not None:
                pairs[var_key] = shadow_key
                shadows.add(c.node_id)
    return pairs, shadows


def _cut_nodes(graph: ObjectGraph, ids: set[int]) -> set[str]:
    """Remove every reference to the nodes ``ids``, then what is unreachable; the keys gone."""
    for node in graph.nodes:
        kept = [c for c in node.children if c.node_id not in ids]
        if len(kept) != len(node.children):
            del node.children[:]
            node.children.extend(kept)
        slots = [
            s
            for s in node.slot_variables
            if s.slot_variable_node_id not in ids and s.original_variable_node_id not in ids
        ]
        if len(slots) != len(node.slot_variables):
            del node.slot_variables[:]
            node.slot_variables.extend(slots)
    return graph.prune()


def plan_average(
    sources,
    dst,
    options: Options | None = None,
    *,
    weights: Sequence[float] | None = None,
    use_ema: bool = False,
    last: int | None = None,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Plan:
    """Decide what :func:`average` writes, from the sources' indexes alone (paths opened
    with ``storage_options``): a :class:`~tfckpt.rewrite.plans.Plan` with ``weights``,
    whose tensors are read from the newest source (the last), each averaged or copied.

    >>> p = plan_average(["train/ckpt-9", "train/ckpt-10"], "avg/", weights=[1, 3])
    >>> tfckpt.execute(p)
    """
    options = Options.of(options, **changes)
    given = [f for f in _UNSUPPORTED if getattr(options, f)]
    if options.backend != "numpy":
        given.append("backend")
    if given:
        raise CheckpointError(f"average does not take {', '.join(given)}")
    if last is not None:
        if not isinstance(sources, (str, bytes)) and not hasattr(sources, "__fspath__"):
            raise CheckpointError("last= takes one directory as the source")
        directory = str(sources)
        # The checkpoints the state file names are on the storage of its directory.
        store = storage_for(normalize(directory), storage_options)
        sources = newest_checkpoints(store, directory, last)
        srcs = open_sources(sources, None, store=store)
    else:
        srcs = open_sources(sources, storage_options)
    try:
        p = _plan(srcs, dst, options, weights, use_ema, storage_options)
        p.from_saved_models = source_saved_models(sources, srcs)
        return p
    except BaseException:
        for s in srcs:
            s.ckpt.close()
        raise


def _plan(
    srcs: list[Source],
    dst,
    options: Options,
    weights,
    use_ema: bool,
    storage_options: StorageOptions | None,
) -> Plan:
    w = _weights(weights, len(srcs))
    policy = DtypePolicy.of(options)
    newest = srcs[-1]
    # Lookup tables and other saveables: values in an order of their own, not averaged.
    fixed = fixed_dtype_tensors(newest)
    books = bookkeeping_tensors(newest) if policy.passes_bookkeeping else set()
    partitioned_before = _check_agree(srcs, fixed)
    # The destination's name inside a directory is the newest source's.
    store = destination_storage(dst, srcs, storage_options)
    dst = resolve_destination(store, dst, [newest] + srcs[:-1], options.overwrite)
    names = [n for n in newest.ckpt.keys() if n != OBJECT_GRAPH_KEY]
    # Before the graph is cut: dtype rules match flat names too.
    flat = source_flat_names(newest) if policy.labels else {}
    read_from = {n: n for n in names}
    gone = _Gone(set(names))
    if use_ema:
        read_from.update(_ema_pairs(newest, names, gone))
    graph_bytes = _output_graph(newest, names, options.drop_objects, gone)
    kept = [new for new in names if new not in gone.why]
    tensors = _planned(srcs, kept, read_from, policy, flat, fixed, books, partitioned_before)
    dropped = [(newest.label, n, gone.why[n]) for n in names if n in gone.why]
    # Read each source in file order.
    p = Plan(srcs, dst, tensors.in_file_order(), dropped, graph_bytes, options, store, weights=w)
    p.unmatched = policy.unmatched((n, flat.get(n)) for _, n, _ in dropped)
    p.check_matched(flat.values())
    return p


def _planned(
    srcs: list[Source],
    kept: list[str],
    read_from: dict[str, str],
    policy: DtypePolicy,
    flat: dict[str, str],
    fixed: set[str],
    books: set[str],
    partitioned_before: set[str],
) -> PlannedTensors:
    """The output tensors ``kept`` (each read from ``read_from``'s name), as columns:
    copies come from the newest source, variables of floating-point dtypes are the
    means of every source's (``partitioned_before``: partitioned in an older one)."""
    newest = srcs[-1]
    out = PlannedTensors()
    out.name = [read_from[new] for new in kept]
    out.new_name = kept
    out.source = [len(srcs) - 1] * len(kept)
    out.infos = infos = newest.ckpt.table(out.name)  # decoded in bulk
    out.averaged = bytearray(len(kept))
    dtypes = {d: _dt.lookup(d) for d in set(infos.dtypes)}
    # Without patterns a dtype decides alone for a variable: once per dtype.
    patterned = bool(policy.keep or policy.rules)
    by_dtype: dict[str, tuple[_dt.DType, str | None]] = {}
    new_dtypes: list[_dt.DType] = []
    for k, (new, name) in enumerate(zip(kept, infos.dtypes)):
        dtype, variable = dtypes[name], new not in fixed
        alone = variable and not patterned and new not in books  # its dtype decides
        decided = by_dtype.get(name) if alone else None
        if decided is None:
            # By the variable's name: with use_ema its value is read from its shadow's.
            decided = policy.decide(
                new, dtype, flat.get(new), variable=variable, bookkeeping=new in books
            )
            if alone:
                by_dtype[name] = decided
        new_dtypes.append(decided[0])
        out.dtype_by.append(decided[1])
        out.averaged[k] = variable and dtype.kind in ("float", "complex")
    out.new_dtype = [d.name for d in new_dtypes]
    out.bytes_out = bytes_out_column(infos, new_dtypes)
    for k, slices in enumerate(infos.slices):
        averaged = bool(out.averaged[k])
        if slices:  # decided for a partitioned tensor; a whole one is never written sliced
            info = infos.info(k)
            sliced = _written_sliced(srcs, out.name[k], info, averaged, new_dtypes[k])
            out.extras[k] = {"sliced": sliced}
        elif averaged and out.name[k] in partitioned_before:
            out.extras[k] = {"sliced": False}  # whole here, so read whole everywhere
    return out


class _Gone:
    """The newest source's tensors left out of an average, each with the first reason."""

    def __init__(self, present: set[str]):
        self.present = present
        self.why: dict[str, str] = {}

    def drop_keys(self, keys: Iterable[str], reason: str) -> None:
        """Leave out the tensors of the object graph's attributes ``keys``."""
        for k in keys:
            for t in attribute_tensors(k, self.present):
                if t in self.present:
                    self.why.setdefault(t, reason)


def _ema_pairs(newest: Source, names: list[str], gone: _Gone) -> dict[str, str]:
    """``{variable: its moving average}`` of the newest source, the averages left out
    (cut from its object graph); an error without any, or with one unlike its variable."""
    present, graph = gone.present, newest.graph
    if graph is None:
        pairs = {
            n[: -len(EMA_SUFFIX)]: n
            for n in names
            if n.endswith(EMA_SUFFIX) and n[: -len(EMA_SUFFIX)] in present
        }
        for n in names:
            if n.endswith(EMA_SUFFIX):
                gone.why[n] = (
                    "moving average written as its variable"
                    if n[: -len(EMA_SUFFIX)] in present
                    else "moving average of no variable in the checkpoint"
                )
    else:
        pairs, shadow_nodes = _keras_ema_pairs(graph)
        gone.drop_keys(_cut_nodes(graph, shadow_nodes), "moving average written as its variable")
    if not pairs:
        raise CheckpointError(
            f"no exponential moving averages found (TF1: names ending in {EMA_SUFFIX}; "
            f"TF2: a Keras optimizer's {KERAS_EMA_LIST})",
            path=newest.ckpt.prefix,
        )
    for var, shadow in pairs.items():
        a, b = newest.ckpt.info(var), newest.ckpt.info(shadow)
        if (a.dtype, a.shape) != (b.dtype, b.shape):
            raise CheckpointError(
                f"its moving average {shadow!r} is {b.dtype} {list(b.shape)}, "
                f"the variable {a.dtype} {list(a.shape)}",
                path=newest.ckpt.prefix,
                tensor=var,
            )
    return pairs


def _output_graph(
    newest: Source, names: list[str], drop_objects: Sequence[str], gone: _Gone
) -> bytes | None:
    """The output's object graph: the newest source's, less ``drop_objects`` (their
    tensors left out); None for TF1 sources, which ``drop_objects`` are an error for."""
    graph = newest.graph
    if drop_objects:
        if graph is None:
            raise CheckpointError(
                f"--drop-object needs a TF2 object-based checkpoint (one with {OBJECT_GRAPH_KEY})",
                path=newest.ckpt.prefix,
            )
        for spec in drop_objects:
            gone.drop_keys(graph.drop_objects([spec]), f"object {spec!r} dropped")
    if graph is None:
        return None
    missing = graph.missing_keys({n for n in names if n not in gone.why})
    if missing:
        raise CheckpointError(
            f"the object graph names tensors the checkpoint lacks: {', '.join(missing[:5])}",
            path=newest.ckpt.prefix,
        )
    return graph.serialize()


def _written_sliced(
    srcs: list[Source], name: str, info: TensorInfo, averaged: bool, new_dtype: _dt.DType
) -> bool:
    """Whether the tensor ``name`` is written slice by slice, as the sources store it;
    an error for a pre-sliced tensor the sources slice differently."""
    # A copied tensor is the newest's alone: the others' slicing does not matter.
    sliced = bool(info.slices) and (not averaged or _same_slices(srcs, name))
    if info.slices and not sliced and info.partial:
        raise CheckpointError(
            "the sources store different slices of this pre-sliced tensor",
            path=srcs[-1].ckpt.prefix,
            tensor=name,
        )
    if sliced and srcs[-1].graph is not None and new_dtype.name not in TF_SLICE_COPYABLE:
        sliced = info.partial  # TF2 restores it whole: see engine._keep_sliced
    return sliced


def _same_slices(srcs: list[Source], name: str) -> bool:
    first = set(srcs[-1].ckpt.info(name).slices)
    return all(set(s.ckpt.info(name).slices) == first for s in srcs[:-1])


def average(
    sources,
    dst,
    options: Options | None = None,
    *,
    weights: Sequence[float] | None = None,
    use_ema: bool = False,
    last: int | None = None,
    progress: Callable[[int], None] | None = None,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Summary:
    """Write the element-wise (weighted) mean of several checkpoints of one model.

    ``sources`` are checkpoints (any form :func:`tfckpt.open` takes), oldest first:
    the last is the newest, whose integer, bool and string tensors (and TF2 object
    graph) are kept. With ``last=N``, ``sources`` is one directory and its state
    file's N newest checkpoints are averaged. ``weights`` gives one weight per
    source (any finite numbers with a non-zero sum; equal by default).
    ``use_ema`` writes every exponential moving average in place of its
    variable. ``options`` and keyword arguments as for :func:`tfckpt.transform`:
    ``cast`` (with ``overflow``), ``drop_objects``, ``chunk_bytes``,
    ``max_shard_bytes``, ``overwrite``, ``durable``. Names, dtypes and shapes
    must agree across the sources.

    >>> tfckpt.average(["train/ckpt-8", "train/ckpt-9", "train/ckpt-10"], "avg/")
    >>> tfckpt.average("train/", "avg/model", last=5, use_ema=True, drop_objects=["optimizer"])
    """
    p = plan_average(
        sources,
        dst,
        options,
        weights=weights,
        use_ema=use_ema,
        last=last,
        storage_options=storage_options,
        **changes,
    )
    try:
        return execute(p, progress=progress)
    finally:
        p.close()


__all__ = ["average", "plan_average", "last_checkpoints"]
