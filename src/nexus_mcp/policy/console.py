"""The operator console's own policy: who may open it, and what each console role may do.

The console (``nexus_mcp/console``) is another client of the same stores and policy as the
CLI; these are its decisions, pure and without a web framework:

- A signed-in person's console role comes from their principal's role (the claims mapping
  of the ``auth`` section for people who sign in with the identity provider; ``admin`` for
  the local one-time link): ``admin_roles`` give *admin*, ``approver_roles`` (by default
  the server's top-level ``approver_roles``) give *approver*, ``viewer_roles`` give
  *viewer*. Any other role gets no console at all: an agent's token is not a pass to the
  operators' pages.
- Roles are ordered: a viewer reads every page; an approver also decides approval
  requests and re-pins upstream tools; an admin also assigns and revokes grants.
- Nobody approves a request of their own subject (their own agent's write) unless
  ``approvals.allow_self_approval`` is on; denying one's own request is always allowed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from nexus_mcp.policy.upstreams import SecretValue

ConsoleRole = Literal["viewer", "approver", "admin"]
CONSOLE_ROLES: tuple[ConsoleRole, ...] = ("viewer", "approver", "admin")
_RANK = {role: rank for rank, role in enumerate(CONSOLE_ROLES)}

# What each action needs (the console checks every request against this table).
ACTIONS: dict[str, ConsoleRole] = {
    "read": "viewer",
    "decide": "approver",
    "repin": "approver",
    "grant": "admin",
}
DEFAULT_SESSION_TTL_SECONDS = 8 * 3600
LOGIN_LINK_TTL_SECONDS = 300


class ConsoleSettings(BaseModel):
    """The ``console`` settings (docs/configuration.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Serve ``/console`` on the HTTP transport.
    enabled: bool = True
    admin_roles: tuple[str, ...] = ("admin",)
    # None: the server's ``approver_roles``.
    approver_roles: tuple[str, ...] | None = None
    viewer_roles: tuple[str, ...] = ()
    session_ttl_seconds: int = Field(default=DEFAULT_SESSION_TTL_SECONDS, ge=300, le=86400)
    # Signs session cookies and login links. Replicas behind one address share it (by
    # reference: ``${NAME}`` or {env: NAME} / {file: path}); without it a key is made once
    # in the data dir (``console.key``, mode 0600).
    secret: SecretValue | None = None


def console_role(
    role: str, settings: ConsoleSettings, approver_roles: Collection[str]
) -> ConsoleRole | None:
    """The console role of a principal role, or None: no console for this person."""
    if role in settings.admin_roles:
        return "admin"
    approvers = settings.approver_roles if settings.approver_roles is not None else approver_roles
    if role in approvers:
        return "approver"
    if role in settings.viewer_roles:
        return "viewer"
    return None


def allows(role: ConsoleRole, action: str) -> bool:
    """Whether a console role may take an action (an unknown action: nobody may)."""
    needed = ACTIONS.get(action)
    return needed is not None and _RANK[role] >= _RANK[needed]


def self_approval_refused(
    *, request_subject: str, approver_subject: str, approve: bool, allow_self_approval: bool
) -> bool:
    """An approver approving their own agent's request, which policy does not allow."""
    return approve and request_subject == approver_subject and not allow_self_approval


def secret_bytes(secret: SecretStr) -> bytes:
    return secret.get_secret_value().encode("utf-8", "surrogatepass")


__all__ = [
    "ACTIONS",
    "CONSOLE_ROLES",
    "DEFAULT_SESSION_TTL_SECONDS",
    "LOGIN_LINK_TTL_SECONDS",
    "ConsoleRole",
    "ConsoleSettings",
    "allows",
    "console_role",
    "secret_bytes",
    "self_approval_refused",
]
