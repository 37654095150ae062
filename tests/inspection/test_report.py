"""The HTML reports, ``tfckpt stats --html`` and ``tfckpt convert --report``, of a checkpoint
TensorFlow writes during the test with values in every range of float16
(tests/report_checkpoints.py).

The page's data is what ``stats --json`` and ``diff DST SRC --json`` print; its histograms
say what the cast's own counts say; headless Chromium (Debian's, driven by selenium
through the system chromedriver) loads it with no console message and no request, shows
every figure, and its visible table and summary hold the numbers of ``stats --json``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
from pathlib import Path

import browser_helpers
import pytest
import report_checkpoints as rc
from cli_helpers import assert_cli_error, run_role, run_text, user_env

import tfckpt

pytest.importorskip("matplotlib")
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow writes the checkpoint", allow_module_level=True)

TARGET = "float16"
EFFECTS = ("overflow", "to_zero", "subnormal")
EDGES = {"zero": -25, "normal": -14, "overflow": 16}  # float16's, on the log2 bins


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("report")
    run_role("report_checkpoints.py", "write", d)
    return str(d / "ckpt" / "model-1")


def _json(*args) -> dict:
    done = run_text(*args)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def _embedded(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="tfckpt-data">(.*?)</script>', html, re.S)
    assert m, "no data block"
    return json.loads(m[1])


@pytest.fixture(scope="module")
def pages(ckpt, tmp_path_factory) -> dict:
    """The two pages, written by the command line in processes of their own, and what
    ``stats --json`` and ``diff OUT SRC --json`` print."""
    d = tmp_path_factory.mktemp("pages")
    stats_page, convert_page, out = d / "stats.html", d / "convert.html", d / "fp16" / "model"
    done = run_text("stats", ckpt, "--html", stats_page)
    assert done.returncode == 0 and f"wrote {stats_page}" in done.stderr, done.stderr
    done = run_text(
        "convert", ckpt, out, "--dtype", TARGET, "--overflow", "inf", "--report", convert_page
    )
    assert done.returncode == 0 and f"wrote {convert_page}" in done.stderr, done.stderr
    return {
        "stats": stats_page,
        "convert": convert_page,
        "out": str(out),
        "stats_json": _json("stats", ckpt, "--json"),
        "diff_json": _json("diff", out, ckpt, "--json"),
    }


def _floats(stats_json: dict) -> list[dict]:
    return [t for t in stats_json["tensors"] if TARGET in t.get("cast", {})]


# ---------------------------------------------------------------- the data


def _only_target(stats_json: dict) -> dict:
    """``stats --json`` with what a cast does counted for the conversion's target only,
    as a conversion's page holds it (float16 and bfloat16 both: ``stats --html``'s)."""
    tensors = [
        {**t, "cast": {TARGET: t["cast"][TARGET]}} if "cast" in t else t
        for t in stats_json["tensors"]
    ]
    return {**stats_json, "tensors": tensors}


def test_page_data_is_stats_json(pages):
    for kind in ("stats", "convert"):
        data = _embedded(pages[kind].read_text())
        assert data["kind"] == kind
        want = pages["stats_json"] if kind == "stats" else _only_target(pages["stats_json"])
        assert data["stats"] == want, kind
    kernel = next(t for t in pages["stats_json"]["tensors"] if t["name"].startswith("kernel/"))
    assert kernel["cast"][TARGET] == {
        "overflow": len(rc.OVERFLOW),
        "to_zero": len(rc.TO_ZERO),
        "subnormal": len(rc.SUBNORMAL),
    }


def test_histograms_say_what_the_cast_counts(pages):
    """The log2 bins below 2**-25 hold the values that became zero, those up to 2**-14
    the subnormals, those from 2**16 the overflows: the bins are exact and the values
    stay clear of the edges where rounding crosses a bin."""
    data = _embedded(pages["stats"].read_text())
    band = data["bands"][TARGET]
    assert (band["zero"], band["normal"], band["unit_roundoff"]) == (-25, -14, -11)
    assert 15.999 < band["max"] < band["overflow"] < 16
    for t in _floats(pages["stats_json"]):
        h = data["histograms"][t["name"]]
        bins = {h["first"] + i: c for i, c in enumerate(h["counts"])} if h["counts"] else {}
        assert sum(bins.values()) + h["zeros"] + h["nonfinite"] == t["elements"], t["name"]
        got = {
            "to_zero": sum(c for k, c in bins.items() if k < EDGES["zero"]),
            "subnormal": sum(c for k, c in bins.items() if EDGES["zero"] <= k < EDGES["normal"]),
            "overflow": sum(c for k, c in bins.items() if k >= EDGES["overflow"]),
        }
        assert got == t["cast"][TARGET], t["name"]
        assert h["zeros"] == round(t["zeros"] * t["elements"]), t["name"]


def test_conversion_errors_are_diff_json(pages):
    data = _embedded(pages["convert"].read_text())
    differing = {v["name"]: v for v in pages["diff_json"]["values"]}
    assert set(data["errors"]) == {t["name"] for t in _floats(pages["stats_json"])}
    for t in _floats(pages["stats_json"]):
        name, cast = t["name"], t["cast"][TARGET]
        error = dict(data["errors"][name])
        rel = error.pop("rel_histogram")
        if name in differing:
            assert {"name": name, **error} == differing[name]
        else:
            assert error["differing"] == 0, name
        # Overflows have an infinite error, values that became zero an error of exactly
        # 1 (bin 0); every other value differs by less than itself, a normal one by less
        # than half an ulp (2**-11).
        assert rel["nonfinite"] == cast["overflow"], name
        bins = {rel["first"] + i: c for i, c in enumerate(rel["counts"])} if rel["counts"] else {}
        assert bins.get(0, 0) == cast["to_zero"] and max(bins, default=-1) <= 0, name
        assert rel["zeros"] == t["elements"] - error["differing"], name
        beyond_rounding = sum(c for k, c in bins.items() if k >= -11)
        assert beyond_rounding <= cast["subnormal"] + cast["to_zero"], name


def test_streamed_in_small_chunks_gives_the_same_data(ckpt, pages):
    from tfckpt.inspection import report

    with tfckpt.open(ckpt) as src, tfckpt.open(pages["out"]) as out:
        small = report.conversion_report(src, out, chunk_bytes=256)
        whole = report.conversion_report(src, out)
        small_stats = report.stats_report(src, chunk_bytes=256)
    assert _stats_equal(small.pop("stats"), whole.pop("stats"))
    assert small == whole  # histograms, errors, ranges, rows: counts, exact
    assert _stats_equal(small_stats.pop("stats"), pages["stats_json"])
    assert small_stats["histograms"] == small["histograms"]


# ---------------------------------------------------------------- samples


def _total(hist: dict) -> int:
    return sum(hist["counts"]) + hist["zeros"] + hist["nonfinite"]


def test_histograms_of_a_sample_and_exact_counts(ckpt, pages, tmp_path):
    """With a bound under the tensors' sizes, each histogram counts exactly the sample
    (and says so), the same however the chunks are cut; the statistics are still those
    of ``stats --json``. After a conversion given its own counts, a sampled tensor's
    counts are the conversion's, exact; its errors and statistics the sample's."""
    from tfckpt.inspection import report

    bound = 256
    with tfckpt.open(ckpt) as src, tfckpt.open(pages["out"]) as out:
        data = report.stats_report(src, sample=bound)
        again = report.stats_report(src, sample=bound, chunk_bytes=100)
        summary = tfckpt.convert(ckpt, str(tmp_path / "o"), "float16", overflow="inf")
        converted = report.conversion_report(src, out, counts=summary.cast_counts, sample=bound)
        full = report.conversion_report(src, out, sample=bound)  # without: a full pass
    assert _strict(data["stats"]) == pages["stats_json"]
    assert again["histograms"] == data["histograms"]
    by_name = {t["name"]: t for t in pages["stats_json"]["tensors"]}
    sampled = {n for n, h in data["histograms"].items() if by_name[n]["elements"] > bound}
    assert sampled == {n for n in by_name if n.startswith(("kernel/", "embedding/"))}
    for name, hist in data["histograms"].items():
        n = by_name[name]["elements"]
        assert _total(hist) == hist.get("sample", n) == min(n, bound), name
    assert _strict(full["stats"]) == _only_target(pages["stats_json"])
    for kind in (converted, full):
        assert kind["histograms"] == data["histograms"]
        for name, error in kind["errors"].items():
            n = by_name[name]["elements"]
            assert error["elements"] == _total(error["rel_histogram"]) == min(n, bound), name
            assert error.get("sample") == error["rel_histogram"].get("sample")
    exact = {t["name"]: t for t in _only_target(pages["stats_json"])["tensors"]}
    for t in converted["stats"]["tensors"]:
        want = by_name[t["name"]]
        if t["name"] not in sampled:
            assert _strict(t) == exact[t["name"]]
            continue
        assert t["sample"] == bound and t["cast"] == {TARGET: want["cast"][TARGET]}
        assert want["min"] <= t["min"] <= t["max"] <= want["max"]
    rows = {r["name"]: r for r in converted["tensors"]}
    for name in sampled:
        assert {k: rows[name][k] for k in EFFECTS} == by_name[name]["cast"][TARGET]


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> dict:
    """A checkpoint TensorFlow writes with a tensor of more values than a report
    histograms (300 x 300, the planted values spread over it), its pages and JSON."""
    d = tmp_path_factory.mktemp("large")
    run_role("report_checkpoints.py", "write_large", d)
    src = str(d / "ckpt" / "model-1")
    stats_page, convert_page, out = d / "stats.html", d / "convert.html", d / "fp16" / "model"
    done = run_text("stats", src, "--html", stats_page)
    assert done.returncode == 0, done.stderr
    done = run_text(
        "convert", src, out, "--dtype", TARGET, "--overflow", "inf", "--report", convert_page
    )
    assert done.returncode == 0, done.stderr
    return {
        "stats": stats_page.read_text(),
        "convert": convert_page.read_text(),
        "stats_json": _json("stats", src, "--json"),
    }


def test_a_large_tensor_is_sampled_on_the_page(large):
    from tfckpt.inspection.sampling import SAMPLE_VALUES

    values = 300 * 300
    kernel = next(t for t in large["stats_json"]["tensors"] if t["name"].startswith("kernel/"))
    assert kernel["elements"] == values > SAMPLE_VALUES
    assert kernel["cast"][TARGET] == {
        "overflow": len(rc.OVERFLOW),
        "to_zero": len(rc.TO_ZERO),
        "subnormal": len(rc.SUBNORMAL),
    }
    for kind in ("stats", "convert"):
        html = large[kind]
        data = _embedded(html)
        hist = data["histograms"][kernel["name"]]
        assert hist["sample"] == _total(hist) == SAMPLE_VALUES, kind
        row = next(r for r in data["tensors"] if r["name"] == kernel["name"])
        assert {k: row[k] for k in EFFECTS} == kernel["cast"][TARGET], kind  # exact
        assert f"a sample of {SAMPLE_VALUES:,} of its {values:,} values" in html, kind
        line = re.search(rf'<tr[^>]* data-name="{re.escape(kernel["name"])}">.*?</tr>', html)
        assert line, kind
        italic = re.findall(r'<td data-key="(\w+)" class="sampled"', line[0])
        if kind == "stats":  # every value counted: only the histogram is of a sample
            assert data["stats"] == large["stats_json"] and not italic
        else:  # the conversion counted the cast; the rest is of the sample
            assert italic == ["min", "max", "mean", "std", "zeros", "nan", "inf"] + [
                "differing",
                "max_rel",
            ]
            error = data["errors"][kernel["name"]]
            assert error["elements"] == error["sample"] == SAMPLE_VALUES
    bias = _embedded(large["convert"])["histograms"]
    assert "sample" not in bias[next(n for n in bias if n.startswith("bias/"))]


# ---------------------------------------------------------------- figures


def _colours(artist) -> set:
    """The colours ``artist`` paints: its faces where filled, its edges where they have a
    width, leaving out what is transparent; as RGB (a range's shading is its colour made
    lighter with alpha)."""
    from matplotlib.collections import Collection
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D

    out = set()
    if isinstance(artist, Line2D):
        if artist.get_linewidth() > 0 and artist.get_linestyle() not in ("None", ""):
            out.add(to_rgba(artist.get_color(), artist.get_alpha()))
    elif isinstance(artist, Collection):
        out.update(map(tuple, artist.get_facecolors()))
        widths = artist.get_linewidths()
        if len(widths) and max(widths) > 0:
            out.update(map(tuple, artist.get_edgecolors()))
    else:  # a patch
        if artist.get_fill():
            out.add(tuple(artist.get_facecolor()))
        if artist.get_linewidth() > 0:
            out.add(tuple(artist.get_edgecolor()))
    return {tuple(round(c, 4) for c in rgba[:3]) for rgba in out if rgba[3] > 0}


def _extents(artist, renderer) -> list:
    """Where ``artist`` paints, in display coordinates: a marker collection's markers
    one by one (their centres and sizes), anything else its window extent."""
    import numpy as np
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import Bbox

    if not isinstance(artist, PathCollection):
        return [artist.get_window_extent(renderer)]
    centres = artist.get_offset_transform().transform(artist.get_offsets())
    radii = np.sqrt(artist.get_sizes()) / 2 * artist.figure.dpi / 72  # s: points squared
    radii = np.broadcast_to(radii, (len(centres),))
    return [Bbox.from_bounds(x - r, y - r, 2 * r, 2 * r) for (x, y), r in zip(centres, radii)]


def _check_figure(fig) -> int:
    """Draw ``fig``: one legend, inside the figure, clear of every axes' data area, every
    data artist and every label; its colours exactly those the data is drawn in. The
    number of data artists checked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == 1, "one legend per figure"
    box = legends[0].get_window_extent(renderer)
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, (box, fig.bbox)
    assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1, (box, fig.bbox)
    legend_colours = set().union(*(_colours(h) for h in legends[0].legend_handles))
    drawn, checked = set(), 0
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent(renderer)), "legend over the data area"
        for artist in [*ax.patches, *ax.collections, *ax.lines]:
            for extent in _extents(artist, renderer):
                assert not box.overlaps(extent), artist
            drawn |= _colours(artist)
            checked += 1
        # The tick labels drawn: the locators' ticks within the view.
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        labels = [ax.xaxis.label, ax.yaxis.label]
        labels += [t for t in ax.get_xticklabels() if x0 <= t.get_position()[0] <= x1]
        labels += [t for t in ax.get_yticklabels() if y0 <= t.get_position()[1] <= y1]
        for text in [*labels, *ax.texts]:
            if text.get_text() and text.get_visible():
                extent = text.get_window_extent(renderer)
                assert not box.overlaps(extent), text.get_text()
                assert fig.bbox.x0 - 0.5 <= extent.x0 and extent.x1 <= fig.bbox.x1 + 0.5, text
    assert drawn <= legend_colours, f"drawn but not in the legend: {drawn - legend_colours}"
    assert legend_colours <= drawn, f"in the legend but not drawn: {legend_colours - drawn}"
    return checked


