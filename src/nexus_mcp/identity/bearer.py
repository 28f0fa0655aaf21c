"""Bearer tokens on HTTP: FastMCP's ``JWTVerifier`` plus the RFC 7519 time checks it leaves out.

FastMCP 4.1's verifier checks the signature, ``crit`` headers, issuer, audience, scopes and
a past ``exp``, but it never looks at ``nbf`` or ``iat`` and accepts a token without
``exp`` (one that never expires). We keep FastMCP's verifier for all of that (house rule:
configure maintained code, don't rewrite it) and add the missing checks on the claims it
has already verified, with joserfc's ``JWTClaimsRegistry`` (the JOSE library FastMCP
itself decodes with):

- ``exp`` is required unless ``auth.allow_tokens_without_exp`` says otherwise;
- ``nbf`` and ``iat`` more than ``auth.leeway_seconds`` in the future are refused;
- ``exp``, ``nbf`` and ``iat`` must be NumericDates (RFC 7519 section 2): a JSON number,
  not a string, boolean or null, finite (Python's JSON reader accepts ``NaN`` and
  ``Infinity``) and within the calendar (1970 to 9999): an ``exp`` of 10**30 is a token
  that never expires under another name;
- ``iss``, ``sub``, ``aud`` and ``jti`` have their RFC 7519 types.

FastMCP compares ``exp`` without leeway, so a token is never accepted after its ``exp``;
the leeway only forgives an issuer whose clock runs ahead of ours. Every refusal is
``None`` (FastMCP answers 401); nothing about the token is logged beyond the claim name.
"""

from __future__ import annotations

import math
from typing import Any

from fastmcp.server.auth import AccessToken
from fastmcp.server.auth.providers.jwt import JWTVerifier
from joserfc.errors import InvalidClaimError, JoseError
from joserfc.jwt import JWTClaimsRegistry

from nexus_mcp.observability.logs import get_logger

log = get_logger(__name__)

# 9999-12-31T23:59:59Z: the last second a NumericDate can mean as a calendar date.
MAX_NUMERIC_DATE = 253_402_300_799
TIME_CLAIMS = ("exp", "nbf", "iat")


def is_numeric_date(value: object) -> bool:
    """A JSON number of seconds between 1970 and 9999; never a bool, NaN or infinity."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    # math.isfinite would raise OverflowError for an int too large for a float.
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return 0 <= value <= MAX_NUMERIC_DATE


class _TimeClaimsRegistry(JWTClaimsRegistry):
    """joserfc's claim checks, with NumericDate read strictly before any comparison."""

    def validate_exp(self, value: object) -> None:
        _require_numeric_date("exp", value)
        super().validate_exp(value)

    def validate_nbf(self, value: object) -> None:
        _require_numeric_date("nbf", value)
        super().validate_nbf(value)

    def validate_iat(self, value: object) -> None:
        _require_numeric_date("iat", value)
        super().validate_iat(value)


def _require_numeric_date(name: str, value: object) -> None:
    if not is_numeric_date(value):
        raise InvalidClaimError(name)


class BearerTokenVerifier(JWTVerifier):
    """``JWTVerifier`` that also enforces ``exp``, ``nbf`` and ``iat`` (RFC 7519, 4.1.4-4.1.6)."""

    def __init__(
        self, *, leeway_seconds: int, require_exp: bool = True, **jwt_options: Any
    ) -> None:
        super().__init__(**jwt_options)
        if isinstance(leeway_seconds, bool) or not isinstance(leeway_seconds, int):
            raise TypeError("leeway_seconds must be an int")
        if leeway_seconds < 0:
            raise ValueError("leeway_seconds must not be negative")
        self.leeway_seconds = leeway_seconds
        self.require_exp = require_exp

    def claims_registry(self) -> JWTClaimsRegistry:
        """A fresh registry per check: its clock is read at validation time."""
        if self.require_exp:
            return _TimeClaimsRegistry(leeway=self.leeway_seconds, exp={"essential": True})
        return _TimeClaimsRegistry(leeway=self.leeway_seconds)

    async def load_access_token(self, token: str) -> AccessToken | None:
        try:
            access = await super().load_access_token(token)
        except OverflowError:
            # FastMCP converts a signed ``exp`` with int(); an ``exp`` of Infinity (or 1e400,
            # which Python's JSON reader turns into infinity) overflows there. It is a bad
            # token, not a server error.
            log.info("bearer_token_refused", claim="exp", reason="InvalidClaimError")
            return None
        if access is None:
            return None
        try:
            self.claims_registry().validate(dict(access.claims))
        except JoseError as exc:
            # The claim name only: values are attacker-chosen and tokens are credentials.
            claim = getattr(exc, "claim", None)
            log.info(
                "bearer_token_refused",
                claim=claim if claim in (*TIME_CLAIMS, "iss", "sub", "aud", "jti") else None,
                reason=type(exc).__name__,
            )
            return None
        return access


__all__ = ["MAX_NUMERIC_DATE", "TIME_CLAIMS", "BearerTokenVerifier", "is_numeric_date"]
