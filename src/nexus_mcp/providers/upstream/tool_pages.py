"""One page of an upstream's ``tools/list``, validated with the event loop given turns.

The MCP SDK's ``ClientSession.list_tools`` validates a result in single calls into
pydantic on the event loop: against the negotiated revision's surface (a validation and a
dump of the whole result), then as ``ListToolsResult``. For a page of thousands of
definitions that holds the loop, and every other caller of the gateway, for as long
(the profile of a 3,000-tool page: most of the loop's time during a listing). Here the
request goes out as the SDK sends it (its dispatcher, its stamp, its read timeout) and
the answer is checked by the same two validations, a definition at a time, paced
(``pacing.py``: the loop left to other callers between slices); then the session takes
the listing in as ``list_tools`` does (``_absorb_tool_listing``: output schemas for
later calls).

This leans on the SDK's session internals (``_dispatcher``, ``_stamp``,
``_absorb_tool_listing``); a session without them (another SDK) is asked with
``list_tools_mcp`` as before. No FastMCP import: the client is passed in.
"""

from __future__ import annotations

import contextlib
from typing import Any

import mcp_types as types
from mcp_types import methods as _methods

from nexus_mcp.providers.upstream.pacing import Pacer

FALLBACK_VERSION = "2025-11-25"  # the SDK's own, before a handshake settles one
METHOD = "tools/list"


def _later_revision_fields(version: str) -> frozenset[str]:
    """The SDK's own rule (result keys of a later revision are dropped), when it has it."""
    try:
        from mcp.client.session import _later_revision_fields as later
    except ImportError:  # pragma: no cover - another SDK: nothing dropped
        return frozenset()
    fields: frozenset[str] = later(METHOD, version)
    return fields


def _surface_check(version: str, data: dict[str, Any]) -> None:
    """The SDK's check against the negotiated revision's surface (none for a pair it has
    no surface for, as the SDK skips it)."""
    with contextlib.suppress(KeyError):
        _methods.validate_server_result(METHOD, version, data)


async def list_page(client: Any, cursor: str | None) -> types.ListToolsResult:
    """``client.list_tools_mcp(cursor=cursor)``, validated in steps (module docstring)."""
    session = getattr(client, "session", None)
    send_raw = getattr(getattr(session, "_dispatcher", None), "send_raw_request", None)
    stamp = getattr(session, "_stamp", None)
    absorb = getattr(session, "_absorb_tool_listing", None)
    if send_raw is None or stamp is None or absorb is None:
        result: types.ListToolsResult = await client.list_tools_mcp(cursor=cursor)
        return result
    params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
    data = types.ListToolsRequest(params=params).model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    opts: dict[str, Any] = {}
    stamp(data, opts)
    timeout = getattr(session, "_session_read_timeout_seconds", None)
    if timeout is not None:
        opts["timeout"] = timeout
    raw = await send_raw(data["method"], data.get("params"), opts)
    version = getattr(session, "_negotiated_version", None) or FALLBACK_VERSION
    listing = await validated(raw, version)
    complete = cursor is None and listing.next_cursor is None
    absorbed: types.ListToolsResult = absorb(listing, complete=complete)
    return absorbed


async def validated(raw: dict[str, Any], version: str) -> types.ListToolsResult:
    """What ``ClientSession.send_request`` makes of a ``tools/list`` result: checked
    against ``version``'s surface, a later revision's keys dropped, validated as
    ``ListToolsResult``; here one definition at a time. Raises as the SDK raises
    (``pydantic.ValidationError``) on a result it would refuse."""
    definitions = raw.get("tools")
    if not isinstance(definitions, list):
        _surface_check(version, raw)  # raises, as the SDK would
        return types.ListToolsResult.model_validate(raw, by_name=False)
    envelope = {key: value for key, value in raw.items() if key != "tools"}
    ttl = envelope.get("ttlMs")
    if isinstance(ttl, int | float) and not isinstance(ttl, bool) and ttl < 0:
        envelope["ttlMs"] = 0  # the SDK's clamp of a negative cache hint
    _surface_check(version, {**envelope, "tools": []})
    foreign = _later_revision_fields(version)
    kept = {key: value for key, value in envelope.items() if key not in foreign}
    result = types.ListToolsResult.model_validate({**kept, "tools": []}, by_name=False)
    tools: list[types.Tool] = []
    pacer = Pacer()
    for definition in definitions:
        _surface_check(version, {**envelope, "tools": [definition]})
        tools.append(types.Tool.model_validate(definition, by_name=False))
        await pacer.step()
    return result.model_copy(update={"tools": tools})


__all__ = ["list_page", "validated"]
