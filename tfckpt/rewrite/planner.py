"""Planning a transform: from the sources' indexes alone, what each output tensor is.

:func:`plan` decides every output tensor's source, new name, new dtype and bytes,
and what is dropped and why; it reads no tensor data. :func:`tfckpt.execute`
then writes the plan.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.errors import CheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import TensorInfo
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, ObjectGraph, attribute_tensors, renamed_key
from tfckpt.format.tf2names import VARIABLE_VALUE, flat_names
from tfckpt.io import paths
from tfckpt.io.storage import (
    StorageOptions,
    current_options,
    normalize,
    storage_for,
    takes_storage_options,
)
from tfckpt.rewrite import collector
from tfckpt.rewrite.cast import CAST_TARGETS, should_cast
from tfckpt.rewrite.options import Options, RenameRules

SAVE_COUNTER = "save_counter"  # the bookkeeping child every tf.train.Checkpoint.save() adds


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
    # Read back whole, as TF2 restores, even from a source without an object graph.
    restored_whole: bool = False
    dtype_by: str | None = None  # the DtypePolicy label that decided new_dtype

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
    options: Options  # those it was planned with; execute() writes with them
    # Those its paths were opened with; execute() writes with them too.
    storage_options: dict | None = field(default=None, repr=False, compare=False)

    @property
    def bytes_in(self) -> int:
        return sum(t.info.nbytes for t in self.tensors)

    @property
    def bytes_out(self) -> int:
        return sum(t.bytes_out for t in self.tensors)

    @property
    def object_graph_copied(self) -> bool:
        """Whether the output's object graph is a source's, byte for byte: nothing in it
        changed, so it is copied rather than rewritten."""
        return self.object_graph is not None and any(
            s.graph is not None and s.graph.parsed_from == self.object_graph for s in self.sources
        )

    def dtype_rule_counts(self) -> dict[str, int] | None:
        """Tensors per keep pattern and dtype rule (zero included), in the order given;
        None when the plan has neither."""
        return DtypePolicy.of(self.options).counts(t.dtype_by for t in self.tensors)

    def to_dict(self) -> dict:
        counts = self.dtype_rule_counts()
        return {
            "dst": self.dst,
            "sources": [s.label for s in self.sources],
            "tensors": [
                {
                    "source": self.sources[t.source].label,
                    "name": t.name,
                    "new_name": t.new_name,
                    "dtype": t.info.dtype,
                    "new_dtype": t.new_dtype,
                    "shape": list(t.info.shape),
                    "bytes_in": t.info.nbytes,
                    "bytes_out": t.bytes_out,
                    **({"dtype_by": t.dtype_by} if counts is not None else {}),
                }
                for t in self.tensors
            ],
            "dropped": [{"source": s, "name": n, "reason": r} for s, n, r in self.dropped],
            "object_graph": self.object_graph is not None,
            "object_graph_copied": self.object_graph_copied,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            **({"dtype_rules": counts} if counts is not None else {}),
        }


@dataclass(frozen=True)
class DtypePolicy:
    """Which dtype each tensor is written in: ``keep_dtype``, then the first matching
    ``dtype_rules`` entry, then ``cast`` (narrowed by ``cast_from``).

    Patterns are ``re.search``-ed on source names, as ``include``/``exclude`` are:
    a tensor of a TF2 source matches by its key or its flat name (see
    :func:`source_flat_names`).
    Only floating-point tensors are ever cast; others keep their dtype whatever
    matches them. ``cast`` casts only variables (see :func:`fixed_dtype_tensors`): a
    lookup table's keys and values keep their dtype unless a keep pattern or a rule
    matches them. :meth:`decide` gives the dtype and the label of what decided it:
    ``'keep REGEX'``, ``'rule REGEX=DTYPE'``, ``'cast'``, or None (unchanged, nothing
    applied).

    >>> policy = DtypePolicy.of(Options(cast="float16", keep_dtype=["LayerNorm"]))
    >>> policy.decide("bert/LayerNorm/gamma", tfckpt.dtypes.lookup("float32"))
    """

    keep: tuple[tuple[re.Pattern, str], ...] = ()
    rules: tuple[tuple[re.Pattern, _dt.DType, str], ...] = ()
    target: _dt.DType | None = None
    cast_from: frozenset[str] | None = None

    @classmethod
    def of(cls, options: Options) -> DtypePolicy:
        """The policy of ``options``; a bad pattern or dtype is a CheckpointError naming it."""
        target = None
        if options.cast is not None:
            target = _cast_target(options.cast, "cast")
        from_set = None
        if options.cast_from is not None:
            from_set = frozenset(_dt.lookup(d).name for d in options.cast_from)
        keep_specs = options.keep_dtype
        keep = tuple(
            (_compile(p, f"keep_dtype pattern {p!r}"), f"keep {p}")
            for p in ([keep_specs] if isinstance(keep_specs, str) else keep_specs)
        )
        items = (
            options.dtype_rules.items()
            if isinstance(options.dtype_rules, Mapping)
            else options.dtype_rules
        )
        if isinstance(items, (str, bytes)):
            raise CheckpointError(f"dtype rules are (regex, dtype) pairs or a dict, not {items!r}")
        rules = []
        for item in items:
            try:
                pattern, dtype = () if isinstance(item, (str, bytes)) else item
            except (TypeError, ValueError):
                raise CheckpointError(
                    f"a dtype rule is a (regex, dtype) pair, not {item!r}"
                ) from None
            what = f"dtype rule {f'{pattern}={dtype}'!r}"
            rules.append(
                (_compile(pattern, what), _cast_target(dtype, what), f"rule {pattern}={dtype}")
            )
        if keep and target is None and not rules:
            raise CheckpointError("keep_dtype keeps nothing: no cast and no dtype_rules given")
        return cls(keep, tuple(rules), target, from_set)

    @property
    def labels(self) -> list[str]:
        """The keep patterns' and rules' labels, in order."""
        return [label for _, label in self.keep] + [label for _, _, label in self.rules]

    def counts(self, decided_by: Iterable[str | None]) -> dict[str, int] | None:
        """Tensors per keep pattern and rule (zero included), in the order given, from
        the labels :meth:`decide` returned; None when there are neither."""
        if not self.labels:
            return None
        counts = dict.fromkeys(self.labels, 0)
        for label in decided_by:
            if label in counts:
                counts[label] += 1
        return counts

    def decide(
        self, name: str, dtype: _dt.DType, flat: str | None = None, *, variable: bool = True
    ) -> tuple[_dt.DType, str | None]:
        """The dtype a tensor named ``name`` (in its source) of ``dtype`` is written in,
        and the label of what decided it; a pattern matching ``flat`` (its flat name)
        matches it too. ``variable=False`` (a tensor TensorFlow restores only in its
        stored dtype) leaves it to keep patterns and rules: ``cast`` passes it by."""
        if not dtype.is_floating:
            return dtype, None
        for rx, label in self.keep:
            if matches(rx, name, flat):
                return dtype, label
        for rx, target, label in self.rules:
            if matches(rx, name, flat):
                return target, label
        if variable and should_cast(dtype, self.target, self.cast_from):
            assert self.target is not None
            return self.target, "cast"
        return dtype, None


def matches(rx: re.Pattern, name: str, flat: str | None = None) -> bool:
    """Whether ``rx`` is found in a source tensor's name or, given, its flat name."""
    return rx.search(name) is not None or (flat is not None and rx.search(flat) is not None)


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

    >>> fixed_dtype_tensors(open_sources("train/ckpt-3")[0])
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


