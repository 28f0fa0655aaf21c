"""The console's Access, Audit and Health pages over a real socket.

An admin signs in with a one-time link (an httpx client keeping cookies, as a browser
would), assigns a profile to an agent's subject and revokes it; the agent (a real MCP
client with a bearer token) sees the profile's tools on its very next ``tools/list`` and
no longer sees them after the revoke, well within the visible-tools cache's TTL. Viewers
and approvers cannot change grants, forms need the session's CSRF token and the console's
own origin, and unknown profiles are refused without echoing them. The audit page filters
the real JSONL audit file, shows a call's whole story, and renders hostile values inert;
the health page shows the state store as ``/readyz`` does.
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

from nexus_mcp.console.security import ConsoleKeys, load_console_key
from nexus_mcp.observability.audit import AuditEvent, JsonlAuditSink, MemoryAuditSink
from nexus_mcp.server import NexusServer
from nexus_mcp.settings import Settings

from .access_helpers import AUDIENCE, SECRET, http_client, list_as, serve_settings, token

pytestmark = pytest.mark.slow

AGENT = "agent-9"
CODING_ONLY = "nexus_write_file"  # in the "coding" profile, not in "minimal" (the fallback)
ADMIN, APPROVER, VIEWER = "admin", "approver", "viewer"


class FileAndMemory(MemoryAuditSink):
    """The server's own JSONL audit file (what the pages read), and a copy to assert on."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.file = JsonlAuditSink(path)

    def emit(self, event: AuditEvent) -> None:
        super().emit(event)
        self.file.emit(event)

    def emit_many(self, events: Any) -> None:
        super().emit_many(events)
        self.file.emit_many(events)

    def close(self) -> None:
        self.file.close()


class Served:
    def __init__(self, server: NexusServer, url: str, audit: FileAndMemory) -> None:
        self.server = server
        self.url = url
        self.base = url.rsplit("/", 1)[0]
        self.audit = audit
        self.keys = ConsoleKeys(load_console_key(self.settings, {}), session_ttl_seconds=600)

    @property
    def settings(self) -> Settings:
        return self.server.runtime.settings

    @property
    def zone(self) -> str:
        return self.settings.profiles.zone

    def assignment(self, subject: str) -> str | None:
        return self.server.runtime.grants.get_assignment(subject, self.zone)

    def link(self, role: str, subject: str = "person-1") -> str:
        return f"{self.base}/console/login?t={self.keys.mint_link(subject=subject, role=role)}"

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e.to_record() for e in self.audit.events if e.event == name]


@pytest.fixture
async def served(tmp_path: Path, workspace: Path) -> AsyncIterator[Served]:
    data = tmp_path / "data"
    settings = Settings(
        mode="prod",
        transport="http",
        workspace=workspace,
        data_dir=data,
        auth={"jwt_secret": SECRET, "audience": AUDIENCE},
        console={"viewer_roles": [VIEWER], "approver_roles": [APPROVER]},
        port=0,
    )
    data.mkdir()
    audit = FileAndMemory(settings.audit_path)
    async with serve_settings(settings, audit) as (server, url):  # type: ignore[arg-type]
        yield Served(server, url, audit)


def client_for(served: Served) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=served.base, follow_redirects=False, timeout=30)


async def sign_in(browser: httpx.AsyncClient, link: str) -> str:
    """Open the link, press Sign in; returns the session's CSRF token."""
    assert (await browser.get(link)).status_code == 200
    done = await browser.post(
        "/console/login",
        data={"t": parse_qs(urlsplit(link).query)["t"][0]},
        headers={"Origin": str(browser.base_url)},
    )
    assert done.status_code == 303, done.text
    page = await browser.get("/console/access")
    assert page.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


async def post(
    browser: httpx.AsyncClient, served: Served, path: str, **fields: str
) -> httpx.Response:
    return await browser.post(path, data=fields, headers={"Origin": served.base})


