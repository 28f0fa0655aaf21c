"""LimitsMiddleware: per-session call budget, per-subject rate, per-tool timeout (step 8).

The timeout cancels the running call; file tools forbid their own commit once cancelled
(``workspace.CommitGuard``), so a timed-out write never lands afterwards.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext

from nexus_mcp.calls import current_call
from nexus_mcp.deadlines import DeadlineWatch
from nexus_mcp.errors import ToolTimeoutError
from nexus_mcp.policy.budgets import CallBudget, RateLimiter, ToolTimeouts


class LimitsMiddleware(Middleware):
    """``offload``: the counters are a network store (the shared backend's Redis), so they
    are asked from a worker thread and a slow store never stalls the event loop; the
    in-process counters are answered inline (microseconds)."""

    def __init__(
        self,
        budget: CallBudget,
        rate: RateLimiter,
        timeouts: ToolTimeouts,
        *,
        offload: bool = False,
    ) -> None:
        self.budget = budget
        self.rate = rate
        self.timeouts = timeouts
        self.offload = offload
        self.deadlines = DeadlineWatch()  # asyncio.timeout's semantics, one timer per loop

    async def on_call_tool(
        self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]
    ) -> Any:
        state = current_call()
        if state is None or state.principal is None:  # pragma: no cover - identity ran first
            return await call_next(context)
        subject = state.principal.subject
        session_key = state.session_key or f"principal:{subject}"
        if self.offload:
            await asyncio.to_thread(self._charge, subject, session_key)
        else:
            self._charge(subject, session_key)
        seconds = self.timeouts.timeout_for(state.tool_name)
        within = self.deadlines.within(seconds)
        try:
            async with within:
                return await call_next(context)
        except TimeoutError:
            if within.expired:
                raise ToolTimeoutError(timeout_seconds=seconds) from None
            raise

    def _charge(self, subject: str, session_key: str) -> None:
        self.rate.check(subject)
        self.budget.charge(session_key)


__all__ = ["LimitsMiddleware"]
