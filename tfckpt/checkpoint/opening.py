"""One door to every checkpoint: a path resolved to a V2 bundle or a V1 checkpoint, or
what else the file is.

:func:`open_checkpoint` is what :func:`tfckpt.open` and every command call, with the
storage options given; :func:`open_in` opens a path on a storage at hand (a task's source,
a checkpoint listed in a directory). The readers' own constructors take the storage and
what was resolved, so a path is looked up once.
"""

from __future__ import annotations

from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.checkpoint.v1 import V1Checkpoint
from tfckpt.checkpoint.v1files import resolve_files
from tfckpt.errors import CheckpointError, CheckpointNotFoundError, UnsupportedCheckpointError
from tfckpt.io import paths
from tfckpt.io.storage import (
    Storage,
    StorageOptions,
    normalize,
    storage_for,
)


def open_checkpoint(
    path,
    *,
    verify: bool = True,
    mmap: bool = True,
    storage_options: StorageOptions | None = None,
) -> Checkpoint:
    """The checkpoint ``path`` designates, V2 or V1, read through one API.

    A path that designates no bundle may designate a V1 checkpoint; a file that is
    neither is an :class:`~tfckpt.UnsupportedCheckpointError` saying what it is.

    >>> with open_checkpoint("train/model.ckpt-7", mmap=False) as ckpt:
    ...     names = ckpt.keys()
    """
    return open_in(storage_for(normalize(path), storage_options), path, verify=verify, mmap=mmap)


def open_in(store: Storage, path, *, verify: bool = True, mmap: bool = True) -> Checkpoint:
    """The checkpoint ``path``, on ``store``, designates (see :func:`open_checkpoint`)."""
    try:
        prefix = paths.find_prefix(store, path)
    except CheckpointNotFoundError as e:
        # find_prefix warned already about a state file naming moved paths.
        files = resolve_files(store, path, warn=False)
        if files is not None:
            return V1Checkpoint(path, verify=verify, mmap=mmap, storage=store, resolved=files)
        why = not_a_checkpoint(store, path)
        if why is not None:
            raise UnsupportedCheckpointError(why, path=e.path) from None
        raise
    return Checkpoint(path, verify=verify, mmap=mmap, storage=store, resolved=prefix)


def not_a_checkpoint(store: Storage, path) -> str | None:
    """Why ``path``, a file on ``store`` that is no checkpoint, is not one; None when no
    kind is known."""
    p = normalize(path)
    if not store.isfile(p):
        return None
    try:
        head = _head(store, p)
    except (OSError, CheckpointError):
        return None
    lower = p.lower()
    if not head:
        return "the file is empty"
    if head.startswith(b"\x89HDF\r\n\x1a\n") or lower.endswith(".h5"):
        return "a Keras HDF5 file, not a TensorFlow checkpoint; load it with Keras"
    if head.startswith(b"PK\x03\x04") and lower.endswith(".keras"):
        return "a Keras .keras archive, not a TensorFlow checkpoint; load it with Keras"
    if head[:2] == b"\x1f\x8b" or head[257:262] == b"ustar" or head.startswith(b"PK\x03\x04"):
        return "an archive (tar/gzip/zip); extract it first and open what it holds"
    if lower.endswith(".meta"):
        return (
            "a MetaGraphDef (.meta) graph file: it holds no variable values; "
            "open the checkpoint beside it (tfckpt dump lists the graph's variables, "
            "tfckpt check --against it what its Saver restores)"
        )
    if lower.endswith(".pb") or lower.endswith(".pbtxt"):
        return (
            "a SavedModel graph (.pb): open the SavedModel directory "
            "(its variables/ hold the values)"
        )
    return None


def _head(store: Storage, path: str) -> bytes:
    reader = store.open_reader(path)
    try:
        buf = bytearray(512)
        n = reader.readinto(memoryview(buf), 0)
        return bytes(buf[:n])
    finally:
        reader.close()
