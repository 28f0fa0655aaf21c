"""Read a request's whole body in an ASGI layer, then hand the same messages on.

The layers that decide from the body before the MCP handler runs (the routing headers'
check, the scope challenge) read it whole (bounded by ``BodyLimitMiddleware`` outside
them) and give the application a ``receive`` that replays what they read.
"""

from __future__ import annotations

from starlette.types import Message, Receive


async def read_body(receive: Receive) -> tuple[list[Message], bytes]:
    """Every message up to the body's end, and the body's bytes."""
    messages: list[Message] = []
    body = b""
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    return messages, body


def replaying(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives ``messages`` first, then whatever comes next."""
    pending = iter(messages)

    async def replayed() -> Message:
        return next(pending, None) or await receive()

    return replayed


__all__ = ["read_body", "replaying"]
