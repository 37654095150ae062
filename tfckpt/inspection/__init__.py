"""What is in a checkpoint, as plain data: the library side of ``tfckpt dump``, ``diff``,
``stats``, ``verify`` and ``list_checkpoints``.

Functions here return dicts and lists of JSON-ready values; printing them is the
CLI's job. One module per verb (:mod:`~tfckpt.inspection.dump`,
:mod:`~tfckpt.inspection.diff`, :mod:`~tfckpt.inspection.stats`,
:mod:`~tfckpt.inspection.verify`, :mod:`~tfckpt.inspection.listing`,
:mod:`~tfckpt.inspection.meta` for TF1 graph files, :mod:`~tfckpt.inspection.check` for
``check --against``), what they share in :mod:`~tfckpt.inspection.reading`. A directory
of checkpoints (``ls``, ``prune``, ``cp``, ``mv``) is
:mod:`~tfckpt.inspection.directories`, imported by name: it writes, and the read-only
commands load no writer.

>>> with tfckpt.open("train/model.ckpt-7") as ckpt:
...     tfckpt.inspection.stats(ckpt, filter="kernel")
"""

from tfckpt.inspection.check import check
from tfckpt.inspection.diff import compare_values, diff
from tfckpt.inspection.dump import dump, dump_json, dump_json_parts, object_graph
from tfckpt.inspection.listing import checkpoints
from tfckpt.inspection.meta import meta_graph
from tfckpt.inspection.stats import CAST_CHECK_TARGETS, stats
from tfckpt.inspection.verify import verify

__all__ = [
    "CAST_CHECK_TARGETS",
    "check",
    "checkpoints",
    "compare_values",
    "diff",
    "dump",
    "dump_json",
    "dump_json_parts",
    "meta_graph",
    "object_graph",
    "stats",
    "verify",
]
