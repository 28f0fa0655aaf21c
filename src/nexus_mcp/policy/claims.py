"""Verified token claims to the principal (``auth.claims`` in ``nexus.yaml``).

Without a mapping the claims name the principal's fields themselves (``sub``, ``role``,
``profile``, ``scope``...): the form our own HS256 and JWKS tokens for scripts carry. With
a mapping the team's identity provider speaks its own words (``email``, ``groups``,
``roles``) and the mapping says what they mean here:

- the subject comes from one claim (``sub`` by default), optionally prefixed;
- rules are tried in order and the first that matches gives the role, profile, read-only
  flag and vault; a group is looked for in every group claim (a list or one string), and
  a list longer than ``MAX_CLAIM_VALUES`` gets nothing (its tail is never silently lost);
- an email the provider did not verify (``email_verified`` present and not true) matches
  no rule and, when the email is the subject claim, gives no principal at all;
- no match gives nothing, never viewer by accident: the caller has no principal and the
  chain hides every tool (``default_role`` is the one way to let everyone in);
- scopes come from the token's scope claims only; a rule never adds one.

A token's claims are mapped once (``ClaimsMapper`` keeps the answer per token until it
expires), so a rule change applies to the next token, as a role change at the provider does.
"""

from __future__ import annotations

import hashlib
import string
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from cachetools import TTLCache

from nexus_mcp.policy.auth_settings import ClaimRule, ClaimsMapping
from nexus_mcp.principal import Principal, parse_scopes, principal_from_claims

MAX_CLAIM_VALUES = 1000  # a group list longer than this gets nothing (fail closed)
MAX_VALUE_CHARS = 512
CACHE_SIZE = 10_000
CACHE_SECONDS = 300.0
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _strings(value: Any) -> Iterable[str]:
    """A claim's string values: one string, or the strings of a list (bounded)."""
    if isinstance(value, str):
        if len(value) <= MAX_VALUE_CHARS:
            yield value
        return
    if isinstance(value, list | tuple):
        for item in value[:MAX_CLAIM_VALUES]:
            if isinstance(item, str) and len(item) <= MAX_VALUE_CHARS:
                yield item


def _scopes(value: Any) -> frozenset[str]:
    """A scope claim: one space-separated string (RFC 8693 ``scope``) or a list (``scp``)."""
    if isinstance(value, str):
        return parse_scopes(value) if len(value) <= MAX_VALUE_CHARS * 8 else frozenset()
    return parse_scopes(list(_strings(value)))


def _unverified(claims: Mapping[str, Any]) -> bool:
    """The provider says the email is not verified (OIDC Core 5.1): any value but true.

    A missing claim says nothing (many providers leave it out); present, only ``true``
    (or the string some providers and userinfo bridges send) counts as verified.
    """
    if "email_verified" not in claims:
        return False
    value = claims["email_verified"]
    return not (value is True or (isinstance(value, str) and value.lower() == "true"))


def _too_many(value: Any) -> bool:
    return isinstance(value, list | tuple) and len(value) > MAX_CLAIM_VALUES


def _fold(value: str) -> str:
    """ASCII letters to lower case, nothing else: ``str.lower`` also maps the KELVIN SIGN
    onto ``k``, so a look-alike (IDN) domain would meet another's rule."""
    return value.translate(_ASCII_LOWER)


def _email_matches(pattern: str, email: str | None) -> bool:
    if email is None:
        return False
    if pattern.startswith("*@"):
        # "*@example.com": the domain after the last "@", compared without ASCII case.
        _, at, domain = email.rpartition("@")
        return bool(at) and _fold(domain) == _fold(pattern[2:])
    return _fold(email) == _fold(pattern)


def _matches(rule: ClaimRule, *, subject: str, email: str | None, groups: set[str]) -> bool:
    if rule.group is not None:
        return rule.group in groups
    if rule.email is not None:
        return _email_matches(rule.email, email)
    return rule.subject == subject


def map_claims(mapping: ClaimsMapping | None, claims: Mapping[str, Any]) -> Principal | None:
    """The principal these verified claims speak for, or None (no subject, no matching rule)."""
    if mapping is None:
        return principal_from_claims(claims)
    raw_subject = claims.get(mapping.subject)
    if not isinstance(raw_subject, str) or not raw_subject.strip():
        return None
    unverified = _unverified(claims)
    if unverified and mapping.subject == mapping.email:
        # An address anyone may have typed names nobody: not as the subject either (its
        # subject rules, grants and assignment belong to whoever verified it).
        return None
    if len(raw_subject) > MAX_VALUE_CHARS:
        return None
    subject = mapping.subject_prefix + raw_subject.strip()
    email_claim = claims.get(mapping.email)
    email = email_claim if isinstance(email_claim, str) else None
    # An email the provider has not verified names nobody (OIDC Core 5.1).
    if email is not None and unverified:
        email = None
    # A group list longer than what is read would lose its tail, and with it a
    # restrictive rule's group placed there on purpose: such a token gets nothing.
    if any(_too_many(claims.get(name)) for name in mapping.groups):
        return None
    groups = {g for name in mapping.groups for g in _strings(claims.get(name))}
    rule = next(
        (r for r in mapping.rules if _matches(r, subject=subject, email=email, groups=groups)),
        None,
    )
    scopes = frozenset().union(*(_scopes(claims.get(name)) for name in mapping.scopes))
    if rule is None:
        if mapping.default_role is None:
            return None
        return Principal(
            subject=subject,
            role=mapping.default_role,
            profile=mapping.default_profile,
            scopes=scopes,
            source="token",
        )
    return Principal(
        subject=subject,
        role=rule.role,
        profile=rule.profile,
        vault_id=rule.vault_id,
        scopes=scopes,
        read_only=rule.read_only,
        source="token",
    )


class ClaimsMapper:
    """``map_claims`` once per token: the answer is kept until the token expires (at most
    ``CACHE_SECONDS``), keyed by the token's digest (never the token itself)."""

    def __init__(self, mapping: ClaimsMapping | None) -> None:
        self.mapping = mapping
        self._cache: TTLCache[str, tuple[float, Principal | None]] = TTLCache(
            maxsize=CACHE_SIZE, ttl=CACHE_SECONDS
        )
        self._lock = threading.Lock()

    def principal(
        self,
        claims: Mapping[str, Any],
        *,
        token: str | None = None,
        subject: str | None = None,
        expires_at: float | None = None,
    ) -> Principal | None:
        if token is None:
            return self._map(claims, subject)
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        now = time.time()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        principal = self._map(claims, subject)
        until = min(expires_at, now + CACHE_SECONDS) if expires_at else now + CACHE_SECONDS
        if until > now:
            with self._lock:
                self._cache[key] = (until, principal)
        return principal

    def _map(self, claims: Mapping[str, Any], subject: str | None) -> Principal | None:
        if self.mapping is None:
            return principal_from_claims(claims, subject=subject)
        return map_claims(self.mapping, claims)


__all__ = ["ClaimsMapper", "map_claims"]
