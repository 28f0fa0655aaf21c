"""What ``build_server`` reads and decides before it assembles anything: token
verification, the served workspace, the registry, the write policies and approval keys,
observability, and the start-up lines that say who callers act as."""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastmcp.server.auth import AuthProvider, TokenVerifier
from mcp.server.request_state import RequestStateSecurity
from pydantic import SecretStr

from nexus_mcp.contracts import ToolContract
from nexus_mcp.errors import ConfigError
from nexus_mcp.identity.resolver import (
    HTTP_TRANSPORTS,
    IdentityResolver,
)
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.observability.telemetry import Observability, build_observability, measured
from nexus_mcp.observability.tracing import configure_tracing
from nexus_mcp.policy.approvals import (
    ApprovalKeys,
    ApprovalSettings,
    has_approval_keys,
    load_approval_keys,
    load_approval_settings,
)
from nexus_mcp.policy.config_errors import split_problems
from nexus_mcp.policy.launch import describe_setting
from nexus_mcp.policy.registry import (
    RegistrySet,
    check_risk_parity,
    default_registry_dir,
    load_registry_dir,
)
from nexus_mcp.policy.repos import ReposConfig, load_repos_config
from nexus_mcp.policy.upstreams import (
    load_upstreams,
    resolve_secret,
)
from nexus_mcp.policy.write_policy import (
    PathGate,
    WritePolicyConfig,
    load_write_policy_config,
)
from nexus_mcp.server.runtime import Runtime
from nexus_mcp.settings import Settings, config_sections
from nexus_mcp.stores.backends import StateStores, request_state_keys
from nexus_mcp.stores.locations import (
    server_state_paths,
)
from nexus_mcp.workspace.files import Workspace

log = get_logger(__name__)


APPROVAL_REPLICAS_WARNING = (
    "--stateless-http with approval tokens on the embedded state backend: a used token is "
    "remembered in this server's data directory only, so replicas that do not share it can "
    "each accept the same token once; replicas need state.backend: shared (docs/replicas.md)"
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


def build_verifier(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> TokenVerifier | AuthProvider | None:
    """The one bearer-token check for HTTP: MCP requests and the plain routes alike.

    FastMCP's verifiers and OAuth providers, configured by ``identity/oauth.py``.
    """
    from nexus_mcp.identity.oauth import build_front_door  # HTTP only: the OAuth stack

    return build_front_door(settings, os.environ if environ is None else environ).provider


def resolve_workspace(settings: Settings, policies: WritePolicyConfig) -> Workspace:
    root = settings.workspace
    if root is None:
        raise ConfigError("no workspace: set --workspace or NEXUS_MCP_WORKSPACE")
    if not root.is_dir():
        raise ConfigError(f"workspace is not a folder: {root}")
    # The gate is the same policy the chain applies, asked again when a write acts.
    gate = PathGate(policies.policy_for_workspace())
    return Workspace(root, hidden=server_state_paths(settings, root), gate=gate)


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


def sealing(settings: Settings, environ: Mapping[str, str]) -> RequestStateSecurity | None:
    """FastMCP's own requestState sealing (AES-256-GCM, rotation ring), with the keys every
    replica shares; None keeps its per-process key (embedded backend, one process)."""
    keys = request_state_keys(settings, environ)
    if not keys:
        return None
    return RequestStateSecurity(keys=keys, audience=settings.server_name)


def warn_about_replicas(settings: Settings, approval_keys: ApprovalKeys | None) -> None:
    """Stateless HTTP is for replicas; approval nonces are only shared through one data dir."""
    if settings.stateless_http and approval_keys is not None and settings.state.backend != "shared":
        log.warning("approval_nonces_not_shared", message=APPROVAL_REPLICAS_WARNING)


def load_served_registry(settings: Settings) -> RegistrySet:
    pins = {sid: (pin.version, pin.digest) for sid, pin in settings.registry.pins.items()}
    return load_registry_dir(
        settings.registry.directory or default_registry_dir(),
        pins=pins,
        upstream_directory=settings.registry.upstream_directory,
    )


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


def section_problems(
    config_file: Path | None, environ: Mapping[str, str], *, mode: str | None = None
) -> list[str]:
    """The problems of the sections their own loaders read (``repos``, ``upstreams``,
    ``write_policies``, ``approvals``), one line each, for a start-up that already failed
    on the settings: the operator then sees every problem of the file in one run instead
    of one part per run. Nothing is opened, started or written.

    ``mode``: the mode the settings asked for, when it is one; else the file's own, else
    prod (whose checks are the stricter). The native server id is the default's: a bad
    ``registry.server_id`` is already one of the settings' problems.
    """
    try:
        sections = config_sections(config_file)
    except ConfigError:
        return []  # the file itself is unreadable: the settings said so
    if mode not in ("dev", "prod"):
        mode = sections.get("mode") if sections.get("mode") in ("dev", "prod") else "prod"
    assert mode is not None
    checks = (
        lambda: load_repos_config(sections.get("repos"), mode=mode, source=config_file),
        lambda: load_upstreams(
            sections.get("upstreams"), mode=mode, native_server_id="nexus", source=config_file
        ),
        lambda: load_write_policy_config(
            sections.get("write_policies"), mode=mode, source=config_file
        ),
        lambda: load_approval_settings(environ, sections),
        lambda: (
            load_approval_keys(environ, sections) if has_approval_keys(environ, sections) else None
        ),
    )
    lines: list[str] = []
    for check in checks:
        try:
            check()
        except ConfigError as exc:
            lines += split_problems(str(exc))
    return lines


def load_write_policies(
    sections: Mapping[str, Any], settings: Settings, *, source: Path | None = None
) -> WritePolicyConfig:
    config, warnings = load_write_policy_config(
        sections.get("write_policies"), mode=settings.mode, source=source
    )
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
    proxy = settings.auth.oidc_proxy
    for name, secret in (
        ("auth.jwt_secret", settings.auth.jwt_secret),
        ("auth.oidc_proxy.signing_key", proxy.signing_key if proxy is not None else None),
    ):
        if (
            keys is not None
            and secret is not None
            and any(
                hmac.compare_digest(keys.secret_for(kid) or b"", secret.get_secret_value().encode())
                for kid in keys.kids
            )
        ):
            # One secret for two kinds of token: a leak of either forges both.
            raise ConfigError(f"the approval secret must differ from {name}")
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
    """Every store of the backend behind a timing proxy (``observability/telemetry.Measured``)."""
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
        tools=runtime.book.contracts,
        cache=runtime.access.metrics,
        upstreams=(
            (lambda: {sid: s.state == "ready" for sid, s in upstreams.servers.items()})
            if upstreams is not None
            else None
        ),
    )
