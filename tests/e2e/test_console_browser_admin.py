"""The console's admin pages in a real browser: headless Chromium driven by Playwright.

Pins: a real upstream process is rug-pulled through its flag file (the setup of
test_console_pins.py); an approver signs in with a one-time link, opens the changed tool,
reads the diff and presses "Pin this definition"; the agent's next tools/list (a real MCP
client with a bearer token) shows the tool again. Access: an admin assigns a profile to an
agent's subject with the page's form and revokes it with the row's button; the agent's
next tools/list follows each change. Audit and Health: the filters narrow to the agent's
call, its story opens, and the health page shows the store ready. No page raised an error
or a CSP refusal. ``NEXUS_SCREENSHOTS=1`` saves the pages to ``docs/images/console-*.png``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from nexus_mcp.settings import Settings

from ..support.chromium import SCREENSHOTS, Watched, chromium, chromium_path, new_page, screenshot
from .access_helpers import AUDIENCE, SECRET, http_client, list_as, serve_settings, token
from .test_console_pages import ADMIN, CODING_ONLY, FileAndMemory
from .test_console_pages import Served as PagesServed
from .test_console_pins import RUG_PULL, serve, upstream

if TYPE_CHECKING:  # playwright is imported lazily: without it the tests skip
    from playwright.async_api import Browser, Page

pytestmark = pytest.mark.slow

AGENT = "agent-9"


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    chromium_path()  # skip (fail under CI) before starting anything
    async with chromium() as launched:
        yield launched


async def sign_in(page: Page, link: str) -> None:
    """Open the one-time link and press Sign in: the inbox opens."""
    await page.goto(link)
    await page.click("#login")
    await page.wait_for_url("**/console/inbox")


async def viewport_shot(page: Page, name: str) -> None:
    """Like ``screenshot`` but only what the window shows: the pins page is many screens long."""
    if os.environ.get("NEXUS_SCREENSHOTS") == "1":
        await page.screenshot(path=str(SCREENSHOTS / f"console-{name}.png"))


def clean(watched: Watched) -> None:
    assert watched.csp == [] and watched.errors == [] and watched.dialogs == [], watched


async def test_a_rug_pull_is_repinned_in_the_browser_and_the_agent_sees_the_tool(
    tmp_path: Path, browser: Browser
) -> None:
    watched = Watched()
    with upstream(tmp_path) as (gw, flag):
        flag.write_text(RUG_PULL, encoding="utf-8")
        async with serve(gw, flag) as served:
            pinned_before = served.pinned("echo")
            assert pinned_before is not None
            assert "up_echo" not in await served.agent_tools()  # quarantined
            page = await new_page(browser, watched)
            await sign_in(page, served.link(role="approver", subject="ops:approver"))
            await page.goto(f"{served.base}/console/pins")
            echo = page.locator("details#tool-up-echo")
            assert await echo.get_attribute("open") is not None  # a changed tool opens
            assert "changed" in await echo.inner_text()
            add = page.locator("details#tool-up-add")
            assert await add.get_attribute("open") is None
            assert "pinned, unchanged" in await add.inner_text()
            cells = echo.locator("pre.def")
            pinned_cell, current_cell = (
                await cells.nth(2).inner_text(),
                await cells.nth(3).inner_text(),
            )
            assert "Echo text back." in pinned_cell and RUG_PULL not in pinned_cell
            assert RUG_PULL in current_cell
            shown = await echo.inner_text()
            assert f"+Echo text back. {RUG_PULL}" in shown and "-Echo text back." in shown
            quarantined = page.locator("li#quarantined-up-echo")
            assert "differs from its pin" in await quarantined.inner_text()
            await page.evaluate("document.getElementById('tool-up-echo').scrollIntoView()")
            await viewport_shot(page, "pins")

            await echo.locator("form.repin button").click()
            await page.wait_for_selector("#pinned-notice")
            assert "pin(s) written" in await page.locator("#pinned-notice").inner_text()
            assert "pinned, unchanged" in await page.locator("details#tool-up-echo").inner_text()
            assert served.pinned("echo") not in (None, pinned_before)
            assert "up_echo" in await served.agent_tools()
            repinned = served.events("upstream_repinned")
            assert [(e["tool"], e["subject"], e["outcome"]) for e in repinned] == [
                ("echo", "ops:approver", "OK")
            ]
            await page.context.close()
    clean(watched)


@pytest.fixture
async def pages_served(tmp_path: Path, workspace: Path) -> AsyncIterator[PagesServed]:
    data = tmp_path / "data"
    settings = Settings(
        mode="prod",
        transport="http",
        workspace=workspace,
        data_dir=data,
        auth={"jwt_secret": SECRET, "audience": AUDIENCE},
        port=0,
    )
    data.mkdir()
    audit = FileAndMemory(settings.audit_path)
    async with serve_settings(settings, audit) as (server, url):  # type: ignore[arg-type]
        yield PagesServed(server, url, audit)


async def test_assign_and_revoke_in_the_browser_and_the_agent_s_next_list_follows(
    pages_served: PagesServed, browser: Browser
) -> None:
    served = pages_served
    bearer = token(AGENT)
    assert CODING_ONLY not in await list_as(served.url, bearer)
    watched = Watched()
    page = await new_page(browser, watched)
    await sign_in(page, served.link(ADMIN))
    await page.goto(f"{served.base}/console/access")
    form = page.locator("form#assign")
    await form.locator('input[name="subject"]').fill(AGENT)
    await form.locator('select[name="profile"]').select_option("coding")
    await form.locator("button").click()
    await page.wait_for_selector("#done")
    assert "Profile assigned" in await page.locator("#done").inner_text()
    row = page.locator("#subjects tr.subject", has_text=AGENT)
    assert "coding" in await row.inner_text()
    assert served.assignment(AGENT) == "coding"
    assert CODING_ONLY in await list_as(served.url, bearer)  # the next list, not after a TTL
    await screenshot(page, "access")

    await row.get_by_role("button", name="Revoke profile").click()
    await page.wait_for_selector("#done")
    await page.wait_for_function("!document.body.innerText.includes('agent-9')")
    assert served.assignment(AGENT) is None
    assert CODING_ONLY not in await list_as(served.url, bearer)
    changes = served.events("grant_changed")
    assert [e["facts"]["action"] for e in changes] == ["assign", "revoke_profile"]
    assert all(e["transport"] == "console" for e in changes)
    await page.context.close()
    clean(watched)


async def test_audit_story_and_health_pages_in_the_browser(
    pages_served: PagesServed, browser: Browser
) -> None:
    served = pages_served
    async with http_client(served.url, token(AGENT)) as client:  # a real call to find
        await client.call_tool_mcp("nexus_list_files", {"path": "."})
    call = [e for e in served.audit.events if e.event == "tool_call_finished"][-1]
    watched = Watched()
    page = await new_page(browser, watched)
    await sign_in(page, served.link(ADMIN))
    await page.goto(f"{served.base}/console/audit")
    filters = page.locator("form#audit-filters")
    await filters.locator('input[name="tool"]').fill("nexus_list_files")
    await filters.get_by_role("button", name="Search").click()
    await page.wait_for_url("**/console/audit?*tool=nexus_list_files*")
    rows = page.locator("#audit-rows tr.record")
    assert await rows.count() >= 2  # started and finished
    for text in await rows.all_inner_texts():
        assert "nexus_list_files" in text and AGENT in text
    assert SECRET not in await page.content()
    await screenshot(page, "audit")

    await filters.locator('input[name="tool"]').fill("")
    await filters.locator('input[name="correlation_id"]').fill(call.correlation_id)
    await filters.get_by_role("button", name="Search").click()
    await page.wait_for_url(f"**correlation_id={call.correlation_id}*")
    assert await rows.count() >= 2
    await rows.first.get_by_role("link", name="story").click()
    await page.wait_for_url(f"**/console/audit/call/{call.correlation_id}")
    story = await page.locator("main").inner_text()
    assert "tool_call_started" in story and "tool_call_finished" in story
    assert "nexus_list_files" in story and story.index("tool_call_started") < story.index(
        "tool_call_finished"
    )

    await page.goto(f"{served.base}/console/health")
    assert await page.locator("#status").inner_text() == "ready"
    assert "embedded" in await page.locator("#store").inner_text()
    assert await page.locator("#upstreams-state").inner_text() == "none configured"
    assert await page.locator("#registry tr").count() >= 2
    await screenshot(page, "health")
    await page.context.close()
    clean(watched)
