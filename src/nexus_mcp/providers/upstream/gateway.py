"""The upstream gateway: every configured upstream server, wired into the one chain.

``UpstreamGateway.plan`` validates what start-up can know (secrets resolve, each upstream has
its registry file in prod, prefixes cannot shadow native tools, policies name tools that
exist) before anything is opened; ``UpstreamGateway.build`` creates one ``UpstreamServer``
per upstream. Every server runs its calls through the one ``Connector``
(``connector.py``), as native tools do. ``bind`` makes each upstream's tools known to the
chain's shared objects as they appear or go: their contract (audit, approval), their
route in the registry enforcer (``{server_id, tool_name}``), their idempotency target,
their catalog entry (discovery), and the set of tools that exist (namespace).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nexus_mcp.book import Listing, ToolBook
from nexus_mcp.connector import Connector
from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.quarantine import PersistedEvidence, SeenDigests
from nexus_mcp.policy.registry import RegistrySet
from nexus_mcp.policy.sandbox import SandboxLaunch
from nexus_mcp.policy.targets import TargetOf, identify_upstream
from nexus_mcp.policy.upstreams import (
    ResolvedSecrets,
    UpstreamConfig,
    UpstreamsConfig,
    name_key,
    resolve_secrets,
    shadowed_names,
)
from nexus_mcp.providers.upstream.provider import UpstreamProvider
from nexus_mcp.providers.upstream.sandboxes import plan_upstream_sandboxes
from nexus_mcp.providers.upstream.server import UpstreamServer
from nexus_mcp.providers.upstream.tools import (
    UPSTREAM_TOOLSET_PREFIX,
    ToolView,
    UpstreamTool,
    check_arguments,
)
from nexus_mcp.settings import Settings

if TYPE_CHECKING:
    from nexus_mcp.identity.access import GrantedTools
    from nexus_mcp.observability.audit import AuditLog
    from nexus_mcp.policy.targets import ToolTargets
    from nexus_mcp.providers.recording import Recorder

log = get_logger(__name__)


@dataclass(frozen=True)
class UpstreamPlan:
    """The upstreams as checked at start-up, before any store is open (``plan``)."""

    config: UpstreamsConfig
    registry: RegistrySet
    registry_dir: Path
    native_tools: frozenset[str]
    mode: str
    max_result_bytes: int
    secrets: Mapping[str, ResolvedSecrets]
    sandboxes: Mapping[str, SandboxLaunch] = field(default_factory=dict)


@dataclass
class UpstreamGateway:
    config: UpstreamsConfig
    servers: dict[str, UpstreamServer]
    provider: UpstreamProvider
    mode: str
    registry: RegistrySet
    _book: ToolBook | None = None
    _access: GrantedTools | None = None
    _native: frozenset[str] = frozenset()
    _native_writes: frozenset[str] = frozenset()
    _catalog_names: frozenset[str] = frozenset()  # every native tool name, mounted or not
    # What each upstream's last publish registered: (tool, view) by exposed name.
    _published: dict[str, dict[str, tuple[UpstreamTool, ToolView]]] = field(default_factory=dict)
    _access_given: tuple[frozenset[str], frozenset[str]] | None = None
    _seen: dict[str, dict[str, UpstreamTool]] = field(default_factory=dict)  # last visible
    recorder: Recorder | None = None  # serve --record: the tools as they are published
    # Told after every publish: what callers may see may have changed (server/notify.py).
    on_published: Callable[[], None] | None = None

    @classmethod
    def plan(
        cls,
        config: UpstreamsConfig,
        *,
        settings: Settings,
        registry: RegistrySet,
        registry_dir: Path,
        native_tools: Collection[str],
        environ: Mapping[str, str],
    ) -> UpstreamPlan:
        """What start-up can know before anything is opened: the configuration holds (see
        the module docstring) and every upstream's secrets resolve. ``build`` then makes the
        servers from it once the stores they need are open."""
        check_upstreams(config, registry, registry_dir, native_tools, mode=settings.mode)
        for warning in config.warnings:
            log.warning("upstream_config", message=warning)
        return UpstreamPlan(
            config=config,
            registry=registry,
            registry_dir=registry_dir,
            native_tools=frozenset(native_tools),
            mode=settings.mode,
            max_result_bytes=settings.limits.max_read_bytes,
            secrets={s.server_id: resolve_secrets(s, environ) for s in config.servers},
            sandboxes=plan_upstream_sandboxes(
                config, settings=settings, registry_dir=registry_dir, environ=environ
            ),
        )

    @classmethod
    def build(
        cls,
        plan: UpstreamPlan,
        *,
        connector: Connector,
        audit: AuditLog,
        seen: SeenDigests | None = None,
        persisted: PersistedEvidence | None = None,
        recorder: Recorder | None = None,
        secrets: Mapping[str, ResolvedSecrets] | None = None,
    ) -> UpstreamGateway:
        """``connector``: the one connector sequence every upstream call runs through;
        ``audit``: the server's audit log. ``seen``: the quarantine evidence store
        every replica shares (``policy/quarantine.py``); None: each upstream keeps its own
        in process memory (one server process), and against its pins in ``persisted``
        (embedded backend: a file in the data directory, read back here). ``recorder``:
        ``serve --record``, which records each upstream's tools as they are published."""
        config, registry = plan.config, plan.registry
        servers: dict[str, UpstreamServer] = {}
        gateway_ref: list[UpstreamGateway] = []

        def on_change(server: UpstreamServer) -> None:
            if gateway_ref:
                gateway_ref[0].publish(server)

        for upstream in config.servers:
            servers[upstream.server_id] = UpstreamServer(
                upstream,
                secrets=plan.secrets[upstream.server_id],
                registry=registry,
                registry_dir=plan.registry_dir,
                mode=plan.mode,
                on_change=on_change,
                max_result_bytes=plan.max_result_bytes,
                seen=seen,
                connector=connector,
                audit=audit,
            )
            servers[upstream.server_id].sandbox = plan.sandboxes.get(upstream.server_id)
            if persisted is not None:
                servers[upstream.server_id].use_persisted(persisted)
        gateway = cls(
            config=config,
            servers=servers,
            provider=UpstreamProvider(servers.values()),
            mode=plan.mode,
            registry=registry,
            recorder=recorder,
        )
        gateway.reserve_native_names(plan.native_tools)
        gateway_ref.append(gateway)
        return gateway

    def reserve_native_names(self, names: Collection[str]) -> None:
        """Every native tool name, of every toolset, mounted here or not: no upstream tool
        is ever exposed under one of them, nor reached by a grant of one."""
        self._catalog_names = frozenset(names)
        reserved = frozenset(name_key(name) for name in names)
        for server in self.servers.values():
            server.reserved_keys = reserved

    def hidden_reason(self, name: str) -> tuple[str, str, str] | None:
        """Why ``name`` is an upstream tool's name that is hidden from everyone now:
        (server_id, its tool, the reason code), for the audit; None otherwise."""
        for server in self.servers.values():
            found = server.hidden_reason(name)
            if found is not None:
                return (server.server_id, *found)
        return None

    def known_names(self) -> list[str]:
        """Every name an upstream tool could be exposed under (for profile warnings)."""
        names = []
        for server in self.servers.values():
            registry = self.registry.get(server.server_id)
            for entry in registry.entries if registry is not None else ():
                exposed = server.config.exposed_name(entry.tool_name)
                if exposed is not None and server.config.allows(entry.tool_name):
                    names.append(exposed)
        return names

    def bind(self, book: ToolBook, access: GrantedTools, targets: ToolTargets) -> None:
        """Make each upstream's tools known as they appear or go: registered in ``book``
        (contract, route, argument check, toolset, catalog entry), the tools that exist
        told to ``access`` (namespace), and each upstream's idempotency target."""
        self._book = book
        self._access = access
        self._native = frozenset(book.contracts)
        self._native_writes = access.write_tools
        self._access_given = None  # told in full below
        self._seen.clear()
        for server in self.servers.values():
            endpoint = server.config.endpoint()
            target = identify_upstream(server.server_id, endpoint)
            targets.add_toolset(
                UPSTREAM_TOOLSET_PREFIX + server.server_id, _constant_target(target)
            )
        self._refresh_access()

    def publish(self, server: UpstreamServer) -> None:
        """An upstream's tools changed (listed, quarantined, down, back): tell the chain."""
        book = self._book
        if book is None:
            return
        visible = server.visible_tools()
        if visible is self._seen.get(server.server_id):
            # The very tool set published last (an upstream's tools are replaced as a
            # whole, never changed in place): only its prompts or resources changed.
            if self.on_published is not None:
                self.on_published()
            return
        self._seen[server.server_id] = visible
        before = self._published.get(server.server_id, {})
        for name in before.keys() - visible.keys():
            book.withdraw(name)
        published: dict[str, tuple[UpstreamTool, ToolView]] = {}
        for name, tool in visible.items():
            view = tool.view
            published[name] = (tool, view)
            held = before.get(name)
            if held is not None and held[0] is tool and held[1] == view:
                # Listed again as it was: the book holds it already. (Every listing of a
                # huge upstream publishes, several times: its tools, prompts, resources.)
                continue
            contract = server.contract_for(view)
            book.put(
                contract,
                server_id=server.server_id,
                listing=Listing(
                    str(view.definition.get("description") or ""),
                    dict(view.definition.get("inputSchema") or {}),
                    dict(tool.annotations.model_dump(by_alias=True, exclude_none=True))
                    if tool.annotations is not None
                    else {},
                ),
                argument_check=functools.partial(check_arguments, view),
                route=(server.server_id, view.upstream_name),
            )
            if self.recorder is not None:
                self.recorder.record_tool(
                    server.server_id, tool, contract, upstream_tool=view.upstream_name
                )
        self._published[server.server_id] = published
        self._refresh_access()
        if self.on_published is not None:
            self.on_published()

    def _refresh_access(self) -> None:
        access = self._access
        if access is None:
            return
        exposed: list[str] = []
        writes: set[str] = set()
        for server in self.servers.values():
            for name, tool in server.visible_tools().items():
                exposed.append(name)
                if tool.view.tool_class == "write":
                    writes.add(name)
        given = (frozenset(exposed), frozenset(writes))
        if given == self._access_given:
            return  # the same tools as last time: nothing to tell the namespace
        self._access_given = given
        access.set_tools(
            self._native | given[0],
            frozenset(self._native_writes | writes),
            upstream=exposed,
            native=self._catalog_names,
        )

    def summary(self) -> dict[str, Any]:
        return {sid: server.summary() for sid, server in sorted(self.servers.items())}

    @contextlib.asynccontextmanager
    async def lifespan(self, _server: Any) -> AsyncIterator[dict[str, Any]]:
        """FastMCP's lifespan: connect every upstream in the background, close on exit."""
        await self.provider.start()
        try:
            yield {}
        finally:
            await self.provider.close()


