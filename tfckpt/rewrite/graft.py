"""Between name-based (TF1) and object-based (TF2) checkpoints, without TensorFlow.

:func:`graft` fills a TF2 template (a checkpoint of the target model, e.g. freshly
initialised and saved) with values found by name in other checkpoints: the output
has the template's object graph, keys, dtypes and shapes. :func:`flatten` goes the
other way: a name-based checkpoint named by the TF2 variables' paths. Both build a
:class:`~tfckpt.Plan` for the one streaming engine.

Names: a TF2 tensor's *path* is its name without ``/.ATTRIBUTES/VARIABLE_VALUE``
(``model/dense/kernel``); a tensor of another attribute keeps the attribute's name
(``table/.ATTRIBUTES/table-keys`` is ``table/table-keys``). Its *flat name* is the
same built on its object's first path from the root that passes no ``optimizer``
edge (what :func:`tfckpt.export` calls it; the key's own path where the optimizer
alone reaches the object), and for a slot variable its variable's flat name, ``/``
and the slot's name (``model/dense/kernel/m``), as a TF1 optimizer names its slots.
Mostly the flat name is the path; they differ for slots, and where a key runs
through the optimizer (Keras 3: ``optimizer/_trainable_variables/0``).

(A little past 600 lines: placing a TF1 optimizer's state stays beside the matching
by name it completes.)
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from dataclasses import fields

import numpy as np

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.errors import PREFER_ARGS, CheckpointError, option
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import TensorInfo, TensorTable
from tfckpt.format.objectgraph import (
    OBJECT_GRAPH_KEY,
    ObjectGraph,
    attribute_tensors,
)
from tfckpt.format.optimizers import OptimizerState, optimizer_state
from tfckpt.format.tf2names import flat_names, tensor_path
from tfckpt.io.storage import StorageOptions
from tfckpt.rewrite.edits import Literal, Scale
from tfckpt.rewrite.engine import Summary, execute
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.planner import (
    SAVE_COUNTER,
    destination_storage,
    finished_plan,
    follow_source_layouts,
    open_sources,
    plan,
    resolve_destination,
    source_flat_names,
)
from tfckpt.rewrite.plans import Plan, PlannedTensor, PlannedTensors, Source
from tfckpt.rewrite.rules import RENAME_EXACT, NameRules, compile_patterns, compile_rules
from tfckpt.rewrite.savedmodel import source_saved_models
from tfckpt.rewrite.tf1slots import (
    ADAM_BETAS,
    BETA_POWERS,
    GLOBAL_STEP,
    MOMENTUM,
    children,
    learning_rate,
    no_tf1_slot,
    slot_suffix,
    steps_from_powers,
    tf1_names,
    tf1_slot,
)


def _as_list(sources) -> list:
    if isinstance(sources, (str, os.PathLike, Checkpoint)):
        return [sources]
    return list(sources)


def plan_graft(
    template,
    sources,
    dst,
    options: Options | None = None,
    *,
    allow_missing=False,
    adam_betas: tuple[float, float] = ADAM_BETAS,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Plan:
    """Plan :func:`graft`; reads no tensor data but TF1 optimizer step counts
    (``global_step``, ``beta1_power``, ``beta2_power``). The plan's first source is the
    template.

    >>> p = tfckpt.plan_graft("tf2/template", "tf1/model.ckpt", "out/ckpt",
    ...                       rename={"simple-fc/weights": "model/fc/kernel"})
    >>> [(t.name, t.new_name) for t in p.tensors]
    """
    options = Options.of(options, **changes)
    if options.cast is not None or options.cast_from is not None or options.dtype_rules:
        raise CheckpointError("graft takes each dtype from the template: no cast")
    if options.keep_dtype:
        raise CheckpointError("graft takes each dtype from the template: nothing to keep")
    sources = _as_list(sources)
    if not sources:
        raise CheckpointError("no source checkpoint given")
    srcs = open_sources([template, *sources], storage_options)
    store = destination_storage(dst, srcs, storage_options)
    dst = resolve_destination(store, dst, srcs, options.overwrite)
    names, candidates, graph_bytes = _template_tensors(srcs[0], options)
    target, shared = _lookup_names(names, candidates)
    naming = NameRules(  # compiled in this order: which bad option is reported first
        renames=compile_rules(options.rename),
        exact=dict(options.rename_exact or {}),
        includes=compile_patterns(options.include, "include pattern"),
        excludes=compile_patterns(options.exclude, "exclude pattern"),
    )
    dropped: list[tuple[str, str, str]] = []
    usable: list[set[str]] = [set()]  # per source, the names its patterns keep
    found = _found_in_sources(srcs, target, shared, naming, dropped, usable)
    state = optimizer_state(srcs[0].graph) if srcs[0].graph is not None else OptimizerState()
    kept = {t for t in names if tensor_path(t) == SAVE_COUNTER or allow_missing} | state.other
    steps, scales = _place_optimizer_state(
        srcs, names, found, state, usable, kept, dropped, adam_betas
    )
    planned = _grafted_tensors(srcs, names, found, options.prefer, kept, steps, dropped)
    for t in planned:
        _scaled(t, scales.get(t.new_name))
    follow_source_layouts(srcs, options)
    p = finished_plan(srcs, dst, planned, dropped, graph_bytes, options, store)
    p.from_saved_models = source_saved_models([template, *sources], srcs)
    p.unmatched = naming.unmatched((n, None) for _, n, _ in dropped)
    p.check_matched()
    return p


def _template_tensors(
    tpl: Source, options: Options
) -> tuple[list[str], dict[str, list[str]], bytes | None]:
    """The template's tensors (less the objects ``drop_objects`` cuts), the names each is
    found by (its key, then in a TF2 template its path and flat name), and the output's
    object graph: the template's, cut."""
    names = [n for n in tpl.ckpt.keys() if n != OBJECT_GRAPH_KEY]
    present = set(names)
    graph_bytes = None
    candidates: dict[str, list[str]] = {n: [n] for n in names}
    if tpl.graph is not None:
        missing = tpl.graph.missing_keys(present)
        if missing:
            raise CheckpointError(
                f"the object graph names tensors the checkpoint lacks: {', '.join(missing[:5])}",
                path=tpl.label,
            )
        if options.drop_objects:
            gone = {
                t
                for k in tpl.graph.drop_objects(options.drop_objects)
                for t in attribute_tensors(k, present)
            }
            names = [n for n in names if n not in gone]
            graph_bytes = tpl.graph.serialize()
        else:
            graph_bytes = tpl.ckpt[OBJECT_GRAPH_KEY].item()  # the template's, byte for byte
        flat = flat_names(tpl.graph, present)
        for n in names:
            candidates[n] += [tensor_path(n), flat.get(n, n)]
    elif options.drop_objects:
        raise CheckpointError(
            f"drop_objects needs a TF2 template (one with {OBJECT_GRAPH_KEY})", path=tpl.label
        )
    return names, candidates, graph_bytes