def _compile(pattern: str, what: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except (re.error, TypeError) as e:
        raise CheckpointError(f"bad {what}: {e}") from None


def _cast_target(spec: str, what: str) -> _dt.DType:
    try:
        # Only a name or a dtype: numpy would read None as float64.
        target = _dt.lookup(spec) if spec is not None else None
    except (ValueError, TypeError):
        target = None
    if target is None or target.name not in CAST_TARGETS:
        raise CheckpointError(
            f"{what}: cannot cast to {spec!r}; targets: {', '.join(CAST_TARGETS)}"
        )
    return target


def compile_rules(rename: RenameRules | None) -> list[tuple[re.Pattern, str]]:
    """Rename rules (a mapping or pairs of regex and replacement) compiled, in order.

    >>> new_name("dense/kernel", {}, compile_rules({"^dense/": "head/"}))
    'head/kernel'
    """
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


def new_name(name: str, exact: Mapping[str, str], rules: list[tuple[re.Pattern, str]]) -> str:
    """``name`` renamed: by ``exact`` first, else by the first rule that matches; never to
    an empty name (every renaming command comes here, so none can write one)."""
    if name in exact:
        if not exact[name]:
            raise CheckpointError("the exact renames give it an empty name", tensor=name)
        return exact[name]
    for rx, repl in rules:
        m = rx.match(name)
        if m:
            try:
                new = m.expand(repl) + name[m.end() :]
            except (re.error, IndexError) as e:
                raise CheckpointError(
                    f"rename {rx.pattern!r} -> {repl!r} on {name!r}: {e}"
                ) from None
            if not new:
                raise CheckpointError(
                    f"rename {rx.pattern!r} -> {repl!r} gives it an empty name", tensor=name
                )
            return new
    return name


def compile_patterns(values: Iterable[str] | str | None) -> list[re.Pattern]:
    """Include/exclude/keep patterns (one regex or several) compiled; [] for None."""
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
        dst = store.join(
            store.dir_path(dst), sources[0].ckpt.storage.basename(sources[0].ckpt.prefix)
        )
    real = store.realpath(dst)
    for s in sources:
        if s.ckpt.storage.realpath(s.ckpt.prefix) == real:
            raise CheckpointError(
                "the destination is a source checkpoint; write elsewhere "
                "(sources are never modified)",
                path=dst,
            )
        if s.ckpt.storage.realpath(s.ckpt.storage.dirname(s.ckpt.prefix)) == store.realpath(
            store.dirname(dst)
        ) and s.ckpt.storage.basename(s.ckpt.prefix) == store.basename(dst):
            raise CheckpointError("the destination would overwrite a source's data files", path=dst)
    if store.isfile(paths.index_filename(dst)) and not overwrite:
        raise CheckpointError(
            "the destination already exists (use overwrite)", path=paths.index_filename(dst)
        )
    return dst


def open_sources(sources) -> list[Source]:
    if isinstance(sources, (str, os.PathLike, Checkpoint)):
        sources = [sources]
    out = []
    for src in sources:
        ckpt = src if isinstance(src, Checkpoint) else open_checkpoint(src, mmap=False)
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
@takes_storage_options()
def plan(
    sources,
    dst,
    options: Options | None = None,
    *,
    storage_options: StorageOptions | None = None,
    **changes,
) -> Plan:
    """Decide every output tensor from the sources' indexes; reads no tensor data.

    ``options`` (see :class:`~tfckpt.Options`), amended by keyword arguments,
    are kept in the plan: :func:`~tfckpt.execute` writes it with them.

    >>> p = tfckpt.plan("train/", "out/", cast="float16", exclude=["/Adam"])
    >>> p.bytes_out, [t.new_name for t in p.tensors][:3]
    >>> tfckpt.execute(p)
    """
    options = Options.of(options, **changes)
    prefer = options.prefer
    policy = DtypePolicy.of(options)
    srcs = open_sources(sources)
    includes, excludes = compile_patterns(options.include), compile_patterns(options.exclude)
    rules = compile_rules(options.rename)
    exact = dict(options.rename_exact or {})
    dst = resolve_destination(dst, srcs, options.overwrite)

    dropped: list[tuple[str, str, str]] = []
    graphs: list[tuple[int, ObjectGraph]] = []
    per_source: list[list[tuple[str, str]]] = []  # (old, new) per kept tensor
    drop_specs = list(options.drop_objects)
    if drop_specs and not any(s.graph for s in srcs):
        raise CheckpointError(
            f"--drop-object needs a TF2 object-based checkpoint (one with {OBJECT_GRAPH_KEY})",
            path=srcs[0].ckpt.prefix,
        )
    matched_specs: set[str] = set()
    winner = _root_object_owners(srcs, prefer)
    # Built once per source, before its graph is cut, and only for patterns to match.
    patterned = bool(includes or excludes or policy.labels)
    flats = [source_flat_names(s) if patterned else {} for s in srcs]
    fixed = [fixed_dtype_tensors(s) if policy.target is not None else set() for s in srcs]
    for i, s in enumerate(srcs):
        names = [n for n in s.ckpt.keys() if n != OBJECT_GRAPH_KEY]
        flat = flats[i]
        present = set(names)
        gone: set[str] = set()

        def tensors_of(keys: Iterable[str], present: set[str] = present) -> set[str]:
            return {t for k in keys for t in attribute_tensors(k, present)}

        if s.graph is not None:
            for spec in drop_specs:
                try:
                    removed = tensors_of(s.graph.drop_objects([spec]))
                except CheckpointError:
                    continue  # this source lacks the object; another may have it
                matched_specs.add(spec)
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
                    f"the object graph names tensors the checkpoint lacks: "
                    f"{', '.join(missing[:5])}",
                    path=s.ckpt.prefix,
                )
        kept = []
        for n in names:
            if n in gone:
                continue
            if includes and not any(matches(rx, n, flat.get(n)) for rx in includes):
                dropped.append((s.label, n, "not included"))
                continue
            if excludes and any(matches(rx, n, flat.get(n)) for rx in excludes):
                dropped.append((s.label, n, "excluded"))
                continue
            kept.append((n, new_name(n, exact, rules)))
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
                raise CheckpointError(
                    f"{local[new]!r} and {old!r} would both be named {new!r}", path=srcs[i].label
                )
            local[new] = old
            if new in chosen:
                j, other = chosen[new]
                if prefer is None:
                    raise CheckpointError(
                        f"{new!r} comes from both {srcs[j].label} ({other!r}) and "
                        f"{srcs[i].label} ({old!r}); choose with --prefer first|last "
                        "(prefer='first' or 'last')"
                    )
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
                g.drop_keys(
                    {k for k, ts in g.attribute_tensors(mine).items() if lost.intersection(ts)}
                )
        merged = (
            graphs[0][1]
            if len(graphs) == 1
            else ObjectGraph.merge([g for _, g in graphs], [srcs[i].label for i, _ in graphs])
        )
        graph_bytes = merged.serialize()

    if options.max_shard_bytes is None:
        base = 0
        for s in srcs:
            s.shard_base = base
            base += s.ckpt.header.num_shards

    planned: list[PlannedTensor] = []
    dtypes: dict[str, _dt.DType] = {}  # a handful of names for any number of tensors
    wanted: list[list[str]] = [[] for _ in srcs]  # per source, its tensors' old names
    for i, old in chosen.values():
        wanted[i].append(old)
    infos = [srcs[i].ckpt.table(olds).infos() for i, olds in enumerate(wanted)]
    # Without patterns, a dtype decides alone: once per dtype, not once per tensor.
    by_dtype: dict[str, tuple[_dt.DType, str | None]] | None = (
        None if policy.keep or policy.rules else {}
    )
    for new, (i, old) in chosen.items():
        info = infos[i][old]
        dtype = dtypes.get(info.dtype)
        if dtype is None:
            dtype = dtypes[info.dtype] = _dt.lookup(info.dtype)
        if by_dtype is None or old in fixed[i]:
            new_dtype, dtype_by = policy.decide(
                old, dtype, flats[i].get(old), variable=old not in fixed[i]
            )
        else:
            decided = by_dtype.get(info.dtype)
            if decided is None:
                decided = by_dtype[info.dtype] = policy.decide(old, dtype)
            new_dtype, dtype_by = decided
        stored = info.size if info.stored_elements is None else info.stored_elements
        out_bytes = info.nbytes if new_dtype is dtype else stored * new_dtype.fixed_itemsize
        planned.append(
            PlannedTensor(i, old, new, info, new_dtype.name, out_bytes, dtype_by=dtype_by)
        )
    return finished_plan(srcs, dst, planned, dropped, graph_bytes, options)


