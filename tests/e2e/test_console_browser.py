"""The console in a real browser: headless Chromium (the system's) driven by Playwright.

The same server as test_console_inbox.py, on a real socket: an agent (a real MCP client
with a bearer token) sends a write the policy sends to approval; a person opens the
one-time link in Chromium, presses Sign in, watches the request arrive in the inbox without
reloading, reads the diff and approves or denies by pressing the page's buttons; the
agent's retry lands once (or is refused). Around that: the approver's own agent's request
offers no Approve button and a button put back into the page is refused; hostile text from
the agent stays text, and markup injected into the page does not run (the CSP).

Chromium comes from Debian (``apt-get install chromium``, done by ``.ci/run`` as root);
without it these tests skip, under CI they fail. ``NEXUS_SCREENSHOTS=1`` saves the pages to
``docs/images/console-*.png``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from nexus_mcp.commands.console import login_link
from nexus_mcp.console.security import ConsoleKeys, load_console_key
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer
from nexus_mcp.settings import Settings
from nexus_mcp.stores.approval_requests import APPROVED, DENIED, PENDING

from ..support.chromium import Watched, chromium, chromium_path, new_page, screenshot
from .access_helpers import AUDIENCE, SECRET, http_client, serve_settings, token
from .conftest import snapshot

if TYPE_CHECKING:  # playwright is imported lazily: without it the tests skip
    from playwright.async_api import Browser, Locator, Page

pytestmark = pytest.mark.slow

APPROVAL_SECRET = "browser-approval-secret-0123456789abcdef-012"
META_REQUEST = "nexus.mcp/approval_request_id"
POLICY = {
    "workspace": {
        "allowed_paths": ["scratch/**"],
        "allowed_operations": ["write", "edit", "delete"],
        "require_approval": True,
    }
}
AGENT = "agent-7"
ORIGINAL = "line one\nline two\n"
WRITE = {"path": "scratch/plan.md", "content": "line one\nline 2, approved\n"}
ENV = {"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET}
# Markup injected into a page as an escaping bug would let it in: an inline script and an
# inline event handler (the image fails to load: ``x`` is no image). Under the console's
# CSP neither runs; on a page without one both do (the control below).
INJECT = """() => {
  const holder = document.createElement("div");
  holder.innerHTML = '<img id="injected-img" src="x" onerror="alert(\\'handler ran\\')">';
  document.body.append(holder);
  const script = document.createElement("script");
  script.textContent = "alert('script ran')";
  document.body.append(script);
}"""


class Served:
    def __init__(self, server: NexusServer, url: str, audit: MemoryAuditSink) -> None:
        self.server = server
        self.url = url
        self.base = url.rsplit("/", 1)[0]
        self.audit = audit

    @property
    def store(self) -> Any:
        return self.server.runtime.state.approval_requests

    def link(self, *, subject: str | None = None, role: str = "admin") -> str:
        """``nexus-mcp console --link``'s link, or one for another person."""
        settings = self.server.runtime.settings
        if subject is None:
            return login_link(settings, self.base)
        keys = ConsoleKeys(load_console_key(settings, ENV), session_ttl_seconds=600)
        return f"{self.base}/console/login?t={keys.mint_link(subject=subject, role=role)}"

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e.to_record() for e in self.audit.events if e.event == name]


@pytest.fixture
async def served(tmp_path: Path, workspace: Path) -> AsyncIterator[Served]:
    chromium_path()  # skip (fail under CI) before starting anything
    (workspace / "scratch").mkdir(exist_ok=True)
    (workspace / "scratch" / "plan.md").write_text(ORIGINAL, encoding="utf-8")
    config = tmp_path / "nexus.yaml"
    config.write_text(yaml.safe_dump({"write_policies": POLICY}), encoding="utf-8")
    audit = MemoryAuditSink()
    settings = Settings(
        mode="prod",
        transport="http",
        workspace=workspace,
        data_dir=tmp_path / "data",
        auth={"jwt_secret": SECRET, "audience": AUDIENCE},
        port=0,
    )
    async with serve_settings(settings, audit, config_file=config, env=ENV) as (server, url):
        yield Served(server, url, audit)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


