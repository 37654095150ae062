"""What the read-only verbs share: picking tensors by pattern, and a tensor's stored
bytes in chunks."""

from __future__ import annotations

import re
from collections.abc import Iterable

from tfckpt.checkpoint.reader import DEFAULT_CHUNK_BYTES, Checkpoint


def match_names(names: Iterable[str], pattern: str | None) -> list[str]:
    if pattern is None:
        return list(names)
    rx = re.compile(pattern)
    return [n for n in names if rx.search(n)]


def stored_chunks(ckpt: Checkpoint, name: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
    """A tensor's elements in chunks; of a pre-sliced tensor, those of its stored slices.

    A pre-sliced tensor's slices come in the order of their extents, so two
    checkpoints holding the same slices give the same sequence.
    """
    info = ckpt.info(name)
    if not info.partial:
        return ckpt.iter_chunks(name, chunk_bytes)
    # slice_info checks that slices do not overlap (overlaps are corrupt)
    stored = [part.extents for part in ckpt.slice_info(name) if part.extents is not None]
    order = sorted(stored, key=lambda ext: [(s, -1 if n is None else n) for s, n in ext])
    return (chunk for extents in order for chunk in ckpt.iter_chunks(name, chunk_bytes, extents))
