"""The commands behind the command line: each reads its arguments, calls the library
and prints what it returns, through :mod:`tfckpt.display` (or as JSON).
"""

from __future__ import annotations

import base64
import functools
import json
import re
import sys
from typing import TYPE_CHECKING

import numpy as np

from tfckpt import inspection as _inspect
from tfckpt.checkpoint.opening import open_checkpoint
from tfckpt.checkpoint.reader import Checkpoint
from tfckpt.checkpoint.slicing import parse_index, split_expression
from tfckpt.cli.display import (
    compact_json,
    emit,
    fmt,
    human_bytes,
    print_json,
    print_json_text,
    shape_text,
    table,
    width,
)
from tfckpt.errors import CheckpointError, CheckpointNotFoundError
from tfckpt.format import dtypes as _dt
from tfckpt.format.orderedcode import encode_name
from tfckpt.rewrite.options import Options

if TYPE_CHECKING:
    from tfckpt.rewrite.engine import Summary
    from tfckpt.rewrite.planner import Plan


def _print_dump(data: dict) -> None:
    v = data["version"]
    emit(f"prefix      {data['prefix']}")
    emit(f"shards      {data['num_shards']}")
    emit(
        f"format      {data.get('format', 'bundle v2')}, producer {v['producer']}, "
        f"min consumer {v['min_consumer']}, {data['endianness']}-endian"
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


def _value_names(ckpt: Checkpoint, patterns: list[str]) -> list[tuple[str, str | None]]:
    """The tensors ``dump --tensor`` asks for, each once, with the index asked for (or
    None): an exact name; else a tensor's name followed by ``[index]`` (``emb[0:5]``);
    else the names a regex matches."""
    names: list[tuple[str, str | None]] = []
    for p in patterns:
        if p in ckpt:
            names.append((p, None))
            continue
        split = split_expression(p)
        if split is not None and split[0] in ckpt:
            names.append((split[0], p[len(split[0]) + 1 : -1]))
            continue
        matched = [n for n in ckpt.keys() if re.search(p, n)]
        if not matched:
            raise CheckpointError(f"no tensor matches {p!r}", path=ckpt.prefix)
        names.extend((n, None) for n in matched)
    return list(dict.fromkeys(names))


def _value(ckpt: Checkpoint, name: str, index: str | None) -> np.ndarray:
    """The tensor's value, or the part of it ``index`` asks for (only that part is read)."""
    if index is None:
        return ckpt[name]
    part = ckpt.get_slice(name)
    try:
        return np.asarray(part[parse_index(index)])
    except (IndexError, ValueError, TypeError) as e:
        raise CheckpointError(
            f"cannot index shape {list(part.shape)} with [{index}]: {e}",
            path=ckpt.prefix,
            tensor=name,
        ) from None


def _print_values(ckpt: Checkpoint, patterns: list[str], full: bool) -> None:
    threshold = sys.maxsize if full else 1000
    for name, index in _value_names(ckpt, patterns):
        info = ckpt.info(name)
        value = _value(ckpt, name, index)
        label = name if index is None else f"{name}[{index}]"
        emit(f"{label} ({info.dtype} {shape_text(value.shape)})")
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
    for name, index in _value_names(ckpt, patterns):
        info = ckpt.info(name)
        value = _value(ckpt, name, index)
        tensors.append(
            {
                "name": name,
                **({} if index is None else {"index": index}),
                "dtype": info.dtype,
                "shape": list(value.shape),
                **_json_values(value, info.dtype),
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


def _print_checkpoints(data: dict) -> None:
    rows = [["NAME", "STEP", "TENSORS", "SIZE", "NOTE"]]
    for c in data["checkpoints"]:
        note = "latest" if c["latest"] else ""
        if data["state_file"] and not c["in_state_file"]:
            note = "not in the state file"
        if c["error"]:
            note = f"{note}; {c['error']}" if note else c["error"]
        rows.append(
            [
                c["name"],
                "-" if c["step"] is None else str(c["step"]),
                "-" if c["tensors"] is None else str(c["tensors"]),
                "-" if c["bytes"] is None else human_bytes(c["bytes"]),
                note,
            ]
        )
    emit(f"directory   {data['directory']}")
    emit(f"latest      {data['latest'] if data['latest'] is not None else '- (no state file)'}")
    emit()
    table(rows, right={1, 2, 3})


def cmd_dump(args) -> int:
    if args.all:
        if args.tensor or args.object_graph or args.filter:
            raise CheckpointError("--all lists checkpoints: no --tensor, --object-graph, --filter")
        data = _inspect.checkpoints(args.path)
        if not data["checkpoints"]:
            raise CheckpointNotFoundError("no checkpoint in directory", path=data["directory"])
        if args.json:
            print_json(data)
        else:
            _print_checkpoints(data)
        return 0
    with open_checkpoint(args.path) as ckpt:
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
        if args.json and compact_json():  # the common case for programs, built in bulk
            print_json_text(*_inspect.dump_json_parts(ckpt, filter=args.filter))
            return 0
        data = _inspect.dump(ckpt, filter=args.filter)
    if args.json:
        print_json(data)
    else:
        _print_dump(data)
    return 0


def cmd_diff(args) -> int:
    with open_checkpoint(args.a) as a, open_checkpoint(args.b) as b:
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
    with open_checkpoint(args.path) as ckpt:
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
        from tfckpt.tf import verify_with_tf

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
        except RecursionError:  # a million '[': the nesting is deeper than Python's stack
            raise CheckpointError(
                "cannot read the rename map: nested too deeply", path=args.map_file
            ) from None
        if not isinstance(exact, dict):
            raise CheckpointError(
                "--map-file: the rename map must be a JSON object of names (old: new), "
                f"not {_json_type(exact)}",
                path=args.map_file,
            )
        for old, new in exact.items():
            if not isinstance(new, str):
                raise CheckpointError(
                    f"--map-file: the new name of {old!r} must be a string, not {_json_type(new)}",
                    path=args.map_file,
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


def _json_type(value) -> str:
    """What a JSON value is, in JSON's words."""
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "true or false"}
    kinds.update({int: "a number", float: "a number", type(None): "null"})
    return kinds.get(type(value), type(value).__name__)


def _dtype_rules(args) -> list[tuple[str, str]]:
    rules = []
    for item in args.dtype_rule or []:
        pattern, eq, dtype = item.rpartition("=")  # a dtype name has no '='; a regex may
        if not eq or not pattern:
            raise CheckpointError(f"--dtype-rule takes REGEX=DTYPE, not {item!r}")
        rules.append((pattern, dtype))
    return rules


def _print_plan(p: Plan) -> None:
    counts = p.dtype_rule_counts()
    rows = [["SOURCE", "NAME", "NEW NAME", "DTYPE", "SHAPE", "BYTES IN", "BYTES OUT"]]
    if counts is not None:
        rows[0].append("DTYPE BY")
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
            + ([] if counts is None else [t.dtype_by or "-"])
        )
    table(rows, right={5, 6})
    for src, name, why in p.dropped:
        emit(f"drop  {src}  {name}  ({why})")
    emit()
    for label, n in (counts or {}).items():
        emit(f"dtype {label}: {n} tensors")
    emit(
        f"{len(p.tensors)} tensors to {p.dst}, {human_bytes(p.bytes_in)} in, "
        f"{human_bytes(p.bytes_out)} out, {len(p.dropped)} dropped"
        + (
            ""
            if p.object_graph is None
            else ", object graph copied"
            if p.object_graph_copied
            else ", object graph rewritten"
        )
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
    for rule, n in (sm.dtype_rules or {}).items():
        emit(f"  dtype {rule}: {n} tensors", err=True)
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
        if workers is not None and workers < 1:
            raise CheckpointError(f"--executor {spec}: the worker count must be at least 1")
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
    from tfckpt.rewrite.planner import (
        plan,  # the transforms' modules load when one runs, not for dump
    )

    sources = args.sources if args.command == "merge" else [args.src]
    dst = args.output if args.command == "merge" else args.dst
    options = _options(args, backend=args.backend, tf_threshold=args.tf_threshold)
    return _run_plan(args, plan(sources, dst, options))


def _options(args, **extra) -> Options:
    """The engine's options from the flags every rewriting command shares, plus ``extra``."""
    rules, exact = _rename_rules(args)
    return Options(
        include=args.include,
        exclude=args.exclude,
        drop_objects=args.drop_object or (),
        rename=rules,
        rename_exact=exact,
        cast=args.dtype,
        cast_from=args.cast_from.split(",") if args.cast_from else None,
        keep_dtype=args.keep_dtype or (),
        dtype_rules=_dtype_rules(args),
        prefer=args.prefer,
        max_shard_bytes=args.max_shard_bytes,
        overwrite=args.overwrite,
        overflow=args.overflow,
        chunk_bytes=args.chunk_bytes,
        durable=args.durable,
        **extra,
    )


def cmd_average(args) -> int:
    from tfckpt.rewrite.average import check_weights, plan_average, write_average

    if args.last is not None and len(args.sources) != 1:
        raise CheckpointError("--last N takes one directory, DIR")
    options = Options(
        drop_objects=args.drop_object or (),
        cast=args.dtype,
        cast_from=args.cast_from.split(",") if args.cast_from else None,
        keep_dtype=args.keep_dtype or (),
        dtype_rules=_dtype_rules(args),
        max_shard_bytes=args.max_shard_bytes,
        overwrite=args.overwrite,
        overflow=args.overflow,
        chunk_bytes=args.chunk_bytes,
        durable=args.durable,
    )
    p = plan_average(
        args.sources[0] if args.last is not None else args.sources,
        args.output,
        options,
        weights=check_weights(args.weights, "--weights") if args.weights else None,
        use_ema=args.use_ema,
        last=args.last,
    )
    try:
        return _run_average(args, p, write_average)
    finally:
        p.close()


def _run_average(args, p, write_average) -> int:
    if args.dry_run:
        if args.json:
            print_json(p.to_dict())
            return 0
        counts = p.dtype_rule_counts()
        rows = [["NAME", "NEW NAME", "DTYPE", "SHAPE", "VALUE", "BYTES OUT"]]
        if counts is not None:
            rows[0].append("DTYPE BY")
        for t in p.tensors:
            dtype = (
                t.info.dtype if t.info.dtype == t.new_dtype else f"{t.info.dtype}->{t.new_dtype}"
            )
            how = f"mean of {len(p.sources)}" if t.averaged else "newest"
            new = "=" if t.new_name == t.name else t.new_name
            rows.append(
                [t.name, new, dtype, shape_text(t.info.shape), how, human_bytes(t.bytes_out)]
                + ([] if counts is None else [t.dtype_by or "-"])
            )
        table(rows, right={5})
        for name, why in p.dropped:
            emit(f"drop  {name}  ({why})")
        emit()
        for label, n in (counts or {}).items():
            emit(f"dtype {label}: {n} tensors")
        weights = " ".join(f"{w:g}" for w in p.weights)
        emit(
            f"{len(p.tensors)} tensors to {p.dst} from {len(p.sources)} sources (weights "
            f"{weights}; newest {p.sources[-1].label}), {human_bytes(p.bytes_in)} in, "
            f"{human_bytes(p.bytes_out)} out, {len(p.dropped)} dropped"
        )
        return 0
    update, close = _progress(p.bytes_in)
    try:
        summary = write_average(p, progress=update)
    finally:
        close()
    if args.json:
        print_json(summary.to_dict())
    _print_summary(summary)
    return 0


def _print_export(sm, dry_run: bool) -> None:
    if dry_run:
        ruled = any("dtype_by" in t for t in sm.tensors)
        rows = [["NAME", "NEW NAME", "DTYPE", "SHAPE", "FILE"] + (["DTYPE BY"] if ruled else [])]
        for t in sm.tensors:
            dtype = (
                t["dtype"] if t["dtype"] == t["new_dtype"] else f"{t['dtype']}->{t['new_dtype']}"
            )
            shape = shape_text(t["shape"]) + (f" permuted {t['permute']}" if t["permute"] else "")
            rows.append(
                [t["name"], t["new_name"], dtype, shape, t["file"]]
                + ([t.get("dtype_by") or "-"] if ruled else [])
            )
        table(rows, right=set())
    verb = "would write" if dry_run else "wrote"
    emit(
        f"{verb} {sm.out}: {len(sm.tensors)} tensors in {len(sm.files)} file(s), "
        f"{sm.dropped} dropped, {human_bytes(sm.bytes_out)}"
        + ("" if dry_run else f", {sm.seconds:.2f} s"),
        err=True,
    )
    for name, reason in sm.skipped:
        emit(f"tfckpt: note: left out {name}: {reason}", err=True)


def cmd_export(args) -> int:
    from tfckpt.interop.export import export
    from tfckpt.interop.importing import import_
    from tfckpt.rewrite.permute import parse_permutes

    if args.executor or args.backend != "numpy":
        # One process streams the files; tf.cast's bits are numpy's anyway.
        raise CheckpointError(f"{args.command} runs here with numpy: no --executor or --backend")
    options = _options(args)
    permute = parse_permutes(args.permute or [])
    if args.command == "export":
        kwargs = dict(
            format=args.format,
            permute=permute,
            keep_keys=args.keep_keys,
            with_optimizer=args.with_optimizer,
            with_bookkeeping=args.with_bookkeeping,
            skip_unsupported=args.skip_unsupported,
        )
        run = functools.partial(export, args.src, args.out, options, **kwargs)
    else:
        run = functools.partial(import_, args.src, args.out, options, permute=permute)
    if args.dry_run:
        sm = run(dry_run=True)
    else:
        # The bar's total is what a dry run says will be written: asked only for a terminal.
        total = run(dry_run=True).bytes_out if sys.stderr.isatty() else 0
        update, close = _progress(total)
        try:
            sm = run(progress=update)
        finally:
            close()
    if args.json:
        print_json(sm.to_dict())
    if not (args.json and args.dry_run):
        _print_export(sm, args.dry_run)
    return 0


def _run_plan(args, p: Plan) -> int:
    """Print a dry run's plan, or execute it and print the summary."""
    if args.dry_run:
        if args.json:
            print_json(p.to_dict())
        else:
            _print_plan(p)
        return 0
    from tfckpt.rewrite.engine import execute

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


def cmd_graft(args) -> int:
    from tfckpt.rewrite.graft import plan_graft

    options = _options(args, backend=args.backend, tf_threshold=args.tf_threshold)
    p = plan_graft(
        args.template, args.sources, args.output, options, allow_missing=args.allow_missing
    )
    return _run_plan(args, p)


def cmd_flatten(args) -> int:
    from tfckpt.rewrite.graft import plan_flatten

    options = _options(args, backend=args.backend, tf_threshold=args.tf_threshold)
    return _run_plan(args, plan_flatten(args.src, args.dst, options))
