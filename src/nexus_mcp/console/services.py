"""What the console works with: the same stores and policy the server and the CLI use.

The console is another client of them, never a second way around them (DESIGN.md, "People
at the edges"): the server builds one ``ConsoleServices`` from its runtime
(``server/build.py``), and ``nexus-mcp console`` builds one from the data dir and the
configuration beside a stdio server (``commands/console.py``). The pages read what they
need from here and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nexus_mcp.console.security import ConsoleKeys, load_console_key
from nexus_mcp.observability.audit import AuditLog
from nexus_mcp.policy.approvals import ApprovalSettings
from nexus_mcp.policy.profiles import ToolProfileConfig
from nexus_mcp.settings import Settings
from nexus_mcp.stores.backends import StateStores

if TYPE_CHECKING:
    from nexus_mcp.providers.upstream.pins_view import PinsView

# The pages beyond the inbox each take a view of their own (pins, access, audit, health);
# a page whose view is missing says so instead of failing.
PageViews = dict[str, Any]


@dataclass
class ConsoleServices:
    settings: Settings
    config_file: Path | None
    approval_settings: ApprovalSettings
    state: StateStores
    audit: AuditLog
    keys: ConsoleKeys
    # Where this console runs: "server" (inside ``serve --transport http``) or
    # "standalone" (``nexus-mcp console`` beside a stdio server).
    host: str = "server"
    views: PageViews = field(default_factory=dict)
    # Sign-in with the identity provider (``console/oidc.py``), when the server has one.
    sign_in: Any = None
    # Called after a grant changes, so the server's own caches follow (server only).
    on_grants_changed: Callable[[str], None] | None = None
    # The profiles the server loaded (None: the Access page loads ``profiles.file``).
    profiles: ToolProfileConfig | None = None
    # Each upstream's summary (``/readyz``'s), when the server has a gateway; None: there
    # is none here, or (standalone) it is not known.
    upstreams: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None
    # The loaded registries' versions and digests (server only).
    registry_info: Callable[[], Mapping[str, Any] | None] | None = None
    # The upstreams' tools against their pins, and re-pinning (``console/pins.py``); None:
    # no upstreams are configured.
    pins: PinsView | None = None

    @property
    def approver_roles(self) -> tuple[str, ...]:
        return tuple(self.settings.approver_roles)


def console_keys(settings: Settings, environ: Mapping[str, str]) -> ConsoleKeys:
    return ConsoleKeys(
        load_console_key(settings, environ),
        session_ttl_seconds=settings.console.session_ttl_seconds,
    )


__all__ = ["ConsoleServices", "PageViews", "console_keys"]
