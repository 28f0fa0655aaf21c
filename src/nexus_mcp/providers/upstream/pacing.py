"""Background work on the event loop in slices, with the loop left to everyone else between.

A listing's CPU work (parsing, validating a page of thousands of definitions) cannot go
to a worker thread to free the loop: the parsers and pydantic hold the GIL, and a
thread holding it makes the loop wait for every turn. It runs on the loop in slices
instead: after ``SLICE_SECONDS`` of work a ``Pacer`` pauses it for ``PAUSE_SECONDS``, so
a caller's request, which takes many short turns of the loop, gets them in the pause
rather than one per slice. The listing takes about twice its CPU time in wall time; no
caller waits for more than a slice.

The other pause a listing causes is the garbage collector's: a page of thousands of
definitions makes hundreds of thousands of objects (parsed JSON, validated models,
views), which survive long enough to be promoted, and CPython's full collection then
walks all of them in one stop of the whole process (measured: 0.2 s of CPU, 0.5 s on the
loaded 2-core machine, several times per listing). ``keep_out_of_collections``
(``gc.freeze``) moves what is alive out of the collector's generations: while a listing
is paced and once it is done. Frozen objects are still freed by their reference counts
as usual (a listing's data is acyclic JSON); only a reference cycle alive at a freeze is
never collected (a few dozen objects per listing, measured beside it: see
``benchmarks/bench_listing_fairness.py``).
"""

from __future__ import annotations

import gc
import time

import anyio

SLICE_SECONDS = 0.002
PAUSE_SECONDS = 0.002
FREEZE_SECONDS = 0.25  # while paced work goes on, what is alive is frozen this often


def keep_out_of_collections() -> None:
    """Move every object alive now out of the collector's generations (module docstring)."""
    gc.freeze()


class Pacer:
    """Call ``await pacer.step()`` between small units of work (one definition)."""

    def __init__(self) -> None:
        self.started = self.frozen = time.perf_counter()

    async def step(self) -> None:
        now = time.perf_counter()
        if now - self.started >= SLICE_SECONDS:
            if now - self.frozen >= FREEZE_SECONDS:
                keep_out_of_collections()
                self.frozen = now
            await anyio.sleep(PAUSE_SECONDS)
            self.started = time.perf_counter()


__all__ = ["PAUSE_SECONDS", "SLICE_SECONDS", "Pacer", "keep_out_of_collections"]
