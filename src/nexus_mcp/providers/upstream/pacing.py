"""Background work on the event loop in slices, with the loop left to everyone else between.

A listing's CPU work (parsing, validating a page of thousands of definitions) cannot go
to a worker thread to free the loop: the parsers and pydantic hold the GIL, and a
thread holding it makes the loop wait for every turn. It runs on the loop in slices
instead: after ``SLICE_SECONDS`` of work a ``Pacer`` pauses it for ``PAUSE_SECONDS``, so
a caller's request, which takes many short turns of the loop, gets them in the pause
rather than one per slice. The listing takes about twice its CPU time in wall time; no
caller waits for more than a slice.

The other pause a listing causes is the garbage collector's: a page of thousands of
definitions makes hundreds of thousands of objects, and CPython's full collection walks
them in one stop of the whole process (0.2 s of CPU measured, 0.5 s on the loaded 2-core
machine). ``gc.freeze`` would remove that stop, but it is process-wide: every reference
cycle alive at a freeze (any caller's finished request or session, not only the
listing's) would never be collected again, and an upstream sending ``list_changed`` in a
loop could grow the gateway's memory without bound. So the collector is left alone and
that pause stays (benchmarks/README.md).
"""

from __future__ import annotations

import time

import anyio

SLICE_SECONDS = 0.002
PAUSE_SECONDS = 0.002


class Pacer:
    """Call ``await pacer.step()`` between small units of work (one definition)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    async def step(self) -> None:
        now = time.perf_counter()
        if now - self.started >= SLICE_SECONDS:
            await anyio.sleep(PAUSE_SECONDS)
            self.started = time.perf_counter()


__all__ = ["PAUSE_SECONDS", "SLICE_SECONDS", "Pacer"]
