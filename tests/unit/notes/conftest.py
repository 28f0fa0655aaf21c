"""A real loopback canister: a Starlette app served by uvicorn on 127.0.0.1 in a thread.

Tests register how the canister answers each note path and read back the requests it
received (method, raw path, headers), so header, encoding and request-count claims are
checked on the wire.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

Behaviour = Callable[[Request], Any]
STARTUP_DEADLINE_S = 10.0


@dataclass
class RecordedRequest:
    method: str
    raw_path: str
    headers: dict[str, str]


@dataclass
class LoopbackCanister:
    base_url: str = ""
    requests: list[RecordedRequest] = field(default_factory=list)
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    release: threading.Event = field(default_factory=threading.Event)

    def reset(self) -> None:
        self.requests.clear()
        self.behaviours.clear()

    def serve_note(self, raw_path: str, payload: Any) -> None:
        self.behaviours[raw_path] = lambda _request: JSONResponse(payload)

    def serve(self, raw_path: str, behaviour: Behaviour) -> None:
        self.behaviours[raw_path] = behaviour


def _build_app(canister: LoopbackCanister) -> Starlette:
    async def notes(request: Request) -> Response:
        raw_path = request.scope["raw_path"].decode("latin-1")
        canister.requests.append(
            RecordedRequest(
                request.method, raw_path, {k.lower(): v for k, v in request.headers.items()}
            )
        )
        behaviour = canister.behaviours.get(raw_path)
        if behaviour is None:
            return JSONResponse({"error": "not found"}, status_code=404)
        result = behaviour(request)
        if asyncio.iscoroutine(result):
            result = await result
        return result  # type: ignore[no-any-return]

    return Starlette(routes=[Route("/api/v1/notes/{path:path}", notes)])


@pytest.fixture(scope="session")
def loopback_canister_server() -> Iterator[LoopbackCanister]:
    canister = LoopbackCanister()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        _build_app(canister), log_level="warning", access_log=False, lifespan="off", ws="none"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while not server.started:  # bounded wait for the listener, not a fixed sleep
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("loopback canister did not start")
        time.sleep(0.01)
    canister.base_url = f"http://127.0.0.1:{port}"
    yield canister
    canister.release.set()
    server.should_exit = True
    thread.join(timeout=STARTUP_DEADLINE_S)
    sock.close()


@pytest.fixture
def loopback_canister(loopback_canister_server: LoopbackCanister) -> Iterator[LoopbackCanister]:
    loopback_canister_server.reset()
    yield loopback_canister_server
    loopback_canister_server.reset()


async def stream_chunks(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def streaming_response(chunks: list[bytes]) -> StreamingResponse:
    """A chunked reply without Content-Length, so the client must count bytes itself."""
    return StreamingResponse(stream_chunks(chunks), media_type="application/json")
