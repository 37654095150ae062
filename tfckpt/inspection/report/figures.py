"""The report's figures, drawn with matplotlib as SVG text to inline in the page.

The only module of tfckpt that imports matplotlib: the report loads it, nothing else
does. Figures are built on :class:`matplotlib.figure.Figure` directly, not pyplot, so no
GUI backend or global figure state is involved. Glyphs are drawn as paths, so the page
needs no font; the ids inside each SVG get a prefix of their own, so that several
figures inlined in one page never share one.
"""

from __future__ import annotations

import io
import math
import re

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import AutoLocator, FuncFormatter, LogLocator, MaxNLocator, NullLocator

# The colours of the target's ranges: red where values are lost, orange where they keep
# fewer bits, blue where a cast only rounds; the bars take the colour of their range.
COLOURS = {
    "zero": "#c0392b",
    "subnormal": "#e67e22",
    "normal": "#2e86c1",
    "overflow": "#8e44ad",
    "error": "#16a085",
    "ulp": "#555555",
}
# What each colour means, in the figures' legends: a range of the target (values, and
# the errors of values that went there) or, of the errors, the rounding of a normal value.
LABELS = {
    "zero": "→ 0",
    "subnormal": "subnormal",
    "normal": "normal",
    "overflow": "overflow",
    "error": "error under half an ulp",
    "ulp": "half an ulp",
}
_STYLE = {
    # Text as SVG text, not glyph outlines: a third less time drawing, half the page's
    # size, and the figures' words can be searched and selected in the browser.
    "svg.fonttype": "none",
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


def svg(fig: Figure, salt: str) -> str:
    """``fig`` as SVG text to inline in a page, drawn once; its ids prefixed with ``salt``."""
    buf = io.StringIO()
    with matplotlib.rc_context({**_STYLE, "svg.hashsalt": salt}):
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
    # No edges: a gap between the bars parts them, in no colour of their own.
    ax.bar(xs, ys, width=0.9, align="edge", color=colours, lw=0)
    if max(ys) >= 20:  # counts over decades: a log scale, so that single values show
        ax.set_yscale("log")
        ax.set_ylim(0.6, max(ys) * 3)
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_major_formatter(FuncFormatter(_count_tick))
        # No minor ticks: drawing them took most of a figure's time, and showed nothing.
        ax.yaxis.set_minor_locator(NullLocator())
    else:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, max(ys) * 1.25)
    ax.set_ylabel("values")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True, steps=[1, 2, 5, 10]))
    ax.xaxis.set_major_formatter(FuncFormatter(_power_of_two_tick))


def _label_folded(ax, x: int, y: int, text: str) -> None:
    ax.annotate(
        text,
        (x + 0.45, y),
        xytext=(0, 2),
        textcoords="offset points",
        ha="center",
        va="bottom",
        fontsize=7,
        color="#333333",
    )


def _values_panel(ax, hist: dict, band: dict) -> set[str]:
    """Draw the magnitudes over the target's ranges; the keys of :data:`COLOURS` used."""
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
    used = set()
    edges = [float(lo), band["zero"], band["normal"], band["overflow"], float(hi)]
    for key, a, b in zip(("zero", "subnormal", "normal", "overflow"), edges, edges[1:]):
        a, b = max(a, lo), min(b, hi)
        if b <= a:
            continue
        ax.axvspan(a, b, color=COLOURS[key], alpha=0.05 if key == "normal" else 0.13, lw=0)
        used.add(key)
    xs, ys = _fold(first, counts, floor, ceiling)
    colours = [_band_of(x + 0.5, band) for x in xs]
    _bars(ax, xs, ys, [COLOURS[c] for c in colours])
    used.update(colours)
    if first < floor:
        _label_folded(ax, floor, ys[0], f"≤ {power_of_two(floor)}")
    if last > ceiling:
        _label_folded(ax, ceiling, ys[-1], f"≥ {power_of_two(ceiling)}")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("|value| (one bar per power of two)")
    return used


def _error_panel(ax, error: dict, band: dict) -> set[str]:
    """Draw the relative errors; the keys of :data:`COLOURS` used (``ulp``: the line)."""
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
        return set()
    xs, ys = _fold(first, counts, roundoff - 40, 8)

    def colour(x: int) -> str:  # rounding, fewer bits (subnormal), all lost (zero)
        return "error" if x < roundoff else ("subnormal" if x < 0 else "zero")

    keys = [colour(x) for x in xs]
    _bars(ax, xs, ys, [COLOURS[k] for k in keys])
    ax.set_xlim(min(xs[0], roundoff) - 2, max(xs[-1] + 1, roundoff) + 2)
    ax.axvline(roundoff, color=COLOURS["ulp"], ls="--", lw=0.8)
    return {*keys, "ulp"}