def _lookup_names(
    names: list[str], candidates: dict[str, list[str]]
) -> tuple[dict[str, str], set[str]]:
    """Which template tensor each name finds, and the names shared by several (which
    find none).

    The name each template tensor is found by: its key first, then its path, then
    its flat name; a path or flat name shared by two tensors finds neither.
    """
    target: dict[str, str] = {n: n for n in names}
    shared: set[str] = set()
    for level in (1, 2):
        claims: dict[str, list[str]] = {}
        for n in names:
            name = candidates[n][level] if len(candidates[n]) > level else None
            if name is not None and name not in target and name not in shared:
                claims.setdefault(name, []).append(n)
        for name, owners in claims.items():
            if len(set(owners)) == 1:
                target[name] = owners[0]
            else:
                shared.add(name)
    return target, shared


_Hits = dict[str, list[tuple[int, str]]]  # a source tensor's new name -> (source, name)


def _found_in_sources(
    srcs: list[Source],
    target: dict[str, str],
    shared: set[str],
    naming: NameRules,
    dropped: list[tuple[str, str, str]],
    usable: list[set[str]],
) -> dict[str, _Hits]:
    """Per template tensor, the source tensors whose new names find it; those that find
    none, or that the patterns leave out, listed in ``dropped``; per source, the names
    the patterns keep added to ``usable``."""
    found: dict[str, _Hits] = {}
    for i, s in enumerate(srcs[1:], 1):
        local: dict[str, str] = {}
        flat = source_flat_names(s) if naming.includes or naming.excludes else {}
        usable.append(set())
        for n in s.ckpt.keys():
            if n == OBJECT_GRAPH_KEY:
                continue
            why, new = naming.decide(n, flat.get(n))
            if why is not None:
                dropped.append((s.label, n, why))
                continue
            usable[i].add(n)
            if new in local:
                raise CheckpointError(
                    f"{local[new]!r} and {n!r} would both be named {new!r}", path=s.label
                )
            local[new] = n
            t = target.get(new)
            if t is None:
                why = "several template tensors have this path" if new in shared else ""
                dropped.append((s.label, n, why or f"no template tensor is named {new!r}"))
                continue
            found.setdefault(t, {}).setdefault(new, []).append((i, n))
    return found


