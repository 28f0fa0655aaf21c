"""Serve an ASGI app for real on 127.0.0.1 in a background thread (uvicorn), for tests.

Outside boundaries (a hosted canister) are served by a small app here rather than by
patching our code; the listener is real, so headers, encoding and request counts are
checked on the wire.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

import uvicorn
from starlette.responses import StreamingResponse
from starlette.types import ASGIApp

STARTUP_DEADLINE_S = 10.0
DRIP_INTERVAL_S = 0.05
DRIP_MAX_CHUNKS = 400  # 20 s at most, far past any deadline a test sets


def drip_fed_response(
    prefix: bytes, *, interval_s: float = DRIP_INTERVAL_S, max_chunks: int = DRIP_MAX_CHUNKS
) -> StreamingResponse:
    """A 200 JSON reply that never finishes in time: ``prefix``, then one byte per interval.

    Each byte arrives well inside any read timeout, so only a total deadline can end the
    read. The pacing is the hostile upstream's behaviour, not a wait in the test; Starlette
    cancels the stream when the client hangs up, and ``max_chunks`` bounds it regardless.
    """

    async def chunks() -> AsyncIterator[bytes]:
        yield prefix
        for _ in range(max_chunks):
            await asyncio.sleep(interval_s)
            yield b" "

    return StreamingResponse(chunks(), media_type="application/json")


@contextmanager
def serve_in_thread(
    app: ASGIApp, *, on_stop: Callable[[], None] | None = None, lifespan: str = "off"
) -> Iterator[str]:
    """Yield the base URL of ``app`` served on a free loopback port; stop it afterwards."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan=lifespan, ws="none", log_config=None
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    try:
        while not server.started:  # bounded wait for the listener, not a fixed sleep
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("loopback server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        if on_stop is not None:
            on_stop()
        server.should_exit = True
        thread.join(timeout=STARTUP_DEADLINE_S)
        sock.close()
