"""The parser of ``tfckpt completion SHELL``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfckpt.cli.parsers.base import command

if TYPE_CHECKING:
    from tfckpt.cli.parsers.base import Subparsers

SHELLS = ("bash", "zsh", "fish", "tcsh")


def add_completion(sub: Subparsers) -> None:
    """``tfckpt completion SHELL``."""
    p = command(
        sub,
        "completion",
        "print a shell's tab-completion script",
        "Print the script that completes tfckpt's commands, options and their choices in "
        "SHELL, made from this version's parser (load it from the shell's startup file, "
        "or save it where the shell looks for completions).",
    )
    p.add_argument("shell", metavar="SHELL", choices=SHELLS, help=", ".join(SHELLS))
    p.set_defaults(func="completion.cmd_completion")
