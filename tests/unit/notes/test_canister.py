"""The hosted backend against a real loopback canister: headers, one request, sanitized errors."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from nexus_mcp.errors import ConfigError, UpstreamError
from nexus_mcp.notes.canister import CanisterBackend
from nexus_mcp.notes.views import read_note_view
from nexus_mcp.principal import Principal
from tests.support.loopback import drip_fed_response
from tests.unit.notes.conftest import LoopbackCanister, streaming_response

TOKEN = "tok-CANARY-TOKEN-1"
SECRET = "gw-CANARY-SECRET-2"
BODY_CANARY = "CANARY-BODY-3"
FM_CANARY = "CANARY-FRONTMATTER-4"
CALLER = Principal(
    subject="actor",
    vault_id="vault-facets",
    user_id="google:actor",
    canister_user_id="google:owner",
)
NOTE = {
    "path": "/Users/private/CANARY-UPSTREAM-PATH.md",
    "frontmatter": json.dumps(json.dumps({"title": "Hosted Title", "api_key": FM_CANARY})),
    "body": f"# Intro\n\n{BODY_CANARY} must not leak.\n\n## Next\n",
}
ENCODED = "/api/v1/notes/inbox%2Fhello%20world.md"


@pytest.fixture
async def backend(loopback_canister: LoopbackCanister) -> AsyncIterator[CanisterBackend]:
    client = CanisterBackend(
        loopback_canister.base_url + "/",
        token=TOKEN,
        gateway_secret=SECRET,
        connect_timeout=2.0,
        read_timeout=0.3,
        total_timeout=2.0,
        max_response_bytes=64 * 1024,
    )
    yield client
    await client.aclose()


def _assert_sanitized(error: UpstreamError) -> None:
    text = f"{error} {error.message} {error.facts} {error!r}"
    assert "CANARY" not in text
    assert "inbox" not in text


async def test_one_valid_call_sends_exactly_one_get_with_the_canister_headers(
    backend: CanisterBackend, loopback_canister: LoopbackCanister
) -> None:
    loopback_canister.serve_note(ENCODED, NOTE)
    view = await read_note_view(backend, "outline", "inbox/hello world.md", CALLER)
    assert view == {
        "schema": "knowtation.note_outline/v1",
        "path": "inbox/hello world.md",
        "title": "Hosted Title",
        "headings": [
            {"level": 1, "text": "Intro", "id": "h1-intro-0001"},
            {"level": 2, "text": "Next", "id": "h2-next-0002"},
        ],
        "truncated": False,
    }
    assert len(loopback_canister.requests) == 1
    request = loopback_canister.requests[0]
    assert (request.method, request.raw_path) == ("GET", ENCODED)
    headers = request.headers
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert headers["x-vault-id"] == "vault-facets"
    assert headers["x-user-id"] == "google:owner"
    assert headers["x-gateway-auth"] == SECRET
    assert headers["accept"] == "application/json"
    assert headers["content-type"] == "application/json"
    assert "cookie" not in headers


async def test_the_user_header_falls_back_to_user_id_and_no_secret_means_no_header(
    loopback_canister: LoopbackCanister,
) -> None:
    loopback_canister.serve_note("/api/v1/notes/a.md", {"body": "# A", "frontmatter": None})
    plain = CanisterBackend(loopback_canister.base_url, token=TOKEN, read_timeout=1.0)
    try:
        caller = Principal(subject="s", vault_id="v", user_id="only-user")
        await plain.read_note("a.md", caller)
    finally:
        await plain.aclose()
    headers = loopback_canister.requests[0].headers
    assert headers["x-user-id"] == "only-user"
    assert "x-gateway-auth" not in headers


async def test_a_token_provider_supplies_the_callers_token(
    loopback_canister: LoopbackCanister,
) -> None:
    loopback_canister.serve_note("/api/v1/notes/a.md", {"body": "", "frontmatter": "{}"})

    async def token_for(caller: Principal) -> str:
        return f"token-of-{caller.subject}"

    client = CanisterBackend(loopback_canister.base_url, token_provider=token_for)
    try:
        await client.read_note("a.md", Principal(subject="alice", vault_id="v", user_id="u"))
    finally:
        await client.aclose()
    assert loopback_canister.requests[0].headers["authorization"] == "Bearer token-of-alice"


@pytest.mark.parametrize(
    "raw_path", ["../secret.md", "\\Users\\owner\\secret.md", "/abs.md", "", None]
)
async def test_an_invalid_path_sends_no_request(
    backend: CanisterBackend, loopback_canister: LoopbackCanister, raw_path: object
) -> None:
    with pytest.raises(UpstreamError) as caught:
        await read_note_view(backend, "section_source", raw_path, CALLER)
    assert caught.value.message == "Invalid path"
    assert loopback_canister.requests == []


@pytest.mark.parametrize("status", [401, 403, 404])
async def test_auth_and_missing_statuses_pass_through_as_upstream_status(
    backend: CanisterBackend, loopback_canister: LoopbackCanister, status: int
) -> None:
    loopback_canister.serve(
        ENCODED, lambda _r: JSONResponse({"error": f"{BODY_CANARY} {TOKEN}"}, status_code=status)
    )
    with pytest.raises(UpstreamError) as caught:
        await read_note_view(backend, "tree", "inbox/hello world.md", CALLER)
    assert caught.value.message == f"Upstream {status}"
    _assert_sanitized(caught.value)
    assert len(loopback_canister.requests) == 1


def _slow(_request: Request) -> Any:
    async def wait() -> Response:
        await asyncio.wait_for(asyncio.Event().wait(), timeout=2.0)
        return JSONResponse(NOTE)

    async def guarded() -> Response:
        try:
            return await wait()
        except TimeoutError:
            return JSONResponse(NOTE)

    return guarded()


@pytest.mark.parametrize(
    "behaviour",
    [
        lambda _r: JSONResponse({"error": BODY_CANARY}, status_code=500),
        lambda _r: JSONResponse({"error": BODY_CANARY}, status_code=400),
        lambda _r: Response(f"{{not json {BODY_CANARY}", media_type="application/json"),
        lambda _r: Response("NaN", media_type="application/json"),
        lambda _r: JSONResponse([NOTE]),
        lambda _r: JSONResponse({"body": 42, "frontmatter": FM_CANARY}),
        lambda _r: JSONResponse({"body": "# x", "frontmatter": f'"{FM_CANARY}"x"'}),
        lambda _r: Response(status_code=204),
        lambda _r: Response(
            b"{}", headers={"content-encoding": "gzip"}, media_type="application/json"
        ),
        _slow,
    ],
    ids=[
        "500",
        "400",
        "malformed",
        "nan",
        "array",
        "body-type",
        "fm-quoted",
        "204",
        "gzip",
        "timeout",
    ],
)
async def test_everything_else_is_a_sanitized_runtime_failure(
    backend: CanisterBackend, loopback_canister: LoopbackCanister, behaviour: Any
) -> None:
    loopback_canister.serve(ENCODED, behaviour)
    with pytest.raises(UpstreamError) as caught:
        await read_note_view(backend, "section_source", "inbox/hello world.md", CALLER)
    assert caught.value.message == "Runtime failure"
    _assert_sanitized(caught.value)
    assert len(loopback_canister.requests) == 1


async def test_redirects_are_never_followed(
    backend: CanisterBackend, loopback_canister: LoopbackCanister
) -> None:
    loopback_canister.serve(
        ENCODED, lambda _r: RedirectResponse("/api/v1/notes/other.md", status_code=302)
    )
    loopback_canister.serve_note("/api/v1/notes/other.md", NOTE)
    with pytest.raises(UpstreamError) as caught:
        await backend.read_note("inbox/hello world.md", CALLER)
    assert caught.value.message == "Runtime failure"
    assert [r.raw_path for r in loopback_canister.requests] == [ENCODED]


@pytest.mark.parametrize(
    "behaviour",
    [
        lambda _r: Response(
            b'{"body": "' + b"x" * (70 * 1024) + b'"}', media_type="application/json"
        ),
        lambda _r: streaming_response([b'{"body": "'] + [b"x" * 8192] * 10 + [b'"}']),
    ],
    ids=["content-length", "chunked"],
)
async def test_a_response_past_the_byte_cap_is_refused(
    backend: CanisterBackend, loopback_canister: LoopbackCanister, behaviour: Any
) -> None:
    loopback_canister.serve(ENCODED, behaviour)
    with pytest.raises(UpstreamError) as caught:
        await backend.read_note("inbox/hello world.md", CALLER)
    assert caught.value.message == "Runtime failure"
    assert caught.value.facts["reason"] == "response_too_large"


async def test_the_output_path_is_the_request_path_never_the_upstream_one(
    backend: CanisterBackend, loopback_canister: LoopbackCanister
) -> None:
    loopback_canister.serve_note("/api/v1/notes/safe.md", NOTE)
    for kind in ("outline", "tree", "section_source", "facets"):
        view = await read_note_view(backend, kind, "safe.md", CALLER)
        assert view["path"] == "safe.md"
        assert "CANARY" not in json.dumps(view)
    assert len(loopback_canister.requests) == 4


async def test_cookies_set_by_the_canister_are_not_sent_back(
    backend: CanisterBackend, loopback_canister: LoopbackCanister
) -> None:
    def with_cookie(_request: Request) -> Response:
        response = JSONResponse(NOTE)
        response.set_cookie("session", "CANARY-COOKIE")
        return response

    loopback_canister.serve("/api/v1/notes/a.md", with_cookie)
    await backend.read_note("a.md", CALLER)
    await backend.read_note("a.md", CALLER)
    assert all("cookie" not in r.headers for r in loopback_canister.requests)


async def test_a_principal_without_vault_or_user_sends_no_request(
    backend: CanisterBackend, loopback_canister: LoopbackCanister
) -> None:
    for caller in (Principal(subject="s", user_id="u"), Principal(subject="s", vault_id="v")):
        with pytest.raises(UpstreamError) as caught:
            await backend.read_note("a.md", caller)
        assert caught.value.message == "Runtime failure"
    assert loopback_canister.requests == []


async def test_canaries_never_reach_logs(
    backend: CanisterBackend, loopback_canister: LoopbackCanister, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    loopback_canister.serve_note("/api/v1/notes/CANARY-PATH.md", NOTE)
    await read_note_view(backend, "section_source", "CANARY-PATH.md", CALLER)
    loopback_canister.serve(
        "/api/v1/notes/CANARY-PATH.md", lambda _r: JSONResponse({}, status_code=500)
    )
    with pytest.raises(UpstreamError):
        await read_note_view(backend, "section_source", "CANARY-PATH.md", CALLER)
    assert "CANARY" not in caplog.text


@pytest.mark.parametrize("url", ["ftp://host", "http://", "http://host/?q=1", "not a url"])
def test_a_malformed_canister_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError):
        CanisterBackend(url, token="t")


def test_exactly_one_of_token_and_token_provider_is_required() -> None:
    with pytest.raises(ConfigError):
        CanisterBackend("http://127.0.0.1:1")


@pytest.mark.parametrize(
    "prefix", [b"", b'{"body": "' + BODY_CANARY.encode()], ids=["nothing-yet", "half-a-body"]
)
async def test_a_reply_drip_fed_past_the_total_deadline_is_a_runtime_failure(
    loopback_canister: LoopbackCanister, prefix: bytes
) -> None:
    # Every byte lands well inside the 0.3 s read timeout: only the total deadline ends it.
    loopback_canister.serve(ENCODED, lambda _r: drip_fed_response(prefix))
    backend = CanisterBackend(
        loopback_canister.base_url,
        token=TOKEN,
        connect_timeout=0.5,
        read_timeout=0.3,
        total_timeout=0.6,
    )
    try:
        with pytest.raises(UpstreamError) as caught:
            await read_note_view(backend, "section_source", "inbox/hello world.md", CALLER)
    finally:
        await backend.aclose()
    assert caught.value.message == "Runtime failure"
    assert caught.value.facts["reason"] == "TimeoutError"  # the total deadline, not a read
    _assert_sanitized(caught.value)
    assert len(loopback_canister.requests) == 1


@pytest.mark.parametrize(
    "timeouts",
    [
        {"connect_timeout": 2.0, "read_timeout": 0.3, "total_timeout": 1.0},
        {"connect_timeout": 0.5, "read_timeout": 3.0, "total_timeout": 1.0},
        {"connect_timeout": 0.5, "read_timeout": 0.5, "total_timeout": 0.0},
        {"connect_timeout": 0.5, "read_timeout": 0.5, "total_timeout": -1.0},
    ],
    ids=["connect-longer", "read-longer", "zero-total", "negative-total"],
)
def test_a_total_timeout_shorter_than_its_parts_is_a_config_error(
    timeouts: dict[str, float],
) -> None:
    with pytest.raises(ConfigError):
        CanisterBackend("http://127.0.0.1:1", token="t", **timeouts)
