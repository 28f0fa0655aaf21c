"""A real browser for the console tests: the system's Chromium driven by Playwright.

Playwright's Python package drives the Chromium that Debian installs (``/usr/bin/chromium``,
``apt-get install chromium``; ``.ci/run`` installs it as root): no browser download. Without
Chromium or the ``playwright`` package the tests skip naming what is missing; under CI
(``CI`` set, as ``.ci/run`` does) they fail instead.

``NEXUS_CHROMIUM`` names another Chromium binary. With ``NEXUS_SCREENSHOTS=1`` the tests
save their pages to ``docs/images/console-*.png`` (otherwise a test run leaves the tree
alone).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.async_api import Browser, ConsoleMessage, Dialog, Page

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO_ROOT / "docs" / "images"
CANDIDATES = ("chromium", "chromium-browser")
# The console's own ticks are 2 s; a browser on two busy cores may need a few of them.
TIMEOUT_MS = 15_000


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _missing(reason: str) -> None:
    if _under_ci():
        pytest.fail(f"required under CI: {reason}")
    pytest.skip(reason)


def chromium_path() -> str:
    """The Chromium binary to drive, or skip the test (fail it under CI) saying why."""
    named = os.environ.get("NEXUS_CHROMIUM")
    if named:
        found = named if os.access(named, os.X_OK) else None
        why = f"NEXUS_CHROMIUM={named} is not an executable"
    else:
        found = next(filter(None, map(shutil.which, CANDIDATES)), None)
        why = "no chromium on PATH (apt-get install chromium)"
    if found is None:
        _missing(why)
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        _missing("the playwright package is not installed (pip install -e '.[test]')")
    assert found is not None
    return found


@dataclass
class Watched:
    """What a page did that a person would not see: dialogs it opened, CSP refusals."""

    dialogs: list[str] = field(default_factory=list)
    csp: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        await dialog.dismiss()

    def _console(self, message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            self.csp.append(message.text)
        elif message.type == "error" and not message.location.get("url", "").endswith(
            "/favicon.ico"
        ):  # the console has no icon; Chromium asks for one anyway
            self.errors.append(message.text)

    def watch(self, page: Page) -> Page:
        page.on("dialog", self._dialog)
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        return page


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Headless Chromium (the system's), closed on the way out."""
    from playwright.async_api import async_playwright

    executable = chromium_path()
    # Chromium refuses to run as root inside its sandbox; CI containers run as root.
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    async with async_playwright() as driver:
        browser = await driver.chromium.launch(executable_path=executable, args=args)
        try:
            yield browser
        finally:
            await browser.close()


async def new_page(browser: Browser, watched: Watched) -> Page:
    """A page in its own context (its own cookie jar: one person)."""
    context = await browser.new_context(viewport={"width": 1100, "height": 720})
    context.set_default_timeout(TIMEOUT_MS)
    return watched.watch(await context.new_page())


async def screenshot(page: Page, name: str) -> Path | None:
    """Save the page as docs/images/console-NAME.png when NEXUS_SCREENSHOTS=1."""
    if os.environ.get("NEXUS_SCREENSHOTS") != "1":
        return None
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"console-{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


__all__ = ["TIMEOUT_MS", "Watched", "chromium", "chromium_path", "new_page", "screenshot"]
