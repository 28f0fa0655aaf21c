"""``nexus-mcp call``: call one tool on a running server over streamable HTTP, print the result.

    nexus-mcp call [--url URL] [--token T] TOOL [KEY=TEXT | KEY:=JSON ...]
                   [--args JSON|@FILE] [--meta JSON|@FILE] [--full] [--timeout S]

Arguments: ``key=text`` is a string, ``key:=json`` any JSON value (``count:=3``,
``recursive:=true``); ``--args`` is a JSON object they are added to. A key given twice is a
usage error, never a silent override. The bearer token comes from ``--token`` or
``NEXUS_MCP_TOKEN`` (better: a flag is visible to other users in the process list); it is
sent as the ``Authorization`` header only and never printed, and neither are the
arguments.

Output, JSON on stdout: the result's structured content (else its text, parsed when it is
JSON); for a refused or failed call, the error envelope ``{"error", "code"}``. ``--full``
prints the whole result instead (``content``, ``structuredContent``, ``isError``,
``_meta`` with the tool effect and ``nexus.mcp/idempotent_replay``); without it, a replay
is also said in one line on stderr.

Exit codes: 0 the tool succeeded; 1 the tool refused or failed (``isError``); 2 a usage
error, or the server could not be reached or spoken to (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from nexus_mcp.commands.call_client import CallFailure

ENV_URL = "NEXUS_MCP_URL"
ENV_TOKEN = "NEXUS_MCP_TOKEN"  # noqa: S105 - the variable's name, not a token
DEFAULT_URL = "http://127.0.0.1:8765/mcp"  # what `make run` serves
DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_SERVER_MESSAGE_CHARS = 200  # a JSON-RPC error message is shown, cut to one short line
AUTH_STATUSES = (401, 403)

EXIT_OK = 0
EXIT_TOOL_ERROR = 1
EXIT_USAGE = 2

TEXT_PAIR = "="
# The marker a server sets on a replayed result: calls.META_REPLAYED, spelled out here so a
# one-shot call does not import the server's call state (test_call_cli pins the two equal).
META_REPLAYED = "nexus.mcp/idempotent_replay"
# The printed result of a replay is the first call's, byte for byte; say so where a person
# sees it without changing what a script reads.
REPLAY_NOTE = (
    "note: idempotent replay: the recorded result of the earlier call with this "
    "idempotency_key; nothing ran again"
)


class UsageError(Exception):
    """A bad command line; the message names the flag or key, never the value."""


class CallFailed(Exception):
    """The server could not be reached or answered with a protocol error."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "call",
        help="call one tool on a running server and print the result (for scripts)",
        description=(
            "Call one tool on a running nexus-mcp server over streamable HTTP and print the "
            "result as JSON: the structured content, or the error envelope {error, code} "
            "when the call is refused or fails."
        ),
        epilog=(
            "Arguments: key=text is a string, key:=json any JSON value (count:=3, "
            "recursive:=true). Exit codes: 0 the tool succeeded, 1 the tool refused or "
            "failed, 2 usage error or the server could not be reached."
        ),
    )
    parser.add_argument("tool", metavar="TOOL", help="the tool to call, e.g. nexus_read_file")
    parser.add_argument(
        "pairs", nargs="*", metavar="KEY=TEXT|KEY:=JSON",
        help="one argument of the tool: a string (key=text) or a JSON value (key:=json)",
    )  # fmt: skip
    parser.add_argument(
        "--args", dest="args_json", default=None, metavar="JSON|@FILE",
        help="the tool's arguments as a JSON object (or @FILE); KEY=... pairs are added",
    )  # fmt: skip
    parser.add_argument(
        "--meta", default=None, metavar="JSON|@FILE",
        help='request _meta as a JSON object, e.g. {"nexus.mcp/idempotency_key": "k-1"}',
    )  # fmt: skip
    parser.add_argument(
        "--url", default=None,
        help=f"the server's MCP endpoint (default {DEFAULT_URL}) [{ENV_URL}]",
    )  # fmt: skip
    parser.add_argument(
        "--token", default=None,
        help=f"bearer token for the server; prefer the environment variable [{ENV_TOKEN}]",
    )  # fmt: skip
    parser.add_argument(
        "--full", action="store_true",
        help="print the whole result: content, structuredContent, isError and _meta",
    )  # fmt: skip
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS, metavar="SECONDS",
        help="give up after this long, connecting included (default %(default)g)",
    )  # fmt: skip
    parser.set_defaults(func=run_call, accepts_trailing_pairs=True)


def run_call(args: argparse.Namespace) -> int:
    try:
        url = _check_url(args.url or os.environ.get(ENV_URL) or DEFAULT_URL)
        arguments = build_arguments(args.args_json, args.pairs)
        meta = _read_json_object(args.meta, "--meta") if args.meta is not None else None
        if not args.timeout > 0:
            raise UsageError("--timeout: must be a positive number of seconds")
    except UsageError as exc:
        return _fail(str(exc))
    token = args.token or os.environ.get(ENV_TOKEN) or None
    import asyncio  # here, not at the top: `nexus-mcp call --help` needs no event loop

    try:
        result = asyncio.run(call_tool(url, token, args.tool, arguments, meta, args.timeout))
    except CallFailed as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _fail("interrupted")
    print(_render(result_to_output(result, full=args.full)))
    if not args.full and is_replay(result):
        print(REPLAY_NOTE, file=sys.stderr)
    return EXIT_TOOL_ERROR if result.get("isError") else EXIT_OK


