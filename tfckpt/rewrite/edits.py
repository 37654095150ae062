"""Edited values: what ``tfckpt edit`` writes in place of a tensor's stored value, and
how the engine reads it in bounded pieces.

A planned tensor carrying an :data:`Edit` (see :class:`~tfckpt.rewrite.plans.PlannedTensor`)
is streamed by :func:`edit_chunks` instead of being copied: a constant (:class:`Fill`),
the source scaled (:class:`Scale`), a small literal (:class:`Literal`), a ``.npy`` file
read by ranges through a memory map (:class:`NpyFile`), or the source's rows along one
axis reordered, cut and grown (:class:`Rows`: ``--resize``, ``--remap-rows``). Each
piece holds at most the read budget of elements, whatever the tensor's size.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from tfckpt.errors import CheckpointError, flag
from tfckpt.format import dtypes as _dt
from tfckpt.io.storage import open_regular
from tfckpt.rewrite.pipeline import BufferRing


@dataclass(frozen=True)
class Fill:
    """Every element ``value`` (already checked to fit the dtype)."""

    value: Any


@dataclass(frozen=True)
class Scale:
    """The source's value times ``factor``, computed in float64 and rounded once."""

    factor: float


@dataclass(frozen=True)
class Literal:
    """A value given on the command line: its bytes in the tensor's dtype, row-major."""

    data: bytes


@dataclass(frozen=True)
class NpyFile:
    """The array of a ``.npy`` file (no pickles), cast to the tensor's dtype without loss."""

    path: str


@dataclass(frozen=True)
class Rows:
    """The source with its indices along ``axis`` taken from ``rows``: output index ``i``
    holds source index ``rows[i]``, or, where that is -1, new values by ``init``
    (``zeros``, ``mean``: the mean of the source's rows, ``normal``: drawn from
    N(0, ``std``²) with ``seed``, in the order the new elements are written)."""

    axis: int
    rows: np.ndarray  # int64: a row of the source, or -1
    init: str = "zeros"
    std: float = 0.0
    seed: int = 0


Edit = Fill | Scale | Literal | NpyFile | Rows

INITS = ("zeros", "mean", "normal")


def parse_init(text: str, what: str) -> tuple[str, float, int]:
    """``zeros``, ``mean`` or ``normal:STD:SEED`` as ``(init, std, seed)``."""
    parts = text.split(":")
    if parts[0] in ("zeros", "mean") and len(parts) == 1:
        return parts[0], 0.0, 0
    if parts[0] == "normal" and len(parts) == 3:
        try:
            std, seed = float(parts[1]), int(parts[2])
        except ValueError:
            pass
        else:
            if math.isfinite(std) and std >= 0 and seed >= 0:
                return "normal", std, seed
    raise CheckpointError(f"{what}: init is zeros, mean or normal:STD:SEED, not {text!r}")


def _numpy_dtype(dtype: str, what: str, path: str, tensor: str) -> np.dtype:
    d = _dt.lookup(dtype)
    if d.numpy is None or d is _dt.STRING:
        raise CheckpointError(
            f"{what} takes numeric and bool tensors, not {dtype}", path=path, tensor=tensor
        )
    return np.dtype(d.numpy)


def literal_array(text: str, dtype: str, what: str, path: str, tensor: str) -> np.ndarray:
    """A literal (a number, ``true``/``false``, or a JSON list of them) as an array of
    ``dtype``. A decimal fraction in a floating-point dtype takes the nearest value, as
    parsing it in that dtype would (beyond its range: an error); whole numbers and bools
    must fit exactly."""
    import json

    target = _numpy_dtype(dtype, what, path, tensor)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise CheckpointError(
            f"{what}: {text!r} is not a number, true/false or a JSON list", path=path, tensor=tensor
        ) from None
    try:
        given = np.array(value)
    except ValueError:
        raise CheckpointError(f"{what}: {text!r} is not a regular array", path=path) from None
    if given.dtype.kind not in "biuf" or given.dtype == object:
        raise CheckpointError(f"{what}: {text!r} holds no numbers", path=path, tensor=tensor)
    # A decimal fraction has no exact binary value to keep; a whole number has.
    nearest = _dt.lookup(dtype).is_floating and given.dtype.kind == "f"
    return exact_cast(given, target, what, path, tensor, nearest=nearest)


