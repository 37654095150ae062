"""Rules files: a model's selection, names, value transforms and dtypes in one TOML file.

``--rules FILE.toml`` on every rewriting command (``rules=`` of :func:`load_rules` for
the library) bundles what would otherwise be many flags::

    # which tensors
    exclude = ["adam_[mv]$", "^global_step$"]
    # names: exact ones first, then [[map]] on whole names, then [[rename]] on prefixes
    [rename_exact]
    "cls/predictions/output_bias" = "cls.predictions.bias"
    [[map]]
    match = 'bert/encoder/layer_(\\d+)/attention/self/(query|key|value)/kernel'
    to = 'bert.encoder.layer.\\1.attention.self.\\2.weight'
    [[rename]]
    match = "^old_scope/"
    to = "new_scope/"
    # values: on the new names
    [[permute]]
    match = '(dense|query|key|value)\\.weight$'
    axes = [1, 0]
    [[reshape]]
    match = "qkv$"
    shape = [768, 3, -1]
    squeeze = ['/w$']
    [[split]]       # one tensor into several along an axis (equal parts, or sizes = [...])
    match = 'attn\\.c_attn\\.(weight|bias)$'
    axis = -1
    into = ['q.\\1', 'k.\\1', 'v.\\1']
    [[concat]]      # several into one: the first regex, the others expanded with its match
    name = 'h.\\1.qkv'
    axis = 0
    parts = ['h\\.(\\d+)\\.q', 'h\\.\\1\\.k', 'h\\.\\1\\.v']
    # dtypes
    cast = "float16"
    keep_dtype = ["LayerNorm"]
    cast_bookkeeping = false   # true: cast casts metrics, optimizer steps... too
    [[dtype]]
    match = "embeddings"
    dtype = "bfloat16"

With ``[[map]]`` rules every kept tensor must be named by one (or by ``rename_exact``)
unless ``allow_unmapped = true``. A pattern (or an old name of ``rename_exact``) that
matches no tensor is an error unless ``allow_unmatched = true``. Keys mean what the
:class:`~tfckpt.Options` fields of the same names mean; an unknown key, or a value of
the wrong kind, is an error naming the file and the key. A file that is not a regular
file, is larger than 64 MiB or nests deeper than 32 is refused unread.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

from tfckpt.errors import CheckpointError
from tfckpt.io.storage import open_regular
from tfckpt.rewrite.options import Options

# Top-level keys taken as they are: lists of strings, and single values of a type.
_LISTS = ("include", "exclude", "drop_objects", "keep_dtype", "squeeze", "cast_from")
_SCALARS = {
    "cast": str,
    "allow_unmapped": bool,
    "allow_unmatched": bool,
    "cast_bookkeeping": bool,
    "description": str,
}
# Tables of rules: (Options field, the keys of one rule, which key holds the value).
_RULES = {
    "map": ("name_map", "to"),
    "rename": ("rename", "to"),
    "permute": ("permute", "axes"),
    "reshape": ("reshape", "shape"),
    "dtype": ("dtype_rules", "dtype"),
}


def load_rules(path) -> dict[str, Any]:
    """The :class:`~tfckpt.Options` fields a rules file gives (see the module's text);
    a file that cannot be read or parsed, or holds anything else, is a
    :class:`~tfckpt.CheckpointError` naming it.

    >>> options = tfckpt.Options(**load_rules("bert_to_hf.toml"), overwrite=True)
    """
    path = os.fspath(path)
    try:
        fd = open_regular(path)  # not a pipe or a device: /dev/zero never ends
    except OSError as e:
        raise CheckpointError(f"cannot read the rules file: {e.strerror}", path=path) from None
    except CheckpointError as e:
        raise CheckpointError(f"cannot read the rules file: {e.detail}", path=path) from None
    try:
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_RULES_BYTES + 1)
    except OSError as e:
        raise CheckpointError(f"cannot read the rules file: {e.strerror}", path=path) from None
    if len(raw) > MAX_RULES_BYTES:
        raise CheckpointError(
            f"not a rules file: larger than {MAX_RULES_BYTES >> 20} MiB", path=path
        )
    try:
        text = raw.decode("utf-8")
        if _depth(text) > MAX_DEPTH:
            raise CheckpointError(
                f"not a rules file: its arrays and tables nest deeper than {MAX_DEPTH}",
                path=path,
            )
        data = tomllib.loads(text)
    except UnicodeDecodeError as e:
        raise CheckpointError(f"not a TOML rules file: not UTF-8 ({e.reason})", path=path) from None
    except tomllib.TOMLDecodeError as e:
        raise CheckpointError(f"not a TOML rules file: {e}", path=path) from None
    except RecursionError:  # what _depth's count missed: nesting deeper than Python's stack
        raise CheckpointError(
            f"not a rules file: its arrays and tables nest deeper than {MAX_DEPTH}", path=path
        ) from None
    return rules_from(data, path)


MAX_RULES_BYTES = 64 << 20  # a rules file larger than this is refused unread
MAX_DEPTH = 32  # inline arrays and tables nested deeper than this are refused unparsed


def _depth(text: str) -> int:
    """How deep the inline arrays and tables of a TOML ``text`` may nest, at most: its
    brackets counted outside strings and comments (a table header's too, which only
    overcounts by one)."""
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(depth - 1, 0)
        elif c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c in "\"'":
            quote = text[i : i + 3] if text[i : i + 3] in ('"""', "'''") else c
            j = i + len(quote)
            while j < n and not text.startswith(quote, j):
                j += 2 if c == '"' and text[j] == "\\" else 1
            i = j + len(quote)
            continue
        i += 1
    return deepest


def rules_from(data: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The Options fields of a parsed rules file (``path`` names it in errors)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _LISTS:
            out[key] = _strings(value, key, path)
        elif key in _SCALARS:
            if not isinstance(value, _SCALARS[key]):
                raise CheckpointError(
                    f"{key} must be a {_SCALARS[key].__name__}, not {value!r}", path=path
                )
            if key != "description":
                out[key] = value
        elif key == "rename_exact":
            if not isinstance(value, Mapping) or not all(
                isinstance(v, str) for v in value.values()
            ):
                raise CheckpointError("rename_exact must be a table of names", path=path)
            out["rename_exact"] = dict(value)
        elif key in _RULES:
            field, what = _RULES[key]
            out[field] = _rules(value, key, what, path)
        elif key in _PIECES:
            out[key] = _pieces(value, key, path)
        else:
            known = sorted([*_LISTS, *_SCALARS, *_RULES, *_PIECES, "rename_exact"])
            raise CheckpointError(f"unknown key {key!r} (known: {', '.join(known)})", path=path)
    return out


def _strings(value, key: str, path: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"{key} must be a string or a list of strings", path=path)
    return value


def _rules(value, key: str, what: str, path: str) -> list[tuple[str, Any]]:
    """``[[key]]`` tables of ``match`` and ``what`` as (regex, value) pairs, in order."""
    if not isinstance(value, list):
        raise CheckpointError(f"{key} must be an array of tables ([[{key}]])", path=path)
    out = []
    for k, rule in enumerate(value):
        if not isinstance(rule, Mapping) or set(rule) != {"match", what}:
            raise CheckpointError(
                f"[[{key}]] number {k + 1} must have exactly the keys match and {what}",
                path=path,
            )
        match, target = rule["match"], rule[what]
        ok = isinstance(target, str) if what in ("to", "dtype") else _whole_numbers(target)
        if not isinstance(match, str) or not ok:
            kind = "a string" if what in ("to", "dtype") else "a list of whole numbers"
            raise CheckpointError(
                f"[[{key}]] number {k + 1}: match must be a string and {what} {kind}",
                path=path,
            )
        out.append((match, tuple(target) if isinstance(target, list) else target))
    return out


# [[split]] and [[concat]] tables: their keys (required, then optional), in rule order.
_PIECES = {
    "split": (("match", "axis", "into"), ("sizes",)),
    "concat": (("name", "axis", "parts"), ()),
}


def _pieces(value, key: str, path: str) -> list[tuple]:
    """``[[split]]``/``[[concat]]`` tables as the rules of Options' field of that name."""
    required, optional = _PIECES[key]
    if not isinstance(value, list):
        raise CheckpointError(f"{key} must be an array of tables ([[{key}]])", path=path)
    out = []
    for k, rule in enumerate(value):
        keys = set(rule) if isinstance(rule, Mapping) else set()
        if not set(required) <= keys <= set(required) | set(optional):
            raise CheckpointError(
                f"[[{key}]] number {k + 1} must have the keys {', '.join(required)}"
                + (f" (and maybe {', '.join(optional)})" if optional else ""),
                path=path,
            )
        names, axis, listed = (rule[r] for r in required)
        sizes = rule.get("sizes")
        if (
            not isinstance(names, str)
            or not isinstance(axis, int)
            or isinstance(axis, bool)
            or not isinstance(listed, list)
            or not all(isinstance(v, str) for v in listed)
            or (sizes is not None and not _whole_numbers(sizes))
        ):
            raise CheckpointError(
                f"[[{key}]] number {k + 1}: {required[0]} a string, axis a whole number, "
                f"{required[2]} a list of strings" + (", sizes whole numbers" if optional else ""),
                path=path,
            )
        out.append((names, axis, listed) + ((sizes,) if sizes is not None else ()))
    return out


def _whole_numbers(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


# Options fields that hold several rules: a rules file's come after those given.
_APPENDED = (
    "include",
    "exclude",
    "drop_objects",
    "keep_dtype",
    "squeeze",
    "cast_from",
    "permute",
    "reshape",
    "rename",
    "dtype_rules",
    "name_map",
    "split",
    "concat",
)


def with_rules(options: Options, rules: Mapping[str, Any]) -> Options:
    """``options`` with a rules file's fields (:func:`load_rules`) added: their rules
    are tried first, then the file's; their exact renames win over the file's; their
    ``cast`` is kept when given; either's ``allow_unmapped`` allows.

    >>> with_rules(Options(cast="float16"), load_rules("model.toml"))
    """
    changes: dict[str, Any] = {}
    for key, value in rules.items():
        mine = getattr(options, key)
        if key in _APPENDED:
            changes[key] = [*_listed(mine), *value]
        elif key == "rename_exact":
            changes[key] = {**value, **(mine or {})}
        elif key == "cast":
            changes[key] = mine if mine is not None else value
        elif key in ("allow_unmapped", "allow_unmatched", "cast_bookkeeping"):
            changes[key] = mine or value
    return Options.of(options, **changes)


def _listed(value) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return list(value.items())
    return list(value)
