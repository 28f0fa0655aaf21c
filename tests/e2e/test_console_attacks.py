"""Hostile requests against the console over a real socket.

A session cookie carries the console role it was granted at sign-in; the role a person
has *now* (the server's current ``console.*`` mapping of their principal role) is what
decides, so a session made before an admin narrowed the mapping cannot keep powers the
person no longer has. Every answer on a ``/console`` path, including the not-found and
wrong-method answers the HTTP framework gives and a fault inside a page, carries the
console's anti-framing headers and no exception text. A number in a query string that
Python's ``str.isdigit`` accepts but ``int`` cannot read is ignored, not a crash. Races
over a real socket: one login link makes one session, one request gets one decision.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from nexus_mcp.console.security import COOKIE_NAME, ConsoleKeys, load_console_key
from nexus_mcp.ids import new_id
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer
from nexus_mcp.settings import Settings
from nexus_mcp.stores.approval_requests import PENDING, ApprovalRequest

from .access_helpers import AUDIENCE, SECRET, grants_db, serve_settings, tuples_table_missing

pytestmark = pytest.mark.slow

VIEWER = "viewer"


class Served:
    def __init__(self, server: NexusServer, url: str) -> None:
        self.server = server
        self.base = url.rsplit("/", 1)[0]
        settings = server.runtime.settings
        self.keys = ConsoleKeys(load_console_key(settings, {}), session_ttl_seconds=600)
        self.zone = settings.profiles.zone

    def browser(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base, follow_redirects=False, timeout=30)

    def session(self, *, role: str, console_role: str) -> tuple[str, str]:
        """A genuine cookie (signed with the server's key) and its CSRF token."""
        user, cookie = self.keys.new_session(
            subject="person-1",
            log_subject="person-1",
            role=role,
            console_role=console_role,  # type: ignore[arg-type]
            via="link",
        )
        return cookie, user.csrf


@pytest.fixture
async def served(tmp_path: Path, workspace: Path) -> AsyncIterator[Served]:
    data = tmp_path / "data"
    data.mkdir()
    settings = Settings(
        mode="prod",
        transport="http",
        workspace=workspace,
        data_dir=data,
        auth={"jwt_secret": SECRET, "audience": AUDIENCE},
        console={"viewer_roles": [VIEWER]},
        port=0,
    )
    async with serve_settings(settings, MemoryAuditSink()) as (server, url):  # type: ignore[arg-type]
        yield Served(server, url)


# -- privilege: the role a person has now decides ------------------------------------------


async def test_a_session_granted_admin_under_an_older_mapping_cannot_change_grants(
    served: Served,
) -> None:
    # Signed when "viewer" was an admin role; the server now maps it to viewer.
    cookie, csrf = served.session(role=VIEWER, console_role="admin")
    async with served.browser() as browser:
        browser.cookies.set(COOKIE_NAME, cookie, path="/console")
        done = await browser.post(
            "/console/access/assign",
            data={"csrf": csrf, "subject": "agent-9", "profile": "coding"},
            headers={"Origin": served.base},
        )
        assert done.status_code == 403, done.text
        # Reading is still what a viewer may do.
        assert (await browser.get("/console/inbox")).status_code == 200
    assert served.server.runtime.grants.get_assignment("agent-9", served.zone) is None


async def test_a_session_whose_role_lost_the_console_is_signed_out(served: Served) -> None:
    cookie, csrf = served.session(role="developer", console_role="admin")
    async with served.browser() as browser:
        browser.cookies.set(COOKIE_NAME, cookie, path="/console")
        page = await browser.get("/console/inbox")
        assert page.status_code == 303
        assert page.headers["location"].endswith("/console/signin")
        done = await browser.post(
            "/console/access/assign",
            data={"csrf": csrf, "subject": "agent-9", "profile": "coding"},
            headers={"Origin": served.base},
        )
        assert done.status_code == 401
    assert served.server.runtime.grants.get_assignment("agent-9", served.zone) is None


# -- clickjacking: every /console answer forbids framing ------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/console/no-such-page"),
        ("GET", "/console/inbox/a/b"),
        ("PUT", "/console/inbox"),
        ("DELETE", "/console/login"),
        ("GET", "/console/static/../console.js"),
    ],
)
async def test_framework_answers_on_console_paths_forbid_framing(
    served: Served, method: str, path: str
) -> None:
    async with served.browser() as browser:
        answer = await browser.request(method, path)
    assert answer.status_code in (404, 405)
    assert answer.headers.get("x-frame-options") == "DENY"
    assert "frame-ancestors 'none'" in answer.headers.get("content-security-policy", "")
    assert answer.headers.get("x-content-type-options") == "nosniff"