def _every_range_data() -> dict:
    """Values in every range of float16 with far tails on both sides, their cast's
    relative errors (rounding, subnormal, zero, overflow), in histograms as a report's."""
    import numpy as np

    from tfckpt.inspection.histograms import Log2Histogram
    from tfckpt.inspection.report import bands

    rng = np.random.default_rng(5)
    x = rng.standard_normal(200_000) * 10.0 ** rng.integers(-12, 8, 200_000)
    x = np.concatenate([x, [1e-300, 1e300, 7e4, 1e-9, 3e-6, 0.0]])
    values, errors = Log2Histogram(), Log2Histogram()
    values.add(x)
    with np.errstate(all="ignore"):
        y = x.astype(np.float16).astype(np.float64)
        rel = np.where(x == 0, 0.0, np.abs(y - x) / np.abs(x))
    errors.add(rel)
    return {
        "hist": values.result(),
        "band": bands(TARGET),
        "error": {"rel_histogram": errors.result(), "max_rel": float("inf")},
    }


def test_legend_beside_the_data_with_every_colour(pages):
    """Every figure of both pages, the overview, and a tensor with values in every range
    of the target and errors of every kind: the legend sits in a strip of its own above
    the axes and lists exactly the colours drawn."""
    from tfckpt.inspection.report import figures

    every = _every_range_data()
    checked = _check_figure(figures.draw_tensor(every["hist"], every["band"], every["error"]))
    checked += _check_figure(figures.draw_tensor(every["hist"], every["band"], None))
    exact = {"rel_histogram": {"first": None, "counts": [], "zeros": 5, "nonfinite": 0}}
    checked += _check_figure(figures.draw_tensor(every["hist"], every["band"], exact))
    for kind in ("stats", "convert"):
        data = _embedded(pages[kind].read_text())
        for row in data["tensors"]:
            hist = data["histograms"].get(row["name"])
            if row["target"] and hist and hist["first"] is not None:
                error = data["errors"].get(row["name"])
                fig = figures.draw_tensor(hist, data["bands"][row["target"]], error)
                checked += _check_figure(fig)
        sizes = {t["name"]: t["elements"] for t in data["stats"]["tensors"]}
        rows = [{**r, "elements": sizes[r["name"]]} for r in data["tensors"] if r["affected"]]
        long = [{**r, "name": "scope/" * 12 + r["name"]} for r in rows]
        effects = [("overflow", "overflow"), ("to_zero", "→ 0"), ("subnormal", "subnormal")]
        checked += _check_figure(figures.draw_overview(rows, effects))
        checked += _check_figure(figures.draw_overview(long, effects))
    assert checked > 100


