"""An upstream's own requests to the caller: sampling, elicitation, roots.

Off unless the upstream's ``forward`` section allows them (``sessions.build_client``
installs a handler only then). An allowed request goes only to the caller whose call is
in flight on that very session, and carries only what the upstream may ask for; what it
learns when the caller cannot answer is that, and nothing of why.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mcp.shared.exceptions import MCPDeprecationWarning

from nexus_mcp.observability.logs import get_logger
from nexus_mcp.providers.upstream.sessions import UpstreamSession

log = get_logger(__name__)


@contextlib.contextmanager
def relay_failure(kind: str) -> Iterator[None]:
    """What the upstream learns when the caller cannot answer: that, and nothing of why.

    Sampling, elicitation and roots are the handshake era's (the 2026-07-28 era has no
    back-channel for them); the SDK's deprecation warning says so on every relay.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            yield
    except Exception:  # noqa: BLE001 - never the caller's error text
        raise RuntimeError(f"{kind} is not available") from None


@dataclass(frozen=True)
class Caller:
    """The caller's MCP session and the id of its tools/call, taken in the caller's task
    (FastMCP's context finds the session through the request being served, which the
    upstream's relay request, arriving on another task, is not)."""

    session: Any
    request_id: Any
    # The caller's own ``_meta.progressToken``, if it asked for progress (``progress.py``):
    # used only towards the caller, never sent upstream.
    progress_token: str | int | None = None


def caller_context() -> Caller | None:
    """The caller of the tools/call being served, when there is one with a session."""
    from fastmcp.server.dependencies import get_context

    try:
        ctx = get_context()
        return Caller(ctx.session, ctx.request_id, _progress_token(ctx))
    except Exception:  # noqa: BLE001 - no request, or no session: nothing to relay to
        return None


def _progress_token(ctx: Any) -> str | int | None:
    request = ctx.request_context
    meta = getattr(request, "meta", None) if request is not None else None
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    # A string or an integer, as the spec says (bool is an int to Python: not a token).
    if isinstance(token, bool) or not isinstance(token, str | int):
        return None
    return token


def caller_on(session: UpstreamSession | None, kind: str, server_id: str) -> Caller:
    """The caller to relay to: one whose call is in flight on ``session``."""
    if session is None or not session.callers:
        raise RuntimeError(f"{kind} refused: no call of this session is in flight")
    ctx: Caller = session.callers[-1]
    log.info("upstream_request_relayed", server_id=server_id, kind=kind)
    return ctx


async def sample(ctx: Caller, params: Any) -> Any:
    # The upstream's messages and limits only; never "include_context" (that would
    # hand it the caller's other servers' context) nor its free-form metadata.
    with relay_failure("sampling"):
        return await ctx.session.create_message(
            messages=list(params.messages),
            max_tokens=params.max_tokens,
            system_prompt=params.system_prompt,
            temperature=params.temperature,
            stop_sequences=params.stop_sequences,
            model_preferences=params.model_preferences,
            related_request_id=ctx.request_id,
        )


async def elicit(ctx: Caller, params: Any) -> Any:
    schema = getattr(params, "requested_schema", None)
    if schema is None:
        raise RuntimeError("elicitation refused: only form elicitation is relayed")
    with relay_failure("elicitation"):
        return await ctx.session.elicit_form(
            params.message, schema, related_request_id=ctx.request_id
        )


async def roots_of(ctx: Caller) -> list[Any]:
    with relay_failure("roots"):
        listed = await ctx.session.list_roots()
    return list(listed.roots)


__all__ = ["Caller", "caller_context", "caller_on", "elicit", "relay_failure", "roots_of", "sample"]
