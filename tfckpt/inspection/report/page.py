"""The report as one HTML file: a summary, the figures of the most affected tensors, a
table of every tensor, and the data itself in a JSON block.

The page holds everything it shows (SVG figures inline, a style sheet in its head, no
script to run, no font, image or link to fetch), so it opens offline and can be mailed.
The table's numbers are those of the embedded data, which is what ``tfckpt stats
--json`` (and ``tfckpt diff DST SRC --json``) print.
"""

from __future__ import annotations

import json
import math
from html import escape

from tfckpt.inspection.report import figures
from tfckpt.inspection.report.data import DEFAULT_TOP, summary
from tfckpt.version import __version__

_CSS = """
:root { color-scheme: light; --ink: #1d2733; --muted: #5d6b7a; --line: #dde3ea; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--ink); background: #f6f8fa; }
main { max-width: 1320px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 32px 0 10px; }
.meta { color: var(--muted); margin: 0 0 18px; overflow-wrap: anywhere; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 14px 18px; }
.summary ul { margin: 6px 0 0; padding-left: 20px; }
.summary li { margin: 4px 0; }
.ok { color: #1e7d4f; font-weight: 600; }
figure { margin: 0 0 14px; }
figure svg { display: block; max-width: 100%; height: auto; }
#figures.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(540px, 1fr));
                gap: 0 14px; }
figure.overview { background: #fff; border: 1px solid var(--line); border-radius: 8px;
                  padding: 8px 12px; }
figure.tensor { background: #fff; border: 1px solid var(--line); border-radius: 8px;
                padding: 10px 12px 4px; }
figcaption { color: var(--muted); font-size: 12.5px; margin-bottom: 4px; overflow-wrap: anywhere; }
figcaption b { color: var(--ink); font-size: 13.5px; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 11.5px; background: #fff; }
th, td { padding: 3px 5px; border-bottom: 1px solid var(--line); text-align: right;
         white-space: nowrap; }
th { background: #eef2f6; position: sticky; top: 0; }
td.name, th.name { text-align: left; white-space: normal; overflow-wrap: anywhere;
                   min-width: 12em; }
td.text { text-align: left; }
tr.lossy td { background: #fff7ef; }
td.sampled { font-style: italic; color: var(--muted); }
code { font-size: 12.5px; }
"""


def _num(v, digits: int = 6) -> str:
    """A number as the table shows it: integers whole, floats to ``digits`` significant
    digits, non-finite ones by name."""
    if v is None:
        return "–"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.{digits}g}"
    return f"{v}"


def _share(part: int, whole: int) -> str:
    if not part:
        return "0"
    pct = 100 * part / whole
    return f"{pct:.3g}%" if pct >= 0.001 else "<0.001%"


def _json_safe(value):
    """Strict JSON, as ``--json`` prints it: non-finite floats as "NaN", "Infinity"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _summary_html(data: dict) -> str:
    lines = summary(data)
    targets = ", ".join(sorted(data["bands"]))
    verb = "did" if data["kind"] == "convert" else "would do"
    if not lines:
        return (
            f'<p class="ok">The cast to {escape(targets)} {verb} nothing but round: no value '
            "overflows, becomes zero or becomes subnormal.</p>"
        )
    items = []
    for line in lines:
        shown = line["tensors"][:8]
        parts = ", ".join(
            f"<code>{escape(h['name'])}</code> "
            f"({h['values']:,}, {_share(h['values'], h['elements'])} of it)"
            for h in shown
        )
        more = f" and {len(line['tensors']) - len(shown)} more" if len(line["tensors"]) > 8 else ""
        n = len(line["tensors"])
        items.append(
            f"<li><b>{line['values']:,} values {escape(line['label'])}</b> in {n} "
            f"tensor{'s' if n != 1 else ''}: {parts}{more}</li>"
        )
    return f"<ul>{''.join(items)}</ul>"


def _figure_notes(stat: dict, row: dict, error: dict | None) -> str:
    """What the cast did to the tensor, in words, under its figure's heading."""
    n = stat.get("stored_elements", stat["elements"])
    notes = [
        f"{label} {row[key]:,} ({_share(row[key], n)})"
        for key, label in (("overflow", "overflow"), ("to_zero", "→ 0"), ("subnormal", "subnormal"))
        if row[key]
    ]
    if stat.get("nan") or stat.get("inf"):
        notes.append(f"NaN or inf in the source: {stat.get('nan', 0) + stat.get('inf', 0):,}")
    if error:
        hist = error["rel_histogram"]
        of = error.get("sample", n)
        where = " in the sample" if "sample" in error else ""
        notes.append(f"exact{where} {hist['zeros']:,} ({_share(hist['zeros'], of)})")
        if hist["nonfinite"]:  # which diff's largest relative error leaves out
            notes.append(f"error inf or NaN{where} {hist['nonfinite']:,}")
        notes.append(f"max. relative error{where} {_num(error['max_rel'], 3)}")
    return " · ".join(notes or ["nothing lost beyond rounding"])


