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

    python benchmarks/callgrind_chain.py [--calls 200] [--mode legacy|auto]

About half a minute per side and era. Counts are of user-space instructions: the kernel's
side of the audit ``write``, thread hand-offs and cache misses are not in them (the
CPU-time ratio of ``bench_chain.py`` is a little higher).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from results import Row, progress, report

NAME = "callgrind_chain"
HERE = Path(__file__).resolve().parent
TARGET_RATIO = 1.05  # issue 29
WARMUP_CALLS = 50
ARGS = {"path": "small.txt"}
ERAS = {"legacy": "2025-11-25", "auto": "2026-07-28"}
SIDES = ("bare", "nexus")
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


async def drive(side: str, calls: int, mode: str, tmp: Path) -> None:
    """The measured process: one server, warm-up, then ``calls`` calls when told to."""
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
            handshake()  # the parent switches instrumentation on
            for _ in range(calls):
                await call()
            handshake()  # and off
    finally:
        if closer is not None:
            closer()


def handshake() -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()


def child(side: str, calls: int, mode: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(drive(side, calls, mode, Path(tmp)))
    return 0


def count(side: str, calls: int, mode: str, out: Path) -> int:
    """Instructions of ``calls`` calls in a child process under callgrind."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "FASTMCP_LOG_LEVEL": "ERROR"}
    proc = subprocess.Popen(
        [tool("valgrind"), "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
         sys.executable, str(Path(__file__).resolve()),
         "--child", side, "--calls", str(calls), "--mode", mode],
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
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path, help="keep the callgrind files in this folder")
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.calls, args.mode or "legacy")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for mode in [args.mode] if args.mode else list(ERAS):
            per_call: dict[str, float] = {}
            for side in [args.side] if args.side else SIDES:
                progress(NAME, f"{ERAS[mode]}: {side}, {args.calls} calls under callgrind")
                total = count(side, args.calls, mode, out / f"callgrind.{side}.{mode}")
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
                    f"{WARMUP_CALLS} uninstrumented",
                )
            )
    if rows:
        report(NAME, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
