"""tools/call overhead: nexus_read_file through the full chain vs bare FastMCP doing the same work.

Both servers read the same small file with the same tool work (``Workspace.resolve``,
the bounded read in ``asyncio.to_thread``, the same ``ReadFileResult``; see
``bare_server.py``); only nexus-mcp's chain differs. Calls alternate (bare, nexus, bare,
...) so machine drift hits both equally, and each side's median is taken. Three
transports:

- in memory: FastMCP's in-memory ``Client``, both servers in this process, for both
  protocol eras (2025-11-25 handshake, 2026-07-28 "auto");
- stdio and streamable HTTP: each server a real subprocess (``nexus-mcp serve --mode dev``
  with its JSONL audit file, and ``bare_server.py``), driven by a minimal JSON-RPC client
  (``servers.py``) so the client's own cost does not dilute the ratio; the servers' CPU
  time per call (from /proc) is reported beside the wall time.

The nexus server runs its real configuration: every chain layer, registry classification,
document hashing, the grants namespace and the JSONL audit file.

    python benchmarks/bench_chain.py [--calls 1500] [--transport memory|stdio|http]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastmcp import Client

from bare_server import build_bare
from nexus_mcp.observability.logs import configure_logging
from nexus_mcp.server import build_server
from nexus_mcp.settings import Settings
from results import Row, progress, report
from servers import (
    HttpSession,
    ServerSpec,
    bench_workspace,
    check_read_result,
    http_server,
    stdio_server,
)

NAME = "bench_chain"
TARGET_RATIO = 1.05  # issue 29 (issues 2 and 11 had 1.10): at most 5 % over bare FastMCP
WARMUP_CALLS = 100
ARGS = {"path": "small.txt"}
ERAS = {"legacy": "2025-11-25", "auto": "2026-07-28"}

Call = Callable[[], Awaitable[Any]]


async def alternate(
    calls: int, sides: dict[str, Call], label: str, every: int = 500
) -> dict[str, list[float]]:
    """Warm up each side, then time ``calls`` rounds of one call per side, alternating."""
    for call in sides.values():
        for _ in range(WARMUP_CALLS):
            await call()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for done in range(1, calls + 1):
        for name, call in sides.items():
            start = time.perf_counter()
            await call()
            samples[name].append(time.perf_counter() - start)
        if done % every == 0 and done < calls:
            progress(NAME, f"{label}: {done}/{calls} rounds")
    return samples


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


async def in_memory(calls: int, mode: str) -> Row:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        root.mkdir()
        (root / "small.txt").write_text("hello benchmark\n" * 16)
        # Limits stay on (they run on every call); only their thresholds are raised so the
        # benchmark's burst of calls is not refused by the default rate limit.
        budgets = {"rate_limit_calls": 10**9, "max_calls_per_session": 10**9}
        nexus = build_server(
            Settings(mode="dev", workspace=root, data_dir=Path(tmp) / "data", budgets=budgets)
        )
        try:
            async with (
                Client(build_bare(root), mode=mode) as bare_client,
                Client(nexus.mcp, mode=mode) as nexus_client,
            ):

                async def bare() -> Any:
                    return await bare_client.call_tool("nexus_read_file", ARGS)

                async def chain() -> Any:
                    return await nexus_client.call_tool("nexus_read_file", ARGS)

                samples = await alternate(
                    calls, {"bare": bare, "nexus": chain}, f"in memory {ERAS[mode]}"
                )
        finally:
            nexus.close()
    return Row(
        measure=f"tools/call in memory ({ERAS[mode]})",
        baseline="bare FastMCP, same tool work",
        baseline_value=median_us(samples["bare"]),
        value=median_us(samples["nexus"]),
        unit="µs",
        target_kind="ratio_max",
        target=TARGET_RATIO,
        note=f"median of {calls} alternating calls each, FastMCP in-memory Client",
    )


async def over_transport(calls: int, transport: str) -> Row:
    with bench_workspace() as (root, workspace, logs):
        specs = {
            "bare": ServerSpec("bare", "equal", workspace, root / "data-bare"),
            "nexus": ServerSpec("nexus", "nexus", workspace, root / "data-nexus"),
        }
        if transport == "stdio":
            async with (
                stdio_server(specs["bare"], logs) as (bare_proc, bare_session),
                stdio_server(specs["nexus"], logs) as (nexus_proc, nexus_session),
            ):
                return await _measure_sessions(
                    calls, transport, {"bare": bare_session, "nexus": nexus_session},
                    {"bare": bare_proc.cpu_seconds, "nexus": nexus_proc.cpu_seconds},
                )  # fmt: skip
        async with (
            http_server(specs["bare"], logs, stateless=False) as bare_proc,
            http_server(specs["nexus"], logs, stateless=False) as nexus_proc,
        ):
            sessions = {
                "bare": HttpSession(bare_proc.url or "", stateless=False),
                "nexus": HttpSession(nexus_proc.url or "", stateless=False),
            }
            for session in sessions.values():
                await session.initialize()
            try:
                return await _measure_sessions(
                    calls, transport, sessions,
                    {"bare": bare_proc.cpu_seconds, "nexus": nexus_proc.cpu_seconds},
                )  # fmt: skip
            finally:
                for session in sessions.values():
                    await session.close()


async def _measure_sessions(
    calls: int, transport: str, sessions: dict[str, Any], cpu: dict[str, Callable[[], float]]
) -> Row:
    for session in sessions.values():
        check_read_result(await session.call_tool("nexus_read_file", ARGS))
    sides: dict[str, Call] = {
        name: (lambda s=session: s.call_tool("nexus_read_file", ARGS))
        for name, session in sessions.items()
    }
    cpu_before = {name: read() for name, read in cpu.items()}
    samples = await alternate(calls, sides, f"over {transport}")
    cpu_used = {name: cpu[name]() - cpu_before[name] for name in cpu}
    total = calls + WARMUP_CALLS
    cpu_us = {name: used / total * 1e6 for name, used in cpu_used.items()}
    label = "stdio" if transport == "stdio" else "streamable HTTP (stateful)"
    return Row(
        measure=f"tools/call over {label}",
        baseline="bare FastMCP, same tool work",
        baseline_value=median_us(samples["bare"]),
        value=median_us(samples["nexus"]),
        unit="µs",
        target_kind="ratio_max",
        target=TARGET_RATIO,
        note=(
            f"median of {calls} alternating calls each, subprocess servers; server CPU per "
            f"call {cpu_us['bare']:.0f} µs bare, {cpu_us['nexus']:.0f} µs nexus-mcp "
            f"({cpu_us['nexus'] / cpu_us['bare']:.2f}x)"
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument(
        "--transport", choices=["memory", "stdio", "http"], action="append", default=None
    )
    parser.add_argument("--mode", choices=sorted(ERAS), default=None, help="in-memory era only")
    args = parser.parse_args(argv)
    transports = args.transport or ["memory", "stdio", "http"]
    configure_logging("ERROR")  # the in-process server's JSON logs are not the result
    rows: list[Row] = []
    for transport in transports:
        if transport == "memory":
            for mode in [args.mode] if args.mode else list(ERAS):
                progress(NAME, f"in memory {ERAS[mode]}: {args.calls} calls per side")
                rows.append(asyncio.run(in_memory(args.calls, mode)))
        else:
            progress(NAME, f"over {transport}: {args.calls} calls per side")
            rows.append(asyncio.run(over_transport(args.calls, transport)))
    report(NAME, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
