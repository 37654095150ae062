"""The data side of reading a V2 bundle: shard files, positioned reads, checksums, values.

:class:`ShardReads` is the base of :class:`~tfckpt.checkpoint.reader.Checkpoint` that
turns an index :class:`~tfckpt.checkpoint.index.Entry` into bytes and the bytes into an
array: it opens each data shard once, checks that an entry's bytes lie inside its
file, reads them with positioned reads (or maps them, zero-copy), verifies their
checksum, swaps their byte order when the bundle's differs from this machine's, and
decodes string and variant framing and partitioned tensors. Streaming is
:mod:`tfckpt.checkpoint.streaming`. These stay methods of the checkpoint (not of an
object it holds) so that a subclass or a test that replaces one (``_check_extent``)
changes every read that goes through it.
"""

from __future__ import annotations

import numpy as np

from tfckpt.checkpoint.index import BundleIndex, Entry
from tfckpt.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnsupportedCheckpointError,
)
from tfckpt.format import dtypes as _dt
from tfckpt.format.bundle import NATIVE, VARIANT, Header
from tfckpt.format.framing import StringFraming, VariantFraming
from tfckpt.format.slices import num_elements, slice_index
from tfckpt.format.table import crc32c, unmask_crc
from tfckpt.io import paths
from tfckpt.io.storage import Reader, Storage


