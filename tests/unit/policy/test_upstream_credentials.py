"""Per-caller upstream credentials in ``upstreams:`` (token_exchange, per_principal): what
the configuration accepts and refuses, and how their secrets resolve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nexus_mcp.errors import ConfigError
from nexus_mcp.policy.upstreams import is_token_endpoint, load_upstreams, resolve_secrets

CANARY = "sk-canary-creds-41aa"


def http(credentials: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "server_id": "web",
        "transport": "http",
        "url": "https://tickets.example/mcp",
        "credentials": credentials,
        **extra,
    }


def exchange(**extra: Any) -> dict[str, Any]:
    return {
        "type": "token_exchange",
        "exchange": {
            "token_url": "https://idp.example/oauth2/token",
            "client_id": "nexus-gateway",
            "client_secret": {"env": "EXCHANGE_SECRET"},
            "audience": "https://tickets.example/mcp",
            **extra,
        },
    }


def load(raw: Any, mode: str = "prod") -> Any:
    return load_upstreams(raw, mode=mode, native_server_id="nexus")


def problems(raw: Any, mode: str = "prod") -> str:
    with pytest.raises(ConfigError) as caught:
        load(raw, mode)
    message = str(caught.value)
    assert CANARY not in message
    return message


def test_a_token_exchange_upstream_is_accepted_with_its_defaults() -> None:
    (server,) = load([http(exchange(scope=["tickets.read"]))]).servers
    creds = server.credentials
    assert creds.per_caller
    assert creds.exchange is not None
    assert creds.exchange.client_auth_method == "client_secret_basic"
    assert creds.exchange.resource is None
    assert creds.exchange.scope == ("tickets.read",)
    assert creds.gateway_token is None


def test_a_per_principal_upstream_is_accepted() -> None:
    (server,) = load(
        [
            http(
                {
                    "type": "per_principal",
                    "principals": {"alice": {"env": "ALICE"}, "bob": {"file": "/run/bob"}},
                    "gateway_token": {"env": "GW"},
                }
            )
        ]
    ).servers
    assert server.credentials.per_caller
    assert set(server.credentials.principals or {}) == {"alice", "bob"}


@pytest.mark.parametrize(
    ("upstream", "problem"),
    [
        (  # the caller's token would leave over plain http
            http(exchange(token_url=f"http://idp.example/token?{CANARY}")),
            "exchange.token_url must be an https:// URL",
        ),
        (http(exchange(token_url="http://idp.example/token")), "must be an https:// URL"),
        (http(exchange(token_url="https://user:pw@idp.example/t")), "must be an https:// URL"),
        (http(exchange(token_url="https://idp.example/t#frag")), "must be an https:// URL"),
        (http(exchange(token_url="http://127.attacker.example/t")), "must be an https:// URL"),
        (http(exchange(audience=None)), "needs audience or resource"),
        (http(exchange(resource="not a uri")), "absolute URI without a fragment"),
        (http(exchange(resource="https://t.example/#x")), "absolute URI without a fragment"),
        (http(exchange(scope=['bad"scope'])), "not an OAuth scope token"),
        (http(exchange(client_id="")), "client_id"),
        (http(exchange(timeout_seconds=0)), "timeout_seconds"),
        (http({"type": "token_exchange"}), "type 'token_exchange' needs exchange"),
        (
            http({**exchange(), "token": {"env": "X"}}),
            "type 'token_exchange' does not take token",
        ),
        (http({"type": "per_principal"}), "type 'per_principal' needs principals"),
        (http({"type": "per_principal", "principals": {}}), "needs at least one subject"),
        (
            http({"type": "per_principal", "principals": {" ": {"env": "A"}}}),
            "a subject is empty",
        ),
        (
            http({"type": "bearer", "token": {"env": "T"}, "gateway_token": {"env": "G"}}),
            "type 'bearer' does not take gateway_token",
        ),
        (
            http({"type": "per_principal", "principals": {"a": {"env": "A"}}}, shared=True),
            "a shared session cannot carry each caller's own credential",
        ),
        (
            http(exchange(), shared=True),
            "a shared session cannot carry each caller's own credential",
        ),
    ],
)
def test_nonsense_is_refused(upstream: dict[str, Any], problem: str) -> None:
    assert problem in problems([upstream])


def test_token_exchange_on_a_stdio_upstream_is_refused() -> None:
    raw = {
        "server_id": "up",
        "transport": "stdio",
        "command": "python",
        "credentials": exchange(),
    }
    assert "transport 'stdio' takes no credentials" in problems([raw])
    per = {**raw, "credentials": {"type": "per_principal", "principals": {"a": {"env": "A"}}}}
    assert "transport 'stdio' takes no credentials" in problems([per])


def test_inline_secrets_are_refused_in_prod_and_warned_in_dev() -> None:
    raw = [
        http(
            {
                "type": "per_principal",
                "principals": {"alice": CANARY},
                "gateway_token": CANARY,
            }
        ),
        {**http(exchange(client_secret=CANARY)), "server_id": "x", "prefix": "x_"},
    ]
    message = problems(raw)
    assert "`upstreams.web.credentials.principals`: inline secrets are refused" in message
    assert "`upstreams.web.credentials.gateway_token`: inline secrets" in message
    assert "`upstreams.x.credentials.exchange.client_secret`: inline secrets" in message
    assert "alice" not in message  # a subject is the caller's, not the config's to show
    warnings = load(raw, mode="dev").warnings
    assert len(warnings) == 3
    assert all(CANARY not in w for w in warnings)


def test_env_references_are_taken_for_every_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALICE_TOKEN", "alice-upstream-token")
    monkeypatch.setenv("EXCHANGE_SECRET", "exchange-secret")
    raw = [
        http({"type": "per_principal", "principals": {"alice": "${ALICE_TOKEN}"}}),
        {**http(exchange(client_secret="${EXCHANGE_SECRET}")), "server_id": "x", "prefix": "x_"},
    ]
    per, exch = load(raw).servers
    assert resolve_secrets(per, {"ALICE_TOKEN": "a1"}).principals["alice"].get_secret_value() == (
        "a1"
    )
    assert resolve_secrets(exch, {"EXCHANGE_SECRET": "s1"}).client_secret is not None
    unset = [http({"type": "per_principal", "principals": {"alice": "${NOT_SET_ANYWHERE}"}})]
    assert "NOT_SET_ANYWHERE" in problems(unset)


def test_secrets_resolve_and_a_missing_one_stops_start_up(tmp_path: Path) -> None:
    bob = tmp_path / "bob"
    bob.write_text("bob-token\n")
    (per,) = load(
        [
            http(
                {
                    "type": "per_principal",
                    "principals": {"alice": {"env": "ALICE"}, "bob": {"file": str(bob)}},
                    "gateway_token": {"env": "GW"},
                }
            )
        ]
    ).servers
    resolved = resolve_secrets(per, {"ALICE": "alice-token", "GW": "gw-token"})
    assert {k: v.get_secret_value() for k, v in resolved.principals.items()} == {
        "alice": "alice-token",
        "bob": "bob-token",
    }
    assert resolved.headers["Authorization"].get_secret_value() == "Bearer gw-token"
    assert set(resolved.values()) >= {"alice-token", "bob-token", "Bearer gw-token"}
    assert "alice-token" not in repr(resolved)
    with pytest.raises(ConfigError, match="env:ALICE is not set"):
        resolve_secrets(per, {"GW": "gw-token"})
    (exch,) = load([http(exchange())]).servers
    with pytest.raises(ConfigError, match="env:EXCHANGE_SECRET is not set"):
        resolve_secrets(exch, {})
    resolved = resolve_secrets(exch, {"EXCHANGE_SECRET": "s3cret"})
    assert resolved.headers == {}  # no gateway_token: the gateway's own session sends none
    assert resolved.values() == ["s3cret"]
    (missing_ca,) = load([http(exchange(ca_file=str(tmp_path / "nope.pem")))]).servers
    with pytest.raises(ConfigError, match=r"exchange\.ca_file is not a file"):
        resolve_secrets(missing_ca, {"EXCHANGE_SECRET": "s"})


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://idp.example/token", True),
        ("http://127.0.0.1:8080/token", True),
        ("http://localhost/token", True),
        ("http://[::1]:9/token", True),
        ("http://idp.example/token", False),
        ("http://127.0.0.1.nip.io/token", False),
        ("ftp://idp.example/token", False),
        ("https://idp.example/token?x=1", False),
        ("https:///token", False),
        ("https://idp.example/to ken", False),
    ],
)
def test_a_token_endpoint_is_https_or_loopback(url: str, ok: bool) -> None:
    assert is_token_endpoint(url) is ok
