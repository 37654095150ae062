"""docs/reference/safety.md: every guarantee names the tests that prove it, and they exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "safety.md"
PROOF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _guarantees() -> list[str]:
    """The page's top-level bullets that state a guarantee (bold lead), before the details."""
    text = PAGE.read_text(encoding="utf-8").split("\n## ", 1)[0]
    return [b for b in re.split(r"\n(?=- \*\*)", text) if b.startswith("- **")]


def test_every_guarantee_names_its_tests():
    guarantees = _guarantees()
    assert len(guarantees) >= 13
    for bullet in guarantees:
        assert "*Proved by*" in bullet and PROOF.search(bullet), bullet.splitlines()[0]


def test_every_named_test_exists():
    named = PROOF.findall(PAGE.read_text(encoding="utf-8"))
    assert named
    defined: dict[str, set[str]] = {}
    for path, name in named:
        if path not in defined:
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            defined[path] = {
                node.name
                for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
        assert name in defined[path], f"{path}::{name} is named on the page but not defined"
