"""A bounded, deterministic sample of a tensor's values, for the reports' histograms.

A tensor of more than ``bound`` stored elements is sampled as ``blocks`` runs of
``bound // blocks`` consecutive elements: its elements (in the order
:func:`~tfckpt.inspection.reading.stored_chunks` gives them) are cut into ``blocks``
equal strata and each stratum gives one run, at an offset drawn with a fixed seed.
The same tensor size gives the same positions on every run and every machine, the
runs cover the whole tensor (no stride to alias with a shape), and each run is one
contiguous read. A tensor of at most ``bound`` elements is taken whole.

The sample is picked either from chunks streamed anyway (:meth:`Sample.pick`, in
``stats``' pass) or read by itself (:meth:`Sample.read`: ``blocks`` positioned reads,
whatever the tensor's size).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from tfckpt.checkpoint.reader import DEFAULT_CHUNK_BYTES, Checkpoint
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import TensorInfo
from tfckpt.inspection.reading import stored_chunks

SAMPLE_VALUES = 1 << 16  # values per tensor a report histograms, at most
SAMPLE_BLOCKS = 64  # runs of consecutive values they come in
_SEED = 20_26_12  # any fixed number: the positions depend on the tensor's size alone


class Sample:
    """Which of a tensor's ``n`` stored elements a report looks at: all of them when
    ``n <= bound``, else ``blocks`` runs of ``block`` consecutive ones (``values`` in all).

    >>> s = Sample(10_000, 64, blocks=4)
    >>> s.whole, s.values, s.block, len(s.runs())
    (False, 64, 16, 4)
    """

    def __init__(self, n: int, bound: int = SAMPLE_VALUES, *, blocks: int = SAMPLE_BLOCKS):
        if bound < 1:
            raise ValueError(f"a sample of {bound} values")
        self.n = n
        self.whole = n <= bound
        if self.whole:
            self.block, self.starts = n, np.zeros(1 if n else 0, np.int64)
        else:
            k = min(blocks, bound)
            self.block = bound // k
            edges = np.arange(k + 1, dtype=np.float64) * (n / k)
            lo = np.floor(edges[:-1]).astype(np.int64)
            room = np.floor(edges[1:]).astype(np.int64) - lo - self.block  # >= 0: n > bound
            jitter = np.random.default_rng(_SEED).random(k)
            self.starts = lo + np.floor(jitter * (room + 1)).astype(np.int64)
        self.values = self.block * len(self.starts)

    def runs(self) -> list[tuple[int, int]]:
        """The sampled runs as ``(start, count)``, in order."""
        return [(int(a), self.block) for a in self.starts]

    def pick(self, chunk: np.ndarray, pos: int) -> np.ndarray:
        """The sampled elements of ``chunk``, a 1-D run of the elements from ``pos``."""
        if self.whole:
            return chunk
        end = pos + len(chunk)
        first = int(np.searchsorted(self.starts + self.block, pos, side="right"))
        last = int(np.searchsorted(self.starts, end, side="left"))
        parts = [
            chunk[max(a, pos) - pos : min(a + self.block, end) - pos]
            for a in self.starts[first:last].tolist()
        ]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else chunk[:0]

    def read(
        self, ckpt: Checkpoint, name: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> Iterator[np.ndarray]:
        """The sampled elements of tensor ``name``, a run at a time: positioned reads of
        the runs where the reader has them (no checksum covers a part of a tensor:
        callers read values that were checked, as a conversion's output and source; of
        a tensor saved in slices, of its slices or of the rows a run meets), else picked
        from the stored chunks, as is a tensor taken whole."""
        read_elements = getattr(ckpt, "read_elements", None)
        read_region = getattr(ckpt, "read_region", None)
        info = ckpt.info(name)
        if self.whole or read_elements is None:
            yield from self._picked(ckpt, name, chunk_bytes)
        elif not info.slices:
            for start, count in self.runs():
                yield read_elements(name, start, count)
        elif info.partial:
            yield from self._from_slices(ckpt, name, read_elements)
        elif read_region and info.shape and _row_bytes(info) <= chunk_bytes:
            # Saved in slices that cover it: the rows each run meets, read as a region.
            row = math.prod(info.shape[1:])
            rest = tuple((0, int(d), 1) for d in info.shape[1:])
            for start, count in self.runs():
                r0, r1 = start // row, (start + count - 1) // row + 1
                rows = read_region(name, ((r0, r1 - r0, 1), *rest)).reshape(-1)
                yield rows[start - r0 * row : start - r0 * row + count]
        else:
            yield from self._picked(ckpt, name, chunk_bytes)

    def _picked(self, ckpt: Checkpoint, name: str, chunk_bytes: int) -> Iterator[np.ndarray]:
        pos = 0
        for chunk in stored_chunks(ckpt, name, chunk_bytes):
            picked = self.pick(chunk, pos)
            pos += len(chunk)
            if len(picked):
                yield picked

    def _from_slices(self, ckpt: Checkpoint, name: str, read_elements) -> Iterator[np.ndarray]:
        """Of a tensor stored in part: its stored slices one after another, as
        stored_chunks orders them; a run may span two of them."""
        parts = [(p.extents, p.stored_elements or 0) for p in ckpt.slice_info(name)]
        stored = sorted(
            ((e, n) for e, n in parts if e is not None),
            key=lambda part: [(s, -1 if n is None else n) for s, n in part[0]],
        )
        for start, count in self.runs():
            base = 0
            for extents, size in stored:
                a, b = max(start, base), min(start + count, base + size)
                if a < b:
                    yield read_elements(name, a - base, b - a, extents)
                base += size


def _row_bytes(info: TensorInfo) -> int:
    return math.prod(info.shape[1:]) * _dt.lookup(info.dtype).fixed_itemsize


def stored_count(info: TensorInfo) -> int:
    """How many elements of the tensor ``info`` describes the checkpoint holds."""
    return info.stored_elements or 0 if info.partial else info.size