def is_replay(result: dict[str, Any]) -> bool:
    """Whether the server answered a retry with the recorded result of an earlier call."""
    return (result.get("_meta") or {}).get(META_REPLAYED) is True


def build_arguments(args_json: str | None, pairs: list[str]) -> dict[str, Any]:
    """``--args`` plus every ``key=text`` / ``key:=json`` pair; a repeated key is refused."""
    arguments = _read_json_object(args_json, "--args") if args_json is not None else {}
    for pair in pairs:
        key, value = _parse_pair(pair)
        if key in arguments:
            raise UsageError(f"argument '{key}' is given twice")
        arguments[key] = value
    return arguments


async def call_tool(
    url: str,
    token: str | None,
    tool: str,
    arguments: dict[str, Any],
    meta: dict[str, Any] | None,
    timeout: float,
) -> dict[str, Any]:
    """One ``tools/call`` over streamable HTTP; the result as the JSON a client receives."""
    # Imported here: `call --help` needs neither the event loop nor the HTTP client.
    import asyncio

    from nexus_mcp.commands.call_client import CallFailure, call_tool_over_http

    where = _safe_url(url)
    try:
        async with asyncio.timeout(timeout):
            return await call_tool_over_http(url, token, tool, arguments, meta, timeout)
    except TimeoutError:
        raise CallFailed(f"no answer from {where} within {timeout:g} s") from None
    except CallFailure as failure:
        raise CallFailed(_describe_failure(failure, where)) from None
    except Exception as exc:  # noqa: BLE001 - any failure to get a result is one line, exit 2
        raise CallFailed(f"cannot connect to {where} ({_root_cause(exc)})") from None


def _describe_failure(failure: CallFailure, where: str) -> str:
    """One line for a call the server answered without a result; never the exception's text."""
    if failure.status in AUTH_STATUSES:
        return f"{where} answered HTTP {failure.status} (check --token or {ENV_TOKEN})"
    if failure.status is not None:
        return f"{where} answered HTTP {failure.status}"
    if failure.error is not None:
        # The server's own JSON-RPC error: its message is meant for the client.
        message = " ".join(str(failure.error.get("message", "")).split())
        code = failure.error.get("code")
        return f"{where} answered with error {code}: {message[:MAX_SERVER_MESSAGE_CHARS]}"
    return f"{where} did not answer as an MCP server"


def result_to_output(result: dict[str, Any], *, full: bool) -> Any:
    """What ``call`` prints for a result (see the module docstring)."""
    if full:
        return result
    content = [_content_value(item) for item in result.get("content", [])]
    if result.get("isError"):
        first = content[0] if content else None
        # FastMCP's own refusals (an unknown or hidden tool) are plain text, not an envelope.
        return first if isinstance(first, dict) else {"error": first}
    if "structuredContent" in result:
        return result["structuredContent"]
    return content[0] if len(content) == 1 else content


def _content_value(item: dict[str, Any]) -> Any:
    if item.get("type") != "text":
        return item
    text = item.get("text", "")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _parse_pair(pair: str) -> tuple[str, Any]:
    if TEXT_PAIR not in pair:
        raise UsageError("an argument must be key=text or key:=json")
    key, _, value = pair.partition(TEXT_PAIR)
    if key.endswith(":"):
        key = key[:-1]
        try:
            parsed: Any = json.loads(value)
        except json.JSONDecodeError:
            raise UsageError(f"argument '{key}': not valid JSON after ':='") from None
    else:
        parsed = value
    if not key:
        raise UsageError("an argument needs a name before '=' or ':='")
    return key, parsed


def _read_json_object(raw: str, flag: str) -> dict[str, Any]:
    text = raw
    if raw.startswith("@"):
        try:
            text = Path(raw[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise UsageError(f"{flag}: the file cannot be read") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise UsageError(f"{flag}: not valid JSON") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: must be a JSON object")
    return value


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError("--url: must be an http:// or https:// URL")
    return url


def _safe_url(url: str) -> str:
    """The URL without user info, query or fragment: only where it points, for messages."""
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _root_cause(exc: BaseException) -> str:
    """The innermost exception's type name: what failed, without its text (which may hold
    addresses or headers)."""
    seen: set[int] = set()
    current: BaseException = exc
    while id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup) and current.exceptions:
            current = current.exceptions[0]
        elif current.__cause__ is not None:
            current = current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            current = current.__context__
        else:
            break
    return type(current).__name__


def _render(value: Any) -> str:
    # Indented for a person at a terminal, one line for a pipe (jq, scripts).
    indent = 2 if sys.stdout.isatty() else None
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


__all__ = [
    "DEFAULT_URL",
    "ENV_TOKEN",
    "ENV_URL",
    "REPLAY_NOTE",
    "add_parser",
    "build_arguments",
    "call_tool",
    "is_replay",
    "result_to_output",
    "run_call",
]
