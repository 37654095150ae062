"""``tfckpt diff``: two checkpoints compared tensor by tensor, chunk by chunk."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from tfckpt.checkpoint.reader import DEFAULT_CHUNK_BYTES, Checkpoint
from tfckpt.errors import UnsupportedCheckpointError
from tfckpt.format import dtypes as _dt
from tfckpt.format.natural import natural_key
from tfckpt.format.objectgraph import OBJECT_GRAPH_KEY
from tfckpt.inspection.histograms import Log2Histogram
from tfckpt.inspection.reading import match_names, stored_chunks

# --- diff --------------------------------------------------------------------


def _paired_chunks(a: Iterator[np.ndarray], b: Iterator[np.ndarray]):
    """Re-cut two streams of 1-D chunks of equal total length into aligned pairs."""
    buf_a: np.ndarray | None = None
    buf_b: np.ndarray | None = None
    for chunk_a in a:
        buf_a = chunk_a if buf_a is None or not len(buf_a) else np.concatenate([buf_a, chunk_a])
        while buf_b is None or len(buf_b) < len(buf_a):
            nxt = next(b, None)
            if nxt is None:
                break
            buf_b = nxt if buf_b is None or not len(buf_b) else np.concatenate([buf_b, nxt])
        n = min(len(buf_a), len(buf_b) if buf_b is not None else 0)
        if n and buf_b is not None:
            yield buf_a[:n], buf_b[:n]
            buf_a, buf_b = buf_a[n:], buf_b[n:]


def _wide(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    if x.dtype.kind in "biu" and x.dtype.itemsize == 8:
        return x  # int64/uint64 compared exactly, not through float64
    return x.astype(np.float64)


def compare_values(
    a: Checkpoint,
    b: Checkpoint,
    name_a: str,
    name_b: str | None = None,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    rel_histogram: Log2Histogram | None = None,
) -> dict:
    """Element-wise comparison of two tensors of one shape, streamed, in the wider dtype.

    Returns ``{"elements", "differing", "max_abs", "max_rel"}``; NaNs in the same
    place count as equal; the relative difference is ``|a - b| / |b|``. Strings are
    compared element by element. Pre-sliced tensors are compared over their stored
    slices (the same in both). ``rel_histogram`` is given every element's relative
    difference in the same pass: 0 where equal, inf where ``b`` is 0 and ``a`` is not
    or where one side is inf (an overflow), NaN where one side is.
    """
    name_b = name_b or name_a
    ia, ib = a.info(name_a), b.info(name_b)
    if (ia.partial or ib.partial) and set(ia.slices) != set(ib.slices):
        raise UnsupportedCheckpointError(
            f"{name_a!r} stores {ia.stored_elements} of {ia.size} elements in {a.prefix}, "
            f"{ib.stored_elements} in {b.prefix}, in other slices: the values cannot be "
            "compared",
            path=a.prefix,
            tensor=name_a,
        )
    pairs = _paired_chunks(
        stored_chunks(a, name_a, chunk_bytes), stored_chunks(b, name_b, chunk_bytes)
    )
    strings = "string" in (ia.dtype, ib.dtype)
    return compare_chunks(pairs, strings=strings, atol=atol, rtol=rtol, rel_histogram=rel_histogram)


def compare_chunks(
    pairs: Iterable[tuple[np.ndarray, np.ndarray]],
    *,
    strings: bool = False,
    atol: float = 0.0,
    rtol: float = 0.0,
    rel_histogram: Log2Histogram | None = None,
) -> dict:
    """:func:`compare_values` of values given as aligned pairs of 1-D runs ``(a, b)``
    (of two tensors, or of the same positions of them: a sample); ``strings`` when
    either side holds strings."""
    elements = differing = 0
    max_abs = max_rel = 0.0
    for ca, cb in pairs:
        elements += len(ca)
        if strings:
            differing += sum(1 for x, y in zip(ca.tolist(), cb.tolist()) if x != y)
            continue
        if ca.dtype.fields or cb.dtype.fields:  # quantized: compare the stored integers
            ca = ca.view(ca.dtype[0]) if ca.dtype.fields else ca
            cb = cb.view(cb.dtype[0]) if cb.dtype.fields else cb
        wa, wb = _wide(ca), _wide(cb)
        if wa.dtype.kind in "iu" and wb.dtype.kind in "iu" and wa.dtype != wb.dtype:
            wa, wb = wa.astype(np.float64), wb.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if wa.dtype.kind in "iu" and wa.dtype == wb.dtype:
                diff = np.abs(wa.astype(np.float64) - wb.astype(np.float64))
                bad = wa != wb
            else:
                diff = np.abs(wa - wb)
                both_nan = np.isnan(wa) & np.isnan(wb)
                same_inf = wa == wb
                diff = np.where(both_nan | same_inf, 0.0, diff)
                bad = ~(both_nan | same_inf)
                bad &= ~(diff <= atol + rtol * np.abs(wb))
            if diff.size:
                finite = diff[np.isfinite(diff)] if not np.isfinite(diff).all() else diff
                if diff.size != finite.size:
                    max_abs = float("inf")
                elif finite.size:
                    max_abs = max(max_abs, float(finite.max()))
                denom = np.abs(wb).astype(np.float64)
                rel = np.divide(
                    diff.astype(np.float64), denom, out=np.zeros(diff.shape), where=denom > 0
                )
                if rel.size:
                    max_rel = max(max_rel, float(np.nanmax(rel)))
                if rel_histogram is not None:
                    rel_histogram.add(np.where((denom == 0) & (diff != 0), np.inf, rel))
        differing += int(np.count_nonzero(bad))
    return {
        "elements": elements,
        "differing": differing,
        "max_abs": None if strings else max_abs,
        "max_rel": None if strings else max_rel,
    }


def diff(
    a: Checkpoint,
    b: Checkpoint,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    values: bool = True,
    filter: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> dict:
    """What differs between two checkpoints: names, dtypes and shapes, then values.

    ``{"a", "b", "only_in_a", "only_in_b", "changed": [{"name", "dtype_a",
    "dtype_b", "shape_a", "shape_b"}], "values": [{"name", "elements",
    "differing", "max_abs", "max_rel"}], "same": bool}``. ``values`` lists every
    common tensor of equal shape whose elements differ beyond ``atol + rtol*|b|``;
    tensors that only changed dtype (a float16 conversion) are compared too. A
    tensor stored in other slices in A than in B, one of them pre-sliced, is
    ``changed`` with ``stored_a``/``stored_b`` (stored elements) and not compared.
    """
    names_a = set(match_names(a.keys(), filter)) - {OBJECT_GRAPH_KEY}
    names_b = set(match_names(b.keys(), filter)) - {OBJECT_GRAPH_KEY}
    changed: list[dict[str, object]] = []
    value_diffs: list[dict[str, object]] = []
    for name in sorted(names_a & names_b, key=natural_key):
        ia, ib = a.info(name), b.info(name)
        stored_differently = (ia.partial or ib.partial) and set(ia.slices) != set(ib.slices)
        if ia.dtype != ib.dtype or ia.shape != ib.shape or stored_differently:
            changed.append(
                {
                    "name": name,
                    "dtype_a": ia.dtype,
                    "dtype_b": ib.dtype,
                    "shape_a": list(ia.shape),
                    "shape_b": list(ib.shape),
                }
            )
            if stored_differently:
                changed[-1].update(stored_a=ia.stored_elements, stored_b=ib.stored_elements)
                continue
        if values and ia.shape == ib.shape and ia.dtype == ib.dtype == "variant":
            result = _compare_variants(a, b, name, ia)
            if result["differing"]:
                value_diffs.append({"name": name, **result})
            continue
        if not values or ia.shape != ib.shape or not _comparable(ia.dtype, ib.dtype):
            continue
        result = compare_values(a, b, name, atol=atol, rtol=rtol, chunk_bytes=chunk_bytes)
        if result["differing"]:
            value_diffs.append({"name": name, **result})
    only_a = sorted(names_a - names_b, key=natural_key)
    only_b = sorted(names_b - names_a, key=natural_key)
    return {
        "a": a.prefix,
        "b": b.prefix,
        "only_in_a": only_a,
        "only_in_b": only_b,
        "changed": changed,
        "values": value_diffs,
        "same": not (only_a or only_b or changed or value_diffs),
    }


def _compare_variants(a: Checkpoint, b: Checkpoint, name: str, info) -> dict:
    """Variant elements compared by their serialized bytes (their only form here)."""
    elements = differing = 0
    for extents in info.slices or [None]:
        ea, eb = a.variant_elements(name, extents), b.variant_elements(name, extents)
        elements += len(ea)
        differing += sum(x != y for x, y in zip(ea, eb)) + abs(len(ea) - len(eb))
    return {"elements": elements, "differing": differing, "max_abs": None, "max_rel": None}


def _comparable(dtype_a: str, dtype_b: str) -> bool:
    kinds = [_dt.lookup(d) for d in (dtype_a, dtype_b)]
    if any(k.kind == "opaque" for k in kinds):
        return False
    return (kinds[0].kind == "string") == (kinds[1].kind == "string")
