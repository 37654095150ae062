"""Temporaries: the names a run writes under before its commit, and the clean-up of what a
killed run left (a process id in each name tells whose it is)."""

from __future__ import annotations

import os
from collections.abc import Callable

from tfckpt.io.storage import Storage

TMP_MARK = ".tfckpt-tmp-"


def temporary_base(prefix: str) -> str:
    """A name beside ``prefix`` for one run's temporaries; the process id in it lets a
    later run tell a killed run's leftovers (see :func:`remove_stale_temporaries`)."""
    return f"{prefix}{TMP_MARK}{os.getpid()}-{os.urandom(4).hex()}"


def remove_stale_temporaries(store: Storage, prefix: str) -> None:
    """Delete what a killed writer left at ``prefix`` on ``store`` (temporaries of
    processes now gone).

    Only where commits rename temporaries into place: elsewhere none are made.
    """
    base = store.basename(prefix)
    remove_stale_temporaries_in(store, store.dirname(prefix), lambda name: name == base)


def remove_stale_temporaries_in(
    store: Storage, directory: str, owns: Callable[[str], bool]
) -> None:
    """Delete the temporaries of processes now gone in ``directory`` (on ``store``) whose
    final name (the part before :data:`TMP_MARK`) ``owns`` accepts; local storage only."""
    for path in stale_temporaries(store, directory, owns):
        try:
            store.remove(path)
        except OSError:
            pass


def stale_temporaries(store: Storage, directory: str, owns: Callable[[str], bool]) -> list[str]:
    """The temporaries in ``directory`` (on ``store``) of processes now gone whose final
    name ``owns`` accepts (see :func:`remove_stale_temporaries_in`); none where nothing is
    renamed."""
    if not store.atomic_rename:
        return []
    directory = directory or "."
    try:
        names = store.listdir(directory)
    except OSError:
        return []
    out = []
    for name in names:
        final, mark, rest = name.partition(TMP_MARK)
        if not mark or not owns(final):
            continue
        pid = rest.split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _process_alive(int(pid)):
            continue
        out.append(store.join(directory, name))
    return out


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
