"""Where the chain's time goes: a sampling profile of a real nexus-mcp server, by layer.

    pip install py-spy      (a profiler; not a dependency of nexus-mcp)
    python benchmarks/profile_chain.py [--seconds 20] [--transport stdio|http]

Starts ``nexus-mcp serve`` (dev mode, JSONL audit file) and the equal-work bare FastMCP
server as subprocesses, drives each with sequential ``nexus_read_file`` calls for the
same time, and samples each with ``py-spy record --gil`` (only the thread holding the GIL:
CPU spent in Python, not waiting). Each nexus-mcp sample is charged to the innermost
chain piece on its stack (the table below); what remains is the work both servers do
(transport, FastMCP, the tool's own read). Figures are microseconds of GIL time per call.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from results import progress
from servers import (
    HttpSession,
    ServerSpec,
    bench_workspace,
    http_server,
    process_cpu_seconds,
    stdio_server,
)

NAME = "profile_chain"
RATE_HZ = 1000
ARGS = {"path": "small.txt"}

# (piece, patterns of "function (file)" frames that belong to it), innermost match wins.
PIECES: list[tuple[str, tuple[str, ...]]] = [
    (
        "audit: build events",
        (
            r"^AuditTrail\._event",
            r"^AuditTrail\._loggable_args",
            r"^AuditTrail\._args_digest",
            r"^utc_timestamp",
            r"digest_arguments",
            r"fingerprint_arguments",
            r"to_canonical_json",
        ),
    ),
    ("audit: encode and write", (r"^JsonlAuditSink\.", r"^encode_record", r"^AuditLog\.emit")),
    ("audit: layer", (r"^AuditTrail\.", r"^AuditMiddleware\.")),
    ("ids (uuid7)", (r"^new_id", r"^uuid7_int")),
    (
        "envelope",
        (
            r"^EnvelopeMiddleware\.",
            r"^estimate_size",
            r"^nexus_meta",
            r"^CallState\.",
            r"^open_call",
            r"^_Bound\.",
        ),
    ),
    (
        "identity",
        (
            r"^IdentityMiddleware\.",
            r"^IdentityResolver\.",
            r"^session_key",
            r"^_safe_session_id",
            r"^bind_principal",
        ),
    ),
    (
        "namespace",
        (
            r"^ToolNamespaceMiddleware\.",
            r"^GrantedTools\.",
            r"^VisibleToolsCache\.",
            r"^_TimedCache\.",
        ),
    ),
    (
        "classification (gateway and connector)",
        (
            r"^ClassificationMiddleware\.",
            r"^RegistryEnforcer\.classify",
            r"^classify_call",
            r"^RegistrySet\.",
            r"^lookup",
            r"^plumbing_value",
            r"^refuse_unrepresentable",
            r"^first_unrepresentable",
        ),
    ),
    ("approval and write policy", (r"^ApprovalMiddleware\.",)),
    (
        "documents (pre-exec, read hashes)",
        (
            r"^DocumentsMiddleware\.",
            r"^RegistryEnforcer\.check_",
            r"^check_read_documents",
            r"^check_write_documents",
            r"^_measure",
            r"^resolve_pointer",
            r"^sha256_hex",
            r"^DocumentCheck\.",
            r"^RegistryConnectorCheck\.",
        ),
    ),
    (
        "limits (budget, rate, deadline)",
        (
            r"^LimitsMiddleware\.",
            r"^SessionBudget\.",
            r"^SlidingWindowRateLimiter\.",
            r"^IdleExpiringMap\.",
            r"^DeadlineWatch\.",
            r"^_Within\.",
            r"^_Deadline\.",
        ),
    ),
    (
        "connector: effect, result text, ToolResult",
        (
            r"^bind_tool\.<locals>\.connector",
            r"^to_structured",
            r"^to_result_json",
            r"^compact_json",
            r"^RegistryEnforcer\.effect",
            r"^build_tool_effect",
            r"^Runtime\.",
        ),
    ),
    ("NexusTool.run (arguments reuse)", (r"^NexusTool\.",)),
    ("tool lookup (ToolIndex)", (r"^ToolIndex\.",)),
    ("chain plumbing (PolicyChain)", (r"^PolicyChain\.", r"^hooks_for")),
]
TOOL_BODY = re.compile(r"nexus_read_file")  # the tool's own work: the bare server does it too
# FastMCP's own tools/call work below the chain (lookup, spans, running the tool): a sample
# under one of these, and under no chain piece deeper down, is FastMCP's, not the layer's
# that called ``call_next``.
FASTMCP_CORE = re.compile(
    r"^(FastMCP\.(call_tool|get_tool|_get_tool)|Tool\._run|Provider\.get_tool)\b"
)
COMPILED = [(piece, [re.compile(p) for p in patterns]) for piece, patterns in PIECES]


def attribute(raw: Path, calls: int) -> tuple[dict[str, float], float]:
    """Per-call µs for each piece, and the total GIL time per call."""
    pieces: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():  # a frame name py-spy could not read whole
            continue
        frames = [f for f in stack.split(";") if f]
        samples = int(count)
        total += samples
        if any(TOOL_BODY.search(f) for f in frames):
            pieces["the tool's own work (both servers)"] += samples
            continue
        piece = "transport and FastMCP (both servers)"
        for frame in reversed(frames):
            name = frame.split(" (")[0]
            if "nexus_mcp/" not in frame:
                if FASTMCP_CORE.search(name):
                    break
                continue
            for candidate, patterns in COMPILED:
                if any(p.search(name) for p in patterns):
                    piece = candidate
                    break
            else:
                continue
            break
        pieces[piece] += samples
    scale = 1e6 / RATE_HZ / calls
    return {k: v * scale for k, v in pieces.items()}, total * scale


def py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")  # installed in this virtualenv
    return str(beside) if beside.exists() else shutil.which("py-spy")


async def sample_alternating(
    sessions: dict[str, Any], pids: dict[str, int], seconds: float, out: Path
) -> tuple[int, dict[str, float]]:
    """Alternate calls between the servers while py-spy samples each; calls and CPU µs/call."""
    for session in sessions.values():
        for _ in range(200):
            await session.call_tool("nexus_read_file", ARGS)
    spies = {}
    for kind, pid in pids.items():
        spies[kind] = subprocess.Popen(
            [py_spy() or "py-spy", "record", "--gil", "--nonblocking", "-r", str(RATE_HZ),
             "-f", "raw", "-o", str(out / f"{kind}.txt"), "--pid", str(pid),
             "-d", str(int(seconds))],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    cpu_start = {kind: process_cpu_seconds(pid) for kind, pid in pids.items()}
    calls = 0
    deadline = time.monotonic() + seconds + 30
    while any(spy.poll() is None for spy in spies.values()) and time.monotonic() < deadline:
        for session in sessions.values():
            await session.call_tool("nexus_read_file", ARGS)
        calls += 1
    cpu = {
        kind: (process_cpu_seconds(pid) - cpu_start[kind]) / calls * 1e6
        for kind, pid in pids.items()
    }
    for spy in spies.values():
        spy.wait()
    return calls, cpu


async def profile(transport: str, seconds: float, out: Path) -> tuple[int, dict[str, float]]:
    with bench_workspace() as (root, workspace, logs):
        specs = {
            kind: ServerSpec(kind, kind, workspace, root / f"data-{kind}")
            for kind in ("equal", "nexus")
        }
        if transport == "stdio":
            async with (
                stdio_server(specs["equal"], logs) as (bare, bare_session),
                stdio_server(specs["nexus"], logs) as (nexus, nexus_session),
            ):
                return await sample_alternating(
                    {"equal": bare_session, "nexus": nexus_session},
                    {"equal": bare.pid, "nexus": nexus.pid}, seconds, out,
                )  # fmt: skip
        async with (
            http_server(specs["equal"], logs, stateless=False) as bare,
            http_server(specs["nexus"], logs, stateless=False) as nexus,
        ):
            sessions = {
                "equal": HttpSession(bare.url or "", stateless=False),
                "nexus": HttpSession(nexus.url or "", stateless=False),
            }
            for session in sessions.values():
                await session.initialize()
            try:
                return await sample_alternating(
                    sessions, {"equal": bare.pid, "nexus": nexus.pid}, seconds, out
                )
            finally:
                for session in sessions.values():
                    await session.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    args = parser.parse_args(argv)
    if py_spy() is None:
        sys.stderr.write("py-spy is not installed: pip install py-spy\n")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        progress(
            NAME, f"both servers over {args.transport}, alternating, sampled {args.seconds:.0f} s"
        )
        calls, cpu = asyncio.run(profile(args.transport, args.seconds, out))
        attributed = {kind: attribute(out / f"{kind}.txt", calls) for kind in ("equal", "nexus")}
    gil = {kind: total for kind, (_, total) in attributed.items()}
    pieces = attributed["nexus"][0]
    print(
        f"per call over {args.transport}, {calls} alternating calls each (py-spy --gil, {RATE_HZ} Hz)"
    )
    print(f"  {'':<45} {'GIL µs':>8} {'CPU µs':>8}")
    for kind, label in (("equal", "bare FastMCP, same tool work"), ("nexus", "nexus-mcp")):
        print(f"  {label:<45} {gil[kind]:8.0f} {cpu[kind]:8.0f}")
    print(
        f"  {'nexus-mcp / bare':<45} {gil['nexus'] / gil['equal']:7.2f}x {cpu['nexus'] / cpu['equal']:7.2f}x"
    )
    print("nexus-mcp GIL time by piece, µs per call:")
    chain = 0.0
    for piece, value in sorted(pieces.items(), key=lambda kv: -kv[1]):
        print(f"  {piece:<45} {value:8.1f}")
        if "both servers" not in piece:
            chain += value
    print(f"  {'chain pieces together':<45} {chain:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
