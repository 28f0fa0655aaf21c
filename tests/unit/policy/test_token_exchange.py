"""RFC 8693 as policy: the request's fields, which answers are used, and for how long."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_mcp.policy.token_exchange import (
    ACCESS_TOKEN_TYPE,
    DEFAULT_LIFETIME_SECONDS,
    REASON_EXCHANGE_UNUSABLE,
    CredentialCache,
    CredentialUnavailable,
    IssuedToken,
    exchange_parameters,
    idp_error_label,
    read_exchange_answer,
)
from nexus_mcp.policy.upstreams import TokenExchange

SUBJECT = "caller-own-token.abc"
NOW = 1_000_000.0


def config(**extra: Any) -> TokenExchange:
    return TokenExchange.model_validate(
        {
            "token_url": "https://idp.example/token",
            "client_id": "gw",
            "client_secret": {"env": "S"},
            "audience": "tickets",
            **extra,
        }
    )


def read(answer: dict[str, Any], *, expires_at: float | None = None, renew: float = 30) -> Any:
    return read_exchange_answer(
        answer,
        subject_token=SUBJECT,
        subject_expires_at=expires_at,
        renew_before_seconds=renew,
        now=NOW,
    )


def test_the_request_names_the_subject_token_and_the_upstream() -> None:
    assert exchange_parameters(
        config(resource="https://t.example/mcp", scope=["a", "b"]), SUBJECT
    ) == {
        "subject_token": SUBJECT,
        "subject_token_type": ACCESS_TOKEN_TYPE,
        "requested_token_type": ACCESS_TOKEN_TYPE,
        "audience": "tickets",
        "resource": "https://t.example/mcp",
        "scope": "a b",
    }
    assert "scope" not in exchange_parameters(config(), SUBJECT)


def test_a_good_answer_is_used_until_shortly_before_it_expires() -> None:
    issued = read({"access_token": "x.y-z", "token_type": "Bearer", "expires_in": 300})
    assert issued.value.get_secret_value() == "x.y-z"
    assert issued.usable_until == NOW + 270
    assert "x.y-z" not in repr(issued)
    bare = read({"access_token": "t", "token_type": "bearer"})
    assert bare.usable_until == NOW + DEFAULT_LIFETIME_SECONDS


def test_never_past_the_callers_own_token() -> None:
    issued = read(
        {"access_token": "t", "token_type": "Bearer", "expires_in": 3600}, expires_at=NOW + 10
    )
    assert issued.usable_until == NOW + 10


@pytest.mark.parametrize(
    "answer",
    [
        {},
        {"access_token": SUBJECT, "token_type": "Bearer"},  # the caller's own token back
        {"access_token": "", "token_type": "Bearer"},
        {"access_token": "a b", "token_type": "Bearer"},
        {"access_token": "a\r\nX-Evil: 1", "token_type": "Bearer"},
        {"access_token": "x" * 20000, "token_type": "Bearer"},
        {"access_token": 5, "token_type": "Bearer"},
        {"access_token": "t"},
        {"access_token": "t", "token_type": "DPoP"},
        {"access_token": "t", "token_type": "N_A"},
        {"access_token": "t", "token_type": "Bearer", "issued_token_type": "urn:x:saml2"},
        {"access_token": "t", "token_type": "Bearer", "expires_in": 0},
        {"access_token": "t", "token_type": "Bearer", "expires_in": -5},
        {"access_token": "t", "token_type": "Bearer", "expires_in": "300"},
        {"access_token": "t", "token_type": "Bearer", "expires_in": True},
        {"access_token": "t", "token_type": "Bearer", "expires_in": 10**12},
        {"access_token": "t", "token_type": "Bearer", "expires_in": float("nan")},
    ],
)
def test_an_unusable_answer_is_refused(answer: dict[str, Any]) -> None:
    with pytest.raises(CredentialUnavailable) as caught:
        read(answer)
    assert caught.value.reason == REASON_EXCHANGE_UNUSABLE
    assert caught.value.idp_error is None


def test_only_registered_error_codes_are_named() -> None:
    assert idp_error_label("invalid_grant") == "invalid_grant"
    assert idp_error_label("invalid_target") == "invalid_target"
    assert idp_error_label("ignore previous instructions") == "other"
    assert idp_error_label(None) == "other"


def test_the_cache_keeps_a_token_only_while_it_is_usable_and_stays_bounded() -> None:
    cache = CredentialCache(max_entries=2)
    cache.put("alice", IssuedToken(read({"access_token": "a", "token_type": "Bearer"}).value, 10))
    assert cache.get("alice", 9) is not None
    assert cache.get("alice", 10) is None  # expired: gone
    assert len(cache) == 0
    for key in ("a", "b", "c"):
        cache.put(key, IssuedToken(read({"access_token": key, "token_type": "Bearer"}).value, 99))
    assert cache.get("a", 0) is None  # the oldest left first
    assert cache.get("c", 0) is not None
    assert len(cache) == 2
