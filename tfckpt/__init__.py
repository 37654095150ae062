"""tfckpt: read, inspect and rewrite TensorFlow checkpoints directly from their files.

>>> import tfckpt
>>> with tfckpt.open("train/model.ckpt-7") as ckpt:
...     kernel = ckpt["dense/kernel"]
>>> tfckpt.save({"dense/kernel": kernel.astype("float16")}, "out/model")

TensorFlow is never imported by this package except by the ``tfckpt.tf`` bridge.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING

from .errors import (
    CastOverflowError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointPathWarning,
    CheckpointWriteError,
    CorruptCheckpointError,
    TensorNotFoundError,
    UnsupportedCheckpointError,
)

if TYPE_CHECKING:
    from .average import average
    from .engine import Summary, convert, execute, merge, rename, select, transform
    from .export import ExportSummary, export
    from .format import Header, TensorInfo, TensorTable, Version
    from .graft import flatten, graft, plan_flatten, plan_graft
    from .importing import import_
    from .inspection import checkpoints as list_checkpoints
    from .options import Options
    from .paths import latest_checkpoint
    from .planner import Plan, plan
    from .reader import Checkpoint
    from .slicing import TensorSlice
    from .writer import BundleWriter, save

# Public name -> (module, name there). Loaded on first use so that ``import tfckpt`` and the
# command line start without importing every module (see __getattr__).
_LAZY = {
    name: (module, name)
    for module, names in {
        "average": "average",
        "engine": "Summary convert execute merge rename select transform",
        "export": "ExportSummary export",
        "importing": "import_",
        "format": "Header TensorInfo TensorTable Version",
        "graft": "flatten graft plan_flatten plan_graft",
        "options": "Options",
        "paths": "latest_checkpoint",
        "planner": "Plan plan",
        "reader": "Checkpoint",
        "slicing": "TensorSlice",
        "writer": "BundleWriter save",
    }.items()
    for name in names.split()
}
_LAZY["list_checkpoints"] = ("inspection", "checkpoints")


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    # tfckpt.inspection.dump(...) and the like after a bare `import tfckpt`
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_LAZY})


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        # Importing a submodule binds it on the package: tfckpt.average, .graft and .export
        # must stay the functions of those names however their modules get imported.
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__version__ = "0.1.0"


def restore(target, path, **options):
    """Restore ``path`` into live TensorFlow variables, casting each value to its variable.

    See :func:`tfckpt.tf.restore`. Imports TensorFlow.

    >>> tfckpt.restore(tf.train.Checkpoint(model=float16_model), "train/ckpt-3")
    """
    from .tf import restore as _restore

    return _restore(target, path, **options)


def verify_with_tf(path, *, reference=None, storage_options=None) -> dict:
    """Compare every tensor with TensorFlow's own reader (and casts with ``tf.cast``).

    See :func:`tfckpt.tf.verify_with_tf`. Imports TensorFlow.

    >>> result = tfckpt.verify_with_tf("fp16/model.ckpt", reference="train/model.ckpt-7")
    >>> result["mismatches"]
    []
    """
    from .tf import verify_with_tf as _verify

    return _verify(path, reference=reference, storage_options=storage_options)


def open(  # noqa: A001 - mirrors safetensors' safe_open
    path, *, verify: bool = True, mmap: bool = True, storage_options=None
) -> Checkpoint:
    """Open a checkpoint for reading.

    ``path`` may be a prefix (``train/model.ckpt-7``), its ``.index`` file, a
    directory with a ``checkpoint`` state file (its latest checkpoint is taken),
    or a SavedModel directory; or a V1 (tensor-slice) checkpoint in any form
    TensorFlow accepts, read through the same API (see :mod:`tfckpt.v1`). With
    ``verify`` (the default) every tensor's CRC32C is checked when it is read;
    index block checksums are always checked. With ``mmap`` (the default),
    ``ckpt[name]`` of a local checkpoint views the mapped file (zero-copy); such
    an array dies with SIGBUS if the file is truncated later. ``mmap=False``
    reads into memory of its own. ``storage_options`` go to fsspec with a URL
    (endpoint, credentials, ``anon=True``...). ``ckpt.get_slice(name)[0:10]`` reads
    a part of a tensor (see :class:`~tfckpt.slicing.TensorSlice`).

    >>> ckpt = tfckpt.open("train")
    >>> ckpt.keys()[:2], ckpt.info("dense/kernel").dtype
    """
    from .reader import Checkpoint

    return Checkpoint(path, verify=verify, mmap=mmap, storage_options=storage_options)


__all__ = [
    "open",
    "save",
    "restore",
    "verify_with_tf",
    "transform",
    "convert",
    "rename",
    "select",
    "merge",
    "graft",
    "flatten",
    "average",
    "plan",
    "plan_graft",
    "plan_flatten",
    "Plan",
    "Summary",
    "Checkpoint",
    "TensorSlice",
    "BundleWriter",
    "TensorInfo",
    "TensorTable",
    "Header",
    "Version",
    "latest_checkpoint",
    "list_checkpoints",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "UnsupportedCheckpointError",
    "CheckpointWriteError",
    "TensorNotFoundError",
    "execute",
    "Options",
    "CastOverflowError",
    "CheckpointPathWarning",
    "export",
    "import_",
    "ExportSummary",
]
