"""The composition root: builds the runtime, the chain and the FastMCP server, nothing else.

Nothing outside this module constructs stores, policies or middleware behind its back;
tests build a server with ``build_server(settings)`` and talk to ``server.mcp`` through a
real client.
"""

from __future__ import annotations

import functools
import hmac
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from fastmcp import FastMCP
from fastmcp.server.auth import TokenVerifier
from mcp.server.request_state import RequestStateSecurity
from pydantic import BaseModel, SecretStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nexus_mcp import __version__
from nexus_mcp.book import ToolCatalog
from nexus_mcp.calls import CallState
from nexus_mcp.contracts import (
    ConnectorCheck,
    NexusTool,
    ToolContract,
    build_arguments_model,
    contract_of,
)
from nexus_mcp.enforcement import RegistryConnectorCheck, RegistryEnforcer, ToolCallRecordCheck
from nexus_mcp.errors import ConfigError, InvalidInputError, NotFoundError
from nexus_mcp.fixtures.integrity import resolve_fixture_key
from nexus_mcp.fixtures.secrets import SecretScanner, configured_secrets
from nexus_mcp.fixtures.store import FixtureWriter, has_macs
from nexus_mcp.identity.access import GrantedTools
from nexus_mcp.identity.bearer import BearerTokenVerifier
from nexus_mcp.identity.resolver import (
    HTTP_TRANSPORTS,
    IdentityResolver,
    build_identity,
    check_launch_settings,
)
from nexus_mcp.middleware.approval import ApprovalMiddleware, WriteGate
from nexus_mcp.middleware.audit import AuditMiddleware, AuditTrail
from nexus_mcp.middleware.chain import ChainLayers, build_middleware
from nexus_mcp.middleware.classification import ClassificationMiddleware
from nexus_mcp.middleware.documents import DocumentsMiddleware
from nexus_mcp.middleware.envelope import EnvelopeMiddleware
from nexus_mcp.middleware.identity import IdentityMiddleware
from nexus_mcp.middleware.limits import LimitsMiddleware
from nexus_mcp.middleware.namespace import ToolNamespaceMiddleware
from nexus_mcp.notes.vaults import VaultRouter, check_canister_deadline
from nexus_mcp.observability.audit import AuditLog, AuditSink, JsonlAuditSink
from nexus_mcp.observability.logs import ensure_logging, get_logger
from nexus_mcp.observability.telemetry import (
    Observability,
    build_observability,
    configure_tracing,
    measured,
    metrics_response,
)
from nexus_mcp.policy.approvals import (
    ApprovalKeys,
    ApprovalSettings,
    has_approval_keys,
    load_approval_keys,
    load_approval_settings,
    spend_approval,
)
from nexus_mcp.policy.budgets import ToolTimeouts
from nexus_mcp.policy.launch import describe_setting
from nexus_mcp.policy.pins import PinState, load_pins
from nexus_mcp.policy.profiles import default_profiles_path, load_profiles
from nexus_mcp.policy.registry import (
    DocumentSpec,
    RegistrySet,
    check_risk_parity,
    default_registry_dir,
    load_registry_dir,
    upstream_registry_dir,
)
from nexus_mcp.policy.repos import ReposConfig, is_safe_repo_name, load_repos_config
from nexus_mcp.policy.targets import ToolTargets, identify_folder
from nexus_mcp.policy.upstreams import (
    UpstreamsConfig,
    decide_upstream_write,
    load_upstreams,
    resolve_secret,
)
from nexus_mcp.policy.write_policy import (
    PathGate,
    WriteDecision,
    WritePolicyConfig,
    load_write_policy_config,
)
from nexus_mcp.providers.fixtures import (
    FixtureProvider,
    Recorder,
    ReplaySet,
    check_replay,
    listed_definition,
    replay_refusal,
)
from nexus_mcp.providers.native import ToolFunction, register_native_tools
from nexus_mcp.providers.tool_index import ToolIndex
from nexus_mcp.providers.upstream.gateway import UpstreamGateway
from nexus_mcp.providers.upstream.tools import ToolView, check_arguments
from nexus_mcp.repos.catalog import ARG_REPO, RepoCatalog
from nexus_mcp.repos.writes import WRITE_OPERATIONS as REPO_WRITE_TOOLS
from nexus_mcp.repos.writes import ConfiguredPolicyGate, RepoWrites
from nexus_mcp.server.health import NO_STORE, is_operator, operator_token, public_readiness
from nexus_mcp.server.routes import add_approval_routes
from nexus_mcp.settings import Settings, config_sections, trust_files
from nexus_mcp.stores.backends import StateStores, open_state, request_state_keys
from nexus_mcp.stores.grants import TupleStore
from nexus_mcp.stores.idempotency import IdempotencyStore
from nexus_mcp.stores.locations import (
    prepare_state,
    server_state_paths,
)
from nexus_mcp.stores.nonces import NonceStore
from nexus_mcp.stores.sqlite_quarantine import open_quarantine_evidence
from nexus_mcp.tools.discovery import build_discovery_tools
from nexus_mcp.tools.files import TOOLSET as FILES_TOOLSET
from nexus_mcp.tools.files import build_files_tools
from nexus_mcp.tools.notes import TOOLSET as NOTES_TOOLSET
from nexus_mcp.tools.notes import build_notes_tools
from nexus_mcp.tools.repo import TOOLSET as REPO_TOOLSET
from nexus_mcp.tools.repo import build_repo_tools
from nexus_mcp.workspace.files import LexicalPaths, ReachedTheWorld, ReplayWorkspace, Workspace

