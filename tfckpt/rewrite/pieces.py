"""Split and concat: output tensors made of boxes of source tensors.

``split`` cuts a tensor along an axis into several (a fused query-key-value kernel
into three); ``concat`` joins several, alike but for one axis, into one. Both act on
new names (after renaming, before ``permute``/``reshape``/``squeeze``, which then apply
to what they make), in the plan: :func:`assemble` turns the planned tensors into the
ones written, each made of :class:`~tfckpt.rewrite.permute.Member` s that the engine
reads in tiles (:func:`~tfckpt.rewrite.permute.assembled_chunks`).

- split: ``(regex, axis, [new, ...])`` or with sizes ``(regex, axis, [new, ...],
  [size, ...])``; the first rule whose regex is found in a tensor's new name cuts it
  into equal parts (or of those sizes), named by the templates expanded with the match
  (``\\1``).
- concat: ``(new, axis, [regex, other, ...])``: each tensor whose new name the first
  regex matches whole is joined, in the order given, with the tensors the others name
  once expanded with that match (``'h.\\1.q'``) — each a regex matching one name whole.

>>> Options(split=[(r"attn\\.c_attn\\.(weight|bias)$", -1, ["q.\\1", "k.\\1", "v.\\1"])])
>>> Options(concat=[("h.\\1.qkv", 0, [r"h\\.(\\d+)\\.q", r"h.\\1.k", r"h.\\1.v"])])
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tfckpt.errors import CheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import TensorInfo
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.permute import Member
from tfckpt.rewrite.plans import PlannedTensor, Source
from tfckpt.rewrite.regex import Found, Regex


@dataclass(frozen=True)
class SplitRule:
    regex: Regex
    axis: int
    into: tuple[str, ...]
    sizes: tuple[int, ...] | None


@dataclass(frozen=True)
class ConcatRule:
    new: str
    axis: int
    first: Regex
    others: tuple[str, ...]


def _regex(pattern, what: str) -> Regex:
    return Regex.compile(pattern, f"{what} pattern")


def _whole(value, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise CheckpointError(f"{what}: {value!r} is not a whole number") from None


def _names(values, what: str) -> tuple[str, ...]:
    if isinstance(values, str) or not all(isinstance(v, str) and v for v in values):
        raise CheckpointError(f"{what}: a list of names, not {values!r}")
    return tuple(values)


def split_rules(options: Options) -> list[SplitRule]:
    """``options.split`` compiled; a bad rule is an error naming it."""
    out = []
    for rule in options.split:
        if isinstance(rule, str) or len(rule) not in (3, 4):
            raise CheckpointError(f"a split rule is (regex, axis, names[, sizes]), not {rule!r}")
        what = f"split {rule[0]!r}"
        into = _names(rule[2], what)
        sizes = None
        if len(rule) == 4:
            sizes = tuple(_whole(n, what) for n in rule[3])
            if len(sizes) != len(into) or any(n < 0 for n in sizes):
                raise CheckpointError(f"{what}: one size >= 0 per name, not {list(sizes)}")
        if len(into) < 2:
            raise CheckpointError(f"{what}: split into two tensors or more")
        out.append(SplitRule(_regex(rule[0], "split"), _whole(rule[1], what), into, sizes))
    return out


def concat_rules(options: Options) -> list[ConcatRule]:
    """``options.concat`` compiled; a bad rule is an error naming it."""
    out = []
    for rule in options.concat:
        if isinstance(rule, str) or len(rule) != 3:
            raise CheckpointError(f"a concat rule is (new name, axis, regexes), not {rule!r}")
        what = f"concat {rule[0]!r}"
        parts = _names(rule[2], what)
        if len(parts) < 2 or not isinstance(rule[0], str) or not rule[0]:
            raise CheckpointError(f"{what}: a new name and two tensors or more")
        out.append(
            ConcatRule(rule[0], _whole(rule[1], what), _regex(parts[0], "concat"), parts[1:])
        )
    return out


def parse_splits(items: Iterable[str]) -> list[tuple[str, int, list[str]]]:
    """``REGEX=AXIS:NEW1,NEW2,...`` strings (``--split``) as split rules."""
    out = []
    for item in items:
        rx, sep, rest = item.rpartition("=")
        axis, colon, names = rest.partition(":")
        into = [n for n in names.split(",") if n]
        if not sep or not colon or not _is_int(axis) or len(into) < 2:
            raise CheckpointError(
                f"--split takes REGEX=AXIS:NEW1,NEW2,... (e.g. 'qkv$=0:q,k,v'), not {item!r}"
            )
        out.append((rx, int(axis), into))
    return out


def parse_concats(items: Iterable[str]) -> list[tuple[str, int, list[str]]]:
    """``NEW=AXIS:REGEX1,REGEX2,...`` strings (``--concat``) as concat rules."""
    out = []
    for item in items:
        new, sep, rest = item.partition("=")
        axis, colon, patterns = rest.partition(":")
        parts = [p for p in patterns.split(",") if p]
        if not sep or not new or not colon or not _is_int(axis) or len(parts) < 2:
            raise CheckpointError(
                f"--concat takes NEW=AXIS:REGEX1,REGEX2,... (e.g. 'qkv=0:q$,k$,v$'), not {item!r}"
            )
        out.append((new, int(axis), parts))
    return out


def _is_int(text: str) -> bool:
    return text.strip().lstrip("-").isdigit()


def assemble(
    srcs: list[Source],
    planned: Sequence[PlannedTensor],
    options: Options,
    has_graph: bool,
) -> Sequence[PlannedTensor]:
    """``planned`` with the tensors ``options``' split rules cut replaced by their pieces
    and those its concat rules join replaced by one; unchanged without rules. A plan
    with an object graph (``has_graph``: a TF2 output) cannot take them: no variable
    of its graph is named by what they make."""
    splits, concats = split_rules(options), concat_rules(options)
    if not splits and not concats:
        return planned
    out: list[PlannedTensor] = []
    for pt in planned:
        for rule in splits:
            m = rule.regex.search(pt.new_name)
            if m:
                out += _split(srcs[pt.source].label, pt, rule, m)
                break
        else:
            out.append(pt)
    for joining in concats:
        out = _concat(srcs, out, joining)
    made = [pt for pt in out if pt.parts is not None]
    if made and has_graph:
        raise CheckpointError(
            "split and concat make tensors no variable of a TF2 object graph names: export "
            "them, or write a TF1 checkpoint (flatten first)",
            path=srcs[0].label,
            tensor=made[0].new_name,
        )
    seen: dict[str, PlannedTensor] = {}
    for pt in out:
        if pt.new_name in seen:
            raise CheckpointError(
                f"{seen[pt.new_name].name!r} and {pt.name!r} would both be named {pt.new_name!r}",
                path=srcs[pt.source].label,
            )
        seen[pt.new_name] = pt
    return out


def _members(pt: PlannedTensor) -> tuple[Member, ...]:
    """What ``pt`` is made of: its members, or all of its source tensor."""
    if pt.parts is not None:
        return pt.parts
    return (Member(pt.name, tuple((0, n) for n in pt.info.shape), (0,) * len(pt.info.shape)),)


def _checked_axis(axis: int, shape: tuple[int, ...], what: str, pt: PlannedTensor, label: str):
    if not -len(shape) <= axis < len(shape):
        raise CheckpointError(
            f"{what}: axis {axis} is not one of shape {list(shape)}", path=label, tensor=pt.name
        )
    dtype = _dt.lookup(pt.info.dtype)
    if dtype.numpy is None or pt.info.dtype == "string":
        raise CheckpointError(
            f"{what}: takes numeric and bool tensors, not {pt.info.dtype}",
            path=label,
            tensor=pt.name,
        )
    return axis % len(shape)


def _assembled(
    pt: PlannedTensor, new_name: str, shape: tuple[int, ...], members: tuple[Member, ...]
) -> PlannedTensor:
    """A planned tensor of ``shape`` made of ``members`` of ``pt``'s source, in its dtypes."""
    size = 1
    for n in shape:
        size *= n
    stored = _dt.lookup(pt.info.dtype).fixed_itemsize
    info = TensorInfo(
        pt.name, pt.info.dtype, shape, size * stored, pt.info.shard, pt.info.offset, None
    )
    out = size * _dt.lookup(pt.new_dtype).fixed_itemsize
    return pt.replaced(new_name=new_name, info=info, bytes_out=out, parts=members, sliced=None)


