"""Per-call deadlines on one event-loop timer instead of one timer per call.

``asyncio.timeout`` schedules (and cancels) a ``TimerHandle`` for every call; measured in
the chain that is a visible share of each call's cost (benchmarks/README.md). A
``DeadlineWatch`` keeps the deadlines of the calls in flight in a dict and holds at most
one timer per loop, armed for the earliest deadline it knows. A call that starts with a
later deadline than the armed one costs a dict insert and delete; when the timer fires it
cancels every call whose deadline has passed and re-arms for the next one. Deadlines are
exact (the timer is never later than the earliest deadline), and a call cancelled by its
deadline ends in ``TimeoutError``, as with ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class _Deadline:
    __slots__ = ("cancelling", "expired", "task", "when")

    def __init__(self, task: asyncio.Task[object], when: float) -> None:
        self.task = task
        self.when = when
        self.expired = False
        self.cancelling = task.cancelling()  # cancel requests already pending at the start


class DeadlineWatch:
    """Deadlines for the calls of one event loop (create one per server)."""

    def __init__(self) -> None:
        self._active: dict[_Deadline, None] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def within(self, seconds: float) -> _Within:
        """``async with watch.within(s):`` raises ``TimeoutError`` once ``s`` seconds pass."""
        return _Within(self, seconds)

    def _enter(self, seconds: float) -> _Deadline:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:  # pragma: no cover - always inside a task on the MCP path
            raise RuntimeError("a deadline needs a running task")
        if loop is not self._loop:  # a new loop (tests): forget the old one's timer
            self._loop, self._handle, self._armed_at = loop, None, None
            self._active.clear()
        deadline = _Deadline(task, loop.time() + seconds)
        self._active[deadline] = None
        if self._armed_at is None or deadline.when < self._armed_at:
            self._arm(loop, deadline.when)
        return deadline

    def _leave(self, deadline: _Deadline) -> None:
        self._active.pop(deadline, None)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = loop.call_at(when, self._fire)
        self._armed_at = when

    def _fire(self) -> None:
        self._handle, self._armed_at = None, None
        loop = self._loop
        if loop is None:  # pragma: no cover
            return
        now = loop.time()
        earliest: float | None = None
        for deadline in list(self._active):
            if deadline.when <= now:
                deadline.expired = True
                del self._active[deadline]
                deadline.task.cancel()
            elif earliest is None or deadline.when < earliest:
                earliest = deadline.when
        if earliest is not None:
            self._arm(loop, earliest)

    def __len__(self) -> int:
        return len(self._active)


class _Within:
    __slots__ = ("_deadline", "_seconds", "_watch")

    def __init__(self, watch: DeadlineWatch, seconds: float) -> None:
        self._watch = watch
        self._seconds = seconds

    @property
    def expired(self) -> bool:
        """True once this block's deadline passed and cancelled it."""
        return self._deadline.expired

    async def __aenter__(self) -> None:
        self._deadline = self._watch._enter(self._seconds)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        deadline = self._deadline
        self._watch._leave(deadline)
        if deadline.expired:
            # Our cancel request, not someone else's: take it back (as asyncio.timeout does)
            # and report the deadline instead of the cancellation.
            remaining = deadline.task.uncancel()
            if remaining <= deadline.cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc


__all__ = ["DeadlineWatch"]