log = get_logger(__name__)

INSTRUCTIONS = (
    "nexus-mcp serves tools over one workspace. Paths are workspace-relative. Write tools "
    "need an idempotency_key (any unique string; reuse it only to retry the same call). "
    "Refusals come back as JSON {error, code}; codes are stable."
)

APPROVAL_REPLICAS_WARNING = (
    "--stateless-http with approval tokens on the embedded state backend: a used token is "
    "remembered in this server's data directory only, so replicas that do not share it can "
    "each accept the same token once; replicas need state.backend: shared (README, "
    '"Running several replicas")'
)

METRICS_NEED_BEARER = (
    "/metrics is not served in prod without 'metrics.bearer_token' "
    "(NEXUS_MCP_METRICS__BEARER_TOKEN, by reference); set it, and give your scraper the token"
)

# Start-up warning when callers would have no principal (prod stdio without a subject).
NO_PRINCIPAL_SETTINGS = ("subject", "role", "profile")
NO_PRINCIPAL_HINT = (
    f"set {describe_setting('subject')}, with {describe_setting('role')} or "
    f"{describe_setting('profile')} for more than the viewer's read tools"
)
NO_PRINCIPAL_HTTP_SETTINGS = ("auth.jwt_secret", "auth.jwks_url", "dev_principal.subject")
NO_PRINCIPAL_HTTP_HINT = (
    "set 'auth.jwt_secret' (NEXUS_MCP_AUTH__JWT_SECRET) or 'auth.jwks_url' "
    "(NEXUS_MCP_AUTH__JWKS_URL) so bearer tokens identify callers, or "
    "'dev_principal.subject' (NEXUS_MCP_DEV_PRINCIPAL__SUBJECT)"
)


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
    contracts: dict[str, ToolContract] = field(default_factory=dict)
    argument_models: dict[str, type[BaseModel]] = field(default_factory=dict)
    # Argument checks of tools without a model (upstream tools, by exposed name).
    argument_checks: dict[str, Callable[[Mapping[str, Any]], None]] = field(default_factory=dict)
    connector_checks: list[ConnectorCheck] = field(default_factory=list)
    verifier: TokenVerifier | None = None
    upstreams: UpstreamGateway | None = None
    repos: RepoWrites | None = None
    # serve --replay: the upstreams' configuration decides their writes (none is started).
    upstream_config: UpstreamsConfig | None = None
    repos_config: ReposConfig | None = None
    recorder: Recorder | None = None  # serve --record
    observability: Observability | None = None  # metrics and per-call telemetry
    identity: IdentityResolver = field(init=False)  # one resolver for MCP and plain routes
    _registry_summary: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # Launch settings given without a subject narrow the dev principal against the
        # loaded profiles and what the namespace selects for it (policy/launch.py).
        try:
            self.identity = build_identity(
                self.settings, profiles=self.access.profiles, profile_of=self.access.select
            )
        except ConfigError:
            self.close()  # the stores are open already and no one else holds them
            raise

    def registry_info(self) -> Mapping[str, Any] | None:
        # The registry is loaded once and never changes while the server runs.
        if self._registry_summary is None:
            self._registry_summary = self.registry.summary()
        return self._registry_summary

    def build_effect(self, contract: ToolContract, state: CallState) -> Mapping[str, Any]:
        return self.enforcer.effect(state, state.document_check)

    def before_run(self, contract: ToolContract, state: CallState) -> None:
        claims = state.pending_approval
        if claims is not None:
            state.pending_approval = None
            spend_approval(claims, self.nonces)

    def upstream_policy(self, server_id: str, tool_name: str) -> WriteDecision:
        if self.upstreams is not None:
            return self.upstreams.decide_write(server_id, tool_name)
        for server in self.upstream_config.servers if self.upstream_config is not None else ():
            if server.server_id == server_id:
                return decide_upstream_write(server, tool_name, mode=self.settings.mode)
        return WriteDecision(False, "upstream_no_policy")

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


