"""The console's inbox over a real socket: sign-in, roles, CSRF, and a decision that runs once.

An agent (a real MCP client with a bearer token) sends a write the policy sends to
approval; the request waits; a person signs in to ``/console`` with a one-time link (an
httpx client keeping cookies, as a browser would), reads the diff and approves; the
agent's retry runs once. Around that path, the console's own defences: the link is spent
once, forms need the session's CSRF token and the console's own origin, roles bound what
each person may do, nobody approves their own agent's request, and hostile text from the
agent is shown inert. The browser itself drives the same path in test_console_browser.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml

from nexus_mcp.commands.console import login_link
from nexus_mcp.console.security import ConsoleKeys, load_console_key
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer
from nexus_mcp.settings import Settings
from nexus_mcp.stores.approval_requests import APPROVED, DENIED, PENDING

from .access_helpers import AUDIENCE, SECRET, http_client, serve_settings, token
from .conftest import snapshot

pytestmark = pytest.mark.slow

APPROVAL_SECRET = "console-approval-secret-0123456789abcdef-01"
META_REQUEST = "nexus.mcp/approval_request_id"
POLICY = {
    "workspace": {
        "allowed_paths": ["scratch/**"],
        "allowed_operations": ["write", "edit", "delete"],
        "require_approval": True,
    }
}
AGENT = "agent-7"
WRITE = {"path": "scratch/plan.md", "content": "line one\nline 2, approved\n"}
ENV = {"NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET}


class Served:
    def __init__(self, server: NexusServer, url: str, audit: MemoryAuditSink) -> None:
        self.server = server
        self.url = url
        self.base = url.rsplit("/", 1)[0]
        self.audit = audit

    @property
    def settings(self) -> Settings:
        return self.server.runtime.settings

    @property
    def store(self) -> Any:
        return self.server.runtime.state.approval_requests

    def link(self, *, subject: str | None = None, role: str = "admin") -> str:
        if subject is None:
            return login_link(self.settings, self.base)
        keys = ConsoleKeys(load_console_key(self.settings, ENV), session_ttl_seconds=600)
        return f"{self.base}/console/login?t={keys.mint_link(subject=subject, role=role)}"

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e.to_record() for e in self.audit.events if e.event == name]


@pytest.fixture
async def served(tmp_path: Path, workspace: Path) -> AsyncIterator[Served]:
    (workspace / "scratch").mkdir(exist_ok=True)
    (workspace / "scratch" / "plan.md").write_text("line one\nline two\n", encoding="utf-8")
    config = tmp_path / "nexus.yaml"
    config.write_text(yaml.safe_dump({"write_policies": POLICY}), encoding="utf-8")
    audit = MemoryAuditSink()
    settings = Settings(
        mode="prod",
        transport="http",
        workspace=workspace,
        data_dir=tmp_path / "data",
        auth={"jwt_secret": SECRET, "audience": AUDIENCE},
        console={"viewer_roles": ["viewer"]},
        port=0,
    )
    async with serve_settings(settings, audit, config_file=config, env=ENV) as (server, url):
        yield Served(server, url, audit)


async def agent_write(served: Served, key: str, **changes: Any) -> dict[str, Any]:
    bearer = token(AGENT, role="editor")
    async with http_client(served.url, bearer) as client:
        result = await client.call_tool_mcp(
            "nexus_write_file", {**WRITE, **changes, "idempotency_key": key}
        )
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def request_id_of(result: dict[str, Any]) -> str:
    assert result["isError"] is True, result
    assert json.loads(result["content"][0]["text"])["code"] == "APPROVAL_REQUIRED"
    found = (result.get("_meta") or {}).get(META_REQUEST)
    assert isinstance(found, str)
    return found


async def sign_in(browser: httpx.AsyncClient, link: str) -> str:
    """Open the link, press Sign in; returns the session's CSRF token."""
    page = await browser.get(link)
    assert page.status_code == 200
    token_value = parse_qs(urlsplit(link).query)["t"][0]
    done = await browser.post(
        "/console/login", data={"t": token_value}, headers={"Origin": str(browser.base_url)}
    )
    assert done.status_code == 303, done.text
    inbox = await browser.get("/console/inbox")
    assert inbox.status_code == 200
    return csrf_of(inbox.text)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


def client_for(served: Served) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=served.base, follow_redirects=False, timeout=30)