def _sample_note(stat: dict, hist: dict) -> str:
    """Where a figure shows a sample: of how many values."""
    if "sample" not in hist:
        return ""
    n = stat.get("stored_elements", stat["elements"])
    return (
        f"<br><i>histograms of a sample of {hist['sample']:,} of its {n:,} values "
        "(runs spread over the tensor, the same on every run); the counts above are of "
        "every value</i>"
    )


def _figures_html(data: dict, top: int) -> str:
    stats = {t["name"]: t for t in data["stats"]["tensors"]}
    drawn = [r for r in data["tensors"] if _drawable(data, r)][:top]
    out = []
    painter = figures.Painter()  # one figure per layout, drawn once per tensor
    for i, row in enumerate(drawn):
        stat = stats[row["name"]]
        error = data["errors"].get(row["name"])
        fig = painter.tensor(data["histograms"][row["name"]], data["bands"][row["target"]], error)
        svg = figures.svg(fig, f"t{i}")
        shape = "[" + ", ".join(map(str, stat["shape"])) + "]"
        renamed = row["output"] not in (None, row["name"])
        heading = f"<b>{escape(row['name'])}</b> {stat['dtype']} {shape} → {row['target']}" + (
            f" as <code>{escape(row['output'])}</code>" if renamed else ""
        )
        out.append(
            f'<figure class="tensor" data-name="{escape(row["name"])}"><figcaption>'
            f"{heading}<br>{escape(_figure_notes(stat, row, error))}"
            f"{_sample_note(stat, data['histograms'][row['name']])}</figcaption>{svg}</figure>"
        )
    return "".join(out)


def _drawable(data: dict, row: dict) -> bool:
    """Cast to a target, with finite non-zero values to draw (not all zeros)."""
    hist = data["histograms"].get(row["name"])
    return bool(row["target"] and hist and hist["first"] is not None)


_COLUMNS = [  # (key, heading, where the value comes from)
    ("dtype", "dtype", "stat"),
    ("shape", "shape", "stat"),
    ("elements", "elements", "stat"),
    ("min", "min", "stat"),
    ("max", "max", "stat"),
    ("mean", "mean", "stat"),
    ("std", "std", "stat"),
    ("zeros", "zeros", "stat"),
    ("nan", "NaN", "stat"),
    ("inf", "inf", "stat"),
    ("target", "cast to", "row"),
    ("overflow", "overflow", "row"),
    ("to_zero", "→ 0", "row"),
    ("subnormal", "subnormal", "row"),
]
_ERROR_COLUMNS = [("differing", "changed", "error"), ("max_rel", "max rel. error", "error")]


_EXACT = {"dtype", "shape", "elements", "target", "overflow", "to_zero", "subnormal"}


def _cell(key: str, value, sample: int | None = None) -> str:
    if key == "shape":
        text = "[" + ", ".join(map(str, value)) + "]" if value is not None else "–"
    elif key == "zeros" and value is not None:
        text = f"{100 * value:.6g}%"
    elif key in ("dtype", "target"):
        text = value or "–"
    elif isinstance(value, int) and key not in ("nan", "inf"):
        text = f"{value:,}"
    else:
        text = _num(value)
    classes = (["text"] if key in ("dtype", "target") else []) + (
        ["sampled"] if sample and key not in _EXACT and text != "–" else []
    )
    cls = f' class="{" ".join(classes)}"' if classes else ""
    of = f' title="of a sample of {sample:,} values"' if "sampled" in classes else ""
    return f'<td data-key="{key}"{cls}{of}>{escape(text)}</td>'


def _breakable(name: str) -> str:
    """``name`` escaped, with line-break opportunities after its scope separators."""
    return escape(name).replace("/", "/<wbr>")


