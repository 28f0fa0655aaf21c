"""LimitsMiddleware: per-session call budget, per-subject rate, per-tool timeout (step 8).

The timeout cancels the running call; file tools forbid their own commit once cancelled
(``workspace.commits.CommitGuard``), so a timed-out write never lands afterwards.
"""

from __future__ import annotations

from typing import Any

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from nexus_mcp.connector import chained_call
from nexus_mcp.errors import ToolTimeoutError
from nexus_mcp.middleware.deadlines import DeadlineWatch
from nexus_mcp.policy.budgets import CallLimits, ToolTimeouts


class LimitsMiddleware(Middleware):
    """Asks both limits of a call inline: in process they take microseconds, and the
    shared backend answers them in one Redis round trip (~0.2 ms; bounded by
    ``state.timeout_seconds`` when Redis does not answer). A worker-thread hop would cost
    as much again on every call (benchmarks/bench_replicas.py)."""

    def __init__(self, limits: CallLimits, timeouts: ToolTimeouts) -> None:
        self.limits = limits
        self.timeouts = timeouts
        self.deadlines = DeadlineWatch()  # asyncio.timeout's semantics, one timer per loop

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        state = chained_call(str(context.message.name))
        principal = state.principal
        assert principal is not None  # chained_call refuses a call without one
        subject = principal.subject
        session_key = state.session_key or f"principal:{subject}"
        self.limits.admit(subject, session_key)
        seconds = self.timeouts.timeout_for(state.tool_name)
        within = self.deadlines.within(seconds)
        try:
            async with within:
                return await call_next(context)
        except TimeoutError:
            if within.expired:
                raise ToolTimeoutError(timeout_seconds=seconds) from None
            raise


__all__ = ["LimitsMiddleware"]
