"""Which files make a V1 (tensor-slice) checkpoint: one table file, the shards of a
sharded save (``PREFIX-00000-of-00002`` ...), the pattern TensorFlow names such a save by,
or a directory holding one.

:class:`~tfckpt.checkpoint.v1.V1Checkpoint` reads the files found here.
"""

from __future__ import annotations

import fnmatch
import re

from tfckpt.errors import CheckpointError, CheckpointNotFoundError
from tfckpt.format.table import FOOTER_SIZE, MAGIC
from tfckpt.io import paths
from tfckpt.io.storage import Storage, normalize

# A shard of a sharded save, or the pattern TensorFlow names all its shards by.
SHARD_RE = re.compile(r"^(?P<prefix>.*)-(?P<shard>\d{5}|\?{5})-of-(?P<num>\d{5})$")
_MAGIC_BYTES = MAGIC.to_bytes(8, "little")


def is_table_file(store: Storage, path: str) -> bool:
    """Whether ``path`` is a regular file ending in the table footer's magic number."""
    try:
        if not store.isfile(path):
            return False
        reader = store.open_reader(path)
    except (OSError, CheckpointError):
        return False
    try:
        size = getattr(reader, "size", None)
        if size is None:
            return store.read_bytes(path)[-8:] == _MAGIC_BYTES
        if size < FOOTER_SIZE:
            return False
        buf = bytearray(8)
        return reader.readinto(memoryview(buf), size - 8) == 8 and bytes(buf) == _MAGIC_BYTES
    except OSError:
        return False
    finally:
        reader.close()


def _shard_siblings(store: Storage, path: str) -> list[str] | None:
    """All shards of the sharded save ``path`` is one shard of; None if it names no shard."""
    m = SHARD_RE.match(store.basename(path))
    if not m:
        return None
    return _glob(
        store, store.join(store.dirname(path) or ".", f"{m['prefix']}-?????-of-{m['num']}")
    )


def _glob(store: Storage, pattern: str) -> list[str]:
    directory = store.dirname(pattern) or "."
    try:
        names = store.listdir(directory)
    except (OSError, CheckpointNotFoundError):
        return []
    base = store.basename(pattern)
    return [store.join(directory, n) for n in sorted(names) if fnmatch.fnmatchcase(n, base)]


def resolve_files(store: Storage, path, *, warn: bool = True) -> tuple[str, list[str]] | None:
    """(what to call the checkpoint, its files) when ``path``, on ``store``, designates a
    V1 checkpoint.

    ``path`` may be a V1 file, one shard of a sharded save, the pattern TensorFlow
    names a sharded save by (``model.ckpt-5-?????-of-00002``), the prefix of a sharded
    save, or a directory whose state file names one of those or that holds one V1
    checkpoint (and no state file). None when it designates none. ``warn=False``
    leaves out the :class:`~tfckpt.CheckpointPathWarning` of a moved state file (for
    a caller that looked at the same state file already).
    """
    p = normalize(path)
    if store.isdir(p):
        return _resolve_directory(store, store.dir_path(p), warn)
    return _resolve_file(store, p)


def _resolve_file(store: Storage, p: str) -> tuple[str, list[str]] | None:
    if any(c in store.basename(p) for c in "?*["):
        files = [f for f in _glob(store, p) if is_table_file(store, f)]
        m = SHARD_RE.match(p)
        return (m["prefix"] if m else p, files) if files else None
    if is_table_file(store, p):
        siblings = _shard_siblings(store, p)
        if siblings and len(siblings) > 1:
            m = SHARD_RE.match(p)
            assert m is not None
            return m["prefix"], siblings
        return p, [p]
    shards = [f for f in _glob(store, f"{p}-?????-of-?????") if is_table_file(store, f)]
    counts = {SHARD_RE.match(f)["num"] for f in shards}  # type: ignore[index]
    if len(counts) == 1:
        return p, shards
    return None


def _resolve_directory(
    store: Storage, directory: str, warn: bool = True
) -> tuple[str, list[str]] | None:
    latest = paths.state_file_latest(store, directory, warn=warn)
    if latest is not None:
        return _resolve_file(store, latest)
    try:
        names = sorted(store.listdir(directory))
    except OSError:
        return None
    found: dict[str, list[str]] = {}
    for name in names:
        full = store.join(directory, name)
        if name.endswith(".index") or not is_table_file(store, full):
            continue
        m = SHARD_RE.match(name)
        label = store.join(directory, m["prefix"]) if m else full
        found.setdefault(label, []).append(full)
    if len(found) == 1:
        return next(iter(found.items()))
    if len(found) > 1:
        listed = ", ".join(store.basename(k) for k in list(found)[:5])
        raise CheckpointNotFoundError(
            f"{len(found)} V1 checkpoints in directory and no state file naming one: "
            f"{listed}; name one of them",
            path=directory,
        )
    return None
