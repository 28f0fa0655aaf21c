"""Listing at scale: a 3,000-tool upstream listing never delays another caller's call.

nexus-mcp runs as users run it (``nexus-mcp serve --transport http --mode dev``, its own
process, the JSONL audit file) with one stdio upstream: the recording test server
(``tests/support/upstream_server.py``) with ``--big 3000``, 3,000 more tools of ~5 KB
each, all in one ``tools/list`` page of 16 MB (FastMCP does not paginate by default).
The configuration is the test harness's (``tests/e2e/upstream_harness.py``): prod
registry and profiles, every tool pinned (``nexus-mcp upstream pin``); ``limits.max_read_bytes``
is raised so one message of that size is read (the default, 10 MiB, ends the connection
on it: the upstream is down, nothing is listed), and ``recheck_seconds`` is an hour so
the idle windows have no listing.

Two callers on their own MCP sessions over streamable HTTP (the minimal client of
``servers.py``):

- caller B calls ``nexus_read_file`` on a small file, one call after the other (a short
  pause between), and records each call's latency;
- caller A, in the active windows only, calls the upstream's ``relist`` tool, which says
  ``notifications/tools/list_changed`` and changes nothing: the gateway fetches the whole
  listing again and verifies it (screening, pins, classification, digests). A calls
  again as soon as the upstream has answered the previous listing, so listings run back
  to back; they are counted in the upstream's own record.

Windows alternate (idle, active, idle, ...) over several rounds, so drift of the loaded
machine hits both sides; before every idle window the server is left to finish what a
listing started (its CPU time stops moving). The baseline is B's own latency in the idle
windows. Target (issue 29): B's worst added delay (its slowest call during listings minus
its idle median) under 50 ms. The idle windows' max minus their median is the machine's
own noise, reported beside it.

    python benchmarks/bench_listing_fairness.py [--rounds 4] [--window 5] [--big 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]  # the test harness builds the configuration

from tests.e2e.upstream_harness import (  # noqa: E402
    UP_TOOLS,
    make_gateway,
    read_record,
    stdio_upstream,
)

from results import Row, progress, report  # noqa: E402
from servers import (  # noqa: E402
    HttpSession,
    ServerSpec,
    check_read_result,
    child_env,
    http_server,
    process_cpu_seconds,
)

NAME = "bench_listing_fairness"
PIN = [sys.executable, "-m", "nexus_mcp", "upstream", "pin", "up", "--yes"]
TARGET_ADDED_MS = 50.0
READ_ARGS = {"path": "small.txt"}
B_PAUSE_S = 0.005  # between caller B's calls: a busy caller, not a saturating one
MIB = 1024 * 1024
SETTLE_IDLE_CPU_S = 0.02  # the server is settled when it spends less CPU than this ...
SETTLE_PERIOD_S = 0.25  # ... over this long (B's calls are paused meanwhile)
SETTLE_MAX_S = 60.0


@dataclass
class Windows:
    """B's latencies (seconds) and the server's CPU time and wall time, per kind."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {"idle": [], "active": []})
    worst_per_window: dict[str, list[float]] = field(
        default_factory=lambda: {"idle": [], "active": []}
    )
    cpu: dict[str, float] = field(default_factory=lambda: {"idle": 0.0, "active": 0.0})
    wall: dict[str, float] = field(default_factory=lambda: {"idle": 0.0, "active": 0.0})
    listings: int = 0  # upstream listings that started in an active window
    listed_tools: int = 0  # tools in the upstream's listing
    rss_kib: list[int] = field(default_factory=lambda: [0, 0])  # the server's, before and after


