"""The index entries a checkpoint's writers build, and the checks on a new tensor's name
and slice made before any of its bytes is written.

One :class:`IndexEntries` is shared by every shard of a checkpoint being written
(:mod:`~tfckpt.checkpoint.writer`); the tensor streams (:mod:`~tfckpt.checkpoint.streams`)
say through it that one is open. Reading an index is :mod:`~tfckpt.checkpoint.index`.
"""

from __future__ import annotations

from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import add_slice, entry_proto
from tfckpt.format.entryrows import EntryRows
from tfckpt.format.orderedcode import encode_name, encode_slice_key
from tfckpt.format.slices import Slice, extents_fit, format_slice, shape_tuple, slice_shape


class IndexEntries:
    """The index entries being built, shared by the shards of one checkpoint.

    Whole tensors and slices by key (as rows: see :class:`~tfckpt.format.entryrows.EntryRows`),
    partitioned tensors' own entries with the slices they list, and whether a stream is
    open (one at a time).
    """

    def __init__(self):
        self.entries = EntryRows()
        self.slices_of: dict[bytes, tuple[_dt.DType, tuple[int, ...]]] = {}
        self.streaming = False
        self.done = False

    def check_open(self, key: bytes, name: str) -> None:
        """Refuse a new tensor ``name`` (index key ``key``) the checkpoint cannot take now."""
        if self.done:
            raise ValueError("the writer is finished")
        if self.streaming:
            raise ValueError("another tensor is being streamed")
        if not name:  # encode_name("") is the header's empty key
            raise ValueError("invalid tensor name '': the empty key is the bundle header")
        if key in self.entries:
            raise ValueError(f"duplicate tensor name {name!r}")

    def slice_key(self, name: str, dt: _dt.DType, full_shape, extents: Slice, shape) -> bytes:
        """The key of a new slice, refused when it does not fit its tensor."""
        full_shape = shape_tuple(full_shape)
        if len(extents) != len(full_shape):
            raise ValueError(f"{len(extents)} extents for a tensor of rank {len(full_shape)}")
        if not extents_fit(extents, full_shape):
            raise ValueError(f"slice {format_slice(extents)} lies outside {list(full_shape)}")
        if tuple(shape) != slice_shape(full_shape, extents):
            raise ValueError(
                f"slice {format_slice(extents)} has shape "
                f"{list(slice_shape(full_shape, extents))}, not {list(shape)}"
            )
        full_key = encode_name(name)
        if full_key in self.entries and full_key not in self.slices_of:
            raise ValueError(f"duplicate tensor name {name!r}")
        known = self.slices_of.get(full_key)
        if known is not None and known != (dt, full_shape):
            raise ValueError(
                f"slices of {name!r} disagree: {known[0].name} {list(known[1])} vs "
                f"{dt.name} {list(full_shape)}"
            )
        return encode_slice_key(name, extents)

    def register_slice(self, name: str, dt: _dt.DType, full_shape, extents: Slice) -> None:
        """Record a written slice on its full tensor's entry."""
        full_shape = shape_tuple(full_shape)
        full_key = encode_name(name)
        full = self.entries.protos.get(full_key)
        if full is None:
            full = self.entries.protos[full_key] = entry_proto(dt, full_shape)
            self.slices_of[full_key] = (dt, full_shape)
        add_slice(full, extents)
