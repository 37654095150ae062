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
from .cast import CAST_TARGETS, OVERFLOW_POLICIES
from .errors import CheckpointError
from .transform import Plan, Summary, execute, plan

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


def _parse_size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m or float(m[1]) <= 0:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)")
    return int(float(m[1]) * units[m[2]])


def _rename_rules(args) -> tuple[list[tuple[str, str]], dict[str, str]]:
    rules = []
    for item in args.map or []:
        if "=" not in item:
            raise CheckpointError(f"--map takes OLD=NEW, not {item!r}")
        old, new = item.split("=", 1)
        rules.append((old, new))
    exact: dict[str, str] = {}
    if args.map_file:
        try:
            with open(args.map_file, encoding="utf-8") as f:
                exact = json.load(f)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot read the rename map: {e}", path=args.map_file) \
                from None
        if not isinstance(exact, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in exact.items()):
            raise CheckpointError("the rename map must be a JSON object of names",
                                  path=args.map_file)
    return rules, exact


def _print_plan(p: Plan) -> None:
    rows = [["SOURCE", "NAME", "NEW NAME", "DTYPE", "SHAPE", "BYTES IN", "BYTES OUT"]]
    for t in p.tensors:
        dtype = t.info.dtype if not t.cast else f"{t.info.dtype}->{t.new_dtype}"
        rows.append([p.sources[t.source].label, t.name, t.new_name if t.renamed else "=",
                     dtype, _shape(t.info.shape), human_bytes(t.info.nbytes),
                     human_bytes(t.bytes_out)])
    print("\n".join(_table(rows, right={5, 6})))
    for src, name, why in p.dropped:
        print(f"drop  {src}  {name}  ({why})")
    print(f"\n{len(p.tensors)} tensors to {p.dst}, {human_bytes(p.bytes_in)} in, "
          f"{human_bytes(p.bytes_out)} out, {len(p.dropped)} dropped"
          + (", object graph rewritten" if p.object_graph is not None else ""))


def _print_summary(sm: Summary) -> None:
    print(f"wrote {sm.dst}: {sm.kept} tensors kept, {sm.dropped} dropped, {sm.renamed} renamed, "
          f"{sm.cast} cast; {human_bytes(sm.bytes_in)} in, {human_bytes(sm.bytes_out)} out, "
          f"{sm.seconds:.2f} s", file=sys.stderr)
    for label, attr in (("clipped or overflowed", "overflow"), ("became zero", "to_zero"),
                        ("became subnormal", "subnormal")):
        hit = {n: getattr(c, attr) for n, c in sm.cast_counts.items() if getattr(c, attr)}
        if hit:
            total = sum(hit.values())
            print(f"  {total} values {label} in {len(hit)} tensors", file=sys.stderr)


def _progress(total: int):
    """A progress bar on stderr when it is a terminal."""
    if not sys.stderr.isatty() or total == 0:
        return None, lambda: None
    from tqdm import tqdm
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
               leave=False)
    return bar.update, bar.close


def cmd_transform(args) -> int:
    sources = args.sources if args.command == "merge" else [args.src]
    dst = args.output if args.command == "merge" else args.dst
    rules, exact = _rename_rules(args)
    p = plan(
        sources, dst, include=args.include, exclude=args.exclude,
        drop_objects=args.drop_object or (), rename=rules, rename_exact=exact,
        cast=args.dtype, cast_from=args.cast_from.split(",") if args.cast_from else None,
        prefer=args.prefer, max_shard_bytes=args.max_shard_bytes, overwrite=args.overwrite)
    if args.dry_run:
        if args.json:
            json.dump(p.to_dict(), sys.stdout, indent=1)
            print()
        else:
            _print_plan(p)
        return 0
    update, close = _progress(p.bytes_in)
    try:
        summary = execute(p, overflow=args.overflow, chunk_bytes=args.chunk_bytes,
                          progress=update)
    finally:
        close()
    if args.json:
        json.dump(summary.to_dict(), sys.stdout, indent=1)
        print()
    _print_summary(summary)
    return 0


def _add_transform_options(p: argparse.ArgumentParser, *, dtype_required: bool = False) -> None:
    g = p.add_argument_group("cast")
    g.add_argument("--dtype", choices=CAST_TARGETS, required=dtype_required,
                   help="cast floating-point tensors to this dtype")
    g.add_argument("--from", dest="cast_from", metavar="DTYPES",
                   help="only cast these source dtypes (comma-separated, e.g. float32,float64)")
    g.add_argument("--overflow", choices=OVERFLOW_POLICIES, default="error",
                   help="values beyond the target's range: fail (default), clip to the "
                        "largest finite value, or keep IEEE inf")
    g = p.add_argument_group("select")
    g.add_argument("--include", metavar="REGEX", action="append",
                   help="keep only tensors whose name matches (repeatable)")
    g.add_argument("--exclude", metavar="REGEX", action="append",
                   help="drop tensors whose name matches (repeatable, after --include)")
    g.add_argument("--drop-object", metavar="NAME_OR_PATH", action="append",
                   help="TF2: cut this object from the object graph, with everything only it "
                        "reaches (a bare name anywhere, or a path a/b/c from the root)")
    g = p.add_argument_group("rename")
    g.add_argument("--map", metavar="OLD=NEW", action="append",
                   help="rename: regex OLD matched at the start of names, replaced by NEW "
                        "(back-references allowed); first matching rule wins")
    g.add_argument("--map-file", metavar="F.json", help="exact renames as a JSON object")
    g = p.add_argument_group("output")
    g.add_argument("--prefer", choices=["first", "last"],
                   help="which source wins a name present in several (default: error)")
    g.add_argument("--max-shard-bytes", type=_parse_size, metavar="SIZE",
                   help="re-shard the output (default: keep the sources' shards)")
    g.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    g.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    g.add_argument("--json", action="store_true", help="print the plan or summary as JSON")
    g.add_argument("--chunk-bytes", type=_parse_size, default=64 << 20, metavar="SIZE",
                   help="memory budget per chunk (default 64M)")
    p.set_defaults(func=cmd_transform)


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

    p = sub.add_parser("convert", help="cast floating-point tensors to another dtype",
                       description="Write a copy of SRC with floating-point tensors cast, e.g. "
                                   "float32 -> float16. Accepts every transform option.")
    p.add_argument("src")
    p.add_argument("dst", help="output prefix, or a directory (the source's name is kept)")
    _add_transform_options(p, dtype_required=True)

    p = sub.add_parser("rename", help="rename tensors by regex rules or an exact map",
                       description="Write a copy of SRC with tensors renamed; TF2 object "
                                   "graphs are re-keyed so restore still finds every value.")
    p.add_argument("src")
    p.add_argument("dst")
    _add_transform_options(p)

    p = sub.add_parser("select", help="keep only some tensors or TF2 objects",
                       description="Write a copy of SRC with only the selected tensors.")
    p.add_argument("src")
    p.add_argument("dst")
    _add_transform_options(p)

    p = sub.add_parser("merge", help="combine several checkpoints into one",
                       description="Write one checkpoint holding the tensors of all SOURCES; "
                                   "TF2 object graphs are joined at the root.")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("-o", "--output", required=True, metavar="DST")
    _add_transform_options(p)
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