async def agent_write(served: Served, key: str, **changes: Any) -> dict[str, Any]:
    async with http_client(served.url, token(AGENT, role="editor")) as client:
        result = await client.call_tool_mcp(
            "nexus_write_file", {**WRITE, **changes, "idempotency_key": key}
        )
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def refused(result: dict[str, Any]) -> tuple[str, str | None]:
    """The refusal's code and the approval request it names."""
    assert result["isError"] is True, result
    code = json.loads(result["content"][0]["text"])["code"]
    return code, (result.get("_meta") or {}).get(META_REQUEST)


def request_id_of(result: dict[str, Any]) -> str:
    code, found = refused(result)
    assert code == "APPROVAL_REQUIRED" and isinstance(found, str)
    return found


async def sign_in(page: Page, link: str, *, shot: bool = False) -> None:
    """Open the one-time link and press Sign in: the inbox opens."""
    await page.goto(link)
    assert await page.locator("h1").inner_text() == "Sign in as the local admin"
    if shot:
        await screenshot(page, "signin")
    await page.click("#login")
    await page.wait_for_url("**/console/inbox")


def row(page: Page, request_id: str) -> Locator:
    return page.locator(f'tr.request[data-request-id="{request_id}"]')


async def test_an_approver_approves_in_the_browser_and_the_retry_lands_once(
    served: Served, browser: Browser, workspace: Path
) -> None:
    watched = Watched()
    page = await new_page(browser, watched)
    await sign_in(page, served.link(), shot=True)
    assert await page.locator("#inbox-empty").is_visible()
    await page.evaluate("() => { window.sameDocument = true; }")

    before = snapshot(workspace)
    request_id = request_id_of(await agent_write(served, "k-1"))
    assert snapshot(workspace) == before
    # The page notices by itself: no reload (the marker set above survives).
    await row(page, request_id).wait_for(state="visible")
    assert await page.evaluate("() => window.sameDocument") is True
    assert await page.locator("#inbox-empty").count() == 0
    listed = await row(page, request_id).inner_text()
    assert "nexus_write_file" in listed and AGENT in listed and "scratch/plan.md" in listed
    await screenshot(page, "inbox")

    await row(page, request_id).get_by_role("link", name="Review").click()
    await page.wait_for_url(f"**/console/inbox/{request_id}")
    preview = await page.locator("#preview").inner_text()
    assert "-line two" in preview and "+line 2, approved" in preview
    assert await page.locator("#request-status").inner_text() == PENDING
    await page.fill("#reason", "looks right")
    await screenshot(page, "request")
    await page.click("#approve")
    await page.wait_for_url(f"**/console/inbox?decided={request_id}")
    await page.locator("#inbox-empty").wait_for(state="visible")
    decided_by = served.store.get(request_id).decided_by
    assert served.store.get(request_id).status == APPROVED and decided_by.startswith("local:")
    assert snapshot(workspace) == before  # approving runs nothing by itself

    landed = await agent_write(served, "k-1")
    assert landed.get("isError") is not True, landed
    target = workspace / "scratch" / "plan.md"
    assert target.read_text(encoding="utf-8") == WRITE["content"]
    # Once: the same call again replays the result and writes nothing (the file, changed
    # meanwhile, stays); under a new key it is another call, which waits again.
    target.write_text("changed since\n", encoding="utf-8")
    again = await agent_write(served, "k-1")
    assert again.get("isError") is not True, again
    assert target.read_text(encoding="utf-8") == "changed since\n"
    assert request_id_of(await agent_write(served, "k-2")) != request_id
    assert target.read_text(encoding="utf-8") == "changed since\n"
    writes = [
        (e["outcome"], e["idempotency"], e.get("approver"))
        for e in served.events("tool_call_finished")
        if e["tool"] == "nexus_write_file"
    ]
    assert writes == [("OK", "executed", decided_by), ("OK", "replayed", None)], writes
    decided = served.events("approval_decided")
    assert [(e["outcome"], e["subject"], e["reason"]) for e in decided] == [
        ("APPROVED", AGENT, "looks right")
    ]
    assert decided[0]["approver"] == decided_by
    assert watched.dialogs == [] and watched.csp == [] and watched.errors == []