def build_verifier(settings: Settings) -> TokenVerifier | None:
    """The one bearer-token verifier for HTTP: MCP requests and the plain routes alike.

    FastMCP's ``JWTVerifier`` (we use it rather than verifying tokens ourselves), subclassed
    only to add the RFC 7519 ``exp``/``nbf``/``iat`` checks it leaves out (``bearer.py``).
    """
    auth = settings.auth
    if not auth.enabled:
        return None
    require_exp = not auth.allow_tokens_without_exp
    if auth.jwt_secret is not None:
        return BearerTokenVerifier(
            public_key=auth.jwt_secret.get_secret_value(),
            algorithm=auth.algorithm,
            audience=auth.audience,
            issuer=auth.issuer,
            leeway_seconds=auth.leeway_seconds,
            require_exp=require_exp,
        )
    return BearerTokenVerifier(
        jwks_uri=auth.jwks_url,
        algorithm=auth.algorithm if auth.algorithm != "HS256" else "RS256",
        audience=auth.audience,
        issuer=auth.issuer,
        leeway_seconds=auth.leeway_seconds,
        require_exp=require_exp,
    )


def resolve_workspace(settings: Settings, policies: WritePolicyConfig) -> Workspace:
    root = settings.workspace
    if root is None:
        raise ConfigError("no workspace: set --workspace or NEXUS_MCP_WORKSPACE")
    if not root.is_dir():
        raise ConfigError(f"workspace is not a folder: {root}")
    # The gate is the same policy the chain applies, asked again when a write acts.
    gate = PathGate(policies.policy_for_workspace())
    return Workspace(root, hidden=server_state_paths(settings, root), gate=gate)


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
    repos_config = load_repos_config(sections.get("repos"), mode=settings.mode)
    # The repositories are opened (and checked) first; nothing else holds them if start-up
    # stops later, so they are closed here then. A replay opens none.
    repos = (
        RepoWrites(RepoCatalog.open(repos_config, mode=settings.mode), environ)
        if repos_config.enabled and settings.replay is None
        else None
    )
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
            "(NEXUS_MCP_AUTH__JWT_SECRET) or auth.jwks_url (NEXUS_MCP_AUTH__JWKS_URL)"
        )
    check_launch_settings(settings)  # before any state is created; build_identity decides
    write_policies = load_write_policies(sections, settings)
    replaying = settings.replay is not None
    # A replay serves no folder: the write policy judges paths as named (workspace.py).
    workspace = (
        LexicalPaths(replay_hidden_parts(settings))
        if replaying
        else resolve_workspace(settings, write_policies)
    )
    catalog = ToolCatalog()
    vaults = VaultRouter(settings)
    # The discovery tools ask the namespace, which is built from the tool list below; the
    # late binding closes that loop without a global.
    late: dict[str, GrantedTools] = {}
    visible = lambda principal: late["access"].visible_tools(principal)  # noqa: E731
    stand_ins: list[ToolFunction] = []
    if isinstance(workspace, Workspace):
        functions: list[ToolFunction] = [
            *build_files_tools(workspace, settings),
            *build_notes_tools(vaults.backend_for),
            *build_discovery_tools(catalog, visible),
            *(build_repo_tools(repos.catalog, repos, settings) if repos is not None else ()),
            *extra_tools,
        ]
    else:
        # Every native tool's contract, to check the recording against; none of them runs.
        stand_ins = replay_stand_ins(settings, catalog, visible, workspace, repos_config)
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
        sections.get("upstreams"), mode=settings.mode, native_server_id=settings.registry.server_id
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

    registry = load_registry(settings)
    # The native tools' risks against the native registry (a replay's upstream tools are
    # classified by their own registries, as live).
    check_registry_parity(
        registry, settings, {n: c for n, c in contracts.items() if n in native_contracts}
    )
    enforcer = RegistryEnforcer(
        registry, server_id=settings.registry.server_id, mode=settings.mode, contracts=contracts
    )
    approval_keys, approval_settings = load_approvals(
        sections, environ, settings, write_policies, repos_config
    )
    upstreams = (
        UpstreamGateway.build(
            upstream_config,
            settings=settings,
            registry=registry,
            registry_dir=upstream_registry_dir(
                settings.registry.directory, settings.registry.upstream_directory
            ),
            native_tools=native_catalog(settings, registry, native_contracts),
            environ=environ,
        )
        if upstream_config.servers and replay is None
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
    sinks = list(audit_sinks) if audit_sinks is not None else [JsonlAuditSink(settings.audit_path)]
    audit_log = AuditLog(sinks)
    state = measure_state(open_state(settings, environ), observability)
    try:
        profiles = load_profiles(
            settings.profiles.file or default_profiles_path(),
            known_tools=[
                *contracts,
                *(upstreams.known_names() if upstreams else ()),
                # Classified native tools of a toolset this deployment does not mount (the
                # repo toolset without repos:) are optional, not typos.
                *native_registry_names(registry, settings.registry.server_id),
            ],
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
                zone=settings.profiles.zone,
                cache_ttl_seconds=settings.profiles.cache_ttl_seconds,
            ),
            write_policies=write_policies,
            vaults=vaults,
            approval_keys=approval_keys,
            approval_settings=approval_settings,
            nonces=state.nonces,
            targets=(
                build_targets(workspace, vaults, contracts, repos)
                if isinstance(workspace, Workspace)
                else replay_targets(settings, contracts)
            ),
            contracts=contracts,
            argument_models=argument_models,
            # The registry re-check, then the call's tool_call record (seed 000, 9.2.2).
            connector_checks=[RegistryConnectorCheck(enforcer), ToolCallRecordCheck(enforcer)],
            verifier=build_verifier(settings) if settings.transport == "http" else None,
            upstreams=upstreams,
            repos=repos,
            upstream_config=upstream_config if replay is not None else None,
            repos_config=repos_config,
            recorder=recorder,
            state=state,
            observability=observability,
        )
    except BaseException:
        state.close()  # Runtime closes it itself once built
        raise
    # A grant change on any replica reaches this one's visible-tools cache at once (the
    # cache's revision refresh and TTL remain the backstop).
    state.watch_grants(lambda zone: _grants_changed(runtime, zone))
    bind_observability(runtime)
    late["access"] = runtime.access
    runtime.access.grant_profiles()
    if replay is not None:
        bind_replayed_upstreams(runtime, replay)
        for name, record in replay.records.items():
            contract = contracts[name]
            catalog.add(
                name=name,
                server_id=record.server_id,
                toolset=contract.toolset,
                description=str(record.definition.get("description") or ""),
                risk=contract.risk,
                input_schema=dict(record.definition.get("inputSchema") or {}),
                annotations=dict(record.definition.get("annotations") or {}),
            )
    else:
        for fn in functions:
            contract = contract_of(fn)
            catalog.add(
                name=contract.name,
                server_id=settings.registry.server_id,
                toolset=contract.toolset,
                description=contract.description,
                risk=contract.risk,
                input_schema=runtime.argument_models[contract.name].model_json_schema(),
                annotations=contract.annotations(),
            )
    trail = AuditTrail(runtime.audit_log, runtime.contracts, runtime.registry_info)
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
    index = ToolIndex(mcp)  # by-name lookup for tools/call, FastMCP's innermost transform
    mcp.add_transform(index)
    if replay is not None:
        provider = FixtureProvider(
            replay.records,
            replay.calls,
            contracts=runtime.contracts,
            argument_models=runtime.argument_models,
            # The native tools' own bodies over stand-ins: the refusals they make from
            # their arguments alone are made in replay too, by the same code.
            prechecks={contract_of(fn).name: fn for fn in stand_ins},
        )
        provider.hooks = (
            list(runtime.connector_checks),
            runtime.build_effect,
            trail.started,
            runtime.before_run,
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
            argument_models=runtime.argument_models,
            checks=runtime.connector_checks,
            build_effect=runtime.build_effect,
            on_started=trail.started,
            before_run=runtime.before_run,
            on_finished=recorder.record_call if recorder is not None else None,
        )
        if recorder is not None:
            for tool in native:
                recorder.record_tool(
                    settings.registry.server_id, tool, runtime.contracts[tool.name]
                )
            log.info("fixtures_recording", tools=len(native))
    if upstreams is not None:
        if state.shared:  # quarantine evidence every replica shares (issue 15)
            from nexus_mcp.stores.redis_quarantine import RedisSeenDigests

            upstreams.share_evidence(RedisSeenDigests(state.redis, settings.state.key_prefix))
        else:  # kept in the data directory across restarts (issue 22, item 15)
            upstreams.persist_evidence(open_quarantine_evidence(settings))
        upstreams.recorder = recorder
        upstreams.bind(runtime, catalog, trail)
        mcp.add_provider(upstreams.provider)
    _add_health_routes(mcp, runtime, health_token)
    _add_metrics_route(mcp, runtime)
    add_approval_routes(mcp, runtime)
    log.info(
        "server_built",
        mode=settings.mode,
        transport=settings.transport,
        tools=len(runtime.contracts),
        registry=registry.summary(),
    )
    log_effective_principal(runtime.identity, settings.transport)
    return NexusServer(mcp=mcp, runtime=runtime)