def _place_optimizer_state(
    srcs: list[Source],
    names: list[str],
    found: dict[str, _Hits],
    state: OptimizerState,
    usable: list[set[str]],
    kept: set[str],
    dropped: list[tuple[str, str, str]],
    betas: tuple[float, float],
) -> tuple[dict[str, int], dict[str, float]]:
    """Fill ``found`` for the template's optimizer slots no name finds: each from the
    TF1 slot of the source tensor that fills its variable (``VAR/Adam``, ``VAR/Adam_1``,
    ``VAR/Momentum``); and the template's step counts, from TF1's ``global_step`` or
    Adam's powers. Returns key → step count, and key → the factor a slot's values are
    scaled by (a momentum's: -learning_rate). What they take leaves ``dropped``."""
    present = set(names)
    used: set[tuple[int, str]] = set()
    missing: list[str] = []
    scales: dict[str, float] = {}
    below: dict[int, dict[str, set[str]]] = {}  # per source: children's names by parent
    for t, (var, role) in state.slots.items():
        if t not in present or t in found or not found.get(var):
            continue
        tf1 = tf1_slot(state, t)
        pairs = [p for where in found[var].values() for p in where]
        hits: _Hits = {}
        for i, n in pairs:
            if tf1 is None:
                continue
            if i not in below:
                below[i] = children(usable[i])
            named = slot_suffix(tf1[0], tf1[1], below[i].get(n, set()))
            if named is not None:
                hits.setdefault(f"{n}/{named}", []).append((i, f"{n}/{named}"))
        if hits:
            found[t] = hits
            used.update(p for where in hits.values() for p in where)
            if tf1 is not None and tf1[0] is MOMENTUM:
                scales[t] = -learning_rate(state, t, srcs[0].ckpt)
        elif t not in kept:
            i, n = pairs[0]
            why = (
                no_tf1_slot(state, t)
                if tf1 is None
                else f"no {n + '/' + tf1[1]!r} in {srcs[i].label} (nor one TF1 "
                f"{tf1[0].name} optimizer's slots under another name)"
            )
            missing.append(f"{t!r} ({role.strip('_')} of what {n!r} fills: {why})")
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(
            f"no source has the template's optimizer slot {'; '.join(missing[:5])}{more} "
            "(rename the TF1 variable to the template's, cut the optimizer with "
            f"{option('drop_objects', '--drop-object')}, or keep the template's slots with "
            f"{option('allow_missing=True', '--allow-missing')})",
            path=srcs[0].label,
        )
    steps: dict[str, int] = {}
    for t in state.steps:
        if t in present and t not in found:
            count = _tf1_step(srcs, usable, betas, used)
            if count is not None:
                steps[t] = count
    dropped[:] = [d for d in dropped if (d[0], d[1]) not in {(srcs[i].label, n) for i, n in used}]
    return steps, scales


