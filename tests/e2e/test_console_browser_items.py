"""The Upstream pins page's prompts and resources in a real browser (headless Chromium
driven by Playwright): an upstream whose prompt description and resource name carry a
script, an image with an error handler and bidi controls is shown as text (no dialog, no
error, no CSP refusal: nothing of it runs), and an approver re-pins the prompt with the
page's own button. The setup is test_console_items.py's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

from nexus_mcp.policy.catalog import Kind

from ..support.chromium import Watched, chromium, chromium_path, new_page
from .test_console_items import HOSTILE, README, Served, served  # noqa: F401 - the fixture

if TYPE_CHECKING:  # playwright is imported lazily: without it the tests skip
    from playwright.async_api import Browser

pytestmark = pytest.mark.slow


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    chromium_path()  # skip (fail under CI) before starting anything
    async with chromium() as launched:
        yield launched


async def test_hostile_items_stay_text_and_a_prompt_is_repinned_in_the_browser(
    served: Served,  # noqa: F811 - the fixture imported above
    browser: Browser,
) -> None:
    watched = Watched()
    before = served.item_pin(Kind.PROMPT, "greet")
    page = await new_page(browser, watched)
    await page.goto(served.link("approver", "ops:approver"))
    await page.click("#login")
    await page.wait_for_url("**/console/inbox")
    await page.goto(f"{served.base}/console/pins")
    greet = page.locator("details.item[data-kind='prompts']", has_text="greet").first
    readme = page.locator("details.item[data-kind='resources']", has_text=README).first
    assert await greet.get_attribute("open") is not None  # a changed item opens
    for item in (greet, readme):
        text = await item.inner_text()
        assert "<script>alert(1)</script>" in text and "<img src=x onerror=y>" in text
        assert "\\u202eevil\\u2066" in text and "\u202e" not in text
    # Nothing the upstream wrote became an element.
    assert await page.locator("main script, main img").count() == 0
    await greet.locator("form.repin-item button").click()
    await page.wait_for_selector("#pinned-notice")
    greet = page.locator("details.item[data-kind='prompts']", has_text="greet").first
    assert "pinned, unchanged" in await greet.inner_text()
    assert served.item_pin(Kind.PROMPT, "greet") not in (None, before)
    await page.context.close()
    assert watched.dialogs == [] and watched.csp == [] and watched.errors == [], watched
    assert HOSTILE not in str(served.gw.events())
