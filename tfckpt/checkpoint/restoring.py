"""Whether a restore would succeed, decided from a checkpoint's index before anything runs.

Whatever restores a checkpoint — a TF1 ``Saver``, ``tf.train.Checkpoint``,
:func:`tfckpt.restore`, :func:`tfckpt.keras.load_weights` — is described here by what it
reads: one :class:`Wanted` per value, naming the checkpoint tensor, the dtype and shape
it wants and, for a partition of a TF1 partitioned variable, the part. Those who know a
kind of target build the list (:mod:`tfckpt.inspection.check` from graph files and
checkpoints, :mod:`tfckpt.tf` from live variables, :mod:`tfckpt.keras` from a model);
:func:`check_restore` holds it against the checkpoint and says, in one
:class:`RestoreCheck`, everything that would make the restore fail, and what the
checkpoint holds that nothing reads.

Two restorers are told apart. TensorFlow wants every dtype exactly, checks shapes where
the assignment does, and reassembles a tensor from slices other than the stored ones only
for some dtypes (:data:`~tfckpt.format.slices.TF_SLICE_COPYABLE`). tfckpt's own restores
cast floating-point values to the variable's dtype and read partitioned tensors whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Container, Iterable
from dataclasses import asdict, dataclass, field
from typing import Literal

from tfckpt.errors import CheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import TensorInfo
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY, attribute_tensors
from tfckpt.format.slices import TF_SLICE_COPYABLE, Slice, format_slice, num_elements

Restorer = Literal["tensorflow", "tfckpt"]
RESTORERS: tuple[Restorer, ...] = ("tensorflow", "tfckpt")
FindingKind = Literal["missing", "dtype", "shape", "slices", "unused"]
SHOWN = 10  # problems an error message names; the check lists them all


@dataclass(frozen=True)
class Wanted:
    """One value a restore reads.

    ``key`` is the checkpoint tensor (None: the target found none to read, ``why``
    says why); ``variable`` how the target calls what receives it. ``dtype`` and
    ``shape`` are what it wants (None: anything; a None dimension: any size); for a
    partition (``slice`` given) ``shape`` is the whole tensor's. ``validate_shape``
    False: the assignment takes any shape (a TF1 resource variable restored by a
    ``Saver`` then changes shape). ``exact_shape`` False: only the dtype is checked
    (a lookup table's contents have any length).
    """

    key: str | None
    variable: str
    dtype: str | None = None
    shape: tuple[int | None, ...] | None = None
    slice: Slice | None = None
    validate_shape: bool = True
    exact_shape: bool = True
    why: str | None = None


@dataclass(frozen=True)
class Finding:
    """One thing :func:`check_restore` found: ``fails`` says whether it makes the restore
    fail; ``castable`` whether a cast of the checkpoint's floating-point values fixes it."""

    kind: FindingKind
    tensor: str | None
    variable: str | None
    detail: str
    fails: bool
    checkpoint_dtype: str | None = None
    checkpoint_shape: list[int] | None = None
    target_dtype: str | None = None
    target_shape: list[int | None] | None = None
    castable: bool = False


@dataclass
class RestoreCheck:
    """What a restore of ``checkpoint`` into ``target`` would do.

    ``ok`` when it would succeed; ``findings`` lists every problem (``fails``) and
    every warning or piece of information: values the target wants that are missing
    or mismatched, and (``unused``) tensors nothing reads. ``cast_command`` is the
    ``tfckpt convert`` run that fixes the dtype mismatches a cast fixes.

    >>> result = check_restore(ckpt, [Wanted("dense/kernel", "dense/kernel", "float32", (4, 3))],
    ...                        target="model.meta")
    >>> result.ok, [f.detail for f in result.failures()]
    """

    checkpoint: str
    target: str
    restorer: Restorer
    wanted: int
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cast_command: str | None = None

    @property
    def ok(self) -> bool:
        return not any(f.fails for f in self.findings)

    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.fails]

    def count(self, kind: FindingKind) -> int:
        return sum(f.kind == kind for f in self.findings)

    def to_dict(self) -> dict:
        return {
            "checkpoint": self.checkpoint,
            "target": self.target,
            "restorer": self.restorer,
            "ok": self.ok,
            "wanted": self.wanted,
            "failures": len(self.failures()),
            "findings": [asdict(f) for f in self.findings],
            "notes": list(self.notes),
            "cast_command": self.cast_command,
        }

    def error(self, what: str) -> CheckpointError:
        """One :class:`~tfckpt.CheckpointError` naming every failure (the first few by
        name, then how many more): ``what`` begins the message."""
        failures = self.failures()
        lines = [f.detail for f in failures[:SHOWN]]
        if len(failures) > SHOWN:
            lines.append(f"{len(failures) - SHOWN} more")
        tensor = failures[0].tensor if len(failures) == 1 else None
        return CheckpointError(f"{what}: " + "; ".join(lines), path=self.checkpoint, tensor=tensor)


