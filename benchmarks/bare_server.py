"""The baselines: bare FastMCP servers exposing the same read tool as nexus-mcp.

- ``equal``: the same tool work as ``nexus_read_file`` — ``Workspace.resolve`` on the
  event loop, the bounded read in ``asyncio.to_thread``, the same ``ReadFileResult`` —
  with none of nexus-mcp's chain (no middleware, no audit, no policy, one tool).
- ``plain``: what a FastMCP user writes first: a plain sync tool that opens the file
  (FastMCP runs it in its thread pool), no containment at all.

Run one as a real server for the transport benchmarks::

    python benchmarks/bare_server.py --kind equal --workspace W --transport stdio
    python benchmarks/bare_server.py --kind plain --workspace W --transport http --port P [--stateless]

Logs are set to ERROR, as the nexus server is run with ``--log-level ERROR``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

# FastMCP reads its log level when it is first imported.
os.environ.setdefault("FASTMCP_LOG_LEVEL", "ERROR")

from fastmcp import FastMCP

from nexus_mcp.tools.files import ReadFileResult
from nexus_mcp.workspace.files import Workspace

READ_LIMIT_BYTES = 10 * 1024 * 1024


def build_bare(root: Path) -> FastMCP[Any]:
    """Equal work: nexus-mcp's read without nexus-mcp's chain."""
    workspace = Workspace(root)
    bare: FastMCP[Any] = FastMCP("bare")

    @bare.tool
    async def nexus_read_file(path: str) -> ReadFileResult:
        target = workspace.resolve(path, must_exist=True)
        data = await asyncio.to_thread(lambda: workspace.read_bytes(target, limit=READ_LIMIT_BYTES))
        return ReadFileResult(
            path=target.relative, content=data.decode(), size_bytes=len(data), binary=False
        )

    return bare


def build_plain(root: Path) -> FastMCP[Any]:
    """A plain sync FastMCP tool: no containment, no bound, FastMCP's thread pool."""
    plain: FastMCP[Any] = FastMCP("plain")

    @plain.tool
    def nexus_read_file(path: str) -> ReadFileResult:
        data = (root / path).read_bytes()
        return ReadFileResult(path=path, content=data.decode(), size_bytes=len(data), binary=False)

    return plain


BUILDERS = {"equal": build_bare, "plain": build_plain}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kind", choices=sorted(BUILDERS), default="equal")
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--stateless", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    server = BUILDERS[args.kind](args.workspace)
    if args.transport == "stdio":
        asyncio.run(server.run_stdio_async(show_banner=False))
    else:
        asyncio.run(
            server.run_http_async(
                show_banner=False,
                transport="http",
                host="127.0.0.1",
                port=args.port,
                stateless_http=args.stateless,
                # As nexus-mcp runs uvicorn: no logging config of its own, access lines
                # below the level (so filtered the same way).
                uvicorn_config={"log_config": None},
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
