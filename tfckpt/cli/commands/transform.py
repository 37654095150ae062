"""The rewriting commands, convert, rename, select, merge, graft, flatten, average, export,
import and edit: each turns its flags into :class:`~tfckpt.rewrite.options.Options`, plans,
then prints the plan (``--dry-run``) or runs it and prints the summary.

The engine's modules load inside the commands, when one runs: ``dump`` needs none.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tfckpt.cli.display import emit, human_bytes, print_json, shape_text, table
from tfckpt.errors import CheckpointError, install_hint
from tfckpt.format.orderedcode import encode_name
from tfckpt.rewrite.options import Options
from tfckpt.rewrite.pieces import parse_concats, parse_splits
from tfckpt.rewrite.rules import parse_permutes, parse_reshapes
from tfckpt.rewrite.rulesfile import load_rules

if TYPE_CHECKING:
    from tfckpt.rewrite.engine import Summary
    from tfckpt.rewrite.plans import Plan


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


def options_from(args, **extra) -> Options:
    """The engine's options from the flags every rewriting command shares, plus ``extra``;
    a ``--rules`` file's come after the flags' (a flag's rule is tried first)."""
    rules, exact = _rename_rules(args)
    flags: dict = dict(
        include=args.include or [],
        exclude=args.exclude or [],
        drop_objects=args.drop_object or [],
        rename=rules,
        keep_dtype=args.keep_dtype or [],
        dtype_rules=_dtype_rules(args),
        permute=parse_permutes(args.permute or []),
        reshape=parse_reshapes(args.reshape or []),
        squeeze=args.squeeze or [],
        split=parse_splits(args.split or []),
        concat=parse_concats(args.concat or []),
    )
    given = load_rules(args.rules) if getattr(args, "rules", None) else {}
    fields: dict[str, Any] = {k: [*v, *given.pop(k, [])] for k, v in flags.items()}
    fields["include"] = fields["include"] or None
    fields["exclude"] = fields["exclude"] or None
    fields["rename_exact"] = {**given.pop("rename_exact", {}), **exact}
    fields["name_map"] = given.pop("name_map", ())
    fields["allow_unmapped"] = getattr(args, "allow_unmapped", False) or given.pop(
        "allow_unmapped", False
    )
    fields["allow_unmatched"] = getattr(args, "allow_unmatched", False) or given.pop(
        "allow_unmatched", False
    )
    fields["cast"] = args.dtype if args.dtype is not None else given.pop("cast", None)
    fields["cast_from"] = (
        args.cast_from.split(",") if args.cast_from else given.pop("cast_from", None)
    )
    fields["cast_bookkeeping"] = getattr(args, "cast_bookkeeping", False) or given.pop(
        "cast_bookkeeping", False
    )
    return Options(
        **fields,
        prefer=getattr(args, "prefer", None),  # verify --against: no output options
        max_shard_bytes=getattr(args, "max_shard_bytes", None),
        overwrite=getattr(args, "overwrite", False),
        checkpoint_only=getattr(args, "checkpoint_only", False),
        overflow=args.overflow,
        chunk_bytes=args.chunk_bytes,
        durable=getattr(args, "durable", True),
        **extra,
    )


def _print_plan(p: Plan) -> None:
    counts, kept = p.dtype_rule_counts(), p.bookkeeping_kept()
    labelled = counts is not None or bool(kept)  # a column says what decided each dtype
    rows = [["SOURCE", "NAME", "NEW NAME", "DTYPE", "SHAPE", "BYTES IN", "BYTES OUT"]]
    if labelled:
        rows[0].append("DTYPE BY")
    for t in p.tensors:
        dtype = t.info.dtype if not t.cast else f"{t.info.dtype}->{t.new_dtype}"
        value = t.edit_fields().get("value")  # a graft's step count, flatten's Adam powers
        computed = value is not None
        rows.append(
            [
                "(computed)" if computed else p.sources[t.source].label,
                str(value) if computed else t.name,
                t.new_name if t.renamed or computed else "=",
                dtype,
                shape_text(t.info.shape)
                + ("" if t.shape is None else f"->{shape_text(t.out_shape)}"),
                human_bytes(t.info.nbytes),
                human_bytes(t.bytes_out),
            ]
            + ([t.dtype_by or "-"] if labelled else [])
        )
    table(rows, right={5, 6})
    for src, name, why in p.dropped:
        emit(f"drop  {src}  {name}  ({why})")
    emit()
    for label, n in (counts or {}).items():
        emit(f"dtype {label}: {n} tensors")
    emit_bookkeeping(kept, "would keep", err=False)
    sm = p.saved_model
    if sm is not None:
        left = f"; {', '.join(sm.left_out)} left out" if sm.left_out else ""
        verb = "replacing the one there" if sm.replaces else "new"
        emit(
            f"SavedModel {sm.directory} ({verb}): {sm.described() or 'no other file'} "
            f"copied from {sm.source}{left}"
        )
    else:
        from tfckpt.rewrite.savedmodel import bare_checkpoint_note

        note = bare_checkpoint_note(p)
        if note is not None:
            emit(f"note: {note}")
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
    what = sm.dst if sm.saved_model is None else f"SavedModel {sm.saved_model}"
    emit(
        f"wrote {what}: {sm.kept} tensors kept, {sm.dropped} dropped, {sm.renamed} renamed, "
        f"{sm.cast} cast; {human_bytes(sm.bytes_in)} in, {human_bytes(sm.bytes_out)} out, "
        f"{sm.seconds:.2f} s",
        err=True,
    )
    for label, attr in (
        ("clipped or overflowed", "overflow"),
        ("became zero", "to_zero"),
        ("became subnormal", "subnormal"),
    ):
        hit = sm.counted(attr)
        if hit:
            total = sum(hit.values())
            emit(f"  {total} values {label} in {len(hit)} tensors", err=True)
    for rule, n in (sm.dtype_rules or {}).items():
        emit(f"  dtype {rule}: {n} tensors", err=True)
    emit_bookkeeping(sm.bookkeeping_kept, "  kept")
    for note in sm.notes:
        emit(f"tfckpt: note: {note}", err=True)
    for warning in sm.warnings:
        emit(f"tfckpt: warning: {warning}", err=True)


def emit_bookkeeping(kept: dict[str, int], verb: str, err: bool = True) -> None:
    """One line per dtype of the training bookkeeping a cast passed by (see
    :func:`~tfckpt.rewrite.rules.bookkeeping_kept`)."""
    for dtype, n in kept.items():
        plural = "s" if n != 1 else ""
        emit(
            f"{verb} {n} bookkeeping tensor{plural} in {dtype} (metrics, optimizer state "
            "but slots, counters; --cast-bookkeeping casts them too)",
            err=err,
        )


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
                f"--executor dask:// needs Dask: {install_hint('dask')}"
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


def _run_plan(args, p: Plan) -> int:
    """Print a dry run's plan, or execute it and print the summary."""
    report_path = getattr(args, "report", None)  # convert's alone
    if report_path is not None and args.dry_run:
        raise CheckpointError(
            "--report shows what a conversion did: run it without --dry-run "
            "(tfckpt stats SRC --html FILE shows what it would do)"
        )
    if args.dry_run:
        if args.json:
            print_json(p.to_dict())
        else:
            _print_plan(p)
        return 0
    from tfckpt.rewrite.engine import execute

    if report_path is not None:
        from tfckpt.inspection import report  # loads matplotlib: only for a report

        report.check_destination(
            report_path,
            overwrite=args.overwrite,
            storage_options=args.storage_options,
            checkpoints=[s.ckpt.prefix for s in p.sources] + [p.dst],
        )
        report.check_available()  # matplotlib, before the checkpoint is written
        # The cast tensors whose values are the source's, only rounded: what the page
        # compares (a reshaped, permuted or edited tensor has no element-wise pair).
        pairs = [
            (t.name, t.new_name, t.new_dtype)
            for t in p.tensors
            if t.cast and t.perm is None and t.shape is None and t.parts is None and t.edit is None
        ]
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
    if report_path is not None:
        _write_report(args, report_path, summary.dst, pairs, summary.cast_counts)
    return 0


def _write_report(
    args, path: str, dst: str, pairs: list[tuple[str, str, str]], counts: Mapping
) -> None:
    """``convert --report``: the source and the output compared, in a page; ``counts``
    the conversion's own (exact) counts, so that a large tensor is only sampled."""
    from tfckpt.checkpoint.opening import open_checkpoint
    from tfckpt.inspection import report

    with open_checkpoint(args.src, storage_options=args.storage_options) as src:
        with open_checkpoint(dst, storage_options=args.storage_options) as out:
            data = report.conversion_report(src, out, pairs, counts=counts)
    path = report.write_report(
        path,
        data,
        top=args.report_top,
        overwrite=args.overwrite,
        storage_options=args.storage_options,
    )
    emit(f"wrote {path}", err=True)


def cmd_transform(args) -> int:
    """``tfckpt convert / rename / select / merge``: one plan from the transform options."""
    from tfckpt.rewrite.planner import (
        plan,  # the transforms' modules load when one runs, not for dump
    )

    sources = args.sources if args.command == "merge" else [args.src]
    dst = args.output if args.command == "merge" else args.dst
    options = options_from(args, backend=args.backend, tf_threshold=args.tf_threshold)
    rc = _run_plan(args, plan(sources, dst, options, storage_options=args.storage_options))
    if args.command == "convert" and not any(getattr(args, flag) for flag in TRANSFORM_FLAGS):
        verb = "would copy" if args.dry_run else "copied"
        emit(
            f"tfckpt: note: {verb} without casting (no --dtype); to cast, add e.g. --dtype float16",
            err=True,
        )
    return rc


# The flags that make convert more than a copy (their args' names).
TRANSFORM_FLAGS = (
    "dtype",
    "dtype_rule",
    "rules",
    "include",
    "exclude",
    "drop_object",
    "map",
    "map_file",
    "split",
    "concat",
    "permute",
    "reshape",
    "squeeze",
)


def _pairs(items: list[str], flag: str, sep: str = "=") -> dict[str, str]:
    out = {}
    for item in items:
        name, eq, value = item.rpartition(sep) if flag in ("--resize",) else item.partition(sep)
        if not eq or not name:
            raise CheckpointError(f"{flag} takes NAME{sep}VALUE, not {item!r}")
        out[name] = value
    return out


def cmd_edit(args) -> int:
    """``tfckpt edit``: set, fill, scale, add, delete, resize or remap tensors."""
    from tfckpt.rewrite.editing import Edits, plan_edit

    edits = Edits(
        set=_pairs(args.set, "--set"),
        add=_pairs(args.add, "--add"),
        delete=args.delete,
        fill=_pairs(args.fill, "--fill"),
        scale=_pairs(args.scale, "--scale"),
        resize=_pairs(args.resize, "--resize"),
        remap_rows=args.remap_rows,
        old_vocab=args.old_vocab,
        new_vocab=args.new_vocab,
        init=args.init,
        axis=args.axis,
        allow_no_overlap=args.allow_no_overlap,
    )
    if not any(
        (
            args.set,
            args.add,
            args.delete,
            args.fill,
            args.scale,
            args.resize,
            args.remap_rows,
            args.as_tf1,
        )
    ):
        raise CheckpointError(
            "edit: nothing to do (give --set, --add, --delete, --fill, "
            "--scale, --resize or --remap-rows)",
            path=args.src,
        )
    for item in args.add:
        if not item.partition("=")[2].startswith("@"):
            raise CheckpointError(f"--add takes NAME=@FILE.npy, not {item!r}")
    options = Options(
        chunk_bytes=args.chunk_bytes,
        durable=args.durable,
        overwrite=args.overwrite,
        checkpoint_only=args.checkpoint_only,
        max_shard_bytes=args.max_shard_bytes,
    )
    p = plan_edit(
        args.src,
        args.dst,
        edits,
        options,
        in_place=args.in_place,
        as_tf1=args.as_tf1,
        storage_options=args.storage_options,
    )
    rc = _run_plan(args, p)
    if not args.dry_run:
        edited = sum(t.edit is not None for t in p.tensors)
        emit(f"  {edited} tensors edited or added", err=True)
    for note in p.notes:
        emit(f"  {note}", err=True)
    if args.dry_run:  # a run's are the summary's
        for warning in p.warnings:
            emit(f"tfckpt: warning: {warning}", err=True)
    return rc


def cmd_graft(args) -> int:
    """``tfckpt graft``: fill a TF2 template with the sources' values found by name."""
    from tfckpt.rewrite.graft import plan_graft

    options = options_from(args, backend=args.backend, tf_threshold=args.tf_threshold)
    p = plan_graft(
        args.template,
        args.sources,
        args.output,
        options,
        allow_missing=args.allow_missing,
        storage_options=args.storage_options,
        **({"adam_betas": args.adam_betas} if args.adam_betas is not None else {}),
    )
    return _run_plan(args, p)


def cmd_flatten(args) -> int:
    """``tfckpt flatten``: a TF2 checkpoint as a name-based (TF1) one."""
    from tfckpt.rewrite.graft import plan_flatten

    options = options_from(args, backend=args.backend, tf_threshold=args.tf_threshold)
    if args.adam_betas is not None and not args.tf1_slots:
        raise CheckpointError("--adam-betas goes with --tf1-slots")
    p = plan_flatten(
        args.src,
        args.dst,
        options,
        tf1_slots=args.tf1_slots,
        storage_options=args.storage_options,
        **({"adam_betas": args.adam_betas} if args.adam_betas is not None else {}),
    )
    return _run_plan(args, p)


def cmd_average(args) -> int:
    """``tfckpt average``: the (weighted) element-wise mean of several checkpoints."""
    from tfckpt.rewrite.average import check_weights, plan_average

    if args.last is not None and len(args.sources) != 1:
        raise CheckpointError("--last N takes one directory, DIR")
    options = Options(
        drop_objects=args.drop_object or (),
        cast=args.dtype,
        cast_from=args.cast_from.split(",") if args.cast_from else None,
        keep_dtype=args.keep_dtype or (),
        dtype_rules=_dtype_rules(args),
        cast_bookkeeping=args.cast_bookkeeping,
        allow_unmatched=args.allow_unmatched,
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
        storage_options=args.storage_options,
    )
    try:
        return _run_average(args, p)
    finally:
        p.close()


def _run_average(args, p) -> int:
    if args.dry_run:
        if args.json:
            print_json(p.to_dict())
            return 0
        counts, kept = p.dtype_rule_counts(), p.bookkeeping_kept()
        labelled = counts is not None or bool(kept)
        rows = [["NAME", "NEW NAME", "DTYPE", "SHAPE", "VALUE", "BYTES OUT"]]
        if labelled:
            rows[0].append("DTYPE BY")
        for t in p.tensors:
            dtype = (
                t.info.dtype if t.info.dtype == t.new_dtype else f"{t.info.dtype}->{t.new_dtype}"
            )
            how = f"mean of {len(p.sources)}" if t.averaged else "newest"
            new = "=" if t.new_name == t.name else t.new_name
            rows.append(
                [t.name, new, dtype, shape_text(t.info.shape), how, human_bytes(t.bytes_out)]
                + ([t.dtype_by or "-"] if labelled else [])
            )
        table(rows, right={5})
        for _, name, why in p.dropped:
            emit(f"drop  {name}  ({why})")
        emit()
        for label, n in (counts or {}).items():
            emit(f"dtype {label}: {n} tensors")
        emit_bookkeeping(kept, "would keep", err=False)
        weights = " ".join(f"{w:g}" for w in p.weights)
        emit(
            f"{len(p.tensors)} tensors to {p.dst} from {len(p.sources)} sources (weights "
            f"{weights}; newest {p.sources[-1].label}), {human_bytes(p.bytes_in)} in, "
            f"{human_bytes(p.bytes_out)} out, {len(p.dropped)} dropped"
        )
        return 0
    from tfckpt.rewrite.engine import execute

    update, close = _progress(p.bytes_in)
    try:
        summary = execute(p, progress=update)
    finally:
        close()
    if args.json:
        print_json(summary.to_dict())
    _print_summary(summary)
    return 0


def cmd_export(args) -> int:
    """``tfckpt export`` (to safetensors / npz) and ``tfckpt import`` (back)."""
    from tfckpt.interop.export import export
    from tfckpt.interop.importing import import_

    if args.executor or args.backend != "numpy":
        # One process streams the files; tf.cast's bits are numpy's anyway.
        raise CheckpointError(f"{args.command} runs here with numpy: no --executor or --backend")
    options = options_from(args)
    if args.command == "export" and args.preset:
        from tfckpt.interop.presets import config_values, export_preset

        run = functools.partial(
            export_preset,
            args.src,
            args.out,
            args.preset,
            options,
            config=args.config,
            config_values=config_values(args.config_value),
            verify=args.verify,
            storage_options=args.storage_options,
        )
    elif args.command == "export":
        kwargs = dict(
            format=args.format,
            keep_keys=args.keep_keys,
            with_optimizer=args.with_optimizer,
            with_bookkeeping=args.with_bookkeeping,
            skip_unsupported=args.skip_unsupported,
        )
        run = functools.partial(
            export, args.src, args.out, options, storage_options=args.storage_options, **kwargs
        )
    else:
        run = functools.partial(
            import_,
            args.src,
            args.out,
            options,
            storage_options=args.storage_options,
        )
    if args.dry_run:
        sm = run(dry_run=True)
    else:
        # The bar starts once planned, with the bytes to write: one plan, each pattern
        # matched once.
        bar: dict = {}

        def start(total: int) -> None:
            bar["update"], bar["close"] = _progress(total)

        def update(n: int) -> None:
            if bar.get("update") is not None:
                bar["update"](n)

        try:
            sm = run(progress=update, on_total=start)
        finally:
            bar.get("close", lambda: None)()
    if args.json:
        print_json(sm.to_dict())
    if not (args.json and args.dry_run):
        _print_export(sm, args.dry_run)
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
        f"{verb} {sm.dst}: {len(sm.tensors)} tensors in {len(sm.files)} file(s), "
        f"{sm.dropped} dropped, {human_bytes(sm.bytes_out)}"
        + ("" if dry_run else f", {sm.seconds:.2f} s"),
        err=True,
    )
    emit_bookkeeping(
        sm.bookkeeping_kept, "tfckpt: note: would keep" if dry_run else "tfckpt: note: kept"
    )
    for name, reason in sm.skipped:
        emit(f"tfckpt: note: left out {name}: {reason}", err=True)
    for warning in sm.warnings:
        emit(f"tfckpt: note: {warning}", err=True)


def cmd_presets(args) -> int:
    """``tfckpt presets``: the presets export --preset knows."""
    from tfckpt.interop.presets import PRESETS

    if args.json:
        print_json({p.name: p.description for p in PRESETS.values()})
        return 0
    rows = [["PRESET", "WHAT"]] + [[p.name, p.description] for p in PRESETS.values()]
    table(rows, right=set(), squeeze=1)  # the names whole (they are what --preset takes)
    return 0