def _legend_handles(used: set[str]) -> list:
    """One entry per colour drawn, in :data:`COLOURS`' order."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    return [
        Line2D([], [], color=COLOURS[k], ls="--", lw=0.8, label=LABELS[k])
        if k == "ulp"
        else Patch(facecolor=COLOURS[k], lw=0, label=LABELS[k])
        for k in COLOURS
        if k in used
    ]


# A tensor's figure, in inches: fixed margins instead of a layout engine, which drew
# every figure twice (once to measure it) and took most of a report's time. The legend
# has the strip above the axes to itself; the left margin grows with the longest
# count on the y axis (at most the sample's size, so a few digits).
_HEIGHT, _TOP, _BOTTOM, _RIGHT, _GAP = 2.9, 0.42, 0.52, 0.15, 0.35


def _left_margin(hist: dict) -> float:
    top = max(hist["counts"], default=1)
    digits = len(f"{10 ** math.ceil(math.log10(top * 3)):,}")  # the top tick's label
    return 0.4 + 0.075 * digits


class Painter:
    """Draws a page's tensor figures on one matplotlib figure per layout (with or without
    the errors' panel), made once and reused: each tensor's artists replace the last
    one's, and the axes keep their ticks (making them took most of a figure's time).
    ``made`` counts the figures made, ``drawn`` the tensors drawn."""

    def __init__(self) -> None:
        self._figures: dict[bool, tuple[Figure, list]] = {}
        self.made = self.drawn = 0

    def tensor(self, hist: dict, band: dict, error: dict | None) -> Figure:
        """One tensor's figure: its magnitudes (``hist``, a log2 histogram with values in
        it) over the target's ranges (``band``, shaded), and beside it, after a
        conversion, the histogram of its relative errors (``error``); a legend above,
        outside the axes, with every colour drawn. Valid until the next call."""
        with matplotlib.rc_context(_STYLE):
            fig, axes = self._figure(bool(error))
            width = fig.get_figwidth()
            panels = [hist] + ([error["rel_histogram"]] if error else [])
            lefts = [_left_margin(h) for h in panels]
            # The panels share the width 3 : 2, after the margins and the gap.
            room = width - sum(lefts) - _RIGHT - (_GAP if error else 0)
            x = 0.0
            for ax, left, w in zip(axes, lefts, [room * 0.6, room * 0.4] if error else [room]):
                x += left
                ax.set_position(
                    (x / width, _BOTTOM / _HEIGHT, w / width, 1 - (_BOTTOM + _TOP) / _HEIGHT)
                )
                x += w + _GAP
            used = _values_panel(axes[0], hist, band)
            if error:
                used |= _error_panel(axes[1], error, band)
            fig.legend(
                handles=_legend_handles(used),
                loc="lower left",
                bbox_to_anchor=(lefts[0] / width, 1 - (_TOP - 0.08) / _HEIGHT),
                ncols=len(used),
                frameon=False,
                borderaxespad=0,
                borderpad=0,
                handlelength=1.4,
                columnspacing=1.4,
                fontsize=8,
            )
        self.drawn += 1
        return fig

    def _figure(self, errors: bool) -> tuple[Figure, list]:
        """The figure of this layout, emptied of the last tensor's artists."""
        if errors not in self._figures:
            fig = Figure(figsize=(11.0 if errors else 7.5, _HEIGHT))
            axes = [fig.add_axes((0, 0, 1, 1)) for _ in range(2 if errors else 1)]
            self._figures[errors] = fig, axes
            self.made += 1
        fig, axes = self._figures[errors]
        for legend in list(fig.legends):
            legend.remove()
        for ax in axes:
            for artist in [*ax.patches, *ax.texts, *ax.lines, *ax.collections]:
                artist.remove()
            ax.set_yscale("linear")
            ax.set_xlabel("")
            ax.set_ylabel("")
            ax.xaxis.set_major_locator(AutoLocator())
            ax.yaxis.set_major_locator(AutoLocator())
        return fig, axes


def draw_tensor(hist: dict, band: dict, error: dict | None) -> Figure:
    """One tensor's figure (:meth:`Painter.tensor`) on a figure of its own."""
    return Painter().tensor(hist, band, error)


def tensor_figure(hist: dict, band: dict, error: dict | None, salt: str) -> str:
    """:func:`draw_tensor`'s figure as SVG text."""
    return svg(draw_tensor(hist, band, error), salt)


def draw_overview(rows: list[dict], effects: list[tuple[str, str]]) -> Figure:
    """The share of each listed tensor's values a cast changes beyond rounding, one row per
    tensor and one marker per effect, on a log scale (shares span many decades); the
    legend above the axes."""
    from matplotlib.textpath import TextPath

    keys = {"overflow": "overflow", "to_zero": "zero", "subnormal": "subnormal"}
    names = [short_name(r["name"]) for r in rows]
    with matplotlib.rc_context(_STYLE):
        # The names' width on the y axis, measured as the glyphs are drawn (8 points).
        label = max(TextPath((0, 0), n, size=8).get_extents().width for n in names) / 72
        width, height = 11.0, 1.15 + 0.25 * len(rows)
        left, top, bottom = label + 0.3, 0.4, 0.5
        fig = Figure(figsize=(width, height))
        ax = fig.add_axes(
            (
                left / width,
                bottom / height,
                1 - (left + _RIGHT) / width,
                1 - (top + bottom) / height,
            )
        )
        ys = list(range(len(rows)))[::-1]
        drawn = 0
        for key, label_ in effects:
            pts = [(100 * r[key] / r["elements"], y) for r, y in zip(rows, ys) if r[key]]
            if pts:
                ax.scatter(
                    [p for p, _ in pts],
                    [y for _, y in pts],
                    s=28,
                    label=label_,
                    color=COLOURS[keys[key]],
                    zorder=3,
                )
                drawn += 1
        ax.set_yticks(ys, names, fontsize=8)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}%"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.grid(axis="x", color="#e5e5e5", lw=0.6)
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_xlabel("share of the tensor's values")
        fig.legend(
            handles=ax.get_legend_handles_labels()[0],
            loc="lower left",
            bbox_to_anchor=(left / width, 1 - (top - 0.08) / height),
            ncols=max(drawn, 1),
            frameon=False,
            borderaxespad=0,
            borderpad=0,
            fontsize=8,
        )
        return fig


def overview_figure(rows: list[dict], effects: list[tuple[str, str]], salt: str) -> str:
    """:func:`draw_overview`'s figure as SVG text."""
    return svg(draw_overview(rows, effects), salt)


def short_name(name: str, width: int = 48) -> str:
    """``name``, its start cut off to fit ``width`` characters (the end names the variable)."""
    return name if len(name) <= width else "…" + name[-(width - 1) :]
