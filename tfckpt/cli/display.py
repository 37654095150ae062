"""Human-readable and JSON output of the command line: the one way text reaches the user.

Human-readable output goes through :func:`emit`, which escapes what names, paths and
messages from files could do to a terminal (:func:`show`); tables fit the terminal
(:func:`table`); ``--json`` output is strict JSON alone on stdout (:func:`print_json`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterable

import numpy as np


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def shape_text(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _escape_char(c: str) -> str:
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape): show the byte
        return f"\\x{n - 0xDC00:02x}"
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def show(text) -> str:
    """``text`` safe for a terminal: each character ``str.isprintable()`` rejects, escaped.

    Names, paths and messages come from files. Raw, an escape sequence in one could clear
    the screen, retitle the window or write the clipboard (OSC 52), a newline could forge
    table rows and a bidi override could reorder what is shown. Escaped as ``\\x1b``,
    ``\\x0a``, ``\\u202e``; a byte that is not UTF-8 shows as ``\\xNN``.
    Applying it twice changes nothing.
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape_char(c) for c in text)


def emit(*parts, err: bool = False) -> None:
    """Print one line of human-readable output; every part goes through :func:`show`.

    A part is text, or ``(text, SGR code)`` to colour it on a terminal.
    """
    stream = sys.stderr if err else sys.stdout
    print(
        "".join(color(show(p[0]), p[1]) if isinstance(p, tuple) else show(p) for p in parts),
        file=stream,
    )


def width() -> int | None:
    """Columns to fit: the terminal's, or $COLUMNS; None (no limit) when piped."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return shutil.get_terminal_size((80, 24)).columns
    return None


def color(text: str, code: str) -> str:
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        return f"\033[{code}m{text}\033[0m"
    return text


def shorten(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    keep = max(width - 1, 2)
    head = keep // 2
    return text[:head] + "…" + text[len(text) - (keep - head) :]


def table(rows: list[list[str]], right: set[int], squeeze: int = 0) -> None:
    """Print aligned columns; column ``squeeze`` is shortened to fit the terminal."""
    rows = [[show(c) for c in r] for r in rows]  # escaped first, so widths are what shows
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    limit = width()
    if limit is not None:
        others = sum(widths) - widths[squeeze] + 2 * (len(widths) - 1)
        room = max(limit - others, 12)
        if widths[squeeze] > room:
            rows = [r[:squeeze] + [shorten(r[squeeze], room)] + r[squeeze + 1 :] for r in rows]
            widths[squeeze] = room
    for k, r in enumerate(rows):
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ]
        line = "  ".join(cells).rstrip()
        emit((line, "1") if k == 0 else line)


def _json_safe(value):
    """Strict JSON: non-finite floats become the strings "NaN", "Infinity", "-Infinity"."""
    if isinstance(value, float) and not np.isfinite(value):
        return "NaN" if np.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def compact_json() -> bool:
    """JSON is printed compact (for programs) rather than indented (for a person)."""
    return not sys.stdout.isatty()


def print_json(data) -> None:
    # Indented for a person at a terminal; compact (and C-encoded: fast) for programs.
    indent = None if compact_json() else 1
    try:
        text = json.dumps(data, indent=indent, allow_nan=False)
    except ValueError:  # NaN or inf somewhere: spell them out, strict JSON has none
        text = json.dumps(_json_safe(data), indent=indent, allow_nan=False)
    print_json_text(text)


def print_json_text(parts: str | Iterable[str]) -> None:
    """Print JSON text that ``json.dumps`` wrote with ``ensure_ascii`` (the default), or
    its equal, given whole or in consecutive parts (each written as it comes): ASCII
    only, DEL and control characters escaped, so no name can upset the output encoding
    or the terminal."""
    for part in [parts] if isinstance(parts, str) else parts:
        sys.stdout.write(part)
    sys.stdout.write("\n")


def print_script(text: str) -> None:
    """Print a script or text the command line made itself from its own parser (a
    completion script, a command's help): lines kept as they are, as the shell must
    read them."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def fmt(v, digits: int = 6) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)
