"""A real loopback canister: a Starlette app served by uvicorn on 127.0.0.1 in a thread.

Tests register how the canister answers each note path and read back the requests it
received (method, raw path, headers), so header, encoding and request-count claims are
checked on the wire.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.loopback import serve_in_thread

Behaviour = Callable[[Request], Any]


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
    with serve_in_thread(_build_app(canister), on_stop=canister.release.set) as base_url:
        canister.base_url = base_url
        yield canister


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
