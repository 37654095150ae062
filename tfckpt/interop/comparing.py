"""Proof of a conversion: an output checked, bit for bit, against what its plan says.

:func:`compare` takes the plan of a rewrite or an export (the same map, value
transforms and casts) and the output that rewrite made (a checkpoint, safetensors
files or an npz), reads what each output tensor should hold from the sources through
the engine's own pipeline (:func:`~tfckpt.rewrite.streaming.stream_items`: split,
concat, permute, reshape, cast, in bounded chunks), and compares it with the output
chunk by chunk. :class:`Proof` is the finding: tensors equal, tensors that differ (and
where), tensors missing or unexpected, and every source tensor the output does not
account for. :func:`tfckpt.interop.proof.verify_against` makes the plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.errors import CheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY
from tfckpt.interop.importing import TensorFileSource, stored_tensors
from tfckpt.io.storage import Storage
from tfckpt.rewrite.cast import CastCountTable
from tfckpt.rewrite.plans import Plan
from tfckpt.rewrite.rules import UNMAPPED
from tfckpt.rewrite.streaming import TaskItem, stream_items
from tfckpt.rewrite.tasks import task_item, written_sliced

TENSOR_FILES = (".safetensors", ".safetensors.index.json", ".npz")
# What a model directory holds, in the order looked for.
MODEL_FILES = ("model.safetensors.index.json", "model.safetensors")


@dataclass
class Proof:
    """What :func:`compare` found. ``ok``: every output tensor equals, bit for bit,
    what the plan makes of the sources, and every source tensor is accounted for
    (written, or left out by a rule: ``left_out``)."""

    source: str
    against: str
    checked: int = 0  # output tensors found equal
    bytes: int = 0  # their bytes
    mismatched: list[tuple[str, str]] = field(default_factory=list)  # (output name, how)
    missing: list[str] = field(default_factory=list)  # output names the output lacks
    unexpected: list[str] = field(default_factory=list)  # output names no source makes
    unaccounted: list[tuple[str, str]] = field(default_factory=list)  # (source name, why)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (source name, rule)
    # A model directory's config.json: why transformers does not load it (a preset's).
    config_problems: list[str] = field(default_factory=list)
    config_note: str | None = None  # what loading it found, where it was loaded

    @property
    def ok(self) -> bool:
        return self.written_ok and not self.unaccounted

    @property
    def written_ok(self) -> bool:
        """Every tensor written is what it should be (and none is missing), and the
        config, where one was checked, loads."""
        return not (self.mismatched or self.missing or self.unexpected or self.config_problems)

    def problems(self, *, unaccounted: bool = True) -> list[str]:
        """One line per finding that makes the proof fail (``unaccounted=False``: but
        the source tensors the output lacks by the user's leave)."""
        return (
            [f"{self.against}: {name}: {how}" for name, how in self.mismatched]
            + [f"{self.against}: {name}: missing" for name in self.missing]
            + [f"{self.against}: {name}: no source tensor makes it" for name in self.unexpected]
            + self.config_problems
            + [
                f"{self.source}: {name}: not in the output ({why})"
                for name, why in (self.unaccounted if unaccounted else [])
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "against": self.against,
            "ok": self.ok,
            "checked": self.checked,
            "bytes": self.bytes,
            "mismatched": [{"name": n, "how": h} for n, h in self.mismatched],
            "missing": self.missing,
            "unexpected": self.unexpected,
            "unaccounted": [{"name": n, "why": w} for n, w in self.unaccounted],
            "left_out": [{"name": n, "why": w} for n, w in self.left_out],
            "config_problems": self.config_problems,
            "config": self.config_note,
        }


def output_path(store: Storage, out: str) -> str:
    """What :func:`open_output` opens for ``out``: a model directory's index or file; a
    directory without one as itself (a checkpoint's directory, opened as one)."""
    if out.endswith(TENSOR_FILES) or not store.isdir(out):
        return out
    for name in MODEL_FILES:
        path = store.join(out, name)
        if store.isfile(path):
            return path
    return out


def open_output(store: Storage, out: str, storage_options=None):
    """The output to check: safetensors files (an index and its shards, or one file) or
    an npz as :class:`~tfckpt.interop.importing.TensorFileSource`, else a checkpoint (a
    directory's latest)."""
    path = output_path(store, out)
    if path.endswith(TENSOR_FILES):
        return TensorFileSource(store, stored_tensors(store, path))
    try:
        return open_checkpoint(path, storage_options=storage_options)
    except CheckpointError as e:
        if path != out or not store.isdir(out) or type(e) is not CheckpointError:
            raise
        raise CheckpointError(
            f"no {' or '.join(MODEL_FILES)} in this directory, and no checkpoint ({e.detail})",
            path=out,
        ) from None


def planned_items(p: Plan) -> list[TaskItem]:
    """What each output tensor of ``p`` is, as the pipeline streams it: an export's
    tensors whole, a checkpoint's slice by slice where it keeps them sliced."""
    if p.weights is not None:
        raise CheckpointError("an average's output cannot be checked against its sources")
    if p.output is not None:
        return [o.item for _, outs in p.output.files for o in outs]
    items = []
    for t in p.tensors:
        if t.info.slices and written_sliced(p, t):
            target = _dt.lookup(t.new_dtype)
            ckpt = p.sources[t.source].ckpt
            for sl in ckpt.slice_info(t.name):
                out = sl.nbytes if not t.cast else sl.size * target.fixed_itemsize
                items.append(task_item(t, sl.extents, sl.nbytes, out))
        else:
            items.append(task_item(t, None, t.info.nbytes, t.bytes_out))
    return items


def compare(p: Plan, output, against: str, *, chunk_bytes: int | None = None) -> Proof:
    """Check ``output`` (opened by :func:`open_output`; named ``against``) against the
    plan ``p`` whose sources are open: see the module's text."""
    proof = Proof(p.sources[0].label if len(p.sources) == 1 else p.dst, against)
    chunk = chunk_bytes or p.options.chunk_bytes
    items = planned_items(p)
    expected = {i.new_name for i in items}
    present = set(output.keys()) - {OBJECT_GRAPH_KEY}
    proof.unexpected = sorted(present - expected)
    skipped = p.output.skipped if p.output is not None else []
    for _, name, why in p.dropped:
        (proof.unaccounted if why == UNMAPPED else proof.left_out).append((name, why))
    proof.left_out += [(n, why) for n, why in skipped if not why.startswith(UNMAPPED)]
    streamed: list[TaskItem] = []
    for item in items:
        if item.new_name not in present:
            if item.new_name not in proof.missing:
                proof.missing.append(item.new_name)
                proof.unaccounted.append((item.name, f"{item.new_name} missing"))
            continue
        how = _differs_in_kind(item, output.info(item.new_name))
        if how is not None:
            proof.mismatched.append((item.new_name, how))
        elif _dt.lookup(item.dtype) is _dt.STRING or _dt.lookup(item.dtype).numpy is None:
            _compare_stored(p, item, output, proof)
        else:
            streamed.append(item)
    sink = _ComparingSink(output, proof, chunk)
    ckpts = {i: s.ckpt for i, s in enumerate(p.sources)}
    stream_items(
        streamed,
        ckpts,
        sink,
        overflow=p.options.overflow,
        chunk_bytes=chunk,
        endianness="little",
        counts=CastCountTable(),
    )
    return proof


def _differs_in_kind(item: TaskItem, info) -> str | None:
    """How the output's tensor differs in dtype or shape from the planned one, if it does."""
    shape = item.shape if item.extents else item.out_shape
    if info.dtype != item.new_dtype:
        return f"dtype {info.dtype}, expected {item.new_dtype}"
    if tuple(info.shape) != tuple(shape):
        return f"shape {list(info.shape)}, expected {list(shape)}"
    return None


def _compare_stored(p: Plan, item: TaskItem, output, proof: Proof) -> None:
    """A string or opaque tensor, which the engine copies as it is: compared whole."""
    src = p.sources[item.source].ckpt
    if item.extents:
        same = src.read_bytes(item.name, item.extents) == output.read_bytes(
            item.new_name, item.extents
        )
    elif _dt.lookup(item.dtype) is _dt.STRING:
        same = list(src[item.name].reshape(-1)) == list(output[item.new_name].reshape(-1))
    else:
        same = src.read_bytes(item.name) == output.read_bytes(item.new_name)
    if same:
        proof.checked += 1
        proof.bytes += item.bytes_out
    else:
        proof.mismatched.append((item.new_name, "its stored values differ"))


class _ComparingSink:
    """The sink of :func:`~tfckpt.rewrite.streaming.stream_items` that compares what it
    is handed with the output's tensor of the same name, chunk by chunk."""

    def __init__(self, output, proof: Proof, chunk_bytes: int):
        self._output = output
        self._proof = proof
        self._read_bytes = max(chunk_bytes // 8, 1 << 16)
        self._item: TaskItem | None = None
        self._got: Iterator[np.ndarray] = iter(())
        self._held = np.empty(0, np.uint8)
        self._pos = 0  # elements compared
        self._bad = False

    def write(self, op: tuple) -> None:
        kind, item = op[0], op[1]
        if kind == "open":
            self._open(item)
        elif kind == "write":
            self._compare(op[2])
        elif kind == "close":
            self._close()
        elif kind == "batch":
            for one, data in zip(item, op[2]):
                self._open(one)
                self._compare(data)
                self._close()
        else:  # strings and opaque tensors are compared apart (see compare)
            raise AssertionError(kind)

    def _open(self, item: TaskItem) -> None:
        self._item, self._pos, self._bad = item, 0, False
        self._held = np.empty(0, np.uint8)
        self._got = self._output.iter_chunks(item.new_name, self._read_bytes, extents=item.extents)

    def _take(self, nbytes: int) -> np.ndarray:
        """The output's next ``nbytes`` bytes (fewer at its end)."""
        parts, have = [self._held], self._held.size
        while have < nbytes:
            chunk = next(self._got, None)
            if chunk is None:
                break
            raw = np.ascontiguousarray(chunk).reshape(-1).view(np.uint8)
            parts.append(raw.copy())
            have += raw.size
        joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self._held = joined[nbytes:]
        return joined[:nbytes]

    def _compare(self, data: np.ndarray) -> None:
        assert self._item is not None
        data = np.ascontiguousarray(data).reshape(-1)
        if self._bad:
            self._pos += data.size
            return
        want = data.view(np.uint8)
        got = self._take(want.size)
        if got.size < want.size:
            self._fail(f"ends at element {self._pos + got.size // max(data.itemsize, 1)}")
        elif not np.array_equal(got, want):
            first = int(np.flatnonzero(got != want)[0]) // data.itemsize
            value = got[first * data.itemsize : (first + 1) * data.itemsize].view(data.dtype)[0]
            self._fail(f"element {self._pos + first} is {value!r}, expected {data[first]!r}")
        self._pos += data.size

    def _close(self) -> None:
        item = self._item
        assert item is not None
        if not self._bad and (self._held.size or next(self._got, None) is not None):
            self._fail(f"holds more than {self._pos} elements")
        if not self._bad:
            self._proof.checked += 1
            self._proof.bytes += item.bytes_out
        self._item = None

    def _fail(self, how: str) -> None:
        assert self._item is not None
        self._bad = True
        self._proof.mismatched.append((self._item.new_name, how))