# -- races: one link, one session; one request, one decision --------------------------------


async def test_two_concurrent_posts_of_one_login_link_make_one_session(served: Served) -> None:
    link = served.keys.mint_link(subject="person-1", role="admin")

    async def press() -> httpx.Response:
        async with served.browser() as browser:
            return await browser.post(
                "/console/login", data={"t": link}, headers={"Origin": served.base}
            )

    answers = await asyncio.gather(*(press() for _ in range(6)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [303, 403, 403, 403, 403, 403]
    assert sum(1 for a in answers if "set-cookie" in a.headers) == 1


async def test_concurrent_approve_and_deny_of_one_request_one_wins(served: Served) -> None:
    store = served.server.runtime.state.approval_requests
    now = time.time()
    opened = store.open(
        ApprovalRequest(
            id=new_id(),
            created_at=now,
            expires_at=now + 600,
            tool="nexus_write_file",
            server_id=None,
            subject="agent-9",
            log_subject="agent-9",
            role="developer",
            args_digest="0" * 64,
            target="notes.txt",
            preview="write notes.txt",
            policy_rule=None,
            status=PENDING,
        )
    )
    cookie, csrf = served.session(role="admin", console_role="admin")

    async def decide(decision: str) -> httpx.Response:
        async with served.browser() as browser:
            browser.cookies.set(COOKIE_NAME, cookie, path="/console")
            return await browser.post(
                f"/console/inbox/{opened.id}",
                data={"csrf": csrf, "decision": decision},
                headers={"Origin": served.base},
            )

    answers = await asyncio.gather(*(decide(d) for d in ("approve", "deny") * 4))
    won = [a for a in answers if a.status_code == 303]
    assert len(won) == 1
    assert sorted({a.status_code for a in answers if a not in won}) == [409]
    final = store.get(opened.id)
    assert final is not None and final.status in ("approved", "denied")
    assert re.search(opened.id, won[0].headers["location"])


# -- query numbers: a digit Python's int() does not read is no crash -----------------------


@pytest.mark.parametrize("path", ["/console/audit?page=%C2%B2", "/console/pins?pinned=%C2%B2"])
async def test_a_superscript_digit_in_a_number_is_ignored_not_a_server_error(
    served: Served, path: str
) -> None:
    cookie, _ = served.session(role="admin", console_role="admin")
    async with served.browser() as browser:
        browser.cookies.set(COOKIE_NAME, cookie, path="/console")
        answer = await browser.get(path)
    assert answer.status_code == 200, answer.text
    assert answer.headers.get("x-frame-options") == "DENY"


# -- a fault inside a page: the console's headers, no exception text -----------------------


async def test_a_store_fault_on_a_page_is_a_plain_500_with_the_console_headers(
    served: Served,
) -> None:
    cookie, _ = served.session(role="admin", console_role="admin")
    async with served.browser() as browser:
        browser.cookies.set(COOKIE_NAME, cookie, path="/console")
        with tuples_table_missing(grants_db(served.server)):
            answer = await browser.get("/console/access")
    assert answer.status_code == 500
    assert answer.headers.get("x-frame-options") == "DENY"
    assert "frame-ancestors 'none'" in answer.headers.get("content-security-policy", "")
    assert "tuples" not in answer.text and "sqlite" not in answer.text.lower()


# -- sign-out: a copy of the cookie is dead too ---------------------------------------------


async def test_a_signed_out_session_is_refused_even_from_a_copy_of_its_cookie(
    served: Served,
) -> None:
    cookie, csrf = served.session(role="admin", console_role="admin")
    jar = {COOKIE_NAME: cookie}
    async with served.browser() as browser:
        browser.cookies.update(jar)
        assert (await browser.get("/console/inbox")).status_code == 200
        out = await browser.post(
            "/console/logout", data={"csrf": csrf}, headers={"Origin": served.base}
        )
        assert out.status_code == 303
    async with served.browser() as thief:
        thief.cookies.update(jar)  # the cookie as copied before the sign-out
        again = await thief.get("/console/inbox")
        assert again.status_code == 303 and again.headers["location"].endswith("/signin")
        post = await thief.post(
            "/console/access/assign",
            data={"csrf": csrf, "subject": "mallory", "profile": "full"},
            headers={"Origin": served.base},
        )
        assert post.status_code == 401
    # Another session of the same person is not affected.
    other, _ = served.session(role="admin", console_role="admin")
    async with served.browser() as browser:
        browser.cookies.update({COOKIE_NAME: other})
        assert (await browser.get("/console/inbox")).status_code == 200
