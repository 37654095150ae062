"""The documentation site as a reader meets it: built by MkDocs (strict) into a temporary
folder, opened from its files in headless Chromium (tests/browser_helpers.py).

The home page, a tutorial, a command page and the API reference are screenshot (kept in
the test's temporary folder, or TFCKPT_SITE_SHOTS=DIR) and checked: nothing wider than the page, no block running out
of the text column, no heading without content under it. The header has the tabs, the
repository link and the release; the home page's "I want to …" table is README.md's; each
command page lists every option its parser has, in tables; search works from file://.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import browser_helpers
import pytest

import tfckpt

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
TABS = ["Get started", "Tutorials", "Commands", "Presets", "Reference"]
PAGES = {  # screenshot name: the page, as the site writes it
    "home": "index.html",
    "tutorial": "tutorials/combine.html",
    "command": "commands/convert.html",
    "api": "reference/api.html",
}
SEARCH = ("bfloat16", "float16")  # typed, and a word every result's text then holds
MARK = re.compile(r"<!--\s*cli-help:\s*([\w-]+)\s*-->")


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """``mkdocs build --strict`` of the repository, into a temporary folder."""
    missing = [m for m in ("mkdocs", "material", "mkdocstrings") if _missing(m)]
    if missing:
        reason = f"the site's build needs {', '.join(missing)} (pip install '.[docs]')"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def browser():
    with browser_helpers.chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where the screenshots go: the test's temporary folder, or TFCKPT_SITE_SHOTS=DIR for
    a person to look at."""
    where = os.environ.get("TFCKPT_SITE_SHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        return Path(where)
    return tmp_path_factory.mktemp("screenshots")


def _config() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def _open(browser, site: Path, page: str) -> None:
    browser.set_window_size(1280, 1000)
    browser.get((site / page).as_uri())
    assert browser.execute_script("return document.readyState") == "complete"


# ---------------------------------------------------------------- what the files hold


def _commands() -> dict[str, argparse.ArgumentParser]:
    from tfckpt.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no commands")


def _first_cells(page_html: str) -> list[str]:
    """The text of the first cell of each row of the page's options and arguments tables."""
    cells = []
    for table in re.findall(
        r'<table data-cli="(?:options|arguments)">(.*?)</table>', page_html, re.S
    ):
        for cell in re.findall(r"<tr[^>]*>\s*<td>(.*?)</td>", table, re.S):
            cells.append(html.unescape(re.sub(r"<[^>]+>", "", cell)))
    return cells


def test_every_option_of_every_command_is_in_its_pages_tables(site):
    """Every action of each command's parser, shown in its ``--help`` or not, is a row."""
    commands = _commands()
    marked = {}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for name in MARK.findall(page.read_text(encoding="utf-8")):
            marked[name] = page.relative_to(ROOT / "docs").with_suffix(".html")
    # `completion SHELL` and `help COMMAND` are described on the command line's page.
    assert set(commands) - set(marked) <= {"completion", "help"}
    assert set(marked) <= set(commands)
    for name, page in marked.items():
        cells = _first_cells((site / page).read_text(encoding="utf-8"))
        assert cells, f"{page}: no options table"
        listed = {part.strip() for cell in cells for part in cell.split(",")}
        for action in commands[name]._actions:
            if action.option_strings:
                missing = set(action.option_strings) - listed
                assert not missing, f"{page}: {sorted(missing)} of `tfckpt {name}` not listed"
            else:
                label = action.metavar or action.dest
                assert any(label in cell for cell in cells), f"{page}: {label} not listed"


def _readme_rows() -> list[str]:
    """The first cell of each row of README's "I want to …" table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## I want to …\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## I want to …' section"
    rows = [line for line in section[1].splitlines() if line.startswith("|")]
    cells = [row.strip("|").split("|")[0].strip() for row in rows[2:]]  # header, rule
    # As the page shows them: a link's text, no code or emphasis marks.
    return [
        re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", c).replace("`", "").replace("**", "") for c in cells
    ]


def test_no_escaped_pipe_shows_in_a_table(site):
    """A ``\\|`` (GitHub's escape for ``|`` in a table's code span) shows as ``|``."""
    found = []
    for page in site.rglob("*.html"):
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", page.read_text(encoding="utf-8"), re.S):
            if "\\|" in html.unescape(re.sub(r"<[^>]+>", "", cell)):
                found.append(f"{page.relative_to(site)}: {cell[:120]}")
    assert not found, "\n".join(found)


def test_nothing_is_fetched_from_the_network(site):
    """Scripts, stylesheets and fonts are the site's own: it works offline, from files."""
    remote = re.compile(r"""<(?:script|link|img)\b[^>]*\b(?:src|href)=["']?(?:https?:)?//""")
    found = [
        f"{page.relative_to(site)}: {m[0]}"
        for page in site.rglob("*.html")
        for m in remote.finditer(page.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found[:10])
    assert (site / "search" / "search_index.js").is_file()


# ---------------------------------------------------------------- in a real browser

# Elements of the text column, each checked against the column's box: its visible part
# (clipped by every ancestor that scrolls or clips) must lie within the column. An inline
# element counts by its text (the padding Material draws around inline code at each line's
# end may pass the edge). A block whose content is wider than itself must scroll inside
# itself: a code block wider than the column passes only so.
OVERFLOW = """
const column = document.querySelector('article.md-content__inner');
const box = column.getBoundingClientRect();
const out = [];
for (const el of column.querySelectorAll(
    'pre, code, table, img, svg, p, li, h1, h2, h3, h4, .highlight, .admonition, details, dl'
    )) {
  let rects = [el.getBoundingClientRect()];
  if (getComputedStyle(el).display === 'inline') {
    const range = document.createRange();
    range.selectNodeContents(el);
    rects = [...range.getClientRects()];
  }
  rects = rects.filter(r => r.width > 0 || r.height > 0);
  if (!rects.length) continue;
  const style = getComputedStyle(el);
  if (el.matches('pre, table, .highlight, .admonition, details, dl')
      && style.overflowX === 'visible' && el.scrollWidth > el.clientWidth + 1) {
    out.push(el.tagName + ' spills ' + (el.scrollWidth - el.clientWidth) + 'px: '
             + el.textContent.slice(0, 80));
    continue;
  }
  let left = Math.min(...rects.map(r => r.left)), right = Math.max(...rects.map(r => r.right));
  for (let a = el.parentElement; a && a !== column; a = a.parentElement) {
    if (getComputedStyle(a).overflowX !== 'visible') {
      const ar = a.getBoundingClientRect();
      left = Math.max(left, ar.left);
      right = Math.min(right, ar.right);
    }
  }
  if (right > box.right + 1 || left < box.left - 1) {
    out.push(el.tagName + ' ' + Math.round(right - box.right) + 'px: '
             + el.textContent.slice(0, 80));
  }
}
return out;
"""

# Each h2/h3 of the text column, and whether content (text, a table, a figure) comes after
# it, in document order, before the next heading.
SECTIONS = """
const column = document.querySelector('article.md-content__inner');
const content = 'p, pre, table, ul, ol, dl, blockquote, img, svg, details, .admonition';
const all = [...column.querySelectorAll('h1, h2, h3, h4, h5, h6, ' + content)];
const out = [];
all.forEach((el, i) => {
  if (!/^H[23]$/.test(el.tagName)) return;
  let filled = false;
  for (const next of all.slice(i + 1)) {
    if (el.contains(next)) continue;
    if (/^H[1-6]$/.test(next.tagName)) break;
    if (next.textContent.trim() || next.matches('img, svg')) { filled = true; break; }
  }
  out.push([el.textContent.replace('¶', '').trim(), filled]);
});
return out;
"""

# Tables that scroll sideways inside their frame: the reader must scroll to read a row.
SCROLLING_TABLES = """
return [...document.querySelectorAll('article .md-typeset__scrollwrap')]
  .filter(w => w.scrollWidth > w.clientWidth + 1)
  .map(w => w.textContent.slice(0, 80));
"""


def test_every_command_page_fits(site, browser):
    """The options tables of every command fit the text column, no row scrolling sideways."""
    pages = sorted((site / "commands").glob("*.html"))
    assert len(pages) > 20
    for page in pages:
        _open(browser, site, str(page.relative_to(site)))
        assert browser.execute_script(OVERFLOW) == [], page.name
        assert browser.execute_script(SCROLLING_TABLES) == [], page.name


@pytest.mark.parametrize("name", sorted(PAGES))
def test_page_fits_and_has_no_empty_section(site, browser, name, shots):
    _open(browser, site, PAGES[name])
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe
    assert browser.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    ), "the page scrolls sideways"
    assert browser.execute_script(OVERFLOW) == []
    assert browser.execute_script(SCROLLING_TABLES) == []
    sections = browser.execute_script(SECTIONS)
    assert [title for title, filled in sections if not filled] == []
    # The whole page (up to 8000 pixels of it), for a person to look at, and not blank.
    height, chrome = browser.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]"
    )
    browser.set_window_size(1280, min(height, 8000) + chrome)
    png = browser.get_screenshot_as_png()
    (shots / f"{name}.png").write_bytes(png)
    assert browser_helpers.not_blank(png) > 20


