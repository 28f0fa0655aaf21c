"""The upstream gateway: every configured upstream server, wired into the one chain.

``UpstreamGateway.build`` validates what start-up can know (secrets resolve, each upstream
has its registry file in prod, prefixes cannot shadow native tools, policies name tools
that exist) and creates one ``UpstreamServer`` per upstream. ``bind`` hands the servers the
connector's hooks (the same checks, effect builder, audit start and approval spend as
native tools) and makes each upstream's tools known to the chain's shared objects as they
appear or go: their contract (audit, approval), their route in the registry enforcer
(``{server_id, tool_name}``), their idempotency target, their catalog entry (discovery),
and the set of tools that exist (namespace).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nexus_mcp.book import ToolCatalog
from nexus_mcp.errors import ConfigError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.quarantine import PersistedEvidence, SeenDigests
from nexus_mcp.policy.registry import RegistrySet
from nexus_mcp.policy.targets import TargetOf, identify_upstream
from nexus_mcp.policy.upstreams import (
    UpstreamConfig,
    UpstreamsConfig,
    decide_upstream_write,
    name_key,
    resolve_secrets,
    shadowed_names,
)
from nexus_mcp.policy.write_policy import WriteDecision
from nexus_mcp.providers.upstream.provider import UpstreamProvider
from nexus_mcp.providers.upstream.server import UpstreamServer
from nexus_mcp.providers.upstream.tools import UPSTREAM_TOOLSET_PREFIX, check_arguments
from nexus_mcp.settings import Settings

if TYPE_CHECKING:
    from nexus_mcp.middleware.audit import AuditTrail
    from nexus_mcp.providers.fixtures import Recorder
    from nexus_mcp.server.build import Runtime

log = get_logger(__name__)


@dataclass
class UpstreamGateway:
    config: UpstreamsConfig
    servers: dict[str, UpstreamServer]
    provider: UpstreamProvider
    mode: str
    registry: RegistrySet
    _runtime: Runtime | None = None
    _catalog: ToolCatalog | None = None
    _native: frozenset[str] = frozenset()
    _native_writes: frozenset[str] = frozenset()
    _catalog_names: frozenset[str] = frozenset()  # every native tool name, mounted or not
    _listed: dict[str, set[str]] = field(default_factory=dict)
    recorder: Recorder | None = None  # serve --record: the tools as listed, and every call

    @classmethod
    def build(
        cls,
        config: UpstreamsConfig,
        *,
        settings: Settings,
        registry: RegistrySet,
        registry_dir: Path,
        native_tools: Collection[str],
        environ: Mapping[str, str],
        seen: SeenDigests | None = None,
    ) -> UpstreamGateway:
        """``seen``: the quarantine evidence store (``policy/quarantine.py``); None: each
        upstream keeps its own in process memory (one server process)."""
        check_upstreams(config, registry, registry_dir, native_tools, mode=settings.mode)
        for warning in config.warnings:
            log.warning("upstream_config", message=warning)
        servers: dict[str, UpstreamServer] = {}
        gateway_ref: list[UpstreamGateway] = []

        def on_change(server: UpstreamServer) -> None:
            if gateway_ref:
                gateway_ref[0].publish(server)

        for upstream in config.servers:
            servers[upstream.server_id] = UpstreamServer(
                upstream,
                secrets=resolve_secrets(upstream, environ),
                registry=registry,
                registry_dir=registry_dir,
                mode=settings.mode,
                on_change=on_change,
                max_result_bytes=settings.limits.max_read_bytes,
                seen=seen,
            )
        gateway = cls(
            config=config,
            servers=servers,
            provider=UpstreamProvider(servers.values()),
            mode=settings.mode,
            registry=registry,
        )
        gateway.reserve_native_names(native_tools)
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

    def share_evidence(self, seen: SeenDigests) -> None:
        """Keep every upstream's quarantine evidence in ``seen``, the store every replica
        shares (the shared backend's, opened after the gateway is built); before start."""
        for server in self.servers.values():
            server.evidence = seen

    def persist_evidence(self, persisted: PersistedEvidence) -> None:
        """Keep every upstream's evidence against its pins in ``persisted`` (embedded
        backend: a file in the data directory) and read back what it held before a
        restart; before start."""
        for server in self.servers.values():
            server.use_persisted(persisted)

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

    def bind(self, runtime: Runtime, catalog: ToolCatalog, trail: AuditTrail) -> None:
        self._runtime = runtime
        self._catalog = catalog
        self._native = frozenset(runtime.contracts)
        self._native_writes = runtime.access.write_tools
        for server in self.servers.values():
            server.audit = runtime.audit_log
            server.hooks = (
                list(runtime.connector_checks),
                runtime.build_effect,
                trail.started,
                runtime.before_run,
            )
            if self.recorder is not None:
                server.on_finished = self.recorder.record_call
            endpoint = server.config.endpoint()
            target = identify_upstream(server.server_id, endpoint)
            runtime.targets.add_toolset(
                UPSTREAM_TOOLSET_PREFIX + server.server_id, _constant_target(target)
            )
        self._refresh_access()

    def publish(self, server: UpstreamServer) -> None:
        """An upstream's tools changed (listed, quarantined, down, back): tell the chain."""
        runtime, catalog = self._runtime, self._catalog
        if runtime is None or catalog is None:
            return
        toolset = UPSTREAM_TOOLSET_PREFIX + server.server_id
        visible = server.visible_tools()
        for name, tool in visible.items():
            view = tool.view
            runtime.contracts[name] = server.contract_for(view)
            runtime.enforcer.routes[name] = (server.server_id, view.upstream_name)
            runtime.argument_checks[name] = functools.partial(check_arguments, view)
            runtime.targets.add_tool(name, toolset)
            if self.recorder is not None:
                self.recorder.record_tool(
                    server.server_id,
                    tool,
                    runtime.contracts[name],
                    upstream_tool=view.upstream_name,
                )
        listed = self._listed.setdefault(server.server_id, set())
        for name in listed - set(visible):
            catalog.remove(name)
        for name, tool in visible.items():
            view = tool.view
            catalog.remove(name)
            catalog.add(
                name=name,
                server_id=server.server_id,
                toolset=toolset,
                description=str(view.definition.get("description") or ""),
                risk=view.tool_class,
                input_schema=dict(view.definition.get("inputSchema") or {}),
                annotations=dict(tool.annotations.model_dump(by_alias=True, exclude_none=True))
                if tool.annotations is not None
                else {},
            )
        self._listed[server.server_id] = set(visible)
        self._refresh_access()

    def _refresh_access(self) -> None:
        runtime = self._runtime
        if runtime is None:
            return
        exposed: list[str] = []
        writes: set[str] = set()
        for server in self.servers.values():
            for name, tool in server.visible_tools().items():
                exposed.append(name)
                if tool.view.tool_class == "write":
                    writes.add(name)
        runtime.access.set_tools(
            self._native | frozenset(exposed),
            frozenset(self._native_writes | writes),
            upstream=exposed,
            native=self._catalog_names,
        )

    def decide_write(self, server_id: str, tool_name: str) -> WriteDecision:
        server = self.servers.get(server_id)
        if server is None:
            return WriteDecision(False, "upstream_no_policy")
        return decide_upstream_write(server.config, tool_name, mode=self.mode)

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


__all__ = ["UpstreamGateway", "check_upstreams"]
