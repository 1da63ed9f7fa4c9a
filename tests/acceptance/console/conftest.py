"""A real browser for the console's tests: Debian's chromium, driven by Playwright.

Playwright's own browser download is never used: the browser is the system's
(``./run test`` installs Debian's ``chromium``).  Without it, or without Playwright,
the tests skip with the reason - and fail under CI=true, as other required tools do.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import REPO

IMAGES = REPO / "docs" / "images"
# The docs' screenshots are rewritten only when asked (SIDECAR_SCREENSHOTS=1 ./run test
# tests/acceptance/console): a test run otherwise leaves the checkout as it found it.
UPDATE_DOCS = os.environ.get("SIDECAR_SCREENSHOTS") == "1"
VIEWPORT = {"width": 1280, "height": 800}


def chromium_path() -> str | None:
    return shutil.which("chromium") or next(
        (p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists()), None
    )


def _missing(what: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (CI=true: the console's browser tests are required)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless chromium for the module's tests."""
    try:
        from playwright.sync_api import sync_playwright  # noqa: PLC0415
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    executable = chromium_path()
    if executable is None:
        _missing("no chromium (Debian package 'chromium'; ./run test installs it as root)")
    with sync_playwright() as driver:
        launched = driver.chromium.launch(
            executable_path=executable,
            headless=True,
            # root in a container: chromium's sandbox needs user namespaces it may not get
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (no stored token) at a laptop's screen size."""
    context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
    context.set_default_timeout(20_000)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield tab
    finally:
        context.close()
    assert not errors, f"the page threw: {errors}"


def screenshot(tab: Any, name: str) -> Path:
    """Saves what the page shows as console-NAME.png: in docs/images (which the docs
    show) when SIDECAR_SCREENSHOTS=1, else in a temporary folder."""
    target = IMAGES if UPDATE_DOCS else Path(tempfile.gettempdir()) / "sidecar-console-shots"
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"console-{name}.png"
    # No focus ring in the picture (a skip link focused by a keyboard check hides the logo).
    tab.evaluate("document.activeElement && document.activeElement.blur()")
    tab.screenshot(path=str(path))
    assert path.stat().st_size > 10_000, f"{path} is too small to show the page"
    return path
