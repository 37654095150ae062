"""The file operations of managing a directory of checkpoints (``ls``, ``prune``, ``cp``,
``mv``): which names are leftovers of interrupted saves, the state file written whole as
TensorFlow's ``CheckpointManager`` leaves it, files copied between storages and removed.

What a directory holds, and what to keep, is decided above (:mod:`tfckpt.inspection.directories`);
every operation here goes through the :class:`~tfckpt.io.storage.Storage` it is handed.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence

from google.protobuf.text_format import MessageToString

from tfckpt._proto.checkpoint_state_pb2 import CheckpointState
from tfckpt._proto.tensor_bundle_pb2 import BundleHeaderProto
from tfckpt.errors import CheckpointError, CheckpointWriteError
from tfckpt.format.bundle import HEADER_KEY, decode_header
from tfckpt.format.table import TableBuilder, TableReader
from tfckpt.io import paths
from tfckpt.io.storage import Storage
from tfckpt.io.temporaries import TMP_MARK, temporary_base

COPY_CHUNK = 8 << 20  # bytes read and written at a time by copy_file

# Names TensorFlow writes before a save is complete (as TensorFlow 2.x writes them, seen in
# tests/io/test_directories.py):
# - BundleWriter's temporaries of an index or data file (``X.index.tempstate123``,
#   ``X.data-00000-of-00001.tempstate123``), and TensorSliceWriter's of a V1 file;
# - file_io.atomic_write_string_to_file's of the state file (``checkpoint.tmp<uuid hex>``);
# - a sharded save's part directory (``ckpt-3_temp/``, older TensorFlow
#   ``model.ckpt-3_temp_<uuid hex>/``) holding only the bundles ``part-00000-of-00001``
#   (their ``.index``, ``.data-00000-of-00001`` and those files' temporaries), whose
#   shards MergeV2Checkpoints moves to the prefix before deleting the directory.
_TEMPSTATE_RE = re.compile(r"\.tempstate\d*$")
_STATE_TMP_RE = re.compile(r"^checkpoint\.tmp[0-9a-f]{32}$")
_PART_DIR_RE = re.compile(r"^(?P<prefix>.+)_temp(?:_[0-9a-f]{32})?$")
_PART_FILE_RE = re.compile(
    r"^part-\d{5}-of-\d{5}\.(?:index|data-\d{5}-of-\d{5})(?:\.tempstate\d*)?$"
)
# - on S3, where TensorFlow makes no part directory, the parts beside the prefix
#   (``ckpt-3.part-00000-of-00001.index`` and its data).
_S3_PART_RE = re.compile(r"^(?P<prefix>.+)\.part-\d{5}-of-\d{5}$")
# The files of a checkpoint ``P``: ``P.index``, ``P.meta``, ``P.data-00000-of-00001``; a V1
# save's ``P`` or ``P-00000-of-00002``.
_FILE_OF_RE = re.compile(
    r"^(?P<prefix>.+?)(?:\.index|\.meta|\.data-\d{5}-of-\d{5}|-\d{5}-of-\d{5})$"
)


def tensorflow_temporary(name: str) -> str | None:
    """What kind of TensorFlow leftover the file ``name`` is, if one: ``tempstate`` or
    ``state-file temporary``; None otherwise."""
    if _TEMPSTATE_RE.search(name):
        return "tempstate"
    if _STATE_TMP_RE.match(name):
        return "state-file temporary"
    return None


def temporary_prefixes(name: str) -> tuple[str, ...]:
    """The checkpoint prefixes (or the state file's name) whose save may have written the
    temporary ``name`` (TensorFlow's, or tfckpt's: see :func:`tensorflow_temporary` and
    :func:`is_tfckpt_temporary`): the file it was to become, read as a prefix itself (a
    V1 file) and as a file of one."""
    final = name.partition(TMP_MARK)[0] if TMP_MARK in name else _TEMPSTATE_RE.sub("", name)
    if _STATE_TMP_RE.match(name):
        final = paths.STATE_FILENAME
    m = _FILE_OF_RE.match(final)
    return (final, m["prefix"]) if m else (final,)


def part_directory_prefix(name: str) -> str | None:
    """The prefix a sharded save's part directory ``name`` was written for, or None."""
    m = _PART_DIR_RE.match(name)
    return m["prefix"] if m else None


def is_part_file(name: str) -> bool:
    """Whether ``name`` is one a sharded save writes into its part directory."""
    return _PART_FILE_RE.match(name) is not None


def part_prefix(name: str) -> str | None:
    """The prefix whose part ``name`` is, where ``name`` is one of the parts TensorFlow
    writes beside a prefix on S3 before merging them into it; None otherwise."""
    m = _S3_PART_RE.match(name)
    return m["prefix"] if m else None


def is_tfckpt_temporary(name: str) -> bool:
    return TMP_MARK in name


def state_bytes(
    latest: str,
    names: Sequence[str],
    timestamps: Sequence[float],
    last_preserved_timestamp: float,
) -> bytes:
    """The text of a state file as ``CheckpointManager`` writes it: ``latest``, then every
    name oldest first with its save time, and the time up to which checkpoints are kept
    for good (those are left out of ``names``)."""
    state = CheckpointState(
        model_checkpoint_path=latest,
        all_model_checkpoint_paths=list(names),
        all_model_checkpoint_timestamps=list(timestamps),
        last_preserved_timestamp=last_preserved_timestamp,
    )
    return MessageToString(state).encode("utf-8")


def replace_state_file(store: Storage, directory: str, data: bytes) -> None:
    """Make ``data`` the state file of ``directory`` in one step: a temporary renamed over
    it locally (fsync'ed first), one request on an object store."""
    path = store.join(directory, paths.STATE_FILENAME)
    try:
        if not store.atomic_rename:
            store.write_bytes(path, data)
            return
        tmp = temporary_base(path)
        try:
            store.write_new(tmp, data, durable=True)
            store.replace(tmp, path)
        except BaseException:
            try:
                store.remove(tmp)
            except OSError:
                pass
            raise
        store.fsync_dir(directory)
    except OSError as e:
        raise CheckpointWriteError(
            f"cannot write the state file: {e.strerror or e}", path=path
        ) from None


def remove_state_file(store: Storage, directory: str) -> None:
    path = store.join(directory, paths.STATE_FILENAME)
    remove(store, path)


def remove(store: Storage, path: str) -> None:
    """Delete one file; gone already is fine."""
    try:
        store.remove(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise CheckpointWriteError(f"cannot delete: {e.strerror or e}", path=path) from None


def remove_part_directory(store: Storage, path: str) -> None:
    """Delete a sharded save's part directory: the part files in it (see
    :func:`is_part_file`), then the directory if nothing is left in it. Whatever else is
    there (put there since it was looked at) stays, and the directory with it."""
    try:
        names = store.listdir(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise CheckpointWriteError(f"cannot list: {e.strerror or e}", path=path) from None
    for name in names:
        if is_part_file(name):
            remove(store, store.join(path, name))
    store.remove_dirs([path])


def copy_file(src_store: Storage, src: str, dst_store: Storage, dst: str) -> int:
    """Copy the file ``src`` to ``dst`` (a new name, on any storage) in chunks; the bytes
    copied. A short read (the source changed under the copy) is an error."""
    reader = src_store.open_reader(src)
    try:
        writer = dst_store.open_writer(dst)
        try:
            buf = bytearray(min(COPY_CHUNK, max(reader.size, 1)))
            view = memoryview(buf)
            offset = 0
            while offset < reader.size:
                n = reader.readinto(view[: min(len(buf), reader.size - offset)], offset)
                if n <= 0:
                    raise CheckpointError(
                        f"file ended at byte {offset} of {reader.size} while copying", path=src
                    )
                writer.write(view[:n])
                offset += n
            writer.flush()
            dst_store.fsync(writer)
        except BaseException:
            if hasattr(writer, "discard"):
                writer.discard()  # an object store would store the part written
            else:
                writer.close()
            raise
        writer.close()
        return offset
    except OSError as e:
        raise CheckpointWriteError(f"cannot copy {src}: {e.strerror or e}", path=dst) from None
    finally:
        reader.close()


def same_place(a: Storage, pa: str, b: Storage, pb: str) -> bool:
    """Whether two paths are the same file or directory."""
    if not a.same_file_system(b):
        return False
    return a.realpath(pa) == b.realpath(pb)


def is_inside(store: Storage, directory: str, path: str) -> bool:
    """Whether ``path`` is ``directory`` or beneath it (by real path)."""
    d = store.realpath(directory).rstrip("/" + os.sep)
    p = store.realpath(path)
    return p == d or p.startswith(d + store.sep) or p.startswith(d + "/")


def index_shards(index: bytes, path: str) -> int:
    """The shard count the header of the index table ``index`` (read from ``path``) declares."""
    raw = dict(TableReader(index, path).entries).get(HEADER_KEY)
    return decode_header(raw, path).num_shards


def reheadered(index: bytes, path: str, num_shards: int) -> bytes:
    """The index table ``index`` with its header declaring ``num_shards`` data shards, every
    entry (and the rest of the header) as it was: the shards past the old count are to
    be empty, which TensorFlow reads as any checkpoint."""
    buf = io.BytesIO()
    table = TableBuilder(buf)
    for key, value in TableReader(index, path).entries:
        if key == HEADER_KEY:
            header = BundleHeaderProto.FromString(value)
            header.num_shards = num_shards
            value = header.SerializeToString()
        table.add(key, value)
    table.finish()
    return buf.getvalue()
