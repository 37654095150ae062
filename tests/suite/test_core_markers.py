"""`make test-core`: a test that skips for want of a module fails unless it is marked for it.

The suite's own conftest runs in a pytester directory; a module is made missing by setting
``sys.modules[name] = None`` (an import of it then raises ImportError), which is how a
test-core environment without PyTorch looks to ``importorskip``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

FILES = {
    "test_module_unmarked.py": """
import sys, pytest
sys.modules["torch"] = None
pytest.importorskip("torch")
def test_a(): pass
""",
    "test_module_marked.py": """
import sys, pytest
pytestmark = pytest.mark.hf
sys.modules["torch"] = None
pytest.importorskip("torch")
def test_a(): pass
""",
    "test_functions.py": """
import sys, pytest
def _missing(name):
    sys.modules[name] = None
    pytest.importorskip(name)
def test_unmarked(): _missing("transformers")
@pytest.mark.hf
def test_marked(): _missing("transformers")
@pytest.mark.hf
def test_wrong_marker(): _missing("jax")
@pytest.mark.hf
def test_a_core_module(): _missing("moto")
def test_a_plain_skip(): pytest.skip("not today")
""",
}


@pytest.fixture
def suite(pytester):
    shutil.copy(CONFTEST, pytester.path / "conftest.py")
    pytester.makeini("[pytest]\nmarkers =\n    hf: x\n    jax: x\n    browser: x\n")
    for name, text in FILES.items():
        pytester.makepyfile(**{name[:-3]: text})
    return pytester


def test_under_test_core_an_unmarked_skip_fails(suite, monkeypatch):
    monkeypatch.setenv("TFCKPT_TEST_CORE", "1")
    result = suite.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rA", "--continue-on-collection-errors"
    )
    text = result.stdout.str()
    assert "test_module_unmarked.py: skipped for want of 'torch'" in text, text
    assert "mark the test `hf`" in text
    outcomes = result.parseoutcomes()
    # An error collecting the unmarked module; failed: the unmarked test, the test marked
    # for another module, the core module; skipped: the marked module and test, the plain
    # skip.
    assert outcomes.get("errors") == 1 and outcomes.get("failed") == 3, text
    assert outcomes.get("skipped", 0) == 3, text
    assert (
        "test_functions.py::test_a_core_module: skipped for want of 'moto', which `make test-core` installs"
        in text
    )


def test_in_the_full_suite_the_same_skips_stay_skips(suite, monkeypatch):
    monkeypatch.delenv("TFCKPT_TEST_CORE", raising=False)
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()
    assert outcomes["skipped"] == 7
