"""MkDocs hook: ``<!-- cli-help: COMMAND -->`` in a page becomes that command's options, as
tables made from its parser at build time, so the reference cannot drift from the command
line. ``<!-- cli-help: -->`` (no command) gives the commands and the top-level options.

Every option the parser holds is listed, whatever its ``--help`` shows: the table reads the
parser's actions, not the help text. The command's own groups come first (its arguments,
its options, the groups only it has), then the groups it shares with other commands (the
rewriting options, the options every command takes), each under a heading of its own, and
the help options last. Where the command line says which options its short ``--help``
shows (``tfckpt.cli.parsers.option_rows``), those are drawn in bold.

The tables are HTML, not Markdown: an option's help may hold ``|`` (a regular expression),
which a Markdown table would take for a cell boundary or show escaped.
"""

from __future__ import annotations

import argparse
import html
import re
from dataclasses import dataclass

_MARK = re.compile(r"<!--\s*cli-help:\s*([\w-]*)\s*-->")

# Groups argparse makes itself: every command has them, their content is the command's own.
_OWN_TITLES = ("positional arguments", "options")
_HEADINGS = {"positional arguments": "Arguments", "options": "Options"}
# Actions whose default says nothing (a flag's False, a help's SUPPRESS...).
_NO_DEFAULT = (
    argparse._HelpAction,
    argparse._VersionAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._StoreConstAction,
    argparse._CountAction,
)


@dataclass
class Group:
    """One table: a heading, whether other commands share it, its actions."""

    title: str
    shared: bool
    actions: list[argparse.Action]


def _top() -> argparse.ArgumentParser:
    from tfckpt.cli import build_parser

    return build_parser()


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise ValueError("tfckpt's parser has no commands")


def _signature(group) -> tuple:
    return (group.title, tuple(tuple(a.option_strings) or (a.dest,) for a in group._group_actions))


def groups(command: str) -> list[Group]:
    """``command``'s options as the site lists them: its own groups, then the shared ones,
    then the help options.

    A titled group is shared when another command has the same group (title and options),
    as every rewriting command has ``cast`` or ``output``.
    """
    commands = _commands(_top())
    if command not in commands.choices:
        raise ValueError(f"<!-- cli-help: {command} -->: no such command")
    others = {
        _signature(g)
        for name, p in commands.choices.items()
        if name != command
        for g in p._action_groups
    }
    found, helps = [], []
    for g in commands.choices[command]._action_groups:
        actions = [a for a in g._group_actions if not _is_help(a)]
        helps += [a for a in g._group_actions if _is_help(a)]
        if not actions:
            continue
        shared = g.title not in _OWN_TITLES and _signature(g) in others
        title = _HEADINGS.get(g.title) or g.title[:1].upper() + g.title[1:]
        found.append(Group(title, shared, actions))
    found.sort(key=lambda g: g.shared)  # stable: the parser's order within each kind
    if helps:
        found.append(Group("Help", False, helps))
    return found


def _is_help(action: argparse.Action) -> bool:
    """``-h``/``--help`` and its kin (``--help-all``): listed last, under Help."""
    return isinstance(action, argparse._HelpAction) or any(
        o.startswith("--help") for o in action.option_strings
    )


def usage(command: str) -> str:
    """The one-line usage of ``command``, as its ``--help`` starts."""
    parser = _commands(_top()).choices[command]
    return parser.format_usage().removeprefix("usage: ").strip()


def _size(value: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f"{value >> shift}{unit}"
    return str(value)


def _code(text: str) -> str:
    return f"<code>{html.escape(text)}</code>"


def _option(name: str) -> str:
    """An option's name: code that the stylesheet keeps on one line."""
    return f"<code data-opt>{html.escape(name)}</code>"


def _breakable(text: str) -> str:
    """``text`` escaped, a line break allowed after ``,``, ``=`` and ``:`` (long metavars)."""
    return re.sub(r"([,=:])", r"\1<wbr>", html.escape(text))


def _argument(action: argparse.Action) -> str:
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return ", ".join(_code(str(c)) for c in action.choices)
    if action.nargs == 0:
        return ""
    formatter = argparse.HelpFormatter("tfckpt")
    default = action.dest.upper() if action.option_strings else action.dest
    text = formatter._format_args(action, default)
    return f"<code>{_breakable(text)}</code>"


def _default(action: argparse.Action) -> str:
    if getattr(action, "required", False) and action.option_strings:
        return "required"
    value = action.default
    if isinstance(action, _NO_DEFAULT) or value in (None, [], argparse.SUPPRESS):
        return ""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 10:
        return _code(_size(value))
    return _code(str(value))


# In help text: an option's name, or a quoted example, reads as code.
_CODE = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)|(?<!\w)'([^'\s]+)'(?!\w)")


