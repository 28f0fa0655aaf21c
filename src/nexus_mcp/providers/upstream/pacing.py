"""Background work on the event loop in slices, with the loop left to everyone else between.

A listing's CPU work (parsing, validating a page of thousands of definitions) cannot go
to a worker thread to free the loop: the parsers and pydantic hold the GIL, and a
thread holding it makes the loop wait for every turn. It runs on the loop in slices
instead: after ``SLICE_SECONDS`` of work a ``Pacer`` pauses it for ``PAUSE_SECONDS``, so
a caller's request, which takes many short turns of the loop, gets them in the pause
rather than one per slice. The listing takes about twice its CPU time in wall time; no
caller waits for more than a slice.

The other pause a listing causes is the garbage collector's: a listing's objects make
CPython run full collections, each one stop of the whole process. Most of what those
walked was the start-up heap (pydantic's compiled validators above all), which the
serving process now sets aside once, before its first request (``server/heap.py``); what
remains is the listings' own objects (50-100 ms a collection for a 3,000-tool upstream
on the 2-core machine, 250-300 ms before). Freezing again during a listing would remove
that too, but ``gc.freeze`` is process-wide: every reference cycle alive at a freeze (any
caller's finished request or session, not only the listing's) would never be collected
again, and an upstream sending ``list_changed`` in a loop could grow the gateway's memory
without bound. So listings leave the collector alone (benchmarks/README.md).
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