def refusal(html: str) -> str:
    found = re.search(r'<p id="refusal">([^<]*)</p>', html)
    assert found is not None, html
    return found.group(1)


# -- Access ------------------------------------------------------------------------------


async def test_an_admin_assigns_and_revokes_and_the_agent_s_next_list_follows(
    served: Served,
) -> None:
    bearer = token(AGENT)
    assert CODING_ONLY not in await list_as(served.url, bearer)  # its role's profile
    async with client_for(served) as browser:
        csrf = await sign_in(browser, served.link(ADMIN))
        page = (await browser.get("/console/access")).text
        assert 'id="assign"' in page and "<code>coding</code>" in page
        done = await post(
            browser, served, "/console/access/assign", csrf=csrf, subject=AGENT, profile="coding"
        )
        assert done.status_code == 303, done.text
        assert served.assignment(AGENT) == "coding"
        # The next list, not one after the cache's TTL (300 s here): the console told it.
        assert CODING_ONLY in await list_as(served.url, bearer)
        listed = (await browser.get("/console/access?done=assigned")).text
        assert f"<code>{AGENT}</code>" in listed and "Profile assigned" in listed
        revoked = await post(browser, served, "/console/access/revoke", csrf=csrf, subject=AGENT)
        assert revoked.status_code == 303, revoked.text
    assert served.assignment(AGENT) is None
    assert CODING_ONLY not in await list_as(served.url, bearer)
    changes = served.events("grant_changed")
    assert [e["facts"]["action"] for e in changes] == ["assign", "revoke_profile"]
    assert changes[0]["facts"]["profile"] == "coding"
    assert {e["facts"]["grantee"] for e in changes} == {AGENT}
    assert all(e["transport"] == "console" and e["outcome"] == "OK" for e in changes)
    signed_in = served.events("console_signed_in")[0]["subject"]
    assert all(e["subject"] == signed_in for e in changes)
    assert SECRET not in json.dumps(changes)


async def test_a_direct_grant_is_revoked_from_the_list(served: Served) -> None:
    store = served.server.runtime.grants
    from nexus_mcp.policy.grants import grant_tool  # the CLI's own operation

    grant_tool(store, AGENT, CODING_ONLY, served.zone)
    served.server.runtime.access.forget()
    bearer = token(AGENT)
    assert CODING_ONLY in await list_as(served.url, bearer)
    async with client_for(served) as browser:
        csrf = await sign_in(browser, served.link(ADMIN))
        page = (await browser.get("/console/access")).text
        assert f'name="tool" value="{CODING_ONLY}"' in page
        done = await post(
            browser, served, "/console/access/revoke", csrf=csrf, subject=AGENT, tool=CODING_ONLY
        )
        assert done.status_code == 303, done.text
    assert CODING_ONLY not in await list_as(served.url, bearer)
    assert [e["facts"]["tool_name"] for e in served.events("grant_changed")] == [CODING_ONLY]


@pytest.mark.parametrize("role", [VIEWER, APPROVER])
async def test_viewers_and_approvers_cannot_change_grants(served: Served, role: str) -> None:
    async with client_for(served) as browser:
        csrf = await sign_in(browser, served.link(role))
        page = (await browser.get("/console/access")).text
        assert 'id="assign"' not in page and "Revoke" not in page
        refused = await post(
            browser, served, "/console/access/assign", csrf=csrf, subject=AGENT, profile="full"
        )
        assert refused.status_code == 403
        assert "change grants" in refusal(refused.text)
    assert served.assignment(AGENT) is None
    assert served.events("grant_changed") == []
    assert [e["reason"] for e in served.events("console_refused")] == ["role"]