def exact_cast(
    given: np.ndarray, target: np.dtype, what: str, path: str, tensor: str, nearest: bool = False
) -> np.ndarray:
    """``given`` as ``target``; an error naming the tensor when that loses anything
    (``nearest``: floats may round, not overflow)."""
    with _quiet():
        out = given.astype(target)
    if np.can_cast(given.dtype, target, "safe"):
        return out
    wide = np.complex128 if "c" in (given.dtype.kind, target.kind) else np.float64
    if nearest and given.dtype.kind in "biuf":
        finite = np.isfinite(given.astype(np.float64))
        with _quiet():
            if np.array_equal(np.isfinite(out.astype(wide)), finite):
                return out
        raise CheckpointError(
            f"{what}: a value is beyond the range of {target.name}", path=path, tensor=tensor
        )
    with _quiet():  # compared where both are exact: an imaginary part lost shows too
        same = np.array_equal(out.astype(wide), given.astype(wide), equal_nan=True)
        if given.dtype.kind in "biu" and target.kind in "fcV":  # whole numbers: exactly
            same = same and np.array_equal(out.astype(given.dtype), given)
    if not same:
        raise CheckpointError(
            f"{what}: a value of {given.dtype.name} does not fit {target.name} without loss",
            path=path,
            tensor=tensor,
        )
    return out


def _quiet():
    """Casts whose loss is checked after: no warnings, no floating-point errors."""
    import contextlib
    import warnings

    stack = contextlib.ExitStack()
    stack.enter_context(np.errstate(all="ignore"))
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    return stack


@contextlib.contextmanager
def opened_regular(path, what: str) -> Iterator[BinaryIO]:
    """``path`` open for reading, refused (with ``what`` in the message) unless it is a
    regular file: a named pipe would block, a device never end."""
    try:
        fd = open_regular(os.fspath(path))
    except CheckpointError as e:
        raise CheckpointError(f"{what}: {e.detail}", path=os.fspath(path)) from None
    except OSError as e:
        raise CheckpointError(
            f"{what}: cannot read: {e.strerror or e}", path=os.fspath(path)
        ) from None
    with os.fdopen(fd, "rb") as f:
        yield f


