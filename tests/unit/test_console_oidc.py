"""The console's identity-provider sign-in, piece by piece (console/oidc.py and the flow
cookie of console/security.py); test_console_oidc.py in e2e drives the whole flow."""

from __future__ import annotations

import time

import pytest
from itsdangerous import URLSafeTimedSerializer
from starlette.requests import Request

from nexus_mcp.console.oidc import (
    FLOW_COOKIE,
    FLOW_FIELDS,
    SECURE_FLOW_COOKIE,
    flow_cookie_name,
    id_token_algorithms,
)
from nexus_mcp.console.security import ConsoleKeys

KEY = b"k" * 48
FLOW = {"state": "s" * 43, "nonce": "n" * 43, "verifier": "v" * 86}


def keys(key: bytes = KEY) -> ConsoleKeys:
    return ConsoleKeys(key, session_ttl_seconds=600)


def request(scheme: str = "http") -> Request:
    return Request(
        {
            "type": "http",
            "method": "GET",
            "scheme": scheme,
            "path": "/console/oidc/callback",
            "headers": [(b"host", b"127.0.0.1:8765")],
            "query_string": b"",
        }
    )


@pytest.mark.parametrize(
    ("advertised", "accepted"),
    [
        (None, ("RS256",)),
        ("RS256", ("RS256",)),  # not a list: the default, never its characters
        (["RS256", "ES256"], ("RS256", "ES256")),
        (["none", "HS256"], ("RS256",)),  # neither unsigned nor secret-keyed tokens
        (["HS256", "PS256", "none"], ("PS256",)),
        (["EdDSA"], ("EdDSA",)),
    ],
)
def test_id_token_algorithms_are_the_providers_asymmetric_ones(
    advertised: object, accepted: tuple[str, ...]
) -> None:
    assert id_token_algorithms(advertised) == accepted


def test_a_sealed_flow_opens_with_the_same_key_only() -> None:
    sealed = keys().seal_flow(FLOW)
    assert keys().open_flow(sealed, fields=FLOW_FIELDS, max_age=600) == FLOW
    assert keys(b"o" * 48).open_flow(sealed, fields=FLOW_FIELDS, max_age=600) is None
    assert keys().open_flow(sealed[:-2] + "xy", fields=FLOW_FIELDS, max_age=600) is None
    assert keys().open_flow(None, fields=FLOW_FIELDS, max_age=600) is None
    assert keys().open_flow("x" * 5000, fields=FLOW_FIELDS, max_age=600) is None


def test_a_flow_is_not_a_session_nor_a_login_link() -> None:
    """Each use has its own salt: no signed value of one passes as another."""
    console = keys()
    _, session = console.new_session(
        subject="a", log_subject="a", role="admin", console_role="admin", via="link"
    )
    link = console.mint_link(subject="a", role="admin")
    assert console.open_flow(session, fields=("sid",), max_age=600) is None
    assert console.open_flow(link, fields=("sub",), max_age=600) is None
    assert console.read_session(console.seal_flow(FLOW)) is None
    assert console.read_link(console.seal_flow({"sub": "a", "role": "admin", "jti": "j"})) is None


def test_an_old_or_incomplete_flow_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    sealed = keys().seal_flow(FLOW)
    later = time.time() + 601
    monkeypatch.setattr(time, "time", lambda: later)
    assert keys().open_flow(sealed, fields=FLOW_FIELDS, max_age=600) is None
    monkeypatch.undo()
    partial = keys().seal_flow({"state": "s", "nonce": ""})
    assert keys().open_flow(partial, fields=FLOW_FIELDS, max_age=600) is None
    odd = URLSafeTimedSerializer(KEY, salt="nexus-console-oidc-flow").dumps(["s", "n", "v"])
    assert keys().open_flow(odd, fields=FLOW_FIELDS, max_age=600) is None


def test_the_flow_cookie_is_host_bound_over_https() -> None:
    assert flow_cookie_name(request()) == FLOW_COOKIE
    assert flow_cookie_name(request("https")) == SECURE_FLOW_COOKIE
    assert flow_cookie_name(request(), "https://console.example") == SECURE_FLOW_COOKIE
