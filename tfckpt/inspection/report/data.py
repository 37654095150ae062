"""What a report shows, as plain data: ``stats`` of the source with its log2 histograms,
and after a conversion the relative error of each cast tensor (``compare_values``, the
numbers of ``tfckpt diff DST SRC``) with a histogram of it.

Everything is counted in bounded chunks; a tensor's histogram holds one counter per
binary exponent, so the data of a checkpoint of any size is small. A histogram counts at
most :data:`~tfckpt.inspection.sampling.SAMPLE_VALUES` values of a tensor (a sample,
the same on every run, of a larger one), so the report's own work per tensor is bounded;
what a cast does to the values (overflow, zero, subnormal) is counted over every value,
in ``stats``' pass or in the conversion's. No plotting library is needed here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import partial

import numpy as np

from tfckpt.checkpoint.reader import DEFAULT_CHUNK_BYTES, Checkpoint
from tfckpt.errors import CheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.natural import in_natural_order
from tfckpt.inspection.diff import compare_chunks, compare_values
from tfckpt.inspection.histograms import Log2Histogram
from tfckpt.inspection.reading import stored_chunks
from tfckpt.inspection.sampling import SAMPLE_VALUES, Sample, stored_count
from tfckpt.inspection.stats import CAST_CHECK_TARGETS, SampledHistogram, describe, stats
from tfckpt.rewrite.cast import CastCounts

# What a cast does to a value, from the largest loss to none: the order of the summary.
EFFECTS = (
    ("overflow", "overflowed (became inf or NaN, or were clipped)"),
    ("to_zero", "became zero"),
    ("subnormal", "became subnormal (fewer significant bits)"),
)
FORMAT = 2  # of the embedded data; bumped when a key changes meaning
DEFAULT_TOP = 12  # tensors drawn; the table lists all
# The comparison works on float64 copies of both sides, their difference and the ratio:
# about 40 bytes per float32 element of a chunk. Its results do not depend on where the
# chunks are cut (counts and maxima), so it reads smaller chunks than the statistics,
# whose means would change in the last digits.
COMPARE_CHUNK_BYTES = 8 << 20


def bands(target: str) -> dict:
    """The target dtype's ranges on the log2 scale of magnitudes: below ``zero`` a value
    rounds to 0, from there to ``normal`` it becomes subnormal, from ``normal`` to
    ``overflow`` it stays normal, beyond ``overflow`` it overflows. ``unit_roundoff``:
    the largest relative error of rounding a normal value (half an ulp), as log2."""
    dtype = _dt.lookup(target).array_dtype
    if dtype in (np.float16, np.float32, np.float64):
        fi = np.finfo(dtype)  # ml_dtypes takes a while to import: only where needed
    else:
        import ml_dtypes  # bfloat16's and the float8 types' limits

        fi = ml_dtypes.finfo(dtype)
    top = float(fi.max)
    overflow_at = top + math.ldexp(0.5, math.frexp(top)[1] - 1 - int(fi.nmant))
    return {
        "dtype": target,
        "zero": math.log2(float(fi.smallest_subnormal)) - 1,
        "normal": math.log2(float(fi.smallest_normal)),
        "max": math.log2(top),
        "overflow": math.log2(overflow_at),
        "unit_roundoff": -(int(fi.nmant) + 1),
    }


def stats_report(
    ckpt: Checkpoint,
    target: str = "float16",
    *,
    filter: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    sample: int = SAMPLE_VALUES,
) -> dict:
    """The data of ``tfckpt stats --html``: what casting every floating-point tensor of
    ``ckpt`` to ``target`` would do.

    ``{"format", "kind": "stats", "source", "output": None, "stats", "histograms",
    "errors": {}, "bands", "tensors"}``: ``stats`` is :func:`~tfckpt.inspection.stats` exactly (what
    ``tfckpt stats --json`` prints), ``histograms`` each tensor's log2 histogram (of at
    most ``sample`` of its values: a tensor with more is sampled, and its histogram says
    ``"sample"``, how many; :mod:`~tfckpt.inspection.sampling`), ``bands`` the target's
    ranges (:func:`bands`), ``tensors`` one record per tensor (name, target, what it
    loses), the most affected first.

    >>> with tfckpt.open("train/model.ckpt-7") as ckpt:
    ...     data = stats_report(ckpt, "float16")
    """
    targets = _targets([target])
    data = stats(
        ckpt,
        filter=filter,
        chunk_bytes=chunk_bytes,
        targets=targets,
        histograms=True,
        sample=sample,
    )
    histograms = {
        t["name"]: t.pop("log2_histogram") for t in data["tensors"] if "log2_histogram" in t
    }
    rows = [_row(t, target if "cast" in t else None, None, None) for t in data["tensors"]]
    return _assemble("stats", ckpt.prefix, None, data, histograms, {}, rows, [target])


def conversion_report(
    src: Checkpoint,
    dst: Checkpoint,
    pairs: Sequence[tuple[str, str, str]] | None = None,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    counts: Mapping[str, CastCounts] | None = None,
    sample: int = SAMPLE_VALUES,
) -> dict:
    """The data of ``tfckpt convert --report``: what the cast from ``src`` to ``dst`` did.

    ``pairs`` are the cast tensors as ``(source name, output name, output dtype)``;
    by default every tensor of both with one shape whose floating-point dtype changed.
    As :func:`stats_report` (``stats`` over all of ``src``), plus ``errors``: per cast
    tensor, :func:`~tfckpt.inspection.compare_values` of the output against the source
    (the relative error is ``|out - src| / |src|``, the numbers ``tfckpt diff DST SRC``
    gives) with ``rel_histogram``, the log2 histogram of the relative errors.

    ``stats`` counts what a cast does for the conversion's targets only (``stats --json``
    adds float16 and bfloat16). A tensor of at most ``sample`` values is read whole: its
    record is ``stats``' and its errors ``diff``'s, exactly. A larger one is sampled
    (:class:`~tfckpt.inspection.sampling.Sample`: the same positions of the source and
    the output, ``sample`` values in all): its histograms, errors and, with ``counts``,
    its statistics are those of the sample and say ``"sample"`` (how many values).
    ``counts``: the conversion's own counts of what the cast did to each tensor (a
    :class:`~tfckpt.rewrite.engine.Summary`'s ``cast_counts``, by output name), exact,
    so the source is not read whole again; without them, a sampled tensor's statistics
    and counts come from a streaming pass over all its values, as ``stats``'.
    """
    if pairs is None:
        pairs = _cast_pairs(src, dst)
    # The conversion's targets only: what another cast would do is stats --html's.
    targets = _targets(sorted({t for _, _, t in pairs}), also=())
    pairs = [(a, b, t) for a, b, t in pairs if _comparable(src.info(a), dst.info(b))]
    cast = {name: (target, new_name) for name, new_name, target in pairs}
    records, histograms, errors = [], {}, {}
    for name in in_natural_order(src.keys()):
        info = src.info(name)
        target, new_name = cast.get(name, (None, None))
        picked = Sample(stored_count(info), sample)
        given = counts.get(new_name) if counts is not None and new_name else None
        dt = _dt.lookup(info.dtype)
        not_numeric = dt.numpy is None or dt.kind == "string"  # no values to count
        values: np.ndarray | None = None
        if (
            picked.whole
            or not_numeric
            or (target and given is None)
            or (not target and counts is None)
        ):
            # Every value read, as stats reads them; the histogram of the sample.
            chunks = partial(stored_chunks, src, name, chunk_bytes)
            rec = describe(info, chunks, targets, SampledHistogram(picked))
        else:  # the conversion counted the cast: only the sample is read
            values = _sample_values(picked, src, name)
            rec = describe(info, partial(list, [values]), (), Log2Histogram())
            rec["sample"] = picked.values
            if target and given is not None:
                rec["cast"] = {target: _counts(given)}
        if "log2_histogram" in rec:
            histograms[name] = rec.pop("log2_histogram")
            if not picked.whole:
                histograms[name]["sample"] = picked.values
        records.append(rec)
        if target and new_name:
            errors[name] = _errors(src, dst, name, new_name, picked, values, chunk_bytes)
    data = {"prefix": src.prefix, "tensors": records}
    rows = []
    for t in records:
        target, output = cast.get(t["name"], (None, None))
        rows.append(_row(t, target, output, errors.get(t["name"])))
    used = sorted({t for _, _, t in pairs})
    return _assemble("convert", src.prefix, dst.prefix, data, histograms, errors, rows, used)


def _errors(
    src: Checkpoint,
    dst: Checkpoint,
    name: str,
    new_name: str,
    picked: Sample,
    values: np.ndarray | None,
    chunk_bytes: int,
) -> dict:
    """``compare_values`` of the output against the source with the relative errors'
    histogram: of every value, or of the sample (``values``: the source's, when read)."""
    hist = Log2Histogram()
    if picked.whole:
        result = compare_values(
            dst,
            src,
            new_name,
            name,
            chunk_bytes=min(chunk_bytes, COMPARE_CHUNK_BYTES),
            rel_histogram=hist,
        )
        return {**result, "rel_histogram": hist.result()}
    if values is None:
        values = _sample_values(picked, src, name)
    out = _sample_values(picked, dst, new_name)
    result = compare_chunks([(out, values)], rel_histogram=hist)
    rel = {**hist.result(), "sample": picked.values}
    return {**result, "rel_histogram": rel, "sample": picked.values}


def _sample_values(picked: Sample, ckpt: Checkpoint, name: str) -> np.ndarray:
    """The sampled values of ``name``, in one array (of at most the sample's size)."""
    runs = list(picked.read(ckpt, name))
    return runs[0] if len(runs) == 1 else np.concatenate(runs)


def _counts(c: CastCounts) -> dict:
    return {"overflow": c.overflow, "to_zero": c.to_zero, "subnormal": c.subnormal}


def _targets(wanted: Sequence[str], also: tuple[str, ...] = CAST_CHECK_TARGETS) -> tuple[str, ...]:
    """The targets to count: ``also`` (float16 and bfloat16, so that ``stats`` is what
    ``stats --json`` prints), then any other the report needs."""
    for t in wanted:
        if not _dt.lookup(t).is_floating:
            raise CheckpointError(f"a report needs a floating-point target dtype, not {t!r}")
    return also + tuple(t for t in wanted if t not in also)


def _comparable(a, b) -> bool:
    """Element by element: one shape, and of a pre-sliced tensor the same stored slices."""
    if a.shape != b.shape:
        return False
    return not (a.partial or b.partial) or set(a.slices) == set(b.slices)


def _cast_pairs(src: Checkpoint, dst: Checkpoint) -> list[tuple[str, str, str]]:
    pairs = []
    for name in src.keys():
        if name not in dst:
            continue
        a, b = src.info(name), dst.info(name)
        floats = _dt.lookup(a.dtype).is_floating and _dt.lookup(b.dtype).is_floating
        if floats and a.dtype != b.dtype:
            pairs.append((name, name, b.dtype))
    return pairs


def _row(t: dict, target: str | None, output: str | None, error: dict | None) -> dict:
    """One tensor's line of the summary: what the cast to ``target`` does to it."""
    row: dict = {"name": t["name"], "target": target, "output": output}
    counts = t.get("cast", {}).get(target) if target else None
    n = t.get("stored_elements", t["elements"])
    lost = 0
    for key, _ in EFFECTS:
        row[key] = counts[key] if counts else 0
        lost += row[key]
    row["affected"] = lost / n if n else 0.0
    row["max_rel"] = error["max_rel"] if error else None
    return row


def _assemble(kind, source, output, data, histograms, errors, rows, targets) -> dict:
    # The most affected first: by the share of values a cast changes beyond rounding,
    # then by the worst relative error, then by name.
    def loss(r):
        rel = r["max_rel"] if r["max_rel"] is not None else -1.0
        return (-r["affected"], -rel, r["name"])

    rows.sort(key=loss)
    return {
        "format": FORMAT,
        "kind": kind,
        "source": source,
        "output": output,
        "stats": data,
        "histograms": histograms,
        "errors": errors,
        "bands": {t: bands(t) for t in targets},
        "tensors": rows,
    }


def summary(data: dict) -> list[dict]:
    """The report's first lines: per effect, how many values in how many tensors, and
    which tensors, with the share of each tensor (largest first).

    ``[{"effect", "label", "values", "tensors": [{"name", "values", "elements",
    "fraction"}]}]``,
    one entry per effect that happened.
    """
    sizes = {t["name"]: t.get("stored_elements", t["elements"]) for t in data["stats"]["tensors"]}
    out = []
    for key, label in EFFECTS:
        hit = [
            {
                "name": r["name"],
                "values": r[key],
                "elements": sizes[r["name"]],
                "fraction": r[key] / sizes[r["name"]],
            }
            for r in data["tensors"]
            if r[key]
        ]
        if hit:
            hit.sort(key=lambda h: (-h["fraction"], h["name"]))
            total = sum(h["values"] for h in hit)
            out.append({"effect": key, "label": label, "values": total, "tensors": hit})
    return out
