"""tools/call overhead in instructions: bare FastMCP vs nexus-mcp, counted by callgrind.

Wall-clock and CPU-time ratios move with the machine's load; instruction counts do not.
Each side runs in its own process under ``valgrind --tool=callgrind``: one server (the
equal-work bare server of ``bare_server.py``, or nexus-mcp in its real configuration as
in ``bench_chain.py``'s in-memory row: every layer, registry classification, document
hashing, the grants namespace, the JSONL audit file) and FastMCP's in-memory ``Client``
calling ``nexus_read_file`` on a small file. Start-up and warm-up run uninstrumented
(``--instr-atstart=no``); this script then switches instrumentation on
(``callgrind_control -i on``), lets the process make ``--calls`` calls, and switches it
off again, so the count is of those calls only (client and server, plus one line of
hand-shake on stdin). Instructions per call = that count / calls.

Under valgrind a call takes about 100x its native time, which time-based caches would
notice (a 0.1 s memo missing on every call); so the measured process's ``time`` clocks run
``--clock-scale`` (100) times slower, and both servers see native calls per second
(``--clock-scale 1``: real time).

    python benchmarks/callgrind_chain.py [--calls 200] [--mode legacy|auto] [--side nexus]
    python benchmarks/callgrind_chain.py --opcodes [--calls 40]    (which Python code)

About a minute per side and era (more on a busy machine). Counts are of user-space
instructions: the kernel's side of the audit ``write``, thread hand-offs and cache misses
are not in them (the CPU-time ratio of ``bench_chain.py`` is a little higher).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, Any

from results import Row, progress, report

NAME = "callgrind_chain"
HERE = Path(__file__).resolve().parent
TARGET_RATIO = 1.05  # issue 29
WARMUP_CALLS = 50
ARGS = {"path": "small.txt"}
ERAS = {"legacy": "2025-11-25", "auto": "2026-07-28"}
SIDES = ("bare", "nexus")
CLOCK_SCALE = 100.0  # valgrind's slow-down, about (slow_clocks)
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


async def drive(
    side: str, calls: int, mode: str, tmp: Path, mark: Callable[[], None] | None = None
) -> None:
    """The measured process: one server, warm-up, then ``calls`` calls when told to
    (``mark``: called instead of the stdin hand-shake, before and after them)."""
    from fastmcp import Client

    root = tmp / "ws"
    root.mkdir()
    (root / "small.txt").write_text("hello benchmark\n" * 16)
    closer: Any = None
    if side == "bare":
        from bare_server import build_bare

        server: Any = build_bare(root)
    else:
        from nexus_mcp.observability.logs import configure_logging
        from nexus_mcp.server import build_server
        from nexus_mcp.settings import Settings

        configure_logging("ERROR")
        # Limits stay on; only their thresholds are raised, as in bench_chain.py.
        budgets = {"rate_limit_calls": 10**9, "max_calls_per_session": 10**9}
        built = build_server(
            Settings(mode="dev", workspace=root, data_dir=tmp / "data", budgets=budgets)
        )
        server, closer = built.mcp, built.close
    try:
        async with Client(server, mode=mode) as client:

            async def call() -> None:
                result = await client.call_tool("nexus_read_file", ARGS)
                if result.is_error:
                    raise SystemExit(f"{side}: the call failed: {result}")

            for _ in range(WARMUP_CALLS):
                await call()
            (mark or handshake)()  # the parent switches instrumentation on
            for _ in range(calls):
                await call()
            (mark or handshake)()  # and off
    finally:
        if closer is not None:
            closer()


def handshake() -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()


def slow_clocks(scale: float) -> None:
    """Make ``time``'s clocks run ``scale`` times slower in this process, before anything
    binds them: under valgrind a call takes ~100x its native time, so a cache that lives
    0.1 s (``identity/access.py``'s recent answers) or refreshes each second (the
    visibility cache's revision read, a SQLite query) would miss on nearly every call,
    where at native speed it hits for dozens or hundreds. With the clocks slowed, both
    servers see the calls per second they see natively."""
    if scale == 1:
        return
    real_monotonic, real_time, real_time_ns = time.monotonic, time.time, time.time_ns
    mono0, wall0, wall0_ns = real_monotonic(), real_time(), real_time_ns()
    time.monotonic = lambda: mono0 + (real_monotonic() - mono0) / scale
    time.time = lambda: wall0 + (real_time() - wall0) / scale
    time.time_ns = lambda: wall0_ns + int((real_time_ns() - wall0_ns) / scale)


def child(side: str, calls: int, mode: str, clock_scale: float) -> int:
    slow_clocks(clock_scale)
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(drive(side, calls, mode, Path(tmp)))
    return 0


def opcodes(side: str, calls: int, mode: str, clock_scale: float) -> collections.Counter[str]:
    """Python bytecodes executed per call, by function (``sys.settrace`` opcode events):
    deterministic like the instruction count, and says which Python function they are in
    (callgrind sees only the interpreter's C functions)."""
    counts: collections.Counter[str] = collections.Counter()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        if event == "opcode":
            code = frame.f_code
            counts[f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}"] += 1
        return tracer

    tracing = False

    def mark() -> None:
        nonlocal tracing
        tracing = not tracing
        threading.settrace(tracer if tracing else None)  # type: ignore[arg-type]
        sys.settrace(tracer if tracing else None)

    slow_clocks(clock_scale * 20)  # tracing is slower still than valgrind
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(drive(side, calls, mode, Path(tmp), mark))
    return counts


def print_opcodes(calls: int, mode: str, clock_scale: float) -> None:
    """Each side in its own process (``--opcodes-side``), then totals and nexus-mcp's own."""
    per_side = {}
    for side in SIDES:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--opcodes-side", side,
             "--calls", str(calls), "--mode", mode, "--clock-scale", str(clock_scale)],
            cwd=HERE, capture_output=True, text=True, check=True,
        )  # fmt: skip
        per_side[side] = collections.Counter(
            {k: float(v) for v, k in (line.split(" ", 1) for line in done.stdout.splitlines())}
        )
    totals = {side: sum(c.values()) / calls for side, c in per_side.items()}
    print(f"Python opcodes per call ({ERAS[mode]}, {calls} calls, sys.settrace)")
    print(f"  bare {totals['bare']:,.0f}  nexus-mcp {totals['nexus']:,.0f}  "
          f"({totals['nexus'] / totals['bare']:.3f}x)")  # fmt: skip
    own = [(v / calls, k) for k, v in per_side["nexus"].items() if "nexus_mcp/" in k]
    print(f"  in nexus_mcp's own code: {sum(v for v, _ in own):,.0f}; the most:")
    for value, name in sorted(own, reverse=True)[:25]:
        print(f"  {value:8.0f}  {name.split('nexus_mcp/')[-1]}")


