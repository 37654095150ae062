"""Name patterns, matched in time linear in the name: RE2 (the ``google-re2`` package).

Python's :mod:`re` backtracks: ``'^(a+)+$'`` on a name of 30 ``a`` and a ``b`` takes
minutes, each character doubling it. Every pattern a rewrite matches against tensor
names (include, exclude, renames, name maps, dtype rules, value transforms, split and
concat) is compiled here instead, by RE2, which never backtracks. Its syntax is
Python's, less what needs backtracking:

- no backreferences in a pattern (``(a)\\1``), lookahead or lookbehind (``(?=``,
  ``(?!``, ``(?<=``, ``(?<!``), possessive quantifiers or atomic groups: such a
  pattern is a :class:`~tfckpt.CheckpointError` saying so;
- ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII (``\\p{L}``, ``\\p{N}`` match any
  letter, any digit); ``$`` is the end of the name only; a repetition counts to 1000.

``\\Z`` (Python's end of text) and ``{,n}`` (up to n) are taken as Python means them.
Replacement templates (``\\1``, ``\\g<name>``) are expanded as :meth:`re.Match.expand`
expands them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import re2

from tfckpt.errors import CheckpointError

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # RE2 would print each refused pattern on stderr


# A name's undecodable bytes are kept as the characters \udc80-\udcff (see
# tfckpt.format.orderedcode), which UTF-8 cannot hold: RE2 sees each as a character of
# the last private-use plane instead, so that ``.`` and ``[^/]`` match it, as in Python.
_ESCAPED = {0xDC80 + b: 0x10FF80 + b for b in range(128)}
_UNESCAPED = {v: k for k, v in _ESCAPED.items()}


def _encoded(text: str) -> bytes:
    """``text`` as the UTF-8 RE2 matches."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.translate(_ESCAPED).encode("utf-8", "surrogatepass")


def _decoded(data: bytes) -> str:
    text = data.decode("utf-8", "surrogatepass")
    return text if text.isascii() else text.translate(_UNESCAPED)


