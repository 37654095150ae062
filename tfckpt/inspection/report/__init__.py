"""Pictures of what a cast does: ``tfckpt stats --html`` and ``tfckpt convert --report``.

A report is one self-contained HTML page: per tensor, its values on a log2 scale over the
target dtype's normal, subnormal and overflow ranges, what becomes zero, subnormal or
inf, and after a conversion the relative error of the cast; a summary on top and a
table of every tensor. :mod:`~tfckpt.inspection.report.data` counts (no plotting
library), :mod:`~tfckpt.inspection.report.figures` draws with matplotlib (the optional
``report`` extra), :mod:`~tfckpt.inspection.report.page` writes the page.

Imported by name, never by :mod:`tfckpt.inspection`: only a report loads matplotlib.

>>> from tfckpt.inspection import report
>>> with tfckpt.open("train/model.ckpt-7") as ckpt:
...     report.write_report("report.html", report.stats_report(ckpt, "float16"))
"""

from __future__ import annotations

from collections.abc import Sequence

from tfckpt.errors import CheckpointError, install_hint
from tfckpt.inspection.report.data import (
    DEFAULT_TOP,
    bands,
    conversion_report,
    stats_report,
    summary,
)
from tfckpt.io.commit import Commit
from tfckpt.io.paths import index_filename, parse_data_filename
from tfckpt.io.storage import StorageOptions, normalize, storage_for

__all__ = [
    "DEFAULT_TOP",
    "bands",
    "check_available",
    "check_destination",
    "conversion_report",
    "render_html",
    "stats_report",
    "summary",
    "write_report",
]


def render_html(data: dict, *, top: int = DEFAULT_TOP) -> str:
    """The HTML page of a report's data; see :func:`tfckpt.inspection.report.page.render_html`.
    Raises :class:`~tfckpt.errors.CheckpointError` when matplotlib is not installed."""
    return _page().render_html(data, top=top)


def check_available() -> None:
    """Refuse a report before any work (a conversion's writing first) when matplotlib
    cannot be imported: :class:`~tfckpt.errors.CheckpointError`, as :func:`render_html`."""
    _page()


def _page():
    try:
        from tfckpt.inspection.report import page
    except ImportError as e:
        if e.name is None or not e.name.startswith("matplotlib"):
            raise
        raise CheckpointError(
            f"an HTML report needs matplotlib: {install_hint('report')}"
        ) from None
    return page


def check_destination(
    path,
    *,
    overwrite: bool,
    storage_options: StorageOptions | None = None,
    checkpoints: Sequence[str] = (),
) -> None:
    """Refuse ``path`` before any work when a file is there and ``overwrite`` is false, or
    when it is a file of one of ``checkpoints`` (prefixes): a report never replaces the
    checkpoint it describes, whatever ``overwrite`` says."""
    path = normalize(path)
    store = storage_for(path, storage_options)
    for prefix in checkpoints:
        prefix = normalize(prefix)
        ours = parse_data_filename(path)
        if path in (prefix, index_filename(prefix)) or (ours and ours[0] == prefix):
            raise CheckpointError(
                f"the report would replace a file of the checkpoint {prefix}", path=path
            )
    if store.exists(path) and not overwrite:
        raise CheckpointError("the report file already exists (use --overwrite)", path=path)


def write_report(
    path,
    data: dict,
    *,
    top: int = DEFAULT_TOP,
    overwrite: bool = False,
    storage_options: StorageOptions | None = None,
) -> str:
    """Render ``data`` and write the page to ``path``, made visible at once by the commit
    every writer uses; an existing file is replaced only with ``overwrite``. The path."""
    html = render_html(data, top=top).encode("utf-8")
    path = normalize(path)
    described = [data["source"]] + ([data["output"]] if data["output"] else [])
    check_destination(
        path, overwrite=overwrite, storage_options=storage_options, checkpoints=described
    )
    store = storage_for(path, storage_options)
    commit = Commit(store, path, overwrite=overwrite, what="a report")
    try:
        directory = store.dirname(path)
        if directory and not store.isdir(directory):
            commit.make_directory(directory)
        commit.write_last(html)
        commit.publish()
    except BaseException:
        commit.discard()
        raise
    return path