async def test_an_approver_decides_in_the_console_and_the_retry_runs_once(
    served: Served, workspace: Path
) -> None:
    before = snapshot(workspace)
    request_id = request_id_of(await agent_write(served, "k-1"))
    assert snapshot(workspace) == before
    async with client_for(served) as browser:
        csrf = await sign_in(browser, served.link())
        listing = (await browser.get("/console/inbox")).text
        assert request_id in listing and "nexus_write_file" in listing
        state = (await browser.get("/console/inbox/state")).json()
        assert state["pending"] == 1
        page = (await browser.get(f"/console/inbox/{request_id}")).text
        assert "+line 2, approved" in page and "-line two" in page
        assert 'id="approve"' in page
        # No token, no origin of its own: both refused, nothing decided.
        assert (
            await browser.post(f"/console/inbox/{request_id}", data={"decision": "approve"})
        ).status_code == 403
        cross = await browser.post(
            f"/console/inbox/{request_id}",
            data={"decision": "approve", "csrf": csrf},
            headers={"Origin": "http://evil.example"},
        )
        assert cross.status_code == 403  # the app's own Origin guard refuses it first
        fetched = await browser.post(
            f"/console/inbox/{request_id}",
            data={"decision": "approve", "csrf": csrf},
            headers={"Origin": served.base, "Sec-Fetch-Site": "cross-site"},
        )
        assert fetched.status_code == 403
        assert served.store.get(request_id).status == PENDING
        decided = await browser.post(
            f"/console/inbox/{request_id}",
            data={"decision": "approve", "csrf": csrf, "reason": "looks right"},
            headers={"Origin": served.base},
        )
        assert decided.status_code == 303, decided.text
    assert served.store.get(request_id).status == APPROVED
    ran = await agent_write(served, "k-1")
    assert ran.get("isError") is not True, ran
    assert (workspace / "scratch" / "plan.md").read_text(encoding="utf-8") == WRITE["content"]
    # The approval was for that one call: the same arguments under a new key wait again.
    assert request_id_of(await agent_write(served, "k-2")) != request_id
    decided_events = served.events("approval_decided")
    assert [(e["outcome"], e["transport"], e["subject"]) for e in decided_events] == [
        ("APPROVED", "console", AGENT)
    ]
    assert decided_events[0]["approver"].startswith("local:")
    refused = [e["reason"] for e in served.events("console_refused")]
    assert refused == ["csrf", "origin"]
    assert [e["outcome"] for e in served.events("console_signed_in")] == ["OK"]


async def test_a_denied_request_refuses_the_retry(served: Served, workspace: Path) -> None:
    before = snapshot(workspace)
    request_id = request_id_of(await agent_write(served, "k-1"))
    async with client_for(served) as browser:
        csrf = await sign_in(browser, served.link())
        done = await browser.post(
            f"/console/inbox/{request_id}",
            data={"decision": "deny", "csrf": csrf, "reason": "not this week"},
            headers={"Origin": served.base},
        )
        assert done.status_code == 303
        again = await browser.post(
            f"/console/inbox/{request_id}",
            data={"decision": "approve", "csrf": csrf},
            headers={"Origin": served.base},
        )
        assert again.status_code == 409 and "decided already" in again.text
    assert served.store.get(request_id).status == DENIED
    retry = await agent_write(served, "k-1")
    assert json.loads(retry["content"][0]["text"])["code"] == "APPROVAL_INVALID"
    assert snapshot(workspace) == before


async def test_a_login_link_works_once_and_only_from_the_console_itself(served: Served) -> None:
    link = served.link()
    value = parse_qs(urlsplit(link).query)["t"][0]
    async with client_for(served) as browser:
        for _ in range(3):  # opening (or prefetching) the link spends nothing
            assert (await browser.get(link)).status_code == 200
        cross = await browser.post(
            "/console/login", data={"t": value}, headers={"Origin": "http://evil.example"}
        )
        assert cross.status_code == 403 and "set-cookie" not in cross.headers
        first = await browser.post(
            "/console/login", data={"t": value}, headers={"Origin": served.base}
        )
        assert first.status_code == 303
        cookie = first.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/console" in cookie
    async with client_for(served) as other:
        second = await other.post(
            "/console/login", data={"t": value}, headers={"Origin": served.base}
        )
        assert second.status_code == 403 and "set-cookie" not in second.headers
        tampered = value[:-2] + ("AA" if not value.endswith("AA") else "BB")
        assert (await other.get(f"/console/login?t={tampered}")).status_code == 403
        assert (await other.get("/console/inbox")).status_code == 303  # to the sign-in page
        assert (await other.post("/console/inbox/x", data={})).status_code == 401


