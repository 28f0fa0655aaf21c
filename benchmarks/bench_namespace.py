"""Benchmark the tool namespace hot path: grant lookup, visible-tools cache, list filtering.

Run: ``python benchmarks/bench_namespace.py``. Reports per-operation medians in microseconds
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
from results import Row, progress, report

NAME = "bench_namespace"

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


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "grants.sqlite3"
        store = SqliteTupleStore(path)
        try:
            total = SUBJECTS * (TOOLS_PER_SUBJECT + FILES_PER_SUBJECT)
            progress(NAME, f"writing {total:,} tuples")
            populate(store)
            subject = f"agent-{SUBJECTS // 2:05d}"
            raw = sqlite3.connect(path)

            progress(NAME, "list_objects: SQL prefix range, client-side filter, full scan")
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
            progress(NAME, f"visible-tools cache and filter over {LISTED_TOOLS} names")
            cached = measure_us(cached_request)
            cold = measure_us(cold_request, batch=20)
            uncached = measure_us(uncached_request, batch=20)
        finally:
            store.close()
    tuples = f"one subject among {total:,} tuples"
    filtering = f"{LISTED_TOOLS} names, {TOOLS_PER_SUBJECT}-tool profile"
    report(
        NAME,
        [
            Row(f"list_objects, {tuples}", "client-side prefix filter", client_side, indexed, "µs"),
            Row(f"list_objects, {tuples}", "forced full scan", full_scan, indexed, "µs"),
            Row(
                f"VisibleToolsCache.get + filter_visible, {filtering}, cached",
                "store lookup per request",
                uncached,
                cached,
                "µs",
                target_kind="value_max",
                target=CACHED_TARGET_US,
            ),
            Row(
                f"same, cold (after invalidate), {filtering}",
                "store lookup per request",
                uncached,
                cold,
                "µs",
                target_kind="value_max",
                target=COLD_TARGET_US,
            ),
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
