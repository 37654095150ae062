"""Griffe extension: the docstrings' reStructuredText habits, read as Markdown.

The docstrings are reStructuredText-flavoured (``:func:`name```, doctest blocks); in
Markdown a ``>>>`` line would read as a nested quotation and ``[a][b]`` in it as a link.
Each run of lines starting at ``>>>`` (with its ``...`` continuations and the output lines
after it, up to a blank line) becomes a fenced ``python`` block, and a role such as
``:class:`~tfckpt.checkpoint.slicing.TensorSlice``` becomes code (``TensorSlice``, the
``~`` keeping the last part only, as Sphinx shows it).
"""

from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|exc|data|obj):`(~?)([^`]+)`")


def _role(m: re.Match) -> str:
    target = m[2].split(".")[-1] if m[1] else m[2]
    return f"`{target}`"


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
    """Fence the doctest examples and plain the roles of every docstring griffe loads."""

    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is None:
            return
        text = _ROLE.sub(_role, obj.docstring.value)
        if ">>>" in text:
            text = fence_doctests(text)
        obj.docstring.value = text
