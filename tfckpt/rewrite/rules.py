"""The rules a transform applies per tensor name: include/exclude patterns, renames,
the dtype each tensor is written in (:class:`DtypePolicy`) and its value transforms
(:class:`ShapeRules`: permute, reshape, squeeze).

Every command that selects, renames or casts by name comes here (plan, graft,
flatten, export, import, average, Keras loading), so one name is treated alike by
each. They look at names alone; which tensors a source holds is the planner's
(:mod:`tfckpt.rewrite.planner`).
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tfckpt.errors import SUGGEST_AMONG, CheckpointError, UnknownDTypeError, option
from tfckpt.format import dtypes as _dt
from tfckpt.rewrite.cast import CAST_TARGETS, should_cast
from tfckpt.rewrite.options import Options, Permutes, RenameRules, Reshapes
from tfckpt.rewrite.regex import Found, Regex

# The options holding patterns (Options' fields), and their flags on the command line.
INCLUDE, EXCLUDE, RENAME, RENAME_EXACT = "include", "exclude", "rename", "rename_exact"
NAME_MAP, KEEP_DTYPE, DTYPE_RULE = "name_map", "keep_dtype", "dtype_rules"
FLAGS = {
    INCLUDE: "--include",
    EXCLUDE: "--exclude",
    RENAME: "--map",
    RENAME_EXACT: "--map-file",
    NAME_MAP: "[[map]]",
    KEEP_DTYPE: "--keep-dtype",
    DTYPE_RULE: "--dtype-rule",
}
ALLOW_UNMATCHED = option("allow_unmatched=True", "--allow-unmatched")

Unmatched = tuple[str, str]  # (the option, as above; the pattern) of a pattern no name matched


class Tried:
    """Patterns of one option, tried on names: which one matches a name first, and which
    have matched none of the names so far (:meth:`unmatched`).

    Each pattern is tried on each name at most once: after the first match, those that
    have not matched yet are tried too (whether they ever match is asked of every
    pattern), the others not.
    """

    __slots__ = ("what", "patterns", "idle")

    def __init__(self, what: str, patterns: Sequence[Regex]):
        self.what = what
        self.patterns = list(patterns)
        self.idle = set(range(len(self.patterns)))

    def first(self, name: str, flat: str | None = None, how: str = "search") -> int | None:
        """The index of the first pattern found in ``name`` (or in ``flat``) by ``how``
        (``'search'``, ``'match'``, ``'fullmatch'``); None when none is."""
        hit = self.first_found(name, flat, how)
        return None if hit is None else hit[0]

    def first_found(
        self, name: str, flat: str | None = None, how: str = "search"
    ) -> tuple[int, Found] | None:
        """:meth:`first`, with the match (in ``name``, else in ``flat``)."""
        out = None
        idle = self.idle
        for k, rx in enumerate(self.patterns):
            if out is not None:
                if not idle:
                    break
                if k not in idle:
                    continue
            m = getattr(rx, how)(name)
            if m is None and flat is not None:
                m = getattr(rx, how)(flat)
            if m is not None:
                idle.discard(k)
                if out is None:
                    out = (k, m)
        return out

    def settle(self, names: Iterable[tuple[str, str | None]], how: str = "search") -> None:
        """Try the patterns that have matched no name yet on ``names`` ((name, flat name
        or None) pairs: those the patterns were not tried on), to tell which match none."""
        if not self.idle:
            return
        for name, flat in names:
            for k in list(self.idle):
                rx = self.patterns[k]
                if getattr(rx, how)(name) is not None or (
                    flat is not None and getattr(rx, how)(flat) is not None
                ):
                    self.idle.discard(k)
            if not self.idle:
                return

    def unmatched(self) -> list[Unmatched]:
        """The patterns that have matched no name tried, in order."""
        return [(self.what, self.patterns[k].pattern) for k in sorted(self.idle)]


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
    values keep their dtype unless a keep pattern or a rule matches them. Nor does it
    cast training bookkeeping (see :mod:`tfckpt.format.bookkeeping`) unless
    ``cast_bookkeeping``: a metric's count stays as it is unless a keep pattern or a rule
    matches it.
    :meth:`decide` gives the dtype and the label of what decided it: ``'keep REGEX'``,
    ``'rule REGEX=DTYPE'``, ``'cast'``, :data:`BOOKKEEPING` (kept, that the cast
    would have cast), or None (unchanged, nothing applied).

    >>> policy = DtypePolicy.of(Options(cast="float16", keep_dtype=["LayerNorm"]))
    >>> policy.decide("bert/LayerNorm/gamma", tfckpt.dtypes.lookup("float32"))
    """

    keep: tuple[tuple[Regex, str], ...] = ()
    rules: tuple[tuple[Regex, _dt.DType, str], ...] = ()
    target: _dt.DType | None = None
    cast_from: frozenset[str] | None = None
    cast_bookkeeping: bool = False
    # The keep patterns and the rules' patterns, tried: which matched no tensor.
    tried: tuple[Tried, Tried] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(
            self,
            "tried",
            (
                Tried(KEEP_DTYPE, [rx for rx, _ in self.keep]),
                Tried(DTYPE_RULE, [rx for rx, _, _ in self.rules]),
            ),
        )

    @classmethod
    def of(cls, options: Options) -> DtypePolicy:
        """The policy of ``options``; a bad pattern or dtype is a CheckpointError naming it."""
        target = None
        if options.cast is not None:
            target = _cast_target(options.cast, option("cast", "--dtype"))
        from_set = None
        if options.cast_from is not None:
            from_set = frozenset(_from_dtype(d) for d in options.cast_from)
        keep_specs = options.keep_dtype
        keep = tuple(
            (_compile(p, "keep_dtype pattern"), f"keep {p}")
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
                (
                    _compile(pattern, "dtype rule", repr(f"{pattern}={dtype}")),
                    _cast_target(dtype, what),
                    f"rule {pattern}={dtype}",
                )
            )
        if keep and target is None and not rules:
            raise CheckpointError(
                f"{option('keep_dtype', '--keep-dtype')} keeps nothing: no "
                f"{option('cast', '--dtype')} and no {option('dtype_rules', '--dtype-rule')} given"
            )
        if options.cast_bookkeeping and target is None:
            raise CheckpointError(
                f"{option('cast_bookkeeping', '--cast-bookkeeping')} casts nothing: no "
                f"{option('cast', '--dtype')} given"
            )
        return cls(keep, tuple(rules), target, from_set, bool(options.cast_bookkeeping))

    @property
    def passes_bookkeeping(self) -> bool:
        """Whether ``cast`` passes training bookkeeping by: a cast without ``cast_bookkeeping``."""
        return self.target is not None and not self.cast_bookkeeping

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
        self,
        name: str,
        dtype: _dt.DType,
        flat: str | None = None,
        *,
        variable: bool = True,
        bookkeeping: bool = False,
    ) -> tuple[_dt.DType, str | None]:
        """The dtype a tensor named ``name`` (in its source) of ``dtype`` is written in,
        and the label of what decided it; a pattern matching ``flat`` (its flat name)
        matches it too. ``variable=False`` (a tensor TensorFlow restores only in its
        stored dtype) leaves it to keep patterns and rules: ``cast`` passes it by.
        ``bookkeeping=True`` (training bookkeeping) likewise, unless ``cast_bookkeeping``:
        a cast it passes by is labelled :data:`BOOKKEEPING`."""
        keep, rules = self.tried
        if not dtype.is_floating:  # never cast: matched only to say which patterns match
            if keep.idle:
                keep.first(name, flat)
            if rules.idle:
                rules.first(name, flat)
            return dtype, None
        k = keep.first(name, flat) if self.keep else None
        r = rules.first(name, flat) if self.rules and (k is None or rules.idle) else None
        if k is not None:
            return dtype, self.keep[k][1]
        if r is not None:
            return self.rules[r][1], self.rules[r][2]
        if variable and should_cast(dtype, self.target, self.cast_from):
            assert self.target is not None
            if bookkeeping and not self.cast_bookkeeping:
                return dtype, BOOKKEEPING
            return self.target, "cast"
        return dtype, None

    def unmatched(self, others: Iterable[tuple[str, str | None]] = ()) -> list[Unmatched]:
        """The keep patterns and rules that matched no tensor: neither one decided nor
        one of ``others`` ((name, flat name or None) pairs: those left out before)."""
        keep, rules = self.tried
        if keep.idle or rules.idle:
            others = list(others)
            keep.settle(others)
            rules.settle(others)
        return keep.unmatched() + rules.unmatched()