def rss_kib(pid: int) -> int:
    """A process's resident memory (VmRSS, KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def listing_starts(record: Path) -> int:
    return sum(1 for r in read_record(record) if r["method"] == "tools/list")


def listing_ends(record: Path) -> int:
    return sum(1 for r in read_record(record) if r["method"] == "tools/list:end")


def descendants(pid: int) -> list[int]:
    """The process and every process under it (the server's upstream processes)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(child) for child in task.read_text().split()]
    return found


def tree_cpu_seconds(pid: int) -> float:
    total = 0.0
    for each in descendants(pid):
        with contextlib.suppress(OSError):
            total += process_cpu_seconds(each)
    return total


async def settle(pid: int, record: Path) -> None:
    """Until every listing the upstream began has ended and neither the server nor its
    upstream processes spend CPU any more (a listing's tail done), bounded."""
    deadline = time.monotonic() + SETTLE_MAX_S
    before = tree_cpu_seconds(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(SETTLE_PERIOD_S)
        now = tree_cpu_seconds(pid)
        if listing_ends(record) < listing_starts(record):
            before = now
            continue
        if now - before < SETTLE_IDLE_CPU_S:
            return
        before = now
    raise RuntimeError("the server did not settle")


async def caller_b(session: HttpSession, until: float, samples: list[float]) -> None:
    while time.monotonic() < until:
        started = time.perf_counter()
        result = await session.call_tool("nexus_read_file", READ_ARGS)
        samples.append(time.perf_counter() - started)
        check_read_result(result)
        await asyncio.sleep(B_PAUSE_S)


async def caller_a(session: HttpSession, record: Path, stop: asyncio.Event) -> None:
    """Listing after listing: relist, wait for the upstream to answer it, again."""
    while not stop.is_set():
        ended = listing_ends(record)
        result = await session.call_tool("up_relist", {})
        if result.get("isError"):
            raise RuntimeError(f"up_relist failed: {result}")
        while listing_ends(record) <= ended and not stop.is_set():
            await asyncio.sleep(0.02)


async def window(
    kind: str,
    seconds: float,
    b: HttpSession,
    a: HttpSession,
    pid: int,
    record: Path,
    into: Windows,
) -> None:
    samples: list[float] = []
    starts = listing_starts(record)
    cpu, wall = process_cpu_seconds(pid), time.monotonic()
    stop = asyncio.Event()
    lister = asyncio.ensure_future(caller_a(a, record, stop)) if kind == "active" else None
    await caller_b(b, time.monotonic() + seconds, samples)
    stop.set()
    if lister is not None:
        await lister
    into.listings += listing_starts(record) - starts if kind == "active" else 0
    if kind == "idle" and listing_starts(record) != starts:
        raise RuntimeError("an upstream listing ran in an idle window")
    # The active window's CPU includes the tail of its last listing: settled first.
    await settle(pid, record)
    into.cpu[kind] += process_cpu_seconds(pid) - cpu
    into.wall[kind] += time.monotonic() - wall
    into.latencies[kind] += samples
    into.worst_per_window[kind].append(max(samples))


async def measure(rounds: int, seconds: float, big: int, root: Path) -> list[Row]:
    record = root / "record.jsonl"
    upstream = stdio_upstream(record=record, recheck_seconds=3600,
                              timeouts={"connect_seconds": 120})  # fmt: skip
    upstream["args"] += ["--big", str(big), "--relist"]
    gw = make_gateway(
        root / "gw",
        [upstream],
        registries={"up": {**UP_TOOLS, "relist": "read"}},
        grant={"full": ["up_relist"]},
        extra={"limits": {"max_read_bytes": 64 * MIB}},
    )
    (gw.workspace / "small.txt").write_text("hello benchmark\n" * 16)
    progress(NAME, f"pinning the upstream's {big} tools")
    pin = await asyncio.to_thread(
        subprocess.run,
        [*PIN, "--config", str(gw.config_file), "--data-dir", str(gw.data_dir)],
        env=child_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if pin.returncode != 0:
        sys.stderr.write(pin.stdout + pin.stderr)
        raise RuntimeError("could not pin the upstream")
    listed = [r for r in read_record(record) if r["method"] == "tools/list"]
    logs = root / "logs"
    logs.mkdir()
    spec = ServerSpec("nexus", "nexus", gw.workspace, gw.data_dir,
                      ("--config", str(gw.config_file)))  # fmt: skip
    windows = Windows(listed_tools=big)
    async with http_server(spec, logs, stateless=False) as server:
        url = server.url or ""
        b, a = HttpSession(url, stateless=False), HttpSession(url, stateless=False)
        await b.initialize()
        await a.initialize()
        # The gateway's own first listing (at start-up) is done before anything counts.
        progress(NAME, "waiting for the gateway's first listing")
        await poll_until(lambda: listing_ends(record) > len(listed), 300)
        check_read_result(await b.call_tool("nexus_read_file", READ_ARGS))
        # A's own upstream session (its process, its first listing) before anything counts.
        ended = listing_ends(record)
        await a.call_tool("up_relist", {})
        await poll_until(lambda: listing_ends(record) > ended, 300)
        await settle(server.pid, record)
        warm: list[float] = []
        await caller_b(b, time.monotonic() + 1.0, warm)
        windows.rss_kib[0] = rss_kib(server.pid)
        for done in range(rounds):
            for kind in ("idle", "active") if done % 2 == 0 else ("active", "idle"):
                await window(kind, seconds, b, a, server.pid, record, windows)
            progress(
                NAME,
                f"round {done + 1}/{rounds}: {windows.listings} listings so far, "
                f"B's worst {max(windows.worst_per_window['active']) * 1000:.0f} ms active, "
                f"{max(windows.worst_per_window['idle']) * 1000:.0f} ms idle",
            )
        windows.rss_kib[1] = rss_kib(server.pid)
        await a.close()
        await b.close()
    return rows(windows, rounds, seconds)


async def poll_until(predicate: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.1)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rows(w: Windows, rounds: int, seconds: float) -> list[Row]:
    if w.listings <= 0:
        raise RuntimeError("no upstream listing ran in the active windows: measurement void")
    idle, active = w.latencies["idle"], w.latencies["active"]
    ms = {
        kind: {
            "p50": statistics.median(values) * 1000,
            "p99": quantile(values, 0.99) * 1000,
            "max": max(values) * 1000,
        }
        for kind, values in (("idle", idle), ("active", active))
    }
    per_call_cpu = w.cpu["idle"] / len(idle)  # B's calls (and the idle server) alone
    listing_cpu = (w.cpu["active"] - per_call_cpu * len(active)) / w.listings
    per_window = ", ".join(f"{v * 1000:.0f}" for v in w.worst_per_window["active"])
    base = "caller B, caller A idle"
    out = [
        Row(
            f"caller B's {stat} during listings",
            base,
            ms["idle"][stat],
            ms["active"][stat],
            "ms",
            note=note,
        )
        for stat, note in (
            ("p50", f"{len(idle)} calls idle, {len(active)} during listings"),
            ("p99", ""),
            ("max", f"worst per active window: {per_window} ms"),
        )
    ]
    out += [
        Row(
            f"upstream listings of {w.listed_tools:,} tools measured",
            "",
            None,
            float(w.listings),
            "listings",
            note=(
                f"{rounds} rounds of {seconds:.0f} s idle + {seconds:.0f} s active; "
                f"server CPU {listing_cpu * 1000:.0f} ms per listing "
                f"(B's calls taken out at their idle CPU per call); server RSS "
                f"{w.rss_kib[0] / 1024:.0f} -> {w.rss_kib[1] / 1024:.0f} MiB over them"
            ),
        ),
        Row(
            "caller B's worst delay while idle (noise)",
            "",
            None,
            ms["idle"]["max"] - ms["idle"]["p50"],
            "ms",
            note="the machine's own: B's idle max minus its idle median",
        ),
        Row(
            f"caller B's worst added delay by a {w.listed_tools:,}-tool listing",
            "",
            None,
            ms["active"]["max"] - ms["idle"]["p50"],
            "ms",
            target_kind="value_max",
            target=TARGET_ADDED_MS,
            note="B's max during listings minus its idle median",
        ),
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--window", type=float, default=5.0, help="seconds per window")
    parser.add_argument("--big", type=int, default=3000, help="upstream tools (~5 KB each)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nexus-bench-fairness-") as tmp:
        progress(NAME, f"{args.rounds} rounds of {args.window:.0f} s idle + active windows")
        found = asyncio.run(measure(args.rounds, args.window, args.big, Path(tmp)))
    report(NAME, found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
