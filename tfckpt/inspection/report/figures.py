"""The report's figures, drawn with matplotlib as SVG text to inline in the page.

The only module of tfckpt that imports matplotlib: the report loads it, nothing else
does. Figures are built on :class:`matplotlib.figure.Figure` directly, not pyplot, so no
GUI backend or global figure state is involved. Glyphs are drawn as paths, so the page
needs no font; the ids inside each SVG get a prefix of their own, so that several
figures inlined in one page never share one.
"""

from __future__ import annotations

import io
import re

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

# The colours of the target's ranges: red where values are lost, orange where they keep
# fewer bits, blue where a cast only rounds; the bars take the colour of their range.
COLOURS = {
    "zero": "#c0392b",
    "subnormal": "#e67e22",
    "normal": "#2e86c1",
    "overflow": "#8e44ad",
    "error": "#16a085",
}
LABELS = {"zero": "→ 0", "subnormal": "subnormal", "normal": "normal", "overflow": "overflow"}
_STYLE = {
    "svg.fonttype": "path",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
}


_SUPERSCRIPTS = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_of_two(k: int) -> str:
    """``2ᵏ`` in plain text (superscript digits): mathtext would take most of the time of
    drawing a figure, laying out its tick labels."""
    return "2" + str(k).translate(_SUPERSCRIPTS)


def _power_of_two_tick(value, _pos) -> str:
    return power_of_two(int(value)) if value == int(value) else ""


def _count_tick(value, _pos) -> str:
    return f"{value:,.0f}" if value >= 1 else ""


def _band_of(k: float, band: dict) -> str:
    if k < band["zero"]:
        return "zero"
    if k < band["normal"]:
        return "subnormal"
    return "normal" if k < band["overflow"] else "overflow"


def _svg(fig: Figure, salt: str) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]  # the XML prolog and doctype have no place in HTML
    prefix = f"{salt}-"
    text = re.sub(r'\bid="', f'id="{prefix}', text)
    text = re.sub(r'href="#', f'href="#{prefix}', text)
    return re.sub(r"url\(#", f"url(#{prefix}", text)


def _fold(first: int, counts: list[int], lo: int, hi: int) -> tuple[list[int], list[int]]:
    """The non-empty bins, those below ``lo`` counted in ``lo``'s and those above ``hi``
    in ``hi``'s: a float64 tensor's far tails would otherwise squeeze the rest."""
    folded: dict[int, int] = {}
    for i, c in enumerate(counts):
        if c:
            k = min(max(first + i, lo), hi)
            folded[k] = folded.get(k, 0) + c
    return sorted(folded), [folded[k] for k in sorted(folded)]


def _bars(ax, xs: list[int], ys: list[int], colours: list[str]) -> None:
    ax.bar(xs, ys, width=1.0, align="edge", color=colours, edgecolor="white", lw=0.4)
    if max(ys) >= 20:  # counts over decades: a log scale, so that single values show
        ax.set_yscale("log")
        ax.set_ylim(0.6, max(ys) * 3)
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_major_formatter(FuncFormatter(_count_tick))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, max(ys) * 1.25)
    ax.set_ylabel("values")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True, steps=[1, 2, 5, 10]))
    ax.xaxis.set_major_formatter(FuncFormatter(_power_of_two_tick))


def _label_folded(ax, x: int, y: int, text: str) -> None:
    ax.annotate(
        text,
        (x + 0.5, y),
        xytext=(0, 2),
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=7,
        color="#333333",
    )