BOOKKEEPING = "bookkeeping"  # the label of training bookkeeping a cast passed by


def bookkeeping_kept(dtype_by: Iterable[str | None], new_dtypes: Iterable[str]) -> dict[str, int]:
    """Per dtype, the tensors kept in it as training bookkeeping that the cast would have
    cast (labelled :data:`BOOKKEEPING` in ``dtype_by``), from a plan's columns.

    >>> bookkeeping_kept(["cast", "bookkeeping", None], ["float16", "float32", "int64"])
    {'float32': 1}
    """
    out: dict[str, int] = {}
    for by, dtype in zip(dtype_by, new_dtypes):
        if by == BOOKKEEPING:
            out[dtype] = out.get(dtype, 0) + 1
    return dict(sorted(out.items()))


def matches(rx: Regex, name: str, flat: str | None = None) -> bool:
    """Whether ``rx`` is found in a source tensor's name or, given, its flat name."""
    return rx.search(name) is not None or (flat is not None and rx.search(flat) is not None)


def _from_dtype(spec) -> str:
    try:
        return _dt.lookup(spec).name
    except (ValueError, TypeError) as e:
        raise UnknownDTypeError(f"{option('cast_from', '--from')}: {e}") from None


def _compile(pattern: str, what: str, shown: str | None = None) -> Regex:
    return Regex.compile(pattern, what, shown)


