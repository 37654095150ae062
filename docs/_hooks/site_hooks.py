"""MkDocs hook: what the site takes from the repository at build time, and what makes it work
opened from files.

- The release, ``tfckpt.__version__``, as ``config.extra.release`` (the header shows it;
  Material keeps ``extra.version`` for its version selector).
- ``<!-- readme: HEADING -->`` in a page becomes the README's section of that heading, its
  links made relative to the page: the home page's "I want to …" table is the README's.
- In a table row, ``\\|`` inside a code span is GitHub's escape for ``|``: GitHub shows
  ``|``, Python-Markdown would show ``\\|``. The site shows what GitHub shows.
- ``search/search_index.js``: the search index as a script, which Material's search loads
  instead of fetching the JSON when the page is a ``file://`` one (a browser fetches no file
  from a file page). Its worker is started by ``_theme/assets/javascripts/file-worker.js``.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

_README_MARK = re.compile(r"^<!--\s*readme:\s*(.+?)\s*-->\s*$", re.M)
_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def readme_section(readme: str, heading: str) -> str:
    """The body of ``readme``'s ``## heading`` section (the heading left out).

    >>> readme_section("# t\\n## A b\\ntext\\n## C\\nmore\\n", "A b")
    'text'
    """
    lines = readme.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if re.fullmatch(rf"##\s+{re.escape(heading)}\s*", line)),
        None,
    )
    if start is None:
        raise ValueError(f"README.md has no section '## {heading}'")
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(r"#{1,2}\s", lines[i])), len(lines)
    )
    return "\n".join(lines[start + 1 : end]).strip()


def relink(text: str, repo_url: str | None, page_dir: str = "") -> str:
    """README's links, relative to the repository's root, made relative to a page in
    ``page_dir`` of the docs: ``docs/x.md`` becomes ``x.md`` (from the docs' root), another
    file of the repository its page at the repository (or is left as it is without
    ``repo_url``).

    >>> relink("[a](docs/tutorials/a.md) [b](Makefile)", "https://host/r", "commands")
    '[a](../tutorials/a.md) [b](https://host/r/blob/main/Makefile)'
    """

    def fix(m: re.Match) -> str:
        target = m[2]
        if re.match(r"[a-z][a-z0-9+.-]*:|#|/", target):
            return m[0]
        path = posixpath.normpath(target)
        if path.startswith("docs/"):
            inside = posixpath.relpath(path[len("docs/") :], page_dir or ".")
            return f"{m[1]}{inside}{m[3]}"
        if repo_url:
            return f"{m[1]}{repo_url.rstrip('/')}/blob/main/{path}{m[3]}"
        return m[0]

    return _LINK.sub(fix, text)


def unescape_table_pipes(markdown: str) -> str:
    """In table rows, ``\\|`` inside code spans becomes ``|`` (GitHub's reading of it)."""

    def span(m: re.Match) -> str:
        return m[1] + m[2].replace("\\|", "|") + m[1]

    return "\n".join(
        _CODE_SPAN.sub(span, line) if line.lstrip().startswith("|") else line
        for line in markdown.split("\n")
    )


def on_config(config):
    """The release, for the header."""
    from tfckpt.version import __version__

    config.extra["release"] = __version__
    return config


def on_page_markdown(markdown, page, config, files):
    """The README's sections where a page asks for them; table pipes as GitHub reads them."""

    def include(m: re.Match) -> str:
        readme = Path(config.config_file_path).parent / "README.md"
        section = readme_section(readme.read_text(encoding="utf-8"), m[1])
        return relink(section, config.repo_url, posixpath.dirname(page.file.src_uri))

    return unescape_table_pipes(_README_MARK.sub(include, markdown))


def on_post_build(config):
    """``search/search_index.js``, from the index the search plugin wrote."""
    search = Path(config.site_dir) / "search"
    index = search / "search_index.json"
    if index.is_file():
        data = index.read_text(encoding="utf-8")
        (search / "search_index.js").write_text(f"var __index = {data}\n", encoding="utf-8")
