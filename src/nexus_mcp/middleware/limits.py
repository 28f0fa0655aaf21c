"""LimitsMiddleware: per-session call budget, per-subject rate, per-tool timeout (step 8).

The timeout cancels the running call; file tools forbid their own commit once cancelled
(``workspace.CommitGuard``), so a timed-out write never lands afterwards.
"""

from __future__ import annotations

from typing import Any

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from nexus_mcp.calls import current_call
from nexus_mcp.deadlines import DeadlineWatch
from nexus_mcp.errors import ToolTimeoutError
from nexus_mcp.policy.budgets import CallBudget, RateLimiter, ToolTimeouts


class LimitsMiddleware(Middleware):
    def __init__(self, budget: CallBudget, rate: RateLimiter, timeouts: ToolTimeouts) -> None:
        self.budget = budget
        self.rate = rate
        self.timeouts = timeouts
        self.deadlines = DeadlineWatch()  # asyncio.timeout's semantics, one timer per loop

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        state = current_call()
        if state is None or state.principal is None:  # pragma: no cover - identity ran first
            return await call_next(context)
        self.rate.check(state.principal.subject)
        self.budget.charge(state.session_key or f"principal:{state.principal.subject}")
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
