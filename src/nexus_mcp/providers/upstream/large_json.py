"""A large JSON text parsed with the event loop given a turn every few milliseconds.

A JSON parser (the stdlib's, pydantic's) is one call into C: an upstream's ``tools/list``
page of thousands of definitions, megabytes on one line, holds the event loop (and the
GIL, so a worker thread would too) for the whole parse, and every other caller of the
gateway waits. Here the outer containers of the text, down to ``depth`` levels (a
JSON-RPC message, its result, the result's list of definitions), are walked in Python,
and each value inside them (one tool definition) is decoded by the stdlib's C decoder in
one call; between values the work is paced (``pacing.py``): the loop is left to other
callers for a pause after every slice of work.

The result is what ``json.loads`` gives for the same text, but for the constants JSON does
not have (``NaN``, ``Infinity``), which are refused as the MCP SDK's parser refuses them.
A text that is not JSON raises ``ValueError`` (``json.JSONDecodeError``), as ``json.loads``
does. No FastMCP import.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator
from typing import Any

from nexus_mcp.providers.upstream.pacing import Pacer

DEPTH = 3  # message -> result -> tools -> each definition decoded whole

_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _no_constant(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_scanstring: Any = json.decoder.scanstring  # type: ignore[attr-defined]  # not in typeshed

Steps = Generator[None, None, tuple[Any, int]]


def _error(text: str, index: int, expected: str) -> json.JSONDecodeError:
    return json.JSONDecodeError(f"Expecting {expected}", text, index)


def _skip(text: str, index: int) -> int:
    match = _WHITESPACE.match(text, index)
    assert match is not None  # matches the empty string at least
    return match.end()


def _value(text: str, index: int, depth: int) -> Steps:
    """The value at ``index`` and where it ends; a step (a ``yield``) after each value
    decoded whole."""
    index = _skip(text, index)
    char = text[index : index + 1]
    if depth <= 0 or char not in ("{", "["):
        value, end = _DECODER.raw_decode(text, index)
        yield
        return value, end
    if char == "{":
        return (yield from _object(text, index + 1, depth))
    return (yield from _array(text, index + 1, depth))


def _object(text: str, index: int, depth: int) -> Steps:
    found: dict[str, Any] = {}
    index = _skip(text, index)
    if text[index : index + 1] == "}":
        return found, index + 1
    while True:
        if text[index : index + 1] != '"':
            raise _error(text, index, "property name enclosed in double quotes")
        key, index = _scanstring(text, index + 1, True)
        index = _skip(text, index)
        if text[index : index + 1] != ":":
            raise _error(text, index, "':' delimiter")
        found[key], index = yield from _value(text, index + 1, depth - 1)
        index = _skip(text, index)
        char = text[index : index + 1]
        if char == "}":
            return found, index + 1
        if char != ",":
            raise _error(text, index, "',' delimiter")
        index = _skip(text, index + 1)


def _array(text: str, index: int, depth: int) -> Steps:
    found: list[Any] = []
    index = _skip(text, index)
    if text[index : index + 1] == "]":
        return found, index + 1
    while True:
        item, index = yield from _value(text, index, depth - 1)
        found.append(item)
        index = _skip(text, index)
        char = text[index : index + 1]
        if char == "]":
            return found, index + 1
        if char != ",":
            raise _error(text, index, "',' delimiter")
        index += 1


async def loads_in_steps(text: str, depth: int = DEPTH) -> Any:
    """``json.loads(text)``, paced (module docstring)."""
    steps = _value(text, 0, depth)
    pacer = Pacer()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            value, end = done.value
            break
        await pacer.step()
    if _skip(text, end) != len(text):
        raise _error(text, _skip(text, end), "end of data")
    return value


__all__ = ["DEPTH", "loads_in_steps"]
