"""Gateway latency: a read call through nexus-mcp to an upstream vs calling it directly.

The upstream is the recording test server (``tests/support/upstream_server.py``) as a
real process, over stdio and over streamable HTTP. The baseline is a FastMCP client
(handshake era, connected once) calling its ``echo`` tool directly. nexus-mcp is a prod
server in this process with that upstream configured, pinned and granted, its JSONL audit
file on: a FastMCP in-memory client calls ``up_echo``, which passes the whole chain and
goes upstream on the caller's reused upstream session. Calls alternate (direct, nexus,
...) and each side's median is taken; the added latency is the difference of the medians
(it includes the in-memory hop from the client to nexus-mcp). A third side, a bare FastMCP
server whose one tool forwards on a reused client, shows what that hop costs by itself.

Target (issue 12): at most 1 ms added per call on this machine, i.e. no handshake per
call. The first call of a new caller (its own upstream session: a process for stdio, a
session for HTTP) is reported beside it, not targeted.

    python benchmarks/bench_upstream.py [--calls 1500] [--transport stdio|http]
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

from fastmcp import Client, FastMCP
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the test harness builds the gateway's configuration

from tests.e2e.upstream_harness import (  # noqa: E402
    UPSTREAM_SCRIPT,
    all_up_tools,
    http_upstream,
    http_upstream_process,
    make_gateway,
    stdio_upstream,
)

from nexus_mcp.observability.logs import configure_logging  # noqa: E402
from results import Row, progress, report  # noqa: E402

NAME = "bench_upstream"
TARGET_ADDED_US = 1000.0
WARMUP_CALLS = 200
ARGS = {"text": "hello"}
UNLIMITED = {"rate_limit_calls": 10**9, "max_calls_per_session": 10**9}

Call = Callable[[], Awaitable[Any]]


async def alternate(calls: int, sides: dict[str, Call], label: str) -> dict[str, list[float]]:
    for call in sides.values():
        for _ in range(WARMUP_CALLS):
            await call()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for done in range(1, calls + 1):
        for name, call in sides.items():
            start = time.perf_counter()
            await call()
            samples[name].append(time.perf_counter() - start)
        if done % 500 == 0 and done < calls:
            progress(NAME, f"{label}: {done}/{calls} rounds")
    return samples


def checked(result: Any) -> Any:
    if result.is_error or result.structured_content != ARGS:
        raise RuntimeError("the benchmark call did not succeed")
    return result


async def measure(calls: int, transport: str, root: Path) -> list[Row]:
    if transport == "stdio":
        upstream = stdio_upstream()
        direct = Client(
            StdioTransport(sys.executable, [str(UPSTREAM_SCRIPT), "--transport", "stdio"]),
            mode="legacy",
        )
        return await _measure(calls, transport, root, upstream, direct)
    with http_upstream_process() as (url, _proc):
        upstream = http_upstream("up", url)
        direct = Client(StreamableHttpTransport(url), mode="legacy")
        return await _measure(calls, transport, root, upstream, direct)


async def _measure(
    calls: int, transport: str, root: Path, upstream: dict[str, Any], direct: Client[Any]
) -> list[Row]:
    gw = make_gateway(root / transport, [upstream], grant={"full": all_up_tools()})
    if await asyncio.to_thread(gw.pin, "up") != 0:
        raise RuntimeError("could not pin the upstream")

    def build() -> Any:
        # The real audit file, as a deployment has it (the harness's memory sink aside).
        from nexus_mcp.server import build_server
        from nexus_mcp.settings import load_settings

        settings = load_settings(
            gw.config_file,
            {"workspace": gw.workspace, "data_dir": gw.data_dir, "budgets": UNLIMITED},
        )
        return build_server(settings, config_file=gw.config_file)

    server = build()
    first_call = await first_call_ms(build())
    forwarder = bare_forwarder(direct)
    async with direct, Client(server.mcp) as via, Client(forwarder) as bare:
        sides: dict[str, Call] = {
            "direct": lambda: direct.call_tool_mcp("echo", ARGS),
            "bare": lambda: bare.call_tool_mcp("echo", ARGS),
            "nexus": lambda: via.call_tool_mcp("up_echo", ARGS),
        }
        for call in sides.values():
            checked(await call())
        samples = await alternate(calls, sides, f"{transport} upstream")
        checked(await sides["nexus"]())
    server.close()
    direct_us = statistics.median(samples["direct"]) * 1e6
    bare_us = statistics.median(samples["bare"]) * 1e6
    nexus_us = statistics.median(samples["nexus"]) * 1e6
    p90 = {k: statistics.quantiles(v, n=10)[-1] * 1e6 for k, v in samples.items()}
    label = "stdio" if transport == "stdio" else "streamable HTTP"
    return [
        Row(
            measure=f"gateway hop alone, {label} upstream",
            baseline="the same upstream called directly",
            baseline_value=direct_us,
            value=bare_us,
            unit="µs",
            note=(
                "a bare FastMCP server in memory whose one tool forwards on a reused client: "
                f"the hop any in-process gateway adds, {bare_us - direct_us:.0f} µs"
            ),
        ),
        Row(
            measure=f"nexus-mcp vs the bare hop, {label} upstream",
            baseline="bare FastMCP forwarder, same client and upstream",
            baseline_value=bare_us,
            value=nexus_us,
            unit="µs",
            note="the chain, pins, classification, audit file and session routing",
        ),
        Row(
            measure=f"read call to a {label} upstream",
            baseline="the same upstream called directly",
            baseline_value=direct_us,
            value=nexus_us,
            unit="µs",
            note=(
                f"median of {calls} alternating calls; p90 {p90['direct']:.0f} µs direct, "
                f"{p90['nexus']:.0f} µs through nexus-mcp"
            ),
        ),
        Row(
            measure=f"added per call, {label} upstream",
            baseline="",
            baseline_value=None,
            value=nexus_us - direct_us,
            unit="µs",
            target_kind="value_max",
            target=TARGET_ADDED_US,
            note=f"first call of a new caller (its own upstream session): {first_call:.0f} ms",
        ),
    ]


def bare_forwarder(upstream: Client[Any]) -> FastMCP[Any]:
    """The thinnest gateway FastMCP allows: one tool forwarding on an open client."""
    bare: FastMCP[Any] = FastMCP("bare-forwarder")

    @bare.tool
    async def echo(text: str) -> dict[str, Any]:
        result = await upstream.call_tool_mcp("echo", {"text": text})
        return dict(result.structured_content or {})

    return bare


async def first_call_ms(server: Any) -> float:
    """A fresh server whose gateway session is up: the caller's first call opens its own."""
    async with Client(server.mcp) as via:
        await via.list_tools()  # the gateway's own session (connect, list, pins)
        start = time.perf_counter()
        checked(await via.call_tool_mcp("up_echo", ARGS))
        elapsed = (time.perf_counter() - start) * 1000
    server.close()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--transport", choices=["stdio", "http"], action="append", default=None)
    args = parser.parse_args(argv)
    configure_logging("ERROR")  # the in-process server's JSON logs are not the result
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="nexus-bench-upstream-") as tmp:
        for transport in args.transport or ["stdio", "http"]:
            progress(NAME, f"{transport} upstream: {args.calls} calls per side")
            rows += asyncio.run(measure(args.calls, transport, Path(tmp)))
    report(NAME, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
