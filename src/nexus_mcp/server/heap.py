"""The start-up heap, set aside from the garbage collector once a server is built.

A built server's objects (the imported modules, their classes and functions, pydantic's
compiled validators of every model class, the registry, the stores, the tool schemas:
about 145,000 tracked objects in a plain server, 175,000 with an upstream configured)
live as long as the process. CPython's full collection walks every tracked object in one
stop of the whole process, those included, and pydantic-core's validators are slow to
walk: a full collection of a built server took 140 ms on the 2-core machine, paid by
whichever caller's request was running when one triggered. ``gc.freeze`` moves what is
tracked at that moment to a permanent generation that no collection walks again (after
it, the same server's full collection took 0.5 ms); a full collection during an
upstream's 3,000-tool listing went from 250-300 ms to 50-100 ms
(benchmarks/README.md).

It is called once, by the serving process (``nexus-mcp serve`` and each ``--workers``
worker), after ``build_server`` and before the first request: nothing a caller makes is
frozen, and neither is an upstream's listing (upstreams connect once serving starts).
What it costs: a reference cycle of the start-up heap that later becomes garbage is
never collected, a bounded, one-time amount (the start-up heap is built once). It is not
called by ``build_server`` itself, which tests and tools call many times in one process.
"""

from __future__ import annotations

import gc


def freeze_start_up_heap() -> int:
    """Set the objects tracked now aside from every later collection; return how many."""
    gc.freeze()
    return gc.get_freeze_count()


__all__ = ["freeze_start_up_heap"]
