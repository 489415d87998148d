"""A real browser for the web UI's tests: Debian's ``chromium``, driven by
``playwright`` (Python) through ``executable_path`` (playwright's own browser
download is not used). Tests that need it skip, saying why, when either is
missing; ``.ci/browser-setup`` installs both."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# OCTAVO_UPDATE_SCREENSHOTS=1 writes the screenshots into docs/img (committed, shown in the README).
SCREENSHOT_DIR = Path(__file__).resolve().parents[2] / "docs" / "img"


def chromium_path() -> str | None:
    for candidate in (os.environ.get("OCTAVO_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless Chromium for the module, with a fresh profile."""
    try:
        from playwright import sync_api
    except ImportError as exc:
        pytest.skip(f"the browser tests need `pip install playwright` (.ci/browser-setup): {exc}")
    executable = chromium_path()
    if executable is None:
        pytest.skip("the browser tests need Debian's chromium (apt-get install chromium; .ci/browser-setup)")
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=executable,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 800},
            accept_downloads=True,
        )
        yield context
        context.close()


@pytest.fixture
def screenshot_path(tmp_path):
    def path_for(name: str) -> Path:
        if os.environ.get("OCTAVO_UPDATE_SCREENSHOTS") == "1":
            SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
            return SCREENSHOT_DIR / name
        return tmp_path / name

    return path_for
