"""Debian's headless Chromium, driven by selenium through the system chromedriver, for the
tests that look at a page as a reader does (the documentation site; the HTML reports do
the same in tests/inspection/test_report.py).

selenium-manager never runs (it would download a driver). Missing, the browser fails the
test in CI (``CI=true``) and skips it elsewhere, saying what to install.
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def driver_path() -> str | None:
    """The system chromedriver, if installed."""
    return shutil.which("chromedriver") or (
        "/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None
    )


def require_browser() -> None:
    """Skip (fail in CI) with what is missing: selenium, Chromium, chromedriver."""
    missing = [
        what
        for what, there in (
            ("selenium (pip install '.[test]')", importlib.util.find_spec("selenium")),
            ("Chromium (apt-get install chromium)", shutil.which("chromium")),
            ("chromedriver (apt-get install chromium-driver)", driver_path()),
        )
        if not there
    ]
    if missing:
        reason = "the browser test needs " + ", ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


@contextmanager
def chromium(width: int = 1280, height: int = 1000) -> Iterator:
    """A headless Chromium window of ``width`` x ``height``, its console logged."""
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path()), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def not_blank(png: bytes) -> float:
    """The spread of a screenshot's pixel values (0 for a blank one)."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float64)
    return float(pixels.std())
