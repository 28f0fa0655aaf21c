"""Gateway hop: what nexus-mcp adds in front of an upstream, beside bare FastMCP forwarders.

Every side is a real process driven by the same minimal JSON-RPC client (``servers.py``),
which costs almost nothing per call, so the differences are the servers'. The upstream is
the recording test server (``tests/support/upstream_server.py``), over stdio and over
streamable HTTP; its ``echo`` tool takes a 5-character text. Four sides, alternating call
by call after a warm-up, each side's median:

- **direct**: the upstream itself (over stdio its own process, over HTTP the one upstream
  process every side shares);
- **bare forwarder**: ``bare_forwarder.py --kind forward``, a bare FastMCP server on stdio
  whose one tool forwards on a FastMCP client opened once and reused: the thinnest
  gateway FastMCP allows, no policy at all;
- **create_proxy**: ``bare_forwarder.py --kind proxy``, FastMCP's ``create_proxy`` with its
  defaults (shown beside, not targeted);
- **nexus-mcp**: ``nexus-mcp serve --transport stdio`` in prod mode with that upstream
  configured, pinned and granted, its JSONL audit file on: the whole chain, pins,
  classification, the argument schema check, session routing, the two audit lines.

Target (issue 29): nexus-mcp's added time (its median minus direct) at most 1.0x the bare
forwarder's added time: the chain's policy must fit inside what nexus-mcp's cheaper
forwarding path saves over FastMCP's client. Issue 12's absolute budget (1 ms added) is
shown as context: on this machine the hop alone, before any policy, is about that much.

    python benchmarks/bench_upstream.py [--calls 1500] [--transport stdio|http]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

from results import Row, progress, report  # noqa: E402
from servers import (  # noqa: E402
    HERE,
    LOG_LEVEL,
    HttpSession,
    child_env,
    process_cpu_seconds,
    stdio_server,
)

NAME = "bench_upstream"
TARGET_RATIO = 1.0  # issue 29: nexus-mcp's added time within the bare forwarder's
ISSUE12_ADDED_US = 1000.0
WARMUP_CALLS = 200
ARGS = {"text": "hello"}
UNLIMITED = {"rate_limit_calls": 10**9, "max_calls_per_session": 10**9}

Call = Callable[[], Awaitable[Any]]


@dataclass
class Side:
    """A server process (``servers.stdio_server`` takes it like a ``ServerSpec``)."""

    name: str
    argv: list[str]

    def command(self, transport: str, port: int | None, stateless: bool) -> list[str]:
        return self.argv

    def env(self) -> dict[str, str]:
        return child_env()


async def alternate(calls: int, sides: dict[str, Call], label: str) -> dict[str, list[float]]:
    for call in sides.values():
        for _ in range(WARMUP_CALLS):
            await call()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for done in range(1, calls + 1):
        order = order[1:] + order[:1]  # rotate, so no side always follows the same one
        for name in order:
            call = sides[name]
            start = time.perf_counter()
            await call()
            samples[name].append(time.perf_counter() - start)
        if done % 500 == 0 and done < calls:
            progress(NAME, f"{label}: {done}/{calls} rounds")
    return samples


def checked(result: dict[str, Any]) -> dict[str, Any]:
    if result.get("isError") or result.get("structuredContent") != ARGS:
        raise RuntimeError("the benchmark call did not succeed")
    return result


@contextlib.asynccontextmanager
async def upstream_of(transport: str) -> AsyncIterator[tuple[dict[str, Any], list[str], Any]]:
    """The gateway config entry, the forwarders' upstream flags, and the direct session."""
    if transport == "stdio":
        logs = Path(tempfile.mkdtemp(prefix="nexus-bench-up-"))
        direct = Side("direct", [sys.executable, str(UPSTREAM_SCRIPT), "--transport", "stdio"])
        async with stdio_server(direct, logs) as (_running, session):  # type: ignore[arg-type]
            yield (
                stdio_upstream(),
                ["--upstream-command", sys.executable, str(UPSTREAM_SCRIPT)],
                session,
            )
        return
    with http_upstream_process() as (url, _proc):
        session = HttpSession(url, stateless=False)
        await session.initialize()
        try:
            yield http_upstream("up", url), ["--upstream-url", url], session
        finally:
            await session.close()


