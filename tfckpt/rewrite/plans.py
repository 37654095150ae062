"""What a plan is: its sources, each output tensor (:class:`PlannedTensor`) and the
whole (:class:`Plan`), the one plan every verb makes and :func:`~tfckpt.execute`
writes. Making one is :mod:`tfckpt.rewrite.planner`'s.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.errors import CheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import Ints, TensorInfo, TensorTable
from tfckpt.format.objectgraph import ObjectGraph
from tfckpt.io.storage import Storage
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.permute import Member
from tfckpt.rewrite.rules import (
    ALLOW_UNMATCHED,
    DtypePolicy,
    Unmatched,
    bookkeeping_kept,
    unmatched_error,
)

if TYPE_CHECKING:
    from tfckpt.rewrite.savedmodel import SavedModelOutput


@dataclass
class Source:
    """One input checkpoint of a transform."""

    label: str
    ckpt: Checkpoint
    graph: ObjectGraph | None
    shard_base: int = 0  # where its shards start in the output, when following its layout
    # (0: laid over the other sources', see planner.follow_source_layouts)


# What a planned tensor has besides its source, names, dtype, size and dtype rule:
# rarely set, so kept per row only where set (a plan of 200 000 tensors has none).
_EXTRAS: dict[str, Any] = {
    # Read back whole, as TF2 restores, even from a source without an object graph.
    "restored_whole": False,
    # Written slice by slice as the sources store it: an average decides when it plans;
    # None leaves it to the engine (:func:`~tfckpt.rewrite.tasks.written_sliced`).
    "sliced": None,
    # Value transforms (see ShapeRules): the axes reordered, and the shape written when
    # it is not the source's.
    "perm": None,
    "shape": None,
    # Made by split or concat (see tfckpt.rewrite.pieces): the boxes of source tensors
    # it is made of; ``name`` is the first one's and ``info`` describes what they make.
    "parts": None,
    # Made by ``tfckpt edit`` (see tfckpt.rewrite.edits): the value written instead of
    # the source's, read in bounded pieces; ``info`` describes what it makes.
    "edit": None,
}


class PlannedTensors(Sequence["PlannedTensor"]):
    """A plan's output tensors as columns, a row each; row ``i`` reads and writes
    through :class:`PlannedTensor` ``self[i]``.

    A plan of 200 000 small tensors would otherwise hold two objects per tensor (the
    planned tensor and its :class:`~tfckpt.format.bundle.TensorInfo`); here it holds a
    few list slots and array items per tensor, and the engine reads columns whole.
    """

    def __init__(self):
        self.source: list[int] = []
        self.name: list[str] = []
        self.new_name: list[str] = []
        self.new_dtype: list[str] = []
        self.bytes_out = array("q")
        self.dtype_by: list[str | None] = []
        # An average's: the weighted mean of every source's value (else read from ``source``).
        self.averaged = bytearray()
        self.infos = TensorTable.empty()  # each row's source tensor, as the index says
        self.extras: dict[int, dict[str, Any]] = {}  # row -> the _EXTRAS set on it

    @classmethod
    def of(cls, rows: Iterable[PlannedTensor]) -> PlannedTensors:
        """The rows given (planned tensors of any tables), in order, as one table."""
        if isinstance(rows, PlannedTensors):
            return rows
        out = cls()
        for pt in rows:
            out.append(pt)
        return out

    def add(
        self,
        source: int,
        name: str,
        new_name: str,
        info: TensorInfo,
        new_dtype: str,
        bytes_out: int,
        **extras,
    ) -> PlannedTensor:
        """A new last row; the planned tensor it is."""
        i = len(self.name)
        self.source.append(source)
        self.name.append(name)
        self.new_name.append(new_name)
        self.new_dtype.append(new_dtype)
        self.bytes_out.append(bytes_out)
        self.dtype_by.append(extras.pop("dtype_by", None))
        self.averaged.append(bool(extras.pop("averaged", False)))
        self.infos.append(info)
        unknown = set(extras) - set(_EXTRAS)
        if unknown:
            raise TypeError(f"unknown planned tensor fields: {', '.join(sorted(unknown))}")
        set_ = {k: v for k, v in extras.items() if v is not _EXTRAS[k]}
        if set_:
            self.extras[i] = set_
        return PlannedTensor.at(self, i)

    def append(self, pt: PlannedTensor) -> None:
        """Add a copy of the planned tensor ``pt`` (of any table) as the last row."""
        self.add(
            pt.source,
            pt.name,
            pt.new_name,
            pt.info,
            pt.new_dtype,
            pt.bytes_out,
            dtype_by=pt.dtype_by,
            averaged=pt.averaged,
            **pt.extras(),
        )

    def take(self, rows: Sequence[int]) -> PlannedTensors:
        """A table of these ``rows``, in this order."""
        out = PlannedTensors()
        out.source = [self.source[i] for i in rows]
        out.name = [self.name[i] for i in rows]
        out.new_name = [self.new_name[i] for i in rows]
        out.new_dtype = [self.new_dtype[i] for i in rows]
        out.bytes_out = array("q", [self.bytes_out[i] for i in rows])
        out.dtype_by = [self.dtype_by[i] for i in rows]
        out.averaged = bytearray(self.averaged[i] for i in rows)
        out.infos = self.infos.take(rows)
        if self.extras:
            at = {old: new for new, old in enumerate(rows)}
            out.extras = {at[i]: dict(e) for i, e in self.extras.items() if i in at}
        return out

    def in_file_order(self) -> PlannedTensors:
        """These rows in reading order: by source, shard, offset, then new name."""
        infos = self.infos
        keys = np.empty((3, len(self)), dtype=np.int64)
        keys[0] = self.source
        keys[1] = _ints(infos.shards, -1)
        keys[2] = _ints(infos.offsets, 0)
        order = np.lexsort(keys[::-1])
        ordered = keys[:, order]
        if (np.diff(ordered, axis=1) == 0).all(axis=0).any():  # ties: the names decide
            rows = sorted(range(len(self)), key=lambda i: (*keys[:, i].tolist(), self.new_name[i]))
            return self.take(rows)
        if (order == np.arange(len(order))).all():
            return self
        return self.take(order.tolist())

    def has_extras(self) -> bool:
        """Whether any row sets one of the rarely set fields (see :data:`_EXTRAS`)."""
        return any(self.extras.values())

    def __len__(self) -> int:
        return len(self.name)

    @overload
    def __getitem__(self, i: int) -> PlannedTensor: ...

    @overload
    def __getitem__(self, i: slice) -> list[PlannedTensor]: ...

    def __getitem__(self, i):
        n = len(self.name)
        if isinstance(i, slice):
            return [PlannedTensor.at(self, k) for k in range(*i.indices(n))]
        if not -n <= i < n:
            raise IndexError(i)
        return PlannedTensor.at(self, i % n)

    def __iter__(self) -> Iterator[PlannedTensor]:
        at = PlannedTensor.at
        return (at(self, i) for i in range(len(self.name)))

    def __repr__(self) -> str:
        return f"<PlannedTensors: {len(self)} rows>"


def _ints(column: Sequence[int | None], none: int) -> np.ndarray:
    """A column of ints or None as an int64 array, None as ``none``."""
    if isinstance(column, Ints):  # None is the least int64 there
        v = column.values()
        return np.where(v == np.iinfo(np.int64).min, none, v)
    return np.array([none if x is None else x for x in column], dtype=np.int64)


def _column(name: str):
    column = attrgetter(name)

    def get(self):
        return column(self._t)[self._i]

    def set_(self, value):
        column(self._t)[self._i] = value

    return property(get, set_)


_NO_EXTRAS: dict[str, Any] = {}


def _extra(name: str):
    default = _EXTRAS[name]

    def get(self):
        return self._t.extras.get(self._i, _NO_EXTRAS).get(name, default)

    def set_(self, value):
        self._t.extras.setdefault(self._i, {})[name] = value

    return property(get, set_)


class PlannedTensor:
    """One output tensor: where it comes from and what it becomes.

    A row of a :class:`PlannedTensors` (its fields read and written there); made on its
    own, a row of a table of one. Fields: ``source`` (the source's number), ``name``
    (in the source), ``new_name``, ``info`` (the source tensor's
    :class:`~tfckpt.format.bundle.TensorInfo`, or what split/concat/edit make),
    ``new_dtype``, ``bytes_out``, ``dtype_by`` (the DtypePolicy label that decided
    ``new_dtype``), and those of :data:`_EXTRAS`.
    """

    __slots__ = ("_t", "_i", "_info")
    _t: PlannedTensors
    _i: int
    _info: TensorInfo | None

    def __init__(
        self,
        source: int,
        name: str,
        new_name: str,
        info: TensorInfo,
        new_dtype: str,
        bytes_out: int,
        **fields,
    ):
        own = PlannedTensors()
        own.add(source, name, new_name, info, new_dtype, bytes_out, **fields)
        self._t, self._i, self._info = own, 0, None

    @classmethod
    def at(cls, table: PlannedTensors, i: int) -> PlannedTensor:
        """Row ``i`` of ``table``."""
        pt = object.__new__(cls)
        pt._t, pt._i, pt._info = table, i, None
        return pt

    source = _column("source")
    name = _column("name")
    new_name = _column("new_name")
    new_dtype = _column("new_dtype")
    bytes_out = _column("bytes_out")
    dtype_by = _column("dtype_by")
    restored_whole = _extra("restored_whole")
    sliced = _extra("sliced")
    perm = _extra("perm")
    shape = _extra("shape")
    parts = _extra("parts")
    edit = _extra("edit")

    @property
    def averaged(self) -> bool:
        """An average's: the weighted mean of every source's value (else read from
        ``source``)."""
        return bool(self._t.averaged[self._i])

    @averaged.setter
    def averaged(self, value: bool) -> None:
        self._t.averaged[self._i] = bool(value)

    @property
    def info(self) -> TensorInfo:
        # Made once per row object: callers read it field by field, often.
        info = self._info
        if info is None:
            info = self._info = self._t.infos.info(self._i)
        return info

    @info.setter
    def info(self, value: TensorInfo) -> None:
        self._t.infos.set(self._i, value)
        self._info = value

    def extras(self) -> dict[str, Any]:
        """The rarely set fields this row sets (a copy)."""
        extras = self._t.extras.get(self._i)
        return {} if extras is None else dict(extras)

    def replaced(self, **changes) -> PlannedTensor:
        """A planned tensor of its own: this one with ``changes``."""
        fields = {
            "source": self.source,
            "name": self.name,
            "new_name": self.new_name,
            "info": self.info,
            "new_dtype": self.new_dtype,
            "bytes_out": self.bytes_out,
            "dtype_by": self.dtype_by,
            "averaged": self.averaged,
            **self.extras(),
            **changes,
        }
        return PlannedTensor(**fields)

    def __repr__(self) -> str:
        return (
            f"PlannedTensor({self.source}, {self.name!r} -> {self.new_name!r}, "
            f"{self.info.dtype} -> {self.new_dtype}, {self.bytes_out} bytes"
            + "".join(f", {k}={v!r}" for k, v in self.extras().items())
            + ")"
        )

    def __eq__(self, other) -> bool:
        if not isinstance(other, PlannedTensor):
            return NotImplemented
        return (self._t is other._t and self._i == other._i) or self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def _fields(self) -> tuple:
        return (
            self.source,
            self.name,
            self.new_name,
            self.info,
            self.new_dtype,
            self.bytes_out,
            self.dtype_by,
            self.averaged,
            sorted(self.extras().items(), key=lambda kv: kv[0]),
        )

    @property
    def out_shape(self) -> tuple[int, ...]:
        """The shape written: the source's, or as the value transforms make it."""
        shape = self.shape
        return self._t.infos.shapes[self._i] if shape is None else shape

    @property
    def renamed(self) -> bool:
        return self.name != self.new_name

    @property
    def cast(self) -> bool:
        return self.info.dtype != self.new_dtype

    def edit_fields(self) -> dict:
        """What ``--dry-run --json`` shows of an edited tensor ({} for others): the kind
        of edit, and the factor of a scale or the elements of a small literal (a graft's
        step count, flatten's Adam powers, a value given to ``edit --set``)."""
        edit = self.edit
        if edit is None:
            return {}
        out: dict = {"edit": type(edit).__name__.lower()}
        factor = getattr(edit, "factor", None)
        data = getattr(edit, "data", None)
        if factor is not None:
            out["scale"] = factor
        elif isinstance(data, bytes) and len(data) <= 64:
            info = self.info
            dtype = _dt.lookup(info.dtype).numpy
            out["value"] = np.frombuffer(data, dtype=dtype).reshape(info.shape).tolist()
        return out


@dataclass
class Plan:
    """What a rewrite will write, decided from the sources' indexes alone; ``execute()``
    writes it and ``to_dict()`` is what ``--dry-run --json`` prints.

    Every verb plans one: a transform (convert, rename, select, merge), a graft or a
    flatten, an average (``weights``: one per source, oldest first; the newest is the
    last), an export (``output``: the files it writes instead of a checkpoint).

    >>> p = tfckpt.plan("train/", "fp16/", cast="float16")
    >>> p.bytes_out, [t.new_name for t in p.tensors][:3]
    """

    sources: list[Source]
    dst: str
    tensors: PlannedTensors  # (a list of PlannedTensor given is made one)
    dropped: list[tuple[str, str, str]]  # (source label, name, reason)
    object_graph: bytes | None
    options: Options  # those it was planned with; execute() writes with them
    storage: Storage = field(repr=False, compare=False)  # where dst is; execute() writes there
    weights: list[float] | None = None  # an average's, one per source
    # An export's files (see tfckpt.interop.export); None: a V2 checkpoint at ``dst``.
    output: Any = field(default=None, repr=False)
    # What the planner says of it (an edit's rows kept from the old vocabulary), and what
    # the user must know: execute() adds ``warnings`` to the summary's.
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # The patterns (option, pattern) that matched no tensor: see check_matched.
    unmatched: list[Unmatched] = field(default_factory=list, repr=False)
    # A SavedModel written around the checkpoint (see tfckpt.rewrite.savedmodel): the
    # checkpoint's final prefix is ``dst``; the SavedModel directories sources were given
    # as (whatever is written); whether this rewrite could have written a SavedModel.
    saved_model: SavedModelOutput | None = None
    from_saved_models: list[str] = field(default_factory=list)
    writes_saved_models: bool = False

    def __post_init__(self):
        self.tensors = PlannedTensors.of(self.tensors)

    def check_matched(self, names: Iterable[str] = (), allow: bool | None = None) -> None:
        """Refuse a plan (unless ``allow``, by default its options' ``allow_unmatched``)
        with patterns that matched no tensor, naming each and the names nearest it (among
        the sources' and ``names``), or one that keeps none of its sources' tensors."""
        if self.options.allow_unmatched if allow is None else allow:
            return
        if self.unmatched:
            raise unmatched_error(
                self.unmatched,
                lambda: (n for s in self.sources for n in [*s.ckpt.keys(), *names]),
                path=self.sources[0].label if len(self.sources) == 1 else None,
            )
        if not len(self.tensors) and self.dropped:
            reasons: dict[str, int] = {}
            for _, _, why in self.dropped:
                reasons[why] = reasons.get(why, 0) + 1
            listed = ", ".join(f"{n} {why}" for why, n in list(reasons.items())[:5])
            raise CheckpointError(
                f"nothing to write: none of the {len(self.dropped)} tensors is kept ({listed}); "
                f"use {ALLOW_UNMATCHED} to write it empty"
            )

    def close(self) -> None:
        """Close the sources (the plan cannot be written after)."""
        for s in self.sources:
            s.ckpt.close()

    @property
    def bytes_in(self) -> int:
        n, tensors = len(self.sources), self.tensors
        averaged = [i for i, a in enumerate(tensors.averaged) if a] if any(tensors.averaged) else []
        nbytes = tensors.infos.nbytes
        return nbytes.total() + (n - 1) * sum(nbytes[i] or 0 for i in averaged)

    @property
    def bytes_out(self) -> int:
        return int(np.frombuffer(self.tensors.bytes_out, dtype=np.int64).sum())

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
        return DtypePolicy.of(self.options).counts(self.tensors.dtype_by)

    def bookkeeping_kept(self) -> dict[str, int]:
        """Per dtype, the tensors of training bookkeeping the cast passes by (see
        :func:`~tfckpt.rewrite.rules.bookkeeping_kept`); {} when none."""
        return bookkeeping_kept(self.tensors.dtype_by, self.tensors.new_dtype)

    def to_dict(self) -> dict:
        if self.weights is not None:
            return self._average_dict()
        counts = self.dtype_rule_counts()
        kept = self.bookkeeping_kept()
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
                    **({"dtype_by": t.dtype_by} if counts is not None or kept else {}),
                    **(
                        {"new_shape": list(t.out_shape), "permute": list(t.perm or []) or None}
                        if t.perm or t.shape is not None
                        else {}
                    ),
                    **({"made_of": _made_of(t.parts)} if t.parts is not None else {}),
                    **t.edit_fields(),
                }
                for t in self.tensors
            ],
            "dropped": [{"source": s, "name": n, "reason": r} for s, n, r in self.dropped],
            "object_graph": self.object_graph is not None,
            "object_graph_copied": self.object_graph_copied,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            **({"dtype_rules": counts} if counts is not None else {}),
            **({"bookkeeping_kept": kept} if kept else {}),
            **({"saved_model": self.saved_model.to_dict()} if self.saved_model else {}),
        }

    def _average_dict(self) -> dict:
        """An average's plan: its weights, and which tensors are averaged or copied."""
        counts = self.dtype_rule_counts()
        kept = self.bookkeeping_kept()
        return {
            "dst": self.dst,
            "sources": [s.label for s in self.sources],
            "weights": self.weights,
            "tensors": [
                {
                    "name": t.name,
                    "new_name": t.new_name,
                    "dtype": t.info.dtype,
                    "new_dtype": t.new_dtype,
                    "shape": list(t.info.shape),
                    "averaged": t.averaged,
                    "bytes_out": t.bytes_out,
                    **({"dtype_by": t.dtype_by} if counts is not None or kept else {}),
                }
                for t in self.tensors
            ],
            "dropped": [{"name": n, "reason": r} for _, n, r in self.dropped],
            "object_graph": self.object_graph is not None,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            **({"dtype_rules": counts} if counts is not None else {}),
            **({"bookkeeping_kept": kept} if kept else {}),
        }


def _made_of(parts: tuple[Member, ...]) -> list[dict]:
    """A split or concat tensor's members, as ``--dry-run --json`` shows them."""
    return [{"name": m.name, "box": [list(b) for b in m.box], "at": list(m.at)} for m in parts]