def test_each_figure_drawn_once_on_reused_figures(pages):
    """A page's figures: each drawn once (no layout pass drawing it first), on one
    matplotlib figure per layout reused from tensor to tensor, and the same SVG as a
    figure of its own (nothing of the last tensor left behind)."""
    from tfckpt.inspection.report import figures

    every = _every_range_data()
    data = _embedded(pages["convert"].read_text())
    cases = [
        (data["histograms"][r["name"]], data["bands"][r["target"]], data["errors"][r["name"]])
        for r in data["tensors"]
        if r["name"] in data["errors"] and data["histograms"][r["name"]]["first"] is not None
    ]
    exact = {"rel_histogram": {"first": None, "counts": [], "zeros": 5, "nonfinite": 0}}
    cases += [
        (every["hist"], every["band"], every["error"]),
        (every["hist"], every["band"], None),
        (every["hist"], every["band"], exact),
        *cases[:2],
        (every["hist"], every["band"], None),
    ]
    painter, draws = figures.Painter(), []
    watched = set()
    for i, (hist, band, error) in enumerate(cases):
        fig = painter.tensor(hist, band, error)
        if id(fig) not in watched:
            watched.add(id(fig))
            fig.canvas.mpl_connect("draw_event", draws.append)
        before = len(draws)
        svg = figures.svg(fig, f"t{i}")
        assert len(draws) == before + 1, "drawn once"
        assert svg == figures.svg(figures.draw_tensor(hist, band, error), f"t{i}"), i
    assert painter.drawn == len(cases) and painter.made == 2


