"""Who is calling: the ``Principal`` value and how it is built from each identity source.

Identity never comes from tool arguments or ``ctx.client_id`` (client-controlled). On
stdio it comes from the launch environment; on HTTP from verified bearer-token claims;
in dev mode a configured default principal fills in when there is neither.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

ROLES = ("viewer", "editor", "evaluator", "admin")
ROLE_FALLBACK = "viewer"
# How much each role may do, for "narrow, never widen" (policy/launch.py): a partial
# order, viewer < editor < admin and viewer < evaluator < admin. editor and evaluator
# share a rank but neither includes the other (their default profiles, coding and
# search, do not nest), so moving between them is never a narrowing.
ROLE_RANKS: Mapping[str, int] = MappingProxyType(
    {"viewer": 0, "editor": 1, "evaluator": 1, "admin": 2}
)

# Subjects that look like credentials (API keys, long opaque tokens) are hashed in logs.
_SECRETISH_RE = re.compile(r"^(sk|pk|api|key|tok|ghp|xox[bap])[-_]|^[A-Za-z0-9+/=_-]{32,}$")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Principal:
    """The caller, as far as policy is concerned."""

    subject: str
    role: str = ROLE_FALLBACK
    profile: str | None = None
    vault_id: str | None = None
    user_id: str | None = None
    canister_user_id: str | None = None
    scopes: frozenset[str] = field(default_factory=frozenset)
    read_only: bool = False
    source: str = "env"  # env | token | dev-default

    @cached_property
    def effective_role(self) -> str:
        """The role policy uses: an unknown role never gets more than viewer."""
        return to_effective_role(self.role)

    @property
    def canister_user(self) -> str | None:
        """The effective canister user: ``canister_user_id`` falling back to ``user_id``."""
        return self.canister_user_id or self.user_id

    @cached_property  # read several times per call; a frozen dataclass still allows this
    def log_subject(self) -> str:
        """The subject as it may appear in logs and audit: hashed when it looks secret."""
        return to_log_subject(self.subject)


def to_effective_role(role: str | None) -> str:
    """A role as policy sees it: an unknown (or missing) role never gets more than viewer."""
    return role if role in ROLES else ROLE_FALLBACK


def is_role_within(role: str | None, ceiling: str | None) -> bool:
    """True when ``role`` may do no more than ``ceiling`` (both taken as effective roles)."""
    role, ceiling = to_effective_role(role), to_effective_role(ceiling)
    return role == ceiling or ROLE_RANKS[role] < ROLE_RANKS[ceiling]


def to_log_subject(subject: str) -> str:
    if _SECRETISH_RE.search(subject):
        return "sha256:" + hashlib.sha256(subject.encode("utf-8")).hexdigest()[:16]
    return subject


def parse_bool(value: str | bool | None, *, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = (value or "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{name} must be a boolean (true/false)")


def parse_scopes(value: str | list[str] | tuple[str, ...] | None) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset(s for s in re.split(r"[\s,]+", value) if s)
    return frozenset(str(s) for s in value if str(s))


def _opt(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def principal_from_fields(fields: Mapping[str, Any], *, source: str) -> Principal | None:
    """Build a principal from a flat mapping of principal fields; None without a subject."""
    subject = _opt(fields.get("subject"))
    if subject is None:
        return None
    return Principal(
        subject=subject,
        role=_opt(fields.get("role")) or ROLE_FALLBACK,
        profile=_opt(fields.get("profile")),
        vault_id=_opt(fields.get("vault_id")),
        user_id=_opt(fields.get("user_id")),
        canister_user_id=_opt(fields.get("canister_user_id")),
        scopes=parse_scopes(fields.get("scopes")),
        read_only=parse_bool(fields.get("read_only"), name="read_only"),
        source=source,
    )


def principal_from_claims(
    claims: Mapping[str, Any], *, subject: str | None = None
) -> Principal | None:
    """Map verified JWT claims to a principal (``sub``, ``role``, ``profile``, ...)."""
    scopes: Any = claims.get("scopes")
    if scopes is None:
        scopes = claims.get("scope", claims.get("scp"))
    return principal_from_fields(
        {
            "subject": subject or claims.get("sub"),
            "role": claims.get("role"),
            "profile": claims.get("profile"),
            "vault_id": claims.get("vault_id"),
            "user_id": claims.get("user_id"),
            "canister_user_id": claims.get("canister_user_id"),
            "scopes": scopes,
            "read_only": claims.get("read_only", False),
        },
        source="token",
    )


__all__ = [
    "ROLES",
    "ROLE_FALLBACK",
    "ROLE_RANKS",
    "Principal",
    "is_role_within",
    "parse_bool",
    "parse_scopes",
    "principal_from_claims",
    "principal_from_fields",
    "to_effective_role",
    "to_log_subject",
]
