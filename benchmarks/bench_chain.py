"""tools/call overhead: nexus_read_file through the full chain vs bare FastMCP, in memory.

Both servers read the same small file with the same function and return the same model;
calls are interleaved (bare, nexus, bare, ...) so machine drift hits both equally. The
nexus server runs its real configuration: JSONL audit file flushed per event, registry
classification and document hashing when those layers are present.

    python benchmarks/bench_chain.py [--calls 1500] [--mode legacy|auto]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastmcp import Client, FastMCP

from nexus_mcp.server import build_server
from nexus_mcp.settings import Settings
from nexus_mcp.tools.files import ReadFileResult
from nexus_mcp.workspace import Workspace


def build_bare(root: Path) -> FastMCP[Any]:
    workspace = Workspace(root)
    bare: FastMCP[Any] = FastMCP("bare")

    @bare.tool
    async def nexus_read_file(path: str) -> ReadFileResult:
        target = workspace.resolve(path, must_exist=True)
        data = await asyncio.to_thread(lambda: workspace.read_bytes(target, limit=10 * 1024 * 1024))
        return ReadFileResult(
            path=target.relative, content=data.decode(), size_bytes=len(data), binary=False
        )

    return bare


async def measure(calls: int, mode: str) -> dict[str, float]:
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
        bare = build_bare(root)
        samples: dict[str, list[float]] = {"bare": [], "nexus": []}
        async with (
            Client(bare, mode=mode) as bare_client,
            Client(nexus.mcp, mode=mode) as nexus_client,
        ):
            clients = {"bare": bare_client, "nexus": nexus_client}
            for client in clients.values():  # warm-up
                for _ in range(100):
                    await client.call_tool("nexus_read_file", {"path": "small.txt"})
            for _ in range(calls):
                for name, client in clients.items():
                    start = time.perf_counter()
                    await client.call_tool("nexus_read_file", {"path": "small.txt"})
                    samples[name].append(time.perf_counter() - start)
        nexus.close()
    bare_us = statistics.median(samples["bare"]) * 1e6
    nexus_us = statistics.median(samples["nexus"]) * 1e6
    return {"bare_us": bare_us, "nexus_us": nexus_us, "ratio": nexus_us / bare_us}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--mode", choices=["legacy", "auto"], default=None)
    args = parser.parse_args(argv)
    modes = [args.mode] if args.mode else ["legacy", "auto"]
    print("tools/call nexus_read_file (small file), in-memory client, interleaved; medians")
    for mode in modes:
        r = asyncio.run(measure(args.calls, mode))
        print(
            f"  mode={mode:6}  bare FastMCP {r['bare_us']:8.0f} us   nexus chain {r['nexus_us']:8.0f} us   ratio {r['ratio']:.3f}x  (target <= 1.10x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