async def test_a_denial_with_a_reason_refuses_the_retry(
    served: Served, browser: Browser, workspace: Path
) -> None:
    before = snapshot(workspace)
    request_id = request_id_of(await agent_write(served, "k-1"))
    watched = Watched()
    page = await new_page(browser, watched)
    await sign_in(page, served.link())
    await row(page, request_id).get_by_role("link", name="Review").click()
    await page.fill("#reason", "not this week")
    await page.click("#deny")
    await page.wait_for_url(f"**/console/inbox?decided={request_id}")
    assert await row(page, request_id).count() == 0

    await page.goto(f"{served.base}/console/inbox/{request_id}")
    assert await page.locator("#request-status").inner_text() == DENIED
    assert "not this week" in await page.locator("dl.facts").inner_text()
    assert await page.locator("#approve").count() == 0 and await page.locator("#deny").count() == 0
    assert served.store.get(request_id).status == DENIED

    code, same = refused(await agent_write(served, "k-1"))
    assert (code, same) == ("APPROVAL_INVALID", request_id)
    assert snapshot(workspace) == before
    assert [e["outcome"] for e in served.events("approval_decided")] == ["DENIED"]
    assert watched.dialogs == [] and watched.errors == []


async def test_the_approvers_own_agents_request_offers_no_approve_button(
    served: Served, browser: Browser, workspace: Path
) -> None:
    before = snapshot(workspace)
    request_id = request_id_of(await agent_write(served, "k-1"))
    watched = Watched()
    page = await new_page(browser, watched)
    await sign_in(page, served.link(subject=AGENT, role="admin"))
    await page.goto(f"{served.base}/console/inbox/{request_id}")
    assert await page.locator("#own-request").is_visible()
    assert await page.locator("#approve").count() == 0
    assert await page.locator("#deny").is_visible()

    # The button put back by hand (devtools, a crafted form): the server refuses it.
    await page.evaluate(
        """() => {
          const button = document.createElement("button");
          button.type = "submit"; button.name = "decision"; button.value = "approve";
          button.id = "approve"; button.textContent = "Approve anyway";
          document.querySelector("form.decide .buttons").prepend(button);
        }"""
    )
    async with page.expect_response(lambda r: r.request.method == "POST") as posted:
        await page.click("#approve")
    response = await posted.value
    assert response.status == 403
    assert "your own agent" in await page.locator("main").inner_text()
    assert served.store.get(request_id).status == PENDING
    code, _ = refused(await agent_write(served, "k-1"))
    assert code == "APPROVAL_REQUIRED"
    assert snapshot(workspace) == before
    assert served.events("approval_decided") == []
    assert [e["reason"] for e in served.events("console_refused")] == ["self_approval"]
    assert watched.dialogs == []


async def test_hostile_text_stays_text_and_injected_markup_does_not_run(
    served: Served, browser: Browser
) -> None:
    path = 'scratch/<img src=x onerror=alert("path")><script>alert("path")</script>.md'
    content = "</pre><script>alert('content')</script><img src=x onerror=alert('content')>\n"
    request_id = request_id_of(await agent_write(served, "k-1", path=path, content=content))
    watched = Watched()
    page = await new_page(browser, watched)
    await sign_in(page, served.link())
    listed = await row(page, request_id).inner_text()
    assert '<img src=x onerror=alert("path")>' in listed
    await page.goto(f"{served.base}/console/inbox/{request_id}")
    assert "<script>alert('content')</script>" in await page.locator("#preview").inner_text()
    assert await page.locator("main img, main script").count() == 0
    assert watched.dialogs == [] and watched.csp == []

    # Suppose an escaping bug let markup in: the page's CSP still refuses to run it.
    await page.evaluate(INJECT)
    await page.locator("#injected-img").wait_for(state="attached")
    await page.wait_for_function("() => document.querySelector('#injected-img').complete")
    await page.wait_for_timeout(300)  # a handler that ran would have opened its dialog
    assert watched.dialogs == []
    assert any("inline" in message for message in watched.csp), watched.csp

    # The control: the same injection on a page without the CSP does run, twice.
    control = Watched()
    bare = await new_page(browser, control)
    await bare.set_content("<!doctype html><title>no policy</title><body></body>")
    await bare.evaluate(INJECT)
    await bare.wait_for_function("() => document.querySelector('#injected-img').complete")
    await bare.wait_for_timeout(300)
    assert sorted(control.dialogs) == ["alert: handler ran", "alert: script ran"]
