"""The composition root: builds the runtime, the chain and the FastMCP server, nothing else.

Nothing outside this module constructs stores, policies or middleware behind its back;
tests build a server with ``build_server(settings)`` and talk to ``server.mcp`` through a
real client.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastmcp import FastMCP
from pydantic import BaseModel

from nexus_mcp._version import __version__
from nexus_mcp.book import Listing, ToolBook
from nexus_mcp.connector import Connector
from nexus_mcp.contracts import ToolContract, build_arguments_model, contract_of
from nexus_mcp.enforcement import RegistryConnectorCheck, RegistryEnforcer, ToolCallRecordCheck
from nexus_mcp.errors import ConfigError
from nexus_mcp.fixtures.integrity import resolve_fixture_key
from nexus_mcp.fixtures.secrets import SecretScanner, configured_secrets
from nexus_mcp.fixtures.store import FixtureWriter
from nexus_mcp.identity.access import GrantedTools
from nexus_mcp.identity.resolver import (
    check_launch_settings,
)
from nexus_mcp.middleware.approval import ApprovalMiddleware, WriteGate
from nexus_mcp.middleware.audit import AuditMiddleware, AuditTrail
from nexus_mcp.middleware.chain import ChainLayers, build_middleware
from nexus_mcp.middleware.classification import ClassificationMiddleware
from nexus_mcp.middleware.documents import DocumentsMiddleware
from nexus_mcp.middleware.envelope import EnvelopeMiddleware
from nexus_mcp.middleware.flow import FlowGuard
from nexus_mcp.middleware.identity import IdentityMiddleware
from nexus_mcp.middleware.inbox import Inbox, secret_args_of
from nexus_mcp.middleware.limits import LimitsMiddleware
from nexus_mcp.middleware.namespace import ToolNamespaceMiddleware
from nexus_mcp.middleware.output_scan import OutputScan
from nexus_mcp.notes.vaults import VaultRouter, check_canister_deadline
from nexus_mcp.observability.audit import AuditLog, AuditSink, JsonlAuditSink
from nexus_mcp.observability.audit_anchor import anchor_audit_sinks
from nexus_mcp.observability.logs import ensure_logging, get_logger
from nexus_mcp.policy.budgets import ToolTimeouts
from nexus_mcp.policy.flow import load_flow_config
from nexus_mcp.policy.pins import PinState
from nexus_mcp.policy.profiles import default_profiles_path, load_profiles
from nexus_mcp.policy.registry import (
    upstream_registry_dir,
)
from nexus_mcp.policy.repos import ReposConfig, load_repos_config
from nexus_mcp.policy.resources import NOTES_SOURCE
from nexus_mcp.policy.targets import TargetOf, ToolTargets, identify_folder
from nexus_mcp.policy.upstreams import (
    UpstreamWrites,
    load_upstreams,
)
from nexus_mcp.providers.native import ToolFunction, register_native_tools
from nexus_mcp.providers.note_resources import register_note_resources
from nexus_mcp.providers.recording import Recorder
from nexus_mcp.providers.tool_index import ToolIndex
from nexus_mcp.server.health import operator_token
from nexus_mcp.server.listen import add_listen_handler
from nexus_mcp.server.notify import ChangeNotifier
from nexus_mcp.server.replay import (
    load_replay_set,
    make_replayed_upstreams_known,
    native_catalog,
    native_registry_names,
    replay_hidden_parts,
    replay_stand_ins,
    replay_targets,
)
from nexus_mcp.server.routes import add_approval_routes, add_health_routes, add_metrics_route
from nexus_mcp.server.runtime import NexusServer, Runtime, grants_changed
from nexus_mcp.server.scope_challenge import bind_scope_check
from nexus_mcp.server.startup import (
    bind_observability,
    build_server_observability,
    build_verifier,
    check_registry_parity,
    load_approvals,
    load_served_registry,
    load_write_policies,
    log_effective_principal,
    measure_state,
    resolve_workspace,
    sealing,
    warn_about_replicas,
)
from nexus_mcp.settings import Settings, config_sections, trust_files
from nexus_mcp.stores.backends import StateStores, audit_replica, open_state
from nexus_mcp.stores.locations import (
    prepare_state,
)
from nexus_mcp.stores.sqlite_quarantine import open_quarantine_evidence
from nexus_mcp.tools.discovery import build_discovery_tools
from nexus_mcp.tools.files import TOOLSET as FILES_TOOLSET
from nexus_mcp.tools.files import build_files_tools
from nexus_mcp.tools.notes import TOOLSET as NOTES_TOOLSET
from nexus_mcp.tools.notes import build_notes_tools
from nexus_mcp.workspace.files import Workspace
from nexus_mcp.workspace.replay import LexicalPaths

if TYPE_CHECKING:
    # The upstream stack (FastMCP's client, its transports) is imported where an upstream
    # is configured or replayed, not by every server (issue 29: a stdio start without one).
    from nexus_mcp.providers.fixtures import ReplaySet  # serve --replay only
    from nexus_mcp.providers.upstream.gateway import UpstreamGateway
    from nexus_mcp.repos.writes import RepoWrites  # the repositories' too, where configured
    from nexus_mcp.server.subscribe import Subscriptions

log = get_logger(__name__)

INSTRUCTIONS = (
    "nexus-mcp serves tools over one workspace. Paths are workspace-relative. Write tools "
    "need an idempotency_key (any unique string; reuse it only to retry the same call). "
    "Refusals come back as JSON {error, code}; codes are stable."
)


def build_server(
    settings: Settings,
    *,
    config_file: Path | None = None,
    audit_sinks: Iterable[AuditSink] | None = None,
    extra_tools: Iterable[ToolFunction] = (),
    env: Mapping[str, str] | None = None,
) -> NexusServer:
    """Build a ready-to-run server. ``audit_sinks`` replaces the JSONL file (tests)."""
    ensure_logging()
    environ = dict(os.environ if env is None else env)
    sections = config_sections(config_file)
    # Settings made without load_settings (tests, embedders) learn here which files the
    # configuration names, so the file tools never reach them (state.server_state_paths).
    trust_files(settings, config_file, sections)
    repos_config = load_repos_config(sections.get("repos"), mode=settings.mode, source=config_file)
    # The repositories are opened (and checked) first; nothing else holds them if start-up
    # stops later, so they are closed here then. A replay opens none.
    repos = None
    if repos_config.enabled and settings.replay is None:
        from nexus_mcp.repos.catalog import RepoCatalog
        from nexus_mcp.repos.writes import RepoWrites

        repos = RepoWrites(RepoCatalog.open(repos_config, mode=settings.mode), environ)
    try:
        return _build_server(
            settings,
            config_file=config_file,
            audit_sinks=audit_sinks,
            extra_tools=extra_tools,
            environ=environ,
            sections=sections,
            repos_config=repos_config,
            repos=repos,
        )
    except BaseException:
        if repos is not None:
            repos.catalog.close()
        raise


def _build_server(
    settings: Settings,
    *,
    config_file: Path | None = None,
    audit_sinks: Iterable[AuditSink] | None = None,
    extra_tools: Iterable[ToolFunction],
    environ: dict[str, str],
    sections: Mapping[str, Any],
    repos_config: ReposConfig,
    repos: RepoWrites | None,
) -> NexusServer:
    if settings.transport == "http" and not settings.is_dev and not settings.auth.enabled:
        raise ConfigError(
            "HTTP in prod mode needs token verification: set auth.jwt_secret "
            "(NEXUS_MCP_AUTH__JWT_SECRET) or auth.jwks_url (NEXUS_MCP_AUTH__JWKS_URL), "
            "or sign callers in with your identity provider (auth.authorization_servers "
            "or auth.oidc_proxy, docs/oauth.md)"
        )
    # Before any state opens: discovery and the provider's configuration may stop start-up.
    front_door = None
    if settings.transport == "http":
        # Imported for HTTP only: the OAuth stack (FastMCP's proxies, their key-value
        # stores) and the console's templates cost a stdio server a second to start.
        from nexus_mcp.identity.oauth import build_front_door

        front_door = build_front_door(settings, environ)
    check_launch_settings(settings)  # before any state is created; build_identity decides
    write_policies = load_write_policies(sections, settings, source=config_file)
    replaying = settings.replay is not None
    # A replay serves no folder: the write policy judges paths as named (workspace/replay.py).
    workspace = (
        LexicalPaths(replay_hidden_parts(settings))
        if replaying
        else resolve_workspace(settings, write_policies)
    )
    # Every tool the chain knows, registered by the provider that serves it (book.py).
    book = ToolBook()
    vaults = VaultRouter(settings)
    # The discovery tools ask the namespace, which is built from the tool list below; the
    # late binding closes that loop without a global.
    late: dict[str, GrantedTools] = {}
    visible = lambda principal: late["access"].visible_tools(principal)  # noqa: E731
    stand_ins: list[ToolFunction] = []
    if repos is not None:
        from nexus_mcp.tools.repo import build_repo_tools
    if isinstance(workspace, Workspace):
        functions: list[ToolFunction] = [
            *build_files_tools(workspace, settings),
            *build_notes_tools(vaults.backend_for),
            *build_discovery_tools(book.catalog, visible),
            *(build_repo_tools(repos.catalog, repos, settings) if repos is not None else ()),
            *extra_tools,
        ]
    else:
        # Every native tool's contract, to check the recording against; none of them runs.
        stand_ins = replay_stand_ins(settings, book.catalog, visible, workspace, repos_config)
        functions = [*stand_ins, *extra_tools]
    contracts: dict[str, ToolContract] = {}
    for fn in functions:
        contract = contract_of(fn)
        if contract.name in contracts:
            raise ConfigError(f"two tools are named {contract.name}")
        contracts[contract.name] = contract
    argument_models = {contract_of(fn).name: build_arguments_model(fn) for fn in functions}
    native_contracts = dict(contracts)
    upstream_config = load_upstreams(
        sections.get("upstreams"),
        mode=settings.mode,
        native_server_id=settings.registry.server_id,
        source=config_file,
    )
    replay = None
    if settings.replay is not None:
        replay = load_replay_set(
            settings, functions, contracts, argument_models, upstream_config, environ
        )
        contracts = replay.contracts
        argument_models = {n: m for n, m in argument_models.items() if n in contracts}
    else:
        check_canister_deadline(
            settings, [name for name, c in contracts.items() if c.toolset == NOTES_TOOLSET]
        )

    registry = load_served_registry(settings)
    # The native tools' risks against the native registry (a replay's upstream tools are
    # classified by their own registries, as live).
    check_registry_parity(
        registry, settings, {n: c for n, c in contracts.items() if n in native_contracts}
    )
    enter_tools(book, settings, functions, argument_models, replay)
    enforcer = RegistryEnforcer(
        registry,
        server_id=settings.registry.server_id,
        mode=settings.mode,
        contracts=book.contracts,
        routes=book.routes,
    )
    approval_keys, approval_settings = load_approvals(
        sections, environ, settings, write_policies, repos_config
    )
    # Checked before any state is opened, as the rest of the configuration.
    gateway: type[UpstreamGateway] | None = None
    if upstream_config.servers and replay is None:
        from nexus_mcp.providers.upstream.gateway import UpstreamGateway as gateway
    upstream_plan = (
        gateway.plan(
            upstream_config,
            settings=settings,
            registry=registry,
            registry_dir=upstream_registry_dir(
                settings.registry.directory, settings.registry.upstream_directory
            ),
            native_tools=native_catalog(settings, registry, native_contracts),
            environ=environ,
        )
        if gateway is not None
        else None
    )
    recorder = (
        Recorder(
            FixtureWriter(
                settings.record,
                key=resolve_fixture_key(
                    settings.fixture_key,
                    is_dev=settings.is_dev,
                    environ=environ,
                    folder=settings.record,
                ),
            ),
            SecretScanner.of(configured_secrets(settings, sections, environ)),
        )
        if settings.record is not None
        else None
    )
    warn_about_replicas(settings, approval_keys)
    observability = build_server_observability(settings, environ)
    health_token = operator_token(settings, environ)
    prepare_state(settings)  # one line naming the setting, not a store's traceback
    sinks = (
        list(audit_sinks)
        if audit_sinks is not None
        else [JsonlAuditSink(settings.audit_path, max_bytes=settings.audit_max_bytes)]
    )
    audit_log = AuditLog(sinks)
    flow = load_flow_config(
        sections.get("flow"),
        mode=settings.mode,
        native_tools=native_contracts,
        upstream_ids=[server.server_id for server in upstream_config.servers],
        upstream_tools=registry.tool_names(s.server_id for s in upstream_config.servers),
        source=config_file,
    )
    state = measure_state(
        open_state(settings, environ, taint_ttl_seconds=flow.taint_ttl_seconds), observability
    )
    # Shared backend: each audit file's head is anchored in PostgreSQL, out of reach.
    anchor_audit_sinks(sinks, state.audit_heads, replica=audit_replica(settings))
    try:
        registry_summary = functools.cache(registry.summary)  # loaded once, never changes
        trail = AuditTrail(audit_log, book.contracts, registry_summary)
        connector = Connector(
            # The registry re-check, then the call's tool_call record (seed 000, 9.2.2).
            [RegistryConnectorCheck(enforcer), ToolCallRecordCheck(enforcer)],
            effect=enforcer.call_effect,
            started=trail.started,
            nonces=state.nonces,
            finished=recorder.record_call if recorder is not None else None,
            scanner=OutputScan(settings.output_scanning),
        )
        upstreams = (
            gateway.build(
                upstream_plan,
                connector=connector,
                audit=audit_log,
                recorder=recorder,
                **quarantine_evidence(settings, state),
            )
            if gateway is not None and upstream_plan is not None
            else None
        )
        profiles = load_profiles(
            settings.profiles.file or default_profiles_path(),
            known_tools=[
                *contracts,
                *(upstreams.known_names() if upstreams else ()),
                # Classified native tools of a toolset this deployment does not mount (the
                # repo toolset without repos:) are optional, not typos.
                *native_registry_names(registry, settings.registry.server_id),
            ],
            # The note resources and every configured upstream's; a typo is a warning.
            known_resources=[NOTES_SOURCE, *(s.server_id for s in upstream_config.servers)],
        )
        write_tools = [name for name, c in contracts.items() if c.tool_class == "write"]
        runtime = Runtime(
            settings=settings,
            config_file=config_file,
            workspace=workspace,
            audit_log=audit_log,
            registry=registry,
            enforcer=enforcer,
            idempotency=state.idempotency,
            grants=state.grants,
            access=GrantedTools(
                state.grants,
                profiles,
                write_tools=write_tools,
                required_scopes={n: c.required_scopes for n, c in contracts.items()},
                tool_scopes=settings.auth.tool_scopes,
                zone=settings.profiles.zone,
                cache_ttl_seconds=settings.profiles.cache_ttl_seconds,
            ),
            write_policies=write_policies,
            vaults=vaults,
            approval_keys=approval_keys,
            approval_settings=approval_settings,
            nonces=state.nonces,
            targets=(
                build_targets(workspace, vaults, book, repos)
                if isinstance(workspace, Workspace)
                else replay_targets(settings, book)
            ),
            book=book,
            connector=connector,
            front_door=front_door,
            upstreams=upstreams,
            repos=repos,
            upstream_writes=UpstreamWrites(upstream_config, mode=settings.mode),
            repos_config=repos_config,
            recorder=recorder,
            state=state,
            observability=observability,
            flow=flow,
        )
    except BaseException:
        state.close()  # Runtime closes them itself once built
        audit_log.close()
        raise
    # A grant change on any replica reaches this one's visible-tools cache at once (the
    # cache's revision refresh and TTL remain the backstop).
    state.watch_grants(lambda zone: grants_changed(runtime, zone))
    runtime.notifier = ChangeNotifier(
        runtime.access, zone=settings.profiles.zone, poll_revision=not state.shared
    )
    bind_observability(runtime)
    late["access"] = runtime.access
    runtime.access.grant_profiles()
    if replay is not None:
        make_replayed_upstreams_known(runtime, replay)
    mcp: FastMCP[Any] = FastMCP(
        settings.server_name,
        instructions=INSTRUCTIONS,
        version=__version__,
        lifespan=upstreams.lifespan if upstreams is not None else None,
        middleware=build_middleware(build_layers(runtime, trail)),
        auth=runtime.verifier,
        mask_error_details=True,
        strict_input_validation=True,
        dereference_schemas=False,  # chain.build_middleware places it, after filtering
        request_state_security=sealing(settings, environ),
    )
    if front_door is not None and front_door.provider is not None:
        # The step-up answer (403 insufficient_scope) is made at the HTTP layer.
        bind_scope_check(mcp, runtime.scope_shortfall, metadata_url=front_door.metadata_url)
    runtime.notifier.bind(mcp)
    index = ToolIndex(mcp)  # by-name lookup for tools/call, FastMCP's innermost transform
    mcp.add_transform(index)
    if replay is not None:
        from nexus_mcp.providers.fixtures import FixtureProvider

        provider = FixtureProvider(
            replay.records,
            replay.calls,
            contracts=book.contracts,
            argument_models=book.argument_models,
            # The native tools' own bodies over stand-ins: the refusals they make from
            # their arguments alone are made in replay too, by the same code.
            connector=connector,
            prechecks={contract_of(fn).name: fn for fn in stand_ins},
        )
        mcp.add_provider(provider)
        log.info(
            "fixtures_replaying",
            tools=len(replay.records),
            calls=sum(len(answers) for answers in replay.calls.values()),
        )
    else:
        native = register_native_tools(
            mcp,
            index,
            functions,
            argument_models=book.argument_models,
            connector=connector,
        )
        if recorder is not None:
            for tool in native:
                recorder.record_tool(settings.registry.server_id, tool, book.contracts[tool.name])
            log.info("fixtures_recording", tools=len(native))
        if settings.notes.backend == "local":
            # The notes as resources, read through the notes rules (providers/note_resources.py);
            # the canister hands over parsed notes, not files, so it serves none.
            register_note_resources(
                mcp, vaults, max_bytes=settings.limits.max_read_bytes, scanner=connector.scanner
            )
    subscriptions: Subscriptions | None = None
    if upstreams is not None:
        from nexus_mcp.providers.upstream.subscriptions import SubscriptionRelay
        from nexus_mcp.server.subscribe import add_subscription_handlers

        upstreams.bind(book, runtime.access, runtime.targets)
        upstreams.on_published = runtime.notifier.changed
        mcp.add_provider(upstreams.provider)
        # resources/subscribe of an upstream's resource, relayed per caller.
        relay = SubscriptionRelay(
            upstreams.servers,
            may_read=lambda principal, source: (
                source in runtime.access.visible_resource_sources(principal)
            ),
        )
        subscriptions = add_subscription_handlers(mcp, relay, runtime.access, audit_log)
    # The 2026-07-28 era's change notifications and resource updates: per-caller streams.
    add_listen_handler(mcp, runtime.notifier, subscriptions, audit_log)
    add_health_routes(mcp, runtime, health_token)
    add_metrics_route(mcp, runtime)
    add_approval_routes(mcp, runtime)
    if settings.transport == "http" and settings.console.enabled:
        from nexus_mcp.console.app import add_console_routes
        from nexus_mcp.server.console import console_services

        add_console_routes(mcp, console_services(runtime, environ))
    log.info(
        "server_built",
        mode=settings.mode,
        transport=settings.transport,
        tools=len(book.contracts),
        registry=registry.summary(),
    )
    log_effective_principal(runtime.identity, settings.transport)
    return NexusServer(mcp=mcp, runtime=runtime)


def quarantine_evidence(settings: Settings, state: StateStores) -> dict[str, Any]:
    """Where the upstreams keep their quarantine evidence: the store every replica shares
    (issue 15), or a file in the data directory kept across restarts (issue 22)."""
    if state.shared:
        from nexus_mcp.stores.redis_quarantine import RedisSeenDigests

        return {"seen": RedisSeenDigests(state.redis, settings.state.key_prefix)}
    return {"persisted": open_quarantine_evidence(settings)}


def build_layers(runtime: Runtime, trail: AuditTrail) -> ChainLayers:
    """One middleware per slot of DESIGN.md's chain; ``middleware/chain.build_middleware``
    orders them."""
    settings = runtime.settings
    budgets = settings.budgets
    return ChainLayers(
        envelope=EnvelopeMiddleware(settings.limits.max_request_bytes),
        audit=AuditMiddleware(
            trail, runtime.observability.telemetry if runtime.observability else None
        ),
        identity=IdentityMiddleware(
            runtime.identity, stateless_http=settings.stateless_http, tracker=runtime.notifier
        ),
        namespace=ToolNamespaceMiddleware(
            runtime.access,
            warm_up=runtime.upstreams.provider if runtime.upstreams is not None else None,
            hidden=runtime.upstreams.hidden_reason if runtime.upstreams is not None else None,
        ),
        classification=ClassificationMiddleware(
            runtime.enforcer,
            runtime.idempotency,
            targets=runtime.targets,
            wait_seconds=settings.registry.idempotency_wait_seconds,
            argument_models=runtime.book.argument_models,
            argument_checks=runtime.book.argument_checks,
        ),
        approval=ApprovalMiddleware(
            runtime.write_policies,
            runtime.workspace,
            keys=runtime.approval_keys,
            approval_settings=runtime.approval_settings,
            nonce_store=runtime.nonces,
            stateless_http=settings.stateless_http,
            connector_tools=runtime.book.contracts,
            enforcer=runtime.enforcer,
            elicit_profiles=frozenset(settings.approvals_elicit_profiles),
            profile_of=runtime.access.select,
            upstream_policy=runtime.upstream_writes.decide if runtime.upstream_writes else None,
            write_gates=repo_write_gates(runtime),
            inbox=Inbox(
                runtime.state.approval_requests,
                runtime.approval_settings,
                runtime.workspace,
                secret_args=functools.partial(secret_args_of, runtime.book.contracts),
            ),
            flow=(
                FlowGuard(
                    runtime.flow,
                    runtime.state.taint,
                    runtime.audit_log,
                    prompt_server=functools.partial(prompt_server, runtime),
                )
                if runtime.flow.enabled
                else None
            ),
        ),
        documents=DocumentsMiddleware(runtime.enforcer),
        limits=LimitsMiddleware(
            runtime.state.limits,
            ToolTimeouts(
                default_seconds=budgets.tool_timeout_seconds, overrides=dict(budgets.tool_timeouts)
            ),
        ),
    )


def prompt_server(runtime: Runtime, name: str) -> str | None:
    """The upstream whose prompt ``name`` is (its ``name_prefix`` starts it; prefixes never
    shadow each other), or None."""
    upstreams = runtime.upstreams
    if upstreams is None:
        return None
    owners = [s for s in upstreams.servers.values() if name.startswith(s.config.name_prefix)]
    return max(owners, key=lambda s: len(s.config.name_prefix)).server_id if owners else None


def repo_write_gates(runtime: Runtime) -> Mapping[str, WriteGate] | None:
    """The repository writes' gate: the repositories themselves, or in a replay (which
    opens none) their configured write policy alone (``repos/writes.py``)."""
    # Without either, the repositories' modules are never loaded.
    if runtime.repos is not None:
        from nexus_mcp.repos.writes import WRITE_OPERATIONS

        return dict.fromkeys(WRITE_OPERATIONS, runtime.repos)
    if runtime.settings.replay is not None and runtime.repos_config is not None:
        from nexus_mcp.repos.writes import WRITE_OPERATIONS, ConfiguredPolicyGate

        return dict.fromkeys(WRITE_OPERATIONS, ConfiguredPolicyGate(runtime.repos_config))
    return None


def build_targets(
    workspace: Workspace,
    vaults: VaultRouter,
    book: ToolBook,
    repos: RepoWrites | None = None,
) -> ToolTargets:
    """What each toolset's tools act on, for idempotency scopes (``policy/targets.py``).

    Files act on the served workspace folder, notes on the caller's vault; a toolset not
    named here has no target, so a write through it is refused rather than made
    idempotent against an unknown target. Providers added later name their own.
    """
    toolsets: dict[str, TargetOf] = {
        FILES_TOOLSET: lambda principal, _arguments: identify_folder(workspace.root),
        NOTES_TOOLSET: lambda principal, _arguments: vaults.target_for(principal),
    }
    if repos is not None:
        from nexus_mcp.tools.repo import TOOLSET as REPO_TOOLSET

        toolsets[REPO_TOOLSET] = repos.catalog.target_of
    targets = ToolTargets(toolsets, book.toolsets)
    untargeted = sorted(
        name
        for name, contract in book.contracts.items()
        if contract.tool_class == "write" and not targets.has_target(name)
    )
    if untargeted:
        log.warning("write_tools_without_target", tools=untargeted)
    return targets


def enter_tools(
    book: ToolBook,
    settings: Settings,
    functions: Sequence[ToolFunction],
    argument_models: Mapping[str, type[BaseModel]],
    replay: ReplaySet | None,
) -> None:
    """Register the tools this server is built with: the native ones, or a replay's
    recorded ones (whose upstream tools are known to the chain as a live gateway makes
    them known: their route in the registry and their argument check)."""
    if replay is None:
        for fn in functions:
            contract = contract_of(fn)
            model = argument_models[contract.name]
            book.add(
                contract,
                server_id=settings.registry.server_id,
                listing=Listing(
                    contract.description, model.model_json_schema(), contract.annotations()
                ),
                arguments_model=model,
            )
        return
    for name, record in replay.records.items():
        definition = record.definition
        check: Callable[[Mapping[str, Any]], None] | None = None
        route = None
        if record.upstream_tool is not None:
            from nexus_mcp.providers.upstream.tools import ToolView, check_arguments

            route = (record.server_id, record.upstream_tool)
            view = ToolView(
                upstream_name=record.upstream_tool,
                exposed_name=name,
                definition=definition,
                digest=record.digest,
                entry=None,
                pin_state=PinState.PINNED,
                status="exposed",
            )
            check = functools.partial(check_arguments, view)
        book.add(
            replay.contracts[name],
            server_id=record.server_id,
            listing=Listing(
                str(definition.get("description") or ""),
                dict(definition.get("inputSchema") or {}),
                dict(definition.get("annotations") or {}),
            ),
            arguments_model=argument_models.get(name),
            argument_check=check,
            route=route,
        )


# --- observability (docs/observability.md; observability/) -------------------------


__all__ = ["NexusServer", "Runtime", "build_layers", "build_server", "build_verifier"]