def _constant_target(target: str) -> TargetOf:
    return lambda _principal, _arguments: target


def check_upstreams(
    config: UpstreamsConfig,
    registry: RegistrySet,
    registry_dir: Path,
    native_tools: Collection[str],
    *,
    mode: str,
) -> None:
    """What start-up can check before connecting; every problem listed at once."""
    problems: list[str] = []
    for position, server in enumerate(config.servers):
        where = f"upstreams[{position}] ({server.server_id})"
        problems.extend(_shadow_problems(where, server, native_tools))
        upstream_registry = registry.get(server.server_id)
        if upstream_registry is None:
            message = f"{where}: no registry file {registry_dir / (server.server_id + '.json')}"
            if mode != "dev":
                problems.append(message + " (every upstream tool would be unclassified)")
            else:
                log.warning("upstream_without_registry", server_id=server.server_id)
        else:
            problems.extend(_policy_problems(where, server, upstream_registry.entries))
        # A bad lock file, or entry, quarantines that upstream's tools it cannot vouch
        # for (policy/pins.py); it never stops start-up: UpstreamServer logs and audits it.
        if server.write_policy is None and mode == "dev":
            log.warning(
                "upstream_write_policy",
                server_id=server.server_id,
                message="no write_policy: dev mode allows its write-class tools without approval",
            )
    if problems:
        raise ConfigError("invalid upstreams configuration:\n  " + "\n  ".join(problems))


