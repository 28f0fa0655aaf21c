"""Per-caller upstream credentials (issue 27): what the gateway asks the identity provider
for, what it accepts back, and how long it keeps it. No I/O here: the request itself is
``providers/upstream/credentials.py``'s (Authlib's OAuth client).

RFC 8693 token exchange: the subject token is the caller's verified access token, the
token asked for is an access token for one upstream (``audience`` and/or ``resource``).
What comes back is used only when it is a bearer token of sane shape that is *not* the
caller's own token (an identity provider that hands the subject token back would make
the gateway forward the caller's token), and only until ``renew_before_seconds`` before
it expires, and never past the caller's own token's expiry. Every refusal is a fixed
reason: nothing the identity provider said is repeated, bar an RFC 6749/8693 error code
from a fixed list.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from nexus_mcp.policy.upstreams import TokenExchange

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 - a URN
JWT_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:jwt"  # noqa: S105 - a URN
ISSUED_TOKEN_TYPES = frozenset({ACCESS_TOKEN_TYPE, JWT_TOKEN_TYPE})
# RFC 6750's b64token: what may follow "Bearer " in a header (no space, no CR/LF).
BEARER_TOKEN_RE = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")
MAX_TOKEN_CHARS = 16 * 1024
MAX_EXPIRES_IN = 24 * 3600
# An answer without ``expires_in`` is kept this long at most (RFC 8693 only recommends it).
DEFAULT_LIFETIME_SECONDS = 60.0
MAX_CACHED = 10_000
# The error codes of RFC 6749 5.2 and RFC 8693 2.2.2 an audit record may name.
IDP_ERRORS = frozenset(
    {
        "invalid_request",
        "invalid_client",
        "invalid_grant",
        "unauthorized_client",
        "unsupported_grant_type",
        "invalid_scope",
        "invalid_target",
    }
)

# Why a caller got no credential (audit ``reason``; the caller sees one fixed message).
REASON_NO_SUBJECT_TOKEN = "no_subject_token"  # noqa: S105 - a reason code
REASON_NO_PRINCIPAL_SECRET = "no_principal_secret"  # noqa: S105 - a reason code
REASON_EXCHANGE_REFUSED = "exchange_refused"
REASON_EXCHANGE_FAILED = "exchange_failed"
REASON_EXCHANGE_UNUSABLE = "exchange_unusable"


class CredentialUnavailable(Exception):
    """No credential for this caller at this upstream; ``reason`` is one of the above,
    ``idp_error`` an error code from ``IDP_ERRORS`` (or ``other``) when the provider
    refused."""

    def __init__(self, reason: str, idp_error: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.idp_error = idp_error


@dataclass(frozen=True)
class IssuedToken:
    """A bearer credential for one caller at one upstream, and until when it is used."""

    value: SecretStr = field(repr=False)
    usable_until: float | None  # monotonic-free wall clock (time.time()); None: no expiry

    def usable(self, now: float) -> bool:
        return self.usable_until is None or now < self.usable_until


def exchange_parameters(config: TokenExchange, subject_token: str) -> dict[str, str]:
    """The form fields of the exchange request (client authentication aside)."""
    fields = {
        "subject_token": subject_token,
        "subject_token_type": ACCESS_TOKEN_TYPE,
        "requested_token_type": ACCESS_TOKEN_TYPE,
    }
    if config.audience is not None:
        fields["audience"] = config.audience
    if config.resource is not None:
        fields["resource"] = config.resource
    if config.scope:
        fields["scope"] = " ".join(config.scope)
    return fields


def idp_error_label(error: object) -> str:
    """The provider's error code when it is a registered one, else ``other``."""
    return error if isinstance(error, str) and error in IDP_ERRORS else "other"


def read_exchange_answer(
    answer: Mapping[str, Any],
    *,
    subject_token: str,
    subject_expires_at: float | None,
    renew_before_seconds: float,
    now: float,
) -> IssuedToken:
    """The token to send upstream, from a successful token response; anything unusable is
    ``CredentialUnavailable(exchange_unusable)``."""
    token = answer.get("access_token")
    token_type = answer.get("token_type")
    issued_type = answer.get("issued_token_type")
    if (
        not isinstance(token, str)
        or not 0 < len(token) <= MAX_TOKEN_CHARS
        or not BEARER_TOKEN_RE.fullmatch(token)
        or token == subject_token
        or not isinstance(token_type, str)
        or token_type.lower() != "bearer"
        or (issued_type is not None and issued_type not in ISSUED_TOKEN_TYPES)
    ):
        raise CredentialUnavailable(REASON_EXCHANGE_UNUSABLE)
    expires_in = answer.get("expires_in")
    if expires_in is None:
        lifetime = DEFAULT_LIFETIME_SECONDS
    elif (
        isinstance(expires_in, bool)
        or not isinstance(expires_in, int | float)
        or not 0 < expires_in <= MAX_EXPIRES_IN
    ):
        raise CredentialUnavailable(REASON_EXCHANGE_UNUSABLE)
    else:
        # Renewing before a lifetime that short: used for this call, kept for none.
        lifetime = max(float(expires_in) - renew_before_seconds, 0.0)
    until = now + lifetime
    if subject_expires_at is not None:
        until = min(until, float(subject_expires_at))
    return IssuedToken(SecretStr(token), until)


class CredentialCache:
    """Issued tokens per (caller session key, upstream): one process's memory, bounded
    (the oldest entry goes first). Never shared between replicas: each exchanges its own."""

    def __init__(self, max_entries: int = MAX_CACHED) -> None:
        self._entries: OrderedDict[Hashable, IssuedToken] = OrderedDict()
        self._max = max_entries

    def get(self, key: Hashable, now: float) -> IssuedToken | None:
        found = self._entries.get(key)
        if found is None:
            return None
        if not found.usable(now):
            del self._entries[key]
            return None
        return found

    def put(self, key: Hashable, token: IssuedToken) -> None:
        self._entries[key] = token
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


__all__ = [
    "ACCESS_TOKEN_TYPE",
    "DEFAULT_LIFETIME_SECONDS",
    "GRANT_TYPE",
    "IDP_ERRORS",
    "REASON_EXCHANGE_FAILED",
    "REASON_EXCHANGE_REFUSED",
    "REASON_EXCHANGE_UNUSABLE",
    "REASON_NO_PRINCIPAL_SECRET",
    "REASON_NO_SUBJECT_TOKEN",
    "CredentialCache",
    "CredentialUnavailable",
    "IssuedToken",
    "exchange_parameters",
    "idp_error_label",
    "read_exchange_answer",
]