class ShardReads:
    """Reading entries' bytes from the data shards of a bundle, and decoding them.

    Not used on its own: :class:`~tfckpt.checkpoint.reader.Checkpoint` sets the
    attributes below when it opens a checkpoint.
    """

    prefix: str
    index_path: str
    verify: bool
    mmap: bool
    header: Header
    storage: Storage
    _index: BundleIndex
    _readers: dict[int, Reader]

    @property
    def data_files(self) -> list[str]:
        """The paths of every data shard the header counts."""
        n = self.header.num_shards
        return [paths.data_filename(self.prefix, i, n) for i in range(n)]

    def check_shard_files(self, shard_ids) -> None:
        """Refuse when a data shard of ``shard_ids`` is missing or not a regular file.

        One directory listing, whatever the count, so a header's shard count costs
        nothing: only the shards that entries use are looked for.
        """
        store = self.storage
        n = self.header.num_shards
        try:
            present = set(store.listdir(store.dirname(self.prefix) or "."))
        except OSError:
            present = set()
        for i in sorted(shard_ids):
            path = paths.data_filename(self.prefix, i, n)
            if store.basename(path) not in present:
                raise CheckpointNotFoundError("data shard is missing", path=path)
            if store.irregular(path):
                raise CorruptCheckpointError("data shard is not a regular file", path=path)

    def close(self) -> None:
        """Close the data shards opened so far (reading again opens them again)."""
        readers, self._readers = self._readers, {}
        for reader in readers.values():
            reader.close()

    def _corrupt(self, what: str, tensor: str | None, path: str | None = None):
        return CorruptCheckpointError(what, path=path or self.index_path, tensor=tensor)

    # -- raw access to shards

    def _shard(self, shard_id: int, tensor: str):
        reader = self._readers.get(shard_id)
        if reader is None:
            path = paths.data_filename(self.prefix, shard_id, self.header.num_shards)
            try:
                reader = self.storage.open_reader(path)
            except OSError as e:
                raise CheckpointNotFoundError(
                    f"cannot open data shard: {e.strerror or e}", path=path, tensor=tensor
                ) from None
            except CheckpointError as e:
                raise type(e)(e.detail, path=path, tensor=tensor) from None
            self._readers[shard_id] = reader
        return reader

    def _shard_path(self, entry: Entry) -> str:
        return paths.data_filename(self.prefix, entry.proto.shard_id, self.header.num_shards)

    def _check_extent(self, entry: Entry):
        reader = self._shard(entry.proto.shard_id, entry.name)
        end = entry.proto.offset + entry.proto.size
        if end > reader.size:
            raise self._corrupt(
                f"bytes [{entry.proto.offset}, {end}) lie past the end of the shard "
                f"({reader.size} bytes); the file is truncated",
                entry.name,
                self._shard_path(entry),
            )
        return reader

    def _pread_into(self, reader, buf: memoryview, offset: int, entry: Entry) -> None:
        done = 0
        total = len(buf)
        while done < total:
            try:
                n = reader.readinto(buf[done:], offset + done)
            except OSError as e:
                raise CorruptCheckpointError(
                    f"read failed: {e.strerror or e}",
                    path=self._shard_path(entry),
                    tensor=entry.name,
                ) from None
            if n == 0:
                raise self._corrupt("unexpected end of file", entry.name, self._shard_path(entry))
            done += n

    def _read_entry_bytes(self, entry: Entry, *, view: bool = False) -> np.ndarray:
        """The entry's bytes as a uint8 array, checksum verified when asked to.

        With ``view`` (and ``mmap``), from a local file this is a read-only view of
        the mapped file: zero-copy.
        """
        reader = self._check_extent(entry)
        buf = None
        if view and self.mmap and entry.proto.size and hasattr(reader, "view"):
            buf = reader.view(entry.proto.offset, entry.proto.size)
        if buf is None:
            buf = np.empty(entry.proto.size, dtype=np.uint8)
            self._pread_into(reader, buf.data, entry.proto.offset, entry)
        if self.verify and entry.dtype is not _dt.STRING and entry.dtype is not VARIANT:
            self._check_crc(entry, crc32c(buf))
        return buf

    def _check_crc(self, entry: Entry, actual: int) -> None:
        stored = unmask_crc(entry.proto.crc32c)
        if stored != actual:
            raise self._corrupt(
                f"checksum mismatch: stored {stored:#010x}, computed "
                f"{actual:#010x} over {entry.proto.size} bytes at offset "
                f"{entry.proto.offset}",
                entry.name,
                self._shard_path(entry),
            )

    # -- values of whole entries

    def _decode(self, entry: Entry) -> np.ndarray:
        dtype = entry.dtype
        if dtype is _dt.STRING:
            return self._decode_strings(entry)
        if dtype.numpy is None:
            raise UnsupportedCheckpointError(
                f"{dtype.name} tensors have no numpy form; use read_bytes()",
                path=self.prefix,
                tensor=entry.name,
            )
        buf = self._read_entry_bytes(entry, view=True)
        return self._to_array(buf, dtype, entry.shape)

    def _to_array(self, buf: np.ndarray, dtype: _dt.DType, shape: tuple[int, ...]) -> np.ndarray:
        if self.header.endianness != NATIVE and dtype.swap_unit > 1:
            if not buf.flags.writeable:
                buf = buf.copy()
            buf.view(np.dtype(f"u{dtype.swap_unit}")).byteswap(inplace=True)
        return buf.view(dtype.array_dtype).reshape(shape)

    def _decode_strings(self, entry: Entry) -> np.ndarray:
        n = num_elements(entry.shape)
        if entry.proto.size == 0:
            if n:
                raise self._corrupt(f"string tensor of {n} elements has no bytes", entry.name)
            return np.empty(entry.shape, dtype=object)
        if n > entry.proto.size:  # checked before reading: one length byte per element
            raise self._corrupt(f"{n} strings cannot fit in {entry.proto.size} bytes", entry.name)
        buf = self._read_entry_bytes(entry).tobytes()
        framing = self._check_string_bytes(entry, buf)
        out = np.empty(n, dtype=object)
        pos = framing.data_offset
        for i, length in enumerate(framing.lengths):
            out[i] = buf[pos : pos + length]
            pos += length
        return out.reshape(entry.shape)

    def _check_string_bytes(self, entry: Entry, buf: bytes) -> StringFraming:
        """Parse a string tensor's framing, checking its checksums when verifying."""
        n = num_elements(entry.shape)
        shard = self._shard_path(entry)
        try:
            framing = StringFraming(buf, n, self.header.endianness)
        except ValueError as e:
            raise self._corrupt(f"malformed string tensor: {e}", entry.name, shard) from None
        if self.verify:
            if framing.stored_lengths_crc != framing.lengths_crc:
                raise self._corrupt(
                    f"string length checksum mismatch: stored {framing.stored_lengths_crc:#010x}"
                    f", computed {framing.lengths_crc:#010x}",
                    entry.name,
                    shard,
                )
            self._check_crc(entry, framing.crc)
        return framing

    def _check_variant_bytes(self, entry: Entry, buf: bytes) -> VariantFraming:
        """Parse a variant tensor's framing, checking its checksums when verifying."""
        shard = self._shard_path(entry)
        try:
            framing = VariantFraming(buf, num_elements(entry.shape), self.header.endianness)
        except ValueError as e:
            raise self._corrupt(f"malformed variant tensor: {e}", entry.name, shard) from None
        if self.verify:
            if framing.bad_element is not None:
                i, stored, computed = framing.bad_element
                raise self._corrupt(
                    f"checksum mismatch after variant element {i}: stored "
                    f"{stored:#010x}, computed {computed:#010x}",
                    entry.name,
                    shard,
                )
            self._check_crc(entry, framing.crc)
        return framing

    def _assemble(self, entry: Entry) -> np.ndarray:
        """A partitioned tensor read whole: its slices, decoded, in one array."""
        self._index.check_whole(entry)
        parts = [self._index.slice_entry(entry, s) for s in entry.slices]
        for part in parts:
            # Every slice's bytes must exist before the full tensor is allocated.
            self._check_extent(part)
        if entry.dtype is _dt.STRING:
            out = np.empty(entry.shape, dtype=object)
        elif entry.dtype.numpy is None:
            raise UnsupportedCheckpointError(
                f"{entry.dtype.name} tensors have no numpy form",
                path=self.prefix,
                tensor=entry.name,
            )
        else:
            out = np.empty(entry.shape, dtype=entry.dtype.numpy)
        for extents, part in zip(entry.slices, parts):
            out[slice_index(extents)] = self._decode(part)
        return out