def _shadow_problems(where: str, server: UpstreamConfig, native: Collection[str]) -> list[str]:
    """An exposed name is never a native tool's, of any toolset, mounted here or not (a
    grant written for the native tool would reach the upstream one): a prefix that begins
    a native name, case and Unicode variants included, stops start-up."""
    shadowed = shadowed_names(server.name_prefix, native)
    if not shadowed:
        return []
    return [
        f"{where}: server_id {server.server_id!r} exposes its tools as "
        f"{server.name_prefix!r}<tool>, which could shadow native tools "
        f"({', '.join(shadowed[:3])}); set another server_id or prefix"
    ]


def _policy_problems(where: str, server: UpstreamConfig, entries: Any) -> list[str]:
    classes = {entry.tool_name: entry.tool_class for entry in entries}
    problems = []
    policy = server.write_policy
    for tool in policy.allowed_tools if policy is not None else ():
        if tool not in classes:
            problems.append(
                f"{where}: write_policy.allowed_tools names {tool!r}, not in its registry"
            )
        elif classes[tool] != "write":
            problems.append(f"{where}: write_policy.allowed_tools names {tool!r}, a read tool")
    for tool in server.tools or ():
        if tool not in classes:
            log.warning("upstream_allowlist_unclassified", server_id=server.server_id, tool=tool)
    return problems


__all__ = ["UpstreamGateway", "UpstreamPlan", "check_upstreams"]
