"""The options of a transform, with their defaults, in one place.

An :class:`Options` has two kinds of fields: what to write (the plan: which
tensors, their names and dtypes, the shards, the destination) and how to write
it (the execution: overflow policy, memory, backend, fsyncs, executor). The
library functions take an ``Options``, keyword arguments that build or amend
one, or both; the command line builds one from its flags.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from tfckpt.errors import CheckpointError
from tfckpt.rewrite.cast import OVERFLOW_POLICIES, OverflowPolicy

Backend = Literal["numpy", "tf", "auto"]  # who rounds: numpy, tf.cast, tf.cast with a GPU
Prefer = Literal["first", "last"]  # which source wins a name present in several
BACKENDS: tuple[str, ...] = get_args(Backend)
PREFER: tuple[str | None, ...] = (None,) + get_args(Prefer)

RenameRules = Sequence[tuple[str, str]] | Mapping[str, str]
Permutes = Sequence[tuple[str, Sequence[int]]]  # ordered (regex, axes)
Reshapes = Sequence[tuple[str, Sequence[int]]]  # ordered (regex, shape), -1 once at most
# Ordered (regex, axis, new names) or (regex, axis, new names, sizes).
Splits = Sequence[tuple[Any, ...]]
Concats = Sequence[tuple[str, int, Sequence[str]]]  # (new name, axis, regexes)
DtypeRules = Sequence[tuple[str, str]] | Mapping[str, str]  # ordered regex -> dtype

MEMORY_BUDGET = 64 << 20  # tensor bytes in flight per shard task
DEFAULT_TF_THRESHOLD = 64 << 20  # the smallest tensor the tf backend casts

PLAN, EXECUTION = "plan", "execution"
# The options that are numbers of bytes: (name, the least value, whether None is allowed).
SIZES = (("max_shard_bytes", 1, True), ("chunk_bytes", 1, False), ("tf_threshold", 0, False))


def _plan(default: Any = None) -> Any:
    return field(default=default, metadata={"stage": PLAN})


def _execution(default: Any = None, **kw) -> Any:
    return field(default=default, metadata={"stage": EXECUTION}, **kw)


@dataclass(frozen=True)
class Options:
    """Every option of :func:`tfckpt.transform` and its helpers, with its default.

    What to write (fixed by :func:`tfckpt.plan`):

    - ``include`` / ``exclude``: regexes (``re.search`` on source names); include
      first, then exclude.
    - ``drop_objects``: TF2 objects to cut from the object graph: a bare name cuts
      every edge with that local name, ``a/b/c`` exactly that path; nodes left
      unreachable go with their tensors.
    - ``rename``: ordered ``{regex: replacement}`` (or pairs), matched at the start
      of the name; the first match applies. ``rename_exact``: ``{old: new}``, tried
      first. TF2 object graphs are re-keyed to match.
    - ``name_map``: ordered ``[(regex, template)]`` matched against whole source names
      (after ``rename_exact``, before ``rename``): the first match names the tensor
      ``match.expand(template)``. Given any, every kept tensor must match one (or
      ``rename_exact``): the others are an error listing them all, or with
      ``allow_unmapped`` left out (dropped as ``'no name_map rule'``).
    - ``allow_unmatched``: without it (the default) a pattern of ``include``,
      ``exclude``, ``rename``, ``name_map``, ``keep_dtype`` or ``dtype_rules``, or an
      old name of ``rename_exact``, that matches no tensor is an error naming it and
      the nearest names, and so is a plan that keeps none of its sources' tensors.
      Patterns are RE2's, matched in linear time (see :mod:`tfckpt.rewrite.regex`).
    - ``cast``: target dtype for floating-point tensors; ``cast_from`` narrows
      which source dtypes.
    - ``cast_bookkeeping``: ``cast`` casts training bookkeeping too (metrics' state,
      an optimizer's step, learning rate and other hyperparameters, ``save_counter``,
      TF1's ``global_step`` and Adam's ``beta1_power``/``beta2_power``; see
      :mod:`tfckpt.format.bookkeeping`), which by default keeps its dtype, as TensorFlow
      keeps it in a model of any dtype. Keep patterns and rules apply to it either way.
    - ``keep_dtype``: regexes (``re.search`` on source names): matching tensors keep
      their dtype whatever the other cast options say.
    - ``dtype_rules``: ordered ``{regex: dtype}`` (or pairs), ``re.search`` on source
      names; the first matching rule casts a floating-point tensor (narrower or
      wider), before ``cast``. ``cast_from`` narrows only ``cast``.
    - ``permute``: ordered ``[(regex, axes)]``, ``re.search`` on new names: the first
      match reorders the tensor's axes (``('kernel$', (1, 0))`` transposes a matrix).
    - ``reshape``: ordered ``[(regex, shape)]`` (one ``-1`` allowed), then ``squeeze``:
      regexes whose tensors lose their axes of size 1; on new names, after
      ``permute``: the elements keep their order, only the shape changes. These value
      transforms take numeric and bool tensors, written whole.
    - ``split``: ordered ``[(regex, axis, [new, ...])]`` (sizes as a fourth item; equal
      parts without): the first whose regex is found in a tensor's new name cuts it
      along ``axis`` into tensors named by the templates expanded with the match.
      ``concat``: ``[(new, axis, [regex, other, ...])]``: each tensor the first regex
      matches whole is joined along ``axis``, in order, with those the others name
      once expanded with its match; ``new`` names the result. Both act before
      ``permute`` (see :mod:`tfckpt.rewrite.pieces`); not for a TF2 output.
    - ``prefer``: which source wins a name present in several (default: error).
    - ``max_shard_bytes``: re-shard; by default the sources' shard layout is kept.
    - ``overwrite``: replace an existing checkpoint (or SavedModel) at the destination.
    - ``checkpoint_only``: from a SavedModel directory to a directory, write its variables
      alone, as a checkpoint (``DST/variables``), not a SavedModel (see
      :mod:`tfckpt.rewrite.savedmodel`).

    How to write it (used by :func:`tfckpt.execute`):

    - ``overflow``: values beyond the target's range: ``'error'`` (nothing is
      written), ``'clip'`` (largest finite value) or ``'inf'`` (IEEE).
    - ``chunk_bytes``: the memory budget for tensor data in flight per task.
    - ``backend``: ``'numpy'``, ``'tf'`` (``tf.cast`` on the best device for
      tensors of at least ``tf_threshold`` bytes) or ``'auto'`` (tf only with a GPU).
    - ``durable``: fsync before the commit; ``False`` skips it (see
      :class:`~tfckpt.BundleWriter`).
    - ``executor``: where the shard tasks run: None (here), a
      ``concurrent.futures`` executor or a Dask ``Client``.

    >>> opts = tfckpt.Options(cast="float16", overflow="clip", exclude=["/Adam"])
    >>> tfckpt.transform("ckpt/model", "out/", opts)
    """

    include: str | Sequence[str] | None = _plan()
    exclude: str | Sequence[str] | None = _plan()
    drop_objects: Sequence[str] = _plan(())
    rename: RenameRules | None = _plan()
    rename_exact: Mapping[str, str] | None = _plan()
    name_map: RenameRules = _plan(())
    allow_unmapped: bool = _plan(False)
    allow_unmatched: bool = _plan(False)
    cast: str | None = _plan()
    cast_from: Sequence[str] | None = _plan()
    cast_bookkeeping: bool = _plan(False)
    keep_dtype: str | Sequence[str] = _plan(())
    dtype_rules: DtypeRules = _plan(())
    permute: Permutes = _plan(())
    reshape: Reshapes = _plan(())
    squeeze: str | Sequence[str] = _plan(())
    split: Splits = _plan(())
    concat: Concats = _plan(())
    prefer: Prefer | None = _plan()
    max_shard_bytes: int | None = _plan()
    overwrite: bool = _plan(False)
    checkpoint_only: bool = _plan(False)

    overflow: OverflowPolicy = _execution("error")
    chunk_bytes: int = _execution(MEMORY_BUDGET)
    backend: Backend = _execution("numpy")
    tf_threshold: int = _execution(DEFAULT_TF_THRESHOLD)
    durable: bool = _execution(True)
    executor: Any = _execution(None, compare=False, repr=False)

    def __post_init__(self):
        if self.prefer not in PREFER:
            raise CheckpointError(f"prefer must be 'first' or 'last', not {self.prefer!r}")
        if self.overflow not in OVERFLOW_POLICIES:
            raise CheckpointError(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}")
        if self.backend not in BACKENDS:
            raise CheckpointError(f"backend must be one of {', '.join(BACKENDS)}")
        for name, minimum, optional in SIZES:
            value = getattr(self, name)
            if value is None and optional:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Integral)
                or value < minimum
            ):
                raise CheckpointError(
                    f"{name} must be a whole number of bytes >= {minimum}"
                    f"{' (or None)' if optional else ''}, not {value!r}"
                )

    @classmethod
    def of(cls, options: Options | None = None, stage: str | None = None, **changes) -> Options:
        """``options`` (or the defaults) with ``changes``; with ``stage``, only its fields.

        >>> Options.of(None, cast="float16").cast
        'float16'
        """
        base = cls() if options is None else options
        if stage is not None:
            other = sorted(
                set(changes) & set(cls.fields(PLAN if stage == EXECUTION else EXECUTION))
            )
            if other:
                raise TypeError(f"{', '.join(other)}: not {stage} option(s)")
        return dataclasses.replace(base, **changes) if changes else base

    @classmethod
    def fields(cls, stage: str) -> tuple[str, ...]:
        """The names of the fields of ``stage`` (``'plan'`` or ``'execution'``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata["stage"] == stage)


DEFAULTS = Options()
