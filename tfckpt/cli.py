"""Command line: ``tfckpt COMMAND ...`` / ``python -m tfckpt COMMAND ...``.

Argument parsing and printing only; the work is done by library functions.
Errors about checkpoints print one line on stderr and exit with status 2.

Human-readable output reaches the terminal only through :func:`emit`, which escapes
what names, paths and messages from files could do to a terminal; ``--json`` prints
JSON alone on stdout, names exact.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import signal
import sys
import threading
import traceback

import numpy as np

from . import __version__
from . import dtypes as _dt
from . import inspection as _inspect
from .cast import CAST_TARGETS, OVERFLOW_POLICIES
from .display import emit, fmt, human_bytes, print_json, shape_text, table, width
from .engine import Summary, execute
from .errors import CheckpointError
from .options import BACKENDS, DEFAULTS, PREFER, Options
from .orderedcode import encode_name
from .planner import Plan, plan
from .reader import Checkpoint

EXIT_ERROR = 2


def _print_dump(data: dict) -> None:
    v = data["version"]
    emit(f"prefix      {data['prefix']}")
    emit(f"shards      {data['num_shards']}")
    emit(
        f"format      bundle v2, producer {v['producer']}, min consumer {v['min_consumer']}, "
        f"{data['endianness']}-endian"
    )
    emit(f"tensors     {data['tensor_count']}")
    emit(f"total       {human_bytes(data['total_bytes'])} ({data['total_bytes']} bytes)")
    if not data["tensors"]:
        return
    emit()
    rows = [["NAME", "DTYPE", "SHAPE", "SIZE", "SHARD"]]
    for t in data["tensors"]:
        shard = f"{len(t['slices'])} slices" if t["slices"] else str(t["shard"])
        if t["stored_elements"] < t["elements"]:  # pre-sliced: only part is stored
            shard += f", {100 * t['stored_elements'] / t['elements']:.3g}% stored"
        rows.append([t["name"], t["dtype"], shape_text(t["shape"]), human_bytes(t["bytes"]), shard])
    table(rows, right={3})
    emit()
    total = data["total_bytes"] or 1
    rows = [["SCOPE", "SIZE", "SHARE", "TENSORS"]]
    for s in data["scopes"]:
        rows.append(
            [
                s["scope"],
                human_bytes(s["bytes"]),
                f"{100 * s['bytes'] / total:.1f}%",
                str(s["tensors"]),
            ]
        )
    table(rows, right={1, 2, 3})


def _value_names(ckpt: Checkpoint, patterns: list[str]) -> list[str]:
    """The tensors ``dump --tensor`` asks for: exact names, else regex matches; each once."""
    names = []
    for p in patterns:
        if p in ckpt:
            names.append(p)
            continue
        matched = [n for n in ckpt.keys() if re.search(p, n)]
        if not matched:
            raise CheckpointError(f"no tensor matches {p!r}", path=ckpt.prefix)
        names.extend(matched)
    return list(dict.fromkeys(names))


def _print_values(ckpt: Checkpoint, patterns: list[str], full: bool) -> None:
    threshold = sys.maxsize if full else 1000
    for name in _value_names(ckpt, patterns):
        info = ckpt.info(name)
        value = ckpt[name]
        emit(f"{name} ({info.dtype} {shape_text(info.shape)})")
        # --full prints each float in its shortest form that reads back exactly.
        if value.dtype == object and not full:
            value = np.vectorize(
                lambda b: b if len(b) <= 64 else b[:48] + b"...(%d bytes)" % len(b), otypes=[object]
            )(value)
        text = (
            np.array2string(
                value,
                threshold=threshold,
                max_line_width=width() or 100,
                floatmode="unique" if full else "maxprec",
            )
            if value.ndim
            else repr(value.item())
        )
        for line in text.split("\n"):
            emit(line)


def _json_values(value: np.ndarray, dtype: str) -> dict:
    """A tensor's values as exact JSON: ``{"values": nested lists or a scalar}``.

    Floats of every width as the float64 that holds them exactly (non-finite ones become
    strings in :func:`print_json`); complex numbers as ``[real, imag]``; quantized types as
    their integers; strings as text when every element is UTF-8 (``"encoding": "utf-8"``),
    else every element as base64 (``"encoding": "base64"``).
    """
    kind = _dt.lookup(dtype).kind
    extra = {}
    if kind == "string":
        items = value.reshape(-1).tolist()
        try:
            items = [b.decode("utf-8") for b in items]
            extra["encoding"] = "utf-8"
        except UnicodeDecodeError:
            items = [base64.b64encode(b).decode("ascii") for b in items]
            extra["encoding"] = "base64"
        value = np.array(items, dtype=object).reshape(value.shape)
    elif kind == "quantized":
        assert value.dtype.names is not None  # one-field structs (see dtypes.py)
        value = value[value.dtype.names[0]]
    elif kind == "float":
        value = value.astype(np.float64)
    elif kind == "complex":
        value = np.stack([value.real, value.imag], axis=-1).astype(np.float64)
    elif kind in ("int", "uint"):  # also int4/uint4/int2/uint2, which have no Python form
        value = value.astype(np.int64 if kind == "int" else np.uint64)
    return {"values": value.tolist(), **extra}


def _dump_values_json(ckpt: Checkpoint, patterns: list[str]) -> None:
    tensors = []
    for name in _value_names(ckpt, patterns):
        info = ckpt.info(name)
        tensors.append(
            {
                "name": name,
                "dtype": info.dtype,
                "shape": list(info.shape),
                **_json_values(ckpt[name], info.dtype),
            }
        )
    print_json({"prefix": ckpt.prefix, "tensors": tensors})


TREE_INDENT_LEVELS = 32  # deeper nodes keep this indentation and show their depth


def _print_object_graph(data: dict) -> None:
    """The graph as a tree from the root, each node shown once (later paths point back).

    Walked with an explicit stack and printed by local names, with the
    indentation capped, so the output stays linear in the graph's size however
    deep it is.
    """
    nodes = data["nodes"]
    shown: set[int] = set()

    def walk(start: int, label: str, depth: int) -> None:
        stack = [(start, label, depth)]
        while stack:
            node_id, label, depth = stack.pop()
            indent = "  " * min(depth, TREE_INDENT_LEVELS)
            if depth > TREE_INDENT_LEVELS:
                label = f"(depth {depth}) {label}"
            node = nodes[node_id]
            if node_id in shown:
                emit(f"{indent}{label} -> {node['path'] or '(root)'}")
                continue
            shown.add(node_id)
            emit(f"{indent}{label}", (f"  #{node_id}", "2"))
            for a in node["attributes"]:
                tensors = a["tensors"]
                if len(tensors) == 1 and tensors[0]["name"] == a["checkpoint_key"]:
                    t = tensors[0]
                    kind = f"{t['dtype']} {shape_text(t['shape'])}" if t["dtype"] else "MISSING"
                    emit(f"{indent}  [{a['name']}] {a['checkpoint_key']}  {kind}")
                    continue
                emit(f"{indent}  [{a['name']}] {a['checkpoint_key']}  {len(tensors)} tensors")
                for t in tensors:
                    kind = f"{t['dtype']} {shape_text(t['shape'])}" if t["dtype"] else "MISSING"
                    emit(f"{indent}    {t['name']}  {kind}")
            for s in node["slot_variables"]:
                original = nodes[s["original_variable_node_id"]]["path"]
                emit(
                    f"{indent}  slot {s['slot_name']!r} of {original}: "
                    f"#{s['slot_variable_node_id']}"
                )
            for c in reversed(node["children"]):
                stack.append((c["node_id"], c["name"], depth + 1))

    emit(f"object graph of {data['prefix']}: {len(nodes)} nodes")
    walk(0, "(root)", 0)
    for s_node in nodes:
        for s in s_node["slot_variables"]:
            if s["slot_variable_node_id"] not in shown:
                walk(s["slot_variable_node_id"], f"slot {s['slot_name']!r}", 1)


def cmd_dump(args) -> int:
    with Checkpoint(args.path) as ckpt:
        if args.tensor:
            if args.json:
                _dump_values_json(ckpt, args.tensor)
            else:
                _print_values(ckpt, args.tensor, args.full)
            return 0
        if args.object_graph:
            data = _inspect.object_graph(ckpt)
            if args.json:
                print_json(data)
            else:
                _print_object_graph(data)
            return 0
        data = _inspect.dump(ckpt, filter=args.filter)
    if args.json:
        print_json(data)
    else:
        _print_dump(data)
    return 0


def cmd_diff(args) -> int:
    with Checkpoint(args.a) as a, Checkpoint(args.b) as b:
        data = _inspect.diff(
            a, b, atol=args.atol, rtol=args.rtol, values=not args.names_only, filter=args.filter
        )
    if args.json:
        print_json(data)
    else:
        for name in data["only_in_a"]:
            emit((f"- {name}", "31"), "  (only in A)")
        for name in data["only_in_b"]:
            emit((f"+ {name}", "32"), "  (only in B)")
        for c in data["changed"]:
            stored = (
                f"  (stored elements {c['stored_a']} -> {c['stored_b']})" if "stored_a" in c else ""
            )
            emit(
                f"~ {c['name']}  {c['dtype_a']} {shape_text(c['shape_a'])} -> "
                f"{c['dtype_b']} {shape_text(c['shape_b'])}{stored}"
            )
        if data["values"]:
            rows = [["NAME", "DIFFERING", "ELEMENTS", "MAX ABS", "MAX REL"]]
            for v in data["values"]:
                rows.append(
                    [
                        v["name"],
                        str(v["differing"]),
                        str(v["elements"]),
                        fmt(v["max_abs"]),
                        fmt(v["max_rel"]),
                    ]
                )
            table(rows, right={1, 2, 3, 4})
        emit(
            "same"
            if data["same"]
            else f"different: {len(data['only_in_a'])} only in A, {len(data['only_in_b'])} only in "
            f"B, {len(data['changed'])} changed dtype/shape, {len(data['values'])} with "
            "different values"
        )
    return 0 if data["same"] else 1


def cmd_stats(args) -> int:
    with Checkpoint(args.path) as ckpt:
        data = _inspect.stats(ckpt, filter=args.filter)
    if args.json:
        print_json(data)
        return 0
    # NaN and inf columns only when some tensor has them: the table fits 80 columns.
    special = any(t.get("nan") or t.get("inf") for t in data["tensors"])
    rows = [
        ["NAME", "DTYPE", "MIN", "MAX", "MEAN", "STD"]
        + (["NAN", "INF"] if special else [])
        + ["ZEROS"]
    ]
    risky = []
    for t in data["tensors"]:
        rows.append(
            [
                t["name"],
                t["dtype"],
                fmt(t.get("min"), 4),
                fmt(t.get("max"), 4),
                fmt(t.get("mean"), 4),
                fmt(t.get("std"), 4),
            ]
            + ([fmt(t.get("nan")), fmt(t.get("inf"))] if special else [])
            + [f"{100 * t['zeros']:.1f}%" if "zeros" in t else "-"]
        )
        for target, c in t.get("cast", {}).items():
            if c["overflow"] or c["to_zero"] or c["subnormal"]:
                risky.append(
                    [t["name"], target, str(c["overflow"]), str(c["to_zero"]), str(c["subnormal"])]
                )
    table(rows, right=set(range(2, len(rows[0]))))
    emit()
    if risky:
        emit("if cast:")
        table([["NAME", "TO", "OVERFLOW", "TO ZERO", "SUBNORMAL"]] + risky, right={2, 3, 4})
    else:
        emit(
            "every floating-point tensor casts to float16 and bfloat16 without overflow, "
            "flush to zero or subnormals"
        )
    return 0


def cmd_verify(args) -> int:
    data = _inspect.verify(args.path)
    if args.tf and not data["problems"]:
        from .tf import verify_with_tf

        tf_report = verify_with_tf(args.path, reference=args.reference)
        data["tf"] = tf_report
        data["problems"] += tf_report["mismatches"]
    if args.json:
        print_json(data)
        return 1 if data["problems"] else 0
    for w in data["warnings"]:
        emit(w, err=True)
    for note in data["partial"]:
        emit(f"note: {note}")
    if data["problems"]:
        for p in data["problems"]:
            emit(p, err=True)
    else:
        extra = ""
        if "tf" in data:
            extra = "; TensorFlow's reader agrees bit-for-bit" + (
                f", {data['tf']['cast_checked']} casts equal tf.cast" if args.reference else ""
            )
        emit(
            f"ok: {data['prefix']}: {data['tensors']} tensors, {human_bytes(data['bytes'])}, "
            f"every checksum, shard, slice and object-graph key checked{extra}"
        )
    for d in data.get("tf", {}).get("cast_differences", []):
        # Documented differences from tf.cast: information, not problems.
        parts = []
        if d["subnormals_tf_flushes"]:
            parts.append(
                f"{d['subnormals_tf_flushes']} subnormal results tf.cast flushes "
                "to zero (kept here, as IEEE 754 rounds)"
            )
        if d["nans_other_bits"]:
            parts.append(f"{d['nans_other_bits']} NaNs of another sign or payload than tf.cast's")
        emit(f"note: {d['tensor']} ({d['cast']}): {', '.join(parts)}")
    return 1 if data["problems"] else 0


def _parse_size(text: str, *, minimum: int = 1) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m or int(float(m[1]) * units[m[2]]) < minimum:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)")
    return int(float(m[1]) * units[m[2]])


def _parse_size_or_zero(text: str) -> int:
    return _parse_size(text, minimum=0)


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
            raise CheckpointError(f"cannot read the rename map: {e}", path=args.map_file) from None
        if not isinstance(exact, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in exact.items()
        ):
            raise CheckpointError(
                "the rename map must be a JSON object of names", path=args.map_file
            )
        for new in exact.values():
            try:
                encode_name(new)
            except UnicodeEncodeError:  # only \udc80-\udcff stand for bytes (see --json)
                raise CheckpointError(
                    f"{new!r} in the rename map is not a tensor name: it holds a lone surrogate",
                    path=args.map_file,
                ) from None
    return rules, exact


def _print_plan(p: Plan) -> None:
    rows = [["SOURCE", "NAME", "NEW NAME", "DTYPE", "SHAPE", "BYTES IN", "BYTES OUT"]]
    for t in p.tensors:
        dtype = t.info.dtype if not t.cast else f"{t.info.dtype}->{t.new_dtype}"
        rows.append(
            [
                p.sources[t.source].label,
                t.name,
                t.new_name if t.renamed else "=",
                dtype,
                shape_text(t.info.shape),
                human_bytes(t.info.nbytes),
                human_bytes(t.bytes_out),
            ]
        )
    table(rows, right={5, 6})
    for src, name, why in p.dropped:
        emit(f"drop  {src}  {name}  ({why})")
    emit()
    emit(
        f"{len(p.tensors)} tensors to {p.dst}, {human_bytes(p.bytes_in)} in, "
        f"{human_bytes(p.bytes_out)} out, {len(p.dropped)} dropped"
        + (", object graph rewritten" if p.object_graph is not None else "")
    )


def _print_summary(sm: Summary) -> None:
    emit(
        f"wrote {sm.dst}: {sm.kept} tensors kept, {sm.dropped} dropped, {sm.renamed} renamed, "
        f"{sm.cast} cast; {human_bytes(sm.bytes_in)} in, {human_bytes(sm.bytes_out)} out, "
        f"{sm.seconds:.2f} s",
        err=True,
    )
    for label, attr in (
        ("clipped or overflowed", "overflow"),
        ("became zero", "to_zero"),
        ("became subnormal", "subnormal"),
    ):
        hit = {n: getattr(c, attr) for n, c in sm.cast_counts.items() if getattr(c, attr)}
        if hit:
            total = sum(hit.values())
            emit(f"  {total} values {label} in {len(hit)} tensors", err=True)
    for warning in sm.warnings:
        emit(f"tfckpt: warning: {warning}", err=True)


def _progress(total: int):
    """A progress bar on stderr when it is a terminal."""
    if not sys.stderr.isatty() or total == 0:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr, leave=False
    )
    return bar.update, bar.close


def _executor(spec: str | None):
    """The executor an --executor SPEC names, and how to shut it down."""
    if spec is None:
        return None, lambda: None
    kind, _, arg = spec.partition(":")
    if kind in ("threads", "processes"):
        from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

        try:
            workers = int(arg) if arg else None
        except ValueError:
            raise CheckpointError(f"--executor {spec}: the worker count must be a number") from None
        pool = (ThreadPoolExecutor if kind == "threads" else ProcessPoolExecutor)(workers)
        return pool, pool.shutdown
    if kind == "dask":
        try:
            from dask.distributed import Client
        except ImportError:
            raise CheckpointError(
                "--executor dask:// needs Dask: pip install 'tfckpt[dask]'"
            ) from None
        try:
            client = Client(
                spec[len("dask://") :] if spec.startswith("dask://") else arg, timeout=30
            )
        except OSError as e:
            raise CheckpointError(f"cannot reach the Dask scheduler {spec}: {e}") from None
        return client, client.close
    raise CheckpointError(
        f"unknown --executor {spec!r}: use threads:N, processes:N or dask://HOST:PORT"
    )


def cmd_transform(args) -> int:
    sources = args.sources if args.command == "merge" else [args.src]
    dst = args.output if args.command == "merge" else args.dst
    rules, exact = _rename_rules(args)
    options = Options(
        include=args.include,
        exclude=args.exclude,
        drop_objects=args.drop_object or (),
        rename=rules,
        rename_exact=exact,
        cast=args.dtype,
        cast_from=args.cast_from.split(",") if args.cast_from else None,
        prefer=args.prefer,
        max_shard_bytes=args.max_shard_bytes,
        overwrite=args.overwrite,
        overflow=args.overflow,
        chunk_bytes=args.chunk_bytes,
        backend=args.backend,
        tf_threshold=args.tf_threshold,
        durable=args.durable,
    )
    p = plan(sources, dst, options)
    if args.dry_run:
        if args.json:
            print_json(p.to_dict())
        else:
            _print_plan(p)
        return 0
    update, close = _progress(p.bytes_in)
    executor, shutdown = _executor(args.executor)
    try:
        summary = execute(p, progress=update, executor=executor)
    finally:
        close()
        shutdown()
    if args.json:
        print_json(summary.to_dict())
    _print_summary(summary)
    return 0


def _add_transform_options(p: argparse.ArgumentParser, *, dtype_required: bool = False) -> None:
    g = p.add_argument_group("cast")
    g.add_argument(
        "--dtype",
        choices=CAST_TARGETS,
        required=dtype_required,
        help="cast floating-point tensors to this dtype",
    )
    g.add_argument(
        "--from",
        dest="cast_from",
        metavar="DTYPES",
        help="only cast these source dtypes (comma-separated, e.g. float32,float64)",
    )
    g.add_argument(
        "--backend",
        choices=BACKENDS,
        default=DEFAULTS.backend,
        help="who rounds: numpy (default), tf (tf.cast on the best device for "
        "tensors of at least --tf-threshold), auto (tf only with a GPU)",
    )
    g.add_argument(
        "--tf-threshold",
        type=_parse_size_or_zero,
        default=DEFAULTS.tf_threshold,
        metavar="SIZE",
        help="smallest tensor cast by the tf backend (default 64M)",
    )
    g.add_argument(
        "--overflow",
        choices=OVERFLOW_POLICIES,
        default=DEFAULTS.overflow,
        help="values beyond the target's range: fail (default), clip to the "
        "largest finite value, or keep IEEE inf",
    )
    g = p.add_argument_group("select")
    g.add_argument(
        "--include",
        metavar="REGEX",
        action="append",
        help="keep only tensors whose name matches (repeatable)",
    )
    g.add_argument(
        "--exclude",
        metavar="REGEX",
        action="append",
        help="drop tensors whose name matches (repeatable, after --include)",
    )
    g.add_argument(
        "--drop-object",
        metavar="NAME_OR_PATH",
        action="append",
        help="TF2: cut this object from the object graph, with everything only it "
        "reaches (a bare name anywhere, or a path a/b/c from the root)",
    )
    g = p.add_argument_group("rename")
    g.add_argument(
        "--map",
        metavar="OLD=NEW",
        action="append",
        help="rename: regex OLD matched at the start of names, replaced by NEW "
        "(back-references allowed); first matching rule wins",
    )
    g.add_argument("--map-file", metavar="F.json", help="exact renames as a JSON object")
    g = p.add_argument_group("output")
    g.add_argument(
        "--prefer",
        choices=PREFER[1:],
        help="which source wins a name present in several (default: error)",
    )
    g.add_argument(
        "--max-shard-bytes",
        type=_parse_size,
        metavar="SIZE",
        help="re-shard the output (default: keep the sources' shards)",
    )
    g.add_argument("--overwrite", action="store_true", help="replace an existing destination")
    g.add_argument(
        "--no-fsync",
        dest="durable",
        action="store_false",
        help="skip the fsyncs before the commit: faster; a killed run still leaves "
        "no partial checkpoint, but a power cut may",
    )
    g.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    g.add_argument("--json", action="store_true", help="print the plan or summary as JSON")
    g.add_argument(
        "--executor",
        metavar="SPEC",
        help="run the per-shard tasks on: threads:N, processes:N, or a Dask "
        "scheduler dask://HOST:PORT (default: here, one after another)",
    )
    g.add_argument(
        "--chunk-bytes",
        type=_parse_size,
        default=DEFAULTS.chunk_bytes,
        metavar="SIZE",
        help="memory budget for tensor data in flight (default 64M)",
    )
    p.set_defaults(func=cmd_transform)


EXAMPLES = {
    "dump": """examples:
  tfckpt dump train/model.ckpt-7
  tfckpt dump train/ --filter '^optimizer/' --json
  tfckpt dump train/ --tensor global_step --tensor '^logits/' --full
  tfckpt dump saved_model_dir --object-graph""",
    "diff": """examples:
  tfckpt diff fp32/model.ckpt fp16/model.ckpt        # how much error did float16 add?
  tfckpt diff old/ new/ --names-only                 # which variables does new/ lack?
  tfckpt diff a b --atol 1e-3 --json