def _strict(value):
    """A copy of ``value`` as ``--json`` prints it: non-finite floats as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict(v) for v in value]
    return value


def _stats_equal(a: dict, b: dict) -> bool:
    """Equal, but for the mean and the standard deviation, which are summed in another
    order when the chunks are cut elsewhere."""
    a, b = _strict(a), _strict(b)  # copies, as --json spells them
    for ta, tb in zip(a["tensors"], b["tensors"], strict=True):
        for key in ("mean", "std"):
            va, vb = ta.pop(key, None), tb.pop(key, None)
            if isinstance(va, float) and isinstance(vb, float):
                assert math.isclose(va, vb, rel_tol=1e-9, abs_tol=1e-300), (ta["name"], key)
            else:
                assert va == vb, (ta["name"], key)
    assert a == b
    return True


def test_summary_sorted_by_loss(pages):
    data = _embedded(pages["convert"].read_text())
    rows = data["tensors"]
    assert rows[0]["name"].startswith("embedding/")  # most of it subnormal
    assert [r["affected"] for r in rows] == sorted((r["affected"] for r in rows), reverse=True)
    lines = {s["effect"]: s for s in report_summary(data)}
    assert set(lines) == set(EFFECTS)
    assert lines["to_zero"]["values"] == len(rc.TO_ZERO) + 1  # the kernel's, scale's 1e-300


def report_summary(data):
    from tfckpt.inspection.report import summary

    return summary(data)


# ---------------------------------------------------------------- the command line


def test_top_n_drawn_every_tensor_in_the_table(ckpt, tmp_path):
    page = tmp_path / "top.html"
    done = run_text("stats", ckpt, "--html", page, "--report-top", "2")
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    data = _embedded(html)
    drawn = re.findall(r'<figure class="tensor" data-name="([^"]*)"', html)
    most = [r["name"] for r in data["tensors"] if r["target"] and r["name"] in data["histograms"]]
    assert drawn == most[:2] == [n for n in most if n.startswith(("embedding/", "scale/"))]
    assert "The 2 most affected tensors" in html
    table = re.findall(r'<tr[^>]* data-name="([^"]*)"', html)
    assert table == [r["name"] for r in data["tensors"]]
    assert sorted(table) == sorted(t["name"] for t in data["stats"]["tensors"])


def test_an_existing_page_is_replaced_only_with_overwrite(ckpt, tmp_path):
    page = tmp_path / "r.html"
    page.write_text("mine")
    assert_cli_error(run_text("stats", ckpt, "--html", page), "already exists", "--overwrite")
    out = tmp_path / "o" / "model"
    assert_cli_error(
        run_text("convert", ckpt, out, "--dtype", TARGET, "--report", page), "already exists"
    )
    assert page.read_text() == "mine" and not out.parent.exists()  # refused before converting
    done = run_text("stats", ckpt, "--html", page, "--overwrite", "--dtype", "bfloat16")
    assert done.returncode == 0, done.stderr
    assert _embedded(page.read_text())["bands"].keys() == {"bfloat16"}


def test_a_page_never_replaces_the_checkpoint(ckpt, tmp_path):
    index = Path(ckpt + ".index")
    before = index.read_bytes()
    assert_cli_error(
        run_text("stats", ckpt, "--html", index, "--overwrite"), "a file of the checkpoint"
    )
    out = tmp_path / "o" / "model"
    assert_cli_error(
        run_text("convert", ckpt, out, "--dtype", TARGET, "--report", f"{out}.index"),
        "a file of the checkpoint",
    )
    assert index.read_bytes() == before and not out.parent.exists()


def test_report_refuses_a_dry_run(ckpt, tmp_path):
    assert_cli_error(
        run_text(
            "convert",
            ckpt,
            tmp_path / "o",
            "--dtype",
            TARGET,
            "--dry-run",
            "--report",
            tmp_path / "r.html",
        ),
        "--report",
        "--dry-run",
    )


def test_without_matplotlib_one_line_names_the_extra(ckpt, tmp_path):
    import subprocess

    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from tfckpt.cli import main\n"
        f"sys.exit(main(['stats', {ckpt!r}, '--html', {str(tmp_path / 'r.html')!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=user_env(), timeout=120
    )
    # From a checkout, the hint names it (tests/cli/test_output_and_help.py: each form).
    assert_cli_error((done.returncode, "", done.stderr), "matplotlib: pip install ", "[report]'")
    assert not (tmp_path / "r.html").exists()


# ---------------------------------------------------------------- in a real browser


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium (tests/browser_helpers.py), one window for the module."""
    with browser_helpers.chromium() as driver:
        yield driver


