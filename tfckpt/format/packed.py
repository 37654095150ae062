"""Many short byte strings end to end in one buffer: a table's keys or values as a column.

A list of ``bytes`` costs about 41 bytes a string besides its contents (the object's
header and the list's slot); an index of 200 000 tensors holds two such lists, 16 MB of
overhead. :class:`PackedBytes` keeps the strings joined in one ``bytearray`` and where
each ends (8 bytes a string), reads like a sequence of ``bytes`` (bisection included)
and hands its buffer and bounds to code that works on all of them at once.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate

import numpy as np


class PackedBytes(Sequence[bytes]):
    """Byte strings kept end to end; string ``i`` is ``data[start(i):ends[i]]``.

    Appended to with :meth:`append` and :meth:`extend`; ``packed[a:b]`` is a view that
    shares the buffer (do not append to a packed column that has views).

    >>> p = PackedBytes.of([b"ab", b"", b"c"]); p[0], p[2], list(p[1:])
    (b'ab', b'c', [b'', b'c'])
    """

    __slots__ = ("data", "ends", "base")

    def __init__(
        self, data: bytes | bytearray | None = None, ends: array | None = None, base: int = 0
    ):
        self.data = bytearray() if data is None else data  # bytes once frozen
        self.ends = array("q") if ends is None else ends  # where each string ends in data
        self.base = base  # where the first string starts

    @classmethod
    def of(cls, items: Iterable[bytes]) -> PackedBytes:
        """The strings of ``items``, packed."""
        out = cls()
        out.extend(list(items))
        return out

    def frozen(self) -> PackedBytes:
        """The same strings over an immutable buffer (read back faster)."""
        return PackedBytes(bytes(self.data), self.ends, self.base)

    def append(self, item: bytes) -> None:
        self.data += item
        self.ends.append(len(self.data))

    def extend(self, items: Sequence[bytes]) -> None:
        start = len(self.data)
        if isinstance(items, PackedBytes):  # its buffer and ends, shifted
            if len(items):
                self.data += items.joined()
                ends = np.frombuffer(items.ends, dtype=np.int64)
                self.ends.frombytes((ends - items.base + start).tobytes())
            return
        self.data += b"".join(items)
        running = accumulate(map(len, items), initial=start)
        next(running)  # the start itself
        self.ends.extend(running)

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self.ends))
            if step != 1:
                raise ValueError("a packed column is sliced with step 1 only")
            stop = max(start, stop)
            base = self.ends[start - 1] if start else self.base
            return PackedBytes(self.data, self.ends[start:stop], base)
        if i < 0:
            i += len(self.ends)
        item = self.data[self.ends[i - 1] if i else self.base : self.ends[i]]
        return item if type(item) is bytes else bytes(item)

    def __iter__(self) -> Iterator[bytes]:
        data, start = self.data, self.base
        if type(data) is not bytes:
            data = bytes(data)
        for end in self.ends:
            yield data[start:end]
            start = end

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Where each string starts and ends in :attr:`data`, as int64 arrays."""
        ends = np.frombuffer(self.ends, dtype=np.int64) if len(self.ends) else np.zeros(0, np.int64)
        starts = np.empty_like(ends)
        if len(ends):
            starts[0] = self.base
            starts[1:] = ends[:-1]
        return starts, ends

    def joined(self) -> bytes:
        """Every string, end to end."""
        return bytes(self.data[self.base : self.ends[-1]]) if len(self.ends) else b""

    def take(self, rows: Sequence[int] | np.ndarray) -> PackedBytes:
        """The strings at ``rows``, in that order, packed anew."""
        rows = np.asarray(rows, dtype=np.int64)
        ends = np.frombuffer(self.ends, dtype=np.int64) if len(self.ends) else np.zeros(1, np.int64)
        e = ends[rows]  # where the rows start and end, without the bounds of every row
        s = np.where(rows > 0, ends[np.maximum(rows - 1, 0)], self.base)
        lengths = e - s
        new_ends = np.cumsum(lengths)
        total = int(new_ends[-1]) if len(new_ends) else 0
        at = np.repeat(s - (new_ends - lengths), lengths) + np.arange(total)
        data = np.frombuffer(self.data, dtype=np.uint8)[at].tobytes()
        return PackedBytes(data, array("q", new_ends.astype(np.int64).tobytes()))

    def __repr__(self) -> str:
        return f"<PackedBytes: {len(self)} strings, {len(self.data)} bytes>"