def test_header_has_tabs_release_and_repository(site, browser):
    _open(browser, site, "index.html")
    tabs = browser.execute_script(
        "return [...document.querySelectorAll('.md-tabs__link')].map(a => [a.textContent.trim(), a.href])"
    )
    assert [t for t, _ in tabs] == TABS
    for _, href in tabs:  # each tab opens a page the site has
        assert href.startswith("file://") and Path(href.removeprefix("file://")).is_file(), href
    header = browser.execute_script(
        "const s = document.querySelector('.md-header .md-source');"
        "return [s.href, s.querySelector('[data-tfckpt-release]').textContent.trim()]"
    )
    assert header == [_config()["repo_url"], tfckpt.__version__]


def test_home_page_has_the_readmes_table(site, browser):
    _open(browser, site, "index.html")
    rows = browser.execute_script(
        "const h = document.getElementById('i-want-to');"
        "let t = h.nextElementSibling; while (t && !t.querySelector('table')) t = t.nextElementSibling;"
        "return [...t.querySelectorAll('tbody tr')].map(r => r.cells[0].textContent.trim())"
    )
    assert rows == _readme_rows() and len(rows) >= 10


def test_command_page_shows_its_options_as_tables(site, browser):
    _open(browser, site, PAGES["command"])
    shown = browser.execute_script(
        "return [...document.querySelectorAll('table[data-cli=options] tbody tr')]"
        ".filter(r => r.getBoundingClientRect().height > 0).map(r => r.cells[0].textContent)"
    )
    listed = {part.strip() for cell in shown for part in cell.split(",")}
    wanted = {o for a in _commands()["convert"]._actions for o in a.option_strings}
    assert wanted <= listed, sorted(wanted - listed)
    blocks = browser.execute_script(
        "return [...document.querySelectorAll('article pre')].map(p => p.textContent)"
    )
    assert not [b for b in blocks if "show this help message" in b]  # no raw --help left


def test_search_works_from_files(site, browser):
    """Material's search runs in a worker, which no browser starts from a file:// page;
    the site's stand-in (docs/_theme/assets/javascripts/file-worker.js) runs it there."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _open(browser, site, "index.html")
    assert browser.current_url.startswith("file://")
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.click()
    box.send_keys(SEARCH[0])
    results = WebDriverWait(browser, 60).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, ".md-search-result__item")
    )
    assert results
    links = [
        a.get_attribute("href")
        for a in browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item > a")
    ]
    for href in links:
        assert Path(href.removeprefix("file://").split("#")[0]).is_file(), href
    assert SEARCH[1] in results[0].text.lower()
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe
