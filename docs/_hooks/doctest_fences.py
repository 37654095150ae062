"""Griffe extension: a docstring's ``>>>`` examples rendered as Python code.

The docstrings are reStructuredText-flavoured (``:func:``, doctest blocks); in Markdown a
``>>>`` line would read as a nested quotation and ``[a][b]`` in it as a link. Each run of
lines starting at ``>>>`` (with its ``...`` continuations and the output lines after it,
up to a blank line) becomes a fenced ``python`` block.
"""

from __future__ import annotations

import griffe


def fence_doctests(text: str) -> str:
    """``text`` with each doctest run fenced."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.lstrip().startswith(">>>") and not inside:
            indent = line[: len(line) - len(line.lstrip())]
            out += ["", f"{indent}```python"]
            inside = True
        elif inside and not line.strip():
            out.append(f"{indent}```")
            inside = False
        out.append(line)
    if inside:
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fence the doctest examples of every docstring griffe loads."""

    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
