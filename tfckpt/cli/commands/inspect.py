"""The inspecting commands, dump, diff, stats and verify: each calls
:mod:`tfckpt.inspection` and prints what it returns through :mod:`tfckpt.cli.display`
(or as JSON).
"""

from __future__ import annotations

import base64
import re
import sys

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
from tfckpt.errors import CheckpointError, CheckpointNotFoundError, did_you_mean
from tfckpt.format import dtypes as _dt
from tfckpt.inspection.meta import is_meta_graph


def _print_dump(data: dict) -> None:
    v = data["version"]
    emit(f"prefix      {data['prefix']}")
    emit(f"shards      {data['num_shards']}")
    # No TensorFlow header to speak of.
    if data.get("format", "").startswith(("Keras", "OpenAI GPT")):
        emit(f"format      {data['format']}")
    else:
        emit(
            f"format      {data.get('format', 'bundle v2')}, producer {v['producer']}, "
            f"min consumer {v['min_consumer']}, {data['endianness']}-endian"
        )
    emit(f"tensors     {data['tensor_count']}")
    emit(
        f"total       {human_bytes(data['total_bytes'])} ({data['total_bytes']} bytes of "
        "tensor data on disk)"
    )
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
            near = did_you_mean(p, ckpt.keys())
            raise CheckpointError(f"no tensor matches {p!r}{near}", path=ckpt.prefix)
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
        if c.get("state_file", data["state_file"]) and not c["in_state_file"]:
            note = "not in the state file"
        if c["error"]:
            note = f"{note}; {c['error']}" if note else c["error"]
        rows.append(
            [
                c["name"],
                "-" if c["step"] is None else str(c["step"]),
                "-" if c["tensors"] is None else str(c["tensors"]),
                "-" if c["tensor_bytes"] is None else human_bytes(c["tensor_bytes"]),
                note,
            ]
        )
    emit(f"directory   {data['directory']}")
    emit(f"latest      {data['latest'] if data['latest'] is not None else '- (no state file)'}")
    emit()
    table(rows, right={1, 2, 3})


def cmd_dump(args) -> int:
    """``tfckpt dump``: a checkpoint's tensors and scopes, values (--tensor), its object
    graph, (--all) the checkpoints of a directory, or what a ``.meta`` graph holds."""
    if is_meta_graph(args.path, args.storage_options):
        from tfckpt.cli.commands.checking import cmd_dump_meta

        return cmd_dump_meta(args)
    if args.all:
        if args.tensor or args.object_graph or args.filter:
            raise CheckpointError("--all lists checkpoints: no --tensor, --object-graph, --filter")
        data = _inspect.checkpoints(args.path, storage_options=args.storage_options)
        if not data["checkpoints"]:
            raise CheckpointNotFoundError("no checkpoint in directory", path=data["directory"])
        if args.json:
            print_json(data)
        else:
            _print_checkpoints(data)
        return 0
    with open_checkpoint(args.path, storage_options=args.storage_options) as ckpt:
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
            print_json_text(_inspect.dump_json_parts(ckpt, filter=args.filter))
            return 0
        data = _inspect.dump(ckpt, filter=args.filter)
    if args.json:
        print_json(data)
    else:
        _print_dump(data)
    return 0


def cmd_diff(args) -> int:
    """``tfckpt diff``: what differs between two checkpoints; exit status 1 if anything does."""
    with (
        open_checkpoint(args.a, storage_options=args.storage_options) as a,
        open_checkpoint(args.b, storage_options=args.storage_options) as b,
    ):
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
    """``tfckpt stats``: value statistics per tensor, and what a float16/bfloat16 cast would do."""
    if args.html is None:
        with open_checkpoint(args.path, storage_options=args.storage_options) as ckpt:
            data = _inspect.stats(ckpt, filter=args.filter)
    else:
        data = _stats_page(args)
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


def _stats_page(args) -> dict:
    """Write the --html page; the statistics it holds (one pass gives both)."""
    from tfckpt.inspection import report  # loads matplotlib: only for a page

    with open_checkpoint(args.path, storage_options=args.storage_options) as ckpt:
        report.check_destination(
            args.html,
            overwrite=args.overwrite,
            storage_options=args.storage_options,
            checkpoints=[ckpt.prefix],
        )
        page = report.stats_report(ckpt, args.dtype, filter=args.filter)
    path = report.write_report(
        args.html,
        page,
        top=args.report_top,
        overwrite=args.overwrite,
        storage_options=args.storage_options,
    )
    emit(f"wrote {path}", err=True)
    return page["stats"]


def cmd_verify(args) -> int:
    """``tfckpt verify``: every checksum and structure check (with --tf, TensorFlow's reading
    too); exit status 1 if a problem is found."""
    if args.against is not None:
        return _verify_against(args)
    given = [f for f in _AGAINST_ONLY if getattr(args, f.lstrip("-").replace("-", "_"))]
    if given:
        raise CheckpointError(f"{', '.join(given)}: for verify --against OUT only")
    data = _inspect.verify(args.path, storage_options=args.storage_options)
    if args.tf and not data["problems"]:
        from tfckpt.tf import verify_with_tf

        tf_report = verify_with_tf(
            args.path, reference=args.reference, storage_options=args.storage_options
        )
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
        fmt = data.get("format", "")
        checked = (
            "every dataset read"
            if fmt.startswith("Keras")
            else "every shard read (numpy shards have no checksums)"
            if fmt.startswith("OpenAI GPT")
            else "every checksum, shard, slice and object-graph key checked"
        )
        emit(
            f"ok: {data['prefix']}: {data['tensors']} tensors, {human_bytes(data['bytes'])}, "
            f"{checked}{extra}"
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


# verify's options that say how a conversion was made: for --against only.
_AGAINST_ONLY = (
    "--preset",
    "--dtype",
    "--keep-dtype",
    "--dtype-rule",
    "--cast-bookkeeping",
    "--include",
    "--exclude",
    "--drop-object",
    "--map",
    "--map-file",
    "--rules",
    "--split",
    "--concat",
    "--permute",
    "--reshape",
    "--squeeze",
    "--keep-keys",
    "--with-optimizer",
    "--with-bookkeeping",
)


def _verify_against(args) -> int:
    """``tfckpt verify SRC --against OUT``: exit status 1 if OUT is not what SRC becomes."""
    from tfckpt.cli.commands.transform import options_from
    from tfckpt.interop.proof import verify_against

    if args.tf or args.reference:
        raise CheckpointError("--tf and --reference check one checkpoint: not with --against")
    options = options_from(args, backend=args.backend, tf_threshold=args.tf_threshold)
    proof = verify_against(
        args.path,
        args.against,
        options,
        preset=args.preset,
        storage_options=args.storage_options,
        keep_keys=args.keep_keys,
        with_optimizer=args.with_optimizer,
        with_bookkeeping=args.with_bookkeeping,
    )
    if args.json:
        print_json(proof.to_dict())
        return 0 if proof.ok else 1
    for line in proof.problems():
        emit(line, err=True)
    if proof.ok:
        emit(
            f"ok: {proof.against}: {proof.checked} tensors, {human_bytes(proof.bytes)}, each "
            f"equal bit for bit to what {proof.source} becomes; every source tensor written "
            f"or left out by a rule ({len(proof.left_out)} left out)"
        )
        if proof.config_note:
            emit(f"tfckpt: note: {proof.config_note}", err=True)
    return 0 if proof.ok else 1
