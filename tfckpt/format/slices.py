"""Shapes and slices of tensors: element counts, a slice's extents, shape and index into
its tensor, whether it fits, how it is written and keyed, and whether a partitioned
tensor's slices overlap or leave parts out (:func:`coverage`).

A slice is a tuple of ``(start, length)`` extents, one per axis, ``length`` None for
a whole axis. Both formats use these: bundles (:mod:`tfckpt.format.bundle`) list a
partitioned tensor's slices on its entry, V1 checkpoints key every value by its slice.
Nothing here touches a file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tfckpt.format import orderedcode

Extent = tuple[int, "int | None"]
Slice = tuple[Extent, ...]


# Dtypes TensorFlow's reader can reassemble from slices (tensor_bundle's copy list):
# any other dtype it reads only from a stored slice equal to the one asked for.
TF_SLICE_COPYABLE = frozenset(
    {
        "float32",
        "float64",
        "int32",
        "uint8",
        "int16",
        "int8",
        "complex64",
        "complex128",
        "int64",
        "bool",
        "qint32",
        "quint8",
        "qint8",
        "bfloat16",
    }
)


def num_elements(shape: Sequence[int]) -> int:
    """The number of elements of a tensor of ``shape`` (1 for a scalar)."""
    return math.prod(shape)


def slice_shape(full_shape: Sequence[int], extents: Slice) -> tuple[int, ...]:
    """The shape of the slice ``extents`` of a tensor of ``full_shape``."""
    return tuple(d if length is None else length for d, (_, length) in zip(full_shape, extents))


def slice_index(extents: Slice) -> tuple[slice, ...]:
    """The numpy index that selects the slice ``extents`` from its full tensor."""
    return tuple(
        slice(None) if length is None else slice(start, start + length) for start, length in extents
    )


def is_full_slice(full_shape: Sequence[int], extents: Slice) -> bool:
    """Whether ``extents`` cover every axis of a tensor of ``full_shape`` whole."""
    return all(
        length is None or (start == 0 and length == d)
        for d, (start, length) in zip(full_shape, extents)
    )


def shape_tuple(shape) -> tuple[int, ...]:
    """A shape given by a caller as a tuple of ints; ``ValueError`` for a negative one."""
    shape = tuple(map(int, shape))
    if shape and min(shape) < 0:
        raise ValueError(f"negative dimension in shape {list(shape)}")
    return shape


def extents_fit(extents: Slice, shape: Sequence[int]) -> bool:
    """Whether extents of the tensor's rank lie inside ``shape`` (a whole axis starts at 0)."""
    return all(
        start >= 0
        and (
            length is None
            and start == 0
            or length is not None
            and length >= 0
            and start + length <= dim
        )
        for (start, length), dim in zip(extents, shape)
    )


def format_slice(extents: Slice) -> str:
    """A slice as TensorFlow writes it: ``start:end`` per axis, ``-`` for a whole one."""
    return ",".join(
        "-" if length is None else f"{start}:{start + length}" for start, length in extents
    )


def _slice_bounds(slices: Sequence[Slice], shape: tuple[int, ...]):
    starts = np.array([[s for s, _ in ext] for ext in slices], dtype=np.int64)
    ends = np.array(
        [[d if n is None else s + n for (s, n), d in zip(ext, shape)] for ext in slices],
        dtype=np.int64,
    )
    return starts.reshape(len(slices), len(shape)), ends.reshape(len(slices), len(shape))


def check_slice_cover(slices: Sequence[Slice], shape: tuple[int, ...], error) -> None:
    """Raise ``error(what)`` if the slices overlap: no element may be stored twice.

    Slices that leave parts out are legal: TensorFlow writes them for pre-sliced
    tensors and restores just those parts (see :func:`coverage`).
    """
    if not shape:
        if len(slices) != 1:
            raise error(f"a scalar has {len(slices)} slices")
        return
    starts, ends = _slice_bounds(slices, shape)
    for i in range(len(slices) - 1):
        overlap = np.all((starts[i] < ends[i + 1 :]) & (starts[i + 1 :] < ends[i]), axis=1)
        if overlap.any():
            j = i + 1 + int(np.argmax(overlap))
            raise error(f"slices {format_slice(slices[i])} and {format_slice(slices[j])} overlap")


_MAX_COVER_CELLS = 1 << 16  # grid cells examined to name the parts slices leave out
MAX_HOLES = 4


def coverage(slices: Sequence[Slice], shape: tuple[int, ...]) -> tuple[int, list[Slice]]:
    """The elements the slices store and (up to a few) blocks they leave out.

    The slices' edges cut every axis into intervals; each cell of that grid is
    either stored or missing, so the missing blocks are found without touching
    an element. On grids too large to walk, the count is the slices' total size
    (exact unless they overlap, which is corrupt anyway) and no block is named.
    """
    total = num_elements(shape)
    if not shape:
        return (total if slices else 0), []
    starts, ends = _slice_bounds(slices, shape)
    volumes = sum(
        num_elements([b - a for a, b in zip(s, e)]) for s, e in zip(starts.tolist(), ends.tolist())
    )
    if volumes == total:
        return total, []
    cuts = [
        np.unique(np.concatenate([[0, d], starts[:, a], ends[:, a]])) for a, d in enumerate(shape)
    ]
    if math.prod(len(c) - 1 for c in cuts) > _MAX_COVER_CELLS:
        return min(volumes, total), []
    stored = np.zeros([len(c) - 1 for c in cuts], dtype=bool)
    for s, e in zip(starts, ends):
        stored[
            tuple(
                slice(int(np.searchsorted(c, a)), int(np.searchsorted(c, b)))
                for c, a, b in zip(cuts, s, e)
            )
        ] = True
    holes: list[Slice] = []
    for cell in np.argwhere(~stored)[: MAX_HOLES + 1]:
        holes.append(
            tuple(
                (0, None) if c[i] == 0 and c[i + 1] == d else (int(c[i]), int(c[i + 1] - c[i]))
                for c, i, d in zip(cuts, cell.tolist(), shape)
            )
        )
    widths = [np.diff(c).tolist() for c in cuts]
    covered = sum(
        math.prod(w[i] for w, i in zip(widths, cell)) for cell in np.argwhere(stored).tolist()
    )
    return covered, holes


def describe_holes(holes: list[Slice], missing: int) -> str:
    """What :func:`coverage` found missing, in words (for an error message)."""
    if not holes:
        return f"{missing} elements are missing"
    listed = ", ".join(f"[{format_slice(h)}]" for h in holes[:MAX_HOLES])
    more = " and more" if len(holes) > MAX_HOLES else ""
    return f"missing {missing} elements: {listed}{more}"


def parse_slice_key(key: bytes) -> tuple[str, Slice] | None:
    """(name, extents) if ``key`` is exactly how TensorFlow encodes that slice's key."""
    try:
        name, extents = orderedcode.decode_slice_key(key)
        canonical = orderedcode.encode_slice_key(name, extents) == key
    except ValueError:
        return None
    return (name, extents) if canonical else None
