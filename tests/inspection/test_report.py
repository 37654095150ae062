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
import io
import json
import math
import os
import re
import shutil
import sys
from pathlib import Path

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


def test_page_data_is_stats_json(pages):
    for kind in ("stats", "convert"):
        data = _embedded(pages[kind].read_text())
        assert data["kind"] == kind
        assert data["stats"] == pages["stats_json"], kind
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


def _driver_path() -> str | None:
    return shutil.which("chromedriver") or (
        "/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None
    )


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium through the system chromedriver: selenium-manager never
    runs (it would download a driver). Missing, it fails the test in CI and skips it
    elsewhere."""
    missing = [
        what
        for what, there in (
            ("selenium (pip install 'tfckpt[test]')", importlib.util.find_spec("selenium")),
            ("Chromium (apt-get install chromium)", shutil.which("chromium")),
            ("chromedriver (apt-get install chromium-driver)", _driver_path()),
        )
        if not there
    ]
    if missing:
        reason = "the browser test needs " + ", ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(_driver_path()), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _not_blank(png: bytes) -> float:
    """The spread of a screenshot's pixel values (0 for a blank one)."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float64)
    return float(pixels.std())


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
        assert _not_blank(figure.screenshot_as_png) > 20, figure.get_attribute("data-name")
    assert _not_blank(browser.get_screenshot_as_png()) > 20
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