def _cast_target(spec: str, what: str) -> _dt.DType:
    try:
        # Only a name or a dtype: numpy would read None as float64.
        target = _dt.lookup(spec) if spec is not None else None
    except (ValueError, TypeError):
        target = None
    if target is None or target.name not in CAST_TARGETS:
        hint = _dt.did_you_mean(spec) if target is None else ""
        raise UnknownDTypeError(
            f"{what}: cannot cast to {spec!r}{hint or ';'} targets: {', '.join(CAST_TARGETS)}"
        )
    return target


def compile_rules(rename: RenameRules | None, what: str = "rename") -> list[tuple[Regex, str]]:
    """Rename rules (a mapping or pairs of regex and replacement) compiled, in order.

    >>> new_name("dense/kernel", {}, compile_rules({"^dense/": "head/"}))
    'head/kernel'
    """
    if rename is None:
        return []
    items = rename.items() if isinstance(rename, Mapping) else rename
    return [(Regex.compile(pattern, f"{what} pattern"), repl) for pattern, repl in items]


def new_name(
    name: str,
    exact: Mapping[str, str],
    rules: list[tuple[Regex, str]],
    tried: Tried | None = None,
) -> str:
    """``name`` renamed: by ``exact`` first, else by the first rule that matches at its
    start (``tried``: those rules, tried, to say which matched no name); never to an
    empty name (every renaming command comes here, so none can write one)."""
    if name in exact:
        if not exact[name]:
            raise CheckpointError("the exact renames give it an empty name", tensor=name)
        return exact[name]
    if not rules:
        return name
    hit = None
    if tried is not None:
        hit = tried.first_found(name, how="match")
    else:
        for k, (rx, _) in enumerate(rules):
            m = rx.match(name)
            if m is not None:
                hit = (k, m)
                break
    if hit is None:
        return name
    k, m = hit
    repl = rules[k][1]
    try:
        new = m.expand(repl) + name[m.end() :]
    except (re.error, IndexError) as e:
        raise CheckpointError(f"rename {m.re.pattern!r} -> {repl!r} on {name!r}: {e}") from None
    if not new:
        raise CheckpointError(
            f"rename {m.re.pattern!r} -> {repl!r} gives it an empty name", tensor=name
        )
    return new


