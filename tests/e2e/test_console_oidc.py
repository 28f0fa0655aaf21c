"""Signing in to the console with the team's identity provider (``console/oidc.py``).

The provider is a real OpenID provider (``tests/clients/oidc_provider.mjs``) on a loopback
port with nexus-mcp's confidential client, whose redirect URIs list the front door's
callback and the console's. nexus-mcp is served in this process over a real socket; a
``Browser`` (an httpx client with its own cookie jar) presses the console's "Sign in with
your identity provider" button, signs in at the provider's login form and comes back.
Accounts whose ``idToken`` overrides make the provider sign ID tokens for another
audience, another nonce, another issuer or long expired: the attacks the relying party's
checks exist for. Every refusal is a fixed sentence, audited, quoting nothing the
provider or the request said.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import httpx
import pytest

from nexus_mcp.console import oidc as console_oidc
from nexus_mcp.console.security import (
    CONTENT_SECURITY_POLICY,
    ConsoleKeys,
    load_console_key,
)
from nexus_mcp.observability.audit import MemoryAuditSink
from nexus_mcp.server import NexusServer
from nexus_mcp.settings import Settings
from tests.support.chromium import Watched, chromium, new_page, screenshot
from tests.support.oidc import Browser, OidcProvider, oidc_provider_fixture

from .access_helpers import serve_settings

pytestmark = pytest.mark.slow

T = TypeVar("T")
CALLBACK = "/console/oidc/callback"
FRONT_SECRET = "console-oidc-client-secret-0123456789"
SIGNING_KEY = "console-oidc-signing-key-0123456789abcdef"
CANARY = "<b>CANARY-from-the-provider</b>"
LEADS = ["leads"]
ACCOUNTS: dict[str, Any] = {
    "lena": {"password": "lena-pw", "email": "lena@example.test", "groups": LEADS},
    "alice": {"password": "alice-pw", "email": "alice@example.test", "groups": ["engineering"]},
    "stranger": {"password": "stranger-pw", "email": "s@example.test", "groups": []},
    # The provider misbehaving: each ID token is otherwise lena's, signed with its own key.
    "eve-aud": {
        "password": "eve-pw",
        "email": "eve@example.test",
        "groups": LEADS,
        "idToken": {"aud": "another-client"},
    },
    "eve-nonce": {
        "password": "eve-pw",
        "email": "eve@example.test",
        "groups": LEADS,
        "idToken": {"nonce": "a-nonce-of-another-sign-in"},
    },
    "eve-iss": {
        "password": "eve-pw",
        "email": "eve@example.test",
        "groups": LEADS,
        "idToken": {"iss": "http://127.0.0.1:1"},
    },
    "eve-exp": {
        "password": "eve-pw",
        "email": "eve@example.test",
        "groups": LEADS,
        "idToken": {"exp": 1_000_000_000, "iat": 999_999_000},
    },
    "eve-azp": {
        "password": "eve-pw",
        "email": "eve@example.test",
        "groups": LEADS,
        "idToken": {"azp": "another-client"},
    },
    "eve-two-audiences": {
        "password": "eve-pw",
        "email": "eve@example.test",
        "groups": LEADS,
        "idToken": {"aud": ["nexus-front", "another-client"]},
    },
}


@pytest.fixture(scope="module")
def nexus_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def provider_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    base = f"http://127.0.0.1:{request.getfixturevalue('nexus_port')}"
    return {
        "accounts": ACCOUNTS,
        "clients": [
            {
                "client_id": "nexus-front",
                "client_secret": FRONT_SECRET,
                "redirect_uris": [f"{base}/auth/callback", f"{base}{CALLBACK}"],
                "grant_types": ["authorization_code", "refresh_token"],
                "scope": "openid email groups",
            }
        ],
    }


oidc = oidc_provider_fixture(provider_config)


class Served:
    def __init__(self, server: NexusServer, base: str, issuer: str, audit: MemoryAuditSink):
        self.server = server
        self.base = base
        self.issuer = issuer
        self.audit = audit

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e.to_record() for e in self.audit.events if e.event == name]

    def refusals(self) -> list[str]:
        return [e["reason"] for e in self.events("console_refused")]


def settings_for(base: str, issuer: str, tmp_path: Path, workspace: Path, port: int) -> Settings:
    return Settings(
        mode="prod",
        transport="http",
        workspace=workspace,
        data_dir=tmp_path / "data",
        port=port,
        console={"approver_roles": ["evaluator"]},
        auth={
            "base_url": base,
            "oidc_proxy": {
                "issuer": issuer,
                "client_id": "nexus-front",
                "client_secret": FRONT_SECRET,
                "signing_key": SIGNING_KEY,
                "scopes": ["openid", "email", "groups"],
            },
            "claims": {
                "subject": "email",
                "rules": [
                    {"group": "leads", "role": "evaluator"},
                    {"group": "engineering", "role": "editor"},
                ],
            },
        },
    )


@pytest.fixture
async def served(
    oidc: OidcProvider, nexus_port: int, tmp_path: Path, workspace: Path
) -> AsyncIterator[Served]:
    base = f"http://127.0.0.1:{nexus_port}"
    audit = MemoryAuditSink()
    settings = settings_for(base, oidc.issuer, tmp_path, workspace, nexus_port)
    async with serve_settings(settings, audit) as (server, _url):
        yield Served(server, base, oidc.issuer, audit)


async def in_thread(work: Callable[[], T]) -> T:
    """The sync ``Browser`` off the event loop that serves nexus-mcp in this process."""
    return await asyncio.to_thread(work)


def press_sign_in(browser: Browser, served: Served) -> httpx.Response:
    request = browser.client.build_request(
        "POST", f"{served.base}/console/oidc/start", headers={"Origin": served.base}
    )
    return browser.send(request)


def to_callback(browser: Browser, served: Served, login: str) -> str:
    """Press the button, sign in at the provider; the callback URL it sends the browser to."""
    started = press_sign_in(browser, served)
    assert started.status_code == 303, started.text
    return browser.sign_in(
        started.headers["location"],
        login=login,
        password=ACCOUNTS[login]["password"],
        stop_at_prefix=served.base + CALLBACK,
        provider_origin=served.issuer,
    )


def flow_cookie(browser: Browser) -> str:
    value = browser.cookies.get(console_oidc.FLOW_COOKIE)
    assert value, "the sign-in in progress has no cookie"
    return str(value)


def signed_in_as(page: str) -> str | None:
    found = re.search(r'<span title="console role">([^<]*)</span>', page)
    return found.group(1) if found else None


def refusal_of(page: httpx.Response) -> str:
    found = re.search(r'<p id="refusal">([^<]*)</p>', page.text)
    assert found is not None, page.text
    return html.unescape(found.group(1))


def session_cookie_set(response: httpx.Response) -> bool:
    return any(
        header.startswith("nexus_console=") for header in response.headers.get_list("set-cookie")
    )


async def test_an_approver_signs_in_with_the_provider_and_sees_the_inbox(served: Served) -> None:
    def flow() -> tuple[httpx.Response, httpx.Response, httpx.Response, str]:
        with Browser() as browser:
            signin = browser.get(f"{served.base}/console/signin")
            callback = to_callback(browser, served, "lena")
            landed = browser.get(callback)
            inbox = browser.get(f"{served.base}/console/inbox")
            return signin, landed, inbox, callback

    signin, landed, inbox, callback = await in_thread(flow)
    assert 'action="/console/oidc/start"' in signin.text
    # Browsers hold the button's redirect to form-action: the provider's origin, there only.
    assert signin.headers["content-security-policy"] == CONTENT_SECURITY_POLICY.replace(
        "form-action 'self'", f"form-action 'self' {served.issuer}"
    )
    assert landed.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert inbox.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    query = parse_qs(urlsplit(callback).query)
    assert set(query) >= {"code", "state"}
    # A same-origin page that moves on (no script), carrying the Strict session cookie.
    assert landed.status_code == 200
    assert '<meta http-equiv="refresh" content="0; url=/console/inbox">' in landed.text
    assert "<script>" not in landed.text
    cookies = landed.headers.get_list("set-cookie")
    session = next(c for c in cookies if c.startswith("nexus_console="))
    assert "samesite=strict" in session.lower() and "httponly" in session.lower()
    flow_gone = next(c for c in cookies if c.startswith(f"{console_oidc.FLOW_COOKIE}="))
    assert "max-age=0" in flow_gone.lower()
    assert inbox.status_code == 200
    assert signed_in_as(inbox.text) == "lena@example.test · approver"
    [signed] = served.events("console_signed_in")
    assert signed["subject"] == "lena@example.test" and signed["role"] == "evaluator"
    assert signed["facts"] == {"via": "oidc"}
    assert served.refusals() == []


async def test_the_sign_in_cookie_is_lax_short_lived_and_the_request_uses_pkce(
    served: Served,
) -> None:
    def start() -> httpx.Response:
        with Browser() as browser:
            return press_sign_in(browser, served)

    started = await in_thread(start)
    assert started.status_code == 303
    location = started.headers["location"]
    assert location.startswith(served.issuer)
    query = parse_qs(urlsplit(location).query)
    assert query["code_challenge_method"] == ["S256"]
    assert query["redirect_uri"] == [served.base + CALLBACK]
    assert query["client_id"] == ["nexus-front"]
    assert {"openid", "email", "groups"} <= set(query["scope"][0].split())
    assert len(query["state"][0]) >= 32 and len(query["nonce"][0]) >= 32
    assert query["state"] != query["nonce"]
    [cookie] = started.headers.get_list("set-cookie")
    assert cookie.startswith(f"{console_oidc.FLOW_COOKIE}=")
    lowered = cookie.lower()
    assert "samesite=lax" in lowered and "httponly" in lowered
    assert f"max-age={console_oidc.FLOW_TTL_SECONDS}" in lowered
    assert "path=/console" in lowered


@pytest.mark.parametrize(
    ("login", "message", "reason"),
    [
        ("alice", "your role has no access to the console", "no_console_role"),
        ("stranger", console_oidc.NO_ROLE, "oidc_no_role"),
    ],
)
async def test_a_person_without_a_console_role_is_refused(
    served: Served, login: str, message: str, reason: str
) -> None:
    def flow() -> tuple[httpx.Response, httpx.Response]:
        with Browser() as browser:
            landed = browser.get(to_callback(browser, served, login))
            return landed, browser.get(f"{served.base}/console/inbox")

    landed, inbox = await in_thread(flow)
    assert landed.status_code == 403
    assert refusal_of(landed) == message
    assert not session_cookie_set(landed)
    assert inbox.status_code == 303  # back to the sign-in page
    assert served.events("console_signed_in") == []
    assert served.refusals() == [reason]


@pytest.mark.parametrize(
    ("login", "reason"),
    [
        ("eve-aud", "oidc_id_token"),
        ("eve-two-audiences", "oidc_id_token"),
        ("eve-azp", "oidc_id_token"),
        ("eve-iss", "oidc_id_token"),
        ("eve-exp", "oidc_id_token"),
        ("eve-nonce", "oidc_nonce"),
    ],
)
async def test_an_id_token_not_made_for_this_sign_in_is_refused(
    served: Served, login: str, reason: str
) -> None:
    def flow() -> tuple[httpx.Response, str]:
        with Browser() as browser:
            callback = to_callback(browser, served, login)
            return browser.get(callback), callback

    landed, callback = await in_thread(flow)
    assert landed.status_code == 403
    assert refusal_of(landed) == console_oidc.UNUSABLE
    assert not session_cookie_set(landed)
    [code] = parse_qs(urlsplit(callback).query)["code"]
    assert code not in landed.text
    assert served.events("console_signed_in") == []
    assert served.refusals() == [reason]
    assert code not in json.dumps([e.to_record() for e in served.audit.events])


async def test_a_tampered_state_is_refused_and_spends_the_sign_in(served: Served) -> None:
    def flow() -> tuple[httpx.Response, httpx.Response]:
        with Browser() as browser:
            callback = to_callback(browser, served, "lena")
            query = parse_qs(urlsplit(callback).query)
            forged = {**{k: v[0] for k, v in query.items()}, "state": "A" * 43}
            tampered = browser.get(f"{served.base}{CALLBACK}?{urlencode(forged)}")
            # The flow's cookie went with the refusal: the genuine answer fails closed too.
            return tampered, browser.get(callback)

    tampered, genuine = await in_thread(flow)
    assert tampered.status_code == 400
    assert refusal_of(tampered) == console_oidc.EXPIRED
    assert "A" * 43 not in tampered.text
    assert not session_cookie_set(tampered) and not session_cookie_set(genuine)
    assert genuine.status_code == 400
    assert served.refusals() == ["oidc_state", "oidc_state"]


async def test_an_answer_naming_another_issuer_is_never_exchanged(served: Served) -> None:
    """RFC 9207: the provider names itself in its answer; another name is a mix-up."""

    keys = ConsoleKeys(
        load_console_key(served.server.runtime.settings, {}), session_ttl_seconds=600
    )

    def flow() -> tuple[httpx.Response, httpx.Response]:
        with Browser() as browser:
            callback = to_callback(browser, served, "lena")
            pending = keys.open_flow(
                flow_cookie(browser), fields=console_oidc.FLOW_FIELDS, max_age=600
            )
            assert pending is not None
            query = {k: v[0] for k, v in parse_qs(urlsplit(callback).query).items()}
            assert query["iss"] == served.issuer
            mixed = {**query, "iss": "http://127.0.0.1:1"}
            refused = browser.get(f"{served.base}{CALLBACK}?{urlencode(mixed)}")
        # The code was never spent: with the flow's verifier the provider still takes it.
        return refused, httpx.post(
            f"{served.issuer}/token",
            data={
                "grant_type": "authorization_code",
                "code": query["code"],
                "code_verifier": pending["verifier"],
                "redirect_uri": served.base + CALLBACK,
            },
            auth=("nexus-front", FRONT_SECRET),
            timeout=10,
        )

    refused, exchange = await in_thread(flow)
    assert refused.status_code == 400
    assert refusal_of(refused) == console_oidc.UNUSABLE
    assert not session_cookie_set(refused)
    assert served.refusals() == ["oidc_issuer"]
    assert exchange.status_code == 200, exchange.text
    assert exchange.json()["id_token"]


async def test_a_tampered_flow_cookie_is_refused(served: Served) -> None:
    def flow() -> httpx.Response:
        with Browser() as browser:
            callback = to_callback(browser, served, "lena")
            value = flow_cookie(browser)
            browser.cookies.set(
                console_oidc.FLOW_COOKIE, value[:-2] + "xy", domain="127.0.0.1", path="/console"
            )
            return browser.get(callback)

    landed = await in_thread(flow)
    assert landed.status_code == 400
    assert refusal_of(landed) == console_oidc.EXPIRED
    assert served.refusals() == ["oidc_state"]


async def test_a_replayed_callback_is_refused(served: Served) -> None:
    def flow() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        with Browser() as browser:
            callback = to_callback(browser, served, "lena")
            kept = flow_cookie(browser)
            first = browser.get(callback)
        # Someone holding both the answer and the flow's cookie sends them again.
        with Browser() as replayer:
            replayer.cookies.set(
                console_oidc.FLOW_COOKIE, kept, domain="127.0.0.1", path="/console"
            )
            replayed = replayer.get(callback)
        with Browser() as bare:
            return first, replayed, bare.get(callback)

    first, replayed, bare = await in_thread(flow)
    assert first.status_code == 200 and session_cookie_set(first)
    assert replayed.status_code == 400
    assert refusal_of(replayed) == console_oidc.REPLAYED
    assert not session_cookie_set(replayed)
    assert bare.status_code == 400
    assert refusal_of(bare) == console_oidc.EXPIRED
    assert len(served.events("console_signed_in")) == 1
    assert served.refusals() == ["oidc_replay", "oidc_state"]


async def test_the_providers_error_is_never_echoed(served: Served) -> None:
    def flow() -> tuple[httpx.Response, httpx.Response]:
        with Browser() as browser:
            started = press_sign_in(browser, served)
            [state] = parse_qs(urlsplit(started.headers["location"]).query)["state"]
            query = {"error": CANARY, "error_description": CANARY, "state": state}
            crafted = browser.get(f"{served.base}{CALLBACK}?{urlencode(query)}")
        with Browser() as browser:
            # The person cancels at the provider: it answers access_denied, described.
            started = press_sign_in(browser, served)
            page = browser.get(started.headers["location"])
            while page.status_code in (302, 303):
                page = browser.get(urljoin(str(page.url), page.headers["location"]))
            interaction = urlsplit(str(page.url)).path
            answer = browser.get(f"{served.issuer}{interaction}/abort")
            while not answer.headers.get("location", "").startswith(served.base):
                assert answer.status_code in (302, 303), answer.text
                answer = browser.get(urljoin(str(answer.url), answer.headers["location"]))
            cancelled = browser.get(answer.headers["location"])
        return crafted, cancelled

    crafted, cancelled = await in_thread(flow)
    for landed in (crafted, cancelled):
        assert landed.status_code == 403
        assert refusal_of(landed) == console_oidc.DENIED
        assert "CANARY" not in landed.text and "access_denied" not in landed.text
        assert "aborted" not in landed.text.lower()
        assert not session_cookie_set(landed)
    assert served.refusals() == ["oidc_denied", "oidc_denied"]
    records = json.dumps([e.to_record() for e in served.audit.events])
    assert "CANARY" not in records and "aborted" not in records.lower()


async def test_a_sign_in_started_from_another_site_is_refused(served: Served) -> None:
    def flow() -> list[httpx.Response]:
        with Browser() as browser:
            answers = []
            for headers in (
                {"Origin": "http://evil.example.test"},
                {"Origin": served.base, "Sec-Fetch-Site": "cross-site"},
            ):
                request = browser.client.build_request(
                    "POST", f"{served.base}/console/oidc/start", headers=headers
                )
                answers.append(browser.send(request))
            return answers

    for answer in await in_thread(flow):
        assert answer.status_code == 403
        assert "location" not in answer.headers
        assert console_oidc.FLOW_COOKIE not in answer.headers.get("set-cookie", "")
    # The foreign Origin is refused by the app's own Origin guard before the console.
    assert served.refusals() == ["origin"]


async def test_without_a_provider_there_is_no_provider_sign_in(
    tmp_path: Path, workspace: Path
) -> None:
    audit = MemoryAuditSink()
    settings = Settings(
        mode="prod",
        transport="http",
        workspace=workspace,
        data_dir=tmp_path / "data",
        port=0,
        auth={"jwt_secret": SIGNING_KEY, "audience": "nexus-mcp"},
    )
    async with serve_settings(settings, audit) as (_server, url):
        base = url.rsplit("/", 1)[0]
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            signin = await client.get("/console/signin")
            start = await client.post("/console/oidc/start", headers={"Origin": base})
            callback = await client.get(f"{CALLBACK}?code=x&state=y")
    assert signin.status_code == 200 and "/oidc/start" not in signin.text
    assert signin.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert start.status_code == 404 and callback.status_code == 404


async def test_a_real_browser_signs_in_with_the_button(served: Served) -> None:
    """Chromium itself: the button's redirect to the provider passes the sign-in page's
    form-action, the Lax flow cookie comes back with the provider's redirect, and the
    Strict session cookie set on that cross-site answer is sent once the same-origin page
    moves on to the inbox."""
    watched = Watched()
    async with chromium() as browser:
        page = await new_page(browser, watched)
        await page.goto(f"{served.base}/console/signin")
        await screenshot(page, "signin-provider")
        await page.click("#oidc-signin")
        await page.wait_for_url(f"{served.issuer}/interaction/**")
        await page.fill("input[name=login]", "lena")
        await page.fill("input[name=password]", ACCOUNTS["lena"]["password"])
        await page.click("button[type=submit]")
        await page.wait_for_url(f"{served.base}/console/inbox")
        who = await page.text_content('span[title="console role"]')
    assert who == "lena@example.test · approver"
    assert watched.csp == [] and watched.errors == [] and watched.dialogs == []
    assert served.refusals() == []