def _table_html(data: dict) -> str:
    stats = {t["name"]: t for t in data["stats"]["tensors"]}
    columns = _COLUMNS + (_ERROR_COLUMNS if data["kind"] == "convert" else [])
    head = '<th class="name">tensor</th>' + "".join(f"<th>{escape(h)}</th>" for _, h, _ in columns)
    rows = []
    for row in data["tensors"]:
        sources = {
            "stat": stats[row["name"]],
            "row": row,
            "error": data["errors"].get(row["name"], {}),
        }
        # A tensor the cast leaves alone has no counts: a dash, not a zero.
        cast = row["target"] is not None
        sample = sources["stat"].get("sample")
        cells = "".join(
            _cell(key, sources[src].get(key) if cast or src != "row" else None, sample)
            for key, _, src in columns
        )
        lossy = ' class="lossy"' if row["affected"] else ""
        rows.append(
            f'<tr{lossy} data-name="{escape(row["name"])}"><td class="name">'
            f"{_breakable(row['name'])}</td>{cells}</tr>"
        )
    return (
        f'<div class="table-wrap"><table id="tensors"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _sampled_html(data: dict) -> str:
    """What the table's italics mean, where a tensor was sampled."""
    sampled = [t for t in data["stats"]["tensors"] if "sample" in t]
    if not sampled:
        return ""
    k = len(sampled)
    return (
        f" Of {k} large tensor{'s' if k != 1 else ''}, the conversion counted the values "
        "that overflowed, became zero or subnormal, exactly; the other numbers, in italics, "
        f"are of a sample of {sampled[0]['sample']:,} values (the same positions in the "
        "source and the output)."
    )


def _overview_html(data: dict, drawn: list[dict], top: int) -> str:
    """The markers of the most affected tensors, when more than one is affected."""
    lossy = [r for r in drawn if r["affected"]][:top]
    if len(lossy) < 2:
        return ""
    sizes = {t["name"]: t.get("stored_elements", t["elements"]) for t in data["stats"]["tensors"]}
    rows = [{**r, "elements": sizes[r["name"]]} for r in lossy]
    effects = [("overflow", "overflow"), ("to_zero", "→ 0"), ("subnormal", "subnormal")]
    return (
        '<h2>Most affected tensors</h2><figure class="overview">'
        + figures.overview_figure(rows, effects, "overview")
        + "</figure>"
    )


def render_html(data: dict, *, top: int = DEFAULT_TOP) -> str:
    """The page of a report's ``data`` (``stats_report`` or ``conversion_report``), with
    figures for the ``top`` most affected tensors and a table of all."""
    converted = data["kind"] == "convert"
    targets = ", ".join(sorted(data["bands"]))
    n = len(data["stats"]["tensors"])
    what = "What the cast to" if converted else "What a cast to"
    title = f"{what} {targets} {'did to' if converted else 'would do to'} {data['source']}"
    meta = f"source <code>{escape(data['source'])}</code>"
    if converted:
        meta += f" · output <code>{escape(data['output'])}</code>"
    meta += f" · {n} tensors · tfckpt {__version__}"
    drawn = [r for r in data["tensors"] if _drawable(data, r)]
    overview = _overview_html(data, drawn, top)
    shown = min(top, len(drawn))
    if 0 < shown < len(drawn):
        heading = f"The {shown} most affected tensors"
    elif shown:
        heading = "Every tensor cast" if converted else "Every floating-point tensor"
    else:
        heading = "Figures"
    explain = (
        "Each figure: how many values of the tensor lie at each magnitude (log scale, one bar "
        "per power of two), over the ranges of the target dtype"
        + ("; beside it, the relative error each value got in the cast." if converted else ".")
    )
    figs = _figures_html(data, top)
    if not figs:
        figs = "<p>No figure was asked for.</p>" if drawn else "<p>No values to draw.</p>"
    grid = "" if converted else ' class="grid"'  # one panel per figure: two figures a row
    payload = json.dumps(_json_safe(data), allow_nan=False).replace("<", "\\u003c")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{escape(title)}</title>'
        f"<style>{_CSS}</style></head><body><main>"
        f'<h1>{escape(title)}</h1><p class="meta">{meta}</p>'
        f'<section class="card summary" id="summary">{_summary_html(data)}</section>'
        f"{overview}"
        f"<h2>{escape(heading)}</h2><p>{escape(explain)}</p>"
        f'<section id="figures"{grid}>{figs}</section>'
        f"<h2>All {n} tensors</h2>"
        "<p>Sorted by the share of values the cast changes beyond rounding. The statistics are "
        "those of <code>tfckpt stats --json</code>"
        + (
            "; the errors those of <code>tfckpt diff OUTPUT SOURCE --json</code>."
            if converted
            else "."
        )
        + _sampled_html(data)
        + f"</p>{_table_html(data)}"
        f'<script type="application/json" id="tfckpt-data">{payload}</script>'
        "</main></body></html>\n"
    )