@dataclass
class Expectation:
    """What a restore reads from one checkpoint: the values (``wanted``), the tensors a
    restore that must consume everything must read (None: all of them), notes, and
    ``problems`` the restorer has that no value stands for (a Keras HDF5 file of another
    layer count): findings added as they are, their tensors not listed as unused."""

    wanted: list[Wanted]
    consumable: set[str] | None = None
    notes: list[str] = field(default_factory=list)
    problems: list[Finding] = field(default_factory=list)


def check_restore(
    ckpt,
    wanted: Iterable[Wanted],
    *,
    target: str,
    restorer: Restorer = "tensorflow",
    allow_missing: bool = False,
    assert_consumed: bool = False,
    reshape: bool = False,
    consumable: Container[str] | None = None,
) -> RestoreCheck:
    """Hold what a restore reads (``wanted``) against the checkpoint ``ckpt``.

    ``allow_missing``: a value the checkpoint lacks is information, not a failure
    (``expect_partial()``). ``assert_consumed``: a tensor nothing reads fails the
    restore (``assert_consumed()``), of those in ``consumable`` when given (for TF2
    checkpoints: the tensors its object graph names). ``reshape``: a value of another
    shape with as many elements is taken (``Saver(reshape=True)``).
    """
    wanted = list(wanted)
    result = RestoreCheck(ckpt.prefix, target, restorer, len(wanted))
    read: set[str] = set()
    casts: dict[str, str] = {}
    for w in wanted:
        tensors = _tensors(w, ckpt)
        if tensors is None:
            result.findings.append(_missing(w, allow_missing))
            continue
        read.update(tensors)
        if tensors != (w.key,):
            continue  # a saveable of several tensors (a table): named, not typed
        assert w.key is not None
        info = ckpt.info(w.key)
        found = _compare(w, info, restorer, reshape)
        result.findings.extend(found)
        if any(f.kind == "dtype" and f.castable for f in found) and w.dtype is not None:
            casts[w.key] = w.dtype
    for name in ckpt.keys():
        if name == OBJECT_GRAPH_KEY or name in read:
            continue
        named = consumable is None or name in consumable
        result.findings.append(
            Finding(
                "unused",
                name,
                None,
                f"{name}: in the checkpoint, read by nothing",
                fails=assert_consumed and named,
            )
        )
    result.cast_command = _cast_command(ckpt.prefix, casts, wanted)
    return result


def _tensors(w: Wanted, ckpt) -> tuple[str, ...] | None:
    """The tensors TensorFlow reads for ``w``: its key, or the key plus suffixes of a
    saveable stored as several tensors; None when they are not all there."""
    if w.key is None:
        return None
    names = attribute_tensors(w.key, ckpt)
    return names if all(n in ckpt for n in names) else None


def _missing(w: Wanted, allowed: bool) -> Finding:
    why = w.why or f"the checkpoint has no tensor {w.key!r}"
    return Finding(
        "missing",
        w.key,
        w.variable,
        f"no value for {w.variable}: {why}",
        fails=not allowed,
        target_dtype=w.dtype,
        target_shape=None if w.shape is None else list(w.shape),
    )


def _compare(w: Wanted, info: TensorInfo, restorer: Restorer, reshape: bool) -> list[Finding]:
    out = []

    def finding(kind: FindingKind, detail: str, fails: bool, castable: bool = False) -> None:
        out.append(
            Finding(
                kind,
                info.name,
                w.variable,
                detail,
                fails,
                checkpoint_dtype=info.dtype,
                checkpoint_shape=list(info.shape),
                target_dtype=w.dtype,
                target_shape=None if w.shape is None else list(w.shape),
                castable=castable,
            )
        )

    if w.dtype is not None and w.dtype != info.dtype:
        have, want = _dt.lookup(info.dtype), _dt.lookup(w.dtype)
        castable = have.is_floating and want.is_floating
        integral = {have.kind, want.kind} <= {"int", "uint", "bool"}
        # tfckpt casts floats, and converts integers whose values fit (checked on reading).
        fails = restorer == "tensorflow" or not (castable or integral)
        how = "a cast fixes it" if castable else "no cast fixes it"
        finding(
            "dtype",
            f"cannot restore {info.dtype} into {w.dtype} variable {w.variable!r} "
            f"(tensor {info.name!r}; {how})",
            fails,
            castable,
        )
    if w.shape is not None and w.exact_shape:
        shape_problem = _shape_problem(w, info, reshape)
        if shape_problem is not None:
            detail, fails = shape_problem
            finding("shape", detail, fails)
            return out
    slices_problem = _slices_problem(w, info, restorer)
    if slices_problem is not None:
        finding("slices", slices_problem, True)
    return out