def count(side: str, calls: int, mode: str, out: Path, clock_scale: float) -> int:
    """Instructions of ``calls`` calls in a child process under callgrind."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "FASTMCP_LOG_LEVEL": "ERROR"}
    proc = subprocess.Popen(
        [tool("valgrind"), "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         sys.executable, str(Path(__file__).resolve()),
         "--child", side, "--calls", str(calls), "--mode", mode,
         "--clock-scale", str(clock_scale)],
        env=env, cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    for switch in ("on", "off"):
        _await_ready(proc.stdout, side)
        subprocess.run(
            [tool("callgrind_control"), "--instr=" + switch, str(proc.pid)],
            capture_output=True, check=True,
        )  # fmt: skip
        proc.stdin.write("go\n")
        proc.stdin.flush()
    _, err = proc.communicate()
    found = COLLECTED.findall(err)
    if proc.returncode != 0 or not found:
        sys.stderr.write(err[-4000:])
        raise SystemExit(f"callgrind run of {side} failed")
    return int(found[-1])


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} is not installed (valgrind's package has it)")
    return found


def _await_ready(stdout: IO[str], side: str) -> None:
    line = stdout.readline()
    if line.strip() != "ready":
        raise SystemExit(f"callgrind run of {side}: expected 'ready', got {line!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--mode", choices=sorted(ERAS))
    parser.add_argument("--side", choices=SIDES, help="count one side only (no ratio)")
    parser.add_argument(
        "--clock-scale",
        type=float,
        default=CLOCK_SCALE,
        help="how many times slower the measured process's clocks run (1: real time)",
    )
    parser.add_argument(
        "--opcodes", action="store_true", help="count Python opcodes by function instead"
    )
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--opcodes-side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path, help="keep the callgrind files in this folder")
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.calls, args.mode or "legacy", args.clock_scale)
    if args.opcodes_side:
        counted = opcodes(args.opcodes_side, args.calls, args.mode or "legacy", args.clock_scale)
        sys.stdout.writelines(f"{v} {k}\n" for k, v in counted.items())
        return 0
    if args.opcodes:
        for mode in [args.mode] if args.mode else list(ERAS):
            print_opcodes(args.calls, mode, args.clock_scale)
        return 0
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for mode in [args.mode] if args.mode else list(ERAS):
            per_call: dict[str, float] = {}
            for side in [args.side] if args.side else SIDES:
                progress(NAME, f"{ERAS[mode]}: {side}, {args.calls} calls under callgrind")
                total = count(
                    side, args.calls, mode, out / f"callgrind.{side}.{mode}", args.clock_scale
                )
                per_call[side] = total / args.calls
                progress(NAME, f"{ERAS[mode]}: {side}: {per_call[side]:,.0f} instructions a call")
            if args.side:
                continue
            rows.append(
                Row(
                    measure=f"tools/call instructions in memory ({ERAS[mode]})",
                    baseline="bare FastMCP, same tool work",
                    baseline_value=per_call["bare"] / 1e3,
                    value=per_call["nexus"] / 1e3,
                    unit="k instr",
                    target_kind="ratio_max",
                    target=TARGET_RATIO,
                    note=f"callgrind, client and server, {args.calls} calls after "
                    f"{WARMUP_CALLS} uninstrumented, clocks {args.clock_scale:g}x slower",
                )
            )
    if rows:
        report(NAME, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