async def test_a_grant_form_needs_the_csrf_token_and_the_console_s_origin(
    served: Served,
) -> None:
    fields = {"subject": AGENT, "profile": "full"}
    async with client_for(served) as browser:
        csrf = await sign_in(browser, served.link(ADMIN))
        missing = await post(browser, served, "/console/access/assign", **fields)
        wrong = await post(browser, served, "/console/access/assign", csrf="x" + csrf, **fields)
        cross = await browser.post(
            "/console/access/assign",
            data={"csrf": csrf, **fields},
            headers={"Origin": "http://evil.example"},
        )
        # The server's own Origin guard refuses that one before the console sees it; a
        # request a browser marks cross-site reaches the console's check.
        fetched = await browser.post(
            "/console/access/revoke",
            data={"csrf": csrf, "subject": AGENT},
            headers={"Origin": served.base, "Sec-Fetch-Site": "cross-site"},
        )
    assert [r.status_code for r in (missing, wrong, cross, fetched)] == [403] * 4
    assert served.assignment(AGENT) is None
    reasons = [e["reason"] for e in served.events("console_refused")]
    assert reasons == ["csrf", "csrf", "origin"]
    assert served.events("grant_changed") == []


async def test_unknown_profiles_and_bad_subjects_are_refused_without_echo(
    served: Served,
) -> None:
    hostile = "<img src=x onerror=alert(1)>"
    async with client_for(served) as browser:
        csrf = await sign_in(browser, served.link(ADMIN))
        unknown = await post(
            browser, served, "/console/access/assign", csrf=csrf, subject=AGENT, profile=hostile
        )
        too_long = await post(
            browser, served, "/console/access/assign", csrf=csrf, subject="a" * 257, profile="full"
        )
        spaced = await post(
            browser, served, "/console/access/assign", csrf=csrf, subject=hostile, profile="full"
        )
        nobody = await post(
            browser, served, "/console/access/revoke", csrf=csrf, subject="never-granted"
        )
    assert (unknown.status_code, too_long.status_code, spaced.status_code) == (400, 400, 400)
    assert nobody.status_code == 404
    assert refusal(unknown.text).startswith("unknown profile")
    for answer in (unknown, spaced, nobody):
        assert "onerror" not in answer.text and "never-granted" not in answer.text
    assert "a" * 257 not in too_long.text
    assert served.assignment(AGENT) is None
    reasons = [e["reason"] for e in served.events("console_refused")]
    assert reasons == ["unknown_profile", "subject", "subject", "unknown_subject"]


# -- Audit -------------------------------------------------------------------------------

HOSTILE_SUBJECT = "<script>alert(1)</script>\u202egnp.exe"


def planted(cid: str, ts: str, event: str, **fields: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "event": event,
        "tool_call_id": cid + "-" + event,
        "correlation_id": cid,
        "tool": fields.pop("tool", "nexus_read_file"),
        "ts": ts,
        **fields,
    }


PLANTED = [
    planted("c-1", "2026-01-01T10:00:00.000000+00:00", "tool_call_started", subject="alice"),
    planted(
        "c-1", "2026-01-01T10:00:01.000000+00:00", "tool_call_finished", subject="alice",
        outcome="OK", args={"path": "notes/a.md"},
    ),
    planted(
        "c-2", "2026-01-01T11:00:00.000000+00:00", "tool_call_blocked", subject="bob",
        tool="nexus_write_file", outcome="POLICY_DENIED", reason="outside_allowed_paths",
    ),
    planted(
        "c-3", "2026-01-02T09:00:00.000000+00:00", "tool_call_finished",
        subject=HOSTILE_SUBJECT, tool="x\u202etool", outcome="OK",
    ),
]  # fmt: skip


def plant(served: Served) -> None:
    with served.settings.audit_path.open("a", encoding="utf-8") as handle:
        for record in PLANTED:
            handle.write(json.dumps(record) + "\n")
        handle.write("not json at all\n")


def calls_in(html: str) -> list[str]:
    return re.findall(r'href="/console/audit/call/([^"]+)"', html)


