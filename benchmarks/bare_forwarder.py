"""The gateway baselines of ``bench_upstream.py``: bare FastMCP servers in front of one upstream.

- ``forward``: the thinnest gateway FastMCP allows. One tool, ``echo``, forwards each call
  on a FastMCP ``Client`` opened once at start-up and reused (``call_tool_mcp``: the raw
  result, not parsed), and hands the upstream's content and structured content back as
  they came. No policy, no audit, no checks.
- ``proxy``: FastMCP's own ``create_proxy`` over the same upstream, with its defaults.

Served on stdio, like the nexus-mcp server beside it::

    python benchmarks/bare_forwarder.py --kind forward --upstream-command PY SCRIPT --transport stdio
    python benchmarks/bare_forwarder.py --kind proxy --upstream-url http://127.0.0.1:P/mcp
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

# FastMCP reads its log level when it is first imported.
os.environ.setdefault("FASTMCP_LOG_LEVEL", "ERROR")

from fastmcp import Client, FastMCP
from fastmcp.client.transports import ClientTransport, StdioTransport, StreamableHttpTransport
from fastmcp.server import create_proxy
from fastmcp.tools import ToolResult


def upstream_transport(args: argparse.Namespace) -> ClientTransport:
    if args.upstream_url:
        return StreamableHttpTransport(args.upstream_url)
    command, *rest = args.upstream_command
    return StdioTransport(command, [*rest, "--transport", "stdio"])


def build_forwarder(transport: ClientTransport) -> FastMCP[Any]:
    client: Client[Any] = Client(transport, mode="legacy")

    @asynccontextmanager
    async def lifespan(_server: FastMCP[Any]) -> AsyncIterator[None]:
        async with client:  # one upstream session for the server's life, reused per call
            yield

    bare: FastMCP[Any] = FastMCP("bare-forwarder", lifespan=lifespan)

    @bare.tool
    async def echo(text: str) -> ToolResult:
        result = await client.call_tool_mcp("echo", {"text": text})
        return ToolResult(content=result.content, structured_content=result.structured_content)

    return bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("forward", "proxy"), default="forward")
    parser.add_argument("--upstream-url", default=None)
    parser.add_argument("--upstream-command", nargs="+", default=None)
    parser.add_argument("--transport", choices=("stdio",), default="stdio")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    transport = upstream_transport(args)
    server = build_forwarder(transport) if args.kind == "forward" else create_proxy(transport)
    server.run(transport="stdio", show_banner=False)


if __name__ == "__main__":
    main()
    sys.exit(0)
