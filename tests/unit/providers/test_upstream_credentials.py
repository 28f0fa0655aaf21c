"""A caller's session of a per-caller credential type carries that caller's credential
and nothing else: never the gateway's own, never a session without one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import SecretStr

from nexus_mcp.policy.upstreams import ResolvedSecrets, UpstreamConfig
from nexus_mcp.providers.upstream.sessions import (
    GATEWAY_SESSION,
    UpstreamFailure,
    session_headers,
)

CALLER = ("principal", "alice", "admin", "", "")


@dataclass
class Host:
    """The two things ``session_headers`` reads of a ``SessionHost``."""

    config: UpstreamConfig
    secrets: ResolvedSecrets


def host(credentials: dict[str, Any]) -> Host:
    config = UpstreamConfig.model_validate(
        {
            "server_id": "up",
            "transport": "http",
            "url": "https://up.example/mcp",
            "credentials": credentials,
        }
    )
    own = {"Authorization": SecretStr("Bearer gateway-own")}
    return Host(config, ResolvedSecrets(headers=own))


PER_PRINCIPAL = {"type": "per_principal", "principals": {"alice": {"env": "A"}}}


def test_a_caller_session_carries_only_its_callers_credential() -> None:
    server: Any = host(PER_PRINCIPAL)
    assert session_headers(server, CALLER, SecretStr("alice-token")) == {
        "Authorization": "Bearer alice-token"
    }
    assert session_headers(server, GATEWAY_SESSION, None) == {"Authorization": "Bearer gateway-own"}


def test_a_caller_session_without_a_credential_is_never_opened() -> None:
    server: Any = host(PER_PRINCIPAL)
    with pytest.raises(UpstreamFailure) as caught:
        session_headers(server, CALLER, None)
    assert caught.value.kind == "credential"
    error = caught.value.to_error()
    assert error.to_payload() == {
        "error": "Upstream credential unavailable",
        "code": "UPSTREAM_ERROR",
    }


def test_the_gateways_own_credential_types_are_unchanged() -> None:
    server: Any = host({"type": "bearer", "token": {"env": "T"}})
    assert session_headers(server, CALLER, None) == {"Authorization": "Bearer gateway-own"}