async def test_audit_filters_each_narrow_the_rows(served: Served) -> None:
    plant(served)
    async with client_for(served) as browser:
        await sign_in(browser, served.link(VIEWER))

        async def found(**query: str) -> list[str]:
            page = await browser.get("/console/audit", params=query)
            assert page.status_code == 200, page.text
            return calls_in(page.text)

        everything = await found()
        # Newest first: the sign-in (written after the planted records), then those.
        assert everything[1:] == ["c-3", "c-2", "c-1", "c-1"]
        assert await found(subject="alice") == ["c-1", "c-1"]
        assert await found(tool="nexus_write_file") == ["c-2"]
        assert await found(outcome="POLICY_DENIED") == ["c-2"]
        assert await found(correlation_id="c-3") == ["c-3"]
        window = {"since": "2026-01-01T10:30", "until": "2026-01-01T23:00"}
        assert await found(**window) == ["c-2"]
        assert await found(since="2026-01-02T00:00", subject="alice") == []
        # The sign-in this test made is in the file too, under the person's subject.
        person = served.events("console_signed_in")[0]
        assert await found(subject=person["subject"]) == [person["correlation_id"]]
        bad = await browser.get("/console/audit", params={"since": "yesterday-ish"})
        assert bad.status_code == 400 and "yesterday-ish" not in bad.text
        long = await browser.get("/console/audit", params={"tool": "t" * 300})
        assert long.status_code == 400 and "t" * 300 not in long.text


async def test_a_call_s_story_shows_every_record_of_it(served: Served) -> None:
    plant(served)
    async with client_for(served) as browser:
        await sign_in(browser, served.link(VIEWER))
        story = (await browser.get("/console/audit/call/c-1")).text
        assert story.count('<dl class="facts story">') == 2
        assert story.index("tool_call_started") < story.index("tool_call_finished")
        assert "notes/a.md" in story  # what the record holds, and no more
        # A real call's story: the agent reads a file, the server records it.
        async with http_client(served.url, token(AGENT)) as client:
            await client.call_tool_mcp("nexus_list_files", {"path": "."})
        real = [e for e in served.audit.events if e.event == "tool_call_finished"][-1]
        page = (await browser.get(f"/console/audit/call/{real.correlation_id}")).text
        assert "tool_call_started" in page and "tool_call_finished" in page
        assert "nexus_list_files" in page and SECRET not in page
        assert (await browser.get("/console/audit/call/none-such")).status_code == 200
        assert (await browser.get("/console/audit/call/%3Cx%3E")).status_code == 404


async def test_hostile_values_in_the_audit_render_inert(served: Served) -> None:
    plant(served)
    async with client_for(served) as browser:
        await sign_in(browser, served.link(VIEWER))
        for path in ("/console/audit", "/console/audit/call/c-3"):
            page = (await browser.get(path)).text
            assert "<script>alert" not in page
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
            assert "\u202e" not in page and "\\u{202e}" in page


# -- Health ------------------------------------------------------------------------------


async def test_health_shows_the_store_registry_and_recent_refusals(served: Served) -> None:
    async with client_for(served) as browser:
        csrf = await sign_in(browser, served.link(VIEWER))
        refused = await post(
            browser, served, "/console/access/assign", csrf=csrf, subject=AGENT, profile="full"
        )
        assert refused.status_code == 403
        page = (await browser.get("/console/health")).text
    assert re.search(r'id="status">ready<', page)
    assert re.search(r'id="store">ready · backend <code>embedded</code>', page)
    assert "none configured" in page  # this server has no upstream gateway
    registry = served.server.runtime.registry_info()
    assert registry is not None
    for server_id, info in registry.items():
        assert f"<code>{server_id}</code>" in page and info["digest"] in page
    refusals = re.search(r'<table class="list" id="refusals">(.*?)</table>', page, re.S)
    assert refusals is not None
    assert re.search(r"<td>console</td><td>role</td><td>1</td>", refusals.group(1))
