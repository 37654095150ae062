"""tfckpt: read, inspect and rewrite TensorFlow checkpoints directly from their files.

>>> import tfckpt
>>> with tfckpt.open("train/model.ckpt-7") as ckpt:
...     kernel = ckpt["dense/kernel"]
>>> tfckpt.save({"dense/kernel": kernel.astype("float16")}, "out/model")

TensorFlow is never imported by this package except by the ``tfckpt.tf`` bridge.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tfckpt.errors import (
    CastOverflowError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointPathWarning,
    CheckpointWriteError,
    CorruptCheckpointError,
    TensorNotFoundError,
    UnknownDTypeError,
    UnsupportedCheckpointError,
)
from tfckpt.version import __version__ as __version__

if TYPE_CHECKING:
    from tfckpt.checkpoint.reader import Checkpoint
    from tfckpt.checkpoint.writer import BundleWriter, save
    from tfckpt.format.bundle import TensorInfo
    from tfckpt.inspection import checkpoints as list_checkpoints
    from tfckpt.inspection.check import check
    from tfckpt.interop.export import export
    from tfckpt.interop.importing import import_
    from tfckpt.interop.matching import match
    from tfckpt.io.paths import latest_checkpoint
    from tfckpt.rewrite.average import average
    from tfckpt.rewrite.editing import edit
    from tfckpt.rewrite.engine import Summary, convert, execute, merge, rename, select, transform
    from tfckpt.rewrite.graft import flatten, graft
    from tfckpt.rewrite.options import Options
    from tfckpt.rewrite.planner import plan
    from tfckpt.rewrite.plans import Plan

# Public name -> (module, name there), loaded on first use so that ``import tfckpt`` and the
# command line start without importing every layer (PEP 562 module __getattr__). Everything
# else lives in the layer packages: tfckpt.format, .io, .checkpoint, .rewrite, .interop.
_LAZY = {
    name: (module, name)
    for module, names in {
        "tfckpt.checkpoint.reader": "Checkpoint",
        "tfckpt.checkpoint.writer": "BundleWriter save",
        "tfckpt.format.bundle": "TensorInfo",
        "tfckpt.inspection.check": "check",
        "tfckpt.interop.export": "export",
        "tfckpt.interop.importing": "import_",
        "tfckpt.interop.matching": "match",
        "tfckpt.io.paths": "latest_checkpoint",
        "tfckpt.rewrite.average": "average",
        "tfckpt.rewrite.editing": "edit",
        "tfckpt.rewrite.engine": "Summary convert execute merge rename select transform",
        "tfckpt.rewrite.graft": "flatten graft",
        "tfckpt.rewrite.options": "Options",
        "tfckpt.rewrite.planner": "plan",
        "tfckpt.rewrite.plans": "Plan",
    }.items()
    for name in names.split()
}
_LAZY["list_checkpoints"] = ("tfckpt.inspection", "checkpoints")


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_LAZY})


def restore(target, path, **options):
    """Restore ``path`` into live TensorFlow variables, casting each value to its variable.

    See :func:`tfckpt.tf.restore`. Imports TensorFlow.

    >>> tfckpt.restore(tf.train.Checkpoint(model=float16_model), "train/ckpt-3")
    """
    from tfckpt.tf import restore as _restore

    return _restore(target, path, **options)


def verify_with_tf(path, *, reference=None, storage_options=None) -> dict:
    """Compare every tensor with TensorFlow's own reader (and casts with ``tf.cast``).

    See :func:`tfckpt.tf.verify_with_tf`. Imports TensorFlow.

    >>> result = tfckpt.verify_with_tf("fp16/model.ckpt", reference="train/model.ckpt-7")
    >>> result["mismatches"]
    []
    """
    from tfckpt.tf import verify_with_tf as _verify

    return _verify(path, reference=reference, storage_options=storage_options)


def open(  # noqa: A001 - mirrors safetensors' safe_open
    path, *, verify: bool = True, mmap: bool = True, storage_options=None
) -> Checkpoint:
    """Open a checkpoint for reading.

    ``path`` may be a prefix (``train/model.ckpt-7``), its ``.index`` file, a
    directory with a ``checkpoint`` state file (its latest checkpoint is taken),
    or a SavedModel directory; or a V1 (tensor-slice) checkpoint in any form
    TensorFlow accepts, read through the same API (see :mod:`tfckpt.checkpoint.v1`). With
    ``verify`` (the default) every tensor's CRC32C is checked when it is read;
    index block checksums are always checked. With ``mmap`` (the default),
    ``ckpt[name]`` of a local checkpoint views the mapped file (zero-copy); such
    an array dies with SIGBUS if the file is truncated later. ``mmap=False``
    reads into memory of its own. ``storage_options`` go to fsspec with a URL
    (endpoint, credentials, ``anon=True``...). ``ckpt.get_slice(name)[0:10]`` reads
    a part of a tensor (see :class:`~tfckpt.checkpoint.slicing.TensorSlice`).

    >>> ckpt = tfckpt.open("train")
    >>> ckpt.keys()[:2], ckpt.info("dense/kernel").dtype
    """
    from tfckpt.checkpoint.opening import open_checkpoint

    return open_checkpoint(path, verify=verify, mmap=mmap, storage_options=storage_options)


__all__ = [
    # reading and writing
    "open",
    "save",
    "Checkpoint",
    "TensorInfo",
    "BundleWriter",
    "latest_checkpoint",
    "list_checkpoints",
    "check",
    # the verbs: each plans, then runs the one engine
    "convert",
    "rename",
    "select",
    "merge",
    "transform",
    "graft",
    "flatten",
    "average",
    "edit",
    "export",
    "import_",
    "match",
    "plan",
    "execute",
    "Plan",
    "Summary",
    "Options",
    # TensorFlow, imported only when called
    "restore",
    "verify_with_tf",
    # errors
    "CheckpointError",
    "CheckpointNotFoundError",
    "CorruptCheckpointError",
    "UnsupportedCheckpointError",
    "CheckpointWriteError",
    "TensorNotFoundError",
    "UnknownDTypeError",
    "CastOverflowError",
    "CheckpointPathWarning",
]
