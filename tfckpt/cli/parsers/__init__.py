"""One parser builder per command: its arguments, help, description and examples, by the
kind of command (:mod:`~tfckpt.cli.parsers.inspecting`,
:mod:`~tfckpt.cli.parsers.rewriting`, :mod:`~tfckpt.cli.parsers.directories`); what they
share in :mod:`~tfckpt.cli.parsers.base`.

The options several commands share come from :mod:`tfckpt.cli.options`; each builder
names the function that runs its command (``func``, see :mod:`tfckpt.cli.commands`).

A command's ``--help`` is short, ``--help-all`` (and ``tfckpt help COMMAND --all``) the
whole (:mod:`~tfckpt.cli.parsers.helptext`); :func:`option_rows` gives a command's options
as rows for the docs' tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tfckpt.cli.parsers.base import add_help
from tfckpt.cli.parsers.completion import add_completion
from tfckpt.cli.parsers.directories import (
    add_cp,
    add_ls,
    add_mv,
    add_prune,
)
from tfckpt.cli.parsers.helptext import OptionRow, option_rows
from tfckpt.cli.parsers.inspecting import (
    add_check,
    add_diff,
    add_dump,
    add_stats,
    add_verify,
)
from tfckpt.cli.parsers.rewriting import (
    add_average,
    add_convert,
    add_edit,
    add_export,
    add_flatten,
    add_graft,
    add_import,
    add_match,
    add_merge,
    add_presets,
    add_rename,
    add_select,
)

if TYPE_CHECKING:
    from tfckpt.cli.parsers.base import Subparsers

# In the order `tfckpt --help` lists them.
COMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    add_dump,
    add_diff,
    add_stats,
    add_verify,
    add_check,
    add_convert,
    add_rename,
    add_select,
    add_merge,
    add_graft,
    add_flatten,
    add_average,
    add_export,
    add_import,
    add_presets,
    add_match,
    add_edit,
    add_ls,
    add_prune,
    add_cp,
    add_mv,
    add_completion,
    add_help,
)

__all__ = ["COMMANDS", "OptionRow", "option_rows"]
