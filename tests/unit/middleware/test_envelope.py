"""The envelope's request path: a client's malformed request is not a server fault."""

from __future__ import annotations

from typing import Any

import mcp_types
import pytest
from fastmcp.server.middleware import MiddlewareContext
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ValidationError

from nexus_mcp.middleware.envelope import (
    INTERNAL_JSONRPC_CODE,
    INVALID_PARAMS_MESSAGE,
    EnvelopeMiddleware,
    is_request_validation,
)

CANARY = "CANARY-ENVELOPE-31c"


class OurModel(BaseModel):
    count: int


def failure(model: Any, value: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        model.model_validate(value)
    return info.value


@pytest.mark.parametrize(
    ("error", "protocol"),
    [
        (failure(mcp_types.CallToolRequest, {"method": "tools/call", "params": CANARY}), True),
        (failure(mcp_types.CallToolRequestParams, {"name": 1}), True),
        (failure(mcp_types.InitializeRequest, {"method": "initialize", "params": {}}), True),
        (failure(mcp_types.ListToolsRequest, {"method": "tools/list", "params": 3}), True),
        (failure(OurModel, {"count": CANARY}), False),
        (failure(mcp_types.CallToolResult, {"content": CANARY}), False),  # a result: ours
    ],
    ids=["call", "call-params", "initialize", "list", "our-model", "result-model"],
)
def test_only_the_sdks_request_models_count_as_a_clients_malformed_request(
    error: ValidationError, protocol: bool
) -> None:
    assert is_request_validation(error) is protocol


async def answer(error: Exception) -> MCPError:
    async def failing(_: MiddlewareContext[Any]) -> Any:
        raise error

    context = MiddlewareContext(message={"params": CANARY}, method="tools/call", type="request")
    with pytest.raises(MCPError) as info:
        await EnvelopeMiddleware(max_request_bytes=1024).on_request(context, failing)
    return info.value


async def test_a_malformed_request_is_invalid_params_without_the_value() -> None:
    error = await answer(
        failure(mcp_types.CallToolRequest, {"method": "tools/call", "params": CANARY})
    )
    assert (error.error.code, error.error.message, error.error.data) == (
        -32602,
        INVALID_PARAMS_MESSAGE,
        "",
    )
    assert CANARY not in str(error.error.model_dump())


@pytest.mark.parametrize(
    "exc",
    [failure(OurModel, {"count": CANARY}), ValueError(CANARY), AttributeError(CANARY)],
    ids=["our-validation", "value-error", "attribute-error"],
)
async def test_a_real_failure_stays_a_masked_internal_error(exc: Exception) -> None:
    error = await answer(exc)
    assert (error.error.code, error.error.message) == (
        INTERNAL_JSONRPC_CODE,
        "Internal server error",
    )
    assert CANARY not in str(error.error.model_dump())
