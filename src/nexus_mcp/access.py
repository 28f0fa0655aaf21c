"""Which tools a principal may see: profiles and ReBAC grants behind the namespace layer.

The first time a principal appears (per subject, profile claim and role) its profile is
selected (principal's ``profile``, else the stored assignment, else its role's default)
and granted eagerly (seed 004 phase 5): one grant per tool in the tuple store. Every
request then reads the visible set from the ``VisibleToolsCache``. A principal naming an
unknown profile sees nothing. Read-only callers never see write-class tools.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from cachetools import TTLCache

from nexus_mcp.logs import get_logger
from nexus_mcp.policy.grants import ensure_principal_grants
from nexus_mcp.policy.profiles import ToolProfileConfig, select_profile
from nexus_mcp.policy.visibility import VisibleToolsCache
from nexus_mcp.principal import Principal
from nexus_mcp.stores.grants import TupleStore

log = get_logger(__name__)

DEFAULT_ZONE = "default"


class GrantedTools:
    """The ``Namespace`` of the namespace middleware, backed by profiles and grants."""

    def __init__(
        self,
        store: TupleStore,
        cache: VisibleToolsCache,
        profiles: ToolProfileConfig,
        *,
        write_tools: Iterable[str],
        zone: str = DEFAULT_ZONE,
        session_ttl_seconds: float = 300.0,
    ) -> None:
        self.store = store
        self.cache = cache
        self.profiles = profiles
        self.write_tools = frozenset(write_tools)
        self.zone = zone
        # (subject, profile claim, role) -> profile granted, or None when denied.
        self._sessions: TTLCache[tuple[str, str | None, str], str | None] = TTLCache(
            maxsize=10_000, ttl=session_ttl_seconds
        )
        self._lock = threading.Lock()

    def start_session(self, principal: Principal) -> str | None:
        """Select and grant the principal's profile once; returns its name (None: denied)."""
        key = (principal.subject, principal.profile, principal.effective_role)
        with self._lock:
            if key in self._sessions:
                return self._sessions[key]
        selection = select_profile(
            self.profiles,
            principal_profile=principal.profile,
            stored_assignment=self.store.get_assignment(principal.subject, self.zone),
            role=principal.effective_role,
        )
        if selection.is_denied or selection.name is None:
            log.warning("profile_denied", subject=principal.log_subject, source=str(selection.source))
            name = None
        else:
            name = selection.name
            if ensure_principal_grants(self.store, self.profiles, principal.subject, name, self.zone):
                self.cache.invalidate(principal.subject)
        with self._lock:
            self._sessions[key] = name
        return name

    def visible_tools(self, principal: Principal) -> frozenset[str]:
        if self.start_session(principal) is None:
            return frozenset()
        visible = self.cache.get(principal.subject, self.zone)
        return visible - self.write_tools if principal.read_only else visible

    def forget(self, subject: str | None = None) -> None:
        """After a grant change through this server: the next request sees it."""
        with self._lock:
            if subject is None:
                self._sessions.clear()
            else:
                for key in [k for k in self._sessions if k[0] == subject]:
                    del self._sessions[key]
        self.cache.invalidate(subject)

    def record_filtered(self, count: int) -> None:
        self.cache.record_filtered(count)

    def record_rejected(self) -> None:
        self.cache.record_rejected()

    def record_error(self) -> None:
        return None  # the cache counts its own lookup errors


__all__ = ["DEFAULT_ZONE", "GrantedTools"]