def plan_storage_options(srcs: list[Source]) -> dict | None:
    """The storage options a plan keeps for writing: those current while planning, else
    those of the first source opened with some."""
    given = current_options()
    if given is not None:
        return given
    opened = (s.ckpt.storage_options for s in srcs if s.ckpt.storage_options is not None)
    return next(opened, None)


def finished_plan(
    srcs: list[Source],
    dst: str,
    planned: list[PlannedTensor],
    dropped: list,
    graph_bytes: bytes | None,
    options: Options,
) -> Plan:
    """The plan of ``planned`` tensors, once every shard file they need is known to
    exist, with its tensors in reading order."""
    # Every shard the output needs must be there before anything is written.
    needed: dict[int, set[int]] = {}
    for pt in planned:
        ids = needed.get(pt.source)
        if ids is None:
            ids = needed[pt.source] = set()
        if pt.info.slices:
            ids.update(x.shard or 0 for x in srcs[pt.source].ckpt.slice_info(pt.name))
        else:
            ids.add(pt.info.shard or 0)
    for i, shard_ids in needed.items():
        srcs[i].ckpt.check_shard_files(shard_ids)
    # Read each source in file order: by source, shard, offset.
    planned.sort(
        key=lambda pt: (
            pt.source,
            pt.info.shard if pt.info.shard is not None else -1,
            pt.info.offset or 0,
            pt.new_name,
        )
    )
    return Plan(srcs, dst, planned, dropped, graph_bytes, options, plan_storage_options(srcs))
