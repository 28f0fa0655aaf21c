"""The HTTP listener ``transport.bind_listener`` binds before the banner is printed."""

from __future__ import annotations

import asyncio
import socket

from nexus_mcp.settings import Settings
from nexus_mcp.transport.serve import bind_listener


async def test_connections_accepted_on_the_listener_send_without_waiting_for_acks() -> None:
    """asyncio turns Nagle's algorithm off only on sockets whose protocol says TCP; with it
    on, each small response waited for the client's delayed ACK (~40 ms a call)."""
    listener = bind_listener(Settings(mode="dev", transport="http", host="127.0.0.1", port=0))
    accepted: asyncio.Queue[int] = asyncio.Queue()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        await accepted.put(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(on_connect, sock=listener)
    try:
        port = listener.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(accepted.get(), 10) != 0
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