def _split(label: str, pt: PlannedTensor, rule: SplitRule, m: Found) -> list[PlannedTensor]:
    what = f"split {rule.regex.pattern!r}"
    shape = pt.info.shape
    axis = _checked_axis(rule.axis, shape, what, pt, label)
    n = len(rule.into)
    sizes = rule.sizes
    if sizes is None:
        if shape[axis] % n:
            raise CheckpointError(
                f"{what}: axis {axis} of shape {list(shape)} does not split into {n} equal parts",
                path=label,
                tensor=pt.name,
            )
        sizes = (shape[axis] // n,) * n
    elif sum(sizes) != shape[axis]:
        raise CheckpointError(
            f"{what}: sizes {list(sizes)} do not add up to axis {axis} of shape {list(shape)}",
            path=label,
            tensor=pt.name,
        )
    out = []
    start = 0
    for template, size in zip(rule.into, sizes):
        try:
            new = m.expand(template)
        except (re.error, IndexError) as e:
            raise CheckpointError(f"{what} -> {template!r} on {pt.new_name!r}: {e}") from None
        piece = shape[:axis] + (size,) + shape[axis + 1 :]
        members = []
        for mem in _members(pt):
            lo = mem.at[axis]
            hi = lo + mem.box[axis][1] - mem.box[axis][0]
            a, b = max(lo, start), min(hi, start + size)
            if a >= b and size:
                continue
            box = list(mem.box)
            box[axis] = (mem.box[axis][0] + a - lo, mem.box[axis][0] + b - lo)
            at = list(mem.at)
            at[axis] = a - start
            # The piece holding the source tensor's first element checks its checksum.
            first = all(b0 == 0 for b0, _ in box) and mem.verify
            members.append(Member(mem.name, tuple(box), tuple(at), first))
        out.append(_assembled(pt, new, piece, tuple(members)))
        start += size
    return out


def _concat(
    srcs: list[Source], planned: list[PlannedTensor], rule: ConcatRule
) -> list[PlannedTensor]:
    what = f"concat {rule.new!r}"
    index = {pt.new_name: k for k, pt in enumerate(planned)}
    used: set[int] = set()
    made: dict[int, PlannedTensor] = {}
    for k, pt in enumerate(planned):
        m = rule.first.fullmatch(pt.new_name) if k not in used else None
        if m is None:
            continue
        try:
            new = m.expand(rule.new)
            expanded = [m.expand(t) for t in rule.others]
        except (re.error, IndexError) as e:
            raise CheckpointError(f"{what} on {pt.new_name!r}: {e}") from None
        patterns = [Regex.compile(t, f"{what} pattern") for t in expanded]
        group = [k]
        for rx in patterns:
            literal = _literal(rx.pattern)
            if literal is not None:  # a name, looked up rather than matched against all
                found = [index[literal]] if literal in index else []
            else:
                found = [j for name, j in index.items() if rx.fullmatch(name)]
            found = [j for j in found if j not in used and j not in group]
            if len(found) != 1:
                how = "no tensor" if not found else f"{len(found)} tensors"
                raise CheckpointError(
                    f"{what}: {how} named {rx.pattern!r} to join to {pt.new_name!r}",
                    path=srcs[pt.source].label,
                )
            group.append(found[0])
        used.update(group)
        made[k] = _joined(srcs, [planned[j] for j in group], rule, new, what)
    return [made.get(k, pt) for k, pt in enumerate(planned) if k in made or k not in used]


_META = frozenset(".^$*+?{}[]|()\\")


def _literal(pattern: str) -> str | None:
    """The one name ``pattern`` matches whole when it is a name with its
    metacharacters escaped (``h\\.3\\.k``), else None."""
    out = []
    escaped = False
    for ch in pattern:
        if escaped:
            if ch.isalnum():
                return None  # \d, \w, \1...
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in _META:
            return None
        else:
            out.append(ch)
    return None if escaped else "".join(out)


def _joined(
    srcs: list[Source], group: list[PlannedTensor], rule: ConcatRule, new: str, what: str
) -> PlannedTensor:
    first = group[0]
    label = srcs[first.source].label
    axis = _checked_axis(rule.axis, first.info.shape, what, first, label)
    rest = first.info.shape[:axis] + first.info.shape[axis + 1 :]
    for pt in group[1:]:
        shape = pt.info.shape
        if len(shape) != len(first.info.shape) or shape[:axis] + shape[axis + 1 :] != rest:
            raise CheckpointError(
                f"{what}: {pt.new_name!r} {list(shape)} does not join {first.new_name!r} "
                f"{list(first.info.shape)} along axis {axis}",
                path=label,
            )
        if pt.source != first.source:
            raise CheckpointError(f"{what}: its tensors come from different sources", path=label)
        if (pt.info.dtype, pt.new_dtype) != (first.info.dtype, first.new_dtype):
            raise CheckpointError(
                f"{what}: {pt.new_name!r} is {pt.info.dtype} -> {pt.new_dtype}, "
                f"{first.new_name!r} {first.info.dtype} -> {first.new_dtype}",
                path=label,
            )
    members = []
    offset = 0
    for pt in group:
        for mem in _members(pt):
            at = list(mem.at)
            at[axis] += offset
            members.append(mem._replace(at=tuple(at)))
        offset += pt.info.shape[axis]
    shape = first.info.shape[:axis] + (offset,) + first.info.shape[axis + 1 :]
    return _assembled(first, new, shape, tuple(members))