def _description(action: argparse.Action) -> str:
    text = action.help or ""
    if text == argparse.SUPPRESS:
        text = ""
    params = {**vars(action), "prog": "tfckpt"}
    if "%" in text:
        try:
            text = text % params
        except (KeyError, TypeError, ValueError):
            pass
    out, last = [], 0
    for m in _CODE.finditer(text):
        out.append(html.escape(text[last : m.start()]))
        out.append(_option(m[1]) if m[1] else _code(f"'{m[2]}'"))
        last = m.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


def _names(action: argparse.Action) -> str:
    if not action.option_strings:  # as the usage line writes it: [DST], SRC [SRC ...]
        formatter = argparse.HelpFormatter("tfckpt")
        return _code(formatter._format_args(action, action.dest))
    return ", ".join(_option(o) for o in action.option_strings)


def _table(
    head: tuple[str, ...], rows: list[tuple[str, ...]], kind: str, marked: list[bool] | None = None
) -> str:
    cells = "".join(f"<th>{h}</th>" for h in head)
    marks = marked or [False] * len(rows)
    body = "\n".join(
        ("<tr data-essential>" if mark else "<tr>")
        + "".join(f"<td>{c}</td>" for c in row)
        + "</tr>"
        for row, mark in zip(rows, marks)
    )
    return (
        f'<table data-cli="{kind}">\n<thead><tr>{cells}</tr></thead>\n'
        f"<tbody>\n{body}\n</tbody>\n</table>"
    )


def essential(command: str) -> set[str] | None:
    """The flags ``tfckpt COMMAND --help`` shows (the rest only ``--help-all``), as the
    command line says (``tfckpt.cli.parsers.option_rows``); None where it does not say,
    its help showing every option."""
    try:
        from tfckpt.cli.parsers import option_rows
    except ImportError:
        return None
    return {flag for row in option_rows(command) if row.essential for flag in row.flags}


def options_table(group: Group, shown: set[str] | None = None) -> str:
    """One group's table: Option | Argument | Default | Description; the rows of the
    options in ``shown`` marked (``data-essential``, drawn in bold)."""
    if group.title == "Arguments":
        rows = [(_names(a), _description(a)) for a in group.actions]
        return _table(("Argument", "Description"), rows, "arguments")
    rows = [(_names(a), _argument(a), _default(a), _description(a)) for a in group.actions]
    marked = [bool(shown and shown & set(a.option_strings)) for a in group.actions]
    return _table(("Option", "Argument", "Default", "Description"), rows, "options", marked)


def command_markdown(command: str) -> str:
    """The usage line, then a heading and a table per group of options."""
    parts = [f"```text\n{usage(command)}\n```"]
    shown = essential(command)
    if shown:
        parts.append(
            f"The options in bold are those `tfckpt {command} --help` shows; "
            f"`tfckpt {command} --help-all` shows them all, as these tables do."
        )
    for g in groups(command):
        title = g.title + (" (shared)" if g.shared and "shared" not in g.title else "")
        parts += [f"### {title}", options_table(g, shown)]
    return "\n\n".join(parts)


def top_markdown(page, files) -> str:
    """``tfckpt --help`` as tables: the commands, each linked to its page, and the options."""
    parser = _top()
    commands = _commands(parser)
    rows = []
    for choice in commands._choices_actions:
        name = choice.dest
        target = files.get_file_from_path(f"commands/{name}.md")
        cell = _code(name)
        if target is not None:
            cell = f'<a href="{html.escape(target.url_relative_to(page.file))}">{cell}</a>'
        rows.append((cell, html.escape(choice.help or "")))
    listing = _table(("Command", "What it does"), rows, "commands")
    options = [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]
    table = options_table(Group("Options", False, options))
    usage_line = parser.format_usage().removeprefix("usage: ").strip()
    return "\n\n".join([f"```text\n{usage_line}\n```", listing, table])


def on_page_markdown(markdown, page, config, files):
    """Replace each mark with its tables (raw HTML, kept as it is by Markdown)."""

    def expand(m: re.Match) -> str:
        if not m[1]:
            return top_markdown(page, files)
        return command_markdown(m[1])

    return _MARK.sub(expand, markdown)
