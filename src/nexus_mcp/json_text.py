"""Compact JSON for what leaves on every call (audit lines, result text), encoded fast.

pydantic-core's encoder is 3-4x faster than ``json.dumps`` (benchmarks/bench_chain.py).
Its output is the same compact JSON with UTF-8 text, except in two corners it handles
differently, both kept safe here: text with no UTF-8 form (a lone surrogate) falls back to
``json.dumps``, whose ASCII escapes keep it, and a non-finite float becomes ``null``
rather than the non-JSON ``NaN``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic_core

REPLACEMENT_CHARACTER = "\ufffd"
# A str holds only lone surrogates in this range: a valid pair is one code point.
_SURROGATE = re.compile("[\ud800-\udfff]")


def compact_json(value: Any) -> bytes:
    """``value`` as compact JSON in UTF-8; unknown types are written as their ``str``."""
    try:
        return pydantic_core.to_json(value, fallback=str, inf_nan_mode="null")
    except pydantic_core.PydanticSerializationError:
        return json.dumps(value, separators=(",", ":"), default=str).encode("ascii")


def to_result_json(value: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A tool result fit for any client, and its compact JSON text.

    A string with a lone surrogate (a file name that is not UTF-8, read back through
    ``surrogateescape``; a YAML ``"\\ud800"`` escape in a note's frontmatter) is no text a
    client can receive: the MCP SDK fails to encode the response, and on stdio that ends
    the whole server. Such characters become U+FFFD, as a UTF-8 decoder with replacement
    would have made them. The usual result, with none, is encoded once and returned as is.
    """
    try:
        return value, pydantic_core.to_json(value, fallback=str, inf_nan_mode="null").decode()
    except pydantic_core.PydanticSerializationError:
        clean = _without_lone_surrogates(value)
        return clean, compact_json(clean).decode("utf-8")


def _without_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return value if value.isascii() else _SURROGATE.sub(REPLACEMENT_CHARACTER, value)
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_lone_surrogates(item) for item in value]
    return value


__all__ = ["compact_json", "to_result_json"]
