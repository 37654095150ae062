"""The rules a transform applies per tensor name: include/exclude patterns, renames,
and the dtype each tensor is written in (:class:`DtypePolicy`).

Every command that selects, renames or casts by name comes here (plan, graft,
flatten, export, import, average, Keras loading), so one name is treated alike by
each. They look at names alone; which tensors a source holds is the planner's
(:mod:`tfckpt.rewrite.planner`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tfckpt.errors import CheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.rewrite.cast import CAST_TARGETS, should_cast
from tfckpt.rewrite.options import Options, RenameRules


@dataclass(frozen=True)
class DtypePolicy:
    """Which dtype each tensor is written in: ``keep_dtype``, then the first matching
    ``dtype_rules`` entry, then ``cast`` (narrowed by ``cast_from``).

    Patterns are ``re.search``-ed on source names, as ``include``/``exclude`` are:
    a tensor of a TF2 source matches by its key or its flat name (see
    :func:`~tfckpt.rewrite.planner.source_flat_names`).
    Only floating-point tensors are ever cast; others keep their dtype whatever
    matches them. ``cast`` casts only variables (see
    :func:`~tfckpt.rewrite.planner.fixed_dtype_tensors`): a lookup table's keys and
    values keep their dtype unless a keep pattern or a rule matches them.
    :meth:`decide` gives the dtype and the label of what decided it: ``'keep REGEX'``,
    ``'rule REGEX=DTYPE'``, ``'cast'``, or None (unchanged, nothing applied).

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


@dataclass(frozen=True)
class NameRules:
    """A transform's ``include``/``exclude`` patterns and renames, compiled: which source
    tensors it keeps and what it names them."""

    includes: list[re.Pattern]
    excludes: list[re.Pattern]
    renames: list[tuple[re.Pattern, str]]
    exact: Mapping[str, str]

    @classmethod
    def of(cls, options: Options) -> NameRules:
        """The rules of ``options``; of several bad patterns, include's is reported first,
        then exclude's, then rename's."""
        return cls(
            compile_patterns(options.include),
            compile_patterns(options.exclude),
            compile_rules(options.rename),
            dict(options.rename_exact or {}),
        )

    def drop_reason(self, name: str, flat: str | None = None) -> str | None:
        """Why the patterns leave a source tensor out (``'not included'``, ``'excluded'``),
        or None when they keep it; a pattern matching ``flat`` (its flat name) matches it."""
        if self.includes and not any(matches(rx, name, flat) for rx in self.includes):
            return "not included"
        if self.excludes and any(matches(rx, name, flat) for rx in self.excludes):
            return "excluded"
        return None

    def new_name(self, name: str) -> str:
        """``name`` renamed (see :func:`new_name`)."""
        return new_name(name, self.exact, self.renames)
