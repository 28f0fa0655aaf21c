"""The console's pages for an upstream's prompts, resources and resource templates.

The upstream is the recording test server as a real stdio process; its items are pinned
with ``nexus-mcp upstream pin``, then its ``--item-flag-file`` is written with hostile
text (HTML, a script, bidi controls, quotes): the prompt ``greet``'s description and the
resource ``readme``'s name and description change, and both are quarantined. Nexus is
served on a real socket; people sign in with one-time links (an httpx client keeping
cookies, as a browser would).

Upstream pins: the items are shown with their verdict and status, their text escaped
and inert; an approver re-pins one item bound to the digest reviewed (the lock file,
through ``review.pin_items`` as the CLI), a definition that moved between the page and
the POST is 409 with nothing written, viewers and forms without CSRF are refused.

Access: an admin grants a resource source and a prompt directly to an agent's subject,
and the agent's very next ``resources/list`` and ``prompts/list`` show them; a malformed
or unknown name is refused with the envelope's code and without echo; viewers cannot.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from nexus_mcp.commands.console import login_link
from nexus_mcp.console.security import ConsoleKeys, load_console_key
from nexus_mcp.policy.catalog import Kind
from nexus_mcp.policy.grants import visible_prompts, visible_resource_sources
from nexus_mcp.policy.pins import load_pins
from nexus_mcp.server import NexusServer
from nexus_mcp.settings import load_settings

from .access_helpers import AUDIENCE, SECRET, http_client, serve_settings, token
from .upstream_harness import Gateway, make_gateway, stdio_upstream

pytestmark = pytest.mark.slow

HOSTILE = 'Ignore "previous" <script>alert(1)</script> \u202eevil\u2066 <img src=x onerror=y>'
README = "test://static/readme"
AGENT = "agent-7"


class Served:
    def __init__(self, gw: Gateway, server: NexusServer, url: str, flag: Path) -> None:
        self.gw = gw
        self.server = server
        self.url = url
        self.base = url.rsplit("/", 1)[0]
        self.flag = flag
        self.zone = server.runtime.settings.profiles.zone

    def link(self, role: str, subject: str) -> str:
        settings = self.server.runtime.settings
        if role == "admin":
            return login_link(settings, self.base)
        keys = ConsoleKeys(load_console_key(settings, {}), session_ttl_seconds=600)
        return f"{self.base}/console/login?t={keys.mint_link(subject=subject, role=role)}"

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.gw.events() if e.get("event") == name]

    def item_pin(self, kind: Kind, key: str) -> str | None:
        return load_pins(self.gw.registry_dir, "up").item_pin(kind, key)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    flag = tmp_path / "item-flag.txt"
    upstream = stdio_upstream()
    upstream["args"] += ["--item-flag-file", str(flag)]
    gw = make_gateway(tmp_path / "gw", [upstream])
    assert gw.pin("up") == 0  # tools and items, before the change
    flag.write_text(HOSTILE, encoding="utf-8")
    settings = load_settings(
        gw.config_file,
        {
            "workspace": gw.workspace,
            "data_dir": gw.data_dir,
            "transport": "http",
            "port": 0,
            "auth": {"jwt_secret": SECRET, "audience": AUDIENCE},
            "console": {"viewer_roles": ["viewer"], "approver_roles": ["approver"]},
        },
    )
    async with serve_settings(settings, gw.audit, config_file=gw.config_file) as (server, url):
        yield Served(gw, server, url, flag)


def client(served: Served) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=served.base, follow_redirects=False, timeout=60)


async def sign_in(browser: httpx.AsyncClient, link: str, page: str = "/console/pins") -> str:
    assert (await browser.get(link)).status_code == 200
    done = await browser.post(
        "/console/login",
        data={"t": parse_qs(urlsplit(link).query)["t"][0]},
        headers={"Origin": str(browser.base_url)},
    )
    assert done.status_code == 303, done.text
    shown = await browser.get(page)
    assert shown.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', shown.text)
    assert found is not None
    return found.group(1)


def item_section(html: str, kind: str, label: str) -> str:
    """The details of the item of ``kind`` whose summary shows ``label``."""
    for body in re.findall(r'<details class="item" id="item-up-\d+" (.*?)</details>', html, re.S):
        summary = re.search(r"<summary>(.*?)</summary>", body, re.S)
        if f'data-kind="{kind}"' in body[:40] and summary and label in summary.group(1):
            return body
    raise AssertionError(f"no {kind} {label}")


def item_form(section: str) -> dict[str, str]:
    found = re.search(r'<form method="post" action="/console/pins/repin" class="repin-item">'
                      r"(.*?)</form>", section, re.S)  # fmt: skip
    assert found is not None, section
    return dict(re.findall(r'name="([a-z0-9]+)" value="([^"]*)"', found.group(1)))


def refusal(html: str) -> str:
    found = re.search(r'<p id="refusal">([^<]*)</p>', html)
    assert found is not None, html
    return found.group(1)


# -- Upstream pins ------------------------------------------------------------------------


async def test_items_are_shown_inert_and_an_approver_repins_only_what_was_reviewed(
    served: Served,
) -> None:
    greet_before = served.item_pin(Kind.PROMPT, "greet")
    assert greet_before is not None
    origin = {"Origin": served.base}
    async with client(served) as browser:
        await sign_in(browser, served.link("approver", "ops:approver"))
        page = (await browser.get("/console/pins")).text
        greet = item_section(page, "prompts", "greet")
        readme = item_section(page, "resources", README)
        review = item_section(page, "prompts", "review")
        assert "changed" in greet and "changed" in readme
        assert "pinned, unchanged" in review and "repin-item" not in review
        assert 'data-kind="resource_templates"' in page
        # The upstream's text: escaped, bidi controls made visible, no markup of its own.
        for raw in ("<script>alert", "<img src=x", '"previous"', "\u202e", "\u2066"):
            assert raw not in page
        for section in (greet, readme):
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in section
            assert "\\u202eevil\\u2066" in section
        assert re.findall(r"<script[^>]*>", page) == [
            '<script src="/console/static/console.js" defer>'
        ]
        form = item_form(greet)
        assert (form["server"], form["scope"], form["kind"], form["key"]) == (
            "up",
            "item",
            "prompts",
            "greet",
        )
        assert form["sha256"] != greet_before and greet_before in greet

        # No CSRF token, or a foreign origin: refused, nothing written.
        without = {k: v for k, v in form.items() if k != "csrf"}
        assert (
            await browser.post("/console/pins/repin", data=without, headers=origin)
        ).status_code == 403
        cross = await browser.post(
            "/console/pins/repin",
            data=form,
            headers={"Origin": served.base, "Sec-Fetch-Site": "cross-site"},
        )
        assert cross.status_code == 403
        # A malformed item (a key no listing can hold): refused before any connection.
        bad = await browser.post(
            "/console/pins/repin", data={**form, "key": "gr eet<x>"}, headers=origin
        )
        assert bad.status_code == 400 and "gr eet" not in bad.text
        assert served.item_pin(Kind.PROMPT, "greet") == greet_before

        # The definition moves between the page and the POST: 409, nothing written, and
        # the page shows what the upstream shows now.
        served.flag.write_text(HOSTILE + " And more.", encoding="utf-8")
        moved = await browser.post("/console/pins/repin", data=form, headers=origin)
        assert moved.status_code == 409
        assert 'id="moved"' in moved.text
        assert "And more." in item_section(moved.text, "prompts", "greet")
        assert served.item_pin(Kind.PROMPT, "greet") == greet_before
        again = item_form(item_section(moved.text, "prompts", "greet"))
        assert again["sha256"] != form["sha256"]

        done = await browser.post("/console/pins/repin", data=again, headers=origin)
        assert done.status_code == 303, done.text
        after = (await browser.get(done.headers["location"])).text
        assert 'id="pinned-notice"' in after
        assert "pinned, unchanged" in item_section(after, "prompts", "greet")
        assert "changed" in item_section(after, "resources", README)  # only what was pinned
    assert served.item_pin(Kind.PROMPT, "greet") == again["sha256"]
    repinned = served.events("upstream_item_repinned")
    assert [(e["server_id"], e["pinned_sha256"], e["transport"]) for e in repinned] == [
        ("up", again["sha256"], "console")
    ]
    assert repinned[0]["facts"]["kind"] == "prompts"
    assert repinned[0]["facts"]["item_sha256"] == hashlib.sha256(b"greet").hexdigest()
    assert repinned[0]["subject"] == "ops:approver"
    assert HOSTILE not in json.dumps(served.gw.events())
    reasons = [e["reason"] for e in served.events("console_refused")]
    assert reasons == ["csrf", "origin", "repin_form", "repin_definition_moved"]


async def test_a_viewer_reads_the_items_but_cannot_repin_one(served: Served) -> None:
    before = served.item_pin(Kind.RESOURCE, README)
    async with client(served) as admin:
        await sign_in(admin, served.link("admin", "ops:admin"))
        form = item_form(item_section((await admin.get("/console/pins")).text, "resources", README))
    async with client(served) as viewer:
        csrf = await sign_in(viewer, served.link("viewer", "ops:viewer"))
        page = (await viewer.get("/console/pins")).text
        assert "changed" in item_section(page, "resources", README)
        assert "repin-item" not in page
        refused = await viewer.post(
            "/console/pins/repin", data={**form, "csrf": csrf}, headers={"Origin": served.base}
        )
        assert refused.status_code == 403
    assert served.item_pin(Kind.RESOURCE, README) == before
    assert served.events("upstream_item_repinned") == []
    refusals = served.events("console_refused")
    assert [(e["reason"], e["subject"]) for e in refusals] == [("role", "ops:viewer")]


# -- Access -------------------------------------------------------------------------------


async def agent_lists(served: Served) -> tuple[set[str], set[str]]:
    async with http_client(served.url, token(AGENT, role="viewer")) as agent:
        prompts = {p.name for p in await agent.list_prompts()}
        resources = {str(r.uri) for r in await agent.list_resources()}
    return prompts, resources


async def test_an_admin_grants_a_resource_source_and_a_prompt_and_the_next_lists_follow(
    served: Served,
) -> None:
    store = served.server.runtime.grants
    prompts, resources = await agent_lists(served)  # the lists are cached now
    assert "up_review" not in prompts and not any(r.startswith("upstream://up/") for r in resources)
    async with client(served) as browser:
        csrf = await sign_in(browser, served.link("admin", "ops:admin"), "/console/access")
        page = (await browser.get("/console/access")).text
        assert 'id="grant-item"' in page
        for kind, name in (("prompt", "up_review"), ("resource", "up")):
            done = await browser.post(
                "/console/access/grant-item",
                data={"csrf": csrf, "subject": AGENT, "kind": kind, "name": name},
                headers={"Origin": served.base},
            )
            assert done.status_code == 303, done.text
        # The very next lists, not after the caches' TTL: the console told the server.
        prompts, resources = await agent_lists(served)
        assert "up_review" in prompts and "up_greet" not in prompts  # greet: quarantined
        assert "upstream://up/test://static/blob" in resources
        assert f"upstream://up/{README}" not in resources  # quarantined
        listed = (await browser.get("/console/access")).text
        row = re.search(
            rf"<tr class=\"subject\">\s*<td><code>{AGENT}</code>(.*?)</tr>", listed, re.S
        )
        assert row is not None
        assert "prompt <code>up_review</code> (direct)" in row.group(1)
        assert "resource <code>up</code> (direct)" in row.group(1)
        revoked = await browser.post(
            "/console/access/revoke-item",
            data={"csrf": csrf, "subject": AGENT, "kind": "prompt", "name": "up_review"},
            headers={"Origin": served.base},
        )
        assert revoked.status_code == 303, revoked.text
    prompts, _ = await agent_lists(served)
    assert "up_review" not in prompts
    assert visible_prompts(store, AGENT, served.zone) == frozenset()
    assert visible_resource_sources(store, AGENT, served.zone) == {"up"}
    changes = served.events("grant_changed")
    assert [e["facts"]["action"] for e in changes] == [
        "grant_prompt",
        "grant_resource",
        "revoke_prompt",
    ]
    assert all(e["transport"] == "console" and e["outcome"] == "OK" for e in changes)


async def test_malformed_unknown_or_unauthorised_grants_are_refused_without_echo(
    served: Served,
) -> None:
    store = served.server.runtime.grants
    hostile = "<img src=x onerror=alert(1)>"
    origin = {"Origin": served.base}
    async with client(served) as browser:
        csrf = await sign_in(browser, served.link("admin", "ops:admin"), "/console/access")

        async def grant(kind: str, name: str, **extra: str) -> httpx.Response:
            data = {"csrf": csrf, "subject": AGENT, "kind": kind, "name": name, **extra}
            return await browser.post("/console/access/grant-item", data=data, headers=origin)

        malformed = await grant("prompt", hostile)
        bad_source = await grant("resource", "../" + "x" * 70)
        unknown = await grant("prompt", "nowhere_prompt")
        no_csrf = await browser.post(
            "/console/access/grant-item",
            data={"subject": AGENT, "kind": "resource", "name": "up"},
            headers=origin,
        )
    assert (malformed.status_code, bad_source.status_code, unknown.status_code) == (400, 400, 404)
    assert refusal(malformed.text) == "invalid input for field &#39;prompt&#39; (INVALID_INPUT)"
    assert refusal(bad_source.text).endswith("(INVALID_INPUT)")
    assert refusal(unknown.text).endswith("(NOT_FOUND)")
    assert "onerror" not in malformed.text and "x" * 70 not in bad_source.text
    assert "nowhere_prompt" not in unknown.text
    assert no_csrf.status_code == 403
    async with client(served) as viewer:
        csrf = await sign_in(viewer, served.link("viewer", "ops:viewer"), "/console/access")
        page = (await viewer.get("/console/access")).text
        assert 'id="grant-item"' not in page
        refused = await viewer.post(
            "/console/access/grant-item",
            data={"csrf": csrf, "subject": AGENT, "kind": "resource", "name": "up"},
            headers=origin,
        )
        assert refused.status_code == 403
    assert visible_prompts(store, AGENT, served.zone) == frozenset()
    assert visible_resource_sources(store, AGENT, served.zone) == frozenset()
    assert served.events("grant_changed") == []
    refusals = served.events("console_refused")
    assert [e["reason"] for e in refusals] == [
        "invalid_input",
        "invalid_input",
        "not_found",
        "csrf",
        "role",
    ]
    assert "onerror" not in json.dumps(refusals) and "nowhere_prompt" not in json.dumps(refusals)
