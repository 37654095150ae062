"""A command's help, short (``--help``) and whole (``--help-all``), and its options as
rows for the docs' tables (:func:`option_rows`).

The short help shows a command's own options and the shared ones people use most
(:data:`tfckpt.cli.options.COMMON`); every other option stays a real action of the
parser, hidden at format time only (:func:`tfckpt.cli.options.is_essential`), so that
``--help-all``, completion and the docs list it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from typing import NamedTuple

from tfckpt.cli import options as opt

DOCS_PAGE = "docs/commands/{}.md"
"""Where a command's page is (in the repository; the site's Commands section)."""
PAGELESS = {"completion": "docs/cli.md", "help": "docs/cli.md"}


def docs_page(command: str) -> str:
    """The page that documents ``command``."""
    return PAGELESS.get(command) or DOCS_PAGE.format(command)


class HelpAll(argparse.Action):
    """``--help-all``: the whole help (every option, the whole description), then exit."""

    help_all = True  # read by tfckpt.cli.options.is_essential

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(format_help(parser, everything=True), sys.stdout)
        parser.exit()


def _own(action: argparse.Action) -> bool:
    return not opt.is_shared(action)


def _helps(action: argparse.Action) -> bool:
    return isinstance(action, (argparse._HelpAction, HelpAll))


def _width() -> int:
    return max(shutil.get_terminal_size().columns - 2, 40)  # as argparse wraps


def format_help(parser: argparse.ArgumentParser, *, everything: bool) -> str:
    """``parser``'s help: its short form (the first paragraph of the description, the
    options :func:`~tfckpt.cli.options.is_essential` picks, then a line naming
    ``--help-all`` and the docs page) or, with ``everything``, every option in its group,
    the command's own groups first."""
    name = parser.prog.split()[-1]
    formatter = parser._get_formatter()
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    paragraphs = (parser.description or "").split("\n\n")
    shown = paragraphs if everything else paragraphs[:1]
    formatter.add_text("\n\n".join(textwrap.fill(p, _width()) for p in shown if p))
    groups = parser._action_groups
    if everything:
        sections = [(g.title, g.description, g._group_actions) for g in groups]
    else:
        essential = [a for a in parser._actions if opt.is_essential(a)]
        sections = [
            (g.title, None, [a for a in g._group_actions if a in essential and _own(a)])
            for g in groups
        ]
        sections.append(("common options", None, [a for a in essential if not _own(a)]))
    for title, description, actions in sections:
        if not actions:
            continue
        formatter.start_section(title)
        if description:
            formatter.add_text(textwrap.fill(description, _width() - 2))
        formatter.add_arguments(actions)
        formatter.end_section()
    formatter.add_text(parser.epilog)
    hidden = sum(
        1 for a in parser._actions if a.option_strings and not _helps(a) and not opt.is_essential(a)
    )
    if not getattr(parser, "short_help", False):
        pass  # not a command's parser: the top level, help
    elif everything:
        formatter.add_text(f"docs: {docs_page(name)}")
    else:
        more = f"{hidden} more options" if hidden else "the whole help"
        formatter.add_text(f"{more}: {parser.prog} --help-all; docs: {docs_page(name)}")
    return formatter.format_help()


class OptionRow(NamedTuple):
    """One option of a command, as its docs table shows it."""

    flags: tuple[str, ...]
    """Its spellings, e.g. ``("-o", "--output")``; ``()`` for a positional argument."""
    metavar: str | None
    """What follows the flag (``DST``, ``{error,clip,inf}``), or a positional's name;
    None for a switch."""
    default: object
    """The value the command uses when it is not given; None where there is none to
    show (a switch, a repeatable option, no default)."""
    help: str
    """Its sentence in ``--help-all``."""
    essential: bool
    """Whether the short ``--help`` shows it."""


def _default(action: argparse.Action) -> object:
    value = action.default
    if value is argparse.SUPPRESS or value in ([], ()) or action.nargs == 0:
        return None
    return value


def option_rows(command: str, *, positionals: bool = False) -> list[OptionRow]:
    """The options of ``tfckpt COMMAND`` in the order ``--help-all`` lists them (the
    command's own first, then the shared ones), each with its flags, metavar, default,
    help and whether the short ``--help`` shows it; with ``positionals``, its positional
    arguments first (``flags == ()``). ``-h/--help`` and ``--help-all`` are left out.
    Made from the parser itself: the docs' option tables cannot drift from it.

    >>> rows = option_rows("convert")
    >>> next(r for r in rows if "--dtype" in r.flags).essential
    True
    >>> next(r for r in rows if "--executor" in r.flags).essential
    False
    """
    from tfckpt.cli import build_parser  # the whole command line, built once per call

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if command not in sub.choices:
        raise ValueError(f"no command {command!r}")
    p = sub.choices[command]
    formatter = p._get_formatter()
    rows = []
    for group in p._action_groups:
        for a in group._group_actions:
            if _helps(a) or (not a.option_strings and not positionals):
                continue
            metavar = None if a.nargs == 0 else formatter._format_args(a, a.dest.upper())
            rows.append(
                OptionRow(
                    tuple(a.option_strings),
                    metavar,
                    _default(a) if a.option_strings else None,
                    " ".join((a.help or "").split()),
                    opt.is_essential(a),
                )
            )
    if positionals:
        rows.sort(key=lambda r: bool(r.flags))
    return rows