TABLE = """return [...document.querySelectorAll('#tensors tbody tr')].map(r => [r.dataset.name,
  Object.fromEntries([...r.querySelectorAll('td[data-key]')].map(c => [c.dataset.key, c.innerText]))]);"""


def _number(text: str) -> float:
    return {"inf": math.inf, "-inf": -math.inf, "NaN": math.nan}.get(text) or float(
        text.replace(",", "")
    )


def _check_table(rows: list, stats_json: dict) -> None:
    by_name = {t["name"]: t for t in stats_json["tensors"]}
    assert sorted(n for n, _ in rows) == sorted(by_name)
    for name, cells in rows:
        t = by_name[name]
        assert int(cells["elements"].replace(",", "")) == t["elements"], name
        for key in ("min", "max", "mean", "std"):
            want = t.get(key)
            if want is None:
                assert cells[key] == "–", (name, key)
                continue
            want = {"Infinity": math.inf, "-Infinity": -math.inf}.get(want, want)
            assert math.isclose(_number(cells[key]), want, rel_tol=1e-5), (
                name,
                key,
                cells[key],
                want,
            )
        if "zeros" in t:
            assert math.isclose(
                float(cells["zeros"].rstrip("%")) / 100, t["zeros"], rel_tol=1e-5, abs_tol=1e-12
            )
            assert (int(cells["nan"]), int(cells["inf"])) == (t["nan"], t["inf"]), name
        cast = t.get("cast", {}).get(TARGET)
        for key in EFFECTS:
            got = cells[key] if cast is None else int(cells[key].replace(",", ""))
            assert got == ("–" if cast is None else cast[key]), (name, key)


