"""``Runtime``: what the chain and the tools share for the life of one server, and the
``NexusServer`` that pairs it with its FastMCP app. Built by ``build.py``; nothing on a
call's path calls back into it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastmcp import FastMCP
from fastmcp.server.auth import AuthProvider

from nexus_mcp.book import ToolBook
from nexus_mcp.connector import Connector
from nexus_mcp.enforcement import RegistryEnforcer
from nexus_mcp.errors import ConfigError
from nexus_mcp.identity.access import GrantedTools
from nexus_mcp.identity.resolver import (
    IdentityResolver,
    build_identity,
)
from nexus_mcp.ids import new_id
from nexus_mcp.notes.vaults import VaultRouter
from nexus_mcp.observability.audit import TOOL_CALL_BLOCKED, AuditEvent, AuditLog
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.observability.telemetry import Observability
from nexus_mcp.policy.approvals import (
    ApprovalKeys,
    ApprovalSettings,
)
from nexus_mcp.policy.flow import FlowConfig
from nexus_mcp.policy.registry import (
    RegistrySet,
)
from nexus_mcp.policy.repos import ReposConfig
from nexus_mcp.policy.targets import ToolTargets
from nexus_mcp.policy.tuples import TupleStore
from nexus_mcp.policy.upstreams import (
    UpstreamWrites,
)
from nexus_mcp.policy.write_policy import (
    WritePolicyConfig,
)
from nexus_mcp.providers.recording import Recorder
from nexus_mcp.server.notify import ChangeNotifier
from nexus_mcp.settings import Settings
from nexus_mcp.stores.backends import StateStores
from nexus_mcp.stores.idempotency import IdempotencyStore
from nexus_mcp.stores.nonces import NonceStore
from nexus_mcp.workspace.files import Workspace
from nexus_mcp.workspace.replay import LexicalPaths

if TYPE_CHECKING:
    from nexus_mcp.identity.oauth import FrontDoor  # HTTP only; imported there
    from nexus_mcp.providers.upstream.gateway import UpstreamGateway  # with an upstream only
    from nexus_mcp.repos.writes import RepoWrites  # with repositories only

log = get_logger(__name__)
# The audit outcome of a call the HTTP layer answered 403 insufficient_scope.
OUTCOME_INSUFFICIENT_SCOPE = "INSUFFICIENT_SCOPE"


@dataclass
class Runtime:
    """Everything the chain and the tools share for the life of one server."""

    settings: Settings
    config_file: Path | None
    workspace: Workspace | LexicalPaths
    audit_log: AuditLog
    registry: RegistrySet
    enforcer: RegistryEnforcer
    idempotency: IdempotencyStore
    grants: TupleStore
    access: GrantedTools
    write_policies: WritePolicyConfig
    vaults: VaultRouter
    approval_keys: ApprovalKeys | None
    approval_settings: ApprovalSettings
    nonces: NonceStore
    targets: ToolTargets
    # The backend the stores above come from (stores/backends.py), with budgets and rates.
    state: StateStores
    # The one connector sequence every provider's calls run through (connector.py).
    connector: Connector
    # Every tool the chain knows (book.py); the providers register into it.
    book: ToolBook = field(default_factory=ToolBook)
    # HTTP: FastMCP's auth provider and the claims mapping (identity/oauth.py).
    front_door: FrontDoor | None = None
    upstreams: UpstreamGateway | None = None
    repos: RepoWrites | None = None
    # Which upstream writes may run, live or in a replay (which starts no upstream).
    upstream_writes: UpstreamWrites | None = None
    repos_config: ReposConfig | None = None
    recorder: Recorder | None = None  # serve --record
    observability: Observability | None = None  # metrics and per-call telemetry
    # The flow policy and the flow labels (policy/flow.py); its taint is in ``state``.
    flow: FlowConfig = field(default_factory=FlowConfig)
    # Tells connected callers their visible lists changed (server/notify.py).
    notifier: ChangeNotifier | None = None
    identity: IdentityResolver = field(init=False)  # one resolver for MCP and plain routes
    _registry_summary: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # Launch settings given without a subject narrow the dev principal against the
        # loaded profiles and what the namespace selects for it (policy/launch.py).
        try:
            self.identity = build_identity(
                self.settings,
                profiles=self.access.profiles,
                profile_of=self.access.select,
                mapper=self.front_door.mapper if self.front_door is not None else None,
            )
        except ConfigError:
            self.close()  # the stores are open already and no one else holds them
            raise

    @property
    def verifier(self) -> AuthProvider | None:
        """What checks a bearer token on HTTP (None: stdio, or dev without token settings)."""
        return self.front_door.provider if self.front_door is not None else None

    def scope_shortfall(self, access: Any, tool: str) -> frozenset[str]:
        """The scopes to challenge for when ``access`` calls ``tool`` (empty: no challenge).

        Only a tool the caller's profile grants is challenged (``missing_scopes``); the
        challenge names all the scopes the tool needs, from configuration.
        """
        principal = self.identity.resolve(
            transport="streamable-http",
            token_claims=access.claims,
            token_subject=access.subject,
            token=access.token,
            expires_at=access.expires_at,
        )
        if principal is None or not self.access.missing_scopes(principal, tool):
            return frozenset()
        # A refusal like any other: in the audit trail (the tool is one the caller may see).
        call_id = new_id()
        self.audit_log.emit(
            AuditEvent(
                event=TOOL_CALL_BLOCKED,
                tool_call_id=call_id,
                correlation_id=call_id,
                tool=tool,
                subject=principal.log_subject,
                role=principal.effective_role,
                outcome=OUTCOME_INSUFFICIENT_SCOPE,
                reason="insufficient_scope",
                transport="streamable-http",
            )
        )
        return self.access.scopes_for(tool) | frozenset(self.settings.auth.required_scopes)

    def registry_info(self) -> Mapping[str, Any] | None:
        # The registry is loaded once and never changes while the server runs.
        if self._registry_summary is None:
            self._registry_summary = self.registry.summary()
        return self._registry_summary

    def close(self) -> None:
        self.audit_log.close()
        self.state.close()
        if self.repos is not None:
            self.repos.catalog.close()
        if self.recorder is not None:
            self.recorder.close()


@dataclass
class NexusServer:
    mcp: FastMCP[Any]
    runtime: Runtime

    def close(self) -> None:
        self.runtime.close()


def grants_changed(runtime: Runtime, zone: str) -> None:
    if zone in ("*", runtime.settings.profiles.zone):
        runtime.access.forget()
        if runtime.notifier is not None:
            runtime.notifier.changed()
