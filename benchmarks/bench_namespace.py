"""Benchmark the tool namespace hot path: grant lookup, visible-tools cache, list filtering.

Run: ``python benchmarks/bench_namespace.py``. Prints per-operation medians in microseconds
with the baseline measured in the same run, and the targets from issue 4:

- ``list_objects`` for one subject among 100,000 tuples, SQL prefix range on the primary
  key, against the seed's client-side prefix filter and a forced full scan;
- ``VisibleToolsCache.get`` + ``filter_visible`` over 1,000 tool names with a 30-tool
  profile: cached (target < 100 us) and cold after ``invalidate()`` (target < 2 ms),
  against an uncached store lookup per request.
"""

from __future__ import annotations

import gc
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nexus_mcp.policy.grants import PROFILE_RELATION, visible_tools
from nexus_mcp.policy.visibility import VisibleToolsCache, filter_visible
from nexus_mcp.stores.grants import RelationTuple, SqliteTupleStore

ZONE = "default"
SUBJECTS = 2_000
TOOLS_PER_SUBJECT = 30
FILES_PER_SUBJECT = 20  # non-tool objects, so a client-side prefix filter has work to do
LISTED_TOOLS = 1_000
WRITE_TOOL_EVERY = 4  # every 4th listed tool is write-class, for the read-only filter
CACHED_TARGET_US = 100.0
COLD_TARGET_US = 2_000.0
BATCH = 200
BATCHES = 101

# Forces a full scan by hiding the indexed columns from the planner behind an expression.
FULL_SCAN_SQL = (
    "SELECT object FROM tuples WHERE zone || '' = ? AND subject || '' = ?"
    " AND relation = ? AND object >= '/tools/' AND object < '/tools0'"
)


def measure_us(
    operation: Callable[[], object], *, batch: int = BATCH, batches: int = BATCHES
) -> float:
    """Median over ``batches`` batches of the mean time per call, in microseconds."""
    operation()
    samples = []
    gc.disable()
    try:
        for _ in range(batches):
            start = time.perf_counter_ns()
            for _ in range(batch):
                operation()
            samples.append((time.perf_counter_ns() - start) / batch / 1_000)
    finally:
        gc.enable()
    return statistics.median(samples)


def populate(store: SqliteTupleStore) -> None:
    batch: list[RelationTuple] = []
    for s in range(SUBJECTS):
        subject = f"agent-{s:05d}"
        batch += [
            RelationTuple(subject, PROFILE_RELATION, f"/tools/tool_{t:04d}")
            for t in range(TOOLS_PER_SUBJECT)
        ]
        batch += [
            RelationTuple(subject, PROFILE_RELATION, f"/files/doc_{f:04d}.md")
            for f in range(FILES_PER_SUBJECT)
        ]
    store.write(batch, ZONE)


def report(name: str, value_us: float, baseline_us: float | None = None, target: float = 0) -> None:
    line = f"  {name:<58} {value_us:>10.2f} us"
    if baseline_us is not None:
        line += f"   ({baseline_us / value_us:>6.1f}x faster than baseline)"
    if target:
        line += f"   target < {target:.0f} us: {'PASS' if value_us < target else 'FAIL'}"
    print(line)


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "grants.sqlite3"
        store = SqliteTupleStore(path)
        try:
            populate(store)
            total = SUBJECTS * (TOOLS_PER_SUBJECT + FILES_PER_SUBJECT)
            subject = f"agent-{SUBJECTS // 2:05d}"
            raw = sqlite3.connect(path)

            print(f"list_objects, one subject among {total:,} tuples (median per call)")
            indexed = measure_us(lambda: store.list_objects(subject, PROFILE_RELATION, ZONE))
            client_side = measure_us(
                lambda: [
                    o
                    for o in store.list_objects(subject, PROFILE_RELATION, ZONE, prefix="")
                    if o.startswith("/tools/")
                ]
            )
            full_scan = measure_us(
                lambda: raw.execute(FULL_SCAN_SQL, (ZONE, subject, PROFILE_RELATION)).fetchall(),
                batch=1,
                batches=21,
            )
            assert len(store.list_objects(subject, PROFILE_RELATION, ZONE)) == TOOLS_PER_SUBJECT
            report("SQL prefix range on the primary key", indexed)
            report("baseline: all objects, prefix filtered client-side", client_side)
            report("baseline: forced full scan", full_scan)
            print(f"  ratio client-side / SQL prefix: {client_side / indexed:.2f}x")
            print(f"  ratio full scan / SQL prefix:   {full_scan / indexed:.1f}x")
            raw.close()

            listed = [f"tool_{t:04d}" for t in range(LISTED_TOOLS)]
            write_tools = frozenset(listed[::WRITE_TOOL_EVERY])
            cache = VisibleToolsCache(store)

            def cached_request() -> list[str]:
                visible = cache.get(subject, ZONE)
                return filter_visible(listed, visible, read_only=False, write_tools=write_tools)

            def cold_request() -> list[str]:
                cache.invalidate()
                return cached_request()

            def uncached_request() -> list[str]:
                visible = visible_tools(store, subject, ZONE)
                return filter_visible(listed, visible, read_only=False, write_tools=write_tools)

            assert len(cached_request()) == TOOLS_PER_SUBJECT
            print(
                f"\ntools/list filtering: {LISTED_TOOLS} listed tools,"
                f" {TOOLS_PER_SUBJECT}-tool profile (median per request)"
            )
            get_only = measure_us(lambda: cache.get(subject, ZONE))
            granted = cache.get(subject, ZONE)
            filter_only = measure_us(
                lambda: filter_visible(listed, granted, read_only=False, write_tools=write_tools)
            )
            read_only = measure_us(
                lambda: filter_visible(
                    listed, cache.get(subject, ZONE), read_only=True, write_tools=write_tools
                )
            )
            cached = measure_us(cached_request)
            cold = measure_us(cold_request, batch=20)
            uncached = measure_us(uncached_request, batch=20)
            report("VisibleToolsCache.get, cached", get_only)
            report("filter_visible alone", filter_only)
            report("cached get + filter_visible (read-only caller)", read_only)
            report("cached get + filter_visible", cached, uncached, CACHED_TARGET_US)
            report("cold get (after invalidate) + filter_visible", cold, None, COLD_TARGET_US)
            report("baseline: store lookup on every request + filter", uncached)
            print(f"  cache metrics: {cache.metrics()}")
            ok = cached < CACHED_TARGET_US and cold < COLD_TARGET_US
        finally:
            store.close()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
