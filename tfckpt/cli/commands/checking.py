"""``tfckpt check`` and ``tfckpt dump GRAPH.meta``: what a TF1 graph file holds, and whether a
restore would succeed; each calls :mod:`tfckpt.inspection` and prints what it returns."""

from __future__ import annotations

from tfckpt.checkpoint.restoring import RestoreCheck
from tfckpt.cli.display import emit, print_json, shape_text, table
from tfckpt.errors import CheckpointError
from tfckpt.inspection.check import check
from tfckpt.inspection.meta import meta_graph


def _shape(shape) -> str:
    return "<unknown rank>" if shape is None else shape_text("?" if d is None else d for d in shape)


def cmd_dump_meta(args) -> int:
    """``tfckpt dump GRAPH.meta`` (or ``saved_model.pb``): the graph's variables, Saver,
    collections, signatures and placeholders."""
    if args.tensor or args.object_graph or args.filter or args.all:
        raise CheckpointError(
            "a .meta graph holds no values: no --tensor, --object-graph, --filter or --all "
            "(open the checkpoint beside it for those)",
            path=args.path,
        )
    data = meta_graph(args.path, storage_options=args.storage_options)
    if args.json:
        print_json(data)
    elif "meta_graphs" in data:  # a saved_model.pb
        for i, graph in enumerate(data["meta_graphs"]):
            if i:
                emit()
            print_meta(graph)
    else:
        print_meta(data)
    return 0


def print_meta(data: dict) -> None:
    emit(f"graph       {data['path']}")
    emit(f"tensorflow  {data['tensorflow_version'] or '-'}, {data['nodes']} nodes")
    if data["tags"]:
        emit(f"tags        {', '.join(data['tags'])}")
    emit()
    rows = [["VARIABLE", "DTYPE", "SHAPE", "TRAINABLE", "PARTITION"]]
    for v in data["variables"]:
        p = v["partition"]
        part = (
            "-"
            if p is None
            else (f"of {p['full_name']} {shape_text(p['full_shape'])} at {shape_text(p['offset'])}")
        )
        trainable = "yes" if v["trainable"] else ""
        rows.append([v["name"], v["dtype"] or "?", _shape(v["shape"]), trainable, part])
    if len(rows) > 1:
        table(rows, right=set())
    else:
        emit("no variables")
    emit()
    saver = data["saver"]
    if saver is None:
        why = data.get("no_saver")
        emit(
            f"saver       none (no saver_def; import_meta_graph builds none: {why})"
            if why
            else "saver       none"
        )
    else:
        emit(
            f"saver       {saver['version']}{', sharded' if saver['sharded'] else ''}, "
            f"max_to_keep {saver['max_to_keep']}: restores {len(saver['restores'])} values"
        )
        if saver["default"]:
            emit("  (no saver_def: the default Saver import_meta_graph builds over the")
            emit("   variables and saveable_objects collections)")
        else:
            emit(f"  filename  {saver['filename_tensor']}")
            emit(f"  save      {saver['save_tensor']}")
            emit(f"  restore   {saver['restore_op']}")
    if data["collections"]:
        emit()
        rows = [["COLLECTION", "KIND", "COUNT", "ITEMS"]]
        for c in data["collections"]:
            items = c["items"]
            shown = "" if items is None else ", ".join(map(str, items[:8]))
            if items is not None and len(items) > 8:
                shown += ", ..."
            rows.append([c["name"], c["kind"] or "-", str(c["count"]), shown])
        table(rows, right={2}, squeeze=3)
    for s in data["signatures"]:
        emit()
        emit(f"signature {s['key']!r} ({s['method_name'] or 'no method'})")
        for side in ("inputs", "outputs"):
            for t in s[side]:
                kind = f"{t['dtype'] or '?'} {_shape(t['shape'])}"
                emit(f"  {side[:-1]:6} {t['key']}: {t['name']} {kind}")
    if data["placeholders"]:
        emit()
        rows = [["PLACEHOLDER", "DTYPE", "SHAPE", "DEFAULT"]]
        for p in data["placeholders"]:
            default = "yes" if p["with_default"] else ""
            rows.append([p["name"], p["dtype"] or "?", _shape(p["shape"]), default])
        table(rows, right=set())


def cmd_check(args) -> int:
    """``tfckpt check CKPT --against TARGET``: exit status 0 when the restore would succeed,
    1 when it would fail."""
    result = check(
        args.path,
        args.against,
        restorer="tfckpt" if args.cast else "tensorflow",
        allow_missing=args.allow_missing,
        assert_consumed=args.assert_consumed,
        storage_options=args.storage_options,
    )
    if args.json:
        print_json(result.to_dict())
    else:
        print_check(result)
    return 0 if result.ok else 1


_LABELS = {"missing": "MISSING", "dtype": "DTYPE", "shape": "SHAPE", "slices": "SLICES"}


def print_check(result: RestoreCheck) -> None:
    emit(f"checkpoint  {result.checkpoint}")
    emit(f"target      {result.target}")
    for note in result.notes:
        emit(f"note: {note}")
    unused = [f for f in result.findings if f.kind == "unused"]
    for f in result.findings:
        if f.kind == "unused":
            continue
        label = _LABELS[f.kind] if f.fails else f"{_LABELS[f.kind].lower()} (warning)"
        emit((label, "31" if f.fails else "33"), f"  {f.detail}")
    if unused:
        failing = any(f.fails for f in unused)
        head = f"{len(unused)} tensors of the checkpoint are read by nothing"
        emit(
            (head, "31" if failing else "2"),
            " (the restore fails on them):" if failing else " (information):",
        )
        for f in unused[:20]:
            emit(f"  {f.tensor}")
        if len(unused) > 20:
            emit(f"  ... and {len(unused) - 20} more (--json lists them all)")
    castable = [f for f in result.failures() if f.kind == "dtype" and f.castable]
    if castable and result.cast_command:
        emit(
            f"{len(castable)} dtype mismatches are fixed by a cast: {result.cast_command}; "
            "or restore with tfckpt.restore / tfckpt.keras.load_weights, which cast"
        )
    failures = result.failures()
    if result.ok:
        emit(("ok", "32"), f": a restore would succeed ({result.wanted} values read)")
        return
    counts: dict[str, int] = {}
    for f in failures:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    listed = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    emit(("fails", "31"), f": a restore would fail ({listed})")
