"""Command line: ``tfckpt COMMAND ...`` / ``python -m tfckpt COMMAND ...``.

Argument parsing and printing only; the work is done by library functions.
Errors about checkpoints print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

import numpy as np

from . import __version__
from . import inspect as _inspect
from .bundle import Checkpoint
from .errors import CheckpointError

EXIT_ERROR = 2


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
    return out


def _print_dump(data: dict) -> None:
    v = data["version"]
    print(f"prefix      {data['prefix']}")
    print(f"shards      {data['num_shards']}")
    print(f"format      bundle v2, producer {v['producer']}, min consumer {v['min_consumer']}, "
          f"{data['endianness']}-endian")
    print(f"tensors     {data['tensor_count']}")
    print(f"total       {human_bytes(data['total_bytes'])} ({data['total_bytes']} bytes)")
    if not data["tensors"]:
        return
    print()
    rows = [["NAME", "DTYPE", "SHAPE", "SIZE", "SHARD"]]
    for t in data["tensors"]:
        shard = f"{len(t['slices'])} slices" if t["slices"] else str(t["shard"])
        rows.append([t["name"], t["dtype"], _shape(t["shape"]), human_bytes(t["bytes"]), shard])
    print("\n".join(_table(rows, right={3})))
    print()
    total = data["total_bytes"] or 1
    rows = [["SCOPE", "SIZE", "SHARE", "TENSORS"]]
    for s in data["scopes"]:
        rows.append([s["scope"], human_bytes(s["bytes"]), f"{100 * s['bytes'] / total:.1f}%",
                     str(s["tensors"])])
    print("\n".join(_table(rows, right={1, 2, 3})))


def _print_values(ckpt: Checkpoint, patterns: list[str], full: bool) -> None:
    names = []
    for p in patterns:
        if p in ckpt:
            names.append(p)
            continue
        matched = [n for n in ckpt.keys() if re.search(p, n)]
        if not matched:
            raise CheckpointError(f"no tensor matches {p!r}", path=ckpt.prefix)
        names.extend(matched)
    threshold = sys.maxsize if full else 1000
    for name in dict.fromkeys(names):
        info = ckpt.info(name)
        value = ckpt[name]
        print(f"{name} ({info.dtype} {_shape(info.shape)})")
        # --full prints each float in its shortest form that reads back exactly.
        print(np.array2string(value, threshold=threshold, max_line_width=100,
                              floatmode="unique" if full else "maxprec")
              if value.ndim else repr(value.item()))


def cmd_dump(args) -> int:
    with Checkpoint(args.path) as ckpt:
        if args.tensor:
            _print_values(ckpt, args.tensor, args.full)
            return 0
        data = _inspect.dump(ckpt, filter=args.filter)
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        print()
    else:
        _print_dump(data)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfckpt", description="Read, inspect and rewrite TensorFlow checkpoints.")
    parser.add_argument("--version", action="version", version=f"tfckpt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("dump", help="list the tensors of a checkpoint",
                       description="Show what a checkpoint holds; reads only the index unless "
                                   "values are asked for.")
    p.add_argument("path", help="checkpoint prefix, .index file, directory or SavedModel")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--filter", metavar="REGEX", help="only tensors whose name matches")
    p.add_argument("--tensor", metavar="NAME_OR_REGEX", action="append",
                   help="print the values of these tensors (repeatable)")
    p.add_argument("--full", action="store_true", help="with --tensor, print every element")
    p.set_defaults(func=cmd_dump)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CheckpointError as e:
        print(f"tfckpt: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except re.error as e:
        print(f"tfckpt: error: bad regular expression: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("tfckpt: interrupted", file=sys.stderr)
        return 130
