"""The commit guard: a write that timed out either committed already or never will.

File work runs in a worker thread, which ``asyncio`` cannot interrupt. ``run_guarded``
runs it under a ``CommitGuard``, also bound for the thread (``guarded``): a workspace
operation wraps its final, visible step (a rename, an unlink) in ``guarded_commit``, a
repository write commits through the guard it is handed (``CommitGuard.commit``); the
event loop side forbids that commit (``CommitGuard.cancel``) when the call times out.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")


class CommitGuard:
    """Decides, under one lock, whether a write commits or was cancelled first.

    File I/O runs in a worker thread, which ``asyncio`` cannot interrupt. When a call times
    out, the event loop side calls ``cancel()``; the worker checks ``may_commit()`` right
    before its final rename. Either the rename happens before the cancel (the call then
    reports a timeout whose outcome is unknown, and idempotency records it so) or it never
    happens: a timed-out write never lands later, and never half-lands.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self.committed = False

    def cancel(self) -> bool:
        """Forbid any later commit; True when a commit already happened."""
        with self._lock:
            self._cancelled = True
            return self.committed

    @contextlib.contextmanager
    def commit(self) -> Iterator[None]:
        with self._lock:
            if self._cancelled:
                raise WriteCancelledError()
            yield
            self.committed = True


class WriteCancelledError(Exception):
    """The call was cancelled (timed out) before the write committed; nothing changed."""


_guard: ContextVar[CommitGuard | None] = ContextVar("nexus_commit_guard", default=None)


async def run_guarded(work: Callable[[CommitGuard], T]) -> T:
    """Run blocking write work in a thread under a ``CommitGuard`` (also bound for
    ``guarded_commit`` below); on cancellation, forbid its commit and wait for it.

    Waiting (shielded) for the thread means that when a timeout is reported, the worker
    has either committed already or never will.
    """
    guard = CommitGuard()

    def run() -> T:
        with guarded(guard):
            return work(guard)

    task = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        # cancel() waits for a commit in progress (a git ref update may take seconds):
        # never on the event loop, which serves every other caller meanwhile.
        with contextlib.suppress(BaseException):
            await asyncio.to_thread(guard.cancel)
        with contextlib.suppress(BaseException):
            await task
        raise


@contextlib.contextmanager
def guarded(guard: CommitGuard) -> Iterator[None]:
    token = _guard.set(guard)
    try:
        yield
    finally:
        _guard.reset(token)


@contextlib.contextmanager
def guarded_commit() -> Iterator[None]:
    guard = _guard.get()
    if guard is None:
        yield
        return
    with guard.commit():
        yield


__all__ = ["CommitGuard", "WriteCancelledError", "guarded", "guarded_commit", "run_guarded"]