def _tf1_step(
    srcs: list[Source], usable: list[set[str]], betas, used: set[tuple[int, str]]
) -> int | None:
    """The step count of the first source with ``global_step`` or Adam's powers (both
    where both are: they must agree); None where none has either."""
    step = powers = None
    for i, s in enumerate(srcs[1:], 1):
        if step is None and GLOBAL_STEP in usable[i]:
            step = (i, int(s.ckpt[GLOBAL_STEP]))
        if powers is None and all(p in usable[i] for p in BETA_POWERS):
            values = [s.ckpt[p] for p in BETA_POWERS]
            dtype = values[0].dtype.name
            powers = (i, steps_from_powers(float(values[0]), float(values[1]), betas, dtype))
    if step is not None:
        used.add((step[0], GLOBAL_STEP))
    if powers is not None:
        used.update((powers[0], p) for p in BETA_POWERS)
    if powers is None:
        return None if step is None else step[1]
    i, counts = powers
    where = f"{BETA_POWERS[0]} and {BETA_POWERS[1]} of {srcs[i].label}"
    if not counts:
        raise CheckpointError(
            f"{where} are no step's powers of Adam's betas {tuple(betas)} (give the "
            "TF1 optimizer's betas with adam_betas, --adam-betas)"
        )
    if step is not None:
        n = step[1]
        if n in counts or (counts[-1] == -1 and n >= counts[-2]):
            return n
        raise CheckpointError(
            f"{GLOBAL_STEP} of {srcs[step[0]].label} is {n}, but {where} are Adam's "
            f"after {counts[0]} steps (exclude one of them to choose)"
        )
    if counts[-1] == -1:
        raise CheckpointError(
            f"{where} stopped changing after {counts[0]} steps: the step count is "
            f"unknown without {GLOBAL_STEP}"
        )
    return counts[0]