def log_effective_principal(identity: IdentityResolver, transport: str) -> None:
    """Say at start-up who callers act as (never a token or secret), and what does not apply."""
    described = identity.describe(transport)
    log.info("effective_principal", **described)
    if described["source"] == "none":
        # Every tool is hidden and tools/list is simply empty: say why, and what to set.
        on_http = transport in HTTP_TRANSPORTS
        log.warning(
            "no_principal",
            transport=transport,
            reason="no caller identity: every tool is hidden",
            settings=list(NO_PRINCIPAL_HTTP_SETTINGS if on_http else NO_PRINCIPAL_SETTINGS),
            hint=NO_PRINCIPAL_HTTP_HINT if on_http else NO_PRINCIPAL_HINT,
        )
    if identity.ignored:
        log.warning(
            "launch_settings_ignored",
            settings=list(identity.ignored),
            reason="on HTTP bearer tokens decide who the caller is",
        )


def build_layers(runtime: Runtime, trail: AuditTrail) -> ChainLayers:
    """One middleware per slot of DESIGN.md's chain; ``chain.build_middleware`` orders them."""
    settings = runtime.settings
    budgets = settings.budgets
    return ChainLayers(
        envelope=EnvelopeMiddleware(settings.limits.max_request_bytes),
        audit=AuditMiddleware(
            trail, runtime.observability.telemetry if runtime.observability else None
        ),
        identity=IdentityMiddleware(runtime.identity, stateless_http=settings.stateless_http),
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
            argument_models=runtime.argument_models,
            argument_checks=runtime.argument_checks,
        ),
        approval=ApprovalMiddleware(
            runtime.write_policies,
            runtime.workspace,
            keys=runtime.approval_keys,
            approval_settings=runtime.approval_settings,
            nonce_store=runtime.nonces,
            stateless_http=settings.stateless_http,
            connector_tools=runtime.contracts,
            enforcer=runtime.enforcer,
            elicit_profiles=frozenset(settings.approvals_elicit_profiles),
            profile_of=runtime.access.select,
            upstream_policy=runtime.upstream_policy,
            write_gates=repo_write_gates(runtime),
        ),
        documents=DocumentsMiddleware(runtime.enforcer),
        limits=LimitsMiddleware(
            runtime.state.limits,
            ToolTimeouts(
                default_seconds=budgets.tool_timeout_seconds, overrides=dict(budgets.tool_timeouts)
            ),
        ),
    )


