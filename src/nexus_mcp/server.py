"""The composition root: builds the runtime, the chain and the FastMCP server, nothing else.

Nothing outside this module constructs stores, policies or middleware behind its back;
tests build a server with ``build_server(settings)`` and talk to ``server.mcp`` through a
real client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.auth import TokenVerifier
from fastmcp.server.auth.providers.jwt import JWTVerifier
from starlette.requests import Request
from starlette.responses import JSONResponse

from nexus_mcp import __version__
from nexus_mcp.audit import AuditLog, AuditSink, JsonlAuditSink
from nexus_mcp.calls import CallState
from nexus_mcp.chain import ChainLayers, build_middleware
from nexus_mcp.decorator import ConnectorCheck, ToolContract, bind_tool, contract_of
from nexus_mcp.errors import ConfigError
from nexus_mcp.identity import IdentityResolver
from nexus_mcp.ids import new_id
from nexus_mcp.logs import ensure_logging, get_logger
from nexus_mcp.middleware.audit import AuditMiddleware, AuditTrail
from nexus_mcp.middleware.envelope import EnvelopeMiddleware
from nexus_mcp.middleware.identity import IdentityMiddleware
from nexus_mcp.middleware.namespace import ToolNamespaceMiddleware
from nexus_mcp.policy.hashing import CONTENT_HASH_ALG
from nexus_mcp.principal import Principal
from nexus_mcp.settings import Settings
from nexus_mcp.tools.files import build_files_tools
from nexus_mcp.workspace import Workspace

log = get_logger(__name__)

INSTRUCTIONS = (
    "nexus-mcp serves tools over one workspace. Paths are workspace-relative. Write tools "
    "need an idempotency_key (any unique string; reuse it only to retry the same call). "
    "Refusals come back as JSON {error, code}; codes are stable."
)

ToolFunction = Callable[..., Awaitable[Any]]


class OpenNamespace:
    """Every registered tool is visible; read-only callers do not see write tools.

    The embedded default until grants are configured (see ``policy/grants.py``).
    """

    def __init__(self, contracts: Mapping[str, ToolContract]) -> None:
        self.all_tools = frozenset(contracts)
        self.read_tools = frozenset(n for n, c in contracts.items() if c.risk == "read")
        self.metrics = {"filtered": 0, "rejected": 0, "errors": 0}

    def visible_tools(self, principal: Principal) -> frozenset[str]:
        return self.read_tools if principal.read_only else self.all_tools

    def record_filtered(self, count: int) -> None:
        self.metrics["filtered"] += count

    def record_rejected(self) -> None:
        self.metrics["rejected"] += 1

    def record_error(self) -> None:
        self.metrics["errors"] += 1


@dataclass
class Runtime:
    """Everything the chain and the tools share for the life of one server."""

    settings: Settings
    config_file: Path | None
    workspace: Workspace
    audit_log: AuditLog
    contracts: dict[str, ToolContract] = field(default_factory=dict)
    connector_checks: list[ConnectorCheck] = field(default_factory=list)

    def registry_info(self) -> Mapping[str, Any] | None:
        return None

    def build_effect(self, contract: ToolContract, state: CallState) -> Mapping[str, Any]:
        return {
            "effect_id": new_id(),
            "tool_call_id": state.tool_call_id,
            "tool_name": contract.name,
            "document_hashes": [dict(h) for h in state.document_hashes or ()],
            "batch_total_bytes": state.batch_total_bytes or 0,
            "content_hash_alg": CONTENT_HASH_ALG,
        }

    def close(self) -> None:
        self.audit_log.close()


@dataclass
class NexusServer:
    mcp: FastMCP[Any]
    runtime: Runtime

    def close(self) -> None:
        self.runtime.close()


def build_verifier(settings: Settings) -> TokenVerifier | None:
    """FastMCP's JWT verifier for HTTP (we use it rather than verifying tokens ourselves)."""
    auth = settings.auth
    if not auth.enabled:
        return None
    if auth.jwt_secret is not None:
        return JWTVerifier(
            public_key=auth.jwt_secret.get_secret_value(),
            algorithm=auth.algorithm,
            audience=auth.audience,
            issuer=auth.issuer,
        )
    return JWTVerifier(
        jwks_uri=auth.jwks_url,
        algorithm=auth.algorithm if auth.algorithm != "HS256" else "RS256",
        audience=auth.audience,
        issuer=auth.issuer,
    )