def _grafted_tensors(
    srcs: list[Source],
    names: list[str],
    found: dict[str, _Hits],
    prefer: str | None,
    kept: set[str],
    steps: dict[str, int],
    dropped: list[tuple[str, str, str]],
) -> PlannedTensors:
    """Each template tensor, from the source tensor that fills it, or as ``steps``
    counts (an optimizer's step); the template's own value for those of ``kept`` none
    fills."""
    tpl = srcs[0]
    unmatched: list[str] = []
    wants = tpl.ckpt.table(names)  # decoded in bulk, not kept per tensor
    chosen = {}  # template name -> (source, name) of the tensor that fills it
    for t in names:
        hits = found.get(t)
        if hits and t not in steps:
            chosen[t] = _one_hit(srcs, t, hits, prefer, dropped)
    # Each source's tensors that fill the template, decoded in bulk too.
    wanted: list[list[str]] = [[] for _ in srcs]
    for i, n in chosen.values():
        wanted[i].append(n)
    tables = [srcs[i].ckpt.table(ns) if ns else None for i, ns in enumerate(wanted)]
    at = [0] * len(srcs)
    # The planned rows as columns: each one's table row and fields, the few rare
    # fields apart (a step count's value; restored whole, a partitioned source's).
    rows: list[tuple[TensorTable, int]] = []
    columns: tuple[list, list, list, list, list] = ([], [], [], [], [])
    extras: dict[int, dict] = {}

    def add(table: TensorTable, row: int, source: int, name: str, t: str, dt: str, out: int):
        rows.append((table, row))
        for column, value in zip(columns, (source, name, t, dt, out)):
            column.append(value)

    for k, t in enumerate(names):
        if t in steps:
            want = wants.info(k)
            value = np.array(steps[t], dtype=_dt.lookup(want.dtype).numpy).reshape(want.shape)
            extras[len(rows)] = {"edit": Literal(value.tobytes())}
            add(wants, k, 0, t, t, want.dtype, want.nbytes)
            continue
        if t not in chosen:
            if t in kept:
                add(wants, k, 0, t, t, wants.dtypes[k], wants.nbytes[k])
            else:
                unmatched.append(t)
            continue
        i, n = chosen[t]
        table = tables[i]
        assert table is not None
        row = at[i]
        at[i] += 1
        shape, want_shape = table.shapes[row], wants.shapes[k]
        if tuple(shape) != tuple(want_shape):
            raise CheckpointError(
                f"shape mismatch: the template's {t!r} is {list(want_shape)}, "
                f"{n!r} of {srcs[i].label} is {list(shape)}"
            )
        src_dt, dt = _dt.lookup(table.dtypes[row]), _dt.lookup(wants.dtypes[k])
        if src_dt is not dt and not (src_dt.is_floating and dt.is_floating):
            raise CheckpointError(
                f"dtype mismatch: the template's {t!r} is {dt.name}, {n!r} of "
                f"{srcs[i].label} is {src_dt.name}; only floating-point values are cast"
            )
        if src_dt is dt:
            out_bytes = table.nbytes[row]
        else:
            stored = table.stored_elements[row]
            out_bytes = (table.elements[row] if stored is None else stored) * dt.fixed_itemsize
        if table.slices[row] and tpl.graph is not None:
            extras[len(rows)] = {"restored_whole": True}  # as TF2 restores it
        add(table, row, i, n, t, dt.name, out_bytes)
    if unmatched:
        more = f" and {len(unmatched) - 5} more" if len(unmatched) > 5 else ""
        raise CheckpointError(
            f"no source has the template's {', '.join(repr(t) for t in unmatched[:5])}{more} "
            "(match names with rename rules, or keep the template's values with "
            f"{option('allow_missing=True', '--allow-missing')})",
            path=tpl.label,
        )
    planned = PlannedTensors()
    planned.source, planned.name, planned.new_name, planned.new_dtype, out = columns
    planned.bytes_out = array("q", out)
    planned.dtype_by = [None] * len(rows)
    planned.averaged = bytearray(len(rows))
    planned.infos = TensorTable.of_columns(
        [getattr(table, f.name)[row] for table, row in rows] for f in fields(TensorTable)
    )
    planned.extras = extras
    return planned


def _one_hit(
    srcs: list[Source],
    t: str,
    hits: _Hits,
    prefer: str | None,
    dropped: list[tuple[str, str, str]],
) -> tuple[int, str]:
    """The ``(source, name)`` that fills the template's ``t`` of its ``hits``; the others
    listed in ``dropped``. _Hits by two names are an error, as is one name in several
    sources unless ``prefer`` says which wins."""
    if tensor_path(t) == SAVE_COUNTER:
        # Bookkeeping, not a value to choose: the first source's, as merge keeps it.
        every = sorted((i, n, name) for name, where in hits.items() for i, n in where)
        i, n, name = every[0]
        dropped += [
            (srcs[j].label, m, f"{t!r} taken from {srcs[i].label}") for j, m, _ in every[1:]
        ]
        hits = {name: [(i, n)]}
    if len(hits) > 1:
        listed = " and ".join(
            f"{srcs[i].label} ({n!r})" for where in hits.values() for i, n in where[:1]
        )
        raise CheckpointError(f"the template's {t!r} is found in both {listed}")
    ((name, where),) = hits.items()
    if len(where) > 1:
        if prefer is None:
            raise CheckpointError(
                f"{name!r} comes from both {srcs[where[0][0]].label} and "
                f"{srcs[where[1][0]].label}; choose with "
                f"{option(PREFER_ARGS, '--prefer first|last')}"
            )
        keep = where[0] if prefer == "first" else where[-1]
        dropped += [
            (srcs[i].label, n, f"{name!r} taken from {srcs[keep[0]].label}")
            for i, n in where
            if (i, n) != keep
        ]
        where = [keep]
    ((i, n),) = where
    return i, n