def read_regular(path, what: str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, refused before reading when larger than
    ``limit``."""
    with opened_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""
        if size > limit or len(data) > limit:
            raise CheckpointError(
                f"{what}: {max(size, len(data))} bytes, more than the limit of {limit}",
                path=os.fspath(path),
            )
    return data


def open_npy(path: str, what: str) -> np.ndarray:
    """The array of the ``.npy`` file ``path``, memory-mapped (never unpickled); refused
    unless a regular file."""
    with opened_regular(path, what):
        pass  # numpy opens it by name (a memory map needs one): known regular first
    try:
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError:  # objects, or an empty array (which cannot be mapped)
            arr = np.load(path, allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e) or "bject" in str(e):
            raise CheckpointError(
                f"{what}: holds Python objects (never unpickled)", path=path
            ) from None
        raise CheckpointError(f"{what}: not a .npy file: {e}", path=path) from None
    except OSError as e:
        raise CheckpointError(f"{what}: cannot read: {e.strerror or e}", path=path) from None
    if not isinstance(arr, np.ndarray):
        raise CheckpointError(f"{what}: not a .npy file (an .npz?)", path=path)
    if arr.dtype.kind not in "biufc":
        raise CheckpointError(f"{what}: holds {arr.dtype}, not numbers", path=path)
    return arr


def c_order_blocks(shape: tuple[int, ...], itemsize: int, budget: int) -> Iterator[tuple]:
    """Index tuples selecting consecutive row-major runs of an array of ``shape``, each
    of at most ``budget`` bytes (or one element), in order."""
    if not shape:
        yield ()
        return
    inner = math.prod(shape[1:]) * itemsize
    if inner <= budget or len(shape) == 1:
        step = max(budget // max(inner, 1), 1)
        for a in range(0, shape[0], step):
            yield (slice(a, min(a + step, shape[0])),)
        return
    for i in range(shape[0]):
        for sub in c_order_blocks(shape[1:], itemsize, budget):
            yield (i, *sub)


def edit_chunks(ckpt, item, read_bytes: int) -> Iterator[np.ndarray]:
    """The edited value of the task item ``item`` (its ``edit``) as 1-D arrays of its
    dtype, row-major, each at most ``read_bytes`` (or one element); ``ckpt`` holds the
    source tensor (``item.name``) when the edit reads it."""
    edit = item.edit
    dtype = np.dtype(_dt.lookup(item.dtype).numpy)
    shape = item.out_shape
    size = math.prod(shape)
    step = max(read_bytes // dtype.itemsize, 1)
    where = dict(path=ckpt.prefix, tensor=item.new_name)
    if isinstance(edit, Fill):
        block = np.full(min(step, size), edit.value, dtype=dtype)
        for a in range(0, size, step):
            yield block[: min(step, size - a)]
    elif isinstance(edit, Literal):
        flat = np.frombuffer(edit.data, dtype=dtype)
        for a in range(0, size, step):
            yield flat[a : a + step]
    elif isinstance(edit, Scale):
        for chunk in ckpt.iter_chunks(item.name, read_bytes):
            with np.errstate(over="ignore"):
                yield (chunk.astype(np.float64) * edit.factor).astype(dtype)
    elif isinstance(edit, NpyFile):
        arr = open_npy(edit.path, flag("set"))
        if tuple(arr.shape) != tuple(shape):
            raise CheckpointError(
                f"{edit.path} holds shape {list(arr.shape)}, the tensor has {list(shape)}", **where
            )
        for sel in c_order_blocks(tuple(arr.shape), arr.dtype.itemsize, read_bytes):
            piece = np.ascontiguousarray(arr[sel]).reshape(-1)
            yield exact_cast(piece, dtype, f"{flag('set')} from {edit.path}", **where)
    elif isinstance(edit, Rows):
        yield from _row_chunks(ckpt, item, edit, dtype, step, read_bytes)
    else:  # pragma: no cover - every kind is above
        raise AssertionError(edit)


class _Gather:
    """Pieces collected into chunks of about ``step`` elements (rows come in runs that
    may be one row long)."""

    def __init__(self, step: int):
        self.step = step
        self.pieces: list[np.ndarray] = []
        self.size = 0

    def add(self, piece: np.ndarray) -> Iterator[np.ndarray]:
        self.pieces.append(piece)
        self.size += piece.size
        if self.size >= self.step:
            yield from self.flush()

    def flush(self) -> Iterator[np.ndarray]:
        if self.pieces:
            out = self.pieces[0] if len(self.pieces) == 1 else np.concatenate(self.pieces)
            self.pieces, self.size = [], 0
            yield out


def _row_chunks(
    ckpt, item, edit: Rows, dtype: np.dtype, step: int, read_bytes: int
) -> Iterator[np.ndarray]:
    src_shape = item.shape
    axis = edit.axis
    outer = math.prod(src_shape[:axis])
    old_rows = src_shape[axis]
    inner = math.prod(src_shape[axis + 1 :])
    # The whole source is read once: its checksum, and the mean for init='mean'.
    mean = _checked_mean(ckpt, item.name, (outer, old_rows, inner), read_bytes, edit.init == "mean")
    if mean is not None:
        mean = mean.astype(dtype)
    rng = np.random.default_rng(edit.seed) if edit.init == "normal" else None
    gather = _Gather(step)
    firsts, counts = _runs(edit.rows)
    for o in range(outer):
        for k in range(firsts.size):  # not as lists: a Python int per row would cost more
            first, n = int(firsts[k]), int(counts[k]) * inner
            if first >= 0:
                start = (o * old_rows + first) * inner
                for a in range(0, n, step):
                    piece = ckpt.read_elements(item.name, start + a, min(step, n - a))
                    yield from gather.add(piece)
                continue
            for a in range(0, n, step):
                k = min(step, n - a)
                if rng is not None:
                    piece = rng.normal(0.0, edit.std, k).astype(dtype)
                elif mean is not None:
                    piece = mean[o][(a + np.arange(k)) % inner]
                else:
                    piece = np.zeros(k, dtype=dtype)
                yield from gather.add(piece)
    yield from gather.flush()


def _runs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` as runs of consecutive source rows, or of new ones: each run's first
    source row (-1: new ones) and its length."""
    rows = np.asarray(rows, dtype=np.int64)
    if not rows.size:
        return rows, rows
    new = rows < 0
    starts = np.ones(rows.size, dtype=bool)
    starts[1:] = (new[1:] != new[:-1]) | (~new[1:] & (rows[1:] != rows[:-1] + 1))
    first = np.flatnonzero(starts)
    counts = np.diff(np.append(first, rows.size))
    return np.where(new[first], -1, rows[first]), counts


def _checked_mean(
    ckpt, name: str, dims: tuple[int, int, int], read_bytes: int, want: bool
) -> np.ndarray | None:
    """Read tensor ``name`` through once (which verifies its checksum); with ``want``,
    the mean over its ``rows`` axis, shape ``(outer, inner)``, in float64."""
    outer, rows, inner = dims
    total = np.zeros(outer * inner, dtype=np.float64) if want else None
    pos = 0
    for chunk in ckpt.iter_chunks(name, read_bytes, buffers=BufferRing(3)):
        if total is not None:
            p = pos + np.arange(chunk.size)
            cols = (p // (rows * inner)) * inner + p % inner
            total += np.bincount(cols, weights=chunk.astype(np.float64), minlength=total.size)
        pos += chunk.size
    if total is None:
        return None
    return (total / max(rows, 1)).reshape(outer, inner)
