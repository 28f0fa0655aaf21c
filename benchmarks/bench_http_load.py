"""Streamable HTTP under load: 50 concurrent clients against nexus-mcp and bare FastMCP.

Three servers, each a real subprocess on a loopback port, expose the same read tool:
nexus-mcp (``nexus-mcp serve --mode dev``, its full chain and JSONL audit file), a bare
FastMCP server doing the same tool work (``bare_server.py --kind equal``) and a plain sync
FastMCP tool (``--kind plain``). For each HTTP mode (stateful sessions, then stateless)
the servers take turns, several rounds each in rotating order (A/B/C, B/C/A, ...), so
machine drift hits all of them. In each round a separate load-generator process opens
50 MCP sessions, warms up, then keeps 50 calls in flight for a fixed window; it reports
the calls completed in the window, their latencies, errors and its own CPU time, and
the server's CPU time over the window is read from /proc.

The load generator is Python too and shares the machine's cores: its CPU per call is
reported beside the server's. The target (issue 11): nexus-mcp at least 0.9 of the
equal-work bare server's throughput, stateful and stateless.

    python benchmarks/bench_http_load.py [--clients 50] [--seconds 5] [--rounds 3]
    python benchmarks/bench_http_load.py --generate URL ...   (the load generator itself)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from results import Row, format_value, progress, report
from servers import (
    HttpSession,
    RpcError,
    ServerSpec,
    bench_workspace,
    check_read_result,
    child_env,
    http_server,
)

NAME = "bench_http_load"
TARGET_RATIO = 0.9
ARGS = {"path": "small.txt"}
KINDS = {
    "nexus": "nexus-mcp",
    "equal": "bare FastMCP, same tool work",
    "plain": "plain sync FastMCP tool",
}
START, STOP = "START", "STOP"


# --- the load generator (its own process) ------------------------------------------------


async def generate(url: str, clients: int, seconds: float, warmup: float, stateless: bool) -> None:
    sessions = [HttpSession(url, stateless) for _ in range(clients)]
    try:
        await asyncio.gather(*(session.initialize() for session in sessions))
        check_read_result(await sessions[0].call_tool("nexus_read_file", ARGS))
        window = {"start": float("inf"), "end": float("inf")}
        stop = asyncio.Event()
        latencies: list[float] = []
        errors: dict[str, int] = {}

        async def worker(session: HttpSession) -> None:
            while not stop.is_set():
                began = time.perf_counter()
                try:
                    result = await session.call_tool("nexus_read_file", ARGS)
                    problem = "isError" if result.get("isError") else None
                except (OSError, asyncio.IncompleteReadError, RpcError) as exc:
                    problem = type(exc).__name__
                done = time.perf_counter()
                if window["start"] <= done <= window["end"]:
                    if problem is None:
                        latencies.append(done - began)
                    else:
                        errors[problem] = errors.get(problem, 0) + 1

        tasks = [asyncio.create_task(worker(session)) for session in sessions]
        await asyncio.sleep(warmup)  # the window of a fixed-duration round, not a wait
        cpu_start = time.process_time()
        window["start"] = time.perf_counter()
        print(START, flush=True)
        await asyncio.sleep(seconds)
        window["end"] = time.perf_counter()
        cpu_used = time.process_time() - cpu_start
        print(STOP, flush=True)
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        await asyncio.gather(*(session.close() for session in sessions))
    print(
        json.dumps(
            {
                "seconds": window["end"] - window["start"],
                "latencies_ms": [round(v * 1000, 3) for v in latencies],
                "errors": errors,
                "client_cpu_s": cpu_used,
            }
        ),
        flush=True,
    )


# --- the benchmark ---------------------------------------------------------------------


@dataclass
class Tally:
    """One server's figures summed over its rounds."""

    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    @property
    def calls(self) -> int:
        return len(self.latencies_ms)

    @property
    def throughput(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def per_call_ms(self, seconds: float) -> float:
        return seconds / self.calls * 1000 if self.calls else float("nan")


async def one_round(server: Any, args: argparse.Namespace, stateless: bool, tally: Tally) -> None:
    command = [
        sys.executable, __file__, "--generate", server.url, "--clients", str(args.clients),
        "--seconds", str(args.seconds), "--warmup", str(args.warmup),
    ]  # fmt: skip
    if stateless:
        command.append("--stateless")
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, env=child_env()
    )
    assert process.stdout is not None
    cpu_start = cpu_stop = 0.0
    result: dict[str, Any] | None = None
    deadline = args.warmup + args.seconds + 120.0  # sessions, warm-up, window, tear-down
    while True:
        line = await asyncio.wait_for(process.stdout.readline(), deadline)
        if not line:
            break
        text = line.decode().strip()
        if text == START:
            cpu_start = server.cpu_seconds()
        elif text == STOP:
            cpu_stop = server.cpu_seconds()
        elif text.startswith("{"):
            result = json.loads(text)
    if await process.wait() != 0 or result is None:
        raise RuntimeError(f"the load generator failed (status {process.returncode})")
    tally.seconds += result["seconds"]
    tally.latencies_ms += result["latencies_ms"]
    tally.errors += sum(result["errors"].values())
    tally.server_cpu_s += cpu_stop - cpu_start
    tally.client_cpu_s += result["client_cpu_s"]