def compile_patterns(values: Iterable[str] | str | None, what: str = "pattern") -> list[Regex]:
    """Include/exclude/keep patterns (one regex or several) compiled; [] for None."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [Regex.compile(v, what) for v in values]


@dataclass(frozen=True)
class NameRules:
    """A transform's ``include``/``exclude`` patterns and renames, compiled: which source
    tensors it keeps and what it names them. :meth:`unmatched`: the patterns and exact
    renames that matched no name they were tried on."""

    includes: list[Regex]
    excludes: list[Regex]
    renames: list[tuple[Regex, str]]
    exact: Mapping[str, str]
    maps: list[tuple[Regex, str]] = field(default_factory=list)
    # Each option's patterns, tried (see Tried); the exact renames' old names found.
    tried: dict[str, Tried] = field(init=False, repr=False, compare=False)
    found: set[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        tried = {
            INCLUDE: Tried(INCLUDE, self.includes),
            EXCLUDE: Tried(EXCLUDE, self.excludes),
            RENAME: Tried(RENAME, [rx for rx, _ in self.renames]),
            NAME_MAP: Tried(NAME_MAP, [rx for rx, _ in self.maps]),
        }
        object.__setattr__(self, "tried", tried)
        object.__setattr__(self, "found", set())

    @classmethod
    def of(cls, options: Options) -> NameRules:
        """The rules of ``options``; of several bad patterns, include's is reported first,
        then exclude's, then rename's, then name_map's."""
        return cls(
            compile_patterns(options.include, "include pattern"),
            compile_patterns(options.exclude, "exclude pattern"),
            compile_rules(options.rename),
            dict(options.rename_exact or {}),
            compile_rules(options.name_map, "name_map"),
        )

    @property
    def keep_all(self) -> bool:
        """Whether the rules keep every tensor under its own name (none given)."""
        return not (self.includes or self.excludes or self.renames or self.exact or self.maps)

    def drop_reason(self, name: str, flat: str | None = None) -> str | None:
        """Why the patterns leave a source tensor out (``'not included'``, ``'excluded'``,
        :data:`UNMAPPED`), or None when they keep it; a pattern matching ``flat`` (its flat
        name) matches it."""
        why = self._left_out(name, flat)
        if why is None and self.maps and name not in self.exact and self._mapped(name) is None:
            return UNMAPPED
        return why

    def decide(self, name: str, flat: str | None = None) -> tuple[str | None, str]:
        """Why the patterns leave a source tensor out (see :meth:`drop_reason`) and ``""``,
        or None and its new name (see :meth:`new_name`), each pattern tried once."""
        why = self._left_out(name, flat)
        if why is not None:
            return why, ""
        new = self.map_name(name)
        return (UNMAPPED, "") if new is None else (None, new)

    def _left_out(self, name: str, flat: str | None) -> str | None:
        if self.exact and name in self.exact:
            self.found.add(name)
        if self.includes and self.tried[INCLUDE].first(name, flat) is None:
            return "not included"
        if self.excludes and self.tried[EXCLUDE].first(name, flat) is not None:
            return "excluded"
        return None

    def mapped(self, name: str) -> bool:
        """Whether a ``name_map`` rule matches all of ``name``."""
        return self._mapped(name) is not None

    def _mapped(self, name: str) -> tuple[int, Found] | None:
        return self.tried[NAME_MAP].first_found(name, how="fullmatch")

    def map_name(self, name: str) -> str | None:
        """``name`` renamed (see :meth:`new_name`), or None when ``name_map`` rules are
        given and neither one of them nor ``exact`` names it."""
        if self.maps and name not in self.exact:
            m = self._mapped(name)
            return None if m is None else _expanded(m[1], self.maps[m[0]][1])
        return self.new_name(name)

    def new_name(self, name: str) -> str:
        """``name`` renamed (see :func:`new_name`): by ``exact``, else by the first
        ``name_map`` rule matching all of it, else by the rename rules."""
        if self.exact and name in self.exact:
            self.found.add(name)
        if self.maps and name not in self.exact:
            m = self._mapped(name)
            if m is not None:
                return _expanded(m[1], self.maps[m[0]][1])
        return new_name(name, self.exact, self.renames, self.tried[RENAME])

    def unmatched(self, others: Iterable[tuple[str, str | None]] = ()) -> list[Unmatched]:
        """The patterns, in the order of the options, and the exact renames' old names
        that matched no name: neither one they were tried on nor one of ``others``
        ((name, flat name or None) pairs: the names left out before they were tried)."""
        tried = self.tried
        if tried[EXCLUDE].idle or tried[RENAME].idle or tried[NAME_MAP].idle:
            others = list(others)
            tried[EXCLUDE].settle(others)
            tried[RENAME].settle(((n, None) for n, _ in others), "match")
            tried[NAME_MAP].settle(((n, None) for n, _ in others), "fullmatch")
        out = [u for t in tried.values() for u in t.unmatched()]
        return out + [(RENAME_EXACT, old) for old in self.exact if old not in self.found]


UNMAPPED = "no name_map rule"  # the drop reason of a tensor no name_map rule names


def check_mapped(dropped: Iterable[tuple[str, str, str]], options: Options) -> None:
    """With ``name_map`` rules and without ``allow_unmapped``: an error listing every
    tensor (of ``dropped``: (source label, name, reason)) no rule names."""
    if not options.name_map or options.allow_unmapped:
        return
    unmapped = [(label, n) for label, n, why in dropped if why == UNMAPPED]
    if unmapped:
        listed = ", ".join(n for _, n in unmapped)
        raise CheckpointError(
            f"{len(unmapped)} tensor(s) no name_map rule names (map them, exclude them, or "
            f"{option('allow_unmapped=True', '--allow-unmapped')} to leave them out): {listed}",
            path=unmapped[0][0],
        )