def graft(
    template,
    sources,
    dst,
    options: Options | None = None,
    *,
    allow_missing: bool = False,
    adam_betas: tuple[float, float] = ADAM_BETAS,
    progress: Callable[[int], None] | None = None,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Summary:
    """Write the TF2 ``template`` with its values taken by name from ``sources``.

    The output has the template's object graph, keys, dtypes and shapes. Each
    template tensor takes the value of the source tensor whose name, after the
    ``rename`` rules (as :func:`tfckpt.rename`; ``rename_exact`` first), equals
    the template tensor's key, path or flat name (see :mod:`tfckpt.graft`). A
    TF2 source is known by its keys. Shapes must be equal; floating-point values
    are cast to the template's dtype (``overflow`` as for :func:`tfckpt.convert`),
    other dtypes must be equal. A template tensor without a source is an error
    naming it, except ``save_counter``; with ``allow_missing`` the template's
    value stays. A name in several sources is an error unless ``prefer``
    (``'first'``/``'last'``) says which wins; ``save_counter`` in several is the first
    source's. ``drop_objects`` cuts objects (e.g. ``optimizer``) from the
    template first; ``include``/``exclude`` choose source tensors (a TF2
    source's by key or flat name). Source tensors no template tensor takes are listed
    in the plan's ``dropped``.

    A template's Adam moments (tf.keras 2 slot variables ``m``/``v``, tf.keras 2 and
    Keras 3 ``_momentums``/``_velocities``; see :mod:`tfckpt.format.optimizers`) no
    name finds come from the TF1 slots ``VAR/Adam`` and ``VAR/Adam_1`` of the source
    tensor ``VAR`` that fills their variable, a momentum SGD's from ``VAR/Momentum``
    times -learning_rate, an Adagrad's from ``VAR/Adagrad``, an RMSprop's from
    ``VAR/RMSProp`` and ``VAR/RMSProp_1``, an Ftrl's from ``VAR/Ftrl`` and
    ``VAR/Ftrl_1``; its step count from ``global_step`` or, without one, from
    ``beta1_power`` and ``beta2_power`` read with ``adam_betas`` (see
    :mod:`tfckpt.rewrite.tf1slots`). Its other state (learning rate) keeps the
    template's values.

    >>> tfckpt.graft("tf2/template", "tf1/model.ckpt", "tf2/model",
    ...              rename={"simple-fc/weights": "model/fc/kernel"})
    """
    return execute(
        plan_graft(
            template,
            sources,
            dst,
            options,
            allow_missing=allow_missing,
            adam_betas=adam_betas,
            storage_options=storage_options,
            **changes,
        ),
        progress=progress,
    )


def plan_flatten(
    src,
    dst,
    options: Options | None = None,
    *,
    tf1_slots: bool = False,
    adam_betas: tuple[float, float] = ADAM_BETAS,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Plan:
    """Plan :func:`flatten`; reads no tensor data (but, with ``tf1_slots``, the step
    count and a momentum's learning rate).

    >>> p = tfckpt.plan_flatten("tf2/ckpt-3", "tf1/model.ckpt")
    >>> [t.new_name for t in p.tensors][:2]
    """
    options = Options.of(options, **changes)
    naming = NameRules([], [], compile_rules(options.rename), dict(options.rename_exact or {}))
    composed: dict[str, str] = {}
    given = isinstance(src, Checkpoint)
    ckpt: Checkpoint = (
        src if given else open_checkpoint(src, mmap=False, storage_options=storage_options)
    )
    try:
        if OBJECT_GRAPH_KEY not in ckpt:
            raise CheckpointError(
                f"flatten needs a TF2 object-based checkpoint (one with {OBJECT_GRAPH_KEY})",
                path=ckpt.prefix,
            )
        graph = ObjectGraph.of(ckpt)
        flat = flat_names(graph, set(ckpt.keys()))
        for key in ckpt.keys():
            if key != OBJECT_GRAPH_KEY:
                composed[key] = naming.new_name(flat.get(key, key))
        scales: dict[str, float] = {}
        made: list = []
        if tf1_slots:
            scales, made = tf1_names(optimizer_state(graph), composed, ckpt, adam_betas)
    finally:
        if not given:
            ckpt.close()
    p = plan(
        src,
        dst,
        # The renames' patterns are checked here, on the flat names, not by plan().
        Options.of(options, rename=None, rename_exact=composed, allow_unmatched=True),
        storage_options=storage_options,
    )
    p.options = Options.of(p.options, allow_unmatched=options.allow_unmatched)
    p.unmatched = [u for u in p.unmatched if u[0] != RENAME_EXACT] + naming.unmatched()
    p.check_matched(flat.values())
    p.object_graph = None  # names are all a name-based reader needs
    for t in p.tensors:
        _scaled(t, scales.get(t.name))
    for name, value in made:
        info = TensorInfo(name, value.dtype.name, value.shape, value.nbytes, None, None, None)
        edit = Literal(np.ascontiguousarray(value).tobytes())
        p.tensors.append(PlannedTensor(0, name, name, info, info.dtype, info.nbytes, edit=edit))
    return p


def flatten(
    src,
    dst,
    options: Options | None = None,
    *,
    tf1_slots: bool = False,
    adam_betas: tuple[float, float] = ADAM_BETAS,
    progress: Callable[[int], None] | None = None,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Summary:
    """Write a TF2 checkpoint as a name-based one, named by flat names, without the
    object graph: what a TF1 ``Saver`` or any name-keyed reader expects.

    Variables are named by their path (``model/dense/kernel``), slot variables by
    their variable's path and the slot's name (``model/dense/kernel/m``), other
    attributes' tensors by their path (see :mod:`tfckpt.graft`). Every transform
    option applies (see :func:`tfckpt.transform`); ``rename`` and ``rename_exact``
    apply to the flat names. Two tensors with one name are an error. With
    ``tf1_slots``, an Adam's, momentum SGD's, Adagrad's, RMSprop's or Ftrl's state is
    named as TF1's optimizers name it: ``VAR/Adam`` and ``VAR/Adam_1``,
    ``VAR/Momentum`` (scaled by -1/learning_rate), ``VAR/Adagrad``, ``VAR/RMSProp`` and
    ``VAR/RMSProp_1``, or ``VAR/Ftrl`` and ``VAR/Ftrl_1`` after the variable's new name,
    ``global_step``, and for an Adam ``beta1_power``/``beta2_power`` for that step
    (``adam_betas``).

    >>> tfckpt.flatten("tf2/ckpt-3", "tf1/model.ckpt")
    """
    return execute(
        plan_flatten(
            src,
            dst,
            options,
            tf1_slots=tf1_slots,
            adam_betas=adam_betas,
            storage_options=storage_options,
            **changes,
        ),
        progress=progress,
    )


def _scaled(t: PlannedTensor, factor: float | None) -> None:
    """``t`` multiplied by ``factor`` (a TF1 momentum as Keras keeps it, or back), when
    there is one: rounded to the tensor's dtype first, so that the product, exact in
    float64 and rounded once, is TensorFlow's in that dtype."""
    if factor is not None:
        t.edit = Scale(float(np.array(factor, dtype=_dt.lookup(t.info.dtype).numpy)))