async def run_mode(args: argparse.Namespace, stateless: bool) -> list[Row]:
    mode = "stateless" if stateless else "stateful"
    tallies = {kind: Tally() for kind in KINDS}
    with bench_workspace() as (root, workspace, logs):
        specs = [ServerSpec(kind, kind, workspace, root / f"data-{kind}") for kind in KINDS]
        async with (
            http_server(specs[0], logs, stateless=stateless) as first,
            http_server(specs[1], logs, stateless=stateless) as second,
            http_server(specs[2], logs, stateless=stateless) as third,
        ):
            servers = [first, second, third]
            for number in range(args.rounds):
                shift = number % len(servers)
                for server in servers[shift:] + servers[:shift]:
                    kind = server.spec.kind
                    progress(NAME, f"{mode} round {number + 1}/{args.rounds}: {KINDS[kind]}")
                    await one_round(server, args, stateless, tallies[kind])
    nexus = tallies["nexus"]
    rows = []
    for kind in ("equal", "plain"):
        base = tallies[kind]
        rows.append(
            Row(
                measure=f"HTTP {mode}, {args.clients} clients: calls/s vs {kind}",
                baseline=KINDS[kind],
                baseline_value=base.throughput,
                value=nexus.throughput,
                unit="calls/s",
                target_kind="ratio_min" if kind == "equal" else "none",
                target=TARGET_RATIO if kind == "equal" else None,
                note=describe(tallies, kind) if kind == "equal" else describe_one(base, kind),
            )
        )
    return rows


def describe_one(tally: Tally, kind: str) -> str:
    label = "nexus-mcp" if kind == "nexus" else kind
    return (
        f"{label}: p50 {format_value(tally.percentile(0.5), 'ms')}, p99 "
        f"{format_value(tally.percentile(0.99), 'ms')}, {tally.errors} errors, server CPU "
        f"{format_value(tally.per_call_ms(tally.server_cpu_s), 'ms')}/call, load generator "
        f"CPU {format_value(tally.per_call_ms(tally.client_cpu_s), 'ms')}/call"
    )


def describe(tallies: dict[str, Tally], kind: str) -> str:
    return "; ".join(describe_one(tallies[k], k) for k in ("nexus", kind))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window per round")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each window")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per server and mode")
    parser.add_argument("--mode", choices=["stateful", "stateless"], action="append")
    parser.add_argument("--generate", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--stateless", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.generate:
        asyncio.run(
            generate(args.generate, args.clients, args.seconds, args.warmup, args.stateless)
        )
        return 0
    rows: list[Row] = []
    for mode in args.mode or ["stateful", "stateless"]:
        rows += asyncio.run(run_mode(args, stateless=mode == "stateless"))
    report(NAME, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