def _expanded(m: Found, template: str) -> str:
    name = m.string
    try:
        new = m.expand(template)
    except (re.error, IndexError) as e:
        raise CheckpointError(
            f"name_map {m.re.pattern!r} -> {template!r} on {name!r}: {e}"
        ) from None
    if not new:
        raise CheckpointError(
            f"name_map {m.re.pattern!r} -> {template!r} gives it an empty name", tensor=name
        )
    return new


def given_patterns(options: Options) -> set[Unmatched]:
    """Every (option, pattern) of ``options`` that :meth:`NameRules.unmatched` and
    :meth:`DtypePolicy.unmatched` may name: to tell a caller's from rules added to them."""
    out: set[Unmatched] = set()
    for what in (INCLUDE, EXCLUDE, KEEP_DTYPE):
        value = getattr(options, what) or ()
        out |= {(what, p) for p in ([value] if isinstance(value, str) else value)}
    for what in (RENAME, NAME_MAP, DTYPE_RULE):
        value = getattr(options, what) or ()
        out |= {(what, p) for p, _ in (value.items() if isinstance(value, Mapping) else value)}
    return out | {(RENAME_EXACT, old) for old in options.rename_exact or {}}


def unmatched_error(
    unmatched: Sequence[Unmatched], names: Callable[[], Iterable[str]], path: str | None = None
) -> CheckpointError:
    """The error for patterns that matched no tensor (``names``: those they could have
    matched, for the nearest), each named with its option."""
    candidates: list[str] = []
    for n in names():
        candidates.append(n)
        if len(candidates) > SUGGEST_AMONG:
            candidates = []
            break
    unique = list(dict.fromkeys(candidates))
    parts = []
    for what, pattern in unmatched:
        part = f"{option(what, FLAGS[what])} {pattern!r} matches no tensor"
        near = _nearest(pattern, unique)
        if near:
            part += f" (nearest: {', '.join(repr(n) for n in near)})"
        if "\\|" in pattern:
            part += (
                " (\\| is a literal | in a regex, likely a Markdown table's escape: "
                "write | for 'or')"
            )
        parts.append(part)
    return CheckpointError(
        "; ".join(parts) + f" (use {ALLOW_UNMATCHED} if that is meant)", path=path
    )


def _nearest(pattern: str, names: list[str]) -> list[str]:
    """Up to three of ``names`` nearest ``pattern`` read as text (difflib's measure),
    each alternative of it (``a|b``) on its own."""
    text = re.sub(r"\\(.)", r"\1", pattern).strip("^$")
    out: list[str] = []
    for word in dict.fromkeys([text, *text.strip("()").split("|")]):
        if word:
            out += difflib.get_close_matches(word, names, n=3, cutoff=0.6)
    return list(dict.fromkeys(out))[:3]


def _axes(text: str) -> tuple[int, ...]:
    """``'1,0'`` as (1, 0); () when it is not whole numbers separated by commas."""
    try:
        return tuple(int(a) for a in text.split(","))
    except ValueError:
        return ()


def parse_permutes(items: Iterable[str]) -> list[tuple[str, tuple[int, ...]]]:
    """``REGEX=AXES`` strings (``'kernel$=1,0'``) as (regex, axes) pairs."""
    out = []
    for item in items:
        rx, sep, axes = item.rpartition("=")
        perm = _axes(axes)
        if not sep or not perm:
            raise CheckpointError(f"--permute takes REGEX=AXES (e.g. 'kernel$=1,0'), not {item!r}")
        out.append((rx, perm))
    return out


def parse_reshapes(items: Iterable[str]) -> list[tuple[str, tuple[int, ...]]]:
    """``REGEX=SHAPE`` strings (``'qkv$=768,3,768'``, one ``-1`` allowed; ``REGEX=`` for
    a scalar) as (regex, shape) pairs."""
    out = []
    for item in items:
        rx, sep, dims = item.rpartition("=")
        shape = _axes(dims) if dims else ()
        if not sep or (dims and not shape):
            raise CheckpointError(
                f"--reshape takes REGEX=SHAPE (e.g. 'c_attn/w$=768,2304'), not {item!r}"
            )
        out.append((rx, shape))
    return out


