"""``tfckpt match``: the pairs :func:`tfckpt.interop.matching.match` suggests, as a table
(or JSON), and with ``-o`` the rules file to review."""

from __future__ import annotations

from tfckpt.cli.display import emit, print_json, shape_text, table
from tfckpt.errors import CheckpointError


def cmd_match(args) -> int:
    """Pair SRC's tensors with TARGET's names; print them, write the rules with -o."""
    from tfckpt.interop.matching import match

    if not 0.0 <= args.min_confidence <= 1.0:  # also NaN
        raise CheckpointError(f"--min-confidence takes 0 to 1, not {args.min_confidence:g}")
    m = match(args.src, args.target, storage_options=args.storage_options)
    if args.output:
        written = m.write(
            args.output,
            min_confidence=args.min_confidence,
            overwrite=args.overwrite,
            storage_options=args.storage_options,
        )
    if args.json:
        print_json(m.to_dict())
    else:
        rows = [["SOURCE", "TARGET", "CONFIDENCE", "TRANSFORM"]]
        for p in m.pairs:
            held = " (commented out)" if p.confidence < args.min_confidence else ""
            rows.append([p.source.name, p.target.name, f"{p.confidence:.2f}{held}", p.transform])
        if m.pairs:
            table(rows, right={2})
        kinds: dict[str, list[str]] = {}
        for name, why in m.excluded:
            kinds.setdefault(why, []).append(name)
        for why, names in kinds.items():
            emit(
                f"exclude   {len(names)} tensor(s), {why}: {names[0]}" + ", ..." * (len(names) > 1)
            )
        for t in m.unpaired:
            emit(f"unpaired  {t.name}  {shape_text(t.shape)}  (no target name fits: excluded)")
        for t in m.unfilled:
            emit(f"unfilled  {t.name}  {shape_text(t.shape)}  (no source tensor fits)")
        low = sum(p.confidence < 0.5 for p in m.pairs)
        emit(
            f"{len(m.pairs)} pairs ({low} under confidence 0.5), {len(m.excluded)} excluded, "
            f"{len(m.unpaired)} unpaired, {len(m.unfilled)} target names unfilled"
        )
    if args.output:
        emit(f"wrote {written}: review it, then export with --rules {written}", err=True)
    return 0
