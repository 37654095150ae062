"""One door to every checkpoint: a path resolved to a V2 bundle or a V1 checkpoint.

:func:`open_checkpoint` is what :func:`tfckpt.open` and every command call; the readers'
own constructors take what it resolved, so a path is looked up once.
"""

from __future__ import annotations

from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.checkpoint.v1 import V1Checkpoint, not_a_checkpoint, resolve_files
from tfckpt.errors import CheckpointNotFoundError, UnsupportedCheckpointError
from tfckpt.io import paths
from tfckpt.io.storage import StorageOptions, takes_storage_options


@takes_storage_options()
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
    try:
        prefix = paths.resolve_prefix(path)
    except CheckpointNotFoundError as e:
        # resolve_prefix warned already about a state file naming moved paths.
        files = resolve_files(path, warn=False)
        if files is not None:
            return V1Checkpoint(path, verify=verify, mmap=mmap, resolved=files)
        why = not_a_checkpoint(path)
        if why is not None:
            raise UnsupportedCheckpointError(why, path=e.path) from None
        raise
    return Checkpoint(path, verify=verify, mmap=mmap, resolved=prefix)
