"""``POST /approvals/mint``: server-side minting of approval tokens (seed 003, section 2).

Only an authenticated principal holding an approver role (``approver_roles``) may mint.
The request names the write tool, its exact arguments and the subject allowed to use the
token; the response carries the token. The secret never leaves the server and neither the
token nor the arguments are logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nexus_mcp._version import __version__
from nexus_mcp.errors import InvalidInputError
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.observability.telemetry import metrics_response
from nexus_mcp.policy.approvals import check_mintable_tool, mint_approval_token
from nexus_mcp.principal import Principal
from nexus_mcp.server.health import (
    NO_STORE,
    StoreProbe,
    is_operator,
    operator_reasons,
    public_readiness,
    readiness_status_code,
)

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from nexus_mcp.server.runtime import Runtime

log = get_logger(__name__)
MAX_MINT_BODY_BYTES = 16 * 1024 * 1024


class MintRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tool: str = Field(min_length=1, max_length=128)
    arguments: dict[str, Any]
    subject: str | None = Field(default=None, min_length=1, max_length=256)
    host_id: str = Field(default="http", min_length=1, max_length=128)


def _refuse(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": message, "code": code}, status_code=status, headers=NO_STORE)


async def authenticate(request: Request, runtime: Runtime) -> Principal | None:
    """The caller of a plain HTTP route: a verified bearer token, or dev's default principal."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if runtime.verifier is not None:
        if scheme.lower() != "bearer" or not token:
            return None
        access = await runtime.verifier.verify_token(token.strip())
        if access is None:
            return None
        # ``auth.required_scopes`` bind every request: FastMCP's middleware asks for them
        # on the MCP endpoint only, and a plain route checks the token itself.
        if not set(runtime.settings.auth.required_scopes) <= set(access.scopes or ()):
            return None
        return runtime.identity.resolve(
            transport="streamable-http",
            token_claims=access.claims,
            token_subject=access.subject,
            token=access.token,
            expires_at=access.expires_at,
        )
    return runtime.identity.resolve(
        transport="streamable-http", token_claims=None, token_subject=None
    )


def add_approval_routes(mcp: FastMCP[Any], runtime: Runtime) -> None:
    @mcp.custom_route("/approvals/mint", methods=["POST"])
    async def mint(request: Request) -> JSONResponse:
        if runtime.approval_keys is None:
            return _refuse(503, "approvals are not configured on this server", "APPROVAL_INVALID")
        principal = await authenticate(request, runtime)
        if principal is None:
            return _refuse(401, "authentication required", "APPROVAL_INVALID")
        if principal.effective_role not in runtime.settings.approver_roles:
            log.warning(
                "approval_mint_refused", subject=principal.log_subject, reason="not_approver"
            )
            return _refuse(
                403, "an approver role is required to mint approvals", "APPROVAL_INVALID"
            )
        body = await request.body()
        if len(body) > MAX_MINT_BODY_BYTES:
            return _refuse(413, "request body too large", "INVALID_INPUT")
        try:
            mint_request = MintRequest.model_validate_json(body)
        except ValidationError as exc:
            fields = sorted({str(e["loc"][0]) for e in exc.errors() if e.get("loc")})
            named = (
                f" for field '{fields[0]}'"
                if len(fields) == 1 and fields[0] in MintRequest.model_fields
                else ""
            )
            return _refuse(400, f"invalid input{named}", "INVALID_INPUT")
        contract = runtime.book.contracts.get(mint_request.tool)
        try:
            check_mintable_tool(contract.tool_class if contract is not None else None)
        except InvalidInputError as exc:
            return _refuse(400, exc.message, str(exc.code))
        try:
            token = mint_approval_token(
                runtime.approval_keys,
                runtime.approval_settings,
                approver=principal.subject,
                subject=mint_request.subject or principal.subject,
                tool=mint_request.tool,
                arguments=mint_request.arguments,
                host_id=mint_request.host_id,
            )
        except InvalidInputError as exc:  # arguments with no canonical JSON (NaN, Infinity)
            return _refuse(400, exc.message, str(exc.code))
        log.info("approval_minted", approver=principal.log_subject, tool=mint_request.tool)
        if runtime.observability is not None:
            runtime.observability.count_approval("minted")
        return JSONResponse(
            {"approval_token": token, "expires_in": runtime.approval_settings.ttl_seconds},
            headers=NO_STORE,
        )


__all__ = ["MintRequest", "add_approval_routes", "authenticate"]


def add_metrics_route(mcp: FastMCP[Any], runtime: Runtime) -> None:
    """``GET /metrics``: only when metrics are on (HTTP). The app's Host/Origin guard
    covers it like every route; a configured bearer token is required."""
    observability = runtime.observability
    if observability is None or observability.metrics is None:
        return

    @mcp.custom_route("/metrics", methods=["GET"])
    async def metrics(request: Request) -> Response:
        return metrics_response(observability, request.headers.get("authorization"))


def add_health_routes(mcp: FastMCP[Any], runtime: Runtime, token: SecretStr | None) -> None:
    """``token``: ``health.bearer_token``, which unlocks ``/readyz``'s detail."""

    @mcp.custom_route("/healthz", methods=["GET"])
    async def healthz(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    # Two round trips, each bounded by the store's own timeout, which names the failure
    # better (a pool that waited in vain: unreachable) than this bound would (timeout).
    store_timeout = 2 * runtime.settings.state.timeout_seconds + 0.5
    store = StoreProbe(runtime.state.probe, timeout=store_timeout)

    @mcp.custom_route("/readyz", methods=["GET"])
    async def readyz(request: Request) -> JSONResponse:
        header = request.headers.get("authorization")
        if header is not None and not is_operator(token, header):
            return JSONResponse(
                {"error": "authentication required"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer", **NO_STORE},
            )
        summaries = runtime.upstreams.summary() if runtime.upstreams is not None else None
        public = public_readiness(summaries, await store.reason())
        status_code = readiness_status_code(public)
        if header is None:
            # Whoever reaches the port: ready or not, which component and why (health.py).
            return JSONResponse(public, status_code=status_code, headers=NO_STORE)
        # The operator: the gateway serves on while an upstream is down or has quarantined
        # tools; it says which, by name (never a tool's text).
        detail: dict[str, Any] = {
            "status": public["status"],
            "components": public["components"],
            "reasons": operator_reasons(public, summaries),
            "version": __version__,
            "mode": runtime.settings.mode,
            "tools": len(runtime.book.contracts),
            "registry": runtime.registry_info(),
        }
        if summaries is not None:
            detail["upstreams"] = summaries
        return JSONResponse(detail, status_code=status_code, headers=NO_STORE)