def repo_write_gates(runtime: Runtime) -> Mapping[str, WriteGate] | None:
    """The repository writes' gate: the repositories themselves, or in a replay (which
    opens none) their configured write policy alone (``repos/writes.py``)."""
    if runtime.repos is not None:
        return dict.fromkeys(REPO_WRITE_TOOLS, runtime.repos)
    if runtime.settings.replay is not None and runtime.repos_config is not None:
        return dict.fromkeys(REPO_WRITE_TOOLS, ConfiguredPolicyGate(runtime.repos_config))
    return None


def build_targets(
    workspace: Workspace,
    vaults: VaultRouter,
    contracts: Mapping[str, ToolContract],
    repos: RepoWrites | None = None,
) -> ToolTargets:
    """What each toolset's tools act on, for idempotency scopes (``targets.py``).

    Files act on the served workspace folder, notes on the caller's vault; a toolset not
    named here has no target, so a write through it is refused rather than made
    idempotent against an unknown target. Providers added later name their own.
    """
    targets = ToolTargets(
        {
            FILES_TOOLSET: lambda principal, _arguments: identify_folder(workspace.root),
            NOTES_TOOLSET: lambda principal, _arguments: vaults.target_for(principal),
            **({REPO_TOOLSET: repos.catalog.target_of} if repos is not None else {}),
        },
        {name: contract.toolset for name, contract in contracts.items()},
    )
    untargeted = sorted(
        name
        for name, contract in contracts.items()
        if contract.tool_class == "write" and not targets.has_target(name)
    )
    if untargeted:
        log.warning("write_tools_without_target", tools=untargeted)
    return targets


