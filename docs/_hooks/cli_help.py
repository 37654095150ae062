"""MkDocs hook: ``<!-- cli-help: COMMAND -->`` in a page becomes that command's ``--help``.

The command pages show their options as the parser defines them, so the reference cannot
drift from the command line. ``<!-- cli-help: -->`` (no command) gives ``tfckpt --help``.
"""

from __future__ import annotations

import argparse
import os
import re

_MARK = re.compile(r"<!--\s*cli-help:\s*([\w-]*)\s*-->")


def _help(command: str) -> str:
    from tfckpt.cli import build_parser

    os.environ["COLUMNS"] = "78"  # argparse wraps to it; the same width on every machine
    parser = build_parser()
    if not command:
        return parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command].format_help()
    raise ValueError(f"<!-- cli-help: {command} -->: no such command")


def on_page_markdown(markdown, page, config, files):
    """Replace each mark with the help text in a ``text`` block."""
    return _MARK.sub(lambda m: "```text\n" + _help(m[1]).rstrip() + "\n```", markdown)
