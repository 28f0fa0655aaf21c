"""The bearer verifier as a plain object: RFC 7519 time claims on top of FastMCP's checks.

Tokens are signed for real (HS256 with the shared secret, RS256 against a JWKS served on
a loopback socket); HS256 payloads are written as raw JSON (``tests/support/tokens.py``)
so hostile values no JWT library would emit (``NaN``, ``Infinity``, 400-digit numbers)
reach the verifier as an attacker would send them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp.server.auth.providers.jwt import RSAKeyPair
from joserfc import jwk, jwt
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from nexus_mcp.identity.bearer import MAX_NUMERIC_DATE, BearerTokenVerifier, is_numeric_date
from nexus_mcp.server.startup import build_verifier
from nexus_mcp.settings import Settings
from tests.support.loopback import serve_in_thread
from tests.support.tokens import OMIT, FromNow, RawJson, claims_json, hs256, resolve_times

SECRET = "unit-secret-0123456789abcdef-0123456789"
AUDIENCE = "nexus-unit"
LEEWAY = 30


def signed(payload_json: str, secret: str = SECRET) -> str:
    return hs256(payload_json, secret)


def payload(**claims: Any) -> str:
    """A valid payload with ``claims`` over it (``OMIT`` drops one, ``RawJson`` is verbatim)."""
    return claims_json({"sub": "carol", "aud": AUDIENCE, "exp": FromNow(300), **claims})


def verifier(**options: Any) -> BearerTokenVerifier:
    values: dict[str, Any] = {
        "public_key": SECRET,
        "algorithm": "HS256",
        "audience": AUDIENCE,
        "leeway_seconds": LEEWAY,
    }
    values.update(options)
    return BearerTokenVerifier(**values)


async def accepts(token: str, **options: Any) -> bool:
    return await verifier(**options).verify_token(token) is not None


# -- the time claims ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "claims",
    [
        {},
        {"nbf": FromNow(10)},
        {"iat": FromNow(10)},
        {"nbf": FromNow(-3600), "iat": FromNow(-3600)},
        {"exp": FromNow(300.5)},  # NumericDate may be fractional (RFC 7519 section 2)
        {"exp": FromNow(300), "nbf": FromNow(0), "iat": FromNow(0)},
    ],
    ids=["plain", "nbf-inside-leeway", "iat-inside-leeway", "past", "fractional", "all-three"],
)
async def test_tokens_valid_now_or_inside_the_leeway_are_accepted(claims: dict[str, Any]) -> None:
    assert await accepts(signed(payload(**claims)))


@pytest.mark.parametrize(
    "claims",
    [
        {"nbf": FromNow(LEEWAY + 60)},
        {"iat": FromNow(LEEWAY + 60)},
        {"nbf": FromNow(86_400 * 365)},
        {"exp": FromNow(-LEEWAY - 60)},
        {"exp": FromNow(-1)},  # FastMCP never extends exp, and neither do we
        {"exp": OMIT},
    ],
    ids=["nbf-future", "iat-future", "nbf-next-year", "expired", "just-expired", "no-exp"],
)
async def test_tokens_outside_their_lifetime_are_refused(claims: dict[str, Any]) -> None:
    assert not await accepts(signed(payload(**claims)))


async def test_a_leeway_of_zero_refuses_any_future_nbf() -> None:
    token = signed(payload(nbf=FromNow(5)))
    assert await accepts(token)
    assert not await accepts(token, leeway_seconds=0)


async def test_a_token_without_exp_is_accepted_only_when_the_setting_allows_it() -> None:
    token = signed(payload(exp=OMIT))
    assert not await accepts(token)
    assert await accepts(token, require_exp=False)


async def test_allowing_tokens_without_exp_still_checks_an_exp_that_is_there() -> None:
    for claims in ({"exp": FromNow(-3600)}, {"exp": None}, {"exp": "soon"}, {"nbf": FromNow(3600)}):
        assert not await accepts(signed(payload(**claims)), require_exp=False), claims


HOSTILE_VALUES: dict[str, Any] = {
    "string": "9999999999",
    "empty-string": "",
    "true": True,
    "false": False,
    "null": None,
    "list": [9_999_999_999],
    "object": {"at": 9_999_999_999},
    "nan": RawJson("NaN"),
    "infinity": RawJson("Infinity"),
    "minus-infinity": RawJson("-Infinity"),
    "overflowing-float": RawJson("1e400"),
    "huge-float": RawJson("1e300"),
    "huge-int": RawJson("1" + "0" * 30),
    "400-digit-int": RawJson("9" * 400),
    "past-year-9999": MAX_NUMERIC_DATE + 1,
    "negative": -1,
}


@pytest.mark.parametrize("claim", ["exp", "nbf", "iat"])
@pytest.mark.parametrize("kind", list(HOSTILE_VALUES))
async def test_time_claims_that_are_not_numeric_dates_are_refused_never_raised(
    claim: str, kind: str
) -> None:
    token = signed(payload(**{claim: HOSTILE_VALUES[kind]}))
    for options in ({}, {"require_exp": False}):
        assert await verifier(**options).verify_token(token) is None, (claim, kind, options)


@pytest.mark.parametrize(
    "claims",
    [{"sub": 42}, {"iss": ["a", "b"]}, {"jti": 7}, {"aud": [AUDIENCE, 5]}],
    ids=["sub-number", "iss-list", "jti-number", "aud-mixed"],
)
async def test_registered_claims_of_the_wrong_type_are_refused(claims: dict[str, Any]) -> None:
    assert not await accepts(signed(payload(**claims)))


async def test_the_time_checks_run_only_after_the_signature_checks() -> None:
    forged = signed(payload(), secret="another-secret-0123456789abcdef-xyz")
    assert not await accepts(forged)
    assert not await accepts(signed(payload(aud="someone-else")))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, True),
        (1_700_000_000, True),
        (1_700_000_000.25, True),
        (MAX_NUMERIC_DATE, True),
        (MAX_NUMERIC_DATE + 1, False),
        (-1, False),
        (True, False),
        (float("nan"), False),
        (float("inf"), False),
        (10**400, False),
        ("1700000000", False),
        (None, False),
    ],
)
def test_a_numeric_date_is_a_finite_json_number_within_the_calendar(
    value: object, expected: bool
) -> None:
    assert is_numeric_date(value) is expected


@pytest.mark.parametrize("leeway", [-1, True, 1.5, "30"])
def test_the_verifier_refuses_a_leeway_that_is_not_a_non_negative_int(leeway: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        verifier(leeway_seconds=leeway)


# -- build_verifier: the one verifier for HTTP ---------------------------------------------


def settings(tmp_path: Path, **auth: Any) -> Settings:
    return Settings(mode="prod", transport="http", workspace=tmp_path, auth=auth)


def test_build_verifier_carries_the_leeway_and_exp_settings(tmp_path: Path) -> None:
    default = build_verifier(settings(tmp_path, jwt_secret=SECRET))
    assert isinstance(default, BearerTokenVerifier)
    assert (default.leeway_seconds, default.require_exp) == (30, True)
    custom = build_verifier(
        settings(tmp_path, jwt_secret=SECRET, leeway_seconds=0, allow_tokens_without_exp=True)
    )
    assert isinstance(custom, BearerTokenVerifier)
    assert (custom.leeway_seconds, custom.require_exp) == (0, False)


KID = "unit-rsa-1"


@pytest.fixture(scope="module")
def rsa_keys() -> RSAKeyPair:
    return RSAKeyPair.generate()


@pytest.fixture(scope="module")
def jwks_url(rsa_keys: RSAKeyPair) -> Iterator[str]:
    public = jwk.import_key(rsa_keys.public_key, "RSA").as_dict(private=False)
    document = {"keys": [{**public, "kid": KID, "use": "sig", "alg": "RS256"}]}

    async def keys(_request: Request) -> JSONResponse:
        return JSONResponse(document)

    with serve_in_thread(Starlette(routes=[Route("/jwks.json", keys)])) as base_url:
        yield f"{base_url}/jwks.json"


def rs256(keys: RSAKeyPair, **claims: Any) -> str:
    body: dict[str, Any] = {"sub": "carol", "aud": AUDIENCE, "exp": FromNow(300)}
    body.update(claims)
    body = {k: v for k, v in resolve_times(body).items() if v is not OMIT}
    private = jwk.import_key(keys.private_key.get_secret_value(), "RSA")
    return jwt.encode({"alg": "RS256", "kid": KID}, body, private, algorithms=["RS256"])


@pytest.mark.parametrize(
    ("claims", "accepted"),
    [
        ({}, True),
        ({"nbf": FromNow(10)}, True),
        ({"nbf": FromNow(3600)}, False),
        ({"iat": FromNow(3600)}, False),
        ({"exp": OMIT}, False),
        ({"exp": FromNow(-3600)}, False),
    ],
    ids=["valid", "nbf-inside-leeway", "nbf-future", "iat-future", "no-exp", "expired"],
)
async def test_jwks_tokens_get_the_same_time_checks(
    tmp_path: Path, rsa_keys: RSAKeyPair, jwks_url: str, claims: dict[str, Any], accepted: bool
) -> None:
    built = build_verifier(
        settings(tmp_path, jwks_url=jwks_url, algorithm="RS256", audience=AUDIENCE)
    )
    assert built is not None
    assert (await built.verify_token(rs256(rsa_keys, **claims)) is not None) is accepted
