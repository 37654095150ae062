"""What a plan is: its sources, each output tensor (:class:`PlannedTensor`) and the
whole (:class:`Plan`), the one plan every verb makes and :func:`~tfckpt.execute`
writes. Making one is :mod:`tfckpt.rewrite.planner`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import TensorInfo
from tfckpt.format.objectgraph import ObjectGraph
from tfckpt.io.storage import Storage
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.permute import Member
from tfckpt.rewrite.rules import DtypePolicy


@dataclass
class Source:
    """One input checkpoint of a transform."""

    label: str
    ckpt: Checkpoint
    graph: ObjectGraph | None
    shard_base: int = 0  # where its shards start in the output, when following its layout
    # (0: laid over the other sources', see planner.follow_source_layouts)


@dataclass(slots=True)  # one per tensor: 200 000 of them in a big plan
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
    # An average's: the weighted mean of every source's value (else read from ``source``).
    averaged: bool = False
    # Written slice by slice as the sources store it: an average decides when it plans;
    # None leaves it to the engine (:func:`~tfckpt.rewrite.tasks.written_sliced`).
    sliced: bool | None = None
    # Value transforms (see ShapeRules): the axes reordered, and the shape written when
    # it is not the source's.
    perm: tuple[int, ...] | None = None
    shape: tuple[int, ...] | None = None
    # Made by split or concat (see tfckpt.rewrite.pieces): the boxes of source tensors
    # it is made of; ``name`` is the first one's and ``info`` describes what they make.
    parts: tuple[Member, ...] | None = None
    # Made by ``tfckpt edit`` (see tfckpt.rewrite.edits): the value written instead of
    # the source's, read in bounded pieces; ``info`` describes what it makes.
    edit: Any = None

    @property
    def out_shape(self) -> tuple[int, ...]:
        """The shape written: the source's, or as the value transforms make it."""
        return self.info.shape if self.shape is None else self.shape

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
        if self.edit is None:
            return {}
        out: dict = {"edit": type(self.edit).__name__.lower()}
        factor = getattr(self.edit, "factor", None)
        data = getattr(self.edit, "data", None)
        if factor is not None:
            out["scale"] = factor
        elif isinstance(data, bytes) and len(data) <= 64:
            dtype = _dt.lookup(self.info.dtype).numpy
            out["value"] = np.frombuffer(data, dtype=dtype).reshape(self.info.shape).tolist()
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
    tensors: list[PlannedTensor]
    dropped: list[tuple[str, str, str]]  # (source label, name, reason)
    object_graph: bytes | None
    options: Options  # those it was planned with; execute() writes with them
    storage: Storage = field(repr=False, compare=False)  # where dst is; execute() writes there
    weights: list[float] | None = None  # an average's, one per source
    # An export's files (see tfckpt.interop.export); None: a V2 checkpoint at ``dst``.
    output: Any = field(default=None, repr=False)

    def close(self) -> None:
        """Close the sources (the plan cannot be written after)."""
        for s in self.sources:
            s.ckpt.close()

    @property
    def bytes_in(self) -> int:
        n = len(self.sources)
        return sum(t.info.nbytes * (n if t.averaged else 1) for t in self.tensors)

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
        if self.weights is not None:
            return self._average_dict()
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
        }

    def _average_dict(self) -> dict:
        """An average's plan: its weights, and which tensors are averaged or copied."""
        counts = self.dtype_rule_counts()
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
                    **({"dtype_by": t.dtype_by} if counts is not None else {}),
                }
                for t in self.tensors
            ],
            "dropped": [{"name": n, "reason": r} for _, n, r in self.dropped],
            "object_graph": self.object_graph is not None,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            **({"dtype_rules": counts} if counts is not None else {}),
        }


def _made_of(parts: tuple[Member, ...]) -> list[dict]:
    """A split or concat tensor's members, as ``--dry-run --json`` shows them."""
    return [{"name": m.name, "box": [list(b) for b in m.box], "at": list(m.at)} for m in parts]