async def measure(calls: int, transport: str, root: Path) -> list[Row]:
    logs = root / f"logs-{transport}"
    logs.mkdir(parents=True)
    async with upstream_of(transport) as (entry, flags, direct):
        gw = make_gateway(
            root / transport, [entry], grant={"full": all_up_tools()}, extra={"budgets": UNLIMITED}
        )
        if await asyncio.to_thread(gw.pin, "up") != 0:
            raise RuntimeError("could not pin the upstream")
        forwarder = [sys.executable, str(HERE / "bare_forwarder.py")]
        nexus = Side("nexus", [sys.executable, "-m", "nexus_mcp", "serve", "--transport", "stdio",
                               "--config", str(gw.config_file), "--workspace", str(gw.workspace),
                               "--data-dir", str(gw.data_dir), "--log-level", LOG_LEVEL])  # fmt: skip
        forward = Side("forward", [*forwarder, "--kind", "forward", *flags])
        proxy = Side("proxy", [*forwarder, "--kind", "proxy", *flags])
        async with (
            stdio_server(nexus, logs) as (nexus_run, via),  # type: ignore[arg-type]
            stdio_server(forward, logs) as (forward_run, bare),  # type: ignore[arg-type]
            stdio_server(proxy, logs) as (_proxy_run, proxied),  # type: ignore[arg-type]
        ):
            sides: dict[str, Call] = {
                "direct": lambda: direct.call_tool("echo", ARGS),
                "forward": lambda: bare.call_tool("echo", ARGS),
                "proxy": lambda: proxied.call_tool("echo", ARGS),
                "nexus": lambda: via.call_tool("up_echo", ARGS),
            }
            for call in sides.values():
                checked(await call())
            cpu_before = {r.pid: process_cpu_seconds(r.pid) for r in (nexus_run, forward_run)}
            samples = await alternate(calls, sides, f"{transport} upstream")
            cpu = {
                r.spec.name: (process_cpu_seconds(r.pid) - cpu_before[r.pid])
                / (calls + WARMUP_CALLS)
                for r in (nexus_run, forward_run)
            }
            checked(await sides["nexus"]())
    us = {name: statistics.median(values) * 1e6 for name, values in samples.items()}
    added = {name: us[name] - us["direct"] for name in ("forward", "proxy", "nexus")}
    label = "stdio" if transport == "stdio" else "streamable HTTP"
    direct_note = f"direct {us['direct']:.0f} µs a call"
    return [
        Row(
            measure=f"added per call, {label} upstream",
            baseline="bare FastMCP forwarder, reused session",
            baseline_value=added["forward"],
            value=added["nexus"],
            unit="µs",
            target_kind="ratio_max",
            target=TARGET_RATIO,
            note=(
                f"{direct_note}; forwarder {us['forward']:.0f}, nexus-mcp {us['nexus']:.0f} µs; "
                f"server CPU a call {cpu['forward'] * 1e6:.0f} / {cpu['nexus'] * 1e6:.0f} µs"
            ),
        ),
        Row(
            measure=f"added per call, {label} upstream, beside create_proxy",
            baseline="FastMCP create_proxy, its defaults",
            baseline_value=added["proxy"],
            value=added["nexus"],
            unit="µs",
            note=f"{direct_note}; create_proxy {us['proxy']:.0f} µs",
        ),
        Row(
            measure=f"added per call, {label} upstream, absolute (issue 12's 1 ms)",
            baseline="the same upstream called directly",
            baseline_value=us["direct"],
            value=us["nexus"],
            unit="µs",
            note=f"added {added['nexus']:.0f} µs; the bare forwarder alone adds {added['forward']:.0f}",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--transport", choices=["stdio", "http"], action="append", default=None)
    args = parser.parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="nexus-bench-upstream-") as tmp:
        for transport in args.transport or ["stdio", "http"]:
            progress(NAME, f"{transport} upstream: {args.calls} calls per side")
            rows += asyncio.run(measure(args.calls, transport, Path(tmp)))
    report(NAME, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