def _python_syntax(pattern: str) -> str:
    """``pattern`` with what Python means by ``\\Z`` and ``{,n}`` spelt as RE2 spells it
    (``\\z``, ``{0,n}``), outside character classes."""
    out = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            out.append("\\z" if pattern[i + 1] == "Z" and not in_class else pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            # A ] first in the class (after its ^) is one of its characters.
            start = re.match(r"\[\^?\]?", pattern[i:])[0]  # type: ignore[index]
            out.append(start)
            i += len(start)
            continue
        elif c == "{" and out:
            m = re.match(r"\{,(\d*)\}", pattern[i:])
            if m:
                out.append("{0," + m[1] + "}")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


class Regex:
    """A pattern compiled by RE2: :meth:`search`, :meth:`match` (at the start) and
    :meth:`fullmatch` (all of it) as :class:`re.Pattern` has them, each in time linear in
    the name.

    >>> Regex.compile(r"^layer_(\\d+)/", "rename pattern").match("layer_3/kernel").expand(r"h.\\1.")
    'h.3.'
    """

    __slots__ = ("pattern", "_rx")

    def __init__(self, pattern: str, rx):
        self.pattern = pattern
        self._rx = rx

    @classmethod
    def compile(cls, pattern, what: str, shown: str | None = None) -> Regex:
        """``pattern`` compiled; one Python's :mod:`re` refuses, or one RE2 cannot match
        without backtracking, is a CheckpointError naming ``what`` and ``shown`` (by
        default the pattern) and why."""
        if isinstance(pattern, Regex):
            return pattern
        if not isinstance(pattern, str):
            raise CheckpointError(f"bad {what}: a pattern is a string, not {pattern!r}")
        what = f"{what} {shown or repr(pattern)}"
        try:
            return cls(pattern, re2.compile(_python_syntax(pattern), _OPTIONS))
        except re2.error as e:
            refused = e.args[0] if e.args else ""
        try:  # Python's reason first, where it refuses the pattern too
            re.compile(pattern)
        except re.error as e:
            raise CheckpointError(f"bad {what}: {e}") from None
        except (OverflowError, RecursionError):
            raise CheckpointError(f"bad {what}: too large or nested too deeply") from None
        if isinstance(refused, bytes):
            refused = refused.decode("utf-8", "replace")
        raise CheckpointError(
            f"bad {what}: {refused} (names are matched in linear time, by RE2: "
            "no backreferences, lookahead, lookbehind or possessive quantifiers; "
            "repetitions up to 1000)"
        )

    def search(self, name: str) -> Found | None:
        """The first match anywhere in ``name``, or None."""
        return self._found(name, self._rx.search)

    def match(self, name: str) -> Found | None:
        """A match at the start of ``name``, or None."""
        return self._found(name, self._rx.match)

    def fullmatch(self, name: str) -> Found | None:
        """A match of all of ``name``, or None."""
        return self._found(name, self._rx.fullmatch)

    def _found(self, name: str, how) -> Found | None:
        data = _encoded(name)
        m = how(data)
        return None if m is None else Found(self, name, data, m)

    @property
    def groups(self) -> int:
        return self._rx.groups

    @property
    def groupindex(self) -> dict[str, int]:
        return dict(self._rx.groupindex)

    def __repr__(self) -> str:
        return f"Regex({self.pattern!r})"


class Found:
    """A match of a :class:`Regex`: its groups and where it ends, in characters."""

    __slots__ = ("re", "string", "_data", "_m")

    def __init__(self, rx: Regex, name: str, data: bytes, m):
        self.re = rx
        self.string = name  # the name matched
        self._data = data
        self._m = m

    def end(self) -> int:
        """Where the match ends in the name, in characters."""
        end = self._m.end()
        return end if len(self._data) == len(self.string) else len(_decoded(self._data[:end]))

    def group(self, index: int | str = 0) -> str | None:
        """The text of group ``index`` (a number or a name), None when it took no part."""
        value = self._m[index]
        return None if value is None else _decoded(value)

    def expand(self, template: str) -> str:
        """``template`` with its group references replaced, as :meth:`re.Match.expand`."""
        return "".join(
            piece if isinstance(piece, str) else (self.group(piece) or "")
            for piece in _template(template, self.re.groups, self.re.groupindex)
        )


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
_OCTAL = "01234567"


def _template(template: str, groups: int, names: dict[str, int]) -> Sequence[str | int]:
    """``template`` as literal texts and group numbers, by Python's rules for a
    replacement; an error (:class:`re.error`, as :mod:`re` raises) for a bad one."""
    out: list[str | int] = []
    text: list[str] = []
    i, n = 0, len(template)

    def group(index: int) -> None:
        if index > groups:
            raise re.error(f"invalid group reference {index}")
        out.append("".join(text))
        text.clear()
        out.append(index)

    while i < n:
        c = template[i]
        if c != "\\":
            text.append(c)
            i += 1
            continue
        if i + 1 == n:
            raise re.error("bad escape (end of pattern)")
        d = template[i + 1]
        if d == "g":
            m = re.match(r"<([^>]*)>", template[i + 2 :])
            if not m:
                raise re.error("missing group name")
            name = m[1]
            if name.isdecimal() and name.isascii():
                group(int(name))
            elif name in names:
                group(names[name])
            elif name.isidentifier():
                raise IndexError(f"unknown group name {name!r}")
            else:
                raise re.error(f"bad character in group name {name!r}")
            i += 2 + m.end()
        elif d == "0":
            digits = re.match(f"[{_OCTAL}]{{0,2}}", template[i + 2 :])[0]  # type: ignore[index]
            text.append(chr(int("0" + digits, 8)))
            i += 2 + len(digits)
        elif d.isdigit() and d.isascii():
            rest = template[i + 1 : i + 4]
            if len(rest) == 3 and all(x in _OCTAL for x in rest):
                value = int(rest, 8)
                if value > 0o377:
                    raise re.error(f"octal escape value \\{rest} outside of range 0-0o377")
                text.append(chr(value))
                i += 4
            elif len(rest) >= 2 and rest[1].isdigit() and rest[1].isascii():
                group(int(rest[:2]))
                i += 3
            else:
                group(int(d))
                i += 2
        elif d in _ESCAPES:
            text.append(_ESCAPES[d])
            i += 2
        elif d.isascii() and d.isalpha():
            raise re.error(f"bad escape \\{d}")
        else:
            text.append("\\" + d)
            i += 2
    out.append("".join(text))
    return out