class Permuter:
    """Which permutation, if any, applies to a tensor: the first rule whose regex
    (``re.search``) matches its new name.

    >>> Permuter([("kernel$", (1, 0))])("dense/kernel", (784, 10))
    (1, 0)
    """

    def __init__(self, rules: Permutes):
        self.rules = []
        for rx, perm in rules:
            compiled = Regex.compile(rx, "permute pattern")
            try:
                self.rules.append((compiled, tuple(operator.index(a) for a in perm)))
            except TypeError:
                raise CheckpointError(
                    f"--permute {rx!r}: the axes must be whole numbers, not {perm!r}"
                ) from None

    def __call__(
        self, name: str, shape: tuple[int, ...], *, path: str | None = None
    ) -> tuple[int, ...] | None:
        for rx, perm in self.rules:
            if rx.search(name):
                if sorted(perm) != list(range(len(shape))):
                    raise CheckpointError(
                        f"permutation {list(perm)} does not fit shape {list(shape)}",
                        tensor=name,
                        path=path,
                    )
                return None if perm == tuple(range(len(shape))) else perm
        return None


@dataclass(frozen=True)
class ShapeRules:
    """A transform's value transforms, compiled: ``permute`` (reorders axes), then
    ``reshape`` or ``squeeze`` (a new shape for the same elements in the same order),
    each the first rule whose regex (``re.search``) matches a tensor's new name.

    >>> rules = ShapeRules.of(Options(permute=[("kernel$", (1, 0))], squeeze=["/w$"]))
    >>> rules.decide("h0/attn/c_attn/w", (1, 768, 2304))
    (None, (768, 2304))
    """

    permuter: Permuter
    reshapes: tuple[tuple[Regex, tuple[int, ...]], ...] = ()
    squeezes: tuple[Regex, ...] = ()

    @classmethod
    def of(cls, options: Options) -> ShapeRules:
        """The rules of ``options``; a bad pattern or shape is a CheckpointError naming it."""
        return cls(
            Permuter(options.permute),
            tuple(_reshape_rule(rx, shape) for rx, shape in _pairs(options.reshape, "reshape")),
            tuple(compile_patterns(options.squeeze, "squeeze pattern")),
        )

    def __bool__(self) -> bool:
        return bool(self.permuter.rules or self.reshapes or self.squeezes)

    def decide(
        self, name: str, shape: tuple[int, ...], *, path: str | None = None
    ) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        """The permutation (None: none) and the output's shape (None: the source's) of a
        tensor of ``shape`` newly named ``name``."""
        perm = self.permuter(name, shape, path=path)
        permuted = shape if perm is None else tuple(shape[a] for a in perm)
        out = permuted
        for rx, target in self.reshapes:
            if rx.search(name):
                out = _fit(target, permuted, name, path)
                break
        else:
            if any(rx.search(name) for rx in self.squeezes):
                out = tuple(d for d in permuted if d != 1)
        return perm, (None if out == shape else out)


def _pairs(rules: Reshapes, what: str) -> list[tuple[str, Sequence[int]]]:
    items = rules.items() if isinstance(rules, Mapping) else rules
    try:
        return [(rx, shape) for rx, shape in items]
    except (TypeError, ValueError):
        raise CheckpointError(f"{what} rules are (regex, shape) pairs, not {rules!r}") from None


def _reshape_rule(rx: str, shape: Sequence[int]) -> tuple[Regex, tuple[int, ...]]:
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise CheckpointError(
            f"reshape {rx!r}: the shape must be whole numbers, not {shape!r}"
        ) from None
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise CheckpointError(f"reshape {rx!r}: sizes >= 0 and at most one -1, not {list(dims)}")
    return _compile(rx, "reshape pattern"), dims


def _fit(
    target: tuple[int, ...], shape: tuple[int, ...], name: str, path: str | None
) -> tuple[int, ...]:
    """``target`` with its -1 resolved for the elements of ``shape``; an error when the
    element counts differ."""
    size = 1
    for d in shape:
        size *= d
    known = 1
    for d in target:
        known *= d if d != -1 else 1
    out = target
    if -1 in target:
        if known == 0 or size % known:
            out = ()
        else:
            out = tuple(size // known if d == -1 else d for d in target)
    count = 1
    for d in out:
        count *= d
    if not out and target or count != size:
        raise CheckpointError(
            f"reshape to {list(target)} does not fit shape {list(shape)} ({size} elements)",
            tensor=name,
            path=path,
        )
    return out