async def test_every_page_carries_the_strict_headers(served: Served) -> None:
    async with client_for(served) as browser:
        await sign_in(browser, served.link())
        for path in ("/console/signin", "/console/inbox", "/console/static/console.js"):
            response = await browser.get(path)
            csp = response.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert "unsafe-inline" not in csp
            assert response.headers["x-frame-options"] == "DENY"
            assert response.headers["x-content-type-options"] == "nosniff"
        assert (await browser.get("/console/static/../security.py")).status_code == 404


async def test_roles_bound_what_each_person_may_do(served: Served) -> None:
    request_id = request_id_of(await agent_write(served, "k-1"))
    async with client_for(served) as viewer:
        csrf = await sign_in(viewer, served.link(subject="carol", role="viewer"))
        page = (await viewer.get(f"/console/inbox/{request_id}")).text
        assert 'id="approve"' not in page and 'id="deny"' not in page
        refused = await viewer.post(
            f"/console/inbox/{request_id}",
            data={"decision": "approve", "csrf": csrf},
            headers={"Origin": served.base},
        )
        assert refused.status_code == 403
    async with client_for(served) as nobody:
        link = served.link(subject="mallory", role="editor")
        value = parse_qs(urlsplit(link).query)["t"][0]
        denied = await nobody.post(
            "/console/login", data={"t": value}, headers={"Origin": served.base}
        )
        assert denied.status_code == 403 and "set-cookie" not in denied.headers
    assert served.store.get(request_id).status == PENDING
    assert {e["reason"] for e in served.events("console_refused")} == {"role", "no_console_role"}


async def test_nobody_approves_their_own_agents_request(served: Served) -> None:
    request_id = request_id_of(await agent_write(served, "k-1"))
    async with client_for(served) as browser:
        csrf = await sign_in(browser, served.link(subject=AGENT, role="admin"))
        page = (await browser.get(f"/console/inbox/{request_id}")).text
        assert 'id="own-request"' in page and 'id="approve"' not in page
        refused = await browser.post(
            f"/console/inbox/{request_id}",
            data={"decision": "approve", "csrf": csrf},
            headers={"Origin": served.base},
        )
        assert refused.status_code == 403 and "your own agent" in refused.text
        assert served.store.get(request_id).status == PENDING
        denied = await browser.post(
            f"/console/inbox/{request_id}",
            data={"decision": "deny", "csrf": csrf},
            headers={"Origin": served.base},
        )
        assert denied.status_code == 303
    assert served.store.get(request_id).status == DENIED


async def test_hostile_text_from_the_agent_is_shown_inert(served: Served, workspace: Path) -> None:
    hostile = 'scratch/<img src=x onerror=alert(1)>"\u202egpj.md'
    content = "</pre><script>alert(1)</script>\u2066x\n"
    request_id = request_id_of(await agent_write(served, "k-1", path=hostile, content=content))
    async with client_for(served) as browser:
        csrf = await sign_in(browser, served.link())
        for path in ("/console/inbox", "/console/inbox/list", f"/console/inbox/{request_id}"):
            html = (await browser.get(path)).text
            assert "<img src=x" not in html and "<script>alert" not in html
            assert "&lt;img src=x onerror=alert(1)&gt;" in html
            assert "\u202e" not in html and "\\u{202e}" in html
        page = (await browser.get(f"/console/inbox/{request_id}")).text
        assert "&lt;/pre&gt;&lt;script&gt;" in page and "\\u{2066}" in page
        long_reason = "<script>" + "r" * 600
        refused = await browser.post(
            f"/console/inbox/{request_id}",
            data={"decision": "deny", "csrf": csrf, "reason": long_reason},
            headers={"Origin": served.base},
        )
        assert refused.status_code == 400 and "<script>" not in refused.text
        assert "rrrrrrrr" not in refused.text


async def test_the_console_can_be_turned_off(tmp_path: Path, workspace: Path) -> None:
    settings = Settings(
        mode="prod",
        transport="http",
        workspace=workspace,
        data_dir=tmp_path / "data",
        auth={"jwt_secret": SECRET, "audience": AUDIENCE},
        console={"enabled": False},
        port=0,
    )
    async with serve_settings(settings, MemoryAuditSink()) as (_server, url):
        async with httpx.AsyncClient(base_url=url.rsplit("/", 1)[0]) as browser:
            assert (await browser.get("/console/signin")).status_code == 404
    assert not (tmp_path / "data" / "console.key").exists()
