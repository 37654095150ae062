"""A gin config file's bindings (``operative_config.gin``), as a preset reads them.

Only what a release's config says about its model is wanted, so only gin's statements
are understood, not its references: ``key = value`` bindings (``d_model = 512``,
``encoder/DenseReluDense.hidden_size = %d_ff``), where a value may run over several lines
inside brackets or after a backslash; ``import``, ``from ... import`` and ``include``
lines, and comments, are skipped. A value is the Python literal it spells (numbers,
strings, lists, ``None``...), a :class:`Macro` for ``%name``, or else its text as gin
wrote it (``@transformer.sublayer_rms_norm``).

>>> read_gin(b"d_ff = 2048\\nencoder/DenseReluDense.hidden_size = %d_ff\\n")
{'d_ff': 2048, 'encoder/DenseReluDense.hidden_size': Macro(name='d_ff')}
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

# scope/scope/module.Selector.parameter, or a macro's bare name
_KEY = re.compile(r"[A-Za-z_][\w.]*(/[A-Za-z_][\w.]*)*")
_MACRO = re.compile(r"%([A-Za-z_][\w./]*)")
_SKIPPED = re.compile(r"(import|from|include)\s")
_CLOSING = {")": "(", "]": "[", "}": "{"}


@dataclass(frozen=True)
class Macro:
    """A value that is another binding's (gin's ``%name``)."""

    name: str


def read_gin(data: bytes) -> dict[str, Any]:
    """The bindings of a gin file, by key (see the module's text); ``ValueError``
    naming the line of a statement that is not one."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not a text file (a gin config is UTF-8 text)") from None
    out: dict[str, Any] = {}
    for line, statement in _statements(text):
        if _SKIPPED.match(statement):
            continue
        key, sep, value = statement.partition("=")
        key = key.strip()
        if not sep or not _KEY.fullmatch(key):
            shown = statement if len(statement) <= 60 else statement[:57] + "..."
            raise ValueError(f"line {line}: not a gin binding (key = value): {shown!r}")
        out[key] = _value(value.strip())
    return out


def _value(text: str) -> Any:
    macro = _MACRO.fullmatch(text)
    if macro:
        return Macro(macro.group(1))
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text  # a reference (@name), a constant (%gin.REQUIRED)...: its text


def _statements(text: str):
    """(first line number, text) of each statement: comments left out, lines joined
    inside brackets and after a backslash."""
    parts: list[str] = []
    opened: list[str] = []  # the brackets open now
    quote = ""  # the quote of the string we are in
    line = start = 1
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                parts.append(text[i : i + 2])
                i += 2
                continue
            if c == "\n":
                raise ValueError(f"line {line}: a string is not closed")
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif c == "\\" and text[i + 1 : i + 2] == "\n":
            line += 1
            parts.append(" ")
            i += 2
            continue
        elif c in "([{":
            opened.append(c)
        elif c in _CLOSING:
            if not opened or opened.pop() != _CLOSING[c]:
                raise ValueError(f"line {line}: {c!r} closes no bracket")
        elif c == "\n":
            line += 1
            if not opened:
                statement = "".join(parts).strip()
                if statement:
                    yield start, statement
                parts, start = [], line
                i += 1
                continue
        parts.append(c)
        i += 1
    if quote:
        raise ValueError(f"line {line}: a string is not closed")
    if opened:
        raise ValueError(f"line {start}: {opened[-1]!r} is not closed")
    statement = "".join(parts).strip()
    if statement:
        yield start, statement
