"""Lazy slices of a tensor: ``ckpt.get_slice(name)[0:10, :, 3]`` reads only what covers
the request.

A numpy basic index (ints, slices with any step, ``...``, ``None``) is split in two: a *region*,
per dimension the ascending progression of indices it touches, ``(start, count, step)``;
and the small index that turns the region's block into what numpy would return
(reversing a negative step, dropping the dimension of an int, adding one for
``None``). Readers fetch regions
(:meth:`tfckpt.Checkpoint.read_region`): a stored, row-major tensor as byte ranges,
a partitioned one slice by slice, only the slices the region meets.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence

import numpy as np

from tfckpt.errors import UnsupportedCheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.slices import Slice, num_elements

Region = tuple[tuple[int, int, int], ...]  # per dimension: (start, count, step > 0)


def _check_item(k) -> None:
    """Raise for an index item that is not an int, a slice, ``...`` or ``None``: as
    numpy does for what it refuses (``IndexError``), ``TypeError`` for the advanced
    indices numpy takes and lazy slices do not (arrays, lists, booleans)."""
    if k is None or k is Ellipsis or isinstance(k, slice):
        return
    advanced = isinstance(k, (bool, np.bool_, list, tuple)) or (
        isinstance(k, np.ndarray) and (k.ndim or k.dtype.kind not in "iu")
    )
    if advanced:
        raise TypeError(
            f"a lazy slice takes basic indices only (integers, slices, '...', None), "
            f"not {type(k).__name__}: read the whole tensor for numpy's advanced indexing"
        )
    if not hasattr(k, "__index__"):
        raise IndexError(
            "only integers, slices (`:`), ellipsis (`...`) and numpy.newaxis (`None`) "
            f"index a lazy slice, not {type(k).__name__}"
        )


def normalize_key(key, shape: Sequence[int]) -> tuple[Region, tuple]:
    """(region, index into the region's block) of numpy basic index ``key``.

    The second, applied to the block, gives what ``full[key]`` gives: the same
    shape (``None`` adds an axis), a numpy scalar for an index of integers only and
    a 0-d array where ``...`` is in it. Raises ``IndexError`` / ``TypeError`` /
    ``ValueError`` as numpy does (see :func:`_check_item` for the exception).
    """
    items = list(key) if isinstance(key, tuple) else [key]
    for k in items:
        _check_item(k)
    ellipses = [i for i, k in enumerate(items) if k is Ellipsis]
    if len(ellipses) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    given = sum(1 for k in items if k is not None and k is not Ellipsis)
    if given > len(shape):
        raise IndexError(
            f"too many indices: the tensor has {len(shape)} dimensions, {given} were indexed"
        )
    fill = [slice(None)] * (len(shape) - given)
    if ellipses:
        items[ellipses[0] : ellipses[0] + 1] = fill
    else:
        items += fill
    region = []
    final: list = []
    axes = iter(enumerate(shape))
    for k in items:
        if k is None:
            final.append(None)
            continue
        axis, n = next(axes)
        if isinstance(k, slice):
            r = range(*k.indices(n))
            if not r:
                region.append((0, 0, 1))
                final.append(slice(None))
            elif r.step > 0:
                region.append((r.start, len(r), r.step))
                final.append(slice(None))
            else:
                region.append((r[-1], len(r), -r.step))
                final.append(slice(None, None, -1))
        else:
            i = operator.index(k)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
            region.append((i % n, 1, 1))
            final.append(0)
    if ellipses:  # numpy gives a 0-d array, not a scalar, where '...' was given
        final.append(Ellipsis)
    return tuple(region), tuple(final)


def region_counts(region: Region) -> tuple[int, ...]:
    return tuple(count for _, count, _ in region)


def region_index(region: Region) -> tuple[slice, ...]:
    """The region as a numpy index into the array it is a region of."""
    return tuple(slice(s, s + (c - 1) * st + 1, st) if c else slice(0, 0) for s, c, st in region)


def is_whole(region: Region, shape: Sequence[int]) -> bool:
    return all(s == 0 and c == n and (st == 1 or n <= 1) for (s, c, st), n in zip(region, shape))


def intersect(region: Region, extents: Slice, shape: Sequence[int]):
    """Where ``region`` meets stored slice ``extents``: (index into the region's block,
    the part as a region of the slice's own array), or None when they do not meet."""
    out, local = [], []
    for (s, c, st), (e0, length), n in zip(region, extents, shape):
        e1 = n if length is None else e0 + length
        lo = max(0, -((s - e0) // st))  # first k with s + k * st >= e0
        hi = min(c, -((s - e1) // st))  # first k with s + k * st >= e1
        if lo >= hi:
            return None
        out.append(slice(lo, hi))
        local.append((s + lo * st - e0, hi - lo, st))
    return tuple(out), tuple(local)


def assemble_region(
    shape: tuple[int, ...],
    dtype: _dt.DType,
    slices: Sequence[Slice],
    region: Region,
    read_part: Callable[[Slice, Region], np.ndarray],
    *,
    path: str,
    tensor: str,
) -> np.ndarray:
    """A region of a partitioned tensor, read from the (disjoint) slices it meets only."""
    np_dtype = np.dtype(object) if dtype is _dt.STRING else dtype.numpy
    if np_dtype is None:
        raise UnsupportedCheckpointError(
            f"{dtype.name} tensors have no numpy form", path=path, tensor=tensor
        )
    out = np.empty(region_counts(region), dtype=np_dtype)
    covered = 0
    for extents in slices:
        met = intersect(region, extents, shape)
        if met is None:
            continue
        index, local = met
        out[index] = read_part(extents, local)
        covered += num_elements(region_counts(local))
    if covered != out.size:
        raise UnsupportedCheckpointError(
            f"{out.size - covered} of the {out.size} elements asked for are in no stored slice",
            path=path,
            tensor=tensor,
        )
    return out


class TensorSlice:
    """A tensor of a checkpoint, not read yet: index it to read a part of it.

    Returned by :meth:`tfckpt.Checkpoint.get_slice`. ``shape`` and ``dtype`` come
    from the index; ``slice[...]`` takes numpy's basic indexing (ints, slices with any
    step, ``...``, ``None``) and returns what numpy indexing of the whole value would
    (the same type: array, numpy scalar or ``bytes``), reading
    only the bytes that cover the request. Such a partial read is not checksummed
    (the stored checksum covers the whole tensor); a request for all of the tensor
    is read and checked like ``ckpt[name]``. String tensors are read whole and then
    indexed; variant tensors have no numpy form.

    >>> emb = ckpt.get_slice("emb")
    >>> emb.shape, emb.dtype
    ((1000000, 512), dtype('float32'))
    >>> rows = emb[0:10, ::2]
    """

    def __init__(self, ckpt, name: str):
        info = ckpt.info(name)
        self._ckpt = ckpt
        self.name = name
        self.shape: tuple[int, ...] = tuple(info.shape)
        self._dtype = _dt.lookup(info.dtype)
        self.dtype: np.dtype | None = (
            np.dtype(object) if self._dtype is _dt.STRING else self._dtype.numpy
        )

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def get_shape(self) -> list[int]:
        """The shape as a list (as safetensors' slices give it)."""
        return list(self.shape)

    def get_dtype(self) -> str:
        """TensorFlow's name of the dtype (``float32``, ``bfloat16``, ``string``...)."""
        return self._dtype.name

    def __repr__(self) -> str:
        return f"<tfckpt.TensorSlice {self.name!r} {self._dtype.name}{list(self.shape)}>"

    def __getitem__(self, key):
        region, final = normalize_key(key, self.shape)
        if self.dtype is None:
            raise UnsupportedCheckpointError(
                f"{self._dtype.name} tensors have no numpy form",
                path=self._ckpt.prefix,
                tensor=self.name,
            )
        if is_whole(region, self.shape):
            return self._ckpt.read(self.name)[final]
        return self._ckpt.read_region(self.name, region)[final]


_INT = re.compile(r"^[+-]?\d+$")


def parse_index(text: str) -> tuple | None:
    """The index ``text`` spells (``0:5``, ``3, ::-1``, ``..., 2``), or None when it is
    not one. Only integers, slices and ``...``: nothing is evaluated."""

    def number(part: str) -> int | None:
        part = part.strip()
        if not _INT.match(part):
            raise ValueError(part)
        return int(part)

    items: list = []
    try:
        for part in text.split(","):
            part = part.strip()
            if part == "...":
                items.append(Ellipsis)
            elif ":" in part:
                bounds = part.split(":")
                if len(bounds) > 3:
                    return None
                items.append(slice(*(number(b) if b.strip() else None for b in bounds)))
            else:
                items.append(number(part))
    except ValueError:
        return None
    return tuple(items)


def split_expression(text: str) -> tuple[str, tuple] | None:
    """(name, index) when ``text`` ends in ``[index]`` that parses as one, else None."""
    if not text.endswith("]"):
        return None
    start = text.rfind("[")
    if start <= 0:
        return None
    index = parse_index(text[start + 1 : -1])
    return None if index is None else (text[:start], index)
