"""Bearer tokens over a real socket: RFC 7519 ``exp``/``nbf``/``iat`` on every HTTP entry.

``nexus-mcp serve --transport http`` runs as a subprocess configured only through its
environment (``NEXUS_MCP_AUTH__LEEWAY_SECONDS``, ``NEXUS_MCP_AUTH__ALLOW_TOKENS_WITHOUT_EXP``).
Each token is checked at the MCP endpoint and at ``POST /approvals/mint``, the other route
that takes a bearer token: one verifier serves both, so both must refuse alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.tokens import OMIT, FromNow, RawJson, claims_json, hs256

from .servers import free_port, http_server
from .test_http import initialize_body

pytestmark = pytest.mark.slow

SECRET = "bearer-e2e-secret-0123456789abcdef-0123"
APPROVAL_SECRET = "bearer-e2e-approval-secret-0123456789abcdef"
AUDIENCE = "nexus-bearer-test"
LEEWAY = 30
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def token(**claims: Any) -> str:
    """An admin's token, valid for five minutes, with ``claims`` over it."""
    base: dict[str, Any] = {"sub": "root", "aud": AUDIENCE, "exp": FromNow(300), "role": "admin"}
    return hs256(claims_json({**base, **claims}), SECRET)


def serve(tmp_path_factory: pytest.TempPathFactory, **env: str) -> Iterator[str]:
    workspace = tmp_path_factory.mktemp("ws")
    (workspace / "hello.txt").write_text("hello")
    port = free_port()
    environ = {
        "NEXUS_MCP_MODE": "prod",
        "NEXUS_MCP_AUTH__JWT_SECRET": SECRET,
        "NEXUS_MCP_AUTH__AUDIENCE": AUDIENCE,
        "NEXUS_MCP_APPROVAL_SECRET": APPROVAL_SECRET,
        "NEXUS_MCP_DATA_DIR": str(tmp_path_factory.mktemp("data")),
        **env,
    }
    with http_server(["--workspace", str(workspace)], environ, port=port):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def default_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Defaults: a 30 s leeway, exp required."""
    yield from serve(tmp_path_factory)


@pytest.fixture(scope="module")
def lenient_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """No leeway at all, and tokens without exp allowed."""
    yield from serve(
        tmp_path_factory,
        NEXUS_MCP_AUTH__LEEWAY_SECONDS="0",
        NEXUS_MCP_AUTH__ALLOW_TOKENS_WITHOUT_EXP="true",
    )


def post_initialize(url: str, bearer: str) -> httpx.Response:
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {bearer}"}
    return httpx.post(f"{url}/mcp", json=initialize_body(), headers=headers, timeout=10)


def post_mint(url: str, bearer: str) -> httpx.Response:
    # An empty body: an accepted caller gets 400 (invalid input), a refused one 401.
    headers = {"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"}
    return httpx.post(f"{url}/approvals/mint", content=b"{}", headers=headers, timeout=10)


def assert_refused(url: str, bearer: str) -> None:
    """401 on both entries, and nothing of the token comes back in body or headers."""
    for response in (post_initialize(url, bearer), post_mint(url, bearer)):
        assert response.status_code == 401, response.request.url.path
        echoed = response.text + " ".join(f"{k}: {v}" for k, v in response.headers.items())
        for part in bearer.split("."):
            assert part not in echoed


def assert_accepted(url: str, bearer: str) -> None:
    assert post_initialize(url, bearer).status_code == 200
    assert post_mint(url, bearer).status_code == 400


@pytest.mark.parametrize(
    "claims",
    [
        {},
        {"nbf": FromNow(10)},
        {"iat": FromNow(10)},
        {"nbf": FromNow(-60), "iat": FromNow(-60)},
        {"exp": FromNow(300.5)},
    ],
    ids=["plain", "nbf-inside-leeway", "iat-inside-leeway", "past-nbf-iat", "fractional-exp"],
)
def test_tokens_valid_now_or_inside_the_leeway_are_accepted(
    default_url: str, claims: dict[str, Any]
) -> None:
    assert_accepted(default_url, token(**claims))


@pytest.mark.parametrize(
    "claims",
    [
        {"nbf": FromNow(LEEWAY + 120)},
        {"iat": FromNow(LEEWAY + 120)},
        {"nbf": FromNow(86_400 * 365), "iat": FromNow(0)},
        {"exp": OMIT},
        {"exp": FromNow(-LEEWAY - 120), "iat": FromNow(-3600)},
    ],
    ids=["nbf-beyond-leeway", "iat-beyond-leeway", "nbf-next-year", "no-exp", "expired"],
)
def test_tokens_outside_their_lifetime_get_401(default_url: str, claims: dict[str, Any]) -> None:
    assert_refused(default_url, token(**claims))


HOSTILE_VALUES: dict[str, Any] = {
    "string": "9999999999",
    "true": True,
    "false": False,
    "null": None,
    "list": [9_999_999_999],
    "nan": RawJson("NaN"),
    "infinity": RawJson("Infinity"),
    "overflowing-float": RawJson("1e400"),
    "huge-float": RawJson("1e300"),
    "huge-int": RawJson("1" + "0" * 30),
    "400-digit-int": RawJson("9" * 400),
}


@pytest.mark.parametrize("claim", ["exp", "nbf", "iat"])
@pytest.mark.parametrize("kind", list(HOSTILE_VALUES))
def test_hostile_time_claims_get_401_never_500(default_url: str, claim: str, kind: str) -> None:
    assert_refused(default_url, token(**{claim: HOSTILE_VALUES[kind]}))


def test_without_exp_a_token_is_accepted_only_where_the_setting_allows_it(
    default_url: str, lenient_url: str
) -> None:
    bearer = token(exp=OMIT)
    assert_refused(default_url, bearer)
    assert_accepted(lenient_url, bearer)


@pytest.mark.parametrize(
    "claims",
    [
        {"nbf": FromNow(10)},
        {"iat": FromNow(10)},
        {"exp": FromNow(-5)},
        {"exp": None},
        {"exp": RawJson("Infinity")},
        {"exp": OMIT, "nbf": RawJson("NaN")},
    ],
    ids=["nbf-ahead", "iat-ahead", "expired", "exp-null", "exp-infinity", "no-exp-nbf-nan"],
)
def test_with_no_leeway_and_no_exp_required_the_other_checks_still_hold(
    lenient_url: str, claims: dict[str, Any]
) -> None:
    assert_refused(lenient_url, token(**claims))