def _fits(shape: tuple[int, ...], want: tuple[int | None, ...]) -> bool:
    return len(shape) == len(want) and all(w is None or w == d for d, w in zip(shape, want))


def _shape_problem(w: Wanted, info: TensorInfo, reshape: bool) -> tuple[str, bool] | None:
    assert w.shape is not None
    have = tuple(info.shape)
    if _fits(have, w.shape):
        return None
    if w.slice is not None:
        # A partition's restore op checks the whole tensor's shape itself.
        return (
            f"shape {list(have)} in the checkpoint, {list(w.shape)} for the partitioned "
            f"variable {w.key!r}: its partition {w.variable!r} cannot read "
            f"[{format_slice(w.slice)}] of it",
            True,
        )
    shown = f"shape {list(have)} in the checkpoint, {list(w.shape)} in variable {w.variable!r}"
    known = None not in w.shape
    same_size = known and num_elements(have) == math.prod(d or 0 for d in w.shape)
    if reshape and same_size:
        return None
    if not w.validate_shape:
        return (
            f"{shown}: the restore takes it and the variable changes shape "
            "(its assignment does not check shapes)",
            False,
        )
    hint = " (as many elements: pass reshape=True to reshape it)" if same_size else ""
    return f"{shown}{hint}", True


def _extents(slice_: Slice, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """A slice as (start, end) per axis."""
    return tuple((s, d if n is None else s + n) for (s, n), d in zip(slice_, shape))


def _slices_problem(w: Wanted, info: TensorInfo, restorer: Restorer) -> str | None:
    """Why the part ``w`` reads cannot be had from the slices the checkpoint stores."""
    shape = tuple(info.shape)
    whole = tuple((0, d) for d in shape)
    asked = whole if w.slice is None or restorer == "tfckpt" else _extents(w.slice, shape)
    stored = [_extents(s, shape) for s in info.slices] if info.slices else [whole]
    covered = sum(
        math.prod(max(0, min(e, b) - max(s, a)) for (s, e), (a, b) in zip(part, asked))
        for part in stored
    )
    if covered < math.prod(b - a for a, b in asked):
        what = "the tensor" if asked == whole else f"the slice {_spec(asked)}"
        return (
            f"{info.name}: the checkpoint stores only part of it, not all of {what} "
            f"that {w.variable!r} reads"
        )
    if restorer == "tensorflow" and info.dtype not in TF_SLICE_COPYABLE:
        # TensorFlow copies other dtypes only from a stored slice spelled as the one
        # asked for ("-" and "0,N" differ), or a whole tensor asked for whole.
        full = tuple((0, None) for _ in shape)
        spelled = list(info.slices) or [full]
        asking = w.slice if w.slice is not None else full
        if not any(
            s == asking or (_is_full(s, shape) and _is_full(asking, shape)) for s in spelled
        ):
            listed = ", ".join(f"[{format_slice(s)}]" for s in spelled[:4])
            return (
                f"{info.name}: TensorFlow cannot assemble {info.dtype} values from other "
                f"slices than those stored ({listed}{', ...' if len(spelled) > 4 else ''}), "
                f"and {w.variable!r} reads [{format_slice(asking)}]"
            )
    return None


def _is_full(extents: Slice, shape: tuple[int, ...]) -> bool:
    return all(n is None or (s == 0 and n == d) for (s, n), d in zip(extents, shape))


def _spec(extents: tuple[tuple[int, int], ...]) -> str:
    return "[" + format_slice(tuple((s, e - s) for s, e in extents)) + "]" if extents else "[]"


def _cast_command(prefix: str, casts: dict[str, str], wanted: list[Wanted]) -> str | None:
    """The ``tfckpt convert`` that writes the castable tensors in the dtypes wanted: one
    ``--dtype`` when the target wants all its floating-point values in one dtype, else a
    ``--dtype-rule`` per dtype naming its tensors."""
    if not casts:
        return None
    floats = {w.dtype for w in wanted if w.dtype is not None and _dt.lookup(w.dtype).is_floating}
    command = f"tfckpt convert {_quoted(prefix)} OUT"
    if len(floats) == 1:
        return f"{command} --dtype {floats.pop()}"
    rules: dict[str, list[str]] = {}
    for name, dtype in casts.items():
        rules.setdefault(dtype, []).append(re.escape(name))
    return command + "".join(
        f" --dtype-rule {_quoted('^(' + '|'.join(names) + ')$=' + dtype)}"
        for dtype, names in rules.items()
    )


def _quoted(text: str) -> str:
    if re.fullmatch(r"[\w./:=-]+", text):
        return text
    return "'" + text.replace("'", "'\\''") + "'"
