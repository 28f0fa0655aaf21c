"""Start-up cost: one-shot commands and a stdio server to ready, beside their baselines.

    python benchmarks/bench_startup.py [--rounds N]

Issue 29: ``nexus-mcp call`` and every ``--help`` within 0.5 s of CPU; ``serve
--transport stdio`` to ready within 1.2x a bare FastMCP server's CPU and wall time, its
resident memory at ready within 1.1x the bare server's. Every
side is a fresh interpreter (this one, ``sys.executable``, with ``src`` on PYTHONPATH),
the sides alternating round by round in rotating order so machine drift hits them all;
each figure is the median over the rounds of the process's CPU time (user + system):

- ``--help`` and each command's ``--help`` (``cli.COMMANDS``): ``python -m nexus_mcp ...``
  beside the interpreter doing nothing (``python -c pass``), and beside building every command's
  parser in full (``build_parser()``: what any ``--help`` did before issue 29, though the
  command modules it imports are lighter now too);
- ``call nexus_read_file path=small.txt``: one tool call, start to exit, against a
  nexus-mcp HTTP server started once for the whole run, beside ``python -c pass`` too;
- ``serve --transport stdio`` to ready: started, ``initialize`` answered and
  ``notifications/initialized`` sent (``servers.stdio_server``), its CPU read from
  ``/proc`` at that moment, beside ``bare_server.py`` (bare FastMCP, one tool) the same
  way (CPU and wall time from start to ready, each its own row); its resident memory at
  ready beside the bare server's too; and, without a target, the CPU once each has
  answered a first ``tools/list``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from nexus_mcp.cli import COMMANDS
from results import Row, progress, report
from servers import (
    ServerSpec,
    bench_workspace,
    check_read_result,
    child_env,
    http_server,
    stdio_server,
)

NAME = "bench_startup"
ONE_SHOT_TARGET_S = 0.5  # issue 29: `call` and `--help` within half a second of CPU
STDIO_START_TARGET = 1.2  # issue 29: stdio to ready within 1.2x bare's CPU and wall time
IDLE_RSS_TARGET = 1.1  # issue 29: resident memory at ready within 1.1x bare's
BASELINE = "python -c pass"
FULL_PARSER = "every command's parser built"

ONE_SHOTS: dict[str, list[str]] = {
    BASELINE: ["-c", "pass"],
    FULL_PARSER: ["-c", "from nexus_mcp.cli import build_parser; build_parser()"],
    "nexus-mcp --help": ["-m", "nexus_mcp", "--help"],
    # Every command's own --help: each imports its command module and nothing else.
    **{f"nexus-mcp {name} --help": ["-m", "nexus_mcp", name, "--help"] for name in COMMANDS},
}
CALL = "nexus-mcp call"
TARGETED = (*(name for name in ONE_SHOTS if name.startswith("nexus-mcp")), CALL)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_shot_cpu(args: list[str]) -> float:
    """CPU seconds of one fresh ``python ARGS`` run to its end (waited for, so counted)."""
    before = children_cpu()
    done = subprocess.run(
        [sys.executable, *args], env=child_env(), capture_output=True, check=False, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"{args} exited {done.returncode}: {done.stderr.decode()[-400:]}")
    if args[-1] == "path=small.txt":  # the call read the file (a refusal is not a measure)
        check_read_result({"structuredContent": json.loads(done.stdout)})
    return children_cpu() - before


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


Served = tuple[float, float, float, float]


async def serve_to_ready(spec: ServerSpec, logs: Path) -> Served:
    """CPU seconds, wall seconds and resident MiB of one stdio server at ready, and its CPU
    seconds once it has answered a first ``tools/list`` (what a desktop client asks next)."""
    start = time.perf_counter()
    async with stdio_server(spec, logs) as (running, session):
        wall = time.perf_counter() - start
        ready = running.cpu_seconds(), wall, rss_mib(running.pid)
        await session.request("tools/list", {})
        return (*ready, running.cpu_seconds())


def rotated(items: list[str], number: int) -> list[str]:
    shift = number % len(items)
    return items[shift:] + items[:shift]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    report(NAME, asyncio.run(measure(args.rounds)))


async def measure(rounds: int) -> list[Row]:
    cpu: dict[str, list[float]] = {name: [] for name in [*ONE_SHOTS, CALL]}
    served: dict[str, list[Served]] = {"nexus": [], "equal": []}
    with bench_workspace() as (root, workspace, logs):
        specs = {
            kind: ServerSpec(f"{kind}-{kind}", kind, workspace, root / f"data-{kind}")
            for kind in served
        }
        target = ServerSpec("nexus-http", "nexus", workspace, root / "data-http")
        async with http_server(target, logs, stateless=False) as running:
            commands = {
                **ONE_SHOTS,
                CALL: ["-m", "nexus_mcp", "call", "--url", running.url or "",
                       "nexus_read_file", "path=small.txt"],
            }  # fmt: skip
            for number in range(rounds):
                progress(NAME, f"round {number + 1}/{rounds}")
                for name in rotated(list(commands), number):
                    cpu[name].append(one_shot_cpu(commands[name]))
                for kind in rotated(list(served), number):
                    served[kind].append(await serve_to_ready(specs[kind], logs))
    return rows(cpu, served)


def rows(cpu: dict[str, list[float]], served: dict[str, list[Served]]) -> list[Row]:
    median: Callable[[list[float]], float] = statistics.median
    base = median(cpu[BASELINE]) * 1e3
    full = median(cpu[FULL_PARSER]) * 1e3
    out = [
        Row(measure=f"{name}, CPU", baseline=BASELINE, baseline_value=base,
            value=median(cpu[name]) * 1e3, unit="ms",
            target_kind="value_max" if name in TARGETED else "none",
            target=ONE_SHOT_TARGET_S * 1e3 if name in TARGETED else None)
        for name in cpu
        if name.startswith("nexus-mcp")
    ]  # fmt: skip
    out.append(
        Row(measure="nexus-mcp --help, CPU, beside building every parser",
            baseline=FULL_PARSER, baseline_value=full,
            value=median(cpu["nexus-mcp --help"]) * 1e3, unit="ms")
    )  # fmt: skip
    nexus, bare = served["nexus"], served["equal"]
    out += [
        Row(measure="serve --transport stdio to ready, CPU", baseline="bare FastMCP server",
            baseline_value=median([s[0] for s in bare]) * 1e3,
            value=median([s[0] for s in nexus]) * 1e3, unit="ms",
            target_kind="ratio_max", target=STDIO_START_TARGET),
        Row(measure="serve --transport stdio to ready, wall", baseline="bare FastMCP server",
            baseline_value=median([s[1] for s in bare]) * 1e3,
            value=median([s[1] for s in nexus]) * 1e3, unit="ms",
            target_kind="ratio_max", target=STDIO_START_TARGET),
        Row(measure="serve --transport stdio at ready, resident memory",
            baseline="bare FastMCP server", baseline_value=median([s[2] for s in bare]),
            value=median([s[2] for s in nexus]), unit="MiB",
            target_kind="ratio_max", target=IDLE_RSS_TARGET),
        # Informational: FastMCP loads its session-state store (py-key-value, beartype) on a
        # server's first listing; nexus-mcp's change notifier lists at initialize, bare
        # FastMCP at the client's first tools/list.
        Row(measure="serve --transport stdio to first tools/list, CPU",
            baseline="bare FastMCP server", baseline_value=median([s[3] for s in bare]) * 1e3,
            value=median([s[3] for s in nexus]) * 1e3, unit="ms"),
    ]  # fmt: skip
    return out


if __name__ == "__main__":
    main()