class _Absent:
    """Stands in for what a replaying server never touches (a vault, a repository): a
    replayed tool's body that reaches it has made every check it makes from its
    arguments (``ReachedTheWorld``), and never reaches the world."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise ReachedTheWorld(self._what)


class _ReplayRepos:
    """The repositories of a replay, never opened: a repository tool's body gets as far as
    its own argument checks. The name is judged as ``RepoCatalog.get`` judges it (a name
    that is not a repository name is INVALID_INPUT; one the configuration does not hold
    is NOT_FOUND, unless dev mode serves any folder); what the tool then asks of the
    repository is ``ReachedTheWorld``."""

    def __init__(self, config: ReposConfig | None) -> None:
        self._config = config

    def get(self, name: object) -> Any:
        if not is_safe_repo_name(name):
            raise InvalidInputError(field=ARG_REPO)
        config = self._config
        known = config is not None and (name in config.repositories or config.dev_allow_all_repos)
        if not known:
            raise NotFoundError(reason="repository_not_found")
        return _Absent("repository")

    def __getattr__(self, name: str) -> Any:
        raise ReachedTheWorld("repositories")


def replay_stand_ins(
    settings: Settings,
    catalog: ToolCatalog,
    visible: Callable[[Any], Any],
    paths: LexicalPaths | None = None,
    repos_config: ReposConfig | None = None,
) -> list[ToolFunction]:
    """Every native toolset over stand-ins (``serve --replay`` answers every call from
    the recording): their contracts and argument models, and their bodies up to the
    first touch of a file, vault or repository (``workspace.ReplayWorkspace``)."""

    def no_vault(_principal: Any) -> Any:
        # A vault that is never read: the notes tools check the path before they read.
        return _Absent("vault")

    absent_repos: Any = _ReplayRepos(repos_config)
    workspace = cast(Workspace, ReplayWorkspace(paths or LexicalPaths()))
    return [
        *build_files_tools(workspace, settings),
        *build_notes_tools(no_vault),
        *build_discovery_tools(catalog, visible),
        *build_repo_tools(absent_repos, absent_repos, settings),
    ]


def replay_hidden_parts(settings: Settings) -> list[tuple[str, ...]]:
    """What a live server over ``workspace`` hides from the file tools, as relative parts
    (the recording folder, the data directory, the audit file...), for a replay to refuse
    by name (``LexicalPaths``). Nothing without a configured workspace: a replay has no
    folder to place them in."""
    if settings.workspace is None:
        return []
    root = settings.workspace.resolve()
    live = settings.model_copy(update={"record": settings.replay})
    parts: list[tuple[str, ...]] = []
    for path in server_state_paths(live, root):
        real = path.resolve()
        if real != root and root in real.parents:
            parts.append(real.relative_to(root).parts)
    return parts


def load_replay_set(
    settings: Settings,
    functions: Iterable[ToolFunction],
    contracts: Mapping[str, ToolContract],
    argument_models: Mapping[str, type[BaseModel]],
    upstream_config: UpstreamsConfig,
    environ: Mapping[str, str],
) -> ReplaySet:
    """The recording in ``settings.replay``, checked against this build and configuration
    (``ConfigError`` listing every problem)."""
    assert settings.replay is not None
    replay, problems = _check_recording(
        settings, settings.replay, functions, contracts, argument_models, upstream_config, environ
    )
    if problems:
        raise replay_refusal(settings.replay, problems)
    return replay


def check_recording(
    settings: Settings,
    directory: Path,
    *,
    sections: Mapping[str, Any],
    environ: Mapping[str, str],
) -> list[str]:
    """Every problem ``serve --replay`` start-up would refuse ``directory`` for, with these
    settings and configuration sections: the same check (``check_replay``) over the same
    build (``replay_stand_ins``). ``nexus-mcp fixtures verify`` runs it."""
    catalog = ToolCatalog()
    functions = replay_stand_ins(
        settings,
        catalog,
        lambda _principal: frozenset(),
        repos_config=load_repos_config(sections.get("repos"), mode=settings.mode),
    )
    contracts = {contract_of(fn).name: contract_of(fn) for fn in functions}
    argument_models = {contract_of(fn).name: build_arguments_model(fn) for fn in functions}
    upstream_config = load_upstreams(
        sections.get("upstreams"), mode=settings.mode, native_server_id=settings.registry.server_id
    )
    _replay, problems = _check_recording(
        settings, directory, functions, contracts, argument_models, upstream_config, environ
    )
    return problems


def _check_recording(
    settings: Settings,
    directory: Path,
    functions: Iterable[ToolFunction],
    contracts: Mapping[str, ToolContract],
    argument_models: Mapping[str, type[BaseModel]],
    upstream_config: UpstreamsConfig,
    environ: Mapping[str, str],
) -> tuple[ReplaySet, list[str]]:
    key = resolve_fixture_key(
        settings.fixture_key, is_dev=settings.is_dev, environ=environ, folder=directory
    )
    if key is None and has_macs(directory):
        log.warning(
            "fixtures_not_verified",
            reason="the recording is sealed (its lines carry MACs) but no fixture_key is "
            "configured: the MACs are not checked",
        )
    definitions = {}
    for fn in functions:
        contract = contract_of(fn)
        tool = NexusTool.bind(fn, contract, argument_models[contract.name])
        definitions[contract.name] = listed_definition(tool)
    configured = {server.server_id: server for server in upstream_config.servers}
    pins_dir = upstream_registry_dir(
        settings.registry.directory, settings.registry.upstream_directory
    )

    def exposed(server_id: str, tool: str) -> str | None:
        server = configured.get(server_id)
        return server.exposed_name(tool) if server is not None and server.allows(tool) else None

    def pin(server_id: str, tool: str) -> str | None:
        return load_pins(pins_dir, server_id).digests.get(tool) if server_id in configured else None

    registry = load_registry(settings)

    def risk(server_id: str, tool: str) -> str:
        # As live classifies an upstream tool (``ToolView.tool_class``): its registry
        # entry's class, a write without one.
        entry = registry.lookup(server_id, tool)
        return entry.tool_class if entry is not None else "write"

    def read_spec(server_id: str, tool: str) -> DocumentSpec | None:
        # The spec the enforcer measures a read's result with (``read_spec``).
        entry = registry.lookup(server_id, tool)
        if entry is None or not entry.is_document_op or entry.tool_class != "read":
            return None
        return entry.document_spec

    return check_replay(
        directory,
        native_server_id=settings.registry.server_id,
        native_contracts=contracts,
        native_definitions=definitions,
        upstream_exposed=exposed,
        upstream_pin=pin,
        upstream_risk=risk,
        read_spec=read_spec,
        key=key,
    )


def replay_targets(settings: Settings, contracts: Mapping[str, ToolContract]) -> ToolTargets:
    """A replay's writes act on the recording, whatever their toolset: idempotency records
    of a replay never match a live run's (or another recording's)."""
    assert settings.replay is not None
    target = identify_folder(settings.replay)
    return ToolTargets(
        {c.toolset: (lambda _principal, _arguments: target) for c in contracts.values()},
        {name: contract.toolset for name, contract in contracts.items()},
    )


def bind_replayed_upstreams(runtime: Runtime, replay: ReplaySet) -> None:
    """Recorded upstream tools, known to the chain as a live gateway makes them known:
    their route in the registry enforcer, their argument check, the tools that exist."""
    for name, record in replay.upstream_records.items():
        assert record.upstream_tool is not None
        runtime.enforcer.routes[name] = (record.server_id, record.upstream_tool)
        view = ToolView(
            upstream_name=record.upstream_tool,
            exposed_name=name,
            definition=record.definition,
            digest=record.digest,
            entry=None,
            pin_state=PinState.PINNED,
            status="exposed",
        )
        runtime.argument_checks[name] = functools.partial(check_arguments, view)
    writes = frozenset(n for n, c in runtime.contracts.items() if c.tool_class == "write")
    # A recorded upstream name that is a native tool's reaches no grant, as live.
    runtime.access.set_tools(
        frozenset(runtime.contracts),
        writes,
        upstream=list(replay.upstream_records),
        native=native_catalog(runtime.settings, runtime.registry, {}),
    )


def sealing(settings: Settings, environ: Mapping[str, str]) -> RequestStateSecurity | None:
    """FastMCP's own requestState sealing (AES-256-GCM, rotation ring), with the keys every
    replica shares; None keeps its per-process key (embedded backend, one process)."""
    keys = request_state_keys(settings, environ)
    if not keys:
        return None
    return RequestStateSecurity(keys=keys, audience=settings.server_name)


def _grants_changed(runtime: Runtime, zone: str) -> None:
    if zone in ("*", runtime.settings.profiles.zone):
        runtime.access.forget()


def warn_about_replicas(settings: Settings, approval_keys: ApprovalKeys | None) -> None:
    """Stateless HTTP is for replicas; approval nonces are only shared through one data dir."""
    if settings.stateless_http and approval_keys is not None and settings.state.backend != "shared":
        log.warning("approval_nonces_not_shared", message=APPROVAL_REPLICAS_WARNING)


def load_registry(settings: Settings) -> RegistrySet:
    pins = {sid: (pin.version, pin.digest) for sid, pin in settings.registry.pins.items()}
    return load_registry_dir(
        settings.registry.directory or default_registry_dir(),
        pins=pins,
        upstream_directory=settings.registry.upstream_directory,
    )


def native_catalog(
    settings: Settings, registry: RegistrySet, mounted: Mapping[str, ToolContract]
) -> frozenset[str]:
    """Every native tool name: each toolset's, whether this configuration mounts it or
    not (built over stand-ins, as a replay builds them), the native registry's, and the
    ones mounted here. No upstream tool is exposed under one of them
    (``providers/upstream/gateway``)."""
    names = {contract_of(fn).name for fn in replay_stand_ins(settings, ToolCatalog(), _no_one)}
    names.update(native_registry_names(registry, settings.registry.server_id))
    names.update(mounted)
    return frozenset(names)


def _no_one(_principal: Any) -> frozenset[str]:
    return frozenset()


def native_registry_names(registry: RegistrySet, server_id: str) -> list[str]:
    native = registry.get(server_id)
    return [entry.tool_name for entry in native.entries] if native is not None else []


def check_registry_parity(
    registry: RegistrySet, settings: Settings, contracts: Mapping[str, ToolContract]
) -> None:
    """A tool whose declared risk disagrees with the registry: refuse in prod, warn in dev."""
    mismatches = check_risk_parity(
        registry,
        server_id=settings.registry.server_id,
        declared_risks={name: c.risk for name, c in contracts.items()},
    )
    if not mismatches:
        return
    described = ", ".join(
        f"{m.tool_name} (declared {m.declared_risk}, registry {m.registry_class or 'unclassified'})"
        for m in mismatches
    )
    if not settings.is_dev:
        raise ConfigError(f"tool risks disagree with the registry: {described}")
    log.warning("registry_risk_mismatch", tools=[m.tool_name for m in mismatches])


def load_write_policies(sections: Mapping[str, Any], settings: Settings) -> WritePolicyConfig:
    config, warnings = load_write_policy_config(sections.get("write_policies"), mode=settings.mode)
    for warning in warnings:
        log.warning("write_policy", message=warning)
    return config


def load_approvals(
    sections: Mapping[str, Any],
    environ: Mapping[str, str],
    settings: Settings,
    policies: WritePolicyConfig,
    repos: ReposConfig | None = None,
) -> tuple[ApprovalKeys | None, ApprovalSettings]:
    """Approval keys and settings; a policy that requires approval without keys stops start-up."""
    approval_settings = load_approval_settings(environ, sections)
    keys = load_approval_keys(environ, sections) if has_approval_keys(environ, sections) else None
    jwt_secret = settings.auth.jwt_secret
    if (
        keys is not None
        and jwt_secret is not None
        and any(
            hmac.compare_digest(keys.secret_for(kid) or b"", jwt_secret.get_secret_value().encode())
            for kid in keys.kids
        )
    ):
        # With one secret and one audience an approval token would also verify as a bearer.
        raise ConfigError("the approval secret must differ from auth.jwt_secret")
    repo_policies = [r.write_policy for r in (repos.repositories.values() if repos else ())]
    needs_tokens = any(
        p.require_approval and p.approval_mode == "token"
        for p in (policies.workspace, *policies.vaults.values())
        if p is not None
    ) or any(p.needs_approval and p.approval_mode == "token" for p in repo_policies if p)
    if keys is None and needs_tokens:
        raise ConfigError(
            "the write policy requires approval but no approval secret is configured: "
            "set NEXUS_MCP_APPROVAL_SECRET (32+ bytes) or approvals.secret in the config file"
        )
    return keys, approval_settings


# --- observability (README "Observability"; observability.py) -----------------------


def build_server_observability(settings: Settings, environ: Mapping[str, str]) -> Observability:
    """Traces when the OTEL_* environment asks; metrics on the HTTP transport."""
    configure_tracing(environ)
    metrics = settings.metrics
    token = metrics.bearer_token
    if isinstance(token, SecretStr) and not settings.is_dev:
        raise ConfigError(
            "invalid setting 'metrics.bearer_token': give it by reference ({env: NAME} or "
            "{file: path}); inline secrets are for dev mode only"
        )
    if token is not None and not isinstance(token, SecretStr):
        token = resolve_secret(token, environ)
    enabled = metrics.enabled and settings.transport == "http"
    if enabled and token is None and not settings.is_dev:
        # Tool names, upstream ids and refusal counts are not for whoever reaches the port.
        log.warning("metrics_not_served", message=METRICS_NEED_BEARER)
        enabled = False
    return build_observability(
        metrics_enabled=enabled,
        native_server_id=settings.registry.server_id,
        bearer_token=token,
    )


def measure_state(state: StateStores, observability: Observability) -> StateStores:
    """Every store of the backend behind a timing proxy (``observability.Measured``)."""
    metrics = observability.metrics
    if metrics is None:
        return state
    state.grants = measured(state.grants, "grants", metrics)
    state.idempotency = measured(state.idempotency, "idempotency", metrics)
    state.nonces = measured(state.nonces, "nonces", metrics)
    state.limits = measured(state.limits, "limits", metrics)
    return state


def bind_observability(runtime: Runtime) -> None:
    """What the metrics read at scrape time: the exposed tool names (label values),
    the visible-tool cache's counters, each upstream's state."""
    observability = runtime.observability
    if observability is None:
        return
    upstreams = runtime.upstreams
    observability.bind(
        tools=runtime.contracts,
        cache=runtime.access.metrics,
        upstreams=(
            (lambda: {sid: s.state == "ready" for sid, s in upstreams.servers.items()})
            if upstreams is not None
            else None
        ),
    )


def _add_metrics_route(mcp: FastMCP[Any], runtime: Runtime) -> None:
    """``GET /metrics``: only when metrics are on (HTTP). The app's Host/Origin guard
    covers it like every route; a configured bearer token is required."""
    observability = runtime.observability
    if observability is None or observability.metrics is None:
        return

    @mcp.custom_route("/metrics", methods=["GET"])
    async def metrics(request: Request) -> Response:
        return metrics_response(observability, request.headers.get("authorization"))


def _add_health_routes(mcp: FastMCP[Any], runtime: Runtime, token: SecretStr | None) -> None:
    """``token``: ``health.bearer_token``, which unlocks ``/readyz``'s detail."""

    @mcp.custom_route("/healthz", methods=["GET"])
    async def healthz(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @mcp.custom_route("/readyz", methods=["GET"])
    async def readyz(request: Request) -> JSONResponse:
        summaries = runtime.upstreams.summary() if runtime.upstreams is not None else None
        public = public_readiness(summaries)
        header = request.headers.get("authorization")
        if header is None:
            # Whoever reaches the port: ready or not, and which component (health.py).
            return JSONResponse(public, headers=NO_STORE)
        if not is_operator(token, header):
            return JSONResponse(
                {"error": "authentication required"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer", **NO_STORE},
            )
        # The operator: the gateway serves on while an upstream is down or has quarantined
        # tools; it says which, by name (never a tool's text).
        detail: dict[str, Any] = {
            "status": public["status"],
            "components": public["components"],
            "version": __version__,
            "mode": runtime.settings.mode,
            "tools": len(runtime.contracts),
            "registry": runtime.registry_info(),
        }
        if summaries is not None:
            detail["upstreams"] = summaries
        return JSONResponse(detail, headers=NO_STORE)


__all__ = ["NexusServer", "Runtime", "build_layers", "build_server", "build_verifier"]
