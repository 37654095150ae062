"""Command line: ``tfckpt COMMAND ...`` / ``python -m tfckpt COMMAND ...``.

The entry point: the top-level parser, ``--storage-option`` values, warnings, errors and
interrupts. Each command's parser is in :mod:`tfckpt.cli.parsers` (the options several
share in :mod:`tfckpt.cli.options`), its implementation in :mod:`tfckpt.cli.commands`,
loaded only when it runs; the work is done by library functions.
Errors about checkpoints print one line on stderr and exit with status 2.

Human-readable output reaches the terminal only through :func:`tfckpt.cli.display.emit`,
which escapes what names, paths and messages from files could do to a terminal;
``--json`` prints JSON alone on stdout, names exact.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import traceback
import warnings

from tfckpt.cli.display import emit, print_script
from tfckpt.cli.options import parse_size
from tfckpt.cli.parsers import COMMANDS
from tfckpt.cli.parsers.base import DEBUG_HELP, Parser, finish
from tfckpt.cli.parsers.helptext import format_help
from tfckpt.errors import CheckpointError, CheckpointPathWarning, did_you_mean
from tfckpt.io.storage import check_options
from tfckpt.rewrite import collector
from tfckpt.version import __version__

__all__ = ["main", "parse_size"]

EXIT_ERROR = 2

MAX_OPTION_TEXT = 1 << 16  # characters of one --storage-option
MAX_OPTION_DEPTH = 16  # levels of nesting, in a dotted key and its JSON value together


def _depth(value: object, limit: int) -> int:
    """How deeply ``value`` nests lists and dicts (a scalar: 0), counted up to ``limit + 1``
    (without recursion: the value may be nested deeper than Python's stack)."""
    depth, level = 0, [value]
    while depth <= limit:
        containers = [x for x in level if isinstance(x, (list, dict))]
        if not containers:
            break
        depth += 1
        level = [v for x in containers for v in (x.values() if isinstance(x, dict) else x)]
    return depth


def parse_storage_option(text: str) -> tuple[list[str], object]:
    """``KEY=VALUE`` as (the dotted key's parts, the typed value)."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if len(text) > MAX_OPTION_TEXT:
        raise CheckpointError(
            f"--storage-option {text[:20]!r}...: longer than {MAX_OPTION_TEXT} characters"
        )
    if not sep or not all(parts):
        raise CheckpointError(f"--storage-option takes KEY=VALUE, not {text!r}")
    value = _typed_option_value(key, raw)
    if len(parts) + _depth(value, MAX_OPTION_DEPTH) > MAX_OPTION_DEPTH:
        raise CheckpointError(
            f"--storage-option {key}: nested more than {MAX_OPTION_DEPTH} levels deep"
        )
    return parts, value


def _typed_option_value(key: str, raw: str) -> object:
    value: object = raw
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        value = lowered == "true"
    elif lowered in ("none", "null"):
        value = None
    elif re.fullmatch(r"[+-]?\d+", raw.strip()):
        value = int(raw)
    elif raw.strip()[:1] in ("{", "[") or re.fullmatch(
        r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?", raw.strip()
    ):
        try:
            value = json.loads(raw)
        except ValueError as e:
            raise CheckpointError(f"--storage-option {key}: not JSON: {e}") from None
        except RecursionError:
            raise CheckpointError(
                f"--storage-option {key}: nested more than {MAX_OPTION_DEPTH} levels deep"
            ) from None
    return value


def nested_storage_options(pairs: list[tuple[list[str], object]]) -> dict | None:
    """The ``--storage-option`` pairs (:func:`parse_storage_option`) as one (nested)
    dict; None without any."""
    if not pairs:
        return None
    out: dict = {}
    for parts, value in pairs:
        level = out
        for i, part in enumerate(parts[:-1]):
            level = level.setdefault(part, {})
            if not isinstance(level, dict):
                raise CheckpointError(
                    f"--storage-option {'.'.join(parts)}: {'.'.join(parts[: i + 1])} "
                    "is set to a value, not to options"
                )
        level[parts[-1]] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    """The ``tfckpt`` parser: global flags, and one subparser per command."""
    parser = Parser(
        prog="tfckpt",
        usage="%(prog)s [--version] [--debug] COMMAND ...",
        description="Read, inspect and rewrite TensorFlow checkpoints directly from their files.",
        epilog="tfckpt help COMMAND (or tfckpt COMMAND --help) shows a command's options and "
        "examples; --help-all every option",
    )
    parser.add_argument("--version", action="version", version=f"tfckpt {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands", prog="tfckpt"
    )
    for add_command in COMMANDS:
        add_command(sub)  # type: ignore[arg-type]  # a Parser is an ArgumentParser
    finish(sub)  # type: ignore[arg-type]
    return parser


def _show_warning(default):
    """Library warnings about paths as one ``tfckpt: note:`` line on stderr; others as usual."""

    shown: set[str] = set()  # one note per fact, however many times a path is resolved

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, CheckpointPathWarning):
            if str(message) not in shown:
                shown.add(str(message))
                emit(f"tfckpt: note: {message}", err=True)
        else:
            default(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); the exit status."""
    for stream in (sys.stdout, sys.stderr):
        # An output encoding narrower than UTF-8 (PYTHONIOENCODING=ascii) shows an escape
        # for a character of a name it lacks, not a traceback.
        if (
            hasattr(stream, "reconfigure")
            and (stream.encoding or "").lower().replace("-", "") != "utf8"
        ):
            stream.reconfigure(errors="backslashreplace")
    program = argv is None and threading.current_thread() is threading.main_thread()
    try:
        with collector.paused():  # a command's records, by the hundred thousand
            try:
                return _main(argv)
            finally:
                if program:
                    # The program itself (not a caller in-process): its work is over,
                    # and a Ctrl-C from here on (the collector resuming, the exit)
                    # would only turn a finished run into an interrupted one.
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        print("tfckpt: interrupted", file=sys.stderr)
        return 130


def _help(parser: argparse.ArgumentParser, topic: str | None, *, everything: bool) -> int:
    """``tfckpt help [COMMAND] [--all]``."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if topic is None:
        parser.print_help()
        return 0
    if topic not in sub.choices:
        hint = did_you_mean(topic, list(sub.choices)) or " (tfckpt help lists the commands)"
        emit(f"tfckpt: error: no command {topic!r}{hint}", err=True)
        return EXIT_ERROR
    command = sub.choices[topic]
    print_script(format_help(command, everything=everything))
    return 0


def _warn_memory_output(args: argparse.Namespace) -> None:
    """A ``memory://`` output lives in this process: say so, before it is written."""
    output = getattr(args, getattr(args, "output_arg", "") or "", None)
    if (
        isinstance(output, str)
        and output.startswith("memory://")
        and not getattr(args, "dry_run", False)
    ):
        emit(
            f"tfckpt: warning: {output} is this process's memory: it is gone when the command "
            "ends (to keep the output, write to a directory, file:// or an object store)",
            err=True,
        )


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):
        # Bare `tfckpt`: what it can do, rather than that a command is missing.
        parser.print_help()
        return EXIT_ERROR
    args = parser.parse_args(argv)
    if args.command == "help":
        return _help(parser, args.topic, everything=args.all)
    _warn_memory_output(args)
    try:
        # Checked once, here; their errors (and the library's, later) name --storage-option.
        args.storage_options = check_options(
            nested_storage_options(list(map(parse_storage_option, args.storage_option_texts))),
            "--storage-option",
        )
        with warnings.catch_warnings():
            warnings.simplefilter("default", CheckpointPathWarning)
            warnings.showwarning = _show_warning(warnings.showwarning)
            # Commands load with their module, when one runs: --help and --version need none.
            from tfckpt.cli.commands import run

            return run(args)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, like other Unix tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (CheckpointError, re.error, OSError) as e:
        if args.debug:
            for line in traceback.format_exc().splitlines():
                emit(line, err=True)
        if isinstance(e, re.error):
            message = f"bad regular expression: {e}"
        elif isinstance(e, OSError) and not isinstance(e, CheckpointError):
            message = f"{e.filename or ''}: {e.strerror or e}".lstrip(": ")
        else:
            message = e.cli_message if isinstance(e, CheckpointError) else str(e)
        emit(f"tfckpt: error: {message}", err=True)
        return EXIT_ERROR