def _values_panel(ax, hist: dict, band: dict) -> None:
    first, counts = hist["first"], hist["counts"]
    last = first + len(counts) - 1
    # The axis spans the values, folding the tails beyond where the target's ranges end,
    # and the nearest edge of the ranges when the values come within reach of it.
    floor, ceiling = int(band["zero"]) - 4, int(band["overflow"]) + 4
    lo, hi = max(first, floor) - 2, min(last, ceiling) + 3
    if band["normal"] - 12 < first:
        lo = min(lo, int(band["zero"]) - 1 if first < band["normal"] else int(band["normal"]) - 3)
    if last > band["overflow"] - 12:
        hi = max(hi, int(band["overflow"]) + 3)
    edges = [float(lo), band["zero"], band["normal"], band["overflow"], float(hi)]
    for key, a, b in zip(("zero", "subnormal", "normal", "overflow"), edges, edges[1:]):
        a, b = max(a, lo), min(b, hi)
        if b <= a:
            continue
        ax.axvspan(a, b, color=COLOURS[key], alpha=0.05 if key == "normal" else 0.13, lw=0)
        if b - a >= 2.5:
            ax.text(
                (a + b) / 2,
                1.0,
                LABELS[key],
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                color=COLOURS[key],
                fontsize=8,
            )
    xs, ys = _fold(first, counts, floor, ceiling)
    _bars(ax, xs, ys, [COLOURS[_band_of(x + 0.5, band)] for x in xs])
    if first < floor:
        _label_folded(ax, floor, ys[0], f"≤ {power_of_two(floor)}")
    if last > ceiling:
        _label_folded(ax, ceiling, ys[-1], f"≥ {power_of_two(ceiling)}")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("|value| (one bar per power of two)")


def _error_panel(ax, error: dict, band: dict) -> None:
    hist = error["rel_histogram"]
    first, counts = hist["first"], hist["counts"]
    roundoff = band["unit_roundoff"]
    ax.set_xlabel("relative error |out − source| / |source|")
    if first is None:
        what = f"no rounding error: {hist['zeros']:,} exact"
        if hist["nonfinite"]:
            what += f", {hist['nonfinite']:,} overflowed or NaN"
        ax.text(0.5, 0.5, what, ha="center", transform=ax.transAxes, color="#555555")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    xs, ys = _fold(first, counts, roundoff - 40, 8)

    def colour(x: int) -> str:  # rounding, fewer bits (subnormal), all lost (zero)
        return COLOURS["error"] if x < roundoff else COLOURS["subnormal" if x < 0 else "zero"]

    _bars(ax, xs, ys, [colour(x) for x in xs])
    ax.set_xlim(min(xs[0], roundoff) - 2, max(xs[-1] + 1, roundoff) + 2)
    ax.axvline(roundoff, color="#555555", ls="--", lw=0.8)
    ax.text(
        roundoff,
        1.0,
        " half an ulp",
        transform=ax.get_xaxis_transform(),
        ha="left",
        va="bottom",
        fontsize=8,
        color="#555555",
    )


def tensor_figure(hist: dict, band: dict, error: dict | None, salt: str) -> str:
    """One tensor's figure as SVG text: its magnitudes (``hist``, a log2 histogram with
    values in it) over the target's ranges (``band``, shaded), and beside it, after a
    conversion, the histogram of its relative errors."""
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(11, 2.8) if error else (7.5, 2.8), layout="constrained")
        axes = fig.subplots(
            1, 2 if error else 1, squeeze=False, width_ratios=[3, 2] if error else None
        )[0]
        _values_panel(axes[0], hist, band)
        if error:
            _error_panel(axes[1], error, band)
        return _svg(fig, salt)


def overview_figure(rows: list[dict], effects: list[tuple[str, str]], salt: str) -> str:
    """The share of each listed tensor's values a cast changes beyond rounding, one row per
    tensor and one marker per effect, on a log scale (shares span many decades)."""
    keys = {"overflow": "overflow", "to_zero": "zero", "subnormal": "subnormal"}
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(11, 1.0 + 0.25 * len(rows)), layout="constrained")
        ax = fig.subplots()
        ys = list(range(len(rows)))[::-1]
        for key, label in effects:
            pts = [(100 * r[key] / r["elements"], y) for r, y in zip(rows, ys) if r[key]]
            if pts:
                ax.scatter(
                    [p for p, _ in pts],
                    [y for _, y in pts],
                    s=28,
                    label=label,
                    color=COLOURS[keys[key]],
                    zorder=3,
                )
        ax.set_yticks(ys, [short_name(r["name"]) for r in rows], fontsize=8)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}%"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(axis="x", color="#e5e5e5", lw=0.6)
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_xlabel("share of the tensor's values")
        ax.legend(loc="lower right", fontsize=8, frameon=True)
        return _svg(fig, salt)


def short_name(name: str, width: int = 48) -> str:
    """``name``, its start cut off to fit ``width`` characters (the end names the variable)."""
    return name if len(name) <= width else "…" + name[-(width - 1) :]