def resolve_workspace(settings: Settings) -> Workspace:
    root = settings.workspace
    if root is None:
        raise ConfigError("no workspace: set --workspace or NEXUS_MCP_WORKSPACE")
    if not root.is_dir():
        raise ConfigError(f"workspace is not a folder: {root}")
    return Workspace(root)


def build_server(
    settings: Settings,
    *,
    config_file: Path | None = None,
    audit_sinks: Iterable[AuditSink] | None = None,
    extra_tools: Iterable[ToolFunction] = (),
) -> NexusServer:
    """Build a ready-to-run server. ``audit_sinks`` replaces the JSONL file (tests)."""
    ensure_logging()
    if settings.transport == "http" and not settings.is_dev and not settings.auth.enabled:
        raise ConfigError(
            "HTTP in prod mode needs token verification: set auth.jwt_secret "
            "(NEXUS_MCP_AUTH__JWT_SECRET) or auth.jwks_url (NEXUS_MCP_AUTH__JWKS_URL)"
        )
    workspace = resolve_workspace(settings)
    sinks = list(audit_sinks) if audit_sinks is not None else [JsonlAuditSink(settings.audit_path)]
    runtime = Runtime(
        settings=settings,
        config_file=config_file,
        workspace=workspace,
        audit_log=AuditLog(sinks),
    )
    functions: list[ToolFunction] = [*build_files_tools(workspace, settings), *extra_tools]
    for fn in functions:
        contract = contract_of(fn)
        if contract.name in runtime.contracts:
            raise ConfigError(f"two tools are named {contract.name}")
        runtime.contracts[contract.name] = contract

    trail = AuditTrail(runtime.audit_log, runtime.contracts, runtime.registry_info)
    layers = ChainLayers(
        envelope=EnvelopeMiddleware(),
        audit=AuditMiddleware(trail),
        identity=IdentityMiddleware(IdentityResolver(settings)),
        namespace=ToolNamespaceMiddleware(OpenNamespace(runtime.contracts)),
    )
    mcp: FastMCP[Any] = FastMCP(
        settings.server_name,
        instructions=INSTRUCTIONS,
        version=__version__,
        middleware=build_middleware(layers),
        auth=build_verifier(settings) if settings.transport == "http" else None,
        mask_error_details=True,
        strict_input_validation=True,
    )
    for fn in functions:
        contract = contract_of(fn)
        bound = bind_tool(
            fn,
            checks=runtime.connector_checks,
            build_effect=runtime.build_effect,
            on_started=trail.started,
        )
        mcp.tool(
            bound,
            name=contract.name,
            description=contract.description,
            annotations=contract.annotations(),
            meta=contract.meta(),
            tags={contract.toolset},
        )
    _add_health_routes(mcp, runtime)
    log.info(
        "server_built",
        mode=settings.mode,
        transport=settings.transport,
        tools=len(runtime.contracts),
    )
    return NexusServer(mcp=mcp, runtime=runtime)


def _add_health_routes(mcp: FastMCP[Any], runtime: Runtime) -> None:
    @mcp.custom_route("/healthz", methods=["GET"])
    async def healthz(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @mcp.custom_route("/readyz", methods=["GET"])
    async def readyz(_request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": "ready",
                "version": __version__,
                "mode": runtime.settings.mode,
                "tools": len(runtime.contracts),
                "registry": runtime.registry_info(),
            }
        )


__all__ = ["NexusServer", "OpenNamespace", "Runtime", "build_server", "build_verifier"]