@pytest.mark.browser
@pytest.mark.parametrize("kind", ["stats", "convert"])
def test_page_in_chromium(browser, pages, kind):
    from selenium.webdriver.common.by import By

    browser.get(pages[kind].as_uri())
    assert browser.execute_script("return document.readyState") == "complete"
    assert browser.get_log("browser") == []  # no console error, warning or message
    # Self-contained: nothing was requested beyond the page itself.
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    figures = browser.find_elements(By.CSS_SELECTOR, "figure.tensor")
    drawn = [t for t in _floats(pages["stats_json"]) if t["min"] != 0 or t["max"] != 0]
    assert len(figures) == len(drawn) == 4
    overview = browser.find_elements(By.CSS_SELECTOR, "figure.overview svg")
    assert len(overview) == 1
    for figure in [*figures, overview[0]]:
        svg = figure if figure.tag_name == "svg" else figure.find_element(By.TAG_NAME, "svg")
        assert svg.size["width"] > 300 and svg.size["height"] > 100, svg.size
        browser.execute_script("arguments[0].scrollIntoView()", figure)
        assert browser_helpers.not_blank(figure.screenshot_as_png) > 20, figure.get_attribute(
            "data-name"
        )
    assert browser_helpers.not_blank(browser.get_screenshot_as_png()) > 20
    _check_table(browser.execute_script(TABLE), pages["stats_json"])
    summary = browser.find_element(By.ID, "summary").text
    for key, words in zip(EFFECTS, ("overflowed", "became zero", "became subnormal")):
        hit = [
            t["cast"][TARGET][key] for t in _floats(pages["stats_json"]) if t["cast"][TARGET][key]
        ]
        n = len(hit)
        assert f"{sum(hit):,} values {words}" in summary, (key, summary)
        assert f"in {n} tensor{'s' if n != 1 else ''}:" in summary, (key, summary)
    if kind == "convert":
        errors = _embedded(pages[kind].read_text())["errors"]
        for name, cells in browser.execute_script(TABLE):
            if name in errors:
                assert int(cells["differing"].replace(",", "")) == errors[name]["differing"]
                want = {"Infinity": math.inf}.get(errors[name]["max_rel"], errors[name]["max_rel"])
                assert math.isclose(_number(cells["max_rel"]), want, rel_tol=1e-5), name
    shots = (
        Path(os.environ.get("TFCKPT_REPORT_SHOTS", ""))
        if os.environ.get("TFCKPT_REPORT_SHOTS")
        else None
    )
    if shots:  # for a person to look at: TFCKPT_REPORT_SHOTS=DIR
        height = browser.execute_script("return document.body.scrollHeight")
        browser.set_window_size(1280, height + 40)
        browser.execute_script("window.scrollTo(0, 0)")
        shots.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(shots / f"{kind}.png"))
        browser.set_window_size(1280, 1000)