exit status: 0 same, 1 different, 2 error""",
    "stats": """examples:
  tfckpt stats train/model.ckpt-7                    # is it safe to cast to float16?
  tfckpt stats train/ --filter 'kernel' --json""",
    "verify": """examples:
  tfckpt verify train/model.ckpt-7
  tfckpt verify fp16/model.ckpt --tf --reference train/model.ckpt-7

exit status: 0 intact, 1 problems found (one line each on stderr), 2 error""",
    "convert": """examples:
  tfckpt convert train/model.ckpt-7 fp16/ --dtype float16
  tfckpt convert train/ bf16/model --dtype bfloat16 --from float32 --exclude '/Adam'
  tfckpt convert big/ small/ --dtype float16 --overflow clip --dry-run""",
    "rename": """examples:
  tfckpt rename pre/model new/model --map 'simple-conv1/=complex-conv1/'
  tfckpt rename pre/ new/ --map '(.*)/weights$=\\1/kernel' --map-file exact.json""",
    "select": """examples:
  tfckpt select pre/model new/model --include '^simple-conv1/(weights|biases)$'
  tfckpt select trained/ shipped/ --drop-object optimizer
  tfckpt select trained/ small/ --exclude 'BatchNorm'""",
    "merge": """examples:
  tfckpt merge a/model.ckpt b/model.ckpt -o c/model.ckpt
  tfckpt merge a/ b/ -o c/ --prefer last""",
}


def _sub(sub, name: str, help: str, description: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfckpt",
        description="Read, inspect and rewrite TensorFlow checkpoints directly from their files.",
    )
    parser.add_argument("--version", action="version", version=f"tfckpt {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _sub(
        sub,
        "dump",
        "list the tensors of a checkpoint",
        "Show what a checkpoint holds; reads only the index unless values are asked for.",
    )
    p.add_argument("path", help="checkpoint prefix, .index file, directory or SavedModel")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--filter", metavar="REGEX", help="only tensors whose name matches")
    p.add_argument(
        "--tensor",
        metavar="NAME_OR_REGEX",
        action="append",
        help="print the values of these tensors (repeatable)",
    )
    p.add_argument("--full", action="store_true", help="with --tensor, print every element")
    p.add_argument(
        "--object-graph",
        action="store_true",
        help="TF2: show the object graph that tf.train.Checkpoint.restore matches",
    )
    p.set_defaults(func=cmd_dump)

    p = _sub(
        sub,
        "diff",
        "compare two checkpoints",
        "Names only in A or B, dtype and shape changes, and value differences of common "
        "tensors (compared in the wider dtype).",
    )
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0)")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance (default 0)")
    p.add_argument("--names-only", action="store_true", help="compare names, dtypes, shapes")
    p.add_argument("--filter", metavar="REGEX", help="only tensors whose name matches")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_diff)

    p = _sub(
        sub,
        "stats",
        "value statistics, and what a float16/bfloat16 cast would do",
        "Per tensor: min, max, mean, std, NaN and inf counts, fraction of zeros; for "
        "floating-point tensors, how many values would overflow, become zero or become "
        "subnormal in float16 and bfloat16. Streams in bounded memory.",
    )
    p.add_argument("path")
    p.add_argument("--filter", metavar="REGEX", help="only tensors whose name matches")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_stats)

    p = _sub(
        sub,
        "verify",
        "check a checkpoint's integrity",
        "Every block checksum, tensor CRC32C, shard extent, shard file, slice cover, "
        "string framing and object-graph key.",
    )
    p.add_argument("path")
    p.add_argument(
        "--tf",
        action="store_true",
        help="also read every tensor with TensorFlow and compare bit-for-bit",
    )
    p.add_argument(
        "--reference",
        metavar="SRC",
        help="with --tf: the checkpoint this one was converted from; cast tensors "
        "must equal TensorFlow's tf.cast of it",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_verify)

    p = _sub(
        sub,
        "convert",
        "cast floating-point tensors to another dtype",
        "Write a copy of SRC with floating-point tensors cast, e.g. float32 -> float16. "
        "Accepts every transform option.",
    )
    p.add_argument("src")
    p.add_argument("dst", help="output prefix, or a directory (the source's name is kept)")
    _add_transform_options(p, dtype_required=True)

    p = _sub(
        sub,
        "rename",
        "rename tensors by regex rules or an exact map",
        "Write a copy of SRC with tensors renamed; TF2 object graphs are re-keyed so "
        "restore still finds every value.",
    )
    p.add_argument("src")
    p.add_argument("dst")
    _add_transform_options(p)

    p = _sub(
        sub,
        "select",
        "keep only some tensors or TF2 objects",
        "Write a copy of SRC with only the selected tensors.",
    )
    p.add_argument("src")
    p.add_argument("dst")
    _add_transform_options(p)

    p = _sub(
        sub,
        "merge",
        "combine several checkpoints into one",
        "Write one checkpoint holding the tensors of all SOURCES; TF2 object graphs are "
        "joined at the root.",
    )
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("-o", "--output", required=True, metavar="DST")
    _add_transform_options(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # An output encoding narrower than UTF-8 (PYTHONIOENCODING=ascii) shows an escape
        # for a character of a name it lacks, not a traceback.
        if (
            hasattr(stream, "reconfigure")
            and (stream.encoding or "").lower().replace("-", "") != "utf8"
        ):
            stream.reconfigure(errors="backslashreplace")
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("tfckpt: interrupted", file=sys.stderr)
        return 130
    finally:
        if argv is None and threading.current_thread() is threading.main_thread():
            # The program itself (not a caller in-process): its work is over, and a
            # Ctrl-C from here on would only turn a finished run into a traceback.
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
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
            message = str(e)
        emit(f"tfckpt: error: {message}", err=True)
        return EXIT_ERROR
